// The caching allocator on the CUDA arena (the shared suite is tests/allocator_suite.h; the CPU
// and Null arenas run it in tests/test_allocator.cpp), host <-> device tensor copies, and tensor
// creation on cuda:0 matching the CPU bit for bit. Skipped (exit 77) without a GPU.
#include <doctest/doctest.h>

#include <cstring>
#include <random>
#include <vector>

#include "regen/core/cuda/runtime.h"
#include "regen/core/tensor.h"
#include "regen/kernels/kernels.h"
#include "tests/allocator_suite.h"

using namespace regen;
using namespace regen::testing;

namespace {
std::unique_ptr<Arena> gpu() {
  return make_cuda_arena(0);
}
std::unique_ptr<Arena> null_cuda() {
  return make_null_arena(Device::cuda(0));
}

// Like the suite's replay with touch_memory, for device memory: every live block carries a byte
// pattern (written and read with cudaMemcpy) at its first, middle and last byte, checked when it
// is freed, so overlapping blocks would be caught.
void replay_touching_device(CachingAllocator& a, const std::vector<Op>& ops) {
  std::vector<Block*> live;
  auto probe = [](Block* b) {
    return std::vector<uint64_t>{0, b->requested / 2, b->requested - 1};
  };
  for (const Op& op : ops) {
    if (op.is_alloc) {
      Block* b = a.allocate(op.bytes, op.category, 0);
      const unsigned char v = static_cast<unsigned char>(b->id() & 0xff);
      for (uint64_t at : probe(b)) {
        cuda::memcpy(static_cast<char*>(b->ptr()) + at, &v, 1, cudaMemcpyHostToDevice);
      }
      live.push_back(b);
    } else {
      Block* b = live[op.victim];
      const unsigned char want = static_cast<unsigned char>(b->id() & 0xff);
      for (uint64_t at : probe(b)) {
        unsigned char got = 0;
        cuda::memcpy(&got, static_cast<char*>(b->ptr()) + at, 1, cudaMemcpyDeviceToHost);
        REQUIRE(got == want);
      }
      a.free(b);
      live.erase(live.begin() + static_cast<long>(op.victim));
    }
  }
  for (Block* b : live) a.free(b);
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}
}  // namespace

TEST_CASE("cuda allocator: rounding, splitting and coalescing") {
  test_rounding_split_coalesce(gpu);
}

TEST_CASE("cuda allocator: statistics of a hand-computed sequence") {
  test_hand_computed_stats(gpu);
}

TEST_CASE("cuda allocator: categories and tags come from RAII scopes") {
  test_category_scopes(gpu);
}

TEST_CASE("cuda allocator: hard limit and the OutOfMemory report") {
  test_limit_and_oom(gpu);
}

TEST_CASE("cuda allocator: under a limit, a medium request takes a smaller segment") {
  test_limit_fallback(gpu);
}

TEST_CASE("cuda allocator: a second free or a foreign block is refused before it is read") {
  test_bad_frees(gpu);
}

TEST_CASE("cuda allocator: requests beyond the largest size are refused, never rounded") {
  test_max_request(gpu);
}

TEST_CASE("cuda allocator: under a limit, fallbacks and flushes match the null arena") {
  test_same_decisions_under_limit(gpu, null_cuda);
}

TEST_CASE("cuda allocator: empty_cache returns segments on the arena's device") {
  // The arena synchronizes and frees on its own device and leaves the caller's current device
  // as it was (DeviceGuard), whichever device that is.
  CachingAllocator a(gpu());
  cuda::set_device(0);
  Block* b = a.allocate(3 * MiB, Category::activation, 0);
  a.free(b);
  a.empty_cache();
  CHECK(a.stats().reserved.current == 0);
  CHECK(cuda::current_device() == 0);
}

TEST_CASE("cuda allocator: randomized stress keeps blocks disjoint and stats exact") {
  test_stress(gpu, /*touch_memory=*/false, 3000);
  CachingAllocator a(gpu());
  replay_touching_device(a, random_sequence(77, 600));
  CHECK(a.stats().allocated.current == 0);
  a.empty_cache();
  CHECK(a.stats().reserved.current == 0);
}

TEST_CASE("cuda allocator: the same sequence gives identical decisions on cuda and null arenas") {
  test_same_decisions(gpu, null_cuda);
}

TEST_CASE("cuda tensors: host <-> device copies round-trip every dtype") {
  Generator g(5);
  const Tensor f = uniform({3, 1001}, -2.0, 2.0, g);
  const Tensor d = uniform({7, 13}, -2.0, 2.0, g, DType::f64);
  const Tensor i = randint({2049}, 1000, g, DType::i32);
  const Tensor l = randint({17, 3}, 1ll << 40, g, DType::i64);
  for (const Tensor& t : {f, d, i, l}) {
    const Tensor on_gpu = t.to(Device::cuda(0));
    CHECK(on_gpu.device() == Device::cuda(0));
    CHECK(on_gpu.shape() == t.shape());
    const Tensor back = on_gpu.to(Device::cpu());
    REQUIRE(back.nbytes() == t.nbytes());
    CHECK(std::memcmp(back.raw_data(), t.raw_data(), t.nbytes()) == 0);
    // Device to device, and a view of rows.
    const Tensor copy = on_gpu.clone();
    CHECK(std::memcmp(copy.to(Device::cpu()).raw_data(), t.raw_data(), t.nbytes()) == 0);
    Tensor dst = empty(t.shape(), t.dtype(), Device::cuda(0));
    dst.copy_from(on_gpu);
    CHECK(std::memcmp(dst.to(Device::cpu()).raw_data(), t.raw_data(), t.nbytes()) == 0);
  }
  const Tensor rows = f.to(Device::cuda(0)).narrow0(1, 2).to(Device::cpu());
  CHECK(same_bits(rows.to_vector<float>(), f.narrow0(1, 2).to_vector<float>()));
  CHECK(f.to(Device::cuda(0)).to(DType::f64).to_vector<double>() ==
        f.to(DType::f64).to_vector<double>());
}

