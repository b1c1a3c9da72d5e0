// The array conversions of kernels/cpu/convert.h: the span functions there, over chunks of a fixed
// size split among the OpenMP threads. Each element's result depends on that element alone, so
// the chunking changes no bit. Tests: tests/test_lowp_kernels.cpp.
#include "regen/kernels/cpu/convert.h"

#include <omp.h>

#include <algorithm>
#include <cstring>

#include "regen/core/dry_run.h"
#include "regen/core/error.h"

namespace regen::cpu {
namespace {
// Conversions move 6 bytes per element and compute little: below a few hundred KiB a parallel
// region costs more than it saves.
constexpr int64_t kParallelMin = 1 << 16;
constexpr int64_t kChunk = 1 << 13;  // elements per task (48 KiB of input and output)

template <class Src, class Dst>
void convert_array(const Src* x, Dst* y, int64_t n, void (*span)(const Src*, Dst*, int64_t)) {
  if (n <= 0 || dry_run_active()) return;  // the dry path: no scratch, no data
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t lo = c * kChunk;
    span(x + lo, y + lo, std::min(kChunk, n - lo));
  }
}
}  // namespace

void narrow(const float* x, bfloat16* y, int64_t n) {
  convert_array<float, bfloat16>(x, y, n, convert::narrow_span);
}
void narrow(const float* x, float16* y, int64_t n) {
  convert_array<float, float16>(x, y, n, convert::narrow_span);
}
void widen(const bfloat16* x, float* y, int64_t n) {
  convert_array<bfloat16, float>(x, y, n, convert::widen_span);
}
void widen(const float16* x, float* y, int64_t n) {
  convert_array<float16, float>(x, y, n, convert::widen_span);
}

namespace {
// Elements [0, n) of x (dtype `from`, not f32) widened (or, from f64, rounded) to f32.
void to_f32(DType from, const void* x, float* y, int64_t n) {
  switch (from) {
    case DType::bf16:
      convert::widen_span(static_cast<const bfloat16*>(x), y, n);
      return;
    case DType::f16:
      convert::widen_span(static_cast<const float16*>(x), y, n);
      return;
    default: {
      const double* d = static_cast<const double*>(x);
      for (int64_t i = 0; i < n; ++i) y[i] = static_cast<float>(d[i]);
    }
  }
}
// Elements [0, n) of f32 x stored as `to` (not f32).
void from_f32(const float* x, DType to, void* y, int64_t n) {
  switch (to) {
    case DType::bf16:
      convert::narrow_span(x, static_cast<bfloat16*>(y), n);
      return;
    case DType::f16:
      convert::narrow_span(x, static_cast<float16*>(y), n);
      return;
    default: {
      double* d = static_cast<double*>(y);
      for (int64_t i = 0; i < n; ++i) d[i] = static_cast<double>(x[i]);
    }
  }
}
bool castable(DType d) {
  return d == DType::f32 || d == DType::f64 || d == DType::bf16 || d == DType::f16;
}
}  // namespace

void cast(const void* x, DType from, void* y, DType to, int64_t n) {
  REGEN_CHECK(castable(from) && castable(to), "cast: from ", dtype_name(from), " to ",
              dtype_name(to), " (casts are between f32, f64, bf16 and f16)");
  if (n <= 0 || dry_run_active()) return;
  const size_t from_size = dtype_size(from), to_size = dtype_size(to);
  if (from == to) {
    std::memcpy(y, x, static_cast<size_t>(n) * from_size);
    return;
  }
  constexpr int64_t kCastChunk = 2048;  // elements per step: the f32 stage stays in L1
  const int64_t chunks = (n + kCastChunk - 1) / kCastChunk;
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t lo = c * kCastChunk, len = std::min(kCastChunk, n - lo);
    const void* src = static_cast<const char*>(x) + static_cast<size_t>(lo) * from_size;
    void* dst = static_cast<char*>(y) + static_cast<size_t>(lo) * to_size;
    float stage[kCastChunk];
    const float* wide = static_cast<const float*>(src);
    if (from != DType::f32) {
      float* into = to == DType::f32 ? static_cast<float*>(dst) : stage;
      to_f32(from, src, into, len);
      wide = into;
    }
    if (to != DType::f32) from_f32(wide, to, dst, len);
  }
}

}  // namespace regen::cpu
