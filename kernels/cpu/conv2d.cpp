// CPU 2-D convolution (declared in kernels/kernels.h): forward, backward-data and
// backward-filter as GEMMs on cpu::gemm.
//
//   forward          y_n (K, PQ)    = w (K, CRS) * col_n (CRS, PQ)          (+ bias)
//   backward-data    dcol_n (CRS, PQ) = w^T (CRS, K) * dy_n (K, PQ), then col2im into dx_n
//   backward-filter  dw (K, CRS)   += dy_n (K, PQ) * col_n^T (PQ, CRS)       over all images
//
// A 1x1, stride-1, unpadded convolution needs no column matrix: x_n is col_n. Everything else
// unfolds the input (im2col) into a Workspace. Work is cut into tiles whose size depends only on
// the shape (never on the thread count or on timing), so the workspace requested is the same on
// every run and the memory simulator can predict it:
//   - small output planes (ResNet's 14x14 and 7x7 stages) put several images side by side in one
//     wide column matrix, so each GEMM has enough columns to run at full speed;
//   - a single image whose column matrix would pass kWorkspaceBudget is cut into bands of output
//     rows.
// Sums run in a fixed order (GEMM accumulation over tiles in image order, col2im per channel by
// one thread, bias gradients per output channel), so results are deterministic for a given thread
// count. Tests: tests/test_ops_vision.cpp (against nested loops), tests/test_gradcheck_vision.cpp.
#include <omp.h>

#include <algorithm>
#include <cstring>

#include "core/tensor.h"
#include "kernels/kernels.h"

