// GEMM through cuBLAS (declared in kernels/cuda/cuda_kernels.h; CPU reference kernels/cpu/gemm.cpp,
// test tests/cuda/test_cuda_ops.cpp) and the TF32 setting.
//
// regen's matrices are row-major and cuBLAS is column-major. A row-major (M, N) matrix with row
// stride ldc is the column-major (N, M) matrix C^T with the same leading dimension, and
// C^T = op(B)^T op(A)^T, so every call swaps the operands (B first) and the sizes (N, M).
//
// 16-bit GEMMs (T = bfloat16, float16): cublasGemmEx with A, B and C in CUDA_R_16BF or CUDA_R_16F
// and CUBLAS_COMPUTE_32F: products summed in f32 (on tensor cores where the GPU has them), alpha
// and beta in f32, C rounded once per element, the contract of cpu::gemm<T> (kernels/cpu/gemm.cpp,
// kernels/cpu/gemm_lowp.h). cuBLAS's order of the f32 sums is its own, so the CPU and the GPU agree
// to f32 roundoff before the one rounding (tests/cuda/test_cuda_ops.cpp).
//
// One cuBLAS handle per device, bound to regen::cuda::stream(). Its workspace is one persistent
// Storage per device (category workspace, tag "cublas.workspace", 32 MiB, NVIDIA's recommended
// size on Hopper), created with the handle by kernels::prepare_device (the trainer's canonical
// start, and dry_run_step before its scope, which counts the block from its start: DryRunScope) or
// else by the first GEMM. Persistent rather than per call because cuBLAS keeps the
// pointer between calls: a per-call buffer would have to be re-registered on every GEMM and would
// put a 32 MiB alloc/free pair around each product in the memory trace. Without it cuBLAS would
// cudaMalloc a workspace itself, outside the allocator. Determinism: cuBLAS gives the same bits run
// to run for the same handle, stream, workspace and GPU (cuBLAS docs, "Results reproducibility");
// regen uses exactly one of each per device.
#include <cublas_v2.h>

#include <memory>
#include <mutex>
#include <type_traits>
#include <vector>

#include "regen/core/allocator.h"
#include "regen/core/tensor.h"
#include "regen/kernels/cuda/check.h"
#include "regen/kernels/cuda/cuda_kernels.h"
#include "regen/kernels/cuda/launch.h"
#include "regen/kernels/kernels.h"

