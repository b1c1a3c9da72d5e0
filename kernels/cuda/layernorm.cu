// CUDA layer normalization over the last dimension (declared in kernels/cuda/cuda_kernels.h; the
// 16-bit launchers layernorm_forward_lowp / layernorm_backward_lowp beside the op,
// autograd/ops_layernorm.cpp, take the general path below with 16-bit x, y, dy, dx;
// CPU reference kernels/cpu/layernorm.cpp; test tests/cuda/test_cuda_ops.cpp; timed by
// `regen bench kernels` against HBM bandwidth).
//
// Fast path (N % 4 == 0, N <= 1024, 16-byte aligned pointers, the Transformer case): one warp per
// row, the row held in registers as float4 (x read once); row sums in double like the CPU, so
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
__device__ __forceinline__ float4 load4(const float4* p, int64_t i) {
  return p[i];
}
__device__ __forceinline__ float get(const float4& v, int e) {
  return e == 0 ? v.x : e == 1 ? v.y : e == 2 ? v.z : v.w;
}
__device__ __forceinline__ void set(float4& v, int e, float f) {
  if (e == 0)
    v.x = f;
  else if (e == 1)
    v.y = f;
  else if (e == 2)
    v.z = f;
  else
    v.w = f;
}

// ---- Fast path: one warp per row ------------------------------------------------------------

// x, y: (M, N) as (M, nvec) float4; gamma, beta: (nvec) float4 or null; mean, rstd: (M).
template <int kMaxVec, int kWarps>
__global__ void __launch_bounds__(kWarps * 32)
    ln_forward_warp_kernel(const float4* x, const float4* gamma, const float4* beta, float4* y,
                           float* mean, float* rstd, int64_t M, int nvec, double eps) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (row >= M) return;
  const int N = nvec * 4;
  float4 v[kMaxVec];
  double s = 0.0;
#pragma unroll
  for (int k = 0; k < kMaxVec; ++k) {
    const int idx = lane + 32 * k;
    v[k] = idx < nvec ? load4(x, row * nvec + idx) : make_float4(0.f, 0.f, 0.f, 0.f);
    s += (static_cast<double>(v[k].x) + static_cast<double>(v[k].y)) +
         (static_cast<double>(v[k].z) + static_cast<double>(v[k].w));
  }
  const double mu = dev::warp_sum(s) / N;
  double sq = 0.0;
#pragma unroll
  for (int k = 0; k < kMaxVec; ++k) {
    if (lane + 32 * k < nvec) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const double d = static_cast<double>(get(v[k], e)) - mu;
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
      const float4 g = gamma ? gamma[idx] : make_float4(1.f, 1.f, 1.f, 1.f);
      const float4 b = beta ? beta[idx] : make_float4(0.f, 0.f, 0.f, 0.f);
      float4 out;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        // Without gamma the CPU adds beta to xhat directly; ln_out with g = 1 is the same value.
        set(out, e, ln_out(get(v[k], e), mu_f, rs_f, get(g, e), get(b, e)));
      }
      y[row * nvec + idx] = out;
    }
  }
  if (lane == 0) {
    mean[row] = mu_f;
    rstd[row] = rs_f;
  }
}