namespace regen::cpu {
namespace {

constexpr uint64_t kWorkspaceBudget = 64ull << 20;  // column matrix (+ staging) bytes per call
constexpr int64_t kTargetCols = 1024;      // below this many output pixels, batch images per GEMM
constexpr int64_t kParallelMin = 1 << 14;  // elements; below this im2col runs on one thread

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// How one launcher call walks the batch. A tile is `images` whole images, or (when images == 1)
// output rows [p0, p0 + rows) of one image.
struct Tiling {
  int64_t images = 1;
  int64_t rows = 0;
  bool direct = false;      // 1x1/stride 1/no padding, one image per tile: GEMM on x, dx directly
  int64_t col_elems = 0;    // workspace elements of the column matrix
  int64_t stage_elems = 0;  // workspace elements of the (K, images*PQ) staging matrix
};

Tiling plan_tiles(const ConvShape& s, size_t elem) {
  Tiling t;
  const int64_t crs = s.C * s.R * s.S, pq = s.P * s.Q;
  const bool pointwise =
      s.R == 1 && s.S == 1 && s.stride_h == 1 && s.stride_w == 1 && s.pad_h == 0 && s.pad_w == 0;
  if (pq < kTargetCols && s.N > 1) {
    // As few groups as reach kTargetCols columns, then spread the images evenly over them so no
    // group is left with a narrow remainder.
    const int64_t want = std::min<int64_t>(s.N, ceil_div(kTargetCols, pq));
    const int64_t per_image = static_cast<int64_t>(elem) * (crs + s.K) * pq;
    const int64_t fit = std::max<int64_t>(1, static_cast<int64_t>(kWorkspaceBudget) / per_image);
    const int64_t groups = ceil_div(s.N, std::min(want, fit));
    t.images = ceil_div(s.N, groups);
  }
  t.rows = s.P;
  if (t.images == 1) {
    t.direct = pointwise;
    const int64_t row_bytes = static_cast<int64_t>(elem) * crs * s.Q;
    if (!t.direct) {
      t.rows = std::clamp<int64_t>(
          static_cast<int64_t>(kWorkspaceBudget) / std::max<int64_t>(row_bytes, 1), 1, s.P);
    }
  }
  t.col_elems = t.direct ? 0 : crs * t.images * t.rows * s.Q;
  t.stage_elems = t.images > 1 ? s.K * t.images * pq : 0;
  return t;
}

// Valid q of kernel column `ks`: 0 <= q*stride_w - pad_w + ks < W.
void valid_q(const ConvShape& s, int64_t ks, int64_t& q_lo, int64_t& q_hi) {
  const int64_t first = s.pad_w - ks;  // q*stride_w >= first
  q_lo = first <= 0 ? 0 : ceil_div(first, s.stride_w);
  const int64_t last = s.W - 1 + s.pad_w - ks;  // q*stride_w <= last
  q_hi = last < 0 ? 0 : std::min<int64_t>(s.Q, last / s.stride_w + 1);
  q_lo = std::min(q_lo, q_hi);
}

// col rows (c, r, ks), columns (p - p0, q) for output rows [p0, p1) of image x: (C, H, W).
// Row i starts at col + i*ld. Padding reads as zero.
template <class T>
void im2col(const T* x, T* col, int64_t ld, int64_t p0, int64_t p1, const ConvShape& s) {
  const int64_t rows = s.C * s.R * s.S, RS = s.R * s.S;
#pragma omp parallel for schedule(static) if (rows * (p1 - p0) * s.Q > kParallelMin)
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t c = row / RS, r = (row / s.S) % s.R, ks = row % s.S;
    const T* plane = x + c * s.H * s.W;
    T* out = col + row * ld;
    int64_t q_lo, q_hi;
    valid_q(s, ks, q_lo, q_hi);
    for (int64_t p = p0; p < p1; ++p, out += s.Q) {
      const int64_t ih = p * s.stride_h - s.pad_h + r;
      if (ih < 0 || ih >= s.H) {
        std::fill(out, out + s.Q, T(0));
        continue;
      }
      const int64_t base = ih * s.W - s.pad_w + ks;  // input index of q = 0
      std::fill(out, out + q_lo, T(0));
      if (s.stride_w == 1) {
        if (q_hi > q_lo) std::memcpy(out + q_lo, plane + base + q_lo, (q_hi - q_lo) * sizeof(T));
      } else {
        for (int64_t q = q_lo; q < q_hi; ++q) out[q] = plane[base + q * s.stride_w];
      }
      std::fill(out + q_hi, out + s.Q, T(0));
    }
  }
}

// dx (C, H, W) += the columns of output rows [p0, p1) folded back (the adjoint of im2col).
// Each channel is summed by one thread in (r, ks, p, q) order: deterministic for any thread count.
template <class T>
void col2im(const T* col, int64_t ld, int64_t p0, int64_t p1, T* dx, const ConvShape& s) {
#pragma omp parallel for schedule(static) if (s.C * s.R * s.S * (p1 - p0) * s.Q > kParallelMin)
  for (int64_t c = 0; c < s.C; ++c) {
    T* plane = dx + c * s.H * s.W;
    for (int64_t r = 0; r < s.R; ++r) {
      for (int64_t ks = 0; ks < s.S; ++ks) {
        const T* in = col + ((c * s.R + r) * s.S + ks) * ld;
        int64_t q_lo, q_hi;
        valid_q(s, ks, q_lo, q_hi);
        for (int64_t p = p0; p < p1; ++p, in += s.Q) {
          const int64_t ih = p * s.stride_h - s.pad_h + r;
          if (ih < 0 || ih >= s.H) continue;
          T* dst = plane + ih * s.W - s.pad_w + ks;
          if (s.stride_w == 1) {
            for (int64_t q = q_lo; q < q_hi; ++q) dst[q] += in[q];
          } else {
            for (int64_t q = q_lo; q < q_hi; ++q) dst[q * s.stride_w] += in[q];
          }
        }
      }
    }
  }
}

// Staging for a group of images: dst (K, n*PQ) <- src (n, K, PQ), or the reverse.
template <class T>
void gather_group(const T* src, T* dst, int64_t n, int64_t K, int64_t pq) {
#pragma omp parallel for schedule(static) if (n * K * pq > kParallelMin)
  for (int64_t k = 0; k < K; ++k) {
    for (int64_t i = 0; i < n; ++i) {
      std::memcpy(dst + (k * n + i) * pq, src + (i * K + k) * pq, pq * sizeof(T));
    }
  }
}

// y (n, K, PQ) <- stage (K, n*PQ) + bias[k].
template <class T>
void scatter_group(const T* stage, const T* bias, T* y, int64_t n, int64_t K, int64_t pq) {
#pragma omp parallel for schedule(static) if (n * K * pq > kParallelMin)
  for (int64_t k = 0; k < K; ++k) {
    const T b = bias ? bias[k] : T(0);
    for (int64_t i = 0; i < n; ++i) {
      const T* in = stage + (k * n + i) * pq;
      T* out = y + (i * K + k) * pq;
      for (int64_t j = 0; j < pq; ++j) out[j] = in[j] + b;
    }
  }
}

// Output rows [p0, p1) of y_n (K, PQ) set to bias[k].
template <class T>
void fill_bias(T* y, const T* bias, int64_t p0, int64_t p1, const ConvShape& s) {
  const int64_t pq = s.P * s.Q;
#pragma omp parallel for schedule(static) if (s.K * (p1 - p0) * s.Q > kParallelMin)
  for (int64_t k = 0; k < s.K; ++k) {
    std::fill(y + k * pq + p0 * s.Q, y + k * pq + p1 * s.Q, bias[k]);
  }
}

}  // namespace

