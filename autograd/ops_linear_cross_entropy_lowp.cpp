// linear_cross_entropy with bf16 or f16 x, weight and bias (autocast's class low, with an fp32
// output: autograd/precision.cpp): the 16-bit path of the op of autograd/ops_cross_entropy.cpp,
// which hands 16-bit inputs to the functions here, and the backward that recomputes the logits
// for f32 inputs too. The chunking is the f32 path's; what differs is where f32 is kept. The
// node's attributes choose how the gradients are made (ops.h, linear_cross_entropy's recompute):
//   forward            logits_c (rows, V) = x_c W^T by cpu::gemm_lowp (16-bit operands, f32 sums)
//                      into an f32 workspace; bias widened to f32 once; lse (M) and the loss are
//                      f32 (the row kernels of kernels/cpu/cross_entropy.cpp at T = float).
//   gradients in the   (attributes forward_dx/dw/db, the default) each chunk's logits become their
//   forward            f32 gradient for a unit loss gradient (linear_cross_entropy_backward_rows);
//                      bf16 rounds it to bf16 (autocast's bf16 gradient of the logits), so the
//                      products are bf16 x bf16; f16 keeps them f32. By vocabulary tiles W_t:
//                      dx_c (+)= dlogits_t W_t and dW_t (+)= dlogits_t^T x_c into f32 (M, K) and
//                      (V, K) outputs, db (+)= the f32 dlogits' column sums: saved, and in backward
//                      (the f32 path's, ops_cross_entropy.cpp) scaled by the loss's gradient, then
//                      rounded once to 16 bits (linear_cross_entropy_round_lowp below; so an fp16
//                      loss scale multiplies f32 sums). Three products of (M, V, K);
//                      the f32 (V, K) sum is held from the forward to the backward (seed
//                      Transformer: 58.6 MiB).
//   recomputed in the  (recompute) by vocabulary tiles W_t (n rows of W: the tiles of
//   backward           linear_cross_entropy_tile_rows below) and, inside each tile, blocks of rows
//                      x_c (backward_block_rows: a (rows, n) block is at most the forward's
//                      (chunk, V) buffer): the f32 logits block (rows, n)
//                      = x_c W_t^T and, with the saved f32 lse, its gradient dlogits = (softmax -
//                      onehot) g, computed alone (each element needs its logit and its row's lse
//                      only), rounded to bf16 for bf16 inputs as above. Then dW_t (+)= dlogits^T
//                      x_c and db_t (+)= the f32 dlogits' column sums in f32 (n, K) and (n) tiles,
//                      rounded once into the 16-bit dw and db when the tile's last block is done,
//                      and dx_c (+)= dlogits W_t into an f32 (M, K) sum over the tiles, rounded
//                      once into the 16-bit dx at the end (f32 inputs sum into their gradients
//                      directly). Four products; no (V, K) f32 buffer exists: the working memory is
//                      the block (and its bf16 copy), the (n, K) tile and the (M, K) dx sum (seed
//                      Transformer: 14.6 + 7.3 + 2 MiB at batch 8, 29.3 + 7.3 + 8 MiB at batch 32).
// Gradients have the operands' dtype; the loss's gradient is f32. On CUDA the same steps run on the
// device: the 16-bit products through cuda::gemm_lowp (cublasGemmEx, f32 C), f16's products with an
// f32 dlogits block through the f32 GEMM on a widened (f32) copy of the 16-bit operand's tile or
// block (the CPU's gemm_lowp widens it while packing: the same f32 products), dlogits by
// cuda::linear_cross_entropy_block_dlogits (recomputing) or linear_cross_entropy_backward_rows
// reading the device's scale, and the conversions by cuda::cast. Tests:
// tests/test_amp_gemm_ops.cpp (CPU), tests/cuda/test_cuda_ops.cpp (CUDA against the CPU).
#include <algorithm>
#include <cmath>
#include <memory>
#include <type_traits>

#include "regen/autograd/op_util.h"
#include "regen/kernels/cpu/convert.h"
#include "regen/kernels/cpu/gemm_lowp.h"
#include "regen/kernels/unary_ops.h"

