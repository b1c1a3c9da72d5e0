// Lossy compression of saved activations (compress.h).
#include "regen/remat/plan/compress.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "regen/core/error.h"
#include "regen/core/numeric.h"
#include "regen/core/tensor.h"
#include "regen/kernels/kernels.h"

namespace regen {

const char* compression_name(Compression c) {
  switch (c) {
    case Compression::bf16:
      return "bf16";
    case Compression::fp16:
      return "fp16";
    case Compression::none:
      break;
  }
  return "none";
}

Compression parse_compression(const std::string& text, const std::string& what) {
  for (Compression c : {Compression::none, Compression::bf16, Compression::fp16}) {
    if (text == compression_name(c)) return c;
  }
  REGEN_FAIL(what, " '", text, "' must be none, bf16 or fp16");
}

bool compressible(const Profile& p, int32_t s) {
  const ProfileSaved& sv = p.saved.at(static_cast<size_t>(s));
  const ProfileValue& root = p.values[static_cast<size_t>(sv.value)];
  if (root.leaf || root.alloc_id == 0 || root.dtype != DType::f32 || root.producer < 0)
    return false;
  if (sv.category != Category::activation || sv.first_bw_rank < 0) return false;
  const ProfileNode& producer = p.nodes[static_cast<size_t>(root.producer)];
  if (root.slot >= producer.num_visible_outputs) return false;
  return sv.last_fwd_use >= 0 && sv.last_fwd_use < p.num_forward_nodes() - 1;
}

uint64_t narrow_bytes(uint64_t bytes) {
  const uint64_t values = bytes / 4;
  return (values + 1) / 2 * 4;
}

uint32_t narrow_tag(const Profile& p, int32_t s) {
  return intern_tag(p.saved.at(static_cast<size_t>(s)).name + "@" + compression_name(p.compress));
}

uint32_t widen_tag(const Profile& p, int32_t s) {
  const ProfileSaved& sv = p.saved.at(static_cast<size_t>(s));
  return intern_tag(p.nodes.at(static_cast<size_t>(sv.producer)).name);
}

CompressCost measure_compress_cost(Device device, Compression c) {
  CompressCost cost;
  if (c == Compression::none || dry_run_active()) return cost;
  CategoryScope cat(Category::workspace);
  TagScope tag(intern_tag("compress cost"));
  // ms of one narrowing and one widening of n values: the median of 3 runs after one warm-up.
  auto time = [&](int64_t n, double& narrow_ms, double& widen_ms) {
    Tensor full = zeros({n}, DType::f32, device);
    Tensor narrow = empty({(n + 1) / 2}, DType::i32, device);
    auto* half_bits = reinterpret_cast<uint16_t*>(narrow.data<int32_t>());
    std::vector<double> a, b;
    for (int r = 0; r < 4; ++r) {
      kernels::synchronize(device);
      auto t0 = std::chrono::steady_clock::now();
      REGEN_LAUNCH(device, float, narrow_to_half, full.data<float>(), half_bits, n, c);
      kernels::synchronize(device);
      auto t1 = std::chrono::steady_clock::now();
      REGEN_LAUNCH(device, float, widen_from_half, half_bits, full.data<float>(), n, c);
      kernels::synchronize(device);
      auto t2 = std::chrono::steady_clock::now();
      if (r == 0) continue;
      a.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      b.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
    }
    narrow_ms = median(a);
    widen_ms = median(b);
  };
  const int64_t small = 16 * 1024, large = 2 * 1024 * 1024;  // values: 64 KiB and 8 MiB of f32
  double ns = 0, ws = 0, nl = 0, wl = 0;
  time(small, ns, ws);
  time(large, nl, wl);
  const double mib = static_cast<double>(large - small) * 4 / (1 << 20);
  cost.narrow_ms_per_mib = std::max(0.0, (nl - ns) / mib);
  cost.widen_ms_per_mib = std::max(0.0, (wl - ws) / mib);
  cost.narrow_fixed_ms = std::max(0.0, ns - cost.narrow_ms_per_mib * small * 4.0 / (1 << 20));
  cost.widen_fixed_ms = std::max(0.0, ws - cost.widen_ms_per_mib * small * 4.0 / (1 << 20));
  return cost;
}

}  // namespace regen
