// libFuzzer: the data loaders: the input as a text file (`--data text:FILE`, byte tokens for a
// Transformer) and as a CIFAR-10 batch file (`--data cifar10:DIR`), each asked for two batches.
#include <sys/stat.h>

#include <cstdint>
#include <string>

#include "regen/models/data.h"
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
  return 0;
}
