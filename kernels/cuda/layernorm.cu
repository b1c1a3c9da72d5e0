// CUDA layer normalization over the last dimension (declared in kernels/cuda/cuda_kernels.h; the
// 16-bit launchers layernorm_forward_lowp / layernorm_backward_lowp beside the op,
// autograd/ops_layernorm.cpp, take the same two paths with 16-bit x, y, dy, dx and f32 gamma,
// beta and statistics; CPU reference kernels/cpu/layernorm.cpp; test tests/cuda/test_cuda_ops.cpp;
// timed by `regen bench kernels` against HBM bandwidth). An f32 x under autocast
// (layernorm_forward_save_xhat / layernorm_backward_xhat, kernels/lowp_launchers.h) runs the f32
// kernels, the forward also storing xhat = (x - mean) * rstd rounded to 16 bits, and the backward
// reading that xhat in place of x (mean unused): the same kernels with x's element type X apart
// from dy's T.
//
// Fast path (rows of at most 1024 elements in whole 16-byte packs: N % 4 == 0 in f32, N % 8 == 0
// in bf16/f16; 16-byte aligned pointers; the Transformer and GPT-2 cases): one warp per row, the
// row held in registers as 128-bit packs (x read once, 16-bit elements widened in registers, each
// output rounded once on store); row sums in double like the CPU, so
// mean and rstd round to the CPU's floats. Backward is fused: each block owns a fixed range of
// rows, every lane keeps dgamma/dbeta partials for its own columns, the block's warps combine them
// in warp order through shared memory, and a second kernel sums the per-block partials column by
// column in block order. No atomics; the partition depends only on (M, N).
// General path (any N): one block per row for y and dx, and a column-sum kernel for dgamma/dbeta.
// y and dx use round-to-nearest intrinsics (no FMA contraction) in the CPU's evaluation order, so
// given the same mean and rstd they differ from the CPU only where the host compiler contracts
// a*b + c into an FMA (GCC does under -march=native).
#include "regen/core/tensor.h"
#include "regen/kernels/cuda/common.cuh"
#include "regen/kernels/cuda/cuda_kernels.h"

