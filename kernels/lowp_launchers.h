// The 16-bit (bfloat16, float16) launchers of the ops whose 16-bit form differs from the f32 one
// in its parameters: the norms read f32 parameters and write f32 statistics beside a 16-bit x
// (the precision policy's fp32_statistics, autograd/precision.h), and dropout's launchers take the
// f32 kernel's mask. One declaration for the ops (autograd/ops_{batchnorm,dropout,layernorm,
// rmsnorm}.cpp) and the tests that call the launchers directly; defined for the CPU in
// kernels/cpu/ and for CUDA in kernels/cuda/ (the 16-bit CUDA launchers, kernels.h kHalfLaunchers).
#pragma once

#include "regen/kernels/kernels.h"

namespace regen {

// batchnorm2d: x, y, dy, dx: (N, C, HW) in T; every (C) array in f32. As batchnorm_* in
// kernels/kernels.h otherwise.
REGEN_LAUNCHER(batchnorm_forward_train_lowp,
               (const T* x, const float* gamma, const float* beta, T* y, float* mean, float* invstd,
                float* running_mean, float* running_var, int64_t N, int64_t C, int64_t HW,
                double momentum, double eps))
REGEN_LAUNCHER(batchnorm_forward_eval_lowp,
               (const T* x, const float* gamma, const float* beta, const float* running_mean,
                const float* running_var, T* y, int64_t N, int64_t C, int64_t HW, double eps))
REGEN_LAUNCHER(batchnorm_backward_lowp,
               (const T* dy, const T* x, const float* gamma, const float* mean, const float* invstd,
                T* dx, float* dgamma, float* dbeta, int64_t N, int64_t C, int64_t HW))
REGEN_LAUNCHER(batchnorm_backward_eval_lowp,
               (const T* dy, const T* x, const float* gamma, const float* running_mean,
                const float* running_var, T* dx, float* dgamma, float* dbeta, int64_t N, int64_t C,
                int64_t HW, double eps))

// dropout: x, y: (n) in T; the mask and scale of dropout_forward (kernels.h), computed in f32 and
// rounded once.
REGEN_LAUNCHER(dropout_forward_lowp,
               (const T* x, T* y, int64_t n, float p, uint64_t seed, uint64_t stream))
REGEN_LAUNCHER(dropout_backward_lowp,
               (const T* dy, T* dx, int64_t n, float p, uint64_t seed, uint64_t stream))

// layernorm: x, y, dy, dx: (M, N) in T; gamma, beta, dgamma, dbeta: (N) and mean, rstd: (M) in f32.
// As layernorm_forward/backward (kernels/kernels.h) otherwise.
REGEN_LAUNCHER(layernorm_forward_lowp, (const T* x, const float* gamma, const float* beta, T* y,
                                        float* mean, float* rstd, int64_t M, int64_t N, double eps))
REGEN_LAUNCHER(layernorm_backward_lowp,
               (const T* dy, const T* x, const float* gamma, const float* mean, const float* rstd,
                T* dx, float* dgamma, float* dbeta, int64_t M, int64_t N))

// layernorm of an f32 x under autocast (LayerNormAttrs::save_dtype, autograd/ops.h): x, y, dy, dx
// and every statistic in f32 as layernorm_forward/backward, and the normalized input
// xhat = (x - mean) * rstd: (M, N) rounded once to T (bf16, f16), which backward reads in place of
// x (half the bytes of the f32 x the op would otherwise save). The forward's y, mean and rstd are
// layernorm_forward's bit for bit.
REGEN_LAUNCHER(layernorm_forward_save_xhat,
               (const float* x, const float* gamma, const float* beta, float* y, float* mean,
                float* rstd, T* xhat, int64_t M, int64_t N, double eps))
REGEN_LAUNCHER(layernorm_backward_xhat,
               (const float* dy, const T* xhat, const float* gamma, const float* rstd, float* dx,
                float* dgamma, float* dbeta, int64_t M, int64_t N))

// rmsnorm: x, y, dy, dx in T; weight, rstd and dweight in f32. As rmsnorm_forward/backward
// (autograd/ops_rmsnorm.cpp) otherwise.
REGEN_LAUNCHER(rmsnorm_forward_lowp, (const T* x, const float* weight, T* y, float* rstd, int64_t M,
                                      int64_t N, double eps))
REGEN_LAUNCHER(rmsnorm_backward_lowp,
               (const T* dy, const T* x, const float* weight, const float* rstd, T* dx,
                float* dweight, int64_t M, int64_t N))

}  // namespace regen
