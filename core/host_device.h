// REGEN_HD: a function compiled for the host and, under nvcc, for the device too, so the CPU and
// CUDA kernels run the same code (core/philox.h, kernels/unary_ops.h, core/half.h).
#pragma once

#if defined(__CUDACC__)
#define REGEN_HD __host__ __device__ __forceinline__
#else
#define REGEN_HD inline
#endif
