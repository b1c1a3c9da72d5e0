// Tensor-core flash attention (declared in kernels/cuda/attention_tc.h; primitives in
// kernels/cuda/mma.cuh; CPU reference kernels/cpu/attention.cpp; test
// tests/cuda/test_cuda_attention_tc.cpp, on a GPU and in the host emulation). FlashAttention-2's
// schedule on mma.sync m16n8k16, bf16 or f16 operands, f32 accumulators and softmax statistics.
//
// Blocks of 4 warps; a block owns a tile of 64 rows (queries in the forward and the dQ pass, keys
// in the dK/dV pass) and each warp 16 of them, so a warp's rows never meet another warp's and the
// softmax statistics of a row live in the 4 lanes that hold it (lanes 4g..4g+3 hold rows g and
// g + 8 of the warp's 16, in the m16n8 accumulator layout of mma.cuh). The other operand streams
// through shared memory in tiles of 64 rows, two stages deep: the cp.async copies of tile n+1 are
// issued before the warps compute on tile n. Tiles are [row][head dim] in 16-byte chunks,
// XOR-swizzled by row (chunk ^ (row % 8)), so the 8 row addresses of each ldmatrix matrix, and
// the .trans loads of 8 consecutive rows, hit 8 different bank groups. Rows past the sequence are
// zero-filled by cp.async (src-size 0) and masked as scores; no thread returns early.
//
// Forward (grid: query tiles x B*H): S = Q K^T (A from the Q tile, B from the K tile without
//   .trans: K is [key][d], the k-contiguous "col" operand), masks (past the end, key padding,
//   causal: key j > query i) as -inf, online softmax in base 2 (scores times scale*log2(e); row max
//   m and per-lane partial sums l, O rescaled by 2^(m_old - m_new)), then O += P V with P
//   converted to 16 bits in registers: the S accumulator of two adjacent 8-key groups is exactly
//   the A fragment of one k16 step, so P never goes through shared memory; V ([key][d], the
//   n-contiguous operand) is loaded with ldmatrix .trans. At the end l is summed over the 4 lanes
//   (a fixed butterfly), O / l is rounded once to T and lse = m ln 2 + log l (f32; -inf and O = 0
//   for a row with no visible key). Causal blocks stop at the tile holding their last query.
//
// Backward, three kernels, no atomics, every sum in a fixed order (so two runs agree bit for bit):
//   1. D_i = <dO_i, O_i> (f32, one warp per row) into a Workspace of B*H*S floats;
//   2. dK, dV (grid: key tiles x B*H): the key tile's K and V stay in shared memory while the
//      query tiles stream (Q, dO, and lse, D of the rows): S^T = K Q^T, dP^T = V dO^T,
//      P^T = exp(scale S^T - lse) (0 where masked), dS^T = P^T (dP^T - D), then dV += P^T dO and
//      dK += dS^T Q with P^T and dS^T converted to 16 bits in registers (A operands) and dO, Q
//      loaded with .trans. dK is scaled by `scale` once at the end. Causal: query tiles from the
//      key tile's own (queries before it see none of its keys);
//   3. dQ (grid: query tiles x B*H): the FlashAttention-2 forward's loop again, recomputing S and
//      P and dP = dO V^T per key tile, dQ += dS K (K with .trans), scaled once at the end. Each dQ
//      row is owned by one warp: no float atomics and no (key tiles x S x Dh) partial buffer, at
//      the price of recomputing S and dP (7 products per tile pair instead of 5).
// The same pair (query tile, key tile) therefore computes P in passes 2 and 3 with the same mma
// sequence, from the same lse: the P of dV and the P of dQ are the same bits.
//
// What the kernels take (attention_tc_unsupported): head dims 64 and 128 (a template argument:
// every fragment loop unrolls), no dropout (the op's Philox mask lives in
// kernels/cuda/attention.cu; those calls stay there), 16-byte aligned tensors. Indices within a
// (batch, head) are 32-bit; the batch and head offsets are 64-bit.
#include <cmath>
#include <type_traits>
#include <utility>

