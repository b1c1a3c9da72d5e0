// Every kernel launcher regen has, and the one dispatch point that picks the CPU or the CUDA
// launcher by device. A launcher takes raw pointers, sizes and shape records (shapes are written
// next to the pointers) and launches work; it never decides what to allocate except its own
// scratch, which comes from the allocator through core's Workspace (category workspace).
//
//   regen::cpu::<name><T>   kernels/cpu/<op>.cpp, T = float or double; the reference.
//   regen::cuda::<name>     kernels/cuda/<op>.cu, float; same arguments as the CPU launcher; and
//                           bfloat16 / float16 for the launchers of cuda::kHalfLaunchers (below).
//
// A launcher declared with REGEN_LAUNCHER (below) is declared once for both devices: its one
// parameter list, written in T, declares cpu::<name><T> and cuda::<name><T>; kernels/cpu/ defines
// the template for float and double, kernels/cuda/ for float. The older launchers below are
// declared twice (here and in kernels/cuda/cuda_kernels.h).
//
// Gradient conventions: launchers that produce gradients write (=) them; the autograd
// engine accumulates (+=) into parameters.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "regen/core/dry_run.h"
#include "regen/core/types.h"
#include "regen/kernels/half.h"
#include "regen/kernels/shapes.h"

// REGEN_LAUNCHER(name, (parameters written in T)): one declaration of a launcher for the CPU and
// CUDA, at namespace regen scope: cpu::name<T> (a kernels/cpu/*.cpp defines it and instantiates it
// for float and double) and, in a CUDA build, cuda::name<T> (a kernels/cuda/*.cu defines it and
// instantiates it for float). REGEN_LAUNCH calls cuda::name(args...), whose float pointers deduce
// T, so pass typed pointers (`p.defined() ? p.data<T>() : nullptr`, not a bare nullptr). It stands
// in this file, or beside the one op that calls the launcher (in its autograd/ops_<op>.cpp); either
// way a definition that differs from it fails to link, naming the launcher. Shapes go in a comment
// beside it, as for the launchers below.
#ifdef REGEN_WITH_CUDA
#define REGEN_LAUNCHER(name, params) \
  namespace cpu {                    \
  template <class T>                 \
  void name params;                  \
  }                                  \
  namespace cuda {                   \
  template <class T>                 \
  void name params;                  \
  }
#else
#define REGEN_LAUNCHER(name, params) \
  namespace cpu {                    \
  template <class T>                 \
  void name params;                  \
  }
#endif