namespace regen::detail {

// The vocabulary tiles (rows of W) the products go by: ops_cross_entropy.cpp's too.
int64_t linear_cross_entropy_tile_rows(int64_t V, int64_t K);

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
  static_assert(!std::is_same<From, To>::value, "convert: the same type");
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

// An f32 copy of a 16-bit bias (V), or none (no bias, or an f32 one).
template <class E>
std::unique_ptr<Workspace> widened_bias(const Tensor& b, int64_t V) {
  if constexpr (std::is_same<E, float>::value) {
    return nullptr;
  } else {
    if (!b.defined()) return nullptr;
    auto ws = std::make_unique<Workspace>(b.device(), static_cast<uint64_t>(V) * sizeof(float));
    convert(b.device(), b.data<E>(), ws->as<float>(), V);
    return ws;
  }
}

// C (M, N) f32 = op(A) op(B), or += with accumulate; A and B 16-bit (as cpu::gemm_lowp).
// f32 operands (the f32 backward that recomputes the logits): the f32 path's GEMM.
template <class E>
void gemm16(Device dev, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const E* A, int64_t lda,
            const E* B, int64_t ldb, bool accumulate, float* C, int64_t ldc) {
  if constexpr (std::is_same<E, float>::value) {
    REGEN_LAUNCH(dev, float, gemm, ta, tb, M, N, K, 1.0f, A, lda, B, ldb, accumulate ? 1.0f : 0.0f,
                 C, ldc);
  } else {
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
}

// C (M, N) f32 (+)= op(A) op(B), A f32 and B 16-bit (B (rows_b, cols_b) contiguous). The CPU's
// gemm_lowp widens B while packing; CUDA widens it into `wide` (rows_b * cols_b floats, on the
// device; null on the CPU) and runs the f32 GEMM: the same f32 products either way.
template <class E>
void gemm_f32_by16(Device dev, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* A,
                   int64_t lda, const E* B, int64_t ldb, int64_t b_elems, float* wide,
                   bool accumulate, float* C, int64_t ldc) {
  if constexpr (std::is_same<E, float>::value) {
    gemm16<float>(dev, ta, tb, M, N, K, A, lda, B, ldb, accumulate, C, ldc);
  } else {
    if (dev.is_cpu()) {
      cpu::gemm_lowp(ta, tb, M, N, K, DType::f32, A, lda, dtype_of<E>::value, B, ldb, nullptr,
                     accumulate, C, ldc);
      return;
    }
    convert(dev, B, wide, b_elems);
    REGEN_LAUNCH(dev, float, gemm, ta, tb, M, N, K, 1.0f, A, lda, static_cast<const float*>(wide),
                 ldb, accumulate ? 1.0f : 0.0f, C, ldc);
  }
}

// logits_c (rows, V) f32 = x rows [r0, r0 + rows) (rows, K) * W^T (K, V), 16-bit operands.
template <class E>
void chunk_logits(const Tensor& x, const Tensor& w, const Dims& d, int64_t r0, int64_t rows,
                  float* logits) {
  gemm16<E>(x.device(), false, true, rows, d.V, d.K, x.data<E>() + r0 * d.K, d.K, w.data<E>(), d.K,
            false, logits, d.V);
}

// The bias as f32 for the kernels: f32 inputs' own, 16-bit inputs' widened copy, or null.
template <class E>
const float* bias_f32(const Tensor& b, const std::unique_ptr<Workspace>& wide) {
  if constexpr (std::is_same<E, float>::value) return b.defined() ? b.data<float>() : nullptr;
  return wide ? wide->as<float>() : nullptr;
}

template <class E>
void forward(OpContext& c) {
  const Tensor &x = c.inputs[0], &w = c.inputs[1], &b = c.inputs[2], &targets = c.inputs[3];
  const LinearCrossEntropyAttrs& a = c.attr<LinearCrossEntropyAttrs>();
  check_device("linear_cross_entropy", x);
  const Dims d = dims(x, w, a);
  const Device dev = x.device();
  const DType dt = dtype_of<E>::value;
  const bool want_dx = a.forward_dx, want_dw = a.forward_dw, want_db = a.has_bias && a.forward_db;
  const bool grads = want_dx || want_dw || want_db;
  Tensor loss = empty({}, DType::f32, dev);
  Tensor lse = empty({d.M}, DType::f32, dev);
  // The gradient slots: f32 sums for a unit loss gradient, or an empty tensor where one is not
  // computed (every slot is filled).
  Tensor dx = want_dx ? empty({d.M, d.K}, DType::f32, dev) : empty({0}, dt, dev);
  Tensor dw = want_dw ? empty({d.V, d.K}, DType::f32, dev) : empty({0}, dt, dev);
  Tensor db = want_db ? empty({d.V}, DType::f32, dev) : empty({0}, dt, dev);
  const int64_t* t = targets.data<int64_t>();
  // Bad targets fail before any product is computed. With gradients to make, the same call forms
  // scale[0] = 1 / count on the device: linear_cross_entropy_scale of a unit loss gradient
  // (scale[1]).
  std::unique_ptr<Workspace> scale;
  if (grads) {
    scale = std::make_unique<Workspace>(dev, 2 * sizeof(float));
    REGEN_LAUNCH(dev, float, fill, scale->as<float>() + 1, 1, 1.0f);
  }
  REGEN_LAUNCH(dev, float, linear_cross_entropy_scale, grads ? scale->as<float>() + 1 : nullptr, t,
               grads ? scale->as<float>() : nullptr, d.M, d.V, a.ignore_index);
  if (d.M == 0) {  // no rows: the loss and every gradient are 0
    for (const Tensor& z : {loss, dx, dw, db}) {
      if (z.numel() > 0) REGEN_LAUNCH(dev, float, fill, z.data<float>(), z.numel(), 0.0f);
    }
    c.outputs = {loss, lse, dx, dw, db};
    return;
  }
  {
    Workspace row_loss(dev, static_cast<uint64_t>(d.M) * sizeof(double));
    Workspace logits(dev, static_cast<uint64_t>(d.chunk * d.V) * sizeof(float));
    const std::unique_ptr<Workspace> bias = widened_bias<E>(b, d.V);
    // bf16: each chunk's dlogits rounded to bf16, as the backward below does, so dx and dW are
    // bf16 x bf16 products; f16 keeps them f32, and on CUDA its products widen W's tile (dx) and
    // the chunk of x (dW) into f32 copies. The products go by the backward's vocabulary tiles:
    // a GEMM packs its operands whole, and dW's, (V, rows), would take as much as the chunk.
    constexpr bool bf16_dlogits = std::is_same<E, bfloat16>::value;
    const bool f16_cuda = !bf16_dlogits && !dev.is_cpu();
    const int64_t tile = linear_cross_entropy_tile_rows(d.V, d.K);
    std::unique_ptr<Workspace> dl16, colsum, wide_w, wide_x;
    if (bf16_dlogits && (want_dx || want_dw))
      dl16 = std::make_unique<Workspace>(dev, static_cast<uint64_t>(d.chunk * d.V) * sizeof(E));
    if (want_db && d.chunk < d.M)
      colsum = std::make_unique<Workspace>(dev, static_cast<uint64_t>(d.V) * sizeof(float));
    if (f16_cuda && want_dx)
      wide_w = std::make_unique<Workspace>(dev, static_cast<uint64_t>(tile * d.K) * sizeof(float));
    if (f16_cuda && want_dw)
      wide_x =
          std::make_unique<Workspace>(dev, static_cast<uint64_t>(d.chunk * d.K) * sizeof(float));
    for (int64_t r0 = 0; r0 < d.M; r0 += d.chunk) {
      const int64_t rows = std::min(d.chunk, d.M - r0);
      const bool first = r0 == 0;
      float* l = logits.as<float>();
      chunk_logits<E>(x, w, d, r0, rows, l);
      REGEN_LAUNCH(dev, float, linear_cross_entropy_forward_rows, l, bias_f32<E>(b, bias), t + r0,
                   lse.data<float>() + r0, row_loss.as<double>() + r0, rows, d.V, a.ignore_index);
      if (!grads) continue;
      // dlogits_c in place; forward_rows added the bias already.
      REGEN_LAUNCH(dev, float, linear_cross_entropy_backward_rows, l,
                   static_cast<const float*>(nullptr), t + r0, lse.data<float>() + r0,
                   scale->as<float>(), rows, d.V, a.ignore_index);
      const E* dl_low = nullptr;
      if (dl16) {
        store(dev, static_cast<const float*>(l), dl16->as<E>(), rows * d.V);
        dl_low = dl16->as<E>();
      }
      const E* xc = x.data<E>() + r0 * d.K;
      for (int64_t v0 = 0; v0 < d.V; v0 += tile) {
        const int64_t n = std::min(tile, d.V - v0);
        const E* wt = w.data<E>() + v0 * d.K;
        if (want_dx) {  // dx_c (rows, K) (+)= dlogits_c[:, tile] (rows, n) * W_t (n, K)
          float* dxc = dx.data<float>() + r0 * d.K;
          if (dl_low) {
            gemm16<E>(dev, false, false, rows, d.K, n, dl_low + v0, d.V, wt, d.K, v0 > 0, dxc, d.K);
          } else {
            gemm_f32_by16<E>(dev, false, false, rows, d.K, n, l + v0, d.V, wt, d.K, n * d.K,
                             wide_w ? wide_w->as<float>() : nullptr, v0 > 0, dxc, d.K);
          }
        }
        if (want_dw) {  // dW_t (n, K) (+)= dlogits_c[:, tile]^T (n, rows) * x_c (rows, K)
          float* dwt = dw.data<float>() + v0 * d.K;
          if (dl_low) {
            gemm16<E>(dev, true, false, n, d.K, rows, dl_low + v0, d.V, xc, d.K, !first, dwt, d.K);
          } else {  // x_c is widened once per chunk on CUDA (at its first tile)
            gemm_f32_by16<E>(dev, true, false, n, d.K, rows, l + v0, d.V, xc, d.K,
                             v0 == 0 ? rows * d.K : 0, wide_x ? wide_x->as<float>() : nullptr,
                             !first, dwt, d.K);
          }
        }
      }
      if (want_db) {  // the f32 dlogits' column sums
        if (first) {
          REGEN_LAUNCH(dev, float, sum_rows, l, db.data<float>(), rows, d.V);
        } else {
          REGEN_LAUNCH(dev, float, sum_rows, l, colsum->as<float>(), rows, d.V);
          REGEN_LAUNCH(dev, float, add_inplace, db.data<float>(), colsum->as<float>(), d.V);
        }
      }
    }
    REGEN_LAUNCH(dev, float, linear_cross_entropy_forward_loss, row_loss.as<double>(), t,
                 loss.data<float>(), d.M, a.ignore_index);
  }
  c.outputs = {loss, lse, dx, dw, db};
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
  // f32 inputs sum straight into their gradients: no f32 tile, no (M, K) sum, no rounding.
  constexpr bool f32_in = std::is_same<E, float>::value;
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
    const bool f16_cuda = !bf16_dlogits && !f32_in && !dev.is_cpu();
    const int64_t tile = linear_cross_entropy_tile_rows(d.V, d.K);
    const int64_t block_rows = backward_block_rows(d, tile, low_copy);
    const bool several = block_rows < d.M;
    const E* xs = x.data<E>();
    const uint64_t f = sizeof(float);
    Workspace block(dev, static_cast<uint64_t>(block_rows * tile) * f);
    std::unique_ptr<Workspace> dx_sum, dw_tile, db_tile, colsum;
    if (want_dx && !f32_in)
      dx_sum = std::make_unique<Workspace>(dev, static_cast<uint64_t>(d.M * d.K) * f);
    if (want_dw && !f32_in)
      dw_tile = std::make_unique<Workspace>(dev, static_cast<uint64_t>(tile * d.K) * f);
    if (want_db && !f32_in)
      db_tile = std::make_unique<Workspace>(dev, static_cast<uint64_t>(tile) * f);
    if (want_db && several)
      colsum = std::make_unique<Workspace>(dev, static_cast<uint64_t>(tile) * f);
    std::unique_ptr<Workspace> dl16, wide_w, wide_x;
    if (low_copy)
      dl16 = std::make_unique<Workspace>(dev, static_cast<uint64_t>(block_rows * tile) * sizeof(E));
    if (f16_cuda && want_dx)
      wide_w = std::make_unique<Workspace>(dev, static_cast<uint64_t>(tile * d.K) * f);
    if (f16_cuda && want_dw)
      wide_x = std::make_unique<Workspace>(dev, static_cast<uint64_t>(block_rows * d.K) * f);
    // Tiles outside, blocks of rows inside: a tile's dW and db are complete after its last block
    // and are rounded then; dx sums over the tiles in dx_sum and is rounded after the last one.
    for (int64_t v0 = 0; v0 < d.V; v0 += tile) {
      const int64_t n = std::min(tile, d.V - v0);
      const E* wt = w.data<E>() + v0 * d.K;
      // Where the f32 sums go: the gradients themselves (f32 inputs) or the f32 sum and tiles.
      float* const dx_acc = !want_dx ? nullptr : f32_in ? dx.data<float>() : dx_sum->as<float>();
      float* const dw_acc = !want_dw ? nullptr
                            : f32_in ? dw.data<float>() + v0 * d.K
                                     : dw_tile->as<float>();
      float* const db_acc = !want_db ? nullptr
                            : f32_in ? db.data<float>() + v0
                                     : db_tile->as<float>();
      for (int64_t r0 = 0; r0 < d.M; r0 += block_rows) {
        const int64_t rows = std::min(block_rows, d.M - r0);
        const bool first = r0 == 0;
        float* dl = block.as<float>();
        // logits (rows, n) = x_c (rows, K) * W_t^T (K, n), then their gradient in place
        gemm16<E>(dev, false, true, rows, n, d.K, xs + r0 * d.K, d.K, wt, d.K, false, dl, n);
        const float* bias_f = bias_f32<E>(b, bias);
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
        if constexpr (bf16_dlogits) {
          if (dl16) {
            store(dev, static_cast<const float*>(dl), dl16->as<E>(), rows * n);
            dl_low = dl16->as<E>();
          }
        }
        if (want_dx) {  // dx_c (rows, K) (+)= dlogits (rows, n) * W_t (n, K), f32 sums
          if (dl_low) {
            gemm16<E>(dev, false, false, rows, d.K, n, dl_low, n, wt, d.K, v0 > 0,
                      dx_acc + r0 * d.K, d.K);
          } else {  // W_t is widened once per tile on CUDA (at its first block)
            gemm_f32_by16<E>(dev, false, false, rows, d.K, n, dl, n, wt, d.K, first ? n * d.K : 0,
                             wide_w ? wide_w->as<float>() : nullptr, v0 > 0, dx_acc + r0 * d.K,
                             d.K);
          }
        }
        if (want_dw) {  // dW_t (n, K) (+)= dlogits^T (n, rows) * x_c (rows, K), f32 sums
          if (dl_low) {
            gemm16<E>(dev, true, false, n, d.K, rows, dl_low, n, xs + r0 * d.K, d.K, !first, dw_acc,
                      d.K);
          } else {
            gemm_f32_by16<E>(dev, true, false, n, d.K, rows, dl, n, xs + r0 * d.K, d.K, rows * d.K,
                             wide_x ? wide_x->as<float>() : nullptr, !first, dw_acc, d.K);
          }
        }
        if (want_db) {
          if (first) {
            REGEN_LAUNCH(dev, float, sum_rows, dl, db_acc, rows, n);
          } else {
            REGEN_LAUNCH(dev, float, sum_rows, dl, colsum->as<float>(), rows, n);
            REGEN_LAUNCH(dev, float, add_inplace, db_acc, colsum->as<float>(), n);
          }
        }
      }
      if constexpr (!f32_in) {
        if (want_dw) store(dev, dw_tile->as<float>(), dw.data<E>() + v0 * d.K, n * d.K);
        if (want_db) store(dev, db_tile->as<float>(), db.data<E>() + v0, n);
      }
    }
    if constexpr (!f32_in) {
      if (want_dx) store(dev, dx_sum->as<float>(), dx.data<E>(), d.M * d.K);
    }
  }
  c.set_grad_input(0, dx);
  c.set_grad_input(1, dw);
  c.set_grad_input(2, db);
}

}  // namespace

