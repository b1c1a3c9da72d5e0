// CUDA slice copy (declared in kernels/cuda/cuda_kernels.h; CPU reference kernels/cpu/slice.cpp;
// test tests/cuda/test_cuda_ops.cpp): the kernel behind concat, split and narrow.
//
// For each outer index the block [start, start + len) x inner is one contiguous row of len * inner
// elements in both tensors. One grid-stride loop over outer * row elements, each thread copying
// one element (a float4 when every row start and both pointers are 16-byte aligned, as for
// channel slices of NCHW tensors with an even plane). Index arithmetic is 32-bit when the element
// count and the offsets fit. A copy: the output is bit-identical to the CPU's.
#include <algorithm>

#include "regen/kernels/cuda/common.cuh"
#include "regen/kernels/cuda/cuda_kernels.h"

namespace regen::cuda {
namespace {

constexpr int kThreads = 256;

// Rows of `row` elements: y[o * y_stride + y_off + r] = x[o * x_stride + x_off + r].
template <class V, class Index>
struct SliceParams {
  Index outer, row, x_stride, x_off, y_stride, y_off;
};

template <class V, class Index>
__global__ void slice_copy_kernel(const V* x, V* y, SliceParams<V, Index> p) {
  const Index total = p.outer * p.row;
  for (Index i = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<Index>(gridDim.x) * blockDim.x) {
    const Index o = i / p.row, r = i - o * p.row;
    y[o * p.y_stride + p.y_off + r] = x[o * p.x_stride + p.x_off + r];
  }
}

// Launches with elements of V (`width` elements of the tensor's type each: float or float4 for
// f32; uint16_t, float or float4 for the 16-bit types); every size is in the tensor's elements
// and divisible by width.
template <class V>
void launch(const void* x, void* y, const SliceShape& s, int64_t width) {
  const int64_t outer = s.outer, row = s.len * s.inner / width;
  const int64_t xs = s.x_dim * s.inner / width, xo = s.x_start * s.inner / width;
  const int64_t ys = s.y_dim * s.inner / width, yo = s.y_start * s.inner / width;
  const int64_t total = outer * row;
  // Largest index any thread forms (the grid-stride loop's last step may pass total by a grid).
  const int64_t span = std::max(outer * std::max(xs, ys), total) +
                       static_cast<int64_t>(detail::kMaxGridBlocks) * kThreads;
  const unsigned blocks = detail::grid_blocks(total, kThreads);
  const V* xv = static_cast<const V*>(x);
  V* yv = static_cast<V*>(y);
  if (span < (int64_t{1} << 32)) {
    const SliceParams<V, uint32_t> p{static_cast<uint32_t>(outer), static_cast<uint32_t>(row),
                                     static_cast<uint32_t>(xs),    static_cast<uint32_t>(xo),
                                     static_cast<uint32_t>(ys),    static_cast<uint32_t>(yo)};
    slice_copy_kernel<V, uint32_t><<<blocks, kThreads, 0, stream()>>>(xv, yv, p);
  } else {
    const SliceParams<V, int64_t> p{outer, row, xs, xo, ys, yo};
    slice_copy_kernel<V, int64_t><<<blocks, kThreads, 0, stream()>>>(xv, yv, p);
  }
}

// A copy of 32-bit or 16-bit elements (bits only); width: how many fit a float4.
template <class T>
void slice_copy_bits(const T* x, T* y, const SliceShape& s) {
  REGEN_CHECK(s.outer >= 0 && s.len >= 0 && s.inner >= 0 && s.x_start >= 0 && s.y_start >= 0 &&
                  s.x_start + s.len <= s.x_dim && s.y_start + s.len <= s.y_dim,
              "slice_copy: bad shape outer=", s.outer, " len=", s.len, " inner=", s.inner,
              " x rows [", s.x_start, ", +len) of ", s.x_dim, ", y rows [", s.y_start,
              ", +len) of ", s.y_dim);
  if (s.outer == 0 || s.len == 0 || s.inner == 0) return;
  // Whether every row start and length is a multiple of w elements (and the pointers aligned).
  auto fits = [&](int64_t w, bool aligned) {
    return aligned && (s.len * s.inner) % w == 0 && (s.x_dim * s.inner) % w == 0 &&
           (s.x_start * s.inner) % w == 0 && (s.y_dim * s.inner) % w == 0 &&
           (s.y_start * s.inner) % w == 0;
  };
  constexpr int64_t per4 = 16 / sizeof(T);  // elements per float4
  const bool a16 = detail::aligned16(x) && detail::aligned16(y);
  if (fits(per4, a16)) {
    launch<float4>(x, y, s, per4);
  } else if (sizeof(T) == 4) {
    launch<float>(x, y, s, 1);
  } else if (fits(2, (reinterpret_cast<uintptr_t>(x) & 3u) == 0 &&
                         (reinterpret_cast<uintptr_t>(y) & 3u) == 0)) {
    launch<float>(x, y, s, 2);
  } else {
    launch<uint16_t>(x, y, s, 1);
  }
  REGEN_CUDA_LAUNCH_CHECK("slice_copy");
}

}  // namespace

void slice_copy(const float* x, float* y, const SliceShape& s) {
  slice_copy_bits(x, y, s);
}
template <class T>
void slice_copy(const T* x, T* y, const SliceShape& s) {
  slice_copy_bits(x, y, s);
}
template void slice_copy<bfloat16>(const bfloat16*, bfloat16*, const SliceShape&);
template void slice_copy<float16>(const float16*, float16*, const SliceShape&);

}  // namespace regen::cuda
