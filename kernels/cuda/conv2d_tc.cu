// The tensor-core convolution, all three passes (declared in kernels/cuda/conv2d_tc.h;
// primitives in kernels/cuda/mma.cuh; CPU reference kernels/cpu/conv2d.cpp; test
// tests/cuda/test_cuda_conv_tc.cpp, on a GPU and in the host emulation).
//
// Forward as an implicit GEMM over NHWC copies of the operands:
//
//   C[m = (n,p,q), k] = sum over kk = (r,s,c) of
//                         xh[n, p*sh-ph+r*dh, q*sw-pw+s*dw, c] * wh[k, r,s,c]
//
// xh is x in NHWC and wh is w in (K, R, S, C), both with C padded with zeros to Cp, a multiple of
// one 16-byte chunk (8 bf16/f16 elements, 4 TF32 ones), so every chunk of the reduction index lies
// in one (r, s) and is 16 contiguous, aligned bytes of global memory: one cp.async, zero-filled
// when the tap falls in the padding or past the reduction. The copies are two small kernels before
// the GEMM (TF32: they also round to TF32).
//
// The GEMM: a 128 x 64 (m x k) tile per block of 4 warps, each warp 64 x 32 (4 x 4 mma tiles of
// 16 x 8); the reduction advances 4 chunks (64 bytes: 32 bf16 or 16 TF32 elements) per stage
// through a 3-stage cp.async pipeline in shared memory, rows of 64 bytes whose chunks are XOR-
// swizzled by row so that ldmatrix's 8 row reads of one matrix hit 8 different bank groups. A and
// B are both k-contiguous in shared memory, so both load with ldmatrix without .trans, and the
// same chunk addressing serves the 16-bit types (m16n8k16: 2 chunks of k per mma) and TF32
// (m16n8k8: 2 chunks of 4-byte elements, which ldmatrix moves as pairs of b16). The epilogue adds
// the bias and writes y in NCHW straight from the accumulator fragments.
//
// Backward-data runs the same kernel as a stride-1 convolution of dy (in NHWC, spread out by the
// stride with zero rows and columns) with the filter flipped and transposed; backward-filter as a
// 1x1 convolution over the transposed im2col matrix of x and dy transposed, its long reduction
// split across blocks into f32 partials summed in a fixed order (conv2d_tc.h).
//
// Determinism: each output is one warp's fixed sequence of mma over the reduction, the same on
// every run. Indices are 32-bit: every tensor (and each NHWC copy) has fewer than 2^31 elements.
#include <algorithm>
#include <type_traits>

#include "regen/core/tensor.h"
#include "regen/kernels/cuda/common.cuh"
#include "regen/kernels/cuda/conv2d_tc.h"
#include "regen/kernels/cuda/mma.cuh"
#include "regen/kernels/kernels.h"

