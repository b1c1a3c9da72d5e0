// linear_cross_entropy with bf16 or f16 x, weight and bias (autocast's class low, with an fp32
// output: autograd/precision.cpp): the 16-bit path of the op of autograd/ops_cross_entropy.cpp,
// which hands 16-bit inputs to the two functions here. The chunking is the f32 path's; what
// differs is where f32 is kept:
//   forward   logits_c (rows, V) = x_c W^T by cpu::gemm_lowp (16-bit operands, f32 sums) into an
//             f32 workspace; bias widened to f32 once; lse (M) and the loss are f32 (the row
//             kernels of kernels/cpu/cross_entropy.cpp at T = float).
//   backward  by vocabulary tiles W_t (n rows of W, tile_rows below) and, inside each tile,
//             blocks of rows x_c (backward_block_rows: a (rows, n) block is at most the
//             forward's (chunk, V) buffer): the f32 logits block (rows, n) = x_c W_t^T and, with
//             the saved f32 lse, its gradient dlogits = (softmax - onehot) g, computed alone (each
//             element needs its logit and its row's lse only). For bf16 inputs dlogits are then
//             rounded to bf16 (autocast's bf16 gradient of the logits), so the two products below
//             are bf16 x bf16; f16 keeps them f32. Then dW_t (+)= dlogits^T x_c and db_t (+)= the
//             f32 dlogits' column sums in f32 (n, K) and (n) tiles, rounded once into the 16-bit
//             dw and db when the tile's last block is done, and dx_c (+)= dlogits W_t into an f32
//             (M, K) sum over the tiles, rounded once into the 16-bit dx at the end. No (V, K) f32
//             buffer exists: the working memory is the block (and its bf16 copy), the (n, K) tile
//             and the (M, K) dx sum (seed Transformer: 14.6 + 7.3 + 2 MiB at batch 8, 29.3 + 7.3
//             + 8 MiB at batch 32, against 32 + 58.6 + 0.5 MiB before). Each logit is computed
//             once per tile, as often as before in all (the same products, re-tiled).
// Gradients have the operands' dtype; the loss's gradient is f32. On CUDA the same steps run on the
// device: the 16-bit products through cuda::gemm_lowp (cublasGemmEx, f32 C), f16's products with an
// f32 dlogits block through the f32 GEMM on a widened (f32) copy of the 16-bit operand (the CPU's
// gemm_lowp widens it while packing: the same f32 products), dlogits by
// cuda::linear_cross_entropy_block_dlogits reading the device's scale, and the conversions by
// cuda::cast. Tests: tests/test_amp_gemm_ops.cpp (CPU), tests/cuda/test_cuda_ops.cpp (CUDA
// against the CPU).
#include <algorithm>
#include <cmath>
#include <memory>
#include <type_traits>

#include "regen/autograd/op_util.h"
#include "regen/kernels/cpu/convert.h"
#include "regen/kernels/cpu/gemm_lowp.h"
#include "regen/kernels/unary_ops.h"

