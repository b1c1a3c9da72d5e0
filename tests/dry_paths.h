// The check of a launcher's dry path (kernels/kernels.h, cpu:: and cuda::kDryRunLaunchers): called
// through REGEN_LAUNCH in a dry run (DryRunScope, core/allocator.h), it asks the allocator for the
// same workspace blocks, of the same sizes, in the same order and nesting, as a real call, and
// touches no tensor byte (a dry run's tensors live at the Null arena's addresses, which are not
// memory: a read or write there faults on the CPU and in the CUDA host emulation, and is an
// illegal address on a GPU). Used by tests/test_kernels_cpu.cpp (cpu), tests/test_op_table.cpp
// and tests/cuda/test_cuda_dry_run.cpp (cuda:0).
#pragma once

#include <doctest/doctest.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "regen/core/allocator.h"
#include "regen/kernels/kernels.h"

namespace regen::testing {

// One workspace request or free the allocator saw: (alloc or free, requested bytes).
using ScratchEvents = std::vector<std::pair<MemoryEventKind, int64_t>>;

// Runs body(begin) on `device`'s allocator, or in a dry run of `device` (its tensors on the Null
// arena). body makes its tensors, calls begin(), then launches; returns the workspace-category
// allocs and frees after begin(), in order. A dry run ends with only the blocks it kept for the
// device (DryRunScope::kept_blocks: cuBLAS's workspace on CUDA) live.
template <class Body>
ScratchEvents scratch_events(Device device, bool dry, const Body& body) {
  std::unique_ptr<DryRunScope> scope;
  if (dry) scope = std::make_unique<DryRunScope>(device);
  CachingAllocator& a = allocator_for(device);
  REQUIRE(!a.event_log_enabled());
  // The log goes off however body ends: a launch that throws must not leave it on for the test
  // cases after this one.
  struct LogOff {
    CachingAllocator& a;
    ~LogOff() {
      a.set_event_log(false);
      a.clear_events();
    }
  } log_off{a};
  body([&a] {
    a.clear_events();
    a.set_event_log(true);
  });
  kernels::synchronize(device);
  ScratchEvents out;
  for (const MemoryEvent& e : a.events()) {
    if (e.category != Category::workspace) continue;
    if (e.kind == MemoryEventKind::alloc || e.kind == MemoryEventKind::free) {
      out.emplace_back(e.kind, e.requested);
    }
  }
  if (dry) CHECK(scope->allocator().stats().live_blocks == scope->kept_blocks());
  return out;
}

// The dry run's scratch events equal the real call's; `scratch` says whether there are any
// (nullopt: whatever the real call requests, which a library may decide). Returns the real call's.
template <class Body>
ScratchEvents check_dry_path(Device device, const std::string& what, std::optional<bool> scratch,
                             const Body& body) {
  CAPTURE(what);
  const int64_t real_allocs = allocator_for(device).stats().num_allocs;
  const ScratchEvents real = scratch_events(device, false, body);
  const int64_t before_dry = allocator_for(device).stats().num_allocs;
  CHECK(before_dry > real_allocs);  // the real call's tensors
  const ScratchEvents dry = scratch_events(device, true, body);
  CHECK(allocator_for(device).stats().num_allocs == before_dry);  // nothing on the real one
  if (scratch) CHECK(real.empty() == !*scratch);
  CHECK(dry.size() == real.size());
  CHECK(dry == real);
  return real;
}

}  // namespace regen::testing
