// The dry run on cuda:0 (core/allocator.h DryRunScope, kernels/kernels.h cuda::kDryRunLaunchers):
//   - every listed CUDA launcher, called through REGEN_LAUNCH in a dry run, requests the workspace
//     blocks a real call requests, of the same sizes, in the same order and nesting, and touches no
//     device byte (the Null arena's addresses are not memory); every listed launcher is checked,
//     each takes scratch in at least one case, and an unlisted one is skipped. The convolutions
//     with the native kernels and, in a build with cuDNN, with cuDNN in FP32 and in TF32;
//   - every row of the op table, forward and backward, run dry requests what its real run requests
//     (no launcher an op reaches takes scratch without a dry path);
//   - the dry run of a training step (models/train.h dry_run_step, as make_session runs it) has
//     the real first step's peaks, allocated and requested, overall and per category, cuBLAS's
//     workspace and every kernel's scratch included, for a small ResNet and transformer-tiny.
// The launcher and op-table checks also run in the host emulation (scripts/cuda-emu/run.sh dryrun;
// no cuDNN there, and CUB's sizes are the stand-ins'). Skipped (exit 77) without a GPU.
#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <optional>
#include <set>
#include <string>

#include "regen/kernels/lowp_launchers.h"
#include "regen/kernels/unary_ops.h"
#include "regen/models/train.h"
#include "regen/session/session.h"
#include "tests/dry_paths.h"
#include "tests/op_table.h"

using namespace regen;
using namespace regen::testing;

