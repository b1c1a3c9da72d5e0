// main() for the CUDA suites. On a machine without a GPU (no device, or no CUDA driver at all) a
// suite exits with ctest's skip code (77) and reports skipped, never failed; with
// REGEN_REQUIRE_GPU=1 (scripts/gpu-session.sh sets it) a missing GPU is a failure instead. Any
// other failure of the CUDA runtime (a driver older than the runtime, no device nodes in a
// container, ...) fails the suite with the runtime's message: a broken GPU is never a skip.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <exception>

#include "regen/core/cuda/runtime.h"

int main(int argc, char** argv) {
  try {
    const regen::cuda::DeviceProbe& probe = regen::cuda::probe_devices();
    if (!probe.error.empty()) {
      std::fprintf(stderr, "regen: %s\n", probe.error.c_str());
      return 1;
    }
    if (probe.count == 0) {
      if (regen::cuda::require_gpu()) {
        std::fprintf(stderr,
                     "regen: REGEN_REQUIRE_GPU=1 but no CUDA device is visible (CUDA driver %d, "
                     "runtime %d)\n",
                     probe.driver_version, probe.runtime_version);
        return 1;
      }
      std::printf("no CUDA device visible: skipping (REGEN_REQUIRE_GPU=1 makes this a failure)\n");
      return 77;
    }
  } catch (const std::exception& e) {  // a bad REGEN_REQUIRE_GPU value
    std::fprintf(stderr, "regen: %s\n", e.what());
    return 1;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
