// The regen command line (tools/), run as a user would: the built binary (REGEN_BINARY) on bad
// inputs must exit non-zero with a message on stderr that names the mistake; good runs exit 0
// and print their summary; --save / --load round-trip. Also the validators of tools/common.h
// (compiled into this test) and the file helpers behind --save (core/io.h).
// Every run is short (transformer-tiny, a few steps) and writes only under a temporary folder in
// the build tree, removed at the end.
#include <doctest/doctest.h>

#include <dirent.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "regen/core/io.h"
#include "regen/core/safetensors.h"
#include "regen/remat/execute/dtr.h"
#include "regen/remat/execute/executor.h"
#include "regen/remat/plan/milp.h"
#include "regen/remat/plan/planner.h"
#include "regen/remat/profile/profiler.h"
#include "regen/remat/profile/transfer.h"
#include "tests/test_util.h"
#include "tools/common.h"

using namespace regen;
using regen::testing::error_of;

namespace {

struct TempDir {
  std::string path;
  TempDir() {
    char name[] = "./cli-XXXXXX";
    REQUIRE(::mkdtemp(name) != nullptr);
    path = std::filesystem::absolute(name).string();
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  std::string file(const std::string& name) const { return path + "/" + name; }
  std::vector<std::string> entries() const {
    std::vector<std::string> out;
    for (const auto& e : std::filesystem::directory_iterator(path)) {
      out.push_back(e.path().filename().string());
    }
    return out;
  }
};

struct Result {
  int status = -1;  // exit status, or -1 when the process did not exit normally
  std::string out, err;
};

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// Runs `regen ARGS` with stdout captured through a pipe and stderr through a file.
Result regen_run(const TempDir& dir, const std::vector<std::string>& args) {
  const std::string err_file = dir.file("stderr.txt");
  std::string cmd = quote(REGEN_BINARY);
  for (const std::string& a : args) cmd += " " + quote(a);
  cmd += " 2>" + quote(err_file);
  Result r;
  FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int st = ::pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  r.err = read_file(err_file);
  std::remove(err_file.c_str());
  return r;
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Every entry under `root` (recursively) with what it holds: a regular file's bytes, "<dir>",
// "<fifo>", "<other>". What a failed run must leave as it found it.
std::map<std::string, std::string> state_of(const std::string& root) {
  std::map<std::string, std::string> out;
  for (const auto& e : std::filesystem::recursive_directory_iterator(root)) {
    const std::string rel = std::filesystem::relative(e.path(), root).string();
    if (e.is_regular_file()) {
      out[rel] = read_file(e.path().string());
    } else {
      out[rel] = e.is_directory() ? "<dir>" : e.is_fifo() ? "<fifo>" : "<other>";
    }
  }
  return out;
}

std::string state_diff(const std::map<std::string, std::string>& before,
                       const std::map<std::string, std::string>& after) {
  std::string d;
  for (const auto& [k, v] : before) {
    const auto it = after.find(k);
    if (it == after.end())
      d += " removed " + k + ";";
    else if (it->second != v)
      d += " changed " + k + ";";
  }
  for (const auto& [k, v] : after) {
    if (!before.count(k)) d += " created " + k + ";";
  }
  return d;
}

// A failed run: non-zero exit, every part on stderr, no training output on stdout, and every file
// under the run's folder (its inputs and the outputs it was asked for) as it was before: nothing
// created, changed or removed.
void expect_failure(const TempDir& dir, const std::vector<std::string>& args,
                    const std::vector<std::string>& parts) {
  std::string line;
  for (const auto& a : args) line += a + " ";
  CAPTURE(line);
  const auto before = state_of(dir.path);
  const Result r = regen_run(dir, args);
  const std::string changed = state_diff(before, state_of(dir.path));
  CHECK_MESSAGE(changed.empty(), "the failed run touched files:", changed);
  CAPTURE(r.err);
  CAPTURE(r.out);
  CHECK((r.status == 1 || r.status == 2));  // a runtime or a usage error, never a crash
  for (const std::string& part : parts) CHECK_MESSAGE(has(r.err, part), "stderr lacks: ", part);
  CHECK(!has(r.out, "summary:"));
}

const std::vector<std::string> kTiny = {"train", "--model", "transformer-tiny", "--progress",
                                        "plain"};

std::vector<std::string> tiny(std::vector<std::string> more) {
  std::vector<std::string> args = kTiny;
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

int open_fds() {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    (void)e;
    ++n;
  }
  return n;
}

std::string validate(const CLI::Validator& v, std::string value) {
  return v(value);
}

}  // namespace

TEST_CASE("cli: mistakes in flags give one clear line and a non-zero exit") {
  TempDir dir;
  expect_failure(dir, {"train", "--model", "resnet7"}, {"unknown model 'resnet7'", "resnet152"});
  expect_failure(dir, tiny({"--batch", "0"}), {"--batch must be a positive integer, got 0"});
  expect_failure(dir, tiny({"--batch", "-3"}), {"--batch must be a positive integer, got -3"});
  expect_failure(dir, tiny({"--batch", "two"}), {"--batch", "'two' (not an integer)"});
  expect_failure(dir, tiny({"--steps", "-1"}), {"--steps must be a positive integer, got -1"});
  expect_failure(dir, tiny({"--lr", "nan"}), {"--lr must be a finite number >= 0, got nan"});
  expect_failure(dir, tiny({"--lr", "abc"}), {"--lr", "'abc' (not a number)"});
  expect_failure(dir, tiny({"--lr", "inf"}), {"--lr must be a finite number"});
  expect_failure(dir, tiny({"--dropout", "nan"}), {"--dropout must be a number from 0 to 0.99"});
  // The model's own options are checked against the model's ranges by the library's session
  // (SessionOptions::validate, which the Python module calls too: tests/python/test_errors.py).
  expect_failure(dir, tiny({"--dropout", "-0.5"}),
                 {"--dropout must be a number from 0 to 0.99, got -0.5"});
  expect_failure(dir, tiny({"--dropout", "1"}),
                 {"--dropout must be a number from 0 to 0.99, got 1"});
  expect_failure(dir, tiny({"--seq-len", "0"}), {"--seq-len must be a positive integer, got 0"});
  expect_failure(dir, tiny({"--seq-len", "1.5"}), {"--seq-len", "'1.5' (not an integer)"});
  expect_failure(dir, {"train", "--model", "resnet-tiny", "--image-size", "0"},
                 {"--image-size must be a positive integer, got 0"});
  expect_failure(dir, {"train", "--model", "resnet-tiny", "--num-classes", "0x10"},
                 {"--num-classes", "'0x10' (not an integer)"});
  expect_failure(dir, tiny({"--threads", "5000"}), {"--threads must be at most 1024, got 5000"});
  expect_failure(dir, tiny({"--optimizer", "adam"}),
                 {"--optimizer must be sgd or adamw, got 'adam'"});
  expect_failure(dir, tiny({"--conv", "fast"}), {"--conv must be native or cudnn, got 'fast'"});
  expect_failure(dir, tiny({"--compress", "bf17"}),
                 {"--compress must be none, bf16 or fp16, got 'bf17'"});
  expect_failure(dir, tiny({"--masks", "maybe"}), {"--masks", "maybe"});
  expect_failure(dir, tiny({"--momentum", "1.5"}), {"--momentum must be a number from 0 to 1"});
  expect_failure(dir, tiny({"--weight-decay", "-1"}), {"--weight-decay must be a finite number"});
  expect_failure(dir, tiny({"--seed", "-1"}), {"--seed must be a non-negative integer, got -1"});
  expect_failure(dir, tiny({"--threads", "0"}), {"--threads must be a positive integer"});
  expect_failure(dir, tiny({"--vocab", "0"}), {"--vocab must be an integer >= 2, got 0"});
  // A vocabulary of one token would train with a loss of 0: refused.
  expect_failure(dir, tiny({"--vocab", "1"}), {"--vocab must be an integer >= 2, got 1"});
  expect_failure(dir, tiny({"--device", "tpu"}), {"unknown device 'tpu'"});
  expect_failure(dir, {"train", "--model", "resnet-tiny", "--image-size", "8"},
                 {"--image-size 8 is too small"});
  expect_failure(dir, tiny({"--image-size", "64"}),
                 {"--image-size does not apply to model 'transformer-tiny'",
                  "its options: --seq-len, --vocab, --dropout, --lm-head-chunk"});
  expect_failure(dir, {"train", "--model", "resnet-tiny", "--vocab", "256"},
                 {"--vocab does not apply to model 'resnet-tiny'"});
  expect_failure(dir, tiny({"--lm-head-chunk", "-2"}),
                 {"--lm-head-chunk must be an integer from -1 to 2147483647, got -2"});
  expect_failure(dir, tiny({"--lm-head-chunk", "auto"}), {"--lm-head-chunk", "'auto'"});
  expect_failure(dir, {"train", "--model", "resnet-tiny", "--lm-head-chunk", "0"},
                 {"--lm-head-chunk does not apply to model 'resnet-tiny'"});
  expect_failure(dir, tiny({"--lm-head-recompute", "1", "--lm-head-chunk", "-1"}),
                 {"--lm-head-recompute 1 recomputes the fused LM head's logits",
                  "--lm-head-chunk -1 asks for the unfused head", "pass --lm-head-chunk 0"});
  expect_failure(dir,
                 {"estimate", "--model", "transformer-tiny", "--lm-head-recompute", "1",
                  "--lm-head-chunk", "-1"},
                 {"--lm-head-recompute 1 recomputes", "--lm-head-chunk -1"});
  expect_failure(dir, tiny({"--no-such-flag"}), {"--no-such-flag"});
  // Remat with every step spent profiling would have no step under the plan to measure.
  expect_failure(dir, tiny({"--policy", "mutwo", "--steps", "2"}),
                 {"--steps 2 leaves no step to run under the plan after 2 profiling step(s)"});
  expect_failure(dir, tiny({"--policy", "sqrt", "--steps", "3", "--profile-steps", "3"}),
                 {"--steps 3 leaves no step", "--profile-steps"});
  // Too large for memory: refused before anything is built, with the exact size from a dry run
  // of the first step (or the request no memory could serve), naming the flags to change.
  // Every batch is bounded (SessionOptions::kMaxBatch); below the bound, a batch far too large
  // is refused from two small dry runs at once, where its own would take minutes.
  expect_failure(dir, tiny({"--batch", "100000000000"}),
                 {"--batch must be at most 16777216, got 100000000000"});
  // Short sequences: the heads' attention requests one workspace whatever the batch, so the exact
  // dry run answers at once. Causal sequences past 256 run their heads one at a time, a request
  // each: there the size is grown from two small dry runs instead of minutes of requests.
  expect_failure(dir, tiny({"--batch", "16777216"}),
                 {"--batch 16777216 at --seq-len 16 is too large for memory",
                  "exact, from a dry run", "use a smaller --batch"});
  expect_failure(dir, tiny({"--batch", "16777216", "--seq-len", "512"}),
                 {"--batch 16777216 at --seq-len 512 is too large for memory",
                  "grown from dry runs at batch 2 and 3", "use a smaller --batch"});
  expect_failure(dir, tiny({"--batch", "16777216", "--seq-len", "1000000"}),
                 {"--batch 16777216 at --seq-len 1000000 is too large", "dry run"});
  expect_failure(
      dir, {"train", "--model", "resnet152", "--batch", "9999", "--steps", "1", "--device", "cpu"},
      {"--batch 9999 at --image-size 224 is too large for memory",
       "training step without remat needs ", "exact, from a dry run", "available",
       "use a smaller --batch or --image-size"});
  // Parameters alone past the memory: refused from the model built dry, before the step's dry
  // run (whose LM head would request its scratch tile by tile over two billion tokens: minutes).
  expect_failure(dir, tiny({"--vocab", "2000000000"}),
                 {"transformer-tiny does not fit in memory", "its parameters alone take",
                  "optimizer state come on top", "--vocab (now 2000000000)"});
  expect_failure(dir, {"train", "--model", "resnet152", "--batch", "2", "--image-size", "1000000"},
                 {"dry run", "--image-size 1000000", "too large"});
}

// The pre-flight dry run on the CPU: every tensor of the first step, parameters, gradients,
// optimizer state, the batch and every activation, and the scratch space the CPU kernels take for
// themselves (GEMM packing, im2col tiles, attention rows: each such launcher requests it in a dry
// run, kernels/kernels.h), is allocated as the real step allocates it, and nothing on the
// process's allocator. So the step's peak of allocated bytes and every category's peak, workspace
// included, are the real first step's (both families, both optimizers, the LM head fused and not,
// ResNet at two image sizes, several batch sizes).
TEST_CASE(
    "cli: the dry run of the first step is exact on the CPU: the peak and every category's, "
    "scratch included") {
  struct Case {
    const char* model;
    const char* optimizer;
    int64_t batch;
    int64_t image_size;     // ResNet
    int64_t lm_head_chunk;  // Transformer
  };
  const int64_t preset = -2;  // the preset's head
  for (const Case& c :
       {Case{"resnet-tiny", "sgd", 8, 64, preset}, Case{"resnet-tiny", "adamw", 3, 64, preset},
        Case{"resnet-tiny", "sgd", 2, 32, preset}, Case{"resnet-tiny", "adamw", 5, 32, preset},
        Case{"transformer-tiny", "adamw", 4, 0, preset},
        Case{"transformer-tiny", "sgd", 2, 0, preset}, Case{"transformer-tiny", "sgd", 3, 0, -1},
        Case{"transformer-tiny", "adamw", 1, 0, -1}}) {
    const std::string what = std::string(c.model) + " " + c.optimizer + " --batch " +
                             std::to_string(c.batch) +
                             (c.image_size ? " --image-size " + std::to_string(c.image_size) : "") +
                             (c.lm_head_chunk == -1 ? " --lm-head-chunk -1" : "");
    CAPTURE(what);
    SessionOptions m;
    m.model = c.model;
    m.optimizer = c.optimizer;
    m.batch = c.batch;
    m.device = "cpu";
    if (c.image_size) m.model_options["image_size"] = static_cast<double>(c.image_size);
    if (c.lm_head_chunk != preset)
      m.model_options["lm_head_chunk"] = static_cast<double>(c.lm_head_chunk);
    CachingAllocator& a = allocator_for(Device::cpu());
    a.empty_cache();
    REQUIRE(a.stats().live_blocks == 0);
    {
      const int64_t allocs = a.stats().num_allocs;
      const DryRunResult dry =
          dry_run_step(m.model_config(), m.batch, Device::cpu(), [](Model& model) {
            return std::unique_ptr<Optimizer>(
                std::make_unique<SGD>(model.parameters(), SGDOptions{}));
          });
      CHECK(a.stats().num_allocs == allocs);  // nothing on the real allocator
      CHECK(a.stats().live_blocks == 0);
      CHECK(dry.memory.allocated.peak > dry.persistent);
      CHECK(dry.persistent > 0);
    }
    auto s = make_session(m);
    const StepResult r = s->trainer->step();
    CHECK(std::isfinite(r.loss));
    CHECK(a.stats().allocated.current == s->preflight.persistent);
    const MemoryStats& dry = s->preflight.memory;
    const size_t ws = static_cast<size_t>(Category::workspace);
    CHECK(dry.allocated_by[ws].peak > 0);  // the GEMM, convolution and attention scratch
    CHECK(dry.allocated.peak == r.memory.allocated.peak);
    CHECK(dry.requested.peak == r.memory.requested.peak);
    for (int k = 0; k < kNumCategories; ++k) {
      CAPTURE(std::string(category_name(static_cast<Category>(k))));
      CHECK(dry.allocated_by[static_cast<size_t>(k)].peak ==
            r.memory.allocated_by[static_cast<size_t>(k)].peak);
      CHECK(dry.requested_by[static_cast<size_t>(k)].peak ==
            r.memory.requested_by[static_cast<size_t>(k)].peak);
      CHECK(dry.allocated_by_at_peak[static_cast<size_t>(k)] ==
            r.memory.allocated_by_at_peak[static_cast<size_t>(k)]);
    }
    MESSAGE(what, ": dry / real peak ", dry.allocated.peak, " / ", r.memory.allocated.peak,
            ", workspace ", dry.allocated_by[ws].peak, " / ", r.memory.allocated_by[ws].peak,
            ", persistent ", s->preflight.persistent);
  }
}

TEST_CASE("cli: budgets, limits, and outputs that are inputs, each other or not regular files") {
  TempDir dir;
  for (const char* b : {"0x10MiB", "1e3", "inf", "nan", "0x10%", "-5%", "12 apples"}) {
    expect_failure(dir, tiny({"--policy", "mutwo", "--budget", b}), {"--budget", "bad budget"});
  }
  expect_failure(dir, tiny({"--policy", "mutwo", "--budget", ""}), {"--budget", "is empty"});
  expect_failure(dir, tiny({"--threads", "300000"}),
                 {"--threads must be at most 1024, got 300000"});
  expect_failure(dir, tiny({"--threads", "2147483647"}), {"--threads must be at most 1024"});
  expect_failure(dir, {"train", "--model", "resnet-tiny", "--num-classes", "1"},
                 {"--num-classes must be an integer from 2"});
  expect_failure(dir, tiny({"--save", ""}), {"--save", "is empty: give a file name"});
  expect_failure(dir, {"frobnicate"}, {"unknown command 'frobnicate'", "train"});
  expect_failure(dir, {"train", "--model", "resnet-tiny", "--image-size", "1000000"},
                 {"--batch 4 at --image-size 1000000: a dry run of one resnet-tiny step fails",
                  "is too large", "use a smaller --batch or --image-size"});
  {
    // A side so large that batch x side x side would overflow: the batch-norm check holds, and
    // the dry run names the size.
    const Result r = regen_run(
        dir, {"train", "--model", "resnet-tiny", "--batch", "2", "--image-size", "1099511627776"});
    CHECK(r.status == 1);
    CHECK(has(r.err, "--batch 2 at --image-size 1099511627776"));
    CHECK(has(r.err, "too large"));
    CHECK_FALSE(has(r.err, "use --batch 2 or more"));
  }
  expect_failure(dir, {"train", "--model", "resnet-tiny", "--batch", "1"},
                 {"--batch 1 at --image-size 32", "use --batch 2 or more"});
  // (A build without CUDA says so first; one with CUDA names the device.)
  expect_failure(dir, {"train", "--model", "resnet-tiny", "--device", "cpu", "--conv", "cudnn"},
                 {"--conv cudnn", "CUDA"});
  expect_failure(dir, {"bench", "ops", "--only", "nosuchcase"},
                 {"--only 'nosuchcase' matches no case", "stem 7x7/2"});
  CHECK_FALSE(has(regen_run(dir, {"bench", "ops", "--only", "nosuchcase"}).out, "GFLOP/s"));
  {
    // A device that is not there fails before the benchmark's header, naming the flag (no
    // machine has 64 GPUs; builds without CUDA say so).
    const Result r = regen_run(dir, {"bench", "ops", "--device", "cuda:63"});
    CHECK(r.status != 0);
    CHECK(has(r.err, "--device cuda:63"));
    CHECK(!has(r.out, "# regen bench ops"));
  }
  expect_failure(dir,
                 {"sweep", "--model", "resnet-tiny", "--batches", "2,4,2", "--out", dir.file("sw")},
                 {"--batches '2,4,2' lists '2' twice"});
  // Outputs that are not regular files are never replaced.
  const std::string fifo = dir.file("fifo");
  REQUIRE(::mkfifo(fifo.c_str(), 0644) == 0);
  expect_failure(dir, tiny({"--save", fifo}),
                 {"--save", "is a FIFO; regen writes only regular files"});
  struct stat st;
  REQUIRE(::stat(fifo.c_str(), &st) == 0);
  CHECK(S_ISFIFO(st.st_mode));
  expect_failure(dir, tiny({"--save", "/dev/null"}), {"--save", "is a character device"});
  REQUIRE(::stat("/dev/null", &st) == 0);
  CHECK(S_ISCHR(st.st_mode));
  // plan: an output that is another output or the profile it reads.
  const Result prof = regen_run(
      dir, {"profile", "--model", "transformer-tiny", "--iterations", "1", "--out", dir.path});
  REQUIRE(prof.status == 0);
  const std::string profile = dir.file("profile.json"), before = read_file(profile);
  expect_failure(dir, {"plan", "--profile", profile, "--out", profile},
                 {"--out", "is the same file as --profile"});
  CHECK(read_file(profile) == before);
  const std::string same = dir.file("same.json");
  expect_failure(dir, {"plan", "--profile", profile, "--out", same, "--decisions", same},
                 {"--decisions", "is the same file as --out"});
  CHECK_FALSE(std::filesystem::exists(same));
  // The same file through another spelling of its folder.
  expect_failure(dir, {"plan", "--profile", profile, "--out", dir.path + "/./profile.json"},
                 {"is the same file as --profile"});
  CHECK(read_file(profile) == before);
  // train --save onto its own --profile.
  expect_failure(dir, tiny({"--policy", "mutwo", "--profile", profile, "--save", profile}),
                 {"--save", "is the same file as --profile"});
  CHECK(read_file(profile) == before);
  // A tiny percentage is a budget no plan meets, not no budget.
  const Result tinyb =
      regen_run(dir, {"plan", "--profile", profile, "--policy", "mutwo", "--budget", "0.00001%",
                      "--out", dir.file("p.json"), "--decisions", dir.file("d.csv")});
  CHECK(has(tinyb.out, "(1 B reserved)"));
  CHECK(has(tinyb.out, "cannot be met"));
  // A profile records the flags that shape the step; a run with others is refused, naming one.
  CHECK(has(read_file(profile), "\"--optimizer\": \"sgd\""));
  expect_failure(dir, tiny({"--optimizer", "adamw", "--profile", profile, "--policy", "mutwo"}),
                 {"--profile " + profile +
                      " was made with --optimizer sgd, but this run has --optimizer adamw",
                  "pass --optimizer sgd, or profile again"});
  expect_failure(dir, tiny({"--dropout", "0", "--profile", profile, "--policy", "mutwo"}),
                 {"was made with --dropout 0.1, but this run has --dropout 0"});
  // Another nonzero dropout has the same ops, saved masks and times: the profile plans it, and
  // the plan's prediction holds on every step.
  const Result other_p =
      regen_run(dir, tiny({"--dropout", "0.3", "--profile", profile, "--policy", "dp", "--budget",
                           "80%", "--budget-of", "allocated", "--steps", "2"}));
  CAPTURE(other_p.err);
  CHECK(other_p.status == 0);
  CHECK(has(other_p.out, "(exact on every one of the 2 steps under the plan)"));
  expect_failure(dir, tiny({"--lm-head-chunk", "-1", "--profile", profile, "--policy", "mutwo"}),
                 {"was made with --lm-head-chunk 0"});
  // A loaded plan reports the profile's no-remat peak (it printed 0 B).
  const Result planned = regen_run(
      dir, {"plan", "--profile", profile, "--policy", "mutwo", "--budget", "90%", "--budget-of",
            "allocated", "--out", dir.file("p.json"), "--decisions", dir.file("d.csv")});
  REQUIRE(planned.status == 0);
  const Result run =
      regen_run(dir, {"train", "--model", "transformer-tiny", "--profile", profile, "--plan",
                      dir.file("p.json"), "--steps", "2", "--progress", "none"});
  CAPTURE(run.err);
  CHECK(run.status == 0);
  CHECK(has(run.out, "(no remat "));
  CHECK_FALSE(has(run.out, "(no remat 0 B)"));
}

TEST_CASE("cli: bad data paths and files") {
  TempDir dir;
  expect_failure(dir, {"train", "--model", "resnet-tiny", "--data", "cifar10:/nonexistent"},
                 {"cifar10:/nonexistent", "cannot open"});
  write_file_atomic(dir.file("empty.txt"), "");
  expect_failure(dir, tiny({"--vocab", "256", "--data", "text:" + dir.file("empty.txt")}),
                 {"empty"});
  expect_failure(dir, tiny({"--vocab", "256", "--data", "text:" + dir.path}),
                 {"is a directory, not a regular file"});
  expect_failure(dir, tiny({"--vocab", "256", "--data", "text:" + dir.file("none.txt")}),
                 {"none.txt", "cannot open"});
  // Byte tokens need 256 vocabulary entries; the tiny preset has 101.
  write_file_atomic(dir.file("text.txt"), std::string(200, 'a') + " some text to read.\n");
  expect_failure(dir, tiny({"--data", "text:" + dir.file("text.txt")}),
                 {"vocabulary of 101", "--vocab 256"});
  expect_failure(dir, tiny({"--vocab", "100", "--data", "text:" + dir.file("text.txt")}),
                 {"vocabulary of 100", "--vocab 256 or more"});
  const Result ok = regen_run(dir, tiny({"--vocab", "256", "--data", "text:" + dir.file("text.txt"),
                                         "--steps", "2", "--batch", "2"}));
  CAPTURE(ok.err);
  CHECK(ok.status == 0);
  CHECK(has(ok.out, "bytes as byte tokens"));
  CHECK(has(ok.out, "summary:"));
}

TEST_CASE("cli: a good run exits 0 and prints the summary, and one step says so") {
  TempDir dir;
  const Result r = regen_run(dir, tiny({"--steps", "2", "--batch", "2"}));
  CAPTURE(r.err);
  CHECK(r.status == 0);
  CHECK(r.err.empty());
  CHECK(has(r.out, "training transformer-tiny"));
  CHECK(has(r.out, "step 2/2 loss"));
  CHECK(has(r.out, "summary: transformer-tiny on cpu, batch 2, 2 steps"));
  CHECK(has(r.out, "step time"));
  CHECK(has(r.out, " ms (the second step"));
  CHECK(has(r.out, "peak memory"));

  const Result one = regen_run(dir, tiny({"--steps", "1", "--batch", "2"}));
  CHECK(one.status == 0);
  CHECK(has(one.out, "a single step"));
  CHECK(has(one.out, "no later steps to take a median over"));
  CHECK(!has(one.out, "median of 1"));
}

// Under a plan every step is checked against the prediction, and the summary says so.
TEST_CASE("cli: train under a plan reports the prediction exact on every step under it") {
  TempDir dir;
  const Result r = regen_run(dir, tiny({"--steps", "6", "--batch", "4", "--policy", "dp",
                                        "--budget", "80%", "--budget-of", "allocated"}));
  CAPTURE(r.out);
  CAPTURE(r.err);
  CHECK(r.status == 0);
  // 2 profiling steps without remat, then 4 under the plan.
  CHECK(has(r.out, "(exact on every one of the 4 steps under the plan)"));
  const Result one = regen_run(dir, tiny({"--steps", "3", "--batch", "4", "--policy", "dp",
                                          "--budget", "80%", "--budget-of", "allocated"}));
  CHECK(one.status == 0);
  CHECK(has(one.out, "(exact on the one step under the plan)"));
}

// Offload from the command line: dp with every fate trains exactly, the host tier's peaks and the
// copies reported beside the prediction; regen bench copy writes a transfer model --transfer reads.
TEST_CASE(
    "cli: train with --offload all reports the host tier exact and bench copy writes a model") {
  TempDir dir;
  const Result r = regen_run(
      dir, tiny({"--steps", "4", "--batch", "4", "--policy", "dp", "--budget", "lowest",
                 "--budget-of", "allocated", "--offload", "all", "--transfer", "gbps:20"}));
  CAPTURE(r.out);
  CAPTURE(r.err);
  CHECK(r.status == 0);
  CHECK(has(r.out, "(exact on every one of the 2 steps under the plan)"));
  CHECK(has(r.out, "  host tier: predicted peak allocated"));
  CHECK(has(r.out, "the times say nothing of a GPU's"));
  const std::string json = dir.path + "/copy.json";
  const Result b =
      regen_run(dir, {"bench", "copy", "--sizes", "1MiB,2MiB", "--repeats", "1", "--json", json});
  CAPTURE(b.err);
  CHECK(b.status == 0);
  CHECK(has(b.out, "transfer model:"));
  CHECK(load_transfer(json).valid());
  const Result t = regen_run(
      dir, tiny({"--steps", "3", "--batch", "4", "--policy", "dp", "--budget", "lowest",
                 "--budget-of", "allocated", "--offload", "activations", "--transfer", json}));
  CAPTURE(t.err);
  CHECK(t.status == 0);
  const Result bad =
      regen_run(dir, tiny({"--steps", "3", "--policy", "dp", "--offload", "weights"}));
  CHECK(bad.status != 0);
  CHECK(has(bad.err, "--offload"));
  const Result bad_t = regen_run(
      dir, tiny({"--steps", "3", "--policy", "dp", "--offload", "all", "--transfer", "pcie5"}));
  CHECK(bad_t.status != 0);
  CHECK(has(bad_t.err, "--transfer 'pcie5': not profile, step:F"));
}

// A step whose loss is still finite can leave parameters that are not (here the update of step 1
// with lr 1e300 overflows float): training stops after that step, naming the tensor and index,
// before a later step or a save would carry them on.
TEST_CASE("cli: a parameter that stops being finite stops training at that step, named") {
  TempDir dir;
  const Result r = regen_run(dir, tiny({"--lr", "1e300", "--steps", "3", "--batch", "2", "--save",
                                        dir.file("never.safetensors")}));
  CAPTURE(r.err);
  CHECK(r.status == 1);
  CHECK(has(r.err, "training diverged: after step 1 the parameter '"));
  CHECK(has(r.err, "' holds "));
  CHECK(has(r.err, "at flat index"));
  CHECK(has(r.err, "lower --lr"));
  CHECK(!std::filesystem::exists(dir.file("never.safetensors")));
}

TEST_CASE("cli: a diverging loss stops with the step, the value and a hint") {
  TempDir dir;
  const Result r = regen_run(dir, tiny({"--lr", "1e30", "--steps", "5", "--batch", "2", "--save",
                                        dir.file("never.safetensors")}));
  CAPTURE(r.out);
  CHECK(r.status == 1);
  CHECK(has(r.err, "the loss of step 2 is"));
  CHECK(has(r.err, "nan"));
  CHECK(has(r.err, "lower --lr"));
  CHECK(!has(r.out, "summary:"));
  CHECK(!std::filesystem::exists(dir.file("never.safetensors")));  // a diverged model is not saved
}

TEST_CASE("cli: --save is checked before training, and --save then --load round-trips") {
  TempDir dir;
  // A typo in the folder fails at once, before any step.
  const Result bad = regen_run(dir, tiny({"--save", dir.file("no/such/dir/m.safetensors")}));
  CHECK(bad.status == 1);
  CHECK(has(bad.err, "--save"));
  CHECK(has(bad.err, "does not exist"));
  CHECK(!has(bad.out, "step 1"));
  expect_failure(dir, tiny({"--save", dir.path}), {"is a directory"});

  const std::string ckpt = dir.file("tiny.safetensors");
  const Result save = regen_run(dir, tiny({"--steps", "2", "--batch", "2", "--save", ckpt}));
  CAPTURE(save.err);
  REQUIRE(save.status == 0);
  CHECK(has(save.out, "saved " + ckpt));
  const SafetensorsFile f = load_safetensors(ckpt);
  CHECK(f.metadata.at("model") == "transformer-tiny");
  CHECK(f.metadata.at("format") == "regen-checkpoint-1");
  CHECK(f.metadata.at("vocab") == "101");
  // Only the checkpoint (and no temporary file) is left beside it.
  CHECK(dir.entries() == std::vector<std::string>{"tiny.safetensors"});

  const Result load = regen_run(dir, tiny({"--steps", "1", "--batch", "2", "--load", ckpt}));
  CAPTURE(load.err);
  CHECK(load.status == 0);
  CHECK(has(load.out, "loaded " + ckpt + " (" + std::to_string(f.tensors.size()) + " tensors)"));
  CHECK(has(load.out, "summary:"));

  // Another model's checkpoint names both models; another --vocab names the flag.
  expect_failure(
      dir, {"train", "--model", "resnet-tiny", "--load", ckpt},
      {"checkpoint " + ckpt + " was saved from model transformer-tiny, not resnet-tiny"});
  expect_failure(dir, tiny({"--vocab", "300", "--load", ckpt}),
                 {"with --vocab 101", "has 300", "pass --vocab 101"});

  // A checkpoint without metadata: the name listing, led by the count of matches.
  const std::string bare = dir.file("bare.safetensors");
  save_safetensors(bare, {{"conv1.weight", zeros({8, 3, 7, 7})}});
  expect_failure(dir, tiny({"--load", bare}),
                 {"names no model", "0 of the model's 28 names match", "missing 28 entries",
                  "1 entry unexpected: conv1.weight"});

  // A checkpoint with a NaN weight: refused with the tensor and the index.
  {
    SafetensorsFile g = load_safetensors(ckpt);
    REQUIRE(g.tensors.size() > 2);
    Tensor& t = g.tensors[2].second;
    REQUIRE(t.dtype() == DType::f32);
    REQUIRE(t.numel() > 3);
    t.data<float>()[3] = std::nanf("");
    const std::string nan_ckpt = dir.file("nan.safetensors");
    save_safetensors(nan_ckpt, g.tensors, g.metadata);
    expect_failure(
        dir, tiny({"--batch", "2", "--load", nan_ckpt}),
        {"nan.safetensors", "tensor '" + g.tensors[2].first + "' holds nan at flat index 3",
         "weights must be finite"});
  }

  // A truncated checkpoint.
  const std::string raw = read_file(ckpt);
  const std::string cut = dir.file("cut.safetensors");
  write_file_atomic(cut, raw.substr(0, raw.size() / 2));
  expect_failure(dir, tiny({"--load", cut}), {"cut.safetensors", "truncated"});
  expect_failure(dir, tiny({"--load", dir.file("missing.safetensors")}), {"missing.safetensors"});
}

TEST_CASE("cli: exit status 2 for a usage error, 1 for a failed run, 0 for success and --help") {
  TempDir dir;
  auto status = [&](const std::vector<std::string>& args) { return regen_run(dir, args).status; };
  CHECK(status({"train", "--model", "resnet-tiny", "--threads", "300000"}) == 2);
  CHECK(status({"train", "--model", "resnet-tiny", "--batch", "-1"}) == 2);
  CHECK(status({"train", "--model", "resnet-tiny", "--bogus"}) == 2);
  CHECK(status({"no-such-command"}) == 2);
  CHECK(status({"train", "--model", "resnet7"}) == 1);  // the library refuses it while running
  CHECK(status({"train", "--help"}) == 0);
  CHECK(status({"--help"}) == 0);
  const Result help = regen_run(dir, {"train", "--help"});
  CHECK(has(help.out, "Exit status: 0 on success, 1 when a run fails"));
  CHECK(has(help.out, "2 for a usage error"));
}

// The list flags of sweep and frontier: each item a value, listed once; numbers are decimal.
TEST_CASE("cli: list flags and numbers are read strictly") {
  TempDir dir;
  const std::string out = dir.file("sw");
  auto sweep = [&](std::vector<std::string> more) {
    std::vector<std::string> a = {"sweep", "--model", "resnet-tiny", "--out", out};
    a.insert(a.end(), more.begin(), more.end());
    return a;
  };
  expect_failure(dir, sweep({"--batches", "2abc"}),
                 {"--batches '2abc': each item must be a positive integer, got '2abc'"});
  expect_failure(dir, sweep({"--batches", "2.9"}), {"--batches '2.9'", "'2.9' (not an integer)"});
  expect_failure(dir, sweep({"--batches", "2,,4"}), {"--batches '2,,4' has an empty item"});
  expect_failure(dir, sweep({"--batches", ""}), {"--batches is empty"});
  expect_failure(dir, sweep({"--batches", "2", "--budgets", "50%,50%"}),
                 {"--budgets '50%,50%' lists '50%' twice"});
  expect_failure(dir, sweep({"--batches", "2", "--policies", "mutwo,mutwo"}),
                 {"--policies 'mutwo,mutwo' lists 'mutwo' twice"});
  expect_failure(dir, {"frontier", "--model", "resnet-tiny", "--out", out, "--policies", ""},
                 {"--policy is empty: give one or more comma-separated planners"});
  // strtod would read hexadecimal: 0x10 as 16.
  expect_failure(dir, tiny({"--lr", "0x10"}), {"--lr", "'0x10' (not a number)"});
  expect_failure(dir, tiny({"--dropout", "0x0.1p0"}), {"--dropout", "(not a number)"});
  expect_failure(dir, tiny({"--lr", "1e"}), {"--lr", "'1e' (not a number)"});
  const Result ok = regen_run(dir, tiny({"--lr", "1.5e-2", "--steps", "1", "--batch", "2"}));
  CHECK(ok.status == 0);
}

// A planned layout places a plan's blocks: without a plan, or against the plan's own, it is an
// error rather than ignored.
TEST_CASE("cli: --layout planned needs a plan and agrees with a loaded one") {
  TempDir dir;
  expect_failure(dir, tiny({"--layout", "planned"}), {"--layout planned", "give --policy"});
  expect_failure(dir, tiny({"--layout", "planned", "--policy", "dtr", "--budget", "90%"}),
                 {"--layout planned", "dtr", "use --layout caching"});
  const std::string profile_dir = dir.file("prof");
  REQUIRE(std::filesystem::create_directory(profile_dir));
  REQUIRE(regen_run(dir, {"profile", "--model", "transformer-tiny", "--out", profile_dir}).status ==
          0);
  const std::string profile = profile_dir + "/profile.json", plan = dir.file("p.json");
  const Result planned =
      regen_run(dir, {"plan", "--profile", profile, "--policy", "dp", "--budget", "90%",
                      "--budget-of", "allocated", "--out", plan, "--decisions", dir.file("d.csv")});
  REQUIRE(planned.status == 0);
  {
    // The summary counts the programs the replays run in: one per backward node that needs any.
    std::smatch m;
    REQUIRE(std::regex_search(planned.out, m,
                              std::regex("in ([0-9]+) op replays in ([0-9]+) programs")));
    const long replays = std::stol(m[1]), programs = std::stol(m[2]);
    CHECK(replays > 0);
    CHECK(programs > 0);
    CHECK(programs <= replays);
  }
  expect_failure(dir, tiny({"--profile", profile, "--plan", plan, "--layout", "planned"}),
                 {"--layout planned contradicts --plan", "made without a planned layout"});
  const Result same = regen_run(
      dir, tiny({"--profile", profile, "--plan", plan, "--layout", "caching", "--steps", "2"}));
  CAPTURE(same.err);
  CHECK(same.status == 0);
}

// Outputs are never written over the run's own training data, and --save may replace the
// checkpoint it started from (read whole before the first step, replaced atomically after the
// last).
TEST_CASE(
    "cli: outputs are checked against --data's files, and --load X --save X trains on in place") {
  TempDir dir;
  const std::string text = dir.file("corpus.txt");
  write_file_atomic(text, std::string(4000, 'a') + "the quick brown fox jumps over the lazy dog");
  const std::string before = read_file(text);
  expect_failure(dir,
                 tiny({"--data", "text:" + text, "--vocab", "256", "--steps", "1", "--save", text}),
                 {"--save " + text + " is the same file as --data"});
  CHECK(read_file(text) == before);
  expect_failure(dir,
                 {"bench", "train", "--model", "transformer-tiny", "--data", "text:" + text,
                  "--vocab", "256", "--steps", "1", "--warmup", "0", "--json", text},
                 {"--json " + text + " is the same file as --data"});
  CHECK(read_file(text) == before);
  // A CIFAR-10 folder: each of its batch files is an input.
  const std::string cifar = dir.file("cifar");
  REQUIRE(std::filesystem::create_directory(cifar));
  std::string batch(3073 * 4, '\0');
  for (size_t i = 0; i < batch.size(); i += 3073) batch[i] = static_cast<char>(i / 3073);
  write_file_atomic(cifar + "/data_batch_1.bin", batch);
  expect_failure(dir,
                 {"train", "--model", "resnet-tiny", "--batch", "2", "--steps", "1", "--data",
                  "cifar10:" + cifar, "--save", cifar + "/data_batch_1.bin"},
                 {"is the same file as --data"});
  CHECK(read_file(cifar + "/data_batch_1.bin") == batch);

  const std::string ckpt = dir.file("m.safetensors");
  REQUIRE(regen_run(dir, tiny({"--steps", "1", "--batch", "2", "--save", ckpt})).status == 0);
  const std::string first = read_file(ckpt);
  const Result on =
      regen_run(dir, tiny({"--steps", "1", "--batch", "2", "--load", ckpt, "--save", ckpt}));
  CAPTURE(on.err);
  CHECK(on.status == 0);
  CHECK(has(on.out, "loaded " + ckpt));
  CHECK(read_file(ckpt) != first);  // one more step's parameters
  std::vector<std::string> left = dir.entries();
  std::sort(left.begin(), left.end());
  CHECK(left == std::vector<std::string>{"cifar", "corpus.txt", "m.safetensors"});
}

// --save through a symbolic link writes the file it leads to and keeps the link; a temporary a
// killed writer left is swept by the next write to the same target.
TEST_CASE("cli: --save through a symbolic link, and a killed writer's temporary swept") {
  TempDir dir;
  const std::string real = dir.file("real.safetensors"), link = dir.file("link.safetensors");
  std::filesystem::create_symlink(real, link);
  const Result dangling = regen_run(dir, tiny({"--steps", "1", "--batch", "2", "--save", link}));
  CHECK(dangling.status == 1);
  CHECK(has(dangling.err, "symbolic link that leads to no file"));
  write_file_atomic(real, "old");
  const Result r = regen_run(dir, tiny({"--steps", "1", "--batch", "2", "--save", link}));
  CAPTURE(r.err);
  REQUIRE(r.status == 0);
  CHECK(std::filesystem::is_symlink(link));
  CHECK(read_file(real) != "old");
  CHECK(load_safetensors(link).metadata.at("model") == "transformer-tiny");
  // A temporary of a process that no longer exists (pid 2^22 + 1 is above Linux's pid_max
  // default, 2^22) beside the target, and one of a live process (this one), which stays.
  const std::string dead = real + ".tmp.4194305.0";
  const std::string live = real + ".tmp." + std::to_string(::getpid()) + ".7";
  write_file_atomic(dead, "left by a killed writer");
  write_file_atomic(live, "being written");
  REQUIRE(regen_run(dir, tiny({"--steps", "1", "--batch", "2", "--save", real})).status == 0);
  CHECK_FALSE(std::filesystem::exists(dead));
  CHECK(std::filesystem::exists(live));
}

TEST_CASE("cli: --help lists every flag") {
  TempDir dir;
  const Result r = regen_run(dir, {"train", "--help"});
  CHECK(r.status == 0);
  for (const char* flag :
       {"--model",    "--batch",         "--device",   "--image-size",    "--num-classes",
        "--seq-len",  "--vocab",         "--dropout",  "--optimizer",     "--lr",
        "--momentum", "--weight-decay",  "--seed",     "--threads",       "--data",
        "--conv",     "--tf32",          "--math",     "--steps",         "--save",
        "--load",     "--policy",        "--budget",   "--chain",         "--profile",
        "--plan",     "--profile-steps", "--progress", "--lm-head-chunk", "--precision"}) {
    CHECK_MESSAGE(has(r.out, flag), "train --help lacks ", flag);
  }
  const Result b = regen_run(dir, {"bench", "train", "--help"});
  CHECK(b.status == 0);
  for (const char* flag : {"--model", "--batch", "--vocab", "--warmup", "--steps", "--json",
                           "--torch-csv", "--threads", "--math", "--tf32", "--precision"}) {
    CHECK_MESSAGE(has(b.out, flag), "bench train --help lacks ", flag);
  }
  const Result all = regen_run(dir, {"--help-all"});
  CHECK(all.status == 0);
  for (const char* cmd : {"train", "profile", "plan", "sweep", "frontier", "bench"}) {
    CHECK(has(all.out, cmd));
  }
}

TEST_CASE("cli: bench train prints what it measured and writes --json atomically") {
  TempDir dir;
  const std::string json = dir.file("bench.json");
  const Result r =
      regen_run(dir, {"bench", "train", "--model", "transformer-tiny", "--batch", "2", "--warmup",
                      "1", "--steps", "3", "--threads", "1", "--json", json});
  CAPTURE(r.err);
  REQUIRE(r.status == 0);
  CHECK(has(r.out, "transformer-tiny batch 2"));
  CHECK(has(r.out, "on cpu, 1 threads"));
  CHECK(has(r.out, "--seq-len 16, --vocab 101"));
  CHECK(has(r.out, "median"));
  CHECK(has(r.out, " ms, min "));
  CHECK(has(r.out, "samples/s"));
  CHECK(has(r.out, "peak allocated"));
  CHECK(has(r.out, "tools/torch_baseline.py has no peer"));  // it has no tiny presets
  const std::string j = read_file(json);
  for (const char* key : {"\"model\": \"transformer-tiny\"", "\"batch\": 2", "\"device\": \"cpu\"",
                          "\"threads\": 1", "\"seq_len\": 16", "\"step_s\": ", "\"step_min_s\": ",
                          "\"samples_per_s\": ", "\"peak_bytes\": ", "\"math\": \"fp32\""}) {
    CHECK_MESSAGE(has(j, key), "json lacks ", key);
  }
  CHECK(dir.entries() == std::vector<std::string>{"bench.json"});

  // The ratio against tools/torch_baseline.py's CSV.
  const std::string csv = dir.file("torch.csv");
  write_file_atomic(csv,
                    "model,batch,mode,math,step_s,peak_bytes,error\n"
                    "transformer-tiny,2,eager,fp32,0.001000,,\n");
  const Result c = regen_run(dir, {"bench", "train", "--model", "transformer-tiny", "--batch", "2",
                                   "--warmup", "0", "--steps", "1", "--torch-csv", csv});
  CHECK(c.status == 0);
  CHECK(has(c.out, "regen / PyTorch = "));
  // As tools/torch_baseline.py writes it: Python's csv rows end in "\r\n", after the autocast
  // column.
  const std::string crlf = dir.file("torch_crlf.csv");
  write_file_atomic(
      crlf,
      "model,batch,mode,math,step_s,peak_bytes,peak_kind,live_before_bytes,"
      "base_bytes,step_min_s,step_cpu_s,memory_budget,error,autocast\r\n"
      "transformer-tiny,2,eager,fp32,0.002000,1,heap_peak,1,1,0.002,0.004,,,none\r\n");
  const Result cr = regen_run(dir, {"bench", "train", "--model", "transformer-tiny", "--batch", "2",
                                    "--warmup", "0", "--steps", "1", "--torch-csv", crlf});
  CAPTURE(cr.err);
  CHECK(cr.status == 0);
  CHECK(has(cr.out, "median step 2.000 ms; regen / PyTorch = "));
  // A file without this run's row, or with a step that is not a number, is refused before any
  // step runs.
  const Result other = regen_run(dir, {"bench", "train", "--model", "transformer-tiny", "--batch",
                                       "3", "--warmup", "0", "--steps", "1", "--torch-csv", csv});
  CHECK(other.status == 1);
  CHECK(has(other.err, "has no eager fp32 row (autocast none) for transformer-tiny batch 3"));
  CHECK_FALSE(has(other.out, "step time"));
  // Decimal only, as every number flag: strtod alone would read "0x1p-9" as 2 ms.
  const std::string bad = dir.file("bad.csv");
  for (const std::string step : {"fast", "0x1p-9"}) {
    const std::string row = "transformer-tiny,2,eager,fp32," + step + ",,";
    write_file_atomic(bad, "model,batch,mode,math,step_s,peak_bytes,error\n" + row + "\n");
    expect_failure(dir,
                   {"bench", "train", "--model", "transformer-tiny", "--batch", "2", "--warmup",
                    "0", "--steps", "1", "--torch-csv", bad},
                   {"--torch-csv", "bad.csv", "'" + row + "'", "not a positive number of seconds"});
  }
  expect_failure(dir, {"bench", "train", "--json", dir.file("no/dir.json")}, {"--json"});

  // For a preset tools/torch_baseline.py knows, the command that measures PyTorch alike.
  const Result peer =
      regen_run(dir, {"bench", "train", "--model", "transformer", "--seq-len", "4", "--batch", "1",
                      "--warmup", "0", "--steps", "1", "--threads", "2"});
  CAPTURE(peer.err);
  CHECK(peer.status == 0);
  CHECK(has(peer.out,
            "python3 tools/torch_baseline.py --device cpu --threads 2 --model "
            "transformer --batches 1 --seq-len 4 --dropout 0.1 --lr 0.1 --modes eager "
            "--math fp32 --autocast none --warmup 0 --steps 1 --csv torch.csv"));
  // In bf16, PyTorch's peer trains under autocast, and a CSV row without autocast is not it.
  const Result bf16 =
      regen_run(dir, {"bench", "train", "--model", "transformer", "--seq-len", "4", "--batch", "1",
                      "--warmup", "0", "--steps", "1", "--threads", "2", "--precision", "bf16"});
  CAPTURE(bf16.err);
  CHECK(bf16.status == 0);
  CHECK(has(bf16.out, "precision bf16"));
  CHECK(has(bf16.out, "--math fp32 --autocast bf16 --warmup 0"));
}

namespace {

std::vector<std::string> split_csv_line(const std::string& line) {
  std::vector<std::string> out(1);
  for (char ch : line) {
    if (ch == ',') {
      out.emplace_back();
    } else {
      out.back() += ch;
    }
  }
  return out;
}

// A CSV file as rows of named fields (every row as wide as the header); `header_out`, when given,
// receives the header in column order.
std::vector<std::map<std::string, std::string>> csv_rows(
    const std::string& path, std::vector<std::string>* header_out = nullptr) {
  std::vector<std::map<std::string, std::string>> rows;
  std::vector<std::string> header;
  size_t start = 0;
  const std::string text = read_file(path);
  while (start < text.size()) {
    const size_t end = text.find('\n', start);
    REQUIRE(end != std::string::npos);  // every line ends
    const std::vector<std::string> fields = split_csv_line(text.substr(start, end - start));
    start = end + 1;
    if (header.empty()) {
      header = fields;
      continue;
    }
    REQUIRE(fields.size() == header.size());
    std::map<std::string, std::string> row;
    for (size_t i = 0; i < fields.size(); ++i) row[header[i]] = fields[i];
    rows.push_back(std::move(row));
  }
  REQUIRE(!header.empty());
  if (header_out) *header_out = header;
  return rows;
}

// frontier.csv as rows of named fields, with every column the frontier writes.
std::vector<std::map<std::string, std::string>> read_csv(const std::string& path) {
  std::vector<std::string> header;
  auto rows = csv_rows(path, &header);
  for (const char* col : {"model",
                          "batch",
                          "device",
                          "threads",
                          "policy",
                          "budget_bytes",
                          "budget_fraction",
                          "feasible",
                          "predicted_peak_allocated",
                          "predicted_peak_reserved",
                          "predicted_ms",
                          "profiled_ms",
                          "overhead_pct",
                          "recompute_ms",
                          "replays",
                          "recomputed",
                          "planning_ms",
                          "executed",
                          "measured_peak_allocated",
                          "measured_peak_reserved",
                          "measured_ms",
                          "exact"}) {
    CHECK_MESSAGE(std::count(header.begin(), header.end(), col) == 1, "no column ", col);
  }
  return rows;
}

}  // namespace

TEST_CASE("cli: frontier checks compare feasible plans only, DTR's infeasible points included") {
  TempDir dir;
  const Result prof = regen_run(
      dir, {"profile", "--model", "transformer-tiny", "--batch", "64", "--out", dir.path});
  REQUIRE(prof.status == 0);
  const std::string out = dir.file("fr");
  // Reserved budgets down to the allocated lower bound: DTR cannot meet the lowest ones, and its
  // "plan" there is the plain step, whose peak is above the last feasible plan's. That is no peak
  // rising as the budget falls: only plans that run are compared.
  const Result r = regen_run(
      dir, {"frontier", "--profile", dir.file("profile.json"), "--points", "6", "--execute", "0",
            "--policies", "dtr", "--model", "transformer-tiny", "--batch", "64", "--out", out});
  CAPTURE(r.err);
  CAPTURE(r.out);
  REQUIRE(r.status == 0);
  int64_t last_feasible = -1;
  bool above = false;  // an infeasible point predicted above the feasible one before it
  for (const auto& row : read_csv(out + "/frontier.csv")) {
    if (row.at("policy") != "dtr") continue;
    const int64_t peak = std::stoll(row.at("predicted_peak_reserved"));
    if (row.at("feasible") == "1") {
      last_feasible = peak;
    } else if (last_feasible >= 0 && peak > last_feasible) {
      above = true;
    }
  }
  CHECK(above);  // the case this test is about occurs
  CHECK(has(r.out, "dtr: monotone"));
}

TEST_CASE("cli: --grad-norm: a metrics log and a profile agree on the gradient norm, or say how") {
  TempDir dir;
  const std::vector<std::string> model = {"--model", "transformer-tiny", "--batch", "2"};
  auto with = [&](std::vector<std::string> head, const std::vector<std::string>& more) {
    head.insert(head.end(), model.begin(), model.end());
    head.insert(head.end(), more.begin(), more.end());
    return head;
  };
  const std::string plain = dir.file("plain"), normed = dir.file("normed");
  REQUIRE(regen_run(dir, with({"profile"}, {"--iterations", "1", "--out", plain})).status == 0);
  REQUIRE(
      regen_run(dir, with({"profile"}, {"--iterations", "1", "--grad-norm", "on", "--out", normed}))
          .status == 0);
  const std::string log = dir.file("m.csv");
  const std::vector<std::string> planned = {"--policy",    "dp",        "--budget", "90%",
                                            "--budget-of", "allocated", "--steps",  "2"};
  auto planned_from = [&](const std::string& folder, std::vector<std::string> more) {
    std::vector<std::string> args = planned;
    args.push_back("--profile");
    args.push_back(folder + "/profile.json");
    args.insert(args.end(), more.begin(), more.end());
    return with({"train"}, args);
  };
  // --log computes the norm for its column: a profile without it is refused, naming both ways out.
  expect_failure(dir, planned_from(plain, {"--log", log}),
                 {"gradient norm not computed", "--log", "pass --grad-norm off",
                  "profile again with --grad-norm on"});
  // Either way out runs, planned exactly.
  for (const auto& args : {planned_from(plain, {"--log", log, "--grad-norm", "off"}),
                           planned_from(normed, {"--log", log})}) {
    const Result r = regen_run(dir, args);
    CAPTURE(r.err);
    REQUIRE(r.status == 0);
    CHECK(has(r.out, "exact on every one"));
  }
  // A refused run leaves an existing log as it was (it is opened at the first step's row).
  expect_failure(dir, planned_from(plain, {"--log", log}), {"pass --grad-norm off"});
  // The other direction, and a bad value.
  expect_failure(dir, planned_from(normed, {}),
                 {"gradient norm computed", "profile again with --grad-norm off"});
  expect_failure(dir, with({"profile"}, {"--grad-norm", "yes", "--out", dir.file("x")}),
                 {"--grad-norm", "{on,off}"});
}

TEST_CASE("cli: frontier plans every policy from the lower bound to the no-remat peak") {
  TempDir dir;
  const Result prof =
      regen_run(dir, {"profile", "--model", "transformer-tiny", "--batch", "2", "--out", dir.path});
  CAPTURE(prof.err);
  REQUIRE(prof.status == 0);
  const std::string profile = dir.file("profile.json");
  const std::string out = dir.file("fr");  // created by the command
  // Allocated-byte budgets: a model this small reserves two 2 MiB segments whatever it plans.
  const Result r = regen_run(dir, {"frontier", "--profile", profile, "--points", "5", "--execute",
                                   "1", "--model", "transformer-tiny", "--batch", "2", "--steps",
                                   "2", "--budget-of", "allocated", "--out", out});
  CAPTURE(r.err);
  CAPTURE(r.out);
  REQUIRE(r.status == 0);
  CHECK(has(r.out, "frontier of transformer-tiny batch 2 on cpu"));
  CHECK(has(r.out, "frontier checks"));
  CHECK(has(r.out, "no remat: peak"));
  CHECK(!has(r.out, "DIFFERS"));

  // The default: every planner but the MILP, and but DTR's, which bound reserved bytes only.
  std::vector<std::string> planners;
  for (const std::string& n : policy_names()) {
    if (n != "none" && n != "milp" && !dtr_policy(n)) planners.push_back(n);
  }
  const auto rows = read_csv(out + "/frontier.csv");
  REQUIRE(rows.size() == 5 * planners.size() + 2);  // + the no-remat and lower-bound rows
  CHECK(rows[0].at("policy") == "none");
  CHECK(rows[1].at("policy") == "lower_bound");
  const int64_t peak = std::stoll(rows[0].at("predicted_peak_allocated"));
  const int64_t bound = std::stoll(rows[1].at("predicted_peak_allocated"));
  CHECK(bound > 0);
  CHECK(bound <= peak);
  CHECK(rows[0].at("executed") == "1");
  CHECK(rows[0].at("exact") == "1");
  for (const auto& row : rows) {
    CHECK(row.at("budget_of") == "allocated");
    CHECK(row.at("model") == "transformer-tiny");
    CHECK(row.at("batch") == "2");
    CHECK(row.at("device") == "cpu");
  }
  int executed = 0;
  for (size_t k = 0; k < planners.size(); ++k) {
    CAPTURE(planners[k]);
    bool any_feasible = false, any_executed = false;
    int64_t last = -1;
    for (size_t i = 0; i < 5; ++i) {
      const auto& row = rows[2 + 5 * k + i];
      REQUIRE(row.at("policy") == planners[k]);
      // Budgets evenly spaced, falling from the no-remat peak to the lower bound.
      const int64_t b = std::stoll(row.at("budget_bytes"));
      CHECK(b == peak - ((peak - bound) * static_cast<int64_t>(i) + 2) / 4);
      if (last >= 0) CHECK(b <= last);
      last = b;
      const bool feasible = row.at("feasible") == "1";
      any_feasible |= feasible;
      if (feasible) CHECK(std::stoll(row.at("predicted_peak_allocated")) <= b);
      if (row.at("executed") == "1") {
        any_executed = true;
        ++executed;
        CHECK(feasible);
        CHECK(row.at("exact") == "1");
        CHECK(row.at("measured_peak_allocated") == row.at("predicted_peak_allocated"));
        CHECK(row.at("measured_peak_reserved") == row.at("predicted_peak_reserved"));
        CHECK(std::stod(row.at("measured_ms")) > 0);
      } else {
        CHECK(row.at("exact").empty());
        CHECK(row.at("measured_ms").empty());
      }
    }
    CHECK(any_executed == any_feasible);           // --execute 1: one plan per policy that has one
    CHECK(has(r.out, "  " + planners[k] + ": "));  // its property check
  }
  CHECK(executed > 0);
}

// Reserved budgets: each budget is its own limit, so one schedule planned at several budgets is
// several runs. Only the points run under the executed plan's limit are marked executed, and each
// is exact (before, every point of the schedule was marked executed, and most said exact 0).
TEST_CASE("cli: frontier under reserved budgets marks executed only the runs it measured, exact") {
  TempDir dir;
  const std::string out = dir.file("fr");
  const Result r = regen_run(
      dir, {"frontier", "--model", "resnet-tiny", "--image-size", "64", "--batch", "8", "--points",
            "6", "--execute", "1", "--steps", "2", "--policies", "sqrt,blocks", "--out", out});
  CAPTURE(r.err);
  CAPTURE(r.out);
  REQUIRE(r.status == 0);
  int executed = 0;
  for (const auto& row : read_csv(out + "/frontier.csv")) {
    if (row.at("policy") != "lower_bound") CHECK(row.at("budget_of") == "reserved");
    if (row.at("executed") != "1") continue;
    ++executed;
    CAPTURE(row.at("policy"));
    CAPTURE(row.at("budget_bytes"));
    CHECK(row.at("exact") == "1");
    CHECK(row.at("measured_peak_allocated") == row.at("predicted_peak_allocated"));
    CHECK(row.at("measured_peak_reserved") == row.at("predicted_peak_reserved"));
  }
  CHECK(executed >= 3);  // no remat, and one plan per policy
}

TEST_CASE("cli: frontier refuses bad flags before any work") {
  TempDir dir;
  const Result prof =
      regen_run(dir, {"profile", "--model", "transformer-tiny", "--batch", "2", "--out", dir.path});
  REQUIRE(prof.status == 0);
  const std::string profile = dir.file("profile.json");
  const std::string out = dir.file("never");
  auto frontier = [&](std::vector<std::string> more) {
    std::vector<std::string> args = {"frontier", "--profile", profile, "--out", out};
    args.insert(args.end(), more.begin(), more.end());
    return args;
  };
  expect_failure(dir, frontier({"--points", "1"}),
                 {"--points must be an integer from 2 to 1000, got 1"});
  // 100000 budgets would plan every policy for hours: refused at once.
  expect_failure(dir, frontier({"--points", "100000"}),
                 {"--points must be at most 1000, got 100000"});
  expect_failure(dir, frontier({"--execute", "-1"}),
                 {"--execute must be a non-negative integer, got -1"});
  expect_failure(dir, frontier({"--steps", "1"}), {"--steps must be an integer from 2"});
  expect_failure(dir, frontier({"--policies", "nosuch"}),
                 {"--policies: unknown policy 'nosuch'", "known policies are blocks"});
  expect_failure(dir, frontier({"--policies", "mutwo:sideways"}),
                 {"--policies", "unknown chain mode 'sideways'"});
  expect_failure(dir, frontier({"--policies", "none"}), {"--policies", "'none' is the baseline"});
  expect_failure(dir, frontier({"--policies", "sqrt,sqrt"}),
                 {"--policies 'sqrt,sqrt' lists 'sqrt' twice"});
  expect_failure(dir, {"frontier", "--profile", dir.file("missing.json"), "--out", out},
                 {"--profile", "missing.json: no such file"});
  // Executing needs the model the profile was made from.
  expect_failure(dir, frontier({"--execute", "1", "--model", "transformer-tiny", "--batch", "3"}),
                 {"--profile", "is for transformer-tiny batch 2", "--batch 3"});
  expect_failure(dir, frontier({"--model", "resnet-tiny", "--batch", "2"}),
                 {"--profile", "is for transformer-tiny batch 2", "--model resnet-tiny"});
  expect_failure(dir, frontier({"--execute", "1"}),
                 {"--execute 1", "pass --model transformer-tiny --batch 2"});
  expect_failure(dir, frontier({"--model", "transformer-tiny", "--batch", "2", "--threads", "7"}),
                 {"--threads 7", "threads"});
  expect_failure(dir,
                 {"frontier", "--model", "transformer-tiny", "--image-size", "64", "--out", out},
                 {"--image-size does not apply to model 'transformer-tiny'"});
  CHECK(!std::filesystem::exists(out));  // refused before the folder was made
  // Another model under the same name and batch: refused up front, naming the flag the profile
  // recorded; a profile without that record (made before it existed) is caught when the no-remat
  // run does not match it.
  expect_failure(dir,
                 frontier({"--model", "transformer-tiny", "--batch", "2", "--seq-len", "8",
                           "--points", "2", "--execute", "1", "--steps", "2"}),
                 {"--profile", "was made with --seq-len 16, but this run has --seq-len 8"});
  {
    nlohmann::json j = nlohmann::json::parse(read_file(profile));
    j.erase("run");
    const std::string old_profile = dir.file("old_profile.json");
    write_file_atomic(old_profile, j.dump());
    expect_failure(dir,
                   {"frontier", "--profile", old_profile, "--out", dir.file("never"), "--model",
                    "transformer-tiny", "--batch", "2", "--seq-len", "8", "--points", "2",
                    "--execute", "1", "--steps", "2"},
                   {"--profile", "the model flags do not build the profiled model"});
    // The same failure into a folder with an earlier run's outputs: they stay as they were (the
    // outputs are committed together at the end; expect_failure compares every file).
    std::filesystem::create_directory(dir.file("kept"));
    write_file_atomic(dir.file("kept/frontier.csv"), "an earlier run's frontier\n");
    write_file_atomic(dir.file("kept/profile.json"), "an earlier run's profile\n");
    expect_failure(dir,
                   {"frontier", "--profile", old_profile, "--out", dir.file("kept"), "--model",
                    "transformer-tiny", "--batch", "2", "--seq-len", "8", "--points", "2",
                    "--execute", "1", "--steps", "2"},
                   {"--profile", "the model flags do not build the profiled model"});
  }
  // --out naming a file.
  write_file_atomic(dir.file("file.txt"), "x");
  expect_failure(dir, {"frontier", "--profile", profile, "--out", dir.file("file.txt")},
                 {"--out", "is a file, not a folder"});
  // Plan only: --profile alone plans without executing.
  const Result plan = regen_run(dir, frontier({"--points", "2", "--policies", "sqrt"}));
  CAPTURE(plan.err);
  CHECK(plan.status == 0);
  CHECK(has(plan.out, "plan only"));
  CHECK(read_csv(out + "/frontier.csv").size() == 2 + 2);
}

// The math mode: --math fp32|tf32 and its synonym --tf32 on every command that runs kernels; a
// conflicting pair and tf32 on the CPU refused before any work, naming the flags; every figure the
// tools write names the mode (on the CPU always fp32: every CPU kernel is FP32); profiles record
// it, and profiles written before --math (--tf32 on|off) are read as --math.
TEST_CASE("cli: --math and --tf32: defaults, conflicts, the CPU, and the math column") {
  using regen::math_mode;
  const Device cpu = Device::cpu(), gpu = Device::cuda(0);
  // Training and everything else: fp32 unless asked; benchmarks: tf32 on CUDA; the CPU: fp32.
  CHECK(math_mode("", false, gpu) == "fp32");
  CHECK(math_mode("", false, gpu, tool::kBenchMath) == "tf32");
  CHECK(math_mode("fp32", false, gpu, tool::kBenchMath) == "fp32");
  CHECK(math_mode("", true, gpu) == "tf32");
  CHECK(math_mode("tf32", true, gpu) == "tf32");  // the synonym beside its own value agrees
  CHECK(math_mode("", false, cpu, tool::kBenchMath) == "fp32");
  CHECK(math_mode("fp32", false, cpu) == "fp32");
  CHECK(has(error_of([&] { math_mode("", true, cpu); }), "--tf32 applies to CUDA devices"));
  CHECK(has(error_of([&] { math_mode("fp32", true, gpu); }),
            "--tf32 (the same as --math tf32) conflicts with --math fp32"));
  CHECK(has(error_of([&] { math_mode("fp16", false, gpu); }),
            "--math must be fp32 or tf32, got 'fp16'"));
  // Flags filled in code (regen.Model) are checked as the command line's are.
  SessionOptions m;
  m.math = "fp32";
  m.tf32 = true;
  CHECK(has(error_of([&] { m.validate(); }), "conflicts with --math fp32"));
  m.math = "bf16";
  m.tf32 = false;
  CHECK(has(error_of([&] { m.validate(); }), "--math must be fp32 or tf32, got 'bf16'"));

  TempDir dir;
  expect_failure(dir, tiny({"--math", "bogus"}), {"--math must be fp32 or tf32, got 'bogus'"});
  expect_failure(dir, tiny({"--math", "fp32", "--tf32"}),
                 {"--tf32 (the same as --math tf32) conflicts with --math fp32"});
  expect_failure(dir, tiny({"--tf32", "--math", "fp32"}), {"--tf32", "conflicts with --math fp32"});
  expect_failure(dir, tiny({"--math", "tf32", "--device", "cpu"}),
                 {"--math tf32 applies to CUDA devices", "on cpu every kernel computes in FP32"});
  expect_failure(dir, tiny({"--tf32", "--device", "cpu"}), {"--tf32 applies to CUDA devices"});
  {
    // --math tf32 --tf32 is no conflict: on the CPU the error is the device's.
    const Result r = regen_run(dir, tiny({"--math", "tf32", "--tf32", "--device", "cpu"}));
    CHECK(r.status == 1);
    CHECK(has(r.err, "--math tf32 applies to CUDA devices"));
    CHECK(!has(r.err, "conflicts"));
  }
  expect_failure(
      dir, {"bench", "train", "--model", "transformer-tiny", "--device", "cpu", "--math", "tf32"},
      {"--math tf32 applies to CUDA devices"});
  expect_failure(dir, {"bench", "train", "--model", "transformer-tiny", "--math", "fp32", "--tf32"},
                 {"conflicts with --math fp32"});
#ifdef REGEN_WITH_CUDA  // bench kernels exists in CUDA builds only
  // bench kernels names a flag mistake before a missing GPU.
  expect_failure(dir, {"bench", "kernels", "--math", "fp32", "--tf32"},
                 {"conflicts with --math fp32"});
  expect_failure(dir, {"bench", "kernels", "--math", "fp16"}, {"--math must be fp32 or tf32"});
#endif
  expect_failure(dir, {"bench", "ops", "--math", "tf32", "--device", "cpu"},
                 {"--math tf32 applies to CUDA devices"});
  expect_failure(dir, {"bench", "ops", "--math", "fp32", "--tf32"}, {"conflicts with --math fp32"});
  // sweep and frontier: refused before their output folder is made.
  expect_failure(dir,
                 {"sweep", "--model", "transformer-tiny", "--device", "cpu", "--math", "tf32",
                  "--out", dir.file("sw_never")},
                 {"--math tf32 applies to CUDA devices"});
  expect_failure(dir,
                 {"frontier", "--model", "transformer-tiny", "--device", "cpu", "--tf32", "--out",
                  dir.file("fr_never")},
                 {"--tf32 applies to CUDA devices"});
  CHECK(!std::filesystem::exists(dir.file("sw_never")));
  CHECK(!std::filesystem::exists(dir.file("fr_never")));

  // The mode in what the tools print and write (CPU runs: fp32).
  const Result train =
      regen_run(dir, tiny({"--steps", "2", "--batch", "2", "--math", "fp32", "--device", "cpu"}));
  CAPTURE(train.err);
  REQUIRE(train.status == 0);
  CHECK(has(train.out, "on cpu, precision fp32, "));
  CHECK(has(train.out, "summary: transformer-tiny on cpu, batch 2, 2 steps, precision fp32"));
  const Result bench = regen_run(dir, {"bench", "train", "--model", "transformer-tiny", "--batch",
                                       "2", "--warmup", "0", "--steps", "1", "--device", "cpu"});
  REQUIRE(bench.status == 0);
  CHECK(has(bench.out, "precision fp32"));
  const std::string ops_json = dir.file("ops.json");
  const Result ops = regen_run(
      dir, {"bench", "ops", "--only", "gemm 256x3136x64", "--repeats", "1", "--json", ops_json});
  CAPTURE(ops.err);
  REQUIRE(ops.status == 0);
  CHECK(has(ops.out, "f32, math fp32, median of 1 runs"));
  CHECK(nlohmann::json::parse(read_file(ops_json)).at("math") == "fp32");

  // A CSV as rows of named fields; the math column comes after the older ones and only the
  // offload columns (frontier.csv) after it, so readers that count columns are unaffected.
  auto rows_of = [](const std::string& path) {
    std::vector<std::string> header;
    auto rows = csv_rows(path, &header);
    const auto math = std::find(header.begin(), header.end(), "math");
    REQUIRE(math != header.end());
    const std::vector<std::string> offload = {"offloaded",
                                              "optimizer_state",
                                              "predicted_host_peak_allocated",
                                              "predicted_stall_ms",
                                              "measured_host_peak_allocated",
                                              "measured_stall_ms",
                                              "measured_cpu_cores"};
    CHECK(std::vector<std::string>(math + 1, header.end()) ==
          (math + 1 == header.end() ? std::vector<std::string>{} : offload));
    return rows;
  };
  const std::string sw = dir.file("sw");
  const Result sweep =
      regen_run(dir, {"sweep", "--model", "transformer-tiny", "--batches", "2", "--policies",
                      "sqrt", "--budgets", "50%", "--steps", "2", "--device", "cpu", "--out", sw});
  CAPTURE(sweep.err);
  REQUIRE(sweep.status == 0);
  CHECK(has(sweep.out, "== transformer-tiny batch 2 (math fp32): profiling"));
  CHECK(has(read_file(sw + "/transformer-tiny_summary.txt"), "budget 50%, math fp32, GB = 2^30"));
  for (const char* csv : {"/transformer-tiny_summary.csv", "/transformer-tiny_timeline.csv"}) {
    CAPTURE(csv);
    const auto rows = rows_of(sw + csv);
    CHECK(!rows.empty());
    for (const auto& row : rows) CHECK(row.at("math") == "fp32");
  }
  const std::string profile = sw + "/transformer-tiny_b2_profile.json";
  CHECK(has(read_file(profile), "\"--precision\": \"fp32\""));
  const std::string fr = dir.file("fr");
  const Result frontier = regen_run(
      dir, {"frontier", "--profile", profile, "--points", "2", "--policies", "sqrt", "--out", fr});
  CAPTURE(frontier.err);
  REQUIRE(frontier.status == 0);
  CHECK(has(frontier.out, "on cpu (math fp32, "));
  const auto fr_rows = rows_of(fr + "/frontier.csv");
  CHECK(fr_rows.size() == 2 + 2);
  for (const auto& row : fr_rows) CHECK(row.at("math") == "fp32");

  // Profiles written before --math recorded --tf32 on|off (on CUDA): off is --math fp32, on is
  // --math tf32 (and both, before --precision, that precision), and a run is checked against that.
  nlohmann::json j = nlohmann::json::parse(read_file(profile));
  j["run"].erase("--precision");
  j["run"]["--tf32"] = "off";
  const std::string old_off = dir.file("old_off.json");
  write_file_atomic(old_off, j.dump());
  const Result off = regen_run(dir, tiny({"--batch", "2", "--steps", "2", "--device", "cpu",
                                          "--profile", old_off, "--policy", "sqrt"}));
  CAPTURE(off.err);
  CHECK(off.status == 0);
  CHECK(has(off.out, "summary:"));
  j["run"]["--tf32"] = "on";
  const std::string old_on = dir.file("old_on.json");
  write_file_atomic(old_on, j.dump());
  expect_failure(dir,
                 tiny({"--batch", "2", "--device", "cpu", "--profile", old_on, "--policy", "sqrt"}),
                 {"was made with --precision tf32, but this run has --precision fp32",
                  "pass --precision tf32"});
  Profile p;
  CHECK(profile_math(p) == "fp32");
  p.run["--tf32"] = "on";
  CHECK(profile_math(p) == "tf32");
  p.run["--tf32"] = "off";
  CHECK(profile_math(p) == "fp32");
  p.run = {{"--math", "tf32"}};
  CHECK(profile_math(p) == "tf32");
}

TEST_CASE("cli validators: messages name the requirement and the value") {
  using namespace regen::tool;
  CHECK(validate(positive_integer(), "5") == "");
  CHECK(validate(positive_integer(), "0") == "must be a positive integer, got 0");
  CHECK(validate(positive_integer(), "-2") == "must be a positive integer, got -2");
  CHECK(validate(positive_integer(), "2.5") ==
        "must be a positive integer, got '2.5' (not an integer)");
  CHECK(validate(positive_integer(), "0x10").find("not an integer") != std::string::npos);
  CHECK(validate(positive_integer(), "010").find("without leading zeros") != std::string::npos);
  CHECK(validate(positive_integer(kIntMax), "3000000000") ==
        "must be at most 2147483647, got 3000000000");
  CHECK(validate(positive_integer(), "99999999999999999999999").find("must be at most") == 0);
  CHECK(validate(non_negative_integer(), "0") == "");
  CHECK(validate(non_negative_integer(), "-1") == "must be a non-negative integer, got -1");
  CHECK(validate(non_negative_integer(UINT64_MAX), "18446744073709551615") == "");
  CHECK(validate(integer_in(2, 1000), "1") == "must be an integer from 2 to 1000, got 1");
  CHECK(validate(integer_in(-5, 5), "-5") == "");
  CHECK(validate(integer_in(-5, 5), "-6") == "must be an integer from -5 to 5, got -6");
  CHECK(validate(non_negative_number(), "0.5") == "");
  CHECK(validate(non_negative_number(), "1e-3") == "");
  CHECK(validate(non_negative_number(), "nan") == "must be a finite number >= 0, got nan");
  CHECK(validate(non_negative_number(), "-inf") == "must be a finite number >= 0, got -inf");
  CHECK(validate(non_negative_number(), "abc") ==
        "must be a finite number >= 0, got 'abc' (not a number)");
  CHECK(validate(number_in(0, 0.99), "0.99") == "");
  CHECK(validate(number_in(0, 0.99), "1") == "must be a number from 0 to 0.99, got 1");
  CHECK(validate(number_in(0, 1), "NaN") == "must be a number from 0 to 1, got NaN");

  // The session's checks (SessionOptions::validate, behind make_session) refuse what the
  // validators refuse.
  SessionOptions f;
  f.model = "transformer-tiny";
  f.model_options["dropout"] = std::nan("");
  CHECK(has(error_of([&] { f.validate(); }), "--dropout must be a number from 0 to 0.99"));
  f = SessionOptions();
  f.lr = HUGE_VAL;
  CHECK(has(error_of([&] { f.validate(); }), "--lr must be a finite number"));
  f = SessionOptions();
  f.model = "transformer-tiny";
  f.data = "text:x.txt";
  CHECK(has(error_of([&] { f.model_config(); }), "pass --vocab 256"));
  f.model_options["vocab"] = 256;
  CHECK(f.model_config().vocab == 256);
  // --lm-head-chunk: the preset's fused automatic head unless given; -1 unfused, N rows.
  CHECK(f.model_config().head_chunk_rows == 0);
  f.model_options["lm_head_chunk"] = -1;
  CHECK(f.model_config().head_chunk_rows == -1);
  f.model_options["lm_head_chunk"] = 64;
  CHECK(f.model_config().head_chunk_rows == 64);
  f.model_options["lm_head_chunk"] = -7;
  CHECK(has(error_of([&] { f.validate(); }),
            "--lm-head-chunk must be an integer from -1 to 2147483647"));
  // --lm-head-recompute: 0 (gradients in the forward) unless given, 1 recomputes the logits.
  f.model_options.erase("lm_head_chunk");
  CHECK(f.model_config().head_recompute == 0);
  f.model_options["lm_head_recompute"] = 1;
  CHECK(f.model_config().head_recompute == 1);
  f.model_options["lm_head_recompute"] = 2;
  CHECK(has(error_of([&] { f.validate(); }), "--lm-head-recompute must be at most 1"));
  // Recomputing needs the fused head: refused with the unfused one, by both flags (estimate,
  // which runs no dry run, too: below).
  f.model_options["lm_head_recompute"] = 1;
  f.model_options["lm_head_chunk"] = -1;
  CHECK(has(error_of([&] { f.validate(); }),
            "--lm-head-recompute 1 recomputes the fused LM head's logits in the backward, but "
            "--lm-head-chunk -1 asks for the unfused head"));
  f.model_options.erase("lm_head_chunk");
  f.model_options.erase("lm_head_recompute");
  f = SessionOptions();
  f.model_options["lm_head_chunk"] = 0;
  CHECK(has(error_of([&] { f.model_config(); }),
            "--lm-head-chunk does not apply to model 'resnet-tiny'"));
}

TEST_CASE("io: failed writes close the file and leave no temporary behind") {
  TempDir dir;
  const int fds = open_fds();
  // An existing directory is refused before anything is written; one that appears while the data
  // is written makes rename() fail after the data was written and synced.
  const std::string folder = dir.file("taken");
  std::filesystem::create_directory(folder);
  CHECK(has(error_of([&] { write_file_atomic(folder, "data"); }),
            "is a directory; regen writes only regular files"));
  const std::string late = dir.file("late");
  CHECK(has(error_of([&] {
              AtomicFileWriter w(late);
              w.write("data", 4);
              std::filesystem::create_directory(late);
              w.commit();
            }),
            "cannot move"));
  std::filesystem::remove(late);
  // write() fails: a file-size limit below the content (SIGXFSZ ignored, so write sets EFBIG).
  {
    struct rlimit old;
    REQUIRE(::getrlimit(RLIMIT_FSIZE, &old) == 0);
    auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
    struct rlimit small = old;
    small.rlim_cur = 1024;
    REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
    const std::string msg =
        error_of([&] { write_file_atomic(dir.file("big"), std::string(4096, 'x')); });
    ::setrlimit(RLIMIT_FSIZE, &old);
    std::signal(SIGXFSZ, old_handler);
    CHECK(has(msg, "writing '" + dir.file("big") + "' failed"));
  }
  CHECK(has(error_of([&] { write_file_atomic(dir.file("no/such/file"), "x"); }), "cannot create"));
  CHECK(open_fds() == fds);
  CHECK(dir.entries() == std::vector<std::string>{"taken"});

  // why_not_writable: the reason, or "" and nothing left behind.
  CHECK(why_not_writable(dir.file("ok.bin")) == "");
  CHECK(has(why_not_writable(dir.file("none/ok.bin")), "does not exist"));
  CHECK(has(why_not_writable(folder), "is a directory"));
  CHECK(has(why_not_writable(dir.path + "/"), "names a folder"));
  CHECK(dir.entries() == std::vector<std::string>{"taken"});

  // SIGTERM while a file is being written: the process dies of it, the temporary is removed and
  // the old file is untouched.
  {
    const std::string target = dir.file("kept.txt");
    write_file_atomic(target, "old");
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      ::signal(SIGTERM, SIG_DFL);  // as in regen (the test runner handles it in this process)
      AtomicFileWriter w(target);
      w.write("new data", 8);
      ::raise(SIGTERM);
      ::_exit(3);  // not reached
    }
    int status = 0;
    REQUIRE(::waitpid(child, &status, 0) == child);
    CHECK(WIFSIGNALED(status));
    if (WIFSIGNALED(status)) CHECK(WTERMSIG(status) == SIGTERM);
    CHECK(read_file(target) == "old");
    std::vector<std::string> left = dir.entries();
    std::sort(left.begin(), left.end());
    CHECK(left == std::vector<std::string>{"kept.txt", "taken"});
    std::remove(target.c_str());
  }

