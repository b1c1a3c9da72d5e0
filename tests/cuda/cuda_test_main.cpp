// main() for the CUDA suites: exits with ctest's skip code (77) when no GPU is visible, so a
// machine without one reports the suite as skipped, never as failed.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include "regen/core/cuda/runtime.h"

int main(int argc, char** argv) {
  if (regen::cuda::device_count() == 0) {
    std::printf("no CUDA device visible: skipping\n");
    return 77;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