namespace regen {

// ---- GEMM (row-major) --------------------------------------------------------------------------
// C: (M, N) = alpha * op(A) * op(B) + beta * C, op(A): (M, K), op(B): (K, N). lda/ldb/ldc are
// row strides of A, B, C as stored (A stored (K, M) when trans_a).
namespace cpu {
template <class T>
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
          int64_t lda, const T* B, int64_t ldb, T beta, T* C, int64_t ldc);
// batch independent GEMMs; matrix i starts at A + i*stride_a (etc.).
template <class T>
void gemm_batched(bool trans_a, bool trans_b, int64_t batch, int64_t M, int64_t N, int64_t K,
                  T alpha, const T* A, int64_t lda, int64_t stride_a, const T* B, int64_t ldb,
                  int64_t stride_b, T beta, T* C, int64_t ldc, int64_t stride_c);

// ---- Element-wise and reductions (kernels/cpu/elementwise.cpp) ----------------------------------
template <class T>
void fill(T* y, int64_t n, T value);  // y: (n)
template <class T>
void copy(const T* x, T* y, int64_t n);  // x, y: (n)
// y[i] = a[i] + b[i % nb]  (b broadcast over leading dimensions; nb divides n)
template <class T>
void add(const T* a, const T* b, T* y, int64_t n, int64_t nb);
template <class T>
void add_inplace(T* y, const T* x, int64_t n);  // y += x
// y[i] = a[i] * b[i % nb]
template <class T>
void mul(const T* a, const T* b, T* y, int64_t n, int64_t nb);
template <class T>
void scale(const T* x, T* y, int64_t n, T alpha);  // y = alpha*x
// y[i] = alpha * s[0] for i < n (backward of sum/mean; s is one element on the device)
template <class T>
void fill_from_scalar(const T* s, T* y, int64_t n, T alpha);
// scale and fill_from_scalar with an f32 factor, for the 16-bit types (bfloat16, float16), whose
// own 8 or 11 bits would round factors such as 1/n or 1/sqrt(d): y = round(alpha * x) per element.
// The CPU's and CUDA's (cuda::kHalfLaunchers) for bfloat16 and float16 only; no scratch.
template <class T>
void scale_f32(const T* x, T* y, int64_t n, float alpha);
template <class T>
void fill_from_scalar_f32(const T* s, T* y, int64_t n, float alpha);
// The unary element-wise ops (relu, gelu, ...): cpu::unary_forward / unary_backward, in
// kernels/unary_ops.h.
// x: (rows, cols) -> y: (cols), y[c] = sum_r x[r, c]  (bias gradients)
template <class T>
void sum_rows(const T* x, T* y, int64_t rows, int64_t cols);
// x: (n) -> y: (1)
template <class T>
void sum_all(const T* x, T* y, int64_t n);
// x: (n) -> y: (1), y[0] = sum_i x[i]^2, accumulated in double (gradient norms for clipping)
template <class T>
void sum_squares(const T* x, T* y, int64_t n);
// Dropout with the Philox stream (seed, stream): element i is kept when
// philox_word(seed, stream, i) >= p * 2^32 and then scaled by 1 / (1 - p). Backward regenerates
// the same mask; nothing is stored.
template <class T>
void dropout_forward(const T* x, T* y, int64_t n, float p, uint64_t seed, uint64_t stream);
template <class T>
void dropout_backward(const T* dy, T* dx, int64_t n, float p, uint64_t seed, uint64_t stream);
// Saved activations held narrow (--compress, kernels/half.h): x: (n) -> y: (n) 16-bit values in
// format c (bf16 or fp16), and back. f32 only (T = float).
template <class T>
void narrow_to_half(const T* x, uint16_t* y, int64_t n, Compression c);
template <class T>
void widen_from_half(const uint16_t* x, T* y, int64_t n, Compression c);
// x: shape s.shape (row-major) -> y: permuted, y.shape[i] = s.shape[s.perm[i]]
template <class T>
void permute(const T* x, T* y, const PermuteShape& s);
// Slices along one dimension (kernels/cpu/slice.cpp; concat, split, narrow): x: (outer, x_dim,
// inner), y: (outer, y_dim, inner); y[o, y_start + j, i] = x[o, x_start + j, i] for j < len. The
// rest of y is left as it was.
template <class T>
void slice_copy(const T* x, T* y, const SliceShape& s);

// ---- Convolution (kernels/cpu/conv2d.cpp)
// -------------------------------------------------------- x: (N, C, H, W), w: (K, C, R, S), bias:
// (K) or null, y: (N, K, P, Q)
template <class T>
void conv2d_forward(const T* x, const T* w, const T* bias, T* y, const ConvShape& s);
// dy: (N, K, P, Q), w: (K, C, R, S) -> dx: (N, C, H, W)
template <class T>
void conv2d_backward_data(const T* dy, const T* w, T* dx, const ConvShape& s);
// x: (N, C, H, W), dy: (N, K, P, Q) -> dw: (K, C, R, S), dbias: (K) or null. For bf16 and f16
// (T = bfloat16, float16) dw may be null too: the bias gradient alone.
// The 16-bit launchers (CPU and CUDA) compute in f32 and round each output element once.
template <class T>
void conv2d_backward_filter(const T* x, const T* dy, T* dw, T* dbias, const ConvShape& s);
// The CPU's algorithm for 3x3 stride-1 convolutions (f32, bf16 and f16): "winograd" (the default)
// or "direct", from the environment variable REGEN_CPU_CONV (kernels/cpu/conv2d_winograd.h). The
// two differ in workspace and time, so profiles of CPU steps record it and runs compare it
// (session/records.cpp).
std::string conv2d_algorithm();
// The CPU's register tile for its GEMMs and convolutions: "avx512bf16", "avx512", "avx2" or
// "generic", the best this CPU runs or the one the environment variable REGEN_CPU_ISA names
// (kernels/cpu/packed_gemm.h; a name that is no tile's, or one this CPU lacks, is an error naming
// the value). Decided on the first call.
std::string cpu_tile_name();
// Sets it for the rest of the process, over the variable: "winograd" or "direct" (anything else is
// an error naming the value). For `regen bench train --cpu-conv`, which compares the two; not for
// use while a convolution runs.
void set_conv2d_algorithm(const std::string& name);

// ---- Transposed convolution (kernels/cpu/conv_transpose2d.cpp) ----------------------------------
// s is the ConvShape of the conv2d whose adjoint this is (make_conv_transpose_shape, shapes.h):
// x: (N, K, P, Q) with K = C_in, w: (K, C, R, S) = (C_in, C_out, kh, kw), y: (N, C, H, W).
// x, w, bias: (C) or null -> y, written. y is conv2d's backward-data of x, plus bias.
template <class T>
void conv_transpose2d_forward(const T* x, const T* w, const T* bias, T* y, const ConvShape& s);
// dy: (N, C, H, W) -> dx: (N, K, P, Q), the conv2d of dy with w.
template <class T>
void conv_transpose2d_backward_data(const T* dy, const T* w, T* dx, const ConvShape& s);
// x, dy -> dw: (K, C, R, S) (conv2d's backward-filter with dy as its input and x as its output
// gradient) and dbias: (C), the per-channel sums of dy; either may be null.
template <class T>
void conv_transpose2d_backward_filter(const T* x, const T* dy, T* dw, T* dbias, const ConvShape& s);

// ---- Batch normalization over (N, C, HW) (kernels/cpu/batchnorm.cpp)
// ------------------------------ Training: batch statistics; mean, invstd: (C) outputs (invstd =
// 1/sqrt(var_biased + eps)). running_mean/var: (C), updated with momentum (unbiased variance, as
// PyTorch) unless null.
template <class T>
void batchnorm_forward_train(const T* x, const T* gamma, const T* beta, T* y, T* mean, T* invstd,
                             T* running_mean, T* running_var, int64_t N, int64_t C, int64_t HW,
                             double momentum, double eps);
template <class T>
void batchnorm_forward_eval(const T* x, const T* gamma, const T* beta, const T* running_mean,
                            const T* running_var, T* y, int64_t N, int64_t C, int64_t HW,
                            double eps);
// dgamma, dbeta: (C), written; may be null.
template <class T>
void batchnorm_backward(const T* dy, const T* x, const T* gamma, const T* mean, const T* invstd,
                        T* dx, T* dgamma, T* dbeta, int64_t N, int64_t C, int64_t HW);
template <class T>
void batchnorm_backward_eval(const T* dy, const T* x, const T* gamma, const T* running_mean,
                             const T* running_var, T* dx, T* dgamma, T* dbeta, int64_t N, int64_t C,
                             int64_t HW, double eps);

// ---- Pooling (kernels/cpu/pool.cpp) ------------------------------------------------------------
// argmax: (N, C, P, Q), index into the (H, W) plane of the chosen input element.
template <class T>
void maxpool2d_forward(const T* x, T* y, int32_t* argmax, const PoolShape& s);
template <class T>
void maxpool2d_backward(const T* dy, const int32_t* argmax, T* dx, const PoolShape& s);
// The same with the argmax packed as window positions (shapes.h, pool_code_bits): codes:
// (N, C, pool_code_words_per_plane(s)) words. Values, and dx summed in the same order, are bit for
// bit those of the argmax forms.
template <class T>
void maxpool2d_forward_packed(const T* x, T* y, uint32_t* codes, const PoolShape& s);
template <class T>
void maxpool2d_backward_packed(const T* dy, const uint32_t* codes, T* dx, const PoolShape& s);
// Average over the window including padding (count_include_pad=True, PyTorch's default).
template <class T>
void avgpool2d_forward(const T* x, T* y, const PoolShape& s);
template <class T>
void avgpool2d_backward(const T* dy, T* dx, const PoolShape& s);
// x: (NC, HW) -> y: (NC)
template <class T>
void global_avgpool_forward(const T* x, T* y, int64_t NC, int64_t HW);
template <class T>
void global_avgpool_backward(const T* dy, T* dx, int64_t NC, int64_t HW);

// ---- 2x upsampling of planes (kernels/cpu/upsample.cpp) -----------------------------------------
// x: (NC, H, W) -> y: (NC, 2H, 2W), as PyTorch's F.interpolate(scale_factor=2).
// nearest (mode='nearest'): y[i, j] = x[i / 2, j / 2]; backward sums each 2x2 block of dy.
template <class T>
void upsample2x_nearest_forward(const T* x, T* y, int64_t NC, int64_t H, int64_t W);
template <class T>
void upsample2x_nearest_backward(const T* dy, T* dx, int64_t NC, int64_t H, int64_t W);
// bilinear (align_corners=False): output row i samples input row max((i + 0.5) / 2 - 0.5, 0)
// between its two neighbours (the upper one clamped to H - 1): weights 0.25 / 0.75, and 1 at the
// borders; columns alike. Backward gathers dx from the (at most 4x4) outputs that read each input.
template <class T>
void upsample2x_bilinear_forward(const T* x, T* y, int64_t NC, int64_t H, int64_t W);
template <class T>
void upsample2x_bilinear_backward(const T* dy, T* dx, int64_t NC, int64_t H, int64_t W);

// ---- Embedding (kernels/cpu/embedding.cpp) -----------------------------------------------------
// weight: (V, D), ids: (n) in [0, V) -> y: (n, D). An id out of range throws regen::Error.
template <class T>
void embedding_forward(const T* weight, const int64_t* ids, T* y, int64_t n, int64_t V, int64_t D);
// dy: (n, D) -> dweight: (V, D), written (zeroed, then every row scattered in order).
template <class T>
void embedding_backward(const T* dy, const int64_t* ids, T* dweight, int64_t n, int64_t V,
                        int64_t D);

// ---- Layer normalization over the last dimension (kernels/cpu/layernorm.cpp) -------------------
// x, y: (M, N); gamma, beta: (N); mean, rstd: (M) outputs.
template <class T>
void layernorm_forward(const T* x, const T* gamma, const T* beta, T* y, T* mean, T* rstd, int64_t M,
                       int64_t N, double eps);
// dgamma, dbeta: (N), written; may be null.
template <class T>
void layernorm_backward(const T* dy, const T* x, const T* gamma, const T* mean, const T* rstd,
                        T* dx, T* dgamma, T* dbeta, int64_t M, int64_t N);

// ---- Softmax over the last dimension (kernels/cpu/softmax.cpp) ---------------------------------
// x, y: (M, N)
template <class T>
void softmax_forward(const T* x, T* y, int64_t M, int64_t N);
template <class T>
void softmax_backward(const T* dy, const T* y, T* dx, int64_t M, int64_t N);

// ---- Fused multi-head attention (kernels/cpu/attention.cpp) -------------------------------------
// qkv: (B, S, 3*H*Dh); key_pad: (B, S), nonzero = padded key, or null; out: (B, S, H*Dh);
// lse: (B, H, S), logsumexp of the scaled, masked scores (-inf for a row with no visible key,
// whose output is 0), in T's accumulation type (f32 for bf16 and f16: acc_t, the end of this
// file; the CPU computes those in f32 from the 16-bit qkv and rounds out once).
}  // namespace cpu
template <class T>
struct accumulate_type;  // defined with acc_t, below
namespace cpu {
template <class T>
void attention_forward(const T* qkv, const int32_t* key_pad, T* out,
                       typename accumulate_type<T>::type* lse, const AttentionShape& s);
// dout: (B, S, H*Dh) -> dqkv: (B, S, 3*H*Dh), written.
template <class T>
void attention_backward(const T* dout, const T* qkv, const T* out,
                        const typename accumulate_type<T>::type* lse, const int32_t* key_pad,
                        T* dqkv, const AttentionShape& s);

// ---- Cross-entropy fused with log-softmax (kernels/cpu/cross_entropy.cpp) -----------------------
// logits: (M, V), targets: (M) -> loss: (1), the mean over rows whose target != ignore_index (0
// when there are none); lse: (M) row logsumexp. A target outside [0, V) that is not ignore_index
// throws regen::Error.
template <class T>
void cross_entropy_forward(const T* logits, const int64_t* targets, T* loss, T* lse, int64_t M,
                           int64_t V, int64_t ignore_index);
// dloss: (1) -> dlogits: (M, V), written.
template <class T>
void cross_entropy_backward(const T* dloss, const T* logits, const int64_t* targets, const T* lse,
                            T* dlogits, int64_t M, int64_t V, int64_t ignore_index);

// ---- Chunked linear + cross-entropy, row-wise pieces (kernels/cpu/cross_entropy.cpp) -----------
// autograd/ops_cross_entropy.cpp computes each chunk's logits with gemm into a workspace and hands
// them to these; (M, V) logits never exist. Same semantics as cross_entropy above.
// Validates every target (a target outside [0, V) that is not ignore_index throws regen::Error
// naming linear_cross_entropy, the row, the target and V); then, when dloss and scale are not
// null, scale: (1) = dloss[0] / (number of rows whose target != ignore_index), 0 when none.
template <class T>
void linear_cross_entropy_scale(const T* dloss, const int64_t* targets, T* scale, int64_t M,
                                int64_t V, int64_t ignore_index);
// logits: (rows, V), in place += bias (V) when bias is not null; targets: (rows) -> lse: (rows)
// row logsumexp, row_loss: (rows) lse - logit[target] in double, 0 for ignored rows.
template <class T>
void linear_cross_entropy_forward_rows(T* logits, const T* bias, const int64_t* targets, T* lse,
                                       double* row_loss, int64_t rows, int64_t V,
                                       int64_t ignore_index);
// row_loss, targets: (M) -> loss: (1) = sum of row_loss / counted rows (0 when none).
template <class T>
void linear_cross_entropy_forward_loss(const double* row_loss, const int64_t* targets, T* loss,
                                       int64_t M, int64_t ignore_index);
// logits: (rows, V) without bias, in place -> dlogits = (softmax(logits + bias) - onehot(target))
// * scale[0], written; rows whose target is ignore_index get 0. lse: (rows) from forward_rows.
template <class T>
void linear_cross_entropy_backward_rows(T* logits, const T* bias, const int64_t* targets,
                                        const T* lse, const T* scale, int64_t rows, int64_t V,
                                        int64_t ignore_index);

// ---- Optimizer updates (kernels/cpu/optim.cpp), in place over (n) -------------------------------
// torch.optim.SGD semantics; momentum_buf is null when momentum == 0; on first_step the buffer is
// set to the (weight-decayed) gradient.
template <class T>
void sgd_step(T* param, const T* grad, T* momentum_buf, int64_t n, double lr, double momentum,
              double dampening, double weight_decay, bool nesterov, bool first_step);
// torch.optim.AdamW semantics (decoupled weight decay, bias correction); step counts from 1.
template <class T>
void adamw_step(T* param, const T* grad, T* exp_avg, T* exp_avg_sq, int64_t n, double lr,
                double beta1, double beta2, double eps, double weight_decay, int64_t step);

}  // namespace cpu

