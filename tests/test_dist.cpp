// Data parallelism in one process (dist/): the buckets, the launch environment, the data shards,
// and DataParallel over a communicator of one rank, where the mean over the ranks is the value
// itself. Training must then be bitwise the training without it, in every shard mode (ZeRO-1 and
// ZeRO-2 update this rank's chunk of flat buckets, which is every element), and the allocator
// requests it adds (flat buckets, ZeRO-2's bucket gradients in the communication category) must
// be predicted to the byte: by the dry run of the first step and by the simulator under remat
// plans. Two ranks under mpirun: tests/test_mpi.cpp.
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <unistd.h>

#include "regen/autograd/tape.h"
#include "regen/dist/communicator.h"
#include "regen/dist/data_parallel.h"
#include "regen/dist/world.h"
#include "regen/models/optim.h"
#include "regen/models/train.h"
#include "regen/remat/execute/pipeline.h"
#include "regen/session/session.h"
#include "tests/test_util.h"

using namespace regen;
using namespace regen::testing;
namespace fs = std::filesystem;

namespace {

// A training run, with data parallelism over one rank when `shard` is given.
struct DpRun {
  std::unique_ptr<Model> model;
  std::unique_ptr<dist::Communicator> comm;
  std::unique_ptr<dist::DataParallel> dp;
  std::unique_ptr<Optimizer> opt;
  std::unique_ptr<DataSource> data;
  std::unique_ptr<Trainer> trainer;
};

dist::DataParallelOptions dp_options(dist::ShardMode shard) {
  dist::DataParallelOptions o;
  o.shard = shard;
  o.bucket_bytes = 64 << 10;  // several buckets on the tiny models
  o.first_bucket_bytes = 8 << 10;
  return o;
}

// A communicator of one rank whose reductions and gathers end only when they are waited for:
// until then a reduction's output keeps the value from before, and a gathered buffer holds NaN
// (its bytes are put back at the wait), so whatever reads either before its wait computes
// something else. It counts the reductions still in flight when another collective was issued.
class DeferredCommunicator final : public dist::Communicator {
 public:
  DeferredCommunicator() : Communicator(0, 1, Device::cpu()) {}
  const char* backend() const override { return "deferred"; }
  int64_t scratch_elements(int64_t) const override { return 0; }
  dist::Work reduce_scatter_mean(DType dtype, void* data, void* out, int64_t chunk,
                                 void*) override {
    auto w = std::make_shared<Deferred>();
    w->run = [=] {
      if (out != data) std::memcpy(out, data, static_cast<size_t>(dtype_size(dtype) * chunk));
    };
    w->issued_at = issued++;
    w->reduction = true;
    ++reductions;
    return w;
  }
  dist::Work all_gather(DType dtype, void* data, int64_t chunk) override {
    auto w = std::make_shared<Deferred>();
    const size_t bytes = static_cast<size_t>(dtype_size(dtype) * chunk);
    auto kept = std::make_shared<std::vector<char>>(static_cast<const char*>(data),
                                                    static_cast<const char*>(data) + bytes);
    std::memset(data, 0xff, bytes);  // NaN in f32 and f64
    w->run = [=] { std::memcpy(data, kept->data(), bytes); };
    w->issued_at = issued++;
    return w;
  }
  dist::Work broadcast(void*, uint64_t, int) override { return finished(); }
  void wait(const dist::Work& w) override {
    auto* d = dynamic_cast<Deferred*>(w.get());
    if (d != nullptr && !d->done) {
      d->run();
      d->done = true;
      if (d->reduction && issued > d->issued_at + 1) ++overlapped;
    }
    w->waited = true;
  }
  bool idle() const override { return true; }

  int64_t issued = 0, reductions = 0, overlapped = 0;

