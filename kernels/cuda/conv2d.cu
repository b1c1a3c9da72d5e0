// CUDA 2-D convolution (declared in kernels/cuda/cuda_kernels.h; CPU reference
// kernels/cpu/conv2d.cpp; test tests/cuda/test_cuda_ops.cpp; timed against cuDNN by
// `regen bench kernels`). The cuDNN path is kernels/cuda/conv2d_cudnn.cu, chosen by
// set_conv_algo(ConvAlgo::cudnn).
//
// Native path: the three passes are implicit GEMMs (the im2col matrix is never materialized; its
// elements are gathered from the NCHW tensors while a tile is staged in shared memory):
//
//   forward          C[m = (n,p,q), k]   = sum over (c,r,s) x[n,c,p*sh-ph+r,q*sw-pw+s] * w[k,c,r,s]
//   backward-data    C[m = (n,h,w), c]   = sum over (k,r,s) dy[n,k,(h+ph-r)/sh,(w+pw-s)/sw] *
//   w[k,c,r,s]
//                    (terms whose division is inexact or out of range are zero)
//
// Backward-data with a stride runs as sh*sw independent problems, one per output phase (rows
// h = rh + sh*i, columns w = rw + sw*j): only the taps r = r0 + sh*a (r0 = (rh+ph) mod sh), and
// likewise s, reach a phase, and for them p = i - a + (rh+ph-r0)/sh exactly. So each phase is a
// unit-stride gather over its own sub-filter, with no divisions and no taps that are always zero
// (a stride-2 layer gathered every tap before and multiplied three zeros of four); a phase that
// no tap reaches (a 1x1 kernel's odd rows) is zeros. With stride 1 there is one phase, the whole
// problem, summed in the same order as before.
//   backward-filter  C[m = (c,r,s), k]   = sum over (n,p,q) x[n,c,p*sh-ph+r,q*sw-pw+s] *
//   dy[n,k,p,q]
//
// One kernel template runs all three: a 128 x 64 output tile per block of 256 threads, each
// thread owning an 8 x 4 register tile; the reduction dimension advances 16 at a time through
// double-buffered shared memory (the next slice is fetched into registers while the current one is
// multiplied). The m dimension is the one that is contiguous in the output tensor, so the
// epilogue (staged through shared memory) writes coalesced rows. Per-thread index arithmetic is
// hoisted out of the main loop: pixel coordinates once per block, the (c,r,s) / (k,r,s)
// decomposition of the reduction index from a small table built per call (no division in the
// loop for forward and backward-data).
//
// Determinism: every output is one thread's sum over the reduction index in a fixed order. When
// the grid would be too small for the GPU, the reduction is split into a shape-determined number
// of chunks (split-K) whose partial results go to a workspace and are added in chunk order by a
// second kernel. No atomics anywhere; dbias is a fixed-order block reduction per channel.
// Indices are 32-bit: every tensor must have fewer than 2^31 elements (checked).
//
// 16-bit tensors (E = bfloat16 or float16; kernels.h cuda::kHalfLaunchers): the same kernels, with
// every element widened to f32 as it is loaded into shared memory, so products and sums are f32;
// each output is rounded to 16 bits once, in the writer or the split reduction, after the bias (if
// any) is added in f32, as the CPU's 16-bit passes (kernels/cpu/conv2d.cpp) do. Split partials stay
// f32. dw is the f32 sum rounded once; dbias is summed in double and rounded once (to f32, then to
// E, as the CPU does), and a null dw asks for dbias alone. Backward-data may add a per-channel
// bias before its rounding: conv_transpose2d's 16-bit forward (conv2d_backward_data_with_bias).
#include <type_traits>
#include <vector>

#include "regen/core/tensor.h"
#include "regen/kernels/cuda/common.cuh"
#include "regen/kernels/cuda/conv2d_cudnn.h"
#include "regen/kernels/cuda/conv2d_tc.h"
#include "regen/kernels/cuda/cuda_kernels.h"

namespace regen::cuda {
namespace {

ConvAlgo g_conv_algo = ConvAlgo::native;

constexpr int kBM = 128, kBN = 64, kBK = 16, kThreads = 256;
constexpr int kAStride = kBM + 4;  // shared row strides (floats), multiples of 4 for float4 reads
constexpr int kBStride = kBN + 4;
constexpr int kCStride = kBM + 4;
constexpr int kTileFloats = 2 * kBK * kAStride + 2 * kBK * kBStride;
constexpr int kEpilogueFloats = kBN * kCStride;
constexpr int kSmemFloats = kTileFloats > kEpilogueFloats ? kTileFloats : kEpilogueFloats;
constexpr int kBig = 1 << 28;  // an offset that makes any bounds test fail, without overflow

// An element widened to f32: through the read-only cache for float, a plain 16-bit load otherwise.
template <class E>
__device__ __forceinline__ float ld(const E* p) {
  if constexpr (std::is_same<E, float>::value) {
    return __ldg(p);
  } else {
    return static_cast<float>(*p);
  }
}

// The reduction index table of forward and backward-data: entry kd = {offset, r, s, 0}; entries
// past Kdim (up to a multiple of kBK) hold an r that fails every bounds test.
// forward:       kd = (c, r, s) -> offset c*H*W + r*W + s (scale H*W, row W, col 1), invalid -kBig
// backward-data: kd = (k, r, s) -> offset k*P*Q (scale P*Q, row 0, col 0),           invalid +kBig
__global__ void conv_table_kernel(int4* table, int Kdim, int Kpad, int RS, int S, int scale,
                                  int row, int col, int invalid_r) {
  for (int kd = blockIdx.x * blockDim.x + threadIdx.x; kd < Kpad; kd += gridDim.x * blockDim.x) {
    if (kd < Kdim) {
      const int c = kd / RS, rs = kd - c * RS, r = rs / S, s = rs - r * S;
      table[kd] = make_int4(c * scale + r * row + s * col, r, s, 0);
    } else {
      table[kd] = make_int4(0, invalid_r, invalid_r, 0);
    }
  }
}

// ---- Problem descriptions: loaders (global -> registers -> shared) and writers ---------------
// Thread layouts of the loaders: lane/warp of threadIdx.x. The compute layout is fixed:
// ty = tid / 16 owns tile rows ty*4..ty*4+3 and 64+ty*4..+3, tx = tid % 16 owns columns tx*4..+3.

template <class E>
struct ForwardProblem {
  const E* x;      // (N, C, H, W)
  const E* w;      // (K, C*R*S)
  const E* bias;   // (K) or null (added by the writer only when not split)
  E* out;          // y (N, K, P, Q)
  float* partial;  // split partials (splits, N, K, P, Q), or null: the writer writes y
  const int4* table;
  int M, Ncol, Kdim;  // N*P*Q, K, C*R*S
  int H, W, P, Q, PQ, CHW, KPQ, sh, sw, ph, pw;
  int kchunk;
  int64_t split_stride;