// ---- Dry runs (REGEN_LAUNCH, below) ------------------------------------------------------------
// The launchers that take scratch space (Workspace) for themselves, directly or through another
// launcher, per device: the only ones REGEN_LAUNCH calls in a dry run. Each has a dry path: it
// requests the Workspace blocks a real call requests, of the same sizes, in the same order and
// nesting, then returns before it reads or writes a tensor's bytes (a dry run's tensors have fake
// addresses). A launcher that starts taking scratch must be listed here and get a dry path;
// tests/test_kernels_cpu.cpp checks every CPU one against a real call, tests/cuda/test_cuda_dry_run
// every CUDA one (on a GPU, and in the host emulation: scripts/cuda-emu/run.sh dryrun).
namespace kernels {
// Whether `name` (a launcher as REGEN_LAUNCH spells it) is one of `list`'s.
template <size_t N>
constexpr bool listed(const char* const (&list)[N], const char* name) {
  for (const char* entry : list) {
    size_t i = 0;
    while (entry[i] != '\0' && entry[i] == name[i]) ++i;
    if (entry[i] == name[i]) return true;
  }
  return false;
}
}  // namespace kernels

namespace cpu {
// CPU (kernels/cpu/): gemm_batched and attention run gemm, conv2d the packed GEMM of
// kernels/cpu/packed_gemm.h, conv_transpose2d conv2d's passes. Sizes that depend on the thread
// count are computed as a real call computes them, from omp_get_max_threads() outside any parallel
// region, and a dry path enters no parallel region.
inline constexpr const char* kDryRunLaunchers[] = {
    "gemm",
    "gemm_batched",
    "sum_all",
    "sum_squares",
    "cross_entropy_forward",
    "conv2d_forward",
    "conv2d_backward_data",
    "conv2d_backward_filter",
    "conv_transpose2d_forward",
    "conv_transpose2d_backward_data",
    "conv_transpose2d_backward_filter",
    "attention_forward",
    "attention_backward",
};
constexpr bool has_dry_run_path(const char* launcher) {
  return kernels::listed(kDryRunLaunchers, launcher);
}
}  // namespace cpu

