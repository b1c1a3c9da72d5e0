// Two ranks under mpirun (REGEN_MPIEXEC, Open MPI from Debian), on the tiny models and the CPU, as
// a user runs them: `mpirun -np 2 regen train ...`. Runs are bitwise the same run to run; ZeRO-1
// and ZeRO-2 give plain data parallelism's parameters bitwise; two ranks at batch B agree with one
// process at batch 2B (the same global batch, from the text loader's shards) within f32 rounding;
// each rank's peaks equal its plan's prediction to the byte; ZeRO lowers what a rank keeps; and a
// rank that fails (a bad flag, other options, a killed process) ends the job with an error naming
// it, within a time limit; a training state is a file per rank, written together, and a resumed
// run is bitwise the uninterrupted one. CI runs this as root: mpirun gets --allow-run-as-root and
// --oversubscribe. Built only with MPI (CMake REGEN_MPI).
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "regen/core/io.h"
#include "regen/core/safetensors.h"
#include "regen/remat/simulate/simulator.h"
#include "tests/test_util.h"

using namespace regen;
namespace fs = std::filesystem;

namespace {

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("regen_mpi_" + std::to_string(::getpid()));
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// mpirun as CI runs it (as root, two ranks on however many cores there are, unbound).
std::string mpirun() {
  return quote(REGEN_MPIEXEC) + " --allow-run-as-root --oversubscribe --bind-to none";
}
std::string regen_args(const std::vector<std::string>& args) {
  std::string cmd = quote(REGEN_BINARY);
  for (const std::string& a : args) cmd += " " + quote(a);
  return cmd;
}

struct Result {
  int status = -1;
  std::string out;  // stdout and stderr
};

// Runs `cmd` (a shell command) with a time limit: a job that hangs fails the test instead of CI.
Result run(const std::string& cmd, int seconds = 120) {
  Result r;
  FILE* p =
      ::popen(("timeout -s KILL " + std::to_string(seconds) + " " + cmd + " 2>&1").c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int st = ::pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

Result mpi_train(int ranks, const std::vector<std::string>& args) {
  std::vector<std::string> all = {"train"};
  all.insert(all.end(), args.begin(), args.end());
  return run(mpirun() + " -np " + std::to_string(ranks) + " " + regen_args(all));
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

std::map<std::string, Tensor> tensors(const std::string& path) {
  SafetensorsFile f = load_safetensors(path);
  return std::map<std::string, Tensor>(f.tensors.begin(), f.tensors.end());
}

// Every tensor bitwise equal.
bool same(const std::string& a, const std::string& b) {
  const auto ta = tensors(a), tb = tensors(b);
  if (ta.size() != tb.size()) return false;
  for (const auto& [name, t] : ta) {
    const auto it = tb.find(name);
    if (it == tb.end() || it->second.nbytes() != t.nbytes()) return false;
    if (std::memcmp(t.raw_data(), it->second.raw_data(), t.nbytes()) != 0) return false;
  }
  return true;
}

// The largest difference of two checkpoints' f32 tensors, relative to each tensor's largest value.
double worst_relative(const std::string& a, const std::string& b) {
  const auto ta = tensors(a), tb = tensors(b);
  double worst = 0;
  for (const auto& [name, t] : ta) {
    if (t.dtype() != DType::f32) continue;
    const std::vector<float> x = t.to_vector<float>(), y = tb.at(name).to_vector<float>();
    double scale = 1e-30, diff = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      scale = std::max(scale, static_cast<double>(std::fabs(x[i])));
      diff = std::max(diff, std::fabs(static_cast<double>(x[i]) - y[i]));
    }
    worst = std::max(worst, diff / scale);
  }
  return worst;
}

const std::vector<std::string> kTiny = {"--threads", "1", "--steps", "4", "--progress", "plain"};

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

}  // namespace

TEST_CASE("two ranks: bitwise the same run to run, and ZeRO-1 and ZeRO-2 give plain's parameters") {
  TempDir dir;
  for (const std::string model : {"resnet-tiny", "transformer-tiny"}) {
    CAPTURE(model);
    const std::vector<std::string> base =
        with(kTiny, {"--model", model, "--batch", "4", "--bucket-size", "32KiB"});
    std::map<std::string, std::string> saved;
    for (const std::string run_name : {"none", "none-again", "optimizer", "gradients"}) {
      const std::string shard = run_name == "none-again" ? "none" : run_name;
      const std::string path = dir.file(model + "_" + run_name + ".safetensors");
      const Result r = mpi_train(2, with(base, {"--shard", shard, "--save", path}));
      INFO(r.out);
      REQUIRE(r.status == 0);
      CHECK(has(r.out, "data parallel: 2 ranks (mpi collectives on cpu), global batch 8"));
      CHECK(has(r.out, "rank 1: gradient communication"));
      saved[run_name] = path;
    }
    CHECK(same(saved["none"], saved["none-again"]));
    CHECK(same(saved["none"], saved["optimizer"]));
    CHECK(same(saved["none"], saved["gradients"]));
  }
}

TEST_CASE(
    "two ranks at batch 4 agree with one process at batch 8, reading the text loader's shards") {
  TempDir dir;
  {
    std::ofstream f(dir.file("text.txt"));
    for (int i = 0; i < 400; ++i) f << "sentence " << i << " of a small corpus, in bytes.\n";
  }
  const std::vector<std::string> base =
      with(kTiny, {"--model", "transformer-tiny", "--vocab", "256", "--dropout", "0", "--data",
                   "text:" + dir.file("text.txt"), "--lr", "0.05"});
  const Result two =
      mpi_train(2, with(base, {"--batch", "4", "--save", dir.file("two.safetensors")}));
  INFO(two.out);
  REQUIRE(two.status == 0);
  const Result one = run(regen_args(
      with({"train"}, with(base, {"--batch", "8", "--save", dir.file("one.safetensors")}))));
  INFO(one.out);
  REQUIRE(one.status == 0);
  // The same losses to the printed digits, the same parameters up to f32 rounding (the gradient
  // of 8 samples as the mean of two means of 4). SGD: Adam would turn the rounding noise of
  // gradients that are zero in exact arithmetic into steps of +-lr.
  auto losses = [](const std::string& out) {
    std::vector<std::string> l;
    for (size_t at = out.find("/4 loss "); at != std::string::npos;
         at = out.find("/4 loss ", at + 1)) {
      l.push_back(out.substr(at + 8, 6));
    }
    return l;
  };
  CHECK(losses(two.out).size() == 4);
  CHECK(losses(two.out) == losses(one.out));
  const double worst = worst_relative(dir.file("one.safetensors"), dir.file("two.safetensors"));
  CHECK(worst < 1e-5);
  CHECK(worst > 0);  // two reductions of a different order: not bitwise, as expected
}

TEST_CASE("two ranks under a plan: each rank measures its predicted peaks, in every shard mode") {
  for (const std::string shard : {"none", "optimizer", "gradients"}) {
    CAPTURE(shard);
    const Result r =
        mpi_train(2, {"--model",   "resnet-tiny", "--image-size",  "64",       "--batch",    "8",
                      "--threads", "1",           "--steps",       "5",        "--progress", "none",
                      "--shard",   shard,         "--bucket-size", "64KiB",    "--policy",   "dp",
                      "--budget",  "85%",         "--budget-of",   "allocated"});
    INFO(r.out);
    REQUIRE(r.status == 0);
    CHECK(has(r.out, "exact on every one of the 3 steps under the plan"));
    CHECK_FALSE(has(r.out, "recompute 0 of"));  // the plan recomputes
    CHECK(has(r.out, "rank 0: gradient communication"));
    CHECK(has(r.out, "; exact on all 3 steps under the plan\n    rank 1:"));
    CHECK(has(r.out, "rank 1: gradient communication"));
  }
}

TEST_CASE("two ranks: ZeRO-1 halves the optimizer state a rank keeps, ZeRO-2 the gradients too") {
  TempDir dir;
  std::map<std::string, std::map<std::string, int64_t>> kept;
  for (const std::string shard : {"none", "optimizer", "gradients"}) {
    const std::string out = dir.file(shard);
    fs::create_directories(out);
    const Result r =
        run(mpirun() + " -np 2 " +
            regen_args({"profile", "--model", "resnet-tiny", "--batch", "4", "--threads", "1",
                        "--warmup", "0", "--iterations", "1", "--shard", shard, "--out", out}));
    INFO(r.out);
    REQUIRE(r.status == 0);
    const Profile p = load_profile(out + "/profile.json");
    CHECK(p.run.at("--ranks") == "2");
    CHECK(p.run.at("--shard") == shard);
    for (const Category c : {Category::parameter, Category::gradient, Category::optimizer_state}) {
      kept[shard][category_name(c)] = p.persistent_by[static_cast<int>(c)];
    }
  }
  const auto& none = kept["none"];
  const auto& z1 = kept["optimizer"];
  const auto& z2 = kept["gradients"];
  // Half of the flat buckets' bytes (and no more than that: rank chunks are equal).
  CHECK(z1.at("optimizer_state") * 2 <= none.at("optimizer_state") + 4096);
  CHECK(z1.at("optimizer_state") * 2 >= none.at("optimizer_state") - 65536);
  CHECK(z1.at("gradient") == none.at("gradient"));
  CHECK(z2.at("gradient") * 2 <= none.at("gradient") + 4096);
  CHECK(z2.at("optimizer_state") == z1.at("optimizer_state"));
}

// ZeRO-3: each rank keeps its chunk of every parameter, which every op reads all-gathered (a
// gather_shards node) and whose gradient backward reduce-scatters with the rank-order mean of
// --shard none's buckets; the optimizer steps element-wise. So the parameters after the steps, and
// the losses, are --shard none's bitwise.
TEST_CASE("two ranks: ZeRO-3 (--shard parameters) gives plain's parameters and losses bitwise") {
  TempDir dir;
  auto losses = [](const std::string& out) {
    std::vector<std::string> l;
    for (size_t at = out.find("/4 loss "); at != std::string::npos;
         at = out.find("/4 loss ", at + 1)) {
      l.push_back(out.substr(at + 8, 8));
    }
    return l;
  };
  for (const std::string model : {"resnet-tiny", "transformer-tiny"}) {
    CAPTURE(model);
    const std::vector<std::string> base =
        with(kTiny, {"--model", model, "--batch", "4", "--optimizer", "adamw", "--lr", "0.01"});
    std::map<std::string, Result> runs;
    // "lowest": the dp plan at the lowest budget it meets, which frees most gathered parameters
    // after forward and gathers them again in backward (replays of their gather_shards nodes).
    for (const std::string run_name : {"none", "parameters", "lowest"}) {
      const std::string shard = run_name == "none" ? "none" : "parameters";
      std::vector<std::string> args =
          with(base, {"--shard", shard, "--save", dir.file(model + "_" + run_name + ".st")});
      if (run_name == "lowest") {
        args = with(args, {"--policy", "dp", "--budget", "lowest", "--budget-of", "allocated"});
      }
      const Result r = mpi_train(2, args);
      INFO(r.out);
      REQUIRE(r.status == 0);
      CHECK(has(r.out, "shard " + shard));
      if (run_name == "lowest") {
        CHECK_FALSE(has(r.out, "recompute 0 of"));
        CHECK(has(r.out, "; exact on all 2 steps under the plan\n    rank 1:"));
        // Forward's gathers issued ahead of their ops, with the plan's replays in backward.
        CHECK(has(r.out, "rank 1: parameter gathers and gradient reductions"));
        std::smatch m;
        const std::regex prefetched("rank 1: .*; ([0-9]+) of the last step's ([0-9]+) gathers");
        REQUIRE(std::regex_search(r.out, m, prefetched));
        CHECK(std::stoll(m[1].str()) > 0);
        CHECK(std::stoll(m[1].str()) < std::stoll(m[2].str()));
      }
      runs[run_name] = r;
    }
    CHECK(losses(runs["none"].out).size() == 4);
    CHECK(losses(runs["parameters"].out) == losses(runs["none"].out));
    // Under a policy the first two steps profile and print no loss line: the last two compare.
    const std::vector<std::string> none_losses = losses(runs["none"].out);
    CHECK(losses(runs["lowest"].out) ==
          std::vector<std::string>(none_losses.end() - 2, none_losses.end()));
    CHECK(same(dir.file(model + "_none.st"), dir.file(model + "_parameters.st")));
    CHECK(same(dir.file(model + "_none.st"), dir.file(model + "_lowest.st")));
  }
}

TEST_CASE("two ranks, ZeRO-3 under a plan: each rank measures its predicted peaks on every step") {
  for (const std::string model : {"resnet-tiny", "transformer-tiny"}) {
    CAPTURE(model);
    // resnet-tiny at 64x64, so that activations, not parameters, make the peak (as above).
    const std::vector<std::string> size = model == "resnet-tiny"
                                              ? std::vector<std::string>{"--image-size", "64"}
                                              : std::vector<std::string>{};
    const Result r =
        mpi_train(2, with(size, {"--model", model, "--batch", "8", "--threads", "1", "--steps", "5",
                                 "--progress", "none", "--shard", "parameters", "--policy", "dp",
                                 "--budget", "85%", "--budget-of", "allocated"}));
    INFO(r.out);
    REQUIRE(r.status == 0);
    CHECK(has(r.out, "exact on every one of the 3 steps under the plan"));
    CHECK_FALSE(has(r.out, "recompute 0 of"));  // the plan recomputes
    CHECK(has(r.out, "; exact on all 3 steps under the plan\n    rank 1:"));
  }
}

// ZeRO-3 beside --shard none with the same options, in the cases a run can add to the bitwise test
// above: --accumulate 2 (each rank keeps every parameter's whole gradient across the micro-batches,
// adds each micro-batch's into it as one process adds into its gradient, and the last micro-batch
// reduce-scatters the sum: --shard none's additions and reduction, so bitwise), bf16 and fp16
// (autocast's 16-bit copy made from the gathered f32 parameter, as from a whole one: the same
// arithmetic), and GPT-2, whose tied token embedding is read by two ops (the two uses' gradients
// summed whole, in backward order, before one reduce-scatter: --shard none's additions). Every
// case also runs under the dp plan at the lowest budget, where each rank measures the predicted
// peaks on every step; their parameters are --shard none's bitwise as well.
static void check_zero3_against_none(const std::string& model,
                                     const std::vector<std::string>& extra, int steps) {
  TempDir dir;
  CAPTURE(model);
  const std::string of = "/" + std::to_string(steps) + " loss ";
  auto losses = [&](const std::string& out) {
    std::vector<std::string> l;
    for (size_t at = out.find(of); at != std::string::npos; at = out.find(of, at + 1)) {
      l.push_back(out.substr(at + of.size(), 8));
    }
    return l;
  };
  const std::vector<std::string> base =
      with(extra, {"--model", model, "--batch", "4", "--optimizer", "adamw", "--lr", "0.01",
                   "--threads", "1", "--progress", "plain", "--steps", std::to_string(steps)});
  std::map<std::string, Result> runs;
  for (const std::string run_name : {"none", "parameters", "lowest"}) {
    const std::string shard = run_name == "none" ? "none" : "parameters";
    std::vector<std::string> args =
        with(base, {"--shard", shard, "--save", dir.file(run_name + ".safetensors")});
    if (run_name == "lowest") {
      args = with(args, {"--policy", "dp", "--budget", "lowest", "--budget-of", "allocated"});
    }
    const Result r = mpi_train(2, args);
    INFO(r.out);
    REQUIRE(r.status == 0);
    CHECK(has(r.out, "shard " + shard));
    if (run_name == "lowest") {
      const std::string exact =
          "exact on all " + std::to_string(steps - 2) + " steps under the plan";
      CHECK_FALSE(has(r.out, "recompute 0 of"));
      CHECK(has(r.out, "; " + exact + "\n    rank 1:"));
      CHECK(has(r.out, "rank 1: parameter gathers and gradient reductions"));
      const size_t rank1 = r.out.find("    rank 1:");
      REQUIRE(rank1 != std::string::npos);
      CHECK(has(r.out.substr(rank1), exact));
    }
    runs[run_name] = r;
  }
  const std::vector<std::string> none_losses = losses(runs["none"].out);
  CHECK(static_cast<int>(none_losses.size()) == steps);
  CHECK(losses(runs["parameters"].out) == none_losses);
  CHECK(losses(runs["lowest"].out) ==
        std::vector<std::string>(none_losses.end() - (steps - 2), none_losses.end()));
  CHECK(same(dir.file("none.safetensors"), dir.file("parameters.safetensors")));
  CHECK(same(dir.file("none.safetensors"), dir.file("lowest.safetensors")));
}

TEST_CASE("two ranks: ZeRO-3 with --accumulate 2 is --shard none's bitwise, with exact peaks") {
  for (const std::string model : {"resnet-tiny", "transformer-tiny"}) {
    check_zero3_against_none(model, {"--accumulate", "2"}, 5);
  }
  // Three micro-batches under the planned layout, which serves the step's k-th request at a
  // planned place: a micro-batch that made a request the simulator does not replay (the
  // reduction's, before the last) would be refused there.
  const Result r =
      mpi_train(2, {"--model",   "resnet-tiny", "--image-size", "64",  "--batch",     "8",
                    "--threads", "1",           "--steps",      "5",   "--progress",  "none",
                    "--shard",   "parameters",  "--accumulate", "3",   "--layout",    "planned",
                    "--policy",  "dp",          "--budget",     "85%", "--budget-of", "allocated"});
  INFO(r.out);
  REQUIRE(r.status == 0);
  CHECK_FALSE(has(r.out, "recompute 0 of"));
  CHECK(has(r.out, "; exact on all 3 steps under the plan\n    rank 1:"));
  const size_t rank1 = r.out.find("    rank 1:");
  REQUIRE(rank1 != std::string::npos);
  CHECK(has(r.out.substr(rank1), "exact on all 3 steps under the plan"));
}

// fp16 on transformer-tiny only: resnet-tiny's first fp16 steps overflow at the initial loss scale
// and are skipped, and `regen train`'s non-finite scan then stops --shard none's run on the
// skipped step's gradients (as it stops one process's), while ZeRO-3's scan skips the parameters.
TEST_CASE("two ranks: ZeRO-3 in bf16 and fp16 is --shard none's bitwise, with exact peaks") {
  for (const std::string model : {"resnet-tiny", "transformer-tiny", "gpt2-tiny"}) {
    check_zero3_against_none(model, {"--precision", "bf16"}, 4);
  }
  check_zero3_against_none("transformer-tiny", {"--precision", "fp16"}, 4);
}

TEST_CASE("two ranks: ZeRO-3 of GPT-2's tied embedding is --shard none's bitwise") {
  check_zero3_against_none("gpt2-tiny", {}, 4);
  check_zero3_against_none("gpt2-tiny", {"--accumulate", "2"}, 5);
}

// --load under ZeRO-3: every rank loads into whole parameters (gathered for the load, dropped
// after) and keeps its chunk of them, so training on from a checkpoint is --shard none's bitwise.
TEST_CASE("two ranks: ZeRO-3 loads a checkpoint as --shard none does, bitwise") {
  TempDir dir;
  const std::vector<std::string> base =
      with(kTiny, {"--model", "resnet-tiny", "--batch", "4", "--optimizer", "adamw"});
  const std::string init = dir.file("init.safetensors");
  Result r = run(regen_args(with({"train"}, with(base, {"--save", init}))));
  INFO(r.out);
  REQUIRE(r.status == 0);
  for (const std::string shard : {"none", "parameters"}) {
    r = mpi_train(2, with(base, {"--shard", shard, "--load", init, "--save",
                                 dir.file(shard + ".safetensors")}));
    INFO(r.out);
    REQUIRE(r.status == 0);
    CHECK(has(r.out, "loaded " + init));
  }
  CHECK(same(dir.file("none.safetensors"), dir.file("parameters.safetensors")));
  CHECK_FALSE(same(init, dir.file("none.safetensors")));
}

TEST_CASE("a bad flag on one rank ends the job with an error naming the rank") {
  const std::string cmd =
      mpirun() + " -np 1 " + regen_args(with({"train", "--model", "resnet-tiny"}, kTiny)) +
      " : -np 1 " + regen_args(with({"train", "--model", "resnet-tiny", "--batch", "0"}, kTiny));
  const Result r = run(cmd, 60);
  INFO(r.out);
  CHECK(r.status != 0);
  CHECK(r.status != 137);  // not the time limit's kill
  CHECK(has(r.out, "regen: error: rank 1 of 2: --batch must be a positive integer, got 0"));
}

// What the training loop does that data parallelism does not carry is refused by name, on every
// rank, before a model is built (docs/distributed.md, "Gradient accumulation").
TEST_CASE("two ranks: accumulation under ZeRO-2 is refused") {
  const std::vector<std::string> base = with({"--model", "resnet-tiny", "--batch", "2"}, kTiny);
  const Result r = mpi_train(2, with(base, {"--accumulate", "2", "--shard", "gradients"}));
  INFO(r.out);
  CHECK(r.status != 0);
  CHECK(r.status != 137);
  CHECK(
      has(r.out, "--accumulate 2 with --shard gradients (ZeRO-2) under mpirun is not supported: "));
  CHECK(has(r.out,
            "use --shard optimizer (ZeRO-1), --shard parameters (ZeRO-3: whole gradients kept "
            "across the micro-batches) or --accumulate 1"));
}

// ---- Training states under mpirun: a file per rank, written together -----------------------

namespace {

// The loss column of a --log CSV file's training rows, as written (9 significant digits).
std::vector<std::string> logged_losses(const std::string& path) {
  std::vector<std::string> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("train,", 0) != 0) continue;
    std::istringstream fields(line);
    std::string kind, step, loss;
    std::getline(fields, kind, ',');
    std::getline(fields, step, ',');
    std::getline(fields, loss, ',');
    out.push_back(step + ":" + loss);
  }
  return out;
}

// The files in `dir` (names only, sorted).
std::vector<std::string> listing(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// transformer-tiny with dropout (each rank's own stream) on text (the data position), AdamW
// (two state tensors per parameter, sharded under ZeRO): what a resumed run must carry on.
std::vector<std::string> resume_base(const TempDir& dir, const std::string& shard,
                                     const std::string& precision) {
  {
    std::ofstream f(dir.file("text.txt"));
    for (int i = 0; i < 200; ++i) f << "line " << i << " of a resumed corpus.\n";
  }
  return {"--model",       "transformer-tiny",
          "--vocab",       "256",
          "--data",        "text:" + dir.file("text.txt"),
          "--dropout",     "0.1",
          "--optimizer",   "adamw",
          "--batch",       "2",
          "--threads",     "1",
          "--progress",    "plain",
          "--bucket-size", "16KiB",
          "--shard",       shard,
          "--precision",   precision};
}

}  // namespace

// A run of 4 steps against one of 2 steps, saved, then resumed for 2 more: bitwise the same
// weights, buffers and optimizer state on every rank (each rank's file compared tensor by
// tensor) and the same losses (the log's 9 significant digits, which tell floats apart), in every
// shard mode, in fp32 and bf16. The uninterrupted run saves every step (--save-every 1): the
// periodic saves alternate the slots, and the replaced state's rank file is removed each time.
// Two test cases, so that ctest runs them side by side.
static void check_bitwise_resume(const std::string& precision) {
  CAPTURE(precision);
  for (const std::string shard : {"none", "optimizer", "gradients", "parameters"}) {
    CAPTURE(shard);
    {
      TempDir dir;
      const std::vector<std::string> base = resume_base(dir, shard, precision);
      const std::string whole = dir.file("whole.st"), split = dir.file("split.st");
      Result r = mpi_train(2, with(base, {"--steps", "4", "--save-state", whole, "--save-every",
                                          "1", "--log", dir.file("whole.csv")}));
      INFO(r.out);
      REQUIRE(r.status == 0);
      // Saves at steps 1, 2, 3 and 4: slots a, b, a, b; a's file went with the step-3 state.
      CHECK(fs::exists(whole + ".rank1-of-2.b"));
      CHECK_FALSE(fs::exists(whole + ".rank1-of-2.a"));
      r = mpi_train(
          2, with(base, {"--steps", "2", "--save-state", split, "--log", dir.file("split.csv")}));
      INFO(r.out);
      REQUIRE(r.status == 0);
      CHECK(fs::exists(split + ".rank1-of-2.a"));
      r = mpi_train(2, with(base, {"--steps", "4", "--resume", split, "--save-state", split,
                                   "--log", dir.file("split.csv")}));
      INFO(r.out);
      REQUIRE(r.status == 0);
      CHECK(has(r.out, "resumed " + split + " at step 2"));
      CHECK(fs::exists(split + ".rank1-of-2.b"));
      CHECK_FALSE(fs::exists(split + ".rank1-of-2.a"));
      CHECK(same(whole, split));
      CHECK(same(whole + ".rank1-of-2.b", split + ".rank1-of-2.b"));
      const std::vector<std::string> losses = logged_losses(dir.file("whole.csv"));
      CHECK(losses.size() == 4);
      CHECK(losses == logged_losses(dir.file("split.csv")));
      // Each rank keeps its own dropout stream and, under ZeRO, its own optimizer shard.
      const auto m0 = load_safetensors(whole).metadata;
      const auto m1 = load_safetensors(whole + ".rank1-of-2.b").metadata;
      CHECK(m0.at("ranks") == "2");
      CHECK(m0.at("shard") == shard);
      CHECK(m0.at("save_id") == m1.at("save_id"));
      CHECK(m0.at("rng_stream") != "");
      CHECK(m0.at("data_position") == m1.at("data_position"));
      if (shard != "none") {
        CHECK_FALSE(same(whole, whole + ".rank1-of-2.b"));
      }
      if (shard == "parameters") {
        // Each rank's file has its chunks; rank 0's also the whole weights (gathered for the
        // save), which one process loads with --load; rank 1's has no whole parameter.
        const auto t0 = tensors(whole), t1 = tensors(whole + ".rank1-of-2.b");
        const std::string w = "encoder.layers.0.linear1.weight";
        REQUIRE(t0.count(w) == 1);
        REQUIRE(t0.count("shard/" + w) == 1);
        REQUIRE(t1.count("shard/" + w) == 1);
        CHECK(t1.count(w) == 0);
        // Chunks of 128-element multiples covering the weight, padded: half of it each.
        CHECK(t0.at("shard/" + w).numel() == t1.at("shard/" + w).numel());
        CHECK(t0.at("shard/" + w).numel() * 2 >= t0.at(w).numel());
        CHECK(t0.at("shard/" + w).numel() * 2 < t0.at(w).numel() + 2 * 128);
        // Rank 0's chunk is the first elements of its whole weight, bitwise.
        CHECK(std::memcmp(t0.at("shard/" + w).raw_data(), t0.at(w).raw_data(),
                          t0.at("shard/" + w).nbytes()) == 0);
        r = run(regen_args({"train", "--model", "transformer-tiny", "--vocab", "256", "--load",
                            whole, "--steps", "1", "--threads", "1", "--progress", "none"}));
        INFO(r.out);
        CHECK(r.status == 0);
      }
    }
  }
}

TEST_CASE("two ranks: a resumed run is bitwise the uninterrupted one, in every shard mode, fp32") {
  check_bitwise_resume("fp32");
}

TEST_CASE("two ranks: a resumed run is bitwise the uninterrupted one, in every shard mode, bf16") {
  check_bitwise_resume("bf16");
}

TEST_CASE("two ranks: a state of another rank count, shard mode or save is refused, naming both") {
  TempDir dir;
  const std::vector<std::string> base = resume_base(dir, "optimizer", "fp32");
  const std::string state = dir.file("state.st");
  Result r = mpi_train(2, with(base, {"--steps", "2", "--save-state", state}));
  INFO(r.out);
  REQUIRE(r.status == 0);
  const std::vector<std::string> more = {"--steps", "3", "--resume", state};
  // Another shard mode.
  std::vector<std::string> other = base;
  other[other.size() - 3] = "none";  // --shard's value
  REQUIRE(other[other.size() - 4] == "--shard");
  r = mpi_train(2, with(other, more));
  INFO(r.out);
  CHECK(r.status != 0);
  CHECK(r.status != 137);
  CHECK(has(r.out, "--resume " + state +
                       " was saved with --shard optimizer, but this run has --shard none: a "
                       "training state is not resharded"));
  // One process.
  r = run(regen_args(with({"train"}, with(base, more))));
  INFO(r.out);
  CHECK(r.status != 0);
  CHECK(has(r.out, "--resume " + state +
                       " was saved by 2 ranks under mpirun (--shard optimizer), but this run has "
                       "one process"));
  CHECK(has(r.out, "resume it under mpirun -np 2 with --shard optimizer"));
  // Three ranks.
  r = run(mpirun() + " -np 3 " + regen_args(with({"train"}, with(base, more))));
  INFO(r.out);
  CHECK(r.status != 0);
  CHECK(r.status != 137);
  CHECK(has(r.out, "but this run has 3 ranks under mpirun"));
  // One process's state under mpirun.
  const std::string single = dir.file("single.st");
  r = run(regen_args(with({"train"}, with(base, {"--steps", "2", "--save-state", single}))));
  INFO(r.out);
  REQUIRE(r.status == 0);
  r = mpi_train(2, with(base, {"--steps", "3", "--resume", single}));
  INFO(r.out);
  CHECK(r.status != 0);
  CHECK(has(r.out, "--resume " + single +
                       " was saved by one process, but this run has 2 ranks under mpirun"));
  // A rank file of another save, then none.
  const std::string other_state = dir.file("other.st");
  r = mpi_train(2, with(base, {"--steps", "1", "--save-state", other_state}));
  INFO(r.out);
  REQUIRE(r.status == 0);
  fs::copy_file(other_state + ".rank1-of-2.a", state + ".rank1-of-2.a",
                fs::copy_options::overwrite_existing);
  r = mpi_train(2, with(base, more));
  INFO(r.out);
  CHECK(r.status != 0);
  CHECK(r.status != 137);
  CHECK(has(r.out, "rank 1 of 2's file " + state + ".rank1-of-2.a is not of the save that " +
                       state + " names"));
  fs::remove(state + ".rank1-of-2.a");
  r = mpi_train(2, with(base, more));
  INFO(r.out);
  CHECK(r.status != 0);
  CHECK(r.status != 137);
  CHECK(has(r.out, "rank 1 of 2's file " + state + ".rank1-of-2.a is missing"));
}

// Rank 1 cannot write its file (a folder stands at its name): no rank's file appears, no
// temporary is left, the error names the rank and the file; and a state saved before keeps every
// file as it was and still resumes.
TEST_CASE("two ranks: a save that fails on one rank writes no file and keeps the state before") {
  TempDir dir;
  const std::vector<std::string> base = resume_base(dir, "gradients", "fp32");
  const std::string fresh = dir.file("fresh.st");
  fs::create_directories(fresh + ".rank1-of-2.a");
  const std::vector<std::string> before = listing(dir.path);
  Result r = mpi_train(2, with(base, {"--steps", "1", "--save-state", fresh}));
  INFO(r.out);
  CHECK(r.status != 0);
  CHECK(r.status != 137);
  CHECK(has(r.out, "--save-state " + fresh + ": rank 1 of 2 could not write " + fresh +
                       ".rank1-of-2.a: "));
  CHECK(has(r.out, "no file of the state was written"));
  CHECK(listing(dir.path) == before);
  // A state of 1 step in slot a; its next save (slot b) fails on rank 1.
  const std::string state = dir.file("state.st");
  r = mpi_train(2, with(base, {"--steps", "1", "--save-state", state}));
  INFO(r.out);
  REQUIRE(r.status == 0);
  const std::string rank0 = read_file(state), rank1 = read_file(state + ".rank1-of-2.a");
  fs::create_directories(state + ".rank1-of-2.b");
  r = mpi_train(2, with(base, {"--steps", "2", "--resume", state, "--save-state", state}));
  INFO(r.out);
  CHECK(r.status != 0);
  CHECK(has(r.out, "rank 1 of 2 could not write " + state + ".rank1-of-2.b"));
  CHECK(read_file(state) == rank0);
  CHECK(read_file(state + ".rank1-of-2.a") == rank1);
  fs::remove(state + ".rank1-of-2.b");
  r = mpi_train(2, with(base, {"--steps", "2", "--resume", state}));
  INFO(r.out);
  CHECK(r.status == 0);
  CHECK(has(r.out, "resumed " + state + " at step 1"));
}

// Gradient accumulation as DDP's no_sync: the micro-batches before the last add their gradients
// up on each rank, the last one's backward reduces the sums. Two ranks at batch 2 with k
// micro-batches read, micro-batch by micro-batch, the global batches of 4 that one process at
// batch 4 with k micro-batches reads, so the runs agree up to the order of the sums: each rank's
// micro-batch gradient is a mean of 2 samples' and the ranks' are averaged, where one process
// takes the mean of 4; the k micro-batches are added in the same order in both. That is a few f32
// roundings (unit 2^-24, 6e-8) per gradient element and step, relative to the gradient, carried
// by SGD into parameters that move by lr * gradient per step: after 4 steps the parameters
// differ by well under 1e-5 of their largest value (the bound of the test without accumulation,
// two ranks at batch 4 against one at 8; measured here: about 1.1e-7, two f32 units at the
// largest parameter). A micro-batch's gradient lost, counted twice or not divided by k would be
// off by a part of a whole update (lr 0.05 times a gradient), orders of magnitude above the bound.
// (Reducing every micro-batch would be exact in arithmetic, the mean being linear; the next test
// catches it: its scratch in every micro-batch is not the predicted step.) ZeRO-1 keeps plain data
// parallelism's parameters bitwise.
TEST_CASE("two ranks with --accumulate 2 and 3 agree with one process at the global batch") {
  TempDir dir;
  {
    std::ofstream f(dir.file("text.txt"));
    for (int i = 0; i < 400; ++i) f << "sentence " << i << " of a small corpus, in bytes.\n";
  }
  const std::vector<std::string> base =
      with(kTiny, {"--model", "transformer-tiny", "--vocab", "256", "--dropout", "0", "--data",
                   "text:" + dir.file("text.txt"), "--lr", "0.05", "--bucket-size", "32KiB"});
  auto losses = [](const std::string& out) {
    std::vector<std::string> l;
    for (size_t at = out.find("/4 loss "); at != std::string::npos;
         at = out.find("/4 loss ", at + 1)) {
      l.push_back(out.substr(at + 8, 6));
    }
    return l;
  };
  for (const std::string k : {"2", "3"}) {
    CAPTURE(k);
    const std::string two_path = dir.file("two_" + k + ".safetensors");
    const Result two =
        mpi_train(2, with(base, {"--batch", "2", "--accumulate", k, "--save", two_path}));
    INFO(two.out);
    REQUIRE(two.status == 0);
    CHECK(has(two.out,
              "data parallel: 2 ranks (mpi collectives on cpu), global batch 4 (2 per "
              "rank) x " +
                  k + " micro-batches, reduced once per step"));
    const std::string one_path = dir.file("one_" + k + ".safetensors");
    const Result one = run(regen_args(
        with({"train"}, with(base, {"--batch", "4", "--accumulate", k, "--save", one_path}))));
    INFO(one.out);
    REQUIRE(one.status == 0);
    CHECK(losses(two.out).size() == 4);
    CHECK(losses(two.out) == losses(one.out));
    const double worst = worst_relative(one_path, two_path);
    MESSAGE("--accumulate " << k << ": worst relative parameter difference " << worst);
    CHECK(worst < 1e-5);
    CHECK(worst > 0);  // reductions of a different order: not bitwise
    // ZeRO-1 with accumulation: the same parameters, bitwise.
    const std::string z1_path = dir.file("z1_" + k + ".safetensors");
    const Result z1 = mpi_train(2, with(base, {"--batch", "2", "--accumulate", k, "--shard",
                                               "optimizer", "--save", z1_path}));
    INFO(z1.out);
    REQUIRE(z1.status == 0);
    CHECK(same(two_path, z1_path));
  }
}

// The last micro-batch communicates (its buckets' scratch) and the others do not: the profile
// keeps the last one and the simulator replays the others without the sync's requests, so every
// rank measures its predicted peaks on every step, under a plan that recomputes (dp at 85% of
// the allocated peak) and under one that recomputes nothing (dp at 100%: the profiled step's own
// replay), with the optimizer state sharded or not; with 3 micro-batches under the planned
// layout, which serves the step's k-th request at a planned place and refuses a request of another
// size (a simulated micro-batch with the scratch where the real one has none would shift every
// request after it).
TEST_CASE("two ranks with --accumulate: each rank measures its predicted peaks on every step") {
  for (const std::string shard : {"none", "optimizer"}) {
    for (const bool recompute : {true, false}) {
      for (const std::string k : {"2", "3"}) {
        CAPTURE(shard);
        CAPTURE(recompute);
        CAPTURE(k);
        std::vector<std::string> args = {"--model",       "resnet-tiny",
                                         "--image-size",  "64",
                                         "--batch",       "8",
                                         "--threads",     "1",
                                         "--steps",       "5",
                                         "--progress",    "none",
                                         "--shard",       shard,
                                         "--bucket-size", "64KiB",
                                         "--policy",      "dp",
                                         "--accumulate",  k,
                                         "--layout",      k == "3" ? "planned" : "caching"};
        args = with(args, recompute ? std::vector<std::string>{"--budget", "85%", "--budget-of",
                                                               "allocated"}
                                    : std::vector<std::string>{"--budget", "100%"});
        const Result r = mpi_train(2, args);
        INFO(r.out);
        REQUIRE(r.status == 0);
        CHECK(has(r.out, "exact on every one of the 3 steps under the plan"));
        CHECK(has(r.out, "recompute 0 of") != recompute);
        CHECK(has(r.out, "; exact on all 3 steps under the plan\n    rank 1:"));
        CHECK(has(r.out, "rank 1: gradient communication"));
        CHECK(has(r.out, "; exact on all 3 steps under the plan\n"));
      }
    }
  }
}

// Under ZeRO a rank holds a shard of the gradients: the global norm is its shard's sum of squares
// added across the ranks, so clipping (and the logged norm) are those of --shard none. The sums
// are taken in another order (per piece rather than per parameter), so the norms agree to float
// rounding, not bitwise: f32 partial sums of at most ~1e5 squares each, added in double, are within
// ~1e-6 of each other relative; the runs clip at every step (a norm of 0.05 against gradients of
// norm ~10), and a norm taken over one rank's shard alone would be about 1/sqrt(2) of the global
// one and move the parameters by a relative 1e-2 or more. The bound 1e-4 sits between the two.
TEST_CASE("two ranks: clipping and the gradient norm under ZeRO are the unsharded ones") {
  TempDir dir;
  const std::vector<std::string> base =
      with(kTiny, {"--model", "resnet-tiny", "--batch", "2", "--clip-grad-norm", "0.05"});
  std::map<std::string, std::string> saved, logs;
  for (const std::string shard : {"none", "optimizer", "gradients"}) {
    saved[shard] = dir.file("clip_" + shard + ".safetensors");
    logs[shard] = dir.file("clip_" + shard + ".csv");
    const Result r =
        mpi_train(2, with(base, {"--shard", shard, "--save", saved[shard], "--log", logs[shard]}));
    INFO(r.out);
    REQUIRE(r.status == 0);
  }
  // The logged norms (column grad_norm of each step's row).
  const auto norms = [](const std::string& path) {
    std::ifstream f(path);
    std::string line;
    std::vector<double> out;
    std::getline(f, line);  // the header: kind,step,loss,lr,grad_norm,...
    while (std::getline(f, line)) {
      std::stringstream row(line);
      std::string cell;
      for (int col = 0; col <= 4 && std::getline(row, cell, ','); ++col) {
        if (col == 4) out.push_back(std::stod(cell));
      }
    }
    return out;
  };
  const std::vector<double> plain = norms(logs["none"]);
  REQUIRE(plain.size() == 4);
  for (double n : plain) CHECK(n > 0.05);  // every step clipped
  for (const std::string shard : {"optimizer", "gradients"}) {
    CAPTURE(shard);
    const std::vector<double> got = norms(logs[shard]);
    REQUIRE(got.size() == plain.size());
    for (size_t i = 0; i < got.size(); ++i)
      CHECK(got[i] == doctest::Approx(plain[i]).epsilon(1e-4));
    CHECK(worst_relative(saved["none"], saved[shard]) < 1e-4);
  }
}

TEST_CASE("ranks started with other commands or options are refused, naming the rank") {
  // Another command line: rank 0 names both.
  Result r = run(mpirun() + " -np 1 " +
                     regen_args(with({"train", "--model", "resnet-tiny"}, kTiny)) + " : -np 1 " +
                     regen_args(with({"train", "--model", "resnet-tiny", "--seed", "9"}, kTiny)),
                 60);
  INFO(r.out);
  CHECK(r.status != 0);
  CHECK(r.status != 137);
  CHECK(has(r.out, "rank 0 of 2: rank 1 of 2 was started as `regen train"));
  // The same command in another environment: the session compares what shapes the step.
  r = run(mpirun() + " -np 1 -x OMP_NUM_THREADS=1 " +
              regen_args({"train", "--model", "resnet-tiny", "--steps", "2"}) +
              " : -np 1 -x OMP_NUM_THREADS=2 " +
              regen_args({"train", "--model", "resnet-tiny", "--steps", "2"}),
          60);
  INFO(r.out);
  CHECK(r.status != 0);
  CHECK(r.status != 137);
  CHECK(has(r.out, "rank 1 of 2 runs with --threads 2 where rank 0 runs with --threads 1"));
}

TEST_CASE("a killed rank ends the job, and mpirun names it: no rank hangs") {
  TempDir dir;
  const std::string log = dir.file("log.txt");
  const pid_t launcher = ::fork();
  REQUIRE(launcher >= 0);
  if (launcher == 0) {
    const std::string cmd =
        "exec " + mpirun() + " -np 2 " +
        regen_args({"train", "--model", "resnet-tiny", "--batch", "2", "--threads", "1", "--steps",
                    "100000", "--progress", "plain"}) +
        " >" + quote(log) + " 2>&1";
    ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  // Rank 1: a child of mpirun with OMPI_COMM_WORLD_RANK=1, once training has started (100000 steps:
  // minutes).
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  pid_t rank1 = -1;
  while (rank1 < 0 && clock::now() - start < std::chrono::seconds(60)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (!has(read_file(log), "data parallel: 2 ranks")) continue;
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // into the steps
    for (const auto& e : fs::directory_iterator("/proc")) {
      const std::string name = e.path().filename().string();
      if (name.find_first_not_of("0123456789") != std::string::npos) continue;
      std::ifstream stat(e.path() / "stat");
      std::string pid, comm, state;
      long ppid = 0;
      if (!(stat >> pid >> comm >> state >> ppid) || ppid != launcher) continue;
      std::ifstream env(e.path() / "environ", std::ios::binary);
      const std::string all((std::istreambuf_iterator<char>(env)),
                            std::istreambuf_iterator<char>());
      if (has(all, std::string("OMPI_COMM_WORLD_RANK=1") + '\0')) rank1 = std::stoi(name);
    }
  }
  REQUIRE_MESSAGE(rank1 > 0, read_file(log));
  REQUIRE(::kill(rank1, SIGKILL) == 0);
  const auto killed = clock::now();
  int status = 0;
  bool ended = false;
  while (clock::now() - killed < std::chrono::seconds(60)) {
    if (::waitpid(launcher, &status, WNOHANG) == launcher) {
      ended = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (!ended) {  // a hang: end it, and fail
    ::kill(-launcher, SIGKILL);
    ::kill(launcher, SIGKILL);
    ::waitpid(launcher, &status, 0);
  }
  const std::string out = read_file(log);
  INFO(out);
  CHECK(ended);
  CHECK((WIFEXITED(status) && WEXITSTATUS(status) != 0));
  CHECK(has(out, "rank 1"));
  CHECK(has(out, "signal 9"));
}
