// Convolution through cuDNN (legacy convolution API of cuDNN 9), the comparison path of the
// native implicit-GEMM kernels (kernels/cuda/conv2d.cu). Compiled to nothing unless
// REGEN_WITH_CUDNN. Test: tests/cuda/test_cuda_ops.cpp (cuDNN vs CPU); timing: `regen bench
// kernels`.
//
// - One cuDNN handle per device, bound to regen::cuda::stream().
// - Descriptors and algorithm choices are cached per (device, shape, TF32 setting).
// - Algorithms come from cuDNN's heuristics (the *_v7 queries), keeping only those cuDNN reports
//   as CUDNN_DETERMINISTIC and, in FP32 mode, only plain-FP32 ones (CUDNN_FMA_MATH), so the
//   comparison with the FP32 native kernels is like for like. With TF32 enabled (set_tf32) an
//   algorithm may also use tensor cores (CUDNN_DEFAULT_MATH or CUDNN_TENSOR_OP_MATH: TF32 for FP32
//   data on Ampere and later), never down-conversion to FP16
//   (CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION).
// - Each pass (forward, backward data, backward filter) has its own convolution descriptor, set to
//   the math type cuDNN reported for the algorithm chosen for that pass: cuDNN runs an algorithm
//   with the descriptor's math type, so both must be the pair the heuristic proposed (as PyTorch
//   does after its search). The descriptors are set once, when the plan is made, never per call.
// - 16-bit tensors (bf16, f16): the same passes with CUDNN_DATA_BFLOAT16 / CUDNN_DATA_HALF tensors
//   and filters and CUDNN_DATA_FLOAT convolutions (f32 compute: products and sums in f32, each
//   stored element rounded once), any deterministic algorithm cuDNN offers for them (tensor cores
//   included). A bias is written into the output first (a 16-bit copy, exact) and the convolution
//   adds its f32 result to it (beta = 1), so the bias is added in f32 before the one rounding, as
//   the native kernels and the CPU do (fill_bias_kernel, a plain copy). Compiled in CUDA builds
//   with cuDNN; not run without a GPU (the host emulation of scripts/cuda-emu has no cuDNN).
// - Workspaces come from regen's allocator per call (Workspace, category workspace), capped at
//   kMaxWorkspace; cuDNN never allocates device memory for a convolution itself.
#ifdef REGEN_WITH_CUDNN
#include <cudnn.h>

#include <array>
#include <map>
#include <mutex>
#include <type_traits>
#include <vector>

#include "regen/core/tensor.h"
#include "regen/kernels/cuda/check.h"
#include "regen/kernels/cuda/common.cuh"
#include "regen/kernels/cuda/conv2d_cudnn.h"
#include "regen/kernels/cuda/cuda_kernels.h"
#include "regen/kernels/cuda/launch.h"

