// Flash-style fused multi-head attention on the packed qkv layout (declared in
// kernels/cuda/cuda_kernels.h; shapes in kernels/shapes.h; CPU reference kernels/cpu/attention.cpp;
// test tests/cuda/test_cuda_ops.cpp; timed against an unfused cuBLAS + softmax path by
// `regen bench kernels`).
//
// Nothing of size S x S is ever stored. Tiles are 64 queries x 64 keys, 256 threads per block;
// thread (ty, tx) = (tid / 16, tid % 16) owns tile rows ty + 16a and tile columns tx + 16c
// (a, c < 4; interleaved so that the shared-memory reads below are free of bank conflicts), and
// output columns d = 4tx..4tx+3 (+64 when the head dim is above 64).
//
// forward (grid: query tiles x B*H): Q tile resident in shared memory; K and V tiles streamed;
//   S = scale * Q K^T, masks (key padding, causal, past the end), online softmax (running row
//   max m and sum l, O rescaled by exp(m_old - m_new)), dropout on the probabilities (the sum l
//   uses the undropped ones), O += P V. Output O / l and lse = m + log l; a row with no visible
//   key gets O = 0 and lse = -inf. Causal blocks skip the key tiles above the diagonal.
// backward, three kernels, no atomics:
//   1. D_i = <dO_i, O_i> per (b, h, i) (one warp per row, in double);
//   2. dK, dV: one block per key tile loops over the query tiles, recomputing P = exp(S - lse)
//      and dP = dO V^T tile by tile; dV += Pd^T dO, dK += dS^T Q with dS = P * (dP - D). Each
//      key row is owned by one block, so the sums have a fixed order;
//   3. dQ: one block per query tile loops over the key tiles, recomputing S, P, dP and
//      accumulating dQ += dS K. (Two of the five products are recomputed: the price of a
//      deterministic dQ without atomics or an S x S buffer.)
// Dropout keeps score (i, j) of head (b, h) iff philox_word(seed, stream, ((b*H + h)*S + i)*S + j)
// >= p * 2^32, the CPU's rule and element index, so the masks agree bit for bit. Each tile's
// 64 x 64 keep bits are generated once into shared memory (one Philox call per four keys).
//
// bf16 and f16 (attention_forward<T>, attention_backward<T>): Q, K, V and dO are widened to f32 as
// their tiles are loaded, so the scores, the online softmax and every product run in f32 exactly
// as for float; out and dqkv are rounded once as they are stored; lse and the row terms D stay f32
// (the CPU's 16-bit contract, kernels/cpu/attention.cpp).
//
// Shared tiles are row-major [row][d] with a row stride of head_dim + 4 floats, read as float4
// along d: 16 threads reading 16 different rows at the same column hit 16 different bank groups.
// Probabilities and dS are staged transposed with the owning thread's four rows packed into one
// float4 ([key][4*ty + a]), so the P V style products read one float4 per key.
#include <cfloat>
#include <map>
#include <mutex>
#include <type_traits>
#include <utility>

#include "regen/core/cuda/graph.h"
#include "regen/core/philox.h"
#include "regen/core/tensor.h"
#include "regen/kernels/cuda/attention_tc.h"
#include "regen/kernels/cuda/common.cuh"
#include "regen/kernels/cuda/cuda_kernels.h"