namespace regen::cuda {
namespace {

constexpr uint64_t kCublasWorkspaceBytes = 32ull << 20;

struct BlasDevice {
  cublasHandle_t handle = nullptr;
  std::unique_ptr<Storage> workspace;
};

bool g_tf32 = false;

// The handle of the current device, created on first use. Handles are never destroyed: cuBLAS
// handles must not be destroyed after the CUDA context is torn down at exit.
cublasHandle_t blas_handle() {
  static std::mutex mutex;
  static std::vector<BlasDevice> devices;
  const int d = current_device();
  std::lock_guard<std::mutex> lock(mutex);
  if (static_cast<int>(devices.size()) <= d) devices.resize(d + 1);
  BlasDevice& dev = devices[d];
  if (!dev.handle) {
    // Inside a dry run the workspace would come from the scope's Null arena and outlive it.
    REGEN_CHECK(!dry_run_active(), "cuBLAS on cuda:", d,
                " is not set up: call kernels::prepare_device before a dry run on the device");
    TagScope tag("cublas.workspace");
    exit_check_ignore_tag("cublas.workspace");  // lives as long as the process, by design
    dev.workspace =
        std::make_unique<Storage>(Device::cuda(d), kCublasWorkspaceBytes, Category::workspace);
    cublasHandle_t h = nullptr;
    REGEN_CUBLAS_CHECK(cublasCreate(&h));
    REGEN_CUBLAS_CHECK(cublasSetStream(h, stream()));
    REGEN_CUBLAS_CHECK(cublasSetWorkspace(h, dev.workspace->data(), kCublasWorkspaceBytes));
    REGEN_CUBLAS_CHECK(cublasSetPointerMode(h, CUBLAS_POINTER_MODE_HOST));
    dev.handle = h;
  }
  REGEN_CUBLAS_CHECK(
      cublasSetMathMode(dev.handle, g_tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
  return dev.handle;
}

cublasOperation_t op(bool trans) {
  return trans ? CUBLAS_OP_T : CUBLAS_OP_N;
}

void check_gemm_args(const char* name, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                     int64_t lda, int64_t ldb, int64_t ldc) {
  REGEN_CHECK(M >= 0 && N >= 0 && K >= 0, name, ": negative size M=", M, " N=", N, " K=", K);
  // Row strides must cover a stored row: A is stored (M, K), or (K, M) when trans_a.
  const int64_t a_cols = trans_a ? M : K, b_cols = trans_b ? K : N;
  REGEN_CHECK(lda >= (a_cols > 1 ? a_cols : 1) && ldb >= (b_cols > 1 ? b_cols : 1) &&
                  ldc >= (N > 1 ? N : 1),
              name, ": row strides lda=", lda, " ldb=", ldb, " ldc=", ldc,
              " are too small for M=", M, " N=", N, " K=", K, " (trans_a=", trans_a,
              ", trans_b=", trans_b, ")");
}

// The cuBLAS type of a 16-bit element type.
template <class T>
constexpr cudaDataType_t cuda_type() {
  static_assert(is_half_v<T>, "a 16-bit element type");
  return std::is_same<T, bfloat16>::value ? CUDA_R_16BF : CUDA_R_16F;
}

}  // namespace

void set_tf32(bool enabled) {
  g_tf32 = enabled;
}
bool tf32_enabled() {
  return g_tf32;
}
void prepare_blas() {
  blas_handle();
}

// C: (M, N) row stride ldc; op(A): (M, K); op(B): (K, N).
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
          int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  check_gemm_args("gemm", trans_a, trans_b, M, N, K, lda, ldb, ldc);
  if (M == 0 || N == 0) return;
  cublasHandle_t h = blas_handle();
  REGEN_CUBLAS_CHECK(
      cublasSgemm_64(h, op(trans_b), op(trans_a), N, M, K, &alpha, B, ldb, A, lda, &beta, C, ldc));
}

// batch products; matrix i of A starts at A + i*stride_a, likewise B and C.
void gemm_batched(bool trans_a, bool trans_b, int64_t batch, int64_t M, int64_t N, int64_t K,
                  float alpha, const float* A, int64_t lda, int64_t stride_a, const float* B,
                  int64_t ldb, int64_t stride_b, float beta, float* C, int64_t ldc,
                  int64_t stride_c) {
  check_gemm_args("gemm_batched", trans_a, trans_b, M, N, K, lda, ldb, ldc);
  REGEN_CHECK(batch >= 0, "gemm_batched: negative batch ", batch);
  if (batch == 0 || M == 0 || N == 0) return;
  cublasHandle_t h = blas_handle();
  REGEN_CUBLAS_CHECK(cublasSgemmStridedBatched_64(h, op(trans_b), op(trans_a), N, M, K, &alpha, B,
                                                  ldb, stride_b, A, lda, stride_a, &beta, C, ldc,
                                                  stride_c, batch));
}

// 16-bit A, B, C: f32 accumulation, one rounding of C (the header's 16-bit note).
template <class T>
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
          int64_t lda, const T* B, int64_t ldb, T beta, T* C, int64_t ldc) {
  check_gemm_args("gemm", trans_a, trans_b, M, N, K, lda, ldb, ldc);
  if (M == 0 || N == 0) return;
  cublasHandle_t h = blas_handle();
  const float a = static_cast<float>(alpha), b = static_cast<float>(beta);
  constexpr cudaDataType_t t = cuda_type<T>();
  REGEN_CUBLAS_CHECK(cublasGemmEx_64(h, op(trans_b), op(trans_a), N, M, K, &a, B, t, ldb, A, t, lda,
                                     &b, C, t, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

template <class T>
void gemm_batched(bool trans_a, bool trans_b, int64_t batch, int64_t M, int64_t N, int64_t K,
                  T alpha, const T* A, int64_t lda, int64_t stride_a, const T* B, int64_t ldb,
                  int64_t stride_b, T beta, T* C, int64_t ldc, int64_t stride_c) {
  check_gemm_args("gemm_batched", trans_a, trans_b, M, N, K, lda, ldb, ldc);
  REGEN_CHECK(batch >= 0, "gemm_batched: negative batch ", batch);
  if (batch == 0 || M == 0 || N == 0) return;
  cublasHandle_t h = blas_handle();
  const float a = static_cast<float>(alpha), b = static_cast<float>(beta);
  constexpr cudaDataType_t t = cuda_type<T>();
  REGEN_CUBLAS_CHECK(cublasGemmStridedBatchedEx_64(
      h, op(trans_b), op(trans_a), N, M, K, &a, B, t, ldb, stride_b, A, t, lda, stride_a, &b, C, t,
      ldc, stride_c, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// 16-bit A and B, f32 C: f32 accumulation, C written or accumulated in f32.
template <class T>
void gemm_lowp(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda,
               const T* B, int64_t ldb, bool accumulate, float* C, int64_t ldc) {
  check_gemm_args("gemm_lowp", trans_a, trans_b, M, N, K, lda, ldb, ldc);
  if (M == 0 || N == 0) return;
  cublasHandle_t h = blas_handle();
  const float a = 1.0f, b = accumulate ? 1.0f : 0.0f;
  constexpr cudaDataType_t t = cuda_type<T>();
  REGEN_CUBLAS_CHECK(cublasGemmEx_64(h, op(trans_b), op(trans_a), N, M, K, &a, B, t, ldb, A, t, lda,
                                     &b, C, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F,
                                     CUBLAS_GEMM_DEFAULT));
}

#define REGEN_GEMM_HALF(T)                                                                       \
  template void gemm<T>(bool, bool, int64_t, int64_t, int64_t, T, const T*, int64_t, const T*,   \
                        int64_t, T, T*, int64_t);                                                \
  template void gemm_batched<T>(bool, bool, int64_t, int64_t, int64_t, int64_t, T, const T*,     \
                                int64_t, int64_t, const T*, int64_t, int64_t, T, T*, int64_t,    \
                                int64_t);                                                        \
  template void gemm_lowp<T>(bool, bool, int64_t, int64_t, int64_t, const T*, int64_t, const T*, \
                             int64_t, bool, float*, int64_t);
REGEN_GEMM_HALF(bfloat16)
REGEN_GEMM_HALF(float16)
#undef REGEN_GEMM_HALF

}  // namespace regen::cuda
