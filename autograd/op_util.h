// Helpers shared by the op implementations (autograd/ops_*.cpp). Not part of the public API.
#pragma once

#include <string>

#include "regen/autograd/op_list.h"
#include "regen/autograd/ops.h"
#include "regen/kernels/kernels.h"

namespace regen::detail {

// Registers an OpDef at static initialization; the op's object file defines it next to the
// user-facing function, so whatever records the op links its definition.
// `def` must be constexpr: its name is checked against the op list (op_list.h REGEN_OPS) when the
// file compiles.
#define REGEN_REGISTER_OP(kind, def)                           \
  static_assert(::regen::detail::same_name((def).name, #kind), \
                "OpDef name differs from its OpKind: " #kind); \
  static const bool regen_registered_##kind = ::regen::register_op(::regen::OpKind::kind, &(def))

constexpr bool same_name(const char* a, const char* b) {
  while (*a != 0 && *a == *b) ++a, ++b;
  return *a == *b;
}

inline void check_same_dtype(const char* op, const Tensor& a, const Tensor& b) {
  REGEN_CHECK(a.dtype() == b.dtype(), op, ": dtype mismatch between ", a.str(), " and ", b.str());
}
inline void check_floating(const char* op, const Tensor& t) {
  REGEN_CHECK(is_floating(t.dtype()), op, ": expected a floating-point tensor, got ", t.str());
}
inline void check_defined(const char* op, const Tensor& t, const char* what) {
  REGEN_CHECK(t.defined(), op, ": ", what, " is undefined");
}

inline Tensor empty_like(const Tensor& t) {
  return empty(t.shape(), t.dtype(), t.device());
}

inline void no_saves(const AttrBlob&, SaveList&) {}

}  // namespace regen::detail