namespace regen::cuda {
namespace {

constexpr int kTile = 64;      // queries per block and keys per tile
constexpr int kThreads = 256;  // 16 x 16
constexpr int kPStride = kTile + 4;

// T: the element type of qkv, out, dout and dqkv (float, or 16-bit: widened as tiles are loaded,
// every product and softmax term in f32, rounded once as out and dqkv are stored); lse and D f32.
template <class T>
struct AttnParamsT {
  const T* qkv;            // (B, S, 3, H, Dh)
  const int32_t* key_pad;  // (B, S) or null
  T* out;                  // forward: (B, S, H*Dh)
  float* lse;              // forward: (B, H, S)
  const T* dout;           // backward: (B, S, H*Dh)
  const T* o;              // backward: (B, S, H*Dh), the forward output
  const float* lse_in;     // backward: (B, H, S)
  const float* dvec;       // backward: (B, H, S), D_i
  T* dqkv;                 // backward: (B, S, 3, H, Dh)
  int B, S, H, Dh, D;
  float scale;
  bool causal, dropout, vec4;
  float keep_scale;
  uint64_t threshold, seed, stream;
  // Added to `stream` when not null: a captured step's replays move it on (core/cuda/graph.h).
  const uint64_t* stream_offset;
};
using AttnParams = AttnParamsT<float>;
// vec4 (float4 loads and stores) is the float kernels' only: 16-bit tiles go element by element.
template <class T>
constexpr bool kIsF32 = std::is_same<T, float>::value;

__device__ __forceinline__ float dot4(float4 a, float4 b, float acc) {
  acc = fmaf(a.x, b.x, acc);
  acc = fmaf(a.y, b.y, acc);
  acc = fmaf(a.z, b.z, acc);
  return fmaf(a.w, b.w, acc);
}
__device__ __forceinline__ float comp(const float4& v, int e) {
  return e == 0 ? v.x : e == 1 ? v.y : e == 2 ? v.z : v.w;
}

// Copies rows [row0, row0 + 64) of a (rows, ld) matrix's columns [0, Dh) into dst [64][kD + 4];
// rows past `rows` and columns past Dh become 0.
template <int kD, class T>
__device__ __forceinline__ void load_tile(float* dst, const T* src, int64_t ld, int row0, int rows,
                                          int Dh, bool vec4) {
  constexpr int kStride = kD + 4;
  if constexpr (!kIsF32<T>) {
    for (int f = threadIdx.x; f < kTile * kD; f += kThreads) {
      const int r = f / kD, d = f - r * kD;
      dst[r * kStride + d] = (row0 + r < rows && d < Dh)
                                 ? static_cast<float>(src[static_cast<int64_t>(row0 + r) * ld + d])
                                 : 0.0f;
    }
  } else if (vec4) {
    constexpr int kVec = kD / 4;
    for (int f = threadIdx.x; f < kTile * kVec; f += kThreads) {
      const int r = f / kVec, d4 = f - r * kVec;
      float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
      if (row0 + r < rows && 4 * d4 < Dh) {
        v = __ldg(reinterpret_cast<const float4*>(src + static_cast<int64_t>(row0 + r) * ld) + d4);
      }
      *reinterpret_cast<float4*>(dst + r * kStride + 4 * d4) = v;
    }
  } else {
    for (int f = threadIdx.x; f < kTile * kD; f += kThreads) {
      const int r = f / kD, d = f - r * kD;
      dst[r * kStride + d] =
          (row0 + r < rows && d < Dh) ? __ldg(src + static_cast<int64_t>(row0 + r) * ld + d) : 0.0f;
    }
  }
}

// masked[j] = 1 when key j0 + j is padding or past the end.
template <class P>
__device__ __forceinline__ void load_key_mask(int* masked, const P& p, int b, int j0) {
  if (threadIdx.x < kTile) {
    const int j = j0 + threadIdx.x;
    masked[threadIdx.x] =
        (j >= p.S || (p.key_pad && p.key_pad[static_cast<int64_t>(b) * p.S + j] != 0)) ? 1 : 0;
  }
}

// Keep bits of the dropout mask for queries [i0, i0+64) x keys [j0, j0+64) of head bh:
// bit (j & 31) of words[i * 2 + j / 32]. Thread t makes 16 bits: row t / 4, keys 16*(t % 4)...
template <class P>
__device__ __forceinline__ void make_keep_bits(uint32_t* words, const P& p, int bh, int i0,
                                               int j0) {
  const int r = threadIdx.x >> 2, g = threadIdx.x & 3;
  const int i = i0 + r;
  uint32_t bits = 0;
  if (i < p.S) {
    const uint64_t e0 = (static_cast<uint64_t>(bh) * p.S + i) * static_cast<uint64_t>(p.S) +
                        static_cast<uint64_t>(j0 + 16 * g);
    const PhiloxKey key{static_cast<uint32_t>(p.seed), static_cast<uint32_t>(p.seed >> 32)};
    const uint64_t stream = p.stream + (p.stream_offset ? *p.stream_offset : 0);
    uint64_t block = ~0ull;
    uint32_t w[4] = {0, 0, 0, 0};
    for (int cc = 0; cc < 16; ++cc) {
      if (j0 + 16 * g + cc >= p.S) break;
      const uint64_t e = e0 + cc;
      if ((e >> 2) != block) {
        block = e >> 2;
        philox4x32_10({static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32),
                       static_cast<uint32_t>(stream), static_cast<uint32_t>(stream >> 32)},
                      key, w);
      }
      if (w[e & 3] >= p.threshold) bits |= 1u << cc;
    }
  }
  // Lanes g and g ^ 1 are adjacent: the even one packs both halves of the 32-bit word.
  const uint32_t other = __shfl_xor_sync(dev::kFullMask, bits, 1);
  if ((g & 1) == 0) words[r * 2 + (g >> 1)] = bits | (other << 16);
}
__device__ __forceinline__ bool kept(const uint32_t* words, int i_local, int j_local) {
  return (words[i_local * 2 + (j_local >> 5)] >> (j_local & 31)) & 1u;
}

// Shared-memory layout (floats): tiles of [64][kD + 4], staging tiles of [64][68], then ints.
template <int kD>
struct Smem {
  static constexpr int kTileFloats = kTile * (kD + 4);
  static constexpr int kStageFloats = kTile * kPStride;
  // forward: Q, K, V tiles, P staging; backward A: K, V, Q, dO, Pd, dS; backward B: Q, dO, K, V,
  // dS.
  static constexpr int forward_floats = 3 * kTileFloats + kStageFloats;
  static constexpr int dkdv_floats = 4 * kTileFloats + 2 * kStageFloats + 2 * kTile;
  static constexpr int dq_floats = 4 * kTileFloats + kStageFloats + 2 * kTile;
  static constexpr int kExtraInts = kTile + 2 * kTile;  // key mask, keep bits
  static constexpr size_t bytes(int floats) { return (floats + kExtraInts) * sizeof(float); }
};

// ---- Forward ------------------------------------------------------------------------------------

template <int kD, class T>
__global__ void __launch_bounds__(kThreads, kD <= 64 ? 2 : 1)
    attention_forward_kernel(const AttnParamsT<T> p) {
  constexpr int kStride = kD + 4, kHalves = kD / 64;
  using L = Smem<kD>;
  extern __shared__ __align__(16) float smem[];
  float* Qs = smem;
  float* Ks = Qs + L::kTileFloats;
  float* Vs = Ks + L::kTileFloats;
  float* Ps = Vs + L::kTileFloats;  // [key j][4*ty + a] = P of query ty + 16a
  int* masked = reinterpret_cast<int*>(Ps + L::kStageFloats);
  uint32_t* keep_words = reinterpret_cast<uint32_t*>(masked + kTile);

  const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
  const int bh = blockIdx.y, b = bh / p.H, h = bh - b * p.H;
  const int i0 = blockIdx.x * kTile;
  const int64_t ld = 3 * static_cast<int64_t>(p.D);
  const T* q_base = p.qkv + static_cast<int64_t>(b) * p.S * ld + static_cast<int64_t>(h) * p.Dh;
  const T* k_base = q_base + p.D;
  const T* v_base = q_base + 2 * p.D;
  load_tile<kD>(Qs, q_base, ld, i0, p.S, p.Dh, p.vec4);

  float o[4][4 * kHalves];
  float m[4], l[4];
#pragma unroll
  for (int a = 0; a < 4; ++a) {
    m[a] = -INFINITY;
    l[a] = 0.0f;
#pragma unroll
    for (int e = 0; e < 4 * kHalves; ++e) o[a][e] = 0.0f;
  }
  const int nd4 = (p.Dh + 3) / 4;
  const int n_tiles = (p.S + kTile - 1) / kTile;
  const int i_last = min(i0 + kTile - 1, p.S - 1);
  const int tiles = p.causal ? min(n_tiles, i_last / kTile + 1) : n_tiles;

  for (int kt = 0; kt < tiles; ++kt) {
    const int j0 = kt * kTile;
    __syncthreads();  // the previous tile's readers are done with Ks, Vs, Ps
    load_tile<kD>(Ks, k_base, ld, j0, p.S, p.Dh, p.vec4);
    load_tile<kD>(Vs, v_base, ld, j0, p.S, p.Dh, p.vec4);
    load_key_mask(masked, p, b, j0);
    if (p.dropout) make_keep_bits(keep_words, p, bh, i0, j0);
    __syncthreads();

    float s[4][4];
#pragma unroll
    for (int a = 0; a < 4; ++a) {
#pragma unroll
      for (int c = 0; c < 4; ++c) s[a][c] = 0.0f;
    }
    for (int d4 = 0; d4 < nd4; ++d4) {
      float4 qf[4], kf[4];
#pragma unroll
      for (int a = 0; a < 4; ++a)
        qf[a] = *reinterpret_cast<const float4*>(Qs + (ty + 16 * a) * kStride + 4 * d4);
#pragma unroll
      for (int c = 0; c < 4; ++c)
        kf[c] = *reinterpret_cast<const float4*>(Ks + (tx + 16 * c) * kStride + 4 * d4);
#pragma unroll
      for (int a = 0; a < 4; ++a) {
#pragma unroll
        for (int c = 0; c < 4; ++c) s[a][c] = dot4(qf[a], kf[c], s[a][c]);
      }
    }

    float pd[4][4];
#pragma unroll
    for (int a = 0; a < 4; ++a) {
      const int i = i0 + ty + 16 * a;
      float tile_max = -INFINITY;
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int jl = tx + 16 * c;
        const bool hidden = masked[jl] || (p.causal && j0 + jl > i);
        s[a][c] = hidden ? -INFINITY : s[a][c] * p.scale;
        tile_max = fmaxf(tile_max, s[a][c]);
      }
      tile_max = dev::group_max<16>(tile_max);
      const float m_new = fmaxf(m[a], tile_max);
      const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // all hidden so far: exp(-inf) = 0
      const float alpha = expf(m[a] - m_use);
      float row_sum = 0.0f;
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const float e = expf(s[a][c] - m_use);
        row_sum += e;
        pd[a][c] = e;
      }
      row_sum = dev::group_sum<16>(row_sum);
      l[a] = l[a] * alpha + row_sum;
      m[a] = m_new;
#pragma unroll
      for (int e = 0; e < 4 * kHalves; ++e) o[a][e] *= alpha;
      if (p.dropout) {
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          pd[a][c] = kept(keep_words, ty + 16 * a, tx + 16 * c) ? pd[a][c] * p.keep_scale : 0.0f;
        }
      }
    }
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      *reinterpret_cast<float4*>(Ps + (tx + 16 * c) * kPStride + 4 * ty) =
          make_float4(pd[0][c], pd[1][c], pd[2][c], pd[3][c]);
    }
    __syncthreads();

    const int keys = min(kTile, p.S - j0);
    for (int j = 0; j < keys; ++j) {
      const float4 pv = *reinterpret_cast<const float4*>(Ps + j * kPStride + 4 * ty);
#pragma unroll
      for (int hf = 0; hf < kHalves; ++hf) {
        const float4 vv = *reinterpret_cast<const float4*>(Vs + j * kStride + 64 * hf + 4 * tx);
#pragma unroll
        for (int a = 0; a < 4; ++a) {
          const float pa = comp(pv, a);
          o[a][4 * hf + 0] = fmaf(pa, vv.x, o[a][4 * hf + 0]);
          o[a][4 * hf + 1] = fmaf(pa, vv.y, o[a][4 * hf + 1]);
          o[a][4 * hf + 2] = fmaf(pa, vv.z, o[a][4 * hf + 2]);
          o[a][4 * hf + 3] = fmaf(pa, vv.w, o[a][4 * hf + 3]);
        }
      }
    }
  }