namespace cuda {
// CUDA (kernels/cuda/): conv2d's index tables, transposed sub-filters and split-K partials (or
// cuDNN's per-pass workspace), conv_transpose2d through conv2d's passes, the reductions' partial
// sums (sum_rows, batchnorm, layernorm, and their 16-bit forms), CUB's scratch (sum_all's reduce,
// embedding_backward's sort), the flags of the launchers that report a bad id or target,
// attention_backward's row terms. A dry path skips every kernel launch, copy, memset and library
// call that touches device data, and every read-back; sizes that depend on the device (CUB's
// temp-storage queries, cuDNN's algorithm and its workspace) are computed as the real call computes
// them, so a dry run on a CUDA device needs that device. cuBLAS (gemm, gemm_batched) takes no
// scratch per call: its workspace is kept for the process (kernels/cuda/blas.cpp), and a dry run
// counts it from the start (DryRunScope, core/allocator.h).
inline constexpr const char* kDryRunLaunchers[] = {
    "sum_rows",
    "sum_all",
    "conv2d_forward",
    "conv2d_backward_data",
    "conv2d_backward_filter",
    "conv_transpose2d_forward",
    "conv_transpose2d_backward_data",
    "conv_transpose2d_backward_filter",
    "batchnorm_forward_train",
    "batchnorm_forward_eval",
    "batchnorm_backward",
    "batchnorm_backward_eval",
    "batchnorm_forward_train_lowp",
    "batchnorm_forward_eval_lowp",
    "batchnorm_backward_lowp",
    "batchnorm_backward_eval_lowp",
    "embedding_forward",
    "embedding_backward",
    "layernorm_backward",
    "layernorm_backward_lowp",
    "layernorm_backward_xhat",
    "attention_backward",
    "cross_entropy_forward",
    "cross_entropy_backward",
    "linear_cross_entropy_scale",
};
constexpr bool has_dry_run_path(const char* launcher) {
  return kernels::listed(kDryRunLaunchers, launcher);
}
// The CUDA launchers with a 16-bit form (T = bfloat16, float16: core/half.h's element types, whose
// f32 conversions are __host__ __device__, so a kernel's bits are the CPU's conversions'): each
// loads 16 bits, computes in f32 (acc_t) and rounds once on store, as its CPU launcher does
// (kernels/cuda/cuda_kernels.h declares them). REGEN_LAUNCH sends a 16-bit call of any other
// launcher to kernels::unsupported. docs/precision.md lists them by op;
// tests/cuda/test_cuda_ops.cpp checks each against its CPU launcher on the same 16-bit inputs.
inline constexpr const char* kHalfLaunchers[] = {
    "fill",
    "copy",
    "add",
    "add_inplace",
    "mul",
    "scale",
    "fill_from_scalar",
    "scale_f32",
    "fill_from_scalar_f32",
    "sum_rows",
    "sum_all",
    "sum_squares",
    "permute",
    "slice_copy",
    "dropout_forward_lowp",
    "dropout_backward_lowp",
    "unary_forward",
    "unary_backward",
    "unary_forward_mask",
    "unary_backward_mask",
    "softmax_forward",
    "softmax_backward",
    "gemm",
    "gemm_batched",
    "layernorm_forward_lowp",
    "layernorm_backward_lowp",
    "layernorm_forward_save_xhat",
    "layernorm_backward_xhat",
    "rmsnorm_forward_lowp",
    "rmsnorm_backward_lowp",
    "embedding_forward",
    "embedding_backward",
    "upsample2x_nearest_forward",
    "upsample2x_nearest_backward",
    "upsample2x_bilinear_forward",
    "upsample2x_bilinear_backward",
    "attention_forward",
    "attention_backward",
    "maxpool2d_forward",
    "maxpool2d_backward",
    "maxpool2d_forward_packed",
    "maxpool2d_backward_packed",
    "avgpool2d_forward",
    "avgpool2d_backward",
    "global_avgpool_forward",
    "global_avgpool_backward",
    "batchnorm_forward_train_lowp",
    "batchnorm_forward_eval_lowp",
    "batchnorm_backward_lowp",
    "batchnorm_backward_eval_lowp",
    "conv2d_forward",
    "conv2d_backward_data",
    "conv2d_backward_filter",
    "conv_transpose2d_forward",
    "conv_transpose2d_backward_data",
    "conv_transpose2d_backward_filter",
};
constexpr bool has_half_path(const char* launcher) {
  return kernels::listed(kHalfLaunchers, launcher);
}
}  // namespace cuda

