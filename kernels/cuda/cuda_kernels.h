// CUDA launchers: the same names and arguments as the CPU launchers in kernels/kernels.h (shapes
// are documented there), for float. Implemented in kernels/cuda/*.cu; each is tested against its
// CPU reference by tests/cuda/test_cuda_ops.cpp. Every launcher runs on regen::cuda::stream() and
// takes its scratch memory from the caching allocator (Workspace, category workspace).
#pragma once

#ifdef REGEN_WITH_CUDA
#include <cstdint>

#include "regen/core/half.h"
#include "regen/core/types.h"
#include "regen/kernels/half.h"
#include "regen/kernels/shapes.h"

namespace regen::cuda {

// GEMM through cuBLAS (FP32, or TF32 when enabled).
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
          int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);
void gemm_batched(bool trans_a, bool trans_b, int64_t batch, int64_t M, int64_t N, int64_t K,
                  float alpha, const float* A, int64_t lda, int64_t stride_a, const float* B,
                  int64_t ldb, int64_t stride_b, float beta, float* C, int64_t ldc,
                  int64_t stride_c);

// Element-wise and reductions (kernels/cuda/elementwise.cu; reductions through CUB). The unary
// element-wise ops (relu, gelu, ...) are cuda::unary_forward / unary_backward, kernels/unary_ops.h.
void fill(float* y, int64_t n, float value);
void copy(const float* x, float* y, int64_t n);
void add(const float* a, const float* b, float* y, int64_t n, int64_t nb);
void add_inplace(float* y, const float* x, int64_t n);
void mul(const float* a, const float* b, float* y, int64_t n, int64_t nb);
void scale(const float* x, float* y, int64_t n, float alpha);
void fill_from_scalar(const float* s, float* y, int64_t n, float alpha);
// The launchers of the unary list (kernels/unary_ops.h, kernels/cuda/unary.cu), type-erased, in
// list order and ended by an entry with a null name: for code that must not recompile when an op
// joins the list (regen bench kernels times every entry).
struct UnaryLaunchers {
  const char* name;
  bool reads_output;
  void (*forward)(const float* x, float* y, int64_t n);                     // x, y: (n)
  void (*backward)(const float* dy, const float* s, float* dx, int64_t n);  // dy, s, dx: (n)
};
const UnaryLaunchers* unary_launchers();
void sum_rows(const float* x, float* y, int64_t rows, int64_t cols);
void sum_all(const float* x, float* y, int64_t n);
void sum_squares(const float* x, float* y, int64_t n);  // y[0] = sum x[i]^2 (in double)
void dropout_forward(const float* x, float* y, int64_t n, float p, uint64_t seed, uint64_t stream);
void dropout_backward(const float* dy, float* dx, int64_t n, float p, uint64_t seed,
                      uint64_t stream);
void permute(const float* x, float* y, const PermuteShape& s);
void narrow_to_half(const float* x, uint16_t* y, int64_t n, Compression c);
void widen_from_half(const uint16_t* x, float* y, int64_t n, Compression c);
// Slices along one dimension (kernels/cuda/slice.cu).
void slice_copy(const float* x, float* y, const SliceShape& s);

// Convolution: native implicit GEMM (kernels/cuda/conv2d.cu) or cuDNN
// (kernels/cuda/conv2d_cudnn.cu).
void conv2d_forward(const float* x, const float* w, const float* bias, float* y,
                    const ConvShape& s);
void conv2d_backward_data(const float* dy, const float* w, float* dx, const ConvShape& s);
void conv2d_backward_filter(const float* x, const float* dy, float* dw, float* dbias,
                            const ConvShape& s);

// Transposed convolution over the conv2d launchers above (kernels/cuda/conv_transpose2d.cu).
void conv_transpose2d_forward(const float* x, const float* w, const float* bias, float* y,
                              const ConvShape& s);
void conv_transpose2d_backward_data(const float* dy, const float* w, float* dx, const ConvShape& s);
void conv_transpose2d_backward_filter(const float* x, const float* dy, float* dw, float* dbias,
                                      const ConvShape& s);

// Batch normalization.
void batchnorm_forward_train(const float* x, const float* gamma, const float* beta, float* y,
                             float* mean, float* invstd, float* running_mean, float* running_var,
                             int64_t N, int64_t C, int64_t HW, double momentum, double eps);
void batchnorm_forward_eval(const float* x, const float* gamma, const float* beta,
                            const float* running_mean, const float* running_var, float* y,
                            int64_t N, int64_t C, int64_t HW, double eps);
void batchnorm_backward(const float* dy, const float* x, const float* gamma, const float* mean,
                        const float* invstd, float* dx, float* dgamma, float* dbeta, int64_t N,
                        int64_t C, int64_t HW);
