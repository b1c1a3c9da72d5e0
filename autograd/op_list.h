// The op list: every op kind, once. Included only where ops are defined (autograd/ops_*.cpp,
// autograd/op_registry.cpp) and tested (tests/): the rest of the library sees OpKind as an opaque
// enum (autograd/tape.h) and names ops at run time (op_name, op_kind_by_name, num_op_kinds), so
// adding an op recompiles autograd, kernels and tests only. docs/ops.md says what a new op needs.
#pragma once

#include <cstdint>

#include "regen/autograd/tape.h"
#include "regen/kernels/unary_ops.h"

namespace regen {

// REGEN_OPS(X) expands X(name) per op, in OpKind order. The enum, the name table (op_name) and the
// count all come from this list, so they cannot disagree. Profiles store op names, never these
// numbers, so the order is free.
// The unary element-wise ops come from their own list, REGEN_UNARY_OPS (kernels/unary_ops.h).
// clang-format off
#define REGEN_OPS(X) \
  X(linear) X(matmul) X(bmm) X(conv2d) X(batchnorm2d) X(add) X(mul) \
  X(scale) X(max_pool2d) X(avg_pool2d) X(global_avg_pool) X(reshape) X(transpose) \
  X(permute) X(embedding) X(layernorm) X(softmax) X(attention) X(dropout) X(cross_entropy) \
  X(sum) X(mean) X(linear_cross_entropy) X(concat) X(split) X(narrow) X(upsample2x) \
  X(conv_transpose2d) REGEN_UNARY_OPS(X)

enum class OpKind : uint16_t {
#define REGEN_OP_ENUM(name) name,
  REGEN_OPS(REGEN_OP_ENUM)
#undef REGEN_OP_ENUM
  count_,
};
// clang-format on
constexpr int kNumOpKinds = static_cast<int>(OpKind::count_);
static_assert(kNumOpKinds < static_cast<int>(kNoOpKind), "kNoOpKind must stay outside the list");

}  // namespace regen
