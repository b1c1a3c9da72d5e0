// CPU cross-entropy fused with log-softmax (declared in kernels/kernels.h), as
// torch.nn.functional.cross_entropy with reduction='mean' and ignore_index, except that a batch
// whose targets are all ignored gives 0 rather than NaN. Targets are validated before any thread
// starts; row losses are summed in row order in double, independent of the thread count.
// Also the row-wise pieces of the chunked linear + cross-entropy op (linear_cross_entropy_*,
// autograd/ops_cross_entropy.cpp): the same arithmetic per row, on one chunk of logits at a time.
// Tests: tests/test_ops_nlp.cpp (values, errors), tests/test_gradcheck_nlp.cpp; the CUDA twins
// (kernels/cuda/cross_entropy.cu) against these in tests/cuda/test_cuda_ops.cpp.
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "regen/core/tensor.h"
#include "regen/kernels/cpu/softmax_rows.h"
#include "regen/kernels/kernels.h"

namespace regen::cpu {
namespace {
constexpr int64_t kParallelMin = 1 << 14;  // elements below which one thread is faster

// Number of rows that count towards the mean; throws on a target that is neither in [0, V) nor
// ignore_index.
int64_t check_targets(const int64_t* targets, int64_t M, int64_t V, int64_t ignore_index,
                      const char* op = "cross_entropy") {
  int64_t counted = 0;
  for (int64_t r = 0; r < M; ++r) {
    if (targets[r] == ignore_index) continue;
    REGEN_CHECK(targets[r] >= 0 && targets[r] < V, op, ": target ", targets[r], " of row ", r,
                " is out of range for V = ", V, " classes (ignore_index is ", ignore_index, ")");
    ++counted;
  }
  return counted;
}
}  // namespace

template <class T>
void cross_entropy_forward(const T* logits, const int64_t* targets, T* loss, T* lse, int64_t M,
                           int64_t V, int64_t ignore_index) {
  // The dry path (kernels.h): the scratch, requested and unused; targets are not read.
  const bool dry = dry_run_active();
  const int64_t counted = dry ? 0 : check_targets(targets, M, V, ignore_index);
  Workspace ws(Device::cpu(), static_cast<uint64_t>(M) * sizeof(double));
  if (dry) return;
  double* row_loss = ws.as<double>();
#pragma omp parallel for schedule(static) if (M * V > kParallelMin)
  for (int64_t r = 0; r < M; ++r) {
    const T* x = logits + r * V;
    const T mx = row_max(x, V);
    const double l = static_cast<double>(mx) + std::log(row_sum_exp(x, V, mx));
    lse[r] = static_cast<T>(l);
    row_loss[r] = targets[r] == ignore_index ? 0.0 : l - static_cast<double>(x[targets[r]]);
  }
  double total = 0;
  for (int64_t r = 0; r < M; ++r) total += row_loss[r];
  loss[0] = counted > 0 ? static_cast<T>(total / static_cast<double>(counted)) : T(0);
}

template <class T>
void cross_entropy_backward(const T* dloss, const T* logits, const int64_t* targets, const T* lse,
                            T* dlogits, int64_t M, int64_t V, int64_t ignore_index) {
  const int64_t counted = check_targets(targets, M, V, ignore_index);
  // d mean / d logit[r, j] = (softmax[r, j] - [j == target]) / counted for counted rows.
  const T g = counted > 0 ? static_cast<T>(static_cast<double>(dloss[0]) / counted) : T(0);
#pragma omp parallel for schedule(static) if (M * V > kParallelMin)
  for (int64_t r = 0; r < M; ++r) {
    const T* x = logits + r * V;
    T* dx = dlogits + r * V;
    if (targets[r] == ignore_index) {
      std::fill(dx, dx + V, T(0));
      continue;
    }
    row_scaled_softmax(x, dx, V, lse[r], g);
    dx[targets[r]] -= g;
  }
}

template void cross_entropy_forward<float>(const float*, const int64_t*, float*, float*, int64_t,
                                           int64_t, int64_t);
template void cross_entropy_forward<double>(const double*, const int64_t*, double*, double*,
                                            int64_t, int64_t, int64_t);
template void cross_entropy_backward<float>(const float*, const float*, const int64_t*,
                                            const float*, float*, int64_t, int64_t, int64_t);
template void cross_entropy_backward<double>(const double*, const double*, const int64_t*,
                                             const double*, double*, int64_t, int64_t, int64_t);

// ---- Chunked linear + cross-entropy: the row-wise pieces ------------------------------------

template <class T>
void linear_cross_entropy_scale(const T* dloss, const int64_t* targets, T* scale, int64_t M,
                                int64_t V, int64_t ignore_index) {
  REGEN_CHECK(M >= 0 && V > 0, "linear_cross_entropy: bad shape M=", M, " V=", V);
  const int64_t counted = check_targets(targets, M, V, ignore_index, "linear_cross_entropy");
  if (dloss == nullptr || scale == nullptr) return;
  // The same expression as cross_entropy_backward's g.
  scale[0] = counted > 0 ? static_cast<T>(static_cast<double>(dloss[0]) / counted) : T(0);
}

template <class T>
void linear_cross_entropy_forward_rows(T* logits, const T* bias, const int64_t* targets, T* lse,
                                       double* row_loss, int64_t rows, int64_t V,
                                       int64_t ignore_index) {
#pragma omp parallel for schedule(static) if (rows * V > kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    T* x = logits + r * V;
    if (bias) {
      for (int64_t j = 0; j < V; ++j) x[j] += bias[j];
    }
    const T mx = row_max(x, V);
    const double l = static_cast<double>(mx) + std::log(row_sum_exp(x, V, mx));
    lse[r] = static_cast<T>(l);
    const int64_t t = targets[r];
    // Targets were validated (linear_cross_entropy_scale); a bad one reads nothing.
    row_loss[r] = t == ignore_index || t < 0 || t >= V ? 0.0 : l - static_cast<double>(x[t]);
  }
}