namespace regen::cuda {
namespace {

constexpr int kBlockThreads = 256;

__device__ __forceinline__ float ln_out(float x, float mu, float rs, float g, float b) {
  const float xhat = __fmul_rn(__fsub_rn(x, mu), rs);
  return __fadd_rn(__fmul_rn(xhat, g), b);
}
// dx = rs * (g - a - xhat * b), evaluated left to right as the CPU does.
__device__ __forceinline__ float ln_dx(float g, float a, float xhat, float b, float rs) {
  return __fmul_rn(rs, __fsub_rn(__fsub_rn(g, a), __fmul_rn(xhat, b)));
}
// kN elements of T in 16 bytes (4 floats, 8 bf16 or f16): the fast path's unit of loads and
// stores, one 128-bit access each.
template <class T>
struct alignas(16) Pack {
  static constexpr int kN = 16 / static_cast<int>(sizeof(T));
  T e[kN];
};
template <class T>
__device__ __forceinline__ float elem(const Pack<T>& p, int e) {
  return static_cast<float>(p.e[e]);
}
// kN elements of X beside a pack of kN elements of T: the pack itself when X is T, or a 16-bit
// xhat's 8 bytes beside four floats.
template <class X, int kN>
struct alignas(kN * sizeof(X)) Lanes {
  X e[kN];
};
template <class T, class X>
using LanesOf = Lanes<X, Pack<T>::kN>;
// The normalized input at one element: from x, or read as stored (X differs from T: a saved xhat).
template <class T, class X>
__device__ __forceinline__ float xhat_of(X x, float mu, float rs) {
  if constexpr (std::is_same<T, X>::value) {
    return __fmul_rn(__fsub_rn(static_cast<float>(x), mu), rs);
  } else {
    return static_cast<float>(x);
  }
}
// kN f32 values of gamma or beta beside a pack of T (one or two 128-bit loads).
template <class T>
struct alignas(16) Params {
  float e[Pack<T>::kN];
};
template <class T>
__device__ __forceinline__ Params<T> load_params(const float* p, int idx, float fill) {
  Params<T> out;
  if (p) {
    out = reinterpret_cast<const Params<T>*>(p)[idx];
  } else {
#pragma unroll
    for (int e = 0; e < Pack<T>::kN; ++e) out.e[e] = fill;
  }
  return out;
}

// ---- Fast path: one warp per row ------------------------------------------------------------

// x, y: (M, N) of T as (M, nvec) packs of kN; gamma, beta: (N) f32 or null; mean, rstd: (M).
// Row sums in double, four elements at a time as ((a + b) + (c + d)).
// xs: (M, nvec) lanes of S, the rounded xhat (S 16-bit beside an f32 T), or null.
template <class T, class S, int kMaxVec, int kWarps>
__global__ void __launch_bounds__(kWarps * 32)
    ln_forward_warp_kernel(const Pack<T>* x, const float* gamma, const float* beta, Pack<T>* y,
                           float* mean, float* rstd, LanesOf<T, S>* xs, int64_t M, int nvec,
                           double eps) {
  constexpr int kN = Pack<T>::kN;
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (row >= M) return;
  const int N = nvec * kN;
  Pack<T> v[kMaxVec];
  double s = 0.0;
#pragma unroll
  for (int k = 0; k < kMaxVec; ++k) {
    const int idx = lane + 32 * k;
    if (idx < nvec) {
      v[k] = x[row * nvec + idx];
#pragma unroll
      for (int q = 0; q < kN; q += 4) {
        s += (static_cast<double>(elem(v[k], q)) + static_cast<double>(elem(v[k], q + 1))) +
             (static_cast<double>(elem(v[k], q + 2)) + static_cast<double>(elem(v[k], q + 3)));
      }
    }
  }
  const double mu = dev::warp_sum(s) / N;
  double sq = 0.0;
#pragma unroll
  for (int k = 0; k < kMaxVec; ++k) {
    if (lane + 32 * k < nvec) {
#pragma unroll
      for (int e = 0; e < kN; ++e) {
        const double d = static_cast<double>(elem(v[k], e)) - mu;
        sq += d * d;
      }
    }
  }
  const double rs = 1.0 / sqrt(dev::warp_sum(sq) / N + eps);
  const float mu_f = static_cast<float>(mu), rs_f = static_cast<float>(rs);
#pragma unroll
  for (int k = 0; k < kMaxVec; ++k) {
    const int idx = lane + 32 * k;
    if (idx < nvec) {
      const Params<T> g = load_params<T>(gamma, idx, 1.0f);
      const Params<T> b = load_params<T>(beta, idx, 0.0f);
      Pack<T> out;
#pragma unroll
      for (int e = 0; e < kN; ++e) {
        // Without gamma the CPU adds beta to xhat directly; ln_out with g = 1 is the same value.
        out.e[e] = T(ln_out(elem(v[k], e), mu_f, rs_f, g.e[e], b.e[e]));
      }
      y[row * nvec + idx] = out;
      if (xs) {
        LanesOf<T, S> kept;
#pragma unroll
        for (int e = 0; e < kN; ++e) kept.e[e] = S(__fmul_rn(__fsub_rn(elem(v[k], e), mu_f), rs_f));
        xs[row * nvec + idx] = kept;
      }
    }
  }
  if (lane == 0) {
    mean[row] = mu_f;
    rstd[row] = rs_f;
  }
}

// dy, x, dx: (M, nvec) packs of T; gamma: (N) f32 or null; mean, rstd: (M).
// partial_g, partial_b: (gridDim.x, N) per-block column sums, or null when not wanted.
// x: lanes of X (X = T: x itself; a 16-bit X: the saved xhat, mean unused).
template <class T, class X, int kMaxVec, int kWarps>
__global__ void __launch_bounds__(kWarps * 32)
    ln_backward_warp_kernel(const Pack<T>* dy, const LanesOf<T, X>* x, const float* gamma,
                            const float* mean, const float* rstd, Pack<T>* dx, float* partial_g,
                            float* partial_b, int64_t M, int nvec, int64_t rows_per_block) {
  constexpr int kN = Pack<T>::kN;
  __shared__ float sg[1024], sb[1024];  // N <= 1024 columns
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int N = nvec * kN;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * rows_per_block;
  const int64_t r1 = r0 + rows_per_block < M ? r0 + rows_per_block : M;
  float acc_g[kMaxVec][kN], acc_b[kMaxVec][kN];
#pragma unroll
  for (int k = 0; k < kMaxVec; ++k) {
#pragma unroll
    for (int e = 0; e < kN; ++e) acc_g[k][e] = acc_b[k][e] = 0.f;
  }
  for (int64_t row = r0 + warp; row < r1; row += kWarps) {
    LanesOf<T, X> xv[kMaxVec];
    Pack<T> dv[kMaxVec];
    const float mu = mean ? mean[row] : 0.f, rs = rstd[row];
    double sum_g = 0.0, sum_gx = 0.0;
#pragma unroll
    for (int k = 0; k < kMaxVec; ++k) {
      const int idx = lane + 32 * k;
      if (idx < nvec) {
        xv[k] = x[row * nvec + idx];
        dv[k] = dy[row * nvec + idx];
        const Params<T> gm = load_params<T>(gamma, idx, 1.0f);
#pragma unroll
        for (int e = 0; e < kN; ++e) {
          const float g = gamma ? __fmul_rn(elem(dv[k], e), gm.e[e]) : elem(dv[k], e);
          const float xhat = xhat_of<T, X>(xv[k].e[e], mu, rs);
          sum_g += static_cast<double>(g);
          sum_gx += static_cast<double>(g) * static_cast<double>(xhat);
        }
      }
    }
    const float a = static_cast<float>(dev::warp_sum(sum_g) / N);
    const float b = static_cast<float>(dev::warp_sum(sum_gx) / N);
#pragma unroll
    for (int k = 0; k < kMaxVec; ++k) {
      const int idx = lane + 32 * k;
      if (idx < nvec) {
        const Params<T> gm = load_params<T>(gamma, idx, 1.0f);
        Pack<T> out;
#pragma unroll
        for (int e = 0; e < kN; ++e) {
          const float d = elem(dv[k], e);
          const float g = gamma ? __fmul_rn(d, gm.e[e]) : d;
          const float xhat = xhat_of<T, X>(xv[k].e[e], mu, rs);
          out.e[e] = T(ln_dx(g, a, xhat, b, rs));
          acc_g[k][e] += d * xhat;
          acc_b[k][e] += d;
        }
        dx[row * nvec + idx] = out;
      }
    }
  }
  if (!partial_g && !partial_b) return;  // uniform over the block
  // Combine the warps' column partials in warp order.
  for (int w = 0; w < kWarps; ++w) {
    if (warp == w) {
#pragma unroll
      for (int k = 0; k < kMaxVec; ++k) {
        const int idx = lane + 32 * k;
        if (idx < nvec) {
#pragma unroll
          for (int e = 0; e < kN; ++e) {
            const int c = idx * kN + e;
            sg[c] = w == 0 ? acc_g[k][e] : sg[c] + acc_g[k][e];
            sb[c] = w == 0 ? acc_b[k][e] : sb[c] + acc_b[k][e];
          }
        }
      }
    }
    __syncthreads();
  }
  for (int c = threadIdx.x; c < N; c += kWarps * 32) {
    if (partial_g) partial_g[static_cast<int64_t>(blockIdx.x) * N + c] = sg[c];
    if (partial_b) partial_b[static_cast<int64_t>(blockIdx.x) * N + c] = sb[c];
  }
}

// partial_g, partial_b: (parts, N) floats -> dgamma, dbeta: (N), each column's parts summed in
// double in a fixed order (deterministic). Either pair may be null. Block (32, kSumLanes): lane tx
// owns a column; row lane ty sums parts ty, ty + kSumLanes, ... in that order, four parts of both
// outputs loaded before any is added (eight loads in flight, where one at a time left a thread
// waiting out each load's latency), and the row lanes are combined in order. One launch for both.
constexpr int kSumLanes = 16;
__global__ void __launch_bounds__(32 * kSumLanes)
    column_sums_kernel(const float* partial_g, const float* partial_b, int64_t parts, int64_t N,
                       float* dgamma, float* dbeta) {
  __shared__ double acc_g[kSumLanes][32], acc_b[kSumLanes][32];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  const bool want_g = dgamma != nullptr, want_b = dbeta != nullptr;
  double sg = 0.0, sb = 0.0;
  if (c < N) {
    int64_t p = threadIdx.y;
    constexpr int64_t kStep = kSumLanes;
    for (; p + 3 * kStep < parts; p += 4 * kStep) {
      float g[4] = {0.f, 0.f, 0.f, 0.f}, b[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        if (want_g) g[k] = partial_g[(p + k * kStep) * N + c];
        if (want_b) b[k] = partial_b[(p + k * kStep) * N + c];
      }
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        sg += static_cast<double>(g[k]);
        sb += static_cast<double>(b[k]);
      }
    }
    for (; p < parts; p += kStep) {
      if (want_g) sg += static_cast<double>(partial_g[p * N + c]);
      if (want_b) sb += static_cast<double>(partial_b[p * N + c]);
    }
  }
  acc_g[threadIdx.y][threadIdx.x] = sg;
  acc_b[threadIdx.y][threadIdx.x] = sb;
  __syncthreads();
  if (threadIdx.y == 0 && c < N) {
    double tg = acc_g[0][threadIdx.x], tb = acc_b[0][threadIdx.x];
#pragma unroll
    for (int k = 1; k < kSumLanes; ++k) {
      tg += acc_g[k][threadIdx.x];
      tb += acc_b[k][threadIdx.x];
    }
    if (want_g) dgamma[c] = static_cast<float>(tg);
    if (want_b) dbeta[c] = static_cast<float>(tb);
  }
}

// ---- General path: one block per row -----------------------------------------------------------

// x, y: (M, N) of T (float, or 16-bit: widened on load, rounded once on store); one block per row.
// xs: (M, N) of S, the rounded xhat, or null.
template <class T, class S>
__global__ void __launch_bounds__(kBlockThreads)
    ln_forward_block_kernel(const T* x, const float* gamma, const float* beta, T* y, float* mean,
                            float* rstd, S* xs, int64_t N, double eps) {
  __shared__ double scratch[32];
  const int64_t row = blockIdx.x;
  const T* xr = x + row * N;
  double s = 0.0;
  for (int64_t c = threadIdx.x; c < N; c += kBlockThreads)
    s += static_cast<double>(static_cast<float>(xr[c]));
  const double mu = dev::block_sum(s, scratch) / static_cast<double>(N);
  double sq = 0.0;
  for (int64_t c = threadIdx.x; c < N; c += kBlockThreads) {
    const double d = static_cast<double>(static_cast<float>(xr[c])) - mu;
    sq += d * d;
  }
  const double rs = 1.0 / sqrt(dev::block_sum(sq, scratch) / static_cast<double>(N) + eps);
  const float mu_f = static_cast<float>(mu), rs_f = static_cast<float>(rs);
  T* yr = y + row * N;
  for (int64_t c = threadIdx.x; c < N; c += kBlockThreads) {
    yr[c] = T(ln_out(static_cast<float>(xr[c]), mu_f, rs_f, gamma ? gamma[c] : 1.0f,
                     beta ? beta[c] : 0.0f));
    if (xs) xs[row * N + c] = S(__fmul_rn(__fsub_rn(static_cast<float>(xr[c]), mu_f), rs_f));
  }
  if (threadIdx.x == 0) {
    mean[row] = mu_f;
    rstd[row] = rs_f;
  }
}

// dy, x, dx: (M, N) of T; one block per row.
// x: (M, N) of X (x, or the saved xhat).
template <class T, class X>
__global__ void __launch_bounds__(kBlockThreads)
    ln_backward_block_kernel(const T* dy, const X* x, const float* gamma, const float* mean,
                             const float* rstd, T* dx, int64_t N) {
  __shared__ double scratch[32];
  const int64_t row = blockIdx.x;
  const X* xr = x + row * N;
  const T* dyr = dy + row * N;
  const float mu = mean ? mean[row] : 0.f, rs = rstd[row];
  double sum_g = 0.0, sum_gx = 0.0;
  for (int64_t c = threadIdx.x; c < N; c += kBlockThreads) {
    const float d = static_cast<float>(dyr[c]);
    const float g = gamma ? __fmul_rn(d, gamma[c]) : d;
    const float xhat = xhat_of<T, X>(xr[c], mu, rs);
    sum_g += static_cast<double>(g);
    sum_gx += static_cast<double>(g) * static_cast<double>(xhat);
  }
  const float a = static_cast<float>(dev::block_sum(sum_g, scratch) / static_cast<double>(N));
  const float b = static_cast<float>(dev::block_sum(sum_gx, scratch) / static_cast<double>(N));
  T* dxr = dx + row * N;
  for (int64_t c = threadIdx.x; c < N; c += kBlockThreads) {
    const float d = static_cast<float>(dyr[c]);
    const float g = gamma ? __fmul_rn(d, gamma[c]) : d;
    const float xhat = xhat_of<T, X>(xr[c], mu, rs);
    dxr[c] = T(ln_dx(g, a, xhat, b, rs));
  }
}

// dgamma/dbeta partial column sums over a chunk of rows. Block (32, 8), grid (column tiles,
// chunks). partial_g, partial_b: (chunks, N) doubles, or the outputs directly when chunks == 1.
template <class T, class X>
__global__ void ln_param_partial_kernel(const T* dy, const X* x, const float* mean,
                                        const float* rstd, int64_t M, int64_t N,
                                        int64_t rows_per_chunk, double* partial_g,
                                        double* partial_b, float* dgamma, float* dbeta) {
  __shared__ double acc_g[8][32], acc_b[8][32];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t r1 = r0 + rows_per_chunk < M ? r0 + rows_per_chunk : M;
  double g = 0.0, b = 0.0;
  if (c < N) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += 8) {
      const float d = static_cast<float>(dy[r * N + c]);
      const float xhat = xhat_of<T, X>(x[r * N + c], mean ? mean[r] : 0.f, rstd[r]);
      g += static_cast<double>(d) * static_cast<double>(xhat);
      b += static_cast<double>(d);
    }
  }
  acc_g[threadIdx.y][threadIdx.x] = g;
  acc_b[threadIdx.y][threadIdx.x] = b;
  __syncthreads();
  if (threadIdx.y == 0 && c < N) {
    double tg = acc_g[0][threadIdx.x], tb = acc_b[0][threadIdx.x];
#pragma unroll
    for (int k = 1; k < 8; ++k) {
      tg += acc_g[k][threadIdx.x];
      tb += acc_b[k][threadIdx.x];
    }
    if (gridDim.y == 1) {
      if (dgamma) dgamma[c] = static_cast<float>(tg);
      if (dbeta) dbeta[c] = static_cast<float>(tb);
    } else {
      partial_g[static_cast<int64_t>(blockIdx.y) * N + c] = tg;
      partial_b[static_cast<int64_t>(blockIdx.y) * N + c] = tb;
    }
  }
}

