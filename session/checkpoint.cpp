// Checkpoints and training states (checkpoint.h).
#include "regen/session/checkpoint.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <set>
#include <sstream>

#include "regen/core/io.h"
#include "regen/core/numeric.h"
#include "regen/core/safetensors.h"
#include "regen/dist/data_parallel.h"
#include "regen/dist/world.h"
#include "regen/remat/execute/pipeline.h"
#include "regen/remat/plan/compress.h"

#ifdef REGEN_WITH_CUDA
#include "regen/core/cuda/runtime.h"
#include "regen/kernels/cuda/cuda_kernels.h"
#endif

namespace regen {

namespace {
// The flat index of the first value of `t` that is not finite, or -1.
int64_t first_bad(const Tensor& t) {
  if (!t.defined() || t.numel() == 0) return -1;
  auto scan = [](const auto* d, int64_t n) -> int64_t {
    int64_t first = n;
#pragma omp parallel for reduction(min : first) if (n > (int64_t{1} << 16))
    for (int64_t i = 0; i < n; ++i) {
      if (!std::isfinite(d[i]) && i < first) first = i;
    }
    return first < n ? first : -1;
  };
  if (t.device().is_cpu()) {
    if (t.dtype() == DType::f32) return scan(t.data<float>(), t.numel());
    if (t.dtype() == DType::f64) return scan(t.data<double>(), t.numel());
    return -1;
  }
  if (t.dtype() != DType::f32) return -1;
  const std::vector<float> v = t.to_vector<float>();
  return scan(v.data(), static_cast<int64_t>(v.size()));
}
double value_at(const Tensor& t, int64_t i) {
  if (t.device().is_cpu())
    return t.dtype() == DType::f64 ? t.data<double>()[i] : t.data<float>()[i];
  return t.to_vector<float>()[static_cast<size_t>(i)];
}
}  // namespace

std::string first_non_finite(const NamedTensors& tensors) {
  for (const auto& [name, t] : tensors) {
    const int64_t i = first_bad(t);
    if (i >= 0) {
      std::ostringstream os;
      os << "tensor '" << name << "' holds " << value_at(t, i) << " at flat index " << i;
      return os.str();
    }
  }
  return "";
}

std::string first_non_finite(const Model& model, bool gradients) {
  for (const auto& [name, p] : model.named_parameters()) {
    if (!p.has_storage()) continue;  // ZeRO-3 dropped its bytes: each rank keeps a shard
    for (const bool grad : {false, true}) {
      if (grad && !gradients) continue;
      const Tensor t = grad ? p.grad() : p;
      const int64_t i = first_bad(t);
      if (i >= 0) {
        std::ostringstream os;
        os << (grad ? "gradient of '" : "parameter '") << name << "' holds " << value_at(t, i)
           << " at flat index " << i;
        return os.str();
      }
    }
  }
  return "";
}

void save_checkpoint(const Session& s, const std::string& path, int64_t steps) {
  // Under mpirun rank 0 writes (every rank holds the same parameters); the others wait until the
  // file is there.
  dist::World& world = dist::world();
  // ZeRO-3: every rank gathers the whole parameters for rank 0 to write, and drops them after.
  const dist::WholeParameters whole(s.sync.get());
  if (world.rank() != 0) {
    world.barrier();
    return;
  }
  const ModelConfig& c = s.config;
  std::map<std::string, std::string> meta = {
      {"format", "regen-checkpoint-1"}, {"model", c.name}, {"steps", std::to_string(steps)}};
  // The options that shape parameters (load_checkpoint compares them) and those recorded for
  // information (how the run computed its loss: the parameters are the same either way).
  for (const ModelOption& opt : model_info(c.name).input.options) {
    if (opt.sizes_parameters || opt.recorded) meta[opt.key] = option_value_text(opt, opt.get(c));
  }
  save_safetensors(path, s.model->state_dict(), meta);
  world.barrier();
}

namespace {
constexpr const char* kStateFormat = "regen-training-state-1";
constexpr const char* kOptimizerPrefix = "optimizer/";  // never in a torch.nn state dict name
// ZeRO-3: a rank's chunk of a parameter in its training state's file ("shard/NAME").
constexpr const char* kShardPrefix = "shard/";

bool starts_with(const std::string& s, const char* prefix) {
  return s.rfind(prefix, 0) == 0;
}

// The session's ZeRO-3 data parallelism, or null (one process, another shard mode).
dist::DataParallel* zero3(const Session& s) {
  auto* dp = dynamic_cast<dist::DataParallel*>(s.sync.get());
  return dp != nullptr && dp->options().shard == dist::ShardMode::parameters ? dp : nullptr;
}

// The weights of a checkpoint or training state, loaded into the session's model.
size_t load_weights(Session& s, const SafetensorsFile& all, const std::string& path) {
  SafetensorsFile file;
  file.metadata = all.metadata;
  for (const auto& kv : all.tensors) {
    if (!starts_with(kv.first, kOptimizerPrefix) && !starts_with(kv.first, kShardPrefix))
      file.tensors.push_back(kv);
  }
  const ModelConfig& c = s.config;
  const OptionStyle style = s.options.style;
  const auto& meta = file.metadata;
  const auto model = meta.find("model");
  if (model != meta.end()) {
    REGEN_CHECK(model->second == c.name, "checkpoint ", path, " was saved from model ",
                model->second, ", not ", c.name, " (pass ",
                style == OptionStyle::keyword ? "regen.Model('" + model->second + "')"
                                              : "--model " + model->second,
                ")");
    for (const ModelOption& opt : model_info(c.name).input.options) {
      if (!opt.sizes_parameters) continue;
      const auto it = meta.find(opt.key);
      const std::string value = option_value_text(opt, opt.get(c));
      REGEN_CHECK(it == meta.end() || it->second == value, "checkpoint ", path, " was saved from ",
                  c.name, " with ", option_setting(opt.key, it->second, style),
                  ", but this run's model has ", value, " (pass ",
                  option_setting(opt.key, it->second, style), ")");
    }
  }
  // Weights that are not finite would train into NaN silently: refused with the tensor and index.
  const std::string bad = first_non_finite(file.tensors);  // f32 and f64 tensors, read in place
  REGEN_CHECK(bad.empty(), "checkpoint ", path, ": ", bad, " (weights must be finite)");
  try {
    // ZeRO-3: the parameters whole for the load (every rank loads), then each rank's chunk of them.
    dist::DataParallel* dp = zero3(s);
    const dist::WholeParameters whole(dp);
    s.model->load_state_dict(file.tensors);
    if (dp) dp->shard_whole_parameters();
  } catch (const Error& e) {
    REGEN_FAIL("checkpoint ", path, " does not fit model ", c.name,
               model == meta.end() ? " (it names no model)" : "", ": ", e.message());
  }
  return file.tensors.size();
}
}  // namespace

size_t load_checkpoint(Session& s, const std::string& path) {
  // The step's persistent tensors first, where a run that loads nothing places them: the file's
  // tensors, read next and freed once copied, then leave the allocator's live blocks as they
  // would be (a plan from a profile checks them at every step's start).
  s.trainer->prepare();
  return load_weights(s, load_safetensors(path), path);
}

std::map<std::string, std::string> trajectory_options(const SessionOptions& o) {
  std::map<std::string, std::string> r;
  r["batch"] = std::to_string(o.batch);
  r["accumulate"] = std::to_string(o.accumulate);
  r["optimizer"] = o.optimizer;
  r["lr"] = number_text(o.lr);
  if (o.optimizer == "sgd") r["momentum"] = number_text(o.momentum);
  r["weight_decay"] = number_text(o.weight_decay);
  r["seed"] = std::to_string(o.seed);
  r["data"] = o.data.empty() ? "synthetic" : o.data;
  r["lr_schedule"] = o.lr_schedule;
  r["warmup_steps"] = std::to_string(o.warmup_steps);
  if (o.lr_schedule == "cosine") {
    r["schedule_steps"] = std::to_string(o.schedule_steps);
    r["lr_min"] = number_text(o.lr_min);
  }
  if (o.lr_schedule == "step") {
    r["lr_step_size"] = std::to_string(o.lr_step_size);
    r["lr_gamma"] = number_text(o.lr_gamma);
  }
  r["clip_grad_norm"] = number_text(o.clip_grad_norm);
  r["precision"] = precision_name(resolve_precision(o, resolve_device(o.device, o.style)));
  const ModelConfig c = o.model_config();
  // What a text file's training part is; other data hold out examples of their own, and their
  // training examples do not depend on it.
  if (data_split_by_holdout(o.data, c, o.style)) r["eval_split"] = number_text(o.holdout());
  for (const ModelOption& opt : model_info(o.model).input.options) {
    r[opt.key] = option_value_text(opt, opt.get(c));
  }
  return r;
}

std::map<std::string, std::string> plan_identity(const Plan& plan) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the decisions
  int64_t recomputed = 0;
  for (const Decision d : plan.decisions) {
    h = (h ^ static_cast<uint64_t>(d)) * 1099511628211ull;
    recomputed += d == Decision::recompute ? 1 : 0;
  }
  char hash[20];
  std::snprintf(hash, sizeof hash, "%016llx", static_cast<unsigned long long>(h));
  return {{"plan", plan.policy + ", budget " + plan.budget_text + " of " +
                       budget_of_name(plan.budget_of) + " bytes, " + std::to_string(recomputed) +
                       " of " + std::to_string(plan.decisions.size()) + " recomputed, decisions " +
                       hash}};
}

