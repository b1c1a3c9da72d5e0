// CPU 2x upsampling of (NC, H, W) planes (declared in kernels/kernels.h): nearest and bilinear
// (align_corners=False), forward and backward, as PyTorch's F.interpolate(scale_factor=2).
//
// Bilinear, one axis of extent n: output i samples src = max((i + 0.5) / 2 - 0.5, 0) (PyTorch's
// area_pixel_compute_source_index with scale 1/2), between i0 = floor(src) and
// i1 = min(i0 + 1, n - 1) with weight l1 = src - i0 on i1 and 1 - l1 on i0. At scale 2 that is
//   i = 0:      i0 = 0,      l1 = 0
//   i = 2k > 0: i0 = k - 1,  l1 = 0.75
//   i = 2k + 1: i0 = k,      l1 = 0.25
// so input h is read by outputs 2h - 1 (weight 0.25, h >= 1), 2h (0.75; 1 for h = 0), 2h + 1
// (0.75; 1 for h = n - 1, where i1 = i0) and 2h + 2 (0.25, h < n - 1). Backward gathers over those
// (at most 4 x 4 outputs per input), so every element is written by one thread with a fixed sum
// order, the same as the CUDA kernels' (kernels/cuda/upsample.cu). All weights are exact binary
// fractions.
//
// 16-bit planes (bfloat16, float16) compute in f32 (acc_t) and round once per output, so each
// result is the f32 kernel's on the widened input, rounded. The rows they read (at most
// lowp::kRowMax wide) are widened into f32 stack buffers (kernels/cpu/lowp_blocks.h) and each
// output row is narrowed once, the same expressions on the same values as converting element by
// element; wider rows do that instead. Work is split over planes (OpenMP).
// Tests: tests/test_ops_upsample.cpp (against loops and PyTorch values),
// tests/test_gradcheck_upsample.cpp.
#include <omp.h>

#include <cstdint>

#include "regen/kernels/cpu/lowp_blocks.h"
#include "regen/kernels/kernels.h"

