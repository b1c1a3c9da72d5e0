// What profiles record (records.h).
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
// What profiles record

namespace {
// What run_flags records the CPU's convolution algorithm as (kernels.h conv2d_algorithm()).
constexpr const char* kCpuConvVariable = "REGEN_CPU_CONV";
// Under Winograd, the output tiles its forward chooses from (kernels/cpu/conv2d_winograd.h
// tile_size): F(4x4, 3x3) came later, with its own workspace and times.
constexpr const char* kWinogradTiles = "winograd-tiles";
constexpr const char* kWinogradTilesNow = "2x2,4x4";
// Under Winograd in bf16 or fp16, the element types it takes: 16-bit operands came later (their
// 3x3 convolutions ran the direct path before, with other workspace and times).
constexpr const char* kWinogradTypes = "winograd-types";
constexpr const char* kWinogradTypesNow = "f32,bf16,f16";
// In bf16 or fp16 on the CPU, the product size from which the attention's per-head products run
// on several threads (kernels/cpu/attention.cpp): 4 MFLOP before, with other workspace and times.
constexpr const char* kLowpAttentionThreads = "attention-16-bit-threads";
constexpr const char* kLowpAttentionThreadsNow = "from 2 MFLOP";
// In bf16 or fp16 on the CPU, how the 16-bit GEMMs that store 16 bits (kernels/cpu/gemm_lowp.h,
// gemm_lowp_store: linear, matmul and bmm) cut their products into strips: by rows only before,
// with other workspace and times where N > M.
constexpr const char* kLowpStrips = "16-bit-gemm-strips";
constexpr const char* kLowpStripsNow = "across the longer side";
// On the CPU in every precision, how the attention runs its heads (kernels/cpu/attention.cpp,
// heads_in_parallel): one at a time before, each product threaded, with other workspace and times.
constexpr const char* kAttentionHeads = "attention-heads";
constexpr const char* kAttentionHeadsNow = "in parallel up to 16 MFLOP a product";
// In bf16 or fp16 on every device, what a layer norm of an f32 input (a residual stream kept in
// fp32) saves for backward (autograd/ops_layernorm.cpp): the f32 input before, with other memory.
constexpr const char* kLayerNormSaves = "layernorm-16-bit-saves";
constexpr const char* kLayerNormSavesNow = "normalized input";
bool is_16_bit(const std::string& precision) {
  return precision == "bf16" || precision == "fp16";
}
}  // namespace

std::map<std::string, std::string> run_flags(const SessionOptions& o) {
  const ModelConfig c = o.model_config();
  const Device device = resolve_device(o.device, o.style);
  std::map<std::string, std::string> r;
  r["--optimizer"] = o.optimizer;
  if (o.optimizer == "sgd") {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", o.momentum);
    r["--momentum"] = buf;
  }
  r["--threads"] = std::to_string(o.threads > 0 ? o.threads : omp_get_max_threads());
  r["--data"] = o.data.empty() ? "synthetic" : o.data.substr(0, o.data.find(':'));
  for (const ModelOption& opt : model_info(o.model).input.options) {
    r[option_name(opt.key, OptionStyle::flag)] = option_value_text(opt, opt.get(c));
  }
  // The precision (fp32 on the CPU unless asked; it holds the CUDA math mode, --math, too).
  r["--precision"] = precision_name(resolve_precision(o, device));
  if (device.is_cuda()) r["--conv"] = o.conv;
  if (is_16_bit(r["--precision"])) r[kLayerNormSaves] = kLayerNormSavesNow;
  // The CPU's 3x3 convolutions: Winograd or the direct GEMM (their workspace and time differ).
  if (device.is_cpu()) {
    r[kCpuConvVariable] = cpu::conv2d_algorithm();
    if (r[kCpuConvVariable] == "winograd") {
      r[kWinogradTiles] = kWinogradTilesNow;
      if (is_16_bit(r["--precision"])) r[kWinogradTypes] = kWinogradTypesNow;
    }
    r[kAttentionHeads] = kAttentionHeadsNow;
    if (is_16_bit(r["--precision"])) {
      r[kLowpAttentionThreads] = kLowpAttentionThreadsNow;
      r[kLowpStrips] = kLowpStripsNow;
    }
  }
  // What the step allocates besides forward and backward: micro-batches, the gradient norm.
  r["--accumulate"] = std::to_string(o.accumulate);
  // fp16's loss scaling checks the gradients for overflow through their norm at every step.
  r["--grad-norm"] = o.clip_grad_norm > 0 || o.grad_norm || o.precision == "fp16" ? "on" : "off";
  // Data parallelism: the ranks, and what shapes each rank's step (a process alone records none).
  const dist::World& world = dist::world();
  if (world.distributed()) {
    r["--ranks"] = std::to_string(world.size());
    r["--shard"] = o.shard;
    r["--bucket-size"] = std::to_string(o.bucket_size);
  }
  r["--masks"] = o.masks ? "on" : "off";
  r["--compress"] = o.compress;
  return r;
}