// ---------------------------------------------------------------------------------------------
// Training states. Under mpirun a state is a file per rank, committed together (checkpoint.h).

namespace {

// Rank `rank`'s file of a state of `ranks` ranks at `path`, in `slot` ("a" or "b"); rank 0's is
// `path` itself.
std::string rank_file(const std::string& path, int rank, int ranks, const std::string& slot) {
  if (rank == 0) return path;
  return path + ".rank" + std::to_string(rank) + "-of-" + std::to_string(ranks) + "." + slot;
}

// A number in a state's metadata, or -1 when it is absent or not a number.
int64_t meta_int(const std::map<std::string, std::string>& meta, const char* key) {
  const auto it = meta.find(key);
  return it == meta.end() ? -1 : parse_count(it->second);
}

// The ranks that saved a state (1 for one process, and for states from before they were recorded).
int saved_ranks(const std::map<std::string, std::string>& meta) {
  const int64_t n = meta_int(meta, "ranks");
  return n < 1 ? 1 : static_cast<int>(std::min<int64_t>(n, int64_t{1} << 24));
}

// What the state now at `path` is made of, read from its first file's header: its rank count and
// the slot of its other ranks' files ("" when it has none, or is no state, or cannot be read).
struct ExistingState {
  int ranks = 1;
  std::string slot;
};
ExistingState existing_state(const std::string& path) {
  ExistingState e;
  try {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(path, ec)) return e;
    const std::map<std::string, std::string> meta = read_safetensors_metadata(path);
    const auto format = meta.find("format");
    const auto slot = meta.find("slot");
    if (format == meta.end() || format->second != kStateFormat || slot == meta.end()) return e;
    if (slot->second != "a" && slot->second != "b") return e;
    e.ranks = saved_ranks(meta);
    e.slot = slot->second;
  } catch (const std::exception&) {
    // A file that is no state: it has no rank files, and is replaced as any file is.
  }
  return e;
}

