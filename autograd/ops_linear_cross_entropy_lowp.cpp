// linear_cross_entropy with bf16 or f16 x, weight and bias (autocast's class low, with an fp32
// output: autograd/precision.cpp): the 16-bit path of the op of autograd/ops_cross_entropy.cpp,
// which hands 16-bit inputs to the two functions here. The chunking is the f32 path's; what
// differs is where f32 is kept:
//   forward   logits_c (rows, V) = x_c W^T by cpu::gemm_lowp (16-bit operands, f32 sums) into an
//             f32 workspace; bias widened to f32 once; lse (M) and the loss are f32 (the row
//             kernels of kernels/cpu/cross_entropy.cpp at T = float).
//   backward  dlogits_c in f32 as forward's logits; dx_c = dlogits_c W into an f32 (chunk, K)
//             tile, rounded once into the 16-bit dx; dW and db summed over chunks in f32
//             workspaces (V, K) and (V), rounded once at the end into the 16-bit dw and db.
// Gradients have the operands' dtype; the loss's gradient is f32. CPU only (a 16-bit input on a
// CUDA device is a clear error). Tests: tests/test_amp_gemm_ops.cpp.
#include <algorithm>
#include <memory>

#include "regen/autograd/op_util.h"
#include "regen/kernels/cpu/convert.h"
#include "regen/kernels/cpu/gemm_lowp.h"

namespace regen::detail {

namespace {

struct Dims {
  int64_t M, K, V, chunk;
};
Dims dims(const Tensor& x, const Tensor& w, const LinearCrossEntropyAttrs& a) {
  const int64_t M = x.size(0);
  return {M, x.size(1), w.size(0), std::max<int64_t>(1, std::min(a.chunk_rows, M))};
}

void check_cpu(const char* what, const Tensor& x) {
  REGEN_CHECK(x.device().is_cpu(), what, ": ", dtype_name(x.dtype()),
              " inputs have a CPU kernel only; input ", x.str(), " is on ", x.device().str());
}

// y (n) 16-bit = x (n) f32, rounded once; nothing in a dry run (its tensors are not memory).
template <class E>
void store(const float* x, E* y, int64_t n) {
  if (!dry_run_active()) cpu::narrow(x, y, n);
}

// An f32 copy of a 16-bit bias (V), or none.
template <class E>
std::unique_ptr<Workspace> widened_bias(const Tensor& b, int64_t V) {
  if (!b.defined()) return nullptr;
  auto ws = std::make_unique<Workspace>(Device::cpu(), static_cast<uint64_t>(V) * sizeof(float));
  if (!dry_run_active()) cpu::widen(b.data<E>(), ws->as<float>(), V);
  return ws;
}

// logits_c (rows, V) f32 = x rows [r0, r0 + rows) (rows, K) * W^T (K, V), 16-bit operands.
template <class E>
void chunk_logits(const Tensor& x, const Tensor& w, const Dims& d, int64_t r0, int64_t rows,
                  float* logits) {
  const DType dt = dtype_of<E>::value;
  cpu::gemm_lowp(false, true, rows, d.V, d.K, dt, x.data<E>() + r0 * d.K, d.K, dt, w.data<E>(), d.K,
                 nullptr, false, logits, d.V);
}

template <class E>
void forward(OpContext& c) {
  const Tensor &x = c.inputs[0], &w = c.inputs[1], &b = c.inputs[2], &targets = c.inputs[3];
  const LinearCrossEntropyAttrs& a = c.attr<LinearCrossEntropyAttrs>();
  check_cpu("linear_cross_entropy", x);
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

template <class E>
void backward(BackwardContext& c) {
  const LinearCrossEntropyAttrs& a = c.attr<LinearCrossEntropyAttrs>();
  const Tensor x = c.saved_input(0), w = c.saved_input(1);
  const Tensor b = a.has_bias ? c.saved_input(2) : Tensor();
  const Tensor targets = c.saved_input(3), lse = c.saved_output(1);
  const Tensor& dloss = c.grad_output(0);
  check_cpu("linear_cross_entropy backward", x);
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
  if (d.M == 0) {  // no rows: every gradient is 0
    if (!dry_run_active()) {
      for (const Tensor& g : {dx, dw, db}) {
        if (g.defined()) std::fill(g.data<E>(), g.data<E>() + g.numel(), E(0.0f));
      }
    }
  } else {
    const int64_t* t = targets.data<int64_t>();
    Workspace scale(dev, sizeof(float));
    REGEN_LAUNCH(dev, float, linear_cross_entropy_scale, dloss.data<float>(), t, scale.as<float>(),
                 d.M, d.V, a.ignore_index);
    Workspace logits(dev, static_cast<uint64_t>(d.chunk * d.V) * sizeof(float));
    const std::unique_ptr<Workspace> bias = widened_bias<E>(b, d.V);
    const bool several = d.chunk < d.M;
    const DType dt = dtype_of<E>::value;
    std::unique_ptr<Workspace> dx_tile, dw_sum, db_sum, colsum;
    if (want_dx) dx_tile = std::make_unique<Workspace>(dev, d.chunk * d.K * sizeof(float));
    if (want_dw) dw_sum = std::make_unique<Workspace>(dev, d.V * d.K * sizeof(float));
    if (want_db) db_sum = std::make_unique<Workspace>(dev, d.V * sizeof(float));
    if (want_db && several) colsum = std::make_unique<Workspace>(dev, d.V * sizeof(float));
    for (int64_t r0 = 0; r0 < d.M; r0 += d.chunk) {
      const int64_t rows = std::min(d.chunk, d.M - r0);
      const bool first = r0 == 0;
      float* dl = logits.as<float>();
      chunk_logits<E>(x, w, d, r0, rows, dl);
      REGEN_LAUNCH(dev, float, linear_cross_entropy_backward_rows, dl,
                   bias ? bias->as<float>() : nullptr, t + r0, lse.data<float>() + r0,
                   scale.as<float>(), rows, d.V, a.ignore_index);
      if (want_dx) {  // dx_c (rows, K) = dlogits_c (rows, V) * W (V, K), rounded once
        cpu::gemm_lowp(false, false, rows, d.K, d.V, DType::f32, dl, d.V, dt, w.data<E>(), d.K,
                       nullptr, false, dx_tile->as<float>(), d.K);
        store(dx_tile->as<float>(), dx.data<E>() + r0 * d.K, rows * d.K);
      }
      if (want_dw) {  // dW (V, K) (+)= dlogits_c^T (V, rows) * x_c (rows, K), in f32
        cpu::gemm_lowp(true, false, d.V, d.K, rows, DType::f32, dl, d.V, dt, x.data<E>() + r0 * d.K,
                       d.K, nullptr, !first, dw_sum->as<float>(), d.K);
      }
      if (want_db) {
        if (first) {
          REGEN_LAUNCH(dev, float, sum_rows, dl, db_sum->as<float>(), rows, d.V);
        } else {
          REGEN_LAUNCH(dev, float, sum_rows, dl, colsum->as<float>(), rows, d.V);
          REGEN_LAUNCH(dev, float, add_inplace, db_sum->as<float>(), colsum->as<float>(), d.V);
        }
      }
    }
    if (want_dw) store(dw_sum->as<float>(), dw.data<E>(), d.V * d.K);
    if (want_db) store(db_sum->as<float>(), db.data<E>(), d.V);
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
