// Whether a dry run is under way on the calling thread (allocator.h, DryRunScope): the kernels and
// every read or write of a tensor's bytes check it. A header of its own so that kernels/kernels.h
// can ask without the allocator's. The dry run's ops, allocations and copies all run on the thread
// that opened the scope: the only kernels called are the launchers with a dry path
// (kernels/kernels.h, cpu:: and cuda::kDryRunLaunchers), which request their scratch and return
// (the CPU ones enter no parallel region, the CUDA ones launch nothing). Other threads run as
// usual.
#pragma once

namespace regen {

// Defined beside DryRunScope (core/allocator_registry.cpp), over a thread_local of that file: an
// extern thread_local read through GCC's TLS wrapper from every file trips UBSan's null check.
bool dry_run_active();

}  // namespace regen