namespace kernels {
// Throws regen::Error: `launcher` has no implementation for this device and dtype.
[[noreturn]] void unsupported(const char* launcher, Device device, DType dtype);
// Makes the tensor's CUDA device current (no-op on CPU builds).
void use_device(Device device);
// Waits for the device's queued work (no-op on the CPU).
void synchronize(Device device);
// REGEN_LAUNCH calls it after each CUDA launcher: with REGEN_CUDA_SYNC=1 it synchronizes and
// reports a failure of the launcher's queued work (kernels, cuBLAS, cuDNN, CUB) under its name.
void after_cuda_launcher(const char* launcher);
// Creates what a device keeps for the whole run (CUDA: stream, library handles and their
// workspaces), so it is allocated before the first training step.
void prepare_device(Device device);

// Points on a device's own clock, to time queued work without waiting for it (the profiler's
// device timing): on CUDA, events on the compute stream, so the host runs ahead as it does in
// training and a gap between two points is the device's work between them, or its wait for the
// host; on the CPU, the host clock. mark() adds a point; elapsed() waits for the device and
// returns each point's milliseconds after the first; clear() starts again (CUDA keeps its events).
class DeviceTimeline {
 public:
  explicit DeviceTimeline(Device device);
  ~DeviceTimeline();
  DeviceTimeline(DeviceTimeline&&) noexcept;
  DeviceTimeline& operator=(DeviceTimeline&&) noexcept;
  void mark();
  std::vector<double> elapsed();
  void clear();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};
}  // namespace kernels

}  // namespace regen