 private:
  struct Deferred : dist::WorkState {
    std::function<void()> run;
    int64_t issued_at = 0;
    bool reduction = false;
  };
  dist::Work finished() {
    ++issued;
    auto w = std::make_shared<dist::WorkState>();
    w->done = true;
    return w;
  }
};

DpRun make_dp_run(const std::string& model, int64_t batch, const dist::ShardMode* shard,
                  const std::string& optimizer = "sgd", bool deferred = false) {
  DpRun r;
  ModelConfig c = model_preset(model);
  c.seed = 7;
  if (c.dropout > 0) c.dropout = 0.1f;
  manual_seed(7);
  r.model = make_model(c, Device::cpu());
  std::vector<Tensor> params = r.model->parameters();
  if (shard) {
    r.comm = deferred ? std::make_unique<DeferredCommunicator>()
                      : dist::make_local_communicator(Device::cpu());
    r.dp = std::make_unique<dist::DataParallel>(*r.model, *r.comm, dp_options(*shard));
    params = r.dp->optimizer_parameters();
  }
  if (optimizer == "sgd") {
    SGDOptions o;
    o.lr = 0.05;
    o.momentum = 0.9;
    o.weight_decay = 1e-4;
    r.opt = std::make_unique<SGD>(params, o);
  } else {
    AdamWOptions o;
    o.lr = 1e-3;
    r.opt = std::make_unique<AdamW>(params, o);
  }
  r.data = make_data_source("", c, 7);
  r.trainer = std::make_unique<Trainer>(*r.model, *r.opt, *r.data, batch, Device::cpu());
  r.trainer->set_gradient_sync(r.dp.get());
  return r;
}

// The dry run of make_dp_run's first step (batch 4, SGD with momentum) over `comm`.
DryRunResult dry_run_dp_step(const std::string& model, dist::ShardMode mode,
                             dist::Communicator& comm) {
  ModelConfig c = model_preset(model);
  c.seed = 7;
  auto make_sync = [&](Model& m) -> std::unique_ptr<GradientSync> {
    return std::make_unique<dist::DataParallel>(m, comm, dp_options(mode));
  };
  auto make_opt = [](Model&, GradientSync* sync) -> std::unique_ptr<Optimizer> {
    SGDOptions o;
    o.momentum = 0.9;
    return std::make_unique<SGD>(sync->optimizer_parameters(), o);
  };
  return dry_run_step(c, 4, Device::cpu(), make_opt, make_sync);
}

std::vector<std::vector<float>> params_of(const Model& m) {
  std::vector<std::vector<float>> out;
  for (const Tensor& p : m.parameters()) out.push_back(p.to_vector<float>());
  return out;
}

const dist::ShardMode kModes[] = {dist::ShardMode::none, dist::ShardMode::optimizer,
                                  dist::ShardMode::gradients};

}  // namespace

TEST_CASE("buckets fill in reverse registration order, the first one small, padded per rank") {
  ModelConfig c = model_preset("transformer-tiny");
  auto model = make_model(c, Device::cpu());
  auto comm = dist::make_local_communicator(Device::cpu());
  dist::DataParallel dp(*model, *comm, dp_options(dist::ShardMode::none));
  const std::vector<dist::BucketInfo>& b = dp.buckets();
  REQUIRE(b.size() > 2);
  int64_t params = 0, elements = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    CHECK(b[i].elements % 128 == 0);  // 512-byte aligned chunks
    CHECK(b[i].chunk == b[i].elements);
    params += b[i].params;
    elements += b[i].elements;
    // Over its cap only when one parameter alone is larger.
    const int64_t cap = i == 0 ? (8 << 10) : (64 << 10);
    if (b[i].params > 1) CHECK(b[i].elements * 4 <= cap + 128 * 4 * b[i].params);
  }
  CHECK(params == static_cast<int64_t>(model->named_parameters().size()));
  CHECK(elements >= model->num_parameters());
  // The last registered parameter is in the first bucket: backward finishes it first.
  CHECK(b[0].params >= 1);
}

TEST_CASE("one rank: data parallelism trains bitwise as without it, in every shard mode") {
  for (const std::string model : {"resnet-tiny", "transformer-tiny"}) {
    for (const std::string optimizer : {"sgd", "adamw"}) {
      DpRun base = make_dp_run(model, 4, nullptr, optimizer);
      std::vector<double> losses;
      for (int i = 0; i < 3; ++i) losses.push_back(base.trainer->step().loss);
      const auto want = params_of(*base.model);
      for (dist::ShardMode mode : kModes) {
        CAPTURE(model);
        CAPTURE(optimizer);
        CAPTURE(dist::shard_mode_name(mode));
        DpRun r = make_dp_run(model, 4, &mode, optimizer);
        for (int i = 0; i < 3; ++i) CHECK(r.trainer->step().loss == losses[static_cast<size_t>(i)]);
        CHECK(params_of(*r.model) == want);
        // ZeRO: the optimizer updates one chunk per bucket, and its state is that size.
        if (mode != dist::ShardMode::none) {
          CHECK(r.opt->params().size() == r.dp->buckets().size());
          for (const auto& [name, t] : r.opt->named_state()) {
            CHECK(name.find("ddp.bucket") == 0);
          }
        }
      }
    }
  }
}

