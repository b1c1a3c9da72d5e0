// Shared setup of the regen subcommands (common.h).
#include "tools/common.h"

#include <omp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>

#include "regen/core/io.h"
#include "regen/core/numeric.h"
#include "regen/core/safetensors.h"
#include "regen/remat/pipeline.h"

#ifdef REGEN_WITH_CUDA
#include "regen/core/cuda/runtime.h"
#include "regen/kernels/cuda/cuda_kernels.h"
#endif

namespace regen::tool {

// ---------------------------------------------------------------------------------------------
// Validators

namespace {

enum class IntParse { ok, not_integer, too_large };

// A decimal integer: optional sign, then digits only (no hex, octal, exponent or spaces).
IntParse parse_integer(const std::string& s, bool& negative, uint64_t& magnitude) {
  size_t i = 0;
  negative = false;
  magnitude = 0;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) negative = s[i++] == '-';
  if (i == s.size()) return IntParse::not_integer;
  bool overflow = false;
  for (; i < s.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(s[i]))) return IntParse::not_integer;
    const uint64_t d = static_cast<uint64_t>(s[i] - '0');
    if (magnitude > (std::numeric_limits<uint64_t>::max() - d) / 10) overflow = true;
    magnitude = magnitude * 10 + d;
  }
  return overflow ? IntParse::too_large : IntParse::ok;
}

std::string number_text(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

// Integers in [lo, hi]; `requirement` completes "must be ...".
CLI::Validator integer_validator(int64_t lo, uint64_t hi, const std::string& requirement,
                                 const std::string& description) {
  return CLI::Validator(
      [lo, hi, requirement](const std::string& s) -> std::string {
        bool negative = false;
        uint64_t mag = 0;
        const IntParse r = parse_integer(s, negative, mag);
        if (r == IntParse::not_integer) {
          return "must be " + requirement + ", got '" + s + "' (not an integer)";
        }
        // CLI11 converts with base 0, which would read "010" as octal 8.
        const size_t first_digit = (s[0] == '+' || s[0] == '-') ? 1 : 0;
        if (s.size() > first_digit + 1 && s[first_digit] == '0') {
          return "must be " + requirement + ", got '" + s + "' (write it without leading zeros)";
        }
        if (negative && mag != 0) {
          // -mag >= lo  <=>  mag <= -lo (for lo < 0)
          const bool fits = lo < 0 && mag <= static_cast<uint64_t>(-(lo + 1)) + 1;
          if (!fits) return "must be " + requirement + ", got " + s;
          return "";
        }
        if (lo > 0 && mag < static_cast<uint64_t>(lo))
          return "must be " + requirement + ", got " + s;
        if (r == IntParse::too_large || mag > hi) {
          return "must be at most " + std::to_string(hi) + ", got " + s;
        }
        return "";
      },
      description);
}

CLI::Validator number_validator(double lo, double hi, const std::string& requirement,
                                const std::string& description) {
  return CLI::Validator(
      [lo, hi, requirement](const std::string& s) -> std::string {
        const char* begin = s.c_str();
        char* end = nullptr;
        const double v = s.empty() ? 0.0 : std::strtod(begin, &end);
        if (s.empty() || end != begin + s.size() ||
            std::isspace(static_cast<unsigned char>(s[0]))) {
          return "must be " + requirement + ", got '" + s + "' (not a number)";
        }
        if (!std::isfinite(v) || v < lo || v > hi) return "must be " + requirement + ", got " + s;
        return "";
      },
      description);
}

}  // namespace

CLI::Validator positive_integer(int64_t max) {
  return integer_validator(1, static_cast<uint64_t>(max), "a positive integer", "POSITIVE");
}

CLI::Validator non_negative_integer(uint64_t max) {
  return integer_validator(0, max, "a non-negative integer", "NON-NEGATIVE");
}

