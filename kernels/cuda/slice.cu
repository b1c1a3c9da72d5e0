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

// Launches with elements of V (float or float4: `width` floats each); every size is in floats
// and divisible by width.
template <class V>
void launch(const float* x, float* y, const SliceShape& s, int64_t width) {
  const int64_t outer = s.outer, row = s.len * s.inner / width;
  const int64_t xs = s.x_dim * s.inner / width, xo = s.x_start * s.inner / width;
  const int64_t ys = s.y_dim * s.inner / width, yo = s.y_start * s.inner / width;
  const int64_t total = outer * row;
  // Largest index any thread forms (the grid-stride loop's last step may pass total by a grid).
  const int64_t span = std::max(outer * std::max(xs, ys), total) +
                       static_cast<int64_t>(detail::kMaxGridBlocks) * kThreads;
  const unsigned blocks = detail::grid_blocks(total, kThreads);
  const V* xv = reinterpret_cast<const V*>(x);
  V* yv = reinterpret_cast<V*>(y);
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

}  // namespace

void slice_copy(const float* x, float* y, const SliceShape& s) {
  REGEN_CHECK(s.outer >= 0 && s.len >= 0 && s.inner >= 0 && s.x_start >= 0 && s.y_start >= 0 &&
                  s.x_start + s.len <= s.x_dim && s.y_start + s.len <= s.y_dim,
              "slice_copy: bad shape outer=", s.outer, " len=", s.len, " inner=", s.inner,
              " x rows [", s.x_start, ", +len) of ", s.x_dim, ", y rows [", s.y_start,
              ", +len) of ", s.y_dim);
  if (s.outer == 0 || s.len == 0 || s.inner == 0) return;
  const bool vec4 = detail::aligned16(x) && detail::aligned16(y) && (s.len * s.inner) % 4 == 0 &&
                    (s.x_dim * s.inner) % 4 == 0 && (s.x_start * s.inner) % 4 == 0 &&
                    (s.y_dim * s.inner) % 4 == 0 && (s.y_start * s.inner) % 4 == 0;
  if (vec4) {
    launch<float4>(x, y, s, 4);
  } else {
    launch<float>(x, y, s, 1);
  }
  REGEN_CUDA_LAUNCH_CHECK("slice_copy");
}

}  // namespace regen::cuda
