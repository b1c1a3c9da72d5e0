// Sessions (session.h).
#include "regen/session/session.h"

#include "regen/session/records.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "regen/core/numeric.h"
#include "regen/core/safetensors.h"
#include "regen/dist/data_parallel.h"
#include "regen/dist/world.h"
#include "regen/kernels/kernels.h"
#include "regen/remat/execute/pipeline.h"
#include "regen/remat/plan/compress.h"

#ifdef REGEN_WITH_CUDA
#include "regen/core/cuda/runtime.h"
#include "regen/kernels/cuda/cuda_kernels.h"
#endif

namespace regen {

// ---------------------------------------------------------------------------------------------
// Memory available, and the dry run's verdict

bool cuda_memory_info(Device device, uint64_t& free_bytes, uint64_t& total_bytes) {
  free_bytes = total_bytes = 0;
#ifdef REGEN_WITH_CUDA
  if (device.is_cuda()) {
    cuda::DeviceGuard guard(device.index);
    cuda::mem_get_info(free_bytes, total_bytes);
    return true;
  }
#else
  (void)device;
#endif
  return false;
}

namespace {

// Bytes of memory on the device: physical RAM for the CPU, the GPU's total for CUDA.
double device_memory_bytes(Device device) {
  uint64_t free_bytes = 0, total_bytes = 0;
  if (cuda_memory_info(device, free_bytes, total_bytes)) return static_cast<double>(total_bytes);
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return 0;
  return static_cast<double>(pages) * static_cast<double>(page);
}

// The model's options with `pick`, named as `style` says: "--image-size", "--seq-len".
std::vector<std::string> options_that(const SessionOptions& o, bool ModelOption::*pick) {
  std::vector<std::string> out;
  for (const ModelOption& opt : model_info(o.model).input.options) {
    if (opt.*pick) out.push_back(o.name(opt.key));
  }
  return out;
}

// "a or b", "a, b or c"
std::string either(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i)
    out += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  return out;
}

// What makes a step large: the batch, with the options that size the step at their values
// ("--batch 8 at --image-size 224").
std::string size_options(const Session& s) {
  const SessionOptions& o = s.options;
  std::string out = option_setting("batch", std::to_string(o.batch), o.style);
  bool first = true;
  for (const ModelOption& opt : model_info(o.model).input.options) {
    if (!opt.sizes_step) continue;
    out += (first ? " at " : ", ") +
           option_setting(opt.key, option_value_text(opt, opt.get(s.config)), o.style);
    first = false;
  }
  return out;
}

// "use a smaller --batch or --image-size": the options a step's activations grow with.
std::string smaller(const SessionOptions& o) {
  std::vector<std::string> names = {o.name("batch")};
  for (const std::string& n : options_that(o, &ModelOption::sizes_step)) names.push_back(n);
  return "use a smaller " + either(names);
}

}  // namespace

int64_t available_memory(Device device) {
  uint64_t free_bytes = 0, total_bytes = 0;
  // What the process's own allocator already reserves (and keeps parked) is its to reuse. In
  // direct mode its segments are bookkeeping only: it holds exactly its live blocks' bytes.
  CachingAllocator& a = allocator_for(device);
  const int64_t own =
      a.direct() ? a.stats().requested.current
                 : a.stats().reserved.current + static_cast<int64_t>(a.arena().retained_bytes());
  if (cuda_memory_info(device, free_bytes, total_bytes))
    return static_cast<int64_t>(free_bytes) + own;
  if (FILE* f = std::fopen("/proc/meminfo", "r")) {
    char line[256];
    long long kib = -1;
    while (std::fgets(line, sizeof line, f)) {
      if (std::sscanf(line, "MemAvailable: %lld kB", &kib) == 1) break;
    }
    std::fclose(f);
    if (kib >= 0) return static_cast<int64_t>(kib) * 1024 + own;
  }
  const double total = device_memory_bytes(device);
  return total > 0 ? static_cast<int64_t>(total) : 0;
}

