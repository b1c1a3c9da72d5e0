// The array conversions of kernels/cpu/convert.h: the span functions there, over chunks of a fixed
// size split among the OpenMP threads. Each element's result depends on that element alone, so
// the chunking changes no bit. Tests: tests/test_lowp_kernels.cpp.
#include "regen/kernels/cpu/convert.h"

#include <omp.h>

#include <algorithm>

#include "regen/core/dry_run.h"

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

}  // namespace regen::cpu
