// The op table (tests/op_table.h) on CUDA: every row's f32 forward and gradients on cuda:0 agree
// with the CPU's f64 run. Exits with ctest's skip code without a GPU (cuda_test_main.cpp).
#include <doctest/doctest.h>

#include "tests/op_table.h"

using namespace regen;
using namespace regen::testing;

TEST_CASE("op table on cuda:0: f32 forward and gradients agree with the CPU's f64 run") {
  int rows = 0;
  for (const OpCase& c : op_table()) {
    CAPTURE(c.name);
    check_against_f64(c, Device::cuda(0));
    ++rows;
  }
  CHECK(rows >= kNumOpKinds);
}
