// Winograd F(2x2, 3x3) and F(4x4, 3x3) for 3x3 stride-1 convolutions (declared in
// conv2d_winograd.h): f32, and bf16 and f16 operands widened to f32 as they are read.
//
// Each 2x2 block of outputs ("tile") of an output plane is computed from the 4x4 input patch
// under it: with d the patch and g a 3x3 filter,
//   y = A^T [ (G g G^T) .* (B^T d B) ] A,
//   B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1],  G = [1 0 0; .5 .5 .5; .5 -.5 .5; 0 0 1],
//   A^T = [1 1 1 0; 0 1 -1 -1].
// Summed over input channels, the 16 element-wise products become 16 matrix products:
//   M[xi] (K, tiles) = U[xi] (K, C) * V[xi] (C, tiles),  U = G g G^T,  V = B^T d B,
// 16 multiply-adds per tile and channel pair where the direct convolution does 36 (2.25x fewer).
// F(4x4, 3x3) is the same with 6x6 patches, 4x4 outputs and 36 products (36 multiply-adds where
// the direct convolution does 144); its matrices are beside its transforms below. forward()
// takes it where tile_size() says (planes of whole 4x4 tiles, enough of them); backward-filter
// stays F(2x2, 3x3).
//
// Fused, so that nothing of size (16, C, tiles) goes through memory (36 for F(4x4) throughout
// this paragraph): the filters are transformed once per call into the packed GEMM's A panels
// (16 x K x C floats, shared; a panel's 8 filters at a time, vectorized across them). Then, for a
// block of kBlock = 48 tiles (one register tile's width), a thread transforms the block's input
// patches for every channel straight into B panels (16 x C x 48 floats, L2-sized), runs
// the 16 products for a chunk of output channels on the register tile (packed_gemm.h) into
// 16 x kRowChunk x 48 floats, and transforms those back into y (adding the bias). Threads take
// whole blocks when there are at least kBlocksPerThread per thread; otherwise every thread
// runs every block: it transforms its share of the block's channels into panels the threads
// share, meets the others at a barrier, and takes its share of the output channels.
//
// Backward-filter (backward_filter below) is not fused: per chunk of 240 tiles, the threads
// transform x and dy into row-major matrices (16 of each), then each thread takes whole xi and
// multiplies dM[xi] by V[xi]^T on the same register tile into dU[xi], summed over the chunks in
// order; last, dw = G^T dU G per filter.
//
// Determinism: an output element is the same sequence of operations (its patch's transform,
// one fused multiply-add chain over the channels per depth block of the register tile, in
// order, the inverse transform, the bias) whichever thread and block computes it, so results do
// not depend on the thread count. They differ from the direct convolution's in rounding (the
// transforms add and scale before multiplying): measured in tests/test_ops_vision.cpp.
//
// 16-bit operands (bf16, f16): x, w and dy are widened to f32 where they are read (a block's
// patches gathered as they are, then widened in one vector loop), every transform and product is
// the f32 path's, and each output (y, dx, dw) is rounded once to 16 bits (a block's tiles narrowed
// in one vector loop). So a 16-bit pass gives the f32 pass's results on the widened values,
// rounded once, bit for bit (tests/test_ops_vision.cpp), with the same workspace, on every CPU.
#include "regen/kernels/cpu/conv2d_winograd.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

#include "regen/core/dry_run.h"
#include "regen/core/error.h"
#include "regen/core/tensor.h"
#include "regen/kernels/cpu/convert.h"
#include "regen/kernels/cpu/packed_gemm.h"
#include "regen/kernels/cpu/panel_transpose.h"
#include "regen/kernels/kernels.h"

