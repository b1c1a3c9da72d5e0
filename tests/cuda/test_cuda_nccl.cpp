// NCCL on one rank (cuda:0, no MPI needed: rank 0 makes the unique id and nobody else needs it):
// the collectives run on the communicator's stream after the compute stream's work and the compute
// stream waits for them; DataParallel over it trains transformer-tiny bitwise as training without
// it in every shard mode (the mean over one rank is the value), and ZeRO-2's bucket gradients are
// predicted to the byte under remat plans. A multi-rank NCCL run needs two GPUs (mpirun -np 2 on a
// machine with two): docs/distributed.md. Skipped (exit 77) without a GPU; without NCCL in the
// build the suite checks that asking for it says so.
#include <doctest/doctest.h>

#include <vector>

#include "regen/dist/communicator.h"
#include "regen/dist/data_parallel.h"
#include "regen/dist/world.h"
#include "regen/models/optim.h"
#include "regen/remat/execute/pipeline.h"
#include "tests/test_util.h"

using namespace regen;
using namespace regen::testing;

namespace {

const Device kGpu = Device::cuda(0);

struct GpuRun {
  std::unique_ptr<Model> model;
  std::unique_ptr<dist::DataParallel> dp;
  std::unique_ptr<Optimizer> opt;
  std::unique_ptr<DataSource> data;
  std::unique_ptr<Trainer> trainer;
};

GpuRun make_gpu_run(dist::Communicator* comm, dist::ShardMode shard) {
  GpuRun r;
  ModelConfig c = model_preset("transformer-tiny");
  c.seed = 11;
  manual_seed(11);
  r.model = make_model(c, kGpu);
  std::vector<Tensor> params = r.model->parameters();
  if (comm) {
    dist::DataParallelOptions o;
    o.shard = shard;
    o.bucket_bytes = 32 << 10;
    o.first_bucket_bytes = 8 << 10;
    r.dp = std::make_unique<dist::DataParallel>(*r.model, *comm, o);
    params = r.dp->optimizer_parameters();
  }
  SGDOptions o;
  o.lr = 0.05;
  o.momentum = 0.9;
  r.opt = std::make_unique<SGD>(params, o);
  r.data = make_data_source("", c, 11);
  r.trainer = std::make_unique<Trainer>(*r.model, *r.opt, *r.data, 8, kGpu);
  r.trainer->set_gradient_sync(r.dp.get());
  return r;
}

std::vector<std::vector<float>> params_of(const Model& m) {
  std::vector<std::vector<float>> out;
  for (const Tensor& p : m.parameters()) out.push_back(p.to_vector<float>());
  return out;
}

}  // namespace

TEST_CASE("NCCL on one rank: reduce-scatter, all-gather and broadcast on its own stream") {
  if (!dist::nccl_built()) {
    expect_error([] { dist::make_nccl_communicator(kGpu, 0, 1); }, {"built without NCCL"});
    return;
  }
  auto comm = dist::make_nccl_communicator(kGpu, 0, 1);
  CHECK(std::string(comm->backend()) == "nccl");
  CHECK(comm->scratch_elements(1 << 20) == 0);
  std::vector<float> host(4096);
  for (size_t i = 0; i < host.size(); ++i) host[i] = 0.25f * static_cast<float>(i) - 7.0f;
  Tensor data = from_vector<float>(host, {4096}, kGpu);
  Tensor out = zeros({4096}, DType::f32, kGpu);
  dist::Work w =
      comm->reduce_scatter_mean(DType::f32, data.raw_data(), out.raw_data(), 4096, nullptr);
  comm->wait(w);
  CHECK(out.to_vector<float>() == host);  // the mean over one rank
  dist::Work g = comm->all_gather(DType::f32, data.raw_data(), 4096);
  dist::Work b = comm->broadcast(data.raw_data(), data.nbytes(), 0);
  comm->wait(g);
  comm->wait(b);
  CHECK(data.to_vector<float>() == host);
  comm->resolve(w);
  CHECK(w->busy_ms >= 0);
  CHECK(w->bytes == 0);  // nothing leaves one rank
}

TEST_CASE("NCCL on one rank: data parallelism trains bitwise as without it, in every shard mode") {
  if (!dist::nccl_built()) return;
  auto comm = dist::make_nccl_communicator(kGpu, 0, 1);
  GpuRun base = make_gpu_run(nullptr, dist::ShardMode::none);
  std::vector<double> losses;
  for (int i = 0; i < 3; ++i) losses.push_back(base.trainer->step().loss);
  const auto want = params_of(*base.model);
  for (dist::ShardMode mode :
       {dist::ShardMode::none, dist::ShardMode::optimizer, dist::ShardMode::gradients}) {
    CAPTURE(dist::shard_mode_name(mode));
    GpuRun r = make_gpu_run(comm.get(), mode);
    for (int i = 0; i < 3; ++i) CHECK(r.trainer->step().loss == losses[static_cast<size_t>(i)]);
    CHECK(params_of(*r.model) == want);
    CHECK(r.dp->last_step().buckets == static_cast<int64_t>(r.dp->buckets().size()));
  }
}

TEST_CASE("NCCL on one rank: plans predict ZeRO-2's bucket gradients to the byte on the GPU") {
  if (!dist::nccl_built()) return;
  auto comm = dist::make_nccl_communicator(kGpu, 0, 1);
  allocator_for(kGpu).empty_cache();
  GpuRun r = make_gpu_run(comm.get(), dist::ShardMode::gradients);
  RematPipeline pipe(*r.trainer);
  ProfileOptions po;
  po.warmup = 1;
  po.iterations = 2;
  pipe.profile(po);
  // "lowest" always has a plan: on the GPU the first run found none at 95% or 80% (the lowest
  // that dp reaches there, printed below, is what says why).
  for (const char* budget : {"95%", "80%", "lowest"}) {
    const Plan& plan = pipe.plan("dp", Budget::parse(budget));
    MESSAGE(budget << ": " << (plan.feasible ? "feasible" : "infeasible") << ", no-remat peak "
                   << plan.no_remat_peak << " B, lowest " << plan.lowest_peak << " B, predicted "
                   << plan.predicted.peak_reserved << " B reserved (" << plan.note << ")");
    if (!plan.feasible) continue;
    for (int i = 0; i < 3; ++i) CHECK(pipe.step().exact());
  }
  CHECK(pipe.predicted_steps() >= 3);
  CHECK(pipe.exact_steps() == pipe.predicted_steps());
}