  static constexpr int kA = 8, kB = 4;
  struct Loader {
    // A: m = m0 + lane + 32*i (i < 4), kd = k0 + warp + 8*j (j < 2). B: kd = k0 + tid % 16,
    // n = n0 + tid / 16 + 16*i (i < 4).
    int base[4], h0[4], w0[4];
    int a_m[4], a_k[2];
    int b_k, b_n[4];
    const E* wrow[4];
    __device__ Loader(const ForwardProblem& pr, int tid, int m0, int n0) {
      const int lane = tid & 31, warp = tid >> 5;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        a_m[i] = lane + 32 * i;
        const int m = m0 + a_m[i];
        if (m < pr.M) {
          const int n = m / pr.PQ, pq = m - n * pr.PQ, p = pq / pr.Q, q = pq - p * pr.Q;
          h0[i] = p * pr.sh - pr.ph;
          w0[i] = q * pr.sw - pr.pw;
          base[i] = n * pr.CHW + h0[i] * pr.W + w0[i];
        } else {
          h0[i] = -kBig;
          w0[i] = -kBig;
          base[i] = 0;
        }
      }
      a_k[0] = warp;
      a_k[1] = warp + 8;
      b_k = tid & 15;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        b_n[i] = (tid >> 4) + 16 * i;
        const int k = n0 + b_n[i];
        wrow[i] = k < pr.Ncol ? pr.w + static_cast<int64_t>(k) * pr.Kdim : nullptr;
      }
    }
    __device__ void load(const ForwardProblem& pr, int k0, int kend, float (&a)[kA],
                         float (&b)[kB]) const {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int4 e = pr.table[k0 + a_k[j]];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int h = h0[i] + e.y, w = w0[i] + e.z;
          a[j * 4 + i] = (static_cast<unsigned>(h) < static_cast<unsigned>(pr.H) &&
                          static_cast<unsigned>(w) < static_cast<unsigned>(pr.W))
                             ? ld(pr.x + base[i] + e.x)
                             : 0.0f;
        }
      }
      const int kd = k0 + b_k;
#pragma unroll
      for (int i = 0; i < 4; ++i) b[i] = (wrow[i] && kd < kend) ? ld(wrow[i] + kd) : 0.0f;
    }
    __device__ void store(float* As, float* Bs, const float (&a)[kA], const float (&b)[kB]) const {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
#pragma unroll
        for (int i = 0; i < 4; ++i) As[a_k[j] * kAStride + a_m[i]] = a[j * 4 + i];
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) Bs[b_k * kBStride + b_n[i]] = b[i];
    }
  };
  struct Writer {  // thread writes m = m0 + tid % 128 for 32 values of n
    int64_t offset;
    bool valid;
    __device__ Writer(const ForwardProblem& pr, int tid, int m0) {
      const int m = m0 + (tid & (kBM - 1));
      valid = m < pr.M;
      const int n = valid ? m / pr.PQ : 0;
      offset = valid ? static_cast<int64_t>(n) * pr.KPQ + (m - n * pr.PQ) : 0;
    }
    __device__ void store(const ForwardProblem& pr, int z, int k, float v) const {
      if (!valid || k >= pr.Ncol) return;
      const int64_t at = offset + static_cast<int64_t>(k) * pr.PQ;
      if (pr.partial) {
        pr.partial[z * pr.split_stride + at] = v;
        return;
      }
      if (pr.bias) v += static_cast<float>(pr.bias[k]);
      pr.out[at] = E(v);
    }
  };
};

// One output phase of backward-data (see the top of the file): rows rh + sh*i (i < Hs), columns
// rw + sw*j (j < Ws), taps (k, a, b) of the phase's sub-filter.
template <class E>
struct DataGradProblem {
  const E* dy;     // (N, K, P, Q)
  const E* wt;     // the phase's sub-filter, transposed to (K*Rs*Ss, C)
  const E* bias;   // (C) or null: added to dx in f32 before its rounding (16-bit only)
  E* out;          // dx (N, C, H, W)
  float* partial;  // split partials (splits, C, M), compact, or null: the writer writes dx
  const int4* table;
  int M, Ncol, Kdim;   // N*Hs*Ws, C, K*Rs*Ss
  int HWs, Ws;         // the phase's rows times columns, and columns
  int oh, ow;          // p = i + oh - a, q = j + ow - b
  int rh, rw, sh, sw;  // dx row of (i): rh + sh*i; column of (j): rw + sw*j
  int W, HW, P, Q, KPQ, CHW;
  int kchunk;
  int64_t split_stride;

