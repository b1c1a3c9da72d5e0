// cross_entropy: log-softmax fused with the mean negative log-likelihood over rows whose target
// is not ignore_index (kernels/cpu/cross_entropy.cpp). The row logsumexp is a hidden output that
// backward reads with the logits and targets.
// linear_cross_entropy: the same loss of linear(x, weight, bias) computed chunk by chunk of rows,
// so the (M, V) logits and their gradient never exist (the LM head of models/transformer.cpp).
// bf16 and f16 inputs take the path of autograd/ops_linear_cross_entropy_lowp.cpp (f32 logits,
// lse and loss; 16-bit gradients), and so does a backward that recomputes the logits (recompute,
// f32 inputs too).
// Gradient checks: tests/test_gradcheck_nlp.cpp; values and errors: tests/test_ops_nlp.cpp.
#include "regen/autograd/op_util.h"

#include <algorithm>
#include <memory>
#include <vector>

namespace regen {
namespace detail {
// autograd/ops_linear_cross_entropy_lowp.cpp: 16-bit inputs' forward (with the gradients when the
// attributes ask for them, f32 sums) and the saved f32 gradients' scaling and rounding; the
// backward that recomputes the logits (16-bit and f32 inputs).
void linear_cross_entropy_forward_lowp(OpContext& c);
// g (f32) rounded once to dt (bf16 or f16), a new tensor.
Tensor linear_cross_entropy_round_lowp(const Tensor& g, DType dt);
void linear_cross_entropy_backward_lowp(BackwardContext& c);
// The vocabulary tiles of W the gradients' products go by: at most about 8 MiB of an f32 (rows,
// K) gradient tile and 4096 rows, V split evenly; a function of V and K alone.
int64_t linear_cross_entropy_tile_rows(int64_t V, int64_t K);
}  // namespace detail
using namespace detail;

namespace {
template <class T>
void cross_entropy_fwd(OpContext& c) {
  const Tensor &logits = c.inputs[0], &targets = c.inputs[1];
  const int64_t M = logits.size(0), V = logits.size(1);
  Tensor loss = empty({}, logits.dtype(), logits.device());
  Tensor lse = empty({M}, logits.dtype(), logits.device());
  REGEN_LAUNCH(logits.device(), T, cross_entropy_forward, logits.data<T>(), targets.data<int64_t>(),
               loss.data<T>(), lse.data<T>(), M, V, c.attr<CrossEntropyAttrs>().ignore_index);
  c.outputs = {loss, lse};
}
void cross_entropy_forward_op(OpContext& c) {
  REGEN_FLOATING(c.inputs[0].dtype(), "cross_entropy", cross_entropy_fwd, c);
}

template <class T>
void cross_entropy_bwd(BackwardContext& c) {
  const Tensor logits = c.saved_input(0), targets = c.saved_input(1), lse = c.saved_output(1);
  const Tensor& dloss = c.grad_output(0);
  const int64_t M = logits.size(0), V = logits.size(1);
  Tensor dlogits = empty_like(logits);
  REGEN_LAUNCH(dloss.device(), T, cross_entropy_backward, dloss.data<T>(), logits.data<T>(),
               targets.data<int64_t>(), lse.data<T>(), dlogits.data<T>(), M, V,
               c.attr<CrossEntropyAttrs>().ignore_index);
  c.set_grad_input(0, dlogits);
}
void cross_entropy_backward_op(BackwardContext& c) {
  REGEN_FLOATING(c.grad_output(0).dtype(), "cross_entropy backward", cross_entropy_bwd, c);
}
void cross_entropy_saves(const AttrBlob&, SaveList& s) {
  s.input(0).input(1).output(1);
}
constexpr OpDef kCrossEntropy{
    "cross_entropy",    2, 1, false, cross_entropy_forward_op, cross_entropy_backward_op,
    cross_entropy_saves};
REGEN_REGISTER_OP(cross_entropy, kCrossEntropy);
}  // namespace

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index) {
  check_defined("cross_entropy", logits, "logits");
  check_defined("cross_entropy", targets, "targets");
  check_floating("cross_entropy", logits);
  // An fp32-class op (docs/precision.md): autocast hands it f32 logits; it has no 16-bit path.
  REGEN_CHECK(
      !is_low_precision(logits.dtype()) || autocast_dtype() != DType::f32, "cross_entropy: logits ",
      logits.str(),
      " are 16-bit; the loss is computed in f32 only (an fp32-class op): cast the logits to "
      "f32 first (autocast does)");
  REGEN_CHECK(targets.dtype() == DType::i64, "cross_entropy: targets ", targets.str(),
              " must be i64");
  REGEN_CHECK(logits.dim() == 2 && logits.size(1) > 0 && targets.dim() == 1 &&
                  targets.size(0) == logits.size(0),
              "cross_entropy: logits ", sh(logits.shape()), " and targets ", sh(targets.shape()),
              " do not match (expected (M, V) with V > 0 and (M))");
  return apply_op(OpKind::cross_entropy, CrossEntropyAttrs{ignore_index}, {logits, targets})[0];
}

