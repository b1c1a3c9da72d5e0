// The run's precision as the session layer takes it (session/options.h resolve_precision): the
// one switch with its synonyms, what it refuses, how profiles and training states record it, and
// fp16's dynamic loss scale (models/train.h LossScale). The ops' 16-bit paths:
// tests/test_autocast.cpp and tests/test_amp_*.cpp; the policy's table: tests/test_precision.cpp.
#include <doctest/doctest.h>

#include <string>

#include "regen/session/checkpoint.h"
#include "regen/session/records.h"
#include "regen/session/session.h"
#include "test_util.h"

using namespace regen;
using regen::testing::error_of;

namespace {

bool has(const std::string& text, const std::string& piece) {
  return text.find(piece) != std::string::npos;
}

SessionOptions tiny(OptionStyle style = OptionStyle::flag) {
  SessionOptions o;
  o.model = "transformer-tiny";
  o.device = "cpu";
  o.batch = 2;
  o.style = style;
  return o;
}

}  // namespace

TEST_CASE("precision: one switch, its default and its synonyms, per device") {
  const Device cpu = Device::cpu(), gpu = Device::cuda(0);
  SessionOptions o = tiny();
  CHECK(resolve_precision(o, cpu) == Precision::fp32);
  CHECK(resolve_precision(o, gpu) == Precision::fp32);
  CHECK(resolve_precision(o, gpu, "tf32") == Precision::tf32);  // the benches' default math
  o.math = "tf32";
  CHECK(resolve_precision(o, gpu) == Precision::tf32);
  o.math = "";
  o.tf32 = true;
  CHECK(resolve_precision(o, gpu) == Precision::tf32);
  o.tf32 = false;
  for (const char* p : {"fp32", "bf16", "fp16"}) {
    o.precision = p;
    CHECK(precision_name(resolve_precision(o, cpu)) == std::string(p));
  }
  o.precision = "tf32";
  CHECK(resolve_precision(o, gpu) == Precision::tf32);
  CHECK(math_mode(o, gpu) == "tf32");
  o.precision = "bf16";
  CHECK(math_mode(o, cpu) == "fp32");
  // A synonym that agrees is accepted; one that does not is refused naming both.
  o.precision = "tf32";
  o.math = "tf32";
  CHECK(resolve_precision(o, gpu) == Precision::tf32);
  o.precision = "fp32";
  std::string e = error_of([&] { resolve_precision(o, gpu); });
  CHECK(has(e, "--precision fp32 conflicts with --math tf32"));
  o.math = "";
  o.tf32 = true;
  e = error_of([&] { o.validate(); });
  CHECK(has(e, "--precision fp32 conflicts with --tf32"));
  o.tf32 = false;
  o.math = "fp32";
  o.precision = "bf16";
  e = error_of([&] { o.validate(); });
  CHECK(has(e, "--precision bf16 conflicts with --math fp32"));
  CHECK(has(e, "drop it"));
  o.math = "";
  // Not a precision; tf32 of the CPU; bf16 on CUDA, which has no 16-bit kernels yet.
  o.precision = "bfloat16";
  e = error_of([&] { o.validate(); });
  CHECK(has(e, "--precision"));
  CHECK(has(e, "fp32, tf32, bf16 or fp16"));
  CHECK(has(e, "bfloat16"));
  o.precision = "tf32";
  e = error_of([&] { resolve_precision(o, cpu); });
  CHECK(has(e, "--precision tf32 applies to CUDA devices"));
  o.precision = "fp16";
  e = error_of([&] { resolve_precision(o, gpu); });
  CHECK(has(e, "--precision fp16 trains on the CPU only so far"));
  CHECK(has(e, "cuda:0"));
  // Python's keywords.
  SessionOptions k = tiny(OptionStyle::keyword);
  k.precision = "fp32";
  k.math = "tf32";
  e = error_of([&] { k.validate(); });
  CHECK(has(e, "precision='fp32' conflicts with math='tf32'"));
}

TEST_CASE("precision: compression of saved activations under a mixed precision is refused") {
  SessionOptions o = tiny();
  o.precision = "bf16";
  o.compress = "bf16";
  const std::string e = error_of([&] { o.validate(); });
  CHECK(has(e, "--compress bf16 with --precision bf16"));
  CHECK(has(e, "already save 16-bit copies"));
  o.compress = "none";
  CHECK_NOTHROW(o.validate());
  o.precision = "fp32";
  o.compress = "fp16";
  CHECK_NOTHROW(o.validate());
}

TEST_CASE("precision: profiles record it, and a run in another precision is refused naming both") {
  SessionOptions o = tiny();
  o.precision = "bf16";
  Profile p;
  p.run = run_flags(o);
  CHECK(p.run.at("--precision") == "bf16");
  CHECK(p.run.count("--math") == 0);
  CHECK(p.run.at("--grad-norm") == "off");
  CHECK_NOTHROW(check_profile_run(p, o, "the profile"));
  o.precision = "";  // fp32 by default
  std::string e = error_of([&] { check_profile_run(p, o, "the profile"); });
  CHECK(has(e, "the profile was made with --precision bf16, but this run has --precision fp32"));
  CHECK(has(e, "pass --precision bf16, or profile again"));
  // fp16 checks its gradients for overflow at every step: the norm's work is in its step.
  o.precision = "fp16";
  CHECK(run_flags(o).at("--grad-norm") == "on");
  // A profile from before --precision, which recorded the math mode: fp32.
  Profile old;
  old.run = run_flags(tiny());
  old.run.erase("--precision");
  old.run["--math"] = "fp32";
  CHECK_NOTHROW(check_profile_run(old, tiny(), "the profile"));
  CHECK(profile_math(old) == "fp32");
  SessionOptions k = tiny(OptionStyle::keyword);
  k.precision = "bf16";
  e = error_of([&] { check_profile_run(old, k, "the profile"); });
  CHECK(has(e, "precision=fp32"));
  CHECK(has(e, "precision=bf16"));
}

TEST_CASE("precision: a training state records it") {
  SessionOptions o = tiny();
  CHECK(trajectory_options(o).at("precision") == "fp32");
  o.precision = "fp16";
  CHECK(trajectory_options(o).at("precision") == "fp16");
}

TEST_CASE("precision: fp16's loss scale grows, backs off and stops at its floor as GradScaler's") {
  LossScale s;
  CHECK(s.scale == 65536.0);
  for (int64_t i = 0; i < LossScale::kGrowthInterval - 1; ++i) s.update(true);
  CHECK(s.scale == 65536.0);
  CHECK(s.good_steps == LossScale::kGrowthInterval - 1);
  s.update(true);
  CHECK(s.scale == 131072.0);
  CHECK(s.good_steps == 0);
  s.update(true);
  s.update(false);  // an overflow: halved, the run of good steps starts again
  CHECK(s.scale == 65536.0);
  CHECK(s.good_steps == 0);
  CHECK(s.skipped == 1);
  // 16 more overflows reach 1 (the floor, still allowed); the 17th ends the run.
  for (int i = 0; i < 16; ++i) s.update(false);
  CHECK(s.scale == 1.0);
  const std::string e = error_of([&] { s.update(false); });
  CHECK(has(e, "fp16 training: the loss scale fell to 0.5 after 18 steps skipped"));
  CHECK(has(e, "train in bf16"));
}