#pragma unroll
  for (int a = 0; a < 4; ++a) {
    const int i = i0 + ty + 16 * a;
    if (i >= p.S) continue;
    const float inv = l[a] > 0.0f ? 1.0f / l[a] : 0.0f;
    T* out_row = p.out + (static_cast<int64_t>(b) * p.S + i) * p.D + static_cast<int64_t>(h) * p.Dh;
#pragma unroll
    for (int hf = 0; hf < kHalves; ++hf) {
      const int d = 64 * hf + 4 * tx;
      if (d >= p.Dh) continue;
      if (kIsF32<T> && p.vec4) {
        *reinterpret_cast<float4*>(out_row + d) =
            make_float4(o[a][4 * hf] * inv, o[a][4 * hf + 1] * inv, o[a][4 * hf + 2] * inv,
                        o[a][4 * hf + 3] * inv);
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          if (d + e < p.Dh) out_row[d + e] = T(o[a][4 * hf + e] * inv);
        }
      }
    }
    if (tx == 0) {
      p.lse[static_cast<int64_t>(bh) * p.S + i] = l[a] > 0.0f ? m[a] + logf(l[a]) : -INFINITY;
    }
  }
}

// ---- Backward -----------------------------------------------------------------------------------

// dvec[(b*H + h)*S + i] = <dout, out> over the head's Dh columns; one warp per (b, i, h) row.
template <class T>
__global__ void attention_dvec_kernel(const T* dout, const T* out, float* dvec, int64_t rows, int S,
                                      int H, int Dh) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + (threadIdx.x >> 5);
  if (row >= rows) return;
  const T* g = dout + row * Dh;  // rows (b, i, h) are contiguous runs of Dh in (B, S, H*Dh)
  const T* y = out + row * Dh;
  double acc = 0.0;
  for (int d = lane; d < Dh; d += 32) {
    acc += static_cast<double>(static_cast<float>(g[d])) *
           static_cast<double>(static_cast<float>(y[d]));
  }
  acc = dev::warp_sum(acc);
  if (lane == 0) {
    const int64_t bi = row / H;
    const int h = static_cast<int>(row - bi * H);
    const int64_t b = bi / S;
    const int i = static_cast<int>(bi - b * S);
    dvec[(b * H + h) * S + i] = static_cast<float>(acc);
  }
}