#include "regen/core/tensor.h"
#include "regen/kernels/cuda/attention_tc.h"
#include "regen/kernels/cuda/common.cuh"
#include "regen/kernels/cuda/cuda_kernels.h"
#include "regen/kernels/cuda/mma.cuh"
#include "regen/kernels/kernels.h"

namespace regen::cuda::tc {
namespace {

constexpr int kRows = 64;      // rows of a block's own tile and of each streamed tile
constexpr int kThreads = 128;  // 4 warps of 16 rows
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

template <int kD>
constexpr int kTileBytes = kRows* kD * 2;  // one [64][kD] tile of 16-bit elements

template <int kD>
struct Smem {
  // forward: Q, then two stages of (K, V). dQ: Q, dO, two stages of (K, V). dK/dV: K, V, two
  // stages of (Q, dO), then the streamed rows' lse (times log2 e) and D, two stages of 64 each.
  static constexpr size_t forward = 5 * kTileBytes<kD>;
  static constexpr size_t dq = 6 * kTileBytes<kD>;
  static constexpr size_t dkdv = 6 * kTileBytes<kD> + 2 * 2 * kRows * sizeof(float);
};

struct FlashParams {
  const void* qkv;         // (B, S, 3, H, Dh)
  const int32_t* key_pad;  // (B, S) or null
  void* out;               // forward: (B, S, H*Dh)
  float* lse;              // forward: (B, H, S)
  const void* dout;        // backward: (B, S, H*Dh)
  const float* lse_in;     // backward: (B, H, S)
  const float* dvec;       // backward: (B, H, S), D_i
  void* dqkv;              // backward: (B, S, 3, H, Dh)
  int S, H, D;             // D = H*Dh, the row stride of out and dout
  int ld;                  // 3*D, the row stride of qkv and dqkv
  float scale;             // on q.k
  float scale_log2;        // scale * log2(e)
  bool causal;
};

// Byte offset of 16-byte chunk `chunk` of row `row` in a [64][kD] tile.
template <int kD>
__device__ __forceinline__ int swz(int row, int chunk) {
  return row * (kD * 2) + ((chunk ^ (row & 7)) << 4);
}

// Two f32 -> one register of two 16-bit T, round to nearest even (lo in the low half).
template <class T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 && !defined(REGEN_CUDA_EMU_MMA)
  uint32_t r;
  if constexpr (std::is_same<T, bfloat16>::value) {
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  } else {
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  }
  return r;
#else
  return static_cast<uint32_t>(T(lo).bits) | (static_cast<uint32_t>(T(hi).bits) << 16);
#endif
}

template <class T>
__device__ __forceinline__ void mma16816(float d[4], const uint32_t a[4], uint32_t b0,
                                         uint32_t b1) {
  const uint32_t b[2] = {b0, b1};
  if constexpr (std::is_same<T, bfloat16>::value) {
    mma_bf16_16816(d, a, b, d);
  } else {
    mma_f16_16816(d, a, b, d);
  }
}

// Rows [row0, row0 + 64) of a (rows, ld) matrix of T, columns [0, kD), into a swizzled tile, by
// cp.async (the caller commits); rows past `rows` are zeros.
template <int kD, class T>
__device__ __forceinline__ void load_tile_async(unsigned char* dst, const T* src, int ld, int row0,
                                                int rows) {
  constexpr int kChunks = kD / 8;
#pragma unroll
  for (int idx = threadIdx.x; idx < kRows * kChunks; idx += kThreads) {
    const int r = idx / kChunks, c = idx - r * kChunks;
    const bool ok = row0 + r < rows;
    const T* s = ok ? src + static_cast<int64_t>(row0 + r) * ld + c * 8 : src;
    cp_async_cg16(dst + swz<kD>(r, c), s, ok);
  }
}

// acc (16 x 64) += A B^T over kD: A = rows [a_row0, a_row0 + 16) of tile tA ([row][k]), B^T =
// the 64 rows of tile tB ([n][k], so B is the k-contiguous operand: ldmatrix without .trans).
// acc[n][e] is row a_row0 + g + 8 (e / 2), column 8n + 2t + e % 2.
template <int kD, class T>
__device__ __forceinline__ void mma_rows_by_tile(float acc[8][4], const unsigned char* tA,
                                                 int a_row0, const unsigned char* tB) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int ks = 0; ks < kD / 16; ++ks) {
    uint32_t a[4];
    // matrices: (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15)
    ldmatrix_x4(a, tA + swz<kD>(a_row0 + (lane & 7) + ((lane >> 3) & 1) * 8, 2 * ks + (lane >> 4)));
#pragma unroll
    for (int np = 0; np < 4; ++np) {
      uint32_t b[4];
      // matrices: (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15)
      ldmatrix_x4(b,
                  tB + swz<kD>(16 * np + (lane & 7) + (lane >> 4) * 8, 2 * ks + ((lane >> 3) & 1)));
      mma16816<T>(acc[2 * np], a, b[0], b[1]);
      mma16816<T>(acc[2 * np + 1], a, b[2], b[3]);
    }
  }
}

