// The CPU loops of the unary element-wise ops (kernels/unary_ops.h), one template instantiated for
// every functor of REGEN_UNARY_OPS in float and double. Tests: the op table (tests/op_table.h)
// checks every op against its f64 reference; the CUDA launchers are in kernels/cuda/unary.cu.
#include <omp.h>

#include "regen/kernels/unary_ops.h"

namespace regen::cpu {
namespace {
constexpr int64_t kParallelMin = 1 << 15;  // below this, threads cost more than they save
}  // namespace

template <class T, class F>
void unary_forward(F, const T* x, T* y, int64_t n) {
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) y[i] = F::value(x[i]);
}

template <class T, class F>
void unary_backward(F, const T* dy, const T* s, T* dx, int64_t n) {
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) dx[i] = F::grad(dy[i], s[i]);
}

#define REGEN_UNARY_INSTANTIATE_T(T, name)                                         \
  template void unary_forward<T, unary::name>(unary::name, const T*, T*, int64_t); \
  template void unary_backward<T, unary::name>(unary::name, const T*, const T*, T*, int64_t);
#define REGEN_UNARY_INSTANTIATE(name)    \
  REGEN_UNARY_INSTANTIATE_T(float, name) \
  REGEN_UNARY_INSTANTIATE_T(double, name)
REGEN_UNARY_OPS(REGEN_UNARY_INSTANTIATE)
#undef REGEN_UNARY_INSTANTIATE
#undef REGEN_UNARY_INSTANTIATE_T

}  // namespace regen::cpu
