// Data parallelism in the manner of PyTorch's DistributedDataParallel, with ZeRO's sharding
// (stages 1 and 2), as the trainer's GradientSync (models/train.h). Every rank holds the whole
// model and reads its own shard of each global batch (ShardedSource); parameters' gradients live in
// flat buckets (about 25 MiB, the first one 1 MiB), filled in reverse registration order. During
// backward, as soon as every gradient of a bucket is final (its parameter's last consumer has run
// backward: known from the tape, exactly), its averaging starts on the communicator's own thread
// (MPI) or stream (NCCL) while backward goes on; end_backward() waits for what is still in flight.
//
// Shard modes (ShardMode):
//   none       every rank keeps every gradient and the whole optimizer state; a bucket is
//              reduce-scattered and all-gathered (the averaged gradient everywhere).
//   optimizer  ZeRO-1: every rank keeps every gradient buffer but only 1/N of the optimizer state.
//              The parameters move into flat buckets too (each parameter a view of its part), so
//              this rank's chunk of a bucket is one tensor: the optimizer's parameter
//              (optimizer_parameters()), with state of the same size on every rank. A bucket is
//              reduce-scattered; after the optimizer step, each bucket's parameters are
//              all-gathered in place.
//   gradients  ZeRO-2: as optimizer, and the gradients are sharded too: a bucket's flat gradient
//              exists only from the first backward node that writes into it until its
//              reduce-scatter is done; what stays is this rank's averaged chunk.
//   parameters ZeRO-3: no buckets. Each parameter is cut in N equal chunks (padded to a multiple
//              of 128 elements) and a rank keeps its chunk, its chunk's gradient and optimizer
//              state; the whole parameter's bytes are dropped. Every op that reads the parameter
//              reads a recorded gather_shards node's output instead
//              (autograd/sharded_parameters.h): all-gathered before use, freed after its last
//              reader (or kept, or gathered again for backward, as a remat plan decides). In a
//              step's forward each gather is issued ahead, while the ops before its reader
//              compute (options.prefetch; gather_parameter says which). Backward
//              adds each use's gradient into the parameter's whole gradient (shard_gradient) and
//              the parameter's last use reduce-scatters it into the shard's gradient, left in
//              flight while backward goes on (at most max_in_flight at once, as the buckets;
//              end_backward() waits for the rest). Gathers a plan replays in backward run
//              blocking.
// The reduction is the same in all three (each rank's chunk of a bucket averaged in rank order),
// so the parameters after a step are bitwise the same in every mode and on every rank.
//
// Memory: everything goes through the device's caching allocator. Persistent: the flat gradient
// buckets (category gradient; none, optimizer), or the gradient shards (gradients); under ZeRO the
// flat parameter buckets (category parameter) instead of the model's own. During the
// step, in category communication: the collectives' scratch of the buckets in flight (MPI only;
// a few MiB each) and ZeRO-2's bucket gradients. At most
// `max_in_flight` buckets are in flight: issuing one more first waits for the oldest. Every
// allocation and free happens on the trainer's thread at a point fixed by the graph (a node's
// backward, a wait at a fixed position), never when a collective happens to finish, so the
// allocator's request sequence is the same at every step and on every rank, the profiler records
// it, and the simulator predicts each rank's peaks to the byte. Under a dry run (DryRunScope)
// nothing is communicated and the same blocks are taken.
//
// Gradient accumulation (Trainer::set_accumulation): begin_step() once per step, then only the
// last micro-batch's backward runs under backward_hooks() (DDP's no_sync for the others): the
// earlier ones add their gradients into the flat buckets locally, and the last one's buckets
// reduce the sums as its backward finishes them. Its scratch is therefore the only
// communication-category request of a micro-batch, in the last one only (Profile::accumulate).
// Not under ZeRO-2 (gradients), whose whole gradients exist only during one backward: refused.
// Under ZeRO-3 (parameters) every parameter's whole gradient is kept across the micro-batches
// (persistent, category gradient, made in prepare() when `accumulate` > 1): the micro-batches
// before the last add into it, and the last reduce-scatters the sums.
// docs/distributed.md. Tests: tests/test_dist.cpp, tests/mpi/.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "regen/autograd/sharded_parameters.h"
#include "regen/autograd/tape.h"
#include "regen/dist/communicator.h"
#include "regen/models/data.h"
#include "regen/models/model.h"
#include "regen/models/train.h"