namespace {

// A model whose own state passes the memory available: its parameters alone (`alone`, from a
// model built dry, before the step's dry run) or with their gradients and optimizer state.
[[noreturn]] void refuse_model_state(const Session& s, int64_t bytes, int64_t have, bool alone) {
  const ModelConfig& c = s.config;
  const SessionOptions& o = s.options;
  std::vector<std::string> sizes;
  for (const ModelOption& opt : model_info(o.model).input.options) {
    if (opt.sizes_parameters) {
      sizes.push_back(o.name(opt.key) + " (now " + option_value_text(opt, opt.get(c)) + ")");
    }
  }
  REGEN_FAIL(c.name, " does not fit in memory: its parameters",
             alone ? " alone take " : ", gradients and optimizer state take ", format_bytes(bytes),
             " (exact, from a dry run",
             alone ? "; their gradients and optimizer state come on top" : "", "), but ",
             s.device.str(), " has ", format_bytes(have), " available; use a smaller preset",
             sizes.empty() ? std::string() : " or a smaller " + either(sizes));
}

}  // namespace

void check_preflight(const Session& s, Preflight preflight) {
  if (preflight == Preflight::none) return;
  const ModelConfig& c = s.config;
  const SessionOptions& o = s.options;
  const int64_t have = available_memory(s.device);
  if (have <= 0) return;
  // The model's own state first: no batch size helps there.
  const int64_t state = s.preflight.persistent;
  if (state > have) refuse_model_state(s, state, have, false);
  if (preflight == Preflight::model) return;
  // Every tensor of the step, as the real step allocates them, with the kernels' scratch space
  // (GEMM packing, im2col tiles; on CUDA the kernels' partial sums and cuDNN's and CUB's
  // workspaces) and what the device keeps (cuBLAS's workspace): the real step's peak.
  const int64_t need = s.preflight.memory.allocated.peak;
  REGEN_CHECK(need <= have, size_options(s), " is too large for memory: one ", c.name,
              " training step without remat needs ", format_bytes(need), " (", format_bytes(state),
              " of it the model's state; every tensor and the kernels' scratch space of the first "
              "step, exact, from a dry run), but ",
              s.device.str(), " has ", format_bytes(have), " available; ", smaller(o));
}

// ---------------------------------------------------------------------------------------------
// Sessions

namespace {

// make_session's probe of a large batch's dry run: from this batch on, and past this many
// allocator requests (about a second of dry run each 100000 on a CPU core).
constexpr int64_t kProbeBatch = 64;
constexpr double kMaxDryRequests = 2e6;

// Applies the threads and the CUDA settings (conv, and math as math_mode gives it for `device`).
void apply_runtime_options(const SessionOptions& o, Device device) {
  if (o.threads > 0) omp_set_num_threads(static_cast<int>(o.threads));
  const bool tf32 = math_mode(o, device) == "tf32";  // refuses tf32 on the CPU, naming it
#ifdef REGEN_WITH_CUDA
  cuda::set_conv_algo(o.conv == "cudnn" ? cuda::ConvAlgo::cudnn : cuda::ConvAlgo::native);
  cuda::set_tf32(tf32);
#else
  (void)tf32;  // math_mode refused it: without CUDA every device is the CPU
#endif
}

std::string spec_text(const TensorSpec& t) {
  std::ostringstream os;
  os << dtype_name(t.dtype) << " " << sh(t.shape);
  return os.str();
}

// The model's data source, with every batch checked against the model's input: a dry run
// allocates what the input describes, so a source that makes something else would make the
// dry run (and every prediction from the same shapes) wrong.
class CheckedSource final : public DataSource {
 public:
  CheckedSource(std::unique_ptr<DataSource> inner, const ModelConfig& config)
      : inner_(std::move(inner)), config_(config), input_(model_info(config.name).input) {}
  Batch next(int64_t n, Device device) override {
    Batch b = inner_->next(n, device);
    const BatchSpec want = input_.batch(config_, n);
    auto same = [](const Tensor& t, const TensorSpec& s) {
      return t.defined() && t.shape() == s.shape && t.dtype() == s.dtype;
    };
    REGEN_CHECK(same(b.input, want.input) && same(b.target, want.target), "data ",
                inner_->describe(), " made a batch of ", b.input.defined() ? b.input.str() : "?",
                " and ", b.target.defined() ? b.target.str() : "?", ", but model '", config_.name,
                "' describes its input as ", spec_text(want.input), " and ", spec_text(want.target),
                " (ModelInput::batch)");
    return b;
  }
  std::string describe() const override { return inner_->describe(); }
  std::string position() const override { return inner_->position(); }
  void set_position(const std::string& p) override { inner_->set_position(p); }
  void skip(int64_t samples) override { inner_->skip(samples); }

