// The cuDNN convolution path (kernels/cuda/conv2d_cudnn.cu), used by the conv2d launchers of
// kernels/cuda/conv2d.cu when set_conv_algo(ConvAlgo::cudnn) is in effect. cuDNN builds only.
#pragma once

#ifdef REGEN_WITH_CUDNN
#include "regen/kernels/shapes.h"

namespace regen::cuda::cudnn_conv {

// Same shapes and semantics as the launchers in kernels/cuda/cuda_kernels.h.
void forward(const float* x, const float* w, const float* bias, float* y, const ConvShape& s);
void backward_data(const float* dy, const float* w, float* dx, const ConvShape& s);
// dw only; dbias is the native deterministic reduction.
void backward_filter(const float* x, const float* dy, float* dw, const ConvShape& s);

}  // namespace regen::cuda::cudnn_conv
#endif
