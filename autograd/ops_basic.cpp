// linear, matmul, bmm, add, mul, scale, reshape/flatten, sum, mean (relu and gelu: ops_unary.cpp).
// Each has a 16-bit path (bf16, f16; docs/precision.md) on the CPU and CUDA: GEMMs through the
// widening GEMM (f32 sums, C rounded once per element; kernels/cpu/gemm_lowp.h; cuBLAS's GemmEx on
// CUDA), element-wise ops computing each element in f32 and rounding it once, reductions summed
// wide and rounded once. sum and mean
// are fp32-class (autocast gives them f32), but called on a 16-bit tensor they return its dtype.
// Gradient checks: tests/test_gradcheck.cpp; 16-bit paths: tests/test_autocast.cpp.
#include "regen/autograd/op_util.h"
#include "regen/autograd/precision.h"
#include "regen/kernels/cpu/gemm_lowp.h"

namespace regen {
using namespace detail;

namespace {
// y = alpha * x, with alpha in f32 for the 16-bit types (a 16-bit alpha would be rounded).
template <class T>
void launch_scale(const Tensor& x, const Tensor& y, int64_t n, double alpha) {
  if constexpr (is_half_v<T>) {
    REGEN_LAUNCH(x.device(), T, scale_f32, x.data<T>(), y.data<T>(), n, static_cast<float>(alpha));
  } else {
    REGEN_LAUNCH(x.device(), T, scale, x.data<T>(), y.data<T>(), n, static_cast<T>(alpha));
  }
}
}  // namespace

ShapeAttr ShapeAttr::of(const Shape& s) {
  REGEN_CHECK(s.size() <= 8, "shapes of more than 8 dimensions are not supported: ", sh(s));
  ShapeAttr a;
  a.ndim = static_cast<int32_t>(s.size());
  for (size_t i = 0; i < s.size(); ++i) a.dims[i] = s[i];
  return a;
}

// ---- linear ---------------------------------------------------------------------------------

namespace {
template <class T>
void linear_fwd(OpContext& c) {
  const Tensor &x = c.inputs[0], &w = c.inputs[1], &b = c.inputs[2];
  const int64_t in = w.size(1), out = w.size(0), M = x.numel() / in;
  Shape ys = x.shape();
  ys.back() = out;
  Tensor y = empty(ys, x.dtype(), x.device());
  if constexpr (is_half_v<T>) {
    if (b.defined()) {
      // y = round(x w^T + b): the bias added in f32 before the one rounding of each element.
      if (x.device().is_cpu()) {
        constexpr DType dt = dtype_of<T>::value;
        cpu::gemm_lowp_store(false, true, M, out, in, dt, x.data<T>(), in, dt, w.data<T>(), in,
                             1.0f, 0.0f, b.dtype(), b.data<T>(), dt, y.data<T>(), out);
      } else {
        // CUDA: every row of y holds the bias (0 + b, exact), then the GEMM with beta = 1 adds it
        // to the f32 sums (cuBLAS's f32 epilogue, CUBLAS_COMPUTE_32F) before its one rounding.
        const Device dev = x.device();
        REGEN_LAUNCH(dev, T, fill, y.data<T>(), M * out, T(0.0f));
        REGEN_LAUNCH(dev, T, add, y.data<T>(), b.data<T>(), y.data<T>(), M * out, out);
        REGEN_LAUNCH(dev, T, gemm, false, true, M, out, in, T(1.0f), x.data<T>(), in, w.data<T>(),
                     in, T(1.0f), y.data<T>(), out);
      }
      c.outputs = {y};
      return;
    }
  }
  // y (M, out) = x (M, in) * w^T (in, out)
  REGEN_LAUNCH(x.device(), T, gemm, false, true, M, out, in, T(1), x.data<T>(), in, w.data<T>(), in,
               T(0), y.data<T>(), out);
  if (b.defined()) {
    REGEN_LAUNCH(x.device(), T, add, y.data<T>(), b.data<T>(), y.data<T>(), M * out, out);
  }
  c.outputs = {y};
}
void linear_forward(OpContext& c) {
  REGEN_FLOATING_LOWP(c.inputs[0].dtype(), "linear", linear_fwd, c);
}

template <class T>
void linear_bwd(BackwardContext& c) {
  const Tensor x = c.saved_input(0), w = c.saved_input(1);
  const Tensor& dy = c.grad_output(0);
  const int64_t in = w.size(1), out = w.size(0), M = x.numel() / in;
  const Device dev = dy.device();
  if (c.needs_grad(0)) {
    Tensor dx = empty_like(x);  // dx (M, in) = dy (M, out) * w (out, in)
    REGEN_LAUNCH(dev, T, gemm, false, false, M, in, out, T(1), dy.data<T>(), out, w.data<T>(), in,
                 T(0), dx.data<T>(), in);
    c.set_grad_input(0, dx);
  }
  if (c.needs_grad(1)) {
    Tensor dw = empty_like(w);  // dw (out, in) = dy^T (out, M) * x (M, in)
    REGEN_LAUNCH(dev, T, gemm, true, false, out, in, M, T(1), dy.data<T>(), out, x.data<T>(), in,
                 T(0), dw.data<T>(), in);
    c.set_grad_input(1, dw);
  }
  if (c.needs_grad(2)) {
    Tensor db = empty({out}, dy.dtype(), dev);
    REGEN_LAUNCH(dev, T, sum_rows, dy.data<T>(), db.data<T>(), M, out);
    c.set_grad_input(2, db);
  }
}
void linear_backward(BackwardContext& c) {
  REGEN_FLOATING_LOWP(c.grad_output(0).dtype(), "linear backward", linear_bwd, c);
}
void linear_saves(const AttrBlob&, SaveList& s) {
  s.input(0).input(1);
}
constexpr OpDef kLinear{"linear", 1, 1, false, linear_forward, linear_backward, linear_saves};
REGEN_REGISTER_OP(linear, kLinear);
}  // namespace

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  check_defined("linear", x, "input");
  check_defined("linear", weight, "weight");
  check_floating("linear", x);
  check_same_dtype_or_autocast("linear", x, weight);
  REGEN_CHECK(weight.dim() == 2 && x.dim() >= 1 && x.size(-1) == weight.size(1), "linear: input ",
              sh(x.shape()), " does not match weight ", sh(weight.shape()),
              " (expected (..., in) and (out, in))");
  if (bias.defined()) {
    check_same_dtype_or_autocast("linear", x, bias);
    REGEN_CHECK(bias.shape() == Shape{weight.size(0)}, "linear: bias ", sh(bias.shape()),
                " does not match weight ", sh(weight.shape()));
  }
  return apply_op(OpKind::linear, LinearAttrs{bias.defined()}, {x, weight, bias})[0];
}

