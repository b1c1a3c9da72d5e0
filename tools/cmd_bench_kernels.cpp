// `regen bench kernels`: times the CUDA kernels on ResNet-152 and Transformer shapes and compares
// each with the library path or the hardware limit it stands against:
//   conv2d       native implicit GEMM (FP32) vs cuDNN (deterministic algorithms, in the math mode)
//   attention    fused flash-style forward+backward (FP32) vs an unfused path (permute, cuBLAS
//                batched GEMMs in the math mode, softmax kernels; the S x S matrices
//                materialized), with peak memory
//   layernorm    achieved bandwidth vs the 3.35 TB/s HBM3 of an H100 SXM
//   gemm, misc   achieved TFLOP/s or GB/s, for reference; misc has a forward and a backward row
//                for every op of the unary list (kernels/unary_ops.h, cuda::unary_launchers())
// Each number is the median of --repeats timed runs (CUDA events on regen's compute stream) after
// --warmup runs. The math mode (--math, printed in every section's title) is TF32 by default:
// cuBLAS and cuDNN may use TF32 tensor cores, as people run them on Hopper; --math fp32 makes the
// comparison with the FP32 native kernels like for like. Compiled only in CUDA builds; without a
// visible GPU it reports an error and exits non-zero. The kernels are documented in
// docs/kernels.md.
#ifdef REGEN_WITH_CUDA
#include <cuda_runtime_api.h>
#ifdef REGEN_WITH_CUDNN
#include <cudnn.h>
#endif

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "regen/core/cuda/runtime.h"
#include "regen/core/error.h"
#include "regen/core/tensor.h"
#include "regen/kernels/kernels.h"
#include "tools/command.h"
#include "tools/common.h"