// The vocabulary tiles both ways of making the gradients go by: at most kMaxTileRows rows of W and
// an f32 (rows, K) dW tile of at most kTileBytes, V split evenly (the tiles differ by at most one
// row). A function of V and K alone, so the blocks requested, the order of every sum and the bits
// of every gradient do not depend on the thread count. For the seed Transformer (V = 30000, K =
// 512): 8 tiles of 3750 rows, a 7.3 MiB dW tile.
int64_t linear_cross_entropy_tile_rows(int64_t V, int64_t K) {
  constexpr int64_t kTileBytes = int64_t{8} << 20, kMaxTileRows = 4096;
  const int64_t per_row = std::max<int64_t>(K, 1) * static_cast<int64_t>(sizeof(float));
  const int64_t most = std::clamp<int64_t>(kTileBytes / per_row, 1, kMaxTileRows);
  const int64_t tiles = (V + most - 1) / most;
  return (V + tiles - 1) / tiles;
}

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

Tensor linear_cross_entropy_round_lowp(const Tensor& g, DType dt) {
  REGEN_CHECK(g.dtype() == DType::f32 && is_low_precision(dt),
              "linear_cross_entropy backward: the forward's gradient ", g.str(),
              " is rounded from f32 to bf16 or f16, not to ", dtype_name(dt));
  Tensor r = empty(g.shape(), dt, g.device());
  if (dt == DType::bf16) {
    store(g.device(), g.data<float>(), r.data<bfloat16>(), g.numel());
  } else {
    store(g.device(), g.data<float>(), r.data<float16>(), g.numel());
  }
  return r;
}

void linear_cross_entropy_backward_lowp(BackwardContext& c) {
  const DType dt = c.saved_input(0).dtype();
  switch (dt) {
    case DType::bf16:
      return backward<bfloat16>(c);
    case DType::f16:
      return backward<float16>(c);
    case DType::f32:
      return backward<float>(c);
    default:
      REGEN_FAIL("linear_cross_entropy backward: the recomputing path got ", dtype_name(dt));
  }
}

}  // namespace regen::detail
