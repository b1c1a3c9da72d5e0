// Remat under mpirun (docs/distributed.md, "Memory plans per rank"). Every rank profiles its own
// step, reducing its gradients as data parallelism does; the steps of all ranks make the same
// allocator requests (same model, local batch, buckets and shard sizes, padded to be equal), and
// this checks it: a profile is the job's only when every rank's memory record is rank 0's, and
// then every rank plans from rank 0's profile (its timings too), so that every rank makes the same
// plan and the same decisions in every command, and checks its own measured peaks against it.
// Tests: tests/mpi/.
#pragma once

#include "regen/remat/profile/profile.h"

namespace regen {

// Alone: `mine`, unchanged. Under mpirun: refuses, on rank 0 and naming the rank, a rank whose
// profiled step made other allocations (its events, markers or starting layout differ from rank
// 0's); then rank 0's profile, as every rank reads it back from its JSON text.
Profile agree_on_profile(Profile mine);

// A fingerprint of everything a profile's memory prediction rests on: the starting layout, every
// allocator event (kind, sizes, category) and every marker's position.
uint64_t profile_memory_fingerprint(const Profile& p);

}  // namespace regen
