// The differentiable ops. Each records a Node (when grad mode is on and an input requires grad)
// and runs its kernel through the dispatch point of kernels/kernels.h. Every op has a
// finite-difference gradient check in tests/test_gradcheck*.cpp.
//
// Saved tensors (what backward reads) are listed beside each op; an op saves only what its
// backward needs. All tensors are contiguous; views (reshape, flatten) share storage.
#pragma once

#include <cstdint>
#include <vector>

#include "regen/autograd/tape.h"

// The op list's entries for the ops this header declares, in OpKind order (autograd/op_list.h
// makes the OpKind enum from them and the unary list): a new op's entry and its function are added
// in this one file. Only autograd/op_list.h expands it; the rest of the library sees OpKind as an
// opaque enum.
// clang-format off
#define REGEN_DECLARED_OPS(X) \
  X(linear) X(matmul) X(bmm) X(conv2d) X(batchnorm2d) X(add) X(mul) \
  X(scale) X(max_pool2d) X(avg_pool2d) X(global_avg_pool) X(reshape) X(transpose) \
  X(permute) X(embedding) X(layernorm) X(softmax) X(attention) X(dropout) X(cross_entropy) \
  X(sum) X(mean) X(linear_cross_entropy) X(concat) X(split) X(narrow) X(upsample2x) \
  X(conv_transpose2d) X(rmsnorm) X(cast) X(gather_shards)
// clang-format on

namespace regen {

// ---- Attribute records (trivially copyable; stored in Node::attrs) --------------------------

struct ShapeAttr {
  int32_t ndim = 0;
  int64_t dims[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  static ShapeAttr of(const Shape& s);
  Shape shape() const { return Shape(dims, dims + ndim); }
};

struct LinearAttrs {
  bool has_bias = false;
};
struct BmmAttrs {
  bool trans_a = false, trans_b = false;
};
struct Conv2dAttrs {
  int64_t stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0;
  bool has_bias = false;
};
struct BatchNormAttrs {
  bool training = true;
  double momentum = 0.1;
  double eps = 1e-5;
};
struct ScaleAttrs {
  double alpha = 1.0;
};
struct Pool2dAttrs {
  int64_t kh = 1, kw = 1, stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0;
};
struct PermuteAttrs {
  int32_t ndim = 0;
  int64_t perm[6] = {0, 0, 0, 0, 0, 0};
};
struct LayerNormAttrs {
  double eps = 1e-5;
  // f32, or the 16-bit dtype autocast was on with when an f32 x was recorded: backward then reads
  // x's normalized form rounded to it (a hidden output) in place of x (docs/precision.md).
  DType save_dtype = DType::f32;
};
struct AttentionAttrs {
  int64_t num_heads = 1;
  bool causal = false;
  bool has_mask = false;
  float dropout_p = 0.0f;
  uint64_t seed = 0, stream = 0;  // drawn at record time; a replay reuses them
};
struct DropoutAttrs {
  float p = 0.0f;
  uint64_t seed = 0, stream = 0;  // drawn at record time; a replay reuses them
};
struct CrossEntropyAttrs {
  int64_t ignore_index = -100;
};
struct ConcatAttrs {
  int32_t dim = 0;  // resolved (non-negative); the inputs' extents come from their values
};
struct SplitAttrs {
  static constexpr int kMaxPieces = 11;  // as many int64 sizes as fit the 96-byte blob
  int32_t dim = 0;
  int32_t count = 0;
  int64_t sizes[kMaxPieces] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
};
struct NarrowAttrs {
  int32_t dim = 0;
  int64_t start = 0, length = 0;
};
enum class UpsampleMode : int32_t { nearest, bilinear };
struct UpsampleAttrs {
  UpsampleMode mode = UpsampleMode::nearest;
};
struct ConvTranspose2dAttrs {
  int64_t stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, out_pad_h = 0, out_pad_w = 0;
  bool has_bias = false;
};
struct LinearCrossEntropyAttrs {
  int64_t ignore_index = -100;
  int64_t chunk_rows = 1;  // resolved at record time (>= 1), so a replay chunks the same way
  bool has_bias = false;
  // Which gradients the forward computes for a unit loss gradient and saves as hidden outputs 2
  // (input), 3 (weight) and 4 (bias), for backward to scale by the loss's gradient: resolved at
  // record time (the inputs that require grad, when the op is recorded and does not recompute),
  // so a replay computes the same. 16-bit inputs' are f32 sums, rounded to grad_dtype (the
  // inputs' dtype) in backward, after the scaling.
  bool forward_dx = false, forward_dw = false, forward_db = false;
  DType grad_dtype = DType::f32;
};

// ---- Ops ------------------------------------------------------------------------------------

// x: (..., in), weight: (out, in), bias: (out) or undefined -> (..., out). Saves x, weight.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());
// a: (M, K), b: (K, N) -> (M, N). Saves a, b.
Tensor matmul(const Tensor& a, const Tensor& b);
// a: (B, M, K) (or (B, K, M) with trans_a), b: (B, K, N) (or (B, N, K)) -> (B, M, N). Saves a, b.
Tensor bmm(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false);

// x: (N, C, H, W), weight: (K, C, R, S), bias: (K) or undefined -> (N, K, P, Q). Saves x, weight.
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(),
              int64_t stride = 1, int64_t padding = 0);
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, int64_t stride_h,
              int64_t stride_w, int64_t pad_h, int64_t pad_w);