// ---- matmul / bmm ---------------------------------------------------------------------------

namespace {
// Stored shapes: a is (B, M, K) or (B, K, M) when trans_a; b is (B, K, N) or (B, N, K).
struct BmmDims {
  int64_t B, M, N, K, lda, ldb;
};
BmmDims bmm_dims(const Tensor& a, const Tensor& b, const BmmAttrs& at) {
  BmmDims d;
  d.B = a.dim() == 3 ? a.size(0) : 1;
  d.M = at.trans_a ? a.size(-1) : a.size(-2);
  d.K = at.trans_a ? a.size(-2) : a.size(-1);
  d.N = at.trans_b ? b.size(-2) : b.size(-1);
  d.lda = a.size(-1);
  d.ldb = b.size(-1);
  return d;
}

template <class T>
void bmm_fwd(OpContext& c) {
  const Tensor &a = c.inputs[0], &b = c.inputs[1];
  const BmmAttrs& at = c.attr<BmmAttrs>();
  const BmmDims d = bmm_dims(a, b, at);
  Tensor y = a.dim() == 3 ? empty({d.B, d.M, d.N}, a.dtype(), a.device())
                          : empty({d.M, d.N}, a.dtype(), a.device());
  REGEN_LAUNCH(a.device(), T, gemm_batched, at.trans_a, at.trans_b, d.B, d.M, d.N, d.K, T(1),
               a.data<T>(), d.lda, d.M * d.K, b.data<T>(), d.ldb, d.K * d.N, T(0), y.data<T>(), d.N,
               d.M * d.N);
  c.outputs = {y};
}
void bmm_forward(OpContext& c) {
  REGEN_FLOATING_LOWP(c.inputs[0].dtype(), "bmm", bmm_fwd, c);
}

template <class T>
void bmm_bwd(BackwardContext& c) {
  const Tensor a = c.saved_input(0), b = c.saved_input(1);
  const Tensor& dy = c.grad_output(0);
  const BmmAttrs& at = c.attr<BmmAttrs>();
  const BmmDims d = bmm_dims(a, b, at);
  const Device dev = dy.device();
  const int64_t sa = d.M * d.K, sb = d.K * d.N, sy = d.M * d.N;
  if (c.needs_grad(0)) {
    Tensor da = empty_like(a);
    if (!at.trans_a) {  // da (M, K) = dy (M, N) * op(b)^T
      REGEN_LAUNCH(dev, T, gemm_batched, false, !at.trans_b, d.B, d.M, d.K, d.N, T(1), dy.data<T>(),
                   d.N, sy, b.data<T>(), d.ldb, sb, T(0), da.data<T>(), d.K, sa);
    } else {  // da stored (K, M) = op(b) * dy^T
      REGEN_LAUNCH(dev, T, gemm_batched, at.trans_b, true, d.B, d.K, d.M, d.N, T(1), b.data<T>(),
                   d.ldb, sb, dy.data<T>(), d.N, sy, T(0), da.data<T>(), d.M, sa);
    }
    c.set_grad_input(0, da);
  }
  if (c.needs_grad(1)) {
    Tensor db = empty_like(b);
    if (!at.trans_b) {  // db (K, N) = op(a)^T * dy
      REGEN_LAUNCH(dev, T, gemm_batched, !at.trans_a, false, d.B, d.K, d.N, d.M, T(1), a.data<T>(),
                   d.lda, sa, dy.data<T>(), d.N, sy, T(0), db.data<T>(), d.N, sb);
    } else {  // db stored (N, K) = dy^T * op(a)
      REGEN_LAUNCH(dev, T, gemm_batched, true, at.trans_a, d.B, d.N, d.K, d.M, T(1), dy.data<T>(),
                   d.N, sy, a.data<T>(), d.lda, sa, T(0), db.data<T>(), d.K, sb);
    }
    c.set_grad_input(1, db);
  }
}
void bmm_backward(BackwardContext& c) {
  REGEN_FLOATING_LOWP(c.grad_output(0).dtype(), "bmm backward", bmm_bwd, c);
}
void bmm_saves(const AttrBlob&, SaveList& s) {
  s.input(0).input(1);
}
constexpr OpDef kBmm{"bmm", 1, 1, false, bmm_forward, bmm_backward, bmm_saves};
constexpr OpDef kMatmul{"matmul", 1, 1, false, bmm_forward, bmm_backward, bmm_saves};
REGEN_REGISTER_OP(bmm, kBmm);
REGEN_REGISTER_OP(matmul, kMatmul);
}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
  check_defined("matmul", a, "a");
  check_defined("matmul", b, "b");
  check_floating("matmul", a);
  check_same_dtype_or_autocast("matmul", a, b);
  REGEN_CHECK(a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(0), "matmul: shapes ",
              sh(a.shape()), " and ", sh(b.shape()), " do not multiply (expected (M, K), (K, N))");
  return apply_op(OpKind::matmul, BmmAttrs{}, {a, b})[0];
}