TEST_CASE("cuda tensors: creation on cuda:0 matches the cpu bit for bit") {
  const Device gpu_dev = Device::cuda(0);
  CHECK(same_bits(zeros({5, 7}, DType::f32, gpu_dev).to_vector<float>(),
                  zeros({5, 7}).to_vector<float>()));
  CHECK(same_bits(ones({9}, DType::f64, gpu_dev).to_vector<double>(),
                  ones({9}, DType::f64).to_vector<double>()));
  CHECK(same_bits(full({4, 4}, -1.5, DType::f32, gpu_dev).to_vector<float>(),
                  full({4, 4}, -1.5).to_vector<float>()));
  for (DType dt : {DType::f32, DType::f64}) {
    Generator a(123), b(123);
    const Tensor x = uniform({1000, 3}, -0.5, 2.0, a, dt, gpu_dev);
    const Tensor y = uniform({1000, 3}, -0.5, 2.0, b, dt);
    CHECK(a.offset == b.offset);
    CHECK(std::memcmp(x.to(Device::cpu()).raw_data(), y.raw_data(), y.nbytes()) == 0);
    const Tensor xn = normal({777}, 0.0, 1.0, a, dt, gpu_dev);
    const Tensor yn = normal({777}, 0.0, 1.0, b, dt);
    CHECK(std::memcmp(xn.to(Device::cpu()).raw_data(), yn.raw_data(), yn.nbytes()) == 0);
  }
  Generator a(9), b(9);
  CHECK(randint({555}, 30000, a, DType::i64, gpu_dev).to_vector<int64_t>() ==
        randint({555}, 30000, b, DType::i64).to_vector<int64_t>());
  Tensor t = empty({100}, DType::f32, gpu_dev);
  fill_(t, 2.5);
  CHECK(same_bits(t.to_vector<float>(), full({100}, 2.5).to_vector<float>()));
  zero_(t);
  CHECK(same_bits(t.to_vector<float>(), zeros({100}).to_vector<float>()));
}

TEST_CASE("cuda tensors: kernel scratch is allocator memory in the workspace category") {
  CachingAllocator& a = allocator_for(Device::cuda(0));
  const int64_t before = a.stats().allocated_by[static_cast<int>(Category::workspace)].current;
  {
    Workspace ws(Device::cuda(0), 3 << 20);
    CHECK(a.stats().allocated_by[static_cast<int>(Category::workspace)].current >=
          before + (3 << 20));
  }
  CHECK(a.stats().allocated_by[static_cast<int>(Category::workspace)].current == before);
  // cuBLAS gets its workspace from the allocator too: one persistent block, tagged, created by
  // prepare_device (the trainer's canonical start), so the GEMM below allocates nothing more.
  kernels::prepare_device(Device::cuda(0));
  const int64_t prepared = a.stats().allocated_by[static_cast<int>(Category::workspace)].current;
  CHECK(prepared >= before);
  const Tensor x = ones({64, 64}, DType::f32, Device::cuda(0));
  Tensor y = empty({64, 64}, DType::f32, Device::cuda(0));
  cuda::set_device(0);
  cuda::gemm(false, false, 64, 64, 64, 1.0f, x.data<float>(), 64, x.data<float>(), 64, 0.0f,
             y.data<float>(), 64);
  CHECK(same_bits(y.to_vector<float>(), full({64, 64}, 64.0).to_vector<float>()));
  CHECK(a.stats().allocated_by[static_cast<int>(Category::workspace)].current == prepared);
  bool found = false;
  for (const BlockInfo& b : a.snapshot()) {
    if (b.allocated && tag_name(b.tag) == "cublas.workspace") {
      found = true;
      CHECK(b.category == Category::workspace);
    }
  }
  CHECK(found);
}

TEST_CASE("cuda tensors: a copy to another GPU waits for the kernels writing its source") {
  const int n = cuda::device_count();
  if (n < 2) {
    MESSAGE("one GPU visible: the cross-device copy needs two (skipped)");
    return;
  }
  // The source is written by a queue of kernels on cuda:0's stream (a large fill, then repeated
  // in-place updates); the copy to cuda:1 runs on cuda:1's stream and must see their result, not
  // the memory before them.
  for (int round = 0; round < 3; ++round) {
    Tensor src = empty({64 << 20}, DType::f32, Device::cuda(0));  // 256 MiB
    fill_(src, 1.0);
    for (int k = 0; k < 8; ++k) fill_(src, 2.0 + k + round);
    const Tensor dst = src.to(Device::cuda(1));
    CHECK(dst.device() == Device::cuda(1));
    const std::vector<float> got = dst.to(Device::cpu()).to_vector<float>();
    const float want = static_cast<float>(9 + round);
    size_t bad = 0;
    for (float v : got) bad += v != want;
    CHECK_MESSAGE(bad == 0, bad, " of ", got.size(), " elements differ from ", want);
    // And back, from cuda:1's stream to cuda:0.
    Tensor back = empty(dst.shape(), DType::f32, Device::cuda(0));
    back.copy_from(dst);
    CHECK(back.to(Device::cpu()).to_vector<float>() == got);
  }
}