namespace regen::cuda::tc {
namespace {

constexpr int kBM = 128, kBN = 64;       // block tile: output pixels x output channels
constexpr int kChunks = 4;               // 16-byte chunks of the reduction per stage
constexpr int kRowBytes = kChunks * 16;  // one row of a stage's A or B tile
constexpr int kStages = 3;               // cp.async pipeline depth
constexpr int kThreads = 128;            // 4 warps, 2 x 2 over the tile
constexpr int kStageBytes = (kBM + kBN) * kRowBytes;
constexpr int kSmemBytes = kStages * kStageBytes;  // 36 KiB: under the default 48 KiB

// The byte offset of chunk `chunk` of row `row` in a tile: chunks XOR-swizzled by row pairs, so
// ldmatrix's 8 rows (rows 2j and 2j+1 share a 128-byte line of banks) land in 8 bank groups.
__device__ __forceinline__ int swizzle(int row, int chunk) {
  return row * kRowBytes + ((chunk ^ ((row >> 1) & 3)) << 4);
}

template <class T>
struct Elem;  // the element the kernel moves, and its mma
template <>
struct Elem<bfloat16> {
  static constexpr int kPerChunk = 8;
  __device__ __forceinline__ static void mma(float d[4], const uint32_t a[4], const uint32_t b[2]) {
    mma_bf16_16816(d, a, b, d);
  }
};
template <>
struct Elem<float16> {
  static constexpr int kPerChunk = 8;
  __device__ __forceinline__ static void mma(float d[4], const uint32_t a[4], const uint32_t b[2]) {
    mma_f16_16816(d, a, b, d);
  }
};
template <>
struct Elem<float> {
  static constexpr int kPerChunk = 4;
  __device__ __forceinline__ static void mma(float d[4], const uint32_t a[4], const uint32_t b[2]) {
    mma_tf32_1688(d, a, b, d);
  }
};

// The value stored in the kernel's layout: 16-bit types as they are, f32 rounded to TF32.
template <class T>
__device__ __forceinline__ T to_operand(T v) {
  if constexpr (std::is_same<T, float>::value) {
    return half::float_of(to_tf32(v));
  } else {
    return v;
  }
}
template <class T>
__device__ __forceinline__ T zero_of() {
  return T(0.0f);
}

// x: (N, C, HW) -> xh: (N, HW, Cp), channels c >= C zero. 32 x 32 tiles of (c, hw) through shared
// memory, so both the reads (along hw) and the writes (along c) are coalesced. Block (32, 8).
template <class T>
__global__ void to_nhwc_kernel(const T* x, T* xh, int C, int HW, int Cp) {
  __shared__ T tile[32][33];
  const int n = blockIdx.z, c0 = blockIdx.y * 32, hw0 = blockIdx.x * 32;
  const T* xn = x + static_cast<int64_t>(n) * C * HW;
  for (int i = threadIdx.y; i < 32; i += 8) {
    const int c = c0 + i, hw = hw0 + threadIdx.x;
    tile[i][threadIdx.x] = c < C && hw < HW ? xn[static_cast<int64_t>(c) * HW + hw] : zero_of<T>();
  }
  __syncthreads();
  T* out = xh + static_cast<int64_t>(n) * HW * Cp;
  for (int i = threadIdx.y; i < 32; i += 8) {
    const int hw = hw0 + i, c = c0 + threadIdx.x;
    if (hw < HW && c < Cp)
      out[static_cast<int64_t>(hw) * Cp + c] = to_operand(tile[threadIdx.x][i]);
  }
}

// w: (K, C, RS) -> wh: (K, RS, Cp), channels c >= C zero. Small: one thread per element.
template <class T>
__global__ void to_krsc_kernel(const T* w, T* wh, int K, int C, int RS, int Cp) {
  const int64_t total = static_cast<int64_t>(K) * RS * Cp;
  for (int64_t i = dev::global_thread(); i < total; i += dev::grid_stride()) {
    const int c = static_cast<int>(i % Cp);
    const int64_t krs = i / Cp;
    const int k = static_cast<int>(krs / RS), rs = static_cast<int>(krs % RS);
    wh[i] = c < C ? to_operand(w[(static_cast<int64_t>(k) * C + c) * RS + rs]) : zero_of<T>();
  }
}

// Backward-data's operands. dy: (N, K, P, Q) -> dyh: (N, Hu, Wu, Kp), Hu = (P-1)*sh + 1, dy spread
// out with sh-1 (sw-1) zero rows (columns) between its rows (columns), channels k >= K zero; the
// strided pass is then a stride-1 convolution. One thread per element (the stride-1 case takes
// to_nhwc_kernel instead).
template <class T>
__global__ void to_nhwc_spread_kernel(const T* dy, T* dyh, int N, int K, int P, int Q, int sh,
                                      int sw, int Kp) {
  const int Hu = (P - 1) * sh + 1, Wu = (Q - 1) * sw + 1;
  const int64_t total = static_cast<int64_t>(N) * Hu * Wu * Kp;
  for (int64_t i = dev::global_thread(); i < total; i += dev::grid_stride()) {
    const int k = static_cast<int>(i % Kp);
    const int64_t pix = i / Kp;
    const int n = static_cast<int>(pix / (Hu * Wu)), ij = static_cast<int>(pix % (Hu * Wu));
    const int a = ij / Wu, b = ij - a * Wu;
    const bool on = k < K && a % sh == 0 && b % sw == 0;
    dyh[i] = on ? to_operand(dy[((static_cast<int64_t>(n) * K + k) * P + a / sh) * Q + b / sw])
                : zero_of<T>();
  }
}
// w: (K, C, R, S) -> wt: (C, R, S, Kp), the filter flipped in r and s and with K and C exchanged:
// wt[c, r, s, k] = w[k, c, R-1-r, S-1-s], channels k >= K zero.
template <class T>
__global__ void to_crsk_flipped_kernel(const T* w, T* wt, int K, int C, int R, int S, int Kp) {
  const int64_t total = static_cast<int64_t>(C) * R * S * Kp;
  for (int64_t i = dev::global_thread(); i < total; i += dev::grid_stride()) {
    const int k = static_cast<int>(i % Kp);
    const int64_t crs = i / Kp;
    const int c = static_cast<int>(crs / (R * S)), rs = static_cast<int>(crs % (R * S));
    const int r = rs / S, t = rs - r * S;
    wt[i] =
        k < K
            ? to_operand(w[((static_cast<int64_t>(k) * C + c) * R + (R - 1 - r)) * S + (S - 1 - t)])
            : zero_of<T>();
  }
}

// Backward-filter's operands: dw (K, CRS) is a GEMM reducing over npq = (n, p, q), with rows crs
// from colt (CRS, NPQp) and columns k from dyt (K, NPQp), both npq-contiguous, npq >= NPQ zero.
// colt[(c,r,s), (n,p,q)] = x[n, c, p sh - ph + r dh, q sw - pw + s dw] (zero outside x): the im2col
// matrix, transposed and materialized, since no layout of x makes its chunks contiguous.
struct Geom {
  int N, C, H, W, K, R, S, P, Q, sh, sw, ph, pw, dh, dw;
};
template <class T>
__global__ void im2col_t_kernel(const T* x, T* colt, Geom g, int NPQp) {
  const int PQ = g.P * g.Q, NPQ = g.N * PQ, RS = g.R * g.S;
  const int64_t total = static_cast<int64_t>(g.C) * RS * NPQp;
  for (int64_t i = dev::global_thread(); i < total; i += dev::grid_stride()) {
    const int npq = static_cast<int>(i % NPQp), crs = static_cast<int>(i / NPQp);
    T v = zero_of<T>();
    if (npq < NPQ) {
      const int n = npq / PQ, pq = npq - n * PQ, oh = pq / g.Q, ow = pq - oh * g.Q;
      const int c = crs / RS, rs = crs - c * RS, r = rs / g.S, t = rs - r * g.S;
      const int h = oh * g.sh - g.ph + r * g.dh, w = ow * g.sw - g.pw + t * g.dw;
      if (h >= 0 && h < g.H && w >= 0 && w < g.W) {
        v = to_operand(x[((static_cast<int64_t>(n) * g.C + c) * g.H + h) * g.W + w]);
      }
    }
    colt[i] = v;
  }
}
// dy: (N, K, PQ) -> dyt: (K, NPQp).
template <class T>
__global__ void dy_t_kernel(const T* dy, T* dyt, int N, int K, int PQ, int NPQp) {
  const int64_t total = static_cast<int64_t>(K) * NPQp;
  for (int64_t i = dev::global_thread(); i < total; i += dev::grid_stride()) {
    const int npq = static_cast<int>(i % NPQp), k = static_cast<int>(i / NPQp);
    const int n = npq / PQ, pq = npq - n * PQ;
    dyt[i] = n < N ? to_operand(dy[(static_cast<int64_t>(n) * K + k) * PQ + pq]) : zero_of<T>();
  }
}
// out[i] = the split partials part[z][i] summed in z order, rounded once to T.
template <class T>
__global__ void split_sum_kernel(const float* part, int splits, int64_t n, T* out) {
  for (int64_t i = dev::global_thread(); i < n; i += dev::grid_stride()) {
    float acc = 0.0f;
    for (int z = 0; z < splits; ++z) acc += part[z * n + i];
    out[i] = T(acc);
  }
}

struct FwdParams {
  const void* xh;                                    // (N, H, W, Cp)
  const void* wh;                                    // (K, R, S, Cp) = (K, Kg)
  const void* bias;                                  // (K) or null
  void* y;                                           // (N, K, P, Q)
  int H, W, Cp, K, S, P, Q, sh, sw, ph, pw, dh, dw;  // ph, pw < 0 in backward-data
  int M, Kg, PQ;  // GEMM sizes: M = N*P*Q rows, Kg = R*S*Cp reduction
  // Split-K: block z reduces tiles [z kt_per_split, (z+1) kt_per_split) of the reduction and
  // writes its partial output at y + z split_stride (one split: everything, at y).
  int kt_per_split;
  int64_t split_stride;
};

template <class T, class OutT>
__global__ void __launch_bounds__(kThreads) conv_fwd_tc_kernel(FwdParams p) {
  extern __shared__ __align__(16) float smem[];
  unsigned char* const sbase = reinterpret_cast<unsigned char*>(smem);
  constexpr int kPer = Elem<T>::kPerChunk, kBK = kChunks * kPer;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int warp_m = warp >> 1, warp_n = warp & 1;
  const int m0 = blockIdx.x * kBM, n0 = blockIdx.y * kBN;
  const T* xh = static_cast<const T*>(p.xh);
  const T* wh = static_cast<const T*>(p.wh);

  // Loader layout: this thread copies chunk `cc` of A rows lrow + 32i (i < 4) and B rows lrow + 32i
  // (i < 2); the output pixel of each A row is decoded once.
  const int cc = tid & 3, lrow = tid >> 2;
  int a_pix[4], a_h0[4], a_w0[4];  // a_pix: n*H*W, the image's first pixel; -1: row past M
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int m = m0 + lrow + 32 * i;
    if (m < p.M) {
      const int n = m / p.PQ, pq = m - n * p.PQ, oh = pq / p.Q, ow = pq - oh * p.Q;
      a_pix[i] = n * p.H * p.W;
      a_h0[i] = oh * p.sh - p.ph;
      a_w0[i] = ow * p.sw - p.pw;
    } else {
      a_pix[i] = -1;
      a_h0[i] = a_w0[i] = 0;
    }
  }
  auto load_stage = [&](int stage, int kt) {
    unsigned char* const sA = sbase + stage * kStageBytes;
    unsigned char* const sB = sA + kBM * kRowBytes;
    const int kk = kt * kBK + cc * kPer;  // this chunk's first reduction index
    const bool k_ok = kk < p.Kg;
    int r = 0, s = 0, c = 0;
    if (k_ok) {
      const int rs = kk / p.Cp;
      c = kk - rs * p.Cp;
      r = rs / p.S;
      s = rs - r * p.S;
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int h = a_h0[i] + r * p.dh, w = a_w0[i] + s * p.dw;
      const bool ok = k_ok && a_pix[i] >= 0 && h >= 0 && h < p.H && w >= 0 && w < p.W;
      const T* src = ok ? xh + static_cast<int64_t>(a_pix[i] + h * p.W + w) * p.Cp + c : xh;
      cp_async_cg16(sA + swizzle(lrow + 32 * i, cc), src, ok);
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int k = n0 + lrow + 32 * i;
      const bool ok = k_ok && k < p.K;
      const T* src = ok ? wh + static_cast<int64_t>(k) * p.Kg + kk : wh;
      cp_async_ca16(sB + swizzle(lrow + 32 * i, cc), src, ok);
    }
  };

