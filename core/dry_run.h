// Whether a dry run is under way (allocator.h, DryRunScope): the kernels and every read or write
// of a tensor's bytes check it. A header of its own so that kernels/kernels.h can ask without the
// allocator's.
#pragma once

namespace regen {

namespace detail {
extern thread_local bool dry_run_flag;  // per thread: other threads run as usual
}  // namespace detail

// On the calling thread (the dry run's ops, allocations and copies all run on the thread that
// opened the scope; no kernel runs, so no parallel region does either).
inline bool dry_run_active() { return detail::dry_run_flag; }

}  // namespace regen