// The files of ranks 1.. of a state that nothing names any more (best effort: a rank file on
// another host's disk is not reachable from here, and one already gone is fine).
void remove_rank_files(const std::string& path, int ranks, const std::string& slot, int from,
                       int to) {
  if (slot.empty()) return;
  for (int r = std::max(from, 1); r < std::min(to, ranks); ++r) {
    std::error_code ec;
    std::filesystem::remove(rank_file(path, r, ranks, slot), ec);
  }
}

// Every rank's `error` ("" for none) gathered: when a rank has one, every rank throws the first
// by rank, so that all leave together and none waits in a collective for a peer that left.
void agree(dist::World& world, const std::string& error) {
  if (!world.distributed()) {
    if (!error.empty()) REGEN_FAIL(error);
    return;
  }
  for (const std::string& e : world.all_gather(error)) {
    if (!e.empty()) REGEN_FAIL(e);
  }
}

// How messages name the state: "--save-state FILE" / "save_state('FILE')", "--resume FILE" /
// "resume('FILE')".
std::string save_call(const Session& s, const std::string& path) {
  return s.options.style == OptionStyle::keyword ? "save_state('" + path + "')"
                                                 : "--save-state " + path;
}
std::string resume_call(const Session& s) {
  return s.options.style == OptionStyle::keyword ? "resume" : "--resume";
}
// "mpirun -np 2 with --shard optimizer", what a state of `ranks` ranks resumes under.
std::string launch_text(const Session& s, int ranks, const std::string& shard) {
  if (ranks <= 1) return "one process (no mpirun)";
  return "mpirun -np " + std::to_string(ranks) + " with " +
         option_setting("shard",
                        s.options.style == OptionStyle::keyword ? "'" + shard + "'" : shard,
                        s.options.style);
}

