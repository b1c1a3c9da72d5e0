// The unary element-wise ops, described once. Each is a functor of __host__ __device__ functions:
//   value(x)        the op's value y = f(x);
//   grad(dy, s)     the input gradient dx = dy * f'(x) from the output gradient and the saved
//                   tensor s, which is the input x or the output y as `reads` says (a
//                   SavedTensor the planner can evict and replay, like any other);
//   optionally, when the gradient needs only one bit of s (relu: whether y > 0):
//   mask(s)         that bit, and
//   grad_masked(dy, bit)  the same dx from it, bit for bit (grad_masked(dy, mask(s)) ==
//                   grad(dy, s) for every s, NaN and signed zeros included:
//                   tests/test_kernels_cpu); the op then saves a 1-bit packed mask instead of s
//                   wherever nothing else saves s (docs/ops.md, "Packed saves");
// and REGEN_UNARY_OPS lists them. From that list alone:
//   kernels/cpu/unary.cpp      the CPU loops (float, double): cpu::unary_forward / unary_backward;
//   kernels/cuda/unary.cu      the CUDA launchers (float): cuda::unary_forward / unary_backward;
//   autograd/op_list.h         the OpKind entries;
//   autograd/ops_unary.cpp     each OpDef, its registration and the function `Tensor name(x)`
//                              (declared in autograd/ops_unary.h; python/ops.cpp binds it);
//   tests/op_table.h           each op-table row (the f64 reference formula is the test's own,
//                              tests/op_reference.h), so the gradcheck, the CPU and CUDA value
//                              checks and the CUDA tests (tests/cuda/test_cuda_ops.cpp) need no
//                              edit;
//   regen bench kernels        a timing row per op (cuda::unary_launchers(), declared in
//                              kernels/cuda/cuda_kernels.h so that the tool need not include this).
// A new activation is a functor here and its entry in the list, plus its reference formula in
// tests/op_reference.h (docs/ops.md). Keep each formula in one expression per function: the CPU and
// CUDA run the same code, so they round alike.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "regen/core/host_device.h"

