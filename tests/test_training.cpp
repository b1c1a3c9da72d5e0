// The training loop around the step: learning-rate schedules and gradient clipping against
// PyTorch 1.13 (tests/data/training_reference.safetensors, written by
// tools/make_training_reference.py), exact resume (bitwise, with and without a remat plan, and
// what a resume refuses), gradient accumulation (the gradients of one full-batch step within f32
// rounding; a plan's predicted peaks exact on every accumulated step), evaluation without the tape,
// and the metrics log. Real-data accuracy against PyTorch: tests/python/test_digits.py.
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "regen/core/io.h"
#include "regen/core/numeric.h"
#include "regen/core/safetensors.h"
#include "regen/models/evaluate.h"
#include "regen/models/metrics_log.h"
#include "regen/remat/execute/pipeline.h"
#include "regen/session/checkpoint.h"
#include "regen/session/session.h"
#include "regen/session/training_run.h"
#include "test_util.h"

using namespace regen;
using regen::testing::expect_error;

namespace {

const SafetensorsFile& reference() {
  static const SafetensorsFile f =
      load_safetensors(std::string(REGEN_TEST_DATA) + "/training_reference.safetensors");
  return f;
}

const Tensor& fixture(const std::string& name) {
  const Tensor* t = reference().find(name);
  REQUIRE_MESSAGE(t != nullptr, "no '", name, "' in training_reference.safetensors");
  return *t;
}

// A temporary file name in the test's folder, removed when the object goes.
struct TempFile {
  std::string path;
  explicit TempFile(const std::string& name)
      : path("test_training_" + std::to_string(::getpid()) + "_" + name) {}
  ~TempFile() { std::remove(path.c_str()); }
};

// The batches of the clipping reference, in order.
class FixtureSource final : public DataSource {
 public:
  Batch next(int64_t, Device) override {
    const std::string i = std::to_string(next_++);
    return {fixture("clip.input." + i), fixture("clip.target." + i)};
  }
  std::string describe() const override { return "training_reference.safetensors batches"; }

 private:
  int next_ = 0;
};

NamedTensors with_prefix(const std::string& prefix) {
  NamedTensors out;
  for (const auto& [name, t] : reference().tensors) {
    if (name.rfind(prefix, 0) == 0) out.emplace_back(name.substr(prefix.size()), t);
  }
  return out;
}

// Every tensor of two state dicts byte for byte.
void check_bitwise(const NamedTensors& a, const NamedTensors& b, const std::string& what) {
  REQUIRE(a.size() == b.size());
  int differ = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    REQUIRE(a[i].first == b[i].first);
    const Tensor x = a[i].second.to(Device::cpu()), y = b[i].second.to(Device::cpu());
    const bool same = x.shape() == y.shape() && x.nbytes() == y.nbytes() &&
                      std::equal(static_cast<const char*>(x.raw_data()),
                                 static_cast<const char*>(x.raw_data()) + x.nbytes(),
                                 static_cast<const char*>(y.raw_data()));
    if (!same && differ++ < 3) MESSAGE(what, ": '", a[i].first, "' differs");
  }
  CHECK_MESSAGE(differ == 0, what, ": ", differ, " of ", a.size(), " tensors differ");
}

SessionOptions lm_options() {
  SessionOptions o;
  o.model = "transformer-tiny";
  o.batch = 4;
  o.device = "cpu";
  o.optimizer = "adamw";
  o.lr = 0.01;
  o.lr_schedule = "cosine";
  o.warmup_steps = 2;
  o.schedule_steps = 8;
  o.clip_grad_norm = 0.5;  // dropout stays on: the resumed run must draw the same masks
  return o;
}

// ResNet-50's block counts at 1/8 width on 64x64 images: activations dominate, so plans recompute
// (resnet-tiny's own peak is its stem's workspace, which no plan lowers).
SessionOptions resnet_options() {
  SessionOptions o;
  o.model = "resnet-tiny";
  ModelConfig c = model_preset("resnet-tiny");
  c.blocks = {3, 4, 6, 3};
  c.image_size = 64;
  o.config = c;
  o.batch = 8;
  o.device = "cpu";
  o.lr = 0.05;
  o.weight_decay = 1e-4;
  o.lr_schedule = "step";
  o.lr_step_size = 3;
  o.lr_gamma = 0.5;
  o.warmup_steps = 1;
  return o;
}

