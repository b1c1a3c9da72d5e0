// The op list's names and the registry of OpDefs (op_list.h REGEN_OPS, register_op).
#include "regen/autograd/op_list.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <string>

#include "regen/autograd/functions.h"
#include "regen/kernels/kernels.h"

namespace regen {

// ---- Op registry ----------------------------------------------------------------------------

namespace {
std::array<const OpDef*, kNumOpKinds>& registry() {
  static std::array<const OpDef*, kNumOpKinds> table{};
  return table;
}
#define REGEN_OP_NAME(name) #name,
const char* const kOpNames[] = {REGEN_OPS(REGEN_OP_NAME)};
#undef REGEN_OP_NAME
static_assert(sizeof(kOpNames) / sizeof(kOpNames[0]) == kNumOpKinds, "one name per op kind");

}  // namespace

bool register_op(OpKind kind, const OpDef* def) {
  registry()[static_cast<size_t>(kind)] = def;
  return true;
}

const OpDef& op_def(OpKind kind) {
  const OpDef* d = registry().at(static_cast<size_t>(kind));
  REGEN_CHECK(d != nullptr, "op ", op_name(kind),
              " is not registered (its object file was not linked)");
  return *d;
}

const char* op_name(OpKind kind) {
  const size_t i = static_cast<size_t>(kind);
  return i < static_cast<size_t>(kNumOpKinds) ? kOpNames[i] : "?";
}

int num_op_kinds() {
  return kNumOpKinds;
}

OpKind op_kind_by_name(const std::string& name) {
  for (int i = 0; i < kNumOpKinds; ++i) {
    if (name == kOpNames[i]) return static_cast<OpKind>(i);
  }
  return kNoOpKind;
}

// ---- Functions bound into Python (autograd/functions.h)
// ------------------------------------------

namespace {
std::vector<OpFunction>& function_registry() {
  static std::vector<OpFunction> functions;
  return functions;
}
}  // namespace

bool register_function(const OpFunction& f) {
  function_registry().push_back(f);
  return true;
}

const std::vector<OpFunction>& registered_functions() {
  const std::vector<OpFunction>& fs = function_registry();
  for (size_t i = 0; i < fs.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      REGEN_CHECK(std::strcmp(fs[i].name, fs[j].name) != 0, "function ", fs[i].name,
                  " is registered twice (REGEN_REGISTER_FUNCTION)");
    }
  }
  return fs;
}

const char* saved_state_name(SavedState s) {
  switch (s) {
    case SavedState::resident:
      return "resident";
    case SavedState::evicted:
      return "evicted";
    case SavedState::released:
      return "released";
  }
  return "?";
}

}  // namespace regen