void batchnorm_backward_eval(const float* dy, const float* x, const float* gamma,
                             const float* running_mean, const float* running_var, float* dx,
                             float* dgamma, float* dbeta, int64_t N, int64_t C, int64_t HW,
                             double eps);

// Pooling.
void maxpool2d_forward(const float* x, float* y, int32_t* argmax, const PoolShape& s);
void maxpool2d_backward(const float* dy, const int32_t* argmax, float* dx, const PoolShape& s);
void maxpool2d_forward_packed(const float* x, float* y, uint32_t* codes, const PoolShape& s);
void maxpool2d_backward_packed(const float* dy, const uint32_t* codes, float* dx,
                               const PoolShape& s);
void avgpool2d_forward(const float* x, float* y, const PoolShape& s);
void avgpool2d_backward(const float* dy, float* dx, const PoolShape& s);
void global_avgpool_forward(const float* x, float* y, int64_t NC, int64_t HW);
void global_avgpool_backward(const float* dy, float* dx, int64_t NC, int64_t HW);

// 2x upsampling (kernels/cuda/upsample.cu).
void upsample2x_nearest_forward(const float* x, float* y, int64_t NC, int64_t H, int64_t W);
void upsample2x_nearest_backward(const float* dy, float* dx, int64_t NC, int64_t H, int64_t W);
void upsample2x_bilinear_forward(const float* x, float* y, int64_t NC, int64_t H, int64_t W);
void upsample2x_bilinear_backward(const float* dy, float* dx, int64_t NC, int64_t H, int64_t W);

// Embedding (kernels/cuda/embedding.cu). Backward is deterministic (no floating-point atomics)
// and parallel over a frequent id: an id's rows are summed in token order in chunks of
// kEmbeddingChunkRows (each chunk from zero), then the chunks' sums in order (from zero). An id
// used at most kEmbeddingChunkRows times gets the CPU's sum bit for bit.
inline constexpr int64_t kEmbeddingChunkRows = 256;
void embedding_forward(const float* weight, const int64_t* ids, float* y, int64_t n, int64_t V,
                       int64_t D);
void embedding_backward(const float* dy, const int64_t* ids, float* dweight, int64_t n, int64_t V,
                        int64_t D);

// Layer normalization (kernels/cuda/layernorm.cu).
void layernorm_forward(const float* x, const float* gamma, const float* beta, float* y, float* mean,
                       float* rstd, int64_t M, int64_t N, double eps);
void layernorm_backward(const float* dy, const float* x, const float* gamma, const float* mean,
                        const float* rstd, float* dx, float* dgamma, float* dbeta, int64_t M,
                        int64_t N);

// Softmax.
void softmax_forward(const float* x, float* y, int64_t M, int64_t N);
void softmax_backward(const float* dy, const float* y, float* dx, int64_t M, int64_t N);

// Flash-style fused attention (kernels/cuda/attention.cu).
void attention_forward(const float* qkv, const int32_t* key_pad, float* out, float* lse,
                       const AttentionShape& s);
void attention_backward(const float* dout, const float* qkv, const float* out, const float* lse,
                        const int32_t* key_pad, float* dqkv, const AttentionShape& s);

// Cross-entropy.
void cross_entropy_forward(const float* logits, const int64_t* targets, float* loss, float* lse,
                           int64_t M, int64_t V, int64_t ignore_index);
void cross_entropy_backward(const float* dloss, const float* logits, const int64_t* targets,
                            const float* lse, float* dlogits, int64_t M, int64_t V,
                            int64_t ignore_index);

// Chunked linear + cross-entropy, row-wise pieces (kernels/cuda/cross_entropy.cu).
void linear_cross_entropy_scale(const float* dloss, const int64_t* targets, float* scale, int64_t M,
                                int64_t V, int64_t ignore_index);
void linear_cross_entropy_forward_rows(float* logits, const float* bias, const int64_t* targets,
                                       float* lse, double* row_loss, int64_t rows, int64_t V,
                                       int64_t ignore_index);
void linear_cross_entropy_forward_loss(const double* row_loss, const int64_t* targets, float* loss,
                                       int64_t M, int64_t ignore_index);
void linear_cross_entropy_backward_rows(float* logits, const float* bias, const int64_t* targets,
                                        const float* lse, const float* scale, int64_t rows,
                                        int64_t V, int64_t ignore_index);

// The 16-bit linear_cross_entropy's backward block (autograd/ops_linear_cross_entropy_lowp.cpp):
// block (rows, n) f32 logits of vocabulary columns [v0, v0 + n) -> their gradient in place, as
// linear_cross_entropy_backward_rows on those columns (bias: all V columns, or null; scale: the
// device scalar of linear_cross_entropy_scale).
void linear_cross_entropy_block_dlogits(float* block, const float* bias, const int64_t* targets,
                                        const float* lse, const float* scale, int64_t rows,
                                        int64_t n, int64_t v0, int64_t V, int64_t ignore_index);

