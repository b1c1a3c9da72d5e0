// Internal to kernels/cpu: the 16-bit conv2d pass that conv_transpose2d's forward needs beyond the
// launchers of kernels/kernels.h. Defined in kernels/cpu/conv2d.cpp; tests:
// tests/test_amp_gemm_ops.cpp.
#pragma once

#include "regen/kernels/shapes.h"

namespace regen::cpu {

// T = bfloat16 or float16. conv2d's backward-data (dy: (N, K, P, Q), w: (K, C, R, S) -> dx:
// (N, C, H, W)) with bias: (C) or null added to every plane of channel c in f32, before the one
// rounding of each dx element to 16 bits.
template <class T>
void conv2d_backward_data_with_bias(const T* dy, const T* w, const T* bias, T* dx,
                                    const ConvShape& s);

}  // namespace regen::cpu