namespace regen::detail {

namespace {

struct Dims {
  int64_t M, K, V, chunk;
};
Dims dims(const Tensor& x, const Tensor& w, const LinearCrossEntropyAttrs& a) {
  const int64_t M = x.size(0);
  return {M, x.size(1), w.size(0), std::max<int64_t>(1, std::min(a.chunk_rows, M))};
}

void check_device(const char* what, const Tensor& x) {
#ifdef REGEN_WITH_CUDA
  const bool ok = x.device().is_cpu() || x.device().is_cuda();
#else
  const bool ok = x.device().is_cpu();
#endif
  REGEN_CHECK(ok, what, ": ", dtype_name(x.dtype()), " inputs have no kernel on ", x.device().str(),
              " (input ", x.str(), ")");
}

// y (n) = x (n) converted (f32 <-> 16-bit), on x's device; nothing in a dry run (its tensors are
// not memory).
template <class From, class To>
void convert(Device dev, const From* x, To* y, int64_t n) {
  if (dry_run_active() || n == 0) return;
  if (dev.is_cpu()) {
    if constexpr (std::is_same<From, float>::value) {
      cpu::narrow(x, y, n);
    } else {
      cpu::widen(x, y, n);
    }
    return;
  }
#ifdef REGEN_WITH_CUDA
  kernels::use_device(dev);
  cuda::cast(x, dtype_of<From>::value, y, dtype_of<To>::value, n);
  kernels::after_cuda_launcher("cast");
#endif
}

// y (n) 16-bit = x (n) f32, rounded once.
template <class E>
void store(Device dev, const float* x, E* y, int64_t n) {
  convert(dev, x, y, n);
}

// An f32 copy of a 16-bit bias (V), or none.
template <class E>
std::unique_ptr<Workspace> widened_bias(const Tensor& b, int64_t V) {
  if (!b.defined()) return nullptr;
  auto ws = std::make_unique<Workspace>(b.device(), static_cast<uint64_t>(V) * sizeof(float));
  convert(b.device(), b.data<E>(), ws->as<float>(), V);
  return ws;
}

// C (M, N) f32 = op(A) op(B), or += with accumulate; A and B 16-bit (as cpu::gemm_lowp).
template <class E>
void gemm16(Device dev, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const E* A, int64_t lda,
            const E* B, int64_t ldb, bool accumulate, float* C, int64_t ldc) {
  if (dev.is_cpu()) {
    const DType dt = dtype_of<E>::value;
    cpu::gemm_lowp(ta, tb, M, N, K, dt, A, lda, dt, B, ldb, nullptr, accumulate, C, ldc);
    return;
  }
#ifdef REGEN_WITH_CUDA
  if (dry_run_active()) return;  // cuBLAS's workspace is the handle's, taken before the step
  kernels::use_device(dev);
  cuda::gemm_lowp(ta, tb, M, N, K, A, lda, B, ldb, accumulate, C, ldc);
  kernels::after_cuda_launcher("gemm_lowp");
#endif
}

// C (M, N) f32 (+)= op(A) op(B), A f32 and B 16-bit (B (rows_b, cols_b) contiguous). The CPU's
// gemm_lowp widens B while packing; CUDA widens it into `wide` (rows_b * cols_b floats, on the
// device; null on the CPU) and runs the f32 GEMM: the same f32 products either way.
template <class E>
void gemm_f32_by16(Device dev, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* A,
                   int64_t lda, const E* B, int64_t ldb, int64_t b_elems, float* wide,
                   bool accumulate, float* C, int64_t ldc) {
  if (dev.is_cpu()) {
    cpu::gemm_lowp(ta, tb, M, N, K, DType::f32, A, lda, dtype_of<E>::value, B, ldb, nullptr,
                   accumulate, C, ldc);
    return;
  }
  convert(dev, B, wide, b_elems);
  REGEN_LAUNCH(dev, float, gemm, ta, tb, M, N, K, 1.0f, A, lda, static_cast<const float*>(wide),
               ldb, accumulate ? 1.0f : 0.0f, C, ldc);
}

// logits_c (rows, V) f32 = x rows [r0, r0 + rows) (rows, K) * W^T (K, V), 16-bit operands.
template <class E>
void chunk_logits(const Tensor& x, const Tensor& w, const Dims& d, int64_t r0, int64_t rows,
                  float* logits) {
  gemm16<E>(x.device(), false, true, rows, d.V, d.K, x.data<E>() + r0 * d.K, d.K, w.data<E>(), d.K,
            false, logits, d.V);
}

template <class E>
void forward(OpContext& c) {
  const Tensor &x = c.inputs[0], &w = c.inputs[1], &b = c.inputs[2], &targets = c.inputs[3];
  const LinearCrossEntropyAttrs& a = c.attr<LinearCrossEntropyAttrs>();
  check_device("linear_cross_entropy", x);
  const Dims d = dims(x, w, a);
  const Device dev = x.device();
  Tensor loss = empty({}, DType::f32, dev);
  Tensor lse = empty({d.M}, DType::f32, dev);
  const int64_t* t = targets.data<int64_t>();
  // Bad targets fail before any product is computed.
  REGEN_LAUNCH(dev, float, linear_cross_entropy_scale, static_cast<const float*>(nullptr), t,
               static_cast<float*>(nullptr), d.M, d.V, a.ignore_index);
  if (d.M == 0) {
    REGEN_LAUNCH(dev, float, fill, loss.data<float>(), 1, 0.0f);
    c.outputs = {loss, lse};
    return;
  }
  {
    Workspace row_loss(dev, static_cast<uint64_t>(d.M) * sizeof(double));
    Workspace logits(dev, static_cast<uint64_t>(d.chunk * d.V) * sizeof(float));
    const std::unique_ptr<Workspace> bias = widened_bias<E>(b, d.V);
    for (int64_t r0 = 0; r0 < d.M; r0 += d.chunk) {
      const int64_t rows = std::min(d.chunk, d.M - r0);
      chunk_logits<E>(x, w, d, r0, rows, logits.as<float>());
      REGEN_LAUNCH(dev, float, linear_cross_entropy_forward_rows, logits.as<float>(),
                   bias ? bias->as<float>() : nullptr, t + r0, lse.data<float>() + r0,
                   row_loss.as<double>() + r0, rows, d.V, a.ignore_index);
    }
    REGEN_LAUNCH(dev, float, linear_cross_entropy_forward_loss, row_loss.as<double>(), t,
                 loss.data<float>(), d.M, a.ignore_index);
  }
  c.outputs = {loss, lse};
}

// The backward's vocabulary tiles: at most kMaxTileRows rows of W and an f32 (rows, K) dW tile of
// at most kTileBytes, V split evenly (the tiles differ by at most one row). A function of V and K
// alone, so the blocks requested, the order of every sum and the bits of every gradient do not
// depend on the thread count. For the seed Transformer (V = 30000, K = 512): 8 tiles of 3750 rows,
// a 7.3 MiB dW tile.
constexpr int64_t kTileBytes = int64_t{8} << 20, kMaxTileRows = 4096;
int64_t tile_rows(int64_t V, int64_t K) {
  const int64_t per_row = std::max<int64_t>(K, 1) * static_cast<int64_t>(sizeof(float));
  const int64_t most = std::clamp<int64_t>(kTileBytes / per_row, 1, kMaxTileRows);
  const int64_t tiles = (V + most - 1) / most;
  return (V + tiles - 1) / tiles;
}

// Rows per block of the backward: as many as keep a (rows, tile) f32 block within the forward's
// (chunk, V) logits buffer (so chunk_rows still bounds the op's working memory), M split evenly.
// Fewer, larger GEMMs than one block per forward chunk: on a loaded machine every GEMM call's
// threads wait for each other once, and the smaller blocks were measured slower for it. With a
// bf16 copy of the block (low_copy), at most 2/3 of those rows, so the block and its copy (6
// bytes per element) take no more than the f32 block alone would: the bf16 gradients do not
// raise the op's working memory.
int64_t backward_block_rows(const Dims& d, int64_t tile, bool low_copy) {
  const auto split = [&](int64_t most) {
    const int64_t blocks = (d.M + most - 1) / most;
    return (d.M + blocks - 1) / blocks;
  };
  const int64_t rows = split(std::max<int64_t>(1, d.chunk * d.V / tile));
  return low_copy ? split(std::max<int64_t>(1, rows * 2 / 3)) : rows;
}

// block (rows, n) f32: in, the logits x_c W_t^T of rows [r0, r0 + rows) and vocabulary columns
// [v0, v0 + n); out, their gradient g exp(logit + bias - lse) less g at the row's target, 0 on an
// ignored row (targets, lse: the chunk's rows; bias: all V, or null). The arithmetic of
// linear_cross_entropy_backward_rows (kernels/cpu/cross_entropy.cpp) on a tile of its columns,
// with its exp_f32: each element depends on its own logit and its row's lse only, so a tile is
// computed alone.
// Rows are independent: the threads change no bit.
void block_dlogits(float* block, int64_t rows, int64_t n, int64_t v0, int64_t V, const float* bias,
                   const int64_t* targets, const float* lse, float g, int64_t ignore_index) {
#pragma omp parallel for schedule(static) if (rows * n > (1 << 14))
  for (int64_t r = 0; r < rows; ++r) {
    float* x = block + r * n;
    const int64_t t = targets[r];
    // Targets were validated (linear_cross_entropy_scale); a bad one is treated as ignored.
    if (t == ignore_index || t < 0 || t >= V) {
      std::fill(x, x + n, 0.0f);
      continue;
    }
    const float l = lse[r];
    if (bias) {
      const float* bt = bias + v0;
      for (int64_t j = 0; j < n; ++j) x[j] = g * unary::exp_f32((x[j] + bt[j]) - l);
    } else {
      for (int64_t j = 0; j < n; ++j) x[j] = g * unary::exp_f32(x[j] - l);
    }
    if (t >= v0 && t < v0 + n) x[t - v0] -= g;
  }
}

template <class E>
void backward(BackwardContext& c) {
  const LinearCrossEntropyAttrs& a = c.attr<LinearCrossEntropyAttrs>();
  const Tensor x = c.saved_input(0), w = c.saved_input(1);
  const Tensor b = a.has_bias ? c.saved_input(2) : Tensor();
  const Tensor targets = c.saved_input(3), lse = c.saved_output(1);
  const Tensor& dloss = c.grad_output(0);
  check_device("linear_cross_entropy backward", x);
  REGEN_CHECK(dloss.dtype() == DType::f32 && lse.dtype() == DType::f32,
              "linear_cross_entropy backward: the loss gradient ", dloss.str(), " and lse ",
              lse.str(), " must be f32 for ", dtype_name(x.dtype()), " inputs");
  const Dims d = dims(x, w, a);
  const Device dev = x.device();
  const bool want_dx = c.needs_grad(0), want_dw = c.needs_grad(1);
  const bool want_db = a.has_bias && c.needs_grad(2);
  Tensor dx = want_dx ? empty_like(x) : Tensor();
  Tensor dw = want_dw ? empty_like(w) : Tensor();
  Tensor db = want_db ? empty({d.V}, b.dtype(), dev) : Tensor();
  const bool dry = dry_run_active();
  if (d.M == 0) {  // no rows: every gradient is 0
    for (const Tensor& g : {dx, dw, db}) {
      if (g.defined()) REGEN_LAUNCH(dev, E, fill, g.data<E>(), g.numel(), E(0.0f));
    }
  } else {
    const int64_t* t = targets.data<int64_t>();
    Workspace scale(dev, sizeof(float));
    REGEN_LAUNCH(dev, float, linear_cross_entropy_scale, dloss.data<float>(), t, scale.as<float>(),
                 d.M, d.V, a.ignore_index);
    // The CPU reads the scale here; CUDA's block kernel reads it on the device.
    const float g = dry || !dev.is_cpu() ? 0.0f : scale.as<float>()[0];
    const std::unique_ptr<Workspace> bias = widened_bias<E>(b, d.V);
    // bf16: the block's dlogits rounded to bf16 (dl16), as autocast's bf16 gradient of the
    // logits, so dx and dW are bf16 x bf16 products (the CPU's bf16 pair tile, tensor cores on
    // CUDA). f16 keeps them f32 (a small probability times the loss's gradient would lose its
    // bits in f16's range), and on CUDA f32 copies of W's tile (for dx) and of a block of x's rows
    // (for dW) serve its f32 products.
    constexpr bool bf16_dlogits = std::is_same<E, bfloat16>::value;
    const bool low_copy = bf16_dlogits && (want_dx || want_dw);
    const int64_t tile = tile_rows(d.V, d.K);
    const int64_t block_rows = backward_block_rows(d, tile, low_copy);
    const bool several = block_rows < d.M;
    const E* xs = x.data<E>();
    const uint64_t f = sizeof(float);
    Workspace block(dev, static_cast<uint64_t>(block_rows * tile) * f);
    std::unique_ptr<Workspace> dx_sum, dw_tile, db_tile, colsum;
    if (want_dx) dx_sum = std::make_unique<Workspace>(dev, static_cast<uint64_t>(d.M * d.K) * f);
    if (want_dw) dw_tile = std::make_unique<Workspace>(dev, static_cast<uint64_t>(tile * d.K) * f);
    if (want_db) db_tile = std::make_unique<Workspace>(dev, static_cast<uint64_t>(tile) * f);
    if (want_db && several)
      colsum = std::make_unique<Workspace>(dev, static_cast<uint64_t>(tile) * f);
    std::unique_ptr<Workspace> dl16, wide_w, wide_x;
    if (low_copy)
      dl16 = std::make_unique<Workspace>(dev, static_cast<uint64_t>(block_rows * tile) * sizeof(E));
    if (!bf16_dlogits && !dev.is_cpu() && want_dx)
      wide_w = std::make_unique<Workspace>(dev, static_cast<uint64_t>(tile * d.K) * f);
    if (!bf16_dlogits && !dev.is_cpu() && want_dw)
      wide_x = std::make_unique<Workspace>(dev, static_cast<uint64_t>(block_rows * d.K) * f);
    // Tiles outside, blocks of rows inside: a tile's dW and db are complete after its last block
    // and are rounded then; dx sums over the tiles in dx_sum and is rounded after the last one.
    for (int64_t v0 = 0; v0 < d.V; v0 += tile) {
      const int64_t n = std::min(tile, d.V - v0);
      const E* wt = w.data<E>() + v0 * d.K;
      for (int64_t r0 = 0; r0 < d.M; r0 += block_rows) {
        const int64_t rows = std::min(block_rows, d.M - r0);
        const bool first = r0 == 0;
        float* dl = block.as<float>();
        // logits (rows, n) = x_c (rows, K) * W_t^T (K, n), then their gradient in place
        gemm16<E>(dev, false, true, rows, n, d.K, xs + r0 * d.K, d.K, wt, d.K, false, dl, n);
        const float* bias_f = bias ? bias->as<float>() : nullptr;
        if (dev.is_cpu()) {
          if (!dry) {
            block_dlogits(dl, rows, n, v0, d.V, bias_f, t + r0, lse.data<float>() + r0, g,
                          a.ignore_index);
          }
        } else {
#ifdef REGEN_WITH_CUDA
          if (!dry) {
            kernels::use_device(dev);
            cuda::linear_cross_entropy_block_dlogits(dl, bias_f, t + r0, lse.data<float>() + r0,
                                                     scale.as<float>(), rows, n, v0, d.V,
                                                     a.ignore_index);
            kernels::after_cuda_launcher("linear_cross_entropy_block_dlogits");
          }
#endif
        }
        const E* dl_low = nullptr;  // bf16: the rounded dlogits
        if (dl16) {
          store(dev, static_cast<const float*>(dl), dl16->as<E>(), rows * n);
          dl_low = dl16->as<E>();
        }
        if (want_dx) {  // dx_c (rows, K) (+)= dlogits (rows, n) * W_t (n, K), f32 sums
          if (dl_low) {
            gemm16<E>(dev, false, false, rows, d.K, n, dl_low, n, wt, d.K, v0 > 0,
                      dx_sum->as<float>() + r0 * d.K, d.K);
          } else {  // W_t is widened once per tile on CUDA (at its first block)
            gemm_f32_by16<E>(dev, false, false, rows, d.K, n, dl, n, wt, d.K, first ? n * d.K : 0,
                             wide_w ? wide_w->as<float>() : nullptr, v0 > 0,
                             dx_sum->as<float>() + r0 * d.K, d.K);
          }
        }
        if (want_dw) {  // dW_t (n, K) (+)= dlogits^T (n, rows) * x_c (rows, K), f32 sums
          if (dl_low) {
            gemm16<E>(dev, true, false, n, d.K, rows, dl_low, n, xs + r0 * d.K, d.K, !first,
                      dw_tile->as<float>(), d.K);
          } else {
            gemm_f32_by16<E>(dev, true, false, n, d.K, rows, dl, n, xs + r0 * d.K, d.K, rows * d.K,
                             wide_x ? wide_x->as<float>() : nullptr, !first, dw_tile->as<float>(),
                             d.K);
          }
        }
        if (want_db) {
          if (first) {
            REGEN_LAUNCH(dev, float, sum_rows, dl, db_tile->as<float>(), rows, n);
          } else {
            REGEN_LAUNCH(dev, float, sum_rows, dl, colsum->as<float>(), rows, n);
            REGEN_LAUNCH(dev, float, add_inplace, db_tile->as<float>(), colsum->as<float>(), n);
          }
        }
      }
      if (want_dw) store(dev, dw_tile->as<float>(), dw.data<E>() + v0 * d.K, n * d.K);
      if (want_db) store(dev, db_tile->as<float>(), db.data<E>() + v0, n);
    }
    if (want_dx) store(dev, dx_sum->as<float>(), dx.data<E>(), d.M * d.K);
  }
  c.set_grad_input(0, dx);
  c.set_grad_input(1, dw);
  c.set_grad_input(2, db);
}

}  // namespace

void linear_cross_entropy_forward_lowp(OpContext& c) {
  switch (c.inputs[0].dtype()) {
    case DType::bf16:
      return forward<bfloat16>(c);
    case DType::f16:
      return forward<float16>(c);
    default:
      REGEN_FAIL("linear_cross_entropy: the 16-bit path got ", dtype_name(c.inputs[0].dtype()));
  }
}

void linear_cross_entropy_backward_lowp(BackwardContext& c) {
  const DType dt = c.saved_input(0).dtype();
  switch (dt) {
    case DType::bf16:
      return backward<bfloat16>(c);
    case DType::f16:
      return backward<float16>(c);
    default:
      REGEN_FAIL("linear_cross_entropy backward: the 16-bit path got ", dtype_name(dt));
  }
}

}  // namespace regen::detail