// partial: (chunks, N) doubles -> out: (N) floats, chunks in order.
__global__ void ln_param_final_kernel(const double* partial_g, const double* partial_b,
                                      int64_t chunks, int64_t N, float* dgamma, float* dbeta) {
  for (int64_t c = dev::global_thread(); c < N; c += dev::grid_stride()) {
    double tg = 0.0, tb = 0.0;
    for (int64_t k = 0; k < chunks; ++k) {
      tg += partial_g[k * N + c];
      tb += partial_b[k * N + c];
    }
    if (dgamma) dgamma[c] = static_cast<float>(tg);
    if (dbeta) dbeta[c] = static_cast<float>(tb);
  }
}

// The warp path takes rows of at most 1024 elements in whole 16-byte packs, every pointer 16-byte
// aligned (gamma and beta are read in packs' widths of f32 too).
template <class T>
bool fast_path(int64_t N, std::initializer_list<const void*> pointers) {
  if (N % Pack<T>::kN != 0 || N > 1024) return false;
  for (const void* p : pointers) {
    if (p && !detail::aligned16(p)) return false;
  }
  return true;
}

void check_shape(const char* name, int64_t M, int64_t N) {
  REGEN_CHECK(M >= 0 && N >= 0, name, ": negative shape (", M, ", ", N, ")");
  REGEN_CHECK(M <= 0x7fffffff, name, ": ", M, " rows are too many");
}

}  // namespace