  float acc[4][4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

  // This block's tiles of the reduction: [kt0, kt0 + KT).
  const int KT_all = (p.Kg + kBK - 1) / kBK, kt0 = blockIdx.z * p.kt_per_split;
  const int KT = min(KT_all - kt0, p.kt_per_split);
  for (int st = 0; st < kStages - 1; ++st) {
    if (st < KT) load_stage(st, kt0 + st);
    cp_async_commit();  // an empty group keeps the count of groups per iteration fixed
  }
  for (int kt = 0; kt < KT; ++kt) {
    cp_async_wait<kStages - 2>();  // stage kt has landed (for this thread's copies) ...
    __syncthreads();               // ... for every thread's; and every warp is done with stage kt-1
    const int next = kt + kStages - 1;
    if (next < KT) load_stage(next % kStages, kt0 + next);  // into stage kt-1's buffer
    cp_async_commit();
    const unsigned char* const sA = sbase + (kt % kStages) * kStageBytes;
    const unsigned char* const sB = sA + kBM * kRowBytes;
#pragma unroll
    for (int ks = 0; ks < kChunks / 2; ++ks) {  // one mma depth = 2 chunks
      uint32_t af[4][4], bfr[4][2];
#pragma unroll
      for (int mi = 0; mi < 4; ++mi) {
        // matrices 0..3 = (rows 0-7, chunk 0), (rows 8-15, chunk 0), (rows 0-7, 1), (rows 8-15, 1)
        const int row = warp_m * 64 + mi * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
        ldmatrix_x4(af[mi], sA + swizzle(row, 2 * ks + (lane >> 4)));
      }
#pragma unroll
      for (int pair = 0; pair < 2; ++pair) {
        // matrices 0..3 = (n 0-7, chunk 0), (n 0-7, chunk 1), (n 8-15, chunk 0), (n 8-15, 1)
        const int row = warp_n * 32 + pair * 16 + (lane & 7) + (lane >> 4) * 8;
        uint32_t r4[4];
        ldmatrix_x4(r4, sB + swizzle(row, 2 * ks + ((lane >> 3) & 1)));
        bfr[2 * pair][0] = r4[0];
        bfr[2 * pair][1] = r4[1];
        bfr[2 * pair + 1][0] = r4[2];
        bfr[2 * pair + 1][1] = r4[3];
      }
#pragma unroll
      for (int mi = 0; mi < 4; ++mi)
#pragma unroll
        for (int ni = 0; ni < 4; ++ni) Elem<T>::mma(acc[mi][ni], af[mi], bfr[ni]);
    }
  }
  cp_async_wait<0>();  // only empty groups remain; nothing is in flight at exit

  const T* bias = static_cast<const T*>(p.bias);
  OutT* const y = static_cast<OutT*>(p.y) + blockIdx.z * p.split_stride;
#pragma unroll
  for (int mi = 0; mi < 4; ++mi) {
#pragma unroll
    for (int ni = 0; ni < 4; ++ni) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int m = m0 + warp_m * 64 + mi * 16 + (lane >> 2) + (e >> 1) * 8;
        const int k = n0 + warp_n * 32 + ni * 8 + (lane & 3) * 2 + (e & 1);
        if (m >= p.M || k >= p.K) continue;
        const int n = m / p.PQ, pq = m - n * p.PQ;
        float v = acc[mi][ni][e];
        if (bias) v += static_cast<float>(bias[k]);
        y[(static_cast<int64_t>(n) * p.K + k) * p.PQ + pq] = OutT(v);
      }
    }
  }
}

