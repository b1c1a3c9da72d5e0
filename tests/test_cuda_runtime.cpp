// The CUDA runtime probe (core/cuda/runtime.h) and how the GPU suites use it, on every machine of
// a CUDA build: with or without a GPU. A machine without one must make the GPU suites report
// skipped; a broken GPU setup, or REGEN_REQUIRE_GPU=1 without a GPU, must make them fail.
// Built only when regen has CUDA (tests/CMakeLists.txt); REGEN_CUDA_SUITE is test_cuda_allocator.
#include <doctest/doctest.h>

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "regen/core/cuda/runtime.h"
#include "test_util.h"

namespace {

using namespace regen;
using regen::testing::expect_error;

struct Outcome {
  int status = -1;
  std::string output;
};

// Runs the CUDA suite with `env` (assignments) in front, and no test case selected beyond the
// start-up check: its exit status and its output (stdout and stderr).
Outcome run_suite(const std::string& env) {
  const std::string cmd = env + " '" + std::string(REGEN_CUDA_SUITE) + "' -tc='no such test' 2>&1";
  Outcome o;
  FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[512];
  while (std::fgets(buf, sizeof buf, p)) o.output += buf;
  const int raw = ::pclose(p);
  o.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  return o;
}

// Sets an environment variable for a scope and restores the previous value.
class EnvScope {
 public:
  EnvScope(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) {
      had_ = true;
      old_ = old;
    }
    if (value)
      ::setenv(name, value, 1);
    else
      ::unsetenv(name);
  }
  ~EnvScope() {
    if (had_)
      ::setenv(name_, old_.c_str(), 1);
    else
      ::unsetenv(name_);
  }

 private:
  const char* name_;
  bool had_ = false;
  std::string old_;
};

}  // namespace

TEST_CASE("cuda runtime: a missing GPU or driver is no GPU and every other failure is an error") {
  // A GPU machine.
  cuda::DeviceProbe p = cuda::classify_device_query(cudaSuccess, 2, 13000, 13000);
  CHECK(p.count == 2);
  CHECK(p.error.empty());
  // A driver and no device.
  p = cuda::classify_device_query(cudaErrorNoDevice, 0, 13000, 13000);
  CHECK(p.count == 0);
  CHECK(p.error.empty());
  // No driver installed at all (what the runtime says on a machine without one).
  p = cuda::classify_device_query(cudaErrorInsufficientDriver, 0, 0, 13000);
  CHECK(p.count == 0);
  CHECK(p.error.empty());
  // A driver older than the runtime: a broken GPU, not a missing one.
  p = cuda::classify_device_query(cudaErrorInsufficientDriver, 0, 12020, 13000);
  CHECK(p.count == 0);
  CHECK(p.error.find("cudaErrorInsufficientDriver") != std::string::npos);
  CHECK(p.error.find("driver 12020, runtime 13000") != std::string::npos);
  CHECK(p.error.find("older than this runtime") != std::string::npos);
  // Anything else: no device nodes, a bad CUDA_VISIBLE_DEVICES, an unknown failure.
  for (cudaError_t e : {cudaErrorNotPermitted, cudaErrorInvalidDevice, cudaErrorUnknown,
                        cudaErrorOperatingSystem, cudaErrorInitializationError}) {
    p = cuda::classify_device_query(e, 0, 13000, 13000);
    CHECK(p.count == 0);
    CHECK_MESSAGE(p.error.find(cudaGetErrorName(e)) != std::string::npos, p.error);
  }
}

TEST_CASE("cuda runtime: this machine's probe agrees with device_count") {
  const cuda::DeviceProbe& p = cuda::probe_devices();
  CHECK(&p == &cuda::probe_devices());  // asked once
  if (p.error.empty()) {
    CHECK(cuda::device_count() == p.count);
  } else {
    expect_error([] { cuda::device_count(); }, {p.error});
  }
}

TEST_CASE("cuda runtime: REGEN_REQUIRE_GPU and REGEN_CUDA_SYNC take 0 or 1") {
  {
    EnvScope env("REGEN_REQUIRE_GPU", nullptr);
    CHECK_FALSE(cuda::require_gpu());
  }
  {
    EnvScope env("REGEN_REQUIRE_GPU", "0");
    CHECK_FALSE(cuda::require_gpu());
  }
  {
    EnvScope env("REGEN_REQUIRE_GPU", "1");
    CHECK(cuda::require_gpu());
  }
  {
    EnvScope env("REGEN_REQUIRE_GPU", "yes");
    expect_error([] { cuda::require_gpu(); }, {"REGEN_REQUIRE_GPU='yes' is not 0 or 1"});
  }
  cuda::set_sync_launches(true);
  CHECK(cuda::sync_launches());
  cuda::set_sync_launches(false);
  CHECK_FALSE(cuda::sync_launches());
}

TEST_CASE("cuda runtime: the GPU suites skip without a GPU and fail with REGEN_REQUIRE_GPU=1") {
  const cuda::DeviceProbe& p = cuda::probe_devices();
  if (!p.error.empty()) {
    // A broken GPU setup: the suite fails with the runtime's message, whatever the variable says.
    const Outcome o = run_suite("REGEN_REQUIRE_GPU=0");
    CHECK(o.status == 1);
    CHECK_MESSAGE(o.output.find(p.error) != std::string::npos, o.output);
    return;
  }
  if (p.count > 0) {
    // A GPU: the suite runs (no test case selected) and passes with the variable set.
    const Outcome o = run_suite("REGEN_REQUIRE_GPU=1");
    CHECK_MESSAGE(o.status == 0, o.output);
    return;
  }
  Outcome o = run_suite("env -u REGEN_REQUIRE_GPU");
  CHECK_MESSAGE(o.status == 77, o.output);  // ctest's skip code
  CHECK(o.output.find("no CUDA device visible: skipping") != std::string::npos);
  o = run_suite("REGEN_REQUIRE_GPU=1");
  CHECK_MESSAGE(o.status == 1, o.output);
  CHECK(o.output.find("REGEN_REQUIRE_GPU=1 but no CUDA device is visible") != std::string::npos);
  o = run_suite("REGEN_REQUIRE_GPU=true");
  CHECK_MESSAGE(o.status == 1, o.output);
  CHECK(o.output.find("REGEN_REQUIRE_GPU='true' is not 0 or 1") != std::string::npos);
}
