// The op table (tests/op_table.h) on the CPU: every op kind of the op list has a row, and every row
// a reference; every row passes the f64 gradcheck; every row's f64 and f32 outputs and gradients
// agree with its reference (an f64 formula or PyTorch's stored values); every backward reads every
// tensor its op saved; every row run dry requests the scratch its real run requests (the same check
// runs on cuda:0 in tests/cuda/test_cuda_dry_run.cpp).
#include <doctest/doctest.h>

#include "tests/op_table.h"

using namespace regen;
using namespace regen::testing;

TEST_CASE("op table: every op kind of the op list has a row, every row a reference") {
  const std::vector<OpCase> table = op_table();
  for (int k = 0; k < kNumOpKinds; ++k) {
    const OpKind kind = static_cast<OpKind>(k);
    const bool has =
        std::any_of(table.begin(), table.end(), [&](const OpCase& c) { return c.kind == kind; });
    CHECK_MESSAGE(has, "op ", op_name(kind), " has no row in tests/op_table.h");
  }
  // A unary op's reference is its formula in tests/op_reference.h; any other row without a formula
  // needs PyTorch's values (tools/make_op_reference.py).
  for (const OpCase& c : table) {
    CAPTURE(c.name);
    if (c.formula) continue;
    CHECK_MESSAGE(stored_references().find(c.name + "/out") != nullptr, "row '", c.name,
                  "' has no reference: a unary op needs its formula in tests/op_reference.h, "
                  "another op its entry in tools/make_op_reference.py");
  }
  // Every stored reference belongs to a row (a renamed row leaves none behind).
  for (const auto& [key, tensor] : stored_references().tensors) {
    const std::string row = key.substr(0, key.rfind('/'));
    CHECK_MESSAGE(std::any_of(table.begin(), table.end(),
                              [&](const OpCase& c) { return c.name == row && !c.formula; }),
                  "tests/data/op_reference.safetensors holds '", key, "' for no row");
  }
}

TEST_CASE("op table: the f64 gradcheck of every row") {
  int checked = 0;
  for (const OpCase& c : op_table()) {
    if (!c.differentiable) continue;
    CAPTURE(c.name);
    GradcheckOptions o = c.tol;
    o.inputs.clear();
    for (size_t i = 0; i < c.inputs.size(); ++i) {
      if (c.inputs[i].kind == OpInput::Kind::real && c.inputs[i].grad)
        o.inputs.push_back(static_cast<int>(i));
    }
    gradcheck(c.name, c.fn, op_inputs(c, DType::f64, Device::cpu()), o);
    ++checked;
  }
  CHECK(checked >= kNumOpKinds);
}

namespace {
// Which saved values each node's backward read (TapeHooks::on_saved_read), against what the node
// saved (Node::saved).
struct SavedReads : TapeHooks {
  struct Ran {
    Node node;
    std::vector<int64_t> read;
    // What saved value v is to the node: "input i" or "output k".
    std::string name(int64_t v) const {
      for (size_t i = 0; i < node.inputs.size(); ++i) {
        if (node.inputs[i] == v) return "input " + std::to_string(i);
      }
      for (size_t k = 0; k < node.outputs.size(); ++k) {
        if (node.outputs[k] == v) return "output " + std::to_string(k);
      }
      return "value " + std::to_string(v);
    }
  };
  std::vector<Ran> ran;
  void on_backward_begin(Tape& tape, int32_t node) override {
    ran.push_back({tape.node(node), {}});
  }
  void on_saved_read(Tape&, int32_t, int64_t value) override { ran.back().read.push_back(value); }
};
}  // namespace

// An op saves only what its backward needs (OpDef::saves): a saved tensor its backward never reads
// holds memory through the whole forward for nothing, and the planner counts it. Every node of
// every row (the op's own and the helpers a row calls) must read each value it saved.
TEST_CASE("op table: every backward reads every tensor its op saved") {
  for (const OpCase& c : op_table()) {
    if (!c.differentiable) continue;
    CAPTURE(c.name);
    std::vector<Tensor> in = op_inputs(c, DType::f64, Device::cpu());
    for (size_t i = 0; i < in.size(); ++i) {
      if (c.inputs[i].kind == OpInput::Kind::real && c.inputs[i].grad)
        in[i].set_requires_grad(true);
    }
    SavedReads reads;
    {
      HooksScope scope(&reads);
      Tensor out = c.fn(in);
      Tape::current().backward(out, ones(out.shape(), DType::f64, Device::cpu()));
    }
    bool ran_op = false;
    for (const SavedReads::Ran& r : reads.ran) {
      ran_op = ran_op || r.node.kind == c.kind;
      for (int64_t v : r.node.saved) {
        CHECK_MESSAGE(std::find(r.read.begin(), r.read.end(), v) != r.read.end(), "op ",
                      std::string(op_name(r.node.kind)), " saves its ", r.name(v),
                      " but its backward never reads it: drop it from its OpDef::saves");
      }
    }
    CHECK_MESSAGE(ran_op, "no backward of op ", std::string(op_name(c.kind)), " ran");
  }
}

TEST_CASE("op table: f64 and f32 outputs and gradients agree with the reference on the CPU") {
  for (const OpCase& c : op_table()) {
    CAPTURE(c.name);
    check_against_reference(c, DType::f64, Device::cpu());
    check_against_reference(c, DType::f32, Device::cpu());
  }
}

// Each row's forward and backward in a dry run (core/allocator.h DryRunScope) request the workspace
// blocks a real run requests, in order: no launcher an op reaches takes scratch without a dry path
// (kernels/kernels.h, cpu::kDryRunLaunchers).
TEST_CASE("op table: every row run dry requests the scratch its real run requests on the CPU") {
  const int with_scratch = check_op_table_dry_runs(Device::cpu());
  MESSAGE(with_scratch, " rows take scratch");
  CHECK(with_scratch > 0);  // the GEMM, convolution and attention rows at least
}
