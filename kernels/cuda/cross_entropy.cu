// CUDA cross-entropy fused with log-softmax (declared in kernels/cuda/cuda_kernels.h; CPU
// reference kernels/cpu/cross_entropy.cpp; test tests/cuda/test_cuda_ops.cpp).
//
// Forward: one block per row computes the row's logsumexp and loss (in double, like the CPU);
// a single block then sums the row losses in row order (fixed tree) and divides by the number of
// rows whose target is not ignore_index (0 when there are none). Backward: one block counts those
// rows and forms dloss / count, then one block per row writes softmax - onehot scaled by it.
// Out-of-range targets: the kernels record the smallest bad row in a device word (atomicMin on
// an integer: the result does not depend on timing) and skip the read; the launcher reads the
// word back (one synchronization) and throws regen::Error naming the row and the target.
//
// The chunked linear + cross-entropy op (autograd/ops_cross_entropy.cpp) uses the same kernels per
// chunk of rows: linear_cross_entropy_scale validates the targets (one synchronization) and forms
// dloss / count on the device (ce_count_kernel); forward_rows adds the bias in place and writes
// the row lse and loss (ce_rows_kernel's arithmetic); forward_loss is ce_mean_kernel;
// backward_rows turns a chunk of logits into dlogits in place. The 16-bit path of that op
// (autograd/ops_linear_cross_entropy_lowp.cpp) tiles the vocabulary in backward: block_dlogits is
// backward_rows on a (rows, n) block of vocabulary columns [v0, v0 + n), the arithmetic of the
// CPU's block_dlogits there.
#include <cstdint>

#include "regen/core/tensor.h"
#include "regen/kernels/cuda/common.cuh"
#include "regen/kernels/cuda/cuda_kernels.h"

namespace regen::cuda {
namespace {

constexpr int kThreads = 256;
constexpr unsigned long long kNoBadRow = ~0ull;

__device__ __forceinline__ bool target_ok(int64_t t, int64_t V, int64_t ignore_index) {
  return t == ignore_index || (t >= 0 && t < V);
}

// logits: (M, V), targets: (M) -> lse: (M), row_loss: (M) doubles (0 for ignored rows).
__global__ void __launch_bounds__(kThreads)
    ce_rows_kernel(const float* logits, const int64_t* targets, int64_t V, int64_t ignore_index,
                   float* lse, double* row_loss, unsigned long long* bad_row) {
  __shared__ float scratch[32];
  const int64_t r = blockIdx.x;
  const float* x = logits + r * V;
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < V; j += kThreads) mx = fmaxf(mx, x[j]);
  mx = dev::block_max(mx, scratch);
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < V; j += kThreads) sum += expf(x[j] - mx);
  sum = dev::block_sum(sum, scratch);
  if (threadIdx.x == 0) {
    const double l = static_cast<double>(mx) + log(static_cast<double>(sum));
    lse[r] = static_cast<float>(l);
    const int64_t t = targets[r];
    double loss = 0.0;
    if (!target_ok(t, V, ignore_index)) {
      atomicMin(bad_row, static_cast<unsigned long long>(r));
    } else if (t != ignore_index) {
      loss = l - static_cast<double>(x[t]);
    }
    row_loss[r] = loss;
  }
}

// row_loss: (M), targets: (M) -> loss: (1). One block; each thread sums a contiguous range of rows
// in order, then the block combines the ranges in a fixed tree.
__global__ void __launch_bounds__(1024)
    ce_mean_kernel(const double* row_loss, const int64_t* targets, int64_t M, int64_t ignore_index,
                   float* loss) {
  __shared__ double scratch_d[32];
  __shared__ double scratch_c[32];
  const int64_t per = (M + blockDim.x - 1) / blockDim.x;
  const int64_t r0 = threadIdx.x * per;
  const int64_t r1 = r0 + per < M ? r0 + per : M;
  double s = 0.0, count = 0.0;
  for (int64_t r = r0; r < r1; ++r) {
    s += row_loss[r];
    count += targets[r] != ignore_index ? 1.0 : 0.0;
  }
  s = dev::block_sum(s, scratch_d);
  count = dev::block_sum(count, scratch_c);
  if (threadIdx.x == 0) loss[0] = count > 0.0 ? static_cast<float>(s / count) : 0.0f;
}

