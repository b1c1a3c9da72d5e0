// libFuzzer: the data loaders: the input as a text file (`--data text:FILE`, byte tokens for a
// Transformer), as a CIFAR-10 batch file (`--data cifar10:DIR`) and as an llm.c token shard
// (`--data tokens:FILE`, gpt2-tiny), each asked for two batches; and the input as an llm.c
// checkpoint, its sizes read and loaded into gpt2-tiny (models/gpt2_llmc.h).
#include <sys/stat.h>

#include <cstdint>
#include <string>

#include "regen/models/data.h"
#include "regen/models/gpt2_llmc.h"
#include "regen/models/model.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace regen;
  const std::string text = fuzz::write_input("text.txt", data, size);
  fuzz::refuse_or_accept([&] {
    ModelConfig m = model_preset("transformer-tiny");
    m.vocab = 256;
    auto source = make_data_source("text:" + text, m, 1);
    source->next(2, Device::cpu());
    source->next(2, Device::cpu());
  });
  const std::string dir = fuzz::scratch() + "/cifar";
  ::mkdir(dir.c_str(), 0700);
  for (int i = 1; i <= 5; ++i)
    fuzz::write_input("cifar/data_batch_" + std::to_string(i) + ".bin", data, size);
  fuzz::refuse_or_accept([&] {
    ModelConfig m = model_preset("resnet-tiny");
    m.image_size = 32;
    m.num_classes = 10;
    auto source = make_data_source("cifar10:" + dir, m, 1);
    source->next(2, Device::cpu());
    source->next(2, Device::cpu());
  });
  const std::string shard = fuzz::write_input("tokens.bin", data, size);
  fuzz::refuse_or_accept([&] {
    ModelConfig m = model_preset("gpt2-tiny");
    auto source = make_data_source("tokens:" + shard, m, 1);
    source->next(2, Device::cpu());
    source->next(2, Device::cpu());
  });
  fuzz::refuse_or_accept([&] {
    const ModelConfig m = gpt2_config_from_llmc(shard, model_preset("gpt2-tiny"));
    // Only sizes as small as gpt2-tiny's: a header may name a model of any size.
    if (m.layers > 4 || m.d_model > 64 || m.vocab > 512 || m.seq_len > 64) return;
    std::unique_ptr<Model> model = make_model(m, Device::cpu());
    load_llmc_checkpoint(*model, shard);
  });
  return 0;
}