// Fused optimizer updates.
void sgd_step(float* param, const float* grad, float* momentum_buf, int64_t n, double lr,
              double momentum, double dampening, double weight_decay, bool nesterov,
              bool first_step);
void adamw_step(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                double lr, double beta1, double beta2, double eps, double weight_decay,
                int64_t step);

// ---- 16-bit forms (T = bfloat16 or float16; cuda::kHalfLaunchers, kernels/kernels.h) -----------
// Overloads of the float launchers above for 16-bit tensors, defined for bfloat16 and float16
// only (a float call picks the float launcher). Each element is widened to f32, computed there and
// rounded once on store, as the CPU's 16-bit launchers do; reductions sum in double or f32 as the
// float launcher does, rounded once. Shapes as the float launchers'.
template <class T>
void fill(T* y, int64_t n, T value);
template <class T>
void copy(const T* x, T* y, int64_t n);
template <class T>
void add(const T* a, const T* b, T* y, int64_t n, int64_t nb);
template <class T>
void add_inplace(T* y, const T* x, int64_t n);
template <class T>
void mul(const T* a, const T* b, T* y, int64_t n, int64_t nb);
template <class T>
void scale(const T* x, T* y, int64_t n, T alpha);
template <class T>
void fill_from_scalar(const T* s, T* y, int64_t n, T alpha);
// scale and fill_from_scalar with an f32 factor (cpu::scale_f32, cpu::fill_from_scalar_f32).
template <class T>
void scale_f32(const T* x, T* y, int64_t n, float alpha);
template <class T>
void fill_from_scalar_f32(const T* s, T* y, int64_t n, float alpha);
template <class T>
void sum_rows(const T* x, T* y, int64_t rows, int64_t cols);
template <class T>
void sum_all(const T* x, T* y, int64_t n);
template <class T>
void sum_squares(const T* x, T* y, int64_t n);
template <class T>
void permute(const T* x, T* y, const PermuteShape& s);
template <class T>
void slice_copy(const T* x, T* y, const SliceShape& s);
template <class T>
void softmax_forward(const T* x, T* y, int64_t M, int64_t N);
template <class T>
void softmax_backward(const T* dy, const T* y, T* dx, int64_t M, int64_t N);
template <class T>
void upsample2x_nearest_forward(const T* x, T* y, int64_t NC, int64_t H, int64_t W);
template <class T>
void upsample2x_nearest_backward(const T* dy, T* dx, int64_t NC, int64_t H, int64_t W);
template <class T>
void upsample2x_bilinear_forward(const T* x, T* y, int64_t NC, int64_t H, int64_t W);
template <class T>
void upsample2x_bilinear_backward(const T* dy, T* dx, int64_t NC, int64_t H, int64_t W);
// embedding_backward's sums are rounded to T after each addition, as the CPU's 16-bit loop adds
// each row into the stored 16-bit gradient (bit for bit for an id used at most
// kEmbeddingChunkRows times; longer runs add their chunks' rounded sums).
template <class T>
void embedding_forward(const T* weight, const int64_t* ids, T* y, int64_t n, int64_t V, int64_t D);
template <class T>
void embedding_backward(const T* dy, const int64_t* ids, T* dweight, int64_t n, int64_t V,
                        int64_t D);
template <class T>
void maxpool2d_forward(const T* x, T* y, int32_t* argmax, const PoolShape& s);
template <class T>
void maxpool2d_backward(const T* dy, const int32_t* argmax, T* dx, const PoolShape& s);
template <class T>
void maxpool2d_forward_packed(const T* x, T* y, uint32_t* codes, const PoolShape& s);
template <class T>
void maxpool2d_backward_packed(const T* dy, const uint32_t* codes, T* dx, const PoolShape& s);
template <class T>
void avgpool2d_forward(const T* x, T* y, const PoolShape& s);
template <class T>
void avgpool2d_backward(const T* dy, T* dx, const PoolShape& s);
template <class T>
void global_avgpool_forward(const T* x, T* y, int64_t NC, int64_t HW);
template <class T>
void global_avgpool_backward(const T* dy, T* dx, int64_t NC, int64_t HW);
// Attention with 16-bit qkv, out, dout and dqkv: tiles widened to f32 as they are loaded, scores,
// softmax and products in f32, out and dqkv rounded once; lse f32 (kernels/cuda/attention.cu).
template <class T>
void attention_forward(const T* qkv, const int32_t* key_pad, T* out, float* lse,
                       const AttentionShape& s);
template <class T>
void attention_backward(const T* dout, const T* qkv, const T* out, const float* lse,
                        const int32_t* key_pad, T* dqkv, const AttentionShape& s);
