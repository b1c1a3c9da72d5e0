// `regen bench train`: times training steps (warm-up, then the median of the timed steps) and
// prints what it measured beside the command that measures PyTorch on the same model, batch and
// threads (tools/torch_baseline.py). --json writes the figures for docs tables; --torch-csv
// reads torch_baseline.py's CSV and prints the ratio regen / PyTorch. On a CUDA device the
// math mode is TF32 unless --math fp32 (what people run on Hopper; training defaults to FP32); it
// is printed, written to --json and passed to the PyTorch command, which must match it.
#include <omp.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <sstream>

#include "regen/core/io.h"
#include "regen/core/numeric.h"
#include "regen/kernels/kernels.h"
#include "tools/command.h"
#include "tools/common.h"
#include "tools/distributed.h"

namespace regen::tool {
namespace {

struct Flags {
  SessionOptions m;
  int warmup = 2;
  int steps = 5;
  std::string json;
  std::string torch_csv;
  std::string cpu_conv;  // "" (the variable's or the default), winograd, direct or both
  std::string against;   // --against-precision: "" (none), or the other session's precision
};

// Two sides of a comparison in one process: f.warmup steps of each, then f.steps pairs of one
// step each, the first of a pair switching every pair (a first, then b first, ...), so that a
// drift in the machine's speed falls on both alike. `steps(side_a, n)` runs n steps of a side and
// returns their times (ms). Prints each side's median and the median of the pairs' ratios a / b.
void alternate_pairs(const Flags& f, const std::string& a_name, const std::string& b_name,
                     const std::function<std::vector<double>(bool, int)>& steps) {
  if (f.warmup > 0) {
    steps(true, f.warmup);
    steps(false, f.warmup);
  }
  std::vector<double> a, b, ratio;
  for (int i = 0; i < f.steps; ++i) {
    const bool a_first = i % 2 == 0;
    const double first = steps(a_first, 1)[0];
    const double second = steps(!a_first, 1)[0];
    a.push_back(a_first ? first : second);
    b.push_back(a_first ? second : first);
    ratio.push_back(a.back() / b.back());
  }
  const int width = static_cast<int>(std::max(a_name.size(), b_name.size())) + 1;
  for (const auto& [name, v] : {std::make_pair(a_name, &a), std::make_pair(b_name, &b)}) {
    std::printf("  %-*s median %s (min %s, max %s)\n", width, (name + ":").c_str(),
                format_ms(median(*v)).c_str(),
                format_ms(*std::min_element(v->begin(), v->end())).c_str(),
                format_ms(*std::max_element(v->begin(), v->end())).c_str());
  }
  std::printf("  %s / %s: median %.3f over the pairs (min %.3f, max %.3f)\n", a_name.c_str(),
              b_name.c_str(), median(ratio), *std::min_element(ratio.begin(), ratio.end()),
              *std::max_element(ratio.begin(), ratio.end()));
}

// --cpu-conv both: the two algorithms alternated step by step (alternate_pairs).
void compare_cpu_conv(const Flags& f, Session& s, RematPipeline& pipe) {
  std::printf(
      "  --cpu-conv both: %d pairs after %d warm-up steps each, alternated in one process\n",
      f.steps, f.warmup);
  alternate_pairs(f, "winograd", "direct", [&](bool winograd, int steps) {
    cpu::set_conv2d_algorithm(winograd ? "winograd" : "direct");
    TrainingRun run(s, pipe);
    run.run(steps);
    return run.stats().ms;
  });
}

// --against-precision P: a second session of the same model in precision P beside this run's, a
// step of each alternated (alternate_pairs). Both sessions hold their memory at once.
void compare_precisions(const Flags& f, Session& s, RematPipeline& pipe, Precision mine) {
  SessionOptions o = f.m;
  o.precision = f.against;
  o.math.clear();
  o.tf32 = false;
  auto other = make_session(o);
  RematPipeline other_pipe(*other->trainer);
  std::printf(
      "  --against-precision %s: %d pairs after %d warm-up steps each, alternated in one process\n",
      f.against.c_str(), f.steps, f.warmup);
  alternate_pairs(f, precision_name(mine), precision_name(other->precision),
                  [&](bool own, int steps) {
                    TrainingRun run(own ? s : *other, own ? pipe : other_pipe);
                    run.run(steps);
                    return run.stats().ms;
                  });
}

// The eager step time (s) of `model` at `batch` in torch_baseline.py's CSV (columns model,
// batch, mode, math, step_s, ..., autocast), trained under `autocast` (none, bf16 or fp16), or 0
// when the file has no such row.
double torch_step_seconds(const std::string& path, const std::string& model, int64_t batch,
                          const std::string& math, const std::string& autocast) {
  std::istringstream in(read_file(path));
  std::string line;
  // Python's csv module ends its rows with "\r\n": the '\r' is not part of the last cell.
  auto next_line = [&] {
    if (!std::getline(in, line)) return false;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    return true;
  };
  next_line();
  REGEN_CHECK(line.rfind("model,batch,mode,math,step_s", 0) == 0, "--torch-csv ", path,
              ": expected the header of tools/torch_baseline.py --csv, got '", line, "'");
  while (next_line()) {
    std::vector<std::string> cells;
    std::istringstream row(line);
    std::string cell;
    while (std::getline(row, cell, ',')) cells.push_back(cell);
    if (cells.size() < 5 || cells[0] != model || cells[1] != std::to_string(batch) ||
        cells[2] != "eager" || cells[3] != math || cells[4].empty()) {
      continue;
    }
    // The autocast column (14th; files written before it trained without autocast).
    const std::string ac = cells.size() > 13 && !cells[13].empty() ? cells[13] : "none";
    if (ac != autocast) continue;
    const double step_s =
        decimal_number_text(cells[4]) ? std::strtod(cells[4].c_str(), nullptr) : 0.0;
    REGEN_CHECK(std::isfinite(step_s) && step_s > 0, "--torch-csv ", path,
                ": the step_s of the row '", line, "' is not a positive number of seconds");
    return step_s;
  }
  return 0;
}

// The tools/torch_baseline.py command that runs the same training step in PyTorch, or "" when
// it has no equivalent (it builds the presets with their default classes and vocabulary and
// trains with SGD, momentum 0.9).
std::string torch_baseline_command(const Flags& f, const ModelConfig& c, Device device, int threads,
                                   const std::string& math, const std::string& autocast) {
  // tools/torch_baseline.py's models, by name.
  const bool resnet = c.name == "resnet18" || c.name == "resnet34" || c.name == "resnet50" ||
                      c.name == "resnet101" || c.name == "resnet152";
  const bool lm = c.name == "transformer" || c.name == "bert-base";
  const bool gpt2 = c.name == "gpt2" || c.name == "gpt2-medium";
  const bool known =
      (resnet && c.num_classes == 1000) || (lm && c.vocab == 30000) || (gpt2 && c.vocab == 50257);
  if (!known || f.m.optimizer != "sgd" || f.m.momentum != 0.9 || f.m.weight_decay != 0) return "";
  char dropout[48] = "";
  if (lm) {
    std::snprintf(dropout, sizeof dropout, " --dropout %g", static_cast<double>(c.dropout));
  }
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "python3 tools/torch_baseline.py --device %s --threads %d --model %s --batches "
                "%lld %s %d%s --lr %g --modes eager --math %s --autocast %s --warmup %d --steps %d "
                "--csv torch.csv",
                device.is_cpu() ? "cpu" : "cuda", threads, c.name.c_str(),
                static_cast<long long>(f.m.batch), resnet ? "--image-size" : "--seq-len",
                static_cast<int>(resnet ? c.image_size : c.seq_len), dropout, f.m.lr, math.c_str(),
                autocast.c_str(), f.warmup, f.steps);
  return buf;
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

void run(Flags f) {
  if (!f.json.empty()) {
    std::vector<std::pair<std::string, std::string>> inputs = data_inputs(f.m);
    inputs.emplace_back("--torch-csv", f.torch_csv);
    check_distinct_files({{"--json", f.json}}, inputs);
  }
  // The precision (TF32 by default on a GPU: kBenchMath); its math mode names PyTorch's peer run,
  // and a mixed precision runs the peer under autocast.
  const Device device = resolve_device(f.m.device);
  const Precision precision = resolve_precision(f.m, device, kBenchMath);
  if (f.m.precision.empty()) f.m.math = math_mode(f.m, device, kBenchMath);
  const std::string math = precision == Precision::tf32 ? "tf32" : "fp32";
  const std::string autocast = is_mixed(precision) ? precision_name(precision) : "none";
  if (!f.cpu_conv.empty()) {
    REGEN_CHECK(device.is_cpu(), "--cpu-conv ", f.cpu_conv,
                ": the CPU's convolution algorithm, but this run is on ", device.str());
    REGEN_CHECK(
        f.cpu_conv != "both" || (f.json.empty() && f.torch_csv.empty() && f.m.cuda_graph == "off"),
        "--cpu-conv both compares the two algorithms and writes no --json or "
        "--torch-csv figures: pass winograd or direct with those");
    cpu::set_conv2d_algorithm(f.cpu_conv == "both" ? "winograd" : f.cpu_conv);
  }
  if (!f.against.empty()) {
    REGEN_CHECK(
        f.json.empty() && f.torch_csv.empty() && f.m.cuda_graph == "off" && f.cpu_conv != "both",
        "--against-precision ", f.against,
        " compares two precisions step by step and writes no --json or --torch-csv "
        "figures, runs no CUDA graphs and no --cpu-conv both: drop it, or those");
    REGEN_CHECK(f.against != "tf32" || device.is_cuda(),
                "--against-precision tf32 applies to CUDA devices; on ", device.str(),
                " pass fp32, bf16 or fp16");
    REGEN_CHECK(parse_precision(f.against) != precision, "--against-precision ", f.against,
                ": this run's precision is ", precision_name(precision),
                " too (pass --precision for this run's side)");
  }
  auto s = make_session(f.m);
  const ModelConfig& c = s->config;
  const int threads = omp_get_max_threads();
  // PyTorch's step, read before any step runs: a file without the row refuses now, not after the
  // benchmark.
  double torch_s = 0;
  if (!f.torch_csv.empty()) {
    torch_s = torch_step_seconds(f.torch_csv, c.name, f.m.batch, math, autocast);
    REGEN_CHECK(torch_s > 0, "--torch-csv ", f.torch_csv, " has no eager ", math, " row (autocast ",
                autocast, ") for ", c.name, " batch ", f.m.batch,
                ": nothing to compare this run with (tools/torch_baseline.py --csv writes one)");
  }
  // The library's training loop, without a plan: the warm-up steps, then the timed ones (a loss
  // or weight that is not finite stops either).
  RematPipeline pipe(*s->trainer);
  // --cuda-graph on|auto: a graph needs every block's address before the step, so the steps run
  // under plan none with a planned layout (one profiled step first, untimed, as a warm-up is).
  if (f.m.cuda_graph != "off") {
    TrainingRun profiling(*s, pipe);
    ProfileOptions po;
    po.warmup = 0;
    po.iterations = 1;
    po.model_name = f.m.model;
    po.measure_transfer = false;
    profiling.profile(po);
    PlanOptions plan;
    plan.planned_layout = true;
    pipe.plan("none", Budget(), plan);
  }
  if (f.cpu_conv == "both" || !f.against.empty()) {  // a comparison (refused together above)
    std::printf("bench train: %s batch %lld on %s, %d threads (regen, %s lr %g)\n", c.name.c_str(),
                static_cast<long long>(f.m.batch), s->device.str().c_str(), threads,
                f.m.optimizer.c_str(), f.m.lr);
    if (f.cpu_conv == "both") {
      compare_cpu_conv(f, *s, pipe);
    } else {
      compare_precisions(f, *s, pipe, precision);
    }
    return;
  }
  if (f.warmup > 0) TrainingRun(*s, pipe).run(f.warmup);
  TrainingRun timed(*s, pipe);
  timed.run(f.steps);
  const std::vector<double>& ms = timed.stats().ms;
  const int64_t peak = timed.stats().peak_allocated, peak_reserved = timed.stats().peak_reserved;
  const double med = median(ms);
  const double lo = *std::min_element(ms.begin(), ms.end());
  const double hi = *std::max_element(ms.begin(), ms.end());
  const double sps = med > 0 ? 1000.0 * f.m.batch / med : 0.0;
  // The model's options with the values this run has: "--seq-len 16, --vocab 101, ...".
  std::string shape;
  const std::vector<ModelOption>& options = model_info(c.name).input.options;
  for (const ModelOption& o : options) {
    shape += (shape.empty() ? "" : ", ") +
             option_setting(o.key, option_value_text(o, o.get(c)), OptionStyle::flag);
  }
  if (shape.empty()) shape = "the preset's sizes";
  std::printf("bench train: %s batch %lld, %s, on %s, %d threads, precision %s (regen, %s lr %g)\n",
              c.name.c_str(), static_cast<long long>(f.m.batch), shape.c_str(),
              s->device.str().c_str(), threads, precision_name(precision), f.m.optimizer.c_str(),
              f.m.lr);
  std::printf("  step time: median %s, min %s, max %s over %d timed steps after %d warm-up\n",
              format_ms(med).c_str(), format_ms(lo).c_str(), format_ms(hi).c_str(), f.steps,
              f.warmup);
  std::printf("  %.2f samples/s; peak allocated %s, reserved %s\n", sps, format_bytes(peak).c_str(),
              format_bytes(peak_reserved).c_str());

  if (!f.torch_csv.empty()) {
    std::printf("  PyTorch (%s): median step %s; regen / PyTorch = %.2f\n", f.torch_csv.c_str(),
                format_ms(torch_s * 1000).c_str(), med / 1000 / torch_s);
  } else {
    const std::string peer = torch_baseline_command(f, c, s->device, threads, math, autocast);
    if (!peer.empty()) {
      std::printf(
          "  PyTorch on the same model, batch and threads: %s (then --torch-csv torch.csv "
          "here for the ratio)\n",
          peer.c_str());
    } else {
      std::printf(
          "  PyTorch: tools/torch_baseline.py has no peer for this configuration (it "
          "runs resnet18..152 with 1000 classes, transformer / bert-base with a "
          "30000 vocabulary and gpt2 / gpt2-medium with 50257, SGD with momentum 0.9)\n");
    }
  }

  if (!f.json.empty()) {
    std::ostringstream j;
    char num[64];
    auto seconds = [&](double v_ms) {
      std::snprintf(num, sizeof num, "%.9f", v_ms / 1000);
      return std::string(num);
    };
    j << "{\n  \"tool\": \"regen bench train\",\n  \"model\": " << json_string(c.name)
      << ",\n  \"batch\": " << f.m.batch << ",\n  \"math\": \"" << math
      << "\",\n  \"precision\": \"" << precision_name(precision)
      << "\",\n  \"device\": " << json_string(s->device.str()) << ",\n  \"threads\": " << threads
      << ",\n";
    for (const ModelOption& o : options) {
      j << "  " << json_string(o.key) << ": " << option_value_text(o, o.get(c)) << ",\n";
    }
    j << "  \"optimizer\": " << json_string(f.m.optimizer) << ",\n  \"warmup\": " << f.warmup
      << ",\n  \"steps\": " << f.steps << ",\n  \"step_s\": " << seconds(med)
      << ",\n  \"step_min_s\": " << seconds(lo) << ",\n  \"step_max_s\": " << seconds(hi)
      << ",\n  \"step_ms\": [";
    for (size_t i = 0; i < ms.size(); ++i) {
      std::snprintf(num, sizeof num, "%.4f", ms[i]);
      j << (i ? ", " : "") << num;
    }
    std::snprintf(num, sizeof num, "%.4f", sps);
    j << "],\n  \"samples_per_s\": " << num << ",\n  \"peak_bytes\": " << peak
      << ",\n  \"peak_reserved_bytes\": " << peak_reserved;
    if (torch_s > 0) {
      std::snprintf(num, sizeof num, "%.9f", torch_s);
      j << ",\n  \"torch_step_s\": " << num;
      std::snprintf(num, sizeof num, "%.4f", med / 1000 / torch_s);
      j << ",\n  \"ratio_regen_over_torch\": " << num;
    }
    j << "\n}\n";
    if (output_rank()) write_file_atomic(f.json, j.str());
    std::printf("  wrote %s\n", f.json.c_str());
  }
}

void setup(CLI::App& app) {
  auto f = std::make_shared<Flags>();
  add_model_flags(app, f->m, true, kBenchMathHelp);
  app.add_option("--warmup", f->warmup, "untimed steps first")
      ->check(non_negative_integer(kIntMax))
      ->capture_default_str();
  app.add_option("--steps", f->steps, "timed steps")
      ->check(positive_integer(kIntMax))
      ->capture_default_str();
  app.add_option("--cuda-graph", f->m.cuda_graph,
                 "CUDA graphs: on (the steps under plan none with a planned layout, every one "
                 "after the first a replayed graph; refused where they cannot be captured, naming "
                 "why), auto (captured where they can be) or off")
      ->check(CLI::IsMember({"on", "off", "auto"}))
      ->capture_default_str();
  app.add_option("--json", f->json,
                 "also write the figures to FILE (atomic): model, batch, math, device, threads, "
                 "the model's options (image_size, seq_len, ...), step_s (median), step_min_s, "
                 "step_max_s, step_ms, "
                 "samples_per_s, peak_bytes")
      ->check(non_empty("a file name"));
  app.add_option("--cpu-conv", f->cpu_conv,
                 "the CPU's algorithm for 3x3 stride-1 convolutions (f32, bf16, f16), over the "
                 "variable "
                 "REGEN_CPU_CONV: winograd (the default), direct, or both (the two alternated "
                 "step by step in one process: --steps pairs, each one's median and the median "
                 "ratio)")
      ->check(CLI::IsMember({"winograd", "direct", "both"}));
  app.add_option("--against-precision", f->against,
                 "also build the model in this precision (fp32, tf32, bf16 or fp16) and alternate "
                 "a step of each with this run's, in one process: --steps pairs, each one's "
                 "median and the median ratio (this run's / this one's); both sessions' memory "
                 "is held at once")
      ->check(CLI::IsMember({"fp32", "tf32", "bf16", "fp16"}));
  app.add_option("--torch-csv", f->torch_csv,
                 "CSV from tools/torch_baseline.py --csv (same model, batch, device and threads): "
                 "print the ratio regen / PyTorch");
  app.callback([f] { run(*f); });
}
REGEN_COMMAND("bench train", "time training steps of a model (median after warm-up)", setup);

}  // namespace
}  // namespace regen::tool
