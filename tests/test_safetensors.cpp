// safetensors reading/writing: round trips, metadata, and every kind of damaged file giving a
// clear regen::Error that names the file and the problem.
#include <doctest/doctest.h>

#include <unistd.h>
#include <cstdio>
#include <fstream>
#include <functional>

#include "regen/core/io.h"
#include "regen/core/safetensors.h"
#include "tests/test_util.h"

using namespace regen;
using regen::testing::error_of;

namespace {
std::string tmp_path(const std::string& name) {
  return "/tmp/regen_test_" + std::to_string(::getpid()) + "_" + name;
}

// A file with the given header JSON and data bytes.
void write_raw(const std::string& path, const std::string& header, const std::string& data) {
  std::string out;
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out += static_cast<char>((n >> (8 * i)) & 0xff);
  out += header + data;
  write_file_atomic(path, out);
}
}  // namespace

TEST_CASE("safetensors: round trip of every dtype with metadata") {
  const std::string path = tmp_path("rt.safetensors");
  Generator g(3);
  Tensor a = uniform({3, 4}, -1, 1, g);
  Tensor b = uniform({5}, -1, 1, g, DType::f64);
  Tensor c = from_vector<int32_t>({1, -2, 3}, {3});
  Tensor d = from_vector<int64_t>({7}, {});
  Tensor e = empty({0, 2});
  save_safetensors(path, {{"layer.weight", a}, {"b", b}, {"c", c}, {"d", d}, {"empty", e}},
                   {{"model", "test"}, {"step", "3"}});
  SafetensorsFile f = load_safetensors(path);
  REQUIRE(f.tensors.size() == 5);
  CHECK(f.find("layer.weight")->to_vector<float>() == a.to_vector<float>());
  CHECK(f.find("layer.weight")->shape() == Shape{3, 4});
  CHECK(f.find("b")->to_vector<double>() == b.to_vector<double>());
  CHECK(f.find("c")->to_vector<int32_t>() == c.to_vector<int32_t>());
  CHECK(f.find("d")->item<int64_t>() == 7);
  CHECK(f.find("d")->dim() == 0);
  CHECK(f.find("empty")->shape() == Shape{0, 2});
  CHECK(f.find("missing") == nullptr);
  CHECK(f.metadata.at("model") == "test");
  CHECK(f.metadata.at("step") == "3");
  // The header is JSON a Python reader understands: 8-byte length, then the object.
  const std::string raw = read_file(path);
  CHECK(raw[8] == '{');
  // No tensors and no metadata: still an object ("{}"), which this reader and torch's take (the
  // header was once JSON null, which none takes).
  save_safetensors(path, {});
  CHECK(read_file(path).substr(8, 2) == "{}");
  const SafetensorsFile none = load_safetensors(path);
  CHECK(none.tensors.empty());
  CHECK(none.metadata.empty());
  std::remove(path.c_str());
}

TEST_CASE(
    "safetensors: BF16 and F16 tensors round trip bitwise, under the dtype names torch writes") {
  const std::string path = tmp_path("half.safetensors");
  Generator g(5);
  const Tensor x = uniform({7, 3}, -100, 100, g);
  const Tensor b = x.to(DType::bf16), h = x.to(DType::f16);
  save_safetensors(path, {{"b", b}, {"h", h}});
  const std::string raw = read_file(path);
  CHECK(raw.find("\"dtype\":\"BF16\"") != std::string::npos);
  CHECK(raw.find("\"dtype\":\"F16\"") != std::string::npos);
  SafetensorsFile f = load_safetensors(path);
  REQUIRE(f.tensors.size() == 2);
  REQUIRE(f.find("b")->dtype() == DType::bf16);
  REQUIRE(f.find("h")->dtype() == DType::f16);
  CHECK(f.find("b")->nbytes() == 7 * 3 * 2);
  CHECK(f.find("b")->to(DType::f32).to_vector<float>() == b.to(DType::f32).to_vector<float>());
  CHECK(f.find("h")->to(DType::f32).to_vector<float>() == h.to(DType::f32).to_vector<float>());
  std::remove(path.c_str());
}