CLI::Validator integer_in(int64_t lo, int64_t hi) {
  const std::string range = std::to_string(lo) + " to " + std::to_string(hi);
  return integer_validator(lo, hi < 0 ? 0 : static_cast<uint64_t>(hi), "an integer from " + range,
                           range);
}

CLI::Validator non_empty(const std::string& what) {
  return CLI::Validator(
      [what](std::string& text) -> std::string {
        return text.empty() ? "is empty: give " + what : std::string();
      },
      "TEXT");
}

CLI::Validator budget_text() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        if (text.empty()) return "is empty (leave --budget out to plan without a budget)";
        try {
          Budget::parse(text);
        } catch (const Error& e) {
          return e.message();
        }
        return "";
      },
      "BYTES|PERCENT");
}

CLI::Validator non_negative_number() {
  return number_validator(0.0, std::numeric_limits<double>::max(), "a finite number >= 0",
                          "NON-NEGATIVE");
}

CLI::Validator number_in(double lo, double hi) {
  const std::string range = number_text(lo) + " to " + number_text(hi);
  return number_validator(lo, hi, "a number from " + range, range);
}

std::string cli_failure_message(const CLI::App* /*app*/, const CLI::Error& e) {
  std::string msg = e.what();
  if (e.get_name() == "ValidationError") {
    // CLI11 writes "--batch: must be ..."; read it as one sentence.
    const auto colon = msg.find(": must be ");
    if (colon != std::string::npos && msg.find(' ') > colon) msg.erase(colon, 1);
  }
  return "regen: error: " + msg + "\nRun with --help for the flags of a command.\n";
}

// ---------------------------------------------------------------------------------------------
// Model flags

void add_model_flags(CLI::App& app, ModelFlags& f, bool with_batch,
                     const std::string& math_default) {
  app.add_option("--model", f.model, "model preset: " + join_names(model_preset_names()))
      ->capture_default_str();
  if (with_batch) {
    app.add_option("--batch", f.batch, "batch size (images or sequences)")
        ->check(positive_integer())
        ->capture_default_str();
  }
  app.add_option("--device", f.device, "auto, cpu, cuda or cuda:N (auto picks cuda when present)")
      ->capture_default_str();
  app.add_option("--image-size", f.image_size,
                 "ResNet input height and width, at least 32 (default: preset)")
      ->check(positive_integer());
  app.add_option("--num-classes", f.num_classes, "ResNet classes, at least 2 (default: preset)")
      ->check(integer_in(2, 1 << 24));
  app.add_option("--seq-len", f.seq_len, "Transformer sequence length (default: preset)")
      ->check(positive_integer());
  app.add_option("--vocab", f.vocab,
                 "Transformer vocabulary size (default: preset; --data text: needs at least 256)")
      ->check(positive_integer());
  app.add_option("--dropout", f.dropout, "Transformer dropout probability (default: preset)")
      ->check(number_in(0.0, 0.99));
  app.add_option("--lm-head-chunk", f.lm_head_chunk,
                 "Transformer LM head + loss in training: 0 fused and chunked automatically "
                 "(about 32 MiB of logits per chunk; the default), N fused with N rows per chunk, "
                 "-1 unfused (the whole (batch x seq, vocab) logits, as PyTorch)")
      ->check(integer_in(-1, kIntMax));
  app.add_option("--optimizer", f.optimizer, "sgd or adamw")
      ->check(CLI::IsMember({"sgd", "adamw"}))
      ->capture_default_str();
  app.add_option("--lr", f.lr, "learning rate")
      ->check(non_negative_number())
      ->capture_default_str();
  app.add_option("--momentum", f.momentum, "SGD momentum")
      ->check(number_in(0.0, 1.0))
      ->capture_default_str();
  app.add_option("--weight-decay", f.weight_decay, "weight decay")
      ->check(non_negative_number())
      ->capture_default_str();
  app.add_option("--seed", f.seed, "seed of initialization, data and dropout")
      ->check(non_negative_integer(std::numeric_limits<uint64_t>::max()))
      ->capture_default_str();
  app.add_option("--threads", f.threads, "CPU threads, at most 1024 (default: OpenMP's)")
      ->check(positive_integer(1024));
  app.add_option("--data", f.data,
                 "synthetic (default), cifar10:DIR (CIFAR-10 binary batches) or text:FILE "
                 "(UTF-8 text as byte tokens)");
  app.add_option("--conv", f.conv, "CUDA convolution: native (regen's kernels) or cudnn")
      ->check(CLI::IsMember({"native", "cudnn"}))
      ->capture_default_str();
  add_math_flags(app, f.math, f.tf32, math_default);
}

