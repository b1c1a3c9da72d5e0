// Helpers shared by the op implementations (autograd/ops_*.cpp). Not part of the public API.
#pragma once

#include <string>

#include "autograd/ops.h"
#include "kernels/kernels.h"

namespace regen::detail {

// Registers an OpDef at static initialization; the op's object file defines it next to the
// user-facing function, so whatever records the op links its definition.
#define REGEN_REGISTER_OP(kind, def) \
  static const bool regen_registered_##kind = ::regen::register_op(::regen::OpKind::kind, &(def))

inline void check_same_dtype(const char* op, const Tensor& a, const Tensor& b) {
  REGEN_CHECK(a.dtype() == b.dtype(), op, ": dtype mismatch between ", a.str(), " and ", b.str());
}
inline void check_floating(const char* op, const Tensor& t) {
  REGEN_CHECK(is_floating(t.dtype()), op, ": expected a floating-point tensor, got ", t.str());
}
inline void check_defined(const char* op, const Tensor& t, const char* what) {
  REGEN_CHECK(t.defined(), op, ": ", what, " is undefined");
}

inline Tensor empty_like(const Tensor& t) { return empty(t.shape(), t.dtype(), t.device()); }

inline void no_saves(const AttrBlob&, std::vector<SaveRef>&) {}

}  // namespace regen::detail