// What one process (or one rank) writes: metadata and tensors.
std::map<std::string, std::string> state_metadata(const Session& s,
                                                  const std::map<std::string, std::string>& extra) {
  const ModelConfig& c = s.config;
  const Trainer& t = *s.trainer;
  std::map<std::string, std::string> meta = extra;
  meta["format"] = kStateFormat;
  meta["model"] = c.name;
  meta["steps"] = std::to_string(t.optimizer_steps());
  meta["optimizer_steps"] = std::to_string(t.optimizer_steps());
  meta["rng_seed"] = std::to_string(rng_seed());
  meta["rng_stream"] = std::to_string(rng_stream_position());
  meta["data_position"] = s.data->position();
  meta["device"] = s.device.str();
  meta["threads"] =
      std::to_string(s.options.threads > 0 ? s.options.threads : omp_get_max_threads());
  for (const ModelOption& opt : model_info(c.name).input.options) {
    if (opt.sizes_parameters || opt.recorded) meta[opt.key] = option_value_text(opt, opt.get(c));
  }
  for (const auto& [key, value] : trajectory_options(s.options)) meta["train." + key] = value;
  if (t.precision() == Precision::fp16) {  // the loss scale goes on where it stopped
    meta["loss_scale"] = number_text(t.loss_scale().scale);
    meta["loss_scale_good_steps"] = std::to_string(t.loss_scale().good_steps);
    meta["loss_scale_skipped"] = std::to_string(t.loss_scale().skipped);
  }
  return meta;
}

NamedTensors state_tensors(const Session& s) {
  NamedTensors tensors;
  if (const dist::DataParallel* dp = zero3(s)) {
    // ZeRO-3: every rank's chunks; rank 0's file also has the whole weights (gathered for the save:
    // --load reads them), the others' the buffers only.
    std::set<std::string> sharded;
    for (const auto& [name, shard] : dp->parameter_shards()) {
      sharded.insert(name);
      tensors.emplace_back(kShardPrefix + name, shard);
    }
    for (const auto& [name, t] : s.model->state_dict()) {
      if (dist::world().rank() == 0 || sharded.count(name) == 0) tensors.emplace_back(name, t);
    }
  } else {
    tensors = s.model->state_dict();
  }
  for (const auto& [name, st] : s.optimizer->named_state())
    tensors.emplace_back(kOptimizerPrefix + name, st);
  const std::vector<int64_t> steps = s.optimizer->step_counts();
  tensors.emplace_back(std::string(kOptimizerPrefix) + "steps",
                       from_vector<int64_t>(steps, {static_cast<int64_t>(steps.size())}));
  return tensors;
}

std::string exception_text(const std::exception& e) {
  const auto* err = dynamic_cast<const Error*>(&e);
  return err != nullptr ? err->message() : std::string(e.what());
}

}  // namespace