namespace {

// What math_mode and check_model_flags refuse whatever the device.
void check_math_flags(const std::string& math, bool tf32) {
  REGEN_CHECK(math.empty() || math == "fp32" || math == "tf32",
              "--math must be fp32 or tf32, got '", math, "'");
  REGEN_CHECK(!tf32 || math != "fp32",
              "--tf32 (the same as --math tf32) conflicts with --math fp32: give one of them");
}

}  // namespace

void add_math_flags(CLI::App& app, std::string& math, bool& tf32, const std::string& default_help) {
  app.add_option("--math", math,
                 "CUDA math mode: fp32 (strict FP32 everywhere) or tf32 (cuBLAS GEMMs and cuDNN "
                 "convolutions may use TF32 tensor cores; regen's own convolution and attention "
                 "kernels stay FP32); default: " +
                     default_help)
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            return v == "fp32" || v == "tf32" ? "" : "must be fp32 or tf32, got '" + v + "'";
          },
          "fp32|tf32"));
  app.add_flag("--tf32", tf32, "the same as --math tf32");
}

std::string math_mode(const std::string& math, bool tf32, Device device,
                      const std::string& default_math) {
  check_math_flags(math, tf32);
  const bool asked = tf32 || math == "tf32";
  if (device.is_cpu()) {
    REGEN_CHECK(!asked, math == "tf32" ? "--math tf32" : "--tf32",
                " applies to CUDA devices (cuBLAS and cuDNN); on ", device.str(),
                " every kernel computes in FP32: drop it, or pass --device cuda");
    return "fp32";
  }
  if (!math.empty()) return math;
  return tf32 ? "tf32" : default_math;
}

std::string math_mode(const ModelFlags& f, Device device, const std::string& default_math) {
  return math_mode(f.math, f.tf32, device, default_math);
}

void check_model_flags(const ModelFlags& f) {
  REGEN_CHECK(f.image_size >= 0, "--image-size must be a positive integer, got ", f.image_size);
  REGEN_CHECK(f.num_classes >= 0, "--num-classes must be a positive integer, got ", f.num_classes);
  REGEN_CHECK(f.seq_len >= 0, "--seq-len must be a positive integer, got ", f.seq_len);
  REGEN_CHECK(f.vocab >= 0, "--vocab must be a positive integer, got ", f.vocab);
  // Written so that nan fails each test (every comparison with nan is false).
  REGEN_CHECK(f.dropout < 0 || (f.dropout >= 0 && f.dropout <= 0.99),
              "--dropout must be a number from 0 to 0.99, got ", f.dropout);
  REGEN_CHECK(std::isfinite(f.lr) && f.lr >= 0, "--lr must be a finite number >= 0, got ", f.lr);
  REGEN_CHECK(f.momentum >= 0 && f.momentum <= 1, "--momentum must be a number from 0 to 1, got ",
              f.momentum);
  REGEN_CHECK(std::isfinite(f.weight_decay) && f.weight_decay >= 0,
              "--weight-decay must be a finite number >= 0, got ", f.weight_decay);
  REGEN_CHECK(f.threads >= 0, "--threads must be a positive integer, got ", f.threads);
  REGEN_CHECK(f.lm_head_chunk == ModelFlags::kPresetHeadChunk ||
                  (f.lm_head_chunk >= -1 && f.lm_head_chunk <= kIntMax),
              "--lm-head-chunk must be an integer from -1 to ", kIntMax,
              " (-1 unfused, 0 automatic chunks, N rows per chunk), got ", f.lm_head_chunk);
  REGEN_CHECK(f.optimizer == "sgd" || f.optimizer == "adamw",
              "--optimizer must be sgd or adamw, got '", f.optimizer, "'");
  check_math_flags(f.math, f.tf32);
}