// targets: (M), dloss: (1) -> scale: (1) = dloss / (number of counted rows), bad_row.
__global__ void __launch_bounds__(1024)
    ce_count_kernel(const int64_t* targets, int64_t M, int64_t V, int64_t ignore_index,
                    const float* dloss, float* scale, unsigned long long* bad_row) {
  __shared__ double scratch[32];
  double count = 0.0;
  for (int64_t r = threadIdx.x; r < M; r += blockDim.x) {
    const int64_t t = targets[r];
    if (!target_ok(t, V, ignore_index)) {
      atomicMin(bad_row, static_cast<unsigned long long>(r));
    } else if (t != ignore_index) {
      count += 1.0;
    }
  }
  count = dev::block_sum(count, scratch);
  if (threadIdx.x == 0 && dloss != nullptr && scale != nullptr) {  // null: validation only
    scale[0] = count > 0.0 ? static_cast<float>(static_cast<double>(dloss[0]) / count) : 0.0f;
  }
}

// logits, dlogits: (M, V), lse, targets: (M). One block per row.
__global__ void __launch_bounds__(kThreads)
    ce_backward_kernel(const float* logits, const int64_t* targets, const float* lse,
                       const float* scale, float* dlogits, int64_t V, int64_t ignore_index) {
  const int64_t r = blockIdx.x;
  const int64_t t = targets[r];
  float* dx = dlogits + r * V;
  if (t == ignore_index || t < 0 || t >= V) {  // ignored (or bad: reported by the launcher)
    for (int64_t j = threadIdx.x; j < V; j += kThreads) dx[j] = 0.0f;
    return;
  }
  const float* x = logits + r * V;
  const float g = scale[0], l = lse[r];
  for (int64_t j = threadIdx.x; j < V; j += kThreads) {
    float v = g * expf(x[j] - l);
    if (j == t) v -= g;
    dx[j] = v;
  }
}

// logits: (rows, V) chunk, in place += bias (or null); targets: (rows), validated -> lse: (rows),
// row_loss: (rows) doubles (0 for ignored rows). One block per row.
__global__ void __launch_bounds__(kThreads)
    lce_rows_kernel(float* logits, const float* bias, const int64_t* targets, int64_t V,
                    int64_t ignore_index, float* lse, double* row_loss) {
  __shared__ float scratch[32];
  const int64_t r = blockIdx.x;
  float* x = logits + r * V;
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < V; j += kThreads) {
    float v = x[j];
    if (bias) {
      v += bias[j];
      x[j] = v;
    }
    mx = fmaxf(mx, v);
  }
  mx = dev::block_max(mx, scratch);  // its barriers also publish the biased logits to thread 0
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < V; j += kThreads) sum += expf(x[j] - mx);
  sum = dev::block_sum(sum, scratch);
  if (threadIdx.x == 0) {
    const double l = static_cast<double>(mx) + log(static_cast<double>(sum));
    lse[r] = static_cast<float>(l);
    const int64_t t = targets[r];
    row_loss[r] = t == ignore_index || t < 0 || t >= V ? 0.0 : l - static_cast<double>(x[t]);
  }
}

// block: (rows, n) logits of vocabulary columns [v0, v0 + n) -> their gradient in place; bias: all
// V columns, or null; targets, lse: the block's rows. One block of threads per row; the same
// expression per element as ce_backward_kernel. A whole chunk of rows is the block v0 = 0, n = V.
__global__ void __launch_bounds__(kThreads)
    lce_block_dlogits_kernel(float* block, const float* bias, const int64_t* targets,
                             const float* lse, const float* scale, int64_t n, int64_t v0, int64_t V,
                             int64_t ignore_index) {
  const int64_t r = blockIdx.x;
  const int64_t t = targets[r];
  float* x = block + r * n;
  if (t == ignore_index || t < 0 || t >= V) {
    for (int64_t j = threadIdx.x; j < n; j += kThreads) x[j] = 0.0f;
    return;
  }
  const float g = scale[0], l = lse[r];
  for (int64_t j = threadIdx.x; j < n; j += kThreads) {
    const float logit = bias ? x[j] + bias[v0 + j] : x[j];
    float v = g * expf(logit - l);
    if (v0 + j == t) v -= g;
    x[j] = v;
  }
}