void save_training_state(const Session& s, const std::string& path,
                         const std::map<std::string, std::string>& extra) {
  dist::World& world = dist::world();
  // ZeRO-3: the whole parameters on every rank for the time of the save (rank 0's file holds
  // them), as a checkpoint's save gathers them.
  const dist::WholeParameters whole(zero3(s));
  std::map<std::string, std::string> meta = state_metadata(s, extra);
  const NamedTensors tensors = state_tensors(s);
  const int rank = world.rank(), ranks = world.size();
  meta["ranks"] = std::to_string(ranks);
  if (!world.distributed()) {
    // A state of several ranks replaced by one process's: its rank files go once the new file is
    // in place.
    const ExistingState old = existing_state(path);
    save_safetensors(path, tensors, meta);
    remove_rank_files(path, old.ranks, old.slot, 1, old.ranks);
    return;
  }
  // Rank 0 picks the slot that the state now at `path` does not name (so its files stay whole
  // until the new state is committed) and an id that every file of this save carries.
  std::string plan;
  if (rank == 0) {
    const ExistingState old = existing_state(path);
    const std::string slot = old.ranks == ranks && old.slot == "a" ? "b" : "a";
    const auto now = std::chrono::steady_clock::now().time_since_epoch().count();
    const std::string id =
        content_id(path + "|" + std::to_string(now) + "|" + std::to_string(::getpid()) + "|" +
                   std::to_string(s.trainer->optimizer_steps()));
    plan = slot + " " + id + " " + std::to_string(old.ranks) + " " +
           (old.slot.empty() ? "-" : old.slot);
  }
  plan = world.broadcast(plan, 0);
  std::istringstream in(plan);
  std::string slot, id, old_slot;
  int old_ranks = 1;
  in >> slot >> id >> old_ranks >> old_slot;
  if (old_slot == "-") old_slot.clear();
  meta["rank"] = std::to_string(rank);
  meta["shard"] = s.options.shard;
  meta["bucket_size"] = std::to_string(s.options.bucket_size);
  meta["save_id"] = id;
  meta["slot"] = slot;
  const std::string call = save_call(s, path);
  const std::string mine = rank_file(path, rank, ranks, slot);
  // 1. Every rank writes its file to a temporary beside it and flushes it to disk.
  std::unique_ptr<AtomicFileWriter> out;
  std::string error;
  try {
    out = std::make_unique<AtomicFileWriter>(mine);
    write_safetensors(*out, mine, tensors, meta);
  } catch (const std::exception& e) {
    out.reset();  // removes the temporary
    error = detail::str_cat(call, ": rank ", rank, " of ", ranks, " could not write ", mine, ": ",
                            exception_text(e),
                            "; every rank removed its temporary file, so no file of the state was "
                            "written (a state saved there before is as it was)");
  }
  for (const std::string& e : world.all_gather(error)) {
    if (!e.empty()) {
      out.reset();
      REGEN_FAIL(e);
    }
  }
  // 2. Ranks 1.. rename theirs into the slot no state names yet: an old state is untouched.
  error.clear();
  bool committed = false;
  if (rank != 0) {
    try {
      out->commit();
      committed = true;
    } catch (const std::exception& e) {
      error = detail::str_cat(call, ": rank ", rank, " of ", ranks,
                              " could not rename its file to ", mine, ": ", exception_text(e),
                              "; the other ranks removed theirs (a state saved there before is "
                              "as it was)");
    }
  }
  auto undo = [&](const std::string& e) {
    out.reset();
    if (committed) {
      std::error_code ec;
      std::filesystem::remove(mine, ec);
    }
    REGEN_FAIL(e);
  };
  for (const std::string& e : world.all_gather(error)) {
    if (!e.empty()) undo(e);
  }
  // 3. Rank 0 renames its file over `path`: the commit point. Before it, `path` is the old state
  // and names the old slot; after it, the new one.
  if (rank == 0) {
    try {
      out->commit();
    } catch (const std::exception& e) {
      error = detail::str_cat(call, ": rank 0 of ", ranks, " could not rename its file to ", path,
                              ": ", exception_text(e),
                              "; the other ranks removed theirs (a state saved there before is "
                              "as it was)");
    }
  }
  error = world.broadcast(error, 0);
  if (!error.empty()) undo(error);
  // 4. The files of the state replaced, which nothing names now: each rank its own, and rank 0
  // those of a state of another rank count.
  if (old_ranks == ranks && old_slot != slot)
    remove_rank_files(path, ranks, old_slot, rank, rank + 1);
  if (rank == 0 && old_ranks != ranks) remove_rank_files(path, old_ranks, old_slot, 1, old_ranks);
  world.barrier();
}

