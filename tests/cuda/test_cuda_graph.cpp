// The planned step as one CUDA graph (remat/execute/cuda_graph.h, --cuda-graph): a step captured
// under a plan with a planned layout and replayed trains bitwise as the same steps uncaptured
// (losses, parameters, gradients; dropout's masks included, through the Philox stream offset each
// replay writes), the graph holds the layout's addresses, every step's peaks are the predicted ones
// to the byte, and each condition a capture cannot meet is refused before training with its reason
// (or, under auto, said and run uncaptured). On a GPU through tests/cuda/cuda_test_main.cpp
// (skipped, exit 77, without one); without a GPU through the host emulation:
// scripts/cuda-emu/run.sh graph.
#include <doctest/doctest.h>

#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "regen/autograd/tape.h"
#include "regen/core/cuda/graph.h"
#include "regen/core/cuda/runtime.h"
#include "regen/kernels/kernels.h"
#include "regen/remat/execute/cuda_graph.h"
#include "regen/remat/execute/pipeline.h"
#include "regen/session/session.h"
#include "regen/session/training_run.h"

using namespace regen;

namespace {

const Device kGpu = Device::cuda(0);

// The small models the emulation runs in seconds: transformer-tiny with dropout (the masks a
// replay must draw anew) and resnet-tiny (batch norm, convolutions, pooling).
SessionOptions graph_options(const std::string& model, const std::string& mode) {
  SessionOptions o;
  o.model = model;
  o.batch = 2;
  o.device = "cuda:0";
  o.lr = 0.05;
  o.momentum = 0.9;
  o.seed = 77;
  o.cuda_graph = mode;
  if (model == "transformer-tiny") o.model_options["dropout"] = 0.25;
  return o;
}

struct GraphRun {
  std::vector<StepResult> steps;
  std::vector<std::vector<float>> params, grads;
  std::vector<std::string> state;  // every parameter and buffer (state_dict), as bytes
  std::vector<uintptr_t> addresses, planned;
  uint64_t streams = 0;
  int64_t replays = 0;
  bool captured = false;
};

// One profiled step, a plan of `policy` with a planned layout, then `steps` steps under it through
// the pipeline with the graph mode `graph` ("on" or "off"; the session is made with cuda_graph on
// either way, so that both runs have the graph's state block and the same layout).
GraphRun run_planned(const std::string& model, const std::string& policy, const std::string& graph,
                     int steps) {
  kernels::prepare_device(kGpu);
  allocator_for(kGpu).empty_cache();
  std::unique_ptr<Session> s = make_session(graph_options(model, "on"), Preflight::none);
  RematPipeline pipe(*s->trainer);
  {
    TrainingRun profiling(*s, pipe);
    ProfileOptions po;
    po.warmup = 0;
    po.iterations = 1;
    po.model_name = model;
    po.measure_transfer = false;
    profiling.profile(po);
  }
  PlanOptions po;
  po.planned_layout = true;
  pipe.plan(policy, Budget(), po);
  pipe.set_cuda_graph(parse_cuda_graph_mode(graph, "--cuda-graph"));
  GraphRun out;
  for (int i = 0; i < steps; ++i) out.steps.push_back(pipe.step());
  if (const CudaGraphStep* g = pipe.cuda_graph()) {
    out.captured = g->captured();
    out.addresses = g->addresses();
    out.planned = g->planned_addresses();
    out.streams = g->streams_per_step();
    out.replays = g->replays();
  }
  pipe.finish();
  for (const Tensor& p : s->model->parameters()) {
    out.params.push_back(p.to_vector<float>());
    out.grads.push_back(p.grad().to_vector<float>());
  }
  // Buffers too: batch norm's running statistics (device) and num_batches_tracked (host, moved on
  // by each replay as forward moves it).
  for (const auto& [name, t] : s->model->state_dict()) {
    const Tensor host = t.to(Device::cpu());
    out.state.push_back(
        name + ":" +
        std::string(static_cast<const char*>(host.raw_data()), static_cast<size_t>(host.nbytes())));
  }
  return out;
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void check_captured_like_uncaptured(const std::string& model, const std::string& policy) {
  INFO(model << " under " << policy);
  // Step 1 warms up, step 2 is captured (and run once), steps 3-5 replay it.
  const GraphRun graph = run_planned(model, policy, "on", 5);
  const GraphRun plain = run_planned(model, policy, "off", 5);
  REQUIRE(graph.captured);
  CHECK(graph.replays == 3);
  CHECK(!plain.captured);
  REQUIRE(graph.steps.size() == plain.steps.size());
  for (size_t i = 0; i < graph.steps.size(); ++i) {
    INFO("step " << i + 1);
    CHECK(graph.steps[i].loss == plain.steps[i].loss);  // bitwise: the same float read back
    CHECK(graph.steps[i].optimizer_step == plain.steps[i].optimizer_step);
    // Every step's peaks are the plan's prediction to the byte (a replay reports the captured
    // step's, which allocated exactly the planned blocks).
    CHECK(graph.steps[i].predicted);
    CHECK(graph.steps[i].exact());
    CHECK(graph.steps[i].memory.allocated.peak == plain.steps[i].memory.allocated.peak);
    CHECK(graph.steps[i].memory.reserved.peak == plain.steps[i].memory.reserved.peak);
  }
  REQUIRE(graph.params.size() == plain.params.size());
  for (size_t i = 0; i < graph.params.size(); ++i) {
    INFO("parameter " << i);
    CHECK(bitwise_equal(graph.params[i], plain.params[i]));
    CHECK(bitwise_equal(graph.grads[i], plain.grads[i]));
  }
  REQUIRE(graph.state.size() == plain.state.size());
  for (size_t i = 0; i < graph.state.size(); ++i) {
    CHECK_MESSAGE(graph.state[i] == plain.state[i], "state_dict entry ", i, " differs");
  }
  // The graph holds the layout's addresses: request k at its hole's or the arena's base plus its
  // planned offset.
  REQUIRE(!graph.addresses.empty());
  CHECK(graph.addresses == graph.planned);
  if (model == "transformer-tiny") CHECK(graph.streams > 0);  // dropout drew streams
}

std::string refusal_of(SessionOptions o, const std::string& policy, bool planned_layout) {
  kernels::prepare_device(o.device == "cpu" ? Device::cpu() : kGpu);
  std::unique_ptr<Session> s = make_session(o, Preflight::none);
  RematPipeline pipe(*s->trainer);
  TrainingRun run(*s, pipe);
  if (!policy.empty()) {
    ProfileOptions po;
    po.warmup = 0;
    po.iterations = 1;
    po.model_name = o.model;
    po.measure_transfer = false;
    run.profile(po);
    PlanOptions plan;
    plan.planned_layout = planned_layout;
    pipe.plan(policy, Budget(), plan);
  }
  return run.cuda_graph_refusal();
}

// The error profiling under `on` raises before its first step for a step that cannot be captured
// ("" when it profiles): the refusal comes before any training.
std::string profile_refusal(const SessionOptions& o) {
  kernels::prepare_device(o.device == "cpu" ? Device::cpu() : kGpu);
  std::unique_ptr<Session> s = make_session(o, Preflight::none);
  RematPipeline pipe(*s->trainer);
  TrainingRun run(*s, pipe);
  ProfileOptions po;
  po.warmup = 0;
  po.iterations = 1;
  po.model_name = o.model;
  po.measure_transfer = false;
  try {
    run.profile(po);
  } catch (const Error& e) {
    CHECK(s->trainer->optimizer_steps() == 0);
    const std::string what = e.what();
    CHECK(what.find("--cuda-graph on: the steps cannot be captured as one CUDA graph: ") !=
          std::string::npos);
    return what;
  }
  return "";
}

}  // namespace

TEST_CASE("cuda graph: captured transformer-tiny steps with dropout replay bitwise") {
  check_captured_like_uncaptured("transformer-tiny", "none");
}

TEST_CASE("cuda graph: captured resnet-tiny steps with regenerations replay bitwise") {
  check_captured_like_uncaptured("resnet-tiny", "sqrt");
}

TEST_CASE("cuda graph: every refused condition names its reason") {
  SessionOptions o = graph_options("resnet-tiny", "on");
  CHECK(refusal_of(o, "", false).find("no plan") != std::string::npos);
  CHECK(refusal_of(o, "none", false).find("--layout planned") != std::string::npos);
  CHECK(refusal_of(o, "none", true).empty());
  CHECK(refusal_of(o, "dtr", false).find("DTR") != std::string::npos);
  // The conditions of the step itself come before the plan's: said without a profile, and under
  // on the profile is refused before it trains, naming the same reason.
  SessionOptions cpu = o;
  cpu.device = "cpu";
  SessionOptions adamw = o;
  adamw.optimizer = "adamw";
  adamw.lr = 1e-3;
  SessionOptions clip = o;
  clip.clip_grad_norm = 1.0;
  SessionOptions norm = o;
  norm.grad_norm = true;
  SessionOptions accumulate = o;
  accumulate.accumulate = 2;
  SessionOptions cosine = o;
  cosine.lr_schedule = "cosine";
  cosine.schedule_steps = 10;
  const std::vector<std::pair<SessionOptions, std::string>> step_cases = {
      {cpu, "the device is cpu"},   {adamw, "AdamW"},
      {clip, "gradient norm"},      {norm, "gradient norm"},
      {accumulate, "accumulation"}, {cosine, "learning rate"}};
  for (const auto& c : step_cases) {
    INFO(c.second);
    CHECK(refusal_of(c.first, "", false).find(c.second) != std::string::npos);
    CHECK(profile_refusal(c.first).find(c.second) != std::string::npos);
  }
  SessionOptions off = o;
  off.cuda_graph = "off";
  CHECK(refusal_of(off, "", false).empty());  // off: nothing to refuse
}

TEST_CASE("cuda graph: on is refused before the first step, auto trains uncaptured") {
  SessionOptions o = graph_options("resnet-tiny", "on");
  kernels::prepare_device(kGpu);
  {
    std::unique_ptr<Session> s = make_session(o, Preflight::none);
    RematPipeline pipe(*s->trainer);
    TrainingRun run(*s, pipe);
    CHECK_THROWS_WITH_AS(run.run(1),
                         doctest::Contains("--cuda-graph on: the steps cannot be captured as one "
                                           "CUDA graph: no plan"),
                         Error);
    CHECK(s->trainer->optimizer_steps() == 0);  // refused before the step
  }
  o.cuda_graph = "auto";
  std::unique_ptr<Session> s = make_session(o, Preflight::none);
  RematPipeline pipe(*s->trainer);
  TrainingRun run(*s, pipe);
  CHECK(run.run(2).size() == 2);
  CHECK(pipe.cuda_graph() == nullptr);
}

TEST_CASE("cuda graph: a host read while capturing is refused, naming the copy") {
  kernels::prepare_device(kGpu);
  Tensor t = full({1}, 1.5, DType::f32, kGpu);
  cuda::begin_capture();
  CHECK(cuda::capturing());
  CHECK_THROWS_WITH_AS(t.item<float>(), doctest::Contains("while the step is captured"), Error);
  cuda::abandon_capture();
  CHECK(!cuda::capturing());
  CHECK(t.item<float>() == 1.5f);  // after the capture, the read is allowed again
}

TEST_CASE("cuda graph: captured work runs at each launch, in order, not at capture") {
  kernels::prepare_device(kGpu);
  Tensor t = zeros({8}, DType::f32, kGpu);
  Tensor one = full({8}, 1.0, DType::f32, kGpu);
  // The sum's block is cached before capturing, so the captured add maps nothing (a cudaMalloc
  // while capturing would invalidate the capture).
  { Tensor warm = add(t, one); }
  cuda::begin_capture();
  Tensor sum = add(t, one);
  cuda::memcpy(t.raw_data(), sum.raw_data(), t.nbytes(), cudaMemcpyDeviceToDevice);
  cuda::Graph g = cuda::end_capture();
  CHECK(t.to_vector<float>() == std::vector<float>(8, 0.0f));  // nothing ran while capturing
  for (int i = 0; i < 3; ++i) g.launch();
  cuda::synchronize();
  CHECK(t.to_vector<float>() == std::vector<float>(8, 3.0f));
}