// `steps` steps through a pipeline, under a dp plan at `budget` of allocated bytes after one
// profiling step when `plan`; returns how many steps under the plan were exact.
int64_t run_steps(Session& s, int64_t steps, bool plan, const std::string& budget = "85%") {
  RematPipeline pipe(*s.trainer);
  int64_t done = 0;
  if (plan) {
    ProfileOptions po;
    po.warmup = 0;
    po.iterations = 1;
    pipe.profile(po);
    done = 1;
    PlanOptions o;
    o.budget_of = BudgetOf::allocated;
    const Plan& p = pipe.plan("dp", Budget::parse(budget), o);
    REQUIRE_MESSAGE(p.feasible, p.note);
    REQUIRE(p.recomputed() > 0);
  }
  for (; done < steps; ++done) pipe.step();
  CHECK(pipe.exact_steps() == pipe.predicted_steps());
  return pipe.exact_steps();
}

}  // namespace

TEST_CASE(
    "training: learning-rate schedules give torch's rates (LinearLR warm-up, StepLR, "
    "CosineAnnealingLR)") {
  struct Case {
    const char* name;
    LrSchedule s;
  };
  auto make = [](LrSchedule::Kind k, double base, int64_t warmup) {
    LrSchedule s;
    s.kind = k;
    s.base = base;
    s.warmup = warmup;
    return s;
  };
  LrSchedule cosine = make(LrSchedule::Kind::cosine, 0.1, 5);
  cosine.horizon = 30;
  cosine.min = 0.001;
  LrSchedule cosine0 = make(LrSchedule::Kind::cosine, 0.05, 0);
  cosine0.horizon = 12;
  LrSchedule step = make(LrSchedule::Kind::step, 0.1, 3);
  step.step_size = 4;
  step.gamma = 0.5;
  const LrSchedule constant = make(LrSchedule::Kind::constant, 0.2, 4);
  for (const Case& c : {Case{"cosine", cosine}, Case{"cosine_nowarm", cosine0}, Case{"step", step},
                        Case{"constant", constant}}) {
    const std::vector<double> want = fixture(std::string("lr.") + c.name).to_vector<double>();
    for (size_t t = 0; t < want.size(); ++t) {
      const double got = c.s.at(static_cast<int64_t>(t));
      if (c.s.kind == LrSchedule::Kind::cosine && static_cast<int64_t>(t) >= c.s.horizon) {
        // Past its horizon torch's cosine rises again (it is periodic); regen stays at the
        // minimum, as timm's scheduler does with one cycle.
        CHECK(got == c.s.min);
        continue;
      }
      CHECK_MESSAGE(std::fabs(got - want[t]) <= 1e-12 * std::max(1.0, std::fabs(want[t])), c.name,
                    " step ", t, ": ", got, " vs torch ", want[t]);
    }
  }
  LrSchedule bad = make(LrSchedule::Kind::cosine, 0.1, 5);
  bad.horizon = 5;
  expect_error([&] { bad.at(0); }, {"more steps (5) than its warm-up (5)"});
  LrSchedule no_size = make(LrSchedule::Kind::step, 0.1, 0);
  expect_error([&] { no_size.at(0); }, {"step size of at least 1"});
}

