// The CUDA launchers of the unary element-wise ops (kernels/unary_ops.h): one grid-stride kernel
// template over the functor, with a float4 variant when every pointer is 16-byte aligned (the tail
// finished by the scalar kernel), instantiated for every functor of REGEN_UNARY_OPS, and the
// packed-mask forms (a warp ballot per mask word) for the functors that have one. The functors
// are the CPU loops' (kernels/cpu/unary.cpp). Tests: the op table on CUDA
// (tests/cuda/test_cuda_op_table.cpp) against the f64 references, tests/cuda/test_cuda_ops.cpp
// against the CPU loops.
#include "regen/kernels/cuda/common.cuh"
#include "regen/kernels/cuda/cuda_kernels.h"
#include "regen/kernels/unary_ops.h"

namespace regen::cuda {
namespace {

using detail::grid_blocks;
constexpr int kThreads = 256;

// x, y: (n)
template <class F>
__global__ void unary_forward_kernel(const float* x, float* y, int64_t n) {
  for (int64_t i = dev::global_thread(); i < n; i += dev::grid_stride()) y[i] = F::value(x[i]);
}
// x, y: (n4) float4 groups
template <class F>
__global__ void unary_forward_kernel4(const float4* x, float4* y, int64_t n4) {
  for (int64_t i = dev::global_thread(); i < n4; i += dev::grid_stride()) {
    const float4 v = x[i];
    y[i] = make_float4(F::value(v.x), F::value(v.y), F::value(v.z), F::value(v.w));
  }
}
// dy, s, dx: (n)
template <class F>
__global__ void unary_backward_kernel(const float* dy, const float* s, float* dx, int64_t n) {
  for (int64_t i = dev::global_thread(); i < n; i += dev::grid_stride()) {
    dx[i] = F::grad(dy[i], s[i]);
  }
}
template <class F>
__global__ void unary_backward_kernel4(const float4* dy, const float4* s, float4* dx, int64_t n4) {
  for (int64_t i = dev::global_thread(); i < n4; i += dev::grid_stride()) {
    const float4 g = dy[i], v = s[i];
    dx[i] = make_float4(F::grad(g.x, v.x), F::grad(g.y, v.y), F::grad(g.z, v.z), F::grad(g.w, v.w));
  }
}

// The packed-mask forward: each warp takes 32 consecutive elements, aligned to 32, so the warp's
// ballot is one mask word (kThreads and the grid stride are multiples of 32, and the loop
// condition is the same for every lane of a warp, so all 32 lanes reach each ballot).
// x, y: (n); mask: (mask_words(n))
template <class F>
__global__ void unary_forward_mask_kernel(const float* x, float* y, uint32_t* mask, int64_t n) {
  constexpr bool reads_output = F::reads == unary::Reads::output;
  const int lane = static_cast<int>(threadIdx.x & 31);
  for (int64_t i = dev::global_thread(); i - lane < n; i += dev::grid_stride()) {
    bool bit = false;
    if (i < n) {
      const float in = x[i];
      const float out = F::value(in);
      y[i] = out;
      bit = F::mask(reads_output ? out : in);
    }
    const unsigned word = __ballot_sync(dev::kFullMask, bit);
    if (lane == 0) mask[i >> 5] = word;
  }
}
// dy, dx: (n); mask: (mask_words(n))
template <class F>
__global__ void unary_backward_mask_kernel(const float* dy, const uint32_t* mask, float* dx,
                                           int64_t n) {
  for (int64_t i = dev::global_thread(); i < n; i += dev::grid_stride()) {
    dx[i] = F::grad_masked(dy[i], ((mask[i >> 5] >> (i & 31)) & 1u) != 0);
  }
}

template <class F>
struct Name;
#define REGEN_UNARY_NAME(name)                                           \
  template <>                                                            \
  struct Name<unary::name> {                                             \
    static constexpr const char* forward = #name "_forward";             \
    static constexpr const char* backward = #name "_backward";           \
    static constexpr const char* forward_mask = #name "_forward_mask";   \
    static constexpr const char* backward_mask = #name "_backward_mask"; \
  };
REGEN_UNARY_OPS(REGEN_UNARY_NAME)
#undef REGEN_UNARY_NAME

}  // namespace

template <class F>
void unary_forward(F, const float* x, float* y, int64_t n) {
  REGEN_CHECK(n >= 0, Name<F>::forward, ": negative size ", n);
  if (n == 0) return;
  int64_t done = 0;
  if (detail::aligned16(x) && detail::aligned16(y) && n >= 4) {
    const int64_t n4 = n / 4;
    unary_forward_kernel4<F><<<grid_blocks(n4, kThreads), kThreads, 0, stream()>>>(
        reinterpret_cast<const float4*>(x), reinterpret_cast<float4*>(y), n4);
    REGEN_CUDA_LAUNCH_CHECK(Name<F>::forward);
    done = n4 * 4;
  }
  if (done < n) {
    unary_forward_kernel<F>
        <<<grid_blocks(n - done, kThreads), kThreads, 0, stream()>>>(x + done, y + done, n - done);
    REGEN_CUDA_LAUNCH_CHECK(Name<F>::forward);
  }
}

template <class F>
void unary_backward(F, const float* dy, const float* s, float* dx, int64_t n) {
  REGEN_CHECK(n >= 0, Name<F>::backward, ": negative size ", n);
  if (n == 0) return;
  int64_t done = 0;
  if (detail::aligned16(dy) && detail::aligned16(s) && detail::aligned16(dx) && n >= 4) {
    const int64_t n4 = n / 4;
    unary_backward_kernel4<F><<<grid_blocks(n4, kThreads), kThreads, 0, stream()>>>(
        reinterpret_cast<const float4*>(dy), reinterpret_cast<const float4*>(s),
        reinterpret_cast<float4*>(dx), n4);
    REGEN_CUDA_LAUNCH_CHECK(Name<F>::backward);
    done = n4 * 4;
  }
  if (done < n) {
    unary_backward_kernel<F><<<grid_blocks(n - done, kThreads), kThreads, 0, stream()>>>(
        dy + done, s + done, dx + done, n - done);
    REGEN_CUDA_LAUNCH_CHECK(Name<F>::backward);
  }
}

template <class F>
void unary_forward_mask(F, const float* x, float* y, uint32_t* mask, int64_t n) {
  if constexpr (unary::has_mask<F>::value) {
    REGEN_CHECK(n >= 0, Name<F>::forward_mask, ": negative size ", n);
    if (n == 0) return;
    const int64_t warps = mask_words(n);
    unary_forward_mask_kernel<F>
        <<<grid_blocks(warps * 32, kThreads), kThreads, 0, stream()>>>(x, y, mask, n);
    REGEN_CUDA_LAUNCH_CHECK(Name<F>::forward_mask);
  } else {
    REGEN_FAIL(Name<F>::forward_mask, ": the op has no packed mask form");
  }
}

template <class F>
void unary_backward_mask(F, const float* dy, const uint32_t* mask, float* dx, int64_t n) {
  if constexpr (unary::has_mask<F>::value) {
    REGEN_CHECK(n >= 0, Name<F>::backward_mask, ": negative size ", n);
    if (n == 0) return;
    unary_backward_mask_kernel<F>
        <<<grid_blocks(n, kThreads), kThreads, 0, stream()>>>(dy, mask, dx, n);
    REGEN_CUDA_LAUNCH_CHECK(Name<F>::backward_mask);
  } else {
    REGEN_FAIL(Name<F>::backward_mask, ": the op has no packed mask form");
  }
}

#define REGEN_UNARY_INSTANTIATE(name)                                                         \
  template void unary_forward<unary::name>(unary::name, const float*, float*, int64_t);       \
  template void unary_backward<unary::name>(unary::name, const float*, const float*, float*,  \
                                            int64_t);                                         \
  template void unary_forward_mask<unary::name>(unary::name, const float*, float*, uint32_t*, \
                                                int64_t);                                     \
  template void unary_backward_mask<unary::name>(unary::name, const float*, const uint32_t*,  \
                                                 float*, int64_t);
REGEN_UNARY_OPS(REGEN_UNARY_INSTANTIATE)
#undef REGEN_UNARY_INSTANTIATE

namespace {
#define REGEN_UNARY_ENTRY(name)                                                        \
  {#name, unary::name::reads == unary::Reads::output,                                  \
   [](const float* x, float* y, int64_t n) { unary_forward(unary::name{}, x, y, n); }, \
   [](const float* dy, const float* s, float* dx, int64_t n) {                         \
     unary_backward(unary::name{}, dy, s, dx, n);                                      \
   }},
const UnaryLaunchers kUnaryLaunchers[] = {
    REGEN_UNARY_OPS(REGEN_UNARY_ENTRY){nullptr, false, nullptr, nullptr}};
#undef REGEN_UNARY_ENTRY
}  // namespace

const UnaryLaunchers* unary_launchers() {
  return kUnaryLaunchers;
}

// ---- 16-bit forms (bfloat16, float16) ---------------------------------------------------------
// The CPU's 16-bit loops (kernels/cpu/unary.cpp) element for element: each element widened to f32,
// the f32 functor, one rounding on store; the mask of an op that reads its output is taken from
// the stored (rounded) value, as the CPU's is.
namespace {
template <class T, class F>
__global__ void half_unary_forward_kernel(const T* x, T* y, int64_t n) {
  for (int64_t i = dev::global_thread(); i < n; i += dev::grid_stride())
    y[i] = T(F::value(static_cast<float>(x[i])));
}
template <class T, class F>
__global__ void half_unary_backward_kernel(const T* dy, const T* s, T* dx, int64_t n) {
  for (int64_t i = dev::global_thread(); i < n; i += dev::grid_stride())
    dx[i] = T(F::grad(static_cast<float>(dy[i]), static_cast<float>(s[i])));
}
template <class T, class F>
__global__ void half_unary_forward_mask_kernel(const T* x, T* y, uint32_t* mask, int64_t n) {
  constexpr bool reads_output = F::reads == unary::Reads::output;
  const int lane = static_cast<int>(threadIdx.x & 31);
  for (int64_t i = dev::global_thread(); i - lane < n; i += dev::grid_stride()) {
    bool bit = false;
    if (i < n) {
      const float in = static_cast<float>(x[i]);
      const T out(F::value(in));
      y[i] = out;
      bit = F::mask(reads_output ? static_cast<float>(out) : in);
    }
    const unsigned word = __ballot_sync(dev::kFullMask, bit);
    if (lane == 0) mask[i >> 5] = word;
  }
}
template <class T, class F>
__global__ void half_unary_backward_mask_kernel(const T* dy, const uint32_t* mask, T* dx,
                                                int64_t n) {
  for (int64_t i = dev::global_thread(); i < n; i += dev::grid_stride()) {
    dx[i] = T(F::grad_masked(static_cast<float>(dy[i]), ((mask[i >> 5] >> (i & 31)) & 1u) != 0));
  }
}
}  // namespace

template <class T, class F>
void unary_forward(F, const T* x, T* y, int64_t n) {
  REGEN_CHECK(n >= 0, Name<F>::forward, ": negative size ", n);
  if (n == 0) return;
  half_unary_forward_kernel<T, F><<<grid_blocks(n, kThreads), kThreads, 0, stream()>>>(x, y, n);
  REGEN_CUDA_LAUNCH_CHECK(Name<F>::forward);
}
template <class T, class F>
void unary_backward(F, const T* dy, const T* s, T* dx, int64_t n) {
  REGEN_CHECK(n >= 0, Name<F>::backward, ": negative size ", n);
  if (n == 0) return;
  half_unary_backward_kernel<T, F>
      <<<grid_blocks(n, kThreads), kThreads, 0, stream()>>>(dy, s, dx, n);
  REGEN_CUDA_LAUNCH_CHECK(Name<F>::backward);
}
template <class T, class F>
void unary_forward_mask(F, const T* x, T* y, uint32_t* mask, int64_t n) {
  if constexpr (unary::has_mask<F>::value) {
    REGEN_CHECK(n >= 0, Name<F>::forward_mask, ": negative size ", n);
    if (n == 0) return;
    half_unary_forward_mask_kernel<T, F>
        <<<grid_blocks(mask_words(n) * 32, kThreads), kThreads, 0, stream()>>>(x, y, mask, n);
    REGEN_CUDA_LAUNCH_CHECK(Name<F>::forward_mask);
  } else {
    REGEN_FAIL(Name<F>::forward_mask, ": the op has no packed mask form");
  }
}
template <class T, class F>
void unary_backward_mask(F, const T* dy, const uint32_t* mask, T* dx, int64_t n) {
  if constexpr (unary::has_mask<F>::value) {
    REGEN_CHECK(n >= 0, Name<F>::backward_mask, ": negative size ", n);
    if (n == 0) return;
    half_unary_backward_mask_kernel<T, F>
        <<<grid_blocks(n, kThreads), kThreads, 0, stream()>>>(dy, mask, dx, n);
    REGEN_CUDA_LAUNCH_CHECK(Name<F>::backward_mask);
  } else {
    REGEN_FAIL(Name<F>::backward_mask, ": the op has no packed mask form");
  }
}

#define REGEN_UNARY_INSTANTIATE_HALF_T(T, name)                                                    \
  template void unary_forward<T, unary::name>(unary::name, const T*, T*, int64_t);                 \
  template void unary_backward<T, unary::name>(unary::name, const T*, const T*, T*, int64_t);      \
  template void unary_forward_mask<T, unary::name>(unary::name, const T*, T*, uint32_t*, int64_t); \
  template void unary_backward_mask<T, unary::name>(unary::name, const T*, const uint32_t*, T*,    \
                                                    int64_t);
#define REGEN_UNARY_INSTANTIATE_HALF(name)       \
  REGEN_UNARY_INSTANTIATE_HALF_T(bfloat16, name) \
  REGEN_UNARY_INSTANTIATE_HALF_T(float16, name)
REGEN_UNARY_OPS(REGEN_UNARY_INSTANTIATE_HALF)
#undef REGEN_UNARY_INSTANTIATE_HALF
#undef REGEN_UNARY_INSTANTIATE_HALF_T

}  // namespace regen::cuda
