// CUDA cast (declared in autograd/ops_cast.cpp; CPU reference kernels/cpu/convert.cpp cast; test
// tests/test_autocast.cpp on the CPU, the op table's cast row on a GPU): y (n, dtype `to`) = x (n,
// dtype `from`), each of f32, f64, bf16, f16. Every element goes through f32 with core/half.h's
// integer conversions, which are __host__ __device__: the bits are the CPU's.
#include <cstdint>

#include "regen/core/half.h"
#include "regen/kernels/cuda/common.cuh"
#include "regen/kernels/cuda/cuda_kernels.h"

namespace regen::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float load_f32(const void* x, int code, int64_t i) {
  switch (code) {
    case 0:
      return static_cast<const float*>(x)[i];
    case 1:
      return static_cast<float>(static_cast<const double*>(x)[i]);
    case 2:
      return half::from_bf16(static_cast<const uint16_t*>(x)[i]);
    default:
      return half::from_fp16(static_cast<const uint16_t*>(x)[i]);
  }
}

__device__ __forceinline__ void store_f32(void* y, int code, int64_t i, float v) {
  switch (code) {
    case 0:
      static_cast<float*>(y)[i] = v;
      break;
    case 1:
      static_cast<double*>(y)[i] = static_cast<double>(v);
      break;
    case 2:
      static_cast<uint16_t*>(y)[i] = half::to_bf16(v);
      break;
    default:
      static_cast<uint16_t*>(y)[i] = half::to_fp16(v);
  }
}

__global__ void cast_kernel(const void* x, int from, void* y, int to, int64_t n) {
  for (int64_t i = dev::global_thread(); i < n; i += dev::grid_stride()) {
    if (from == 1 && to == 1) {
      static_cast<double*>(y)[i] = static_cast<const double*>(x)[i];  // not reached: same dtype
    } else {
      store_f32(y, to, i, load_f32(x, from, i));
    }
  }
}

int code_of(DType d) {
  switch (d) {
    case DType::f32:
      return 0;
    case DType::f64:
      return 1;
    case DType::bf16:
      return 2;
    case DType::f16:
      return 3;
    default:
      REGEN_FAIL("cast: ", dtype_name(d), " is not a floating dtype (f32, f64, bf16, f16)");
  }
}

}  // namespace

void cast(const void* x, DType from, void* y, DType to, int64_t n) {
  const int f = code_of(from), t = code_of(to);
  if (n <= 0) return;
  if (from == to) {
    memcpy(y, x, static_cast<size_t>(n) * dtype_size(from), cudaMemcpyDeviceToDevice);
    return;
  }
  cast_kernel<<<detail::grid_blocks(n, kThreads), kThreads, 0, stream()>>>(x, f, y, t, n);
  REGEN_CUDA_LAUNCH_CHECK("cast");
}

}  // namespace regen::cuda
