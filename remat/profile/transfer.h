// The transfer model: how long a copy between a device and its host tier takes, per direction, as
// latency + bytes / bandwidth. `regen bench copy` measures it on the copy queues the executor uses
// (core/copy_queue.h); `regen profile` stores it with the profile (Profile::transfer), and the
// simulator times an offload plan's copies with it: when each copy ends, and how long the step
// waits for one that is late (docs/remat.md, "Offload"). Tests: tests/test_offload.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "regen/core/types.h"

namespace regen {

struct Profile;

struct TransferModel {
  struct Link {
    double latency_ms = 0;    // per copy
    double bytes_per_ms = 0;  // bandwidth; 0: no link (the model is not set)
    double ms(uint64_t bytes) const;
  };
  Link to_host, to_device;
  // Where it comes from, for reports: "measured: regen bench copy on cpu, 2026-11-28", "step
  // fraction 0.4 of resnet152 b32 (...)".
  std::string source;

  bool valid() const { return to_host.bytes_per_ms > 0 && to_device.bytes_per_ms > 0; }
  double ms(bool to_host_direction, uint64_t bytes) const {
    return to_host_direction ? to_host.ms(bytes) : to_device.ms(bytes);
  }
  // "12.3 GB/s + 0.020 ms out, 11.8 GB/s + 0.021 ms back (source)"
  std::string str() const;
};

// JSON (inside profile.json and plan.json, and the file `regen bench copy --json` writes):
// {"to_host": {"latency_ms": ., "gb_per_s": .}, "to_device": {...}, "source": "..."}. GB/s are
// 10^9 bytes per second. Parsing throws regen::Error naming `origin` and the field.
std::string transfer_to_json(const TransferModel& t);
TransferModel transfer_from_json(const std::string& text, const std::string& origin);
TransferModel load_transfer(const std::string& path);

// One measured copy size of `regen bench copy`.
struct CopySample {
  uint64_t bytes = 0;
  double to_host_ms = 0, to_device_ms = 0;  // medians
};
// Copies of each size (median of `repeats`) through the copy queues between `device` and its host
// tier, and the model fitted to them (least squares of time against bytes per direction; a
// negative intercept is taken as 0). Allocates from the device's allocator and its host tier only.
TransferModel measure_transfer(Device device, const std::vector<uint64_t>& sizes, int repeats,
                               std::vector<CopySample>* samples = nullptr);

// The model a `--transfer` value names, for a profile p:
//   profile          the profile's own (measured when it was recorded; refused when it has none)
//   FILE.json        a model `regen bench copy --json` wrote
//   step:F           a GPU-like model: copying every saved activation of p's step once, one way,
//                    takes F of p's profiled step (F = 0.4: an H100's ResNet-152 step against PCIe
//                    5)
//   gbps:B[,LAT]     B GB/s both ways with LAT ms latency per copy (default 0)
// Throws regen::Error naming the value and what is wrong.
TransferModel transfer_for(const std::string& spec, const Profile& p);
// The bytes of every saved activation of p's step (what step:F copies in F of the step).
int64_t saved_activation_bytes(const Profile& p);

}  // namespace regen
