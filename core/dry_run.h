// Whether a dry run is under way (allocator.h, DryRunScope): the kernels and every read or write
// of a tensor's bytes check it. A header of its own so that kernels/kernels.h can ask without the
// allocator's.
#pragma once

#include <atomic>

namespace regen {

namespace detail {
extern std::atomic<bool> dry_run_flag;
}  // namespace detail

inline bool dry_run_active() { return detail::dry_run_flag.load(std::memory_order_relaxed); }

}  // namespace regen