// ---- linear_cross_entropy ----------------------------------------------------------------------
//
// Forward, per chunk of rows [r0, r0 + rows): logits_c = x_c W^T (gemm into one workspace reused
// by every chunk), then linear_cross_entropy_forward_rows adds the bias in place and writes the
// rows' lse and loss (double); the loss is their sum over counted rows, in row order.
// Recorded f32 and f64 (LinearCrossEntropyAttrs::forward_dx/dw/db), the same chunk goes on:
// linear_cross_entropy_backward_rows turns it into dlogits_c = (softmax - onehot) / count in place
// (the gradient for a loss gradient of 1), then dx_c = dlogits_c W (written), dW (+)= dlogits_c^T
// x_c (the first chunk writes, later ones accumulate: beta 1) and db (+)= the column sums, into the
// hidden outputs 2, 3 and 4, which the node saves. Backward multiplies them in place by the loss's
// gradient (nothing to do for the usual 1: x * 1 is x) and hands them on as the gradients. The
// logits are computed once per step, where a backward that recomputed them computed them twice
// (four GEMMs of (M, V, K) instead of three); what the node keeps is the size of x, W and b, as
// the backward's gradients were, and x itself is no longer saved. A backward's gradients are the
// bits the recomputing backward gave for a loss gradient of 1 (or a power of 2). Chunks run in a
// fixed order, so the result is the same bits every run.
// Working memory (all from the allocator, category workspace): one (chunk, V) logits buffer, M
// doubles, two scalars and, with a bias gradient and more than one chunk, V column sums. The GEMMs'
// own workspaces come on top, as for any GEMM.