// acc (16 x kD) += P B over the 64 rows of tile tB ([k][n]: the n-contiguous operand, ldmatrix
// .trans), P (16 x 64) given as an f32 accumulator of mma_rows_by_tile and rounded to T here:
// the accumulators of 8-column groups 2j and 2j+1 are the A fragment of k16 step j.
template <int kD, class T>
__device__ __forceinline__ void mma_acc_by_tile(float acc[kD / 8][4], const float p[8][4],
                                                const unsigned char* tB) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const uint32_t a[4] = {pack2<T>(p[2 * j][0], p[2 * j][1]), pack2<T>(p[2 * j][2], p[2 * j][3]),
                           pack2<T>(p[2 * j + 1][0], p[2 * j + 1][1]),
                           pack2<T>(p[2 * j + 1][2], p[2 * j + 1][3])};
#pragma unroll
    for (int dp = 0; dp < kD / 16; ++dp) {
      uint32_t b[4];
      // matrices: (k 0-7, n 0-7), (k 8-15, n 0-7), (k 0-7, n 8-15), (k 8-15, n 8-15)
      ldmatrix_x4_trans(
          b, tB + swz<kD>(16 * j + (lane & 7) + ((lane >> 3) & 1) * 8, 2 * dp + (lane >> 4)));
      mma16816<T>(acc[2 * dp], a, b[0], b[1]);
      mma16816<T>(acc[2 * dp + 1], a, b[2], b[3]);
    }
  }
}

// Whether key j is visible to query i (both in range checked by the caller or here).
__device__ __forceinline__ bool key_visible(const FlashParams& p, const int32_t* pad, int i,
                                            int j) {
  return j < p.S && !(pad && pad[j] != 0) && !(p.causal && j > i);
}

// The row's output (16-bit pairs) at column 8n + 2t of the row starting at `row`.
template <int kD, class T>
__device__ __forceinline__ void store_row(T* row, const float acc[kD / 8][4], int r, float mul) {
  const int t = threadIdx.x & 3;
#pragma unroll
  for (int n = 0; n < kD / 8; ++n) {
    *reinterpret_cast<uint32_t*>(row + 8 * n + 2 * t) =
        pack2<T>(acc[n][2 * r] * mul, acc[n][2 * r + 1] * mul);
  }
}

// ---- Forward ------------------------------------------------------------------------------------

