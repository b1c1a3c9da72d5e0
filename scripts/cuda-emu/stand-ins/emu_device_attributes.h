// Stand-in for the CUDA runtime's cudaDeviceGetAttribute in the host emulation (scripts/cuda-emu),
// for kernels/cuda/device_info.cpp, the one file that includes it (so the definition below is
// compiled once). The emulated device answers compute capability 9.0, the architecture regen
// builds for by default (REGEN_CUDA_ARCHS 90); any other attribute is cudaErrorInvalidValue.
#pragma once
#include <cuda_runtime_api.h>

extern "C" cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (!value || device != 0) return cudaErrorInvalidValue;
  switch (attr) {
    case cudaDevAttrComputeCapabilityMajor:
      *value = 9;
      return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor:
      *value = 0;
      return cudaSuccess;
    default:
      return cudaErrorInvalidValue;
  }
}
