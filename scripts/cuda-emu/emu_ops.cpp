// The CUDA-vs-CPU harness of tests/cuda/test_cuda_ops.cpp on small shapes, for the host emulation
// (scripts/cuda-emu/run.sh). The harness's own TEST_CASEs (GPU-sized shapes) are compiled out;
// the cases below call its helpers with shapes an emulator finishes in minutes.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
#undef TEST_CASE
#define TEST_CASE(name) [[maybe_unused]] static void DOCTEST_ANONYMOUS(DOCTEST_ANON_FUNC_)()
#include "tests/cuda/test_cuda_ops.cpp"
#undef TEST_CASE
#define TEST_CASE(name) DOCTEST_TEST_CASE(name)

namespace {
using regen::cuda::ConvAlgo;
}

TEST_CASE("emu gemm") {
  Rng rng(1);
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      gemm_case(rng, ta, tb, 1, 1, 1, 1.0f, 0.0f, false);
      gemm_case(rng, ta, tb, 17, 33, 9, 0.5f, 1.0f, false);
      gemm_case(rng, ta, tb, 30, 67, 20, 1.0f, -0.5f, false);
      gemm_batched_case(rng, ta, tb, 5, 33, 17, 40);
    }
  }
  gemm_case(rng, false, false, 0, 5, 3, 1.0f, 0.0f, false);
}

TEST_CASE("emu elementwise") {
  Rng rng(2);
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{4099}}) {
    elementwise_cases(rng, n, false);
    elementwise_cases(rng, n, true);
  }
  broadcast_case(rng, 1000, 1000);
  broadcast_case(rng, 512 * 3, 3);
  broadcast_case(rng, 4 * 512, 512);
  broadcast_case(rng, 7 * 130, 130);
  sum_rows_case(rng, 1, 5);
  sum_rows_case(rng, 1000, 3);
  sum_rows_case(rng, 1100, 40);
  sum_rows_case(rng, 3, 700);
  permute_case(rng, {2, 3, 4, 5}, {0, 2, 1, 3});
  permute_case(rng, {2, 8, 3, 2, 16}, {2, 0, 3, 1, 4});
  permute_case(rng, {2, 3, 1, 4, 5, 3}, {5, 4, 3, 2, 1, 0});
  permute_case(rng, {7}, {0});
}

#if REGEN_HAVE_CPU_CONV2D
TEST_CASE("emu conv2d: the remat suite's ResNet") {
  Rng rng(5);
  for (const ConvShape& s : remat_resnet_convs()) conv_case(rng, s, false, ConvAlgo::native);
}

TEST_CASE("emu conv2d") {
  Rng rng(3);
  for (const ConvShape& s : odd_convs()) {
    conv_case(rng, s, false, ConvAlgo::native);
    conv_case(rng, s, true, ConvAlgo::native);
  }
  conv_case(rng, make_conv_shape(1, 16, 10, 10, 32, 3, 3, 1, 1, 1, 1), false, ConvAlgo::native);
  conv_case(rng, make_conv_shape(1, 16, 10, 10, 32, 3, 3, 2, 2, 1, 1), false, ConvAlgo::native);
  conv_case(rng, make_conv_shape(2, 8, 9, 9, 16, 1, 1, 2, 2, 0, 0), true, ConvAlgo::native);
  conv_case(rng, make_conv_shape(1, 3, 20, 20, 16, 7, 7, 2, 2, 3, 3), false, ConvAlgo::native);
  conv_case(rng, make_conv_shape(1, 64, 4, 4, 16, 3, 3, 1, 1, 1, 1), true,
            ConvAlgo::native);  // split-K fwd
  conv_case(rng, make_conv_shape(2, 4, 16, 16, 8, 3, 3, 1, 1, 1, 1), true,
            ConvAlgo::native);  // split-K wgrad
  conv_case(rng, make_conv_shape(1, 20, 12, 12, 70, 3, 3, 1, 1, 1, 1), false, ConvAlgo::native);
  conv_case(rng, make_conv_shape(8, 2, 64, 64, 4, 3, 3, 1, 1, 1, 1), true,
            ConvAlgo::native);  // 128 splits
}
#endif

