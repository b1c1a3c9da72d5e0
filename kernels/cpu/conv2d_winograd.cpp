// Winograd F(2x2, 3x3) for f32 3x3 stride-1 convolutions (declared in conv2d_winograd.h).
//
// Each 2x2 block of outputs ("tile") of an output plane is computed from the 4x4 input patch
// under it: with d the patch and g a 3x3 filter,
//   y = A^T [ (G g G^T) .* (B^T d B) ] A,
//   B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1],  G = [1 0 0; .5 .5 .5; .5 -.5 .5; 0 0 1],
//   A^T = [1 1 1 0; 0 1 -1 -1].
// Summed over input channels, the 16 element-wise products become 16 matrix products:
//   M[xi] (K, tiles) = U[xi] (K, C) * V[xi] (C, tiles),  U = G g G^T,  V = B^T d B,
// 16 multiply-adds per tile and channel pair where the direct convolution does 36 (2.25x fewer).
//
// Fused, so that nothing of size (16, C, tiles) goes through memory: the filters are
// transformed once per call into the packed GEMM's A panels (16 x K x C floats, shared). Then,
// for a block of kBlock = 48 tiles (one register tile's width), a thread transforms the block's
// input patches for every channel straight into B panels (16 x C x 48 floats, L2-sized), runs
// the 16 products for a chunk of output channels on the register tile (packed_gemm.h) into
// 16 x kRowChunk x 48 floats, and transforms those back into y (adding the bias). Threads take
// whole blocks when there are at least kBlocksPerThread per thread; otherwise every thread
// transforms every block and takes its share of the output channels (the input transform is
// then repeated per thread, which costs less than leaving a core idle on a short block list).
//
// Determinism: an output element is the same sequence of operations (its patch's transform,
// one fused multiply-add chain over the channels per depth block of the register tile, in
// order, the inverse transform, the bias) whichever thread and block computes it, so results do
// not depend on the thread count. They differ from the direct convolution's in rounding (the
// transforms add and scale before multiplying): measured in tests/test_ops_vision.cpp.
#include "regen/kernels/cpu/conv2d_winograd.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

#include "regen/core/dry_run.h"
#include "regen/core/error.h"
#include "regen/core/tensor.h"
#include "regen/kernels/cpu/packed_gemm.h"

