// The mixed-precision policy (autograd/precision.h): every op of the op list has exactly one rule,
// no rule names an op the list does not have, and each class gives the dtypes it promises.
#include <doctest/doctest.h>

#include <set>
#include <stdexcept>
#include <string>

#include "regen/autograd/precision.h"
#include "test_util.h"

using namespace regen;

namespace {
OpKind kind(const std::string& name) {
  const OpKind k = op_kind_by_name(name);
  REQUIRE_MESSAGE(k != kNoOpKind, "no op '", name, "'");
  return k;
}
}  // namespace

TEST_CASE("precision: every op of the op list has one rule, and every rule an op") {
  std::set<std::string> seen;
  for (const std::string& name : precision_rule_names()) {
    CAPTURE(name);
    CHECK(seen.insert(name).second);  // once
    CHECK(op_kind_by_name(name) != kNoOpKind);
  }
  for (int k = 0; k < num_op_kinds(); ++k) {
    const OpKind op = static_cast<OpKind>(k);
    CAPTURE(op_name(op));
    CHECK(seen.count(op_name(op)) == 1);
    CHECK_NOTHROW(precision_rule(op));
    CHECK(std::string(precision_rule(op).why).size() > 0);
  }
  CHECK(seen.size() == static_cast<size_t>(num_op_kinds()));
}

TEST_CASE("precision: each class gives the dtypes it promises") {
  for (const DType low : {DType::bf16, DType::f16}) {
    CAPTURE(dtype_name(low));
    // low: the 16-bit format whatever the inputs.
    CHECK(compute_dtype(kind("linear"), low, {DType::f32, DType::f32}) == low);
    CHECK(output_dtype(kind("conv2d"), low, {DType::f32}) == low);
    CHECK(output_dtype(kind("attention"), low, {low, low, low}) == low);
    // ...but the fused head returns an fp32 loss.
    CHECK(compute_dtype(kind("linear_cross_entropy"), low, {low}) == low);
    CHECK(output_dtype(kind("linear_cross_entropy"), low, {low}) == DType::f32);
    // fp32: always.
    CHECK(output_dtype(kind("softmax"), low, {low}) == DType::f32);
    CHECK(output_dtype(kind("cross_entropy"), low, {low}) == DType::f32);
    CHECK(output_dtype(kind("sum"), low, {low}) == DType::f32);
    // follow: the inputs' dtype when they agree, else fp32.
    CHECK(output_dtype(kind("relu"), low, {low}) == low);
    CHECK(output_dtype(kind("relu"), low, {DType::f32}) == DType::f32);
    CHECK(output_dtype(kind("add"), low, {low, low}) == low);
    CHECK(output_dtype(kind("add"), low, {low, DType::f32}) == DType::f32);
    CHECK(output_dtype(kind("add"), low, {DType::bf16, DType::f16}) == DType::f32);
    CHECK(output_dtype(kind("layernorm"), low, {low}) == low);
    // An op with fp32 statistics computes in its input's dtype and reads its f32 parameters.
    CHECK(output_dtype(kind("layernorm"), low, {low, DType::f32, DType::f32}) == low);
    CHECK(output_dtype(kind("batchnorm2d"), low, {low, DType::f32, DType::f32}) == low);
    CHECK(output_dtype(kind("layernorm"), low, {DType::f32, DType::f32, DType::f32}) == DType::f32);
    CHECK(precision_rule(kind("layernorm")).fp32_statistics);
    CHECK(precision_rule(kind("batchnorm2d")).fp32_statistics);
    CHECK(!precision_rule(kind("add")).fp32_statistics);
  }
  // Only a 16-bit format is a run's low precision.
  CHECK(regen::testing::error_of([] {
          compute_dtype(kind("linear"), DType::f32, {});
        }).find("bf16 or f16") != std::string::npos);
}

TEST_CASE("precision: the run's precision by name, its 16-bit dtype, and the autocast scope") {
  for (const Precision p : {Precision::fp32, Precision::tf32, Precision::bf16, Precision::fp16}) {
    CHECK(parse_precision(precision_name(p)) == p);
  }
  CHECK(low_dtype(Precision::bf16) == DType::bf16);
  CHECK(low_dtype(Precision::fp16) == DType::f16);
  CHECK(low_dtype(Precision::fp32) == DType::f32);
  CHECK(low_dtype(Precision::tf32) == DType::f32);
  CHECK(is_mixed(Precision::bf16));
  CHECK(!is_mixed(Precision::tf32));
  const std::string e = regen::testing::error_of([] { parse_precision("bfloat16"); });
  CHECK(e.find("'bfloat16'") != std::string::npos);
  CHECK(e.find("fp32, tf32, bf16 or fp16") != std::string::npos);

  CHECK(autocast_dtype() == DType::f32);
  {
    AutocastScope on(DType::bf16);
    CHECK(autocast_dtype() == DType::bf16);
    {
      AutocastScope off(DType::f32);
      CHECK(autocast_dtype() == DType::f32);
    }
    CHECK(autocast_dtype() == DType::bf16);
  }
  CHECK(autocast_dtype() == DType::f32);
  try {
    AutocastScope on(DType::f16);
    throw std::runtime_error("leaving");
  } catch (const std::runtime_error&) {
  }
  CHECK(autocast_dtype() == DType::f32);
  CHECK(regen::testing::error_of([] { AutocastScope s(DType::i64); }).find("bf16 or f16") !=
        std::string::npos);
}