namespace {
// The warp path's forward: (4, 8 warps) packs per lane up to 128 packs a row, else (8, 4 warps).
// xs: the rounded xhat (S), or null (S = T).
template <class T, class S>
void forward_warp(const T* x, const float* gamma, const float* beta, T* y, float* mean, float* rstd,
                  S* xs, int64_t M, int64_t N, double eps) {
  const int nvec = static_cast<int>(N / Pack<T>::kN);
  const auto* xp = reinterpret_cast<const Pack<T>*>(x);
  auto* yp = reinterpret_cast<Pack<T>*>(y);
  auto* sp = reinterpret_cast<LanesOf<T, S>*>(xs);
  if (nvec <= 32 * 4) {
    constexpr int kWarps = 8;
    const unsigned blocks = static_cast<unsigned>(detail::ceil_div(M, kWarps));
    ln_forward_warp_kernel<T, S, 4, kWarps>
        <<<blocks, kWarps * 32, 0, stream()>>>(xp, gamma, beta, yp, mean, rstd, sp, M, nvec, eps);
  } else {
    constexpr int kWarps = 4;
    const unsigned blocks = static_cast<unsigned>(detail::ceil_div(M, kWarps));
    ln_forward_warp_kernel<T, S, 8, kWarps>
        <<<blocks, kWarps * 32, 0, stream()>>>(xp, gamma, beta, yp, mean, rstd, sp, M, nvec, eps);
  }
}
}  // namespace