// Accumulation under a sync runs the micro-batches before the last without its hooks: the
// gradients add up in the flat buckets as in one process, and the last backward reduces them
// (over one rank, the value itself), so the run is bitwise the plain accumulated one. ZeRO-2
// keeps no whole gradients between micro-batches: the trainer refuses it, naming both options.
TEST_CASE("one rank: accumulated steps under data parallelism train bitwise as without it") {
  for (const int64_t k : {int64_t{2}, int64_t{3}}) {
    DpRun base = make_dp_run("transformer-tiny", 2, nullptr);
    base.trainer->set_accumulation(k);
    std::vector<double> losses;
    for (int i = 0; i < 3; ++i) losses.push_back(base.trainer->step().loss);
    const auto want = params_of(*base.model);
    for (dist::ShardMode mode : {dist::ShardMode::none, dist::ShardMode::optimizer}) {
      CAPTURE(k);
      CAPTURE(dist::shard_mode_name(mode));
      DpRun r = make_dp_run("transformer-tiny", 2, &mode);
      r.trainer->set_accumulation(k);
      for (int i = 0; i < 3; ++i) CHECK(r.trainer->step().loss == losses[static_cast<size_t>(i)]);
      CHECK(params_of(*r.model) == want);
    }
  }
  const dist::ShardMode zero2 = dist::ShardMode::gradients;
  DpRun r = make_dp_run("transformer-tiny", 2, &zero2);
  r.trainer->set_accumulation(2);
  expect_error([&] { r.trainer->step(); },
               {"gradient accumulation (2 micro-batches) with gradients sharded across the ranks "
                "(ZeRO-2) is not supported",
                "shard the optimizer state only (ZeRO-1), or one micro-batch per step"});
}

TEST_CASE("one rank: the dry run of the first step takes exactly what the step takes") {
  for (dist::ShardMode mode : kModes) {
    CAPTURE(dist::shard_mode_name(mode));
    const std::unique_ptr<dist::Communicator> comm = dist::make_local_communicator(Device::cpu());
    const DryRunResult dry = dry_run_dp_step("transformer-tiny", mode, *comm);
    allocator_for(Device::cpu()).empty_cache();
    DpRun r = make_dp_run("transformer-tiny", 4, &mode);
    const StepResult st = r.trainer->step();
    CHECK(dry.memory.allocated.peak == st.memory.allocated.peak);
    CHECK(dry.memory.allocated_by_at_peak == st.memory.allocated_by_at_peak);
    for (int k = 0; k < kNumCategories; ++k) {
      CHECK(dry.memory.allocated_by[k].peak == st.memory.allocated_by[k].peak);
    }
  }
}

TEST_CASE(
    "one rank: ZeRO-2's bucket gradients are communication requests, and plans predict them") {
  for (dist::ShardMode mode : kModes) {
    CAPTURE(dist::shard_mode_name(mode));
    allocator_for(Device::cpu()).empty_cache();
    DpRun r = make_dp_run("resnet-tiny", 8, &mode);
    RematPipeline pipe(*r.trainer);
    ProfileOptions po;
    po.warmup = 0;
    po.iterations = 2;
    const Profile& p = pipe.profile(po);
    int64_t comm_allocs = 0,
            grads_persistent = p.persistent_by[static_cast<int>(Category::gradient)];
    for (const ProfileEvent& e : p.events) {
      if (e.kind == MemoryEventKind::alloc && e.category == Category::communication) {
        ++comm_allocs;
        CHECK(e.tag.find("ddp.bucket") == 0);
      }
    }
    // ZeRO-2 makes every bucket's gradient during backward (the local communicator needs no
    // scratch); the other modes keep them from before the step.
    if (mode == dist::ShardMode::gradients) {
      CHECK(comm_allocs == static_cast<int64_t>(r.dp->buckets().size()));
    } else {
      CHECK(comm_allocs == 0);
    }
    CHECK(grads_persistent > 0);
    // Under plans at several budgets, every step measures the predicted peaks.
    for (const char* budget : {"90%", "75%"}) {
      const Plan& plan = pipe.plan("dp", Budget::parse(budget));
      if (!plan.feasible) continue;
      for (int i = 0; i < 3; ++i) {
        const StepResult st = pipe.step();
        CHECK(st.predicted);
        CHECK(st.exact());
      }
    }
    CHECK(pipe.predicted_steps() > 0);
    CHECK(pipe.exact_steps() == pipe.predicted_steps());
  }
}