#if REGEN_HAVE_CPU_ATTENTION
TEST_CASE("emu attention") {
  Rng rng(11);
  attention_case(rng, attn(1, 77, 3, 5, true, 0.0f), true);
  attention_case(rng, attn(2, 70, 2, 64, false, 0.2f), true);
  attention_case(rng, attn(2, 128, 1, 64, true, 0.1f), true);
  attention_case(rng, attn(1, 64, 1, 128, true, 0.0f), false);
  attention_case(rng, attn(1, 66, 1, 96, false, 0.3f), false);
  attention_case(rng, attn(3, 1, 2, 16, false, 0.0f), false);
  attention_case(rng, attn(1, 40, 1, 8, false, 1.0f), false);
}
#endif

#if REGEN_HAVE_CPU_LAYERNORM
TEST_CASE("emu layernorm") {
  Rng rng(8);
  layernorm_case(rng, 5, 7, true, false);
  layernorm_case(rng, 33, 512, true, false);
  layernorm_case(rng, 9, 768, true, false);
  layernorm_case(rng, 3, 2048, true, false);
  layernorm_case(rng, 17, 512, false, false);
  layernorm_case(rng, 9, 512, true, true);
  layernorm_case(rng, 300, 64, true, false);
  // Enough blocks of partial sums (79) for the column sums' four-at-a-time loop and its tail.
  layernorm_case(rng, 2500, 64, true, false);
}
#endif

#if REGEN_HAVE_CPU_SOFTMAX
TEST_CASE("emu softmax") {
  Rng rng(9);
  softmax_case(rng, 3, 1);
  softmax_case(rng, 17, 100);
  softmax_case(rng, 5, 1000);
  softmax_case(rng, 2, 3000);
}
#endif

#if REGEN_HAVE_CPU_CROSS_ENTROPY
TEST_CASE("emu cross_entropy") {
  Rng rng(10);
  cross_entropy_case(rng, 5, 3, 0);
  cross_entropy_case(rng, 4, 7, 1);
  cross_entropy_case(rng, 33, 100, 5);
  cross_entropy_case(rng, 3, 2000, 2);
  const std::vector<float> logits(2 * 3, 0.5f), dloss{1.0f}, lse(2, 0.0f);
  const std::vector<int64_t> targets{1, 3};
  DeviceArray<float> dl(logits), dd(dloss), dlse(lse), loss(1), lse_out(2), dg(6);
  DeviceArray<int64_t> dt(targets);
  CHECK_THROWS_AS(
      cuda::cross_entropy_forward(dl.ptr(), dt.ptr(), loss.ptr(), lse_out.ptr(), 2, 3, -100),
      regen::Error);
  CHECK_THROWS_AS(
      cuda::cross_entropy_backward(dd.ptr(), dl.ptr(), dt.ptr(), dlse.ptr(), dg.ptr(), 2, 3, -100),
      regen::Error);
}
#endif

#if REGEN_HAVE_CPU_CROSS_ENTROPY
TEST_CASE("emu linear_cross_entropy") {
  Rng rng(13);
  linear_cross_entropy_case(rng, 5, 3, 0, true);
  linear_cross_entropy_case(rng, 7, 300, 3, true);
  linear_cross_entropy_case(rng, 9, 1000, 0, false);
  linear_cross_entropy_case(rng, 1, 7, 0, true);
  linear_cross_entropy_case(rng, 4, 7, 1, true);  // every row ignored
  linear_cross_entropy_errors();
}
#endif

#if REGEN_HAVE_CPU_BATCHNORM
TEST_CASE("emu batchnorm") {
  Rng rng(5);
  batchnorm_case(rng, 2, 3, 5, true);
  batchnorm_case(rng, 1, 7, 1, true);
  batchnorm_case(rng, 2, 5, 300, true);
  batchnorm_case(rng, 3, 4, 2000, false);
}
#endif