// ---- Probes ------------------------------------------------------------------------------------

__global__ void ldmatrix_probe_kernel(int count, bool trans, const uint16_t* src, uint32_t* out) {
  extern __shared__ __align__(16) float smem[];
  uint16_t* const s = reinterpret_cast<uint16_t*>(smem);
  const int lane = threadIdx.x;
  for (int i = lane; i < count * 64; i += 32) s[i] = src[i];
  __syncthreads();
  const void* row = s + (lane % (8 * count)) * 8;  // lane 8j + i: row i of matrix j
  uint32_t r[4] = {0, 0, 0, 0};
  if (count == 1) {
    trans ? ldmatrix_x1_trans(r, row) : ldmatrix_x1(r, row);
  } else if (count == 2) {
    trans ? ldmatrix_x2_trans(r, row) : ldmatrix_x2(r, row);
  } else {
    trans ? ldmatrix_x4_trans(r, row) : ldmatrix_x4(r, row);
  }
  for (int j = 0; j < count; ++j) out[lane * count + j] = r[j];
}

// Shared memory: A (16 rows of 16 elements), B as (k, n) rows of 8 elements and as (n, k) rows of
// 16 elements; all rows 16-byte multiples.
template <class T>
__global__ void mma_tile_probe_kernel(const T* a, const T* b, float* d, bool b_trans) {
  extern __shared__ __align__(16) float smem[];
  T* const sa = reinterpret_cast<T*>(smem);  // (16, 16)
  T* const sb_kn = sa + 256;                 // (16, 8)
  T* const sb_nk = sb_kn + 128;              // (8, 16)
  const int lane = threadIdx.x;
  for (int i = lane; i < 256; i += 32) sa[i] = a[i];
  for (int i = lane; i < 128; i += 32) {
    sb_kn[i] = b[i];
    sb_nk[(i % 8) * 16 + i / 8] = b[i];
  }
  __syncthreads();
  float acc[4] = {0, 0, 0, 0};
  if constexpr (std::is_same<T, float>::value) {
    // Two k8 steps; A rows are 4 chunks (64 bytes): step ks covers chunks 2ks, 2ks+1.
    for (int ks = 0; ks < 2; ++ks) {
      uint32_t af[4], bfr[2];
      ldmatrix_x4(af, sa + ((lane & 7) + ((lane >> 3) & 1) * 8) * 16 + (2 * ks + (lane >> 4)) * 4);
      ldmatrix_x2(bfr, sb_nk + (lane & 7) * 16 + (2 * ks + ((lane >> 3) & 1)) * 4);
      mma_tf32_1688(acc, af, bfr, acc);
    }
  } else {
    uint32_t af[4], bfr[2];
    ldmatrix_x4(af, sa + ((lane & 7) + ((lane >> 3) & 1) * 8) * 16 + (lane >> 4) * 8);
    if (b_trans) {
      // matrix 0 = (k 0-7, n 0-7), matrix 1 = (k 8-15, n 0-7), each row one k of 8 n
      ldmatrix_x2_trans(bfr, sb_kn + (lane & 15) * 8);
    } else {
      ldmatrix_x2(bfr, sb_nk + (lane & 7) * 16 + ((lane >> 3) & 1) * 8);
    }
    if constexpr (std::is_same<T, bfloat16>::value) {
      mma_bf16_16816(acc, af, bfr, acc);
    } else {
      mma_f16_16816(acc, af, bfr, acc);
    }
  }
  for (int e = 0; e < 4; ++e) {
    d[((lane >> 2) + (e >> 1) * 8) * 8 + (lane & 3) * 2 + (e & 1)] = acc[e];
  }
}