// The 16-bit layer and RMS norms (layernorm_forward_lowp, ..., rmsnorm_backward_lowp: 16-bit x,
// y, dy, dx; f32 parameters and statistics) are declared beside their ops (REGEN_LAUNCHER in
// autograd/ops_layernorm.cpp, ops_rmsnorm.cpp), as dropout_forward_lowp is (ops_dropout.cpp).
// Convolution with 16-bit x, w, bias, y, dy, dx, dw, dbias (kernels/cuda/conv2d.cu, native or
// cuDNN as set_conv_algo chose): products and sums in f32, each output rounded once after the bias
// is added in f32; dw the f32 sum rounded once, dbias summed in double and rounded once; dw may be
// null (the bias gradient alone), as cpu::conv2d_backward_filter<T>'s.
template <class T>
void conv2d_forward(const T* x, const T* w, const T* bias, T* y, const ConvShape& s);
template <class T>
void conv2d_backward_data(const T* dy, const T* w, T* dx, const ConvShape& s);
template <class T>
void conv2d_backward_filter(const T* x, const T* dy, T* dw, T* dbias, const ConvShape& s);
// conv2d's backward-data with bias: (C) or null added to every plane of channel c in f32 before
// the one rounding (cpu::conv2d_backward_data_with_bias, kernels/cpu/conv2d_lowp.h): the 16-bit
// conv_transpose2d forward.
template <class T>
void conv2d_backward_data_with_bias(const T* dy, const T* w, const T* bias, T* dx,
                                    const ConvShape& s);
// Transposed convolution over the 16-bit conv2d passes (kernels/cuda/conv_transpose2d.cu).
template <class T>
void conv_transpose2d_forward(const T* x, const T* w, const T* bias, T* y, const ConvShape& s);
template <class T>
void conv_transpose2d_backward_data(const T* dy, const T* w, T* dx, const ConvShape& s);
template <class T>
void conv_transpose2d_backward_filter(const T* x, const T* dy, T* dw, T* dbias, const ConvShape& s);
// C (M, N) f32 = op(A) op(B), or C += op(A) op(B) with accumulate, A and B 16-bit (cublasGemmEx
// with CUDA_R_32F C, CUBLAS_COMPUTE_32F; kernels/cuda/blas.cpp): cpu::gemm_lowp's contract
// (kernels/cpu/gemm_lowp.h) without its bias, for the 16-bit linear_cross_entropy. Shapes and
// strides as gemm's.
template <class T>
void gemm_lowp(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda,
               const T* B, int64_t ldb, bool accumulate, float* C, int64_t ldc);
// A tensor's elements converted between f32, f64, bf16 and f16 (kernels/cuda/cast.cu), bitwise
// cpu::cast's (kernels/cpu/convert.h).
void cast(const void* x, DType from, void* y, DType to, int64_t n);
// GEMMs with 16-bit A, B and C through cublasGemmEx (CUDA_R_16BF / CUDA_R_16F operands,
// CUBLAS_COMPUTE_32F: f32 accumulation, tensor cores on a GPU that has them; alpha and beta in
// f32, C rounded once per element), as cpu::gemm<T>'s widening GEMM (kernels/cpu/gemm_lowp.h).
template <class T>
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
          int64_t lda, const T* B, int64_t ldb, T beta, T* C, int64_t ldc);
template <class T>
void gemm_batched(bool trans_a, bool trans_b, int64_t batch, int64_t M, int64_t N, int64_t K,
                  T alpha, const T* A, int64_t lda, int64_t stride_a, const T* B, int64_t ldb,
                  int64_t stride_b, T beta, T* C, int64_t ldc, int64_t stride_c);

// ---- Settings ----------------------------------------------------------------------------------
// A device's compute capability (kernels/cuda/device_info.cpp); throws regen::Error when the
// runtime cannot answer.
struct ComputeCapability {
  int major = 0, minor = 0;
};
ComputeCapability compute_capability(int device);
// Whether `device` has the bf16/f16 mma of sm_80 (compute capability 8.0 or later), asked of the
// runtime once per device: the tensor-core convolution and attention are chosen by it.
bool has_tensor_cores(int device);
enum class ConvAlgo { native, cudnn };
// Which convolution the conv2d launchers run (default native). cudnn in a build without cuDNN is
// a regen::Error.
void set_conv_algo(ConvAlgo algo);
ConvAlgo conv_algo();
// cuBLAS GEMMs in plain FP32 (default) or with TF32 tensor cores.
void set_tf32(bool enabled);
bool tf32_enabled();
// Creates the current device's cuBLAS handle and its persistent workspace now (otherwise the first
// GEMM does), so the workspace is counted before a training step starts.
void prepare_blas();

}  // namespace regen::cuda
#endif
