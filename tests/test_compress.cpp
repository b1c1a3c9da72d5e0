// Lossy compression of saved activations (remat/plan/compress.h, --compress bf16|fp16): the 16-bit
// conversions of kernels/half.h against a rounding written here in double (and GCC's _Float16
// where the compiler has it), the CPU launchers, and training under plans with compression:
// every step's peaks exactly the predicted ones, and the gradients bit for bit those of a run
// without compression whose narrowed tensors are rounded in place (here, by the reference
// rounding) when backward starts, so the only error is the rounding of the saved tensors the
// schedule narrows; that error beside full precision; compression beside offload in one dp plan;
// the options refused by name; DTR refused.
#include <doctest/doctest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "regen/kernels/half.h"
#include "regen/kernels/kernels.h"
#include "regen/remat/execute/pipeline.h"
#include "regen/remat/plan/compress.h"
#include "regen/remat/plan/offload.h"
#include "regen/session/records.h"
#include "regen/session/session.h"
#include "tests/remat_suite.h"
#include "tests/test_util.h"

using namespace regen;

namespace {

// x rounded to the nearest value of a binary format with p significand bits (the implicit one
// included), normal exponents from emin to emax and subnormals below, ties to even; beyond the
// largest finite value (half an ulp past it), infinity. In double, where every step is exact.
double round_format(double x, int p, int emin, int emax) {
  if (std::isnan(x) || std::isinf(x) || x == 0) return x;
  const double ax = std::fabs(x);
  int k = 0;
  std::frexp(ax, &k);  // ax in [2^(k-1), 2^k)
  const int e = std::max(k - 1, emin);
  const double ulp = std::ldexp(1.0, e - (p - 1));
  const double y = std::nearbyint(ax / ulp) * ulp;  // the default mode: ties to even
  const double largest = (2 - std::ldexp(1.0, -(p - 1))) * std::ldexp(1.0, emax);
  return std::copysign(y > largest ? std::numeric_limits<double>::infinity() : y, x);
}
float ref_round(float x, Compression c) {
  if (std::isnan(x)) return x;
  return static_cast<float>(c == Compression::bf16 ? round_format(x, 8, -126, 127)
                                                   : round_format(x, 11, -14, 15));
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Float bit patterns: a stride through all 2^32 of them, and the neighbourhoods of every power of
// two and of both formats' limits and halfway points.
std::vector<float> probe_floats() {
  std::vector<float> v;
  for (uint64_t u = 0; u < (uint64_t{1} << 32); u += 997)
    v.push_back(from_bits(static_cast<uint32_t>(u)));
  for (int e = -160; e <= 128; ++e) {
    const uint32_t b = bits(std::ldexp(1.0f, e));
    for (int d = -40; d <= 40; ++d) {
      v.push_back(from_bits(b + static_cast<uint32_t>(d)));
      v.push_back(-from_bits(b + static_cast<uint32_t>(d)));
    }
  }
  for (float f : {65504.0f, 65519.99f, 65520.0f, 65520.01f, 6.1035156e-05f, 5.9604645e-08f,
                  2.9802322e-08f, 2.9802326e-08f, 3.3895314e38f, 3.4028235e38f}) {
    for (int d = -3; d <= 3; ++d) {
      v.push_back(from_bits(bits(f) + static_cast<uint32_t>(d)));
      v.push_back(-from_bits(bits(f) + static_cast<uint32_t>(d)));
    }
  }
  return v;
}

}  // namespace

TEST_CASE("bf16 and fp16: round to nearest even, subnormals, overflow, NaN, against a reference") {
  const std::vector<float> xs = probe_floats();
  for (Compression c : {Compression::bf16, Compression::fp16}) {
    CAPTURE(compression_name(c));
    int64_t bad = 0;
    for (float x : xs) {
      const uint16_t h = half::narrow(x, c);
      const float back = half::widen(h, c);
      if (std::isnan(x)) {
        bad += !std::isnan(back) || std::signbit(back) != std::signbit(x);
        continue;
      }
      const float want = ref_round(x, c);
      if (bits(back) != bits(want)) {
        if (bad < 5) MESSAGE("x=", x, " (", bits(x), "): got ", back, ", want ", want);
        ++bad;
      }
    }
    CHECK(bad == 0);
    // Widening is exact: every 16-bit pattern comes back as the value it encodes, and narrowing
    // that value gives the pattern again (NaNs aside).
    int64_t round_trip = 0;
    for (uint32_t h = 0; h < 65536; ++h) {
      const float f = half::widen(static_cast<uint16_t>(h), c);
      if (std::isnan(f)) continue;
      round_trip += half::narrow(f, c) != h;
    }
    CHECK(round_trip == 0);
  }
#if defined(__FLT16_MAX__)
  // GCC's _Float16, a second and independent rounding (clang before 15 lacks it on x86).
  int64_t bad = 0;
  for (float x : xs) {
    if (std::isnan(x)) continue;
    const float want = static_cast<float>(static_cast<_Float16>(x));
    bad += bits(half::widen(half::narrow(x, Compression::fp16), Compression::fp16)) != bits(want);
  }
  CHECK(bad == 0);
  for (uint32_t h = 0; h < 65536; ++h) {
    _Float16 v;
    const uint16_t h16 = static_cast<uint16_t>(h);
    std::memcpy(&v, &h16, sizeof v);
    const float want = static_cast<float>(v);
    if (std::isnan(want)) continue;
    CHECK_MESSAGE(bits(half::from_fp16(h16)) == bits(want), "half ", h);
  }
#endif
}

TEST_CASE(
    "cpu narrow_to_half and widen_from_half: the element functions, odd sizes, 1 and 2 threads") {
  for (int threads : {1, 2}) {
    omp_set_num_threads(threads);
    for (Compression c : {Compression::bf16, Compression::fp16}) {
      for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{100003}}) {
        std::vector<float> x(static_cast<size_t>(n)), back(x);
        for (int64_t i = 0; i < n; ++i) x[i] = std::sin(0.37f * i) * std::exp(0.001f * (i % 900));
        std::vector<uint16_t> h(static_cast<size_t>(n) + 1, 0xbeef);
        cpu::narrow_to_half<float>(x.data(), h.data(), n, c);
        CHECK(h.back() == 0xbeef);
        cpu::widen_from_half<float>(h.data(), back.data(), n, c);
        int64_t bad = 0;
        for (int64_t i = 0; i < n; ++i) bad += bits(back[i]) != bits(ref_round(x[i], c));
        CHECK(bad == 0);
      }
    }
  }
  float x = 1;
  uint16_t h = 0;
  testing::expect_error([&] { cpu::narrow_to_half<float>(&x, &h, 1, Compression::none); },
                        {"narrow_to_half", "16-bit format"});
}

