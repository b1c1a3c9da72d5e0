// The op table (tests/op_table.h) on CUDA: every row's f32 output and gradients on cuda:0 agree
// with its reference (an f64 formula or PyTorch's stored values). Exits with ctest's skip code
// without a GPU (cuda_test_main.cpp).
#include <doctest/doctest.h>

#include "tests/op_table.h"

using namespace regen;
using namespace regen::testing;

TEST_CASE("op table on cuda:0: f32 outputs and gradients agree with the reference") {
  int rows = 0;
  for (const OpCase& c : op_table()) {
    CAPTURE(c.name);
    check_against_reference(c, DType::f32, Device::cuda(0));
    ++rows;
  }
  CHECK(rows >= kNumOpKinds);
}
