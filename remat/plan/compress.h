// Lossy compression of saved activations (--compress bf16|fp16; docs/remat.md, "Compression"):
// a retained saved tensor is narrowed to 16 bits after its last forward use (its f32 bytes freed)
// and widened back before backward first needs it. Which tensors may be (compressible), the names
// of the modes, and the time model the profiler measures. The schedule (remat/execute/schedule.h)
// places the narrowings and widenings; the simulator and the executor perform them in its order, so
// the predicted peaks stay exact. Tests: tests/test_compress.cpp.
#pragma once

#include <string>

#include "regen/core/types.h"
#include "regen/remat/profile/profile.h"

namespace regen {

// "none", "bf16", "fp16".
const char* compression_name(Compression c);
// The mode named `text`; throws regen::Error naming `what` (the option) and the three names.
Compression parse_compression(const std::string& text, const std::string& what = "compression");

// Whether saved tensor `s` of the profile may be held narrow when retained: an f32 activation the
// step computes (a node's visible output, not a hidden statistic such as batch norm's mean or a
// log-sum-exp, not a mask), which backward reads, and whose last forward use is not the last
// forward op (so there is a span to hold it narrow in). Independent of the profile's mode.
bool compressible(const Profile& p, int32_t s);

// Bytes of the narrow form of a tensor of `bytes` f32 bytes: 16 bits per value, in whole 32-bit
// words (what the executor allocates).
uint64_t narrow_bytes(uint64_t bytes);

// The allocation tags of saved tensor s's narrow form ("<saved name>@bf16") and of its widened
// f32 block (its producer's tag, as when forward made it): the executor's and the simulator's.
uint32_t narrow_tag(const Profile& p, int32_t s);
uint32_t widen_tag(const Profile& p, int32_t s);

// Narrowing and widening timed on `device` (median of a few runs at two sizes, a small and a large
// buffer from the allocator, category workspace, freed before returning): the fixed cost and the
// cost per MiB of each direction. Zeros in a dry run.
CompressCost measure_compress_cost(Device device, Compression c);

}  // namespace regen