namespace {
// Flags a profile made before they were recorded ran with these values.
const std::map<std::string, std::string>& flags_before_recorded() {
  static const std::map<std::string, std::string> m = {{"--accumulate", "1"},
                                                       {"--grad-norm", "off"}};
  return m;
}
}  // namespace

std::string profile_precision(const Profile& p) {
  const auto precision = p.run.find("--precision");
  return precision != p.run.end() ? precision->second : profile_math(p);
}

std::string profile_math(const Profile& p) {
  const auto precision = p.run.find("--precision");
  if (precision != p.run.end()) return precision->second == "tf32" ? "tf32" : "fp32";
  const auto math = p.run.find("--math");
  if (math != p.run.end()) return math->second;
  const auto tf32 = p.run.find("--tf32");
  return tf32 != p.run.end() && tf32->second == "on" ? "tf32" : "fp32";
}

void check_profile_run(const Profile& p, const SessionOptions& o, const std::string& what) {
  const std::map<std::string, std::string> now = run_flags(o);
  // The optimizer first: other flags (its momentum) follow from it.
  std::vector<std::pair<std::string, std::string>> recorded(p.run.begin(), p.run.end());
  // A flag recorded since (a profile of any age has the step of its value then): compared too.
  // Only a profile that recorded flags at all (an empty set is a profile from before them).
  if (!p.run.empty()) {
    for (const auto& [flag, value] : flags_before_recorded()) {
      if (p.run.count(flag) == 0) recorded.emplace_back(flag, value);
    }
  }
  std::stable_partition(recorded.begin(), recorded.end(),
                        [](const auto& kv) { return kv.first == "--optimizer"; });
  // Profiles written before packed saves were made without them.
  if (p.run.count("--masks") == 0 && !p.run.empty()) recorded.emplace_back("--masks", "off");
  if (p.run.count("--compress") == 0 && !p.run.empty()) {
    recorded.emplace_back("--compress", compression_name(p.compress));
  }
  // CPU profiles written before the convolution algorithm was recorded ran the direct path
  // (Winograd was opt-in then). It matters only where the step has a convolution.
  const bool has_conv = std::any_of(p.nodes.begin(), p.nodes.end(),
                                    [](const ProfileNode& n) { return n.op == "conv2d"; });
  if (!has_conv) {
    recorded.erase(std::remove_if(recorded.begin(), recorded.end(),
                                  [](const auto& kv) {
                                    return kv.first == kCpuConvVariable ||
                                           kv.first == kWinogradTiles || kv.first == kWinogradTypes;
                                  }),
                   recorded.end());
  } else if (p.run.count(kCpuConvVariable) == 0 && !p.run.empty() && p.device == "cpu") {
    recorded.emplace_back(kCpuConvVariable, "direct");
  } else if (p.run.count(kCpuConvVariable) != 0 && p.run.at(kCpuConvVariable) == "winograd") {
    if (p.run.count(kWinogradTiles) == 0) {
      recorded.emplace_back(kWinogradTiles, "2x2");  // before F(4x4, 3x3)
    }
    if (p.run.count(kWinogradTypes) == 0 && is_16_bit(profile_precision(p))) {
      recorded.emplace_back(kWinogradTypes, "f32");  // before 16-bit Winograd
    }
  }
  // Profiles with a fused LM head written before --lm-head-recompute: their head took other memory
  // and time (16-bit heads always recomputed their logits in backward; f32 heads' gradient products
  // packed a (vocab, rows) operand whole).
  const bool has_head = std::any_of(p.nodes.begin(), p.nodes.end(), [](const ProfileNode& n) {
    return n.op == "linear_cross_entropy";
  });
  REGEN_CHECK(!has_head || p.run.empty() || p.run.count("--lm-head-recompute") != 0, what,
              " was made by a regen whose fused LM head (linear_cross_entropy) took other memory "
              "and time (from before --lm-head-recompute): its step is another's (profile again)");
  // A setting of the kernels (the 16-bit ones when lowp) that changes only the steps with one of
  // `ops`: dropped from the comparison when the profile has none of them, and taken as `before`
  // for a profile (a 16-bit one when lowp; a CPU one when cpu_only) written before it was
  // recorded.
  const auto kernel_setting = [&](const char* flag, std::initializer_list<const char*> ops,
                                  const char* before, bool lowp, bool cpu_only) {
    const bool has_op = std::any_of(p.nodes.begin(), p.nodes.end(), [&](const ProfileNode& n) {
      return std::any_of(ops.begin(), ops.end(), [&](const char* op) { return n.op == op; });
    });
    if (!has_op) {
      recorded.erase(std::remove_if(recorded.begin(), recorded.end(),
                                    [&](const auto& kv) { return kv.first == flag; }),
                     recorded.end());
    } else if (p.run.count(flag) == 0 && !p.run.empty() && (!cpu_only || p.device == "cpu") &&
               (!lowp || is_16_bit(profile_precision(p)))) {
      recorded.emplace_back(flag, before);
    }
  };
  // The attention's per-head products threaded from 4 MFLOP before; the 16-bit GEMMs that store
  // 16 bits cut their products by rows; the attention ran its heads one at a time.
  kernel_setting(kLowpAttentionThreads, {"attention"}, "from 4 MFLOP", true, true);
  kernel_setting(kLowpStrips, {"linear", "matmul", "bmm"}, "by rows", true, true);
  kernel_setting(kAttentionHeads, {"attention"}, "one at a time", false, true);
  // A 16-bit layer norm of an f32 input saved that input before, on every device.
  kernel_setting(kLayerNormSaves, {"layernorm"}, "the f32 input", true, false);
  // Profiles written before --precision recorded the math mode (--math, or --tf32 before it), or
  // nothing: they ran in fp32 or tf32.
  if (p.run.count("--precision") == 0 && !p.run.empty()) {
    recorded.erase(
        std::remove_if(recorded.begin(), recorded.end(),
                       [](const auto& kv) { return kv.first == "--math" || kv.first == "--tf32"; }),
        recorded.end());
    recorded.emplace_back("--precision", profile_math(p));
  }
  for (auto [flag, then] : recorded) {
    const auto it = now.find(flag);
    const std::string here = it == now.end() ? "(none)" : it->second;
    if (here == then) continue;
    // An option whose profile depends on less than its value (ModelOption::profile_key).
    const ModelOption* opt = nullptr;
    for (const ModelOption& m : model_info(o.model).input.options) {
      if (option_name(m.key, OptionStyle::flag) == flag) opt = &m;
    }
    if (opt && opt->profile_key && it != now.end()) {
      char* end_then = nullptr;
      char* end_here = nullptr;
      const double v_then = std::strtod(then.c_str(), &end_then);
      const double v_here = std::strtod(here.c_str(), &end_here);
      if (*end_then == '\0' && *end_here == '\0' &&
          opt->profile_key(v_then) == opt->profile_key(v_here)) {
        continue;
      }
    }
    // The gradient norm is on for several reasons, not only its own setting.
    if (flag == "--grad-norm") {
      const bool on = here == "on";
      const bool kw = o.style == OptionStyle::keyword;
      const auto setting = [&](const char* key, bool v) {
        return kw ? std::string(key) + (v ? "=True" : "=False")
                  : option_name(key, o.style) + (v ? " on" : " off");
      };
      std::string why;
      bool own = false;  // on by its own setting (or a log's), which can turn it off again
      if (o.clip_grad_norm > 0) {
        why = option_name("clip_grad_norm", o.style);
      } else if (o.precision == "fp16") {
        why = option_setting("precision", "fp16", o.style);
      } else if (o.grad_norm) {
        why = kw ? setting("grad_norm", true) : "--log, or --grad-norm on";
        own = true;
      }
      REGEN_FAIL(what, " was made with the gradient norm ", on ? "not computed" : "computed",
                 " in each step, but this run ", on ? "computes it (" + why + ")" : "does not",
                 ": its memory and times are another step's (",
                 own ? "pass " + setting("grad_norm", false) + ", or " : std::string(),
                 "profile again with ", setting("grad_norm", on), ")");
    }
    if (flag == kWinogradTypes) {
      REGEN_FAIL(what, " was made by a regen whose CPU Winograd convolutions took ", then,
                 " operands only (its ", profile_precision(p),
                 " 3x3 convolutions ran the direct path), but this one's take ", here,
                 ": its memory and times are another step's (profile again)");
    }
    if (flag == kLowpAttentionThreads) {
      REGEN_FAIL(what, " was made by a regen whose 16-bit CPU attention ran its per-head products ",
                 "on several threads ", then, ", but this one's do ", here,
                 ": its memory and times are another step's (profile again)");
    }
    if (flag == kLayerNormSaves) {
      REGEN_FAIL(what, " was made by a regen whose ", profile_precision(p),
                 " layer norms of an f32 input saved ", then, " for backward, but this one's save ",
                 "its ", here,
                 " in 16 bits: its memory and times are another step's (profile again)");
    }
    if (flag == kAttentionHeads) {
      REGEN_FAIL(what, " was made by a regen whose CPU attention ran its heads ", then,
                 ", but this one's run ", here,
                 ": its memory and times are another step's (profile again)");
    }
    if (flag == kLowpStrips) {
      REGEN_FAIL(what,
                 " was made by a regen whose 16-bit CPU GEMMs cut their products into strips ",
                 then, ", but this one's go ", here,
                 ": its memory and times are another step's (profile again)");
    }
    if (flag == kWinogradTiles) {
      REGEN_FAIL(what, " was made by a regen whose CPU Winograd convolutions had output tiles of ",
                 then, " only, but this one's have ", here,
                 ": its memory and times are another step's (profile again)");
    }
    if (flag == kCpuConvVariable) {
      REGEN_FAIL(what, " was made with the CPU's 3x3 convolutions by ", then, " (", flag, "=", then,
                 "), but this run has ", here == "(none)" ? "none: it is not on the CPU" : here,
                 ": its memory and times are another step's (",
                 here == "(none)" ? std::string()
                                  : "set the environment variable " + flag + "=" + then + ", or ",
                 "profile again)");
    }
    // The flag as `o.style` names it: "--seq-len" -> "seq_len".
    std::string key = flag.substr(2);
    std::replace(key.begin(), key.end(), '-', '_');
    const std::string was = option_setting(key, then, o.style);
    REGEN_FAIL(what, " was made with ", was,
               o.style == OptionStyle::keyword ? ", but this model has " : ", but this run has ",
               option_setting(key, here, o.style), ": its memory and times are another step's (",
               "pass ", was, ", or profile again)");
  }
  // A profile of one process records no ranks.
  const auto ranks = now.find("--ranks");
  REGEN_CHECK(ranks == now.end() || p.run.count("--ranks"), what,
              " was made by one process, but this run has ", ranks->second,
              " ranks (mpirun): each rank's step also reduces gradients, which the profile does "
              "not have; profile under mpirun with the same ranks");
}

}  // namespace regen