#ifdef REGEN_WITH_CUDA
#include "regen/kernels/cuda/cuda_kernels.h"
#endif

// REGEN_LAUNCH(device, T, name, args...): the one dispatch point. CPU: cpu::name<T>(args...);
// CUDA: cuda::name(args...) for T = float, and for T = bfloat16 or float16 when the launcher is one
// of cuda::kHalfLaunchers (a REGEN_LAUNCHER template, or the 16-bit overload beside a float
// launcher, deduces T from the typed arguments); anything else is a clear regen::Error.
// In a dry run (dry_run_active(); DryRunScope, core/allocator.h) every launcher is skipped except
// those of the device's kDryRunLaunchers (cpu:: or cuda::, above), whose dry paths request the
// Workspace blocks a real call requests and return. So the dry run's allocator sees the real
// step's requests and frees, the kernels' scratch included, and on either device its peaks are
// the real step's (with what the device keeps for the process, which DryRunScope counts from its
// start: cuBLAS's workspace). A skipped launcher's arguments are not evaluated. After a CUDA
// launcher, kernels::after_cuda_launcher checks its work when REGEN_CUDA_SYNC=1 (not in a dry run:
// there is none).
#ifdef REGEN_WITH_CUDA
#define REGEN_LAUNCH(device, T, name, ...)                                                 \
  do {                                                                                     \
    if (::regen::dry_run_active() &&                                                       \
        !((device).is_cpu() ? ::regen::cpu::has_dry_run_path(#name)                        \
                            : ::regen::cuda::has_dry_run_path(#name)))                     \
      break; /* a dry run: shapes and blocks only */                                       \
    if ((device).is_cpu()) {                                                               \
      ::regen::cpu::name<T>(__VA_ARGS__);                                                  \
    } else if constexpr (std::is_same<T, float>::value ||                                  \
                         (::regen::is_half_v<T> && ::regen::cuda::has_half_path(#name))) { \
      ::regen::kernels::use_device(device);                                                \
      ::regen::cuda::name(__VA_ARGS__);                                                    \
      ::regen::kernels::after_cuda_launcher(#name);                                        \
    } else {                                                                               \
      ::regen::kernels::unsupported(#name, (device), ::regen::dtype_of<T>::value);         \
    }                                                                                      \
  } while (0)
#else
#define REGEN_LAUNCH(device, T, name, ...)                                         \
  do {                                                                             \
    if (::regen::dry_run_active() &&                                               \
        !((device).is_cpu() && ::regen::cpu::has_dry_run_path(#name)))             \
      break; /* a dry run: shapes and blocks only */                               \
    if ((device).is_cpu()) {                                                       \
      ::regen::cpu::name<T>(__VA_ARGS__);                                          \
    } else {                                                                       \
      ::regen::kernels::unsupported(#name, (device), ::regen::dtype_of<T>::value); \
    }                                                                              \
  } while (0)
#endif

// REGEN_FLOATING(dtype, what, fn, args...): calls fn<float>(args...) or fn<double>(args...).
#define REGEN_FLOATING(dtype, what, fn, ...)                                                    \
  do {                                                                                          \
    switch (dtype) {                                                                            \
      case ::regen::DType::f32:                                                                 \
        fn<float>(__VA_ARGS__);                                                                 \
        break;                                                                                  \
      case ::regen::DType::f64:                                                                 \
        fn<double>(__VA_ARGS__);                                                                \
        break;                                                                                  \
      default:                                                                                  \
        REGEN_FAIL(what, ": expected an f32 or f64 tensor, got ", ::regen::dtype_name(dtype),   \
                   " (this op has no 16-bit path yet; docs/precision.md lists those that do)"); \
    }                                                                                           \
  } while (0)

// REGEN_FLOATING_LOWP(dtype, what, fn, args...): as REGEN_FLOATING, and fn<bfloat16>(args...) or
// fn<float16>(args...) for the 16-bit dtypes (an op with a 16-bit path: its kernels store 16 bits
// and compute in acc_t<T>, below).
#define REGEN_FLOATING_LOWP(dtype, what, fn, ...)                                    \
  do {                                                                               \
    switch (dtype) {                                                                 \
      case ::regen::DType::f32:                                                      \
        fn<float>(__VA_ARGS__);                                                      \
        break;                                                                       \
      case ::regen::DType::f64:                                                      \
        fn<double>(__VA_ARGS__);                                                     \
        break;                                                                       \
      case ::regen::DType::bf16:                                                     \
        fn<::regen::bfloat16>(__VA_ARGS__);                                          \
        break;                                                                       \
      case ::regen::DType::f16:                                                      \
        fn<::regen::float16>(__VA_ARGS__);                                           \
        break;                                                                       \
      default:                                                                       \
        REGEN_FAIL(what, ": expected a floating tensor (f32, f64, bf16, f16), got ", \
                   ::regen::dtype_name(dtype));                                      \
    }                                                                                \
  } while (0)

namespace regen {
// acc_t<T>: the type a kernel on elements of type T computes and sums in: float for the 16-bit
// element types (core/half.h), which are storage only, and T itself otherwise. A 16-bit kernel
// widens what it reads to acc_t<T>, computes there, and rounds once when it stores.
template <class T>
struct accumulate_type {
  using type = T;
};
template <HalfFormat F>
struct accumulate_type<Half16<F>> {
  using type = float;
};
template <class T>
using acc_t = typename accumulate_type<T>::type;
template <class T>
constexpr bool is_half_v = !std::is_same<acc_t<T>, T>::value;
}  // namespace regen