namespace {

// What a state's file holds besides the weights, checked against the session before anything is
// changed.
struct StateContents {
  uint64_t steps = 0, rng_stream = 0, seed = 0;
  std::map<std::string, Tensor> optimizer;
  std::vector<int64_t> counts;
};

void check_format(const Session& s, const std::map<std::string, std::string>& meta,
                  const std::string& path) {
  const OptionStyle style = s.options.style;
  const std::string what = resume_call(s);
  const auto format = meta.find("format");
  REGEN_CHECK(
      format != meta.end() && format->second == kStateFormat, what, " ", path,
      " is not a training state (",
      format == meta.end() ? std::string("no format in its metadata") : "format " + format->second,
      "): write one with ",
      style == OptionStyle::keyword ? "Model.save_state()" : "--save-state FILE",
      "; a checkpoint of weights alone loads with ",
      style == OptionStyle::keyword ? "Model.load()" : "--load");
}

// The rank count, shard mode and (under ZeRO) bucket size the state was saved with, against this
// run's: a state is not resharded.
void check_layout(const Session& s, const std::map<std::string, std::string>& meta,
                  const std::string& path) {
  const std::string what = resume_call(s);
  const int now = dist::world().size(), then = saved_ranks(meta);
  const auto shard_it = meta.find("shard");
  const std::string then_shard = shard_it == meta.end() ? "none" : shard_it->second;
  const std::string now_shard = now > 1 ? s.options.shard : "none";
  const auto ranks_text = [](int n) {
    return n <= 1 ? std::string("one process") : std::to_string(n) + " ranks under mpirun";
  };
  REGEN_CHECK(then == now, what, " ", path, " was saved by ", ranks_text(then),
              then > 1 ? " (" + option_setting("shard", then_shard, s.options.style) + ")" : "",
              ", but this run has ", ranks_text(now),
              ": a training state is not resharded (each rank keeps its own dropout stream and, "
              "under ZeRO, its own shard of the optimizer state); resume it under ",
              launch_text(s, then, then_shard));
  if (now <= 1) return;
  const bool keyword = s.options.style == OptionStyle::keyword;
  const auto shard_setting = [&](const std::string& v) {
    return option_setting("shard", keyword ? "'" + v + "'" : v, s.options.style);
  };
  REGEN_CHECK(then_shard == now_shard, what, " ", path, " was saved with ",
              shard_setting(then_shard), ", but this run has ", shard_setting(now_shard),
              ": a training state is not resharded (under ZeRO each rank's file holds its shard of "
              "the optimizer state); pass ",
              shard_setting(then_shard));
  // ZeRO-3's chunks depend on the rank count alone.
  if (now_shard == "none" || now_shard == "parameters") return;
  const int64_t then_bucket = meta_int(meta, "bucket_size");
  REGEN_CHECK(then_bucket == s.options.bucket_size, what, " ", path, " was saved with ",
              option_setting("bucket_size", std::to_string(then_bucket), s.options.style),
              ", but this run has ",
              option_setting("bucket_size", std::to_string(s.options.bucket_size), s.options.style),
              ": under ", shard_setting(now_shard),
              " each rank's optimizer state is its chunk of every bucket, so the buckets must be "
              "the same; pass ",
              option_setting("bucket_size", std::to_string(then_bucket), s.options.style));
}

// The model, the trajectory options, the counters and the optimizer's tensors of `file` (read
// from `path`, a training state: check_format), checked against the session; nothing is changed.
StateContents check_state(const Session& s, const SafetensorsFile& file, const std::string& path) {
  const auto& meta = file.metadata;
  const OptionStyle style = s.options.style;
  const std::string what = resume_call(s);
  const auto model = meta.find("model");
  REGEN_CHECK(model != meta.end() && model->second == s.config.name, what, " ", path,
              " was saved from model ", model == meta.end() ? "?" : model->second, ", not ",
              s.config.name);
  // Every option that shapes the trajectory must be the one the stopped run had: the optimizer
  // and the schedule first (the options that apply follow from them).
  const std::map<std::string, std::string> now_options = trajectory_options(s.options);
  std::vector<std::pair<std::string, std::string>> ordered(now_options.begin(), now_options.end());
  std::stable_partition(ordered.begin(), ordered.end(), [](const auto& kv) {
    return kv.first == "optimizer" || kv.first == "lr_schedule";
  });
  for (const auto& entry : ordered) {
    const std::string& key = entry.first;  // a plain reference: lambdas below capture it
    const std::string& now = entry.second;
    const auto it = meta.find("train." + key);
    // States saved before the precision was recorded trained in fp32.
    const std::string then = it != meta.end()     ? it->second
                             : key == "precision" ? "fp32"
                                                  : "(not recorded)";
    if (then == now) continue;
    const bool text = key == "optimizer" || key == "data" || key == "lr_schedule";
    const auto setting = [&](const std::string& v) {
      return option_setting(key, text && style == OptionStyle::keyword ? "'" + v + "'" : v, style);
    };
    REGEN_FAIL(what, " ", path, " was saved by a run with ", setting(then), ", but this run has ",
               setting(now),
               ": the resumed steps would not be the ones "
               "that run took (pass ",
               setting(then), ")");
  }
  auto number = [&](const char* key) -> uint64_t {
    const auto it = meta.find(key);
    REGEN_CHECK(it != meta.end(), what, " ", path, ": its metadata has no '", key, "'");
    const int64_t v = parse_count(it->second);
    REGEN_CHECK(v >= 0, what, " ", path, ": its metadata's '", key, "' is '", it->second,
                "', not a count (decimal digits, at most ", INT64_MAX, ")");
    return static_cast<uint64_t>(v);
  };
  StateContents c;
  c.steps = number("optimizer_steps");
  c.rng_stream = number("rng_stream");
  c.seed = number("rng_seed");
  if (s.trainer->precision() == Precision::fp16) {
    number("loss_scale_good_steps");
    number("loss_scale_skipped");
  }
  bool have_counts = false;
  for (const auto& [name, t] : file.tensors) {
    if (name.rfind(kOptimizerPrefix, 0) != 0) continue;
    const std::string rest = name.substr(std::string(kOptimizerPrefix).size());
    if (rest == "steps") {
      REGEN_CHECK(t.dtype() == DType::i64 && t.dim() == 1, what, " ", path, ": optimizer/steps is ",
                  t.str(), ", not a vector of i64");
      c.counts = t.to_vector<int64_t>();
      have_counts = true;
    } else {
      c.optimizer[rest] = t;
    }
  }
  REGEN_CHECK(have_counts, what, " ", path, ": no optimizer/steps (the file is damaged)");
  return c;
}

// ZeRO-3: this rank's chunks from its file's "shard/NAME" tensors, the buffers by name (rank 0's
// whole weights are for --load; the chunks are what the rank trains).
void load_zero3_weights(Session& s, dist::DataParallel& dp, const SafetensorsFile& file,
                        const std::string& path) {
  const std::string what = resume_call(s);
  std::map<std::string, Tensor> chunks;
  NamedTensors rest;
  const NamedTensors shards = dp.parameter_shards();
  std::set<std::string> sharded;
  for (const auto& kv : shards) sharded.insert(kv.first);
  for (const auto& [name, t] : file.tensors) {
    if (starts_with(name, kOptimizerPrefix)) continue;
    const std::string bad = first_non_finite(NamedTensors{{name, t}});
    REGEN_CHECK(bad.empty(), what, " ", path, ": ", bad, " (weights must be finite)");
    if (starts_with(name, kShardPrefix)) {
      chunks[name.substr(std::string(kShardPrefix).size())] = t;
    } else if (sharded.count(name) == 0) {
      rest.emplace_back(name, t);
    }
  }
  for (const auto& [name, shard] : shards) {
    const auto it = chunks.find(name);
    REGEN_CHECK(it != chunks.end(), what, " ", path, ": no chunk of parameter '", name,
                "' (a state saved with --shard parameters holds each rank's, as shard/", name, ")");
    REGEN_CHECK(it->second.shape() == shard.shape() && it->second.dtype() == shard.dtype(), what,
                " ", path, ": the chunk of '", name, "' is ", it->second.str(),
                ", but this rank's is ", shard.str());
  }
  for (const auto& entry : s.model->state_dict()) {
    const std::string& name = entry.first;  // a plain reference: a lambda cannot capture a binding
    if (sharded.count(name) > 0) continue;
    REGEN_CHECK(
        std::any_of(rest.begin(), rest.end(), [&](const auto& kv) { return kv.first == name; }),
        what, " ", path, ": no '", name, "' (the file is damaged)");
  }
  try {
    s.model->load_state_dict(rest, /*strict=*/false);
  } catch (const Error& e) {
    REGEN_FAIL(what, " ", path, " does not fit model ", s.config.name, ": ", e.message());
  }
  for (const auto& [name, shard] : shards) Tensor(shard).copy_from(chunks.at(name));
}

// Restores what check_state read: the weights, the optimizer state, the step count, the loss
// scale, the data position and the RNG.
void apply_state(Session& s, const SafetensorsFile& file, const StateContents& c,
                 const std::string& path) {
  const auto& meta = file.metadata;
  const std::string what = resume_call(s);
  if (dist::DataParallel* dp = zero3(s)) {
    load_zero3_weights(s, *dp, file, path);
  } else {
    load_weights(s, file, path);
  }
  try {
    s.optimizer->load_state(c.optimizer, c.counts);
  } catch (const Error& e) {
    REGEN_FAIL(what, " ", path, ": ", e.message());
  }
  s.trainer->set_optimizer_steps(static_cast<int64_t>(c.steps));
  if (s.trainer->precision() == Precision::fp16) {
    LossScale scale;
    const auto text = meta.find("loss_scale");
    REGEN_CHECK(text != meta.end(), what, " ", path, ": an fp16 state without its loss scale");
    char* end = nullptr;
    scale.scale = std::strtod(text->second.c_str(), &end);
    REGEN_CHECK(end && *end == '\0' && !text->second.empty(), what, " ", path, ": loss_scale '",
                text->second, "' is not a number");
    scale.good_steps = meta_int(meta, "loss_scale_good_steps");
    scale.skipped = meta_int(meta, "loss_scale_skipped");
    try {
      s.trainer->set_loss_scale(scale);
    } catch (const Error& e) {
      REGEN_FAIL(what, " ", path, ": ", e.message());
    }
  }
  const auto pos = meta.find("data_position");
  s.data->set_position(pos == meta.end() ? "" : pos->second);
  set_rng_state(c.seed, c.rng_stream);
}

}  // namespace