template <int kD, class T>
__global__ void __launch_bounds__(kThreads) flash_forward_kernel(const FlashParams p) {
  extern __shared__ __align__(16) float smem[];
  unsigned char* const sQ = reinterpret_cast<unsigned char*>(smem);
  unsigned char* const sKV = sQ + kTileBytes<kD>;  // stage st: K at 2 st tiles, V after it
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int bh = blockIdx.y, b = bh / p.H, h = bh - b * p.H;
  const int i0 = blockIdx.x * kRows;
  const T* q_base = static_cast<const T*>(p.qkv) + static_cast<int64_t>(b) * p.S * p.ld +
                    static_cast<int64_t>(h) * kD;
  const T* k_base = q_base + p.D;
  const T* v_base = q_base + 2 * p.D;
  const int32_t* pad = p.key_pad ? p.key_pad + static_cast<int64_t>(b) * p.S : nullptr;
  const int n_tiles = (p.S + kRows - 1) / kRows;
  const int tiles = p.causal ? min(n_tiles, min(i0 + kRows - 1, p.S - 1) / kRows + 1) : n_tiles;

  load_tile_async<kD>(sQ, q_base, p.ld, i0, p.S);
  load_tile_async<kD>(sKV, k_base, p.ld, 0, p.S);
  load_tile_async<kD>(sKV + kTileBytes<kD>, v_base, p.ld, 0, p.S);
  cp_async_commit();

  float o[kD / 8][4];
#pragma unroll
  for (int n = 0; n < kD / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[n][e] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // m in base-2 units; l per lane
  const int row[2] = {i0 + warp * 16 + g, i0 + warp * 16 + g + 8};

  for (int kt = 0; kt < tiles; ++kt) {
    cp_async_wait<0>();  // tile kt has landed (this thread's copies) ...
    __syncthreads();     // ... for every thread's; and every warp is done with tile kt-1's stage
    if (kt + 1 < tiles) {
      unsigned char* const next = sKV + ((kt + 1) & 1) * 2 * kTileBytes<kD>;
      load_tile_async<kD>(next, k_base, p.ld, (kt + 1) * kRows, p.S);
      load_tile_async<kD>(next + kTileBytes<kD>, v_base, p.ld, (kt + 1) * kRows, p.S);
    }
    cp_async_commit();
    const unsigned char* const sK = sKV + (kt & 1) * 2 * kTileBytes<kD>;
    const unsigned char* const sV = sK + kTileBytes<kD>;

    float s[8][4];
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] = 0.0f;
    mma_rows_by_tile<kD, T>(s, sQ, warp * 16, sK);

    const int j0 = kt * kRows;
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1, j = j0 + 8 * n + 2 * t + (e & 1);
        s[n][e] = key_visible(p, pad, row[r], j) ? s[n][e] * p.scale_log2 : -INFINITY;
        mx[r] = fmaxf(mx[r], s[n][e]);
      }
    float m_use[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float m_new = fmaxf(m[r], dev::group_max<4>(mx[r]));
      m_use[r] = m_new == -INFINITY ? 0.0f : m_new;  // nothing visible yet: every term is 0
      const float alpha = exp2f(m[r] - m_use[r]);
      m[r] = m_new;
      l[r] *= alpha;
#pragma unroll
      for (int n = 0; n < kD / 8; ++n) {
        o[n][2 * r] *= alpha;
        o[n][2 * r + 1] *= alpha;
      }
    }
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[n][e] = exp2f(s[n][e] - m_use[e >> 1]);
        l[e >> 1] += s[n][e];
      }
    mma_acc_by_tile<kD, T>(o, s, sV);
  }
  cp_async_wait<0>();  // only an empty group remains; nothing is in flight at exit

  T* const out = static_cast<T*>(p.out);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float sum = dev::group_sum<4>(l[r]);
    if (row[r] >= p.S) continue;
    T* const orow = out + (static_cast<int64_t>(b) * p.S + row[r]) * p.D + h * kD;
    store_row<kD, T>(orow, o, r, sum > 0.0f ? 1.0f / sum : 0.0f);
    if (t == 0) {
      p.lse[static_cast<int64_t>(bh) * p.S + row[r]] =
          sum > 0.0f ? m[r] * kLn2 + logf(sum) : -INFINITY;
    }
  }
}

// ---- Backward -----------------------------------------------------------------------------------

