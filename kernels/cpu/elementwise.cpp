// CPU element-wise kernels and reductions (declared in kernels/kernels.h). Reductions are summed
// in fixed chunks and then in order, so results do not depend on the thread count.
// Tests: tests/test_kernels_cpu.cpp; the CUDA versions are in kernels/cuda/elementwise.cu.
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "regen/core/philox.h"
#include "regen/core/tensor.h"
#include "regen/kernels/cpu/philox_words.h"
#include "regen/kernels/kernels.h"

namespace regen::cpu {
namespace {
constexpr int64_t kParallelMin = 1 << 15;  // below this, threads cost more than they save
constexpr int64_t kChunk = 4096;           // reduction chunk (fixed: thread-count independent)
}  // namespace

template <class T>
void fill(T* y, int64_t n, T value) {
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) y[i] = value;
}

template <class T>
void copy(const T* x, T* y, int64_t n) {
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) y[i] = x[i];
}

// The 16-bit element types (core/half.h) compute in acc_t<T> (f32): each element is widened, the
// arithmetic done in f32, and the result rounded once as it is stored. For f32 and f64 the casts
// are no-ops.
template <class T>
inline acc_t<T> wide(T v) {
  return static_cast<acc_t<T>>(v);
}

template <class T>
void add(const T* a, const T* b, T* y, int64_t n, int64_t nb) {
  if (nb == n) {
#pragma omp parallel for schedule(static) if (n > kParallelMin)
    for (int64_t i = 0; i < n; ++i) y[i] = T(wide(a[i]) + wide(b[i]));
    return;
  }
  const int64_t rows = n / nb;
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    const T* ar = a + r * nb;
    T* yr = y + r * nb;
    for (int64_t j = 0; j < nb; ++j) yr[j] = T(wide(ar[j]) + wide(b[j]));
  }
}

template <class T>
void add_inplace(T* y, const T* x, int64_t n) {
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) y[i] = T(wide(y[i]) + wide(x[i]));
}

template <class T>
void mul(const T* a, const T* b, T* y, int64_t n, int64_t nb) {
  if (nb == n) {
#pragma omp parallel for schedule(static) if (n > kParallelMin)
    for (int64_t i = 0; i < n; ++i) y[i] = T(wide(a[i]) * wide(b[i]));
    return;
  }
  const int64_t rows = n / nb;
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    const T* ar = a + r * nb;
    T* yr = y + r * nb;
    for (int64_t j = 0; j < nb; ++j) yr[j] = T(wide(ar[j]) * wide(b[j]));
  }
}

template <class T>
void scale(const T* x, T* y, int64_t n, T alpha) {
  const acc_t<T> a = wide(alpha);
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) y[i] = T(a * wide(x[i]));
}

template <class T>
void scale_f32(const T* x, T* y, int64_t n, float alpha) {
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) y[i] = T(alpha * static_cast<float>(x[i]));
}

template <class T>
void fill_from_scalar_f32(const T* s, T* y, int64_t n, float alpha) {
  fill<T>(y, n, T(alpha * static_cast<float>(s[0])));
}

template <class T>
void fill_from_scalar(const T* s, T* y, int64_t n, T alpha) {
  fill<T>(y, n, T(wide(alpha) * wide(s[0])));
}

// A sum kept in double, stored as T: for the 16-bit types through f32 (double -> f32 -> 16 bits
// can differ from one rounding only when the f32 value is a tie of the 16-bit format, far below
// the 16-bit roundoff that a sum of 16-bit terms carries anyway).
template <class T>
T round_from_double(double v) {
  return T(static_cast<acc_t<T>>(v));
}

