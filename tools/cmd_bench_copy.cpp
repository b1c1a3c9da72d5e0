// `regen bench copy`: times copies between a device and its host tier on the copy queues the
// offload executor uses (core/copy_queue.h: cudaMemcpyAsync on a copy stream from pinned memory;
// a helper thread's memcpy on the CPU), fits the transfer model (latency + bytes / bandwidth, per
// direction; remat/profile/transfer.h) and prints both. --json writes the model, which
// `regen plan`, `train`, `frontier` and `sweep` take as --transfer FILE.json (profiles store
// their own).
#include <cstdio>
#include <ctime>

#include "regen/core/io.h"
#include "regen/remat/profile/transfer.h"
#include "regen/session/session.h"
#include "tools/command.h"
#include "tools/common.h"

namespace regen::tool {
namespace {

std::string date_today() {
  const std::time_t t = std::time(nullptr);
  char buf[16];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", std::localtime(&t));
  return buf;
}

struct Flags {
  std::string device = "auto";
  std::string sizes = "1MiB,4MiB,16MiB,64MiB,256MiB";
  int repeats = 5;
  std::string json;
};

void setup(CLI::App& app) {
  auto f = std::make_shared<Flags>();
  app.add_option("--device", f->device, "cpu, cuda, cuda:N or auto")->capture_default_str();
  app.add_option("--sizes", f->sizes, "comma-separated copy sizes (bytes, KiB, MiB, GiB)")
      ->capture_default_str();
  app.add_option("--repeats", f->repeats, "timed copies per size and direction (the median)")
      ->check(integer_in(1, 1000))
      ->capture_default_str();
  app.add_option("--json", f->json, "write the fitted transfer model here (for --transfer)")
      ->check(non_empty("a file name"));
  app.callback([f] {
    if (!f->json.empty()) check_output_path("--json", f->json);
    const Device device = resolve_device(f->device);
    std::vector<uint64_t> sizes;
    for (const std::string& s : split_commas(f->sizes)) {
      int64_t b = 0;
      try {
        b = parse_bytes(s);
      } catch (const Error& e) {
        REGEN_FAIL("--sizes: '", s, "': ", e.message());
      }
      REGEN_CHECK(b > 0 && b <= (int64_t{1} << 40), "--sizes: '", s,
                  "' must be between 1 byte and 1 TiB");
      sizes.push_back(static_cast<uint64_t>(b));
    }
    REGEN_CHECK(!sizes.empty(), "--sizes is empty: give at least one size");
    std::vector<CopySample> samples;
    TransferModel t = measure_transfer(device, sizes, f->repeats, &samples);
    t.source = "measured: regen bench copy on " + device.str() + ", " + date_today() + ", " +
               std::to_string(f->repeats) + " copies per size";
    std::printf("copies between %s and its host tier (%s), median of %d:\n", device.str().c_str(),
                host_allocator_for(device).arena().name().c_str(), f->repeats);
    std::printf("%12s %14s %10s %14s %10s\n", "bytes", "to host ms", "GB/s", "to device ms",
                "GB/s");
    for (const CopySample& c : samples) {
      std::printf("%12s %14.3f %10.2f %14.3f %10.2f\n",
                  format_bytes(static_cast<int64_t>(c.bytes)).c_str(), c.to_host_ms,
                  static_cast<double>(c.bytes) / (c.to_host_ms * 1e6), c.to_device_ms,
                  static_cast<double>(c.bytes) / (c.to_device_ms * 1e6));
    }
    std::printf("transfer model: %s\n", t.str().c_str());
    if (!f->json.empty()) {
      write_file_atomic(f->json, transfer_to_json(t));
      std::printf("wrote %s\n", f->json.c_str());
    }
    host_allocator_for(device).release_memory();
  });
}
REGEN_COMMAND("bench copy",
              "time copies between the device and its host tier (the offload transfer model)",
              setup);

}  // namespace
}  // namespace regen::tool