TEST_CASE(
    "training: six steps with warm-up, cosine and clip_grad_norm_ give torch's losses, "
    "norms, rates and weights") {
  ModelConfig c = model_preset("transformer-tiny");
  c.dropout = 0.0f;
  auto model = make_model(c, Device::cpu());
  model->load_state_dict(with_prefix("clip.init."));
  SGDOptions so;
  so.lr = 0.1;
  so.momentum = 0.9;
  SGD opt(model->parameters(), so);
  FixtureSource data;
  Trainer trainer(*model, opt, data, 4, Device::cpu());
  LrSchedule s;
  s.kind = LrSchedule::Kind::cosine;
  s.base = 0.1;
  s.warmup = 2;
  s.horizon = 6;
  s.min = 0.01;
  trainer.set_schedule(s);
  trainer.set_clip_grad_norm(0.5);
  const std::vector<float> losses = fixture("clip.losses").to_vector<float>();
  const std::vector<double> norms = fixture("clip.norms").to_vector<double>();
  const std::vector<double> lrs = fixture("clip.lrs").to_vector<double>();
  for (size_t i = 0; i < 6; ++i) {
    const StepResult r = trainer.step();
    CHECK_MESSAGE(std::fabs(r.loss - losses[i]) <= 1e-5 * std::fabs(losses[i]), "step ", i,
                  " loss ", r.loss, " vs torch ", losses[i]);
    CHECK_MESSAGE(std::fabs(r.grad_norm - norms[i]) <= 1e-5 * norms[i], "step ", i, " norm ",
                  r.grad_norm, " vs torch ", norms[i]);
    CHECK(std::fabs(r.lr - lrs[i]) <= 1e-12);
    CHECK(r.grad_norm > 0.5);  // every step clipped
  }
  double worst = 0;
  for (const auto& [name, want] : with_prefix("clip.final.")) {
    const Tensor* got = nullptr;
    const NamedTensors state = model->state_dict();
    for (const auto& kv : state) {
      if (kv.first == name) got = &kv.second;
    }
    REQUIRE_MESSAGE(got != nullptr, name);
    const std::vector<float> a = got->to_vector<float>(), b = want.to_vector<float>();
    double max_ref = 0, max_err = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      max_ref = std::max(max_ref, std::fabs(static_cast<double>(b[i])));
      max_err = std::max(max_err, std::fabs(static_cast<double>(a[i]) - b[i]));
    }
    CHECK_MESSAGE(max_err <= 1e-4 * max_ref + 1e-7, name, ": max error ", max_err, " of ", max_ref);
    worst = std::max(worst, max_ref > 0 ? max_err / max_ref : max_err);
  }
  MESSAGE("weights after six clipped steps: worst relative error against torch ", worst);
}

TEST_CASE(
    "training: a run stopped and resumed is bitwise the run that never stopped "
    "(transformer with dropout and AdamW, ResNet with momentum and batch norm, with and "
    "without a dp plan)") {
  for (const bool resnet : {false, true}) {
    const SessionOptions o = resnet ? resnet_options() : lm_options();
    const int64_t n = 6, k = 3;
    auto full = make_session(o);
    run_steps(*full, n, false);
    for (const bool plan : {false, true}) {
      CAPTURE(resnet);
      CAPTURE(plan);
      TempFile state("state.safetensors");
      {
        auto first = make_session(o);
        run_steps(*first, k, false);
        save_training_state(*first, state.path, {{"plan", "no plan"}});
      }
      auto resumed = make_session(o);
      const auto meta = resume_training_state(*resumed, state.path);
      CHECK(meta.at("optimizer_steps") == "3");
      CHECK(resumed->trainer->optimizer_steps() == k);
      // With a plan the resumed run profiles one step, then runs the others under the plan.
      const int64_t exact = run_steps(*resumed, n - k, plan, "90%");
      if (plan) CHECK(exact == n - k - 1);
      check_bitwise(full->model->state_dict(), resumed->model->state_dict(), "weights");
      NamedTensors a, b;
      for (const auto& kv : full->optimizer->named_state()) a.push_back(kv);
      for (const auto& kv : resumed->optimizer->named_state()) b.push_back(kv);
      check_bitwise(a, b, "optimizer state");
      CHECK(full->data->position() == resumed->data->position());
      CHECK(resumed->trainer->optimizer_steps() == n);
    }
  }
}

