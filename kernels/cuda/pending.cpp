// TRANSITIONAL: CUDA launchers that are declared but not yet written. Each throws a clear
// regen::Error so the CUDA build links and a CUDA run fails loudly instead of silently. Every
// entry is removed as its kernel lands in kernels/cuda/<op>.cu; the file goes when it is empty.
#include "core/error.h"
#include "kernels/cuda/cuda_kernels.h"

namespace regen::cuda {

void attention_forward(const float*, const int32_t*, float*, float*, const AttentionShape&) {
  REGEN_FAIL("CUDA kernel attention_forward is not implemented yet");
}
void attention_backward(const float*, const float*, const float*, const float*, const int32_t*,
                        float*, const AttentionShape&) {
  REGEN_FAIL("CUDA kernel attention_backward is not implemented yet");
}

}  // namespace regen::cuda
