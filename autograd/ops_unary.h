// The unary element-wise ops of the list in kernels/unary_ops.h, as differentiable functions:
// `Tensor name(const Tensor& x)` for every entry of REGEN_UNARY_OPS (relu, gelu, ...), defined by
// one template in autograd/ops_unary.cpp. Each saves one tensor, its input or its output, as its
// functor's `reads` says. A program that calls an op added to the list includes this header;
// relu and gelu are also declared in autograd/ops.h. Tests: the op table (tests/op_table.h).
#pragma once

#include "regen/autograd/tape.h"
#include "regen/kernels/unary_ops.h"

namespace regen {

#define REGEN_UNARY_DECLARE(name) Tensor name(const Tensor& x);
REGEN_UNARY_OPS(REGEN_UNARY_DECLARE)
#undef REGEN_UNARY_DECLARE

}  // namespace regen