// dy, x, dx: (M, nvec) float4; gamma: (nvec) or null; mean, rstd: (M).
// partial_g, partial_b: (gridDim.x, N) per-block column sums, or null when not wanted.
template <int kMaxVec, int kWarps>
__global__ void __launch_bounds__(kWarps * 32)
    ln_backward_warp_kernel(const float4* dy, const float4* x, const float4* gamma,
                            const float* mean, const float* rstd, float4* dx, float* partial_g,
                            float* partial_b, int64_t M, int nvec, int64_t rows_per_block) {
  __shared__ float4 sg[256], sb[256];  // N <= 1024 columns
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int N = nvec * 4;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * rows_per_block;
  const int64_t r1 = r0 + rows_per_block < M ? r0 + rows_per_block : M;
  float4 acc_g[kMaxVec], acc_b[kMaxVec];
#pragma unroll
  for (int k = 0; k < kMaxVec; ++k) {
    acc_g[k] = make_float4(0.f, 0.f, 0.f, 0.f);
    acc_b[k] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
  for (int64_t row = r0 + warp; row < r1; row += kWarps) {
    float4 xv[kMaxVec], dv[kMaxVec];
    const float mu = mean[row], rs = rstd[row];
    double sum_g = 0.0, sum_gx = 0.0;
#pragma unroll
    for (int k = 0; k < kMaxVec; ++k) {
      const int idx = lane + 32 * k;
      if (idx < nvec) {
        xv[k] = x[row * nvec + idx];
        dv[k] = dy[row * nvec + idx];
        const float4 gm = gamma ? gamma[idx] : make_float4(1.f, 1.f, 1.f, 1.f);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float g = gamma ? __fmul_rn(get(dv[k], e), get(gm, e)) : get(dv[k], e);
          const float xhat = __fmul_rn(__fsub_rn(get(xv[k], e), mu), rs);
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
        const float4 gm = gamma ? gamma[idx] : make_float4(1.f, 1.f, 1.f, 1.f);
        float4 out;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float d = get(dv[k], e);
          const float g = gamma ? __fmul_rn(d, get(gm, e)) : d;
          const float xhat = __fmul_rn(__fsub_rn(get(xv[k], e), mu), rs);
          set(out, e, ln_dx(g, a, xhat, b, rs));
          set(acc_g[k], e, get(acc_g[k], e) + d * xhat);
          set(acc_b[k], e, get(acc_b[k], e) + d);
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
          if (w == 0) {
            sg[idx] = acc_g[k];
            sb[idx] = acc_b[k];
          } else {
            float4 g = sg[idx], b = sb[idx];
            g.x += acc_g[k].x;
            g.y += acc_g[k].y;
            g.z += acc_g[k].z;
            g.w += acc_g[k].w;
            b.x += acc_b[k].x;
            b.y += acc_b[k].y;
            b.z += acc_b[k].z;
            b.w += acc_b[k].w;
            sg[idx] = g;
            sb[idx] = b;
          }
        }
      }
    }
    __syncthreads();
  }
  const float* sgf = reinterpret_cast<const float*>(sg);
  const float* sbf = reinterpret_cast<const float*>(sb);
  for (int c = threadIdx.x; c < N; c += kWarps * 32) {
    if (partial_g) partial_g[static_cast<int64_t>(blockIdx.x) * N + c] = sgf[c];
    if (partial_b) partial_b[static_cast<int64_t>(blockIdx.x) * N + c] = sbf[c];
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
template <class T>
__global__ void __launch_bounds__(kBlockThreads)
    ln_forward_block_kernel(const T* x, const float* gamma, const float* beta, T* y, float* mean,
                            float* rstd, int64_t N, double eps) {
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
  }
  if (threadIdx.x == 0) {
    mean[row] = mu_f;
    rstd[row] = rs_f;
  }
}

// dy, x, dx: (M, N) of T; one block per row.
template <class T>
__global__ void __launch_bounds__(kBlockThreads)
    ln_backward_block_kernel(const T* dy, const T* x, const float* gamma, const float* mean,
                             const float* rstd, T* dx, int64_t N) {
  __shared__ double scratch[32];
  const int64_t row = blockIdx.x;
  const T *xr = x + row * N, *dyr = dy + row * N;
  const float mu = mean[row], rs = rstd[row];
  double sum_g = 0.0, sum_gx = 0.0;
  for (int64_t c = threadIdx.x; c < N; c += kBlockThreads) {
    const float d = static_cast<float>(dyr[c]);
    const float g = gamma ? __fmul_rn(d, gamma[c]) : d;
    const float xhat = __fmul_rn(__fsub_rn(static_cast<float>(xr[c]), mu), rs);
    sum_g += static_cast<double>(g);
    sum_gx += static_cast<double>(g) * static_cast<double>(xhat);
  }
  const float a = static_cast<float>(dev::block_sum(sum_g, scratch) / static_cast<double>(N));
  const float b = static_cast<float>(dev::block_sum(sum_gx, scratch) / static_cast<double>(N));
  T* dxr = dx + row * N;
  for (int64_t c = threadIdx.x; c < N; c += kBlockThreads) {
    const float d = static_cast<float>(dyr[c]);
    const float g = gamma ? __fmul_rn(d, gamma[c]) : d;
    const float xhat = __fmul_rn(__fsub_rn(static_cast<float>(xr[c]), mu), rs);
    dxr[c] = T(ln_dx(g, a, xhat, b, rs));
  }
}

// dgamma/dbeta partial column sums over a chunk of rows. Block (32, 8), grid (column tiles,
// chunks). partial_g, partial_b: (chunks, N) doubles, or the outputs directly when chunks == 1.
template <class T>
__global__ void ln_param_partial_kernel(const T* dy, const T* x, const float* mean,
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
      const float xhat = __fmul_rn(__fsub_rn(static_cast<float>(x[r * N + c]), mean[r]), rstd[r]);
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

bool fast_path(int64_t N, std::initializer_list<const void*> pointers) {
  if (N % 4 != 0 || N > 1024) return false;
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

// x, y: (M, N); gamma, beta: (N) or null; mean, rstd: (M)
void layernorm_forward(const float* x, const float* gamma, const float* beta, float* y, float* mean,
                       float* rstd, int64_t M, int64_t N, double eps) {
  check_shape("layernorm_forward", M, N);
  if (M == 0 || N == 0) return;
  if (fast_path(N, {x, gamma, beta, y})) {
    const int nvec = static_cast<int>(N / 4);
    const auto* x4 = reinterpret_cast<const float4*>(x);
    const auto* g4 = reinterpret_cast<const float4*>(gamma);
    const auto* b4 = reinterpret_cast<const float4*>(beta);
    auto* y4 = reinterpret_cast<float4*>(y);
    if (nvec <= 32 * 4) {
      constexpr int kWarps = 8;
      const unsigned blocks = static_cast<unsigned>(detail::ceil_div(M, kWarps));
      ln_forward_warp_kernel<4, kWarps>
          <<<blocks, kWarps * 32, 0, stream()>>>(x4, g4, b4, y4, mean, rstd, M, nvec, eps);
    } else {
      constexpr int kWarps = 4;
      const unsigned blocks = static_cast<unsigned>(detail::ceil_div(M, kWarps));
      ln_forward_warp_kernel<8, kWarps>
          <<<blocks, kWarps * 32, 0, stream()>>>(x4, g4, b4, y4, mean, rstd, M, nvec, eps);
    }
  } else {
    ln_forward_block_kernel<float><<<static_cast<unsigned>(M), kBlockThreads, 0, stream()>>>(
        x, gamma, beta, y, mean, rstd, N, eps);
  }
  REGEN_CUDA_LAUNCH_CHECK("layernorm_forward");
}

namespace {
template <class T>
void backward_general(const T* dy, const T* x, const float* gamma, const float* mean,
                      const float* rstd, T* dx, float* dgamma, float* dbeta, int64_t M, int64_t N);

template <int kMaxVec, int kWarps>
void launch_backward_warp(const float* dy, const float* x, const float* gamma, const float* mean,
                          const float* rstd, float* dx, float* dgamma, float* dbeta, int64_t M,
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
  ln_backward_warp_kernel<kMaxVec, kWarps>
      <<<static_cast<unsigned>(parts), kWarps * 32, 0, stream()>>>(
          reinterpret_cast<const float4*>(dy), reinterpret_cast<const float4*>(x),
          reinterpret_cast<const float4*>(gamma), mean, rstd, reinterpret_cast<float4*>(dx),
          partial_g, partial_b, M, static_cast<int>(N / 4), rows_per_block);
  REGEN_CUDA_LAUNCH_CHECK("layernorm_backward");
  if (!params) return;
  const unsigned tiles = static_cast<unsigned>(detail::ceil_div(N, 32));
  column_sums_kernel<<<tiles, dim3(32, kSumLanes), 0, stream()>>>(partial_g, partial_b, parts, N,
                                                                  dgamma, dbeta);
  REGEN_CUDA_LAUNCH_CHECK("layernorm_backward");
}
}  // namespace

// dy, x, dx: (M, N); gamma: (N) or null; mean, rstd: (M); dgamma, dbeta: (N) or null (written)
void layernorm_backward(const float* dy, const float* x, const float* gamma, const float* mean,
                        const float* rstd, float* dx, float* dgamma, float* dbeta, int64_t M,
                        int64_t N) {
  check_shape("layernorm_backward", M, N);
  if (N == 0) return;
  // The dry path (kernels.h): the partials' workspace of the path a real call takes (it depends
  // on N and on the pointers' alignment, which a dry run's addresses keep), no kernel.
  const bool dry = dry_run_active();
  if (M == 0) {
    if (dry) return;
    if (dgamma) fill(dgamma, N, 0.0f);
    if (dbeta) fill(dbeta, N, 0.0f);
    return;
  }
  if (fast_path(N, {dy, x, gamma, dx})) {
    if (N / 4 <= 32 * 4) {
      launch_backward_warp<4, 8>(dy, x, gamma, mean, rstd, dx, dgamma, dbeta, M, N);
    } else {
      launch_backward_warp<8, 4>(dy, x, gamma, mean, rstd, dx, dgamma, dbeta, M, N);
    }
    return;
  }
  backward_general(dy, x, gamma, mean, rstd, dx, dgamma, dbeta, M, N);
}

namespace {
// The general path's backward (any N), for float and the 16-bit T: dx by one block per row, then
// dgamma/dbeta by column chunks (a workspace of partials when there is more than one chunk: the
// dry path requests it too).
template <class T>
void backward_general(const T* dy, const T* x, const float* gamma, const float* mean,
                      const float* rstd, T* dx, float* dgamma, float* dbeta, int64_t M, int64_t N) {
  const bool dry = dry_run_active();
  if (!dry && dx) {
    ln_backward_block_kernel<T>
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
  ln_param_partial_kernel<T><<<grid, dim3(32, 8), 0, stream()>>>(
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
// f16; gamma, beta, mean, rstd, dgamma, dbeta f32. The general path's kernels on widened elements
// (row sums in double, mean and rstd rounded to f32 as the CPU's), one rounding per stored element.
template <class T>
void layernorm_forward_lowp(const T* x, const float* gamma, const float* beta, T* y, float* mean,
                            float* rstd, int64_t M, int64_t N, double eps) {
  check_shape("layernorm_forward", M, N);
  if (M == 0 || N == 0) return;
  ln_forward_block_kernel<T><<<static_cast<unsigned>(M), kBlockThreads, 0, stream()>>>(
      x, gamma, beta, y, mean, rstd, N, eps);
  REGEN_CUDA_LAUNCH_CHECK("layernorm_forward");
}
template <class T>
void layernorm_backward_lowp(const T* dy, const T* x, const float* gamma, const float* mean,
                             const float* rstd, T* dx, float* dgamma, float* dbeta, int64_t M,
                             int64_t N) {
  check_shape("layernorm_backward", M, N);
  if (N == 0) return;
  if (M == 0) {
    if (dry_run_active()) return;
    if (dgamma) fill(dgamma, N, 0.0f);
    if (dbeta) fill(dbeta, N, 0.0f);
    return;
  }
  backward_general(dy, x, gamma, mean, rstd, dx, dgamma, dbeta, M, N);
}
#define REGEN_LAYERNORM_HALF(T)                                                             \
  template void layernorm_forward_lowp<T>(const T*, const float*, const float*, T*, float*, \
                                          float*, int64_t, int64_t, double);                \
  template void layernorm_backward_lowp<T>(const T*, const T*, const float*, const float*,  \
                                           const float*, T*, float*, float*, int64_t, int64_t);
REGEN_LAYERNORM_HALF(bfloat16)
REGEN_LAYERNORM_HALF(float16)
#undef REGEN_LAYERNORM_HALF

}  // namespace regen::cuda