 private:
  std::unique_ptr<DataSource> inner_;
  ModelConfig config_;
  const ModelInput& input_;
};

// Under mpirun every rank must run the same step: the options that shape it, compared with rank
// 0's before anything is built (a rank with another batch or model would wait in a collective
// forever). Rank 0 names the first difference; the other ranks wait for it to end the job.
void check_same_on_every_rank(const SessionOptions& o, Device device) {
  dist::World& w = dist::world();
  if (!w.distributed()) return;
  std::ostringstream mine;
  mine << "--model " << o.model << "\n--batch " << o.batch << "\n--device " << device.str()
       << "\n--seed " << o.seed << "\n--lr " << number_text(o.lr) << "\n--weight-decay "
       << number_text(o.weight_decay) << "\n--shard " << o.shard << "\n--bucket-size "
       << o.bucket_size << "\n";
  for (const auto& [flag, value] : run_flags(o)) mine << flag << " " << value << "\n";
  const std::vector<std::string> all = w.all_gather(mine.str());
  if (w.rank() != 0) {
    for (const std::string& other : all) {
      if (other != all[0]) {
        w.barrier();  // rank 0 ends the job with the difference
      }
    }
    return;
  }
  auto lines = [](const std::string& text) {
    std::vector<std::string> out;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) out.push_back(line);
    return out;
  };
  const std::vector<std::string> ref = lines(all[0]);
  for (size_t r = 1; r < all.size(); ++r) {
    if (all[r] == all[0]) continue;
    const std::vector<std::string> got = lines(all[r]);
    for (size_t i = 0; i < std::max(ref.size(), got.size()); ++i) {
      const std::string a = i < ref.size() ? ref[i] : "(nothing)";
      const std::string b = i < got.size() ? got[i] : "(nothing)";
      REGEN_CHECK(a == b, "rank ", r, " of ", all.size(), " runs with ", b,
                  " where rank 0 runs with ", a,
                  ": every rank of a data-parallel job must train the same step (give every "
                  "rank the same options and environment, OMP_NUM_THREADS included)");
    }
  }
}

}  // namespace

