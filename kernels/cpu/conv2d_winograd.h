// Winograd F(2x2, 3x3) for the f32 3x3 stride-1 convolutions (forward, and backward-data where it
// is itself a stride-1 convolution of dy). Internal to kernels/cpu (conv2d.cpp calls it);
// algorithm, workspace and measurements in docs/kernels.md, "Winograd F(2x2, 3x3), fused".
#pragma once

#include <cstdint>

#include "regen/kernels/shapes.h"

namespace regen::cpu::winograd {

// Which algorithm conv2d's f32 3x3 stride-1 passes use: direct (the packed GEMM with implicit
// im2col, the default) or winograd (forward() where applies() holds). Read once from the
// environment variable REGEN_CPU_CONV (direct or winograd; anything else is an error naming the
// variable). Winograd is not the default: its layers run at 0.57-0.73x the direct path's time,
// but whole ResNet-152 steps gained only 5% at the median of eleven pairs (0.78-1.11x), within
// the noise of the machine it was measured on, where profiles showed the rest of the step
// slowing (docs/kernels.md, "Winograd F(2x2, 3x3), fused").
enum class Algo { direct, winograd };
Algo algo();
// For tests and benchmarks: while one lives, algo() answers `a`. Not for concurrent use.
class ScopedAlgo {
 public:
  explicit ScopedAlgo(Algo a);
  ~ScopedAlgo();
  ScopedAlgo(const ScopedAlgo&) = delete;
  ScopedAlgo& operator=(const ScopedAlgo&) = delete;

 private:
  int previous_;
};

// Whether conv2d's f32 passes use forward() for this convolution: algo() is winograd, 3x3,
// stride 1, padding at most 2, at least 16 input and output channels and at least 128 output
// tiles (2x2 blocks of output pixels, over the batch). It depends on the shape only, never on
// the thread count, so results stay independent of it.
bool applies(const ConvShape& s);

// y (N, K, P, Q) = conv(x (N, C, H, W), w (K, C, 3, 3)) + bias (K, or null), by F(2x2, 3x3):
// 16 products of transformed filters (K, C) by transformed input tiles (C, tiles), on the packed
// GEMM's register tile, a block of 48 tiles at a time. Every byte of scratch comes from the
// allocator (category workspace), sized by the shape and the thread count only; in a dry run
// the workspace is requested and nothing is computed. Deterministic and independent of the
// thread count: every output is the same chain of operations whichever thread computes it.
void forward(const float* x, const float* w, const float* bias, float* y, const ConvShape& s);

}  // namespace regen::cpu::winograd