// Loads lse and D for query rows [i0, i0 + 64) of head bh into shared memory.
template <class P>
__device__ __forceinline__ void load_row_stats(float* lse_s, float* d_s, const P& p, int bh,
                                               int i0) {
  if (threadIdx.x < kTile) {
    const int i = i0 + threadIdx.x;
    const bool ok = i < p.S;
    lse_s[threadIdx.x] = ok ? p.lse_in[static_cast<int64_t>(bh) * p.S + i] : -INFINITY;
    d_s[threadIdx.x] = ok ? p.dvec[static_cast<int64_t>(bh) * p.S + i] : 0.0f;
  }
}

// P and dS of one (query, key) pair from the recomputed score and dPd = dO . V.
// Returns P (dropped out, for dV) in pd and dS (without the softmax scale) in ds.
template <class P>
__device__ __forceinline__ void probs_and_grads(const P& p, float score, float dpd, float lse_i,
                                                float d_i, bool visible, bool keep, float& pd,
                                                float& ds) {
  const float prob = (visible && lse_i != -INFINITY) ? expf(score * p.scale - lse_i) : 0.0f;
  float dp = dpd;
  pd = prob;
  if (p.dropout) {
    pd = keep ? prob * p.keep_scale : 0.0f;
    dp = keep ? dpd * p.keep_scale : 0.0f;
  }
  ds = prob * (dp - d_i);
}

