// The mixed-precision policy: how each op of the op list computes when a run trains in a 16-bit
// format (bf16 or fp16; docs/precision.md says what exists yet), described once, here, for every
// op. As PyTorch's autocast does, it sorts ops into three classes:
// - low: the floating inputs are cast to the run's 16-bit format and the op accumulates in fp32
//   (convolution, linear, matmul, bmm, attention's two products); its output is 16-bit, and what
//   it saves for backward is the 16-bit copies (half the bytes of fp32);
// - fp32: the inputs are cast to fp32 and the op computes and returns fp32 (softmax, the losses,
//   reductions), where 16 bits lose range or accuracy that training needs;
// - follow: the op runs in its inputs' dtype (the widest when they differ: fp32 beside a 16-bit
//   one), as element-wise ops, pooling, dropout and views do; an op that keeps statistics (batch
//   norm, layer norm) computes and saves them in fp32 whatever its input.
// Master weights, gradients and optimizer state stay fp32 in every class. docs/precision.md shows
// the table beside PyTorch's autocast lists and says where regen differs. Tests:
// tests/test_precision.cpp (every op has a rule; the dtypes each class gives).
#pragma once

#include <string>
#include <vector>

#include "regen/autograd/tape.h"
#include "regen/core/types.h"

namespace regen {

// The precision a run trains in (--precision; SessionOptions::precision; precision= in Python):
// fp32 (every op in f32), tf32 (f32 tensors; GEMMs and convolutions may use TF32 tensor cores on a
// GPU that has them), bf16 and fp16 (mixed precision: low-class ops compute from 16-bit copies,
// as below; master weights, gradients and optimizer state stay f32).
enum class Precision : uint8_t { fp32, tf32, bf16, fp16 };
const char* precision_name(Precision p);  // "fp32", "tf32", "bf16", "fp16"
// The precision a name precision_name gives; throws regen::Error naming the choices otherwise.
Precision parse_precision(const std::string& name);
// The 16-bit dtype a mixed precision computes low-class ops in (bf16, f16), or f32 for fp32 and
// tf32.
DType low_dtype(Precision p);
inline bool is_mixed(Precision p) {
  return p == Precision::bf16 || p == Precision::fp16;
}

// Autocast: while a scope with a 16-bit dtype is open on the calling thread, each op recorded on
// the tape has its floating inputs cast (by the cast op, on the tape, so the copies are saved
// tensors the planner sees) to the dtypes its rule below gives. f32 (the default) turns it off; a
// scope puts back the state before it when it ends, also when an exception leaves it.
class AutocastScope {
 public:
  explicit AutocastScope(DType low);
  ~AutocastScope();
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  DType saved_;
};
// The 16-bit dtype autocast casts to on the calling thread, or f32 when it is off.
DType autocast_dtype();

enum class PrecisionClass : uint8_t { low, fp32, follow };
const char* precision_class_name(PrecisionClass c);  // "low", "fp32", "follow"

struct PrecisionRule {
  PrecisionClass inputs = PrecisionClass::follow;
  // The dtype of the output: the class's (low: the 16-bit format; fp32: f32; follow: the compute
  // dtype), unless `fp32_output` (an op of class low whose result is a loss: the fused head).
  bool fp32_output = false;
  // Statistics (mean, variance, rstd) computed and saved in fp32 whatever the input dtype.
  bool fp32_statistics = false;
  const char* why = "";  // one line: why this class (the docs' table)
};

// The rule of op `kind`; throws regen::Error for a kind the policy has no rule for (the test
// makes sure every op of the list has one).
const PrecisionRule& precision_rule(OpKind kind);
// Every op name the policy has a rule for, in the policy's order.
std::vector<std::string> precision_rule_names();

// The dtype op `kind` computes in under a run whose 16-bit format is `low` (bf16 or f16), given
// its floating inputs' dtypes: `low` for class low, f32 for class fp32, and for follow the inputs'
// dtype when they agree, else f32 -- except an op with fp32_statistics, which computes in its
// first input's dtype and reads its parameters (the other inputs) in f32. Throws regen::Error
// when `low` is not a 16-bit format.
DType compute_dtype(OpKind kind, DType low, const std::vector<DType>& inputs);
// The dtype of its output: the compute dtype, or f32 for an op whose rule says fp32_output.
DType output_dtype(OpKind kind, DType low, const std::vector<DType>& inputs);

}  // namespace regen
