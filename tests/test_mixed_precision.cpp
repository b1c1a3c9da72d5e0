// The run's precision as the session layer takes it (session/options.h resolve_precision): the
// one switch with its synonyms, what it refuses, how profiles and training states record it, and
// fp16's dynamic loss scale (models/train.h LossScale). The ops' 16-bit paths:
// tests/test_autocast.cpp and tests/test_amp_*.cpp; the policy's table: tests/test_precision.cpp.
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "regen/remat/execute/pipeline.h"
#include "regen/remat/plan/offload.h"
#include "regen/remat/profile/estimate.h"
#include "regen/remat/profile/transfer.h"
#include "regen/session/checkpoint.h"
#include "regen/session/records.h"
#include "regen/session/session.h"
#include "regen/session/training_run.h"
#include "test_util.h"

using namespace regen;
using regen::testing::error_of;

namespace {

// A temporary file name in the test's folder, removed when the object goes.
struct TempFile {
  std::string path;
  explicit TempFile(const std::string& name)
      : path("test_mixed_precision_" + std::to_string(::getpid()) + "_" + name) {}
  ~TempFile() { std::remove(path.c_str()); }
};

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

SessionOptions lm(const std::string& precision) {
  SessionOptions o = tiny();
  o.batch = 4;
  o.optimizer = "adamw";
  o.lr = 0.01;
  o.clip_grad_norm = 0.5;  // dropout stays on: the planned run must draw the same masks
  o.precision = precision;
  return o;
}

// ResNet-50's block counts at 1/8 width on 32x32 images, with batch norm and momentum.
SessionOptions resnet(const std::string& precision) {
  SessionOptions o;
  o.model = "resnet-tiny";
  ModelConfig c = model_preset("resnet-tiny");
  c.blocks = {3, 4, 6, 3};
  c.image_size = 32;
  o.config = c;
  o.batch = 4;
  o.device = "cpu";
  o.lr = 0.05;
  o.precision = precision;
  return o;
}

bool same_bits(const NamedTensors& a, const NamedTensors& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    const Tensor& x = a[i].second;
    const Tensor& y = b[i].second;
    if (a[i].first != b[i].first || x.nbytes() != y.nbytes() || x.dtype() != y.dtype() ||
        !std::equal(static_cast<const char*>(x.raw_data()),
                    static_cast<const char*>(x.raw_data()) + x.nbytes(),
                    static_cast<const char*>(y.raw_data()))) {
      return false;
    }
  }
  return true;
}