ModelConfig model_config(const ModelFlags& flags) {
  check_model_flags(flags);
  ModelConfig c = model_preset(flags.model);
  if (flags.image_size > 0) {
    REGEN_CHECK(c.family == ModelFamily::resnet, "--image-size applies to ResNet models, not '",
                flags.model, "'");
    REGEN_CHECK(flags.image_size >= 32, "--image-size ", flags.image_size,
                " is too small for ResNet's five downsamplings (at least 32)");
    c.image_size = flags.image_size;
  }
  if (flags.num_classes > 0) {
    REGEN_CHECK(c.family == ModelFamily::resnet, "--num-classes applies to ResNet models, not '",
                flags.model, "'");
    c.num_classes = flags.num_classes;
  }
  if (flags.seq_len > 0) {
    REGEN_CHECK(c.family == ModelFamily::transformer,
                "--seq-len applies to Transformer models, not '", flags.model, "'");
    c.seq_len = flags.seq_len;
  }
  if (flags.vocab > 0) {
    REGEN_CHECK(c.family == ModelFamily::transformer,
                "--vocab applies to Transformer models, not '", flags.model, "'");
    c.vocab = flags.vocab;
  }
  if (flags.dropout >= 0) {
    REGEN_CHECK(c.family == ModelFamily::transformer,
                "--dropout applies to Transformer models, not '", flags.model, "'");
    c.dropout = static_cast<float>(flags.dropout);
  }
  if (flags.lm_head_chunk != ModelFlags::kPresetHeadChunk) {
    REGEN_CHECK(c.family == ModelFamily::transformer,
                "--lm-head-chunk applies to Transformer models, not '", flags.model, "'");
    c.head_chunk_rows = flags.lm_head_chunk;
  }
  if (flags.data.rfind("text:", 0) == 0 && c.family == ModelFamily::transformer) {
    // Byte tokens take the values 0..255: the embedding and the head need 256 rows.
    REGEN_CHECK(c.vocab >= 256, "--data ", flags.data, " feeds byte tokens (0..255), but model '",
                flags.model, "' has a vocabulary of ", c.vocab,
                flags.vocab > 0 ? ": pass --vocab 256 or more" : " by default: pass --vocab 256");
  }
  c.seed = flags.seed;
  return c;
}

Device resolve_device(const std::string& text) {
#ifdef REGEN_WITH_CUDA
  // A GPU whose runtime fails is an error, never taken for a machine without one (runtime.h).
  auto count = [&] {
    const cuda::DeviceProbe& probe = cuda::probe_devices();
    REGEN_CHECK(probe.error.empty(), "--device ", text, ": ", probe.error);
    return probe.count;
  };
#endif
  if (text == "auto") {
#ifdef REGEN_WITH_CUDA
    if (count() > 0) return Device::cuda(0);
#endif
    return Device::cpu();
  }
  const Device d = Device::parse(text);
#ifdef REGEN_WITH_CUDA
  if (d.is_cuda()) {
    const int n = count();
    REGEN_CHECK(d.index < n, "--device ", text, ": ", n, " CUDA device(s) visible",
                n == 0 ? "; use --device cpu" : "");
  }
#else
  REGEN_CHECK(d.is_cpu(), "--device ", text, ": regen was built without CUDA support");
#endif
  return d;
}

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