template <class T>
void sum_rows(const T* x, T* y, int64_t rows, int64_t cols) {
  // Each column is summed over rows in order by one thread: deterministic for any thread count.
  const int64_t blocks = (cols + 63) / 64;
#pragma omp parallel for schedule(static) if (rows * cols > kParallelMin)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t c0 = b * 64, c1 = std::min(cols, c0 + 64);
    double acc[64] = {0};
    for (int64_t r = 0; r < rows; ++r) {
      const T* row = x + r * cols;
      for (int64_t c = c0; c < c1; ++c) acc[c - c0] += static_cast<double>(row[c]);
    }
    for (int64_t c = c0; c < c1; ++c) y[c] = round_from_double<T>(acc[c - c0]);
  }
}

namespace {
// One term of a sum (sum_all) or of a sum of squares (sum_squares), in double.
template <bool Square, class T>
double term(T v) {
  const double d = static_cast<double>(v);
  return Square ? d * d : d;
}
template <class T, bool Square>
void reduce_all(const T* x, T* y, int64_t n) {
  if (n <= kChunk) {               // one chunk: no scratch
    if (dry_run_active()) return;  // nothing to request
    double acc = 0;
    for (int64_t i = 0; i < n; ++i) acc += term<Square>(x[i]);
    y[0] = round_from_double<T>(acc);
    return;
  }
  // One partial sum per chunk, in workspace from the allocator (taken before the parallel region,
  // so the allocator sees the same request order for any thread count).
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  Workspace ws(Device::cpu(), static_cast<uint64_t>(chunks) * sizeof(double));
  if (dry_run_active()) return;  // the dry path (kernels.h): the scratch, requested and unused
  double* partial = ws.as<double>();
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t lo = c * kChunk, hi = std::min(n, lo + kChunk);
    double acc = 0;
    for (int64_t i = lo; i < hi; ++i) acc += term<Square>(x[i]);
    partial[c] = acc;
  }
  double total = 0;
  for (int64_t c = 0; c < chunks; ++c) total += partial[c];
  y[0] = round_from_double<T>(total);
}

}  // namespace

template <class T>
void sum_all(const T* x, T* y, int64_t n) {
  reduce_all<T, false>(x, y, n);
}

template <class T>
void sum_squares(const T* x, T* y, int64_t n) {
  reduce_all<T, true>(x, y, n);
}

// Element i is kept iff philox_word(seed, stream, i) >= threshold (the CUDA kernel draws the same
// words, one Philox block per thread: masks agree bit for bit). The words come kDropoutRun at a
// time from philox_words (kernels/cpu/philox_words.h) into an array, and apply_dropout_words (the
// same header) applies them in a loop GCC vectorizes.
constexpr int64_t kDropoutRun = 256;
template <class T>
void dropout_forward(const T* x, T* y, int64_t n, float p, uint64_t seed, uint64_t stream) {
  const uint64_t threshold = dropout_threshold(p);
  if (threshold > 0xFFFFFFFFull) {  // p >= 1: no word reaches it, every element is dropped
    fill<T>(y, n, T(0));
    return;
  }
  const T keep_scale = p < 1.0f ? T(1) / (T(1) - static_cast<T>(p)) : T(0);
  const int64_t runs = (n + kDropoutRun - 1) / kDropoutRun;
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t r = 0; r < runs; ++r) {
    const int64_t i0 = r * kDropoutRun, len = std::min(kDropoutRun, n - i0);
    uint32_t words[kDropoutRun];
    philox_words(seed, stream, static_cast<uint64_t>(i0), len, words);
    apply_dropout_words(words, len, threshold, keep_scale, x + i0, y + i0);
  }
}

template <class T>
void dropout_backward(const T* dy, T* dx, int64_t n, float p, uint64_t seed, uint64_t stream) {
  dropout_forward<T>(dy, dx, n, p, seed, stream);  // the same mask and scale
}

