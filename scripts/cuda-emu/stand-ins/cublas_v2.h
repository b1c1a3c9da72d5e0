// emulation stand-in for cuBLAS: naive column-major SGEMM with BLAS semantics.
#pragma once
#include <cuda_runtime_api.h>
#include <cstddef>
#include <cstdint>
typedef struct cublasContext* cublasHandle_t;
typedef enum { CUBLAS_STATUS_SUCCESS = 0, CUBLAS_STATUS_INVALID_VALUE = 7 } cublasStatus_t;
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
  for (int64_t j = 0; j < n; ++j)
    for (int64_t i = 0; i < m; ++i) {
      double acc = 0;
      for (int64_t p = 0; p < k; ++p) {
        const float a = ta == CUBLAS_OP_N ? A[i + p * lda] : A[p + i * lda];
        const float b = tb == CUBLAS_OP_N ? B[p + j * ldb] : B[j + p * ldb];
        acc += double(a) * b;
      }
      C[i + j * ldc] = float(*alpha * acc + (*beta == 0.0f ? 0.0 : double(*beta) * C[i + j * ldc]));
    }
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