template <class T>
void linear_cross_entropy_forward_loss(const double* row_loss, const int64_t* targets, T* loss,
                                       int64_t M, int64_t ignore_index) {
  double total = 0;
  int64_t counted = 0;
  for (int64_t r = 0; r < M; ++r) {
    total += row_loss[r];
    counted += targets[r] != ignore_index ? 1 : 0;
  }
  loss[0] = counted > 0 ? static_cast<T>(total / static_cast<double>(counted)) : T(0);
}

template <class T>
void linear_cross_entropy_backward_rows(T* logits, const T* bias, const int64_t* targets,
                                        const T* lse, const T* scale, int64_t rows, int64_t V,
                                        int64_t ignore_index) {
  const T g = scale[0];
#pragma omp parallel for schedule(static) if (rows * V > kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    T* x = logits + r * V;
    const int64_t t = targets[r];
    if (t == ignore_index || t < 0 || t >= V) {
      std::fill(x, x + V, T(0));
      continue;
    }
    const T l = lse[r];
    if (bias) {
      for (int64_t j = 0; j < V; ++j) x[j] = g * row_exp((x[j] + bias[j]) - l);
    } else {
      row_scaled_softmax(x, x, V, l, g);
    }
    x[t] -= g;
  }
}

#define REGEN_LCE_INSTANTIATE(T)                                                                 \
  template void linear_cross_entropy_scale<T>(const T*, const int64_t*, T*, int64_t, int64_t,    \
                                              int64_t);                                          \
  template void linear_cross_entropy_forward_rows<T>(T*, const T*, const int64_t*, T*, double*,  \
                                                     int64_t, int64_t, int64_t);                 \
  template void linear_cross_entropy_forward_loss<T>(const double*, const int64_t*, T*, int64_t, \
                                                     int64_t);                                   \
  template void linear_cross_entropy_backward_rows<T>(T*, const T*, const int64_t*, const T*,    \
                                                      const T*, int64_t, int64_t, int64_t);
REGEN_LCE_INSTANTIATE(float)
REGEN_LCE_INSTANTIATE(double)
#undef REGEN_LCE_INSTANTIATE

}  // namespace regen::cpu