TEST_CASE(
    "training: a resume refuses another trajectory, a checkpoint of weights alone, and a "
    "damaged state, naming what to do") {
  SessionOptions o = lm_options();
  TempFile state("refuse.safetensors"), weights("weights.safetensors");
  {
    auto s = make_session(o);
    run_steps(*s, 2, false);
    save_training_state(*s, state.path);
    save_checkpoint(*s, weights.path, 2);
    // --load takes the weights of a training state too.
    auto other = make_session(o);
    CHECK(load_checkpoint(*other, state.path) == s->model->state_dict().size());
  }
  SessionOptions lr = o;
  lr.lr = 0.02;
  expect_error([&] { resume_training_state(*make_session(lr), state.path); },
               {"saved by a run with --lr 0.01", "this run has --lr 0.02"});
  SessionOptions acc = o;
  acc.accumulate = 2;
  expect_error([&] { resume_training_state(*make_session(acc), state.path); },
               {"--accumulate 1", "--accumulate 2"});
  SessionOptions py = o;
  py.style = OptionStyle::keyword;
  py.lr_schedule = "step";
  py.lr_step_size = 2;
  expect_error([&] { resume_training_state(*make_session(py), state.path); },
               {"lr_schedule='cosine'"});
  expect_error([&] { resume_training_state(*make_session(o), weights.path); },
               {"is not a training state", "--save-state"});
  // Counters edited past what they can hold are named with their key, not left to the library's
  // conversion (std::stoull's exception), nor wrapped to a negative count.
  for (const char* key : {"optimizer_steps", "rng_stream", "rng_seed"}) {
    for (const char* value : {"99999999999999999999", "18446744073709551615", "-3", "1e3", ""}) {
      CAPTURE(key);
      CAPTURE(value);
      SafetensorsFile f = load_safetensors(state.path);
      f.metadata[key] = value;
      TempFile edited("edited.safetensors");
      save_safetensors(edited.path, f.tensors, f.metadata);
      expect_error([&] { resume_training_state(*make_session(o), edited.path); },
                   {edited.path, std::string("its metadata's '") + key + "' is '" + value +
                                     "', not a count (decimal digits, at most "
                                     "9223372036854775807)"});
    }
  }
  SafetensorsFile f = load_safetensors(state.path);
  f.metadata["data_position"] = "sample=99999999999999999999";
  TempFile edited("edited.safetensors");
  save_safetensors(edited.path, f.tensors, f.metadata);
  expect_error([&] { resume_training_state(*make_session(o), edited.path); },
               {"cannot read the position 'sample=99999999999999999999'"});
}

TEST_CASE(
    "training: K micro-batches give the gradients of one step at the full batch within f32 "
    "rounding (no batch norm, dropout off)") {
  SessionOptions base;
  base.model = "transformer-tiny";
  base.device = "cpu";
  base.model_options["dropout"] = 0;
  base.model_options["lm_head_chunk"] = -1;
  std::vector<std::unique_ptr<Session>> runs;
  std::vector<StepResult> results;
  for (const int64_t k : {1, 2, 4}) {
    SessionOptions o = base;
    o.batch = 8 / k;
    o.accumulate = k;
    runs.push_back(make_session(o));
    results.push_back(runs.back()->trainer->step());
    CHECK(results.back().micro_batches == k);
  }
  for (size_t r = 1; r < runs.size(); ++r) {
    CHECK_MESSAGE(std::fabs(results[r].loss - results[0].loss) <= 1e-6 * results[0].loss, "loss ",
                  results[r].loss, " vs the full batch's ", results[0].loss);
    const NamedTensors a = runs[0]->model->named_parameters();
    const NamedTensors b = runs[r]->model->named_parameters();
    double worst = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      const std::vector<float> x = a[i].second.grad().to_vector<float>();
      const std::vector<float> y = b[i].second.grad().to_vector<float>();
      double max_ref = 0, max_err = 0;
      for (size_t j = 0; j < x.size(); ++j) {
        max_ref = std::max(max_ref, std::fabs(static_cast<double>(x[j])));
        max_err = std::max(max_err, std::fabs(static_cast<double>(x[j]) - y[j]));
      }
      CHECK_MESSAGE(max_err <= 1e-5 * max_ref + 1e-9, a[i].first, ": max error ", max_err, " of ",
                    max_ref);
      worst = std::max(worst, max_ref > 0 ? max_err / max_ref : 0.0);
    }
    MESSAGE(runs[r]->options.accumulate, " micro-batches: worst gradient error ", worst,
            " of the tensor's largest");
  }
}

