// Training data: synthetic batches from a fixed seed (the default), CIFAR-10 binary batches
// (`cifar10:DIR`) for ResNet and a UTF-8 text file as byte tokens (`text:FILE`) for the
// Transformer. Every batch is created in the input memory category. Tests: tests/test_models.cpp
// (batches), tests/test_cli.cpp (bad specs and files).
#pragma once

#include <memory>
#include <string>

#include "regen/models/model.h"

namespace regen {

class DataSource {
 public:
  virtual ~DataSource() = default;
  virtual Batch next(int64_t batch_size, Device device) = 0;
  virtual std::string describe() const = 0;
};

// spec: "" or "synthetic", "cifar10:DIR", "text:FILE". Checks the spec against the model family
// and its sizes; a missing, truncated or malformed file is a regen::Error naming it.
std::unique_ptr<DataSource> make_data_source(const std::string& spec, const ModelConfig& model,
                                             uint64_t seed);

// Batches of the right shapes, dtypes, categories and tags for `model` and no values (a dry run,
// core/allocator.h DryRunScope): the blocks every real source's batch takes, nothing written.
std::unique_ptr<DataSource> make_shape_source(const ModelConfig& model);

}  // namespace regen