namespace {

const Device kGpu = Device::cuda(0);

Tensor f32(const Shape& shape) {
  return zeros(shape, DType::f32, kGpu);
}
Tensor bf16(const Shape& shape) {
  return zeros(shape, DType::bf16, kGpu);
}

std::string conv_text(const ConvShape& s) {
  return " N" + std::to_string(s.N) + " C" + std::to_string(s.C) + " " + std::to_string(s.H) + "x" +
         std::to_string(s.W) + " K" + std::to_string(s.K) + " " + std::to_string(s.R) + "x" +
         std::to_string(s.S) + "/" + std::to_string(s.stride_h) + "x" + std::to_string(s.stride_w) +
         " pad " + std::to_string(s.pad_h) + "x" + std::to_string(s.pad_w);
}

// The launchers checked, and those seen taking scratch in at least one case.
struct Coverage {
  std::set<std::string> checked, with_scratch;
  template <class Body>
  void check(const std::string& launcher, const std::string& what, std::optional<bool> scratch,
             const Body& body) {
    const ScratchEvents real = check_dry_path(kGpu, launcher + what, scratch, body);
    checked.insert(launcher);
    if (!real.empty()) with_scratch.insert(launcher);
  }
};

// conv2d's and conv_transpose2d's passes with the algorithm set now (set_conv_algo, set_tf32), on
// tensors of T (float, or bfloat16 for the 16-bit passes).
// `native`: the native kernels, whose scratch this knows (forward: the index table always;
// backward-data: tables and sub-filters always; backward-filter: only split partials); cuDNN's
// workspace is its algorithm's, 0 or not.
template <class T>
void conv_cases(Coverage& cov, bool native, const std::string& algo) {
  auto make = [](const Shape& shape) { return zeros(shape, dtype_of<T>::value, kGpu); };
  const std::optional<bool> some = native ? std::optional<bool>(true) : std::nullopt;
  const ConvShape convs[] = {
      make_conv_shape(2, 8, 8, 8, 16, 3, 3, 1, 1, 1, 1),   // one phase, no split
      make_conv_shape(1, 8, 9, 9, 8, 3, 3, 2, 2, 1, 1),    // four phases
      make_conv_shape(2, 8, 9, 9, 16, 1, 1, 2, 2, 0, 0),   // phases no tap reaches
      make_conv_shape(1, 3, 20, 20, 8, 7, 7, 2, 2, 3, 3),  // a stem
      make_conv_shape(1, 64, 4, 4, 16, 3, 3, 1, 1, 1, 1),  // split-K forward and backward-data
      make_conv_shape(2, 4, 16, 16, 8, 3, 3, 1, 1, 1, 1),  // split-K backward-filter
      make_conv_shape(1, 16, 7, 5, 8, 3, 2, 3, 2, 1, 0)};  // odd sizes, stride 3x2
  for (const ConvShape& s : convs) {
    const std::string what = " " + algo + conv_text(s);
    const Shape xs{s.N, s.C, s.H, s.W}, ws{s.K, s.C, s.R, s.S}, ys{s.N, s.K, s.P, s.Q};
    cov.check("conv2d_forward", what, some, [&](const auto& begin) {
      Tensor x = make(xs), w = make(ws), b = make({s.K}), y = make(ys);
      begin();
      REGEN_LAUNCH(kGpu, T, conv2d_forward, x.data<T>(), w.data<T>(), b.data<T>(), y.data<T>(), s);
    });
    cov.check("conv2d_backward_data", what, some, [&](const auto& begin) {
      Tensor dy = make(ys), w = make(ws), dx = make(xs);
      begin();
      REGEN_LAUNCH(kGpu, T, conv2d_backward_data, dy.data<T>(), w.data<T>(), dx.data<T>(), s);
    });
    cov.check("conv2d_backward_filter", what, std::nullopt, [&](const auto& begin) {
      Tensor x = make(xs), dy = make(ys), dw = make(ws), db = make({s.K});
      begin();
      REGEN_LAUNCH(kGpu, T, conv2d_backward_filter, x.data<T>(), dy.data<T>(), dw.data<T>(),
                   db.data<T>(), s);
    });
  }
  const ConvShape transposed[] = {
      make_conv_transpose_shape(2, 8, 4, 4, 4, 2, 2, 2, 2, 0, 0, 0, 0),
      make_conv_transpose_shape(1, 8, 5, 5, 4, 3, 3, 2, 2, 1, 1, 1, 1),
      make_conv_transpose_shape(2, 5, 4, 6, 7, 3, 2, 3, 2, 1, 0, 2, 1),
      make_conv_transpose_shape(2, 4, 16, 16, 4, 2, 2, 2, 2, 0, 0, 0, 0)};  // split-K filter
  for (const ConvShape& s : transposed) {
    const std::string what = " " + algo + conv_text(s);
    const Shape xs{s.N, s.K, s.P, s.Q}, ws{s.K, s.C, s.R, s.S}, ys{s.N, s.C, s.H, s.W};
    cov.check("conv_transpose2d_forward", what, some, [&](const auto& begin) {
      Tensor x = make(xs), w = make(ws), b = make({s.C}), y = make(ys);
      begin();
      REGEN_LAUNCH(kGpu, T, conv_transpose2d_forward, x.data<T>(), w.data<T>(), b.data<T>(),
                   y.data<T>(), s);
    });
    cov.check("conv_transpose2d_backward_data", what, some, [&](const auto& begin) {
      Tensor dy = make(ys), w = make(ws), dx = make(xs);
      begin();
      REGEN_LAUNCH(kGpu, T, conv_transpose2d_backward_data, dy.data<T>(), w.data<T>(), dx.data<T>(),
                   s);
    });
    for (bool with_dw : {true, false}) {
      cov.check("conv_transpose2d_backward_filter", what + (with_dw ? "" : " (dbias only)"),
                with_dw ? std::nullopt : std::optional<bool>(false), [&](const auto& begin) {
                  Tensor x = make(xs), dy = make(ys), dw = make(ws), db = make({s.C});
                  begin();
                  REGEN_LAUNCH(kGpu, T, conv_transpose2d_backward_filter, x.data<T>(), dy.data<T>(),
                               with_dw ? dw.data<T>() : static_cast<T*>(nullptr), db.data<T>(), s);
                });
    }
  }
}

// Restores the convolution algorithm and the math mode at the end of a scope.
struct CudaSettingsGuard {
  cuda::ConvAlgo algo = cuda::conv_algo();
  bool tf32 = cuda::tf32_enabled();
  ~CudaSettingsGuard() {
    cuda::set_conv_algo(algo);
    cuda::set_tf32(tf32);
  }
};

}  // namespace