void require_tensor_cores(const char* name) {
#ifndef REGEN_CUDA_EMU_MMA
  int major = 0;
  REGEN_CUDA_CHECK(
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, current_device()));
  REGEN_CHECK(major >= 8, name, ": needs tensor cores with bf16/TF32 mma (compute capability 8.0 ",
              "or later); device ", current_device(), " has ", major, ".x");
#else
  (void)name;
#endif
}

void check_int32(const char* name, const char* what, int64_t n) {
  REGEN_CHECK(n < (int64_t{1} << 31), name, ": ", what, " has ", n,
              " elements; this kernel indexes with 32 bits (at most 2^31 - 1)");
}

uint64_t round_up_256(uint64_t b) {
  return (b + 255) / 256 * 256;
}

}  // namespace

ConvTcShape make_conv_tc_shape(int64_t N, int64_t C, int64_t H, int64_t W, int64_t K, int64_t R,
                               int64_t S, int64_t stride_h, int64_t stride_w, int64_t pad_h,
                               int64_t pad_w, int64_t dil_h, int64_t dil_w) {
  REGEN_CHECK(N > 0 && C > 0 && H > 0 && W > 0 && K > 0 && R > 0 && S > 0,
              "conv2d (tensor cores): sizes N=", N, " C=", C, " H=", H, " W=", W, " K=", K,
              " R=", R, " S=", S, " must be positive");
  REGEN_CHECK(stride_h > 0 && stride_w > 0 && dil_h > 0 && dil_w > 0 && pad_h >= 0 && pad_w >= 0,
              "conv2d (tensor cores): stride ", stride_h, "x", stride_w, " and dilation ", dil_h,
              "x", dil_w, " must be positive and padding ", pad_h, "x", pad_w, " non-negative");
  const int64_t span_h = dil_h * (R - 1) + 1, span_w = dil_w * (S - 1) + 1;
  REGEN_CHECK(H + 2 * pad_h >= span_h && W + 2 * pad_w >= span_w, "conv2d (tensor cores): kernel ",
              R, "x", S, " with dilation ", dil_h, "x", dil_w, " does not fit input ", H, "x", W,
              " with padding ", pad_h, "x", pad_w);
  ConvTcShape s;
  s.N = N, s.C = C, s.H = H, s.W = W, s.K = K, s.R = R, s.S = S;
  s.stride_h = stride_h, s.stride_w = stride_w, s.pad_h = pad_h, s.pad_w = pad_w;
  s.dil_h = dil_h, s.dil_w = dil_w;
  s.P = (H + 2 * pad_h - span_h) / stride_h + 1;
  s.Q = (W + 2 * pad_w - span_w) / stride_w + 1;
  return s;
}

ConvTcShape conv_tc_shape(const ConvShape& s) {
  return make_conv_tc_shape(s.N, s.C, s.H, s.W, s.K, s.R, s.S, s.stride_h, s.stride_w, s.pad_h,
                            s.pad_w, 1, 1);
}