TEST_CASE(
    "training: accumulated steps under plans are predicted exactly on every step, and the "
    "profile keeps one micro-batch") {
  for (const bool resnet : {false, true}) {
    SessionOptions o = resnet ? resnet_options() : lm_options();
    o.accumulate = resnet ? 2 : 3;
    auto s = make_session(o);
    RematPipeline pipe(*s->trainer);
    ProfileOptions po;
    po.warmup = 0;
    po.iterations = 1;
    const Profile& p = pipe.profile(po);
    CHECK(p.accumulate == o.accumulate);
    CHECK(p.micro_batch_marker() >= 0);
    // The replay of one micro-batch three times and the optimizer gives the measured peaks.
    const SimResult none = pipe.simulator().run(
        build_schedule(p, std::vector<Decision>(p.saved.size(), Decision::retain)));
    CHECK(none.peak_allocated == p.peak_allocated);
    CHECK(none.peak_reserved == p.peak_reserved);
    // JSON keeps it.
    const Profile back = profile_from_json(profile_to_json(p), "round trip");
    CHECK(back.accumulate == o.accumulate);
    struct Try {
      const char* policy;
      const char* budget;
      BudgetOf of;
    };
    std::vector<Try> tries = {{"dp", "85%", BudgetOf::allocated}};
    // DTR under a reserved budget (the tiny Transformer's step fits its first 2 MiB segment).
    tries.push_back(resnet ? Try{"dtr", "11MiB", BudgetOf::reserved}
                           : Try{"sqrt", "lowest", BudgetOf::allocated});
    for (const Try& t : tries) {
      CAPTURE(t.policy);
      PlanOptions opt;
      opt.budget_of = t.of;
      const Plan& plan = pipe.plan(t.policy, Budget::parse(t.budget), opt);
      REQUIRE_MESSAGE(plan.feasible, plan.note);
      CHECK((plan.recomputed() > 0 || plan.predicted.evictions > 0));
      for (int i = 0; i < 2; ++i) {
        const StepResult r = pipe.step();
        CHECK_MESSAGE(r.exact(), t.policy, " step ", i, ": measured ", r.memory.allocated.peak, "/",
                      r.memory.reserved.peak, ", predicted ", r.predicted_allocated, "/",
                      r.predicted_reserved);
      }
      CHECK(pipe.first_inexact_step() == 0);
    }
    pipe.finish();
    // A profile of another accumulation is refused.
    SessionOptions one = o;
    one.accumulate = 1;
    auto other = make_session(one);
    RematPipeline pipe1(*other->trainer);
    expect_error([&] { pipe1.use_profile(p); },
                 {std::to_string(o.accumulate) + " micro-batch(es) per step, not 1"});
  }
}

