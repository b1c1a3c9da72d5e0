// Device-side helpers shared by the CUDA kernels: warp and block reductions with a fixed
// combination order (the same bits on every run), and grid-stride index helpers.
// Included by kernels/cuda/*.cu only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "regen/kernels/cuda/check.h"
#include "regen/kernels/cuda/launch.h"

namespace regen::cuda::dev {

constexpr unsigned kFullMask = 0xffffffffu;

// Butterfly reductions: every lane ends with the same value, computed in the same order on every
// run (a + b == b + a bitwise, so the two partners of each step agree exactly).
template <class T>
__device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}
template <class T>
__device__ __forceinline__ T warp_max(T v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1)
    v = fmax(v, __shfl_xor_sync(kFullMask, v, offset));
  return v;
}
// Within aligned groups of `width` lanes (width a power of two <= 32).
template <int width, class T>
__device__ __forceinline__ T group_sum(T v) {
#pragma unroll
  for (int offset = width / 2; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}
template <int width>
__device__ __forceinline__ float group_max(float v) {
#pragma unroll
  for (int offset = width / 2; offset > 0; offset >>= 1) {
    v = fmaxf(v, __shfl_xor_sync(kFullMask, v, offset));
  }
  return v;
}

// Sum over the whole block (blockDim.x a multiple of 32, at most 1024); every thread receives
// the result. `scratch` holds 32 values. Safe to call repeatedly with the same scratch.
template <class T>
__device__ __forceinline__ T block_sum(T v, T* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int warps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // the previous call's readers are done with scratch
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : T(0);
  return warp_sum(v);  // every warp reduces the same values in the same order
}
__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int warps = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : -INFINITY;
  return warp_max(v);
}

__device__ __forceinline__ int64_t global_thread() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_stride() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

}  // namespace regen::cuda::dev
