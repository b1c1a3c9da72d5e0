// The mixed-precision policy (precision.h).
#include "regen/autograd/precision.h"

#include <algorithm>

#include "regen/core/error.h"

namespace regen {

namespace {

struct NamedRule {
  const char* op;
  PrecisionRule rule;
};

constexpr PrecisionClass kLow = PrecisionClass::low;
constexpr PrecisionClass kFp32 = PrecisionClass::fp32;
constexpr PrecisionClass kFollow = PrecisionClass::follow;

// Every op of the op list, once. A new op adds its row here (the test fails until it does).
const std::vector<NamedRule>& rules() {
  static const std::vector<NamedRule> r = {
      // ---- low: 16-bit inputs, fp32 accumulation --------------------------------------------
      {"linear", {kLow, false, false, "a GEMM: 16-bit operands, fp32 accumulation"}},
      {"matmul", {kLow, false, false, "a GEMM"}},
      {"bmm", {kLow, false, false, "batched GEMMs"}},
      {"conv2d", {kLow, false, false, "an implicit GEMM"}},
      {"conv_transpose2d", {kLow, false, false, "an implicit GEMM"}},
      {"attention",
       {kLow, false, false,
        "its two products in 16 bits, the softmax between them in fp32 (one fused op)"}},
      {"linear_cross_entropy",
       {kLow, true, false,
        "the head's GEMM in 16 bits; the log-softmax and the loss in fp32, and an fp32 loss"}},
      // ---- fp32: range and accuracy ----------------------------------------------------------
      {"softmax", {kFp32, false, false, "exponentials and a normalizing sum"}},
      {"cross_entropy", {kFp32, false, false, "a log-softmax and the loss"}},
      {"sum", {kFp32, false, false, "a reduction: 16-bit sums lose the small terms"}},
      {"mean", {kFp32, false, false, "a reduction"}},
      // ---- follow: the inputs' dtype ---------------------------------------------------------
      {"batchnorm2d",
       {kFollow, false, true, "16 bits in and out; batch statistics and running stats in fp32"}},
      {"layernorm", {kFollow, false, true, "16 bits in and out; mean and rstd in fp32"}},
      {"rmsnorm", {kFollow, false, true, "16 bits in and out; rstd in fp32"}},
      {"add", {kFollow, false, false, "element-wise (fp32 beside 16 bits: fp32)"}},
      {"mul", {kFollow, false, false, "element-wise"}},
      {"scale", {kFollow, false, false, "element-wise"}},
      {"relu", {kFollow, false, false, "element-wise"}},
      {"gelu", {kFollow, false, false, "element-wise, computed in fp32 per element"}},
      {"gelu_tanh", {kFollow, false, false, "element-wise, computed in fp32 per element"}},
      {"dropout", {kFollow, false, false, "a mask"}},
      {"max_pool2d", {kFollow, false, false, "a selection: exact in any dtype"}},
      {"avg_pool2d", {kFollow, false, false, "a small window's mean, summed in fp32"}},
      {"global_avg_pool", {kFollow, false, false, "a mean per channel, summed in fp32"}},
      {"embedding", {kFollow, false, false, "a gather from the fp32 master table: fp32 rows"}},
      {"upsample2x", {kFollow, false, false, "a copy or a 2x2 interpolation"}},
      {"reshape", {kFollow, false, false, "a view"}},
      {"transpose", {kFollow, false, false, "a copy"}},
      {"permute", {kFollow, false, false, "a copy"}},
      {"concat", {kFollow, false, false, "a copy (fp32 beside 16 bits: fp32)"}},
      {"split", {kFollow, false, false, "a copy"}},
      {"narrow", {kFollow, false, false, "a copy"}},
      {"cast",
       {kFollow, false, false,
        "the conversion autocast records: never itself cast (its output dtype is its attribute)"}},
      {"gather_shards",
       {kFollow, false, false,
        "ZeRO-3's all-gather of a parameter's shards: the master weights' dtype, as stored"}},
  };
  return r;
}

}  // namespace

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::fp32:
      return "fp32";
    case Precision::tf32:
      return "tf32";
    case Precision::bf16:
      return "bf16";
    case Precision::fp16:
      return "fp16";
  }
  return "?";
}

Precision parse_precision(const std::string& name) {
  for (Precision p : {Precision::fp32, Precision::tf32, Precision::bf16, Precision::fp16}) {
    if (name == precision_name(p)) return p;
  }
  REGEN_FAIL("unknown precision '", name, "' (expected fp32, tf32, bf16 or fp16)");
}

DType low_dtype(Precision p) {
  switch (p) {
    case Precision::bf16:
      return DType::bf16;
    case Precision::fp16:
      return DType::f16;
    default:
      return DType::f32;
  }
}

namespace {
thread_local DType tl_autocast = DType::f32;
}  // namespace

AutocastScope::AutocastScope(DType low) : saved_(tl_autocast) {
  REGEN_CHECK(low == DType::f32 || is_low_precision(low),
              "autocast casts to bf16 or f16 (or is off: f32), not ", dtype_name(low));
  tl_autocast = low;
}
AutocastScope::~AutocastScope() {
  tl_autocast = saved_;
}
DType autocast_dtype() {
  return tl_autocast;
}

const char* precision_class_name(PrecisionClass c) {
  switch (c) {
    case PrecisionClass::low:
      return "low";
    case PrecisionClass::fp32:
      return "fp32";
    case PrecisionClass::follow:
      return "follow";
  }
  return "?";
}

const PrecisionRule& precision_rule(OpKind kind) {
  const std::string name = op_name(kind);
  for (const NamedRule& r : rules()) {
    if (name == r.op) return r.rule;
  }
  REGEN_FAIL("the mixed-precision policy (autograd/precision.cpp) has no rule for op '", name,
             "': add its row");
}

std::vector<std::string> precision_rule_names() {
  std::vector<std::string> out;
  for (const NamedRule& r : rules()) out.emplace_back(r.op);
  return out;
}

DType compute_dtype(OpKind kind, DType low, const std::vector<DType>& inputs) {
  REGEN_CHECK(is_low_precision(low), "mixed precision computes in bf16 or f16, not ",
              dtype_name(low));
  const PrecisionRule& rule = precision_rule(kind);
  if (rule.inputs == PrecisionClass::low) return low;
  if (rule.inputs == PrecisionClass::fp32) return DType::f32;
  if (inputs.empty()) return DType::f32;
  const DType first = inputs.front();
  if (rule.fp32_statistics) return first;
  const bool agree = std::all_of(inputs.begin(), inputs.end(), [&](DType d) { return d == first; });
  return agree ? first : DType::f32;
}

DType output_dtype(OpKind kind, DType low, const std::vector<DType>& inputs) {
  return precision_rule(kind).fp32_output ? DType::f32 : compute_dtype(kind, low, inputs);
}

}  // namespace regen
