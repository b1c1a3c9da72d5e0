// CPU embedding lookup and its dense gradient (declared in kernels/kernels.h).
// Ids are validated before any thread starts, so a bad id throws from the calling thread.
// A 16-bit table (bfloat16, float16) gathers its rows exactly; its gradient adds each token's row
// in f32 and rounds after each add (a row used by k tokens is rounded k times; a table's gradient
// is normally an f32 master weight's, where this does not arise). Tests:
// tests/test_gradcheck_nlp.cpp (gradient), tests/test_ops_nlp.cpp (errors, values),
// tests/test_amp_ops.cpp (16-bit).
#include <omp.h>

#include <algorithm>

#include "regen/core/error.h"
#include "regen/kernels/cpu/convert.h"
#include "regen/kernels/kernels.h"

namespace regen::cpu {
namespace {
constexpr int64_t kParallelMin = 1 << 15;  // elements below which one thread is faster
constexpr int64_t kColumnBlock = 64;       // columns one backward task owns

void check_ids(const int64_t* ids, int64_t n, int64_t V) {
  for (int64_t i = 0; i < n; ++i) {
    REGEN_CHECK(ids[i] >= 0 && ids[i] < V, "embedding: id ", ids[i], " at position ", i,
                " is out of range for a table of V = ", V, " rows");
  }
}
}  // namespace

template <class T>
void embedding_forward(const T* weight, const int64_t* ids, T* y, int64_t n, int64_t V, int64_t D) {
  check_ids(ids, n, V);
#pragma omp parallel for schedule(static) if (n * D > kParallelMin)
  for (int64_t i = 0; i < n; ++i)
    std::copy(weight + ids[i] * D, weight + (ids[i] + 1) * D, y + i * D);
}

template <class T>
void embedding_backward(const T* dy, const int64_t* ids, T* dweight, int64_t n, int64_t V,
                        int64_t D) {
  check_ids(ids, n, V);
  std::fill(dweight, dweight + V * D, T(0));
  // Each task owns a block of columns and adds the rows in token order, so a row used by several
  // tokens sums them in the same order for any thread count.
  const int64_t blocks = (D + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static) if (n * D > kParallelMin && blocks > 1)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t c0 = b * kColumnBlock, c1 = std::min(D, c0 + kColumnBlock);
    for (int64_t i = 0; i < n; ++i) {
      const T* src = dy + i * D;
      T* dst = dweight + ids[i] * D;
      if constexpr (is_half_v<T>) {
        // Widened, added and narrowed 64 columns at a time (kernels/cpu/convert.h): the bits of
        // T(float(dst) + float(src)) per element.
        float a[kColumnBlock], g[kColumnBlock];
        convert::widen_span(dst + c0, a, c1 - c0);
        convert::widen_span(src + c0, g, c1 - c0);
        for (int64_t c = 0; c < c1 - c0; ++c) a[c] += g[c];
        convert::narrow_span(a, dst + c0, c1 - c0);
      } else {
        for (int64_t c = c0; c < c1; ++c) dst[c] += src[c];
      }
    }
  }
}

#define REGEN_INSTANTIATE(T)                                                                   \
  template void embedding_forward<T>(const T*, const int64_t*, T*, int64_t, int64_t, int64_t); \
  template void embedding_backward<T>(const T*, const int64_t*, T*, int64_t, int64_t, int64_t);
REGEN_INSTANTIATE(bfloat16)
REGEN_INSTANTIATE(float16)
#undef REGEN_INSTANTIATE

template void embedding_forward<float>(const float*, const int64_t*, float*, int64_t, int64_t,
                                       int64_t);
template void embedding_forward<double>(const double*, const int64_t*, double*, int64_t, int64_t,
                                        int64_t);
template void embedding_backward<float>(const float*, const int64_t*, float*, int64_t, int64_t,
                                        int64_t);
template void embedding_backward<double>(const double*, const int64_t*, double*, int64_t, int64_t,
                                         int64_t);

}  // namespace regen::cpu