  static constexpr int kA = 8, kB = 4;
  struct Loader {
    // A: m = m0 + lane + 32*i, kd = k0 + warp + 8*j. B: n = n0 + tid % 64, kd = k0 + tid/64 + 4*i.
    int base[4], hh[4], ww[4];
    int a_m[4], a_k[2];
    int b_n, b_k[4];
    bool b_valid;
    __device__ Loader(const DataGradProblem& pr, int tid, int m0, int n0) {
      const int lane = tid & 31, warp = tid >> 5;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        a_m[i] = lane + 32 * i;
        const int m = m0 + a_m[i];
        if (m < pr.M) {
          const int n = m / pr.HWs, ij = m - n * pr.HWs, r = ij / pr.Ws, c = ij - r * pr.Ws;
          hh[i] = r + pr.oh;
          ww[i] = c + pr.ow;
          base[i] = n * pr.KPQ;
        } else {
          hh[i] = -kBig;
          ww[i] = -kBig;
          base[i] = 0;
        }
      }
      a_k[0] = warp;
      a_k[1] = warp + 8;
      b_n = tid & 63;
      b_valid = n0 + b_n < pr.Ncol;
#pragma unroll
      for (int i = 0; i < 4; ++i) b_k[i] = (tid >> 6) + 4 * i;
    }
    __device__ void load(const DataGradProblem& pr, int k0, int kend, float (&a)[kA],
                         float (&b)[kB]) const {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int4 e = pr.table[k0 + a_k[j]];  // {k*P*Q, a, b}
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int p = hh[i] - e.y, q = ww[i] - e.z;
          const bool ok = static_cast<unsigned>(p) < static_cast<unsigned>(pr.P) &&
                          static_cast<unsigned>(q) < static_cast<unsigned>(pr.Q);
          a[j * 4 + i] = ok ? ld(pr.dy + base[i] + e.x + p * pr.Q + q) : 0.0f;
        }
      }
      const int c = blockIdx.y * kBN + b_n;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int kd = k0 + b_k[i];
        b[i] = (b_valid && kd < kend) ? ld(pr.wt + static_cast<int64_t>(kd) * pr.Ncol + c) : 0.0f;
      }
    }
    __device__ void store(float* As, float* Bs, const float (&a)[kA], const float (&b)[kB]) const {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
#pragma unroll
        for (int i = 0; i < 4; ++i) As[a_k[j] * kAStride + a_m[i]] = a[j * 4 + i];
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) Bs[b_k[i] * kBStride + b_n] = b[i];
    }
  };
  // dx's flat index of the phase's row m, channel 0 (a channel adds HW).
  __device__ __host__ int64_t dx_offset(int m) const {
    const int n = m / HWs, ij = m - n * HWs, i = ij / Ws, j = ij - i * Ws;
    return static_cast<int64_t>(n) * CHW + static_cast<int64_t>(rh + sh * i) * W + rw + sw * j;
  }
  struct Writer {
    int m;
    int64_t offset;
    bool valid;
    __device__ Writer(const DataGradProblem& pr, int tid, int m0) {
      m = m0 + (tid & (kBM - 1));
      valid = m < pr.M;
      offset = valid ? pr.dx_offset(m) : 0;
    }
    __device__ void store(const DataGradProblem& pr, int z, int c, float v) const {
      if (!valid || c >= pr.Ncol) return;
      if (pr.partial) {
        pr.partial[z * pr.split_stride + static_cast<int64_t>(c) * pr.M + m] = v;
      } else {
        if (pr.bias) v += static_cast<float>(pr.bias[c]);
        pr.out[offset + static_cast<int64_t>(c) * pr.HW] = E(v);
      }
    }
  };
};

template <class E>
struct FilterGradProblem {
  const E* x;         // (N, C, H, W)
  const E* dy;        // (N, K, P, Q)
  E* out;             // dw (K, C*R*S)
  float* partial;     // split partials (splits, K, C*R*S), or null: the writer writes dw
  int M, Ncol, Kdim;  // C*R*S, K, N*P*Q
  int H, W, HW, CHW, RS, S, Q, PQ, KPQ, sh, sw, ph, pw;
  int kchunk;
  int64_t split_stride;

  static constexpr int kA = 8, kB = 4;
  struct Loader {
    // Both operands: kd = k0 + tid % 16. A: m = m0 + tid/16 + 16*i (i < 8). B: n = n0 + tid/16 +
    // 16*i (i < 4).
    int coff[8], rr[8], ss[8];
    int a_m[8];
    int kk;
    int dy_col[4];
    __device__ Loader(const FilterGradProblem& pr, int tid, int m0, int n0) {
      kk = tid & 15;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        a_m[i] = (tid >> 4) + 16 * i;
        const int m = m0 + a_m[i];
        if (m < pr.M) {
          const int c = m / pr.RS, rs = m - c * pr.RS, r = rs / pr.S;
          coff[i] = c * pr.HW;
          rr[i] = r;
          ss[i] = rs - r * pr.S;
        } else {
          coff[i] = 0;
          rr[i] = -kBig;
          ss[i] = -kBig;
        }
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int k = n0 + (tid >> 4) + 16 * i;
        dy_col[i] = k < pr.Ncol ? k * pr.PQ : -1;
      }
    }
    __device__ void load(const FilterGradProblem& pr, int k0, int kend, float (&a)[kA],
                         float (&b)[kB]) const {
      const int kd = k0 + kk;
      int hb = -kBig, wb = -kBig, xbase = 0, dybase = 0;
      const bool kd_ok = kd < kend;
      if (kd_ok) {
        const int n = kd / pr.PQ, pq = kd - n * pr.PQ, p = pq / pr.Q, q = pq - p * pr.Q;
        hb = p * pr.sh - pr.ph;
        wb = q * pr.sw - pr.pw;
        xbase = n * pr.CHW;
        dybase = n * pr.KPQ + pq;
      }
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int h = hb + rr[i], w = wb + ss[i];
        a[i] = (static_cast<unsigned>(h) < static_cast<unsigned>(pr.H) &&
                static_cast<unsigned>(w) < static_cast<unsigned>(pr.W))
                   ? ld(pr.x + xbase + coff[i] + h * pr.W + w)
                   : 0.0f;
      }
#pragma unroll
      for (int i = 0; i < 4; ++i)
        b[i] = (kd_ok && dy_col[i] >= 0) ? ld(pr.dy + dybase + dy_col[i]) : 0.0f;
    }
    __device__ void store(float* As, float* Bs, const float (&a)[kA], const float (&b)[kB]) const {
#pragma unroll
      for (int i = 0; i < 8; ++i) As[kk * kAStride + a_m[i]] = a[i];
#pragma unroll
      for (int i = 0; i < 4; ++i) Bs[kk * kBStride + a_m[i]] = b[i];  // n_local == a_m[i] for i < 4
    }
  };
  struct Writer {
    int m;
    bool valid;
    __device__ Writer(const FilterGradProblem& pr, int tid, int m0) {
      m = m0 + (tid & (kBM - 1));
      valid = m < pr.M;
    }
    __device__ void store(const FilterGradProblem& pr, int z, int k, float v) const {
      if (!valid || k >= pr.Ncol) return;
      const int64_t at = static_cast<int64_t>(k) * pr.M + m;
      if (pr.partial) {
        pr.partial[z * pr.split_stride + at] = v;
      } else {
        pr.out[at] = E(v);
      }
    }
  };
};