TEST_CASE(
    "cuda dry paths: the listed launchers request a real call's scratch in order, and only they "
    "run") {
  static_assert(cuda::has_dry_run_path("conv2d_forward") && cuda::has_dry_run_path("sum_rows"));
  static_assert(!cuda::has_dry_run_path("gemm") && !cuda::has_dry_run_path("sum_rowsx"));
  static_assert(!cuda::has_dry_run_path("unary_forward") && !cuda::has_dry_run_path(""));
  kernels::prepare_device(kGpu);  // cuBLAS's workspace: the dry runs below keep it too
  CudaSettingsGuard settings;
  Coverage cov;

  // Reductions: sum_rows' partials (more than one chunk of 512 rows), sum_all's CUB scratch.
  for (const auto& rc : {std::pair<int64_t, int64_t>{1100, 40}, {3, 700}, {0, 5}, {2000, 3}}) {
    const int64_t rows = rc.first, cols = rc.second;
    cov.check("sum_rows", " " + std::to_string(rows) + "x" + std::to_string(cols), rows > 512,
              [&](const auto& begin) {
                Tensor x = f32({rows, cols}), y = f32({cols});
                begin();
                REGEN_LAUNCH(kGpu, float, sum_rows, x.data<float>(), y.data<float>(), rows, cols);
              });
  }
  for (int64_t n : {int64_t{0}, int64_t{100}, int64_t{100003}}) {
    cov.check("sum_all", " " + std::to_string(n), n > 0, [&](const auto& begin) {
      Tensor x = f32({n}), y = f32({1});
      begin();
      REGEN_LAUNCH(kGpu, float, sum_all, x.data<float>(), y.data<float>(), n);
    });
  }

  cuda::set_conv_algo(cuda::ConvAlgo::native);
  conv_cases<float>(cov, true, "native");
  conv_cases<bfloat16>(cov, true, "native bf16");  // the same scratch, f32 partials
#ifdef REGEN_WITH_CUDNN
  {
    // cuDNN's plan (algorithm and workspace size) per shape and math mode, as the real call makes
    // it; whether a pass needs a workspace is cuDNN's choice.
    Coverage cudnn;
    cuda::set_conv_algo(cuda::ConvAlgo::cudnn);
    for (bool tf32 : {false, true}) {
      cuda::set_tf32(tf32);
      conv_cases<float>(cudnn, false, tf32 ? "cudnn tf32" : "cudnn fp32");
    }
    cuda::set_tf32(settings.tf32);
    conv_cases<bfloat16>(cudnn, false, "cudnn bf16");
    cuda::set_conv_algo(cuda::ConvAlgo::native);
    MESSAGE("cuDNN passes with a workspace: ", cudnn.with_scratch.size(), " of ",
            cudnn.checked.size());
  }
#endif

  // Batch normalization: one chunk and several (N*HW above 4096), each pass's optional outputs.
  for (const auto& shape : {std::array<int64_t, 3>{2, 3, 5}, {2, 4, 4100}}) {
    const int64_t N = shape[0], C = shape[1], HW = shape[2];
    const std::string what =
        " " + std::to_string(N) + "x" + std::to_string(C) + "x" + std::to_string(HW);
    cov.check("batchnorm_forward_train", what, true, [&](const auto& begin) {
      Tensor x = f32({N, C, HW}), g = f32({C}), b = f32({C}), y = f32({N, C, HW});
      Tensor mean = f32({C}), invstd = f32({C}), rm = f32({C}), rv = f32({C});
      begin();
      REGEN_LAUNCH(kGpu, float, batchnorm_forward_train, x.data<float>(), g.data<float>(),
                   b.data<float>(), y.data<float>(), mean.data<float>(), invstd.data<float>(),
                   rm.data<float>(), rv.data<float>(), N, C, HW, 0.1, 1e-5);
    });
    cov.check("batchnorm_forward_eval", what, true, [&](const auto& begin) {
      Tensor x = f32({N, C, HW}), g = f32({C}), b = f32({C}), y = f32({N, C, HW});
      Tensor rm = f32({C}), rv = ones({C}, DType::f32, kGpu);
      begin();
      REGEN_LAUNCH(kGpu, float, batchnorm_forward_eval, x.data<float>(), g.data<float>(),
                   b.data<float>(), rm.data<float>(), rv.data<float>(), y.data<float>(), N, C, HW,
                   1e-5);
    });
    for (bool params : {true, false}) {
      const std::string w = what + (params ? "" : " (dx only)");
      cov.check("batchnorm_backward", w, true, [&](const auto& begin) {
        Tensor dy = f32({N, C, HW}), x = f32({N, C, HW}), g = f32({C}), mean = f32({C});
        Tensor invstd = ones({C}, DType::f32, kGpu), dx = f32({N, C, HW}), dg = f32({C}),
               db = f32({C});
        begin();
        REGEN_LAUNCH(kGpu, float, batchnorm_backward, dy.data<float>(), x.data<float>(),
                     g.data<float>(), mean.data<float>(), invstd.data<float>(), dx.data<float>(),
                     params ? dg.data<float>() : nullptr, params ? db.data<float>() : nullptr, N, C,
                     HW);
      });
      cov.check("batchnorm_backward_eval", w, true, [&](const auto& begin) {
        Tensor dy = f32({N, C, HW}), x = f32({N, C, HW}), g = f32({C}), rm = f32({C});
        Tensor rv = ones({C}, DType::f32, kGpu), dx = f32({N, C, HW}), dg = f32({C}), db = f32({C});
        begin();
        REGEN_LAUNCH(kGpu, float, batchnorm_backward_eval, dy.data<float>(), x.data<float>(),
                     g.data<float>(), rm.data<float>(), rv.data<float>(), dx.data<float>(),
                     params ? dg.data<float>() : nullptr, params ? db.data<float>() : nullptr, N, C,
                     HW, 1e-5);
      });
    }
  }

  // The 16-bit batch norms (bf16 x, y, dy, dx; f32 statistics): the float launchers' workspace.
  for (const auto& shape : {std::array<int64_t, 3>{2, 3, 5}, {2, 4, 4100}}) {
    const int64_t N = shape[0], C = shape[1], HW = shape[2];
    const std::string what =
        " bf16 " + std::to_string(N) + "x" + std::to_string(C) + "x" + std::to_string(HW);
    cov.check("batchnorm_forward_train_lowp", what, true, [&](const auto& begin) {
      Tensor x = bf16({N, C, HW}), g = f32({C}), b = f32({C}), y = bf16({N, C, HW});
      Tensor mean = f32({C}), invstd = f32({C}), rm = f32({C}), rv = f32({C});
      begin();
      REGEN_LAUNCH(kGpu, bfloat16, batchnorm_forward_train_lowp, x.data<bfloat16>(),
                   g.data<float>(), b.data<float>(), y.data<bfloat16>(), mean.data<float>(),
                   invstd.data<float>(), rm.data<float>(), rv.data<float>(), N, C, HW, 0.1, 1e-5);
    });
    cov.check("batchnorm_forward_eval_lowp", what, true, [&](const auto& begin) {
      Tensor x = bf16({N, C, HW}), g = f32({C}), b = f32({C}), y = bf16({N, C, HW});
      Tensor rm = f32({C}), rv = ones({C}, DType::f32, kGpu);
      begin();
      REGEN_LAUNCH(kGpu, bfloat16, batchnorm_forward_eval_lowp, x.data<bfloat16>(), g.data<float>(),
                   b.data<float>(), rm.data<float>(), rv.data<float>(), y.data<bfloat16>(), N, C,
                   HW, 1e-5);
    });
    cov.check("batchnorm_backward_lowp", what, true, [&](const auto& begin) {
      Tensor dy = bf16({N, C, HW}), x = bf16({N, C, HW}), g = f32({C}), mean = f32({C});
      Tensor invstd = ones({C}, DType::f32, kGpu), dx = bf16({N, C, HW}), dg = f32({C}),
             db = f32({C});
      begin();
      REGEN_LAUNCH(kGpu, bfloat16, batchnorm_backward_lowp, dy.data<bfloat16>(), x.data<bfloat16>(),
                   g.data<float>(), mean.data<float>(), invstd.data<float>(), dx.data<bfloat16>(),
                   dg.data<float>(), db.data<float>(), N, C, HW);
    });
    cov.check("batchnorm_backward_eval_lowp", what, true, [&](const auto& begin) {
      Tensor dy = bf16({N, C, HW}), x = bf16({N, C, HW}), g = f32({C}), rm = f32({C});
      Tensor rv = ones({C}, DType::f32, kGpu), dx = bf16({N, C, HW}), dg = f32({C}), db = f32({C});
      begin();
      REGEN_LAUNCH(kGpu, bfloat16, batchnorm_backward_eval_lowp, dy.data<bfloat16>(),
                   x.data<bfloat16>(), g.data<float>(), rm.data<float>(), rv.data<float>(),
                   dx.data<bfloat16>(), dg.data<float>(), db.data<float>(), N, C, HW, 1e-5);
    });
  }

  // The 16-bit layer norm backward: the warp path (N a multiple of 8 up to 1024, aligned) always
  // takes its per-block partials; the block path (any other N) takes partials from more than 256
  // rows only.
  for (const auto& mn : {std::pair<int64_t, int64_t>{300, 64}, {9, 768}, {300, 1030}, {9, 1030}}) {
    const int64_t M = mn.first, N = mn.second;
    const bool warp = N % 8 == 0 && N <= 1024;
    cov.check("layernorm_backward_lowp", " bf16 " + std::to_string(M) + "x" + std::to_string(N),
              warp || M > 256, [&](const auto& begin) {
                Tensor dy = bf16({M, N}), x = bf16({M, N}), g = f32({N}), mean = f32({M});
                Tensor rstd = ones({M}, DType::f32, kGpu), dx = bf16({M, N}), dg = f32({N}),
                       db = f32({N});
                begin();
                REGEN_LAUNCH(kGpu, bfloat16, layernorm_backward_lowp, dy.data<bfloat16>(),
                             x.data<bfloat16>(), g.data<float>(), mean.data<float>(),
                             rstd.data<float>(), dx.data<bfloat16>(), dg.data<float>(),
                             db.data<float>(), M, N);
              });
  }

  // The layer norm of an f32 x under autocast, backward from its bf16 xhat: f32 rows in packs of 4
  // on the warp path (N a multiple of 4 up to 1024, aligned), partials as layernorm_backward's.
  for (const auto& mn : {std::pair<int64_t, int64_t>{300, 64}, {9, 512}, {300, 1030}, {9, 1030}}) {
    const int64_t M = mn.first, N = mn.second;
    const bool warp = N % 4 == 0 && N <= 1024;
    cov.check(
        "layernorm_backward_xhat", " bf16 " + std::to_string(M) + "x" + std::to_string(N),
        warp || M > 256, [&](const auto& begin) {
          Tensor dy = f32({M, N}), xhat = bf16({M, N}), g = f32({N});
          Tensor rstd = ones({M}, DType::f32, kGpu), dx = f32({M, N}), dg = f32({N}), db = f32({N});
          begin();
          REGEN_LAUNCH(kGpu, bfloat16, layernorm_backward_xhat, dy.data<float>(),
                       xhat.data<bfloat16>(), g.data<float>(), rstd.data<float>(), dx.data<float>(),
                       dg.data<float>(), db.data<float>(), M, N);
        });
  }

  // Embedding: the bad-id flag; backward's keys, sort (CUB's scratch), marks and partial rows.
  for (const auto& shape : {std::array<int64_t, 3>{300, 50, 70}, {7, 5, 3}, {0, 5, 4}}) {
    const int64_t n = shape[0], V = shape[1], D = shape[2];
    const std::string what =
        " n" + std::to_string(n) + " V" + std::to_string(V) + " D" + std::to_string(D);
    cov.check("embedding_forward", what, n > 0, [&](const auto& begin) {
      Tensor w = f32({V, D}), ids = zeros({n}, DType::i64, kGpu), y = f32({n, D});
      begin();
      REGEN_LAUNCH(kGpu, float, embedding_forward, w.data<float>(), ids.data<int64_t>(),
                   y.data<float>(), n, V, D);
    });
    cov.check("embedding_backward", what, n > 0, [&](const auto& begin) {
      Tensor dy = f32({n, D}), ids = zeros({n}, DType::i64, kGpu), dw = f32({V, D});
      begin();
      REGEN_LAUNCH(kGpu, float, embedding_backward, dy.data<float>(), ids.data<int64_t>(),
                   dw.data<float>(), n, V, D);
    });
  }

  // Layer norm backward: the vectorized path (N a multiple of 4 up to 1024, aligned) and the
  // block path (one chunk of rows, or several: partials), with and without dgamma and dbeta.
  for (const auto& mn : {std::pair<int64_t, int64_t>{33, 512}, {9, 768}, {300, 7}, {5, 2048}}) {
    const int64_t M = mn.first, N = mn.second;
    for (bool params : {true, false}) {
      const bool vectorized = N % 4 == 0 && N <= 1024;
      cov.check("layernorm_backward",
                " " + std::to_string(M) + "x" + std::to_string(N) + (params ? "" : " (dx only)"),
                params && (vectorized || M > 256), [&](const auto& begin) {
                  Tensor dy = f32({M, N}), x = f32({M, N}), g = f32({N}), mean = f32({M});
                  Tensor rstd = ones({M}, DType::f32, kGpu), dx = f32({M, N}), dg = f32({N}),
                         db = f32({N});
                  begin();
                  REGEN_LAUNCH(kGpu, float, layernorm_backward, dy.data<float>(), x.data<float>(),
                               g.data<float>(), mean.data<float>(), rstd.data<float>(),
                               dx.data<float>(), params ? dg.data<float>() : nullptr,
                               params ? db.data<float>() : nullptr, M, N);
                });
    }
  }

  // Attention backward: the row terms (head dims on both kernel sizes).
  for (const auto& sd : {std::pair<int64_t, int64_t>{40, 16}, {70, 96}}) {
    AttentionShape s;
    s.B = 2;
    s.S = sd.first;
    s.H = 2;
    s.Dh = sd.second;
    s.scale = 0.25f;
    s.causal = true;
    s.dropout_p = 0.1f;
    const Shape qkv_shape{s.B, s.S, 3 * s.H * s.Dh}, out_shape{s.B, s.S, s.H * s.Dh};
    cov.check("attention_backward", " S=" + std::to_string(s.S) + " Dh=" + std::to_string(s.Dh),
              true, [&](const auto& begin) {
                Tensor dout = f32(out_shape), qkv = f32(qkv_shape), out = f32(out_shape);
                Tensor lse = f32({s.B, s.H, s.S}), dqkv = f32(qkv_shape);
                Tensor pad = zeros({s.B, s.S}, DType::i32, kGpu);
                begin();
                REGEN_LAUNCH(kGpu, float, attention_backward, dout.data<float>(), qkv.data<float>(),
                             out.data<float>(), lse.data<float>(), pad.data<int32_t>(),
                             dqkv.data<float>(), s);
              });
  }

  // Cross-entropy: the bad-target flag and the per-row losses; M = 0 writes a zero loss with no
  // scratch (and, dry, nothing).
  for (const auto& mv : {std::pair<int64_t, int64_t>{33, 100}, {0, 7}}) {
    const int64_t M = mv.first, V = mv.second;
    const std::string what = " " + std::to_string(M) + "x" + std::to_string(V);
    cov.check("cross_entropy_forward", what, M > 0, [&](const auto& begin) {
      Tensor logits = f32({M, V}), targets = zeros({M}, DType::i64, kGpu), loss = f32({1}),
             lse = f32({M});
      begin();
      REGEN_LAUNCH(kGpu, float, cross_entropy_forward, logits.data<float>(),
                   targets.data<int64_t>(), loss.data<float>(), lse.data<float>(), M, V,
                   int64_t{-100});
    });
    cov.check("cross_entropy_backward", what, M > 0, [&](const auto& begin) {
      Tensor dloss = ones({1}, DType::f32, kGpu), logits = f32({M, V}),
             targets = zeros({M}, DType::i64, kGpu), lse = f32({M}), dlogits = f32({M, V});
      begin();
      REGEN_LAUNCH(kGpu, float, cross_entropy_backward, dloss.data<float>(), logits.data<float>(),
                   targets.data<int64_t>(), lse.data<float>(), dlogits.data<float>(), M, V,
                   int64_t{-100});
    });
    for (bool validate_only : {false, true}) {
      cov.check("linear_cross_entropy_scale", what + (validate_only ? " (validation)" : ""), true,
                [&](const auto& begin) {
                  Tensor dloss = ones({1}, DType::f32, kGpu),
                         targets = zeros({M}, DType::i64, kGpu), scale = f32({1});
                  begin();
                  REGEN_LAUNCH(kGpu, float, linear_cross_entropy_scale,
                               validate_only ? nullptr : dloss.data<float>(),
                               targets.data<int64_t>(),
                               validate_only ? nullptr : scale.data<float>(), M, V, int64_t{-100});
                });
    }
  }

  // Every listed launcher is checked here, takes scratch in some case, and nothing else is listed.
  const std::set<std::string> listed(std::begin(cuda::kDryRunLaunchers),
                                     std::end(cuda::kDryRunLaunchers));
  CHECK(cov.checked == listed);
  CHECK(cov.with_scratch == listed);

  // A launcher without a dry path is skipped: on the Null arena's addresses it would fault.
  check_dry_path(kGpu, "unary_forward (no dry path)", false, [&](const auto& begin) {
    Tensor x = f32({1000}), y = f32({1000});
    begin();
    REGEN_LAUNCH(kGpu, float, unary_forward, unary::relu{}, x.data<float>(), y.data<float>(),
                 int64_t{1000});
  });
}

