// The pieces a softmax row on the CPU is made of, written so that GCC vectorizes them: f32 rows
// take exp_f32 (kernels/unary_ops.h), f64 rows libm's exp. Sums and maxima run in kRowLanes
// independent lanes combined in lane order at the end, so a row's bits depend on its values only,
// never on the threads or on where the row starts. A file that includes this is compiled with
// -fno-trapping-math (CMakeLists.txt), as kernels/cpu/unary.cpp: the selects then need no masks.
// Users: kernels/cpu/cross_entropy.cpp (the loss rows, the LM head's chunks) and
// kernels/cpu/attention.cpp (the scores' softmax).
#pragma once

#include <cmath>
#include <cstdint>

#include "regen/kernels/unary_ops.h"

namespace regen::cpu {

constexpr int64_t kRowLanes = 16;

inline float row_exp(float x) {
  return unary::exp_f32(x);
}
inline double row_exp(double x) {
  return std::exp(x);
}

// The largest of x[0, n) (NaNs passed over, as std::max(m, x) does); -inf for n = 0.
template <class T>
T row_max(const T* x, int64_t n) {
  T m[kRowLanes];
  for (int64_t l = 0; l < kRowLanes; ++l) m[l] = -INFINITY;
  int64_t j = 0;
  for (; j + kRowLanes <= n; j += kRowLanes) {
    for (int64_t l = 0; l < kRowLanes; ++l) m[l] = x[j + l] > m[l] ? x[j + l] : m[l];
  }
  for (; j < n; ++j) m[0] = x[j] > m[0] ? x[j] : m[0];
  T mx = m[0];
  for (int64_t l = 1; l < kRowLanes; ++l) mx = m[l] > mx ? m[l] : mx;
  return mx;
}

// The sum over x[0, n) of exp(x - mx), in double.
template <class T>
double row_sum_exp(const T* x, int64_t n, T mx) {
  double s[kRowLanes] = {};
  int64_t j = 0;
  for (; j + kRowLanes <= n; j += kRowLanes) {
    for (int64_t l = 0; l < kRowLanes; ++l) s[l] += static_cast<double>(row_exp(x[j + l] - mx));
  }
  for (; j < n; ++j) s[0] += static_cast<double>(row_exp(x[j] - mx));
  double sum = 0;
  for (int64_t l = 0; l < kRowLanes; ++l) sum += s[l];
  return sum;
}

// x[j] = exp(x[j] - mx) over [0, n), in place; returns their sum in double (as row_sum_exp).
template <class T>
double row_exp_in_place(T* x, int64_t n, T mx) {
  double s[kRowLanes] = {};
  int64_t j = 0;
  for (; j + kRowLanes <= n; j += kRowLanes) {
    for (int64_t l = 0; l < kRowLanes; ++l) {
      x[j + l] = row_exp(x[j + l] - mx);
      s[l] += static_cast<double>(x[j + l]);
    }
  }
  for (; j < n; ++j) {
    x[j] = row_exp(x[j] - mx);
    s[0] += static_cast<double>(x[j]);
  }
  double sum = 0;
  for (int64_t l = 0; l < kRowLanes; ++l) sum += s[l];
  return sum;
}

// y[j] = g * exp(x[j] - l) over [0, n) (y may be x).
template <class T>
void row_scaled_softmax(const T* x, T* y, int64_t n, T l, T g) {
  for (int64_t j = 0; j < n; ++j) y[j] = g * row_exp(x[j] - l);
}

}  // namespace regen::cpu