// What makes a step large: the batch, with the image size or the sequence length.
static std::string size_flags(const ModelConfig& c, int64_t batch) {
  return "--batch " + std::to_string(batch) +
         (c.family == ModelFamily::resnet ? " at --image-size " + std::to_string(c.image_size)
                                          : " at --seq-len " + std::to_string(c.seq_len));
}

void check_preflight(const Session& s, int64_t batch, Preflight preflight) {
  if (preflight == Preflight::none) return;
  const ModelConfig& c = s.config;
  const int64_t have = available_memory(s.device);
  if (have <= 0) return;
  const bool resnet = c.family == ModelFamily::resnet;
  // The model's own state first: no batch size helps there.
  const int64_t state = s.preflight.persistent;
  REGEN_CHECK(state <= have, c.name, " does not fit in memory: its parameters, gradients and ",
              "optimizer state take ", format_bytes(state), " (exact, from a dry run), but ",
              s.device.str(), " has ", format_bytes(have), " available; ",
              resnet ? "use fewer --num-classes or a smaller preset"
                     : "use a smaller --vocab (now " + std::to_string(c.vocab) +
                           ") or --seq-len (now " + std::to_string(c.seq_len) +
                           ", one position embedding each)");
  if (preflight == Preflight::model) return;
  // Every tensor of the step, as the real step allocates them. On the CPU the kernels' scratch
  // space (GEMM packing, im2col tiles) is in it too, so this is the real step's peak; on CUDA the
  // CUDA kernels' scratch comes on top, so it is a lower bound the real peak passes.
  const int64_t need = s.preflight.memory.allocated.peak;
  const bool exact = s.device.is_cpu();
  REGEN_CHECK(need <= have, size_flags(c, batch), " is too large for memory: one ", c.name,
              " training step without remat needs ", exact ? "" : "at least ", format_bytes(need),
              " (", format_bytes(state), " of it the model's state; ",
              exact ? "every tensor and the kernels' scratch space of the first step, exact, from "
                      "a dry run"
                    : "every tensor of the first step, from a dry run, before the CUDA kernels' "
                      "scratch space",
              "), but ", s.device.str(), " has ", format_bytes(have),
              " available; use a smaller --batch", resnet ? " or --image-size" : " or --seq-len");
}

std::map<std::string, std::string> run_flags(const ModelFlags& f) {
  const ModelConfig c = model_config(f);
  const Device device = resolve_device(f.device);
  auto num = [](double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", v);
    return std::string(buf);
  };
  std::map<std::string, std::string> r;
  r["--optimizer"] = f.optimizer;
  if (f.optimizer == "sgd") r["--momentum"] = num(f.momentum);
  r["--threads"] = std::to_string(f.threads > 0 ? f.threads : omp_get_max_threads());
  const std::string data = f.data.empty() ? "synthetic" : f.data.substr(0, f.data.find(':'));
  r["--data"] = data;
  if (c.family == ModelFamily::resnet) {
    r["--image-size"] = std::to_string(c.image_size);
    r["--num-classes"] = std::to_string(c.num_classes);
  } else {
    r["--seq-len"] = std::to_string(c.seq_len);
    r["--vocab"] = std::to_string(c.vocab);
    r["--dropout"] = num(c.dropout);
    r["--lm-head-chunk"] = std::to_string(c.head_chunk_rows);
  }
  r["--math"] = math_mode(f, device);  // fp32 on the CPU
  if (device.is_cuda()) r["--conv"] = f.conv;
  return r;
}