// ---- Training under compression
// -------------------------------------------------------------------

namespace {

// Rounds, when backward starts, every saved tensor a schedule narrows, in place: the step a
// compressed run takes, written without the executor's narrowing.
class RoundSaved final : public TapeHooks {
 public:
  RoundSaved(const Profile& p, std::vector<int32_t> saved, Compression c)
      : p_(p), saved_(std::move(saved)), c_(c) {}
  void on_backward_start(Tape& tape) override {
    for (int32_t s : saved_) {
      Tensor t = tape.value_tensor(p_.saved[static_cast<size_t>(s)].value);
      float* d = t.data<float>();
      for (int64_t i = 0; i < t.numel(); ++i) d[i] = ref_round(d[i], c_);
    }
  }

 private:
  const Profile& p_;
  std::vector<int32_t> saved_;
  Compression c_;
};

struct Outcome {
  std::vector<double> losses;
  std::vector<std::vector<float>> grads, params;
  int64_t narrowed = 0;
  Profile profile;
  std::vector<int32_t> narrowed_set;
};

// Two profiling steps, then `steps` under `policy` (no budget): with compression `c`, or without it
// and with the tensors of `round` rounded in place at backward start.
Outcome run(const ModelConfig& cfg, int64_t batch, const std::string& policy, Compression c,
            int steps, const std::vector<int32_t>* round = nullptr, Compression round_c = {}) {
  SessionOptions o = regen::testing::run_options(cfg, batch, Device::cpu());
  o.compress = compression_name(c);
  allocator_for(Device::cpu()).empty_cache();
  auto s = make_session(o, Preflight::none);
  RematPipeline pipe(*s->trainer);
  ProfileOptions po;
  po.warmup = 0;
  po.iterations = 2;
  Outcome out;
  out.profile = pipe.profile(po);
  CHECK(out.profile.compress == c);
  const Plan& plan = pipe.plan(policy, Budget());
  const Schedule sch = plan_schedule(pipe.current_profile(), plan);
  for (const std::vector<int32_t>& v : sch.narrow_after) {
    out.narrowed_set.insert(out.narrowed_set.end(), v.begin(), v.end());
  }
  CHECK(plan.predicted.narrowed == static_cast<int64_t>(out.narrowed_set.size()));
  std::unique_ptr<RoundSaved> rounder;
  if (round) rounder = std::make_unique<RoundSaved>(pipe.current_profile(), *round, round_c);
  {
    HooksScope hooks(rounder.get());
    for (const StepResult& r : pipe.train(steps)) {
      out.losses.push_back(r.loss);
      CHECK(r.exact());  // compression's narrow and f32 blocks are in the prediction
    }
  }
  if (pipe.executor()) out.narrowed = pipe.executor()->narrowed();
  pipe.finish();
  for (const Tensor& p : s->model->parameters()) {
    out.params.push_back(p.to_vector<float>());
    out.grads.push_back(p.grad().to_vector<float>());
  }
  return out;
}

bool same(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].size() != b[i].size() ||
        std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float)) != 0)
      return false;
  }
  return true;
}