namespace {

template <class T>
const char* pass_name(bool backward) {
  if (std::is_same<T, float>::value) {
    return backward ? "conv2d_backward_data_tc (tf32)" : "conv2d_forward_tc (tf32)";
  }
  if (std::is_same<T, bfloat16>::value) {
    return backward ? "conv2d_backward_data_tc (bf16)" : "conv2d_forward_tc (bf16)";
  }
  return backward ? "conv2d_backward_data_tc (f16)" : "conv2d_forward_tc (f16)";
}

// The reduction's channels padded to whole chunks.
template <class T>
int64_t padded(int64_t channels) {
  constexpr int64_t per = Elem<T>::kPerChunk;
  return (channels + per - 1) / per * per;
}

// The operand sizes (elements) of one pass: the NHWC input and the (cols, R, S, Cp) filter.
struct PassSizes {
  int64_t in_h, in_w, cp, in_elems, w_elems;
};
template <class T>
PassSizes pass_sizes(const ConvTcShape& s, bool backward) {
  PassSizes z;
  if (!backward) {
    z.in_h = s.H, z.in_w = s.W, z.cp = padded<T>(s.C);
    z.w_elems = s.K * s.R * s.S * z.cp;
  } else {
    z.in_h = (s.P - 1) * s.stride_h + 1, z.in_w = (s.Q - 1) * s.stride_w + 1, z.cp = padded<T>(s.K);
    z.w_elems = s.C * s.R * s.S * z.cp;
  }
  z.in_elems = s.N * z.in_h * z.in_w * z.cp;
  return z;
}
template <class T>
uint64_t pass_workspace_bytes(const PassSizes& z) {
  return round_up_256(static_cast<uint64_t>(z.in_elems) * sizeof(T)) +
         round_up_256(static_cast<uint64_t>(z.w_elems) * sizeof(T));
}

// The GEMM of either pass over operands already in the kernel's layouts: out (N, cols, P, Q) from
// in (N, in_h, in_w, Cp) and wt (cols, R, S, Cp), with the given stride, padding (backward-data's
// may be negative) and dilation.
template <class T, class OutT>
void launch_gemm(const char* name, const T* in, const T* wt, const T* bias, OutT* out, int64_t N,
                 const PassSizes& z, int64_t cols, int64_t R, int64_t S, int64_t P, int64_t Q,
                 int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh, int64_t dw,
                 int splits = 1, int kt_per_split = 1 << 30) {
  const int64_t M = N * P * Q, Kg = R * S * z.cp;
  const int64_t gx = detail::ceil_div(M, kBM), gy = detail::ceil_div(cols, kBN);
  REGEN_CHECK(gy <= 65535, name, ": ", cols, " output channels are too many");
  FwdParams p;
  p.kt_per_split = kt_per_split;
  p.split_stride = N * cols * P * Q;
  p.xh = in, p.wh = wt, p.bias = bias, p.y = out;
  p.H = static_cast<int>(z.in_h), p.W = static_cast<int>(z.in_w), p.Cp = static_cast<int>(z.cp);
  p.K = static_cast<int>(cols), p.S = static_cast<int>(S);
  p.P = static_cast<int>(P), p.Q = static_cast<int>(Q);
  p.sh = static_cast<int>(sh), p.sw = static_cast<int>(sw);
  p.ph = static_cast<int>(ph), p.pw = static_cast<int>(pw);
  p.dh = static_cast<int>(dh), p.dw = static_cast<int>(dw);
  p.M = static_cast<int>(M), p.Kg = static_cast<int>(Kg), p.PQ = static_cast<int>(P * Q);
  const dim3 grid(static_cast<unsigned>(gx), static_cast<unsigned>(gy),
                  static_cast<unsigned>(splits));
  conv_fwd_tc_kernel<T, OutT><<<grid, kThreads, kSmemBytes, stream()>>>(p);
  REGEN_CUDA_LAUNCH_CHECK(name);
}

template <class T>
void copy_to_nhwc(const char* name, const T* x, T* xh, int64_t N, int64_t C, int64_t HW,
                  int64_t Cp) {
  REGEN_CHECK(N <= 65535 && detail::ceil_div(Cp, 32) <= 65535, name, ": batch ", N, " or ", Cp,
              " channels too many for the layout copy's grid (at most 65535 and 2097120)");
  const dim3 grid(static_cast<unsigned>(detail::ceil_div(HW, 32)),
                  static_cast<unsigned>(detail::ceil_div(Cp, 32)), static_cast<unsigned>(N));
  to_nhwc_kernel<T><<<grid, dim3(32, 8), 0, stream()>>>(x, xh, static_cast<int>(C),
                                                        static_cast<int>(HW), static_cast<int>(Cp));
  REGEN_CUDA_LAUNCH_CHECK(name);
}

}  // namespace

template <class T>
uint64_t conv2d_forward_tc_workspace_bytes(const ConvTcShape& s) {
  return pass_workspace_bytes<T>(pass_sizes<T>(s, false));
}
template <class T>
uint64_t conv2d_backward_data_tc_workspace_bytes(const ConvTcShape& s) {
  return pass_workspace_bytes<T>(pass_sizes<T>(s, true));
}

template <class T>
void conv2d_forward_tc(const T* x, const T* w, const T* bias, T* y, const ConvTcShape& s) {
  const char* name = pass_name<T>(false);
  const PassSizes z = pass_sizes<T>(s, false);
  check_int32(name, "x (N, H, W, C padded)", z.in_elems);
  check_int32(name, "w (K, R, S, C padded)", z.w_elems);
  check_int32(name, "y", s.N * s.K * s.P * s.Q);
  Workspace ws(detail::device(), pass_workspace_bytes<T>(z));
  if (dry_run_active()) return;  // the dry path: the layout copies' block, requested and unused
  require_tensor_cores(name);
  T* xh = ws.as<T>();
  T* wh = reinterpret_cast<T*>(static_cast<unsigned char*>(ws.data()) +
                               round_up_256(static_cast<uint64_t>(z.in_elems) * sizeof(T)));
  copy_to_nhwc(name, x, xh, s.N, s.C, s.H * s.W, z.cp);
  to_krsc_kernel<T><<<detail::grid_blocks(z.w_elems, 256), 256, 0, stream()>>>(
      w, wh, static_cast<int>(s.K), static_cast<int>(s.C), static_cast<int>(s.R * s.S),
      static_cast<int>(z.cp));
  REGEN_CUDA_LAUNCH_CHECK(name);
  launch_gemm(name, xh, wh, bias, y, s.N, z, s.K, s.R, s.S, s.P, s.Q, s.stride_h, s.stride_w,
              s.pad_h, s.pad_w, s.dil_h, s.dil_w);
}