// dvec[(b*H + h)*S + i] = <dout, out> over the head's kD columns, in f32; one warp per (b, i, h).
template <int kD, class T>
__global__ void flash_row_dot_kernel(const T* dout, const T* out, float* dvec, int64_t rows, int S,
                                     int H) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + (threadIdx.x >> 5);
  if (row >= rows) return;        // whole warps: rows are per warp
  const T* gr = dout + row * kD;  // rows (b, i, h) are contiguous runs of kD in (B, S, H*kD)
  const T* yr = out + row * kD;
  float acc = 0.0f;
#pragma unroll
  for (int d = lane; d < kD; d += 32) acc += static_cast<float>(gr[d]) * static_cast<float>(yr[d]);
  acc = dev::warp_sum(acc);
  if (lane == 0) {
    const int64_t bi = row / H;
    const int h = static_cast<int>(row - bi * H);
    const int64_t b = bi / S;
    const int i = static_cast<int>(bi - b * S);
    dvec[(b * H + h) * S + i] = acc;
  }
}

// dK, dV of key tile blockIdx.x of head blockIdx.y.
template <int kD, class T>
__global__ void __launch_bounds__(kThreads) flash_dkdv_kernel(const FlashParams p) {
  extern __shared__ __align__(16) float smem[];
  unsigned char* const sK = reinterpret_cast<unsigned char*>(smem);
  unsigned char* const sV = sK + kTileBytes<kD>;
  unsigned char* const sQdO = sV + kTileBytes<kD>;  // stage st: Q at 2 st tiles, dO after it
  float* const s_lse = reinterpret_cast<float*>(sQdO + 4 * kTileBytes<kD>);  // [2][64], log2 units
  float* const s_d = s_lse + 2 * kRows;                                      // [2][64]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int bh = blockIdx.y, b = bh / p.H, h = bh - b * p.H;
  const int j0 = blockIdx.x * kRows;
  const T* q_base = static_cast<const T*>(p.qkv) + static_cast<int64_t>(b) * p.S * p.ld +
                    static_cast<int64_t>(h) * kD;
  const T* do_base = static_cast<const T*>(p.dout) + static_cast<int64_t>(b) * p.S * p.D +
                     static_cast<int64_t>(h) * kD;
  const int32_t* pad = p.key_pad ? p.key_pad + static_cast<int64_t>(b) * p.S : nullptr;
  const int n_tiles = (p.S + kRows - 1) / kRows;
  const int first = p.causal ? blockIdx.x : 0;  // queries before the key tile see none of its keys

  auto load_query_tile = [&](int stage, int qt) {
    unsigned char* const dst = sQdO + stage * 2 * kTileBytes<kD>;
    load_tile_async<kD>(dst, q_base, p.ld, qt * kRows, p.S);
    load_tile_async<kD>(dst + kTileBytes<kD>, do_base, p.D, qt * kRows, p.S);
    if (threadIdx.x < kRows) {  // plain loads: the rows' statistics are not 16-byte aligned
      const int i = qt * kRows + threadIdx.x;
      const int64_t at = static_cast<int64_t>(bh) * p.S + i;
      s_lse[stage * kRows + threadIdx.x] = i < p.S ? p.lse_in[at] * kLog2e : -INFINITY;
      s_d[stage * kRows + threadIdx.x] = i < p.S ? p.dvec[at] : 0.0f;
    }
  };
  load_tile_async<kD>(sK, q_base + p.D, p.ld, j0, p.S);
  load_tile_async<kD>(sV, q_base + 2 * p.D, p.ld, j0, p.S);
  load_query_tile(0, first);
  cp_async_commit();

  float dk[kD / 8][4], dv[kD / 8][4];
#pragma unroll
  for (int n = 0; n < kD / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[n][e] = dv[n][e] = 0.0f;
  const int key[2] = {j0 + warp * 16 + g, j0 + warp * 16 + g + 8};
  const bool key_ok[2] = {key[0] < p.S && !(pad && pad[key[0]] != 0),
                          key[1] < p.S && !(pad && pad[key[1]] != 0)};

  for (int qt = first; qt < n_tiles; ++qt) {
    const int stage = (qt - first) & 1;
    cp_async_wait<0>();
    __syncthreads();
    if (qt + 1 < n_tiles) load_query_tile(stage ^ 1, qt + 1);
    cp_async_commit();
    const unsigned char* const sQ = sQdO + stage * 2 * kTileBytes<kD>;
    const unsigned char* const sdO = sQ + kTileBytes<kD>;
    const float* const lse2 = s_lse + stage * kRows;
    const float* const dd = s_d + stage * kRows;

    float st[8][4], dpt[8][4];  // rows: the warp's keys; columns: the tile's queries
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) st[n][e] = dpt[n][e] = 0.0f;
    mma_rows_by_tile<kD, T>(st, sK, warp * 16, sQ);
    mma_rows_by_tile<kD, T>(dpt, sV, warp * 16, sdO);
    const int i0 = qt * kRows;
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1, il = 8 * n + 2 * t + (e & 1);
        // lse2 is -inf for queries past the end and for rows with no visible key
        const bool visible = key_ok[r] && !(p.causal && key[r] > i0 + il) && lse2[il] != -INFINITY;
        const float prob = visible ? exp2f(st[n][e] * p.scale_log2 - lse2[il]) : 0.0f;
        st[n][e] = prob;
        dpt[n][e] = prob * (dpt[n][e] - dd[il]);
      }
    mma_acc_by_tile<kD, T>(dv, st, sdO);
    mma_acc_by_tile<kD, T>(dk, dpt, sQ);
  }
  cp_async_wait<0>();

  T* const dqkv = static_cast<T*>(p.dqkv);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (key[r] >= p.S) continue;
    T* const dk_row = dqkv + (static_cast<int64_t>(b) * p.S + key[r]) * p.ld + p.D + h * kD;
    store_row<kD, T>(dk_row, dk, r, p.scale);
    store_row<kD, T>(dk_row + p.D, dv, r, 1.0f);
  }
}