namespace {

using namespace regen;
using namespace regen::tool;

constexpr double kHbmBytesPerSecond = 3.35e12;  // H100 SXM5 HBM3

struct Options {
  std::vector<int64_t> batches{32, 64};
  std::vector<int64_t> seqs{128, 256, 512, 1024};
  int repeats = 10;
  int warmup = 2;
  std::vector<std::string> only;
  std::string math;   // --math; resolved by run() to fp32 or tf32
  bool tf32 = false;  // --tf32, the same as --math tf32
};

// How the libraries compute in the run's math mode, for the section titles.
std::string library_math(const Options& o) {
  return o.math == "tf32" ? "tf32: TF32 tensor cores allowed" : "fp32: strict FP32";
}

bool wanted(const Options& o, const std::string& section) {
  return o.only.empty() || std::find(o.only.begin(), o.only.end(), section) != o.only.end();
}

// Median milliseconds of fn over the repeats, each run bracketed by events on the compute stream.
double time_ms(const Options& o, const std::function<void()>& fn) {
  cudaStream_t s = cuda::stream();
  cudaEvent_t start, stop;
  REGEN_CUDA_CHECK(cudaEventCreate(&start));
  REGEN_CUDA_CHECK(cudaEventCreate(&stop));
  for (int i = 0; i < o.warmup; ++i) fn();
  std::vector<double> ms;
  for (int i = 0; i < o.repeats; ++i) {
    REGEN_CUDA_CHECK(cudaEventRecord(start, s));
    fn();
    REGEN_CUDA_CHECK(cudaEventRecord(stop, s));
    REGEN_CUDA_CHECK(cudaEventSynchronize(stop));
    float t = 0;
    REGEN_CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
    ms.push_back(t);
  }
  REGEN_CUDA_CHECK(cudaEventDestroy(start));
  REGEN_CUDA_CHECK(cudaEventDestroy(stop));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

Tensor filled(const Shape& shape, float value) {
  Tensor t = empty(shape, DType::f32, Device::cuda(0));
  cuda::fill(t.data<float>(), t.numel(), value);
  return t;
}

double tflops(double flops, double ms) {
  return flops / (ms * 1e-3) / 1e12;
}
double gbps(double bytes, double ms) {
  return bytes / (ms * 1e-3) / 1e9;
}

// ---- Convolution
// ---------------------------------------------------------------------------------

struct ConvCase {
  std::string name;
  ConvShape s;
  int count;               // occurrences in ResNet-152
  bool input_grad = true;  // training computes its dgrad (not the stem's: images need none)
};

std::vector<ConvCase> resnet152(int64_t N) {
  std::vector<ConvCase> v;
  v.push_back({"stem 7x7/2", make_conv_shape(N, 3, 224, 224, 64, 7, 7, 2, 2, 3, 3), 1, false});
  struct Stage {
    const char* name;
    int64_t in, width, out, hw, blocks, stride;
  };
  const Stage stages[] = {{"layer1", 64, 64, 256, 56, 3, 1},
                          {"layer2", 256, 128, 512, 56, 8, 2},
                          {"layer3", 512, 256, 1024, 28, 36, 2},
                          {"layer4", 1024, 512, 2048, 14, 3, 2}};
  auto add = [&](const std::string& n, const ConvShape& s, int count) {
    v.push_back({n, s, count});
  };
  for (const Stage& st : stages) {
    const int64_t o = st.hw / st.stride;
    const std::string p = st.name;
    add(p + " 1x1 reduce (first)",
        make_conv_shape(N, st.in, st.hw, st.hw, st.width, 1, 1, 1, 1, 0, 0), 1);
    add(p + " 3x3 (first)",
        make_conv_shape(N, st.width, st.hw, st.hw, st.width, 3, 3, st.stride, st.stride, 1, 1), 1);
    add(p + " 1x1 expand", make_conv_shape(N, st.width, o, o, st.out, 1, 1, 1, 1, 0, 0),
        static_cast<int>(st.blocks));
    add(p + " 1x1 downsample",
        make_conv_shape(N, st.in, st.hw, st.hw, st.out, 1, 1, st.stride, st.stride, 0, 0), 1);
    add(p + " 1x1 reduce", make_conv_shape(N, st.out, o, o, st.width, 1, 1, 1, 1, 0, 0),
        static_cast<int>(st.blocks - 1));
    add(p + " 3x3", make_conv_shape(N, st.width, o, o, st.width, 3, 3, 1, 1, 1, 1),
        static_cast<int>(st.blocks - 1));
  }
  return v;
}

void bench_conv(const Options& o) {
  std::printf("\n== conv2d: ResNet-152 shapes, native implicit GEMM (fp32) vs cuDNN (math %s) ==\n",
              library_math(o).c_str());
#ifndef REGEN_WITH_CUDNN
  std::printf("(built without cuDNN: native timings only)\n");
#endif
  std::printf("%-26s %5s %-5s %10s %9s %10s %9s %8s\n", "layer", "batch", "pass", "native ms",
              "TFLOP/s", "cudnn ms", "TFLOP/s", "cudnn/nat");
  for (int64_t N : o.batches) {
    double total_native = 0, total_cudnn = 0;
    bool cudnn_complete = true;
    for (const ConvCase& c : resnet152(N)) {
      if (c.count == 0) continue;
      const ConvShape& s = c.s;
      Tensor x = filled({s.N, s.C, s.H, s.W}, 0.01f), w = filled({s.K, s.C, s.R, s.S}, 0.02f);
      Tensor y = filled({s.N, s.K, s.P, s.Q}, 0.0f), dy = filled({s.N, s.K, s.P, s.Q}, 0.03f);
      Tensor dx = filled({s.N, s.C, s.H, s.W}, 0.0f), dw = filled({s.K, s.C, s.R, s.S}, 0.0f);
      const double flops = 2.0 * s.N * s.K * s.P * s.Q * s.C * s.R * s.S;
      const char* passes[] = {"fwd", "dgrad", "wgrad"};
      for (int pass = 0; pass < 3; ++pass) {
        auto run = [&] {
          if (pass == 0)
            cuda::conv2d_forward(x.data<float>(), w.data<float>(), nullptr, y.data<float>(), s);
          if (pass == 1)
            cuda::conv2d_backward_data(dy.data<float>(), w.data<float>(), dx.data<float>(), s);
          if (pass == 2)
            cuda::conv2d_backward_filter(x.data<float>(), dy.data<float>(), dw.data<float>(),
                                         nullptr, s);
        };
        // The totals are what a training step runs: not a dgrad training skips.
        const int in_step = pass == 1 && !c.input_grad ? 0 : c.count;
        cuda::set_conv_algo(cuda::ConvAlgo::native);
        const double native = time_ms(o, run);
        total_native += native * in_step;
        double cudnn = NAN;
#ifdef REGEN_WITH_CUDNN
        try {
          cuda::set_conv_algo(cuda::ConvAlgo::cudnn);
          cudnn = time_ms(o, run);
          total_cudnn += cudnn * in_step;
        } catch (const Error& e) {
          cudnn_complete = false;
          std::printf("  (cuDNN: %s)\n", e.message().c_str());
        }
        cuda::set_conv_algo(cuda::ConvAlgo::native);
#else
        cudnn_complete = false;
#endif
        std::printf("%-26s %5lld %-5s %10.3f %9.2f %10.3f %9.2f %8.2f%s\n", c.name.c_str(),
                    static_cast<long long>(N), passes[pass], native, tflops(flops, native), cudnn,
                    tflops(flops, cudnn), cudnn / native,
                    in_step == 0 ? "  (not in training)" : "");
      }
    }
    std::printf(
        "ResNet-152 batch %lld, the convolutions of one training iteration (fwd+dgrad+wgrad, each "
        "layer x its count, no dgrad for the stem): native (fp32) %.1f ms",
        static_cast<long long>(N), total_native);
    if (cudnn_complete) {
      std::printf(", cuDNN (math %s) %.1f ms, cuDNN/native %.2f", o.math.c_str(), total_cudnn,
                  total_cudnn / total_native);
    }
    std::printf("\n");
  }
}

// ---- Attention
// -----------------------------------------------------------------------------------

// The unfused reference: permute to (3, B, H, S, Dh), cuBLAS batched GEMMs, softmax kernels.
struct Unfused {
  AttentionShape s;
  Tensor qkvp, P, Op, dOp, dP, dqkvp;
  int64_t BH, S, Dh;
  Unfused(const AttentionShape& shape)
      : s(shape), BH(shape.B * shape.H), S(shape.S), Dh(shape.Dh) {}
  const float* part(const Tensor& t, int i) const { return t.data<float>() + i * BH * S * Dh; }
  float* part(Tensor& t, int i) { return t.data<float>() + i * BH * S * Dh; }
  void forward(const Tensor& qkv, Tensor& out) {
    qkvp = empty({3, s.B, s.H, S, Dh}, DType::f32, Device::cuda(0));
    P = empty({BH, S, S}, DType::f32, Device::cuda(0));
    Op = empty({s.B, s.H, S, Dh}, DType::f32, Device::cuda(0));
    PermuteShape ps{5, {s.B, S, 3, s.H, Dh}, {2, 0, 3, 1, 4}};
    cuda::permute(qkv.data<float>(), qkvp.data<float>(), ps);
    cuda::gemm_batched(false, true, BH, S, S, Dh, s.scale, part(qkvp, 0), Dh, S * Dh, part(qkvp, 1),
                       Dh, S * Dh, 0.0f, P.data<float>(), S, S * S);
    cuda::softmax_forward(P.data<float>(), P.data<float>(), BH * S, S);
    cuda::gemm_batched(false, false, BH, S, Dh, S, 1.0f, P.data<float>(), S, S * S, part(qkvp, 2),
                       Dh, S * Dh, 0.0f, Op.data<float>(), Dh, S * Dh);
    PermuteShape po{4, {s.B, s.H, S, Dh}, {0, 2, 1, 3}};
    cuda::permute(Op.data<float>(), out.data<float>(), po);
  }
  void backward(const Tensor& dout, Tensor& dqkv) {
    dOp = empty({s.B, s.H, S, Dh}, DType::f32, Device::cuda(0));
    dP = empty({BH, S, S}, DType::f32, Device::cuda(0));
    dqkvp = empty({3, s.B, s.H, S, Dh}, DType::f32, Device::cuda(0));
    PermuteShape pd{4, {s.B, S, s.H, Dh}, {0, 2, 1, 3}};
    cuda::permute(dout.data<float>(), dOp.data<float>(), pd);
    // dV = P^T dO, dP = dO V^T, dS = softmax'(dP), dQ = scale dS K, dK = scale dS^T Q
    cuda::gemm_batched(true, false, BH, S, Dh, S, 1.0f, P.data<float>(), S, S * S,
                       dOp.data<float>(), Dh, S * Dh, 0.0f, part(dqkvp, 2), Dh, S * Dh);
    cuda::gemm_batched(false, true, BH, S, S, Dh, 1.0f, dOp.data<float>(), Dh, S * Dh,
                       part(qkvp, 2), Dh, S * Dh, 0.0f, dP.data<float>(), S, S * S);
    cuda::softmax_backward(dP.data<float>(), P.data<float>(), dP.data<float>(), BH * S, S);
    cuda::gemm_batched(false, false, BH, S, Dh, S, s.scale, dP.data<float>(), S, S * S,
                       part(qkvp, 1), Dh, S * Dh, 0.0f, part(dqkvp, 0), Dh, S * Dh);
    cuda::gemm_batched(true, false, BH, S, Dh, S, s.scale, dP.data<float>(), S, S * S,
                       part(qkvp, 0), Dh, S * Dh, 0.0f, part(dqkvp, 1), Dh, S * Dh);
    PermuteShape pb{5, {3, s.B, s.H, S, Dh}, {1, 3, 0, 2, 4}};
    cuda::permute(dqkvp.data<float>(), dqkv.data<float>(), pb);
  }
};

void bench_attention(const Options& o) {
  std::printf(
      "\n== attention: fused flash-style (fp32) vs unfused (cuBLAS batched GEMM, math %s, + "
      "softmax), H=8 Dh=64 ==\n",
      library_math(o).c_str());
  std::printf("%5s %5s %11s %11s %9s %13s %13s %8s %12s %12s\n", "batch", "seq", "fused fwd",
              "fused bwd", "TFLOP/s", "unfused fwd", "unfused bwd", "unf/fus", "fused peak",
              "unfused peak");
  CachingAllocator& alloc = allocator_for(Device::cuda(0));
  for (int64_t B : o.batches) {
    for (int64_t S : o.seqs) {
      AttentionShape s;
      s.B = B;
      s.S = S;
      s.H = 8;
      s.Dh = 64;
      s.scale = 0.125f;
      const int64_t D = s.H * s.Dh;
      Tensor qkv = filled({B, S, 3 * D}, 0.01f), dout = filled({B, S, D}, 0.02f);
      Tensor out = filled({B, S, D}, 0.0f), lse = filled({B, s.H, S}, 0.0f),
             dqkv = filled({B, S, 3 * D}, 0.0f);
      // Useful work: QK^T and PV forward, four products backward.
      const double fwd_flops = 4.0 * B * s.H * S * S * s.Dh,
                   bwd_flops = 8.0 * B * s.H * S * S * s.Dh;
      cuda::synchronize();
      alloc.reset_peak();
      const int64_t base = alloc.stats().allocated.current;
      const double ffwd = time_ms(o, [&] {
        cuda::attention_forward(qkv.data<float>(), nullptr, out.data<float>(), lse.data<float>(),
                                s);
      });
      const double fbwd = time_ms(o, [&] {
        cuda::attention_backward(dout.data<float>(), qkv.data<float>(), out.data<float>(),
                                 lse.data<float>(), nullptr, dqkv.data<float>(), s);
      });
      const int64_t fused_peak = alloc.stats().allocated.peak - base;
      double ufwd = NAN, ubwd = NAN;
      int64_t unfused_peak = 0;
      try {
        alloc.reset_peak();
        Unfused u(s);
        ufwd = time_ms(o, [&] { u.forward(qkv, out); });
        ubwd = time_ms(o, [&] { u.backward(dout, dqkv); });
        unfused_peak = alloc.stats().allocated.peak - base;
      } catch (const OutOfMemory&) {
        std::printf("  (unfused path out of memory at batch %lld seq %lld)\n",
                    static_cast<long long>(B), static_cast<long long>(S));
      }
      std::printf("%5lld %5lld %9.3fms %9.3fms %9.2f %11.3fms %11.3fms %8.2f %10.1fMiB %10.1fMiB\n",
                  static_cast<long long>(B), static_cast<long long>(S), ffwd, fbwd,
                  tflops(fwd_flops + bwd_flops, ffwd + fbwd), ufwd, ubwd,
                  (ufwd + ubwd) / (ffwd + fbwd), fused_peak / 1048576.0, unfused_peak / 1048576.0);
    }
  }
  std::printf(
      "(peak: allocator bytes above the inputs and outputs while the path ran: workspace, and for "
      "the "
      "unfused path its S x S matrices)\n");
}

// ---- LayerNorm and other memory-bound kernels
// -------------------------------------------------------

void bench_layernorm(const Options& o) {
  std::printf("\n== layernorm: achieved bandwidth vs HBM (%.2f TB/s, H100 SXM) ==\n",
              kHbmBytesPerSecond / 1e12);
  std::printf("%8s %5s %10s %9s %8s %10s %9s %8s\n", "rows", "N", "fwd ms", "GB/s", "of HBM",
              "bwd ms", "GB/s", "of HBM");
  for (int64_t N : {int64_t{512}, int64_t{768}}) {
    for (int64_t B : o.batches) {
      for (int64_t S : o.seqs) {
        const int64_t M = B * S;
        Tensor x = filled({M, N}, 0.5f), y = filled({M, N}, 0.0f), dy = filled({M, N}, 0.1f),
               dx = filled({M, N}, 0.0f);
        Tensor g = filled({N}, 1.0f), b = filled({N}, 0.0f), dg = filled({N}, 0.0f),
               db = filled({N}, 0.0f);
        Tensor mean = filled({M}, 0.0f), rstd = filled({M}, 0.0f);
        const double fwd = time_ms(o, [&] {
          cuda::layernorm_forward(x.data<float>(), g.data<float>(), b.data<float>(),
                                  y.data<float>(), mean.data<float>(), rstd.data<float>(), M, N,
                                  1e-5);
        });
        const double bwd = time_ms(o, [&] {
          cuda::layernorm_backward(dy.data<float>(), x.data<float>(), g.data<float>(),
                                   mean.data<float>(), rstd.data<float>(), dx.data<float>(),
                                   dg.data<float>(), db.data<float>(), M, N);
        });
        // Compulsory traffic: forward reads x, writes y; backward reads dy and x, writes dx.
        const double fwd_bytes = 2.0 * M * N * 4, bwd_bytes = 3.0 * M * N * 4;
        std::printf("%8lld %5lld %10.4f %9.1f %7.0f%% %10.4f %9.1f %7.0f%%\n",
                    static_cast<long long>(M), static_cast<long long>(N), fwd, gbps(fwd_bytes, fwd),
                    100.0 * fwd_bytes / (fwd * 1e-3) / kHbmBytesPerSecond, bwd,
                    gbps(bwd_bytes, bwd), 100.0 * bwd_bytes / (bwd * 1e-3) / kHbmBytesPerSecond);
      }
    }
  }
}

void bench_misc(const Options& o) {
  std::printf(
      "\n== other kernels (memory-bound: GB/s and share of HBM; reductions: GB/s of input read) "
      "==\n");
  std::printf("%-44s %10s %9s %8s\n", "kernel", "ms", "GB/s", "of HBM");
  auto row = [&](const std::string& name, double ms, double bytes) {
    std::printf("%-44s %10.4f %9.1f %7.0f%%\n", name.c_str(), ms, gbps(bytes, ms),
                100.0 * bytes / (ms * 1e-3) / kHbmBytesPerSecond);
  };
  const int64_t B = o.batches.back();
  {
    const int64_t n = B * 256 * 56 * 56;  // a ResNet layer1 activation
    Tensor x = filled({n}, 0.5f), y = filled({n}, 0.0f);
    // Every op of the unary list (kernels/unary_ops.h), forward and backward: a new op adds its
    // rows here without an edit.
    Tensor dy = filled({n}, 0.1f), dx = filled({n}, 0.0f);
    for (const cuda::UnaryLaunchers* u = cuda::unary_launchers(); u->name != nullptr; ++u) {
      row(std::string(u->name) + "_forward " + std::to_string(n),
          time_ms(o, [&] { u->forward(x.data<float>(), y.data<float>(), n); }), 2.0 * n * 4);
      row(std::string(u->name) + "_backward " + std::to_string(n),
          time_ms(o, [&] { u->backward(dy.data<float>(), x.data<float>(), dx.data<float>(), n); }),
          3.0 * n * 4);
    }
    row("dropout_forward p=0.1 " + std::to_string(n),
        time_ms(o, [&] { cuda::dropout_forward(x.data<float>(), y.data<float>(), n, 0.1f, 1, 2); }),
        2.0 * n * 4);
    row("sum_all " + std::to_string(n),
        time_ms(o, [&] { cuda::sum_all(x.data<float>(), y.data<float>(), n); }), 1.0 * n * 4);
    const int64_t C = 256, HW = 56 * 56;
    Tensor g = filled({C}, 1.0f), bt = filled({C}, 0.0f), m = filled({C}, 0.0f),
           is = filled({C}, 0.0f), dg = filled({C}, 0.0f), db = filled({C}, 0.0f);
    row("batchnorm_forward_train " + std::to_string(B) + "x256x56x56",
        time_ms(o,
                [&] {
                  cuda::batchnorm_forward_train(x.data<float>(), g.data<float>(), bt.data<float>(),
                                                y.data<float>(), m.data<float>(), is.data<float>(),
                                                nullptr, nullptr, B, C, HW, 0.1, 1e-5);
                }),
        3.0 * n * 4);
    row("batchnorm_backward " + std::to_string(B) + "x256x56x56",
        time_ms(o,
                [&] {
                  cuda::batchnorm_backward(y.data<float>(), x.data<float>(), g.data<float>(),
                                           m.data<float>(), is.data<float>(), dx.data<float>(),
                                           dg.data<float>(), db.data<float>(), B, C, HW);
                }),
        5.0 * n * 4);
  }
  {
    const PoolShape ps = make_pool_shape(B, 64, 112, 112, 3, 3, 2, 2, 1, 1);
    Tensor x = filled({B, 64, 112, 112}, 0.5f), y = filled({B, 64, 56, 56}, 0.0f),
           dx = filled({B, 64, 112, 112}, 0.0f);
    Tensor arg = empty({B, 64, 56, 56}, DType::i32, Device::cuda(0));
    const double in = 4.0 * x.numel(), out = 4.0 * y.numel();
    row("maxpool2d_forward 3x3/2 stem",
        time_ms(o,
                [&] {
                  cuda::maxpool2d_forward(x.data<float>(), y.data<float>(), arg.data<int32_t>(),
                                          ps);
                }),
        in + 2 * out);
    row("maxpool2d_backward 3x3/2 stem",
        time_ms(o,
                [&] {
                  cuda::maxpool2d_backward(y.data<float>(), arg.data<int32_t>(), dx.data<float>(),
                                           ps);
                }),
        in + 2 * out);
  }
  {
    const int64_t M = B * 128, V = 30000, D = 512;
    Tensor logits = filled({M, V}, 0.1f), lse = filled({M}, 0.0f), loss = filled({1}, 0.0f),
           dl = filled({M, V}, 0.0f);
    Tensor dloss = filled({1}, 1.0f);
    Tensor targets = zeros({M}, DType::i64, Device::cuda(0));
    row("cross_entropy_forward " + std::to_string(M) + "x30000",
        time_ms(o,
                [&] {
                  cuda::cross_entropy_forward(logits.data<float>(), targets.data<int64_t>(),
                                              loss.data<float>(), lse.data<float>(), M, V, -100);
                }),
        4.0 * M * V);
    row("cross_entropy_backward " + std::to_string(M) + "x30000",
        time_ms(o,
                [&] {
                  cuda::cross_entropy_backward(dloss.data<float>(), logits.data<float>(),
                                               targets.data<int64_t>(), lse.data<float>(),
                                               dl.data<float>(), M, V, -100);
                }),
        8.0 * M * V);
    row("softmax_forward " + std::to_string(M) + "x30000",
        time_ms(o, [&] { cuda::softmax_forward(logits.data<float>(), dl.data<float>(), M, V); }),
        8.0 * M * V);
    Tensor w = filled({V, D}, 0.1f), e = filled({M, D}, 0.0f), dw = filled({V, D}, 0.0f);
    Generator gen(1);
    Tensor ids = randint({M}, V, gen, DType::i64, Device::cuda(0));
    row("embedding_forward " + std::to_string(M) + "x512",
        time_ms(o,
                [&] {
                  cuda::embedding_forward(w.data<float>(), ids.data<int64_t>(), e.data<float>(), M,
                                          V, D);
                }),
        8.0 * M * D);
    row("embedding_backward (dense 30000x512 grad)",
        time_ms(o,
                [&] {
                  cuda::embedding_backward(e.data<float>(), ids.data<int64_t>(), dw.data<float>(),
                                           M, V, D);
                }),
        4.0 * M * D + 4.0 * V * D);
  }
}

void bench_gemm(const Options& o) {
  std::printf("\n== gemm (cuBLAS, math %s): Transformer linear layers, d_model 512, ff 2048 ==\n",
              library_math(o).c_str());
  std::printf("%-34s %10s %9s\n", "M x N x K", "ms", "TFLOP/s");
  for (int64_t B : o.batches) {
    const int64_t M = B * 128;
    for (const auto& d :
         std::vector<std::array<int64_t, 2>>{{512, 2048}, {2048, 512}, {512, 1536}, {512, 30000}}) {
      const int64_t N = d[1], K = d[0];
      Tensor a = filled({M, K}, 0.1f), b = filled({N, K}, 0.1f), c = filled({M, N}, 0.0f);
      const double ms = time_ms(o, [&] {
        cuda::gemm(false, true, M, N, K, 1.0f, a.data<float>(), K, b.data<float>(), K, 0.0f,
                   c.data<float>(), N);
      });
      std::printf(
          "%-34s %10.3f %9.2f\n",
          (std::to_string(M) + " x " + std::to_string(N) + " x " + std::to_string(K)).c_str(), ms,
          tflops(2.0 * M * N * K, ms));
    }
  }
}

void run(Options o) {
  // The flags first: a mistake in them is named before a missing GPU.
  o.math = math_mode(o.math, o.tf32, Device::cuda(0), kBenchMath);
  if (cuda::device_count() == 0) {
    REGEN_FAIL(
        "bench kernels: no CUDA device is visible (this build has CUDA, the machine has no GPU)");
  }
  cuda::set_device(0);
  cudaDeviceProp prop{};
  REGEN_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  int runtime = 0;
  REGEN_CUDA_CHECK(cudaRuntimeGetVersion(&runtime));
  std::printf("regen bench kernels on %s (%d SMs, %.1f GiB), CUDA runtime %d", prop.name,
              prop.multiProcessorCount, prop.totalGlobalMem / 1073741824.0, runtime);
#ifdef REGEN_WITH_CUDNN
  std::printf(", cuDNN %zu", cudnnGetVersion());
#endif
  std::printf(
      "\nmedian of %d runs after %d warm-up runs; times in ms (CUDA events); math %s for "
      "cuBLAS and cuDNN (regen's convolution and attention kernels: fp32)\n",
      o.repeats, o.warmup, library_math(o).c_str());
  std::printf(
      "HBM reference: %.2f TB/s (H100 SXM5); ratios above 1 in the last column mean the "
      "fused/native "
      "kernel is faster\n",
      kHbmBytesPerSecond / 1e12);
  cuda::set_tf32(o.math == "tf32");
  {
    // Create the cuBLAS handle and its persistent workspace now, so no measurement includes them.
    Tensor a = filled({8, 8}, 1.0f), c = filled({8, 8}, 0.0f);
    cuda::gemm(false, false, 8, 8, 8, 1.0f, a.data<float>(), 8, a.data<float>(), 8, 0.0f,
               c.data<float>(), 8);
    cuda::synchronize();
  }
  if (wanted(o, "gemm")) bench_gemm(o);
  if (wanted(o, "conv")) bench_conv(o);
  if (wanted(o, "attention")) bench_attention(o);
  if (wanted(o, "layernorm")) bench_layernorm(o);
  if (wanted(o, "misc")) bench_misc(o);
  cuda::set_tf32(false);
}

void setup(CLI::App& app) {
  auto o = std::make_shared<Options>();
  // Each item read in decimal and bounded, as every count (CLI11 alone would read "0x10").
  app.add_option("--batch", o->batches, "batch sizes (ResNet-152 and Transformer)")
      ->check(positive_integer(SessionOptions::kMaxBatch))
      ->capture_default_str();
  app.add_option("--seq", o->seqs, "Transformer sequence lengths")
      ->check(positive_integer(1 << 20))
      ->capture_default_str();
  app.add_option("--repeats", o->repeats, "timed runs per measurement (the median is reported)")
      ->capture_default_str()
      ->check(positive_integer(kIntMax));
  app.add_option("--warmup", o->warmup, "untimed runs first")
      ->capture_default_str()
      ->check(non_negative_integer(kIntMax));
  app.add_option("--only", o->only,
                 "sections to run: gemm conv attention layernorm misc (default: all)")
      ->check(CLI::IsMember({"gemm", "conv", "attention", "layernorm", "misc"}));
  add_math_flags(app, o->math, o->tf32, "tf32");
  app.callback([o] { run(*o); });
}

REGEN_COMMAND("bench kernels",
              "time the CUDA kernels on ResNet-152 and Transformer shapes (needs a GPU)", setup);

}  // namespace
#endif
