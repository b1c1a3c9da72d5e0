// Setup shared by the regen subcommands: model/optimizer/data flags, device choice, threads,
// and the objects a training run needs.
#pragma once

#include <CLI/CLI.hpp>

#include <memory>
#include <string>

#include "models/data.h"
#include "models/optim.h"
#include "models/train.h"

namespace regen::tool {

struct ModelFlags {
  std::string model = "resnet-tiny";
  int64_t batch = 4;
  std::string device = "auto";
  int64_t image_size = 0;   // 0: the preset's
  int64_t num_classes = 0;
  int64_t seq_len = 0;
  double dropout = -1;      // < 0: the preset's
  std::string optimizer = "sgd";
  double lr = 0.1;
  double momentum = 0.9;
  double weight_decay = 0.0;
  uint64_t seed = 0;
  int threads = 0;          // 0: OpenMP's default
  std::string data;         // "", synthetic, cifar10:DIR, text:FILE
  std::string conv = "native";  // CUDA convolution: native or cudnn
  bool tf32 = false;
};

// Adds the flags above to `app` (`with_batch` false for commands that take --batches).
void add_model_flags(CLI::App& app, ModelFlags& f, bool with_batch = true);

// "auto": cuda:0 when regen was built with CUDA and a GPU is visible, else cpu.
Device resolve_device(const std::string& text);

// Everything one training run needs, built from the flags on a fresh allocator state.
struct Session {
  ModelFlags flags;
  Device device;
  ModelConfig config;
  std::unique_ptr<Model> model;
  std::unique_ptr<Optimizer> optimizer;
  std::unique_ptr<DataSource> data;
  std::unique_ptr<Trainer> trainer;
};
std::unique_ptr<Session> make_session(const ModelFlags& flags, int64_t batch);

// Applies --threads and the CUDA settings; returns the thread count in use.
int apply_runtime_flags(const ModelFlags& f);

std::string gib(int64_t bytes);  // "1.234" (GiB, 2^30 bytes)
bool stdout_is_terminal();

}  // namespace regen::tool