namespace {
// Every forward launcher's body: y (T) from x (T), and xhat kept in S where xs is not null.
template <class T, class S>
void forward_launch(const T* x, const float* gamma, const float* beta, T* y, float* mean,
                    float* rstd, S* xs, int64_t M, int64_t N, double eps) {
  check_shape("layernorm_forward", M, N);
  if (M == 0 || N == 0) return;
  if (fast_path<T>(N, {x, gamma, beta, y, xs})) {
    forward_warp<T, S>(x, gamma, beta, y, mean, rstd, xs, M, N, eps);
  } else {
    ln_forward_block_kernel<T, S><<<static_cast<unsigned>(M), kBlockThreads, 0, stream()>>>(
        x, gamma, beta, y, mean, rstd, xs, N, eps);
  }
  REGEN_CUDA_LAUNCH_CHECK("layernorm_forward");
}
}  // namespace

// x, y: (M, N); gamma, beta: (N) or null; mean, rstd: (M)
void layernorm_forward(const float* x, const float* gamma, const float* beta, float* y, float* mean,
                       float* rstd, int64_t M, int64_t N, double eps) {
  forward_launch<float, float>(x, gamma, beta, y, mean, rstd, nullptr, M, N, eps);
}

namespace {
// X: x's element type (T), or the saved xhat's (16-bit beside an f32 T; mean null).
template <class T, class X>
void backward_general(const T* dy, const X* x, const float* gamma, const float* mean,
                      const float* rstd, T* dx, float* dgamma, float* dbeta, int64_t M, int64_t N);

template <class T, class X, int kMaxVec, int kWarps>
void launch_backward_warp(const T* dy, const X* x, const float* gamma, const float* mean,
                          const float* rstd, T* dx, float* dgamma, float* dbeta, int64_t M,
                          int64_t N) {
  // The row partition depends only on M: blocks of rows_per_block rows, at most kMaxParts blocks.
  constexpr int64_t kMaxParts = 512;
  int64_t parts = detail::ceil_div(M, kWarps * 4);
  if (parts > kMaxParts) parts = kMaxParts;
  const int64_t rows_per_block = detail::ceil_div(M, parts);
  parts = detail::ceil_div(M, rows_per_block);
  const bool params = dgamma || dbeta;
  Workspace ws(detail::device(), params ? 2 * static_cast<uint64_t>(parts * N) * sizeof(float) : 0);
  if (dry_run_active()) return;  // the dry path (kernels.h): the workspace, requested and unused
  float* partial_g = params ? ws.as<float>() : nullptr;
  float* partial_b = params ? partial_g + parts * N : nullptr;
  ln_backward_warp_kernel<T, X, kMaxVec, kWarps>
      <<<static_cast<unsigned>(parts), kWarps * 32, 0, stream()>>>(
          reinterpret_cast<const Pack<T>*>(dy), reinterpret_cast<const LanesOf<T, X>*>(x), gamma,
          mean, rstd, reinterpret_cast<Pack<T>*>(dx), partial_g, partial_b, M,
          static_cast<int>(N / Pack<T>::kN), rows_per_block);
  REGEN_CUDA_LAUNCH_CHECK("layernorm_backward");
  if (!params) return;
  const unsigned tiles = static_cast<unsigned>(detail::ceil_div(N, 32));
  column_sums_kernel<<<tiles, dim3(32, kSumLanes), 0, stream()>>>(partial_g, partial_b, parts, N,
                                                                  dgamma, dbeta);
  REGEN_CUDA_LAUNCH_CHECK("layernorm_backward");
}

template <class T, class X>
void backward_warp(const T* dy, const X* x, const float* gamma, const float* mean,
                   const float* rstd, T* dx, float* dgamma, float* dbeta, int64_t M, int64_t N) {
  if (N / Pack<T>::kN <= 32 * 4) {
    launch_backward_warp<T, X, 4, 8>(dy, x, gamma, mean, rstd, dx, dgamma, dbeta, M, N);
  } else {
    launch_backward_warp<T, X, 8, 4>(dy, x, gamma, mean, rstd, dx, dgamma, dbeta, M, N);
  }
}
}  // namespace