// dQ of query tile blockIdx.x of head blockIdx.y.
template <int kD, class T>
__global__ void __launch_bounds__(kThreads) flash_dq_kernel(const FlashParams p) {
  extern __shared__ __align__(16) float smem[];
  unsigned char* const sQ = reinterpret_cast<unsigned char*>(smem);
  unsigned char* const sdO = sQ + kTileBytes<kD>;
  unsigned char* const sKV = sdO + kTileBytes<kD>;  // stage st: K at 2 st tiles, V after it
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int bh = blockIdx.y, b = bh / p.H, h = bh - b * p.H;
  const int i0 = blockIdx.x * kRows;
  const T* q_base = static_cast<const T*>(p.qkv) + static_cast<int64_t>(b) * p.S * p.ld +
                    static_cast<int64_t>(h) * kD;
  const T* k_base = q_base + p.D;
  const T* v_base = q_base + 2 * p.D;
  const T* do_base = static_cast<const T*>(p.dout) + static_cast<int64_t>(b) * p.S * p.D +
                     static_cast<int64_t>(h) * kD;
  const int32_t* pad = p.key_pad ? p.key_pad + static_cast<int64_t>(b) * p.S : nullptr;
  const int n_tiles = (p.S + kRows - 1) / kRows;
  const int tiles = p.causal ? min(n_tiles, min(i0 + kRows - 1, p.S - 1) / kRows + 1) : n_tiles;

  load_tile_async<kD>(sQ, q_base, p.ld, i0, p.S);
  load_tile_async<kD>(sdO, do_base, p.D, i0, p.S);
  load_tile_async<kD>(sKV, k_base, p.ld, 0, p.S);
  load_tile_async<kD>(sKV + kTileBytes<kD>, v_base, p.ld, 0, p.S);
  cp_async_commit();

  const int row[2] = {i0 + warp * 16 + g, i0 + warp * 16 + g + 8};
  float lse2[2], dd[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t at = static_cast<int64_t>(bh) * p.S + row[r];
    lse2[r] = row[r] < p.S ? p.lse_in[at] * kLog2e : -INFINITY;
    dd[r] = row[r] < p.S ? p.dvec[at] : 0.0f;
  }
  float dq[kD / 8][4];
#pragma unroll
  for (int n = 0; n < kD / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) dq[n][e] = 0.0f;

  for (int kt = 0; kt < tiles; ++kt) {
    cp_async_wait<0>();
    __syncthreads();
    if (kt + 1 < tiles) {
      unsigned char* const next = sKV + ((kt + 1) & 1) * 2 * kTileBytes<kD>;
      load_tile_async<kD>(next, k_base, p.ld, (kt + 1) * kRows, p.S);
      load_tile_async<kD>(next + kTileBytes<kD>, v_base, p.ld, (kt + 1) * kRows, p.S);
    }
    cp_async_commit();
    const unsigned char* const sK = sKV + (kt & 1) * 2 * kTileBytes<kD>;
    const unsigned char* const sV = sK + kTileBytes<kD>;

    float s[8][4], dp[8][4];
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] = dp[n][e] = 0.0f;
    mma_rows_by_tile<kD, T>(s, sQ, warp * 16, sK);
    mma_rows_by_tile<kD, T>(dp, sdO, warp * 16, sV);
    const int j0 = kt * kRows;
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1, j = j0 + 8 * n + 2 * t + (e & 1);
        const bool visible = key_visible(p, pad, row[r], j) && lse2[r] != -INFINITY;
        const float prob = visible ? exp2f(s[n][e] * p.scale_log2 - lse2[r]) : 0.0f;
        s[n][e] = prob * (dp[n][e] - dd[r]);  // dS, without the scale
      }
    mma_acc_by_tile<kD, T>(dq, s, sK);
  }
  cp_async_wait<0>();

  T* const dqkv = static_cast<T*>(p.dqkv);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (row[r] >= p.S) continue;
    store_row<kD, T>(dqkv + (static_cast<int64_t>(b) * p.S + row[r]) * p.ld + h * kD, dq, r,
                     p.scale);
  }
}