namespace regen::cuda::cudnn_conv {
namespace {

constexpr size_t kMaxWorkspace = 1ull << 30;

struct Plan {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr, bias = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  // Same geometry; the math type of the pass's algorithm.
  cudnnConvolutionDescriptor_t fwd_conv = nullptr, bwd_data_conv = nullptr,
                               bwd_filter_conv = nullptr;
  cudnnConvolutionFwdAlgo_t fwd{};
  cudnnConvolutionBwdDataAlgo_t bwd_data{};
  cudnnConvolutionBwdFilterAlgo_t bwd_filter{};
  size_t fwd_bytes = 0, bwd_data_bytes = 0, bwd_filter_bytes = 0;
  bool have_fwd = false, have_bwd_data = false, have_bwd_filter = false;
};

using Key = std::array<int64_t, 14>;

cudnnHandle_t handle() {
  static std::mutex mutex;
  static std::vector<cudnnHandle_t> handles;
  const int d = current_device();
  std::lock_guard<std::mutex> lock(mutex);
  if (static_cast<int>(handles.size()) <= d) handles.resize(d + 1, nullptr);
  if (!handles[d]) {
    REGEN_CUDNN_CHECK(cudnnCreate(&handles[d]));
    REGEN_CUDNN_CHECK(cudnnSetStream(handles[d], stream()));
  }
  return handles[d];
}

int i32(int64_t v) {
  REGEN_CHECK(v >= 0 && v <= 0x7fffffff, "cuDNN convolution: dimension ", v,
              " does not fit in int");
  return static_cast<int>(v);
}

// cuDNN's type of an element type.
template <class E>
constexpr cudnnDataType_t data_type() {
  if constexpr (std::is_same<E, bfloat16>::value) {
    return CUDNN_DATA_BFLOAT16;
  } else if constexpr (std::is_same<E, float16>::value) {
    return CUDNN_DATA_HALF;
  } else {
    static_assert(std::is_same<E, float>::value, "float, bfloat16 or float16");
    return CUDNN_DATA_FLOAT;
  }
}

// The math type the heuristics are asked with: tensor cores allowed (TF32, or 16-bit data) or FMA
// only (FP32).
cudnnMathType_t wanted_math(cudnnDataType_t dt) {
  if (dt != CUDNN_DATA_FLOAT) return CUDNN_TENSOR_OP_MATH;
  return tf32_enabled() ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
}

// Whether an algorithm's math type is one the current mode allows: FP32 only FMA; TF32 and 16-bit
// data also tensor cores, but never FP16 down-conversion of f32 data.
bool math_allowed(cudnnMathType_t m, cudnnDataType_t dt) {
  if (m == CUDNN_FMA_MATH) return true;
  return (tf32_enabled() || dt != CUDNN_DATA_FLOAT) &&
         (m == CUDNN_DEFAULT_MATH || m == CUDNN_TENSOR_OP_MATH);
}

// The first heuristic result that succeeded, is deterministic, fits the workspace cap and uses an
// allowed math type, or nullptr.
template <class Perf>
const Perf* pick(const Perf* perf, int count, cudnnDataType_t dt) {
  for (int i = 0; i < count; ++i) {
    if (perf[i].status != CUDNN_STATUS_SUCCESS) continue;
    if (perf[i].determinism != CUDNN_DETERMINISTIC) continue;
    if (perf[i].memory > kMaxWorkspace) continue;
    if (!math_allowed(perf[i].mathType, dt)) continue;
    return &perf[i];
  }
  return nullptr;
}

// The convolution computes in f32 for every data type (16-bit data: cuDNN's pseudo-half and
// pseudo-bf16 configurations).
cudnnConvolutionDescriptor_t conv_descriptor(const ConvShape& s, cudnnDataType_t dt) {
  cudnnConvolutionDescriptor_t d = nullptr;
  REGEN_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&d));
  REGEN_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(d, i32(s.pad_h), i32(s.pad_w), i32(s.stride_h),
                                                    i32(s.stride_w), 1, 1, CUDNN_CROSS_CORRELATION,
                                                    CUDNN_DATA_FLOAT));
  REGEN_CUDNN_CHECK(cudnnSetConvolutionMathType(d, wanted_math(dt)));
  return d;
}