// dx[n, c, h, w] = sum over (k, r, s) of dy[n, k, (h + ph - r dh) / sh, (w + pw - s dw) / sw]
// w[k, c, r, s], the terms whose division is inexact or out of range zero: a stride-1 forward
// convolution of dy spread out by the stride (to_nhwc_spread_kernel) with the flipped, transposed
// filter, padding dh (R-1) - ph (which may be negative), dilation dh, output H x W.
template <class T>
void conv2d_backward_data_tc(const T* dy, const T* w, T* dx, const ConvTcShape& s) {
  const char* name = pass_name<T>(true);
  const PassSizes z = pass_sizes<T>(s, true);
  check_int32(name, "dy (N, P, Q spread by the stride, K padded)", z.in_elems);
  check_int32(name, "w (C, R, S, K padded)", z.w_elems);
  check_int32(name, "dx", s.N * s.C * s.H * s.W);
  Workspace ws(detail::device(), pass_workspace_bytes<T>(z));
  if (dry_run_active()) return;  // the dry path: the layout copies' block, requested and unused
  require_tensor_cores(name);
  T* dyh = ws.as<T>();
  T* wt = reinterpret_cast<T*>(static_cast<unsigned char*>(ws.data()) +
                               round_up_256(static_cast<uint64_t>(z.in_elems) * sizeof(T)));
  if (s.stride_h == 1 && s.stride_w == 1) {
    copy_to_nhwc(name, dy, dyh, s.N, s.K, s.P * s.Q, z.cp);
  } else {
    to_nhwc_spread_kernel<T><<<detail::grid_blocks(z.in_elems, 256), 256, 0, stream()>>>(
        dy, dyh, static_cast<int>(s.N), static_cast<int>(s.K), static_cast<int>(s.P),
        static_cast<int>(s.Q), static_cast<int>(s.stride_h), static_cast<int>(s.stride_w),
        static_cast<int>(z.cp));
    REGEN_CUDA_LAUNCH_CHECK(name);
  }
  to_crsk_flipped_kernel<T><<<detail::grid_blocks(z.w_elems, 256), 256, 0, stream()>>>(
      w, wt, static_cast<int>(s.K), static_cast<int>(s.C), static_cast<int>(s.R),
      static_cast<int>(s.S), static_cast<int>(z.cp));
  REGEN_CUDA_LAUNCH_CHECK(name);
  launch_gemm<T>(name, dyh, wt, nullptr, dx, s.N, z, s.C, s.R, s.S, s.H, s.W, 1, 1,
                 s.dil_h * (s.R - 1) - s.pad_h, s.dil_w * (s.S - 1) - s.pad_w, s.dil_h, s.dil_w);
}

namespace {

// Backward-filter's sizes: the GEMM as a 1x1 convolution of one image of 1 x CRS pixels with NPQp
// channels (colt) by the filter (K, 1, 1, NPQp) (dyt), and its split of the reduction.
struct FilterPlan {
  PassSizes z;
  int64_t crs, npqp, splits, kt_per_split;
};
template <class T>
FilterPlan filter_plan(const ConvTcShape& s) {
  FilterPlan f;
  f.crs = s.C * s.R * s.S;
  f.npqp = padded<T>(s.N * s.P * s.Q);
  f.z.in_h = 1, f.z.in_w = f.crs, f.z.cp = f.npqp;
  f.z.in_elems = f.crs * f.npqp, f.z.w_elems = s.K * f.npqp;
  // The output is small and the reduction long: enough splits for about two blocks per SM of an
  // H100 (264), each at least 8 tiles of the reduction; the partials are summed in split order.
  const int64_t tiles = detail::ceil_div(f.crs, kBM) * detail::ceil_div(s.K, kBN);
  const int64_t kt_all = detail::ceil_div(f.npqp, kChunks * Elem<T>::kPerChunk);
  int64_t splits = std::min(detail::ceil_div(264, tiles), detail::ceil_div(kt_all, 8));
  splits = std::max<int64_t>(1, std::min<int64_t>(splits, 64));
  f.kt_per_split = detail::ceil_div(kt_all, splits);
  f.splits = detail::ceil_div(kt_all, f.kt_per_split);
  return f;
}
template <class T>
uint64_t filter_workspace_bytes(const ConvTcShape& s, const FilterPlan& f) {
  return pass_workspace_bytes<T>(f.z) +
         (f.splits > 1 ? round_up_256(static_cast<uint64_t>(f.splits * s.K * f.crs) * 4) : 0);
}

}  // namespace

template <class T>
uint64_t conv2d_backward_filter_tc_workspace_bytes(const ConvTcShape& s) {
  return filter_workspace_bytes<T>(s, filter_plan<T>(s));
}

