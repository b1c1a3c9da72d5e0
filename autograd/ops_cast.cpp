// cast: a tensor converted to another floating dtype (f32, f64, bf16, f16), the op autocast
// records in front of an op whose precision rule (autograd/precision.cpp) asks for other dtypes
// than its inputs have. Its output is a tape value like any op's: the 16-bit copy a low-class op
// saves is the cast's output, which the planner sees and may evict and recompute. Backward casts
// the gradient back to the input's dtype (a master weight's gradient is f32). The conversions are
// kernels/cpu/convert.h's (bitwise core/half.h's rounding). Tests: tests/test_autocast.cpp, the
// op table's row (tests/op_table.h).
#include "regen/autograd/op_util.h"
#include "regen/kernels/cpu/convert.h"

namespace regen {

#ifdef REGEN_WITH_CUDA
namespace cuda {
// kernels/cuda/cast.cu: the same conversion as cpu::cast (kernels/cpu/convert.h), on the device.
void cast(const void* x, DType from, void* y, DType to, int64_t n);
}  // namespace cuda
#endif

using namespace detail;

namespace {

struct CastAttrs {
  DType to = DType::f32;
};

// y (n, dtype `to`) = x (n, dtype `from`) on x's device. No scratch: in a dry run nothing runs.
void convert(const Tensor& x, const Tensor& y) {
  const Device dev = x.device();
  if (dry_run_active()) return;
  if (dev.is_cpu()) {
    cpu::cast(x.raw_data(), x.dtype(), y.raw_data(), y.dtype(), x.numel());
    return;
  }
#ifdef REGEN_WITH_CUDA
  kernels::use_device(dev);
  cuda::cast(x.raw_data(), x.dtype(), y.raw_data(), y.dtype(), x.numel());
  kernels::after_cuda_launcher("cast");
#else
  kernels::unsupported("cast", dev, x.dtype());
#endif
}

void cast_forward(OpContext& c) {
  const Tensor& x = c.inputs[0];
  Tensor y = empty(x.shape(), c.attr<CastAttrs>().to, x.device());
  convert(x, y);
  c.outputs = {y};
}

void cast_backward(BackwardContext& c) {
  const Tensor& dy = c.grad_output(0);
  const DType from = c.tape().value(c.node().inputs[0]).dtype;
  Tensor dx = empty(dy.shape(), from, dy.device());
  convert(dy, dx);
  c.set_grad_input(0, dx);
}

constexpr OpDef kCast{"cast", 1, 1, false, cast_forward, cast_backward, no_saves};
REGEN_REGISTER_OP(cast, kCast);

}  // namespace

Tensor cast(const Tensor& x, DType dtype) {
  check_defined("cast", x, "input");
  REGEN_CHECK(is_floating(x.dtype()) && is_floating(dtype), "cast: from ", x.str(), " to ",
              dtype_name(dtype), " (casts are between f32, f64, bf16 and f16)");
  if (x.dtype() == dtype) return x;
  return apply_op(OpKind::cast, CastAttrs{dtype}, {x})[0];
}

}  // namespace regen
