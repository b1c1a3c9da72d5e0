// Tensor-core flash attention (kernels/cuda/attention_tc.cu): fused multi-head self-attention
// forward and backward on mma.sync m16n8k16 in bf16 and f16 with f32 softmax statistics and
// accumulators, on the packed qkv layout of kernels/shapes.h (AttentionShape) and with the same
// pointer arguments as the FP32 / 16-bit kernels of kernels/cuda/attention.cu, so a caller can
// choose either. The 16-bit cuda::attention_forward / attention_backward
// (kernels/cuda/attention.cu) call these wherever attention_tc_unsupported answers null; see
// docs/kernels.md, "Tensor-core attention". CPU reference kernels/cpu/attention.cpp; tests
// tests/cuda/test_cuda_attention_tc.cpp, on a GPU and in the host emulation
// (scripts/cuda-emu/run.sh flash).
#pragma once

#ifdef REGEN_WITH_CUDA
#include <cstdint>

#include "regen/core/half.h"
#include "regen/kernels/shapes.h"

namespace regen::cuda::tc {

// Why the tensor-core kernels cannot take this call, or null when they can. They take: a head dim
// (s.Dh) of 64 or 128; no dropout (s.dropout_p == 0); B*H <= 65535; qkv (and every other tensor)
// under 2^31 elements; each pointer 16-byte aligned (every row of q, k, v, out, dout then starts
// on a 16-byte boundary, as cp.async needs); a current device of compute capability 8.0 or later
// (asked once per device). `ptrs` are the call's tensors (null entries are skipped). A dispatch
// asks this first and runs kernels/cuda/attention.cu when it answers a reason.
const char* attention_tc_unsupported(const AttentionShape& s, const void* const* ptrs, int n_ptrs);

// qkv: (B, S, 3*H*Dh), key_pad: (B, S) (nonzero = padded key) or null -> out: (B, S, H*Dh)
// (T, written), lse: (B, H, S) (f32, written: the natural-log logsumexp of the scaled, masked
// scores, -inf for a row with no visible key, whose output is 0). T = bfloat16 or float16. Throws a
// regen::Error naming the reason when attention_tc_unsupported answers one.
template <class T>
void attention_forward_tc(const T* qkv, const int32_t* key_pad, T* out, float* lse,
                          const AttentionShape& s);

// dout: (B, S, H*Dh), qkv, out and lse as the forward gave them -> dqkv: (B, S, 3*H*Dh), written
// (every element). Requests one Workspace block of B*H*S floats (the row terms D_i).
template <class T>
void attention_backward_tc(const T* dout, const T* qkv, const T* out, const float* lse,
                           const int32_t* key_pad, T* dqkv, const AttentionShape& s);

}  // namespace regen::cuda::tc
#endif