template <class T>
void conv2d_forward(const T* x, const T* w, const T* bias, T* y, const ConvShape& s) {
  const Tiling t = plan_tiles(s, sizeof(T));
  const int64_t crs = s.C * s.R * s.S, pq = s.P * s.Q, chw = s.C * s.H * s.W;
  Workspace ws(Device::cpu(), static_cast<uint64_t>(t.col_elems + t.stage_elems) * sizeof(T));
  T* col = ws.as<T>();
  T* stage = col + t.col_elems;
  for (int64_t n0 = 0; n0 < s.N; n0 += t.images) {
    const int64_t ng = std::min(t.images, s.N - n0);
    if (ng > 1) {
      const int64_t ld = ng * pq;
      for (int64_t i = 0; i < ng; ++i) im2col(x + (n0 + i) * chw, col + i * pq, ld, 0, s.P, s);
      gemm<T>(false, false, s.K, ld, crs, T(1), w, crs, col, ld, T(0), stage, ld);
      scatter_group(stage, bias, y + n0 * s.K * pq, ng, s.K, pq);
      continue;
    }
    T* yn = y + n0 * s.K * pq;
    for (int64_t p0 = 0; p0 < s.P; p0 += t.rows) {
      const int64_t p1 = std::min(s.P, p0 + t.rows), cols = (p1 - p0) * s.Q;
      if (bias) fill_bias(yn, bias, p0, p1, s);
      const T beta = bias ? T(1) : T(0);
      if (t.direct) {
        gemm<T>(false, false, s.K, pq, crs, T(1), w, crs, x + n0 * chw, pq, beta, yn, pq);
      } else {
        im2col(x + n0 * chw, col, cols, p0, p1, s);
        gemm<T>(false, false, s.K, cols, crs, T(1), w, crs, col, cols, beta, yn + p0 * s.Q, pq);
      }
    }
  }
}