Tensor bmm(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  check_defined("bmm", a, "a");
  check_defined("bmm", b, "b");
  check_floating("bmm", a);
  check_same_dtype_or_autocast("bmm", a, b);
  REGEN_CHECK(a.dim() == 3 && b.dim() == 3 && a.size(0) == b.size(0), "bmm: shapes ", sh(a.shape()),
              " and ", sh(b.shape()), " are not batches of equal count");
  const BmmAttrs at{trans_a, trans_b};
  const BmmDims d = bmm_dims(a, b, at);
  const int64_t kb = trans_b ? b.size(2) : b.size(1);
  REGEN_CHECK(d.K == kb, "bmm: shapes ", sh(a.shape()), (trans_a ? "^T" : ""), " and ",
              sh(b.shape()), (trans_b ? "^T" : ""), " do not multiply");
  return apply_op(OpKind::bmm, at, {a, b})[0];
}

// ---- add / mul / scale ----------------------------------------------------------------------

namespace {
// b must equal a's shape or a suffix of it.
void check_broadcast(const char* op, const Tensor& a, const Tensor& b) {
  check_defined(op, a, "a");
  check_defined(op, b, "b");
  check_floating(op, a);
  check_same_dtype_or_autocast(op, a, b);
  bool ok = b.dim() <= a.dim();
  for (int64_t i = 1; ok && i <= b.dim(); ++i) ok = a.size(-i) == b.size(-i);
  REGEN_CHECK(ok, op, ": shapes ", sh(a.shape()), " and ", sh(b.shape()),
              " do not broadcast (the second must match a suffix of the first)");
}

// Sum of g over the leading dims it was broadcast along, shaped like `like`.
template <class T>
Tensor reduce_to(const Tensor& g, const Shape& like) {
  const int64_t nb = shape_numel(like);
  if (nb == g.numel()) return g.reshape(like);
  Tensor r = empty(like, g.dtype(), g.device());
  REGEN_LAUNCH(g.device(), T, sum_rows, g.data<T>(), r.data<T>(), g.numel() / nb, nb);
  return r;
}

template <class T>
void add_fwd(OpContext& c) {
  const Tensor &a = c.inputs[0], &b = c.inputs[1];
  Tensor y = empty_like(a);
  REGEN_LAUNCH(a.device(), T, add, a.data<T>(), b.data<T>(), y.data<T>(), a.numel(), b.numel());
  c.outputs = {y};
}
void add_forward_op(OpContext& c) {
  REGEN_FLOATING_LOWP(c.inputs[0].dtype(), "add", add_fwd, c);
}
template <class T>
void add_bwd(BackwardContext& c) {
  const Tensor& dy = c.grad_output(0);
  if (c.needs_grad(0)) c.set_grad_input(0, dy);
  if (c.needs_grad(1)) {
    const Shape& bs = c.tape().value(c.node().inputs[1]).shape;
    c.set_grad_input(1, reduce_to<T>(dy, bs));
  }
}
void add_backward_op(BackwardContext& c) {
  REGEN_FLOATING_LOWP(c.grad_output(0).dtype(), "add backward", add_bwd, c);
}
constexpr OpDef kAdd{"add", 1, 1, false, add_forward_op, add_backward_op, no_saves};
REGEN_REGISTER_OP(add, kAdd);

template <class T>
void mul_fwd(OpContext& c) {
  const Tensor &a = c.inputs[0], &b = c.inputs[1];
  Tensor y = empty_like(a);
  REGEN_LAUNCH(a.device(), T, mul, a.data<T>(), b.data<T>(), y.data<T>(), a.numel(), b.numel());
  c.outputs = {y};
}
void mul_forward_op(OpContext& c) {
  REGEN_FLOATING_LOWP(c.inputs[0].dtype(), "mul", mul_fwd, c);
}
template <class T>
void mul_bwd(BackwardContext& c) {
  const Tensor a = c.saved_input(0), b = c.saved_input(1);
  const Tensor& dy = c.grad_output(0);
  if (c.needs_grad(0)) {
    Tensor da = empty_like(a);  // da = dy * b (b broadcast)
    REGEN_LAUNCH(dy.device(), T, mul, dy.data<T>(), b.data<T>(), da.data<T>(), a.numel(),
                 b.numel());
    c.set_grad_input(0, da);
  }
  if (c.needs_grad(1)) {
    // db = reduce(dy * a); in 16 bits each product is rounded before the sum, as PyTorch's is.
    Tensor prod = empty_like(a);
    REGEN_LAUNCH(dy.device(), T, mul, dy.data<T>(), a.data<T>(), prod.data<T>(), a.numel(),
                 a.numel());
    c.set_grad_input(1, reduce_to<T>(prod, b.shape()));
  }
}
void mul_backward_op(BackwardContext& c) {
  REGEN_FLOATING_LOWP(c.grad_output(0).dtype(), "mul backward", mul_bwd, c);
}
void mul_saves(const AttrBlob&, SaveList& s) {
  s.input(0).input(1);
}
constexpr OpDef kMul{"mul", 1, 1, false, mul_forward_op, mul_backward_op, mul_saves};
REGEN_REGISTER_OP(mul, kMul);

template <class T>
void scale_fwd(OpContext& c) {
  const Tensor& x = c.inputs[0];
  Tensor y = empty_like(x);
  launch_scale<T>(x, y, x.numel(), c.attr<ScaleAttrs>().alpha);
  c.outputs = {y};
}
void scale_forward_op(OpContext& c) {
  REGEN_FLOATING_LOWP(c.inputs[0].dtype(), "scale", scale_fwd, c);
}
template <class T>
void scale_bwd(BackwardContext& c) {
  const Tensor& dy = c.grad_output(0);
  Tensor dx = empty_like(dy);
  launch_scale<T>(dy, dx, dy.numel(), c.attr<ScaleAttrs>().alpha);
  c.set_grad_input(0, dx);
}
void scale_backward_op(BackwardContext& c) {
  REGEN_FLOATING_LOWP(c.grad_output(0).dtype(), "scale backward", scale_bwd, c);
}
constexpr OpDef kScale{"scale", 1, 1, false, scale_forward_op, scale_backward_op, no_saves};
REGEN_REGISTER_OP(scale, kScale);
}  // namespace