Plan& plan_for(const ConvShape& s, cudnnDataType_t dt) {
  static std::mutex mutex;
  static std::map<Key, Plan> plans;
  const Key key{current_device(),
                s.N,
                s.C,
                s.H,
                s.W,
                s.K,
                s.R,
                s.S,
                s.stride_h,
                s.stride_w,
                s.pad_h,
                s.pad_w,
                tf32_enabled() ? 1 : 0,
                static_cast<int64_t>(dt)};
  std::lock_guard<std::mutex> lock(mutex);
  auto it = plans.find(key);
  if (it != plans.end()) return it->second;
  Plan p;
  cudnnHandle_t h = handle();
  REGEN_CUDNN_CHECK(cudnnCreateTensorDescriptor(&p.x));
  REGEN_CUDNN_CHECK(cudnnCreateTensorDescriptor(&p.y));
  REGEN_CUDNN_CHECK(cudnnCreateTensorDescriptor(&p.bias));
  REGEN_CUDNN_CHECK(cudnnCreateFilterDescriptor(&p.w));
  REGEN_CUDNN_CHECK(cudnnSetTensor4dDescriptor(p.x, CUDNN_TENSOR_NCHW, dt, i32(s.N), i32(s.C),
                                               i32(s.H), i32(s.W)));
  REGEN_CUDNN_CHECK(cudnnSetTensor4dDescriptor(p.y, CUDNN_TENSOR_NCHW, dt, i32(s.N), i32(s.K),
                                               i32(s.P), i32(s.Q)));
  REGEN_CUDNN_CHECK(cudnnSetTensor4dDescriptor(p.bias, CUDNN_TENSOR_NCHW, dt, 1, i32(s.K), 1, 1));
  REGEN_CUDNN_CHECK(cudnnSetFilter4dDescriptor(p.w, dt, CUDNN_TENSOR_NCHW, i32(s.K), i32(s.C),
                                               i32(s.R), i32(s.S)));
  p.fwd_conv = conv_descriptor(s, dt);
  p.bwd_data_conv = conv_descriptor(s, dt);
  p.bwd_filter_conv = conv_descriptor(s, dt);
  int n, P, Q, K;
  REGEN_CUDNN_CHECK(cudnnGetConvolution2dForwardOutputDim(p.fwd_conv, p.x, p.w, &n, &K, &P, &Q));
  REGEN_CHECK(n == s.N && K == s.K && P == s.P && Q == s.Q, "cuDNN convolution: output ", n, "x", K,
              "x", P, "x", Q, " differs from regen's shape");

  // Per pass: the heuristics' candidates, the first allowed one, then its math type on the pass's
  // descriptor before the workspace query (the size depends on the pair) and every call.
  constexpr int kMaxAlgos = 16;
  int count = 0;
  cudnnConvolutionFwdAlgoPerf_t fwd[kMaxAlgos];
  REGEN_CUDNN_CHECK(
      cudnnGetConvolutionForwardAlgorithm_v7(h, p.x, p.w, p.fwd_conv, p.y, kMaxAlgos, &count, fwd));
  if (const auto* chosen = pick(fwd, count, dt)) {
    p.have_fwd = true;
    p.fwd = chosen->algo;
    REGEN_CUDNN_CHECK(cudnnSetConvolutionMathType(p.fwd_conv, chosen->mathType));
    REGEN_CUDNN_CHECK(
        cudnnGetConvolutionForwardWorkspaceSize(h, p.x, p.w, p.fwd_conv, p.y, p.fwd, &p.fwd_bytes));
  }
  cudnnConvolutionBwdDataAlgoPerf_t bd[kMaxAlgos];
  REGEN_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, p.w, p.y, p.bwd_data_conv, p.x,
                                                                kMaxAlgos, &count, bd));
  if (const auto* chosen = pick(bd, count, dt)) {
    p.have_bwd_data = true;
    p.bwd_data = chosen->algo;
    REGEN_CUDNN_CHECK(cudnnSetConvolutionMathType(p.bwd_data_conv, chosen->mathType));
    REGEN_CUDNN_CHECK(cudnnGetConvolutionBackwardDataWorkspaceSize(
        h, p.w, p.y, p.bwd_data_conv, p.x, p.bwd_data, &p.bwd_data_bytes));
  }
  cudnnConvolutionBwdFilterAlgoPerf_t bf[kMaxAlgos];
  REGEN_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, p.x, p.y, p.bwd_filter_conv,
                                                                  p.w, kMaxAlgos, &count, bf));
  if (const auto* chosen = pick(bf, count, dt)) {
    p.have_bwd_filter = true;
    p.bwd_filter = chosen->algo;
    REGEN_CUDNN_CHECK(cudnnSetConvolutionMathType(p.bwd_filter_conv, chosen->mathType));
    REGEN_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterWorkspaceSize(
        h, p.x, p.y, p.bwd_filter_conv, p.w, p.bwd_filter, &p.bwd_filter_bytes));
  }
  return plans.emplace(key, p).first->second;
}

// y: (N, C, HW) = bias[c] per plane, a copy (so exact in any type): the output a 16-bit pass then
// adds its f32 result to (beta = 1).
template <class E>
__global__ void fill_bias_kernel(E* y, const E* bias, int64_t C, int64_t HW, int64_t total) {
  for (int64_t i = dev::global_thread(); i < total; i += dev::grid_stride()) {
    y[i] = bias[(i / HW) % C];
  }
}

template <class E>
void fill_bias(E* y, const E* bias, int64_t N, int64_t C, int64_t HW) {
  const int64_t total = N * C * HW;
  if (total == 0) return;
  fill_bias_kernel<E><<<detail::grid_blocks(total, 256), 256, 0, stream()>>>(y, bias, C, HW, total);
  REGEN_CUDA_LAUNCH_CHECK("cuDNN convolution (bias)");
}