namespace regen::dist {

enum class ShardMode { none, optimizer, gradients, parameters };
const char* shard_mode_name(ShardMode mode);  // "none", "optimizer", "gradients", "parameters"
// Throws regen::Error naming the value and the three names.
ShardMode parse_shard_mode(const std::string& name);

struct DataParallelOptions {
  ShardMode shard = ShardMode::none;
  int64_t bucket_bytes = int64_t{25} << 20;       // DDP's bucket_cap_mb
  int64_t first_bucket_bytes = int64_t{1} << 20;  // the first bucket ready: small, to start early
  int max_in_flight = 2;
  // Micro-batches per step (Trainer::set_accumulation): ZeRO-3 keeps whole gradients across them.
  int64_t accumulate = 1;
  // ZeRO-3: in a step's forward, gather parameters ahead of the ops that read them (DataParallel,
  // "Prefetch"), so that the gathers run while the ops before compute.
  bool prefetch = true;
};

// What the last step communicated and how much of it backward hid.
struct SyncStats {
  int64_t buckets = 0;
  int64_t bytes = 0;             // sent and received by this rank over the step
  double backward_comm_ms = 0;   // the buckets' collectives, on the communicator's thread/stream
  double exposed_ms = 0;         // of which backward and end_backward waited for
  double optimizer_comm_ms = 0;  // ZeRO's parameter gather after the optimizer (not overlapped)
  double optimizer_wait_ms = 0;
  // ZeRO-3: the parameter gathers of the step (forward, and a plan's in backward), and how many of
  // them were issued ahead of the op that read them (prefetched).
  int64_t gathers = 0, prefetched = 0;
  // Share of the buckets' communication that ran while backward computed: 1 - exposed / comm.
  double hidden_share() const;
};

// One bucket, for reports.
struct BucketInfo {
  int64_t elements = 0;  // padded to a multiple of ranks * 128
  int64_t chunk = 0;     // elements per rank
  int64_t params = 0;
  DType dtype = DType::f32;
};

class DataParallel final : public GradientSync, private TapeHooks, private ShardCollectives {
 public:
  // The model's parameters that require grad, bucketed; `comm` must outlive this. Nothing is
  // allocated until prepare() (the trainer's, before its first step).
  DataParallel(Model& model, Communicator& comm, const DataParallelOptions& options);
  ~DataParallel() override;
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  // GradientSync
  void prepare() override;
  bool manages_gradients() const override {
    return options_.shard == ShardMode::gradients || options_.shard == ShardMode::parameters;
  }
  bool supports_accumulation() const override { return options_.shard != ShardMode::gradients; }
  std::vector<Tensor> optimizer_parameters() const override;
  void begin_step() override;
  void end_forward() override;
  TapeHooks& backward_hooks() override { return *this; }
  void end_backward() override;
  void end_optimizer() override;
  double reduce_loss(double loss) override;
  double reduce_squared_norm(double local) override;

  const DataParallelOptions& options() const { return options_; }
  Communicator& communicator() const { return comm_; }
  const std::vector<BucketInfo>& buckets() const { return info_; }
  const SyncStats& last_step() const { return stats_; }

  // ZeRO-3: every parameter whole on every rank (all-gathered, category parameter) until
  // drop_whole_parameters(); every rank calls both, in the same order (a checkpoint's save).
  // Nothing in the other modes.
  void gather_whole_parameters();
  void drop_whole_parameters();
  // ZeRO-3: this rank's chunk of every sharded parameter (1-D, padded with zeros), by the
  // parameter's name: what a training state keeps of it on each rank. Empty in the other modes.
  NamedTensors parameter_shards() const;
  // ZeRO-3: each shard set from the whole parameter (while gather_whole_parameters() holds them,
  // after a load into them: --load); every rank calls it.
  void shard_whole_parameters();