  // read_file names a directory as such.
  CHECK(has(error_of([&] { read_file(folder); }), "is a directory, not a regular file"));
  write_file_atomic(dir.file("a.txt"), "hello");
  CHECK(read_file(dir.file("a.txt")) == "hello");
  CHECK(open_fds() == fds);
}

// A command's outputs as a group: when one cannot be written, none is replaced; a folder being
// written by one process is refused to a second, naming the flag and the folder.
TEST_CASE("io: outputs committed together, and a folder locked against a second writer") {
  TempDir dir;
  const int fds = open_fds();
  write_file_atomic(dir.file("a.txt"), "old a");
  write_file_atomic(dir.file("b.txt"), "old b");
  // The third fails after the first two are written and synced: a and b keep their old content.
  CHECK(has(error_of([&] {
              write_files_atomic({{dir.file("a.txt"), "new a"},
                                  {dir.file("b.txt"), "new b"},
                                  {dir.file("no/such/c.txt"), "c"}});
            }),
            "cannot create"));
  CHECK(read_file(dir.file("a.txt")) == "old a");
  CHECK(read_file(dir.file("b.txt")) == "old b");
  write_files_atomic({{dir.file("a.txt"), "new a"}, {dir.file("b.txt"), "new b"}});
  CHECK(read_file(dir.file("a.txt")) == "new a");
  CHECK(read_file(dir.file("b.txt")) == "new b");
  std::vector<std::string> left = dir.entries();
  std::sort(left.begin(), left.end());
  CHECK(left == std::vector<std::string>{"a.txt", "b.txt"});  // no temporary left

  // The lock: a second lock in this process is refused (flock locks per open file), and so is a
  // regen profile into the folder; released, both work again.
  const std::string out = dir.file("out");
  std::filesystem::create_directory(out);
  {
    const FolderLock lock(out, "--out");
    CHECK(has(error_of([&] { FolderLock again(out, "--out"); }),
              "--out '" + out + "' is being written by another regen process"));
    const Result r =
        regen_run(dir, {"profile", "--model", "resnet-tiny", "--batch", "2", "--out", out});
    CHECK(r.status != 0);
    CHECK(has(r.err, "is being written by another regen process"));
    CHECK(std::filesystem::is_empty(out));
  }
  { FolderLock again(out, "--out"); }
  CHECK(has(error_of([&] { FolderLock none(dir.file("missing"), "--out"); }),
            "cannot open the folder"));
  // profile checks all three outputs before it profiles: one that is a folder stops it, nothing
  // written.
  std::filesystem::create_directory(out + "/trace.json");
  const Result r =
      regen_run(dir, {"profile", "--model", "resnet-tiny", "--batch", "2", "--out", out});
  CHECK(r.status != 0);
  CHECK(has(r.err, "trace.json"));
  CHECK(!std::filesystem::exists(out + "/profile.json"));
  std::filesystem::remove(out + "/trace.json");
  const Result ok =
      regen_run(dir, {"profile", "--model", "resnet-tiny", "--batch", "2", "--out", out});
  CHECK(ok.status == 0);
  left.clear();
  for (const auto& e : std::filesystem::directory_iterator(out))
    left.push_back(e.path().filename().string());
  std::sort(left.begin(), left.end());
  CHECK(left == std::vector<std::string>{"profile.json", "profile.txt", "trace.json"});
  CHECK(open_fds() == fds);
}

// A step that passes its plan's limit (here a limit below what the plan allocates, which no
// planner would set) stops with an out-of-memory report a person can act on: live blocks by
// category and producer, the free bytes and largest free block in the reserved segments, and what
// the plan predicted and where.
TEST_CASE(
    "cli: out of memory under a plan's limit names the plan's prediction and the fragmentation") {
  SessionOptions m;  // large enough that a step maps segments of its own
  m.model = "resnet-tiny";
  m.model_options["image_size"] = 64;
  m.batch = 16;
  m.device = "cpu";
  Profile profile;
  {
    allocator_for(Device::cpu()).empty_cache();
    auto s = make_session(m);
    ProfileOptions po;
    po.warmup = 1;
    po.iterations = 1;
    po.model_name = m.model;
    profile = profile_training(*s->trainer, po);
  }
  const Simulator sim(profile);
  PlanOptions po;
  po.budget_of = BudgetOf::allocated;
  Plan plan = make_plan(sim, "dp", Budget::parse("80%"), po);
  REQUIRE(plan.feasible);
  plan.predicted.peak_at = "bwd_begin somewhere";
  const std::string e =
      error_of([&] { measure_training(m, 2, &profile, &plan, plan.predicted.peak_allocated - 1); });
  CAPTURE(e);
  CHECK(e.find("out of memory") != std::string::npos);
  CHECK(e.find("would pass the limit") != std::string::npos);
  CHECK(e.find("largest live blocks") != std::string::npos);
  CHECK(e.find("free in reserved segments") != std::string::npos);
  CHECK(e.find("the plan (dp, budget 80%") != std::string::npos);
  CHECK(e.find("reached at bwd_begin somewhere") != std::string::npos);
  CHECK(allocator_for(Device::cpu()).limit() == 0);  // the limit ends with the run
}

// Ctrl-C while `regen plan --policy milp` solves. CBC and Clp install SIGINT handlers of their own
// while they run, which swallowed it: the solve went on to its time limit, the plan was written and
// the exit status was 0. Now CBC runs in a child process: SIGINT to the process group (what Ctrl-C
// sends) while the solver's process is alive kills regen with SIGINT (130 in a shell), the
// solver's process is gone with it, and neither output exists. A plan that ran to its time limit
// (30 s here) would fail all three checks.
TEST_CASE("cli: SIGINT stops plan --policy milp: regen dies of it and writes nothing") {
  if (!milp_available()) return;
  TempDir dir;
  REQUIRE(regen_run(dir, {"profile", "--model", "transformer-tiny", "--batch", "4", "--iterations",
                          "1", "--out", dir.path})
              .status == 0);
  const std::string profile = dir.file("profile.json"), plan = dir.file("plan.json"),
                    decisions = dir.file("decisions.csv");
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::setpgid(0, 0);  // its own process group, as a job in a shell
    for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::signal(sig, SIG_DFL);
    const int null = ::open("/dev/null", O_WRONLY);
    ::dup2(null, 1);
    ::dup2(null, 2);
    // 70% of the allocated no-remat peak: a solve of tens of seconds on transformer-tiny.
    ::execl(REGEN_BINARY, "regen", "plan", "--profile", profile.c_str(), "--policy", "milp",
            "--budget", "70%", "--budget-of", "allocated", "--milp-time-limit", "30", "--out",
            plan.c_str(), "--decisions", decisions.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::setpgid(child, child);
  // The solver's process: regen's child, once it exists (dp plans first, in regen itself).
  pid_t solver = -1;
  int status = 0;
  bool exited = false;
  const std::string children =
      "/proc/" + std::to_string(child) + "/task/" + std::to_string(child) + "/children";
  for (int i = 0; i < 60000 && solver < 0 && !exited; ++i) {
    FILE* f = std::fopen(children.c_str(), "r");
    if (f) {
      long id = 0;
      if (std::fscanf(f, "%ld", &id) == 1) solver = static_cast<pid_t>(id);
      std::fclose(f);
    }
    if (solver < 0) {
      exited = ::waitpid(child, &status, WNOHANG) == child;
      ::usleep(1000);
    }
  }
  REQUIRE_FALSE(exited);
  REQUIRE(solver > 0);
  ::kill(-child, SIGINT);
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK(WIFSIGNALED(status));
  if (WIFSIGNALED(status)) CHECK(WTERMSIG(status) == SIGINT);
  CHECK((::kill(solver, 0) == -1 && errno == ESRCH));
  CHECK_FALSE(std::filesystem::exists(plan));
  CHECK_FALSE(std::filesystem::exists(decisions));
}

// REGEN_CPU_CONV picks the CPU's 3x3 convolution algorithm, whose workspace and time a profile
// holds: a bad value is named as itself (not as a size the dry run failed on), and a profile made
// with the other algorithm is refused with both ways out.
TEST_CASE("cli: REGEN_CPU_CONV: a bad value named, a profile of the other algorithm refused") {
  TempDir dir;
  const std::vector<std::string> model = {"--model", "resnet-tiny", "--batch",
                                          "4",       "--device",    "cpu"};
  auto with = [&](std::vector<std::string> head, const std::vector<std::string>& more) {
    head.insert(head.end(), model.begin(), model.end());
    head.insert(head.end(), more.begin(), more.end());
    return head;
  };
  ::setenv("REGEN_CPU_CONV", "fast", 1);
  const Result bad = regen_run(dir, with({"train"}, {"--steps", "1"}));
  ::setenv("REGEN_CPU_CONV", "direct", 1);
  const Result made = regen_run(dir, with({"profile"}, {"--iterations", "1", "--out", dir.path}));
  const Result same =
      regen_run(dir, with({"train"}, {"--steps", "1", "--profile", dir.file("profile.json"),
                                      "--policy", "dp", "--budget", "100%"}));
  ::unsetenv("REGEN_CPU_CONV");
  // REGEN_CPU_ISA alike, for a model whose products never reach the register tile too.
  ::setenv("REGEN_CPU_ISA", "bogus", 1);
  const Result bad_isa = regen_run(dir, tiny({"--steps", "1", "--batch", "2"}));
  ::unsetenv("REGEN_CPU_ISA");
  CHECK(bad_isa.status == 1);
  CHECK(has(bad_isa.err, "REGEN_CPU_ISA=bogus is not one of avx512bf16, avx512, avx2, generic"));
  CHECK(bad.status == 1);
  CHECK(has(bad.err, "REGEN_CPU_CONV='fast': expected winograd (the default"));
  CHECK_FALSE(has(bad.err, "a dry run"));
  REQUIRE(made.status == 0);
  CHECK(has(read_file(dir.file("profile.json")), "\"REGEN_CPU_CONV\": \"direct\""));
  CHECK_MESSAGE(same.status == 0, same.err);
  expect_failure(dir,
                 with({"train"}, {"--steps", "1", "--profile", dir.file("profile.json"), "--policy",
                                  "dp", "--budget", "100%"}),
                 {"was made with the CPU's 3x3 convolutions by direct (REGEN_CPU_CONV=direct), "
                  "but this run has winograd",
                  "set the environment variable REGEN_CPU_CONV=direct, or profile again"});
}

namespace {
// `regen bench train` of resnet-tiny, batch 4, on the CPU, 2 timed steps after `warmup`, then
// `more`.
std::vector<std::string> bench_tiny(const std::string& warmup,
                                    const std::vector<std::string>& more) {
  std::vector<std::string> args = {"bench",    "train", "--model",  "resnet-tiny", "--batch", "4",
                                   "--device", "cpu",   "--warmup", warmup,        "--steps", "2"};
  args.insert(args.end(), more.begin(), more.end());
  return args;
}
}  // namespace

// bench train --cpu-conv: one algorithm for the run, or both alternated step by step.
TEST_CASE(
    "cli: bench train --cpu-conv both alternates the two algorithms, and says what it refuses") {
  TempDir dir;
  auto with = [](const std::vector<std::string>& more) { return bench_tiny("0", more); };
  const Result both = regen_run(dir, with({"--cpu-conv", "both"}));
  CHECK_MESSAGE(both.status == 0, both.err);
  CHECK(has(both.out, "--cpu-conv both: 2 pairs after 0 warm-up steps each"));
  CHECK(has(both.out, "winograd: median"));
  CHECK(has(both.out, "direct:   median"));
  CHECK(has(both.out, "winograd / direct: median"));
  const Result direct = regen_run(dir, with({"--cpu-conv", "direct"}));
  CHECK_MESSAGE(direct.status == 0, direct.err);
  CHECK(has(direct.out, "step time: median"));
  expect_failure(dir, with({"--cpu-conv", "both", "--json", dir.file("b.json")}),
                 {"--cpu-conv both compares the two algorithms and writes no --json"});
  const Result bad = regen_run(dir, with({"--cpu-conv", "fast"}));
  CHECK(bad.status == 2);
  CHECK(has(bad.err, "--cpu-conv: fast not in {winograd,direct,both}"));
}

// bench train --against-precision: two sessions, a step of each alternated.
TEST_CASE(
    "cli: bench train --against-precision alternates two precisions, and says what it "
    "refuses") {
  TempDir dir;
  auto with = [](const std::vector<std::string>& more) { return bench_tiny("1", more); };
  const Result both = regen_run(dir, with({"--precision", "bf16", "--against-precision", "fp32"}));
  CHECK_MESSAGE(both.status == 0, both.err);
  CHECK(has(both.out, "--against-precision fp32: 2 pairs after 1 warm-up steps each"));
  CHECK(has(both.out, "bf16: median"));
  CHECK(has(both.out, "fp32: median"));
  CHECK(has(both.out, "bf16 / fp32: median"));
  expect_failure(dir, with({"--against-precision", "fp32"}),
                 {"--against-precision fp32: this run's precision is fp32 too"});
  expect_failure(dir, with({"--against-precision", "tf32"}),
                 {"--against-precision tf32 applies to CUDA devices; on cpu"});
  expect_failure(
      dir,
      with({"--precision", "bf16", "--against-precision", "fp32", "--json", dir.file("b.json")}),
      {"--against-precision fp32 compares two precisions step by step and writes no "
       "--json"});
  CHECK_FALSE(std::filesystem::exists(dir.file("b.json")));
  const Result bad = regen_run(dir, with({"--against-precision", "fp8"}));
  CHECK(bad.status == 2);
  CHECK(has(bad.err, "--against-precision: fp8 not in {fp32,tf32,bf16,fp16}"));
}

// REGEN_MILP_PARAMS passed any name=value to CBC unchecked (preprocess=on crashed CBC at short
// time limits): it is refused, by name, before any solve, and nothing is written.
TEST_CASE("cli: REGEN_MILP_PARAMS is refused") {
  if (!milp_available()) return;
  TempDir dir;
  REQUIRE(regen_run(dir, {"profile", "--model", "transformer-tiny", "--batch", "2", "--iterations",
                          "1", "--out", dir.path})
              .status == 0);
  ::setenv("REGEN_MILP_PARAMS", "preprocess=on", 1);
  const Result r = regen_run(dir, {"plan", "--profile", dir.file("profile.json"), "--policy",
                                   "milp", "--budget", "80%", "--milp-time-limit", "0.1", "--out",
                                   dir.file("plan.json"), "--decisions", dir.file("d.csv")});
  ::unsetenv("REGEN_MILP_PARAMS");
  CHECK(r.status == 1);
  CHECK(has(r.err, "REGEN_MILP_PARAMS"));
  CHECK(has(r.err, "preprocess=on crashed CBC"));
  CHECK_FALSE(std::filesystem::exists(dir.file("plan.json")));
  CHECK_FALSE(std::filesystem::exists(dir.file("d.csv")));
}

// Help texts and messages that name policies read the planner registry: every registered planner
// appears in each (they once said "blocks, sqrt or mutwo" while six existed).
TEST_CASE("cli: help texts and messages list every registered planner") {
  TempDir dir;
  const std::vector<std::string> remat = remat_policy_names();
  REQUIRE(remat.size() >= 5);
  for (const char* cmd : {"train", "plan", "sweep"}) {
    const Result r = regen_run(dir, {cmd, "--help"});
    CHECK(r.status == 0);
    for (const std::string& name : remat)
      CHECK_MESSAGE(has(r.out, name), cmd, " --help lacks ", name);
  }
  const Result budget = regen_run(dir, {"train", "--model", "transformer-tiny", "--budget", "50%"});
  CHECK(budget.status != 0);
  CHECK(has(budget.err, "needs a rematerialization --policy (" + join_names(remat) + ")"));
  const Result sweep = regen_run(dir, {"sweep", "--model", "transformer-tiny", "--policies", "none",
                                       "--out", dir.file("sweep")});
  CHECK(sweep.status != 0);
  CHECK(has(sweep.err, "is the baseline every batch runs anyway (use " + join_names(remat)));
  CHECK_FALSE(std::filesystem::exists(dir.file("sweep")));
}

TEST_CASE(
    "cli: the training loop's flags, --save-state and --resume, --log, regen eval, regen "
    "choose") {
  TempDir dir;
  expect_failure(dir, tiny({"--accumulate", "0"}),
                 {"--accumulate must be a positive integer, got 0"});
  expect_failure(dir, tiny({"--lr-schedule", "linear"}),
                 {"--lr-schedule must be constant, step or cosine, got 'linear'"});
  expect_failure(dir, tiny({"--lr-schedule", "step"}), {"--lr-schedule step needs --lr-step-size"});
  expect_failure(
      dir, tiny({"--lr-schedule", "cosine", "--schedule-steps", "3", "--warmup-steps", "5"}),
      {"--lr-schedule cosine decays over --schedule-steps 3 steps", "more than --warmup-steps 5"});
  expect_failure(dir, tiny({"--clip-grad-norm", "-1"}), {"--clip-grad-norm must be"});
  expect_failure(dir, tiny({"--eval-split", "0.95"}),
                 {"--eval-split must be a number from 0 to 0.9, got 0.95"});
  expect_failure(dir, tiny({"--save-every", "2"}), {"--save-every needs --save-state"});
  expect_failure(dir, tiny({"--resume", dir.file("a"), "--load", dir.file("b")}),
                 {"either --resume", "or --load"});
  expect_failure(dir, tiny({"--resume", dir.file("missing.safetensors")}), {"missing.safetensors"});
  expect_failure(dir, {"eval", "--model", "transformer-tiny"}, {"--load is required"});
  expect_failure(dir,
                 {"choose", "--model", "transformer-tiny", "--global-batch", "8", "--micro-batches",
                  "3", "--budget", "4MiB"},
                 {"3 does not divide --global-batch 8"});
  expect_failure(
      dir, {"choose", "--model", "transformer-tiny", "--global-batch", "8", "--budget", "50%"},
      {"--budget 50%: give the device's bytes"});

  // A run that saves its state, logs and evaluates; then resumed to the end; then evaluated.
  const std::string state = dir.file("state.safetensors"), log = dir.file("log.csv");
  const Result first =
      regen_run(dir, tiny({"--steps", "2", "--lr-schedule", "cosine", "--schedule-steps", "4",
                           "--warmup-steps", "1", "--clip-grad-norm", "1", "--eval-every", "2",
                           "--eval-batches", "2", "--save-state", state, "--log", log}));
  REQUIRE_MESSAGE(first.status == 0, first.err);
  CHECK(has(first.out, "eval after step 2: loss"));
  CHECK(has(first.out, "perplexity"));
  CHECK(has(first.out, "no tape, no saved tensors"));
  CHECK(has(first.out, "eta"));
  CHECK(has(first.out, "saved the training state at step 2"));
  const Result again =
      regen_run(dir, tiny({"--steps", "4", "--lr-schedule", "cosine", "--warmup-steps", "1",
                           "--clip-grad-norm", "1", "--eval-every", "2", "--eval-batches", "2",
                           "--resume", state, "--save-state", state, "--log", log}));
  REQUIRE_MESSAGE(again.status == 0, again.err);
  CHECK(has(again.out, "resumed " + state + " at step 2"));
  CHECK(has(again.out, "step 3/4"));
  CHECK_FALSE(has(again.out, "step 1/4"));
  const std::string rows = read_file(log);
  CHECK(std::count(rows.begin(), rows.end(), '\n') == 1 + 4 + 2);  // header, 4 steps, 2 evals
  CHECK(has(rows, "\neval,4,"));
  // Finished: resuming it again has no step left.
  expect_failure(dir,
                 tiny({"--steps", "4", "--lr-schedule", "cosine", "--warmup-steps", "1",
                       "--clip-grad-norm", "1", "--eval-every", "2", "--resume", state}),
                 {"is at step 4 already"});
  // Another trajectory is refused, naming the flag.
  expect_failure(
      dir, tiny({"--steps", "6", "--resume", state}),
      {"saved by a run with --lr-schedule cosine", "this run has --lr-schedule constant"});
  const Result ev = regen_run(dir, {"eval", "--model", "transformer-tiny", "--load", state,
                                    "--eval-batches", "3", "--device", "cpu"});
  REQUIRE_MESSAGE(ev.status == 0, ev.err);
  CHECK(has(ev.out, "perplexity"));
  CHECK(has(ev.out, "memory (no tape, no saved tensors): peak allocated"));
}

// A hostile-input battery's findings, each with its siblings: every count a person gives is
// bounded (nothing runs longer than its work needs), every number is read in decimal, a flag that
// would be ignored is refused naming it, and messages name the command's own flags.
TEST_CASE("cli: counts bounded, numbers decimal, ignored flags refused, each named") {
  TempDir dir;
  // Counts: a global batch's divisors are found at once, and every batch has a bound.
  expect_failure(dir,
                 {"choose", "--model", "resnet-tiny", "--image-size", "32", "--global-batch",
                  "99999999999", "--budget", "4MiB"},
                 {"--global-batch must be at most 16777216, got 99999999999"});
  expect_failure(dir, tiny({"--batch", "16777217"}),
                 {"--batch must be at most 16777216, got 16777217"});
  expect_failure(dir, tiny({"--eval-batch", "16777217"}),
                 {"--eval-batch must be at most 16777216, got 16777217"});
  expect_failure(dir,
                 {"sweep", "--model", "transformer-tiny", "--batches", "2,16777217", "--out",
                  dir.file("sweep")},
                 {"--batches '2,16777217': each item must be at most 16777216, got 16777217"});
  expect_failure(dir,
                 {"choose", "--model", "transformer-tiny", "--global-batch", "8", "--micro-batches",
                  "0x2", "--budget", "4MiB"},
                 {"--micro-batches '0x2': each item", "(not an integer)"});
  // The estimate's range is the step's bytes: refused where they could pass 64-bit counts.
  expect_failure(
      dir, {"estimate", "--model", "resnet-tiny", "--batch", "2", "--image-size", "1099511627776"},
      {"--batch 2 --image-size 1099511627776: estimate: a step of model 'resnet-tiny' at batch 2",
       "lower the batch"});
  expect_failure(
      dir,
      {"estimate", "--model", "bert-base", "--batch", "16777216", "--seq-len", "1000000",
       "--compare"},
      {"--batch 16777216 --seq-len 1000000: estimate: a step of model 'bert-base'", "1 EiB"});
  expect_failure(dir, {"estimate", "--model", "bert-base", "--batch", "1000000", "--compare"},
                 {"--batch 1000000: dry profile: a step of model 'bert-base' at batch 1000000",
                  "allocator events", "profile a smaller batch"});
  // The closed forms count an fp32 step: a mixed precision's terms come from its dry run only.
  expect_failure(dir, {"estimate", "--model", "transformer-tiny", "--precision", "bf16"},
                 {"--precision bf16: the closed forms count an fp32 step",
                  "pass --compare for the exact terms of a bf16 step"});
  // What the estimate of a CPU step without a plan does not count is refused, not ignored.
  expect_failure(dir, {"estimate", "--model", "resnet-tiny", "--conv", "cudnn"},
                 {"--conv cudnn applies to CUDA devices; the estimate counts a CPU step"});
  expect_failure(dir, {"estimate", "--model", "resnet-tiny", "--compress", "bf16"},
                 {"--compress bf16 narrows what a remat plan retains"});
  expect_failure(dir, {"bench", "ops", "--threads", "100000"},
                 {"--threads", "must be at most 1024, got 100000"});
  // Numbers are decimal everywhere, --transfer's included.
  expect_failure(dir,
                 tiny({"--policy", "dp", "--budget", "50%", "--offload", "activations",
                       "--transfer", "step:0x10"}),
                 {"--transfer 'step:0x10'", "'0x10' is not a number"});
  // Flags that would be ignored: --offload without a planner, --transfer without --offload,
  // another schedule's settings, a warm-up longer than the run.
  expect_failure(dir, tiny({"--offload", "activations"}),
                 {"--offload activations", "no plan is made here", "--policy dp"});
  expect_failure(dir, tiny({"--transfer", "step:0.4"}),
                 {"--transfer step:0.4", "--offload is none"});
  // ... and --offload under a planner that plans no offload (it would run without one).
  expect_failure(dir, tiny({"--policy", "blocks", "--offload", "activations"}),
                 {"--offload activations", "--policy blocks plans no offload and would ignore it",
                  "give --policy dp or --policy milp, or drop --offload"});
  // eval runs no training step: the flags that only shape one are refused by name.
  for (const std::vector<std::string>& flag :
       std::vector<std::vector<std::string>>{{"--lr", "0.5"},
                                             {"--optimizer", "adamw"},
                                             {"--weight-decay", "0.1"},
                                             {"--grad-norm", "on"},
                                             {"--compress", "bf16"},
                                             {"--masks", "off"}}) {
    std::vector<std::string> args = {"eval", "--model", "resnet-tiny", "--load", "w.safetensors"};
    args.insert(args.end(), flag.begin(), flag.end());
    expect_failure(dir, args, {flag[0] + " applies to training, and eval runs no training step"});
  }
  // Empty output paths are refused before anything runs, on every command that writes one.
  expect_failure(dir, {"estimate", "--model", "resnet-tiny", "--csv", ""},
                 {"--csv", "is empty: give a file name"});
  expect_failure(dir, {"bench", "train", "--model", "resnet-tiny", "--json", ""},
                 {"--json", "is empty: give a file name"});
  expect_failure(dir, {"bench", "ops", "--json", ""}, {"--json", "is empty: give a file name"});
  expect_failure(dir, {"bench", "copy", "--json", ""}, {"--json", "is empty: give a file name"});
  expect_failure(dir, tiny({"--lr-schedule", "cosine", "--lr-gamma", "0.5"}),
                 {"--lr-gamma applies to --lr-schedule step, not to --lr-schedule cosine"});
  expect_failure(dir, tiny({"--lr-schedule", "cosine", "--lr-step-size", "2"}),
                 {"--lr-step-size applies to --lr-schedule step"});
  expect_failure(dir, tiny({"--lr-schedule", "step", "--lr-step-size", "2", "--lr-min", "0.01"}),
                 {"--lr-min applies to --lr-schedule cosine, not to --lr-schedule step"});
  expect_failure(
      dir, tiny({"--schedule-steps", "10"}),
      {"--schedule-steps applies to --lr-schedule cosine, not to --lr-schedule constant"});
  expect_failure(dir, tiny({"--steps", "3", "--warmup-steps", "5"}),
                 {"--warmup-steps 5 is more than --steps 3", "would never finish"});
  expect_failure(dir, tiny({"--lr-schedule", "cosine", "--lr", "0.1", "--lr-min", "5"}),
                 {"--lr-schedule cosine decays from --lr 0.1 to --lr-min 5, which must not be "
                  "above it"});
  // What only a planner reads, a profile read only to plan from, and how train evaluates, each
  // given where nothing would read it.
  expect_failure(dir, tiny({"--chain", "drop"}),
                 {"--chain drop applies to planning with a rematerialization --policy"});
  expect_failure(dir, tiny({"--budget-of", "allocated"}),
                 {"--budget-of allocated applies to planning with a rematerialization --policy"});
  expect_failure(dir, tiny({"--profile", dir.file("absent.json")}),
                 {"--profile ", "absent.json is read to plan from: give --policy P"});
  expect_failure(dir, tiny({"--eval-batches", "3"}),
                 {"--eval-batches 3 sets how train evaluates", "only with --eval-every N"});
  expect_failure(dir, tiny({"--eval-batch", "3"}),
                 {"--eval-batch 3 sets how train evaluates", "only with --eval-every N"});
  expect_failure(dir, tiny({"--eval-split", "0.5"}),
                 {"--eval-split 0.5 holds out the end of a text file; this data has held-out "
                  "examples of its own"});
  // Byte counts past what 64 bits hold are named as such, not as not positive.
  expect_failure(dir, tiny({"--policy", "dp", "--budget", "8388608TiB"}),
                 {"'8388608TiB' is too large (at most 8 EiB)"});
  expect_failure(dir, tiny({"--policy", "dp", "--budget", "1e1%"}),
                 {"bad budget '1e1%': a percentage is written as decimal digits"});
  // A bad value is named before any combination of flags that involves it.
  expect_failure(dir, tiny({"--compress", "bf17", "--steps", "1"}),
                 {"--compress must be none, bf16 or fp16, got 'bf17'"});
  // --cuda-graph on where the steps cannot be captured: refused before training, naming why.
  expect_failure(dir, tiny({"--cuda-graph", "on", "--steps", "2"}),
                 {"--cuda-graph on: the steps cannot be captured as one CUDA graph without "
                  "--layout planned"});
  expect_failure(dir, tiny({"--cuda-graph", "on", "--layout", "planned", "--steps", "4"}),
                 {"--cuda-graph on: the steps cannot be captured as one CUDA graph: the device is "
                  "cpu"});
  expect_failure(dir, tiny({"--cuda-graph", "always", "--steps", "1"}), {"--cuda-graph"});
  // choose names its own flags; batch norm's smallest micro-batch is skipped, not fatal.
  expect_failure(dir,
                 {"choose", "--model", "resnet-tiny", "--global-batch", "4", "--micro-batches", "1",
                  "--budget", "64MiB"},
                 {"--micro-batches: micro-batch 1 at --image-size 32", "micro-batch 2 or more"});
  const Result chose =
      regen_run(dir, {"choose", "--model", "resnet-tiny", "--image-size", "32", "--global-batch",
                      "2", "--policies", "none", "--budget", "1GiB", "--device", "cpu"});
  CAPTURE(chose.err);
  CHECK(chose.status == 0);
  CHECK(has(chose.out, "micro-batch 1 skipped: micro-batch 1 at --image-size 32"));
  CHECK(has(chose.out, "fastest that fits 1GiB: --batch 2 --accumulate 1"));
  CHECK_FALSE(has(chose.out + chose.err, "--batch 2 or more"));
}

// Files: --load is an input like every other, a log named .CSV is CSV, and what a writer killed
// while saving left is swept when the file is read.
TEST_CASE("cli: --load is never an output, .CSV logs, temporaries swept by readers") {
  TempDir dir;
  const std::string ckpt = dir.file("ckpt.safetensors");
  REQUIRE(regen_run(dir, tiny({"--steps", "1", "--batch", "2", "--save", ckpt})).status == 0);
  for (const char* out : {"--log", "--save-state"}) {
    expect_failure(dir, tiny({"--steps", "1", "--batch", "2", "--load", ckpt, out, ckpt}),
                   {std::string(out) + " " + ckpt + " is the same file as --load"});
  }
  // --load X --save X trains on in place, as before.
  REQUIRE(regen_run(dir, tiny({"--steps", "1", "--batch", "2", "--load", ckpt, "--save", ckpt}))
              .status == 0);
  // The metrics log's format by its extension in any case.
  const std::string log = dir.file("run.CSV");
  REQUIRE(regen_run(dir, tiny({"--steps", "2", "--batch", "2", "--log", log})).status == 0);
  CHECK(read_file(log).rfind("kind,step,loss", 0) == 0);
  // A killed writer's temporary (pid 2^22 + 1 is above Linux's pid_max default) goes when the
  // file is read (--load, --resume, eval), not only when it is written again.
  const std::string dead = ckpt + ".tmp.4194305.3";
  write_file_atomic(dead, "left by a killed writer");
  REQUIRE(regen_run(dir, {"eval", "--model", "transformer-tiny", "--load", ckpt, "--batch", "2",
                          "--eval-batches", "1", "--device", "cpu"})
              .status == 0);
  CHECK_FALSE(std::filesystem::exists(dead));
  write_file_atomic(dead, "left by a killed writer");
  CHECK(load_safetensors(ckpt).metadata.at("model") == "transformer-tiny");
  CHECK_FALSE(std::filesystem::exists(dead));
}

namespace {

// Whether two safetensors files hold the same tensors, bit for bit (f32 weights and i64 counts).
bool same_tensors(const std::string& a, const std::string& b) {
  const SafetensorsFile x = load_safetensors(a), y = load_safetensors(b);
  if (x.tensors.size() != y.tensors.size()) return false;
  for (const auto& [name, t] : x.tensors) {
    const Tensor* u = y.find(name);
    if (u == nullptr || u->shape() != t.shape() || u->dtype() != t.dtype()) return false;
    const auto bits = [](const auto& v) {
      return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof v[0]);
    };
    if (t.dtype() == DType::f32 && bits(t.to_vector<float>()) != bits(u->to_vector<float>()))
      return false;
    if (t.dtype() == DType::i64 && bits(t.to_vector<int64_t>()) != bits(u->to_vector<int64_t>()))
      return false;
  }
  return true;
}

}  // namespace

// A run planned from a --profile file, stopped and resumed: the resumed process's persistent
// tensors are where a run from the start has them (the training state's tensors are read after
// them), so every step after the resume starts from the profiled state, its peaks are the
// predicted ones, and its losses are the uninterrupted run's bitwise. And a profile set a killed
// writer left mixed is refused.
TEST_CASE("cli: a run planned from --profile resumes exactly, and a mixed profile set is refused") {
  TempDir dir;
  const std::string prof = dir.file("P");
  const Result profiled = regen_run(dir, {"profile", "--model", "transformer-tiny", "--batch", "4",
                                          "--device", "cpu", "--out", prof});
  REQUIRE_MESSAGE(profiled.status == 0, profiled.err);
  const auto run = [&](std::vector<std::string> more) {
    std::vector<std::string> args =
        tiny({"--batch", "4", "--device", "cpu", "--profile", prof + "/profile.json", "--policy",
              "dp", "--budget", "lowest"});
    args.insert(args.end(), more.begin(), more.end());
    return regen_run(dir, args);
  };
  const std::string whole_state = dir.file("whole.st"), state = dir.file("s.st");
  const Result whole = run({"--steps", "5", "--save-state", whole_state});
  REQUIRE_MESSAGE(whole.status == 0, whole.err);
  CHECK(has(whole.out, "exact on every one of the 5 steps under the plan"));
  const Result first = run({"--steps", "3", "--save-state", state});
  REQUIRE_MESSAGE(first.status == 0, first.err);
  const Result rest = run({"--steps", "5", "--resume", state, "--save-state", state});
  CAPTURE(rest.out);
  REQUIRE_MESSAGE(rest.status == 0, rest.err);
  CHECK(has(rest.out, "exact on every one of the 2 steps under the plan"));
  // The weights, the optimizer state and its counts after step 5: the uninterrupted run's, bit
  // for bit (and so every loss on the way).
  CHECK(same_tensors(state, whole_state));

  // profile.txt of another run beside profile.json: what a kill between the renames leaves.
  const std::string other = dir.file("Q");
  REQUIRE(regen_run(dir, {"profile", "--model", "transformer-tiny", "--batch", "2", "--device",
                          "cpu", "--out", other})
              .status == 0);
  CHECK(read_file(prof + "/profile.txt").rfind("# regen profile set ", 0) == 0);
  CHECK(read_file(prof + "/trace.json").rfind("{\"regen_profile_set\":\"", 0) == 0);
  REQUIRE(nlohmann::json::parse(read_file(prof + "/trace.json")).contains("traceEvents"));
  write_file_atomic(prof + "/profile.txt", read_file(other + "/profile.txt"));
  expect_failure(dir,
                 {"plan", "--profile", prof + "/profile.json", "--policy", "dp", "--budget", "70%",
                  "--out", dir.file("plan.json"), "--decisions", dir.file("d.csv")},
                 {"profile.txt beside it are not one set", "profile again"});
}

// A resume compares --eval-split only where it sets the training data (a text file's held-out
// tail), and train's summary says how much CPU time its steps had (a CPU step below 0.75 of each
// thread's core, in CPU time over its wall time, waited for other work).
TEST_CASE(
    "cli: resume compares --eval-split only for data it splits, and the summary gives CPU time") {
  TempDir dir;
  const std::string state = dir.file("s.st");
  const Result first = regen_run(dir, tiny({"--steps", "2", "--batch", "2", "--eval-every", "2",
                                            "--eval-batches", "1", "--save-state", state}));
  REQUIRE_MESSAGE(first.status == 0, first.err);
  CHECK(has(first.out, "CPU time: "));
  CHECK(has(first.out, "cores over the step's wall time (median; "));
  // Synthetic data: the resumed run evaluates or not, as it likes.
  const Result resumed = regen_run(dir, tiny({"--steps", "3", "--batch", "2", "--resume", state}));
  CHECK_MESSAGE(resumed.status == 0, resumed.err);
  // A text file trains on its bytes before the held-out tail: that must not change.
  std::string text;
  for (int i = 0; i < 400; ++i) text += "the quick brown fox jumps over the lazy dog. ";
  write_file_atomic(dir.file("corpus.txt"), text);
  const std::vector<std::string> on_text = {
      "--vocab", "256", "--data", "text:" + dir.file("corpus.txt"), "--batch", "2"};
  std::vector<std::string> args = tiny(on_text);
  for (const char* a : {"--steps", "2", "--eval-every", "2", "--eval-batches", "1", "--save-state"})
    args.push_back(a);
  args.push_back(dir.file("t.st"));
  const Result text_run = regen_run(dir, args);
  REQUIRE_MESSAGE(text_run.status == 0, text_run.err);
  std::vector<std::string> again = tiny(on_text);
  for (const char* a : {"--steps", "3", "--resume"}) again.push_back(a);
  again.push_back(dir.file("t.st"));
  expect_failure(dir, again,
                 {"saved by a run with --eval-split 0.1", "this run has --eval-split 0"});
}

// --transfer times copies to the host tier: with nothing offloaded (no --offload, no policy+MODE)
// sweep and frontier refuse it, as train and plan do.
// --plot runs tools/plot.py with each path as one argument, never through a shell: a folder named
// with a space, a quote or a ';' is a folder, and a plot that fails fails the command, naming the
// python and its status.
TEST_CASE("cli: --plot passes its paths as they are, with no shell, and its failure is named") {
  TempDir dir;
  ::setenv("REGEN_PYTHON", "/bin/false", 1);  // the plot fails at once, as a missing matplotlib
  std::filesystem::remove("INJECTED_sweep");
  std::filesystem::remove("INJECTED_frontier");
  const Result sweep =
      regen_run(dir, {"sweep", "--model", "transformer-tiny", "--batches", "2", "--policies",
                      "sqrt", "--budgets", "50%", "--steps", "2", "--device", "cpu", "--out",
                      dir.file("sw x;touch INJECTED_sweep"), "--plot"});
  const Result frontier =
      regen_run(dir, {"frontier", "--model", "transformer-tiny", "--batch", "2", "--device", "cpu",
                      "--points", "2", "--execute", "0", "--policies", "sqrt", "--out",
                      dir.file("fr';touch INJECTED_frontier;'"), "--plot"});
  ::unsetenv("REGEN_PYTHON");
  for (const Result* r : {&sweep, &frontier}) {
    CAPTURE(r->err);
    CHECK(r->status == 1);
    CHECK(has(r->err, "plotting failed: /bin/false tools/plot.py exited with status 1"));
  }
  CHECK_FALSE(std::filesystem::exists("INJECTED_sweep"));
  CHECK_FALSE(std::filesystem::exists("INJECTED_frontier"));
  // The outputs before the plot were written under the folder's own name.
  CHECK(
      std::filesystem::exists(dir.file("sw x;touch INJECTED_sweep/transformer-tiny_summary.csv")));
}

TEST_CASE("cli: sweep and frontier refuse a --transfer with nothing to offload") {
  TempDir dir;
  expect_failure(dir,
                 {"sweep", "--model", "transformer-tiny", "--batches", "2", "--policies", "dp",
                  "--budgets", "50%", "--transfer", "step:0.4", "--out", dir.file("s")},
                 {"--transfer step:0.4", "--offload is none"});
  expect_failure(dir,
                 {"frontier", "--model", "transformer-tiny", "--batch", "2", "--policies", "dp",
                  "--transfer", "step:0.4", "--out", dir.file("f")},
                 {"--transfer step:0.4", "--offload is none"});
}
