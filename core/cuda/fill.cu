// The device side of fill_, full and ones on CUDA (core/tensor.cpp): every element of a tensor set
// to one bit pattern of 2, 4 or 8 bytes on the compute stream. The value is converted to the
// dtype's bits on the host, by the conversion the CPU's fill uses, so both devices hold the same
// bits; no host staging tensor and no host-to-device copy, so a fill can be captured in a CUDA
// graph (core/cuda/graph.h). Tests: tests/cuda/test_cuda_ops.cpp ("cuda fill"), also through the
// host emulation (scripts/cuda-emu/run.sh ops -tc="cuda fill*").
#include <cuda_runtime.h>

#include <cstdint>

#include "regen/core/cuda/runtime.h"
#include "regen/core/error.h"

namespace regen::cuda {
namespace {

constexpr int kThreads = 256;
// Enough blocks for every SM of an H100 many times over; a grid-stride loop covers the rest.
constexpr int64_t kMaxBlocks = 4096;

// dst: (n,), every element = pattern.
template <class T>
__global__ void fill_pattern_kernel(T* dst, int64_t n, T pattern) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    dst[i] = pattern;
  }
}

}  // namespace

void fill_pattern(void* dst, int64_t count, int width, uint64_t pattern) {
  REGEN_CHECK(width == 2 || width == 4 || width == 8, "fill_pattern: element width ", width,
              " bytes (2, 4 or 8 expected)");
  REGEN_CHECK(count >= 0, "fill_pattern: negative element count ", count);
  REGEN_CHECK(reinterpret_cast<uintptr_t>(dst) % static_cast<uintptr_t>(width) == 0,
              "fill_pattern: destination ", dst, " is not aligned to its ", width,
              "-byte elements");
  if (count == 0) return;
  int64_t blocks = (count + kThreads - 1) / kThreads;
  if (blocks > kMaxBlocks) blocks = kMaxBlocks;
  const dim3 grid(static_cast<unsigned>(blocks));
  switch (width) {
    case 2:
      fill_pattern_kernel<uint16_t><<<grid, kThreads, 0, stream()>>>(
          static_cast<uint16_t*>(dst), count, static_cast<uint16_t>(pattern));
      break;
    case 4:
      fill_pattern_kernel<uint32_t><<<grid, kThreads, 0, stream()>>>(
          static_cast<uint32_t*>(dst), count, static_cast<uint32_t>(pattern));
      break;
    default:
      fill_pattern_kernel<uint64_t>
          <<<grid, kThreads, 0, stream()>>>(static_cast<uint64_t*>(dst), count, pattern);
  }
  // As REGEN_CUDA_LAUNCH_CHECK (kernels/cuda/check.h), which core does not include.
  REGEN_CUDA_CHECK(cudaGetLastError());
  if (sync_launches()) check_launch_completed("fill_pattern");
}

}  // namespace regen::cuda