namespace regen::cpu::winograd {
namespace {

constexpr int64_t kMinChannels = 16;  // fewer input or output channels: the direct path
// Fewer output tiles: the direct path. The filters' transform (16 K C floats written per call)
// is paid back only over enough tiles: ResNet-152's 7x7 layers at batch 4 (64 tiles) ran at 0.8x
// and 0.6x the direct path's speed (forward, backward-data), its 14x14 ones (196) at 1.3-1.6x.
constexpr int64_t kMinTiles = 128;
constexpr int64_t kBlock = packed::kNR<float>;  // tiles per block: one register tile's width
constexpr int kLanes = packed::kLanes<float>;
constexpr int64_t kMR = packed::kMR;
constexpr int64_t kKC = packed::kKC;
constexpr int64_t kRowChunk = 64;  // output channels per pass over a block's products
constexpr int64_t kBlocksPerThread = 4;

// -1: not read yet; otherwise an Algo. The scoped override replaces it.
std::atomic<int> g_algo{-1};

Algo read_env() {
  const char* v = std::getenv("REGEN_CPU_CONV");
  if (v == nullptr || *v == '\0' || std::string(v) == "direct") return Algo::direct;
  REGEN_CHECK(std::string(v) == "winograd", "REGEN_CPU_CONV='", v,
              "': expected direct (the default) or winograd (F(2x2, 3x3) for the 3x3 stride-1 "
              "f32 convolutions)");
  return Algo::winograd;
}

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// U = G g G^T for one 3x3 filter g (row-major), u[4 * i + j].
void filter_transform(const float* g, float* u) {
  float t[4][3];  // G g
  for (int c = 0; c < 3; ++c) {
    const float g0 = g[c], g1 = g[3 + c], g2 = g[6 + c];
    t[0][c] = g0;
    t[1][c] = 0.5f * (g0 + g1 + g2);
    t[2][c] = 0.5f * (g0 - g1 + g2);
    t[3][c] = g2;
  }
  for (int r = 0; r < 4; ++r) {
    const float a = t[r][0], b = t[r][1], c = t[r][2];
    u[4 * r + 0] = a;
    u[4 * r + 1] = 0.5f * (a + b + c);
    u[4 * r + 2] = 0.5f * (a - b + c);
    u[4 * r + 3] = c;
  }
}

// Where a block's tiles read and write: tile j of the block is output rows [2 th, 2 th + 2) and
// columns [2 tw, 2 tw + 2) of image n.
struct TileSites {
  int64_t count = 0;
  int64_t n[kBlock], th[kBlock], tw[kBlock];
};

TileSites block_tiles(int64_t first, int64_t count, int64_t tiles_h, int64_t tiles_w) {
  TileSites t;
  t.count = count;
  for (int64_t j = 0; j < count; ++j) {
    const int64_t g = first + j, plane = tiles_h * tiles_w;
    t.n[j] = g / plane;
    t.th[j] = g % plane / tiles_w;
    t.tw[j] = g % tiles_w;
  }
  return t;
}

// V[xi] = B^T d B for every channel of the block's patches, written as the register tile's B
// panels, `width` columns (the tiles rounded up to whole vectors) per depth step:
// v[xi * vstride + c * width + j]. Columns past the block's tiles are zero.
void input_transform(const float* x, const ConvShape& s, const TileSites& t, int64_t width,
                     float* v, int64_t vstride) {
  const int64_t hw = s.H * s.W, chw = s.C * hw;
  alignas(64) float d[4][4][kBlock];
  // Per tile: the patch's first row and column in the input, and whether all 16 are inside.
  int64_t h0[kBlock], w0[kBlock], base[kBlock];
  bool inside[kBlock];
  for (int64_t j = 0; j < t.count; ++j) {
    h0[j] = 2 * t.th[j] - s.pad_h;
    w0[j] = 2 * t.tw[j] - s.pad_w;
    base[j] = t.n[j] * chw + h0[j] * s.W + w0[j];
    inside[j] = h0[j] >= 0 && w0[j] >= 0 && h0[j] + 4 <= s.H && w0[j] + 4 <= s.W;
  }
  std::memset(d, 0, sizeof(d));
  for (int64_t c = 0; c < s.C; ++c) {
    const float* xc = x + c * hw;
    for (int64_t j = 0; j < t.count; ++j) {
      if (inside[j]) {
        const float* p = xc + base[j];
        for (int a = 0; a < 4; ++a)
          for (int b = 0; b < 4; ++b) d[a][b][j] = p[a * s.W + b];
        continue;
      }
      for (int a = 0; a < 4; ++a) {
        const int64_t h = h0[j] + a;
        for (int b = 0; b < 4; ++b) {
          const int64_t w = w0[j] + b;
          d[a][b][j] = h >= 0 && h < s.H && w >= 0 && w < s.W ? xc[base[j] + a * s.W + b] : 0.0f;
        }
      }
    }
    // Along the block's tiles, vectorized: t = B^T d, then V = t B.
    float* out = v + c * width;
    for (int b = 0; b < 4; ++b) {
      alignas(64) float r0[kBlock], r1[kBlock], r2[kBlock], r3[kBlock];
      for (int64_t j = 0; j < kBlock; ++j) {
        r0[j] = d[0][b][j] - d[2][b][j];
        r1[j] = d[1][b][j] + d[2][b][j];
        r2[j] = d[2][b][j] - d[1][b][j];
        r3[j] = d[1][b][j] - d[3][b][j];
      }
      for (int64_t j = 0; j < kBlock; ++j) {
        d[0][b][j] = r0[j];
        d[1][b][j] = r1[j];
        d[2][b][j] = r2[j];
        d[3][b][j] = r3[j];
      }
    }
    for (int a = 0; a < 4; ++a) {
      float* o0 = out + (4 * a + 0) * vstride;
      float* o1 = out + (4 * a + 1) * vstride;
      float* o2 = out + (4 * a + 2) * vstride;
      float* o3 = out + (4 * a + 3) * vstride;
      for (int64_t j = 0; j < width; ++j) {
        o0[j] = d[a][0][j] - d[a][2][j];
        o1[j] = d[a][1][j] + d[a][2][j];
        o2[j] = d[a][2][j] - d[a][1][j];
        o3[j] = d[a][1][j] - d[a][3][j];
      }
    }
    // The transform overwrote d in place: the in-block columns are rewritten for the next
    // channel, and the rest stay zero (the transform of zeros).
  }
}

// y's tiles from M[xi] for output channels [k0, k1): y = A^T M A (+ bias). The products wrote
// the first `width` columns of M (the block's tiles rounded up to whole vectors).
void output_transform(const float* m, int64_t mstride, int64_t width, const TileSites& t,
                      int64_t k0, int64_t k1, const float* bias, float* y, const ConvShape& s) {
  const int64_t pq = s.P * s.Q, kpq = s.K * pq;
  for (int64_t k = k0; k < k1; ++k) {
    const float* mk = m + (k - k0) * kBlock;
    alignas(64) float o[2][2][kBlock];
    alignas(64) float r[2][4][kBlock];  // A^T M
    for (int c = 0; c < 4; ++c) {
      const float* m0 = mk + (0 + c) * mstride;
      const float* m1 = mk + (4 + c) * mstride;
      const float* m2 = mk + (8 + c) * mstride;
      const float* m3 = mk + (12 + c) * mstride;
      for (int64_t j = 0; j < width; ++j) {
        r[0][c][j] = m0[j] + m1[j] + m2[j];
        r[1][c][j] = m1[j] - m2[j] - m3[j];
      }
    }
    const float b = bias ? bias[k] : 0.0f;
    for (int a = 0; a < 2; ++a) {
      for (int64_t j = 0; j < width; ++j) {
        o[a][0][j] = r[a][0][j] + r[a][1][j] + r[a][2][j] + b;
        o[a][1][j] = r[a][1][j] - r[a][2][j] - r[a][3][j] + b;
      }
    }
    for (int64_t j = 0; j < t.count; ++j) {
      const int64_t p0 = 2 * t.th[j], q0 = 2 * t.tw[j];
      float* yk = y + t.n[j] * kpq + k * pq;
      for (int a = 0; a < 2 && p0 + a < s.P; ++a)
        for (int c = 0; c < 2 && q0 + c < s.Q; ++c) yk[(p0 + a) * s.Q + q0 + c] = o[a][c][j];
    }
  }
}

}  // namespace

Algo algo() {
  int a = g_algo.load(std::memory_order_relaxed);
  if (a < 0) {
    a = static_cast<int>(read_env());
    g_algo.store(a, std::memory_order_relaxed);
  }
  return static_cast<Algo>(a);
}

ScopedAlgo::ScopedAlgo(Algo a) : previous_(static_cast<int>(algo())) {
  g_algo.store(static_cast<int>(a), std::memory_order_relaxed);
}
ScopedAlgo::~ScopedAlgo() {
  g_algo.store(previous_, std::memory_order_relaxed);
}

bool applies(const ConvShape& s) {
  return algo() == Algo::winograd && s.R == 3 && s.S == 3 && s.stride_h == 1 && s.stride_w == 1 &&
         s.pad_h <= 2 && s.pad_w <= 2 && s.C >= kMinChannels && s.K >= kMinChannels &&
         s.N * ceil_div(s.P, 2) * ceil_div(s.Q, 2) >= kMinTiles;
}

void forward(const float* x, const float* w, const float* bias, float* y, const ConvShape& s) {
  REGEN_CHECK(
      s.R == 3 && s.S == 3 && s.stride_h == 1 && s.stride_w == 1 && s.pad_h <= 2 && s.pad_w <= 2,
      "conv2d Winograd F(2x2, 3x3): needs a 3x3 stride-1 convolution with padding at most "
      "2, got ",
      s.R, "x", s.S, " stride ", s.stride_h, "x", s.stride_w, " padding ", s.pad_h, "x", s.pad_w);
  const int64_t tiles_h = ceil_div(s.P, 2), tiles_w = ceil_div(s.Q, 2);
  const int64_t tiles = s.N * tiles_h * tiles_w, blocks = ceil_div(tiles, kBlock);
  const int64_t row_panels = ceil_div(s.K, kMR), ustride = row_panels * kMR * s.C;
  // Threads: whole blocks each when there are enough; else every thread every block, a share
  // of the row panels each.
  const int threads = omp_in_parallel() ? 1
                                        : static_cast<int>(std::min<int64_t>(
                                              omp_get_max_threads(), std::max(blocks, row_panels)));
  const bool split_blocks = blocks >= kBlocksPerThread * threads || threads == 1;
  const int64_t vstride = s.C * kBlock;  // one xi's B panels
  const int64_t rows_max = std::min(kRowChunk, row_panels * kMR), mstride = rows_max * kBlock;
  const int64_t per_thread = 16 * vstride + 16 * mstride;
  Workspace ws(Device::cpu(),
               static_cast<uint64_t>(16 * ustride + threads * per_thread) * sizeof(float));
  if (dry_run_active()) return;
  float* const u = ws.as<float>();
  // U[xi] as A panels: depth block pc, panel ip at u + xi * ustride + row_panels * kMR * pc +
  // ip * kMR * kc, element [k * kMR + i] (rows past K zero), as packed_gemm.h's shared A.
  const packed::TileFn<float> tile = packed::tile_kernel<float>(packed::tile_isa());
#pragma omp parallel num_threads(threads)
  {
    // A panel's 8 filters at a time, so each xi's 8 values land as one contiguous run.
#pragma omp for schedule(static)
    for (int64_t ip = 0; ip < row_panels; ++ip) {
      alignas(64) float g[kMR][16];
      for (int64_t c = 0; c < s.C; ++c) {
        const int64_t pc = c / kKC * kKC, kc = std::min(kKC, s.C - pc);
        for (int64_t i = 0; i < kMR; ++i) {
          const int64_t k = ip * kMR + i;
          if (k < s.K) {
            filter_transform(w + (k * s.C + c) * 9, g[i]);
          } else {
            std::fill(g[i], g[i] + 16, 0.0f);
          }
        }
        float* dst = u + row_panels * kMR * pc + ip * kMR * kc + (c - pc) * kMR;
        for (int xi = 0; xi < 16; ++xi)
          for (int64_t i = 0; i < kMR; ++i) dst[xi * ustride + i] = g[i][xi];
      }
    }
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    float* const v = u + 16 * ustride + t * per_thread;
    float* const m = v + 16 * vstride;
    const int64_t b_lo = split_blocks ? blocks * t / nt : 0;
    const int64_t b_hi = split_blocks ? blocks * (t + 1) / nt : blocks;
    const int64_t r_lo = split_blocks ? 0 : row_panels * t / nt;
    const int64_t r_hi = split_blocks ? row_panels : row_panels * (t + 1) / nt;
    for (int64_t blk = b_lo; blk < b_hi && r_lo < r_hi; ++blk) {
      const int64_t first = blk * kBlock, count = std::min(kBlock, tiles - first);
      const TileSites sites = block_tiles(first, count, tiles_h, tiles_w);
      const int nv = static_cast<int>(ceil_div(count, kLanes));
      const int64_t width = nv * kLanes;
      input_transform(x, s, sites, width, v, vstride);
      for (int64_t rc = r_lo; rc < r_hi; rc += kRowChunk / kMR) {
        const int64_t rc_end = std::min(r_hi, rc + kRowChunk / kMR);
        for (int64_t pc = 0; pc < s.C; pc += kKC) {
          const int64_t kc = std::min(kKC, s.C - pc);
          for (int xi = 0; xi < 16; ++xi) {
            const float* bp = v + xi * vstride + pc * width;
            for (int64_t ip = rc; ip < rc_end; ++ip) {
              const float* ap = u + xi * ustride + row_panels * kMR * pc + ip * kMR * kc;
              const packed::Run<float> run{0, width, m + xi * mstride + (ip - rc) * kMR * kBlock};
              tile(nv, kc, ap, bp, &run, 1, std::min<int64_t>(kMR, s.K - ip * kMR), kBlock, pc > 0,
                   nullptr);
            }
          }
        }
        output_transform(m, mstride, width, sites, rc * kMR, std::min(s.K, rc_end * kMR), bias, y,
                         s);
      }
    }
  }
}

}  // namespace regen::cpu::winograd
