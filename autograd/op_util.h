// Helpers shared by the op implementations (autograd/ops_*.cpp). Not part of the public API.
#pragma once

#include <string>

#include "regen/autograd/op_list.h"
#include "regen/autograd/ops.h"
#include "regen/autograd/precision.h"
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
// Under autocast an op's floating inputs may differ in dtype: Tape::apply casts them as the op's
// precision rule says before the op runs. Otherwise they must agree.
inline void check_same_dtype_or_autocast(const char* op, const Tensor& a, const Tensor& b) {
  if (autocast_dtype() == DType::f32) check_same_dtype(op, a, b);
}
inline void check_floating(const char* op, const Tensor& t) {
  REGEN_CHECK(is_floating(t.dtype()), op, ": expected a floating-point tensor, got ", t.str());
}
inline void check_defined(const char* op, const Tensor& t, const char* what) {
  REGEN_CHECK(t.defined(), op, ": ", what, " is undefined");
}

// The parameters of an op whose statistics stay f32 (layernorm, rmsnorm, batchnorm2d: the precision
// policy's fp32_statistics) beside its input x: of x's dtype, or f32 beside a 16-bit x.
inline void check_param_dtype(const char* op, const Tensor& x, const Tensor& param,
                              const char* name) {
  const bool lowp = is_low_precision(x.dtype());
  const DType want = lowp ? DType::f32 : x.dtype();
  REGEN_CHECK(param.dtype() == want, op, ": dtype mismatch: ", name, " ", param.str(), " must be ",
              dtype_name(want), " beside input ", x.str(),
              lowp ? " (a 16-bit input reads f32 parameters and keeps f32 statistics)" : "");
}

inline Tensor empty_like(const Tensor& t) {
  return empty(t.shape(), t.dtype(), t.device());
}

inline void no_saves(const AttrBlob&, SaveList&) {}

}  // namespace regen::detail