// ---- The implicit-GEMM kernel ------------------------------------------------------------------

// One kBK slice: acc[i][j] += A[kk][row i] * B[kk][col j] for the thread's 8 rows and 4 columns.
__device__ __forceinline__ void multiply_slice(const float* As, const float* Bs, int tx, int ty,
                                               float (&acc)[8][4]) {
#pragma unroll
  for (int kk = 0; kk < kBK; ++kk) {
    const float4 a0 = *reinterpret_cast<const float4*>(As + kk * kAStride + ty * 4);
    const float4 a1 = *reinterpret_cast<const float4*>(As + kk * kAStride + 64 + ty * 4);
    const float4 b4 = *reinterpret_cast<const float4*>(Bs + kk * kBStride + tx * 4);
    const float a[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
    const float b[4] = {b4.x, b4.y, b4.z, b4.w};
#pragma unroll
    for (int i = 0; i < 8; ++i) {
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
  }
}

// grid: (ceil(M / 128), ceil(Ncol / 64), splits). Split z reduces kd in
// [z*kchunk, min(Kdim, (z+1)*kchunk)).
template <class Problem>
__global__ void __launch_bounds__(kThreads, 2) conv_igemm_kernel(const Problem pr) {
  __shared__ __align__(16) float smem[kSmemFloats];
  float* As = smem;                       // [2][kBK][kAStride]
  float* Bs = smem + 2 * kBK * kAStride;  // [2][kBK][kBStride]
  const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
  const int m0 = blockIdx.x * kBM, n0 = blockIdx.y * kBN;
  const int kbeg = blockIdx.z * pr.kchunk;
  const int kend = kbeg + pr.kchunk < pr.Kdim ? kbeg + pr.kchunk : pr.Kdim;

  const typename Problem::Loader loader(pr, tid, m0, n0);
  float a[Problem::kA], b[Problem::kB];
  float acc[8][4];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;
  }
  loader.load(pr, kbeg, kend, a, b);
  loader.store(As, Bs, a, b);
  __syncthreads();
  int buf = 0;
  for (int k0 = kbeg; k0 < kend; k0 += kBK) {
    const bool has_next = k0 + kBK < kend;
    if (has_next) loader.load(pr, k0 + kBK, kend, a, b);  // in flight during the multiply
    multiply_slice(As + buf * kBK * kAStride, Bs + buf * kBK * kBStride, tx, ty, acc);
    if (has_next)
      loader.store(As + (buf ^ 1) * kBK * kAStride, Bs + (buf ^ 1) * kBK * kBStride, a, b);
    __syncthreads();
    buf ^= 1;
  }

  // Epilogue: stage the tile as Cs[n][m] (the loop's last barrier freed the tile buffers), then
  // each thread writes one m for 32 values of n, so a warp writes 32 consecutive m.
  float* Cs = smem;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    float* col = Cs + (tx * 4 + j) * kCStride;
    *reinterpret_cast<float4*>(col + ty * 4) =
        make_float4(acc[0][j], acc[1][j], acc[2][j], acc[3][j]);
    *reinterpret_cast<float4*>(col + 64 + ty * 4) =
        make_float4(acc[4][j], acc[5][j], acc[6][j], acc[7][j]);
  }
  __syncthreads();
  const typename Problem::Writer writer(pr, tid, m0);
  const int m_local = tid & (kBM - 1);
#pragma unroll 4
  for (int n_local = tid >> 7; n_local < kBN; n_local += kThreads / kBM) {
    writer.store(pr, blockIdx.z, n0 + n_local, Cs[n_local * kCStride + m_local]);
  }
}

// out: (size) = sum over z < splits of partial[z * size + i], in z order (+ bias[(i / PQ) % K]),
// rounded once to E.
template <class E>
__global__ void split_reduce_kernel(const float* partial, int splits, int64_t size, E* out,
                                    const E* bias, int64_t PQ, int64_t K) {
  for (int64_t i = dev::global_thread(); i < size; i += dev::grid_stride()) {
    float v = partial[i];
    for (int z = 1; z < splits; ++z) v += partial[z * size + i];
    if (bias) v += static_cast<float>(bias[(i / PQ) % K]);
    out[i] = E(v);
  }
}

// w: (K, C, R, S) -> wt: (K*Rs*Ss, C), the sub-filter of taps r = r0 + sh*a (a < Rs) and
// s = s0 + sw*b (b < Ss), transposed: row kd = (k*Rs + a)*Ss + b. Stride 1: the whole filter.
template <class E>
__global__ void transpose_filter_kernel(const E* w, E* wt, int K, int C, int R, int S, int r0,
                                        int s0, int sh, int sw, int Rs, int Ss) {
  const int RSs = Rs * Ss;
  const int64_t total = static_cast<int64_t>(K) * C * RSs;
  for (int64_t i = dev::global_thread(); i < total; i += dev::grid_stride()) {
    const int64_t kd = i / C;
    const int c = static_cast<int>(i - kd * C);
    const int k = static_cast<int>(kd / RSs),
              ab = static_cast<int>(kd - static_cast<int64_t>(k) * RSs);
    const int a = ab / Ss, b = ab - a * Ss;
    wt[i] = w[((static_cast<int64_t>(k) * C + c) * R + r0 + sh * a) * S + s0 + sw * b];
  }
}