void no_algo(const char* pass, const ConvShape& s, cudnnDataType_t dt) {
  const char* math = dt == CUDNN_DATA_BFLOAT16 ? "bf16 (f32 compute) "
                     : dt == CUDNN_DATA_HALF   ? "f16 (f32 compute) "
                     : tf32_enabled()          ? "FP32 or TF32 "
                                               : "FP32 (FMA) ";
  REGEN_FAIL("cuDNN offers no deterministic ", math, pass, " algorithm for conv N=", s.N,
             " C=", s.C, " H=", s.H, " W=", s.W, " K=", s.K, " R=", s.R, " S=", s.S, " stride ",
             s.stride_h, "x", s.stride_w, " pad ", s.pad_h, "x", s.pad_w,
             "; use set_conv_algo(native)");
}

}  // namespace

template <class E>
void forward(const E* x, const E* w, const E* bias, E* y, const ConvShape& s) {
  constexpr cudnnDataType_t dt = data_type<E>();
  Plan& p = plan_for(s, dt);
  if (!p.have_fwd) no_algo("forward", s, dt);
  Workspace ws(detail::device(), p.fwd_bytes);
  if (dry_run_active()) return;  // the dry path (kernels.h): the chosen algorithm's workspace
  const float one = 1.0f, zero = 0.0f;
  if (dt != CUDNN_DATA_FLOAT && bias) {
    // y = bias (a copy), then y = conv + y in f32 and one rounding.
    fill_bias(y, bias, s.N, s.K, s.P * s.Q);
    REGEN_CUDNN_CHECK(cudnnConvolutionForward(handle(), &one, p.x, x, p.w, w, p.fwd_conv, p.fwd,
                                              ws.data(), p.fwd_bytes, &one, p.y, y));
    return;
  }
  REGEN_CUDNN_CHECK(cudnnConvolutionForward(handle(), &one, p.x, x, p.w, w, p.fwd_conv, p.fwd,
                                            ws.data(), p.fwd_bytes, &zero, p.y, y));
  if (bias) REGEN_CUDNN_CHECK(cudnnAddTensor(handle(), &one, p.bias, bias, &one, p.y, y));
}

template <class E>
void backward_data(const E* dy, const E* w, const E* bias, E* dx, const ConvShape& s) {
  constexpr cudnnDataType_t dt = data_type<E>();
  Plan& p = plan_for(s, dt);
  if (!p.have_bwd_data) no_algo("backward-data", s, dt);
  Workspace ws(detail::device(), p.bwd_data_bytes);
  if (dry_run_active()) return;  // the dry path (kernels.h): the chosen algorithm's workspace
  const float one = 1.0f, zero = 0.0f;
  // With a bias, dx = bias (a copy) first and the convolution adds its f32 result to it.
  if (bias) fill_bias(dx, bias, s.N, s.C, s.H * s.W);
  REGEN_CUDNN_CHECK(cudnnConvolutionBackwardData(handle(), &one, p.w, w, p.y, dy, p.bwd_data_conv,
                                                 p.bwd_data, ws.data(), p.bwd_data_bytes,
                                                 bias ? &one : &zero, p.x, dx));
}

template <class E>
void backward_filter(const E* x, const E* dy, E* dw, const ConvShape& s) {
  constexpr cudnnDataType_t dt = data_type<E>();
  Plan& p = plan_for(s, dt);
  if (!p.have_bwd_filter) no_algo("backward-filter", s, dt);
  Workspace ws(detail::device(), p.bwd_filter_bytes);
  if (dry_run_active()) return;  // the dry path (kernels.h): the chosen algorithm's workspace
  const float one = 1.0f, zero = 0.0f;
  REGEN_CUDNN_CHECK(cudnnConvolutionBackwardFilter(handle(), &one, p.x, x, p.y, dy,
                                                   p.bwd_filter_conv, p.bwd_filter, ws.data(),
                                                   p.bwd_filter_bytes, &zero, p.w, dw));
}

#define REGEN_CUDNN_CONV(E)                                                           \
  template void forward<E>(const E*, const E*, const E*, E*, const ConvShape&);       \
  template void backward_data<E>(const E*, const E*, const E*, E*, const ConvShape&); \
  template void backward_filter<E>(const E*, const E*, E*, const ConvShape&);
REGEN_CUDNN_CONV(float)
REGEN_CUDNN_CONV(bfloat16)
REGEN_CUDNN_CONV(float16)
#undef REGEN_CUDNN_CONV

}  // namespace regen::cuda::cudnn_conv
#endif