namespace {

constexpr int64_t kAutoChunkBytes = 32ll << 20;

struct LceDims {
  int64_t M, K, V, chunk;
};
LceDims lce_dims(const Tensor& x, const Tensor& w, const LinearCrossEntropyAttrs& a) {
  const int64_t M = x.size(0);
  return {M, x.size(1), w.size(0), std::max<int64_t>(1, std::min(a.chunk_rows, M))};
}

bool lce_forward_grads(const LinearCrossEntropyAttrs& a) {
  return a.forward_dx || a.forward_dw || a.forward_db;
}

template <class T>
void lce_fwd(OpContext& c) {
  const Tensor &x = c.inputs[0], &w = c.inputs[1], &b = c.inputs[2], &targets = c.inputs[3];
  const LinearCrossEntropyAttrs& a = c.attr<LinearCrossEntropyAttrs>();
  const LceDims d = lce_dims(x, w, a);
  const Device dev = x.device();
  const bool want_dx = a.forward_dx, want_dw = a.forward_dw, want_db = a.has_bias && a.forward_db;
  Tensor loss = empty({}, x.dtype(), dev);
  Tensor lse = empty({d.M}, x.dtype(), dev);
  // The gradients' slots: an empty tensor where one is not computed (every slot is filled).
  Tensor dx = want_dx ? empty_like(x) : empty({0}, x.dtype(), dev);
  Tensor dw = want_dw ? empty_like(w) : empty({0}, x.dtype(), dev);
  Tensor db = want_db ? empty({d.V}, x.dtype(), dev) : empty({0}, x.dtype(), dev);
  const int64_t* t = targets.data<int64_t>();
  const bool grads = want_dx || want_dw || want_db;
  // Bad targets fail before any product is computed. With gradients to make, the same call forms
  // scale[0] = 1 / count on the device: linear_cross_entropy_scale of a unit loss gradient
  // (scale[1]).
  std::unique_ptr<Workspace> scale;
  if (grads) {
    scale = std::make_unique<Workspace>(dev, 2 * sizeof(T));
    REGEN_LAUNCH(dev, T, fill, scale->as<T>() + 1, 1, T(1));
  }
  REGEN_LAUNCH(dev, T, linear_cross_entropy_scale, grads ? scale->as<T>() + 1 : nullptr, t,
               grads ? scale->as<T>() : nullptr, d.M, d.V, a.ignore_index);
  if (d.M == 0) {  // no rows: the loss and every gradient are 0
    for (const Tensor& z : {loss, dx, dw, db}) {
      if (z.numel() > 0) REGEN_LAUNCH(dev, T, fill, z.data<T>(), z.numel(), T(0));
    }
    c.outputs = {loss, lse, dx, dw, db};
    return;
  }
  const T* bias = b.defined() ? b.data<T>() : nullptr;
  {
    Workspace row_loss(dev, static_cast<uint64_t>(d.M) * sizeof(double));
    Workspace logits(dev, static_cast<uint64_t>(d.chunk * d.V) * sizeof(T));
    std::unique_ptr<Workspace> colsum;
    if (want_db && d.chunk < d.M) colsum = std::make_unique<Workspace>(dev, d.V * sizeof(T));
    const int64_t tile = linear_cross_entropy_tile_rows(d.V, d.K);
    for (int64_t r0 = 0; r0 < d.M; r0 += d.chunk) {
      const int64_t rows = std::min(d.chunk, d.M - r0);
      const bool first = r0 == 0;
      T* l = logits.as<T>();
      // logits_c (rows, V) = x_c (rows, K) * W^T (K, V)
      REGEN_LAUNCH(dev, T, gemm, false, true, rows, d.V, d.K, T(1), x.data<T>() + r0 * d.K, d.K,
                   w.data<T>(), d.K, T(0), l, d.V);
      REGEN_LAUNCH(dev, T, linear_cross_entropy_forward_rows, l, bias, t + r0, lse.data<T>() + r0,
                   row_loss.as<double>() + r0, rows, d.V, a.ignore_index);
      if (!grads) continue;
      // dlogits_c in place; forward_rows added the bias already.
      REGEN_LAUNCH(dev, T, linear_cross_entropy_backward_rows, l, static_cast<const T*>(nullptr),
                   t + r0, lse.data<T>() + r0, scale->as<T>(), rows, d.V, a.ignore_index);
      // The products by vocabulary tiles: a GEMM packs its operands whole, and dW's, (V, rows),
      // would take as much memory as the chunk of logits.
      for (int64_t v0 = 0; v0 < d.V; v0 += tile) {
        const int64_t n = std::min(tile, d.V - v0);
        if (want_dx) {  // dx_c (rows, K) (+)= dlogits_c[:, tile] (rows, n) * W_t (n, K)
          REGEN_LAUNCH(dev, T, gemm, false, false, rows, d.K, n, T(1), l + v0, d.V,
                       w.data<T>() + v0 * d.K, d.K, v0 > 0 ? T(1) : T(0), dx.data<T>() + r0 * d.K,
                       d.K);
        }
        if (want_dw) {  // dW_t (n, K) (+)= dlogits_c[:, tile]^T (n, rows) * x_c (rows, K)
          REGEN_LAUNCH(dev, T, gemm, true, false, n, d.K, rows, T(1), l + v0, d.V,
                       x.data<T>() + r0 * d.K, d.K, first ? T(0) : T(1), dw.data<T>() + v0 * d.K,
                       d.K);
        }
      }
      if (want_db) {
        if (first) {
          REGEN_LAUNCH(dev, T, sum_rows, l, db.data<T>(), rows, d.V);
        } else {
          REGEN_LAUNCH(dev, T, sum_rows, l, colsum->as<T>(), rows, d.V);
          REGEN_LAUNCH(dev, T, add_inplace, db.data<T>(), colsum->as<T>(), d.V);
        }
      }
    }
    REGEN_LAUNCH(dev, T, linear_cross_entropy_forward_loss, row_loss.as<double>(), t,
                 loss.data<T>(), d.M, a.ignore_index);
  }
  c.outputs = {loss, lse, dx, dw, db};
}
void lce_forward_op(OpContext& c) {
  const LinearCrossEntropyAttrs& a = c.attr<LinearCrossEntropyAttrs>();
  const DType dt = c.inputs[0].dtype();
  REGEN_CHECK(!lce_forward_grads(a) || a.grad_dtype == dt, "linear_cross_entropy: ", dtype_name(dt),
              " inputs, yet the node was recorded for ", dtype_name(a.grad_dtype), " gradients");
  if (is_low_precision(dt)) return linear_cross_entropy_forward_lowp(c);
  REGEN_FLOATING(dt, "linear_cross_entropy", lce_fwd, c);
}

// The forward's gradients (unit loss gradient) times the loss's gradient, in place, handed on.
template <class T>
void lce_bwd(BackwardContext& c) {
  const LinearCrossEntropyAttrs& a = c.attr<LinearCrossEntropyAttrs>();
  const Tensor& dloss = c.grad_output(0);
  const Device dev = dloss.device();
  // A loss gradient of exactly 1 (loss.backward()) changes no bit: the CPU skips the products.
  const bool unit = dev.is_cpu() && !dry_run_active() && dloss.data<T>()[0] == T(1);
  const bool wanted[3] = {a.forward_dx, a.forward_dw, a.has_bias && a.forward_db};
  for (int i = 0; i < 3; ++i) {
    if (!wanted[i]) continue;
    Tensor g = c.saved_output(2 + i);
    if (!unit && g.numel() > 0) {
      REGEN_LAUNCH(dev, T, mul, g.data<T>(), dloss.data<T>(), g.data<T>(), g.numel(), 1);
    }
    // 16-bit inputs: their f32 sums, scaled, rounded once to the inputs' dtype.
    if (is_low_precision(a.grad_dtype)) g = linear_cross_entropy_round_lowp(g, a.grad_dtype);
    c.set_grad_input(i, g);
  }
}
void lce_backward_op(BackwardContext& c) {
  const LinearCrossEntropyAttrs& a = c.attr<LinearCrossEntropyAttrs>();
  if (!lce_forward_grads(a)) {
    const DType dt = c.saved_input(0).dtype();
    REGEN_CHECK(is_low_precision(dt) || dt == DType::f32,
                "linear_cross_entropy backward: ", c.saved_input(0).str(),
                " input, and the forward computed no gradient (the logits are recomputed for "
                "f32, bf16 and f16 only)");
    return linear_cross_entropy_backward_lowp(c);
  }
  REGEN_FLOATING(c.grad_output(0).dtype(), "linear_cross_entropy backward", lce_bwd, c);
}
void lce_saves(const AttrBlob& attrs, SaveList& s) {
  const LinearCrossEntropyAttrs& a = attrs.as<LinearCrossEntropyAttrs>();
  if (lce_forward_grads(a)) {
    if (a.forward_dx) s.output(2);
    if (a.forward_dw) s.output(3);
    if (a.has_bias && a.forward_db) s.output(4);
    return;
  }
  s.input(0).input(1);
  if (a.has_bias) s.input(2);
  s.input(3).output(1);
}
constexpr OpDef kLinearCrossEntropy{"linear_cross_entropy", 5,        1, false, lce_forward_op,
                                    lce_backward_op,        lce_saves};
REGEN_REGISTER_OP(linear_cross_entropy, kLinearCrossEntropy);
}  // namespace