// dK, dV of key tile blockIdx.x of head blockIdx.y.
template <int kD, class T>
__global__ void __launch_bounds__(kThreads, kD <= 64 ? 2 : 1)
    attention_dkdv_kernel(const AttnParamsT<T> p) {
  constexpr int kStride = kD + 4, kHalves = kD / 64;
  using L = Smem<kD>;
  extern __shared__ __align__(16) float smem[];
  float* Ks = smem;
  float* Vs = Ks + L::kTileFloats;
  float* Qs = Vs + L::kTileFloats;
  float* dOs = Qs + L::kTileFloats;
  float* Ps = dOs + L::kTileFloats;   // [query i][4*ty + a] = Pd of key ty + 16a
  float* dSs = Ps + L::kStageFloats;  // same layout, dS
  float* lse_s = dSs + L::kStageFloats;
  float* d_s = lse_s + kTile;
  int* masked = reinterpret_cast<int*>(d_s + kTile);
  uint32_t* keep_words = reinterpret_cast<uint32_t*>(masked + kTile);

  const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
  const int bh = blockIdx.y, b = bh / p.H, h = bh - b * p.H;
  const int j0 = blockIdx.x * kTile;
  const int64_t ld = 3 * static_cast<int64_t>(p.D);
  const T* q_base = p.qkv + static_cast<int64_t>(b) * p.S * ld + static_cast<int64_t>(h) * p.Dh;
  const T* do_base = p.dout + static_cast<int64_t>(b) * p.S * p.D + static_cast<int64_t>(h) * p.Dh;
  load_tile<kD>(Ks, q_base + p.D, ld, j0, p.S, p.Dh, p.vec4);
  load_tile<kD>(Vs, q_base + 2 * p.D, ld, j0, p.S, p.Dh, p.vec4);
  load_key_mask(masked, p, b, j0);

  float dk[4][4 * kHalves], dv[4][4 * kHalves];  // keys ty + 16a, columns 64*hf + 4tx + e
#pragma unroll
  for (int a = 0; a < 4; ++a) {
#pragma unroll
    for (int e = 0; e < 4 * kHalves; ++e) {
      dk[a][e] = 0.0f;
      dv[a][e] = 0.0f;
    }
  }
  const int nd4 = (p.Dh + 3) / 4;
  const int n_tiles = (p.S + kTile - 1) / kTile;
  const int first = p.causal ? blockIdx.x : 0;  // queries before the key tile see none of its keys

  for (int qt = first; qt < n_tiles; ++qt) {
    const int i0 = qt * kTile;
    __syncthreads();
    load_tile<kD>(Qs, q_base, ld, i0, p.S, p.Dh, p.vec4);
    load_tile<kD>(dOs, do_base, p.D, i0, p.S, p.Dh, p.vec4);
    load_row_stats(lse_s, d_s, p, bh, i0);
    if (p.dropout) make_keep_bits(keep_words, p, bh, i0, j0);
    __syncthreads();

    // S^T and dPd^T for keys ty + 16a (rows) and queries tx + 16c (columns).
    float st[4][4], dpt[4][4];
#pragma unroll
    for (int a = 0; a < 4; ++a) {
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        st[a][c] = 0.0f;
        dpt[a][c] = 0.0f;
      }
    }
    for (int d4 = 0; d4 < nd4; ++d4) {
      float4 kf[4], qf[4];
#pragma unroll
      for (int a = 0; a < 4; ++a)
        kf[a] = *reinterpret_cast<const float4*>(Ks + (ty + 16 * a) * kStride + 4 * d4);
#pragma unroll
      for (int c = 0; c < 4; ++c)
        qf[c] = *reinterpret_cast<const float4*>(Qs + (tx + 16 * c) * kStride + 4 * d4);
#pragma unroll
      for (int a = 0; a < 4; ++a) {
#pragma unroll
        for (int c = 0; c < 4; ++c) st[a][c] = dot4(kf[a], qf[c], st[a][c]);
      }
    }
    for (int d4 = 0; d4 < nd4; ++d4) {
      float4 vf[4], gf[4];
#pragma unroll
      for (int a = 0; a < 4; ++a)
        vf[a] = *reinterpret_cast<const float4*>(Vs + (ty + 16 * a) * kStride + 4 * d4);
#pragma unroll
      for (int c = 0; c < 4; ++c)
        gf[c] = *reinterpret_cast<const float4*>(dOs + (tx + 16 * c) * kStride + 4 * d4);
#pragma unroll
      for (int a = 0; a < 4; ++a) {
#pragma unroll
        for (int c = 0; c < 4; ++c) dpt[a][c] = dot4(vf[a], gf[c], dpt[a][c]);
      }
    }
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int il = tx + 16 * c, i = i0 + il;
      float pd[4], ds[4];
#pragma unroll
      for (int a = 0; a < 4; ++a) {
        const int jl = ty + 16 * a;
        const bool visible = i < p.S && !masked[jl] && !(p.causal && j0 + jl > i);
        const bool keep = p.dropout && kept(keep_words, il, jl);
        probs_and_grads(p, st[a][c], dpt[a][c], lse_s[il], d_s[il], visible, keep, pd[a], ds[a]);
      }
      *reinterpret_cast<float4*>(Ps + il * kPStride + 4 * ty) =
          make_float4(pd[0], pd[1], pd[2], pd[3]);
      *reinterpret_cast<float4*>(dSs + il * kPStride + 4 * ty) =
          make_float4(ds[0], ds[1], ds[2], ds[3]);
    }
    __syncthreads();

    const int queries = min(kTile, p.S - i0);
    for (int i = 0; i < queries; ++i) {
      const float4 pv = *reinterpret_cast<const float4*>(Ps + i * kPStride + 4 * ty);
      const float4 sv = *reinterpret_cast<const float4*>(dSs + i * kPStride + 4 * ty);
#pragma unroll
      for (int hf = 0; hf < kHalves; ++hf) {
        const float4 gv = *reinterpret_cast<const float4*>(dOs + i * kStride + 64 * hf + 4 * tx);
        const float4 qv = *reinterpret_cast<const float4*>(Qs + i * kStride + 64 * hf + 4 * tx);
#pragma unroll
        for (int a = 0; a < 4; ++a) {
          const float pa = comp(pv, a), sa = comp(sv, a);
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            dv[a][4 * hf + e] = fmaf(pa, comp(gv, e), dv[a][4 * hf + e]);
            dk[a][4 * hf + e] = fmaf(sa, comp(qv, e), dk[a][4 * hf + e]);
          }
        }
      }
    }
  }

  // dK = scale * dS^T Q, dV = Pd^T dO, into the k and v parts of dqkv.
