// ResNet 18/34/50/101/152 laid out like torchvision's (parameter names and shapes match, so
// weights move between the two): conv1, bn1, maxpool, layer1..4 of BasicBlock or Bottleneck
// (stride on the 3x3 conv, "v1.5"), downsample.{0,1}, avgpool, fc. Each block is a BlockScope.
#pragma once

#include "regen/models/data.h"
#include "regen/models/layers.h"
#include "regen/models/model.h"

namespace regen {

class ResNetBlock : public Module {
 public:
  ResNetBlock(const std::string& name, int64_t inplanes, int64_t planes, int64_t stride,
              bool bottleneck, Generator& gen, Device device);
  Tensor forward(const Tensor& x);
  static int64_t expansion(bool bottleneck) { return bottleneck ? 4 : 1; }

 private:
  bool bottleneck_;
  Conv2d *conv1_, *conv2_, *conv3_ = nullptr;
  BatchNorm2d *bn1_, *bn2_, *bn3_ = nullptr;
  Conv2d* down_conv_ = nullptr;
  BatchNorm2d* down_bn_ = nullptr;
};

class ResNet : public Model {
 public:
  ResNet(const ModelConfig& config, Device device);
  // What a ResNet takes: images and class labels (data.h image_classifier_input) at least 32
  // pixels on a side (five downsamplings), in batches that leave batch norm 2 values per channel.
  static ModelInput input();
  Tensor forward(const Tensor& input) override;
  Tensor loss(const Tensor& logits, const Tensor& target) const override;
  void check_batch(const Batch& b) const override;

 private:
  Conv2d* conv1_;
  BatchNorm2d* bn1_;
  std::vector<std::vector<ResNetBlock*>> stages_;
  Linear* fc_;
};

}  // namespace regen
