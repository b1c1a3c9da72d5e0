// The U-Net of examples/unet (unet.cpp describes it): defined outside regen, through the
// installed headers only, and registered as model "unet" by register_unet().
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "regen/autograd/ops.h"
#include "regen/core/error.h"
#include "regen/models/layers.h"
#include "regen/models/model.h"

namespace unet {

using namespace regen;

// conv3x3 - bn - relu, twice: one block for the planners (blocks, sqrt and dp's chain).
class DoubleConv : public Module {
 public:
  DoubleConv(const std::string& name, int64_t in, int64_t out, Generator& gen, Device device)
      : Module(name) {
    conv1_ = &register_module(
        "conv1", std::make_unique<Conv2d>("conv1", in, out, 3, 1, 1, false, gen, device));
    bn1_ = &register_module("bn1", std::make_unique<BatchNorm2d>("bn1", out, device));
    conv2_ = &register_module(
        "conv2", std::make_unique<Conv2d>("conv2", out, out, 3, 1, 1, false, gen, device));
    bn2_ = &register_module("bn2", std::make_unique<BatchNorm2d>("bn2", out, device));
  }
  Tensor forward(const Tensor& x) {
    ModuleScope scope(name());
    BlockScope block("");
    const Tensor h = relu(bn1_->forward(conv1_->forward(x)));
    return relu(bn2_->forward(conv2_->forward(h)));
  }

 private:
  Conv2d *conv1_, *conv2_;
  BatchNorm2d *bn1_, *bn2_;
};

class UNet : public Model {
 public:
  static constexpr int kLevels = 4;

  UNet(const ModelConfig& c, Device device) : Model(c) {
    REGEN_CHECK(c.image_size % (1 << kLevels) == 0, "unet: --image-size must be a multiple of ",
                1 << kLevels, " (", kLevels, " poolings), got ", c.image_size);
    REGEN_CHECK(c.base_width > 0 && c.num_classes > 1, "unet: width and classes must be positive");
    Generator gen(c.seed);
    int64_t in = 3;
    for (int i = 0; i < kLevels; ++i) {
      const int64_t w = c.base_width << i;
      down_.push_back(&register_module(
          "down" + std::to_string(i),
          std::make_unique<DoubleConv>("down" + std::to_string(i), in, w, gen, device)));
      in = w;
    }
    const int64_t wb = c.base_width << kLevels;
    bottom_ =
        &register_module("bottom", std::make_unique<DoubleConv>("bottom", in, wb, gen, device));
    // The deepest upsampling is learned: a 2x2 transposed convolution with stride 2 that also
    // halves the channels; the others copy (bilinear, nearest) and keep them.
    const int64_t w3 = c.base_width << (kLevels - 1);
    up_weight_ =
        &register_parameter("up3.weight", make_param("up3.weight", {wb, w3, 2, 2}, device));
    up_bias_ = &register_parameter("up3.bias", make_param("up3.bias", {w3}, device));
    up_weight_->copy_from(normal({wb, w3, 2, 2}, 0.0, 0.1, gen));
    up_bias_->copy_from(zeros({w3}));
    int64_t cur = w3;  // channels coming up into level 3
    for (int i = kLevels - 1; i >= 0; --i) {
      const int64_t skip = c.base_width << i;
      up_.insert(up_.begin(),
                 &register_module("up" + std::to_string(i),
                                  std::make_unique<DoubleConv>("up" + std::to_string(i), cur + skip,
                                                               skip, gen, device)));
      cur = skip;
    }
    head_ = &register_module(
        "head", std::make_unique<Conv2d>("head", cur, c.num_classes, 1, 1, 0, true, gen, device));
    assign_full_names();
  }

  Tensor forward(const Tensor& input) override {
    std::vector<Tensor> skips;
    Tensor x = input;
    for (int i = 0; i < kLevels; ++i) {
      x = down_[i]->forward(x);
      skips.push_back(x);  // the long skips: each crosses every block below its level
      ModuleScope scope("pool" + std::to_string(i));
      x = max_pool2d(x, 2, 2, 0);
    }
    x = bottom_->forward(x);
    for (int i = kLevels - 1; i >= 0; --i) {
      {
        ModuleScope scope("up" + std::to_string(i) + "_sample");
        if (i == kLevels - 1)
          x = conv_transpose2d(x, *up_weight_, *up_bias_, 2, 0, 0);
        else
          x = upsample2x(x, i == kLevels - 2 ? UpsampleMode::bilinear : UpsampleMode::nearest);
        x = concat({x, skips[static_cast<size_t>(i)]}, 1);
      }
      x = up_[static_cast<size_t>(i)]->forward(x);
    }
    ModuleScope scope("head");
    return flatten(global_avg_pool(head_->forward(x)), 1);
  }
  Tensor loss(const Tensor& logits, const Tensor& target) const override {
    ModuleScope scope("loss");
    return cross_entropy(logits, target);
  }
  void check_batch(const Batch& b) const override {
    REGEN_CHECK(b.input.defined() && b.input.dim() == 4 && b.input.size(1) == 3 &&
                    b.input.size(2) == config_.image_size && b.input.size(3) == config_.image_size,
                "unet: expected images (N, 3, ", config_.image_size, ", ", config_.image_size,
                "), got ", b.input.str());
  }

 private:
  std::vector<DoubleConv*> down_, up_;
  DoubleConv* bottom_;
  Tensor *up_weight_, *up_bias_;
  Conv2d* head_;
};

// Registers "unet": an image classifier (images and labels from the built-in data, --image-size,
// --num-classes), 64x64 images, 10 classes, width 8 (the first level's channels).
inline void register_unet() {
  ModelConfig preset;
  preset.family = ModelFamily::resnet;
  preset.base_width = 8;
  preset.num_classes = 10;
  preset.image_size = 64;
  register_model({"unet", "U-Net, 4 levels, concat skips (examples/unet)", preset,
                  [](const ModelConfig& c, Device d) { return std::make_unique<UNet>(c, d); }});
}

}  // namespace unet