// Backward-data's split partials (splits, C, M) of one phase -> dx: each value the sum over z in
// z order (+ the channel's bias), rounded once to E and written to its place in dx.
template <class E>
__global__ void dgrad_reduce_kernel(const DataGradProblem<E> pr, const float* partial, int splits) {
  const int64_t size = static_cast<int64_t>(pr.Ncol) * pr.M;
  for (int64_t t = dev::global_thread(); t < size; t += dev::grid_stride()) {
    float v = partial[t];
    for (int z = 1; z < splits; ++z) v += partial[z * size + t];
    const int c = static_cast<int>(t / pr.M),
              m = static_cast<int>(t - static_cast<int64_t>(c) * pr.M);
    if (pr.bias) v += static_cast<float>(pr.bias[c]);
    pr.out[pr.dx_offset(m) + static_cast<int64_t>(c) * pr.HW] = E(v);
  }
}

// A phase of dx that no tap reaches (pr.M rows, pr.Ncol channels): zeros (the bias, if any).
template <class E>
__global__ void dgrad_zero_kernel(const DataGradProblem<E> pr) {
  const int64_t size = static_cast<int64_t>(pr.Ncol) * pr.M;
  for (int64_t t = dev::global_thread(); t < size; t += dev::grid_stride()) {
    const int c = static_cast<int>(t / pr.M),
              m = static_cast<int>(t - static_cast<int64_t>(c) * pr.M);
    pr.out[pr.dx_offset(m) + static_cast<int64_t>(c) * pr.HW] = pr.bias ? pr.bias[c] : E(0.0f);
  }
}

// dy: (N, K, PQ) -> dbias: (K); one block per channel, a fixed-order block reduction in double,
// rounded to f32 (then to E).
template <class E>
__global__ void __launch_bounds__(256)
    conv_dbias_kernel(const E* dy, E* dbias, int64_t N, int64_t K, int64_t PQ) {
  __shared__ double scratch[32];
  const int64_t k = blockIdx.x;
  const int64_t total = N * PQ;
  int64_t e = threadIdx.x;
  int64_t n = e / PQ, pq = e - n * PQ;
  const int64_t step_n = 256 / PQ, step_pq = 256 - step_n * PQ;
  double s = 0.0;
  for (; e < total; e += 256) {
    s += static_cast<double>(static_cast<float>(dy[(n * K + k) * PQ + pq]));
    pq += step_pq;
    n += step_n;
    if (pq >= PQ) {
      pq -= PQ;
      ++n;
    }
  }
  s = dev::block_sum(s, scratch);
  if (threadIdx.x == 0) dbias[k] = E(static_cast<float>(s));
}

// ---- Launch helpers
// ------------------------------------------------------------------------------

void check_conv(const char* name, const ConvShape& s) {
  REGEN_CHECK(s.N > 0 && s.C > 0 && s.H > 0 && s.W > 0 && s.K > 0 && s.R > 0 && s.S > 0 &&
                  s.P > 0 && s.Q > 0 && s.stride_h > 0 && s.stride_w > 0 && s.pad_h >= 0 &&
                  s.pad_w >= 0,
              name, ": bad shape N=", s.N, " C=", s.C, " H=", s.H, " W=", s.W, " K=", s.K,
              " R=", s.R, " S=", s.S, " P=", s.P, " Q=", s.Q);
  REGEN_CHECK(s.P == (s.H + 2 * s.pad_h - s.R) / s.stride_h + 1 &&
                  s.Q == (s.W + 2 * s.pad_w - s.S) / s.stride_w + 1,
              name, ": output ", s.P, "x", s.Q, " does not match the input and kernel");
  const int64_t limit = 0x7fffffffLL;
  REGEN_CHECK(s.N * s.C * s.H * s.W < limit && s.N * s.K * s.P * s.Q < limit &&
                  s.K * s.C * s.R * s.S < limit,
              name,
              ": tensors of 2^31 or more elements are not supported by the native kernels "
              "(N=",
              s.N, " C=", s.C, " H=", s.H, " W=", s.W, " K=", s.K, "); use cuDNN");
}

// Split-K: enough blocks to fill an H100 (two resident blocks per SM on 132 SMs), but at least
// 256 reduction steps per split. Depends only on the shape. The workspace is splits x output, and
// splits x tiles stays near kTargetBlocks, so it is bounded by about 264 x 128 x 64 floats (9 MB).
struct Split {
  int splits, kchunk;
};
Split choose_split(int64_t tiles, int64_t Kdim) {
  constexpr int64_t kTargetBlocks = 264, kMinChunk = 256, kMaxSplits = 128;
  int64_t splits = detail::ceil_div(kTargetBlocks, tiles);
  const int64_t by_depth = detail::ceil_div(Kdim, kMinChunk);
  if (splits > by_depth) splits = by_depth;
  if (splits > kMaxSplits) splits = kMaxSplits;
  if (splits < 1) splits = 1;
  int64_t kchunk = detail::ceil_div(detail::ceil_div(Kdim, splits), kBK) * kBK;
  splits = detail::ceil_div(Kdim, kchunk);
  return {static_cast<int>(splits), static_cast<int>(kchunk)};
}