// ||a - b|| / ||b|| over every tensor.
double relative_error(const std::vector<std::vector<float>>& a,
                      const std::vector<std::vector<float>>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    for (size_t j = 0; j < a[i].size(); ++j) {
      num += (double(a[i][j]) - b[i][j]) * (double(a[i][j]) - b[i][j]);
      den += double(b[i][j]) * b[i][j];
    }
  }
  return std::sqrt(num / den);
}

}  // namespace

TEST_CASE("--compress: exact peaks, and the error is the rounding of the narrowed tensors only") {
  ModelConfig resnet = model_preset("resnet-tiny");
  resnet.image_size = 48;
  ModelConfig transformer = model_preset("transformer-tiny");
  struct Case {
    const ModelConfig& cfg;
    const char* policy;
    std::vector<Compression> modes;
  };
  const Case cases[] = {{transformer, "none", {Compression::bf16, Compression::fp16}},
                        {transformer, "blocks", {Compression::bf16, Compression::fp16}},
                        {resnet, "none", {Compression::bf16}},
                        {resnet, "blocks", {Compression::fp16}}};
  for (const Case& k : cases) {
    const ModelConfig& cfg = k.cfg;
    CAPTURE(cfg.name);
    CAPTURE(std::string(k.policy));
    const Outcome full = run(cfg, 4, k.policy, Compression::none, 1);
    CHECK(full.narrowed_set.empty());
    for (Compression c : k.modes) {
      CAPTURE(std::string(compression_name(c)));
      const Outcome lossy = run(cfg, 4, k.policy, c, 1);
      REQUIRE_FALSE(lossy.narrowed_set.empty());
      CHECK(lossy.narrowed == static_cast<int64_t>(lossy.narrowed_set.size()));
      // Forward is untouched: the step under the plan has the loss of full precision.
      CHECK(lossy.losses == full.losses);
      // Without compression, rounding in place the tensors the schedule narrowed: the same bits.
      const Outcome ref = run(cfg, 4, k.policy, Compression::none, 1, &lossy.narrowed_set, c);
      CHECK(same(ref.grads, lossy.grads));
      CHECK(same(ref.params, lossy.params));
      // Beside full precision (the same parameters before the step). On the Transformer, the
      // rounding's size: bf16 keeps 8 significant bits, fp16 11. The ResNet's gradients at
      // initialization are chaotic (a tiny change of the input moves some by percents: batch norm
      // over a few values per channel), and blocks recomputes each block, batch norm statistics
      // included, from its rounded input: its error is only shown.
      const double err = relative_error(lossy.grads, full.grads);
      MESSAGE(cfg.name, " ", k.policy, " ", compression_name(c), ": gradients off by ", err,
              " (relative L2) after one step");
      CHECK(err > 0);
      if (cfg.name == "transformer-tiny") CHECK(err < (c == Compression::bf16 ? 1e-2 : 2e-3));
    }
  }
}