// x: (N, C, H, W); gamma, beta, running_mean, running_var: (C). Training uses batch statistics
// and updates the running ones (unbiased variance, momentum); eval uses the running ones.
// Training saves x and the batch mean and 1/std (hidden outputs); eval saves x.
Tensor batchnorm2d(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                   const Tensor& running_mean, const Tensor& running_var, bool training,
                   double momentum = 0.1, double eps = 1e-5);

// The unary element-wise ops are defined by their list (kernels/unary_ops.h; every one is declared
// in autograd/ops_unary.h); the two the built-in models use are declared here too.
Tensor relu(const Tensor& x);  // saves its output
Tensor gelu(const Tensor& x);  // exact (erf) GELU; saves its input
// a + b, where b has a's shape or a suffix of it (broadcast over leading dims). Saves nothing.
Tensor add(const Tensor& a, const Tensor& b);
// a * b, where b has a's shape or a suffix of it. Saves a and b.
Tensor mul(const Tensor& a, const Tensor& b);
Tensor scale(const Tensor& x, double alpha);  // alpha * x; saves nothing

// x: (N, C, H, W). max saves the argmax indices (a hidden i32 output); avg saves nothing.
Tensor max_pool2d(const Tensor& x, int64_t kernel, int64_t stride, int64_t padding = 0);
Tensor avg_pool2d(const Tensor& x, int64_t kernel, int64_t stride, int64_t padding = 0);
// (N, C, H, W) -> (N, C, 1, 1), the mean over H and W. Saves nothing.
Tensor global_avg_pool(const Tensor& x);

// Views sharing storage (one -1 allowed). Save nothing.
Tensor reshape(const Tensor& x, const Shape& shape);
Tensor flatten(const Tensor& x, int64_t start_dim = 1);  // dims start_dim.. merged
// Copies. Save nothing.
Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1);
Tensor permute(const Tensor& x, const std::vector<int64_t>& dims);

// Copies along one dimension of any rank (dim < 0 counts from the end). Save nothing.
// Joins tensors that agree outside `dim` (same dtype and device) along it.
Tensor concat(const std::vector<Tensor>& tensors, int64_t dim);
// Cuts x along `dim` into pieces of `sizes` (summing to x.size(dim); at most 11 pieces).
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim);
// Rows [start, start + length) of x along `dim` (start < 0 counts from the end).
Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length);

// x: (N, C, H, W) -> (N, C, 2H, 2W), as F.interpolate(scale_factor=2, mode='nearest' or
// mode='bilinear', align_corners=False). Saves nothing.
Tensor upsample2x(const Tensor& x, UpsampleMode mode = UpsampleMode::nearest);

// F.conv_transpose2d (groups 1, dilation 1): x: (N, C_in, H, W), weight: (C_in, C_out, kh, kw),
// bias: (C_out) or undefined -> (N, C_out, (H - 1) * stride - 2 padding + kh + output_padding, ...)
// with output_padding < stride. Saves x, weight.
Tensor conv_transpose2d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(),
                        int64_t stride = 1, int64_t padding = 0, int64_t output_padding = 0);
Tensor conv_transpose2d(const Tensor& x, const Tensor& weight, const Tensor& bias, int64_t stride_h,
                        int64_t stride_w, int64_t pad_h, int64_t pad_w, int64_t out_pad_h,
                        int64_t out_pad_w);