#pragma unroll
  for (int a = 0; a < 4; ++a) {
    const int j = j0 + ty + 16 * a;
    if (j >= p.S) continue;
    T* dk_row =
        p.dqkv + (static_cast<int64_t>(b) * p.S + j) * ld + p.D + static_cast<int64_t>(h) * p.Dh;
    T* dv_row = dk_row + p.D;
#pragma unroll
    for (int hf = 0; hf < kHalves; ++hf) {
      const int d = 64 * hf + 4 * tx;
      if (d >= p.Dh) continue;
      if (kIsF32<T> && p.vec4) {
        *reinterpret_cast<float4*>(dk_row + d) =
            make_float4(dk[a][4 * hf] * p.scale, dk[a][4 * hf + 1] * p.scale,
                        dk[a][4 * hf + 2] * p.scale, dk[a][4 * hf + 3] * p.scale);
        *reinterpret_cast<float4*>(dv_row + d) =
            make_float4(dv[a][4 * hf], dv[a][4 * hf + 1], dv[a][4 * hf + 2], dv[a][4 * hf + 3]);
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          if (d + e < p.Dh) {
            dk_row[d + e] = T(dk[a][4 * hf + e] * p.scale);
            dv_row[d + e] = T(dv[a][4 * hf + e]);
          }
        }
      }
    }
  }
}

// dQ of query tile blockIdx.x of head blockIdx.y.
template <int kD, class T>
__global__ void __launch_bounds__(kThreads, kD <= 64 ? 2 : 1)
    attention_dq_kernel(const AttnParamsT<T> p) {
  constexpr int kStride = kD + 4, kHalves = kD / 64;
  using L = Smem<kD>;
  extern __shared__ __align__(16) float smem[];
  float* Qs = smem;
  float* dOs = Qs + L::kTileFloats;
  float* Ks = dOs + L::kTileFloats;
  float* Vs = Ks + L::kTileFloats;
  float* dSs = Vs + L::kTileFloats;  // [key j][4*ty + a] = dS of query ty + 16a
  float* lse_s = dSs + L::kStageFloats;
  float* d_s = lse_s + kTile;
  int* masked = reinterpret_cast<int*>(d_s + kTile);
  uint32_t* keep_words = reinterpret_cast<uint32_t*>(masked + kTile);

  const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
  const int bh = blockIdx.y, b = bh / p.H, h = bh - b * p.H;
  const int i0 = blockIdx.x * kTile;
  const int64_t ld = 3 * static_cast<int64_t>(p.D);
  const T* q_base = p.qkv + static_cast<int64_t>(b) * p.S * ld + static_cast<int64_t>(h) * p.Dh;
  const T* do_base = p.dout + static_cast<int64_t>(b) * p.S * p.D + static_cast<int64_t>(h) * p.Dh;
  load_tile<kD>(Qs, q_base, ld, i0, p.S, p.Dh, p.vec4);
  load_tile<kD>(dOs, do_base, p.D, i0, p.S, p.Dh, p.vec4);
  load_row_stats(lse_s, d_s, p, bh, i0);

  float dq[4][4 * kHalves];  // queries ty + 16a, columns 64*hf + 4tx + e
#pragma unroll
  for (int a = 0; a < 4; ++a) {
#pragma unroll
    for (int e = 0; e < 4 * kHalves; ++e) dq[a][e] = 0.0f;
  }
  const int nd4 = (p.Dh + 3) / 4;
  const int n_tiles = (p.S + kTile - 1) / kTile;
  const int i_last = min(i0 + kTile - 1, p.S - 1);
  const int tiles = p.causal ? min(n_tiles, i_last / kTile + 1) : n_tiles;

  for (int kt = 0; kt < tiles; ++kt) {
    const int j0 = kt * kTile;
    __syncthreads();
    load_tile<kD>(Ks, q_base + p.D, ld, j0, p.S, p.Dh, p.vec4);
    load_tile<kD>(Vs, q_base + 2 * p.D, ld, j0, p.S, p.Dh, p.vec4);
    load_key_mask(masked, p, b, j0);
    if (p.dropout) make_keep_bits(keep_words, p, bh, i0, j0);
    __syncthreads();

    float s[4][4], dpd[4][4];  // queries ty + 16a, keys tx + 16c
#pragma unroll
    for (int a = 0; a < 4; ++a) {
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        s[a][c] = 0.0f;
        dpd[a][c] = 0.0f;
      }
    }
    for (int d4 = 0; d4 < nd4; ++d4) {
      float4 qf[4], kf[4];
#pragma unroll
      for (int a = 0; a < 4; ++a)
        qf[a] = *reinterpret_cast<const float4*>(Qs + (ty + 16 * a) * kStride + 4 * d4);
#pragma unroll
      for (int c = 0; c < 4; ++c)
        kf[c] = *reinterpret_cast<const float4*>(Ks + (tx + 16 * c) * kStride + 4 * d4);
#pragma unroll
      for (int a = 0; a < 4; ++a) {
#pragma unroll
        for (int c = 0; c < 4; ++c) s[a][c] = dot4(qf[a], kf[c], s[a][c]);
      }
    }
    for (int d4 = 0; d4 < nd4; ++d4) {
      float4 gf[4], vf[4];
#pragma unroll
      for (int a = 0; a < 4; ++a)
        gf[a] = *reinterpret_cast<const float4*>(dOs + (ty + 16 * a) * kStride + 4 * d4);
#pragma unroll
      for (int c = 0; c < 4; ++c)
        vf[c] = *reinterpret_cast<const float4*>(Vs + (tx + 16 * c) * kStride + 4 * d4);
#pragma unroll
      for (int a = 0; a < 4; ++a) {
#pragma unroll
        for (int c = 0; c < 4; ++c) dpd[a][c] = dot4(gf[a], vf[c], dpd[a][c]);
      }
    }
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int jl = tx + 16 * c;
      float ds[4];
#pragma unroll
      for (int a = 0; a < 4; ++a) {
        const int il = ty + 16 * a, i = i0 + il;
        const bool visible = i < p.S && !masked[jl] && !(p.causal && j0 + jl > i);
        const bool keep = p.dropout && kept(keep_words, il, jl);
        float pd_unused;
        probs_and_grads(p, s[a][c], dpd[a][c], lse_s[il], d_s[il], visible, keep, pd_unused, ds[a]);
      }
      *reinterpret_cast<float4*>(dSs + jl * kPStride + 4 * ty) =
          make_float4(ds[0], ds[1], ds[2], ds[3]);
    }
    __syncthreads();

    const int keys = min(kTile, p.S - j0);
    for (int j = 0; j < keys; ++j) {
      const float4 sv = *reinterpret_cast<const float4*>(dSs + j * kPStride + 4 * ty);
#pragma unroll
      for (int hf = 0; hf < kHalves; ++hf) {
        const float4 kv = *reinterpret_cast<const float4*>(Ks + j * kStride + 64 * hf + 4 * tx);
#pragma unroll
        for (int a = 0; a < 4; ++a) {
          const float sa = comp(sv, a);
          dq[a][4 * hf + 0] = fmaf(sa, kv.x, dq[a][4 * hf + 0]);
          dq[a][4 * hf + 1] = fmaf(sa, kv.y, dq[a][4 * hf + 1]);
          dq[a][4 * hf + 2] = fmaf(sa, kv.z, dq[a][4 * hf + 2]);
          dq[a][4 * hf + 3] = fmaf(sa, kv.w, dq[a][4 * hf + 3]);
        }
      }
    }
  }