TEST_CASE(
    "training: evaluation runs without the tape on the held-out split, matches a plain "
    "loop, leaves the RNG and the mode as they were, and reports its memory") {
  SessionOptions o = resnet_options();
  o.eval_batches = 3;
  o.eval_batch = 4;
  auto s = make_session(o);
  s->trainer->step();
  const uint64_t stream = rng_stream_position();
  const EvalResult e = evaluate_session(*s);
  CHECK(rng_stream_position() == stream);
  CHECK(s->model->is_training());
  CHECK(e.examples == 12);
  CHECK(e.batches == 3);
  CHECK(e.accuracy >= 0);
  CHECK(e.perplexity < 0);  // not a metric of an image classifier
  CHECK(e.memory.allocated.peak > e.persistent);
  // The same on a plain loop over forward() in eval mode.
  s->eval_data->reset();
  s->model->eval();
  double loss = 0;
  int64_t hits = 0, n = 0;
  for (int b = 0; b < 3; ++b) {
    NoGradScope ng;
    const Batch batch = s->eval_data->next(4, Device::cpu());
    const Tensor logits = s->model->forward(batch.input);
    CHECK(Tape::current().nodes().empty());  // nothing recorded
    loss += s->model->loss(logits, batch.target).item<float>() * 4;
    const std::vector<float> l = logits.to_vector<float>();
    const std::vector<int64_t> t = batch.target.to_vector<int64_t>();
    for (size_t i = 0; i < t.size(); ++i) {
      const float* row = l.data() + i * 10;
      hits += std::max_element(row, row + 10) - row == t[i] ? 1 : 0;
    }
    n += 4;
  }
  s->model->train();
  CHECK(std::fabs(e.loss - loss / n) <= 1e-6 * std::fabs(e.loss));
  CHECK(e.accuracy == doctest::Approx(static_cast<double>(hits) / n));
  // Evaluation keeps no activation for backward: its peak is below a training step's.
  const StepResult r = s->trainer->step();
  CHECK(e.memory.allocated.peak < r.memory.allocated.peak);

  // A language model: loss and perplexity over a text file's tail, which training then skips.
  TempFile text("text.txt");
  {
    std::ofstream f(text.path);
    for (int i = 0; i < 400; ++i) f << "the quick brown fox jumps over the lazy dog " << i << "\n";
  }
  SessionOptions lm;
  lm.model = "transformer-tiny";
  lm.device = "cpu";
  lm.model_options["vocab"] = 256;
  lm.data = "text:" + text.path;
  lm.eval_every = 1;
  auto t = make_session(lm);
  CHECK(t->data->describe().find("held out") != std::string::npos);
  const EvalResult te = evaluate_session(*t);
  CHECK(te.perplexity == doctest::Approx(std::exp(te.loss)));
  CHECK(te.accuracy < 0);
  CHECK(te.examples == t->eval_data->size());
  expect_error([&] { make_eval_source("nope", s->config, 0, 0.1); }, {"nope"});
}

TEST_CASE("training: the metrics log is checked at once, opened at its first row") {
  // A log that no row reached leaves an existing file as it was (a run refused before its first
  // step, from the command line or Python) and creates none.
  TempFile existing("kept.csv"), fresh("fresh.csv");
  {
    std::ofstream out(existing.path);
    out << "an earlier run's rows\n";
  }
  { MetricsLog log(existing.path); }
  { MetricsLog log(fresh.path); }
  std::ifstream in(existing.path);
  std::string line;
  std::getline(in, line);
  CHECK(line == "an earlier run's rows");
  CHECK_FALSE(std::ifstream(fresh.path).good());
  // What cannot be written is an error at once, naming the log.
  expect_error([&] { MetricsLog log(existing.path + ".missing/run.csv"); },
               {"--log", "cannot create it in", "No such file or directory"});
  expect_error([&] { MetricsLog log("."); }, {"--log .", "cannot open it for writing"});
}