template <class Problem, class E>
void launch_igemm(const char* name, Problem pr, E* final_out, int64_t out_size, const E* bias,
                  int64_t PQ, int64_t K) {
  const int64_t gx = detail::ceil_div(pr.M, kBM), gy = detail::ceil_div(pr.Ncol, kBN);
  REGEN_CHECK(gy <= 65535, name, ": ", pr.Ncol, " output columns are too many");
  const Split split = choose_split(gx * gy, pr.Kdim);
  pr.kchunk = split.kchunk;
  pr.split_stride = out_size;
  Workspace ws(
      detail::device(),
      split.splits > 1 ? static_cast<uint64_t>(split.splits) * out_size * sizeof(float) : 0);
  if (dry_run_active()) return;  // the dry path (kernels.h): the partials, requested and unused
  pr.out = final_out;
  pr.partial = split.splits > 1 ? ws.as<float>() : nullptr;
  const dim3 grid(static_cast<unsigned>(gx), static_cast<unsigned>(gy),
                  static_cast<unsigned>(split.splits));
  conv_igemm_kernel<Problem><<<grid, kThreads, 0, stream()>>>(pr);
  REGEN_CUDA_LAUNCH_CHECK(name);
  if (split.splits > 1) {
    split_reduce_kernel<E><<<detail::grid_blocks(out_size, 256), 256, 0, stream()>>>(
        ws.as<float>(), split.splits, out_size, final_out, bias, PQ, K);
    REGEN_CUDA_LAUNCH_CHECK(name);
  }
}

// One phase of backward-data: like launch_igemm, but split partials are laid out compactly
// (splits, C, M) and reduced into the phase's places in dx.
template <class E>
void launch_dgrad(const char* name, DataGradProblem<E> pr) {
  const int64_t gx = detail::ceil_div(pr.M, kBM), gy = detail::ceil_div(pr.Ncol, kBN);
  REGEN_CHECK(gy <= 65535, name, ": ", pr.Ncol, " output columns are too many");
  const Split split = choose_split(gx * gy, pr.Kdim);
  pr.kchunk = split.kchunk;
  const int64_t size = static_cast<int64_t>(pr.Ncol) * pr.M;
  pr.split_stride = size;
  const bool partials = split.splits > 1;
  Workspace ws(detail::device(),
               partials ? static_cast<uint64_t>(split.splits) * size * sizeof(float) : 0);
  if (dry_run_active()) return;  // the dry path (kernels.h): the partials, requested and unused
  pr.partial = partials ? ws.as<float>() : nullptr;
  const dim3 grid(static_cast<unsigned>(gx), static_cast<unsigned>(gy),
                  static_cast<unsigned>(split.splits));
  using Problem = DataGradProblem<E>;  // one template argument at the launch (scripts/cuda-emu)
  conv_igemm_kernel<Problem><<<grid, kThreads, 0, stream()>>>(pr);
  REGEN_CUDA_LAUNCH_CHECK(name);
  if (partials) {
    const float* partial = pr.partial;
    pr.partial = nullptr;
    dgrad_reduce_kernel<E>
        <<<detail::grid_blocks(size, 256), 256, 0, stream()>>>(pr, partial, split.splits);
    REGEN_CUDA_LAUNCH_CHECK(name);
  }
}

// Builds the reduction-index table in `table` (Kpad entries).
void build_table(const char* name, int4* table, int Kdim, int Kpad, int RS, int S, int scale,
                 int row, int col, int invalid_r) {
  conv_table_kernel<<<detail::grid_blocks(Kpad, 256), 256, 0, stream()>>>(
      table, Kdim, Kpad, RS, S, scale, row, col, invalid_r);
  REGEN_CUDA_LAUNCH_CHECK(name);
}

int i32(int64_t v) {
  return static_cast<int>(v);
}

template <class E>
void native_forward(const E* x, const E* w, const E* bias, E* y, const ConvShape& s) {
  const char* name = "conv2d_forward";
  check_conv(name, s);
  ForwardProblem<E> pr{};
  pr.x = x;
  pr.w = w;
  pr.M = i32(s.N * s.P * s.Q);
  pr.Ncol = i32(s.K);
  pr.Kdim = i32(s.C * s.R * s.S);
  pr.H = i32(s.H);
  pr.W = i32(s.W);
  pr.P = i32(s.P);
  pr.Q = i32(s.Q);
  pr.PQ = i32(s.P * s.Q);
  pr.CHW = i32(s.C * s.H * s.W);
  pr.KPQ = i32(s.K * s.P * s.Q);
  pr.sh = i32(s.stride_h);
  pr.sw = i32(s.stride_w);
  pr.ph = i32(s.pad_h);
  pr.pw = i32(s.pad_w);
  const int Kpad = i32(detail::ceil_div(pr.Kdim, kBK) * kBK);
  Workspace table_ws(detail::device(), static_cast<uint64_t>(Kpad) * sizeof(int4));
  // The dry path (kernels.h): the table's and launch_igemm's workspaces, no kernel.
  if (!dry_run_active()) {
    build_table(name, table_ws.as<int4>(), pr.Kdim, Kpad, i32(s.R * s.S), i32(s.S), i32(s.H * s.W),
                pr.W, 1, -kBig);
  }
  pr.table = table_ws.as<int4>();
  const int64_t out_size = s.N * s.K * s.P * s.Q;
  // Split partials get the bias in the reduction, unsplit tiles in the writer.
  pr.bias = bias;
  launch_igemm(name, pr, y, out_size, bias, s.P * s.Q, s.K);
}