std::unique_ptr<Session> make_session(const SessionOptions& options, Preflight preflight) {
  auto s = std::make_unique<Session>();
  s->options = options;
  s->config = options.model_config();  // validates every option first
  s->device = resolve_device(options.device, options.style);
  s->precision = resolve_precision(options, s->device);
  apply_runtime_options(options, s->device);
  const ModelConfig& c = s->config;
  REGEN_CHECK(options.conv == "native" || s->device.is_cuda(),
              option_setting("conv", options.conv, options.style), " applies to CUDA devices; on ",
              s->device.str(), " convolution is regen's own");
#ifndef REGEN_WITH_CUDA
  REGEN_CHECK(options.conv == "native", option_setting("conv", options.conv, options.style),
              " needs a CUDA build");
#endif
  // Data parallelism: every rank trains the same step on its own shard of each global batch.
  dist::World& world = dist::world();
  check_same_on_every_rank(options, s->device);
  if (world.distributed()) {
    // Accumulation runs the micro-batches before the last without the sync (DDP's no_sync), their
    // gradients adding up in each rank's buffers; ZeRO-2 keeps no whole gradients between
    // micro-batches to add into (docs/distributed.md).
    REGEN_CHECK(options.accumulate == 1 || options.shard != "gradients",
                option_setting("accumulate", std::to_string(options.accumulate), options.style),
                " with ", option_setting("shard", options.shard, options.style),
                " (ZeRO-2) under mpirun is not supported: ZeRO-2 keeps only this rank's shard of "
                "the gradients, so there is nothing to accumulate the micro-batches into; use ",
                option_setting("shard", "optimizer", options.style), " (ZeRO-1), ",
                option_setting("shard", "parameters", options.style),
                " (ZeRO-3: whole gradients kept across the micro-batches) or ",
                option_setting("accumulate", "1", options.style));
  }
  // The data before the model: a wrong file fails before a large model is built.
  std::unique_ptr<DataSource> data =
      make_training_source(options.data, c, options.seed, options.holdout(), options.style);
  if (world.distributed()) {
    data = std::make_unique<dist::ShardedSource>(std::move(data), world.rank(), world.size());
  }
  s->data = std::make_unique<CheckedSource>(std::move(data), c);
  if (options.eval_every > 0) {
    s->eval_data =
        make_eval_source(options.data, c, options.seed, options.holdout(), options.style);
  }
  const LrSchedule schedule = options.schedule();
  // What the trainer does besides forward, backward and the update: the dry run does it too.
  // The packed-save decisions are learned just before the dry run (below), which uses them too.
  Session* const session = s.get();
  auto setup_trainer = [&options, session](Trainer& t) {
    t.set_precision(session->precision);
    t.set_accumulation(options.accumulate);
    t.set_clip_grad_norm(options.clip_grad_norm);
    t.set_track_grad_norm(options.grad_norm);
    if (session->packed_saves) t.set_packed_saves(session->packed_saves);
  };
  auto make_sync = [&](Model& model) -> std::unique_ptr<GradientSync> {
    if (!world.distributed()) return nullptr;
    dist::DataParallelOptions o;
    o.shard = dist::parse_shard_mode(options.shard);
    o.bucket_bytes = options.bucket_size;
    o.accumulate = options.accumulate;
    o.first_bucket_bytes = std::min(o.first_bucket_bytes, o.bucket_bytes);
    return std::make_unique<dist::DataParallel>(model, dist::communicator_for(model.device()), o);
  };
  auto make_optimizer = [&options](Model& model, GradientSync* sync) -> std::unique_ptr<Optimizer> {
    // Under ZeRO the optimizer owns this rank's slices of the parameters only.
    std::vector<Tensor> params = sync ? sync->optimizer_parameters() : model.parameters();
    if (options.optimizer == "sgd") {
      SGDOptions o;
      o.lr = options.lr;
      o.momentum = options.momentum;
      o.weight_decay = options.weight_decay;
      return std::make_unique<SGD>(std::move(params), o);
    }
    AdamWOptions o;
    o.lr = options.lr;
    o.weight_decay = options.weight_decay;
    if (model_info(model.config().name).input.decay_matrices_only) {
      o.decay = DecayScope::matrices;
      // Sharded optimizer state is flat pieces of buckets, which mix matrices and biases.
      REGEN_CHECK(!sync || options.weight_decay == 0.0 || options.shard == "none", "model '",
                  model.config().name, "' decays its matrices only, which ",
                  option_setting("shard", options.shard, options.style),
                  " cannot select yet (its optimizer holds flat pieces of buckets): use ",
                  option_setting("shard", "none", options.style), " or ",
                  option_setting("weight_decay", "0", options.style));
    }
    return std::make_unique<AdamW>(std::move(params), o);
  };
  // The parameters alone first, from a model built dry: a model far past the memory (a vocabulary
  // of billions) is refused at once, where its step's dry run would request its scratch tile by
  // tile for minutes.
  if (preflight != Preflight::none) {
    const int64_t have = available_memory(s->device);
    int64_t params = 0;
    try {
      params = dry_run_parameter_bytes(c, s->device);
    } catch (const Error&) {
      params = 0;  // the step's dry run below stops there too, and says why with the sizes
    }
    if (have > 0 && params > have) refuse_model_state(*s, params, have, true);
  }
  // A dry run's time grows with the batch: no kernel runs, but the kernels request their scratch
  // as they would (per sample and head, per tile). Before a large batch's, two small steps run
  // dry tell how its requests and its peak grow: a step that would take millions of requests
  // to measure (minutes) and is far past the memory available is refused from them, roughly.
  if (preflight == Preflight::step && options.batch >= kProbeBatch) {
    const int64_t have = available_memory(s->device);
    // Batches 2 and 3: batch norm trains on any map of two values a channel.
    DryRunResult one, two;
    try {
      one = dry_run_step(c, 2, s->device, make_optimizer, make_sync, setup_trainer);
      two = dry_run_step(c, 3, s->device, make_optimizer, make_sync, setup_trainer);
    } catch (const Error&) {
      // A batch this small cannot run (a model's own check): the full dry run says why.
      one = two = DryRunResult{};
    }
    const auto grown = [&](double at2, double at3) {
      return at2 + std::max(0.0, at3 - at2) * static_cast<double>(options.batch - 2);
    };
    const double requests = grown(static_cast<double>(one.memory.num_allocs),
                                  static_cast<double>(two.memory.num_allocs));
    const double need = grown(static_cast<double>(one.memory.allocated.peak),
                              static_cast<double>(two.memory.allocated.peak));
    if (have > 0 && requests > kMaxDryRequests && need > 2.0 * static_cast<double>(have)) {
      char about[64];
      std::snprintf(about, sizeof about, "%.3g", requests);
      REGEN_FAIL(size_options(*s), " is too large for memory: one ", c.name,
                 " training step without remat needs about ",
                 format_bytes(static_cast<int64_t>(std::min(need, 9e18))),
                 " (grown from dry runs at batch 2 and 3; the exact dry run would make about ",
                 about, " requests, minutes of work), but ", s->device.str(), " has ",
                 format_bytes(have), " available; ", smaller(options));
    }
  }
  // The environment's choice of CPU convolution algorithm (REGEN_CPU_CONV), checked here so that
  // a bad value is named as itself, not as a size the dry run below could not handle.
  // The same for the register tile (REGEN_CPU_ISA), which a model without large products (a tiny
  // Transformer's run on Eigen alone) would otherwise never read.
  if (s->device.is_cpu()) {
    cpu::conv2d_algorithm();
    cpu::cpu_tile_name();
  }
  // The first step, run dry: its memory, exact, before any of it is used; first, with masks on,
  // which ops save packed forms (a dry forward pass of its own).
  try {
    if (options.masks) {
      s->packed_saves = std::make_shared<const PackedSaves>(
          learn_packed_saves(c, options.batch, s->device, s->precision));
    }
    s->preflight =
        dry_run_step(c, options.batch, s->device, make_optimizer, make_sync, setup_trainer);
  } catch (const Error& e) {
    // Options that pass their own checks and still stop a dry run mostly do so by size: a request
    // beyond any device's (the Null arena maps anything else), an index type's limit, an
    // overflow. Say which options set the sizes; an error of another kind (a model's own code)
    // is passed on as it is, with them.
    if (dynamic_cast<const OutOfMemory*>(&e) != nullptr) {
      REGEN_FAIL(size_options(*s), " is too large for any memory: a dry run of one ", c.name,
                 " step stops at ", e.message(), "; ", smaller(options));
    }
    REGEN_FAIL(size_options(*s), ": a dry run of one ", c.name, " step fails: ", e.message(),
               " (if a size is the cause: ", smaller(options), ")");
  }
  check_preflight(*s, preflight);
  manual_seed(options.seed);
  s->model = make_model(c, s->device);
  // Each rank draws its own dropout masks (rank 0 those of one process with the same seed).
  if (world.distributed()) manual_seed(dist::rank_seed(options.seed, world.rank()));
  s->sync = make_sync(*s->model);
  s->optimizer = make_optimizer(*s->model, s->sync.get());
  s->trainer =
      std::make_unique<Trainer>(*s->model, *s->optimizer, *s->data, options.batch, s->device);
  setup_trainer(*s->trainer);
  s->trainer->set_schedule(schedule);
  s->trainer->set_gradient_sync(s->sync.get());
  s->trainer->set_compression(parse_compression(options.compress));
  // The graph's state block is a persistent tensor made with the others (Trainer::prepare), so
  // that profiles and plans count it; only a CUDA device captures.
  if (options.cuda_graph != "off" && s->device.is_cuda()) s->trainer->set_cuda_graph(true);
  return s;
}

EvalResult evaluate_session(Session& s) {
  const SessionOptions& o = s.options;
  if (!s.eval_data) {
    const double holdout = o.holdout() > 0 ? o.holdout() : kDefaultHoldout;
    s.eval_data = make_eval_source(o.data, s.config, o.seed, holdout, o.style);
  }
  AutocastScope autocast(low_dtype(s.precision));
  return evaluate(*s.model, *s.eval_data, o.evaluation_batch(), o.eval_batches);
}

}  // namespace regen
