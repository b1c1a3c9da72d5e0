// CPU GEMM. f32 products of some size run on regen's own packed GEMM (kernels/cpu/packed_gemm.h:
// the register tile chosen at run time for AVX-512 or AVX2, 0.81-0.92x Eigen's time on the
// Transformer's and GPT-2's shapes, docs/kernels.md "f32 GEMM"); small or skinny f32 products, f64
// and the alpha/beta combinations the packed GEMM has no form for run on Eigen's GEBP kernels on
// raw row-major buffers, parallelized with OpenMP here (Eigen's own threading is not used). Both
// take their packing buffers from regen's allocator (Workspace, category workspace) instead of a
// heap of their own, so every byte is accounted. In a dry run (kernels.h, kDryRunLaunchers) gemm
// and gemm_batched request the same packing buffers and compute nothing. Both are deterministic
// and independent of the thread count. Reference for tests: plain loops in
// tests/test_kernels_cpu.cpp.
#include <omp.h>

#include <Eigen/Core>
#include <algorithm>
#include <type_traits>
#include <vector>

#include "regen/core/tensor.h"
#include "regen/kernels/cpu/gemm_lowp.h"
#include "regen/kernels/cpu/widening_sources.h"
#include "regen/kernels/kernels.h"

namespace regen::cpu {
namespace {

// Blocking sizes and buffers chosen by us; Eigen's GEMM uses the buffers when non-null.
template <class Lhs, class Rhs>
class RegenBlocking : public Eigen::internal::level3_blocking<Lhs, Rhs> {
 public:
  RegenBlocking(Eigen::Index kc, Eigen::Index mc, Eigen::Index nc, Lhs* a, Rhs* b) {
    this->m_kc = kc;
    this->m_mc = mc;
    this->m_nc = nc;
    this->m_blockA = a;
    this->m_blockB = b;
  }
};

struct Plan {
  Eigen::Index kc, mc, nc;  // for the problem Eigen runs (column-major, rows = N, cols = M_t)
  size_t floats_a, floats_b;
};

template <class T>
Plan plan_blocking(int64_t internal_rows, int64_t internal_cols, int64_t depth) {
  Eigen::Index k = depth, m = internal_rows, n = internal_cols;
  Eigen::internal::computeProductBlockingSizes<T, T, 1, Eigen::Index>(k, m, n, 1);
  Plan p{k, m, n, 0, 0};
  // Pad each buffer to 64 bytes so every thread's slice stays aligned for AVX-512 loads.
  const size_t per_line = 64 / sizeof(T);
  p.floats_a = (static_cast<size_t>(k * m) + per_line - 1) / per_line * per_line;
  p.floats_b = (static_cast<size_t>(k * n) + per_line - 1) / per_line * per_line;
  return p;
}

// C[0:M, 0:N] += alpha * op(A) * op(B), one thread, row-major C with row stride ldc.
template <class T, int LhsOrder, int RhsOrder>
void run_one(int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t lda, const T* B,
             int64_t ldb, T* C, int64_t ldc, const Plan& plan, T* block_a, T* block_b) {
  using Gemm = Eigen::internal::general_matrix_matrix_product<Eigen::Index, T, LhsOrder, false, T,
                                                              RhsOrder, false, Eigen::RowMajor, 1>;
  RegenBlocking<T, T> blocking(plan.kc, plan.mc, plan.nc, block_a, block_b);
  Gemm::run(M, N, K, A, lda, B, ldb, C, 1, ldc, alpha, blocking, nullptr);
}

template <class T, int LhsOrder, int RhsOrder>
void gemm_impl(int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t lda, const T* B,
               int64_t ldb, T* C, int64_t ldc) {
  // Eigen runs a row-major product as the column-major product of the transposes, with rows = N.
  const double flops = 2.0 * static_cast<double>(M) * N * K;
  int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  if (flops < 2e6) threads = 1;
  // Split the larger of M and N across threads: each thread owns a block of C.
  const bool split_m = M >= N;
  const int64_t extent = split_m ? M : N;
  threads = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(threads, extent / 16)));
  const int64_t chunk = (extent + threads - 1) / threads;
  const int64_t part_m = split_m ? chunk : M, part_n = split_m ? N : chunk;
  const Plan plan = plan_blocking<T>(part_n, part_m, K);
  Workspace ws(Device::cpu(),
               static_cast<uint64_t>(threads) * (plan.floats_a + plan.floats_b) * sizeof(T));
  if (dry_run_active()) return;  // the dry path (kernels.h): the scratch, requested and unused
  T* base = ws.as<T>();
#pragma omp parallel for num_threads(threads) schedule(static, 1) if (threads > 1)
  for (int t = 0; t < threads; ++t) {
    const int64_t lo = t * chunk, hi = std::min(extent, lo + chunk);
    if (lo >= hi) continue;
    T* block_a = base + static_cast<size_t>(t) * (plan.floats_a + plan.floats_b);
    T* block_b = block_a + plan.floats_a;
    if (split_m) {
      // Rows lo..hi of op(A): A + lo*lda when A is row-major (M, K), A + lo when stored (K, M).
      const T* a = LhsOrder == Eigen::RowMajor ? A + lo * lda : A + lo;
      run_one<T, LhsOrder, RhsOrder>(hi - lo, N, K, alpha, a, lda, B, ldb, C + lo * ldc, ldc, plan,
                                     block_a, block_b);
    } else {
      // Columns lo..hi of op(B): B + lo when B is row-major (K, N), B + lo*ldb when stored (N, K).
      const T* b = RhsOrder == Eigen::RowMajor ? B + lo : B + lo * ldb;
      run_one<T, LhsOrder, RhsOrder>(M, hi - lo, K, alpha, A, lda, b, ldb, C + lo, ldc, plan,
                                     block_a, block_b);
    }
  }
}