TEST_CASE("safetensors: writes are atomic and leave no temporary files") {
  const std::string path = tmp_path("atomic.safetensors");
  save_safetensors(path, {{"x", ones({4})}});
  save_safetensors(path, {{"x", zeros({8})}});
  CHECK(load_safetensors(path).find("x")->numel() == 8);
  CHECK_FALSE(std::ifstream(path + ".tmp." + std::to_string(::getpid())).good());
  std::remove(path.c_str());
  // Writing into a missing folder fails cleanly, naming the path.
  const std::string msg = error_of([] {
    save_safetensors("/nonexistent/dir/x.safetensors", {{"x", ones({1})}});
  });
  CHECK(msg.find("/nonexistent/dir/x.safetensors") != std::string::npos);
}

TEST_CASE("safetensors: damaged files give errors naming the file and the problem") {
  const std::string path = tmp_path("bad.safetensors");
  save_safetensors(path, {{"w", ones({16})}});
  const std::string good = read_file(path);

  // Truncated in the data.
  write_file_atomic(path, good.substr(0, good.size() - 10));
  std::string msg = error_of([&] { load_safetensors(path); });
  CHECK(msg.find(path) != std::string::npos);
  CHECK(msg.find("'w'") != std::string::npos);
  CHECK(msg.find("truncated") != std::string::npos);

  // Truncated in the header length.
  write_file_atomic(path, good.substr(0, 5));
  msg = error_of([&] { load_safetensors(path); });
  CHECK(msg.find("too short") != std::string::npos);

  // Header length larger than the file.
  std::string huge = good;
  huge[7] = 0x10;
  write_file_atomic(path, huge);
  msg = error_of([&] { load_safetensors(path); });
  CHECK(msg.find("exceeds the file size") != std::string::npos);

  // Not JSON.
  write_raw(path, "{not json", "");
  msg = error_of([&] { load_safetensors(path); });
  CHECK(msg.find("not valid JSON") != std::string::npos);

  // Unsupported dtype (U8: torch writes it for uint8 tensors), bad shape/offset agreement,
  // overlap.
  write_raw(path, R"({"x":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})", std::string(4, '\0'));
  msg = error_of([&] { load_safetensors(path); });
  CHECK(msg.find("unsupported dtype \"U8\" (F32, F64, I32, I64, BF16, F16 only)") !=
        std::string::npos);
  write_raw(path, R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})",
            std::string(8, '\0'));
  msg = error_of([&] { load_safetensors(path); });
  CHECK(msg.find("needs 12") != std::string::npos);
  write_raw(
      path,
      R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"y":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
      std::string(12, '\0'));
  msg = error_of([&] { load_safetensors(path); });
  CHECK(msg.find("overlap") != std::string::npos);
  write_raw(path, R"({"x":{"dtype":"F32","shape":[-1],"data_offsets":[0,0]}})", "");
  msg = error_of([&] { load_safetensors(path); });
  CHECK(msg.find("bad dimension") != std::string::npos);
  write_raw(path, R"({"x":{"dtype":"F32","shape":[1]}})", std::string(4, '\0'));
  msg = error_of([&] { load_safetensors(path); });
  CHECK(msg.find("lacks dtype, shape or data_offsets") != std::string::npos);
  msg = error_of([&] { load_safetensors(tmp_path("does_not_exist")); });
  CHECK(msg.find("cannot open") != std::string::npos);
  std::remove(path.c_str());
}

TEST_CASE("safetensors: duplicate or empty names are refused when writing") {
  const std::string path = tmp_path("dup.safetensors");
  CHECK(error_of([&] {
          save_safetensors(path, {{"a", ones({1})}, {"a", ones({1})}});
        }).find("appears twice") != std::string::npos);
  CHECK(error_of([&] {
          save_safetensors(path, {{"", ones({1})}});
        }).find("bad tensor name") != std::string::npos);
}