// ZeRO-3 gathers parameters ahead of the ops that read them and leaves each shard's gradient
// reduction in flight while backward goes on: over a communicator whose collectives end only when
// waited for, the parameters still come out bitwise those of a run without data parallelism
// (nothing read a gathered parameter or a reduced gradient before its wait), gathers were
// prefetched, more than one reduction was in flight at once, and the dry run and the plans predict
// the blocks both hold, to the byte.
TEST_CASE("one rank, ZeRO-3: prefetched gathers and reductions in flight, bitwise and exact") {
  const dist::ShardMode mode = dist::ShardMode::parameters;
  for (const std::string model : {"transformer-tiny", "resnet-tiny"}) {
    CAPTURE(model);
    {
      DpRun base = make_dp_run(model, 4, nullptr);
      std::vector<double> losses;
      for (int i = 0; i < 3; ++i) losses.push_back(base.trainer->step().loss);
      DpRun r = make_dp_run(model, 4, &mode, "sgd", true);
      for (int i = 0; i < 3; ++i) CHECK(r.trainer->step().loss == losses[static_cast<size_t>(i)]);
      {
        dist::WholeParameters whole(r.dp.get());
        CHECK(params_of(*r.model) == params_of(*base.model));
      }
      const auto& comm = static_cast<const DeferredCommunicator&>(*r.comm);
      const int64_t shards = static_cast<int64_t>(r.dp->parameter_shards().size());
      CHECK(comm.reductions == 3 * shards);
      // Every reduction but the last of a step waits for a later one (max_in_flight is 2).
      CHECK(comm.overlapped >= 3 * (shards - 1));
      const dist::SyncStats& st = r.dp->last_step();
      CHECK(st.gathers >= shards);
      CHECK(st.prefetched > shards / 4);
      CHECK(st.prefetched < st.gathers);
    }

    // The step's requests, in the dry run and under plans.
    DeferredCommunicator dry_comm;
    const DryRunResult dry = dry_run_dp_step(model, mode, dry_comm);
    allocator_for(Device::cpu()).empty_cache();
    DpRun fresh = make_dp_run(model, 4, &mode, "sgd", true);
    const StepResult st = fresh.trainer->step();
    CHECK(dry.memory.allocated.peak == st.memory.allocated.peak);
    CHECK(dry.memory.allocated_by_at_peak == st.memory.allocated_by_at_peak);
    RematPipeline pipe(*fresh.trainer);
    ProfileOptions po;
    po.warmup = 0;
    po.iterations = 2;
    pipe.profile(po);
    PlanOptions allocated;
    allocated.budget_of = BudgetOf::allocated;
    for (const std::string budget : {"85%", "lowest"}) {
      CAPTURE(budget);
      const Plan& plan = pipe.plan("dp", Budget::parse(budget), allocated);
      CHECK(plan.feasible);
      for (int i = 0; i < 2; ++i) {
        const StepResult s = pipe.step();
        CHECK(s.predicted);
        CHECK(s.exact());
      }
    }
    CHECK(pipe.predicted_steps() > 0);
    CHECK(pipe.exact_steps() == pipe.predicted_steps());
  }
}

TEST_CASE("ZeRO-2 lowers the persistent gradients to one chunk per bucket") {
  int64_t grads[3] = {0, 0, 0};
  for (int m = 0; m < 3; ++m) {
    allocator_for(Device::cpu()).empty_cache();
    DpRun r = make_dp_run("resnet-tiny", 4, &kModes[m]);
    r.trainer->prepare();
    grads[m] = allocator_for(Device::cpu())
                   .stats()
                   .allocated_by[static_cast<int>(Category::gradient)]
                   .current;
  }
  // One rank: a chunk is the whole bucket, so the gradients take the same bytes in every mode; with
  // N ranks the shard is 1/N (tests/mpi).
  CHECK(grads[0] == grads[1]);
  CHECK(grads[2] == grads[0]);
}

TEST_CASE("a step that failed part-way is not followed by another") {
  const dist::ShardMode mode = dist::ShardMode::none;
  DpRun r = make_dp_run("resnet-tiny", 4, &mode);
  r.trainer->step();
  r.dp->begin_step();  // as a step that then threw would leave it
  expect_error([&] { r.trainer->step(); }, {"the previous step failed on this rank part-way"});
}

