// Tensors, dtypes, devices, byte parsing, errors and the Philox generator.
#include <doctest/doctest.h>

#include <cmath>

#include "core/philox.h"
#include "core/tensor.h"

using namespace regen;

TEST_CASE("philox4x32-10 matches the published known-answer vectors") {
  uint32_t o[4];
  philox4x32_10({0, 0, 0, 0}, {0, 0}, o);
  CHECK(o[0] == 0x6627e8d5u);
  CHECK(o[1] == 0xe169c58du);
  CHECK(o[2] == 0xbc57ac4cu);
  CHECK(o[3] == 0x9b00dbd8u);
  philox4x32_10({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, {0xffffffffu, 0xffffffffu},
                o);
  CHECK(o[0] == 0x408f276du);
  CHECK(o[1] == 0x41c83b0eu);
  CHECK(o[2] == 0xa20bc7c6u);
  CHECK(o[3] == 0x6d5451fdu);
  philox4x32_10({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, {0xa4093822u, 0x299f31d0u},
                o);
  CHECK(o[0] == 0xd16cfe09u);
  CHECK(o[1] == 0x94fdccebu);
  CHECK(o[2] == 0x5001e420u);
  CHECK(o[3] == 0x24126ea1u);
  // regen's stream layout: element i is word i%4 of block i/4.
  philox4x32_10({1, 0, 7, 0}, {42, 0}, o);
  CHECK(philox_word(42, 7, 4) == o[0]);
  CHECK(philox_word(42, 7, 7) == o[3]);
}

TEST_CASE("random tensors: same (seed, offset) gives the same numbers, and streams advance") {
  Generator g1(5), g2(5);
  Tensor a = uniform({1000}, -1.0, 1.0, g1);
  Tensor b = uniform({1000}, -1.0, 1.0, g2);
  CHECK(a.to_vector<float>() == b.to_vector<float>());
  CHECK(g1.offset == 1000);
  Tensor c = uniform({1000}, -1.0, 1.0, g1);  // continues the stream
  CHECK(a.to_vector<float>() != c.to_vector<float>());
  // Drawing 1000 then 1000 equals drawing 2000 at once.
  Generator g3(5);
  std::vector<float> both = uniform({2000}, -1.0, 1.0, g3).to_vector<float>();
  std::vector<float> cv = c.to_vector<float>();
  CHECK(std::equal(cv.begin(), cv.end(), both.begin() + 1000));
  // Statistics of a large sample.
  Generator g4(11);
  std::vector<double> n = normal({100000}, 2.0, 3.0, g4, DType::f64).to_vector<double>();
  double mean = 0, var = 0;
  for (double x : n) mean += x;
  mean /= n.size();
  for (double x : n) var += (x - mean) * (x - mean);
  var /= n.size();
  CHECK(mean == doctest::Approx(2.0).epsilon(0.02));
  CHECK(std::sqrt(var) == doctest::Approx(3.0).epsilon(0.02));
  std::vector<float> u = uniform({100000}, 0.0, 1.0, g4).to_vector<float>();
  float lo = 1, hi = 0;
  for (float x : u) {
    lo = std::min(lo, x);
    hi = std::max(hi, x);
  }
  CHECK(lo >= 0.0f);
  CHECK(hi < 1.0f);
  std::vector<int64_t> r = randint({10000}, 7, g4).to_vector<int64_t>();
  for (int64_t x : r) REQUIRE((x >= 0 && x < 7));
}

TEST_CASE("tensor creation, shapes and read-back") {
  Tensor z = zeros({2, 3});
  CHECK(z.shape() == Shape{2, 3});
  CHECK(z.dim() == 2);
  CHECK(z.size(-1) == 3);
  CHECK(z.numel() == 6);
  CHECK(z.nbytes() == 24);
  CHECK(z.str() == "f32[2, 3] on cpu");
  for (float v : z.to_vector<float>()) CHECK(v == 0.0f);
  CHECK(ones({4}, DType::f64).to_vector<double>() == std::vector<double>{1, 1, 1, 1});
  CHECK(full({3}, 2.5).to_vector<float>() == std::vector<float>{2.5f, 2.5f, 2.5f});
  CHECK(arange(4, DType::i64).to_vector<int64_t>() == std::vector<int64_t>{0, 1, 2, 3});
  CHECK(arange(1.0, 2.0, 0.25, DType::f64).to_vector<double>() ==
        std::vector<double>{1.0, 1.25, 1.5, 1.75});
  Tensor v = from_vector<int32_t>({1, 2, 3, 4, 5, 6}, {2, 3});
  CHECK(v.dtype() == DType::i32);
  CHECK(v.to(DType::f64).to_vector<double>() == std::vector<double>{1, 2, 3, 4, 5, 6});
  CHECK(from_vector<float>({3.5f}, {}).item<float>() == 3.5f);
  Tensor e = empty({0, 5});
  CHECK(e.numel() == 0);
  CHECK(e.to_vector<float>().empty());
}

TEST_CASE("reshape and narrow0 share storage but clone does not") {
  Tensor a = arange(12);
  Tensor b = a.reshape({3, -1});
  CHECK(b.shape() == Shape{3, 4});
  CHECK(b.raw_data() == a.raw_data());
  b.data<float>()[5] = 100.0f;
  CHECK(a.to_vector<float>()[5] == 100.0f);
  Tensor rows = b.narrow0(1, 2);
  CHECK(rows.shape() == Shape{2, 4});
  CHECK(rows.to_vector<float>()[0] == 4.0f);
  CHECK(rows.to_vector<float>()[1] == 100.0f);
  Tensor c = a.clone();
  CHECK(c.raw_data() != a.raw_data());
  CHECK(c.to_vector<float>() == a.to_vector<float>());
  Tensor d = zeros({12});
  d.copy_from(a);
  CHECK(d.to_vector<float>() == a.to_vector<float>());
}

TEST_CASE("bad input throws regen::Error naming shapes, dtypes and devices") {
  Tensor a = zeros({2, 3});
  try {
    a.reshape({4, 2});
    FAIL("no throw");
  } catch (const Error& e) {
    const std::string m = e.what();
    CHECK(m.find("reshape") != std::string::npos);
    CHECK(m.find("[2, 3]") != std::string::npos);
    CHECK(m.find("[4, 2]") != std::string::npos);
    CHECK(m.find("core/tensor.cpp:") != std::string::npos);
  }
  CHECK_THROWS_AS(a.reshape({-1, -1}), Error);
  CHECK_THROWS_AS(a.narrow0(1, 2), Error);
  CHECK_THROWS_AS(a.data<double>(), Error);
  try {
    a.data<int64_t>();
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("f32[2, 3] on cpu accessed as i64") != std::string::npos);
  }
  CHECK_THROWS_AS(zeros({2, -1}), Error);
  CHECK_THROWS_AS(Tensor().shape(), Error);
  CHECK_THROWS_AS(a.item<float>(), Error);
  CHECK_THROWS_AS(zeros({2}, DType::i64).set_requires_grad(true), Error);
  Tensor b = zeros({3, 2});
  CHECK_THROWS_AS(a.copy_from(b), Error);
  CHECK_THROWS_AS(from_vector<float>({1, 2, 3}, {2, 2}), Error);
}

TEST_CASE("devices parse and report, and cuda without a GPU build or device is a clear error") {
  CHECK(Device::parse("cpu") == Device::cpu());
  CHECK(Device::parse("cuda") == Device::cuda(0));
  CHECK(Device::parse("cuda:3") == Device::cuda(3));
  CHECK(Device::parse("cuda:1").str() == "cuda:1");
  CHECK_THROWS_AS(Device::parse("gpu"), Error);
  CHECK_THROWS_AS(Device::parse("cuda:x"), Error);
  CHECK_THROWS_AS(Device::parse("cuda:"), Error);
#ifndef REGEN_WITH_CUDA
  try {
    zeros({2}, DType::f32, Device::cuda(0));
    FAIL("no throw");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("without CUDA") != std::string::npos);
  }
#endif
}