void check_shape(const char* name, int64_t M, int64_t V) {
  REGEN_CHECK(M >= 0 && V > 0, name, ": bad shape M=", M, " V=", V);
  REGEN_CHECK(M <= 0x7fffffff, name, ": ", M, " rows are too many");
}

[[noreturn]] void report_bad_target(const char* name, unsigned long long row,
                                    const int64_t* targets, int64_t V, int64_t ignore_index) {
  const int64_t t = detail::read_back(targets + row);
  REGEN_FAIL(name, ": target ", t, " of row ", row, " is out of range for V = ", V,
             " classes (ignore_index is ", ignore_index, ")");
}

}  // namespace

// logits: (M, V), targets: (M) -> loss: (1), lse: (M)
void cross_entropy_forward(const float* logits, const int64_t* targets, float* loss, float* lse,
                           int64_t M, int64_t V, int64_t ignore_index) {
  check_shape("cross_entropy_forward", M, V);
  if (M == 0) {
    if (!dry_run_active()) fill(loss, 1, 0.0f);
    return;
  }
  // [bad_row (8 bytes) | pad to 256 | row_loss (M doubles)]
  Workspace ws(detail::device(), 256 + static_cast<uint64_t>(M) * sizeof(double));
  if (dry_run_active()) return;  // the dry path (kernels.h): the workspace, requested and unused
  auto* bad_row = ws.as<unsigned long long>();
  double* row_loss = reinterpret_cast<double*>(static_cast<char*>(ws.data()) + 256);
  REGEN_CUDA_CHECK(cudaMemsetAsync(bad_row, 0xff, sizeof(unsigned long long), stream()));
  ce_rows_kernel<<<static_cast<unsigned>(M), kThreads, 0, stream()>>>(
      logits, targets, V, ignore_index, lse, row_loss, bad_row);
  REGEN_CUDA_LAUNCH_CHECK("cross_entropy_forward");
  ce_mean_kernel<<<1, 1024, 0, stream()>>>(row_loss, targets, M, ignore_index, loss);
  REGEN_CUDA_LAUNCH_CHECK("cross_entropy_forward");
  const unsigned long long bad = detail::read_back_flag(bad_row, kNoBadRow);
  if (bad != kNoBadRow) report_bad_target("cross_entropy_forward", bad, targets, V, ignore_index);
}

// dloss: (1) -> dlogits: (M, V)
void cross_entropy_backward(const float* dloss, const float* logits, const int64_t* targets,
                            const float* lse, float* dlogits, int64_t M, int64_t V,
                            int64_t ignore_index) {
  check_shape("cross_entropy_backward", M, V);
  if (M == 0) return;
  // [bad_row (8 bytes) | scale (4 bytes)]
  Workspace ws(detail::device(), 16);
  if (dry_run_active()) return;  // the dry path (kernels.h): the workspace, requested and unused
  auto* bad_row = ws.as<unsigned long long>();
  float* scale = reinterpret_cast<float*>(static_cast<char*>(ws.data()) + 8);
  REGEN_CUDA_CHECK(cudaMemsetAsync(bad_row, 0xff, sizeof(unsigned long long), stream()));
  ce_count_kernel<<<1, 1024, 0, stream()>>>(targets, M, V, ignore_index, dloss, scale, bad_row);
  REGEN_CUDA_LAUNCH_CHECK("cross_entropy_backward");
  ce_backward_kernel<<<static_cast<unsigned>(M), kThreads, 0, stream()>>>(
      logits, targets, lse, scale, dlogits, V, ignore_index);
  REGEN_CUDA_LAUNCH_CHECK("cross_entropy_backward");
  const unsigned long long bad = detail::read_back_flag(bad_row, kNoBadRow);
  if (bad != kNoBadRow) report_bad_target("cross_entropy_backward", bad, targets, V, ignore_index);
}

