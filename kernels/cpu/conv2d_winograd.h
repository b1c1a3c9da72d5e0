// Winograd F(2x2, 3x3) and F(4x4, 3x3) for the 3x3 stride-1 convolutions (forward, and
// backward-data where it is itself a stride-1 convolution of dy; backward-filter by F(2x2, 3x3)).
// Internal to kernels/cpu (conv2d.cpp calls it); algorithm, workspace and measurements in
// docs/kernels.md, "Winograd F(2x2, 3x3), fused".
#pragma once

#include <cstdint>

#include "regen/core/half.h"
#include "regen/kernels/shapes.h"

namespace regen::cpu::winograd {

// Which algorithm conv2d's 3x3 stride-1 passes (f32, bf16, f16) use: winograd (the default:
// forward(), backward_filter() and backward-data as a flipped forward(), where applies() holds) or
// direct (the packed GEMM with implicit im2col, as every other convolution). Read once from the
// environment variable REGEN_CPU_CONV (winograd or direct; anything else is an error naming the
// variable; `regen bench train --cpu-conv` sets it for a run, or alternates the two). Measured on
// ResNet-152 (batch 4, 224, 2 threads, `--cpu-conv both`): whole steps at 0.83-0.90x the direct
// path's time (docs/kernels.md, "Winograd F(2x2, 3x3), fused").
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

// Whether conv2d's f32, bf16 and f16 passes use Winograd for this convolution: algo() is winograd,
// 3x3, stride 1, padding at most 2, at least 16 input and output channels and at least 128 output
// tiles (2x2 blocks of output pixels, over the batch). It depends on the shape only, never on
// the thread count, so results stay independent of it.
bool applies(const ConvShape& s);

// The output tile forward() uses for a convolution that applies(): 4 (F(4x4, 3x3): 36 products
// per 16 outputs, 4x fewer multiplications than the direct convolution) where the output planes
// split into whole 4x4 tiles, at least 128 of them over the batch; else 2 (F(2x2, 3x3): 16 per
// 4, 2.25x fewer). Shape only, like applies(). F(4x4)'s transforms scale by up to 8 and 1/24,
// so it rounds more: scaled errors of 0.5e-6 to 2.4e-6 against F(2x2)'s 0.7e-7 to 2.7e-7
// (tests/test_ops_vision.cpp).
int tile_size(const ConvShape& s);
// For tests and benchmarks: while one lives, tile_size() answers m (2 or 4; 0: its own choice).
// Not for concurrent use.
class ScopedTileSize {
 public:
  explicit ScopedTileSize(int m);
  ~ScopedTileSize();
  ScopedTileSize(const ScopedTileSize&) = delete;
  ScopedTileSize& operator=(const ScopedTileSize&) = delete;

 private:
  int previous_;
};

// y (N, K, P, Q) = conv(x (N, C, H, W), w (K, C, 3, 3)) + bias (K, or null), by F(m x m, 3x3)
// with m = tile_size(s): (m + 2)^2 products of transformed filters (K, C) by transformed input
// tiles (C, tiles), on the packed GEMM's register tile, a block of 48 tiles at a time. Every byte
// of scratch comes from the allocator (category workspace), sized by the shape and the thread count
// only; in a dry run the workspace is requested and nothing is computed. Deterministic and
// independent of the thread count: every output is the same chain of operations whichever thread
// computes it.
// flipped: w is not this convolution's (K, C, 3, 3) but the (C, K, 3, 3) weights of the one whose
// backward-data it is, read flipped in space with K and C swapped (no flipped copy is made).
// E: float, or bfloat16 and float16 (core/half.h), widened as they are read, the transforms and
// products in f32 as for float, each output rounded once to E.
template <class E>
void forward(const E* x, const E* w, const E* bias, E* y, const ConvShape& s, bool flipped = false);

// dw (K, C, 3, 3) = the filter gradient of forward()'s convolution, from x and dy (N, K, P, Q),
// written (not accumulated), by F(2x2, 3x3): dU[xi] (K, C) = dM[xi] (K, tiles) * V[xi]^T, with V
// forward's input transform and dM = A dy A^T per tile, summed over chunks of 240 tiles in order,
// then dw = G^T dU G. Threads take whole xi (a product's every element is one thread's chain over
// the tiles in order), so results do not depend on the thread count. Workspace: the chunk's
// transforms and dU (16 (C + K) 240 + 16 K C floats) and each thread's panels, from the
// allocator; requested, and nothing computed, in a dry run.
template <class E>
void backward_filter(const E* x, const E* dy, E* dw, const ConvShape& s);

}  // namespace regen::cpu::winograd