Tensor add(const Tensor& a, const Tensor& b) {
  check_broadcast("add", a, b);
  return apply_op(OpKind::add, NoAttrs{}, {a, b})[0];
}

Tensor mul(const Tensor& a, const Tensor& b) {
  check_broadcast("mul", a, b);
  return apply_op(OpKind::mul, NoAttrs{}, {a, b})[0];
}

Tensor scale(const Tensor& x, double alpha) {
  check_defined("scale", x, "input");
  check_floating("scale", x);
  return apply_op(OpKind::scale, ScaleAttrs{alpha}, {x})[0];
}

// ---- reshape / flatten ----------------------------------------------------------------------

namespace {
void reshape_forward(OpContext& c) {
  c.outputs = {c.inputs[0].reshape(c.attr<ShapeAttr>().shape())};
}
void reshape_backward(BackwardContext& c) {
  const Shape& xs = c.tape().value(c.node().inputs[0]).shape;
  c.set_grad_input(0, c.grad_output(0).reshape(xs));
}
constexpr OpDef kReshape{"reshape", 1, 1, true, reshape_forward, reshape_backward, no_saves};
REGEN_REGISTER_OP(reshape, kReshape);
}  // namespace

Tensor reshape(const Tensor& x, const Shape& shape) {
  check_defined("reshape", x, "input");
  // Resolve -1 and validate now, so the node stores the concrete shape.
  const Shape target = x.reshape(shape).shape();
  if (!x.requires_grad() || !grad_mode_enabled()) return x.reshape(target);
  return apply_op(OpKind::reshape, ShapeAttr::of(target), {x})[0];
}