 private:
  struct Sharded;
  // ShardCollectives (ZeRO-3's gather_shards nodes): blocking collectives on comm_.
  int rank() const override { return comm_.rank(); }
  int ranks() const override { return comm_.size(); }
  int64_t scratch_elements(int64_t chunk) const override { return comm_.scratch_elements(chunk); }
  void all_gather(DType dtype, void* data, int64_t chunk) override;
  void reduce_scatter_mean(DType dtype, void* data, void* out, int64_t chunk,
                           void* scratch) override;
  Gradient shard_gradient(const TensorImpl* shard, int32_t node, DType dtype, Device device,
                          int64_t chunk) override;
  // In a step's forward (grad mode, options.prefetch): the parameter's prefetched gather if one is
  // in flight (waited for), else one made now; then the gathers of the parameters after it, in
  // registration order, through the next one of more than one dimension, are issued and left in
  // flight: those the next ops should read. Elsewhere the default.
  Tensor gather_parameter(const Tensor& shard, const Shape& shape) override;
  void gather_into(const Tensor& flat, const Tensor& out, int64_t chunk) override;
  struct Prefetched;
  void finish_prefetch(Prefetched& p);  // waits for its gather, copies a staging buffer out
  // In the step's reduction: issued into the shard's gradient and left in flight (at most
  // max_in_flight; end_backward() waits for the rest). Otherwise blocking, as the default.
  Tensor reduce_gradient(const TensorImpl* shard, Tensor whole, int64_t chunk) override;
  void retire_oldest_shard();  // waits for the oldest reduction in flight, frees its buffers
  void shard_parameters();     // ZeRO-3, in prepare()

  struct Slot;
  struct Bucket;
  // TapeHooks
  void on_backward_start(Tape& tape) override;
  void on_backward_begin(Tape& tape, int32_t node) override;
  void on_backward_end(Tape& tape, int32_t node) override;
  void on_backward_finish(Tape& tape) override;

  void bind_gradients(Bucket& b);  // ZeRO-2: the bucket's flat gradient, its params' .grad views
  void launch(Bucket& b);
  void retire_oldest();  // waits for the oldest bucket in flight and frees what it used
  void abandon();        // a step that failed half-way: keep what collectives may still touch
  bool dry() const;

  Model& model_;
  Communicator& comm_;
  DataParallelOptions options_;
  std::vector<Slot> slots_;
  std::vector<Bucket> buckets_;
  std::vector<BucketInfo> info_;
  std::vector<Tensor> pieces_;    // ZeRO: this rank's chunk of each bucket (the optimizer's)
  std::vector<Sharded> sharded_;  // ZeRO-3: every parameter that requires grad
  std::unordered_map<const TensorImpl*, size_t> sharded_by_shard_;
  struct ShardReduction;
  std::vector<ShardReduction> shard_in_flight_;  // ZeRO-3: oldest first
  // This step's collectives that ran while the step computed (their exposure is their wait).
  std::vector<Work> overlapped_work_;
  std::vector<Prefetched> prefetched_;  // ZeRO-3: gathers in flight in this forward, issue order
  std::vector<char> gathered_;          // by sharded_ index: read by an op in this forward
  bool prefetching_ = false;            // issuing a prefetch (gather_into leaves it in flight)
  bool syncing_ = false;  // in a backward under backward_hooks() (the step's reduction)
  std::vector<int32_t> in_flight_;
  std::vector<Work> step_work_;  // this step's collectives, for the figures
  std::vector<std::vector<int32_t>> ready_at_, touch_at_;  // by backward node: slots, buckets
  bool prepared_ = false, in_step_ = false;
  SyncStats stats_, building_;
};

// A checkpoint's save under ZeRO-3: the whole parameters for its lifetime (every rank makes one).
class WholeParameters {
 public:
  explicit WholeParameters(GradientSync* sync);
  ~WholeParameters();
  WholeParameters(const WholeParameters&) = delete;
  WholeParameters& operator=(const WholeParameters&) = delete;

 private:
  DataParallel* dp_ = nullptr;
};

// Rank `rank` of `ranks`'s shard of every global batch of `inner`: each next(n) skips the n
// samples of every rank before it, makes its own n, and skips the rest (DataSource::skip), so the
// ranks together read the global batch of ranks * n samples that one process reading with batch
// ranks * n would, each a disjoint part.
class ShardedSource final : public DataSource {
 public:
  ShardedSource(std::unique_ptr<DataSource> inner, int rank, int ranks);
  Batch next(int64_t batch_size, Device device) override;
  std::string describe() const override;
  void skip(int64_t samples) override;
  // The inner stream's position: every rank's moves by whole global batches, so it is the same on
  // every rank, the position of one process at the global batch (a training state records it).
  std::string position() const override { return inner_->position(); }
  void set_position(const std::string& position) override { inner_->set_position(position); }

 private:
  std::unique_ptr<DataSource> inner_;
  int rank_, ranks_;
};

// The dropout seed of rank `rank`: `seed` itself on rank 0 (one rank draws what one process
// draws), a different stream on every other rank so that no two ranks drop the same units of
// their samples.
uint64_t rank_seed(uint64_t seed, int rank);

}  // namespace regen::dist
