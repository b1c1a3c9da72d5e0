// concat, split and narrow: copies along one dimension through the slice_copy launcher
// (kernels/cpu/slice.cpp, kernels/cuda/slice.cu). A tensor of shape (..., d, ...) is viewed as
// (outer, d, inner) around the dimension, so one launcher serves every rank and dimension. Each op
// is the adjoint of another (concat's backward is a split of dy, split's a concat of the output
// gradients, narrow's writes dy into zeros), and none saves a tensor: backward needs only shapes,
// which are the attributes and the node's input values.
// Gradient checks: tests/test_gradcheck_shape.cpp; values and errors: tests/test_ops_shape.cpp.
#include <string>
#include <vector>

#include "regen/autograd/op_util.h"
#include "regen/autograd/precision.h"

namespace regen {
using namespace detail;

namespace {

// shape viewed as (outer, shape[dim], inner).
void outer_inner(const Shape& shape, int dim, int64_t& outer, int64_t& inner) {
  outer = 1;
  inner = 1;
  for (int d = 0; d < dim; ++d) outer *= shape[d];
  for (size_t d = static_cast<size_t>(dim) + 1; d < shape.size(); ++d) inner *= shape[d];
}

// Rows [x_start, x_start + len) of x (extent x_dim along dim) to [y_start, ...) of y (y_dim).
SliceShape slice(const Shape& x_shape, int dim, int64_t len, int64_t x_start, int64_t y_dim,
                 int64_t y_start) {
  SliceShape s;
  outer_inner(x_shape, dim, s.outer, s.inner);
  s.len = len;
  s.x_dim = x_shape[dim];
  s.x_start = x_start;
  s.y_dim = y_dim;
  s.y_start = y_start;
  return s;
}

const Shape& input_shape(const BackwardContext& c, int i) {
  return c.tape().value(c.node().inputs[static_cast<size_t>(i)]).shape;
}

// Resolves a possibly negative dim of a tensor of rank nd.
int resolve_dim(const char* op, int64_t dim, const Tensor& x) {
  const int64_t nd = x.dim();
  REGEN_CHECK(nd >= 1, op, ": input ", sh(x.shape()), " is a scalar; it has no dimension ", dim);
  REGEN_CHECK(dim >= -nd && dim < nd, op, ": dim ", dim, " out of range for input ", sh(x.shape()),
              " of ", nd, " dimensions");
  return static_cast<int>(dim < 0 ? dim + nd : dim);
}

// ---- concat -------------------------------------------------------------------------------------

template <class T>
void concat_fwd(OpContext& c) {
  const int dim = c.attr<ConcatAttrs>().dim;
  Shape ys = c.inputs[0].shape();
  int64_t total = 0;
  for (const Tensor& x : c.inputs) total += x.size(dim);
  ys[static_cast<size_t>(dim)] = total;
  Tensor y = empty(ys, c.inputs[0].dtype(), c.inputs[0].device());
  int64_t at = 0;
  for (const Tensor& x : c.inputs) {
    const int64_t len = x.size(dim);
    REGEN_LAUNCH(x.device(), T, slice_copy, x.data<T>(), y.data<T>(),
                 slice(x.shape(), dim, len, 0, total, at));
    at += len;
  }
  c.outputs = {y};
}
void concat_forward(OpContext& c) {
  REGEN_FLOATING_LOWP(c.inputs[0].dtype(), "concat", concat_fwd, c);
}

template <class T>
void concat_bwd(BackwardContext& c) {
  const int dim = c.attr<ConcatAttrs>().dim;
  const Tensor& dy = c.grad_output(0);
  const int n = static_cast<int>(c.node().inputs.size());
  int64_t at = 0;
  for (int i = 0; i < n; ++i) {
    const Shape& xs = input_shape(c, i);
    const int64_t len = xs[static_cast<size_t>(dim)];
    if (c.needs_grad(i)) {
      Tensor dx = empty(xs, dy.dtype(), dy.device());
      // dy's rows [at, at + len) become all of dx's.
      REGEN_LAUNCH(dy.device(), T, slice_copy, dy.data<T>(), dx.data<T>(),
                   slice(dy.shape(), dim, len, at, len, 0));
      c.set_grad_input(i, dx);
    }
    at += len;
  }
}
void concat_backward(BackwardContext& c) {
  REGEN_FLOATING_LOWP(c.grad_output(0).dtype(), "concat backward", concat_bwd, c);
}
constexpr OpDef kConcat{"concat", 1, 1, false, concat_forward, concat_backward, no_saves};
REGEN_REGISTER_OP(concat, kConcat);

// ---- split --------------------------------------------------------------------------------------

template <class T>
void split_fwd(OpContext& c) {
  const SplitAttrs& a = c.attr<SplitAttrs>();
  const Tensor& x = c.inputs[0];
  c.outputs.clear();
  int64_t at = 0;
  for (int k = 0; k < a.count; ++k) {
    Shape ys = x.shape();
    ys[static_cast<size_t>(a.dim)] = a.sizes[k];
    Tensor y = empty(ys, x.dtype(), x.device());
    REGEN_LAUNCH(x.device(), T, slice_copy, x.data<T>(), y.data<T>(),
                 slice(x.shape(), a.dim, a.sizes[k], at, a.sizes[k], 0));
    c.outputs.push_back(y);
    at += a.sizes[k];
  }
}
void split_forward(OpContext& c) {
  REGEN_FLOATING_LOWP(c.inputs[0].dtype(), "split", split_fwd, c);
}

template <class T>
void split_bwd(BackwardContext& c) {
  const SplitAttrs& a = c.attr<SplitAttrs>();
  const Shape& xs = input_shape(c, 0);
  // The pieces that received no gradient contribute zeros; the device is that of any gradient.
  const Tensor* any = nullptr;
  bool missing = false;
  for (int k = 0; k < a.count; ++k) {
    if (c.grad_output(k).defined()) {
      if (!any) any = &c.grad_output(k);
    } else {
      missing = true;
    }
  }
  if (!any) return;  // no piece received a gradient
  Tensor dx = empty(xs, any->dtype(), any->device());
  if (missing) REGEN_LAUNCH(dx.device(), T, fill, dx.data<T>(), dx.numel(), T(0));
  int64_t at = 0;
  for (int k = 0; k < a.count; ++k) {
    const Tensor& g = c.grad_output(k);
    if (g.defined()) {
      REGEN_LAUNCH(g.device(), T, slice_copy, g.data<T>(), dx.data<T>(),
                   slice(g.shape(), a.dim, a.sizes[k], 0, xs[static_cast<size_t>(a.dim)], at));
    }
    at += a.sizes[k];
  }
  c.set_grad_input(0, dx);
}
void split_backward(BackwardContext& c) {
  const SplitAttrs& a = c.attr<SplitAttrs>();
  DType dtype = c.tape().value(c.node().inputs[0]).dtype;  // each gradient has its value's
  for (int k = 0; k < a.count; ++k) {
    if (c.grad_output(k).defined()) dtype = c.grad_output(k).dtype();
  }
  REGEN_FLOATING_LOWP(dtype, "split backward", split_bwd, c);
}
constexpr OpDef kSplit{"split",       kVariableOutputs, kVariableOutputs, false,
                       split_forward, split_backward,   no_saves};
REGEN_REGISTER_OP(split, kSplit);

// ---- narrow -------------------------------------------------------------------------------------

template <class T>
void narrow_fwd(OpContext& c) {
  const NarrowAttrs& a = c.attr<NarrowAttrs>();
  const Tensor& x = c.inputs[0];
  Shape ys = x.shape();
  ys[static_cast<size_t>(a.dim)] = a.length;
  Tensor y = empty(ys, x.dtype(), x.device());
  REGEN_LAUNCH(x.device(), T, slice_copy, x.data<T>(), y.data<T>(),
               slice(x.shape(), a.dim, a.length, a.start, a.length, 0));
  c.outputs = {y};
}
void narrow_forward(OpContext& c) {
  REGEN_FLOATING_LOWP(c.inputs[0].dtype(), "narrow", narrow_fwd, c);
}

template <class T>
void narrow_bwd(BackwardContext& c) {
  const NarrowAttrs& a = c.attr<NarrowAttrs>();
  const Tensor& dy = c.grad_output(0);
  const Shape& xs = input_shape(c, 0);
  Tensor dx = empty(xs, dy.dtype(), dy.device());
  // Zeros, then dy into its rows: the rows outside are not contiguous, one fill is simplest.
  REGEN_LAUNCH(dy.device(), T, fill, dx.data<T>(), dx.numel(), T(0));
  REGEN_LAUNCH(dy.device(), T, slice_copy, dy.data<T>(), dx.data<T>(),
               slice(dy.shape(), a.dim, a.length, 0, xs[static_cast<size_t>(a.dim)], a.start));
  c.set_grad_input(0, dx);
}
void narrow_backward(BackwardContext& c) {
  REGEN_FLOATING_LOWP(c.grad_output(0).dtype(), "narrow backward", narrow_bwd, c);
}
constexpr OpDef kNarrow{"narrow", 1, 1, false, narrow_forward, narrow_backward, no_saves};
REGEN_REGISTER_OP(narrow, kNarrow);

std::string sizes_str(const std::vector<int64_t>& sizes) {
  std::string s = "(";
  for (size_t i = 0; i < sizes.size(); ++i) s += (i ? ", " : "") + std::to_string(sizes[i]);
  return s + ")";
}

}  // namespace

Tensor concat(const std::vector<Tensor>& tensors, int64_t dim) {
  REGEN_CHECK(!tensors.empty(), "concat: no tensors to join");
  for (size_t i = 0; i < tensors.size(); ++i) {
    check_defined("concat", tensors[i], ("tensor " + std::to_string(i)).c_str());
    check_floating("concat", tensors[i]);
  }
  const Tensor& first = tensors[0];
  const int d = resolve_dim("concat", dim, first);
  for (size_t i = 1; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    // Under autocast the pieces may differ: Tape::apply casts them (to f32 when they differ).
    if (autocast_dtype() == DType::f32) check_same_dtype("concat", first, t);
    bool match = t.dim() == first.dim();
    for (int64_t k = 0; match && k < first.dim(); ++k) match = k == d || t.size(k) == first.size(k);
    REGEN_CHECK(match, "concat: tensor ", i, " ", sh(t.shape()), " does not match tensor 0 ",
                sh(first.shape()), " outside dim ", dim);
  }
  ConcatAttrs a;
  a.dim = d;
  return apply_op(OpKind::concat, a, tensors)[0];
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  check_defined("split", x, "input");
  check_floating("split", x);
  const int d = resolve_dim("split", dim, x);
  REGEN_CHECK(!sizes.empty() && sizes.size() <= static_cast<size_t>(SplitAttrs::kMaxPieces),
              "split: ", sizes.size(), " pieces ", sizes_str(sizes), " of input ", sh(x.shape()),
              "; 1 to ", SplitAttrs::kMaxPieces, " are supported");
  int64_t total = 0;
  for (int64_t s : sizes) {
    REGEN_CHECK(s >= 0, "split: sizes ", sizes_str(sizes), " of input ", sh(x.shape()),
                " must be non-negative");
    total += s;
  }
  REGEN_CHECK(total == x.size(d), "split: sizes ", sizes_str(sizes), " sum to ", total,
              ", not to size ", x.size(d), " of dim ", dim, " of input ", sh(x.shape()));
  SplitAttrs a;
  a.dim = d;
  a.count = static_cast<int32_t>(sizes.size());
  for (size_t k = 0; k < sizes.size(); ++k) a.sizes[k] = sizes[k];
  return apply_op(OpKind::split, a, {x});
}

Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length) {
  check_defined("narrow", x, "input");
  check_floating("narrow", x);
  const int d = resolve_dim("narrow", dim, x);
  const int64_t size = x.size(d);
  REGEN_CHECK(start >= -size && start <= size, "narrow: start ", start, " out of range for size ",
              size, " of dim ", dim, " of input ", sh(x.shape()));
  const int64_t first = start < 0 ? start + size : start;
  REGEN_CHECK(length >= 0, "narrow: length ", length, " must be non-negative (input ",
              sh(x.shape()), ")");
  REGEN_CHECK(first + length <= size, "narrow: start ", start, " + length ", length,
              " exceeds size ", size, " of dim ", dim, " of input ", sh(x.shape()));
  NarrowAttrs a;
  a.dim = d;
  a.start = first;
  a.length = length;
  return apply_op(OpKind::narrow, a, {x})[0];
}

}  // namespace regen
