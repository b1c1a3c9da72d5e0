// The tensor-core convolution (kernels/cuda/conv2d_tc.cu): 2-D convolution forward, backward-data
// and backward-filter as GEMMs on mma.sync, in bf16 and f16 (m16n8k16) and TF32 (m16n8k8),
// accumulating in f32. Not yet reached from the ops' dispatch (`--conv native` runs
// kernels/cuda/conv2d.cu); see docs/kernels.md, "Tensor-core convolution". Tests:
// tests/cuda/test_cuda_conv_tc.cpp, on a GPU and in the host emulation (scripts/cuda-emu/run.sh
// tc).
#pragma once

#ifdef REGEN_WITH_CUDA
#include <cstdint>

#include "regen/core/half.h"
#include "regen/kernels/shapes.h"

namespace regen::cuda::tc {

// A convolution with dilation (ConvShape has none): P = (H + 2 pad_h - dil_h (R - 1) - 1) /
// stride_h + 1, Q alike. Groups are 1 (ConvShape and regen's conv2d have no groups).
struct ConvTcShape {
  int64_t N = 0, C = 0, H = 0, W = 0;
  int64_t K = 0, R = 0, S = 0;
  int64_t stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, dil_h = 1, dil_w = 1;
  int64_t P = 0, Q = 0;
};
// Checks the sizes (positive, the dilated kernel fits the padded input) and computes P, Q; a bad
// shape is a regen::Error naming it.
ConvTcShape make_conv_tc_shape(int64_t N, int64_t C, int64_t H, int64_t W, int64_t K, int64_t R,
                               int64_t S, int64_t stride_h, int64_t stride_w, int64_t pad_h,
                               int64_t pad_w, int64_t dil_h = 1, int64_t dil_w = 1);
// The same convolution as regen's ConvShape (dilation 1).
ConvTcShape conv_tc_shape(const ConvShape& s);

// Forward: x: (N, C, H, W), w: (K, C, R, S), bias: (K) or null -> y: (N, K, P, Q), written.
// T = bfloat16 or float16 (mma m16n8k16), or float (TF32, mma m16n8k8: x and w are rounded to
// TF32, to nearest with ties away from zero, as they are copied to the kernel's layout). Products
// are summed in f32; with bias added, each output is rounded once to T. x and w are first copied
// to NHWC and (K, R, S, C) layouts with C padded to a multiple of 16 bytes, in a Workspace
// (conv2d_forward_tc_workspace_bytes); the copies run on the stream before the GEMM and are part
// of the call's time. Needs a device of compute capability 8.0 or later (a clear regen::Error
// otherwise). Tensors must have fewer than 2^31 elements.
template <class T>
void conv2d_forward_tc(const T* x, const T* w, const T* bias, T* y, const ConvTcShape& s);
// The Workspace bytes conv2d_forward_tc<T> requests (one block) for shape s.
template <class T>
uint64_t conv2d_forward_tc_workspace_bytes(const ConvTcShape& s);

// Backward-data: dy: (N, K, P, Q), w: (K, C, R, S) -> dx: (N, C, H, W), written. The same GEMM
// kernel as the forward, over dy in NHWC spread out by the stride (zeros between its rows and
// columns, so the pass is a stride-1 convolution) with the filter flipped in R and S and
// transposed to (C, R, S, K); a stride of sh x sw multiplies sh*sw - 1 of every sh*sw terms by
// zero (the phase decomposition of kernels/cuda/conv2d.cu would skip them; not done yet). T and
// the rounding as in the forward.
template <class T>
void conv2d_backward_data_tc(const T* dy, const T* w, T* dx, const ConvTcShape& s);
template <class T>
uint64_t conv2d_backward_data_tc_workspace_bytes(const ConvTcShape& s);

// Backward-filter: x: (N, C, H, W), dy: (N, K, P, Q) -> dw: (K, C, R, S), written (not
// accumulated; no bias gradient: that is a per-channel sum of dy, for the native reduction). The
// same GEMM kernel over the im2col matrix of x, transposed to (C R S, N P Q) and materialized in
// the Workspace (C R S N P Q elements: no layout of x makes its chunks contiguous), and dy
// transposed to (K, N P Q); the long reduction is split (up to 64 ways, partials in f32, summed in
// a fixed order). T and the rounding as in the forward.
template <class T>
void conv2d_backward_filter_tc(const T* x, const T* dy, T* dw, const ConvTcShape& s);
template <class T>
uint64_t conv2d_backward_filter_tc_workspace_bytes(const ConvTcShape& s);

// ---- Probes of the primitives of kernels/cuda/mma.cuh (tests only) ----------------------------
// One warp loads `count` (1, 2 or 4) 8x8 matrices of 16-bit elements, src: (count, 8, 8)
// row-major, through shared memory with ldmatrix .x<count> (.trans when trans) -> out:
// (32 lanes, count registers), each register as the lane received it.
void ldmatrix_probe(int count, bool trans, const uint16_t* src, uint32_t* out);
// One warp computes D = A B (16 x 8, f32) with K = 16 through shared memory, ldmatrix and mma:
// a: (16, 16) row-major, b: (16, 8) row-major (k, n), d: (16, 8) row-major. T = bfloat16 or
// float16 (one m16n8k16; B is loaded with ldmatrix .trans from its (k, n) layout when b_trans,
// from an (n, k) copy without .trans otherwise) or float (TF32: two m16n8k8, both operands loaded
// without .trans from k-contiguous copies; a and b must already be TF32 values).
template <class T>
void mma_tile_probe(const T* a, const T* b, float* d, bool b_trans);

}  // namespace regen::cuda::tc
#endif
