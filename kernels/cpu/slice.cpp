// CPU slice copy (declared in kernels/kernels.h): the one kernel behind concat, split and narrow
// (forward and backward). For each outer index the block [start, start + len) x inner is
// contiguous in both tensors, so the copy is `outer` memcpys of len * inner elements. Long rows are
// cut into pieces so that one row (outer = 1: concat along dimension 0) still spreads over threads.
// Tests: tests/test_ops_shape.cpp (against index loops), tests/test_gradcheck_shape.cpp.
#include <omp.h>

#include <algorithm>
#include <cstring>

#include "regen/kernels/kernels.h"

namespace regen::cpu {
namespace {
constexpr int64_t kParallelMin = 1 << 16;  // elements; below this one thread is faster
constexpr int64_t kPiece = 1 << 15;        // elements per memcpy when a row is cut
}  // namespace

template <class T>
void slice_copy(const T* x, T* y, const SliceShape& s) {
  const int64_t row = s.len * s.inner;
  if (s.outer <= 0 || row <= 0) return;
  const int64_t pieces = (row + kPiece - 1) / kPiece;  // per row
  const int64_t total = s.outer * pieces;
#pragma omp parallel for schedule(static) if (s.outer * row > kParallelMin)
  for (int64_t t = 0; t < total; ++t) {
    const int64_t o = t / pieces, lo = (t % pieces) * kPiece;
    const int64_t n = std::min(kPiece, row - lo);
    std::memcpy(y + (o * s.y_dim + s.y_start) * s.inner + lo,
                x + (o * s.x_dim + s.x_start) * s.inner + lo, static_cast<size_t>(n) * sizeof(T));
  }
}

template void slice_copy<float>(const float*, float*, const SliceShape&);
template void slice_copy<double>(const double*, double*, const SliceShape&);
// 16-bit tensors: a bit copy, like the others.
template void slice_copy<bfloat16>(const bfloat16*, bfloat16*, const SliceShape&);
template void slice_copy<float16>(const float16*, float16*, const SliceShape&);

}  // namespace regen::cpu
