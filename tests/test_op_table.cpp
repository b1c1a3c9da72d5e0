// The op table (tests/op_table.h) on the CPU: every op kind of the op list has a row; every row
// passes the f64 gradcheck; every row's f32 forward and gradients agree with its f64 run.
#include <doctest/doctest.h>

#include "tests/op_table.h"

using namespace regen;
using namespace regen::testing;

TEST_CASE("op table: every op kind of the op list has a row") {
  const std::vector<OpCase> table = op_table();
  for (int k = 0; k < kNumOpKinds; ++k) {
    const OpKind kind = static_cast<OpKind>(k);
    const bool has =
        std::any_of(table.begin(), table.end(), [&](const OpCase& c) { return c.kind == kind; });
    CHECK_MESSAGE(has, "op ", op_name(kind), " has no row in tests/op_table.h");
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

TEST_CASE("op table: f32 forward and gradients agree with the f64 run on the CPU") {
  for (const OpCase& c : op_table()) {
    CAPTURE(c.name);
    check_against_f64(c, Device::cpu());
  }
}