namespace regen::cpu::winograd {
namespace {

constexpr int64_t kMinChannels = 16;  // fewer input or output channels: the direct path
// Fewer output tiles: the direct path. The filters' transform (16 K C floats written per call)
// is paid back only over enough tiles: ResNet-152's 7x7 layers at batch 4 (64 tiles) ran at 0.8x
// and 0.6x the direct path's speed (forward, backward-data), its 14x14 ones (196) at 1.3-1.6x.
constexpr int64_t kMinTiles = 128;
// F(4x4, 3x3) where the output planes split into whole 4x4 tiles, at least this many (over the
// batch). Forward on 2 threads, against F(2x2) (a scratch program, this 2-core Zen 4): ResNet's
// 56x56 layers 0.68-0.82x the time at batch 4-32, its 28x28 ones 0.67-0.84x; its 14x14 ones
// (tiles of 16x16, a third more area than the plane) 0.99-1.07x, its 7x7 ones 0.83-1.69x.
constexpr int64_t kMinTiles4 = 128;
constexpr int64_t kBlock = packed::kNR<float>;  // tiles per block: one register tile's width
constexpr int kLanes = packed::kLanes<float>;
constexpr int64_t kMR = packed::kMR;
constexpr int64_t kKC = packed::kKC;
constexpr int64_t kRowChunk = 64;  // output channels per pass over a block's products
constexpr int64_t kBlocksPerThread = 4;
// Backward-filter: tiles per chunk (the products' depth; one depth block of the register tile)
// and channels per work item of its transforms.
constexpr int64_t kChunk = 5 * kBlock;
static_assert(kChunk <= kKC, "a chunk's products are one depth block");
constexpr int64_t kTransformGroup = 32;

// -1: not read yet; otherwise an Algo. The scoped override replaces it.
std::atomic<int> g_algo{-1};

// The Algo a name stands for (as an int), or -1 for a name that is neither.
int algo_named(const std::string& name) {
  if (name == "winograd") return static_cast<int>(Algo::winograd);
  if (name == "direct") return static_cast<int>(Algo::direct);
  return -1;
}

Algo read_env() {
  const char* v = std::getenv("REGEN_CPU_CONV");
  if (v == nullptr || *v == '\0') return Algo::winograd;
  const int a = algo_named(v);
  REGEN_CHECK(a >= 0, "REGEN_CPU_CONV='", v,
              "': expected winograd (the default: F(4x4, 3x3) or F(2x2, 3x3) for the 3x3 stride-1 "
              "convolutions with enough channels and tiles) or direct (the packed GEMM for every "
              "convolution)");
  return static_cast<Algo>(a);
}

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// One element widened to f32, exactly (core/half.h): f16 by the hardware conversion where there
// is one, except infinities and NaNs (the hardware would quiet a signalling NaN's payload).
inline float widen(float v) {
  return v;
}
inline float widen(bfloat16 v) {
  return half::from_bf16(v.bits);
}
inline float widen(float16 v) {
#if defined(__F16C__)
  if ((v.bits & 0x7c00u) != 0x7c00u) return _cvtsh_ss(v.bits);
#endif
  return half::from_fp16(v.bits);
}

// U = G g G^T for kMR filters at once, one per lane: g[3 * i + j][lane] the filters' taps
// (row-major), u[4 * i + j][lane]. Vectorized across the filters: each lane is the scalar
// transform's operations in its order.
void filter_transform(const float (*g)[kMR], float (*u)[kMR]) {
  float t[4][3][kMR];  // G g
  for (int c = 0; c < 3; ++c) {
    for (int l = 0; l < kMR; ++l) {
      const float g0 = g[c][l], g1 = g[3 + c][l], g2 = g[6 + c][l];
      t[0][c][l] = g0;
      t[1][c][l] = 0.5f * (g0 + g1 + g2);
      t[2][c][l] = 0.5f * (g0 - g1 + g2);
      t[3][c][l] = g2;
    }
  }
  for (int r = 0; r < 4; ++r) {
    for (int l = 0; l < kMR; ++l) {
      const float a = t[r][0][l], b = t[r][1][l], c = t[r][2][l];
      u[4 * r + 0][l] = a;
      u[4 * r + 1][l] = 0.5f * (a + b + c);
      u[4 * r + 2][l] = 0.5f * (a - b + c);
      u[4 * r + 3][l] = c;
    }
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

// The input patches of a block's tiles: A x A values from row M th - pad and column M tw - pad of
// each tile's image (zero outside the plane), gathered channel by channel into d[a][b][j] as f32.
// 16-bit elements are gathered as they are, then widened all at once (a vector loop, not a
// conversion per element).
template <int A, int M, class E>
class Patches {
 public:
  Patches(const ConvShape& s, const TileSites& t) : s_(s), t_(t) {
    const int64_t chw = s.C * s.H * s.W;
    for (int64_t j = 0; j < t.count; ++j) {
      h0_[j] = M * t.th[j] - s.pad_h;
      w0_[j] = M * t.tw[j] - s.pad_w;
      base_[j] = t.n[j] * chw + h0_[j] * s.W + w0_[j];
      inside_[j] = h0_[j] >= 0 && w0_[j] >= 0 && h0_[j] + A <= s.H && w0_[j] + A <= s.W;
    }
    if constexpr (kWiden) std::memset(raw_, 0, sizeof(raw_));  // +0 in both formats
  }
  // Channel plane xc's patches; columns past the block's tiles are left as they are (16-bit
  // elements: zero).
  void gather(const E* xc, float (*d)[A][kBlock]) {
    if constexpr (kWiden) {
      copy(xc, raw_);
      // The block's columns rounded up to 16 (whole vectors for any lane count; zero past them).
      const int64_t w = std::min<int64_t>(kBlock, (t_.count + 15) / 16 * 16);
      for (int a = 0; a < A; ++a)
        for (int b = 0; b < A; ++b) convert::widen_span(raw_[a][b], d[a][b], w);
    } else {
      copy(xc, d);
    }
  }

 private:
  static constexpr bool kWiden = !std::is_same_v<E, float>;
  template <class T>
  void copy(const E* xc, T (*d)[A][kBlock]) const {
    const T zero(0.0f);
    for (int64_t j = 0; j < t_.count; ++j) {
      if (inside_[j]) {
        const E* p = xc + base_[j];
        for (int a = 0; a < A; ++a)
          for (int b = 0; b < A; ++b) d[a][b][j] = p[a * s_.W + b];
        continue;
      }
      for (int a = 0; a < A; ++a) {
        const int64_t h = h0_[j] + a;
        for (int b = 0; b < A; ++b) {
          const int64_t w = w0_[j] + b;
          d[a][b][j] =
              h >= 0 && h < s_.H && w >= 0 && w < s_.W ? xc[base_[j] + a * s_.W + b] : zero;
        }
      }
    }
  }

  const ConvShape& s_;
  const TileSites& t_;
  int64_t h0_[kBlock], w0_[kBlock], base_[kBlock];
  bool inside_[kBlock];
  alignas(64) E raw_[kWiden ? A : 1][kWiden ? A : 1][kWiden ? kBlock : 1];
};

// V[xi] = B^T d B for channels [c_lo, c_hi) of the block's patches, `width` columns (the tiles
// rounded up to whole vectors) per channel, rows `ld` apart: v[xi * vstride + c * ld + j].
// Columns past the block's tiles are zero. Forward writes the register tile's B panels (ld ==
// width); backward-filter writes row-major matrices whose rows span several blocks.
template <class E>
void input_transform(const E* x, const ConvShape& s, const TileSites& t, int64_t width, int64_t ld,
                     int64_t c_lo, int64_t c_hi, float* v, int64_t vstride) {
  const int64_t hw = s.H * s.W;
  alignas(64) float d[4][4][kBlock];
  Patches<4, 2, E> patches(s, t);
  std::memset(d, 0, sizeof(d));
  for (int64_t c = c_lo; c < c_hi; ++c) {
    patches.gather(x + c * hw, d);
    // Along the block's tiles, vectorized: t = B^T d, then V = t B.
    float* out = v + c * ld;
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

// The block's M x M output tiles o[a][c][j] into yk, one output channel's planes (rounded once to
// E; 16-bit: all at once, a vector loop); outputs past the plane's edge are dropped.
template <int M, class E>
void store_tiles(const float (*o)[M][kBlock], const TileSites& t, E* yk, const ConvShape& s) {
  const int64_t pq = s.P * s.Q, kpq = s.K * pq;
  auto scatter = [&](const auto(*v)[M][kBlock]) {
    for (int64_t j = 0; j < t.count; ++j) {
      const int64_t p0 = M * t.th[j], q0 = M * t.tw[j];
      E* yt = yk + t.n[j] * kpq + p0 * s.Q + q0;
      for (int a = 0; a < M && p0 + a < s.P; ++a)
        for (int c = 0; c < M && q0 + c < s.Q; ++c) yt[a * s.Q + c] = v[a][c][j];
    }
  };
  if constexpr (std::is_same_v<E, float>) {
    scatter(o);
  } else {
    alignas(64) E narrow[M][M][kBlock];
    for (int a = 0; a < M; ++a)
      for (int c = 0; c < M; ++c) convert::narrow_span(o[a][c], narrow[a][c], t.count);
    scatter(narrow);
  }
}

// y's tiles from M[xi] for output channels [k0, k1): y = A^T M A (+ bias). The products wrote
// the first `width` columns of M (the block's tiles rounded up to whole vectors).
template <class E>
void output_transform(const float* m, int64_t mstride, int64_t width, const TileSites& t,
                      int64_t k0, int64_t k1, const E* bias, E* y, const ConvShape& s) {
  const int64_t pq = s.P * s.Q;
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
    const float b = bias ? widen(bias[k]) : 0.0f;
    for (int a = 0; a < 2; ++a) {
      for (int64_t j = 0; j < width; ++j) {
        o[a][0][j] = r[a][0][j] + r[a][1][j] + r[a][2][j] + b;
        o[a][1][j] = r[a][1][j] - r[a][2][j] - r[a][3][j] + b;
      }
    }
    store_tiles<2>(o, t, y + k * pq, s);
  }
}

// dM[xi] = A dy A^T for output channels [k_lo, k_hi) of the block's tiles (the adjoint of
// output_transform; outputs past the plane's edge have no gradient): rows `ld` apart,
// g[xi * gstride + k * ld + j], `width` columns, zero past the block's tiles.
template <class E>
void grad_output_transform(const E* dy, const ConvShape& s, const TileSites& t, int64_t width,
                           int64_t ld, int64_t k_lo, int64_t k_hi, float* g, int64_t gstride) {
  const int64_t pq = s.P * s.Q, kpq = s.K * pq;
  int64_t base[kBlock];
  bool full[kBlock];  // all four outputs inside the plane
  for (int64_t j = 0; j < t.count; ++j) {
    const int64_t p0 = 2 * t.th[j], q0 = 2 * t.tw[j];
    base[j] = t.n[j] * kpq + p0 * s.Q + q0;
    full[j] = p0 + 2 <= s.P && q0 + 2 <= s.Q;
  }
  alignas(64) float e[2][2][kBlock] = {};  // columns past the tiles stay zero
  for (int64_t k = k_lo; k < k_hi; ++k) {
    const E* dk = dy + k * pq;
    for (int64_t j = 0; j < t.count; ++j) {
      const E* p = dk + base[j];
      if (full[j]) {
        e[0][0][j] = widen(p[0]);
        e[0][1][j] = widen(p[1]);
        e[1][0][j] = widen(p[s.Q]);
        e[1][1][j] = widen(p[s.Q + 1]);
        continue;
      }
      const int64_t p0 = 2 * t.th[j], q0 = 2 * t.tw[j];
      for (int a = 0; a < 2; ++a)
        for (int b = 0; b < 2; ++b)
          e[a][b][j] = p0 + a < s.P && q0 + b < s.Q ? widen(p[a * s.Q + b]) : 0.0f;
    }
    // Rows r = A e (r0 = e0, r1 = e0 + e1, r2 = e0 - e1, r3 = -e1), then each row times A^T.
    alignas(64) float r[4][2][kBlock];
    for (int b = 0; b < 2; ++b) {
      for (int64_t j = 0; j < width; ++j) {
        r[0][b][j] = e[0][b][j];
        r[1][b][j] = e[0][b][j] + e[1][b][j];
        r[2][b][j] = e[0][b][j] - e[1][b][j];
        r[3][b][j] = -e[1][b][j];
      }
    }
    float* out = g + k * ld;
    for (int a = 0; a < 4; ++a) {
      float* o0 = out + (4 * a + 0) * gstride;
      float* o1 = out + (4 * a + 1) * gstride;
      float* o2 = out + (4 * a + 2) * gstride;
      float* o3 = out + (4 * a + 3) * gstride;
      for (int64_t j = 0; j < width; ++j) {
        o0[j] = r[a][0][j];
        o1[j] = r[a][0][j] + r[a][1][j];
        o2[j] = r[a][0][j] - r[a][1][j];
        o3[j] = -r[a][1][j];
      }
    }
  }
}

// dg = G^T du G for one filter: du[4 * a + b] the 4x4 gradient of U, dg[3 * i + j] row-major.
void filter_gradient(const float* du, float* dg) {
  float t[3][4];  // G^T du
  for (int b = 0; b < 4; ++b) {
    const float u0 = du[b], u1 = du[4 + b], u2 = du[8 + b], u3 = du[12 + b];
    t[0][b] = u0 + 0.5f * (u1 + u2);
    t[1][b] = 0.5f * (u1 - u2);
    t[2][b] = 0.5f * (u1 + u2) + u3;
  }
  for (int i = 0; i < 3; ++i) {
    dg[3 * i + 0] = t[i][0] + 0.5f * (t[i][1] + t[i][2]);
    dg[3 * i + 1] = 0.5f * (t[i][1] - t[i][2]);
    dg[3 * i + 2] = 0.5f * (t[i][1] + t[i][2]) + t[i][3];
  }
}

// ---- F(4x4, 3x3): 6x6 patches, 4x4 outputs, interpolation points 0, 1, -1, 2, -2 and infinity:
//   B^T = [4 0 -5 0 1 0; 0 -4 -4 1 1 0; 0 4 -4 -1 1 0; 0 -2 -1 2 1 0; 0 2 -1 -2 1 0; 0 4 0 -5 0 1],
//   G = [1/4 0 0; -1/6 -1/6 -1/6; -1/6 1/6 -1/6; 1/24 1/12 1/6; 1/24 -1/12 1/6; 0 0 1],
//   A^T = [1 1 1 1 1 0; 0 1 -1 2 -2 0; 0 1 1 4 4 0; 0 1 -1 8 -8 1].
// 36 products per 16 outputs where the direct convolution does 144 (4x fewer; F(2x2): 2.25x).

// U = G g G^T for kMR filters at once, as filter_transform: u[6 * i + j][lane].
void filter_transform4(const float (*g)[kMR], float (*u)[kMR]) {
  float t[6][3][kMR];  // G g
  for (int c = 0; c < 3; ++c) {
    for (int l = 0; l < kMR; ++l) {
      const float g0 = g[c][l], g1 = g[3 + c][l], g2 = g[6 + c][l];
      t[0][c][l] = g0 * (1.0f / 4);
      t[1][c][l] = -(g0 + g1 + g2) * (1.0f / 6);
      t[2][c][l] = -(g0 - g1 + g2) * (1.0f / 6);
      t[3][c][l] = g0 * (1.0f / 24) + g1 * (1.0f / 12) + g2 * (1.0f / 6);
      t[4][c][l] = g0 * (1.0f / 24) - g1 * (1.0f / 12) + g2 * (1.0f / 6);
      t[5][c][l] = g2;
    }
  }
  for (int r = 0; r < 6; ++r) {
    for (int l = 0; l < kMR; ++l) {
      const float a = t[r][0][l], b = t[r][1][l], c = t[r][2][l];
      u[6 * r + 0][l] = a * (1.0f / 4);
      u[6 * r + 1][l] = -(a + b + c) * (1.0f / 6);
      u[6 * r + 2][l] = -(a - b + c) * (1.0f / 6);
      u[6 * r + 3][l] = a * (1.0f / 24) + b * (1.0f / 12) + c * (1.0f / 6);
      u[6 * r + 4][l] = a * (1.0f / 24) - b * (1.0f / 12) + c * (1.0f / 6);
      u[6 * r + 5][l] = c;
    }
  }
}

// r = B^T d along one index of six vectors of kBlock (d0..d5 in, r0..r5 out; may not alias).
inline void b_transpose_6(const float* d0, const float* d1, const float* d2, const float* d3,
                          const float* d4, const float* d5, float* r0, float* r1, float* r2,
                          float* r3, float* r4, float* r5, int64_t width) {
  for (int64_t j = 0; j < width; ++j) {
    const float a = d4[j] - 4.0f * d2[j], b = d3[j] - 4.0f * d1[j];
    const float c = d4[j] - d2[j], e = 2.0f * (d3[j] - d1[j]);
    r0[j] = 4.0f * d0[j] - 5.0f * d2[j] + d4[j];
    r1[j] = a + b;
    r2[j] = a - b;
    r3[j] = c + e;
    r4[j] = c - e;
    r5[j] = 4.0f * d1[j] - 5.0f * d3[j] + d5[j];
  }
}

// V[xi] = B^T d B for channels [c_lo, c_hi) of the block's 6x6 patches (tile j's patch starts at
// row 4 th - pad, column 4 tw - pad), into the register tile's B panels: v[xi * vstride + c *
// width + j], zero past the block's tiles.
template <class E>
void input_transform4(const E* x, const ConvShape& s, const TileSites& t, int64_t width,
                      int64_t c_lo, int64_t c_hi, float* v, int64_t vstride) {
  const int64_t hw = s.H * s.W;
  alignas(64) float d[6][6][kBlock];
  alignas(64) float r[6][6][kBlock];
  Patches<6, 4, E> patches(s, t);
  std::memset(d, 0, sizeof(d));
  for (int64_t c = c_lo; c < c_hi; ++c) {
    patches.gather(x + c * hw, d);
    // Columns first (t = B^T d into r), then rows (V = t B) straight into the panels.
    for (int b = 0; b < 6; ++b) {
      b_transpose_6(d[0][b], d[1][b], d[2][b], d[3][b], d[4][b], d[5][b], r[0][b], r[1][b], r[2][b],
                    r[3][b], r[4][b], r[5][b], width);
    }
    float* out = v + c * width;
    for (int a = 0; a < 6; ++a) {
      float* o = out + 6 * a * vstride;
      b_transpose_6(r[a][0], r[a][1], r[a][2], r[a][3], r[a][4], r[a][5], o, o + vstride,
                    o + 2 * vstride, o + 3 * vstride, o + 4 * vstride, o + 5 * vstride, width);
    }
  }
}

// y's 4x4 tiles from M[xi] for output channels [k0, k1): y = A^T M A (+ bias).
template <class E>
void output_transform4(const float* m, int64_t mstride, int64_t width, const TileSites& t,
                       int64_t k0, int64_t k1, const E* bias, E* y, const ConvShape& s) {
  const int64_t pq = s.P * s.Q;
  for (int64_t k = k0; k < k1; ++k) {
    const float* mk = m + (k - k0) * kBlock;
    alignas(64) float r[4][6][kBlock];  // A^T M
    alignas(64) float o[4][4][kBlock];
    for (int c = 0; c < 6; ++c) {
      const float* m0 = mk + (0 + c) * mstride;
      const float* m1 = mk + (6 + c) * mstride;
      const float* m2 = mk + (12 + c) * mstride;
      const float* m3 = mk + (18 + c) * mstride;
      const float* m4 = mk + (24 + c) * mstride;
      const float* m5 = mk + (30 + c) * mstride;
      for (int64_t j = 0; j < width; ++j) {
        const float sp = m1[j] + m2[j], sm = m1[j] - m2[j];
        const float tp = m3[j] + m4[j], tm = m3[j] - m4[j];
        r[0][c][j] = m0[j] + sp + tp;
        r[1][c][j] = sm + 2.0f * tm;
        r[2][c][j] = sp + 4.0f * tp;
        r[3][c][j] = sm + 8.0f * tm + m5[j];
      }
    }
    const float b = bias ? widen(bias[k]) : 0.0f;
    for (int a = 0; a < 4; ++a) {
      for (int64_t j = 0; j < width; ++j) {
        const float sp = r[a][1][j] + r[a][2][j], sm = r[a][1][j] - r[a][2][j];
        const float tp = r[a][3][j] + r[a][4][j], tm = r[a][3][j] - r[a][4][j];
        o[a][0][j] = r[a][0][j] + sp + tp + b;
        o[a][1][j] = sm + 2.0f * tm + b;
        o[a][2][j] = sp + 4.0f * tp + b;
        o[a][3][j] = sm + 8.0f * tm + r[a][5][j] + b;
      }
    }
    store_tiles<4>(o, t, y + k * pq, s);
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

// 0: tile_size() chooses; 2 or 4: the ScopedTileSize override.
std::atomic<int> g_tile_override{0};

int tile_size(const ConvShape& s) {
  const int o = g_tile_override.load(std::memory_order_relaxed);
  if (o != 0) return o;
  const bool whole = s.P % 4 == 0 && s.Q % 4 == 0;
  return whole && s.N * (s.P / 4) * (s.Q / 4) >= kMinTiles4 ? 4 : 2;
}

ScopedTileSize::ScopedTileSize(int m) : previous_(g_tile_override.load()) {
  REGEN_CHECK(m == 0 || m == 2 || m == 4, "Winograd output tiles: 2 or 4 (0 to choose), got ", m);
  g_tile_override.store(m);
}
ScopedTileSize::~ScopedTileSize() {
  g_tile_override.store(previous_);
}

bool applies(const ConvShape& s) {
  return algo() == Algo::winograd && s.R == 3 && s.S == 3 && s.stride_h == 1 && s.stride_w == 1 &&
         s.pad_h <= 2 && s.pad_w <= 2 && s.C >= kMinChannels && s.K >= kMinChannels &&
         s.N * ceil_div(s.P, 2) * ceil_div(s.Q, 2) >= kMinTiles;
}

namespace {
// forward() with output tiles of M x M (2 or 4): (M + 2)^2 products.
template <int M, class E>
void forward_tiles(const E* x, const E* w, const E* bias, E* y, const ConvShape& s, bool flipped) {
  constexpr int kXi = (M + 2) * (M + 2);
  const int64_t tiles_h = ceil_div(s.P, M), tiles_w = ceil_div(s.Q, M);
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
  // Splitting blocks, each thread has its own B panels; splitting rows, the threads share two
  // sets (each transforms its share of a block's channels into one while the other may still be
  // read for the previous block).
  const int64_t shared_v = split_blocks ? 0 : 2 * kXi * vstride;
  const int64_t per_thread = (split_blocks ? kXi * vstride : 0) + kXi * mstride;
  Workspace ws(
      Device::cpu(),
      static_cast<uint64_t>(kXi * ustride + shared_v + threads * per_thread) * sizeof(float));
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
      alignas(64) float g[9][kMR];
      alignas(64) float ut[kXi][kMR];
      for (int64_t c = 0; c < s.C; ++c) {
        const int64_t pc = c / kKC * kKC, kc = std::min(kKC, s.C - pc);
        for (int64_t i = 0; i < kMR; ++i) {
          const int64_t k = ip * kMR + i;
          for (int tap = 0; tap < 9; ++tap) {
            g[tap][i] = k >= s.K  ? 0.0f
                        : flipped ? widen(w[(c * s.K + k) * 9 + 8 - tap])
                                  : widen(w[(k * s.C + c) * 9 + tap]);
          }
        }
        if constexpr (M == 2) {
          filter_transform(g, ut);
        } else {
          filter_transform4(g, ut);
        }
        float* dst = u + row_panels * kMR * pc + ip * kMR * kc + (c - pc) * kMR;
        for (int xi = 0; xi < kXi; ++xi) std::copy(ut[xi], ut[xi] + kMR, dst + xi * ustride);
      }
    }
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    float* const mine = u + kXi * ustride + shared_v + t * per_thread;
    float* const m = mine + (split_blocks ? kXi * vstride : 0);
    const int64_t b_lo = split_blocks ? blocks * t / nt : 0;
    const int64_t b_hi = split_blocks ? blocks * (t + 1) / nt : blocks;
    const int64_t r_lo = split_blocks ? 0 : row_panels * t / nt;
    const int64_t r_hi = split_blocks ? row_panels : row_panels * (t + 1) / nt;
    for (int64_t blk = b_lo; blk < b_hi; ++blk) {
      const int64_t first = blk * kBlock, count = std::min(kBlock, tiles - first);
      const TileSites sites = block_tiles(first, count, tiles_h, tiles_w);
      const int nv = static_cast<int>(ceil_div(count, kLanes));
      const int64_t width = nv * kLanes;
      auto transform_input = [&](int64_t c_lo, int64_t c_hi, float* dst) {
        if constexpr (M == 2) {
          input_transform(x, s, sites, width, width, c_lo, c_hi, dst, vstride);
        } else {
          input_transform4(x, s, sites, width, c_lo, c_hi, dst, vstride);
        }
      };
      float* v = mine;
      if (split_blocks) {
        transform_input(0, s.C, v);
      } else {
        // Every thread runs every block: one barrier per block, after its share of the transform
        // (the other set of panels is free: every thread left the block before the last one at
        // the previous barrier).
        v = u + kXi * ustride + (blk % 2) * kXi * vstride;
        transform_input(s.C * t / nt, s.C * (t + 1) / nt, v);
#pragma omp barrier
      }
      for (int64_t rc = r_lo; rc < r_hi; rc += kRowChunk / kMR) {
        const int64_t rc_end = std::min(r_hi, rc + kRowChunk / kMR);
        for (int64_t pc = 0; pc < s.C; pc += kKC) {
          const int64_t kc = std::min(kKC, s.C - pc);
          for (int xi = 0; xi < kXi; ++xi) {
            const float* bp = v + xi * vstride + pc * width;
            for (int64_t ip = rc; ip < rc_end; ++ip) {
              const float* ap = u + xi * ustride + row_panels * kMR * pc + ip * kMR * kc;
              const packed::Run<float> run{0, width, m + xi * mstride + (ip - rc) * kMR * kBlock};
              tile(nv, kc, ap, bp, &run, 1, std::min<int64_t>(kMR, s.K - ip * kMR), kBlock, pc > 0,
                   nullptr);
            }
          }
        }
        if constexpr (M == 2) {
          output_transform(m, mstride, width, sites, rc * kMR, std::min(s.K, rc_end * kMR), bias, y,
                           s);
        } else {
          output_transform4(m, mstride, width, sites, rc * kMR, std::min(s.K, rc_end * kMR), bias,
                            y, s);
        }
      }
    }
  }
}
}  // namespace

template <class E>
void forward(const E* x, const E* w, const E* bias, E* y, const ConvShape& s, bool flipped) {
  REGEN_CHECK(
      s.R == 3 && s.S == 3 && s.stride_h == 1 && s.stride_w == 1 && s.pad_h <= 2 && s.pad_w <= 2,
      "conv2d Winograd: needs a 3x3 stride-1 convolution with padding at most "
      "2, got ",
      s.R, "x", s.S, " stride ", s.stride_h, "x", s.stride_w, " padding ", s.pad_h, "x", s.pad_w);
  if (tile_size(s) == 4) return forward_tiles<4>(x, w, bias, y, s, flipped);
  forward_tiles<2>(x, w, bias, y, s, flipped);
}

template <class E>
void backward_filter(const E* x, const E* dy, E* dw, const ConvShape& s) {
  REGEN_CHECK(
      s.R == 3 && s.S == 3 && s.stride_h == 1 && s.stride_w == 1 && s.pad_h <= 2 && s.pad_w <= 2,
      "conv2d Winograd F(2x2, 3x3) backward-filter: needs a 3x3 stride-1 convolution with padding "
      "at most 2, got ",
      s.R, "x", s.S, " stride ", s.stride_h, "x", s.stride_w, " padding ", s.pad_h, "x", s.pad_w);
  const int64_t tiles_h = ceil_div(s.P, 2), tiles_w = ceil_div(s.Q, 2);
  const int64_t tiles = s.N * tiles_h * tiles_w;
  const int64_t chunk = std::min(kChunk, tiles), ld = ceil_div(chunk, kLanes) * kLanes;
  const int64_t vstride = s.C * ld, gstride = s.K * ld, ustride = s.K * s.C;
  const int64_t c_padded = ceil_div(s.C, kLanes) * kLanes;  // the B panels' widths, summed
  const int64_t per_thread = c_padded * chunk + kMR * chunk + kLanes;
  // The products: one xi per thread at a time, so at most 16 threads.
  const int threads =
      omp_in_parallel() ? 1 : static_cast<int>(std::min<int64_t>(omp_get_max_threads(), 16));
  Workspace ws(Device::cpu(),
               static_cast<uint64_t>(16 * (vstride + gstride + ustride) + threads * per_thread) *
                   sizeof(float));
  if (dry_run_active()) return;
  float* const v = ws.as<float>();     // V[xi] (C, chunk) row-major, rows ld apart
  float* const g = v + 16 * vstride;   // dM[xi] (K, chunk)
  float* const du = g + 16 * gstride;  // dU[xi] (K, C)
  const packed::TileFn<float> tile = packed::tile_kernel<float>(packed::tile_isa());
  const int64_t c_groups = ceil_div(s.C, kTransformGroup),
                k_groups = ceil_div(s.K, kTransformGroup);
#pragma omp parallel num_threads(threads)
  {
    float* const bp = du + 16 * ustride + omp_get_thread_num() * per_thread;
    float* const ap = bp + c_padded * chunk;
    for (int64_t first = 0; first < tiles; first += chunk) {
      const int64_t count = std::min(chunk, tiles - first);
      // Both transforms of this chunk's tiles, a group of channels at a time, block by block.
#pragma omp for schedule(static)
      for (int64_t item = 0; item < c_groups + k_groups; ++item) {
        const bool input = item < c_groups;
        const int64_t lo = (input ? item : item - c_groups) * kTransformGroup;
        const int64_t hi = std::min(input ? s.C : s.K, lo + kTransformGroup);
        for (int64_t b0 = 0; b0 < count; b0 += kBlock) {
          const int64_t n = std::min(kBlock, count - b0);
          const TileSites sites = block_tiles(first + b0, n, tiles_h, tiles_w);
          const int64_t width = ceil_div(n, kLanes) * kLanes;
          if (input) {
            input_transform(x, s, sites, width, ld, lo, hi, v + b0, vstride);
          } else {
            grad_output_transform(dy, s, sites, width, ld, lo, hi, g + b0, gstride);
          }
        }
      }
      // dU[xi] (+)= dM[xi] V[xi]^T over this chunk's tiles: V's panels packed once per xi, dM's
      // row panels one at a time, the register tile over every column panel.
#pragma omp for schedule(static)
      for (int xi = 0; xi < 16; ++xi) {
        const float* vx = v + xi * vstride;
        const float* gx = g + xi * gstride;
        float* ux = du + xi * ustride;
        for (int64_t c0 = 0; c0 < s.C; c0 += kBlock) {
          const int64_t cols = std::min(kBlock, s.C - c0), w = ceil_div(cols, kLanes) * kLanes;
          packed::transpose_into_panel(vx + c0 * ld, ld, cols, count, bp + c0 * chunk, w, w);
        }
        for (int64_t k0 = 0; k0 < s.K; k0 += kMR) {
          const int64_t rows = std::min(kMR, s.K - k0);
          packed::transpose_into_panel(gx + k0 * ld, ld, rows, count, ap, kMR, kMR);
          for (int64_t c0 = 0; c0 < s.C; c0 += kBlock) {
            const int64_t cols = std::min(kBlock, s.C - c0);
            const int nv = static_cast<int>(ceil_div(cols, kLanes));
            const packed::Run<float> run{0, cols, ux + k0 * s.C + c0};
            tile(nv, count, ap, bp + c0 * chunk, &run, 1, rows, s.C, first > 0, nullptr);
          }
        }
      }
    }
#pragma omp for schedule(static)
    for (int64_t k = 0; k < s.K; ++k) {
      // 16-bit: kGradGroup filters' gradients in f32, then rounded together (a vector loop).
      constexpr int64_t kGradGroup = 32;
      float g[kGradGroup * 9];
      for (int64_t c0 = 0; c0 < s.C; c0 += kGradGroup) {
        const int64_t n = std::min(kGradGroup, s.C - c0);
        for (int64_t c = c0; c < c0 + n; ++c) {
          float u[16];
          for (int xi = 0; xi < 16; ++xi) u[xi] = du[xi * ustride + k * s.C + c];
          if constexpr (std::is_same_v<E, float>) {
            filter_gradient(u, dw + (k * s.C + c) * 9);
          } else {
            filter_gradient(u, g + (c - c0) * 9);
          }
        }
        if constexpr (!std::is_same_v<E, float>) {
          convert::narrow_span(g, dw + (k * s.C + c0) * 9, n * 9);
        }
      }
    }
  }
}

#define REGEN_INSTANTIATE(E)                                                          \
  template void forward<E>(const E*, const E*, const E*, E*, const ConvShape&, bool); \
  template void backward_filter<E>(const E*, const E*, E*, const ConvShape&);
REGEN_INSTANTIATE(float)
REGEN_INSTANTIATE(bfloat16)
REGEN_INSTANTIATE(float16)
#undef REGEN_INSTANTIATE

}  // namespace regen::cpu::winograd

namespace regen::cpu {
std::string conv2d_algorithm() {
  return winograd::algo() == winograd::Algo::winograd ? "winograd" : "direct";
}
void set_conv2d_algorithm(const std::string& name) {
  const int a = winograd::algo_named(name);
  REGEN_CHECK(a >= 0, "the CPU's convolution algorithm '", name, "': expected winograd or direct");
  winograd::g_algo.store(a, std::memory_order_relaxed);
}
}  // namespace regen::cpu
