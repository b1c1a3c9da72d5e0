// Grad mode, module and block scopes, and the global RNG seed and streams (tape.h).
#include "regen/autograd/tape.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <string>

#include "regen/kernels/kernels.h"

namespace regen {

// ---- Modes, scopes, RNG -----------------------------------------------------------------------

namespace {
thread_local bool tl_grad_mode = true;
thread_local std::string tl_module_path;
std::atomic<uint64_t> g_seed{0};
std::atomic<uint64_t> g_stream{1};
}  // namespace

bool grad_mode_enabled() {
  return tl_grad_mode;
}
NoGradScope::NoGradScope() : saved_(tl_grad_mode) {
  tl_grad_mode = false;
}
NoGradScope::~NoGradScope() {
  tl_grad_mode = saved_;
}

ModuleScope::ModuleScope(const std::string& name) : saved_size_(tl_module_path.size()) {
  if (!name.empty()) {
    if (!tl_module_path.empty()) tl_module_path += '.';
    tl_module_path += name;
  }
}
ModuleScope::~ModuleScope() {
  tl_module_path.resize(saved_size_);
}
const std::string& ModuleScope::current_path() {
  return tl_module_path;
}

BlockScope::BlockScope(const std::string& name) {
  std::string full = ModuleScope::current_path();
  if (!name.empty()) full += (full.empty() ? "" : ".") + name;
  block_ = Tape::current().begin_block(intern_tag(full));
}
BlockScope::~BlockScope() {
  Tape::current().end_block(block_);
}

void manual_seed(uint64_t seed) {
  g_seed = seed;
  g_stream = 1;
}
uint64_t rng_seed() {
  return g_seed;
}
uint64_t next_rng_stream() {
  return g_stream++;
}
uint64_t rng_stream_position() {
  return g_stream;
}
void set_rng_state(uint64_t seed, uint64_t stream) {
  g_seed = seed;
  g_stream = stream;
}

RngStreamRestore::RngStreamRestore() : seed_(g_seed), stream_(g_stream) {}
RngStreamRestore::~RngStreamRestore() {
  g_seed = seed_;
  g_stream = stream_;
}

RngStreamDraw::~RngStreamDraw() {
  // Undo the draw only if nothing drew after it (a later draw keeps its stream).
  uint64_t expected = stream_ + 1;
  if (!committed_) g_stream.compare_exchange_strong(expected, stream_);
}

}  // namespace regen