// ---- Launchers ----------------------------------------------------------------------------------

// Whether the current device has the bf16/f16 mma of sm_80 (asked once per device).
bool tensor_cores_present() {
#ifndef REGEN_CUDA_EMU_MMA
  return has_tensor_cores(current_device());
#else
  return true;
#endif
}

template <class Kernel>
void launch(const char* name, Kernel kernel, dim3 grid, size_t smem, const FlashParams& p) {
  detail::allow_shared_memory(reinterpret_cast<const void*>(kernel), smem);
  kernel<<<grid, kThreads, smem, stream()>>>(p);
  REGEN_CUDA_LAUNCH_CHECK(name);
}

template <class T>
const char* dtype_label() {
  return std::is_same<T, bfloat16>::value ? "bf16" : "f16";
}

template <class T>
FlashParams make_params(const char* name, const AttentionShape& s, const void* const* ptrs,
                        int n_ptrs) {
  const char* why = attention_tc_unsupported(s, ptrs, n_ptrs);
  REGEN_CHECK(why == nullptr, name, " (", dtype_label<T>(), "): ", why ? why : "", " (B=", s.B,
              " S=", s.S, " H=", s.H, " Dh=", s.Dh, " dropout_p=", s.dropout_p,
              "); the kernels of kernels/cuda/attention.cu take this call");
  FlashParams p{};
  p.S = static_cast<int>(s.S);
  p.H = static_cast<int>(s.H);
  p.D = static_cast<int>(s.H * s.Dh);
  p.ld = 3 * p.D;
  p.scale = s.scale;
  p.scale_log2 = s.scale * kLog2e;
  p.causal = s.causal;
  return p;
}

}  // namespace