namespace regen::cpu {
namespace {
constexpr int64_t kParallelMin = 1 << 15;  // output elements; below this one thread is faster

// Output i of an axis of extent n: the two input indices and the weight of the second.
template <class T>
inline void source(int64_t i, int64_t n, int64_t& i0, int64_t& i1, T& l1) {
  const int64_t k = i >> 1;
  if (i & 1) {
    i0 = k;
    l1 = T(0.25);
  } else if (k == 0) {
    i0 = 0;
    l1 = T(0);
  } else {
    i0 = k - 1;
    l1 = T(0.75);
  }
  i1 = i0 < n - 1 ? i0 + 1 : i0;
}

// The outputs [lo, lo + count) that read input h of an axis of extent n, and their weights.
template <class T>
inline int readers(int64_t h, int64_t n, int64_t& lo, T (&w)[4]) {
  int count = 0;
  lo = h >= 1 ? 2 * h - 1 : 0;
  if (h >= 1) w[count++] = T(0.25);
  w[count++] = h == 0 ? T(1) : T(0.75);
  w[count++] = h == n - 1 ? T(1) : T(0.75);
  if (h < n - 1) w[count++] = T(0.25);
  return count;
}
}  // namespace

template <class T>
void upsample2x_nearest_forward(const T* x, T* y, int64_t NC, int64_t H, int64_t W) {
  const int64_t W2 = 2 * W;
#pragma omp parallel for schedule(static) if (NC * H * W * 4 > kParallelMin)
  for (int64_t i = 0; i < NC; ++i) {
    for (int64_t h = 0; h < H; ++h) {
      const T* in = x + (i * H + h) * W;
      T* out = y + (i * 2 * H + 2 * h) * W2;
      for (int64_t w = 0; w < W2; ++w) out[w] = in[w >> 1];  // a copy: exact in any dtype
      for (int64_t w = 0; w < W2; ++w) out[W2 + w] = out[w];
    }
  }
}

template <class T>
void upsample2x_nearest_backward(const T* dy, T* dx, int64_t NC, int64_t H, int64_t W) {
  using A = acc_t<T>;
  const int64_t W2 = 2 * W;
#pragma omp parallel for schedule(static) if (NC * H * W * 4 > kParallelMin)
  for (int64_t i = 0; i < NC; ++i) {
    for (int64_t h = 0; h < H; ++h) {
      const T* top = dy + (i * 2 * H + 2 * h) * W2;
      const T* bottom = top + W2;
      T* out = dx + (i * H + h) * W;
      if constexpr (is_half_v<T>) {
        if (W2 <= lowp::kRowMax) {
          float t[lowp::kRowMax], b[lowp::kRowMax], o[lowp::kRowMax / 2];
          convert::widen_span(top, t, W2);
          convert::widen_span(bottom, b, W2);
          for (int64_t w = 0; w < W; ++w) {
            o[w] = (t[2 * w] + t[2 * w + 1]) + (b[2 * w] + b[2 * w + 1]);
          }
          convert::narrow_span(o, out, W);
          continue;
        }
      }
      for (int64_t w = 0; w < W; ++w) {
        out[w] = T((A(top[2 * w]) + A(top[2 * w + 1])) + (A(bottom[2 * w]) + A(bottom[2 * w + 1])));
      }
    }
  }
}

namespace {
// Output row `out` (2W) of bilinear upsampling from input rows r0, r1 (W) with row weights lh0,
// lh1. R: the element type of the input rows (16 bits, or f32 for widened rows), O: of the output
// row.
template <class A, class R, class O>
inline void bilinear_row(const R* r0, const R* r1, A lh0, A lh1, O* out, int64_t W) {
  for (int64_t ow = 0; ow < 2 * W; ++ow) {
    int64_t w0, w1;
    A lw1;
    source(ow, W, w0, w1, lw1);
    const A lw0 = A(1) - lw1;
    out[ow] =
        O(lh0 * (lw0 * A(r0[w0]) + lw1 * A(r0[w1])) + lh1 * (lw0 * A(r1[w0]) + lw1 * A(r1[w1])));
  }
}
}  // namespace

template <class T>
void upsample2x_bilinear_forward(const T* x, T* y, int64_t NC, int64_t H, int64_t W) {
  using A = acc_t<T>;
  const int64_t H2 = 2 * H, W2 = 2 * W;
#pragma omp parallel for schedule(static) if (NC * H * W * 4 > kParallelMin)
  for (int64_t i = 0; i < NC; ++i) {
    const T* in = x + i * H * W;
    for (int64_t oh = 0; oh < H2; ++oh) {
      int64_t h0, h1;
      A lh1;
      source(oh, H, h0, h1, lh1);
      const A lh0 = A(1) - lh1;
      const T* r0 = in + h0 * W;
      const T* r1 = in + h1 * W;
      T* out = y + (i * H2 + oh) * W2;
      if constexpr (is_half_v<T>) {
        if (W2 <= lowp::kRowMax) {
          float a[lowp::kRowMax / 2], b[lowp::kRowMax / 2], o[lowp::kRowMax];
          convert::widen_span(r0, a, W);
          convert::widen_span(r1, b, W);
          bilinear_row<A>(a, b, lh0, lh1, o, W);
          convert::narrow_span(o, out, W2);
          continue;
        }
      }
      bilinear_row<A>(r0, r1, lh0, lh1, out, W);
    }
  }
}

namespace {
// Input row `out` (W) of bilinear upsampling's backward: each element gathers the gradient rows
// rows[0, nh) (2W each; weights wh) over the outputs that read it.
template <class A, class R, class O>
inline void bilinear_gather_row(const R* const (&rows)[4], int nh, const A (&wh)[4], O* out,
                                int64_t W) {
  for (int64_t w = 0; w < W; ++w) {
    int64_t ow0;
    A ww[4];
    const int nw = readers(w, W, ow0, ww);
    A acc = A(0);
    for (int a = 0; a < nh; ++a) {
      const R* row = rows[a] + ow0;
      A part = A(0);
      for (int b = 0; b < nw; ++b) part += ww[b] * A(row[b]);
      acc += wh[a] * part;
    }
    out[w] = O(acc);
  }
}
}  // namespace

template <class T>
void upsample2x_bilinear_backward(const T* dy, T* dx, int64_t NC, int64_t H, int64_t W) {
  using A = acc_t<T>;
  const int64_t W2 = 2 * W;
#pragma omp parallel for schedule(static) if (NC * H * W * 4 > kParallelMin)
  for (int64_t i = 0; i < NC; ++i) {
    const T* g = dy + i * 4 * H * W;
    for (int64_t h = 0; h < H; ++h) {
      int64_t oh0;
      A wh[4];
      const int nh = readers(h, H, oh0, wh);
      if constexpr (lowp::kBlocksFor<T>) {
        if (W2 <= lowp::kRowMax) {
          float rows[4][lowp::kRowMax], o[lowp::kRowMax / 2];
          for (int a = 0; a < nh; ++a) convert::widen_span(g + (oh0 + a) * W2, rows[a], W2);
          const float* r[4] = {rows[0], rows[1], rows[2], rows[3]};
          bilinear_gather_row<A>(r, nh, wh, o, W);
          convert::narrow_span(o, dx + (i * H + h) * W, W);
          continue;
        }
      }
      const T* r[4] = {};
      for (int a = 0; a < nh; ++a) r[a] = g + (oh0 + a) * W2;
      bilinear_gather_row<A>(r, nh, wh, dx + (i * H + h) * W, W);
    }
  }
}

#define REGEN_INSTANTIATE(T)                                                             \
  template void upsample2x_nearest_forward<T>(const T*, T*, int64_t, int64_t, int64_t);  \
  template void upsample2x_nearest_backward<T>(const T*, T*, int64_t, int64_t, int64_t); \
  template void upsample2x_bilinear_forward<T>(const T*, T*, int64_t, int64_t, int64_t); \
  template void upsample2x_bilinear_backward<T>(const T*, T*, int64_t, int64_t, int64_t);
REGEN_INSTANTIATE(float)
REGEN_INSTANTIATE(double)
REGEN_INSTANTIATE(bfloat16)
REGEN_INSTANTIATE(float16)
#undef REGEN_INSTANTIATE

}  // namespace regen::cpu