namespace {
// Every backward launcher's body: x of X (x itself, or a saved xhat with mean null). The dry path
// (kernels.h): the partials' workspace of the path a real call takes (it depends on N and on the
// pointers' alignment, which a dry run's addresses keep), no kernel.
template <class T, class X>
void backward_launch(const T* dy, const X* x, const float* gamma, const float* mean,
                     const float* rstd, T* dx, float* dgamma, float* dbeta, int64_t M, int64_t N) {
  check_shape("layernorm_backward", M, N);
  if (N == 0) return;
  if (M == 0) {
    if (dry_run_active()) return;
    if (dgamma) fill(dgamma, N, 0.0f);
    if (dbeta) fill(dbeta, N, 0.0f);
    return;
  }
  if (dx && fast_path<T>(N, {dy, x, gamma, dx})) {
    backward_warp<T, X>(dy, x, gamma, mean, rstd, dx, dgamma, dbeta, M, N);
    return;
  }
  backward_general<T, X>(dy, x, gamma, mean, rstd, dx, dgamma, dbeta, M, N);
}
}  // namespace

// dy, x, dx: (M, N); gamma: (N) or null; mean, rstd: (M); dgamma, dbeta: (N) or null (written)
void layernorm_backward(const float* dy, const float* x, const float* gamma, const float* mean,
                        const float* rstd, float* dx, float* dgamma, float* dbeta, int64_t M,
                        int64_t N) {
  backward_launch<float, float>(dy, x, gamma, mean, rstd, dx, dgamma, dbeta, M, N);
}