void check_profile_run(const Profile& p, const ModelFlags& f, const std::string& what) {
  const std::map<std::string, std::string> now = run_flags(f);
  // The optimizer first: other flags (its momentum) follow from it.
  std::vector<std::pair<std::string, std::string>> recorded(p.run.begin(), p.run.end());
  std::stable_partition(recorded.begin(), recorded.end(),
                        [](const auto& kv) { return kv.first == "--optimizer"; });
  for (auto [flag, then] : recorded) {
    if (flag == "--tf32") {  // written before --math
      flag = "--math";
      then = profile_math(p);
    }
    const auto it = now.find(flag);
    const std::string here = it == now.end() ? "(none)" : it->second;
    REGEN_CHECK(here == then, what, " was made with ", flag, " ", then, ", but this run has ", flag,
                " ", here, ": its memory and times are another step's (pass ", flag, " ", then,
                ", or profile again)");
  }
}

std::string profile_math(const Profile& p) {
  const auto math = p.run.find("--math");
  if (math != p.run.end()) return math->second;
  const auto tf32 = p.run.find("--tf32");
  return tf32 != p.run.end() && tf32->second == "on" ? "tf32" : "fp32";
}

int apply_runtime_flags(const ModelFlags& f, Device device) {
  if (f.threads > 0) omp_set_num_threads(f.threads);
  const bool tf32 = math_mode(f, device) == "tf32";  // refuses tf32 on the CPU, naming the flag
#ifdef REGEN_WITH_CUDA
  cuda::set_conv_algo(f.conv == "cudnn" ? cuda::ConvAlgo::cudnn : cuda::ConvAlgo::native);
  cuda::set_tf32(tf32);
#else
  (void)tf32;  // math_mode refused it: without CUDA every device is the CPU
  REGEN_CHECK(f.conv == "native", "--conv cudnn needs a CUDA build");
#endif
  return omp_get_max_threads();
}

std::unique_ptr<Session> make_session(const ModelFlags& flags, int64_t batch, Preflight preflight) {
  REGEN_CHECK(batch > 0, "--batch must be a positive integer, got ", batch);
  check_model_flags(flags);
  auto s = std::make_unique<Session>();
  s->flags = flags;
  s->device = resolve_device(flags.device);
  apply_runtime_flags(flags, s->device);
  s->config = model_config(flags);
  const ModelConfig& c = s->config;
  if (c.family == ModelFamily::resnet) {
    // Batch norm in training needs two values per channel; the last stage's map is the image
    // size over 32 (rounded up) on a side.
    const int64_t side = (c.image_size + 31) / 32;
    REGEN_CHECK(batch * side * side >= 2, "--batch ", batch, " at --image-size ", c.image_size,
                ": batch norm in training needs at least 2 values per channel, and the last "
                "stage's maps are ",
                side, "x", side, "; use --batch 2 or more");
  }
  REGEN_CHECK(flags.conv == "native" || s->device.is_cuda(), "--conv ", flags.conv,
              " applies to CUDA devices; on ", s->device.str(), " convolution is regen's own");
  // The data before the model: a wrong file fails before a large model is built.
  s->data = make_data_source(flags.data, c, flags.seed);
  auto make_optimizer = [&flags](Model& model) -> std::unique_ptr<Optimizer> {
    if (flags.optimizer == "sgd") {
      SGDOptions o;
      o.lr = flags.lr;
      o.momentum = flags.momentum;
      o.weight_decay = flags.weight_decay;
      return std::make_unique<SGD>(model.parameters(), o);
    }
    AdamWOptions o;
    o.lr = flags.lr;
    o.weight_decay = flags.weight_decay;
    return std::make_unique<AdamW>(model.parameters(), o);
  };
  // The first step, run dry: its memory (exact on the CPU), before any of it is used.
  try {
    s->preflight = dry_run_step(c, batch, s->device, make_optimizer);
  } catch (const Error& e) {
    // Flags that pass their own checks and still stop a dry run do so by size: a request beyond
    // any device's (the Null arena maps anything else), an index type's limit, an overflow. Say
    // which flags set the sizes.
    const bool oom = dynamic_cast<const OutOfMemory*>(&e) != nullptr;
    REGEN_FAIL(size_flags(c, batch), oom ? " is too large for any memory" : " is too large",
               ": a dry run of one ", c.name,
               oom ? " step stops at " : " step fails: ", e.message(), "; use a smaller --batch",
               c.family == ModelFamily::resnet ? " or --image-size" : ", --seq-len or --vocab");
  }
  check_preflight(*s, batch, preflight);
  manual_seed(flags.seed);
  s->model = make_model(c, s->device);
  s->optimizer = make_optimizer(*s->model);
  s->trainer = std::make_unique<Trainer>(*s->model, *s->optimizer, *s->data, batch, s->device);
  return s;
}

