// The cuDNN convolution path (kernels/cuda/conv2d_cudnn.cu), used by the conv2d launchers of
// kernels/cuda/conv2d.cu when set_conv_algo(ConvAlgo::cudnn) is in effect. cuDNN builds only.
#pragma once

#ifdef REGEN_WITH_CUDNN
#include "regen/kernels/shapes.h"

namespace regen::cuda::cudnn_conv {

// Same shapes and semantics as the launchers in kernels/cuda/cuda_kernels.h, for E = float and,
// with f32 compute (CUDNN_DATA_FLOAT convolutions, one rounding of each stored element), for
// E = bfloat16 and float16.
template <class E>
void forward(const E* x, const E* w, const E* bias, E* y, const ConvShape& s);
// bias: (C) or null, added to dx (conv_transpose2d's forward): for 16-bit E in f32 before the
// rounding, as the native path and the CPU do.
template <class E>
void backward_data(const E* dy, const E* w, const E* bias, E* dx, const ConvShape& s);
// dw only; dbias is the native deterministic reduction.
template <class E>
void backward_filter(const E* x, const E* dy, E* dw, const ConvShape& s);

}  // namespace regen::cuda::cudnn_conv
#endif