namespace {
// The general path's backward (any N), for float and the 16-bit T: dx by one block per row, then
// dgamma/dbeta by column chunks (a workspace of partials when there is more than one chunk: the
// dry path requests it too).
template <class T, class X>
void backward_general(const T* dy, const X* x, const float* gamma, const float* mean,
                      const float* rstd, T* dx, float* dgamma, float* dbeta, int64_t M, int64_t N) {
  const bool dry = dry_run_active();
  if (!dry && dx) {
    ln_backward_block_kernel<T, X>
        <<<static_cast<unsigned>(M), kBlockThreads, 0, stream()>>>(dy, x, gamma, mean, rstd, dx, N);
    REGEN_CUDA_LAUNCH_CHECK("layernorm_backward");
  }
  if (!dgamma && !dbeta) return;
  constexpr int64_t kRowsPerChunk = 256, kMaxChunks = 128;
  int64_t chunks = detail::ceil_div(M, kRowsPerChunk);
  if (chunks > kMaxChunks) chunks = kMaxChunks;
  const int64_t rows_per_chunk = detail::ceil_div(M, chunks);
  chunks = detail::ceil_div(M, rows_per_chunk);
  Workspace ws(detail::device(),
               chunks > 1 ? 2 * static_cast<uint64_t>(chunks * N) * sizeof(double) : 0);
  if (dry) return;
  double* partial_g = chunks > 1 ? ws.as<double>() : nullptr;
  double* partial_b = chunks > 1 ? partial_g + chunks * N : nullptr;
  const dim3 grid(static_cast<unsigned>(detail::ceil_div(N, 32)), static_cast<unsigned>(chunks));
  ln_param_partial_kernel<T, X><<<grid, dim3(32, 8), 0, stream()>>>(
      dy, x, mean, rstd, M, N, rows_per_chunk, partial_g, partial_b, dgamma, dbeta);
  REGEN_CUDA_LAUNCH_CHECK("layernorm_backward");
  if (chunks > 1) {
    ln_param_final_kernel<<<detail::grid_blocks(N, 256), 256, 0, stream()>>>(
        partial_g, partial_b, chunks, N, dgamma, dbeta);
    REGEN_CUDA_LAUNCH_CHECK("layernorm_backward");
  }
}

}  // namespace

