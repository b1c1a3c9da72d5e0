// Shared setup of the regen subcommands (common.h).
#include "tools/common.h"

#include <omp.h>
#include <unistd.h>

#include <cstdio>

#ifdef REGEN_WITH_CUDA
#include "core/cuda/runtime.h"
#include "kernels/cuda/cuda_kernels.h"
#endif

namespace regen::tool {

void add_model_flags(CLI::App& app, ModelFlags& f, bool with_batch) {
  std::string names;
  for (const std::string& n : model_preset_names()) names += (names.empty() ? "" : ", ") + n;
  app.add_option("--model", f.model, "model preset: " + names)->capture_default_str();
  if (with_batch) {
    app.add_option("--batch", f.batch, "batch size (images or sequences)")
        ->check(CLI::PositiveNumber)
        ->capture_default_str();
  }
  app.add_option("--device", f.device, "auto, cpu, cuda or cuda:N (auto picks cuda when present)")
      ->capture_default_str();
  app.add_option("--image-size", f.image_size, "ResNet input height and width (default: preset)")
      ->check(CLI::PositiveNumber);
  app.add_option("--num-classes", f.num_classes, "ResNet classes (default: preset)")
      ->check(CLI::PositiveNumber);
  app.add_option("--seq-len", f.seq_len, "Transformer sequence length (default: preset)")
      ->check(CLI::PositiveNumber);
  app.add_option("--dropout", f.dropout, "Transformer dropout probability (default: preset)")
      ->check(CLI::Range(0.0, 0.99));
  app.add_option("--optimizer", f.optimizer, "sgd or adamw")
      ->check(CLI::IsMember({"sgd", "adamw"}))
      ->capture_default_str();
  app.add_option("--lr", f.lr, "learning rate")->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--momentum", f.momentum, "SGD momentum")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  app.add_option("--weight-decay", f.weight_decay, "weight decay")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--seed", f.seed, "seed of initialization, data and dropout")->capture_default_str();
  app.add_option("--threads", f.threads, "CPU threads (default: OpenMP's)")->check(CLI::PositiveNumber);
  app.add_option("--data", f.data,
                 "synthetic (default), cifar10:DIR (CIFAR-10 binary batches) or text:FILE "
                 "(UTF-8 text as byte tokens)");
  app.add_option("--conv", f.conv, "CUDA convolution: native (regen's kernels) or cudnn")
      ->check(CLI::IsMember({"native", "cudnn"}))
      ->capture_default_str();
  app.add_flag("--tf32", f.tf32, "CUDA GEMMs with TF32 tensor cores (default FP32)");
}

Device resolve_device(const std::string& text) {
  if (text == "auto") {
#ifdef REGEN_WITH_CUDA
    if (cuda::device_count() > 0) return Device::cuda(0);
#endif
    return Device::cpu();
  }
  const Device d = Device::parse(text);
#ifdef REGEN_WITH_CUDA
  if (d.is_cuda()) {
    const int n = cuda::device_count();
    REGEN_CHECK(d.index < n, "--device ", text, ": ", n, " CUDA device(s) visible");
  }
#else
  REGEN_CHECK(d.is_cpu(), "--device ", text, ": regen was built without CUDA support");
#endif
  return d;
}

int apply_runtime_flags(const ModelFlags& f) {
  if (f.threads > 0) omp_set_num_threads(f.threads);
#ifdef REGEN_WITH_CUDA
  cuda::set_conv_algo(f.conv == "cudnn" ? cuda::ConvAlgo::cudnn : cuda::ConvAlgo::native);
  cuda::set_tf32(f.tf32);
#else
  REGEN_CHECK(!f.tf32 && f.conv == "native", "--tf32 and --conv cudnn need a CUDA build");
#endif
  return omp_get_max_threads();
}

std::unique_ptr<Session> make_session(const ModelFlags& flags, int64_t batch) {
  REGEN_CHECK(batch > 0, "batch size must be positive, got ", batch);
  auto s = std::make_unique<Session>();
  s->flags = flags;
  s->device = resolve_device(flags.device);
  apply_runtime_flags(flags);
  s->config = model_preset(flags.model);
  ModelConfig& c = s->config;
  if (flags.image_size > 0) {
    REGEN_CHECK(c.family == ModelFamily::resnet, "--image-size applies to ResNet models, not '",
                flags.model, "'");
    REGEN_CHECK(flags.image_size >= 32, "--image-size ", flags.image_size,
                " is too small for ResNet's five downsamplings (at least 32)");
    c.image_size = flags.image_size;
  }
  if (flags.num_classes > 0) {
    REGEN_CHECK(c.family == ModelFamily::resnet, "--num-classes applies to ResNet models");
    c.num_classes = flags.num_classes;
  }
  if (flags.seq_len > 0) {
    REGEN_CHECK(c.family == ModelFamily::transformer, "--seq-len applies to Transformer models");
    c.seq_len = flags.seq_len;
  }
  if (flags.dropout >= 0) {
    REGEN_CHECK(c.family == ModelFamily::transformer, "--dropout applies to Transformer models");
    c.dropout = static_cast<float>(flags.dropout);
  }
  c.seed = flags.seed;
  manual_seed(flags.seed);
  s->model = make_model(c, s->device);
  if (flags.optimizer == "sgd") {
    SGDOptions o;
    o.lr = flags.lr;
    o.momentum = flags.momentum;
    o.weight_decay = flags.weight_decay;
    s->optimizer = std::make_unique<SGD>(s->model->parameters(), o);
  } else {
    AdamWOptions o;
    o.lr = flags.lr;
    o.weight_decay = flags.weight_decay;
    s->optimizer = std::make_unique<AdamW>(s->model->parameters(), o);
  }
  s->data = make_data_source(flags.data, c, flags.seed);
  s->trainer = std::make_unique<Trainer>(*s->model, *s->optimizer, *s->data, batch, s->device);
  return s;
}

std::string gib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", static_cast<double>(bytes) / (1ull << 30));
  return buf;
}

bool stdout_is_terminal() { return ::isatty(STDOUT_FILENO) == 1; }

}  // namespace regen::tool