template <class T>
void permute(const T* x, T* y, const PermuteShape& s) {
  const int nd = s.ndim;
  int64_t in_stride[6], out_shape[6], src_stride[6];
  int64_t acc = 1;
  for (int d = nd - 1; d >= 0; --d) {
    in_stride[d] = acc;
    acc *= s.shape[d];
  }
  const int64_t n = acc;
  for (int d = 0; d < nd; ++d) {
    out_shape[d] = s.shape[s.perm[d]];
    src_stride[d] = in_stride[s.perm[d]];
  }
  const int64_t inner = nd > 0 ? out_shape[nd - 1] : 1;
  const int64_t inner_stride = nd > 0 ? src_stride[nd - 1] : 1;
  const int64_t outer = inner > 0 ? n / inner : 0;
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t o = 0; o < outer; ++o) {
    int64_t rem = o, off = 0;
    for (int d = nd - 2; d >= 0; --d) {
      off += (rem % out_shape[d]) * src_stride[d];
      rem /= out_shape[d];
    }
    T* dst = y + o * inner;
    for (int64_t j = 0; j < inner; ++j) dst[j] = x[off + j * inner_stride];
  }
}

template <class T>
void narrow_to_half(const T* x, uint16_t* y, int64_t n, Compression c) {
  static_assert(std::is_same<T, float>::value, "saved activations narrow from f32");
  REGEN_CHECK(c != Compression::none, "narrow_to_half: no 16-bit format given");
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) y[i] = half::narrow(x[i], c);
}

template <class T>
void widen_from_half(const uint16_t* x, T* y, int64_t n, Compression c) {
  static_assert(std::is_same<T, float>::value, "saved activations widen to f32");
  REGEN_CHECK(c != Compression::none, "widen_from_half: no 16-bit format given");
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) y[i] = half::widen(x[i], c);
}
template void narrow_to_half<float>(const float*, uint16_t*, int64_t, Compression);
template void widen_from_half<float>(const uint16_t*, float*, int64_t, Compression);

// Every floating type: the kernels of add, mul, scale, sum and mean (forward and backward), the
// gradient accumulation of the autograd engine, and the copies of the shape ops (permute).
#define REGEN_INSTANTIATE_ANY(T)                                  \
  template void fill<T>(T*, int64_t, T);                          \
  template void copy<T>(const T*, T*, int64_t);                   \
  template void add<T>(const T*, const T*, T*, int64_t, int64_t); \
  template void add_inplace<T>(T*, const T*, int64_t);            \
  template void mul<T>(const T*, const T*, T*, int64_t, int64_t); \
  template void scale<T>(const T*, T*, int64_t, T);               \
  template void fill_from_scalar<T>(const T*, T*, int64_t, T);    \
  template void sum_rows<T>(const T*, T*, int64_t, int64_t);      \
  template void sum_all<T>(const T*, T*, int64_t);                \
  template void sum_squares<T>(const T*, T*, int64_t);            \
  template void permute<T>(const T*, T*, const PermuteShape&);
// f32 and f64: dropout too (the 16-bit dropout is kernels/cpu/dropout_lowp.cpp).
#define REGEN_INSTANTIATE(T)                                                          \
  REGEN_INSTANTIATE_ANY(T)                                                            \
  template void dropout_forward<T>(const T*, T*, int64_t, float, uint64_t, uint64_t); \
  template void dropout_backward<T>(const T*, T*, int64_t, float, uint64_t, uint64_t);
REGEN_INSTANTIATE(float)
REGEN_INSTANTIATE(double)
#undef REGEN_INSTANTIATE

// The 16-bit types: factors in f32 too (scale_f32, fill_from_scalar_f32).
#define REGEN_INSTANTIATE_HALF(T)                           \
  REGEN_INSTANTIATE_ANY(T)                                  \
  template void scale_f32<T>(const T*, T*, int64_t, float); \
  template void fill_from_scalar_f32<T>(const T*, T*, int64_t, float);
REGEN_INSTANTIATE_HALF(bfloat16)
REGEN_INSTANTIATE_HALF(float16)
#undef REGEN_INSTANTIATE_HALF
#undef REGEN_INSTANTIATE_ANY

}  // namespace regen::cpu