std::map<std::string, std::string> resume_training_state(Session& s, const std::string& path) {
  // Gradients and optimizer state in their places first, as a run from the first step has them
  // after its first: the file's tensors, read next and freed once copied, must not take those
  // places (a plan made from a profile checks every step's start against the profiled one's).
  s.trainer->prepare();
  dist::World& world = dist::world();
  const std::string what = resume_call(s);
  if (!world.distributed()) {
    const SafetensorsFile file = load_safetensors(path);
    check_format(s, file.metadata, path);
    check_layout(s, file.metadata, path);
    const StateContents c = check_state(s, file, path);
    apply_state(s, file, c, path);
    return file.metadata;
  }
  const int rank = world.rank(), ranks = world.size();
  // Rank 0 reads `path`, which names the save (its rank count, shard mode, slot and id); every
  // rank hears the verdict, so that all refuse together.
  SafetensorsFile file;
  std::string error, header;
  if (rank == 0) {
    try {
      file = load_safetensors(path);
      check_format(s, file.metadata, path);
      check_layout(s, file.metadata, path);
      const auto slot = file.metadata.find("slot");
      const auto id = file.metadata.find("save_id");
      REGEN_CHECK(slot != file.metadata.end() && id != file.metadata.end(), what, " ", path,
                  ": its metadata names no slot or save id (the file is damaged)");
      header = slot->second + " " + id->second;
    } catch (const std::exception& e) {
      error = exception_text(e);
    }
  }
  const std::string verdict = world.broadcast(error.empty() ? "ok " + header : "error " + error, 0);
  if (verdict.rfind("error ", 0) == 0) REGEN_FAIL(verdict.substr(6));
  std::istringstream in(verdict.substr(3));
  std::string slot, id;
  in >> slot >> id;
  const std::string mine = rank_file(path, rank, ranks, slot);
  // Every other rank reads its own file, which must be of the same save; then every rank checks
  // its file against its session, changing nothing yet.
  StateContents contents;
  try {
    if (rank != 0) {
      std::error_code ec;
      REGEN_CHECK(std::filesystem::exists(mine, ec), what, " ", path, ": rank ", rank, " of ",
                  ranks, "'s file ", mine,
                  " is missing (a state saved under mpirun is a file per rank; on several hosts, "
                  "each rank reads its own from its host)");
      file = load_safetensors(mine);
      check_format(s, file.metadata, mine);
      const auto their_id = file.metadata.find("save_id");
      REGEN_CHECK(
          their_id != file.metadata.end() && their_id->second == id &&
              meta_int(file.metadata, "rank") == rank && meta_int(file.metadata, "ranks") == ranks,
          what, " ", path, ": rank ", rank, " of ", ranks, "'s file ", mine,
          " is not of the save that ", path, " names (save id ",
          their_id == file.metadata.end() ? std::string("none") : their_id->second, ", rank ",
          meta_int(file.metadata, "rank"), " of ", meta_int(file.metadata, "ranks"), "; ", path,
          " names save ", id, "): it is another run's, or was copied from one");
    }
    contents = check_state(s, file, mine);
  } catch (const std::exception& e) {
    error = exception_text(e);  // it names the rank's file
  }
  agree(world, error);
  try {
    apply_state(s, file, contents, mine);
  } catch (const std::exception& e) {
    error = exception_text(e);
  }
  agree(world, error);
  return file.metadata;
}

}  // namespace regen