MeasuredRun measure_training(const ModelFlags& m, int64_t batch, int steps, const Profile* profile,
                             const Plan* plan, int64_t limit) {
  REGEN_CHECK(plan == nullptr || profile != nullptr, "measure_training: a plan needs its profile");
  allocator_for(resolve_device(m.device)).empty_cache();
  auto s = make_session(m, batch);
  RematPipeline pipe(*s->trainer);
  if (plan) {
    pipe.use_profile(*profile);
    pipe.use_plan(*plan);
    pipe.set_limit(limit);
  }
  std::vector<double> ms;
  MeasuredRun r;
  for (const StepResult& st : pipe.train(steps)) {
    ms.push_back(st.ms);
    r.peak = std::max(r.peak, st.memory.allocated.peak);
    r.reserved = std::max(r.reserved, st.memory.reserved.peak);
  }
  if (const RematExecutor* exec = pipe.executor()) {
    r.regen_ms = exec->regen_ms();
    r.replays = exec->replays();
  }
  r.steps_predicted = pipe.predicted_steps();
  r.steps_exact = pipe.exact_steps();
  // The first step pays first-touch costs; the median of the rest is the step time.
  if (ms.size() > 1) ms.erase(ms.begin());
  r.ms = median(ms);
  return r;
}

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

std::string plot_python() {
  const char* env = std::getenv("REGEN_PYTHON");
  struct stat py;
  return env ? env : (::stat("/usr/bin/python3", &py) == 0 ? "/usr/bin/python3" : "python3");
}

// ---------------------------------------------------------------------------------------------
// Outputs, losses, checkpoints

void check_output_path(const std::string& flag, const std::string& path) {
  const std::string why = why_not_writable(path);
  REGEN_CHECK(why.empty(), flag, " ", path, ": cannot write there: ", why);
}

namespace {

// A path with its folder resolved (the file itself need not exist), to compare two paths.
std::string resolved_path(const std::string& path) {
  const auto slash = path.find_last_of('/');
  const std::string dir =
      slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  char buf[PATH_MAX];
  if (::realpath(path.c_str(), buf)) return buf;  // an existing file (through links)
  if (::realpath(dir.c_str(), buf)) return std::string(buf) + "/" + name;
  return path;
}

}  // namespace

void check_distinct_files(const std::vector<std::pair<std::string, std::string>>& outputs,
                          const std::vector<std::pair<std::string, std::string>>& inputs) {
  std::vector<std::pair<std::string, std::string>> seen;  // (resolved path, flag)
  for (const auto& [flag, path] : inputs) {
    if (!path.empty()) seen.emplace_back(resolved_path(path), flag);
  }
  for (const auto& [flag, path] : outputs) {
    check_output_path(flag, path);
    const std::string r = resolved_path(path);
    for (const auto& [other, other_flag] : seen) {
      REGEN_CHECK(other != r, flag, " ", path, " is the same file as ", other_flag,
                  ": give each output its own path, never an input's");
    }
    seen.emplace_back(r, flag);
  }
}

void check_finite_loss(double loss, int64_t step, double lr) {
  REGEN_CHECK(std::isfinite(loss), "training diverged: the loss of step ", step, " is ", loss,
              " (not finite); try a lower --lr (this run used ", lr, ")");
}

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

