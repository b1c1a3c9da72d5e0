// Offload on cuda:0 (tests/offload_suite.h): the host tier is pinned memory, the copies run on
// copy streams of their own (cudaMemcpyAsync, events both ways), and plans that offload every
// offloadable tensor and keep the optimizer state on the host tier train bitwise as without remat,
// with the device's and the host tier's peaks exact on every step. The stall time the copy queues
// measure is printed beside the prediction (no timed assertion). Skipped (exit 77) without a GPU.
#include <doctest/doctest.h>

#include <cstring>

#include "regen/core/copy_queue.h"
#include "regen/core/cuda/runtime.h"
#include "tests/offload_suite.h"

using namespace regen;
using namespace regen::testing;

namespace {

const Device kGpu = Device::cuda(0);

TEST_CASE("cuda: the host tier is pinned memory of its own") {
  CachingAllocator& host = host_allocator_for(kGpu);
  CHECK(&host != &allocator_for(Device::cpu()));
  if (!allocator_for(kGpu).direct()) CHECK(host.arena().name().find("host tier of cuda:0") == 0);
  {
    Storage s(host, 1 << 20, Category::activation);
    cudaPointerAttributes attr{};
    REGEN_CUDA_CHECK(cudaPointerGetAttributes(&attr, s.data()));
    if (!host.direct()) CHECK(attr.type == cudaMemoryTypeHost);  // page-locked
  }
  host.empty_cache();
}

TEST_CASE("cuda: copies on their own streams, after the kernels that wrote them") {
  CachingAllocator& host = host_allocator_for(kGpu);
  auto out = CopyQueue::make(kGpu, CopyDirection::to_host);
  auto back = CopyQueue::make(kGpu, CopyDirection::to_device);
  const int64_t n = 1 << 22;  // 16 MiB of floats
  // A tensor written by a kernel on the compute stream, copied out at once: the copy stream must
  // wait for the kernel (an event), or it reads what the block held before.
  for (int round = 0; round < 3; ++round) {
    Tensor t = full({n}, 1.5 + round, DType::f32, kGpu);
    auto h = std::make_shared<Storage>(host, t.nbytes(), Category::activation);
    const uint64_t a = out->issue(h, t.impl()->storage);
    out->wait(a);
    Tensor again = empty({n}, DType::f32, kGpu);
    const uint64_t b = back->issue(again.impl()->storage, h);
    back->wait(b);
    // The compute stream waited for the copy: a kernel reading `again` sees the copied values.
    const std::vector<float> v = again.to_vector<float>();
    bool ok = true;
    for (float x : v) ok = ok && x == static_cast<float>(1.5 + round);
    CHECK(ok);
  }
  CHECK(out->take_stall_ms() >= 0);
  CHECK(back->take_stall_ms() >= 0);
  host.empty_cache();
}

void check_gpu_offload(const ModelConfig& cfg, int64_t batch, const std::string& optimizer) {
  SessionOptions o = run_options(cfg, batch, kGpu);
  o.optimizer = optimizer;
  fresh_allocator(kGpu);
  Profile p;
  {
    std::unique_ptr<Session> s = make_session(o, Preflight::none);
    ProfileOptions po;
    po.warmup = 1;
    po.iterations = 2;
    po.model_name = cfg.name;
    p = profile_training(*s->trainer, po);
  }
  MESSAGE(cfg.name, ": measured transfer model ", p.transfer.str());
  const Simulator sim(p);
  const Trace ref = reference(o, kGpu);
  for (const std::string& spec : {std::string("profile"), std::string("step:2")}) {
    for (StatePlace place : {StatePlace::device, StatePlace::host}) {
      CAPTURE(spec);
      CAPTURE(std::string(state_place_name(place)));
      const Plan plan = offload_everything(sim, place, transfer_for(spec, p));
      check_exact_training(cfg, batch, p, plan, ref, o, kGpu);
      MESSAGE(cfg.name, ", transfer ", spec, ", optimizer state on the ", state_place_name(place),
              ": predicted wait ", plan.predicted.stall_ms, " ms of a ", plan.predicted.time_ms,
              " ms step");
    }
  }
}

TEST_CASE("cuda: offload on a ResNet, exact on the device and its host tier, bitwise") {
  check_gpu_offload(remat_resnet(), 8, "sgd");
}

TEST_CASE("cuda: offload on the Transformer with AdamW and dropout, exact, bitwise") {
  ModelConfig cfg = model_preset("transformer-tiny");
  cfg.dropout = 0.1;
  check_gpu_offload(cfg, 4, "adamw");
}

}  // namespace