// C = beta * C (beta = 0 ignores C, NaNs included); rows split over threads when C is large (each
// element is one multiplication: the same bits at any thread count).
template <class T>
void scale_c(int64_t M, int64_t N, T beta, T* C, int64_t ldc) {
  if (beta == T(1)) return;
#pragma omp parallel for schedule(static) if (M * N > (1 << 15) && !omp_in_parallel())
  for (int64_t i = 0; i < M; ++i) {
    T* row = C + i * ldc;
    if (beta == T(0)) {
      std::fill(row, row + N, T(0));  // beta = 0 ignores C, NaNs included
    } else {
      for (int64_t j = 0; j < N; ++j) row[j] *= beta;
    }
  }
}

}  // namespace

namespace {
template <class T>
void gemm_eigen(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
                int64_t lda, const T* B, int64_t ldb, T beta, T* C, int64_t ldc) {
  REGEN_CHECK(M >= 0 && N >= 0 && K >= 0, "gemm: negative size M=", M, " N=", N, " K=", K);
  if (M == 0 || N == 0) return;
  if (!dry_run_active()) scale_c(M, N, beta, C, ldc);
  if (K == 0 || alpha == T(0)) return;
  constexpr int R = Eigen::RowMajor, Cm = Eigen::ColMajor;
  if (!trans_a && !trans_b)
    gemm_impl<T, R, R>(M, N, K, alpha, A, lda, B, ldb, C, ldc);
  else if (!trans_a && trans_b)
    gemm_impl<T, R, Cm>(M, N, K, alpha, A, lda, B, ldb, C, ldc);
  else if (trans_a && !trans_b)
    gemm_impl<T, Cm, R>(M, N, K, alpha, A, lda, B, ldb, C, ldc);
  else
    gemm_impl<T, Cm, Cm>(M, N, K, alpha, A, lda, B, ldb, C, ldc);
}
// Whether an f32 product runs on the packed GEMM: both sides of C at least 32 and 8 MFLOP or
// more. Below that Eigen's kernels were as fast or faster on one core (an 8-row product took
// 2.2x as long packed, 128 x 128 x 64 attention products 1.02-1.05x; docs/kernels.md).
bool packed_f32_pays(int64_t M, int64_t N, int64_t K) {
  return std::min(M, N) >= 32 && 2.0 * static_cast<double>(M) * N * K >= 8e6;
}

// C = alpha * op(A) op(B) + beta * C on the packed GEMM, for beta 0 or 1 (false when it has no
// form for the call). alpha != 1 multiplies C afterwards, which needs beta = 0: one rounding of
// each sum, then one of the product by alpha.
bool gemm_packed_f32(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                     const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
                     int64_t ldc) {
  const bool accumulate = beta == 1.0f;
  if (!packed_f32_pays(M, N, K) || (beta != 0.0f && !accumulate) || (alpha != 1.0f && accumulate) ||
      K == 0 || alpha == 0.0f) {
    return false;
  }
  // C's columns form one "image" of N columns: CView's image split never happens.
  const packed::CView<float> c{C, ldc, N, 0};
  packed::gemm<float>(M, N, K, packed::WideningA<float>{A, lda, trans_a},
                      packed::WideningB<float>{B, ldb, trans_b}, nullptr, accumulate, c);
  if (!dry_run_active()) scale_c(M, N, alpha, C, ldc);  // alpha is not 0 here
  return true;
}

}  // namespace