TEST_CASE("--compress: bad values refused by name, a profile's mode recorded, DTR refused") {
  SessionOptions o;
  o.model = "transformer-tiny";
  o.compress = "bf17";
  testing::expect_error([&] { o.validate(); }, {"--compress must be none, bf16 or fp16", "'bf17'"});
  o.style = OptionStyle::keyword;
  testing::expect_error([&] { o.validate(); }, {"compress='bf17'", "none, bf16 or fp16"});
  o.style = OptionStyle::flag;
  o.compress = "fp16";
  o.validate();
  CHECK(run_flags(o).at("--compress") == "fp16");
  Profile p;
  p.run = run_flags(o);
  o.compress = "none";
  testing::expect_error([&] { check_profile_run(p, o, "the profile"); },
                        {"the profile was made with --compress fp16", "--compress none"});
  CHECK(parse_compression("bf16") == Compression::bf16);
  testing::expect_error([] { parse_compression("half", "--compress"); },
                        {"--compress 'half' must be none, bf16 or fp16"});

  // The profile records the mode and its time model, and profile.json keeps both.
  o.compress = "bf16";
  o.batch = 2;
  o.device = "cpu";
  auto s = make_session(o, Preflight::none);
  RematPipeline pipe(*s->trainer);
  ProfileOptions po;
  po.warmup = 0;
  po.iterations = 1;
  const Profile& prof = pipe.profile(po);
  CHECK(prof.compress == Compression::bf16);
  CHECK(prof.compress_cost.narrow_ms_per_mib > 0);
  const Profile again = profile_from_json(profile_to_json(prof), "test");
  CHECK(again.compress == Compression::bf16);
  CHECK(again.compress_cost.widen_ms_per_mib == prof.compress_cost.widen_ms_per_mib);
  const Plan& none = pipe.plan("none", Budget());
  CHECK(none.predicted.narrowed > 0);
  CHECK(none.predicted.compress_ms > 0);
  CHECK(none.predicted.time_ms == doctest::Approx(prof.iteration_ms + none.predicted.compress_ms));
  testing::expect_error([&] { pipe.plan("dtr", Budget::parse("90%")); },
                        {"dtr and dtr-coop do not run with --compress bf16"});
}