#pragma unroll
  for (int a = 0; a < 4; ++a) {
    const int i = i0 + ty + 16 * a;
    if (i >= p.S) continue;
    T* dq_row = p.dqkv + (static_cast<int64_t>(b) * p.S + i) * ld + static_cast<int64_t>(h) * p.Dh;
#pragma unroll
    for (int hf = 0; hf < kHalves; ++hf) {
      const int d = 64 * hf + 4 * tx;
      if (d >= p.Dh) continue;
      if (kIsF32<T> && p.vec4) {
        *reinterpret_cast<float4*>(dq_row + d) =
            make_float4(dq[a][4 * hf] * p.scale, dq[a][4 * hf + 1] * p.scale,
                        dq[a][4 * hf + 2] * p.scale, dq[a][4 * hf + 3] * p.scale);
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          if (d + e < p.Dh) dq_row[d + e] = T(dq[a][4 * hf + e] * p.scale);
        }
      }
    }
  }
}

// ---- Launchers ----------------------------------------------------------------------------------

template <class T>
AttnParamsT<T> make_params(const char* name, const AttentionShape& s) {
  REGEN_CHECK(s.B > 0 && s.S > 0 && s.H > 0 && s.Dh > 0, name, ": bad shape B=", s.B, " S=", s.S,
              " H=", s.H, " Dh=", s.Dh);
  REGEN_CHECK(s.Dh <= 128, name, ": head dim ", s.Dh, " is above the CUDA kernels' limit of 128");
  REGEN_CHECK(s.B * s.H <= 65535, name, ": B*H = ", s.B * s.H, " heads are more than 65535");
  REGEN_CHECK(s.S <= 0x7fffffffLL / 2 && s.B * s.S * 3 * s.H * s.Dh < (int64_t{1} << 62), name,
              ": sequence length ", s.S, " is too large");
  REGEN_CHECK(s.dropout_p >= 0.0f && s.dropout_p <= 1.0f, name, ": dropout probability ",
              s.dropout_p, " is not in [0, 1]");
  AttnParamsT<T> p{};
  p.B = static_cast<int>(s.B);
  p.S = static_cast<int>(s.S);
  p.H = static_cast<int>(s.H);
  p.Dh = static_cast<int>(s.Dh);
  p.D = static_cast<int>(s.H * s.Dh);
  p.scale = s.scale;
  p.causal = s.causal;
  // The CPU's rule (kernels/cpu/attention.cpp): keep iff word >= p * 2^32, scale 1 / (1 - p).
  p.threshold = s.dropout_p <= 0.0f ? 0
                : s.dropout_p >= 1.0f
                    ? (uint64_t{1} << 32)
                    : static_cast<uint64_t>(static_cast<double>(s.dropout_p) * 4294967296.0);
  p.dropout = p.threshold > 0;
  p.keep_scale = s.dropout_p < 1.0f ? 1.0f / (1.0f - s.dropout_p) : 0.0f;
  p.seed = s.seed;
  p.stream = s.stream;
  p.stream_offset = p.dropout ? cuda::rng_stream_offset() : nullptr;
  return p;
}

template <class Kernel, class P>
void launch(const char* name, Kernel kernel, dim3 grid, size_t smem, const P& p) {
  detail::allow_shared_memory(reinterpret_cast<const void*>(kernel), smem);
  kernel<<<grid, kThreads, smem, stream()>>>(p);
  REGEN_CUDA_LAUNCH_CHECK(name);
}