TEST_CASE("byte counts parse and format") {
  CHECK(parse_bytes("2GiB") == 2ll << 30);
  CHECK(parse_bytes("512MiB") == 512ll << 20);
  CHECK(parse_bytes("1.5 GiB") == 3ll << 29);
  CHECK(parse_bytes("1GB") == 1000000000ll);
  CHECK(parse_bytes("4096") == 4096);
  CHECK_THROWS_AS(parse_bytes("lots"), Error);
  CHECK_THROWS_AS(parse_bytes("3 parsecs"), Error);
  CHECK_THROWS_AS(parse_bytes("-1GiB"), Error);
  CHECK(format_bytes(512) == "512 B");
  CHECK(format_bytes(3ll << 29) == "1.50 GiB");
}

TEST_CASE("tensor storage is tagged with the current category") {
  CachingAllocator& a = allocator_for(Device::cpu());
  const int64_t before = a.stats().allocated_by[static_cast<int>(Category::parameter)].current;
  {
    CategoryScope scope(Category::parameter);
    Tensor w = zeros({256, 256});
    CHECK(w.impl()->storage->category() == Category::parameter);
    CHECK(a.stats().allocated_by[static_cast<int>(Category::parameter)].current ==
          before + 256 * 256 * 4);
  }
  CHECK(a.stats().allocated_by[static_cast<int>(Category::parameter)].current == before);
}