// bias: (C) or null, added to dx before its rounding (16-bit conv_transpose2d's forward).
template <class E>
void native_backward_data(const E* dy, const E* w, const E* bias, E* dx, const ConvShape& s) {
  const char* name = "conv2d_backward_data";
  check_conv(name, s);
  const int sh = i32(s.stride_h), sw = i32(s.stride_w);
  // The phases, each with its rows and columns of dx and its taps (see the top of the file).
  struct Phase {
    int rh, rw, r0, s0, Hs, Ws, Rs, Ss;
  };
  std::vector<Phase> phases;
  for (int rh = 0; rh < sh; ++rh) {
    for (int rw = 0; rw < sw; ++rw) {
      Phase ph{};
      ph.rh = rh;
      ph.rw = rw;
      ph.r0 = (rh + i32(s.pad_h)) % sh;
      ph.s0 = (rw + i32(s.pad_w)) % sw;
      ph.Hs = rh < s.H ? i32(detail::ceil_div(s.H - rh, sh)) : 0;
      ph.Ws = rw < s.W ? i32(detail::ceil_div(s.W - rw, sw)) : 0;
      ph.Rs = ph.r0 < s.R ? i32(detail::ceil_div(s.R - ph.r0, sh)) : 0;
      ph.Ss = ph.s0 < s.S ? i32(detail::ceil_div(s.S - ph.s0, sw)) : 0;
      if (ph.Hs > 0 && ph.Ws > 0) phases.push_back(ph);
    }
  }
  // [per phase with taps: table (Kpad int4) | sub-filter (K*Rs*Ss*C elements)], in phase order.
  // Each table starts on a 16-byte boundary: the kernel reads its entries as int4, and a
  // sub-filter of an odd number of floats (K*Rs*Ss*C = 9*3*3*3 = 243 for a phase of a 7x7
  // stride-2 layer with 9 filters over 3 channels) would leave the next phase's table misaligned.
  std::vector<uint64_t> table_at(phases.size()), wt_at(phases.size());
  uint64_t bytes = 0;
  for (size_t i = 0; i < phases.size(); ++i) {
    const int64_t kdim = s.K * phases[i].Rs * phases[i].Ss;
    if (kdim == 0) continue;
    bytes = (bytes + alignof(int4) - 1) / alignof(int4) * alignof(int4);
    table_at[i] = bytes;
    bytes += static_cast<uint64_t>(detail::ceil_div(kdim, kBK) * kBK) * sizeof(int4);
    wt_at[i] = bytes;
    bytes += static_cast<uint64_t>(kdim * s.C) * sizeof(E);
  }
  Workspace ws(detail::device(), bytes);
  char* base = static_cast<char*>(ws.data());
  // The dry path (kernels.h): this workspace and each phase's partials (launch_dgrad), no kernel.
  const bool dry = dry_run_active();
  for (size_t i = 0; i < phases.size(); ++i) {
    const Phase& ph = phases[i];
    DataGradProblem<E> pr{};
    pr.dy = dy;
    pr.out = dx;
    pr.bias = bias;
    pr.M = i32(s.N * ph.Hs * ph.Ws);
    pr.Ncol = i32(s.C);
    pr.Kdim = i32(s.K * ph.Rs * ph.Ss);
    pr.HWs = ph.Hs * ph.Ws;
    pr.Ws = ph.Ws;
    pr.oh = (ph.rh + i32(s.pad_h) - ph.r0) / sh;
    pr.ow = (ph.rw + i32(s.pad_w) - ph.s0) / sw;
    pr.rh = ph.rh;
    pr.rw = ph.rw;
    pr.sh = sh;
    pr.sw = sw;
    pr.W = i32(s.W);
    pr.HW = i32(s.H * s.W);
    pr.P = i32(s.P);
    pr.Q = i32(s.Q);
    pr.KPQ = i32(s.K * s.P * s.Q);
    pr.CHW = i32(s.C * s.H * s.W);
    if (pr.Kdim == 0) {  // no tap reaches these rows and columns
      if (dry) continue;
      dgrad_zero_kernel<E>
          <<<detail::grid_blocks(static_cast<int64_t>(pr.M) * pr.Ncol, 256), 256, 0, stream()>>>(
              pr);
      REGEN_CUDA_LAUNCH_CHECK(name);
      continue;
    }
    const int Kpad = i32(detail::ceil_div(pr.Kdim, kBK) * kBK);
    auto* table = reinterpret_cast<int4*>(base + table_at[i]);
    auto* wt = reinterpret_cast<E*>(base + wt_at[i]);
    REGEN_CHECK(detail::aligned16(table), name, ": the reduction table of phase ", i,
                " is not 16-byte aligned");
    if (!dry) {
      build_table(name, table, pr.Kdim, Kpad, ph.Rs * ph.Ss, ph.Ss, i32(s.P * s.Q), 0, 0, kBig);
      transpose_filter_kernel<E>
          <<<detail::grid_blocks(static_cast<int64_t>(pr.Kdim) * s.C, 256), 256, 0, stream()>>>(
              w, wt, i32(s.K), i32(s.C), i32(s.R), i32(s.S), ph.r0, ph.s0, sh, sw, ph.Rs, ph.Ss);
      REGEN_CUDA_LAUNCH_CHECK(name);
    }
    pr.table = table;
    pr.wt = wt;
    launch_dgrad(name, pr);
  }
}

template <class E>
void native_backward_filter(const E* x, const E* dy, E* dw, const ConvShape& s) {
  const char* name = "conv2d_backward_filter";
  check_conv(name, s);
  FilterGradProblem<E> pr{};
  pr.x = x;
  pr.dy = dy;
  pr.M = i32(s.C * s.R * s.S);
  pr.Ncol = i32(s.K);
  pr.Kdim = i32(s.N * s.P * s.Q);
  pr.H = i32(s.H);
  pr.W = i32(s.W);
  pr.HW = i32(s.H * s.W);
  pr.CHW = i32(s.C * s.H * s.W);
  pr.RS = i32(s.R * s.S);
  pr.S = i32(s.S);
  pr.Q = i32(s.Q);
  pr.PQ = i32(s.P * s.Q);
  pr.KPQ = i32(s.K * s.P * s.Q);
  pr.sh = i32(s.stride_h);
  pr.sw = i32(s.stride_w);
  pr.ph = i32(s.pad_h);
  pr.pw = i32(s.pad_w);
  launch_igemm(name, pr, dw, s.K * s.C * s.R * s.S, static_cast<const E*>(nullptr), 1, 1);
}

