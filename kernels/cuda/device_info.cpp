// What regen asks of a CUDA device beyond the runtime's basics (declared in
// kernels/cuda/cuda_kernels.h): its compute capability, for the precision check of
// session/options.cpp (bf16 needs 8.0). The host emulation (scripts/cuda-emu) has no device to
// ask: its stand-in answers the capability the build targets by default (stand-ins/
// emu_device_attributes.h).
#include <cuda_runtime.h>

#include <map>
#include <mutex>

#include "regen/core/cuda/runtime.h"
#include "regen/kernels/cuda/cuda_kernels.h"

#if __has_include("emu_device_attributes.h")
#include "emu_device_attributes.h"
#endif

namespace regen::cuda {

ComputeCapability compute_capability(int device) {
  ComputeCapability cc;
  REGEN_CUDA_CHECK(cudaDeviceGetAttribute(&cc.major, cudaDevAttrComputeCapabilityMajor, device));
  REGEN_CUDA_CHECK(cudaDeviceGetAttribute(&cc.minor, cudaDevAttrComputeCapabilityMinor, device));
  return cc;
}

bool has_tensor_cores(int device) {
  static std::mutex mutex;
  static std::map<int, bool> known;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = known.find(device);
  if (it == known.end()) it = known.emplace(device, compute_capability(device).major >= 8).first;
  return it->second;
}

}  // namespace regen::cuda
