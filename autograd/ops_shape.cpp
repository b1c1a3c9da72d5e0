// transpose and permute: copies through cpu::permute (tensors are always contiguous), up to 6
// dimensions. Backward is the inverse permutation; nothing is saved.
// Gradient checks: tests/test_gradcheck_vision.cpp; values and errors: tests/test_ops_vision.cpp.
#include <string>
#include <vector>

#include "regen/autograd/op_util.h"

namespace regen {
using namespace detail;

namespace {
constexpr int kMaxPermuteDims = 6;

PermuteShape permute_shape(const Shape& in, const PermuteAttrs& a) {
  PermuteShape s;
  s.ndim = a.ndim;
  for (int d = 0; d < a.ndim; ++d) {
    s.shape[d] = in[d];
    s.perm[d] = a.perm[d];
  }
  return s;
}

template <class T>
void permute_fwd(OpContext& c) {
  const Tensor& x = c.inputs[0];
  const PermuteAttrs& a = c.attr<PermuteAttrs>();
  Shape ys(static_cast<size_t>(a.ndim));
  for (int d = 0; d < a.ndim; ++d) ys[d] = x.size(a.perm[d]);
  Tensor y = empty(ys, x.dtype(), x.device());
  REGEN_LAUNCH(x.device(), T, permute, x.data<T>(), y.data<T>(), permute_shape(x.shape(), a));
  c.outputs = {y};
}
void permute_forward(OpContext& c) {
  REGEN_FLOATING_LOWP(c.inputs[0].dtype(), "permute", permute_fwd, c);
}

template <class T>
void permute_bwd(BackwardContext& c) {
  const Tensor& dy = c.grad_output(0);
  const PermuteAttrs& a = c.attr<PermuteAttrs>();
  PermuteAttrs inverse;
  inverse.ndim = a.ndim;
  for (int d = 0; d < a.ndim; ++d) inverse.perm[a.perm[d]] = d;
  const Shape& xs = c.tape().value(c.node().inputs[0]).shape;
  Tensor dx = empty(xs, dy.dtype(), dy.device());
  REGEN_LAUNCH(dy.device(), T, permute, dy.data<T>(), dx.data<T>(),
               permute_shape(dy.shape(), inverse));
  c.set_grad_input(0, dx);
}
void permute_backward(BackwardContext& c) {
  REGEN_FLOATING_LOWP(c.grad_output(0).dtype(), "permute backward", permute_bwd, c);
}
constexpr OpDef kPermute{"permute", 1, 1, false, permute_forward, permute_backward, no_saves};
constexpr OpDef kTranspose{"transpose", 1, 1, false, permute_forward, permute_backward, no_saves};
REGEN_REGISTER_OP(permute, kPermute);
REGEN_REGISTER_OP(transpose, kTranspose);

std::string dims_str(const std::vector<int64_t>& dims) {
  std::string s = "(";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + ")";
}

Tensor apply_permute(OpKind kind, const char* op, const Tensor& x,
                     const std::vector<int64_t>& dims) {
  check_floating(op, x);
  PermuteAttrs a;
  a.ndim = static_cast<int32_t>(dims.size());
  for (size_t d = 0; d < dims.size(); ++d) a.perm[d] = dims[d];
  return apply_op(kind, a, {x})[0];
}
}  // namespace

Tensor permute(const Tensor& x, const std::vector<int64_t>& dims) {
  check_defined("permute", x, "input");
  const int64_t nd = x.dim();
  REGEN_CHECK(nd <= kMaxPermuteDims, "permute: input ", sh(x.shape()), " has ", nd,
              " dimensions; at most ", kMaxPermuteDims, " are supported");
  REGEN_CHECK(static_cast<int64_t>(dims.size()) == nd, "permute: dims ", dims_str(dims),
              " do not match input ", sh(x.shape()), " of ", nd, " dimensions");
  std::vector<int64_t> resolved(dims);
  std::vector<bool> seen(static_cast<size_t>(nd), false);
  for (int64_t& d : resolved) {
    if (d < 0) d += nd;
    REGEN_CHECK(d >= 0 && d < nd && !seen[static_cast<size_t>(d)], "permute: dims ", dims_str(dims),
                " are not a permutation of the dimensions of input ", sh(x.shape()));
    seen[static_cast<size_t>(d)] = true;
  }
  return apply_permute(OpKind::permute, "permute", x, resolved);
}

Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1) {
  check_defined("transpose", x, "input");
  const int64_t nd = x.dim();
  REGEN_CHECK(nd <= kMaxPermuteDims, "transpose: input ", sh(x.shape()), " has ", nd,
              " dimensions; at most ", kMaxPermuteDims, " are supported");
  const int64_t d0 = dim0 < 0 ? dim0 + nd : dim0, d1 = dim1 < 0 ? dim1 + nd : dim1;
  REGEN_CHECK(d0 >= 0 && d0 < nd && d1 >= 0 && d1 < nd, "transpose: dims ", dim0, " and ", dim1,
              " out of range for input ", sh(x.shape()));
  std::vector<int64_t> perm(static_cast<size_t>(nd));
  for (int64_t d = 0; d < nd; ++d) perm[d] = d;
  std::swap(perm[d0], perm[d1]);
  return apply_permute(OpKind::transpose, "transpose", x, perm);
}

}  // namespace regen