TEST_CASE("each rank's shard of a global batch is the global batch's part, for every data kind") {
  const fs::path dir =
      fs::temp_directory_path() / ("regen_dist_data_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  // CIFAR-10: 10 records (label r % 10, pixels from r), so that batches wrap into new epochs.
  {
    std::ofstream f(dir / "data_batch_1.bin", std::ios::binary);
    for (int r = 0; r < 10; ++r) {
      f.put(static_cast<char>(r % 10));
      for (int e = 0; e < 3072; ++e) f.put(static_cast<char>((r * 7 + e) % 251));
    }
  }
  {
    std::ofstream f(dir / "text.txt");
    for (int i = 0; i < 200; ++i) f << "line " << i << " of the text\n";
  }
  struct Kind {
    std::string model, spec;
  };
  ModelConfig lm = model_preset("transformer-tiny");
  lm.vocab = 256;
  for (const Kind& k : {Kind{"resnet-tiny", ""}, Kind{"resnet-tiny", "cifar10:" + dir.string()},
                        Kind{"transformer-tiny", ""},
                        Kind{"transformer-tiny", "text:" + (dir / "text.txt").string()}}) {
    CAPTURE(k.spec);
    const ModelConfig c = k.model == "resnet-tiny" ? model_preset("resnet-tiny") : lm;
    auto whole = make_data_source(k.spec, c, 3);
    const int ranks = 3, n = 2;
    std::vector<std::unique_ptr<DataSource>> shards;
    for (int r = 0; r < ranks; ++r) {
      shards.push_back(
          std::make_unique<dist::ShardedSource>(make_data_source(k.spec, c, 3), r, ranks));
    }
    for (int step = 0; step < 4; ++step) {  // 24 samples: two CIFAR epochs and more
      const Batch g = whole->next(n * ranks, Device::cpu());
      for (int r = 0; r < ranks; ++r) {
        const Batch b = shards[static_cast<size_t>(r)]->next(n, Device::cpu());
        const Tensor gi = g.input.narrow0(r * n, n), gt = g.target.narrow0(r * n, n);
        if (gi.dtype() == DType::f32) {
          CHECK(b.input.to_vector<float>() == gi.to_vector<float>());
        } else {
          CHECK(b.input.to_vector<int64_t>() == gi.to_vector<int64_t>());
        }
        CHECK(b.target.to_vector<int64_t>() == gt.to_vector<int64_t>());
      }
    }
  }
  fs::remove_all(dir);
}

TEST_CASE("a data source that cannot skip is refused under data parallelism, naming it") {
  class Plain final : public DataSource {
   public:
    Batch next(int64_t, Device) override { return {}; }
    std::string describe() const override { return "my stream"; }
  };
  dist::ShardedSource s(std::make_unique<Plain>(), 1, 2);
  expect_error([&] { s.next(4, Device::cpu()); }, {"my stream", "cannot skip", "shard"});
}

TEST_CASE("the launch environment is read, and a bad value is named") {
  auto with_env = [](const std::vector<std::pair<const char*, const char*>>& vars,
                     const std::function<void()>& f) {
    for (const auto& [k, v] : vars) ::setenv(k, v, 1);
    try {
      f();
    } catch (...) {
      for (const auto& kv : vars) ::unsetenv(kv.first);
      throw;
    }
    for (const auto& kv : vars) ::unsetenv(kv.first);
  };
  CHECK_FALSE(dist::detect_launch().launched);
  with_env({{"OMPI_COMM_WORLD_SIZE", "4"},
            {"OMPI_COMM_WORLD_RANK", "2"},
            {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}},
           [] {
             const dist::Launch l = dist::detect_launch();
             CHECK(l.launched);
             CHECK(l.launcher == "Open MPI");
             CHECK(l.size == 4);
             CHECK(l.rank == 2);
             CHECK(l.local_rank == 1);
           });
  with_env({{"PMI_SIZE", "2"}, {"PMI_RANK", "1"}}, [] {
    const dist::Launch l = dist::detect_launch();
    CHECK(l.launcher == "PMI");
    CHECK(l.rank == 1);
  });
  with_env({{"OMPI_COMM_WORLD_SIZE", "two"}}, [] {
    expect_error([] { dist::detect_launch(); }, {"OMPI_COMM_WORLD_SIZE", "two"});
  });
  with_env({{"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_RANK", "5"}},
           [] { expect_error([] { dist::detect_launch(); }, {"rank 5 of 2"}); });
  // This process was not launched: one rank, no MPI.
  CHECK(dist::world().size() == 1);
  CHECK_FALSE(dist::world().distributed());
}

TEST_CASE("shard modes and bucket sizes are checked as options") {
  SessionOptions o;
  o.shard = "stage3";
  expect_error([&] { o.validate(); },
               {"--shard", "stage3", "none, optimizer, gradients or parameters"});
  o.shard = "gradients";
  o.bucket_size = 100;
  expect_error([&] { o.validate(); }, {"--bucket-size", "100"});
  o.style = OptionStyle::keyword;
  expect_error([&] { o.validate(); }, {"bucket_size=100"});
  CHECK_THROWS_AS(dist::parse_shard_mode("zero3"), Error);
}