template <class T>
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
          int64_t lda, const T* B, int64_t ldb, T beta, T* C, int64_t ldc) {
  if constexpr (is_half_v<T>) {
    // 16-bit operands and C: the widening packed GEMM, f32 sums, C rounded once per element
    // (kernels/cpu/gemm_lowp.h); its dry path requests its strip and packing workspace.
    constexpr DType dt = dtype_of<T>::value;
    gemm_lowp_store(trans_a, trans_b, M, N, K, dt, A, lda, dt, B, ldb, static_cast<float>(alpha),
                    static_cast<float>(beta), dt, nullptr, dt, C, ldc);
  } else {
    if constexpr (std::is_same_v<T, float>) {
      REGEN_CHECK(M >= 0 && N >= 0 && K >= 0, "gemm: negative size M=", M, " N=", N, " K=", K);
      if (M > 0 && N > 0 &&
          gemm_packed_f32(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc)) {
        return;
      }
    }
    gemm_eigen<T>(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }
}

template <class T>
void gemm_batched(bool trans_a, bool trans_b, int64_t batch, int64_t M, int64_t N, int64_t K,
                  T alpha, const T* A, int64_t lda, int64_t stride_a, const T* B, int64_t ldb,
                  int64_t stride_b, T beta, T* C, int64_t ldc, int64_t stride_c) {
  REGEN_CHECK(batch >= 0, "gemm_batched: negative batch ", batch);
  for (int64_t i = 0; i < batch; ++i) {
    gemm<T>(trans_a, trans_b, M, N, K, alpha, A + i * stride_a, lda, B + i * stride_b, ldb, beta,
            C + i * stride_c, ldc);
  }
}

template void gemm<float>(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t,
                          const float*, int64_t, float, float*, int64_t);
template void gemm<double>(bool, bool, int64_t, int64_t, int64_t, double, const double*, int64_t,
                           const double*, int64_t, double, double*, int64_t);
template void gemm_batched<float>(bool, bool, int64_t, int64_t, int64_t, int64_t, float,
                                  const float*, int64_t, int64_t, const float*, int64_t, int64_t,
                                  float, float*, int64_t, int64_t);
template void gemm_batched<double>(bool, bool, int64_t, int64_t, int64_t, int64_t, double,
                                   const double*, int64_t, int64_t, const double*, int64_t, int64_t,
                                   double, double*, int64_t, int64_t);
#define REGEN_INSTANTIATE_HALF(T)                                                              \
  template void gemm<T>(bool, bool, int64_t, int64_t, int64_t, T, const T*, int64_t, const T*, \
                        int64_t, T, T*, int64_t);                                              \
  template void gemm_batched<T>(bool, bool, int64_t, int64_t, int64_t, int64_t, T, const T*,   \
                                int64_t, int64_t, const T*, int64_t, int64_t, T, T*, int64_t,  \
                                int64_t);
REGEN_INSTANTIATE_HALF(bfloat16)
REGEN_INSTANTIATE_HALF(float16)
#undef REGEN_INSTANTIATE_HALF

}  // namespace regen::cpu
