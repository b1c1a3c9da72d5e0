// CPU pooling (declared in kernels/kernels.h): max pooling with an argmax index per output (or
// packed window positions, shapes.h pool_code_bits),
// average pooling with count_include_pad=True, and global average pooling; forward and backward.
// Work is split over (image, channel) planes and every plane is written by one thread, so the
// backward scatters need no atomics and sum in a fixed order.
// 16-bit planes (bfloat16, float16) compare and sum in f32 (acc_t) and round once per output; their
// backward scatters are gathers instead (each input element sums, in f32 and in the scatter's
// order, the outputs whose window holds it, and is rounded once; a widened plane scatters in f32),
// so each 16-bit result is the f32 kernel's on the widened inputs, rounded. A plane of at most
// lowp::kPlaneMax elements is widened whole into an f32 stack buffer (kernels/cpu/lowp_blocks.h)
// and runs the f32 plane loops, its output narrowed once; a larger one converts element by element,
// with the same bits. Tests: tests/test_ops_vision.cpp (against nested loops),
// tests/test_gradcheck_vision.cpp, tests/test_amp_ops.cpp (16-bit against f32).
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "regen/kernels/cpu/lowp_blocks.h"
#include "regen/kernels/kernels.h"

namespace regen::cpu {
namespace {
constexpr int64_t kParallelMin = 1 << 14;  // elements; below this one thread is faster

// Rows [lo, hi) of the input that output row p's window covers, padding excluded.
inline void window(int64_t p, int64_t stride, int64_t pad, int64_t k, int64_t extent, int64_t& lo,
                   int64_t& hi) {
  const int64_t start = p * stride - pad;
  lo = std::max<int64_t>(start, 0);
  hi = std::min<int64_t>(start + k, extent);
}

// Outputs [lo, hi) along one axis (of `outputs` positions) whose window covers input row h: the
// inverse of window().
inline void covering(int64_t h, int64_t stride, int64_t pad, int64_t k, int64_t outputs,
                     int64_t& lo, int64_t& hi) {
  const int64_t first = h + pad - k;  // p * stride > first
  lo = first < 0 ? 0 : first / stride + 1;
  hi = std::min<int64_t>((h + pad) / stride + 1, outputs);
}

// Whether a 16-bit plane (P*Q outputs of H*W inputs) is widened whole.
inline bool plane_fits(const PoolShape& s) {
  return s.H * s.W <= lowp::kPlaneMax && s.P * s.Q <= lowp::kPlaneMax;
}

// For each 16-bit plane i (in parallel): the plane's `in_count` elements of `in` widened into a
// stack buffer, body(i, widened, out) writing `out_count` f32 results, narrowed into `out`.
template <class T, class Body>
void over_widened_planes(const T* in, int64_t in_count, T* out, int64_t out_count, int64_t planes,
                         int64_t work, Body body) {
#pragma omp parallel for schedule(static) if (work > kParallelMin)
  for (int64_t i = 0; i < planes; ++i) {
    float a[lowp::kPlaneMax], b[lowp::kPlaneMax];
    convert::widen_span(in + i * in_count, a, in_count);
    body(i, static_cast<const float*>(a), b);
    convert::narrow_span(b, out + i * out_count, out_count);
  }
}

// The 16-bit backward of max pooling, as a gather over one plane: dx[h, w] sums dy over the
// outputs (in output order) whose chosen element is (h, w); `chosen(j)` is output j's plane index.
// D: the element type of dy and dx (16 bits, or f32 for a widened plane).
template <class D, class Chosen>
void maxpool2d_gather_plane(const D* dy, D* dx, const PoolShape& s, Chosen chosen) {
  for (int64_t h = 0; h < s.H; ++h) {
    int64_t p0, p1;
    covering(h, s.stride_h, s.pad_h, s.kh, s.P, p0, p1);
    for (int64_t w = 0; w < s.W; ++w) {
      int64_t q0, q1;
      covering(w, s.stride_w, s.pad_w, s.kw, s.Q, q0, q1);
      const int64_t at = h * s.W + w;
      float acc = 0.0f;
      for (int64_t p = p0; p < p1; ++p) {
        for (int64_t q = q0; q < q1; ++q) {
          const int64_t j = p * s.Q + q;
          if (chosen(j) == at) acc += static_cast<float>(dy[j]);
        }
      }
      dx[at] = D(acc);
    }
  }
}

// The 16-bit backward of max pooling; `chosen(i, j)` is output j's plane index in plane i.
template <class T, class Chosen>
void maxpool2d_backward_gather(const T* dy, T* dx, const PoolShape& s, Chosen chosen) {
  const int64_t planes = s.N * s.C, hw = s.H * s.W, pq = s.P * s.Q;
  if (plane_fits(s)) {
    // A widened plane scatters in f32, in output order: each element receives the same additions
    // in the same order as the gather below, so the same bits, without visiting every window that
    // covers each element.
    over_widened_planes(dy, pq, dx, hw, planes, planes * (pq + hw),
                        [&](int64_t i, const float* g, float* out) {
                          std::fill(out, out + hw, 0.0f);
                          for (int64_t j = 0; j < pq; ++j) out[chosen(i, j)] += g[j];
                        });
    return;
  }
#pragma omp parallel for schedule(static) if (planes * (pq + hw) > kParallelMin)
  for (int64_t i = 0; i < planes; ++i) {
    maxpool2d_gather_plane(dy + i * pq, dx + i * hw, s, [&](int64_t j) { return chosen(i, j); });
  }
}

// Max pooling of one plane: in (H, W) -> out (P, Q) and each output's plane index. D: the
// element type of in and out (T, or f32 for a widened 16-bit plane).
template <class D>
void maxpool2d_plane(const D* in, D* out, int32_t* argmax, const PoolShape& s) {
  for (int64_t p = 0; p < s.P; ++p) {
    D* best = out + p * s.Q;
    int32_t* best_at = argmax + p * s.Q;
    std::fill(best_at, best_at + s.Q, -1);
    std::fill(best, best + s.Q, D(0));
    int64_t h0, h1;
    window(p, s.stride_h, s.pad_h, s.kh, s.H, h0, h1);
    // Window elements in row-major order, each for a whole row of outputs at once: the q
    // iterations are independent, unlike a running max over one window. Padding never
    // competes; the first maximum wins ties; a NaN, once seen, is kept (as PyTorch).
    for (int64_t h = h0; h < h1; ++h) {
      const D* row = in + h * s.W;
      for (int64_t kw = 0; kw < s.kw; ++kw) {
        const int64_t shift = kw - s.pad_w;  // q reads row[q*sw + shift]
        const int64_t q_lo = shift >= 0 ? 0 : (-shift + s.stride_w - 1) / s.stride_w;
        const int64_t last = s.W - 1 - shift;
        const int64_t q_hi = last < 0 ? 0 : std::min<int64_t>(s.Q, last / s.stride_w + 1);
        for (int64_t q = q_lo; q < q_hi; ++q) {
          const int64_t at = q * s.stride_w + shift;
          const acc_t<D> v = row[at];
          const acc_t<D> b = best[q];
          const bool take = best_at[q] < 0 || v > b || (v != v && b == b);
          best[q] = D(take ? v : b);
          best_at[q] = take ? static_cast<int32_t>(h * s.W + at) : best_at[q];
        }
      }
    }
  }
}

// Average pooling of one plane (count_include_pad: the divisor is kh*kw). D as above.
template <class D>
void avgpool2d_plane(const D* in, D* out, const PoolShape& s) {
  const double inv = 1.0 / static_cast<double>(s.kh * s.kw);
  for (int64_t p = 0; p < s.P; ++p) {
    int64_t h0, h1;
    window(p, s.stride_h, s.pad_h, s.kh, s.H, h0, h1);
    for (int64_t q = 0; q < s.Q; ++q) {
      int64_t w0, w1;
      window(q, s.stride_w, s.pad_w, s.kw, s.W, w0, w1);
      double acc = 0;
      for (int64_t h = h0; h < h1; ++h) {
        for (int64_t w = w0; w < w1; ++w) acc += static_cast<double>(in[h * s.W + w]);
      }
      out[p * s.Q + q] = static_cast<D>(acc * inv);
    }
  }
}

// The backward of average pooling over one plane (f32 or f64): each output adds g = dy * inv to
// its window, outputs row by row. Never inlined, so the f32 kernel and a widened 16-bit plane run
// the same machine code: the compiler cannot fuse the multiply-add one way here and another there.
template <class D>
__attribute__((noinline)) void avgpool2d_scatter_plane(const D* dy, D* out, const PoolShape& s,
                                                       D inv) {
  std::fill(out, out + s.H * s.W, D(0));
  for (int64_t p = 0; p < s.P; ++p) {
    int64_t h0, h1;
    window(p, s.stride_h, s.pad_h, s.kh, s.H, h0, h1);
    for (int64_t q = 0; q < s.Q; ++q) {
      int64_t w0, w1;
      window(q, s.stride_w, s.pad_w, s.kw, s.W, w0, w1);
      const D g = dy[p * s.Q + q] * inv;
      for (int64_t h = h0; h < h1; ++h) {
        for (int64_t w = w0; w < w1; ++w) out[h * s.W + w] += g;
      }
    }
  }
}

// The 16-bit backward of average pooling over one plane, as a gather: input (h, w) adds
// g = dy * inv of the windows that hold it, in the order the f32 scatter adds them (outputs row by
// row), in f32. D: the element type of dy and dx (16 bits, or f32 for a widened plane).
template <class D>
void avgpool2d_gather_plane(const D* dy, D* dx, const PoolShape& s, float inv) {
  for (int64_t h = 0; h < s.H; ++h) {
    int64_t p0, p1;
    covering(h, s.stride_h, s.pad_h, s.kh, s.P, p0, p1);
    for (int64_t w = 0; w < s.W; ++w) {
      int64_t q0, q1;
      covering(w, s.stride_w, s.pad_w, s.kw, s.Q, q0, q1);
      float acc = 0.0f;
      for (int64_t p = p0; p < p1; ++p) {
        for (int64_t q = q0; q < q1; ++q) acc += static_cast<float>(dy[p * s.Q + q]) * inv;
      }
      dx[h * s.W + w] = D(acc);
    }
  }
}
}  // namespace

template <class T>
void maxpool2d_forward(const T* x, T* y, int32_t* argmax, const PoolShape& s) {
  const int64_t planes = s.N * s.C, hw = s.H * s.W, pq = s.P * s.Q;
  const int64_t work = planes * pq * s.kh * s.kw;
  if constexpr (is_half_v<T>) {
    if (plane_fits(s)) {
      over_widened_planes(x, hw, y, pq, planes, work, [&](int64_t i, const float* in, float* out) {
        maxpool2d_plane(in, out, argmax + i * pq, s);
      });
      return;
    }
  }
#pragma omp parallel for schedule(static) if (work > kParallelMin)
  for (int64_t i = 0; i < planes; ++i) maxpool2d_plane(x + i * hw, y + i * pq, argmax + i * pq, s);
}

template <class T>
void maxpool2d_backward(const T* dy, const int32_t* argmax, T* dx, const PoolShape& s) {
  if constexpr (is_half_v<T>) {
    const int64_t pq = s.P * s.Q;
    maxpool2d_backward_gather(dy, dx, s,
                              [&](int64_t i, int64_t j) -> int64_t { return argmax[i * pq + j]; });
  } else {
    const int64_t planes = s.N * s.C, hw = s.H * s.W, pq = s.P * s.Q;
#pragma omp parallel for schedule(static) if (planes * (pq + hw) > kParallelMin)
    for (int64_t i = 0; i < planes; ++i) {
      T* out = dx + i * hw;
      std::fill(out, out + hw, T(0));
      // Overlapping windows can pick the same element: add in output order.
      for (int64_t j = 0; j < pq; ++j) out[argmax[i * pq + j]] += dy[i * pq + j];
    }
  }
}

// One output at a time, visiting its window in the order the row-at-a-time loop above visits it
// (rows, then kernel columns), so the maximum and its position are the same bit for bit.
template <class T>
void maxpool2d_forward_packed(const T* x, T* y, uint32_t* codes, const PoolShape& s) {
  const int64_t planes = s.N * s.C, hw = s.H * s.W, pq = s.P * s.Q;
  const int bits = pool_code_bits(s);
  const int64_t per_word = 32 / bits, words = pool_code_words_per_plane(s);
#pragma omp parallel for schedule(static) if (planes * pq * s.kh * s.kw > kParallelMin)
  for (int64_t i = 0; i < planes; ++i) {
    const T* in = x + i * hw;
    for (int64_t wd = 0; wd < words; ++wd) {
      uint32_t word = 0;
      for (int64_t e = 0; e < per_word; ++e) {
        const int64_t j = wd * per_word + e;
        if (j >= pq) break;
        const int64_t p = j / s.Q, q = j % s.Q;
        const int64_t top = p * s.stride_h - s.pad_h, left = q * s.stride_w - s.pad_w;
        int64_t h0, h1, w0, w1;
        window(p, s.stride_h, s.pad_h, s.kh, s.H, h0, h1);
        window(q, s.stride_w, s.pad_w, s.kw, s.W, w0, w1);
        acc_t<T> best = 0;
        int64_t best_h = -1, best_w = -1;
        for (int64_t h = h0; h < h1; ++h) {
          for (int64_t w = w0; w < w1; ++w) {
            const acc_t<T> v = in[h * s.W + w];
            if (best_h < 0 || v > best || (v != v && best == best)) {
              best = v;
              best_h = h;
              best_w = w;
            }
          }
        }
        y[i * pq + j] = T(best);
        const uint32_t code = static_cast<uint32_t>((best_h - top) * s.kw + (best_w - left));
        word |= code << (e * bits);
      }
      codes[i * words + wd] = word;
    }
  }
}

template <class T>
void maxpool2d_backward_packed(const T* dy, const uint32_t* codes, T* dx, const PoolShape& s) {
  const int64_t planes = s.N * s.C, hw = s.H * s.W, pq = s.P * s.Q;
  const int bits = pool_code_bits(s);
  const int64_t per_word = 32 / bits, words = pool_code_words_per_plane(s);
  const uint32_t field = bits == 32 ? 0xffffffffu : (1u << bits) - 1u;
  if constexpr (is_half_v<T>) {
    maxpool2d_backward_gather(dy, dx, s, [&](int64_t i, int64_t j) -> int64_t {
      const uint32_t code = (codes[i * words + j / per_word] >> ((j % per_word) * bits)) & field;
      const int64_t p = j / s.Q, q = j % s.Q;
      const int64_t h = p * s.stride_h - s.pad_h + static_cast<int64_t>(code) / s.kw;
      const int64_t w = q * s.stride_w - s.pad_w + static_cast<int64_t>(code) % s.kw;
      return h * s.W + w;
    });
  } else {
#pragma omp parallel for schedule(static) if (planes * (pq + hw) > kParallelMin)
    for (int64_t i = 0; i < planes; ++i) {
      T* out = dx + i * hw;
      std::fill(out, out + hw, T(0));
      // In output order, as the argmax form adds.
      for (int64_t j = 0; j < pq; ++j) {
        const uint32_t code = (codes[i * words + j / per_word] >> ((j % per_word) * bits)) & field;
        const int64_t p = j / s.Q, q = j % s.Q;
        const int64_t h = p * s.stride_h - s.pad_h + static_cast<int64_t>(code) / s.kw;
        const int64_t w = q * s.stride_w - s.pad_w + static_cast<int64_t>(code) % s.kw;
        out[h * s.W + w] += dy[i * pq + j];
      }
    }
  }
}

template <class T>
void avgpool2d_forward(const T* x, T* y, const PoolShape& s) {
  const int64_t planes = s.N * s.C, hw = s.H * s.W, pq = s.P * s.Q;
  const int64_t work = planes * pq * s.kh * s.kw;
  if constexpr (is_half_v<T>) {
    if (plane_fits(s)) {
      over_widened_planes(x, hw, y, pq, planes, work, [&](int64_t, const float* in, float* out) {
        avgpool2d_plane(in, out, s);
      });
      return;
    }
  }
#pragma omp parallel for schedule(static) if (work > kParallelMin)
  for (int64_t i = 0; i < planes; ++i) avgpool2d_plane(x + i * hw, y + i * pq, s);
}

template <class T>
void avgpool2d_backward(const T* dy, T* dx, const PoolShape& s) {
  const int64_t planes = s.N * s.C, hw = s.H * s.W, pq = s.P * s.Q;
  const int64_t work = planes * pq * s.kh * s.kw;
  const acc_t<T> inv = static_cast<acc_t<T>>(1.0 / static_cast<double>(s.kh * s.kw));
  if constexpr (is_half_v<T>) {
    if (plane_fits(s)) {
      // The f32 kernel's own plane function on the widened plane, so the same bits.
      over_widened_planes(dy, pq, dx, hw, planes, work, [&](int64_t, const float* g, float* out) {
        avgpool2d_scatter_plane(g, out, s, inv);
      });
      return;
    }
    // Element by element: a larger plane does not fit the stack buffer.
#pragma omp parallel for schedule(static) if (work > kParallelMin)
    for (int64_t i = 0; i < planes; ++i) avgpool2d_gather_plane(dy + i * pq, dx + i * hw, s, inv);
  } else {
#pragma omp parallel for schedule(static) if (work > kParallelMin)
    for (int64_t i = 0; i < planes; ++i) avgpool2d_scatter_plane(dy + i * pq, dx + i * hw, s, inv);
  }
}

template <class T>
void global_avgpool_forward(const T* x, T* y, int64_t NC, int64_t HW) {
#pragma omp parallel for schedule(static) if (NC * HW > kParallelMin)
  for (int64_t i = 0; i < NC; ++i) {
    const T* in = x + i * HW;
    double acc = 0;
    if constexpr (is_half_v<T>) {
      lowp::for_blocks(in, HW, [&](int64_t, const float* v, int64_t len) {
        for (int64_t j = 0; j < len; ++j) acc += static_cast<double>(v[j]);
      });
    } else {
      for (int64_t j = 0; j < HW; ++j) acc += static_cast<double>(in[j]);
    }
    y[i] = static_cast<T>(HW > 0 ? acc / static_cast<double>(HW) : 0.0);
  }
}

template <class T>
void global_avgpool_backward(const T* dy, T* dx, int64_t NC, int64_t HW) {
  const double inv = HW > 0 ? 1.0 / static_cast<double>(HW) : 0.0;
#pragma omp parallel for schedule(static) if (NC * HW > kParallelMin)
  for (int64_t i = 0; i < NC; ++i) {
    const T g = static_cast<T>(static_cast<double>(dy[i]) * inv);
    std::fill(dx + i * HW, dx + (i + 1) * HW, g);
  }
}

#define REGEN_INSTANTIATE(T)                                                                   \
  template void maxpool2d_forward<T>(const T*, T*, int32_t*, const PoolShape&);                \
  template void maxpool2d_backward<T>(const T*, const int32_t*, T*, const PoolShape&);         \
  template void maxpool2d_forward_packed<T>(const T*, T*, uint32_t*, const PoolShape&);        \
  template void maxpool2d_backward_packed<T>(const T*, const uint32_t*, T*, const PoolShape&); \
  template void avgpool2d_forward<T>(const T*, T*, const PoolShape&);                          \
  template void avgpool2d_backward<T>(const T*, T*, const PoolShape&);                         \
  template void global_avgpool_forward<T>(const T*, T*, int64_t, int64_t);                     \
  template void global_avgpool_backward<T>(const T*, T*, int64_t, int64_t);
REGEN_INSTANTIATE(float)
REGEN_INSTANTIATE(double)
REGEN_INSTANTIATE(bfloat16)
REGEN_INSTANTIATE(float16)
#undef REGEN_INSTANTIATE

}  // namespace regen::cpu
