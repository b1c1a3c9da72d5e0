// The mixed-precision GEMM of kernels/cpu/gemm_lowp.h: the widening sources of
// kernels/cpu/widening_sources.h for each operand's storage type, fed to the f32 packed GEMM.
// Tests: tests/test_lowp_kernels.cpp.
#include "regen/kernels/cpu/gemm_lowp.h"

#include "regen/core/error.h"
#include "regen/core/half.h"
#include "regen/kernels/cpu/widening_sources.h"

namespace regen::cpu {
namespace {

// Calls f with the widening source for an operand stored as `dtype`.
template <template <class> class Source, class F>
void with_source(const char* operand, DType dtype, const void* p, int64_t ld, bool trans, F&& f) {
  switch (dtype) {
    case DType::f32:
      f(Source<float>{static_cast<const float*>(p), ld, trans});
      return;
    case DType::bf16:
      f(Source<bfloat16>{static_cast<const bfloat16*>(p), ld, trans});
      return;
    case DType::f16:
      f(Source<float16>{static_cast<const float16*>(p), ld, trans});
      return;
    default:
      REGEN_CHECK(false, "gemm_lowp: operand ", operand, " is ", dtype_name(dtype),
                  "; it must be f32, bf16 or f16");
  }
}

}  // namespace

void gemm_lowp(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, DType a_dtype,
               const void* A, int64_t lda, DType b_dtype, const void* B, int64_t ldb,
               const float* bias, bool accumulate, float* C, int64_t ldc) {
  REGEN_CHECK(M >= 0 && N >= 0 && K >= 0, "gemm_lowp: negative size M=", M, " N=", N, " K=", K);
  REGEN_CHECK(lda >= (trans_a ? M : K) && ldb >= (trans_b ? K : N) && ldc >= N,
              "gemm_lowp: leading dimensions lda=", lda, " ldb=", ldb, " ldc=", ldc,
              " too small for M=", M, " N=", N, " K=", K, trans_a ? " (A stored (K, M))" : "",
              trans_b ? " (B stored (N, K))" : "");
  // C's columns form one "image" of N columns: CView's image split never happens.
  const packed::CView<float> c{C, ldc, N > 0 ? N : 1, 0};
  with_source<packed::WideningA>("A", a_dtype, A, lda, trans_a, [&](const auto& a) {
    with_source<packed::WideningB>("B", b_dtype, B, ldb, trans_b, [&](const auto& b) {
      packed::gemm<float>(M, N, K, a, b, bias, accumulate, c);
    });
  });
}

}  // namespace regen::cpu