// The 16-bit launchers (declared beside the op, autograd/ops_layernorm.cpp): x, y, dy, dx bf16 or
// f16; gamma, beta, mean, rstd, dgamma, dbeta f32. The kernels above on widened elements (row
// sums in double, mean and rstd rounded to f32 as the CPU's), one rounding per stored element.
template <class T>
void layernorm_forward_lowp(const T* x, const float* gamma, const float* beta, T* y, float* mean,
                            float* rstd, int64_t M, int64_t N, double eps) {
  forward_launch<T, T>(x, gamma, beta, y, mean, rstd, nullptr, M, N, eps);
}
template <class T>
void layernorm_backward_lowp(const T* dy, const T* x, const float* gamma, const float* mean,
                             const float* rstd, T* dx, float* dgamma, float* dbeta, int64_t M,
                             int64_t N) {
  backward_launch<T, T>(dy, x, gamma, mean, rstd, dx, dgamma, dbeta, M, N);
}
// An f32 x under autocast: the f32 kernels, the forward also storing xhat rounded to S (bf16 or
// f16), the backward reading it in place of x.
template <class S>
void layernorm_forward_save_xhat(const float* x, const float* gamma, const float* beta, float* y,
                                 float* mean, float* rstd, S* xhat, int64_t M, int64_t N,
                                 double eps) {
  forward_launch<float, S>(x, gamma, beta, y, mean, rstd, xhat, M, N, eps);
}
template <class S>
void layernorm_backward_xhat(const float* dy, const S* xhat, const float* gamma, const float* rstd,
                             float* dx, float* dgamma, float* dbeta, int64_t M, int64_t N) {
  const float* no_mean = nullptr;
  backward_launch<float, S>(dy, xhat, gamma, no_mean, rstd, dx, dgamma, dbeta, M, N);
}

#define REGEN_LAYERNORM_HALF(T)                                                                  \
  template void layernorm_forward_lowp<T>(const T*, const float*, const float*, T*, float*,      \
                                          float*, int64_t, int64_t, double);                     \
  template void layernorm_backward_lowp<T>(const T*, const T*, const float*, const float*,       \
                                           const float*, T*, float*, float*, int64_t, int64_t);  \
  template void layernorm_forward_save_xhat<T>(const float*, const float*, const float*, float*, \
                                               float*, float*, T*, int64_t, int64_t, double);    \
  template void layernorm_backward_xhat<T>(const float*, const T*, const float*, const float*,   \
                                           float*, float*, float*, int64_t, int64_t);
REGEN_LAYERNORM_HALF(bfloat16)
REGEN_LAYERNORM_HALF(float16)
#undef REGEN_LAYERNORM_HALF

}  // namespace regen::cuda
