// TRANSITIONAL: CUDA launchers that are declared but not yet written. Each throws a clear
// regen::Error so the CUDA build links and a CUDA run fails loudly instead of silently. Every
// entry is removed as its kernel lands in kernels/cuda/<op>.cu; the file goes when it is empty.
#include "core/error.h"
#include "kernels/cuda/cuda_kernels.h"

namespace regen::cuda {

void gemm(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*, int64_t, float, float*, int64_t) {
  REGEN_FAIL("CUDA kernel gemm is not implemented yet");
}
void gemm_batched(bool, bool, int64_t, int64_t, int64_t, int64_t, float, const float*, int64_t, int64_t, const float*, int64_t, int64_t, float, float*, int64_t, int64_t) {
  REGEN_FAIL("CUDA kernel gemm_batched is not implemented yet");
}
void fill(float*, int64_t, float) {
  REGEN_FAIL("CUDA kernel fill is not implemented yet");
}
void copy(const float*, float*, int64_t) {
  REGEN_FAIL("CUDA kernel copy is not implemented yet");
}
void add(const float*, const float*, float*, int64_t, int64_t) {
  REGEN_FAIL("CUDA kernel add is not implemented yet");
}
void add_inplace(float*, const float*, int64_t) {
  REGEN_FAIL("CUDA kernel add_inplace is not implemented yet");
}
void mul(const float*, const float*, float*, int64_t, int64_t) {
  REGEN_FAIL("CUDA kernel mul is not implemented yet");
}
void scale(const float*, float*, int64_t, float) {
  REGEN_FAIL("CUDA kernel scale is not implemented yet");
}
void fill_from_scalar(const float*, float*, int64_t, float) {
  REGEN_FAIL("CUDA kernel fill_from_scalar is not implemented yet");
}
void relu_forward(const float*, float*, int64_t) {
  REGEN_FAIL("CUDA kernel relu_forward is not implemented yet");
}
void relu_backward(const float*, const float*, float*, int64_t) {
  REGEN_FAIL("CUDA kernel relu_backward is not implemented yet");
}
void gelu_forward(const float*, float*, int64_t) {
  REGEN_FAIL("CUDA kernel gelu_forward is not implemented yet");
}
void gelu_backward(const float*, const float*, float*, int64_t) {
  REGEN_FAIL("CUDA kernel gelu_backward is not implemented yet");
}
void sum_rows(const float*, float*, int64_t, int64_t) {
  REGEN_FAIL("CUDA kernel sum_rows is not implemented yet");
}
void sum_all(const float*, float*, int64_t) {
  REGEN_FAIL("CUDA kernel sum_all is not implemented yet");
}
void dropout_forward(const float*, float*, int64_t, float, uint64_t, uint64_t) {
  REGEN_FAIL("CUDA kernel dropout_forward is not implemented yet");
}
void dropout_backward(const float*, float*, int64_t, float, uint64_t, uint64_t) {
  REGEN_FAIL("CUDA kernel dropout_backward is not implemented yet");
}
void permute(const float*, float*, const PermuteShape&) {
  REGEN_FAIL("CUDA kernel permute is not implemented yet");
}
void conv2d_forward(const float*, const float*, const float*, float*, const ConvShape&) {
  REGEN_FAIL("CUDA kernel conv2d_forward is not implemented yet");
}
void conv2d_backward_data(const float*, const float*, float*, const ConvShape&) {
  REGEN_FAIL("CUDA kernel conv2d_backward_data is not implemented yet");
}
void conv2d_backward_filter(const float*, const float*, float*, float*, const ConvShape&) {
  REGEN_FAIL("CUDA kernel conv2d_backward_filter is not implemented yet");
}
void batchnorm_forward_train(const float*, const float*, const float*, float*, float*, float*, float*, float*, int64_t, int64_t, int64_t, double, double) {
  REGEN_FAIL("CUDA kernel batchnorm_forward_train is not implemented yet");
}
void batchnorm_forward_eval(const float*, const float*, const float*, const float*, const float*, float*, int64_t, int64_t, int64_t, double) {
  REGEN_FAIL("CUDA kernel batchnorm_forward_eval is not implemented yet");
}
void batchnorm_backward(const float*, const float*, const float*, const float*, const float*, float*, float*, float*, int64_t, int64_t, int64_t) {
  REGEN_FAIL("CUDA kernel batchnorm_backward is not implemented yet");
}
void batchnorm_backward_eval(const float*, const float*, const float*, const float*, const float*, float*, float*, float*, int64_t, int64_t, int64_t, double) {
  REGEN_FAIL("CUDA kernel batchnorm_backward_eval is not implemented yet");
}
void maxpool2d_forward(const float*, float*, int32_t*, const PoolShape&) {
  REGEN_FAIL("CUDA kernel maxpool2d_forward is not implemented yet");
}
void maxpool2d_backward(const float*, const int32_t*, float*, const PoolShape&) {
  REGEN_FAIL("CUDA kernel maxpool2d_backward is not implemented yet");
}
void avgpool2d_forward(const float*, float*, const PoolShape&) {
  REGEN_FAIL("CUDA kernel avgpool2d_forward is not implemented yet");
}
void avgpool2d_backward(const float*, float*, const PoolShape&) {
  REGEN_FAIL("CUDA kernel avgpool2d_backward is not implemented yet");
}
void global_avgpool_forward(const float*, float*, int64_t, int64_t) {
  REGEN_FAIL("CUDA kernel global_avgpool_forward is not implemented yet");
}
void global_avgpool_backward(const float*, float*, int64_t, int64_t) {
  REGEN_FAIL("CUDA kernel global_avgpool_backward is not implemented yet");
}
void embedding_forward(const float*, const int64_t*, float*, int64_t, int64_t, int64_t) {
  REGEN_FAIL("CUDA kernel embedding_forward is not implemented yet");
}
void embedding_backward(const float*, const int64_t*, float*, int64_t, int64_t, int64_t) {
  REGEN_FAIL("CUDA kernel embedding_backward is not implemented yet");
}
void layernorm_forward(const float*, const float*, const float*, float*, float*, float*, int64_t, int64_t, double) {
  REGEN_FAIL("CUDA kernel layernorm_forward is not implemented yet");
}
void layernorm_backward(const float*, const float*, const float*, const float*, const float*, float*, float*, float*, int64_t, int64_t) {
  REGEN_FAIL("CUDA kernel layernorm_backward is not implemented yet");
}
void softmax_forward(const float*, float*, int64_t, int64_t) {
  REGEN_FAIL("CUDA kernel softmax_forward is not implemented yet");
}
void softmax_backward(const float*, const float*, float*, int64_t, int64_t) {
  REGEN_FAIL("CUDA kernel softmax_backward is not implemented yet");
}
void attention_forward(const float*, const int32_t*, float*, float*, const AttentionShape&) {
  REGEN_FAIL("CUDA kernel attention_forward is not implemented yet");
}
void attention_backward(const float*, const float*, const float*, const float*, const int32_t*, float*, const AttentionShape&) {
  REGEN_FAIL("CUDA kernel attention_backward is not implemented yet");
}
void cross_entropy_forward(const float*, const int64_t*, float*, float*, int64_t, int64_t, int64_t) {
  REGEN_FAIL("CUDA kernel cross_entropy_forward is not implemented yet");
}
void cross_entropy_backward(const float*, const float*, const int64_t*, const float*, float*, int64_t, int64_t, int64_t) {
  REGEN_FAIL("CUDA kernel cross_entropy_backward is not implemented yet");
}
void sgd_step(float*, const float*, float*, int64_t, double, double, double, double, bool, bool) {
  REGEN_FAIL("CUDA kernel sgd_step is not implemented yet");
}
void adamw_step(float*, const float*, float*, float*, int64_t, double, double, double, double, double, int64_t) {
  REGEN_FAIL("CUDA kernel adamw_step is not implemented yet");
}

}  // namespace regen::cuda

// TRANSITIONAL settings until kernels/cuda lands them.
namespace regen::cuda {
namespace {
ConvAlgo g_conv_algo = ConvAlgo::native;
bool g_tf32 = false;
}  // namespace
void set_conv_algo(ConvAlgo algo) { g_conv_algo = algo; }
ConvAlgo conv_algo() { return g_conv_algo; }
void set_tf32(bool enabled) { g_tf32 = enabled; }
bool tf32_enabled() { return g_tf32; }
}  // namespace regen::cuda