// Compression with every fate in one plan (offload, recompute, retain; optimizer state on the host
// tier) under --compress bf16.
// Offloaded tensors are copied in full and only the compressible tensors the plan retains are held
// narrow, so: the two sets are disjoint and the narrowed one is exactly the retained compressible
// tensors; every step measures the predicted device and host peaks; and training is bit for bit the
// same plan's (same fates and copies) without compression, with the narrowed tensors rounded in
// place when backward starts (offload itself moves bytes, not values).
TEST_CASE("--compress with every fate and host state: exact on every step, rounding only") {
  const ModelConfig cfg = model_preset("transformer-tiny");
  const int64_t batch = 4;
  const int steps = 3;
  auto session = [&](Compression c) {
    SessionOptions o = regen::testing::run_options(cfg, batch, Device::cpu());
    o.compress = compression_name(c);
    regen::testing::fresh_allocator(Device::cpu());  // nothing left from the other run
    host_allocator_for(Device::cpu()).empty_cache();
    return make_session(o, Preflight::none);
  };
  ProfileOptions po;
  po.warmup = 1;  // the optimizer's state made before the profiled step (host tier's start)
  po.iterations = 1;
  struct Trained {
    std::vector<double> losses;
    std::vector<std::vector<float>> grads, params;
  };
  auto train = [&](Session& s, RematPipeline& pipe, const Plan& plan, TapeHooks* hooks) {
    Trained t;
    {
      HooksScope scope(hooks);
      for (const StepResult& r : pipe.train(steps)) {
        t.losses.push_back(r.loss);
        CHECK(r.exact());
        CHECK(r.host_predicted);
        CHECK(r.host_memory.allocated.peak == plan.predicted.host_peak_allocated);
        CHECK(r.host_memory.reserved.peak == plan.predicted.host_peak_reserved);
      }
    }
    CHECK(pipe.exact_steps() == steps);
    CHECK(pipe.executor()->offload().offloads == plan.offloaded());
    CHECK(pipe.executor()->offload().bytes_to_host == plan.predicted.bytes_to_host);
    CHECK(pipe.executor()->narrowed() == plan.predicted.narrowed);
    pipe.finish();
    pipe.clear_plan();  // the optimizer state back on the device, the host tier empty
    CHECK(host_allocator_for(Device::cpu()).stats().live_blocks == 0);
    for (const Tensor& p : s.model->parameters()) {
      t.params.push_back(p.to_vector<float>());
      t.grads.push_back(p.grad().to_vector<float>());
    }
    return t;
  };

  // Compressed: a plan with every fate, made by hand so that its sets do not hang on measured
  // times (dp given every fate on this small model offloads all or nothing, by the link's speed):
  // of the offloadable tensors, in order, one in three offloaded, one in three recomputed (when it
  // may be) and the rest retained; the optimizer state on the host tier.
  Plan draft, plan;
  PlanOptions o;
  o.budget_of = BudgetOf::allocated;
  std::vector<int32_t> narrowed;
  Trained lossy;
  {
    auto lossy_session = session(Compression::bf16);
    RematPipeline lossy_pipe(*lossy_session->trainer);
    const Profile& p = lossy_pipe.profile(po);
    draft.policy = "python";
    draft.decisions.assign(p.saved.size(), Fate::retain);
    int k = 0;
    for (const ProfileSaved& sv : p.saved) {
      if (!sv.offloadable) continue;
      Fate& f = draft.decisions[static_cast<size_t>(sv.index)];
      if (k % 3 == 0) f = Fate::offload;
      if (k % 3 == 1 && sv.candidate) f = Fate::recompute;
      ++k;
    }
    draft.optimizer_state = StatePlace::host;
    draft.transfer = transfer_for("step:0.4", p);
    plan = lossy_pipe.use_plan(finish_plan(lossy_pipe.simulator(), draft, Budget(), o));
    REQUIRE(plan.offloaded() > 0);
    REQUIRE(plan.predicted.narrowed > 0);
    REQUIRE(plan.predicted.replays > 0);
    MESSAGE("transformer-tiny b4 under bf16: ", plan.offloaded(), " tensors offloaded, ",
            plan.predicted.narrowed, " held narrow, ", plan.predicted.replays, " nodes replayed");
    const Schedule sch = plan_schedule(p, plan);
    for (const std::vector<int32_t>& v : sch.narrow_after)
      narrowed.insert(narrowed.end(), v.begin(), v.end());
    std::sort(narrowed.begin(), narrowed.end());
    std::vector<int32_t> expected;
    for (size_t i = 0; i < p.saved.size(); ++i) {
      if (plan.decisions[i] == Fate::retain && compressible(p, static_cast<int32_t>(i)))
        expected.push_back(static_cast<int32_t>(i));
    }
    CHECK(narrowed == expected);
    lossy = train(*lossy_session, lossy_pipe, plan, nullptr);
  }  // the compressed run's model, optimizer and trainer gone

  // The same fates and copies without compression, the narrowed tensors rounded in place.
  auto ref_session = session(Compression::none);
  RematPipeline ref_pipe(*ref_session->trainer);
  const Profile& rp = ref_pipe.profile(po);
  REQUIRE(rp.saved.size() == draft.decisions.size());
  draft.offloads = plan.offloads;  // the same copy points
  const Plan same_fates = ref_pipe.use_plan(finish_plan(ref_pipe.simulator(), draft, Budget(), o));
  CHECK(same_fates.predicted.narrowed == 0);
  RoundSaved rounder(rp, narrowed, Compression::bf16);
  const Trained ref = train(*ref_session, ref_pipe, same_fates, &rounder);
  CHECK(lossy.losses == ref.losses);
  CHECK(same(lossy.grads, ref.grads));
  CHECK(same(lossy.params, ref.params));
}