// ids: (...) i64 in [0, V), weight: (V, D) -> (..., D). Saves ids.
Tensor embedding(const Tensor& ids, const Tensor& weight);
// Over the last dimension; gamma, beta: (D). Saves x, gamma and the row mean and 1/std (hidden).
Tensor layernorm(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps = 1e-5);
// Over the last dimension: x * rstd * weight, rstd = 1/sqrt(mean(x^2) + eps) per row (RMSNorm);
// weight: (D). Saves x, weight and the row rstd (hidden). Python: regen.ops.rmsnorm.
Tensor rmsnorm(const Tensor& x, const Tensor& weight, double eps = 1e-6);
// Over the last dimension. Saves its output.
Tensor softmax(const Tensor& x);

// Fused multi-head self-attention on a packed projection.
// qkv: (B, S, 3*D) laid out [q | k | v] (torch.nn.MultiheadAttention's in_proj), D = heads * Dh;
// key_padding_mask: (B, S) i32, nonzero = padded key, or undefined -> (B, S, D), heads merged.
// Scores are scaled by 1/sqrt(Dh); dropout_p applies to the attention probabilities.
// Saves qkv, the output, the row logsumexp (B, heads, S) (a hidden output) and the mask when
// given; never an S x S matrix.
Tensor attention(const Tensor& qkv, int64_t num_heads, const Tensor& key_padding_mask = Tensor(),
                 bool causal = false, float dropout_p = 0.0f);

// Inverted dropout; identity when !training or p == 0 (no node is recorded then). The mask comes
// from the Philox stream (seed, stream) stored in the node: nothing is saved.
Tensor dropout(const Tensor& x, float p, bool training = true);

// logits: (M, V), targets: (M) i64 -> scalar mean over targets != ignore_index.
// Saves logits, targets and the row logsumexp (hidden output).
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index = -100);

// cross_entropy(linear(x, weight, bias), targets, ignore_index) without the (M, V) logits: rows
// are processed chunk_rows at a time, each chunk's logits computed into a workspace, in a fixed
// chunk order (deterministic). x: (M, K), weight: (V, K), bias: (V) or undefined, targets: (M) i64
// -> scalar mean over targets != ignore_index (0 when there are none). chunk_rows = 0 picks the
// rows whose (rows, V) chunk of logits is about 32 MiB (linear_cross_entropy_auto_rows). Never an
// (M, V) tensor; the working memory is one (chunk_rows, V) workspace.
// Recorded, the gradients are made one of two ways (the same values up to the order of f32 sums):
//  - recompute = false (the default): the forward turns each chunk's logits into their gradient
//    for a unit loss gradient at once and computes the gradients of x, weight and bias (those
//    that require grad) from it; it saves those (x's shape, weight's, bias's; f32 sums for 16-bit
//    inputs) and backward only scales them by the loss's gradient (16-bit inputs: then rounds them
//    once, so a scaled fp16 loss's gradients are formed in f32 first): three GEMMs in all. The
//    weight's gradient, (V, K), is held from the forward to the backward.
//  - recompute = true (f32, bf16, f16): saves x, weight, bias, targets and the row logsumexp
//    (hidden output) and recomputes the logits in backward, by vocabulary tiles: four GEMMs, and
//    no (V, K) gradient held across the step; the backward's working set is a block of logits, a
//    (tile, K) gradient tile and x's gradient.
Tensor linear_cross_entropy(const Tensor& x, const Tensor& weight, const Tensor& bias,
                            const Tensor& targets, int64_t ignore_index = -100,
                            int64_t chunk_rows = 0, bool recompute = false);
// The chunk size chunk_rows = 0 resolves to for M rows of V classes of `elem_bytes` each:
// about 32 MiB of logits, spread evenly over the fewest chunks (at least 1 row, at most M).
int64_t linear_cross_entropy_auto_rows(int64_t M, int64_t V, int64_t elem_bytes = 4);

// x converted to `dtype` (f32, f64, bf16, f16; rounded to nearest even, through f32: see
// kernels/cpu/convert.h cast); x itself, with no node recorded, when it already has that dtype.
// Backward casts the gradient back to x's dtype. Saves nothing. Autocast (AutocastScope,
// autograd/precision.h) records it in front of ops whose rule asks for another dtype.
Tensor cast(const Tensor& x, DType dtype);

Tensor sum(const Tensor& x);   // -> scalar (shape {}); saves nothing
Tensor mean(const Tensor& x);  // -> scalar; saves nothing

}  // namespace regen
