// Ops that bind themselves into Python: an op's file (autograd/ops_<op>.cpp) registers its function
// with REGEN_REGISTER_FUNCTION, naming its tensor arguments and its number arguments with their
// defaults, and python/ops.cpp binds every registered function into regen.ops under that name. So
// an op whose signature is tensors then numbers is bound from its own file, with no edit in
// python/. Tests: tests/python/test_unary_ops.py (every registered function is in regen.ops).
#pragma once

#include <utility>
#include <vector>

#include "regen/autograd/tape.h"

namespace regen {

struct OpFunction {
  const char* name;                                     // the Python name, regen.ops.<name>
  const char* doc;                                      // its docstring
  std::vector<const char*> tensors;                     // tensor arguments, in order
  std::vector<std::pair<const char*, double>> numbers;  // then numbers, with their defaults
  // Calls the op: tensors in the order above, numbers too (defaults filled in).
  Tensor (*call)(const std::vector<Tensor>& tensors, const std::vector<double>& numbers);
};

// Adds f to the registry (at static initialization, through REGEN_REGISTER_FUNCTION); a second
// function of the same name is a regen::Error when the registry is read.
bool register_function(const OpFunction& f);
// Every registered function, in registration order.
const std::vector<OpFunction>& registered_functions();

// REGEN_REGISTER_FUNCTION(name, doc, {tensor names}, {{number name, default}, ...}, call):
// registers `name` for regen.ops at static initialization, in the op's file.
#define REGEN_REGISTER_FUNCTION(name, ...)             \
  static const bool regen_function_registered_##name = \
      ::regen::register_function(::regen::OpFunction{#name, __VA_ARGS__})

}  // namespace regen