namespace regen {
namespace unary {

// What grad's second argument is: the op's input or its output.
enum class Reads : uint8_t { input, output };

// The same math calls on the host and the device (CUDA's libm on the GPU), by argument type.
REGEN_HD float erf_(float x) {
  return ::erff(x);
}
REGEN_HD double erf_(double x) {
  return ::erf(x);
}
REGEN_HD float exp_(float x) {
  return ::expf(x);
}
REGEN_HD double exp_(double x) {
  return ::exp(x);
}
// tanh in f32 from operations a CPU loop vectorizes (GCC: AVX-512 and AVX2, kernels/cpu/unary.cpp
// is compiled with -fno-trapping-math so the selects need no masks) and CUDA runs alike, every
// multiply-add an explicit fma so that no compiler contracts them its own way: libm's scalar tanhf
// kept GPT-2's gelu_tanh at about 7 ns per element on the CPU. Within 1.6 ulp of the correctly
// rounded tanh over every float (checked exhaustively against the double tanh when it was written;
// libm's tanhf: 2.2), odd, tanh(-0) = -0, +-1 at +-inf, NaN for NaN. tests/test_kernels_cpu.cpp
// checks it against std::tanh on a dense sweep.
REGEN_HD float float_from_bits(int32_t i) {
#if defined(__CUDA_ARCH__)
  return __int_as_float(i);
#else
  float f;
  std::memcpy(&f, &i, sizeof f);
  return f;
#endif
}
// exp(y - n ln 2) for n = rint(y / ln 2), which `n` receives: r = y - n ln 2 with ln 2 in two
// parts (the first's 15 bits times |n| < 2^9 are exact), then e^r by its Taylor series to r^7
// (|r| <= ln 2 / 2: truncation 6e-9 relative), every step an explicit fma. tanh_f32 and exp_f32
// scale it by 2^n.
REGEN_HD float exp_reduced(float y, float& n) {
  n = ::rintf(y * 1.44269504088896341f);
  float r = ::fmaf(n, -0.693145751953125f, y);
  r = ::fmaf(n, -1.428606820309417e-6f, r);
  float e = 1.0f / 5040.0f;
  e = ::fmaf(e, r, 1.0f / 720.0f);
  e = ::fmaf(e, r, 1.0f / 120.0f);
  e = ::fmaf(e, r, 1.0f / 24.0f);
  e = ::fmaf(e, r, 1.0f / 6.0f);
  e = ::fmaf(e, r, 0.5f);
  e = ::fmaf(e, r, 1.0f);
  return ::fmaf(e, r, 1.0f);
}
REGEN_HD float tanh_f32(float x) {
  const float a = ::fabsf(x);
  // |x| < 0.55: x + x z P(z), z = x^2; P is a least-squares fit (relative error of tanh 1.1e-9
  // in real arithmetic, far below f32's 6e-8).
  const float z = a * a;
  float p = ::fmaf(z, -0.006282475425833878f, 0.021077760024093155f);
  p = ::fmaf(z, p, -0.05385385840536662f);
  p = ::fmaf(z, p, 0.13332601690918566f);
  p = ::fmaf(z, p, -0.33333318045898347f);
  const float small = ::fmaf(a * z, p, a);
  // Otherwise 1 - 2 / (e + 1), e = exp(2|x|) = 2^n exp(r) (exp_reduced). Past |x| = 10, tanh
  // rounds to 1: 2|x| is held at 20 there (and for NaN, returned as itself below), so n < 2^5.
  const float y = a < 10.0f ? 2.0f * a : 20.0f;
  float n;
  float e = exp_reduced(y, n);
  e = e * float_from_bits((static_cast<int32_t>(n) + 127) << 23);
  const float large = 1.0f - 2.0f / (e + 1.0f);
  const float t = a < 0.55f ? small : large;
  return a == a ? ::copysignf(t, x) : x;
}
// exp in f32 the same way (operations a CPU loop vectorizes and CUDA runs alike, explicit fmas):
// e^x = 2^n e^r (exp_reduced, |n| <= 150), 2^n applied as two powers of two, 2^floor(n/2) then
// 2^ceil(n/2), so that a subnormal result is rounded once. x is held to [-104, 89] first (NaN to
// -104, returned as itself below): exp(x) is 0 below -103.98 and inf above 88.73 in f32 anyway.
// Within 0.94 ulp of the correctly rounded exp over every float (checked exhaustively against the
// double exp when it was written; tests/test_kernels_cpu.cpp checks a dense sweep within 2); exp(0)
// = 1, exp(-inf) = 0, exp(inf) = inf. The softmax rows of kernels/cpu/cross_entropy.cpp run on it:
// libm's scalar expf kept them at about 2 ns per element, 6x slower.
REGEN_HD float exp_f32(float x) {
  float c = x > -104.0f ? x : -104.0f;
  c = c < 89.0f ? c : 89.0f;
  float n;
  float e = exp_reduced(c, n);
  const int32_t k = static_cast<int32_t>(n);  // in [-150, 129]
  const int32_t h = k >> 1;                   // floor(k / 2): both halves in [-75, 65]
  e = e * float_from_bits((h + 127) << 23);
  e = e * float_from_bits((k - h + 127) << 23);
  return x == x ? e : x;
}
REGEN_HD float tanh_(float x) {
  return tanh_f32(x);
}
REGEN_HD double tanh_(double x) {
  return ::tanh(x);
}

// max(x, 0); backward reads the output (y > 0 exactly where x > 0).
struct relu {
  static constexpr Reads reads = Reads::output;
  template <class T>
  REGEN_HD static T value(T x) {
    return x > T(0) ? x : T(0);
  }
  template <class T>
  REGEN_HD static T grad(T dy, T y) {
    return y > T(0) ? dy : T(0);
  }
  template <class T>
  REGEN_HD static bool mask(T y) {
    return y > T(0);
  }
  template <class T>
  REGEN_HD static T grad_masked(T dy, bool bit) {
    return bit ? dy : T(0);
  }
};

// Exact GELU: x Phi(x) = 0.5 x (1 + erf(x / sqrt 2)), as torch.nn.functional.gelu; its derivative
// is Phi(x) + x phi(x).
struct gelu {
  static constexpr Reads reads = Reads::input;
  template <class T>
  REGEN_HD static T value(T x) {
    return T(0.5) * x * (T(1) + erf_(x * T(0.70710678118654752440)));
  }
  template <class T>
  REGEN_HD static T grad(T dy, T x) {
    const T cdf = T(0.5) * (T(1) + erf_(x * T(0.70710678118654752440)));
    const T pdf = T(0.39894228040143267794) * exp_(T(-0.5) * x * x);
    return dy * (cdf + x * pdf);
  }
};

// GELU, tanh approximation: 0.5 x (1 + tanh(u)), u = sqrt(2 / pi) (x + 0.044715 x^3), as
// torch.nn.functional.gelu(approximate='tanh'); its derivative is 0.5 (1 + t) + 0.5 x (1 - t^2) u'.
struct gelu_tanh {
  static constexpr Reads reads = Reads::input;
  template <class T>
  REGEN_HD static T value(T x) {
    return T(0.5) * x * (T(1) + tanh_(T(0.79788456080286535588) * (x + T(0.044715) * x * x * x)));
  }
  template <class T>
  REGEN_HD static T grad(T dy, T x) {
    const T t = tanh_(T(0.79788456080286535588) * (x + T(0.044715) * x * x * x));
    const T du = T(0.79788456080286535588) * (T(1) + T(3 * 0.044715) * x * x);
    return dy * (T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * du);
  }
};

}  // namespace unary

// Every unary op, once: X(name) names the op and its functor unary::name.
// clang-format off
#define REGEN_UNARY_OPS(X) X(relu) X(gelu) X(gelu_tanh)
// clang-format on

namespace unary {
// Each functor's op name, from the list: name_of<gelu>::value is "gelu".
template <class F>
struct name_of;
#define REGEN_UNARY_NAME_OF(name)               \
  template <>                                   \
  struct name_of<name> {                        \
    static constexpr const char* value = #name; \
  };
REGEN_UNARY_OPS(REGEN_UNARY_NAME_OF)
#undef REGEN_UNARY_NAME_OF

// Whether functor F's backward runs from a 1-bit mask (it declares mask and grad_masked).
template <class F, class = void>
struct has_mask : std::false_type {};
template <class F>
struct has_mask<F, std::void_t<decltype(F::template mask<float>(0.0f)),
                               decltype(F::template grad_masked<float>(0.0f, true))>>
    : std::true_type {};
}  // namespace unary

// A packed 1-bit mask of n elements: bit i % 32 of 32-bit word i / 32 (least significant bit
// first); the bits of the last word past n are zero.
constexpr int64_t mask_words(int64_t n) {
  return (n + 31) / 32;
}

// The launchers, one template each, instantiated for every functor of the list. A launcher takes
// the functor (an empty tag) first, then raw pointers of n elements; REGEN_LAUNCH(device, T,
// unary_forward, unary::name{}, x, y, n) dispatches them like any other. In-place use (y == x,
// dx == dy) is allowed.
namespace cpu {
template <class T, class F>
void unary_forward(F, const T* x, T* y, int64_t n);  // x, y: (n)
// dy, s, dx: (n); s is the input or the output, as F::reads says.
template <class T, class F>
void unary_backward(F, const T* dy, const T* s, T* dx, int64_t n);
// The packed-mask forms, for a functor with has_mask (others throw): forward also writes the mask
// of what F reads, mask: (mask_words(n)); backward computes dx from dy and that mask alone.
template <class T, class F>
void unary_forward_mask(F, const T* x, T* y, uint32_t* mask, int64_t n);
template <class T, class F>
void unary_backward_mask(F, const T* dy, const uint32_t* mask, T* dx, int64_t n);
}  // namespace cpu
#ifdef REGEN_WITH_CUDA
namespace cuda {
template <class F>
void unary_forward(F, const float* x, float* y, int64_t n);
template <class F>
void unary_backward(F, const float* dy, const float* s, float* dx, int64_t n);
template <class F>
void unary_forward_mask(F, const float* x, float* y, uint32_t* mask, int64_t n);
template <class F>
void unary_backward_mask(F, const float* dy, const uint32_t* mask, float* dx, int64_t n);
// The 16-bit forms (T = bfloat16, float16; kernels/cuda/unary.cu): the CPU's 16-bit loops.
template <class T, class F>
void unary_forward(F, const T* x, T* y, int64_t n);
template <class T, class F>
void unary_backward(F, const T* dy, const T* s, T* dx, int64_t n);
template <class T, class F>
void unary_forward_mask(F, const T* x, T* y, uint32_t* mask, int64_t n);
template <class T, class F>
void unary_backward_mask(F, const T* dy, const uint32_t* mask, T* dx, int64_t n);
}  // namespace cuda
#endif

}  // namespace regen