#if REGEN_HAVE_CPU_POOL
TEST_CASE("emu pool") {
  Rng rng(6);
  pool_case(rng, make_pool_shape(1, 4, 20, 20, 3, 3, 2, 2, 1, 1));
  pool_case(rng, make_pool_shape(1, 3, 7, 9, 3, 3, 1, 1, 1, 1));
  pool_case(rng, make_pool_shape(2, 2, 9, 8, 2, 2, 2, 2, 0, 0));
  pool_case(rng, make_pool_shape(1, 4, 10, 7, 4, 3, 3, 2, 2, 1));
  global_pool_case(rng, 40, 49);
  global_pool_case(rng, 5, 1);
  global_pool_case(rng, 3, 1000);
}
#endif

#if REGEN_HAVE_CPU_EMBEDDING
TEST_CASE("emu embedding") {
  Rng rng(7);
  embedding_case(rng, 300, 50, 70);
  embedding_case(rng, 7, 5, 3);
  embedding_case(rng, 100, 3, 130);
  embedding_case(rng, 700, 1, 33, embedding_ids(rng, {700}));
  embedding_case(rng, 905, 3, 70, embedding_ids(rng, {300, 600, 5}));
  embedding_case(rng, 600, 4, 5, embedding_ids(rng, {256, 257, 0, 87}));
  const std::vector<float> w(5 * 4, 1.0f), dy(3 * 4, 1.0f);
  const std::vector<int64_t> ids{0, 5, 2};
  DeviceArray<float> dw(w), ddy(dy), y(12), dweight(20);
  DeviceArray<int64_t> dids(ids);
  CHECK_THROWS_AS(cuda::embedding_forward(dw.ptr(), dids.ptr(), y.ptr(), 3, 5, 4), regen::Error);
  CHECK_THROWS_AS(cuda::embedding_backward(ddy.ptr(), dids.ptr(), dweight.ptr(), 3, 5, 4),
                  regen::Error);
}
#endif

#if REGEN_HAVE_CPU_OPTIM
TEST_CASE("emu optim") {
  Rng rng(12);
  optim_cases(rng, 1);
  optim_cases(rng, 1003);
}
#endif

TEST_CASE("emu slice_copy") {
  Rng rng(16);
  slice_case(rng, 2, 4, 16, 4, 0, 12, 4, false);  // float4 path
  slice_case(rng, 2, 4, 16, 4, 0, 12, 8, true);   // x unaligned: scalar path
  slice_case(rng, 3, 2, 5, 7, 4, 2, 0, false);
  slice_case(rng, 1, 3001, 1, 3700, 699, 3001, 0, false);
  slice_case(rng, 100, 1, 3, 4, 3, 2, 1, false);
  slice_case(rng, 4, 0, 7, 3, 1, 5, 2, false);
}

TEST_CASE("emu upsample2x") {
  Rng rng(17);
  upsample_case(rng, 4, 9, 7);
  upsample_case(rng, 3, 7, 5);
  upsample_case(rng, 2, 1, 1);
  upsample_case(rng, 1, 1, 9);
  upsample_case(rng, 5, 6, 1);
}

#if REGEN_HAVE_CPU_CONV2D
TEST_CASE("emu conv_transpose2d") {
  Rng rng(14);
  const ConvShape shapes[] = {
      make_conv_transpose_shape(2, 16, 4, 4, 8, 2, 2, 2, 2, 0, 0, 0, 0),
      make_conv_transpose_shape(1, 8, 5, 5, 4, 3, 3, 2, 2, 1, 1, 1, 1),
      make_conv_transpose_shape(1, 3, 7, 5, 5, 3, 3, 1, 1, 1, 1, 0, 0),
      make_conv_transpose_shape(2, 5, 4, 6, 7, 3, 2, 3, 2, 1, 0, 2, 1),
      make_conv_transpose_shape(1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0),
  };
  for (const ConvShape& s : shapes) {
    conv_transpose_case(rng, s, false, ConvAlgo::native);
    conv_transpose_case(rng, s, true, ConvAlgo::native);
  }
}
#endif
