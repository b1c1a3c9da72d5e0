// `regen bench ops`: times GEMM and the three conv2d launchers (forward, backward-data,
// backward-filter) on the convolution shapes of ResNet-152 at batch 4, 224x224, f32, and prints
// the median time, GFLOP/s, the thread count and the math mode (on CUDA TF32 by default: cuBLAS's
// GEMMs may use TF32 tensor cores; the convolutions are regen's own, FP32). With --json it also
// writes the rows, which tools/bench_ops_torch.py reads to print PyTorch's figures beside them
// (docs/results.md).
// Timings are never asserted anywhere; this is a measuring tool.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "regen/core/io.h"
#include "regen/core/tensor.h"
#include "regen/kernels/kernels.h"
#include "tools/command.h"
#include "tools/common.h"
#ifdef REGEN_WITH_CUDA
#include "regen/core/cuda/runtime.h"
#include "regen/kernels/cuda/cuda_kernels.h"
#endif

namespace {
using namespace regen;
using namespace regen::tool;

// Every distinct convolution of torchvision's ResNet-152 (stride on the 3x3, "v1.5") at batch 4
// and how many times one forward pass runs it. Keep in sync with tools/bench_ops_torch.py.
struct ConvCase {
  const char* name;
  int count;
  int64_t N, C, H, W, K, R, S, stride, pad;
};
const ConvCase kConvShapes[] = {
    {"stem 7x7/2", 1, 4, 3, 224, 224, 64, 7, 7, 2, 3},
    {"s1 1x1 64>64", 1, 4, 64, 56, 56, 64, 1, 1, 1, 0},
    {"s1 3x3 64", 3, 4, 64, 56, 56, 64, 3, 3, 1, 1},
    {"s1 1x1 64>256", 4, 4, 64, 56, 56, 256, 1, 1, 1, 0},
    {"s1 1x1 256>64", 2, 4, 256, 56, 56, 64, 1, 1, 1, 0},
    {"s2 1x1 256>128 @56", 1, 4, 256, 56, 56, 128, 1, 1, 1, 0},
    {"s2 3x3/2 128", 1, 4, 128, 56, 56, 128, 3, 3, 2, 1},
    {"s2 1x1/2 256>512 ds", 1, 4, 256, 56, 56, 512, 1, 1, 2, 0},
    {"s2 1x1 128>512", 8, 4, 128, 28, 28, 512, 1, 1, 1, 0},
    {"s2 1x1 512>128", 7, 4, 512, 28, 28, 128, 1, 1, 1, 0},
    {"s2 3x3 128", 7, 4, 128, 28, 28, 128, 3, 3, 1, 1},
    {"s3 1x1 512>256 @28", 1, 4, 512, 28, 28, 256, 1, 1, 1, 0},
    {"s3 3x3/2 256", 1, 4, 256, 28, 28, 256, 3, 3, 2, 1},
    {"s3 1x1/2 512>1024 ds", 1, 4, 512, 28, 28, 1024, 1, 1, 2, 0},
    {"s3 1x1 256>1024", 36, 4, 256, 14, 14, 1024, 1, 1, 1, 0},
    {"s3 1x1 1024>256", 35, 4, 1024, 14, 14, 256, 1, 1, 1, 0},
    {"s3 3x3 256", 35, 4, 256, 14, 14, 256, 3, 3, 1, 1},
    {"s4 1x1 1024>512 @14", 1, 4, 1024, 14, 14, 512, 1, 1, 1, 0},
    {"s4 3x3/2 512", 1, 4, 512, 14, 14, 512, 3, 3, 2, 1},
    {"s4 1x1/2 1024>2048 ds", 1, 4, 1024, 14, 14, 2048, 1, 1, 2, 0},
    {"s4 1x1 512>2048", 3, 4, 512, 7, 7, 2048, 1, 1, 1, 0},
    {"s4 1x1 2048>512", 2, 4, 2048, 7, 7, 512, 1, 1, 1, 0},
    {"s4 3x3 512", 2, 4, 512, 7, 7, 512, 3, 3, 1, 1},
};
// (M, N, K): square references and the GEMMs behind a few of the convolutions above.
const int64_t kGemmShapes[][3] = {
    {1024, 1024, 1024}, {2048, 2048, 2048}, {256, 3136, 64}, {1024, 196, 256}, {512, 49, 4608}};

// Memory-bound kernels beside them, timed by the bytes they read and write: dropout of the seed
// Transformer's feed-forward activations at batch 8, batch norm of a ResNet stage-1 output at
// batch 4.
const char* const kDropoutCase = "dropout 1024x2048";
const char* const kBatchnormCase = "batchnorm 4x256x56x56";

struct Row {
  std::string kind, name;
  int count;
  double seconds, gflops;  // median; gflops is 0 for a memory-bound row
  double best_seconds;
  double gbytes = 0;  // a memory-bound row's GB/s (bytes read and written over the median)
};

void sync(Device d) {
#ifdef REGEN_WITH_CUDA
  if (d.is_cuda()) cuda::synchronize();
#else
  (void)d;
#endif
}

struct Timing {
  double median, best;
};

// Median and best wall time of `repeats` runs after one warm-up run. The best run shows what
// the code can do when no other process shares the cores; the median is what we report.
template <class F>
Timing time_runs(Device d, int repeats, F&& fn) {
  fn();
  sync(d);
  std::vector<double> t;
  for (int i = 0; i < repeats; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    sync(d);
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  const size_t h = t.size() / 2;
  return {t.size() % 2 ? t[h] : 0.5 * (t[h - 1] + t[h]), t.front()};
}

void run(const std::string& device_text, int threads, int repeats, const std::string& json_path,
         const std::string& only, const std::string& math_flag, bool tf32_flag) {
  const Device dev =
      resolve_device(device_text);  // a device that is not there fails before the header
  const std::string math = math_mode(math_flag, tf32_flag, dev, kBenchMath);
  REGEN_CHECK(repeats > 0, "bench ops: --repeats must be positive, got ", repeats);
  if (!json_path.empty()) check_output_path("--json", json_path);  // before the timings, not after
  if (threads > 0) omp_set_num_threads(threads);
  threads = omp_get_max_threads();
#ifdef REGEN_WITH_CUDA
  cuda::set_tf32(math == "tf32");
#endif
  std::vector<Row> rows;
  auto report = [&](const char* kind, const std::string& name, int count, Timing tm, double flops) {
    rows.push_back({kind, name, count, tm.median, flops / tm.median / 1e9, tm.best});
    std::printf("%-16s %-24s %5d %10.3f %10.1f %10.3f\n", kind, name.c_str(), count,
                tm.median * 1e3, rows.back().gflops, tm.best * 1e3);
    std::fflush(stdout);
  };
  if (!only.empty()) {
    // A filter that matches no case is a mistake, not an empty benchmark.
    std::string names;
    bool any = false;
    for (const auto& g : kGemmShapes) {
      const std::string name =
          "gemm " + std::to_string(g[0]) + "x" + std::to_string(g[1]) + "x" + std::to_string(g[2]);
      any = any || name.find(only) != std::string::npos;
      names += (names.empty() ? "" : ", ") + name;
    }
    for (const ConvCase& cc : kConvShapes) {
      any = any || std::string(cc.name).find(only) != std::string::npos;
      names += std::string(", ") + cc.name;
    }
    for (const char* name : {kDropoutCase, kBatchnormCase}) {
      any = any || std::string(name).find(only) != std::string::npos;
      names += std::string(", ") + name;
    }
    REGEN_CHECK(any, "--only '", only, "' matches no case; the cases are: ", names);
  }
  std::printf("# regen bench ops: device %s, %d CPU threads, f32, math %s, median of %d runs\n",
              dev.str().c_str(), threads, math.c_str(), repeats);
  std::printf("%-16s %-24s %5s %10s %10s %10s\n", "pass", "shape", "count", "median ms", "GFLOP/s",
              "best ms");
  Generator gen(1);
  for (const auto& g : kGemmShapes) {
    const int64_t M = g[0], N = g[1], K = g[2];
    const std::string name =
        "gemm " + std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K);
    if (!only.empty() && name.find(only) == std::string::npos) continue;
    Tensor a = uniform({M, K}, -1, 1, gen, DType::f32, dev);
    Tensor b = uniform({K, N}, -1, 1, gen, DType::f32, dev);
    Tensor c = empty({M, N}, DType::f32, dev);
    const Timing tm = time_runs(dev, repeats, [&] {
      REGEN_LAUNCH(dev, float, gemm, false, false, M, N, K, 1.0f, a.data<float>(), K,
                   b.data<float>(), N, 0.0f, c.data<float>(), N);
    });
    report("gemm", name, 1, tm, 2.0 * M * N * K);
  }
  double total = 0, best_total = 0;
  for (const ConvCase& cc : kConvShapes) {
    if (!only.empty() && std::string(cc.name).find(only) == std::string::npos) continue;
    const ConvShape s = make_conv_shape(cc.N, cc.C, cc.H, cc.W, cc.K, cc.R, cc.S, cc.stride,
                                        cc.stride, cc.pad, cc.pad);
    Tensor x = uniform({s.N, s.C, s.H, s.W}, -1, 1, gen, DType::f32, dev);
    Tensor w = uniform({s.K, s.C, s.R, s.S}, -0.1, 0.1, gen, DType::f32, dev);
    Tensor dy = uniform({s.N, s.K, s.P, s.Q}, -1, 1, gen, DType::f32, dev);
    Tensor y = empty(dy.shape(), DType::f32, dev), dx = empty(x.shape(), DType::f32, dev);
    Tensor dw = empty(w.shape(), DType::f32, dev);
    const double flops = 2.0 * s.N * s.K * s.P * s.Q * s.C * s.R * s.S;
    const Timing fwd = time_runs(dev, repeats, [&] {
      REGEN_LAUNCH(dev, float, conv2d_forward, x.data<float>(), w.data<float>(), nullptr,
                   y.data<float>(), s);
    });
    report("forward", cc.name, cc.count, fwd, flops);
    const Timing bwd_data = time_runs(dev, repeats, [&] {
      REGEN_LAUNCH(dev, float, conv2d_backward_data, dy.data<float>(), w.data<float>(),
                   dx.data<float>(), s);
    });
    report("backward_data", cc.name, cc.count, bwd_data, flops);
    const Timing bwd_filter = time_runs(dev, repeats, [&] {
      REGEN_LAUNCH(dev, float, conv2d_backward_filter, x.data<float>(), dy.data<float>(),
                   dw.data<float>(), nullptr, s);
    });
    report("backward_filter", cc.name, cc.count, bwd_filter, flops);
    // A training step never needs the gradient of the network's input (the stem's dx).
    const bool needs_dx = std::string(cc.name).rfind("stem", 0) != 0;
    total += cc.count * (fwd.median + (needs_dx ? bwd_data.median : 0.0) + bwd_filter.median);
    best_total += cc.count * (fwd.best + (needs_dx ? bwd_data.best : 0.0) + bwd_filter.best);
  }
  if (only.empty()) {
    std::printf(
        "# all ResNet-152 convolutions of one training step at batch 4 (each shape times "
        "its count): %.3f s\n",
        total);
  }
  auto report_bytes = [&](const char* kind, const std::string& name, Timing tm, double bytes) {
    rows.push_back({kind, name, 1, tm.median, 0.0, tm.best, bytes / tm.median / 1e9});
    std::printf("%-16s %-24s %5d %10.3f %10.1f %10.3f   GB/s\n", kind, name.c_str(), 1,
                tm.median * 1e3, rows.back().gbytes, tm.best * 1e3);
    std::fflush(stdout);
  };
  if (only.empty() || std::string(kDropoutCase).find(only) != std::string::npos) {
    const int64_t n = 1024 * 2048;
    Tensor x = uniform({n}, -1, 1, gen, DType::f32, dev), y = empty({n}, DType::f32, dev);
    uint64_t stream = 0;
    const Timing tm = time_runs(dev, repeats, [&] {
      REGEN_LAUNCH(dev, float, dropout_forward, x.data<float>(), y.data<float>(), n, 0.1f,
                   uint64_t{1}, ++stream);
    });
    report_bytes("dropout", kDropoutCase, tm, 2.0 * n * sizeof(float));
  }
  if (only.empty() || std::string(kBatchnormCase).find(only) != std::string::npos) {
    const int64_t N = 4, C = 256, HW = 56 * 56, n = N * C * HW;
    Tensor x = uniform({N, C, HW}, -1, 1, gen, DType::f32, dev);
    Tensor dy = uniform({N, C, HW}, -1, 1, gen, DType::f32, dev);
    Tensor y = empty(x.shape(), DType::f32, dev), dx = empty(x.shape(), DType::f32, dev);
    Tensor gamma = uniform({C}, 0.5, 1.5, gen, DType::f32, dev);
    Tensor beta = uniform({C}, -0.5, 0.5, gen, DType::f32, dev);
    Tensor mean = empty({C}, DType::f32, dev), invstd = empty({C}, DType::f32, dev);
    Tensor dgamma = empty({C}, DType::f32, dev), dbeta = empty({C}, DType::f32, dev);
    const double plane = static_cast<double>(n) * sizeof(float);
    // Forward reads x twice (statistics, normalize) and writes y; backward reads dy and x twice
    // and writes dx.
    const Timing fwd = time_runs(dev, repeats, [&] {
      REGEN_LAUNCH(dev, float, batchnorm_forward_train, x.data<float>(), gamma.data<float>(),
                   beta.data<float>(), y.data<float>(), mean.data<float>(), invstd.data<float>(),
                   nullptr, nullptr, N, C, HW, 0.1, 1e-5);
    });
    report_bytes("batchnorm_fwd", kBatchnormCase, fwd, 3 * plane);
    const Timing bwd = time_runs(dev, repeats, [&] {
      REGEN_LAUNCH(dev, float, batchnorm_backward, dy.data<float>(), x.data<float>(),
                   gamma.data<float>(), mean.data<float>(), invstd.data<float>(), dx.data<float>(),
                   dgamma.data<float>(), dbeta.data<float>(), N, C, HW);
    });
    report_bytes("batchnorm_bwd", kBatchnormCase, bwd, 5 * plane);
  }
  if (!json_path.empty()) {
    nlohmann::json j;
    j["device"] = dev.str();
    j["math"] = math;
    j["threads"] = threads;
    j["repeats"] = repeats;
    j["conv_step_seconds"] = total;
    j["conv_step_best_seconds"] = best_total;
    for (const Row& r : rows) {
      nlohmann::json row = {{"kind", r.kind},     {"name", r.name},
                            {"count", r.count},   {"seconds", r.seconds},
                            {"gflops", r.gflops}, {"best_seconds", r.best_seconds}};
      if (r.gbytes > 0) row["gbytes_per_s"] = r.gbytes;
      j["rows"].push_back(row);
    }
    write_file_atomic(json_path, j.dump(1) + "\n");
  }
}

void setup(CLI::App& app) {
  struct Options {
    std::string device = "cpu", json, only, math;
    int threads = 0, repeats = 5;
    bool tf32 = false;
  };
  auto opt = std::make_shared<Options>();
  app.add_option("--device", opt->device, "cpu or cuda[:N]")->capture_default_str();
  app.add_option("--threads", opt->threads,
                 "OpenMP threads, at most 1024 (default: OpenMP's choice)")
      ->check(positive_integer(SessionOptions::kMaxThreads));
  app.add_option("--repeats", opt->repeats, "timed runs per case (median)")
      ->check(positive_integer(kIntMax))
      ->capture_default_str();
  app.add_option("--json", opt->json, "also write the rows as JSON (for bench_ops_torch.py)")
      ->check(non_empty("a file name"));
  app.add_option("--only", opt->only, "only cases whose name contains this text");
  add_math_flags(app, opt->math, opt->tf32, kBenchMathHelp);
  app.callback([opt] {
    run(opt->device, opt->threads, opt->repeats, opt->json, opt->only, opt->math, opt->tf32);
  });
}
REGEN_COMMAND("bench ops", "time GEMM and conv2d on ResNet-152 shapes, dropout and batch norm",
              setup);

}  // namespace