template <class T>
void conv2d_backward_filter_tc(const T* x, const T* dy, T* dw, const ConvTcShape& s) {
  const char* name = std::is_same<T, float>::value      ? "conv2d_backward_filter_tc (tf32)"
                     : std::is_same<T, bfloat16>::value ? "conv2d_backward_filter_tc (bf16)"
                                                        : "conv2d_backward_filter_tc (f16)";
  const FilterPlan f = filter_plan<T>(s);
  check_int32(name, "the im2col matrix (C R S, N P Q padded)", f.z.in_elems);
  check_int32(name, "dy (K, N P Q padded)", f.z.w_elems);
  check_int32(name, "x", s.N * s.C * s.H * s.W);
  check_int32(name, "dy", s.N * s.K * s.P * s.Q);
  Workspace ws(detail::device(), filter_workspace_bytes<T>(s, f));
  if (dry_run_active()) return;  // the dry path: the operands' and partials' block, unused
  require_tensor_cores(name);
  unsigned char* base = static_cast<unsigned char*>(ws.data());
  T* colt = reinterpret_cast<T*>(base);
  base += round_up_256(static_cast<uint64_t>(f.z.in_elems) * sizeof(T));
  T* dyt = reinterpret_cast<T*>(base);
  base += round_up_256(static_cast<uint64_t>(f.z.w_elems) * sizeof(T));
  float* partials = reinterpret_cast<float*>(base);
  Geom g;
  g.N = static_cast<int>(s.N), g.C = static_cast<int>(s.C), g.H = static_cast<int>(s.H);
  g.W = static_cast<int>(s.W), g.K = static_cast<int>(s.K), g.R = static_cast<int>(s.R);
  g.S = static_cast<int>(s.S), g.P = static_cast<int>(s.P), g.Q = static_cast<int>(s.Q);
  g.sh = static_cast<int>(s.stride_h), g.sw = static_cast<int>(s.stride_w);
  g.ph = static_cast<int>(s.pad_h), g.pw = static_cast<int>(s.pad_w);
  g.dh = static_cast<int>(s.dil_h), g.dw = static_cast<int>(s.dil_w);
  im2col_t_kernel<T><<<detail::grid_blocks(f.z.in_elems, 256), 256, 0, stream()>>>(
      x, colt, g, static_cast<int>(f.npqp));
  REGEN_CUDA_LAUNCH_CHECK(name);
  dy_t_kernel<T><<<detail::grid_blocks(f.z.w_elems, 256), 256, 0, stream()>>>(
      dy, dyt, g.N, g.K, g.P * g.Q, static_cast<int>(f.npqp));
  REGEN_CUDA_LAUNCH_CHECK(name);
  if (f.splits == 1) {
    launch_gemm<T, T>(name, colt, dyt, nullptr, dw, 1, f.z, s.K, 1, 1, 1, f.crs, 1, 1, 0, 0, 1, 1);
    return;
  }
  launch_gemm<T, float>(name, colt, dyt, nullptr, partials, 1, f.z, s.K, 1, 1, 1, f.crs, 1, 1, 0, 0,
                        1, 1, static_cast<int>(f.splits), static_cast<int>(f.kt_per_split));
  const int64_t n = s.K * f.crs;
  split_sum_kernel<T><<<detail::grid_blocks(n, 256), 256, 0, stream()>>>(
      partials, static_cast<int>(f.splits), n, dw);
  REGEN_CUDA_LAUNCH_CHECK(name);
}

void ldmatrix_probe(int count, bool trans, const uint16_t* src, uint32_t* out) {
  REGEN_CHECK(count == 1 || count == 2 || count == 4, "ldmatrix_probe: count ", count,
              " is not 1, 2 or 4");
  require_tensor_cores("ldmatrix_probe");
  ldmatrix_probe_kernel<<<1, 32, 4 * 64 * sizeof(uint16_t), stream()>>>(count, trans, src, out);
  REGEN_CUDA_LAUNCH_CHECK("ldmatrix_probe");
}

template <class T>
void mma_tile_probe(const T* a, const T* b, float* d, bool b_trans) {
  require_tensor_cores("mma_tile_probe");
  mma_tile_probe_kernel<T><<<1, 32, 512 * sizeof(T), stream()>>>(a, b, d, b_trans);
  REGEN_CUDA_LAUNCH_CHECK("mma_tile_probe");
}

#define REGEN_CONV_TC(T)                                                                    \
  template void conv2d_forward_tc<T>(const T*, const T*, const T*, T*, const ConvTcShape&); \
  template uint64_t conv2d_forward_tc_workspace_bytes<T>(const ConvTcShape&);               \
  template void conv2d_backward_data_tc<T>(const T*, const T*, T*, const ConvTcShape&);     \
  template uint64_t conv2d_backward_data_tc_workspace_bytes<T>(const ConvTcShape&);         \
  template void conv2d_backward_filter_tc<T>(const T*, const T*, T*, const ConvTcShape&);   \
  template uint64_t conv2d_backward_filter_tc_workspace_bytes<T>(const ConvTcShape&);       \
  template void mma_tile_probe<T>(const T*, const T*, float*, bool);
REGEN_CONV_TC(bfloat16)
REGEN_CONV_TC(float16)
REGEN_CONV_TC(float)
#undef REGEN_CONV_TC

}  // namespace regen::cuda::tc