// targets: (M); dloss, scale: (1) or both null (validation only)
void linear_cross_entropy_scale(const float* dloss, const int64_t* targets, float* scale, int64_t M,
                                int64_t V, int64_t ignore_index) {
  check_shape("linear_cross_entropy", M, V);
  // [bad_row (8 bytes)]
  Workspace ws(detail::device(), 8);
  if (dry_run_active()) return;  // the dry path (kernels.h): the workspace, requested and unused
  auto* bad_row = ws.as<unsigned long long>();
  REGEN_CUDA_CHECK(cudaMemsetAsync(bad_row, 0xff, sizeof(unsigned long long), stream()));
  ce_count_kernel<<<1, 1024, 0, stream()>>>(targets, M, V, ignore_index, dloss, scale, bad_row);
  REGEN_CUDA_LAUNCH_CHECK("linear_cross_entropy_scale");
  const unsigned long long bad = detail::read_back_flag(bad_row, kNoBadRow);
  if (bad != kNoBadRow) report_bad_target("linear_cross_entropy", bad, targets, V, ignore_index);
}

// logits: (rows, V) in place; bias: (V) or null; targets, lse, row_loss: (rows)
void linear_cross_entropy_forward_rows(float* logits, const float* bias, const int64_t* targets,
                                       float* lse, double* row_loss, int64_t rows, int64_t V,
                                       int64_t ignore_index) {
  check_shape("linear_cross_entropy_forward_rows", rows, V);
  if (rows == 0) return;
  lce_rows_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream()>>>(
      logits, bias, targets, V, ignore_index, lse, row_loss);
  REGEN_CUDA_LAUNCH_CHECK("linear_cross_entropy_forward_rows");
}

// row_loss, targets: (M) -> loss: (1)
void linear_cross_entropy_forward_loss(const double* row_loss, const int64_t* targets, float* loss,
                                       int64_t M, int64_t ignore_index) {
  REGEN_CHECK(M >= 0 && M <= 0x7fffffff, "linear_cross_entropy_forward_loss: bad row count ", M);
  if (M == 0) return fill(loss, 1, 0.0f);
  ce_mean_kernel<<<1, 1024, 0, stream()>>>(row_loss, targets, M, ignore_index, loss);
  REGEN_CUDA_LAUNCH_CHECK("linear_cross_entropy_forward_loss");
}

// logits: (rows, V) in place -> dlogits; bias: (V) or null; targets, lse: (rows); scale: (1)
void linear_cross_entropy_backward_rows(float* logits, const float* bias, const int64_t* targets,
                                        const float* lse, const float* scale, int64_t rows,
                                        int64_t V, int64_t ignore_index) {
  check_shape("linear_cross_entropy_backward_rows", rows, V);
  if (rows == 0) return;
  lce_block_dlogits_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream()>>>(
      logits, bias, targets, lse, scale, V, 0, V, ignore_index);
  REGEN_CUDA_LAUNCH_CHECK("linear_cross_entropy_backward_rows");
}

// block: (rows, n), columns [v0, v0 + n) of V; bias: (V) or null; targets, lse: (rows)
void linear_cross_entropy_block_dlogits(float* block, const float* bias, const int64_t* targets,
                                        const float* lse, const float* scale, int64_t rows,
                                        int64_t n, int64_t v0, int64_t V, int64_t ignore_index) {
  check_shape("linear_cross_entropy_block_dlogits", rows, V);
  REGEN_CHECK(n > 0 && v0 >= 0 && v0 + n <= V, "linear_cross_entropy_block_dlogits: columns [", v0,
              ", ", v0 + n, ") are not inside V = ", V);
  if (rows == 0) return;
  lce_block_dlogits_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream()>>>(
      block, bias, targets, lse, scale, n, v0, V, ignore_index);
  REGEN_CUDA_LAUNCH_CHECK("linear_cross_entropy_block_dlogits");
}

}  // namespace regen::cuda
