// The op list: every op kind, once. Included only where ops are defined (autograd/ops_*.cpp,
// autograd/op_registry.cpp) and tested (tests/): the rest of the library sees OpKind as an opaque
// enum (autograd/tape.h) and names ops at run time (op_name, op_kind_by_name, num_op_kinds), so
// adding a unary op recompiles autograd, kernels and tests only; another op's entry stands beside
// its declaration in autograd/ops.h, whose includers recompile for the declaration anyway.
// docs/ops.md says what a new op needs.
#pragma once

#include <cstdint>

#include "regen/autograd/ops.h"
#include "regen/autograd/tape.h"
#include "regen/kernels/unary_ops.h"

namespace regen {

// REGEN_OPS(X) expands X(name) per op, in OpKind order. The enum, the name table (op_name) and the
// count all come from this list, so they cannot disagree. Profiles store op names, never these
// numbers, so the order is free.
// Its entries stand beside the ops' functions: REGEN_DECLARED_OPS (autograd/ops.h) for the ops
// declared there, then the unary element-wise ops' own list, REGEN_UNARY_OPS (kernels/unary_ops.h).
// clang-format off
#define REGEN_OPS(X) REGEN_DECLARED_OPS(X) REGEN_UNARY_OPS(X)

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