// qkv: (B, S, 3*H*Dh), key_pad: (B, S) or null -> out: (B, S, H*Dh), lse: (B, H, S). One body
// for float and the 16-bit T.
template <class T>
void forward(const T* qkv, const int32_t* key_pad, T* out, float* lse, const AttentionShape& s) {
  const char* name = "attention_forward";
  AttnParamsT<T> p = make_params<T>(name, s);
  p.qkv = qkv;
  p.key_pad = key_pad;
  p.out = out;
  p.lse = lse;
  p.vec4 = kIsF32<T> && s.Dh % 4 == 0 && detail::aligned16(qkv) && detail::aligned16(out);
  const dim3 grid(static_cast<unsigned>((s.S + kTile - 1) / kTile),
                  static_cast<unsigned>(s.B * s.H));
  if (s.Dh <= 64) {
    launch(name, attention_forward_kernel<64, T>, grid, Smem<64>::bytes(Smem<64>::forward_floats),
           p);
  } else {
    launch(name, attention_forward_kernel<128, T>, grid,
           Smem<128>::bytes(Smem<128>::forward_floats), p);
  }
}

// dout: (B, S, H*Dh) -> dqkv: (B, S, 3*H*Dh), written
template <class T>
void backward(const T* dout, const T* qkv, const T* out, const float* lse, const int32_t* key_pad,
              T* dqkv, const AttentionShape& s) {
  const char* name = "attention_backward";
  AttnParamsT<T> p = make_params<T>(name, s);
  p.qkv = qkv;
  p.key_pad = key_pad;
  p.dout = dout;
  p.o = out;
  p.lse_in = lse;
  p.dqkv = dqkv;
  p.vec4 = kIsF32<T> && s.Dh % 4 == 0 && detail::aligned16(qkv) && detail::aligned16(dout) &&
           detail::aligned16(dqkv);
  const int64_t rows = s.B * s.H * s.S;
  Workspace ws(detail::device(), static_cast<uint64_t>(rows) * sizeof(float));
  if (dry_run_active()) return;  // the dry path (kernels.h): the row terms, requested and unused
  p.dvec = ws.as<float>();
  attention_dvec_kernel<T><<<static_cast<unsigned>(detail::ceil_div(rows, 8)), 256, 0, stream()>>>(
      dout, out, ws.as<float>(), rows, p.S, p.H, p.Dh);
  REGEN_CUDA_LAUNCH_CHECK(name);
  const dim3 grid(static_cast<unsigned>((s.S + kTile - 1) / kTile),
                  static_cast<unsigned>(s.B * s.H));
  if (s.Dh <= 64) {
    launch(name, attention_dkdv_kernel<64, T>, grid, Smem<64>::bytes(Smem<64>::dkdv_floats), p);
    launch(name, attention_dq_kernel<64, T>, grid, Smem<64>::bytes(Smem<64>::dq_floats), p);
  } else {
    launch(name, attention_dkdv_kernel<128, T>, grid, Smem<128>::bytes(Smem<128>::dkdv_floats), p);
    launch(name, attention_dq_kernel<128, T>, grid, Smem<128>::bytes(Smem<128>::dq_floats), p);
  }
}

}  // namespace

void attention_forward(const float* qkv, const int32_t* key_pad, float* out, float* lse,
                       const AttentionShape& s) {
  forward(qkv, key_pad, out, lse, s);
}
void attention_backward(const float* dout, const float* qkv, const float* out, const float* lse,
                        const int32_t* key_pad, float* dqkv, const AttentionShape& s) {
  backward(dout, qkv, out, lse, key_pad, dqkv, s);
}
// The 16-bit forms take the tensor-core flash kernels (kernels/cuda/attention_tc.h: head dim 64 or
// 128, no dropout, 16-byte aligned tensors, compute capability 8.0 or later) wherever those take
// the call, else the kernels above. Both are deterministic, so a replay under a plan gives the
// first pass's bits; they differ from each other within the 16-bit rounding of P (docs/kernels.md,
// "Tensor-core attention"). The backward of either requests the same workspace (B*H*S floats), so
// the dry path's requests do not depend on which runs.
template <class T>
void attention_forward(const T* qkv, const int32_t* key_pad, T* out, float* lse,
                       const AttentionShape& s) {
  const void* ptrs[] = {qkv, out};
  if (tc::attention_tc_unsupported(s, ptrs, 2) == nullptr) {
    tc::attention_forward_tc(qkv, key_pad, out, lse, s);
    return;
  }
  forward(qkv, key_pad, out, lse, s);
}
template <class T>
void attention_backward(const T* dout, const T* qkv, const T* out, const float* lse,
                        const int32_t* key_pad, T* dqkv, const AttentionShape& s) {
  const void* ptrs[] = {dout, qkv, out, dqkv};
  if (tc::attention_tc_unsupported(s, ptrs, 4) == nullptr) {
    tc::attention_backward_tc(dout, qkv, out, lse, key_pad, dqkv, s);
    return;
  }
  backward(dout, qkv, out, lse, key_pad, dqkv, s);
}
#define REGEN_ATTENTION_HALF(T)                                                                    \
  template void attention_forward<T>(const T*, const int32_t*, T*, float*, const AttentionShape&); \
  template void attention_backward<T>(const T*, const T*, const T*, const float*, const int32_t*,  \
                                      T*, const AttentionShape&);
REGEN_ATTENTION_HALF(bfloat16)
REGEN_ATTENTION_HALF(float16)
#undef REGEN_ATTENTION_HALF

}  // namespace regen::cuda