template <class T>
void conv2d_backward_data(const T* dy, const T* w, T* dx, const ConvShape& s) {
  const Tiling t = plan_tiles(s, sizeof(T));
  const int64_t crs = s.C * s.R * s.S, pq = s.P * s.Q, chw = s.C * s.H * s.W;
  if (!t.direct) fill<T>(dx, s.N * chw, T(0));  // col2im accumulates
  Workspace ws(Device::cpu(), static_cast<uint64_t>(t.col_elems + t.stage_elems) * sizeof(T));
  T* col = ws.as<T>();
  T* stage = col + t.col_elems;
  for (int64_t n0 = 0; n0 < s.N; n0 += t.images) {
    const int64_t ng = std::min(t.images, s.N - n0);
    if (ng > 1) {
      const int64_t ld = ng * pq;
      gather_group(dy + n0 * s.K * pq, stage, ng, s.K, pq);
      gemm<T>(true, false, crs, ld, s.K, T(1), w, crs, stage, ld, T(0), col, ld);
      for (int64_t i = 0; i < ng; ++i) col2im(col + i * pq, ld, 0, s.P, dx + (n0 + i) * chw, s);
      continue;
    }
    const T* dyn = dy + n0 * s.K * pq;
    if (t.direct) {
      gemm<T>(true, false, s.C, pq, s.K, T(1), w, s.C, dyn, pq, T(0), dx + n0 * chw, pq);
      continue;
    }
    for (int64_t p0 = 0; p0 < s.P; p0 += t.rows) {
      const int64_t p1 = std::min(s.P, p0 + t.rows), cols = (p1 - p0) * s.Q;
      gemm<T>(true, false, crs, cols, s.K, T(1), w, crs, dyn + p0 * s.Q, pq, T(0), col, cols);
      col2im(col, cols, p0, p1, dx + n0 * chw, s);
    }
  }
}

template <class T>
void conv2d_backward_filter(const T* x, const T* dy, T* dw, T* dbias, const ConvShape& s) {
  const Tiling t = plan_tiles(s, sizeof(T));
  const int64_t crs = s.C * s.R * s.S, pq = s.P * s.Q, chw = s.C * s.H * s.W;
  if (dbias) {
    // Per output channel, images in order, in double: deterministic and accurate.
#pragma omp parallel for schedule(static) if (s.N * s.K * pq > kParallelMin)
    for (int64_t k = 0; k < s.K; ++k) {
      double acc = 0;
      for (int64_t n = 0; n < s.N; ++n) {
        const T* row = dy + (n * s.K + k) * pq;
        for (int64_t j = 0; j < pq; ++j) acc += static_cast<double>(row[j]);
      }
      dbias[k] = static_cast<T>(acc);
    }
  }
  if (s.N == 0) {
    fill<T>(dw, s.K * crs, T(0));
    return;
  }
  Workspace ws(Device::cpu(), static_cast<uint64_t>(t.col_elems + t.stage_elems) * sizeof(T));
  T* col = ws.as<T>();
  T* stage = col + t.col_elems;
  T beta = T(0);  // the first tile writes dw, later ones accumulate
  for (int64_t n0 = 0; n0 < s.N; n0 += t.images) {
    const int64_t ng = std::min(t.images, s.N - n0);
    if (ng > 1) {
      const int64_t ld = ng * pq;
      for (int64_t i = 0; i < ng; ++i) im2col(x + (n0 + i) * chw, col + i * pq, ld, 0, s.P, s);
      gather_group(dy + n0 * s.K * pq, stage, ng, s.K, pq);
      gemm<T>(false, true, s.K, crs, ld, T(1), stage, ld, col, ld, beta, dw, crs);
      beta = T(1);
      continue;
    }
    const T* dyn = dy + n0 * s.K * pq;
    if (t.direct) {
      gemm<T>(false, true, s.K, crs, pq, T(1), dyn, pq, x + n0 * chw, pq, beta, dw, crs);
      beta = T(1);
      continue;
    }
    for (int64_t p0 = 0; p0 < s.P; p0 += t.rows) {
      const int64_t p1 = std::min(s.P, p0 + t.rows), cols = (p1 - p0) * s.Q;
      im2col(x + n0 * chw, col, cols, p0, p1, s);
      gemm<T>(false, true, s.K, crs, cols, T(1), dyn + p0 * s.Q, pq, col, cols, beta, dw, crs);
      beta = T(1);
    }
  }
}

#define REGEN_INSTANTIATE(T)                                                           \
  template void conv2d_forward<T>(const T*, const T*, const T*, T*, const ConvShape&); \
  template void conv2d_backward_data<T>(const T*, const T*, T*, const ConvShape&);     \
  template void conv2d_backward_filter<T>(const T*, const T*, T*, T*, const ConvShape&);
REGEN_INSTANTIATE(float)
REGEN_INSTANTIATE(double)
#undef REGEN_INSTANTIATE

}  // namespace regen::cpu