int64_t linear_cross_entropy_auto_rows(int64_t M, int64_t V, int64_t elem_bytes) {
  REGEN_CHECK(M >= 0 && V > 0 && elem_bytes > 0, "linear_cross_entropy: bad sizes M=", M, " V=", V,
              " element bytes ", elem_bytes);
  if (M <= 1) return 1;
  const int64_t most = std::max<int64_t>(1, kAutoChunkBytes / (V * elem_bytes));
  const int64_t chunks = (M + most - 1) / most;
  return (M + chunks - 1) / chunks;  // <= most: the chunks differ by at most one row
}

Tensor linear_cross_entropy(const Tensor& x, const Tensor& weight, const Tensor& bias,
                            const Tensor& targets, int64_t ignore_index, int64_t chunk_rows,
                            bool recompute) {
  const char* op = "linear_cross_entropy";
  check_defined(op, x, "input");
  check_defined(op, weight, "weight");
  check_defined(op, targets, "targets");
  check_floating(op, x);
  check_same_dtype_or_autocast(op, x, weight);
  REGEN_CHECK(targets.dtype() == DType::i64, op, ": targets ", targets.str(), " must be i64");
  REGEN_CHECK(
      x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(1) && weight.size(0) > 0, op,
      ": input ", sh(x.shape()), " does not match weight ", sh(weight.shape()),
      " (expected (M, K) and (V, K) with V > 0)");
  REGEN_CHECK(targets.dim() == 1 && targets.size(0) == x.size(0), op, ": input ", sh(x.shape()),
              " and targets ", sh(targets.shape()), " do not match (expected (M, K) and (M))");
  if (bias.defined()) {
    check_same_dtype_or_autocast(op, x, bias);
    REGEN_CHECK(bias.shape() == Shape{weight.size(0)}, op, ": bias ", sh(bias.shape()),
                " does not match weight ", sh(weight.shape()), " (expected (V))");
  }
  REGEN_CHECK(chunk_rows >= 0, op, ": chunk_rows must be at least 1 (or 0 for automatic), got ",
              chunk_rows);
  LinearCrossEntropyAttrs a;
  a.ignore_index = ignore_index;
  a.has_bias = bias.defined();
  // The dtype the op computes in (autocast may hand it 16-bit inputs).
  DType compute = x.dtype();
  if (autocast_dtype() != DType::f32) {
    std::vector<DType> floating = {x.dtype(), weight.dtype()};
    if (bias.defined()) floating.push_back(bias.dtype());
    compute = compute_dtype(OpKind::linear_cross_entropy, autocast_dtype(), floating);
  }
  REGEN_CHECK(!recompute || compute != DType::f64, op,
              ": recompute (the logits again in backward) takes f32, bf16 and f16 inputs; f64 "
              "computes its gradients in the forward");
  // The gradients the forward computes: those of the inputs that require grad, when the op is
  // recorded (grad mode on) and does not recompute.
  if (grad_mode_enabled() && !recompute) {
    a.forward_dx = x.requires_grad();
    a.forward_dw = weight.requires_grad();
    a.forward_db = bias.defined() && bias.requires_grad();
    a.grad_dtype = compute;
  }
  // The chunk's logits are f32 for 16-bit inputs; bf16's forward gradients also round a chunk's
  // gradient to bf16 (2 bytes more per logit).
  const bool bf16_copy = compute == DType::bf16 && lce_forward_grads(a);
  a.chunk_rows = chunk_rows > 0
                     ? chunk_rows
                     : linear_cross_entropy_auto_rows(
                           x.size(0), weight.size(0),
                           is_low_precision(compute) ? (bf16_copy ? 6 : 4) : dtype_size(compute));
  return apply_op(OpKind::linear_cross_entropy, a, {x, weight, bias, targets})[0];
}

}  // namespace regen
