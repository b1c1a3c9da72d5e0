// Shape records passed to the convolution, pooling and attention launchers (CPU and CUDA).
#pragma once

#include <cstdint>

#include "core/error.h"

namespace regen {

// x: (N, C, H, W), w: (K, C, R, S), y: (N, K, P, Q). Dilation 1, groups 1.
struct ConvShape {
  int64_t N = 0, C = 0, H = 0, W = 0;
  int64_t K = 0, R = 0, S = 0;
  int64_t stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0;
  int64_t P = 0, Q = 0;
};

inline ConvShape make_conv_shape(int64_t N, int64_t C, int64_t H, int64_t W, int64_t K,
                                 int64_t R, int64_t S, int64_t stride_h, int64_t stride_w,
                                 int64_t pad_h, int64_t pad_w) {
  ConvShape s{N, C, H, W, K, R, S, stride_h, stride_w, pad_h, pad_w, 0, 0};
  REGEN_CHECK(stride_h > 0 && stride_w > 0 && pad_h >= 0 && pad_w >= 0, "conv2d: stride ",
              stride_h, "x", stride_w, " must be positive and padding ", pad_h, "x", pad_w,
              " non-negative");
  s.P = (H + 2 * pad_h - R) / stride_h + 1;
  s.Q = (W + 2 * pad_w - S) / stride_w + 1;
  REGEN_CHECK(H + 2 * pad_h >= R && W + 2 * pad_w >= S && s.P > 0 && s.Q > 0, "conv2d: kernel ",
              R, "x", S, " does not fit input ", H, "x", W, " with padding ", pad_h, "x", pad_w);
  return s;
}

// x: (N, C, H, W), y: (N, C, P, Q).
struct PoolShape {
  int64_t N = 0, C = 0, H = 0, W = 0;
  int64_t kh = 1, kw = 1, stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0;
  int64_t P = 0, Q = 0;
};

inline PoolShape make_pool_shape(int64_t N, int64_t C, int64_t H, int64_t W, int64_t kh,
                                 int64_t kw, int64_t stride_h, int64_t stride_w, int64_t pad_h,
                                 int64_t pad_w) {
  PoolShape s{N, C, H, W, kh, kw, stride_h, stride_w, pad_h, pad_w, 0, 0};
  REGEN_CHECK(kh > 0 && kw > 0 && stride_h > 0 && stride_w > 0, "pool2d: kernel ", kh, "x", kw,
              " and stride ", stride_h, "x", stride_w, " must be positive");
  REGEN_CHECK(pad_h >= 0 && pad_w >= 0 && 2 * pad_h <= kh && 2 * pad_w <= kw, "pool2d: padding ",
              pad_h, "x", pad_w, " must be at most half the kernel ", kh, "x", kw);
  s.P = (H + 2 * pad_h - kh) / stride_h + 1;
  s.Q = (W + 2 * pad_w - kw) / stride_w + 1;
  REGEN_CHECK(H + 2 * pad_h >= kh && W + 2 * pad_w >= kw && s.P > 0 && s.Q > 0, "pool2d: kernel ",
              kh, "x", kw, " does not fit input ", H, "x", W);
  return s;
}

// Multi-head attention over a packed projection. qkv: (B, S, 3, H, Dh), i.e. (B, S, 3*D) with
// q in [0, D), k in [D, 2D), v in [2D, 3D) and head h at [h*Dh, (h+1)*Dh) of each (the layout of
// torch.nn.MultiheadAttention's in_proj). out: (B, S, H, Dh) = (B, S, D). lse: (B, H, S).
struct AttentionShape {
  int64_t B = 0, S = 0, H = 0, Dh = 0;
  float scale = 1.0f;       // applied to q.k (usually 1/sqrt(Dh))
  bool causal = false;      // key j > query i is masked
  float dropout_p = 0.0f;   // on the attention probabilities
  uint64_t seed = 0;        // Philox stream of the dropout mask; element index
  uint64_t stream = 0;      // ((b*H + h)*S + i)*S + j
};

// Up to 6 dimensions: y.shape[i] = shape[perm[i]].
struct PermuteShape {
  int ndim = 0;
  int64_t shape[6] = {0, 0, 0, 0, 0, 0};
  int64_t perm[6] = {0, 0, 0, 0, 0, 0};
};

}  // namespace regen
