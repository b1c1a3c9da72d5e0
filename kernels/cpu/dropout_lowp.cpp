// CPU dropout on 16-bit tensors (bfloat16, float16): the launchers dropout_forward_lowp and
// dropout_backward_lowp, declared beside their op in autograd/ops_dropout.cpp. The mask is the one
// of kernels/kernels.h's dropout rule (element i kept iff philox_word(seed, stream, i) >= p *
// 2^32), drawn exactly as the f32 kernel draws it (kernels/cpu/philox_words.h's philox_words), so a
// 16-bit dropout keeps the same elements as the f32 one and each kept value is the f32 value x * (1
// / (1 - p)) rounded once. Blocks of kBlock elements are widened into an f32 buffer on the stack
// (kernels/cpu/convert.h), scaled and narrowed back. Tests: tests/test_amp_ops.cpp (against the f32
// op on the same rounded input).
#include <omp.h>

#include <algorithm>
#include <cstdint>

#include "regen/kernels/cpu/convert.h"
#include "regen/kernels/cpu/philox_words.h"
#include "regen/kernels/kernels.h"

namespace regen::cpu {
namespace {
constexpr int64_t kParallelMin = 1 << 15;  // below this, threads cost more than they save
constexpr int64_t kBlock = 512;            // elements per block: a multiple of 4 (Philox words)
}  // namespace

template <class T>
void dropout_forward_lowp(const T* x, T* y, int64_t n, float p, uint64_t seed, uint64_t stream) {
  static_assert(is_half_v<T>, "dropout_forward_lowp is the 16-bit path");
  const uint64_t threshold = dropout_threshold(p);
  const float keep_scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;  // as the f32 kernel's T(1)/(1-p)
  const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t i0 = b * kBlock, len = std::min(kBlock, n - i0);
    float buf[kBlock];
    uint32_t words[kBlock];
    convert::widen_span(x + i0, buf, len);
    philox_words(seed, stream, static_cast<uint64_t>(i0), len, words);
    apply_dropout_words(words, len, threshold, keep_scale, buf, buf);
    convert::narrow_span(buf, y + i0, len);
  }
}

template <class T>
void dropout_backward_lowp(const T* dy, T* dx, int64_t n, float p, uint64_t seed, uint64_t stream) {
  dropout_forward_lowp<T>(dy, dx, n, p, seed, stream);  // the same mask and scale
}

template void dropout_forward_lowp<bfloat16>(const bfloat16*, bfloat16*, int64_t, float, uint64_t,
                                             uint64_t);
template void dropout_forward_lowp<float16>(const float16*, float16*, int64_t, float, uint64_t,
                                            uint64_t);
template void dropout_backward_lowp<bfloat16>(const bfloat16*, bfloat16*, int64_t, float, uint64_t,
                                              uint64_t);
template void dropout_backward_lowp<float16>(const float16*, float16*, int64_t, float, uint64_t,
                                             uint64_t);

}  // namespace regen::cpu