std::string first_non_finite(const Model& model) {
  for (const auto& [name, p] : model.named_parameters()) {
    for (const bool grad : {false, true}) {
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
  const ModelConfig& c = s.config;
  std::map<std::string, std::string> meta = {
      {"format", "regen-checkpoint-1"}, {"model", c.name}, {"steps", std::to_string(steps)}};
  // The sizes a flag can change that shape parameters (load_checkpoint compares them).
  if (c.family == ModelFamily::transformer) {
    meta["vocab"] = std::to_string(c.vocab);
    meta["seq_len"] = std::to_string(c.seq_len);
    // How the run computed its loss; informational (the head's parameters are the same either
    // way, so loading does not compare it).
    meta["lm_head_chunk"] = std::to_string(c.head_chunk_rows);
  } else {
    meta["num_classes"] = std::to_string(c.num_classes);
  }
  save_safetensors(path, s.model->state_dict(), meta);
}

size_t load_checkpoint(Session& s, const std::string& path) {
  const SafetensorsFile file = load_safetensors(path);
  const ModelConfig& c = s.config;
  const auto& meta = file.metadata;
  const auto model = meta.find("model");
  if (model != meta.end()) {
    REGEN_CHECK(model->second == c.name, "checkpoint ", path, " was saved from model ",
                model->second, ", not ", c.name, " (pass --model ", model->second, ")");
    auto same_size = [&](const char* key, const char* flag, int64_t value) {
      const auto it = meta.find(key);
      REGEN_CHECK(it == meta.end() || it->second == std::to_string(value), "checkpoint ", path,
                  " was saved from ", c.name, " with ", flag, " ", it->second,
                  ", but this run's model has ", value, " (pass ", flag, " ", it->second, ")");
    };
    if (c.family == ModelFamily::transformer) {
      same_size("vocab", "--vocab", c.vocab);
      same_size("seq_len", "--seq-len", c.seq_len);
    } else {
      same_size("num_classes", "--num-classes", c.num_classes);
    }
  }
  // Weights that are not finite would train into NaN silently: refused with the tensor and index.
  for (const auto& [name, t] : file.tensors) {
    const int64_t i = first_bad(t);  // f32 and f64 tensors, read in place
    REGEN_CHECK(i < 0, "checkpoint ", path, ": tensor '", name, "' holds ", value_at(t, i),
                " at flat index ", i, " (weights must be finite)");
  }
  try {
    s.model->load_state_dict(file.tensors);
  } catch (const Error& e) {
    REGEN_FAIL("checkpoint ", path, " does not fit model ", c.name,
               model == meta.end() ? " (it names no model)" : "", ": ", e.message());
  }
  return file.tensors.size();
}

std::string gib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", static_cast<double>(bytes) / (1ull << 30));
  return buf;
}

std::string format_ms(double ms) {
  char buf[48];
  std::snprintf(buf, sizeof buf, ms < 100 ? "%.3f ms" : "%.1f ms", ms);
  return buf;
}

bool stdout_is_terminal() {
  return ::isatty(STDOUT_FILENO) == 1;
}

void add_budget_of_flag(CLI::App& app, std::string& budget_of) {
  app.add_option("--budget-of", budget_of,
                 "what --budget bounds: reserved (what the device sees: the steps run with the "
                 "allocator's hard limit at the budget, and a plan fits when it runs under it) or "
                 "allocated (the bytes tensors occupy, as other planners count them)")
      ->check(CLI::IsMember({"reserved", "allocated"}))
      ->capture_default_str();
}

void add_layout_flag(CLI::App& app, std::string& layout) {
  app.add_option("--layout", layout,
                 "where the planned step's blocks go: caching (the caching allocator places them "
                 "as they come) or planned (every block at a place planned from the schedule, in "
                 "the persistent segments' free blocks and one arena mapped before the step: "
                 "reserved bytes close to allocated)")
      ->check(CLI::IsMember({"caching", "planned"}))
      ->capture_default_str();
}

}  // namespace regen::tool
