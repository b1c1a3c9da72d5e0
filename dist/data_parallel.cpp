// Data parallelism with ZeRO sharding (data_parallel.h).
#include "regen/dist/data_parallel.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "regen/core/error.h"
#include "regen/dist/world.h"

namespace regen::dist {

// Parameters and buffers are placed at multiples of this many elements inside a bucket, and every
// rank's chunk starts at one: 512 bytes of f32, the allocator's own block alignment, which the
// kernels' vector loads rely on.
constexpr int64_t kAlignElements = 128;

const char* shard_mode_name(ShardMode mode) {
  switch (mode) {
    case ShardMode::none:
      return "none";
    case ShardMode::optimizer:
      return "optimizer";
    case ShardMode::gradients:
      return "gradients";
    case ShardMode::parameters:
      return "parameters";
  }
  return "?";
}

ShardMode parse_shard_mode(const std::string& name) {
  for (ShardMode m :
       {ShardMode::none, ShardMode::optimizer, ShardMode::gradients, ShardMode::parameters}) {
    if (name == shard_mode_name(m)) return m;
  }
  REGEN_FAIL("shard mode '", name,
             "': must be none, optimizer (ZeRO-1), gradients (ZeRO-2) or parameters (ZeRO-3)");
}

double SyncStats::hidden_share() const {
  if (backward_comm_ms <= 0) return 1.0;
  return std::clamp(1.0 - exposed_ms / backward_comm_ms, 0.0, 1.0);
}

struct DataParallel::Slot {
  std::shared_ptr<TensorImpl> param;
  std::string name;
  Shape shape;
  int64_t numel = 0;
  int64_t offset = 0;  // in its bucket, elements
  int32_t bucket = -1;
};

// ZeRO-3: a parameter and this rank's chunk of it.
struct DataParallel::Sharded {
  Tensor full;   // the model's parameter: no bytes once sharded (but while whole for a save)
  Tensor shard;  // (chunk,), requires grad; its gradient persistent (category gradient)
  std::string name;
  int64_t chunk = 0;
  // Its whole gradient (ranks x chunk elements): under accumulation kept across the step's
  // micro-batches (persistent, category gradient); else `live` from its first use in backward to
  // its last (category communication).
  Tensor whole_grad, live;
  int32_t last_node = -1;  // the gather_shards node whose backward reduces it, this backward
};

// ZeRO-3: a parameter's gather issued ahead of the op that reads it.
struct DataParallel::Prefetched {
  size_t index = 0;  // into sharded_
  Tensor out;        // the gathered parameter: the output of its gather_shards node
  Work work;         // null in a dry run
};

// ZeRO-3: a shard's gradient reduction in flight, and the buffers it reads until it is done.
struct DataParallel::ShardReduction {
  Work work;  // null in a dry run
  Tensor whole, scratch;
};

struct DataParallel::Bucket {
  DType dtype = DType::f32;
  int64_t elements = 0, chunk = 0;
  std::vector<int32_t> slots;
  std::string tag;
  Tensor flat_param;  // optimizer, gradients: its parameters, each a view of its part (persistent)
  Tensor flat_grad;   // none, optimizer: the gradients of its parameters (persistent)
  Tensor shard_grad;  // gradients: this rank's averaged chunk (persistent)
  Tensor live;        // gradients: the flat gradient, during backward only
  Tensor scratch;     // the collective's scratch, while in flight
  Work reduce, gather;
  int32_t pending = 0;
  bool launched = false;
};

namespace {

int64_t round_up(int64_t n, int64_t m) {
  return (n + m - 1) / m * m;
}

uint64_t element_bytes(DType d) {
  return static_cast<uint64_t>(dtype_size(d));
}

void* offset_ptr(const Tensor& t, int64_t elements) {
  return static_cast<char*>(t.raw_data()) + element_bytes(t.dtype()) * elements;
}

// Buffers a failed step may still have in a collective: kept for the rest of the process (which
// is ending: the job aborts), so that a collective a live peer completes never writes into memory
// the allocator gave to something else.
std::vector<Tensor>& kept_forever() {
  static auto* kept = new std::vector<Tensor>();
  return *kept;
}

}  // namespace

DataParallel::DataParallel(Model& model, Communicator& comm, const DataParallelOptions& options)
    : model_(model), comm_(comm), options_(options) {
  REGEN_CHECK(options.bucket_bytes >= 1024, "data parallelism: buckets of ", options.bucket_bytes,
              " bytes are too small (at least 1 KiB)");
  REGEN_CHECK(options.first_bucket_bytes >= 1024, "data parallelism: a first bucket of ",
              options.first_bucket_bytes, " bytes is too small (at least 1 KiB)");
  REGEN_CHECK(options.max_in_flight >= 1, "data parallelism: max_in_flight must be at least 1");
  REGEN_CHECK(model.device() == comm.device(), "data parallelism: the model is on ",
              model.device().str(), " but the communicator reduces ", comm.device().str());
  const int ranks = comm.size();
  // Reverse registration order: roughly the order backward finishes the gradients in.
  NamedTensors params = model.named_parameters();
  std::reverse(params.begin(), params.end());
  auto close = [&](Bucket& b) {
    b.elements = round_up(std::max<int64_t>(b.elements, 1), kAlignElements * ranks);
    b.chunk = b.elements / ranks;
  };
  std::set<const TensorImpl*> seen;
  for (const auto& [name, p] : params) {
    if (!p.requires_grad()) continue;
    REGEN_CHECK(seen.insert(p.impl().get()).second, "data parallelism: parameter '", name,
                "' is registered twice (tied weights are not supported)");
    REGEN_CHECK(p.dtype() == DType::f32 || p.dtype() == DType::f64, "data parallelism: parameter '",
                name, "' is ", dtype_name(p.dtype()), " (f32 and f64 are reduced)");
    const int64_t numel = p.numel();
    if (options.shard == ShardMode::parameters) {
      Sharded z;
      z.full = p;
      z.name = name;
      z.chunk = round_up(std::max<int64_t>((numel + ranks - 1) / ranks, 1), kAlignElements);
      sharded_.push_back(std::move(z));
      continue;
    }
    const uint64_t bytes = element_bytes(p.dtype()) * static_cast<uint64_t>(numel);
    bool fresh = buckets_.empty() || buckets_.back().dtype != p.dtype();
    if (!fresh) {
      const Bucket& b = buckets_.back();
      const int64_t limit =
          buckets_.size() == 1 ? options.first_bucket_bytes : options.bucket_bytes;
      const int64_t used = static_cast<int64_t>(element_bytes(b.dtype)) * b.elements;
      fresh = used + static_cast<int64_t>(bytes) > limit;
    }
    if (fresh) {
      if (!buckets_.empty()) close(buckets_.back());
      buckets_.emplace_back();
      buckets_.back().dtype = p.dtype();
      buckets_.back().tag = "ddp.bucket" + std::to_string(buckets_.size() - 1);
    }
    Bucket& b = buckets_.back();
    Slot s;
    s.param = p.impl();
    s.name = name;
    s.shape = p.shape();
    s.numel = numel;
    s.offset = b.elements;
    s.bucket = static_cast<int32_t>(buckets_.size() - 1);
    b.elements = round_up(b.elements + numel, kAlignElements);
    b.slots.push_back(static_cast<int32_t>(slots_.size()));
    slots_.push_back(std::move(s));
  }
  if (!buckets_.empty()) close(buckets_.back());
  // ZeRO-3: this rank's chunk of every parameter, the optimizer's parameter from the start (its
  // values arrive in prepare(), after rank 0's parameters did).
  for (Sharded& z : sharded_) {
    {
      CategoryScope cat(Category::parameter);
      TagScope tag(z.name + ".shard");
      z.shard = zeros({z.chunk}, z.full.dtype(), model.device());
    }
    z.shard.set_requires_grad(true);
    z.shard.impl()->name = z.name + ".shard" + std::to_string(comm.rank());
    sharded_by_shard_[z.shard.impl().get()] = static_cast<size_t>(&z - sharded_.data());
  }
  for (const Bucket& b : buckets_) {
    REGEN_CHECK(b.elements < (int64_t{1} << 31), "data parallelism: a bucket of ", b.elements,
                " elements is more than the collectives address (a parameter over 2^31 elements)");
    info_.push_back({b.elements, b.chunk, static_cast<int64_t>(b.slots.size()), b.dtype});
  }
  // ZeRO: the parameters move into flat buckets, each a view of its part, so that this rank's
  // chunk of a bucket is one tensor: the optimizer's parameter, with optimizer state of the same
  // size on every rank, updated in place and then all-gathered in place. A bucket at a time, so
  // the move needs one bucket's bytes more than the parameters, not twice them.
  if (options_.shard == ShardMode::optimizer || options_.shard == ShardMode::gradients) {
    const Device device = model.device();
    for (Bucket& b : buckets_) {
      {
        CategoryScope cat(Category::parameter);
        TagScope tag(b.tag + ".param");
        b.flat_param = zeros({b.elements}, b.dtype, device);
      }
      for (int32_t si : b.slots) {
        const Slot& s = slots_[static_cast<size_t>(si)];
        TensorImpl* p = s.param.get();
        const Tensor view = b.flat_param.narrow0(s.offset, s.numel);
        copy_bytes(view.raw_data(), device, Tensor(s.param).raw_data(), device, view.nbytes());
        std::weak_ptr<Storage> old = p->storage;
        p->storage = view.impl()->storage;
        p->offset_bytes = view.impl()->offset_bytes;
        REGEN_CHECK(old.expired(), "data parallelism with --shard ", shard_mode_name(options.shard),
                    ": parameter '", s.name,
                    "' shares its memory with another tensor (a view "
                    "kept by the model?), which would not follow it into its bucket");
      }
      Tensor piece = b.flat_param.narrow0(comm.rank() * b.chunk, b.chunk);
      piece.impl()->name = b.tag + ".shard" + std::to_string(comm.rank());
      pieces_.push_back(std::move(piece));
    }
  }
}

DataParallel::~DataParallel() {
  if (in_step_) abandon();
  for (const Sharded& z : sharded_) unregister_sharded_parameter(z.full);
}

bool DataParallel::dry() const {
  return dry_run_active();
}

std::vector<Tensor> DataParallel::optimizer_parameters() const {
  if (options_.shard == ShardMode::none) return model_.parameters();
  if (options_.shard == ShardMode::parameters) {
    std::vector<Tensor> shards;
    for (const Sharded& z : sharded_) shards.push_back(z.shard);
    return shards;
  }
  return pieces_;
}

void DataParallel::prepare() {
  REGEN_CHECK(!prepared_, "data parallelism: prepare() runs once");
  prepared_ = true;
  const Device device = model_.device();
  const int64_t me = comm_.rank();
  for (Bucket& b : buckets_) {
    if (options_.shard == ShardMode::gradients) {
      CategoryScope cat(Category::gradient);
      TagScope tag(b.tag + ".grad_shard");
      b.shard_grad = zeros({b.chunk}, b.dtype, device);
      for (int32_t si : b.slots) slots_[static_cast<size_t>(si)].param->grad.reset();
    } else {
      CategoryScope cat(Category::gradient);
      TagScope tag(b.tag + ".grad");
      b.flat_grad = zeros({b.elements}, b.dtype, device);
      for (int32_t si : b.slots) {
        Slot& s = slots_[static_cast<size_t>(si)];
        s.param->grad = b.flat_grad.narrow0(s.offset, s.numel).reshape(s.shape).impl();
      }
    }
  }
  // ZeRO: the gradient of this rank's chunk of each bucket: its averaged part.
  for (size_t k = 0; k < pieces_.size(); ++k) {
    Bucket& b = buckets_[k];
    const Tensor g = options_.shard == ShardMode::gradients
                         ? b.shard_grad
                         : b.flat_grad.narrow0(me * b.chunk, b.chunk);
    pieces_[k].impl()->grad = g.impl();
  }
  // Every rank starts from rank 0's parameters and buffers, as DDP does.
  if (comm_.size() > 1 && !dry()) {
    std::vector<Work> works;
    for (const NamedTensors& all : {model_.named_parameters(), model_.named_buffers()}) {
      for (const auto& kv : all) {
        if (kv.second.numel() == 0) continue;
        works.push_back(comm_.broadcast(kv.second.raw_data(), kv.second.nbytes(), 0));
      }
    }
    for (const Work& w : works) comm_.wait(w);
  }
  if (options_.shard == ShardMode::parameters) shard_parameters();
}

void DataParallel::shard_parameters() {
  const Device device = model_.device();
  const int64_t me = comm_.rank();
  for (Sharded& z : sharded_) {
    const DType dtype = z.full.dtype();
    const int64_t begin = std::min(me * z.chunk, z.full.numel());
    const int64_t n = std::min(z.chunk, z.full.numel() - begin);
    if (n > 0 && !dry()) {
      copy_bytes(z.shard.raw_data(), device, offset_ptr(z.full, begin), device,
                 element_bytes(dtype) * static_cast<uint64_t>(n));
    }
    {
      CategoryScope cat(Category::gradient);
      TagScope tag(z.name + ".grad_shard");
      z.shard.impl()->grad = zeros({z.chunk}, dtype, device).impl();
    }
    if (options_.accumulate > 1) {
      // The micro-batches add up every use's gradient whole, as one process does in the
      // parameter's gradient; the last one reduce-scatters the sum (shard_gradient).
      CategoryScope cat(Category::gradient);
      TagScope tag(z.name + ".grad");
      z.whole_grad = zeros({z.chunk * comm_.size()}, dtype, device);
    }
    // The whole parameter's bytes go: from now on ops read it gathered (Tape::apply).
    TensorImpl* p = z.full.impl().get();
    p->grad.reset();
    std::weak_ptr<Storage> old = p->storage;
    p->storage.reset();
    REGEN_CHECK(old.expired(), "data parallelism with --shard parameters: parameter '", z.name,
                "' shares its memory with another tensor (a view kept by the model?), so its "
                "bytes could not be dropped");
    register_sharded_parameter(z.full, z.shard, this);
  }
}

void DataParallel::all_gather(DType dtype, void* data, int64_t chunk) {
  if (in_step_) ++building_.gathers;
  const Work w = comm_.all_gather(dtype, data, chunk);
  comm_.wait(w);
  if (in_step_) step_work_.push_back(w);
}

void DataParallel::reduce_scatter_mean(DType dtype, void* data, void* out, int64_t chunk,
                                       void* scratch) {
  const Work w = comm_.reduce_scatter_mean(dtype, data, out, chunk, scratch);
  comm_.wait(w);
  if (in_step_) step_work_.push_back(w);
}

ShardCollectives::Gradient DataParallel::shard_gradient(const TensorImpl* shard, int32_t node,
                                                        DType dtype, Device device, int64_t chunk) {
  const auto it = sharded_by_shard_.find(shard);
  REGEN_CHECK(it != sharded_by_shard_.end(),
              "data parallelism: gather_shards of a shard this rank does not keep");
  Sharded& z = sharded_[it->second];
  REGEN_CHECK(dtype == z.shard.dtype() && device == z.shard.device() && chunk == z.chunk,
              "data parallelism: the gradient of '", z.name, "' does not match its shard");
  // Outside the step's reduction (a micro-batch before the last, under accumulation) the
  // gradient only adds up in the whole gradient kept across micro-batches.
  const bool reduce = syncing_ && node == z.last_node;
  if (z.whole_grad.defined()) return {z.whole_grad, reduce};
  if (!syncing_) return ShardCollectives::shard_gradient(shard, node, dtype, device, chunk);
  if (!z.live.defined()) {
    CategoryScope cat(Category::communication);
    TagScope tag(z.name + ".grad_whole");
    z.live = zeros({z.chunk * comm_.size()}, dtype, device);
  }
  Gradient g{z.live, reduce};
  if (reduce) z.live = Tensor();  // freed once reduced
  return g;
}

// ---- ZeRO-3: prefetched gathers ----------------------------------------------------------------
//
// In a step's forward (grad mode), when an op asks for parameter i: its gather if one is in flight
// (waited for), else a gather made now, blocking; then every parameter after i in registration
// order, through the next one of more than one dimension (a weight, and the biases and norms
// before it), that no op read yet in this forward, that is not already in flight and whose chunks
// fill it exactly gets its gather_shards node recorded and its all-gather issued without a wait.
// Models register their parameters about in the order forward reads them, so the next op's weight
// is gathered while this op computes. A guess that proves wrong costs memory and a blocking gather,
// never a wrong value: a parameter read out of order is gathered again, and end_forward() finishes
// and drops what no op read. Every allocation and free is at a point the forward's order fixes (the
// gathers' issue, an op's request, end_forward), the same at every step and on every rank, and a
// dry run takes the same blocks, so peaks stay predicted to the byte. The prefetched parameter's
// bytes live from its issue: the planner sees it born there, as the tape records it.

Tensor DataParallel::gather_parameter(const Tensor& shard, const Shape& shape) {
  if (!options_.prefetch || !in_step_ || !grad_mode_enabled() || prefetching_) {
    return ShardCollectives::gather_parameter(shard, shape);
  }
  const auto found = sharded_by_shard_.find(shard.impl().get());
  REGEN_CHECK(found != sharded_by_shard_.end(),
              "data parallelism: a gather of a shard this rank does not keep");
  const size_t i = found->second;
  Tensor out;
  const auto it = std::find_if(prefetched_.begin(), prefetched_.end(),
                               [&](const Prefetched& p) { return p.index == i; });
  if (it != prefetched_.end()) {
    finish_prefetch(*it);
    out = it->out;
    prefetched_.erase(it);
    ++building_.prefetched;
  } else {
    out = ShardCollectives::gather_parameter(shard, shape);
  }
  gathered_[i] = 1;
  // sharded_ is in reverse registration order: the parameters after i are at i - 1, i - 2, ...
  for (size_t j = i; j-- > 0;) {
    const Sharded& z = sharded_[j];
    const bool in_flight = std::any_of(prefetched_.begin(), prefetched_.end(),
                                       [&](const Prefetched& p) { return p.index == j; });
    // Only a parameter its chunks fill exactly: its gather's node then allocates its output and
    // nothing else, as a blocking one does, so a plan's replay of the node takes what the profile
    // saw. (The others, gathered through a staging buffer, are the small ones: biases and norms
    // whose length is not a multiple of ranks x 128.)
    const bool exact_fit = z.chunk * comm_.size() == z.full.numel();
    if (!gathered_[j] && !in_flight && exact_fit) {
      prefetched_.emplace_back();
      prefetched_.back().index = j;
      prefetching_ = true;
      try {
        Tensor t = ShardCollectives::gather_parameter(z.shard, z.full.shape());
        prefetched_.back().out = std::move(t);
      } catch (...) {
        prefetching_ = false;
        throw;
      }
      prefetching_ = false;
    }
    if (z.full.dim() >= 2) break;
  }
  return out;
}

void DataParallel::gather_into(const Tensor& flat, const Tensor& out, int64_t chunk) {
  if (!prefetching_) {
    ShardCollectives::gather_into(flat, out, chunk);
    return;
  }
  REGEN_CHECK(!prefetched_.empty() && chunk > 0 && flat.same(out),
              "data parallelism: a prefetched gather without its record, or through a staging "
              "buffer");
  Prefetched& p = prefetched_.back();
  if (!dry()) {
    ++building_.gathers;
    p.work = comm_.all_gather(flat.dtype(), flat.raw_data(), chunk);
    step_work_.push_back(p.work);
    overlapped_work_.push_back(p.work);
  }
}

void DataParallel::finish_prefetch(Prefetched& p) {
  if (p.work) comm_.wait(p.work);
  p.work.reset();
}

void DataParallel::end_forward() {
  // What no op read: finished (its collective must end before its buffers go) and dropped.
  for (Prefetched& p : prefetched_) finish_prefetch(p);
  prefetched_.clear();
  std::fill(gathered_.begin(), gathered_.end(), 0);
}

Tensor DataParallel::reduce_gradient(const TensorImpl* shard, Tensor whole, int64_t chunk) {
  if (!syncing_) return ShardCollectives::reduce_gradient(shard, std::move(whole), chunk);
  const auto it = sharded_by_shard_.find(shard);
  REGEN_CHECK(it != sharded_by_shard_.end(),
              "data parallelism: a reduction of a shard this rank does not keep");
  Sharded& z = sharded_[it->second];
  const Tensor into(z.shard.impl()->grad);
  REGEN_CHECK(into.defined() && into.numel() == chunk && into.dtype() == whole.dtype() &&
                  whole.numel() == chunk * comm_.size(),
              "data parallelism: the gradient of '", z.name, "' does not match its shard");
  // As the buckets: one more in flight than allowed first waits for the oldest (its buffers go
  // before this one's scratch is made), so every free happens at a node the graph fixes.
  while (static_cast<int>(shard_in_flight_.size()) >= options_.max_in_flight) {
    retire_oldest_shard();
  }
  ShardReduction r;
  r.whole = std::move(whole);
  const int64_t s = comm_.scratch_elements(chunk);
  if (s > 0) {
    CategoryScope cat(Category::communication);
    TagScope tag(z.name + ".scratch");
    r.scratch = empty({s}, r.whole.dtype(), r.whole.device());
  }
  if (!dry()) {
    // Written into the shard's gradient, which the optimizer zeroed: what the engine's addition
    // of a reduced copy would leave there, without the copy.
    r.work = comm_.reduce_scatter_mean(r.whole.dtype(), r.whole.raw_data(), into.raw_data(), chunk,
                                       r.scratch.defined() ? r.scratch.raw_data() : nullptr);
    if (in_step_) {
      step_work_.push_back(r.work);
      overlapped_work_.push_back(r.work);
    }
  }
  shard_in_flight_.push_back(std::move(r));
  return Tensor();
}

void DataParallel::retire_oldest_shard() {
  ShardReduction r = std::move(shard_in_flight_.front());
  shard_in_flight_.erase(shard_in_flight_.begin());
  if (r.work) comm_.wait(r.work);
  r.whole = Tensor();
  r.scratch = Tensor();
}

void DataParallel::gather_whole_parameters() {
  for (Sharded& z : sharded_) {
    Tensor flat;
    {
      CategoryScope cat(Category::parameter);
      TagScope tag(z.name);
      flat = empty({z.chunk * comm_.size()}, z.shard.dtype(), model_.device());
    }
    if (!dry()) {
      copy_bytes(offset_ptr(flat, comm_.rank() * z.chunk), model_.device(), z.shard.raw_data(),
                 model_.device(), z.shard.nbytes());
      comm_.wait(comm_.all_gather(z.shard.dtype(), flat.raw_data(), z.chunk));
    }
    TensorImpl* p = z.full.impl().get();
    p->storage = flat.impl()->storage;
    p->offset_bytes = 0;
  }
}

NamedTensors DataParallel::parameter_shards() const {
  NamedTensors out;
  for (const Sharded& z : sharded_) out.emplace_back(z.name, z.shard);
  return out;
}

void DataParallel::shard_whole_parameters() {
  const Device device = model_.device();
  const int64_t me = comm_.rank();
  for (Sharded& z : sharded_) {
    REGEN_CHECK(z.full.has_storage(), "data parallelism: parameter '", z.name,
                "' is not whole (shard_whole_parameters outside gather_whole_parameters)");
    if (dry()) continue;
    const int64_t begin = std::min(me * z.chunk, z.full.numel());
    const int64_t n = std::min(z.chunk, z.full.numel() - begin);
    zero_(z.shard);
    if (n > 0) {
      copy_bytes(z.shard.raw_data(), device, offset_ptr(z.full, begin), device,
                 element_bytes(z.shard.dtype()) * static_cast<uint64_t>(n));
    }
  }
}

void DataParallel::drop_whole_parameters() {
  for (Sharded& z : sharded_) z.full.impl()->storage.reset();
}

WholeParameters::WholeParameters(GradientSync* sync) : dp_(dynamic_cast<DataParallel*>(sync)) {
  if (dp_) dp_->gather_whole_parameters();
}

WholeParameters::~WholeParameters() {
  if (dp_) dp_->drop_whole_parameters();
}

void DataParallel::begin_step() {
  REGEN_CHECK(prepared_, "data parallelism: begin_step() before prepare()");
  REGEN_CHECK(
      !in_step_,
      "data parallelism: the previous step failed on this rank part-way, so its "
      "collectives no longer match the other ranks': the job cannot go on (start it again)");
  in_step_ = true;
  building_ = SyncStats();
  building_.buckets = static_cast<int64_t>(buckets_.size());
  step_work_.clear();
  overlapped_work_.clear();
  REGEN_CHECK(prefetched_.empty(), "data parallelism: gathers prefetched in the last step are ",
              "still in flight (a forward pass without end_forward?)");
  gathered_.assign(sharded_.size(), 0);
  for (Bucket& b : buckets_) {
    b.launched = false;
    b.reduce.reset();
    b.gather.reset();
  }
  // ZeRO-1: the optimizer zeroed only this rank's slices; the buckets fill whole.
  if (options_.shard == ShardMode::optimizer) {
    for (Bucket& b : buckets_) zero_(b.flat_grad);
  }
  // ZeRO-3 under accumulation: the whole gradients start at zero, as the gradients of one process.
  if (!dry()) {
    for (Sharded& z : sharded_) {
      if (z.whole_grad.defined()) zero_(z.whole_grad);
    }
  }
}

void DataParallel::on_backward_start(Tape& tape) {
  const size_t nodes = tape.nodes().size();
  ready_at_.assign(nodes, {});
  touch_at_.assign(nodes, {});
  std::vector<char> active(nodes, 0);
  for (int32_t n : tape.backward_order()) active[static_cast<size_t>(n)] = 1;
  // ZeRO-3: a parameter's whole gradient is final after the backward of its first gather_shards
  // node (forward order) that backward runs, which reduces it.
  syncing_ = true;
  for (Sharded& z : sharded_) {
    z.last_node = -1;
    const TensorImpl* s = z.shard.impl().get();
    if (s->tape_value < 0 || s->tape_epoch != tape.epoch()) continue;
    for (int32_t c : tape.value(s->tape_value).consumers) {
      if (active[static_cast<size_t>(c)] && (z.last_node < 0 || c < z.last_node)) z.last_node = c;
    }
  }
  std::vector<int32_t> first_touch(buckets_.size(), -1);
  for (Bucket& b : buckets_) b.pending = 0;
  for (size_t si = 0; si < slots_.size(); ++si) {
    const Slot& s = slots_[si];
    const TensorImpl* p = s.param.get();
    // Its gradient is final after the backward of its first active consumer (forward order):
    // backward runs the nodes in reverse, and only a consumer accumulates into a leaf's gradient.
    int32_t final_node = -1, first_node = -1;
    if (p->tape_value >= 0 && p->tape_epoch == tape.epoch()) {
      for (int32_t c : tape.value(p->tape_value).consumers) {
        if (!active[static_cast<size_t>(c)]) continue;
        final_node = final_node < 0 ? c : std::min(final_node, c);
        first_node = std::max(first_node, c);
      }
    }
    if (final_node < 0) continue;  // no gradient this step: ready from the start
    Bucket& b = buckets_[static_cast<size_t>(s.bucket)];
    ++b.pending;
    ready_at_[static_cast<size_t>(final_node)].push_back(static_cast<int32_t>(si));
    first_touch[static_cast<size_t>(s.bucket)] =
        std::max(first_touch[static_cast<size_t>(s.bucket)], first_node);
  }
  for (size_t bi = 0; bi < buckets_.size(); ++bi) {
    if (options_.shard == ShardMode::gradients && first_touch[bi] >= 0) {
      touch_at_[static_cast<size_t>(first_touch[bi])].push_back(static_cast<int32_t>(bi));
    }
  }
  // Buckets no gradient reaches this step are ready now (their gradients are zero).
  for (Bucket& b : buckets_) {
    if (b.pending > 0) continue;
    if (options_.shard == ShardMode::gradients) bind_gradients(b);
    launch(b);
  }
}

void DataParallel::bind_gradients(Bucket& b) {
  {
    CategoryScope cat(Category::communication);
    TagScope tag(b.tag);
    b.live = zeros({b.elements}, b.dtype, model_.device());
  }
  for (int32_t si : b.slots) {
    Slot& s = slots_[static_cast<size_t>(si)];
    REGEN_CHECK(s.param->grad == nullptr, "data parallelism: parameter '", s.name,
                "' has a gradient before its bucket was made");
    s.param->grad = b.live.narrow0(s.offset, s.numel).reshape(s.shape).impl();
  }
}

void DataParallel::on_backward_begin(Tape&, int32_t node) {
  if (static_cast<size_t>(node) >= touch_at_.size()) return;
  for (int32_t bi : touch_at_[static_cast<size_t>(node)]) {
    bind_gradients(buckets_[static_cast<size_t>(bi)]);
  }
}

void DataParallel::on_backward_end(Tape&, int32_t node) {
  if (static_cast<size_t>(node) >= ready_at_.size()) return;
  for (int32_t si : ready_at_[static_cast<size_t>(node)]) {
    Bucket& b = buckets_[static_cast<size_t>(slots_[static_cast<size_t>(si)].bucket)];
    if (--b.pending == 0) launch(b);
  }
}

void DataParallel::on_backward_finish(Tape&) {
  syncing_ = false;
  for (Sharded& z : sharded_) {
    REGEN_CHECK(!z.live.defined(), "data parallelism: the whole gradient of '", z.name,
                "' was not reduced in backward");
  }
  for (Bucket& b : buckets_) {
    if (!b.launched) {
      if (options_.shard == ShardMode::gradients && !b.live.defined()) bind_gradients(b);
      launch(b);
    }
  }
}

void DataParallel::launch(Bucket& b) {
  while (static_cast<int>(in_flight_.size()) >= options_.max_in_flight) retire_oldest();
  b.launched = true;
  const int64_t scratch = comm_.scratch_elements(b.chunk);
  if (scratch > 0) {
    CategoryScope cat(Category::communication);
    TagScope tag(b.tag + ".scratch");
    b.scratch = empty({scratch}, b.dtype, model_.device());
  }
  in_flight_.push_back(static_cast<int32_t>(&b - buckets_.data()));
  if (dry()) return;
  const bool zero2 = options_.shard == ShardMode::gradients;
  const Tensor& src = zero2 ? b.live : b.flat_grad;
  void* out = zero2 ? b.shard_grad.raw_data() : offset_ptr(b.flat_grad, comm_.rank() * b.chunk);
  b.reduce = comm_.reduce_scatter_mean(b.dtype, src.raw_data(), out, b.chunk,
                                       b.scratch.defined() ? b.scratch.raw_data() : nullptr);
  step_work_.push_back(b.reduce);
  if (options_.shard == ShardMode::none) {
    b.gather = comm_.all_gather(b.dtype, b.flat_grad.raw_data(), b.chunk);
    step_work_.push_back(b.gather);
  }
}

void DataParallel::retire_oldest() {
  Bucket& b = buckets_[static_cast<size_t>(in_flight_.front())];
  in_flight_.erase(in_flight_.begin());
  if (b.reduce) comm_.wait(b.reduce);
  if (b.gather) comm_.wait(b.gather);
  b.scratch = Tensor();
  if (options_.shard == ShardMode::gradients) {
    for (int32_t si : b.slots) slots_[static_cast<size_t>(si)].param->grad.reset();
    b.live = Tensor();
  }
}

void DataParallel::end_backward() {
  while (!in_flight_.empty()) retire_oldest();
  while (!shard_in_flight_.empty()) retire_oldest_shard();
}

void DataParallel::end_optimizer() {
  if (options_.shard == ShardMode::none || dry()) return;
  // Each rank updated its chunk of every bucket in place; every rank's chunk to every rank.
  for (Bucket& b : buckets_) {
    b.gather = comm_.all_gather(b.dtype, b.flat_param.raw_data(), b.chunk);
    step_work_.push_back(b.gather);
  }
  for (Bucket& b : buckets_) comm_.wait(b.gather);
}

double DataParallel::reduce_squared_norm(double local) {
  // Every rank holds every reduced gradient: its own sum is the global one.
  if (options_.shard == ShardMode::none || comm_.size() == 1) return local;
  // Each holds a shard (the optimizer's pieces): the ranks' sums added in rank order, the same
  // number on every rank.
  double sum = 0;
  for (double v : world().all_gather(local)) sum += v;
  return sum;
}

double DataParallel::reduce_loss(double loss) {
  const bool was_dry = dry();
  in_step_ = false;
  if (was_dry) return loss;
  // The figures of the step, now that the device is synchronized.
  SyncStats st = building_;
  for (Bucket& b : buckets_) {
    for (const Work* w : {&b.reduce, &b.gather}) {
      if (!*w) continue;
      comm_.resolve(*w);
    }
  }
  for (const Work& w : step_work_) {
    st.bytes += static_cast<int64_t>(w->bytes);
  }
  if (options_.shard == ShardMode::parameters) {
    // ZeRO-3's gathers made by the ops ran blocking: nothing of them hidden. Its prefetched
    // gathers and its reduce-scatters held the step back only while something waited for them.
    for (const Work& w : step_work_) {
      comm_.resolve(w);
      st.backward_comm_ms += w->busy_ms;
      const bool overlapped =
          std::find(overlapped_work_.begin(), overlapped_work_.end(), w) != overlapped_work_.end();
      st.exposed_ms += overlapped ? w->stalled_ms : w->busy_ms;
    }
  }
  for (const Bucket& b : buckets_) {
    const bool gathered_params = options_.shard != ShardMode::none;
    if (b.reduce) {
      st.backward_comm_ms += b.reduce->busy_ms;
      st.exposed_ms += b.reduce->stalled_ms;
    }
    if (b.gather) {
      if (gathered_params) {
        st.optimizer_comm_ms += b.gather->busy_ms;
        st.optimizer_wait_ms += b.gather->stalled_ms;
      } else {
        st.backward_comm_ms += b.gather->busy_ms;
        st.exposed_ms += b.gather->stalled_ms;
      }
    }
  }
  stats_ = st;
  if (comm_.size() == 1) return loss;
  // The mean of the ranks' losses, summed in rank order: the same number on every rank.
  const std::vector<double> all = world().all_gather(loss);
  double sum = 0;
  for (double l : all) sum += l;
  return sum / static_cast<double>(all.size());
}

void DataParallel::abandon() {
  for (Bucket& b : buckets_) {
    for (Tensor* t : {&b.scratch, &b.live, &b.flat_param, &b.flat_grad, &b.shard_grad}) {
      if (t->defined()) kept_forever().push_back(*t);
    }
  }
  for (Sharded& z : sharded_) {
    for (Tensor* t : {&z.live, &z.whole_grad}) {
      if (t->defined()) kept_forever().push_back(*t);
    }
    // A reduction in flight writes into the shard's gradient.
    if (!shard_in_flight_.empty() && z.shard.impl()->grad) {
      kept_forever().push_back(Tensor(z.shard.impl()->grad));
    }
  }
  for (ShardReduction& r : shard_in_flight_) {
    for (Tensor* t : {&r.whole, &r.scratch}) {
      if (t->defined()) kept_forever().push_back(*t);
    }
  }
  for (Prefetched& p : prefetched_) {
    if (p.out.defined()) kept_forever().push_back(p.out);
  }
}

// ---- ShardedSource ----------------------------------------------------------------------------

ShardedSource::ShardedSource(std::unique_ptr<DataSource> inner, int rank, int ranks)
    : inner_(std::move(inner)), rank_(rank), ranks_(ranks) {
  REGEN_CHECK(ranks >= 1 && rank >= 0 && rank < ranks, "ShardedSource: rank ", rank, " of ", ranks);
}

Batch ShardedSource::next(int64_t batch_size, Device device) {
  inner_->skip(static_cast<int64_t>(rank_) * batch_size);
  Batch b = inner_->next(batch_size, device);
  inner_->skip(static_cast<int64_t>(ranks_ - 1 - rank_) * batch_size);
  return b;
}

std::string ShardedSource::describe() const {
  return inner_->describe() + ", shard " + std::to_string(rank_) + " of " + std::to_string(ranks_) +
         " of every global batch";
}

void ShardedSource::skip(int64_t samples) {
  inner_->skip(samples * ranks_);
}

uint64_t rank_seed(uint64_t seed, int rank) {
  if (rank == 0) return seed;
  // splitmix64 of the seed and the rank.
  uint64_t z = seed + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(rank + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace regen::dist
