// Shape records passed to the convolution, pooling and attention launchers (CPU and CUDA).
#pragma once

#include <cstdint>

#include "regen/core/error.h"

namespace regen {

// x: (N, C, H, W), w: (K, C, R, S), y: (N, K, P, Q). Dilation 1, groups 1.
struct ConvShape {
  int64_t N = 0, C = 0, H = 0, W = 0;
  int64_t K = 0, R = 0, S = 0;
  int64_t stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0;
  int64_t P = 0, Q = 0;
};

inline ConvShape make_conv_shape(int64_t N, int64_t C, int64_t H, int64_t W, int64_t K, int64_t R,
                                 int64_t S, int64_t stride_h, int64_t stride_w, int64_t pad_h,
                                 int64_t pad_w) {
  ConvShape s{N, C, H, W, K, R, S, stride_h, stride_w, pad_h, pad_w, 0, 0};
  REGEN_CHECK(stride_h > 0 && stride_w > 0 && pad_h >= 0 && pad_w >= 0, "conv2d: stride ", stride_h,
              "x", stride_w, " must be positive and padding ", pad_h, "x", pad_w, " non-negative");
  s.P = (H + 2 * pad_h - R) / stride_h + 1;
  s.Q = (W + 2 * pad_w - S) / stride_w + 1;
  REGEN_CHECK(H + 2 * pad_h >= R && W + 2 * pad_w >= S && s.P > 0 && s.Q > 0, "conv2d: kernel ", R,
              "x", S, " does not fit input ", H, "x", W, " with padding ", pad_h, "x", pad_w);
  return s;
}

// A transposed convolution (PyTorch's conv_transpose2d, groups 1, dilation 1) is the adjoint of
// a conv2d; the launchers take that conv2d's ConvShape. x: (N, C_in, H_in, W_in), weight:
// (C_in, C_out, kh, kw) -> y: (N, C_out, H_out, W_out), H_out = (H_in - 1) * stride_h - 2 pad_h +
// kh + out_pad_h (W alike). The conv2d maps y's shape to x's: N, C = C_out, H = H_out, W = W_out,
// K = C_in, R = kh, S = kw, P = H_in, Q = W_in (exact because out_pad < stride).
inline ConvShape make_conv_transpose_shape(int64_t N, int64_t C_in, int64_t H_in, int64_t W_in,
                                           int64_t C_out, int64_t kh, int64_t kw, int64_t stride_h,
                                           int64_t stride_w, int64_t pad_h, int64_t pad_w,
                                           int64_t out_pad_h, int64_t out_pad_w) {
  REGEN_CHECK(stride_h > 0 && stride_w > 0 && pad_h >= 0 && pad_w >= 0 && out_pad_h >= 0 &&
                  out_pad_w >= 0 && out_pad_h < stride_h && out_pad_w < stride_w,
              "conv_transpose2d: stride ", stride_h, "x", stride_w, " must be positive, padding ",
              pad_h, "x", pad_w, " non-negative and output padding ", out_pad_h, "x", out_pad_w,
              " non-negative and smaller than the stride");
  const int64_t H = (H_in - 1) * stride_h - 2 * pad_h + kh + out_pad_h;
  const int64_t W = (W_in - 1) * stride_w - 2 * pad_w + kw + out_pad_w;
  REGEN_CHECK(H_in > 0 && W_in > 0 && kh > 0 && kw > 0 && H > 0 && W > 0,
              "conv_transpose2d: input ", H_in, "x", W_in, " with kernel ", kh, "x", kw,
              ", stride ", stride_h, "x", stride_w, " and padding ", pad_h, "x", pad_w,
              " gives an empty output ", H, "x", W);
  const ConvShape s =
      make_conv_shape(N, C_out, H, W, C_in, kh, kw, stride_h, stride_w, pad_h, pad_w);
  REGEN_ASSERT(s.P == H_in && s.Q == W_in);
  return s;
}

// x: (N, C, H, W), y: (N, C, P, Q).
struct PoolShape {
  int64_t N = 0, C = 0, H = 0, W = 0;
  int64_t kh = 1, kw = 1, stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0;
  int64_t P = 0, Q = 0;
};

inline PoolShape make_pool_shape(int64_t N, int64_t C, int64_t H, int64_t W, int64_t kh, int64_t kw,
                                 int64_t stride_h, int64_t stride_w, int64_t pad_h, int64_t pad_w) {
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

// max_pool2d's packed argmax (docs/ops.md, "Packed saves"): each output keeps the position of its
// maximum inside its own kh x kw window, (h - window top) * kw + (w - window left), in the fewest
// bits of 1, 2, 4, 8, 16 or 32 that hold kh * kw positions; codes go least significant first into
// 32-bit words, and each (n, c) plane starts a new word, so planes are written independently.
inline int pool_code_bits(const PoolShape& s) {
  const int64_t positions = s.kh * s.kw;
  int bits = 1;
  while (bits < 32 && (int64_t{1} << bits) < positions) bits *= 2;
  return bits;
}
// Words of one plane's codes; the packed argmax of a pooling is (N, C, this) words.
inline int64_t pool_code_words_per_plane(const PoolShape& s) {
  const int64_t per_word = 32 / pool_code_bits(s);
  return (s.P * s.Q + per_word - 1) / per_word;
}

// Multi-head attention over a packed projection. qkv: (B, S, 3, H, Dh), i.e. (B, S, 3*D) with
// q in [0, D), k in [D, 2D), v in [2D, 3D) and head h at [h*Dh, (h+1)*Dh) of each (the layout of
// torch.nn.MultiheadAttention's in_proj). out: (B, S, H, Dh) = (B, S, D). lse: (B, H, S).
struct AttentionShape {
  int64_t B = 0, S = 0, H = 0, Dh = 0;
  float scale = 1.0f;      // applied to q.k (usually 1/sqrt(Dh))
  bool causal = false;     // key j > query i is masked
  float dropout_p = 0.0f;  // on the attention probabilities
  uint64_t seed = 0;       // Philox stream of the dropout mask; element index
  uint64_t stream = 0;     // ((b*H + h)*S + i)*S + j
};

// A block of rows along one dimension (concat, split, narrow): x viewed as (outer, x_dim, inner),
// y as (outer, y_dim, inner); rows [x_start, x_start + len) of x go to [y_start, y_start + len)
// of y.
struct SliceShape {
  int64_t outer = 0, len = 0, inner = 0;
  int64_t x_dim = 0, x_start = 0;
  int64_t y_dim = 0, y_start = 0;
};

// Up to 6 dimensions: y.shape[i] = shape[perm[i]].
struct PermuteShape {
  int ndim = 0;
  int64_t shape[6] = {0, 0, 0, 0, 0, 0};
  int64_t perm[6] = {0, 0, 0, 0, 0, 0};
};

}  // namespace regen