// Each op's forward and backward on cuda:0, run dry, request the workspace blocks its real run
// requests: no CUDA launcher an op reaches takes scratch without a dry path.
TEST_CASE("cuda dry run: every op table row requests the scratch its real run requests") {
  kernels::prepare_device(kGpu);
  const int with_scratch = check_op_table_dry_runs(kGpu);
  MESSAGE(with_scratch, " rows take scratch on cuda:0");
  CHECK(with_scratch > 0);
}

// The first step's dry run (make_session's pre-flight) against the real first step on cuda:0:
// the peak of allocated and of requested bytes, and every category's peak and share at the peak,
// to the byte; cuBLAS's workspace kept through both; the model's state exact.
TEST_CASE("cuda dry run: a training step's dry run has the real step's peaks on cuda:0") {
  struct Case {
    const char* model;
    const char* optimizer;
    int64_t batch;
    int64_t image_size;  // ResNet
    bool fused_head;     // Transformer: the preset's chunked head, or the full logits
    const char* conv;
    bool tf32;
    const char* precision = "";  // --precision, or the math mode's
  };
  std::vector<Case> cases = {{"resnet-tiny", "sgd", 4, 32, true, "native", false},
                             {"resnet-tiny", "adamw", 3, 64, true, "native", true},
                             {"transformer-tiny", "adamw", 4, 0, true, "native", false},
                             {"transformer-tiny", "sgd", 3, 0, false, "native", true},
                             // 16 bits: the layer norms save a 16-bit xhat of the f32 stream.
                             {"transformer-tiny", "sgd", 4, 0, true, "native", false, "bf16"},
                             {"resnet-tiny", "sgd", 2, 32, true, "native", false, "fp16"}};
#ifdef REGEN_WITH_CUDNN
  cases.push_back({"resnet-tiny", "sgd", 4, 32, true, "cudnn", false});
  cases.push_back({"resnet-tiny", "adamw", 2, 64, true, "cudnn", true});
#endif
  CudaSettingsGuard settings;
  for (const Case& c : cases) {
    const std::string what = std::string(c.model) + " " + c.optimizer + " --batch " +
                             std::to_string(c.batch) +
                             (c.image_size ? " --image-size " + std::to_string(c.image_size) : "") +
                             (c.fused_head ? "" : " --lm-head-chunk -1") + " --conv " + c.conv +
                             (c.tf32 ? " --tf32" : "") +
                             (*c.precision ? std::string(" --precision ") + c.precision : "");
    CAPTURE(what);
    SessionOptions m;
    m.model = c.model;
    m.optimizer = c.optimizer;
    m.batch = c.batch;
    m.device = "cuda:0";
    m.conv = c.conv;
    m.tf32 = c.tf32;
    m.precision = c.precision;
    if (c.image_size) m.model_options["image_size"] = static_cast<double>(c.image_size);
    if (!c.fused_head) m.model_options["lm_head_chunk"] = -1.0;
    kernels::prepare_device(kGpu);
    CachingAllocator& a = allocator_for(kGpu);
    a.empty_cache();
    REQUIRE(a.stats().live_blocks == 1);  // cuBLAS's workspace
    const int64_t cublas = a.stats().allocated.current;
    auto s = make_session(m);
    const StepResult r = s->trainer->step();
    CHECK(std::isfinite(r.loss));
    const DryRunResult& pre = s->preflight;
    CHECK(pre.kept == cublas);
    CHECK(a.stats().allocated.current == pre.persistent + pre.kept);
    const MemoryStats& dry = pre.memory;
    const size_t ws = static_cast<size_t>(Category::workspace);
    CHECK(dry.allocated_by[ws].peak > cublas);  // the kernels' scratch on top of cuBLAS's
    CHECK(dry.allocated.peak == r.memory.allocated.peak);
    CHECK(dry.requested.peak == r.memory.requested.peak);
    for (int k = 0; k < kNumCategories; ++k) {
      CAPTURE(std::string(category_name(static_cast<Category>(k))));
      CHECK(dry.allocated_by[static_cast<size_t>(k)].peak ==
            r.memory.allocated_by[static_cast<size_t>(k)].peak);
      CHECK(dry.requested_by[static_cast<size_t>(k)].peak ==
            r.memory.requested_by[static_cast<size_t>(k)].peak);
      CHECK(dry.allocated_by_at_peak[static_cast<size_t>(k)] ==
            r.memory.allocated_by_at_peak[static_cast<size_t>(k)]);
    }
    MESSAGE(what, ": dry / real peak ", dry.allocated.peak, " / ", r.memory.allocated.peak,
            ", workspace ", dry.allocated_by[ws].peak, " / ", r.memory.allocated_by[ws].peak,
            ", persistent ", pre.persistent, ", kept ", pre.kept);
  }
}