const char* attention_tc_unsupported(const AttentionShape& s, const void* const* ptrs, int n_ptrs) {
  if (s.B <= 0 || s.S <= 0 || s.H <= 0 || s.Dh <= 0) return "sizes must be positive";
  if (s.Dh != 64 && s.Dh != 128) return "head dim is not 64 or 128";
  if (s.dropout_p != 0.0f) return "dropout is not supported";
  if (s.B * s.H > 65535) return "B*H is above 65535";
  if (s.B * s.S * 3 * s.H * s.Dh >= (int64_t{1} << 31)) return "qkv has 2^31 elements or more";
  for (int i = 0; i < n_ptrs; ++i) {
    if (ptrs[i] && !detail::aligned16(ptrs[i])) return "a tensor is not 16-byte aligned";
  }
  if (!tensor_cores_present()) return "the device is older than compute capability 8.0";
  return nullptr;
}

template <class T>
void attention_forward_tc(const T* qkv, const int32_t* key_pad, T* out, float* lse,
                          const AttentionShape& s) {
  const char* name = "attention_forward_tc";
  const void* ptrs[] = {qkv, out};
  FlashParams p = make_params<T>(name, s, ptrs, 2);
  p.qkv = qkv;
  p.key_pad = key_pad;
  p.out = out;
  p.lse = lse;
  const dim3 grid(static_cast<unsigned>(detail::ceil_div(s.S, kRows)),
                  static_cast<unsigned>(s.B * s.H));
  if (s.Dh == 64) {
    launch(name, flash_forward_kernel<64, T>, grid, Smem<64>::forward, p);
  } else {
    launch(name, flash_forward_kernel<128, T>, grid, Smem<128>::forward, p);
  }
}

template <class T>
void attention_backward_tc(const T* dout, const T* qkv, const T* out, const float* lse,
                           const int32_t* key_pad, T* dqkv, const AttentionShape& s) {
  const char* name = "attention_backward_tc";
  const void* ptrs[] = {dout, qkv, out, dqkv};
  FlashParams p = make_params<T>(name, s, ptrs, 4);
  const int64_t rows = s.B * s.H * s.S;
  Workspace ws(detail::device(), static_cast<uint64_t>(rows) * sizeof(float));
  if (dry_run_active()) return;  // the dry path (kernels.h): the row terms, requested and unused
  p.qkv = qkv;
  p.key_pad = key_pad;
  p.dout = dout;
  p.lse_in = lse;
  p.dvec = ws.as<float>();
  p.dqkv = dqkv;
  const unsigned dot_blocks = static_cast<unsigned>(detail::ceil_div(rows, 8));
  const dim3 grid(static_cast<unsigned>(detail::ceil_div(s.S, kRows)),
                  static_cast<unsigned>(s.B * s.H));
  if (s.Dh == 64) {
    flash_row_dot_kernel<64, T>
        <<<dot_blocks, 256, 0, stream()>>>(dout, out, ws.as<float>(), rows, p.S, p.H);
    REGEN_CUDA_LAUNCH_CHECK(name);
    launch(name, flash_dkdv_kernel<64, T>, grid, Smem<64>::dkdv, p);
    launch(name, flash_dq_kernel<64, T>, grid, Smem<64>::dq, p);
  } else {
    flash_row_dot_kernel<128, T>
        <<<dot_blocks, 256, 0, stream()>>>(dout, out, ws.as<float>(), rows, p.S, p.H);
    REGEN_CUDA_LAUNCH_CHECK(name);
    launch(name, flash_dkdv_kernel<128, T>, grid, Smem<128>::dkdv, p);
    launch(name, flash_dq_kernel<128, T>, grid, Smem<128>::dq, p);
  }
}

#define REGEN_ATTENTION_TC(T)                                                        \
  template void attention_forward_tc<T>(const T*, const int32_t*, T*, float*,        \
                                        const AttentionShape&);                      \
  template void attention_backward_tc<T>(const T*, const T*, const T*, const float*, \
                                         const int32_t*, T*, const AttentionShape&);
REGEN_ATTENTION_TC(bfloat16)
REGEN_ATTENTION_TC(float16)
#undef REGEN_ATTENTION_TC

}  // namespace regen::cuda::tc