TEST_CASE("training: the metrics log writes a row per step and evaluation, CSV or JSON lines") {
  TempFile csv("log.csv"), jsonl("log.jsonl");
  StepResult r;
  r.loss = 2.5;
  r.lr = 0.1;
  r.ms = 100;
  r.memory.allocated.peak = 1000;
  r.memory.reserved.peak = 2048;
  EvalResult e;
  e.loss = 1.5;
  e.accuracy = 0.75;
  e.examples = 10;
  e.ms = 5;
  {
    MetricsLog log(csv.path);
    log.step(1, r, 8);
    log.eval(1, e);
  }
  {
    MetricsLog log(csv.path, /*append=*/true);  // a resumed run adds rows, no second header
    log.step(2, r, 8);
  }
  std::ifstream in(csv.path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  REQUIRE(lines.size() == 4);
  CHECK(lines[0].rfind("kind,step,loss,lr,grad_norm,samples_per_s", 0) == 0);
  CHECK(lines[1] == "train,1,2.5,0.1,,80,100,1000,2048,,,,");
  CHECK(lines[2] == "eval,1,1.5,,,2000,5,0,0,0.75,,,");
  CHECK(lines[3].rfind("train,2,", 0) == 0);
  {
    // fp16's steps: the loss scale, and whether the step was skipped for an overflow.
    StepResult h = r;
    h.loss_scale = 32768;
    h.skipped = true;
    MetricsLog log(csv.path, /*append=*/true);
    log.step(3, h, 8);
  }
  std::ifstream again(csv.path);
  lines.clear();
  for (std::string line; std::getline(again, line);) lines.push_back(line);
  REQUIRE(lines.size() == 5);
  CHECK(lines[0].find(",perplexity,loss_scale,skipped") != std::string::npos);
  CHECK(lines[4] == "train,3,2.5,0.1,,80,100,1000,2048,,,32768,1");
  {
    MetricsLog log(jsonl.path);
    log.step(1, r, 8);
  }
  std::ifstream j(jsonl.path);
  std::string row;
  std::getline(j, row);
  CHECK(row.find("\"kind\": \"train\", \"step\": 1, \"loss\": 2.5, \"lr\": 0.1, \"grad_norm\": "
                 "null") == 1);
  expect_error([] { MetricsLog("/nonexistent-dir/x.csv"); }, {"--log /nonexistent-dir/x.csv"});
}

// ---------------------------------------------------------------------------------------------
// The one training loop (session/training_run.h): what its observers hear and when, what it
// keeps, and what it refuses, as the command line and Python drive it.

namespace {

// Writes down every hook in order: "profile 1", "step 3", "eval 3", "end 3", "abort".
struct Recorder final : TrainingObserver {
  std::vector<std::string> calls;
  int64_t stop_at = -1;  // on_step_end returns false after this step
  std::vector<int64_t> indices, counts;
  void on_step(const TrainingRun&, const StepEvent& e) override {
    calls.push_back((e.profiling ? "profile " : "step ") + std::to_string(e.step));
    indices.push_back(e.index);
    counts.push_back(e.count);
    REQUIRE(e.result != nullptr);
    CHECK(e.result->optimizer_step == e.step);
  }
  void on_eval(const TrainingRun&, int64_t step, const EvalResult& e) override {
    calls.push_back("eval " + std::to_string(step));
    CHECK(e.examples > 0);
  }
  bool on_step_end(const TrainingRun&, const StepEvent& e) override {
    calls.push_back("end " + std::to_string(e.step));
    return e.step != stop_at;
  }
  void on_abort(const TrainingRun&) override { calls.push_back("abort"); }
};

SessionOptions tiny_session() {
  SessionOptions o;
  o.model = "resnet-tiny";
  o.batch = 2;
  o.threads = 1;
  return o;
}

std::string joined(const std::vector<std::string>& v) {
  std::string out;
  for (const std::string& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

}  // namespace

TEST_CASE("training: a TrainingRun tells its observers of every step, evaluation and stop") {
  SessionOptions o = tiny_session();
  o.eval_every = 2;
  o.eval_batches = 1;
  auto s = make_session(o);
  RematPipeline pipe(*s->trainer);
  TrainingRun run(*s, pipe);
  Recorder rec;
  run.observe(rec);
  ProfileOptions po;
  po.warmup = 1;
  po.iterations = 1;
  run.profile(po);
  // The profiling steps train and are heard as such, without an evaluation or an end.
  CHECK(joined(rec.calls) == "profile 1, profile 2");
  CHECK(rec.counts == std::vector<int64_t>{2, 2});
  pipe.plan("dp", Budget::parse("lowest"));
  rec.calls.clear();
  rec.indices.clear();
  rec.counts.clear();
  const std::vector<StepResult> out = run.run(3);
  // Steps 3..5 of the session: evaluation after each even step and after the last.
  CHECK(joined(rec.calls) == "step 3, end 3, step 4, eval 4, end 4, step 5, eval 5, end 5");
  CHECK(rec.indices == std::vector<int64_t>{1, 2, 3});
  CHECK(rec.counts == std::vector<int64_t>{3, 3, 3});
  REQUIRE(out.size() == 3);
  // What the run keeps is the steps' own figures.
  const TrainingStats& st = run.stats();
  REQUIRE(st.losses.size() == 3);
  int64_t peak = 0, reserved = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    CHECK(st.losses[i] == out[i].loss);
    CHECK(st.ms[i] == out[i].ms);
    peak = std::max(peak, out[i].memory.allocated.peak);
    reserved = std::max(reserved, out[i].memory.reserved.peak);
  }
  CHECK(st.peak_allocated == peak);
  CHECK(st.peak_reserved == reserved);
  CHECK(st.median_ms() == doctest::Approx(median({out[1].ms, out[2].ms})));
  // Every step ran under the plan and measured its predicted peaks.
  CHECK(pipe.predicted_steps() == 3);
  CHECK(pipe.exact_steps() == 3);
  CHECK_NOTHROW(run.check_predictions());

  // An observer that says stop ends the run after that step; the others still hear of it.
  Recorder second;
  second.stop_at = 6;
  run.observe(second);
  rec.calls.clear();
  CHECK(run.run(10).size() == 1);
  // (step 6 is evaluated: eval_every 2)
  CHECK(joined(second.calls) == "step 6, eval 6, end 6");
  CHECK(joined(rec.calls) == "step 6, eval 6, end 6");
}

TEST_CASE("training: a TrainingRun refuses a plan over its budget and stops on divergence") {
  SUBCASE("a plan that does not fit its budget, before any step") {
    auto s = make_session(tiny_session());
    RematPipeline pipe(*s->trainer);
    TrainingRun run(*s, pipe);
    Recorder rec;
    run.observe(rec);
    pipe.profile();
    pipe.plan("dp", Budget::parse("1KiB"));
    REQUIRE(!pipe.current_plan().feasible);
    const int64_t before = s->trainer->optimizer_steps();
    for (const OptionStyle style : {OptionStyle::flag, OptionStyle::keyword}) {
      s->options.style = style;
      const std::string e = regen::testing::error_of([&] { run.run(2); });
      CHECK(e.find("the plan does not fit its budget") != std::string::npos);
      CHECK(e.find(style == OptionStyle::flag ? "--budget" : "budget_of='allocated'") !=
            std::string::npos);
    }
    CHECK(s->trainer->optimizer_steps() == before);
    CHECK(rec.calls.empty());
    // No LM head: nothing said of one.
    CHECK(regen::testing::error_of([&] { run.run(2); }).find("lm_head") == std::string::npos);
  }
  SUBCASE("a plan over its budget with a fused LM head names its recompute option") {
    SessionOptions o = tiny_session();
    o.model = "transformer-tiny";
    for (const double recompute : {0.0, 1.0}) {
      o.model_options["lm_head_recompute"] = recompute;
      auto s = make_session(o);
      RematPipeline pipe(*s->trainer);
      TrainingRun run(*s, pipe);
      pipe.profile();
      pipe.plan("dp", Budget::parse("1KiB"));
      REQUIRE(!pipe.current_plan().feasible);
      for (const OptionStyle style : {OptionStyle::flag, OptionStyle::keyword}) {
        s->options.style = style;
        const std::string e = regen::testing::error_of([&] { run.run(2); });
        CHECK(e.find("the plan does not fit its budget") != std::string::npos);
        // Only while the head makes its gradients in the forward.
        const std::string hint =
            style == OptionStyle::flag ? "(--lm-head-recompute 1)" : "(lm_head_recompute=1)";
        CHECK((e.find(hint) != std::string::npos) == (recompute == 0.0));
      }
    }
  }
  SUBCASE("a loss that is not finite, named by its step, the observers told first") {
    SessionOptions o = tiny_session();
    o.lr = 1e30;
    auto s = make_session(o);
    RematPipeline pipe(*s->trainer);
    TrainingRun run(*s, pipe);
    Recorder rec;
    run.observe(rec);
    const std::string e = regen::testing::error_of([&] { run.run(5); });
    CHECK(e.find("training diverged") != std::string::npos);
    CHECK(e.find("--lr") != std::string::npos);
    REQUIRE(!rec.calls.empty());
    CHECK(rec.calls.back() == "abort");
  }
  SUBCASE("measure_training measures whatever the values") {
    SessionOptions o = tiny_session();
    o.lr = 1e30;
    const MeasuredRun m = measure_training(o, 3);
    CHECK(m.peak > 0);
    CHECK(m.reserved >= m.peak);
    CHECK(m.ms > 0);
  }
}