Tensor flatten(const Tensor& x, int64_t start_dim) {
  check_defined("flatten", x, "input");
  const int64_t nd = x.dim();
  if (start_dim < 0) start_dim += nd;
  REGEN_CHECK(start_dim >= 0 && start_dim < std::max<int64_t>(nd, 1), "flatten: start_dim ",
              start_dim, " out of range for ", sh(x.shape()));
  Shape s(x.shape().begin(), x.shape().begin() + start_dim);
  int64_t rest = 1;
  for (int64_t i = start_dim; i < nd; ++i) rest *= x.size(i);
  s.push_back(rest);
  return reshape(x, s);
}

// ---- sum / mean -----------------------------------------------------------------------------

namespace {
template <class T>
void sum_fwd(OpContext& c) {
  const Tensor& x = c.inputs[0];
  Tensor y = empty({}, x.dtype(), x.device());
  REGEN_LAUNCH(x.device(), T, sum_all, x.data<T>(), y.data<T>(), x.numel());
  // A 16-bit mean rounds twice: the sum, then the scaled sum (autocast gives sum and mean f32).
  if (c.attr<ScaleAttrs>().alpha != 1.0) launch_scale<T>(y, y, 1, c.attr<ScaleAttrs>().alpha);
  c.outputs = {y};
}
void sum_forward_op(OpContext& c) {
  REGEN_FLOATING_LOWP(c.inputs[0].dtype(), "sum", sum_fwd, c);
}
template <class T>
void sum_bwd(BackwardContext& c) {
  const Tensor& dy = c.grad_output(0);
  const Shape& xs = c.tape().value(c.node().inputs[0]).shape;
  Tensor dx = empty(xs, dy.dtype(), dy.device());
  if constexpr (is_half_v<T>) {  // the factor in f32 (a 16-bit 1/n would be rounded)
    REGEN_LAUNCH(dy.device(), T, fill_from_scalar_f32, dy.data<T>(), dx.data<T>(), dx.numel(),
                 static_cast<float>(c.attr<ScaleAttrs>().alpha));
  } else {
    REGEN_LAUNCH(dy.device(), T, fill_from_scalar, dy.data<T>(), dx.data<T>(), dx.numel(),
                 static_cast<T>(c.attr<ScaleAttrs>().alpha));
  }
  c.set_grad_input(0, dx);
}
void sum_backward_op(BackwardContext& c) {
  REGEN_FLOATING_LOWP(c.grad_output(0).dtype(), "sum backward", sum_bwd, c);
}
constexpr OpDef kSum{"sum", 1, 1, false, sum_forward_op, sum_backward_op, no_saves};
constexpr OpDef kMean{"mean", 1, 1, false, sum_forward_op, sum_backward_op, no_saves};
REGEN_REGISTER_OP(sum, kSum);
REGEN_REGISTER_OP(mean, kMean);
}  // namespace

Tensor sum(const Tensor& x) {
  check_defined("sum", x, "input");
  check_floating("sum", x);
  return apply_op(OpKind::sum, ScaleAttrs{1.0}, {x})[0];
}

Tensor mean(const Tensor& x) {
  check_defined("mean", x, "input");
  check_floating("mean", x);
  REGEN_CHECK(x.numel() > 0, "mean: empty tensor ", x.str());
  return apply_op(OpKind::mean, ScaleAttrs{1.0 / static_cast<double>(x.numel())}, {x})[0];
}

}  // namespace regen