// The bytes of the saved tensors of a profile's step that are activations, by dtype width.
int64_t saved_bytes(const Profile& p) {
  int64_t n = 0;
  for (const ProfileSaved& t : p.saved) n += static_cast<int64_t>(t.bytes);
  return n;
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
  // Not a precision; tf32 of the CPU; bf16 and fp16 on a CUDA device too old for them.
  o.precision = "bfloat16";
  e = error_of([&] { o.validate(); });
  CHECK(has(e, "--precision"));
  CHECK(has(e, "fp32, tf32, bf16 or fp16"));
  CHECK(has(e, "bfloat16"));
  o.precision = "tf32";
  e = error_of([&] { resolve_precision(o, cpu); });
  CHECK(has(e, "--precision tf32 applies to CUDA devices"));
  // bf16 and fp16 on CUDA: refused only on a device without the format (the capability is the
  // device's, asked by resolve_precision on a CUDA build; here given).
  e = error_of([&] { check_precision_capability(Precision::bf16, "--precision bf16", gpu, 7, 5); });
  CHECK(has(e, "--precision bf16"));
  CHECK(has(e, "cuda:0 has compute capability 7.5"));
  CHECK(has(e, "needs 8.0 or later"));
  CHECK(has(e, "fp16"));  // what to pass instead
  CHECK_NOTHROW(check_precision_capability(Precision::bf16, "--precision bf16", gpu, 8, 0));
  CHECK_NOTHROW(check_precision_capability(Precision::fp16, "--precision fp16", gpu, 7, 0));
  e = error_of([&] { check_precision_capability(Precision::fp16, "--precision fp16", gpu, 6, 1); });
  CHECK(has(e, "cuda:0 has compute capability 6.1"));
  CHECK(has(e, "needs 7.0 or later"));
  CHECK_NOTHROW(check_precision_capability(Precision::fp32, "--precision fp32", gpu, 6, 1));
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

TEST_CASE("profiles record how the fused LM head makes its gradients, and refuse older heads") {
  SessionOptions o = tiny();
  Profile p;
  p.run = run_flags(o);
  CHECK(p.run.at("--lm-head-recompute") == "0");
  ProfileNode head;
  head.op = "linear_cross_entropy";
  p.nodes.push_back(head);
  CHECK_NOTHROW(check_profile_run(p, o, "the profile"));
  o.model_options["lm_head_recompute"] = 1;
  std::string e = error_of([&] { check_profile_run(p, o, "the profile"); });
  CHECK(has(e,
            "the profile was made with --lm-head-recompute 0, but this run has "
            "--lm-head-recompute 1"));
  // A profile of a head from before the option: refused, whatever this run's setting.
  p.run.erase("--lm-head-recompute");
  for (const double v : {0.0, 1.0}) {
    o.model_options["lm_head_recompute"] = v;
    e = error_of([&] { check_profile_run(p, o, "the profile"); });
    CHECK(has(e, "the profile was made by a regen whose fused LM head (linear_cross_entropy)"));
    CHECK(has(e, "profile again"));
  }
  // Without the fused head's node (--lm-head-chunk -1) nothing about it is asked.
  p.nodes.clear();
  o.model_options["lm_head_recompute"] = 0;
  CHECK_NOTHROW(check_profile_run(p, o, "the profile"));
}

namespace {

// A setting of the 16-bit kernels that a 16-bit profile (of `device`) records (not an fp32 one),
// and a profile with `op` from before it refused by `refusal`; without such a node it changes
// nothing.
void check_lowp_cpu_setting(const std::string& precision, const std::string& flag,
                            const std::string& now, const std::string& op,
                            const std::string& refusal, const std::string& device = "cpu") {
  CAPTURE(flag);
  CAPTURE(device);
  SessionOptions o = tiny();
  o.precision = precision;
  Profile p;
  p.device = device;
  p.run = run_flags(o);
  CHECK(p.run.at(flag) == now);
  CHECK(run_flags(tiny()).count(flag) == 0);  // fp32: not asked
  ProfileNode node;
  node.op = op;
  p.nodes.push_back(node);
  CHECK_NOTHROW(check_profile_run(p, o, "the profile"));
  p.run.erase(flag);
  const std::string e = error_of([&] { check_profile_run(p, o, "the profile"); });
  CHECK(has(e, refusal));
  CHECK(has(e, "profile again"));
  p.nodes.clear();
  CHECK_NOTHROW(check_profile_run(p, o, "the profile"));
}

}  // namespace

TEST_CASE("16-bit CPU profiles record the attention's threading and the GEMMs' strips") {
  check_lowp_cpu_setting("bf16", "attention-16-bit-threads", "from 2 MFLOP", "attention",
                         "the profile was made by a regen whose 16-bit CPU attention ran its "
                         "per-head products on several threads from 4 MFLOP, but this one's do "
                         "from 2 MFLOP");
  for (const char* op : {"linear", "matmul", "bmm"}) {
    check_lowp_cpu_setting("fp16", "16-bit-gemm-strips", "across the longer side", op,
                           "the profile was made by a regen whose 16-bit CPU GEMMs cut their "
                           "products into strips by rows, but this one's go across the longer "
                           "side");
  }
}

TEST_CASE("CPU profiles record how the attention runs its heads, in every precision") {
  for (const char* precision : {"fp32", "bf16"}) {
    CAPTURE(precision);
    SessionOptions o = tiny();
    o.precision = precision;
    Profile p;
    p.device = "cpu";
    p.run = run_flags(o);
    CHECK(p.run.at("attention-heads") == "in parallel up to 16 MFLOP a product");
    ProfileNode node;
    node.op = "attention";
    p.nodes.push_back(node);
    CHECK_NOTHROW(check_profile_run(p, o, "the profile"));
    // A profile from before the setting was recorded: its heads ran one at a time.
    p.run.erase("attention-heads");
    const std::string e = error_of([&] { check_profile_run(p, o, "the profile"); });
    CHECK(has(e,
              "the profile was made by a regen whose CPU attention ran its heads one at a "
              "time, but this one's run in parallel up to 16 MFLOP a product"));
    CHECK(has(e, "profile again"));
    p.nodes.clear();  // no attention in its step: nothing to compare
    CHECK_NOTHROW(check_profile_run(p, o, "the profile"));
  }
}

TEST_CASE("16-bit profiles record what a layer norm of an f32 input saves, on every device") {
  for (const char* precision : {"bf16", "fp16"}) {
    for (const char* device : {"cpu", "cuda"}) {
      check_lowp_cpu_setting(precision, "layernorm-16-bit-saves", "normalized input", "layernorm",
                             std::string("the profile was made by a regen whose ") + precision +
                                 " layer norms of an f32 input saved the f32 input for backward, "
                                 "but this one's save its normalized input in 16 bits",
                             device);
    }
  }
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
  // A trainer takes only a scale a run reaches, and its precision before the first step.
  auto session = make_session(lm("fp16"));
  LossScale bad;
  bad.scale = 0.5;
  CHECK(has(error_of([&] { session->trainer->set_loss_scale(bad); }),
            "a loss scale of 0.5 with 0 good steps and 0 skipped is not one a run reaches"));
  bad.scale = 1024;
  bad.good_steps = LossScale::kGrowthInterval;
  CHECK(has(error_of([&] { session->trainer->set_loss_scale(bad); }), "good steps below 2000"));
  session->trainer->step();
  CHECK(has(error_of([&] { session->trainer->set_precision(Precision::bf16); }),
            "the precision is set before the first step"));
}

TEST_CASE(
    "mixed precision: bf16 and fp16 steps under plans are predicted exactly on every step, and "
    "training under a plan is bitwise training without one") {
  for (const bool is_resnet : {false, true}) {
    for (const char* precision : {"bf16", "fp16"}) {
      CAPTURE(is_resnet);
      CAPTURE(precision);
      const SessionOptions o = is_resnet ? resnet(precision) : lm(precision);
      const int64_t n = 4;
      // The run without a plan.
      auto plain = make_session(o);
      CHECK(plain->precision == parse_precision(precision));
      std::vector<double> losses;
      for (int64_t i = 0; i < n; ++i) {
        const StepResult r = plain->trainer->step();
        CHECK(std::isfinite(r.loss));
        CHECK((r.loss_scale > 0) == (std::string(precision) == "fp16"));
        losses.push_back(r.loss);
      }
      // The same run profiled at its first step, then under a dp plan.
      auto planned = make_session(o);
      RematPipeline pipe(*planned->trainer);
      ProfileOptions po;
      po.warmup = 0;
      po.iterations = 1;
      pipe.profile(po);
      PlanOptions opt;
      opt.budget_of = BudgetOf::allocated;
      const Plan& plan = pipe.plan("dp", Budget::parse("lowest"), opt);
      REQUIRE_MESSAGE(plan.feasible, plan.note);
      CHECK(plan.recomputed() > 0);
      for (int64_t i = 1; i < n; ++i) {
        const StepResult r = pipe.step();
        CHECK_MESSAGE(r.exact(), "step ", i + 1, ": measured ", r.memory.allocated.peak, "/",
                      r.memory.reserved.peak, ", predicted ", r.predicted_allocated, "/",
                      r.predicted_reserved);
        CHECK(r.loss == losses[static_cast<size_t>(i)]);
      }
      pipe.finish();
      CHECK(same_bits(plain->model->state_dict(), planned->model->state_dict()));
      // Master weights stay f32.
      for (const auto& [name, t] : planned->model->state_dict()) {
        CAPTURE(name);
        CHECK((t.dtype() == DType::f32 || t.dtype() == DType::i64));
      }
    }
  }
}

TEST_CASE(
    "mixed precision: a bf16 step saves about half the activation bytes of fp32, and DTR and "
    "offloading plans are exact in bf16") {
  Profile p32, p16;
  for (const char* precision : {"fp32", "bf16"}) {
    SessionOptions o = lm(precision);
    o.clip_grad_norm = 0;  // the optimizer state streams from the host: no norm in its step
    auto s = make_session(o);
    RematPipeline pipe(*s->trainer);
    ProfileOptions po;
    po.warmup = 0;
    po.iterations = 1;
    const Profile& p = pipe.profile(po);
    (std::string(precision) == "fp32" ? p32 : p16) = p;
    if (std::string(precision) == "fp32") continue;
    // An offloading plan and DTR in bf16.
    PlanOptions off;
    off.budget_of = BudgetOf::allocated;
    off.offload = OffloadMode::all;
    off.transfer = transfer_for("step:0.4", p);
    const Plan& plan = pipe.plan("dp", Budget::parse("60%"), off);
    REQUIRE_MESSAGE(plan.feasible, plan.note);
    for (int i = 0; i < 2; ++i) {
      const StepResult r = pipe.step();
      CHECK_MESSAGE(r.exact(), "offload step ", i, ": measured ", r.memory.allocated.peak,
                    ", predicted ", r.predicted_allocated);
    }
    pipe.finish();
  }
  {
    // DTR runs under the caching allocator's limit (the ResNet: the tiny Transformer's step fits
    // its first segment).
    SessionOptions o = resnet("bf16");
    o.config->image_size = 64;
    o.batch = 8;
    auto s = make_session(o);
    RematPipeline pipe(*s->trainer);
    ProfileOptions po;
    po.warmup = 0;
    po.iterations = 1;
    pipe.profile(po);
    PlanOptions dtr;
    dtr.budget_of = BudgetOf::reserved;
    const Plan& d = pipe.plan("dtr", Budget::parse("lowest"), dtr);
    REQUIRE_MESSAGE(d.feasible, d.note);
    // At this size DTR's lowest reserved budget is met by the limit alone (the allocator reuses
    // its cache instead of growing; no eviction): the prediction under the limit is what is
    // checked here.
    for (int i = 0; i < 2; ++i) {
      const StepResult r = pipe.step();
      CHECK_MESSAGE(r.exact(), "dtr step ", i, ": measured ", r.memory.reserved.peak,
                    ", predicted ", r.predicted_reserved);
    }
    pipe.finish();
  }
  const double ratio =
      static_cast<double>(saved_bytes(p16)) / static_cast<double>(saved_bytes(p32));
  MESSAGE("saved bytes: fp32 ", saved_bytes(p32), ", bf16 ", saved_bytes(p16), " (", ratio, "x)");
  // The tiny Transformer's saved tensors are mostly the 16-bit operands of its GEMMs and
  // attention; its f32 statistics, ids and the embedding's f32 rows keep it above one half.
  CHECK(ratio < 0.75);
  CHECK(ratio > 0.45);
}

TEST_CASE(
    "mixed precision: an fp16 step whose gradients overflow is skipped, halves the scale and "
    "leaves the weights as they were") {
  auto s = make_session(lm("fp16"));
  s->trainer->step();
  const NamedTensors before = [&] {
    NamedTensors out;
    for (const auto& [name, t] : s->model->state_dict()) out.emplace_back(name, t.clone());
    return out;
  }();
  LossScale huge;
  huge.scale = std::ldexp(1.0, 60);  // the loss times 2^60 overflows fp16 at once
  s->trainer->set_loss_scale(huge);
  const StepResult r = s->trainer->step();
  CHECK(r.skipped);
  CHECK(r.loss_scale == std::ldexp(1.0, 60));
  CHECK(std::isfinite(r.loss));
  CHECK(s->trainer->loss_scale().scale == std::ldexp(1.0, 59));
  CHECK(s->trainer->loss_scale().skipped == 1);
  CHECK(same_bits(before, s->model->state_dict()));
  CHECK(s->trainer->optimizer_steps() == 2);  // the schedule moves on, as GradScaler's loops do
  // A sane scale trains again.
  LossScale sane;
  sane.scale = 1024;
  s->trainer->set_loss_scale(sane);
  const StepResult next = s->trainer->step();
  CHECK(!next.skipped);
  CHECK(!same_bits(before, s->model->state_dict()));
}

TEST_CASE(
    "mixed precision: a training run goes on through skipped fp16 steps (their gradients are not "
    "finite) and still stops on a parameter that is not") {
  auto s = make_session(lm("fp16"));
  RematPipeline pipe(*s->trainer);
  TrainingRunOptions ro;
  ro.scan_every = 1;  // parameters and gradients read after every step
  ro.evaluate = false;
  TrainingRun run(*s, pipe, ro);
  LossScale huge;
  huge.scale = std::ldexp(1.0, 60);  // every step's scaled loss overflows fp16 at once
  s->trainer->set_loss_scale(huge);
  std::vector<StepResult> out;
  CHECK_NOTHROW(out = run.run(2));
  REQUIRE(out.size() == 2);
  CHECK(out[0].skipped);
  CHECK(out[1].skipped);
  CHECK(s->trainer->loss_scale().skipped == 2);
  // The gradients the skipped steps left are not finite; the parameters are.
  CHECK(first_non_finite(*s->model) != "");
  CHECK(first_non_finite(*s->model, false) == "");
  // A parameter that is not finite stops the run, skipped step or not.
  Tensor w = s->model->named_parameters().front().second;
  w.data<float>()[0] = std::nanf("");
  CHECK_THROWS_WITH_AS(run.run(1), doctest::Contains("training diverged"), Error);
}

TEST_CASE(
    "mixed precision: a resume in another precision is refused, an fp16 state keeps its loss "
    "scale, and an fp32 checkpoint loads into a bf16 run with f32 master weights") {
  TempFile state("fp16.safetensors"), weights("fp32.safetensors");
  {
    auto s = make_session(lm("fp16"));
    s->trainer->step();
    LossScale odd;
    odd.scale = 4096;
    odd.good_steps = 7;
    odd.skipped = 3;
    s->trainer->set_loss_scale(odd);
    save_training_state(*s, state.path);
  }
  {
    auto s = make_session(lm("fp16"));
    resume_training_state(*s, state.path);
    CHECK(s->trainer->loss_scale().scale == 4096);
    CHECK(s->trainer->loss_scale().good_steps == 7);
    CHECK(s->trainer->loss_scale().skipped == 3);
  }
  const std::string e =
      error_of([&] { resume_training_state(*make_session(lm("bf16")), state.path); });
  CHECK(has(e, "saved by a run with --precision fp16"));
  CHECK(has(e, "this run has --precision bf16"));
  {
    auto s = make_session(lm("fp32"));
    s->trainer->step();
    save_checkpoint(*s, weights.path, 1);
  }
  auto b = make_session(lm("bf16"));
  CHECK(load_checkpoint(*b, weights.path) == b->model->state_dict().size());
  for (const auto& [name, t] : b->model->state_dict()) {
    CAPTURE(name);
    CHECK((t.dtype() == DType::f32 || t.dtype() == DType::i64));
  }
  CHECK(std::isfinite(b->trainer->step().loss));
}

TEST_CASE("mixed precision: the dry profile of regen estimate --compare trains in the precision") {
  for (const char* model : {"transformer-tiny", "resnet-tiny"}) {
    CAPTURE(model);
    const ModelConfig c = model_preset(model);
    EstimateOptions o;
    const MemoryTerms f32 = measure_memory_terms(dry_profile(c, 32, o), o.policy);
    o.precision = Precision::bf16;
    const MemoryTerms b16 = measure_memory_terms(dry_profile(c, 32, o), o.policy);
    MESSAGE("activations: f32 ", f32.activations, ", bf16 ", b16.activations);
    // Master weights, gradients and optimizer state are the same; activations shrink. The saved
    // tensors include each low op's 16-bit weight copy (planner-visible: it may be recast in
    // backward instead of held), so the batch must be large enough for activations to dominate
    // (at batch 4 the tiny Transformer's bf16 saves exceed its fp32 ones: 433952 against 341744
    // bytes).
    CHECK(b16.parameters == f32.parameters);
    CHECK(b16.gradients == f32.gradients);
    CHECK(b16.optimizer_state == f32.optimizer_state);
    CHECK(b16.activations < f32.activations);
    CHECK(2 * b16.activations > f32.activations);
    // The weight copies among them: none in f32; in bf16 some, and at most one 16-bit copy of
    // each parameter (half its f32 bytes).
    MESSAGE("bf16 weight copies ", b16.weight_copies, " of ", b16.parameters, " parameter bytes");
    CHECK(f32.weight_copies == 0);
    CHECK(b16.weight_copies > 0);
    CHECK(2 * b16.weight_copies <= b16.parameters);
    CHECK(b16.weight_copies < b16.activations);
  }
}