template <class E>
void dbias(const E* dy, E* db, const ConvShape& s) {
  REGEN_CHECK(s.K <= 0x7fffffff, "conv2d_backward_filter: too many channels");
  if (dry_run_active()) return;  // no workspace: nothing for a dry path to request
  conv_dbias_kernel<E>
      <<<static_cast<unsigned>(s.K), 256, 0, stream()>>>(dy, db, s.N, s.K, s.P * s.Q);
  REGEN_CUDA_LAUNCH_CHECK("conv2d_backward_filter (dbias)");
}

// Whether the native 16-bit passes run on tensor cores (kernels/cuda/conv2d_tc.h): bf16 and f16
// on a device of compute capability 8.0 or later (has_tensor_cores). f32 stays on the
// CUDA-core kernels above (TF32 through conv2d_tc is not chosen: regen's own f32 convolution is
// strict FP32). The filter gradient stays on native_backward_filter: the tensor-core one
// materializes an im2col matrix of x in its workspace (C R S N P Q elements, about 115 MB for a
// ResNet 3x3 layer at batch 32 in bf16), a transient the memory planner would have to fit at every
// layer's backward.
template <class E>
bool tensor_core_pass(const ConvShape& s) {
  if constexpr (std::is_same<E, float>::value) {
    return false;
  } else {
    return has_tensor_cores(current_device()) && s.N * s.C * s.H * s.W < (int64_t{1} << 31) &&
           s.N * s.K * s.P * s.Q < (int64_t{1} << 31) && s.K * s.C * s.R * s.S < (int64_t{1} << 31);
  }
}

// The passes for any element type: native (on tensor cores in 16-bit where tensor_core_pass),
// or cuDNN when chosen.
template <class E>
void forward_any(const E* x, const E* w, const E* bias, E* y, const ConvShape& s) {
#ifdef REGEN_WITH_CUDNN
  if (g_conv_algo == ConvAlgo::cudnn) return cudnn_conv::forward(x, w, bias, y, s);
#endif
  if (tensor_core_pass<E>(s)) return tc::conv2d_forward_tc(x, w, bias, y, tc::conv_tc_shape(s));
  native_forward(x, w, bias, y, s);
}

template <class E>
void backward_data_any(const E* dy, const E* w, const E* bias, E* dx, const ConvShape& s) {
#ifdef REGEN_WITH_CUDNN
  if (g_conv_algo == ConvAlgo::cudnn) return cudnn_conv::backward_data(dy, w, bias, dx, s);
#endif
  // The tensor-core pass adds no bias (conv_transpose2d's forward passes one): native then.
  if (!bias && tensor_core_pass<E>(s))
    return tc::conv2d_backward_data_tc(dy, w, dx, tc::conv_tc_shape(s));
  native_backward_data(dy, w, bias, dx, s);
}

template <class E>
void backward_filter_any(const E* x, const E* dy, E* dw, E* dbias_out, const ConvShape& s) {
  if (dw) {
#ifdef REGEN_WITH_CUDNN
    if (g_conv_algo == ConvAlgo::cudnn) {
      cudnn_conv::backward_filter(x, dy, dw, s);
    } else {
      native_backward_filter(x, dy, dw, s);
    }
#else
    native_backward_filter(x, dy, dw, s);
#endif
  }
  if (dbias_out) dbias(dy, dbias_out, s);
}

}  // namespace

void set_conv_algo(ConvAlgo algo) {
#ifndef REGEN_WITH_CUDNN
  REGEN_CHECK(algo != ConvAlgo::cudnn,
              "set_conv_algo(cudnn): regen was built without cuDNN (REGEN_WITH_CUDNN is off)");
#endif
  g_conv_algo = algo;
}
ConvAlgo conv_algo() {
  return g_conv_algo;
}

// x: (N, C, H, W), w: (K, C, R, S), bias: (K) or null -> y: (N, K, P, Q)
void conv2d_forward(const float* x, const float* w, const float* bias, float* y,
                    const ConvShape& s) {
  forward_any(x, w, bias, y, s);
}

// dy: (N, K, P, Q), w: (K, C, R, S) -> dx: (N, C, H, W)
void conv2d_backward_data(const float* dy, const float* w, float* dx, const ConvShape& s) {
  backward_data_any(dy, w, static_cast<const float*>(nullptr), dx, s);
}

// x: (N, C, H, W), dy: (N, K, P, Q) -> dw: (K, C, R, S), dbias: (K) or null
void conv2d_backward_filter(const float* x, const float* dy, float* dw, float* dbias_out,
                            const ConvShape& s) {
  backward_filter_any(x, dy, dw, dbias_out, s);
}

// The 16-bit forms (cuda_kernels.h): the same passes on 16-bit tensors, f32 inside.
template <class T>
void conv2d_forward(const T* x, const T* w, const T* bias, T* y, const ConvShape& s) {
  forward_any(x, w, bias, y, s);
}
template <class T>
void conv2d_backward_data(const T* dy, const T* w, T* dx, const ConvShape& s) {
  backward_data_any(dy, w, static_cast<const T*>(nullptr), dx, s);
}
template <class T>
void conv2d_backward_data_with_bias(const T* dy, const T* w, const T* bias, T* dx,
                                    const ConvShape& s) {
  backward_data_any(dy, w, bias, dx, s);
}
template <class T>
void conv2d_backward_filter(const T* x, const T* dy, T* dw, T* dbias_out, const ConvShape& s) {
  backward_filter_any(x, dy, dw, dbias_out, s);
}

#define REGEN_CONV_HALF(T)                                                             \
  template void conv2d_forward<T>(const T*, const T*, const T*, T*, const ConvShape&); \
  template void conv2d_backward_data<T>(const T*, const T*, T*, const ConvShape&);     \
  template void conv2d_backward_data_with_bias<T>(const T*, const T*, const T*, T*,    \
                                                  const ConvShape&);                   \
  template void conv2d_backward_filter<T>(const T*, const T*, T*, T*, const ConvShape&);
REGEN_CONV_HALF(bfloat16)
REGEN_CONV_HALF(float16)
#undef REGEN_CONV_HALF

}  // namespace regen::cuda
