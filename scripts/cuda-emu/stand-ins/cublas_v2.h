// emulation stand-in for cuBLAS: naive column-major SGEMM with BLAS semantics, and GemmEx for the
// 16-bit types (bf16, f16 operands; C 16-bit or f32; CUBLAS_COMPUTE_32F) with cuBLAS's checks of
// the type combination, summing in double and rounding C once (core/half.h's conversions).
#pragma once
#include <cuda_runtime_api.h>
#include <library_types.h>
#include <cstddef>
#include <cstdint>

#include "emu_graph.h"
#include "regen/core/half.h"
typedef struct cublasContext* cublasHandle_t;
typedef enum {
  CUBLAS_STATUS_SUCCESS = 0,
  CUBLAS_STATUS_INVALID_VALUE = 7,
  CUBLAS_STATUS_NOT_SUPPORTED = 15
} cublasStatus_t;
typedef enum { CUBLAS_COMPUTE_32F = 68, CUBLAS_COMPUTE_32F_FAST_TF32 = 77 } cublasComputeType_t;
typedef enum { CUBLAS_GEMM_DEFAULT = -1 } cublasGemmAlgo_t;
typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 } cublasOperation_t;
typedef enum { CUBLAS_DEFAULT_MATH = 0, CUBLAS_TF32_TENSOR_OP_MATH = 3 } cublasMath_t;
typedef enum { CUBLAS_POINTER_MODE_HOST = 0 } cublasPointerMode_t;
inline cublasStatus_t cublasCreate(cublasHandle_t* h) {
  *h = reinterpret_cast<cublasHandle_t>(1);
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasSetStream(cublasHandle_t, cudaStream_t) {
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasSetWorkspace(cublasHandle_t, void*, size_t) {
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasSetPointerMode(cublasHandle_t, cublasPointerMode_t) {
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasSetMathMode(cublasHandle_t, cublasMath_t) {
  return CUBLAS_STATUS_SUCCESS;
}
inline const char* cublasGetStatusName(cublasStatus_t) {
  return "emu";
}
inline const char* cublasGetStatusString(cublasStatus_t) {
  return "emu";
}
// C (m x n, col-major, ldc) = alpha op(A) op(B) + beta C; op(A): m x k, op(B): k x n.
inline cublasStatus_t cublasSgemm_64(cublasHandle_t, cublasOperation_t ta, cublasOperation_t tb,
                                     int64_t m, int64_t n, int64_t k, const float* alpha,
                                     const float* A, int64_t lda, const float* B, int64_t ldb,
                                     const float* beta, float* C, int64_t ldc) {
  const int64_t a_rows = ta == CUBLAS_OP_N ? m : k, b_rows = tb == CUBLAS_OP_N ? k : n;
  if (lda < (a_rows > 1 ? a_rows : 1) || ldb < (b_rows > 1 ? b_rows : 1) || ldc < (m > 1 ? m : 1))
    return CUBLAS_STATUS_INVALID_VALUE;
  // alpha and beta are read at the call (host pointer mode); the product runs now, or when a
  // captured graph replays (emu_graph.h).
  const float al = *alpha, be = *beta;
  emu::run_or_record([=] {
    for (int64_t j = 0; j < n; ++j)
      for (int64_t i = 0; i < m; ++i) {
        double acc = 0;
        for (int64_t p = 0; p < k; ++p) {
          const float a = ta == CUBLAS_OP_N ? A[i + p * lda] : A[p + i * lda];
          const float b = tb == CUBLAS_OP_N ? B[p + j * ldb] : B[j + p * ldb];
          acc += double(a) * b;
        }
        C[i + j * ldc] = float(al * acc + (be == 0.0f ? 0.0 : double(be) * C[i + j * ldc]));
      }
  });
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasSgemmStridedBatched_64(
    cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n, int64_t k,
    const float* alpha, const float* A, int64_t lda, int64_t sa, const float* B, int64_t ldb,
    int64_t sb, const float* beta, float* C, int64_t ldc, int64_t sc, int64_t batch) {
  for (int64_t i = 0; i < batch; ++i) {
    cublasStatus_t s = cublasSgemm_64(h, ta, tb, m, n, k, alpha, A + i * sa, lda, B + i * sb, ldb,
                                      beta, C + i * sc, ldc);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
  }
  return CUBLAS_STATUS_SUCCESS;
}

// One element of a GemmEx matrix as a double, or a store of v rounded to the matrix's type.
inline double emu_gemm_load(const void* p, cudaDataType_t t, int64_t i) {
  if (t == CUDA_R_32F) return static_cast<const float*>(p)[i];
  const uint16_t bits = static_cast<const uint16_t*>(p)[i];
  return t == CUDA_R_16BF ? regen::half::from_bf16(bits) : regen::half::from_fp16(bits);
}
inline void emu_gemm_store(void* p, cudaDataType_t t, int64_t i, float v) {
  if (t == CUDA_R_32F) {
    static_cast<float*>(p)[i] = v;
  } else {
    static_cast<uint16_t*>(p)[i] =
        t == CUDA_R_16BF ? regen::half::to_bf16(v) : regen::half::to_fp16(v);
  }
}
// cuBLAS's rules for CUBLAS_COMPUTE_32F with a float scale: A and B of one type; 16BF or 16F
// inputs with C of that type or f32; f32 throughout.
inline cublasStatus_t cublasGemmEx_64(cublasHandle_t, cublasOperation_t ta, cublasOperation_t tb,
                                      int64_t m, int64_t n, int64_t k, const void* alpha,
                                      const void* A, cudaDataType_t at, int64_t lda, const void* B,
                                      cudaDataType_t bt, int64_t ldb, const void* beta, void* C,
                                      cudaDataType_t ct, int64_t ldc, cublasComputeType_t compute,
                                      cublasGemmAlgo_t) {
  if (compute != CUBLAS_COMPUTE_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
  const bool half_in = at == CUDA_R_16BF || at == CUDA_R_16F;
  if (at != bt || !(at == CUDA_R_32F || half_in)) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (!(ct == at || (half_in && ct == CUDA_R_32F))) return CUBLAS_STATUS_NOT_SUPPORTED;
  const int64_t a_rows = ta == CUBLAS_OP_N ? m : k, b_rows = tb == CUBLAS_OP_N ? k : n;
  if (m < 0 || n < 0 || k < 0 || lda < (a_rows > 1 ? a_rows : 1) ||
      ldb < (b_rows > 1 ? b_rows : 1) || ldc < (m > 1 ? m : 1))
    return CUBLAS_STATUS_INVALID_VALUE;
  const float al = *static_cast<const float*>(alpha), be = *static_cast<const float*>(beta);
  emu::run_or_record([=] {
    for (int64_t j = 0; j < n; ++j)
      for (int64_t i = 0; i < m; ++i) {
        double acc = 0;
        for (int64_t p = 0; p < k; ++p) {
          acc += emu_gemm_load(A, at, ta == CUBLAS_OP_N ? i + p * lda : p + i * lda) *
                 emu_gemm_load(B, bt, tb == CUBLAS_OP_N ? p + j * ldb : j + p * ldb);
        }
        const double old = be == 0.0f ? 0.0 : double(be) * emu_gemm_load(C, ct, i + j * ldc);
        emu_gemm_store(C, ct, i + j * ldc, float(al * float(acc) + old));
      }
  });
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasGemmStridedBatchedEx_64(
    cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n, int64_t k,
    const void* alpha, const void* A, cudaDataType_t at, int64_t lda, int64_t sa, const void* B,
    cudaDataType_t bt, int64_t ldb, int64_t sb, const void* beta, void* C, cudaDataType_t ct,
    int64_t ldc, int64_t sc, int64_t batch, cublasComputeType_t compute, cublasGemmAlgo_t algo) {
  auto at_offset = [](const void* p, cudaDataType_t t, int64_t off) {
    return static_cast<const char*>(p) + off * (t == CUDA_R_32F ? 4 : 2);
  };
  if (batch < 0) return CUBLAS_STATUS_INVALID_VALUE;
  for (int64_t i = 0; i < batch; ++i) {
    cublasStatus_t s = cublasGemmEx_64(
        h, ta, tb, m, n, k, alpha, at_offset(A, at, i * sa), at, lda, at_offset(B, bt, i * sb), bt,
        ldb, beta, const_cast<char*>(at_offset(C, ct, i * sc)), ct, ldc, compute, algo);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
  }
  return CUBLAS_STATUS_SUCCESS;
}
