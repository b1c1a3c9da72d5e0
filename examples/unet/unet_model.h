// The U-Net of examples/unet (unet.cpp describes it): defined outside regen, through the
// installed headers only, and registered as model "unet" by register_unet(), with its own input:
// images and a class per pixel (segmentation), its own synthetic data, and its own options
// (--width, --levels beside --image-size and --num-classes). The session, `unet-tool` (the
// command line) and the Python module (regen.load_extension, unet_extension.cpp) take it from
// there like a built-in model.
#pragma once

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "regen/autograd/ops.h"
#include "regen/core/error.h"
#include "regen/core/philox.h"
#include "regen/models/data.h"
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

// The U-Net's depth: its own option, kept in ModelConfig::params.
inline int levels_of(const ModelConfig& c) {
  const auto it = c.params.find("levels");
  return it == c.params.end() ? 4 : static_cast<int>(it->second);
}

class UNet : public Model {
 public:
  UNet(const ModelConfig& c, Device device) : Model(c), levels_(levels_of(c)) {
    Generator gen(c.seed);
    int64_t in = 3;
    for (int i = 0; i < levels_; ++i) {
      const int64_t w = c.base_width << i;
      down_.push_back(&register_module(
          "down" + std::to_string(i),
          std::make_unique<DoubleConv>("down" + std::to_string(i), in, w, gen, device)));
      in = w;
    }
    const int64_t wb = c.base_width << levels_;
    bottom_ =
        &register_module("bottom", std::make_unique<DoubleConv>("bottom", in, wb, gen, device));
    // The deepest upsampling is learned: a 2x2 transposed convolution with stride 2 that also
    // halves the channels; the others copy (bilinear, nearest) and keep them.
    const int64_t wt = c.base_width << (levels_ - 1);
    up_weight_ = &register_parameter("up.weight", make_param("up.weight", {wb, wt, 2, 2}, device));
    up_bias_ = &register_parameter("up.bias", make_param("up.bias", {wt}, device));
    up_weight_->copy_from(normal({wb, wt, 2, 2}, 0.0, 0.1, gen));
    up_bias_->copy_from(zeros({wt}));
    int64_t cur = wt;  // channels coming up into the deepest level
    for (int i = levels_ - 1; i >= 0; --i) {
      const int64_t skip = c.base_width << i;
      up_.insert(up_.begin(),
                 &register_module("up" + std::to_string(i),
                                  std::make_unique<DoubleConv>("up" + std::to_string(i), cur + skip,
                                                               skip, gen, device)));
      cur = skip;
    }
    // Class scores per pixel.
    head_ = &register_module(
        "head", std::make_unique<Conv2d>("head", cur, c.num_classes, 1, 1, 0, true, gen, device));
    assign_full_names();
  }

  // images (N, 3, S, S) -> class scores per pixel (N, classes, S, S)
  Tensor forward(const Tensor& input) override {
    std::vector<Tensor> skips;
    Tensor x = input;
    for (int i = 0; i < levels_; ++i) {
      x = down_[static_cast<size_t>(i)]->forward(x);
      skips.push_back(x);  // the long skips: each crosses every block below its level
      ModuleScope scope("pool" + std::to_string(i));
      x = max_pool2d(x, 2, 2, 0);
    }
    x = bottom_->forward(x);
    for (int i = levels_ - 1; i >= 0; --i) {
      {
        ModuleScope scope("up" + std::to_string(i) + "_sample");
        if (i == levels_ - 1)
          x = conv_transpose2d(x, *up_weight_, *up_bias_, 2, 0, 0);
        else
          x = upsample2x(x, i == levels_ - 2 ? UpsampleMode::bilinear : UpsampleMode::nearest);
        x = concat({x, skips[static_cast<size_t>(i)]}, 1);
      }
      x = up_[static_cast<size_t>(i)]->forward(x);
    }
    return head_->forward(x);
  }
  // Mean cross-entropy over every pixel: scores (N, C, S, S) against classes (N, S, S).
  Tensor loss(const Tensor& scores, const Tensor& target) const override {
    ModuleScope scope("loss");
    const int64_t classes = scores.size(1);
    const Tensor per_pixel = reshape(permute(scores, {0, 2, 3, 1}), {-1, classes});
    return cross_entropy(per_pixel, target.reshape({-1}));
  }
  void check_batch(const Batch& b) const override {
    const int64_t s = config_.image_size;
    REGEN_CHECK(b.input.defined() && b.input.dim() == 4 && b.input.size(1) == 3 &&
                    b.input.size(2) == s && b.input.size(3) == s,
                "unet: expected images (N, 3, ", s, ", ", s, "), got ", b.input.str());
    REGEN_CHECK(b.target.defined() && b.target.dtype() == DType::i64 &&
                    b.target.shape() == (Shape{b.input.size(0), s, s}),
                "unet: expected a class per pixel i64 (", b.input.size(0), ", ", s, ", ", s,
                "), got ", b.target.str());
  }

 private:
  int levels_;
  std::vector<DoubleConv*> down_, up_;
  DoubleConv* bottom_;
  Tensor *up_weight_, *up_bias_;
  Conv2d* head_;
};

// Synthetic scenes: a background (class 0) and one axis-aligned rectangle per other class at a
// random place and size, each class with its own colour plus noise, so a network can learn to
// label the pixels.
class SyntheticScenes final : public DataSource {
 public:
  SyntheticScenes(const ModelConfig& c, uint64_t seed)
      : s_(c.image_size), classes_(c.num_classes), seed_(seed) {}
  Batch next(int64_t n, Device device) override {
    const int64_t hw = s_ * s_;
    HostArray images{{n, 3, s_, s_}, std::vector<float>(static_cast<size_t>(n * 3 * hw)), {}};
    HostArray labels{{n, s_, s_}, {}, std::vector<int64_t>(static_cast<size_t>(n * hw), 0)};
    for (int64_t i = 0; i < n; ++i) {
      const uint64_t sample = counter_++;
      int64_t* lab = labels.i64.data() + i * hw;
      for (int64_t k = 1; k < classes_; ++k) {
        auto draw = [&](int j) {
          return static_cast<int64_t>(
              philox_word(seed_, 1, (sample * static_cast<uint64_t>(classes_) + k) * 4 + j) %
              static_cast<uint64_t>(s_));
        };
        const int64_t y0 = draw(0), x0 = draw(1), h = 1 + draw(2) / 2, w = 1 + draw(3) / 2;
        for (int64_t y = y0; y < std::min(s_, y0 + h); ++y)
          for (int64_t x = x0; x < std::min(s_, x0 + w); ++x) lab[y * s_ + x] = k;
      }
      for (int64_t c = 0; c < 3; ++c) {
        float* p = images.f32.data() + (i * 3 + c) * hw;
        for (int64_t e = 0; e < hw; ++e) {
          const uint64_t colour = static_cast<uint64_t>(lab[e] * 3 + c);
          const uint64_t idx = (sample * 3 + static_cast<uint64_t>(c)) * static_cast<uint64_t>(hw) +
                               static_cast<uint64_t>(e);
          p[e] = 2.0f * philox_uniform01(philox_word(seed_, 2, colour)) - 1.0f +
                 0.5f * (philox_uniform01(philox_word(seed_, 3, idx)) - 0.5f);
        }
      }
    }
    return batch_on_device(images, labels, device);
  }
  std::string describe() const override {
    return "synthetic scenes " + std::to_string(s_) + "x" + std::to_string(s_) + ", " +
           std::to_string(classes_) + " classes per pixel (seed " + std::to_string(seed_) + ")";
  }

 private:
  int64_t s_, classes_;
  uint64_t seed_;
  uint64_t counter_ = 0;
};

// What the U-Net takes: images (N, 3, S, S) and a class per pixel (N, S, S), S a multiple of
// 2^levels; its synthetic scenes; the options --image-size, --num-classes, --width (the first
// level's channels) and --levels (poolings, 1 to 6).
inline ModelInput unet_input() {
  ModelInput in;
  in.help = "images (N, 3, S, S) f32 with a class per pixel (N, S, S) i64";
  in.batch = [](const ModelConfig& c, int64_t n) {
    return BatchSpec{{{n, 3, c.image_size, c.image_size}, DType::f32},
                     {{n, c.image_size, c.image_size}, DType::i64}};
  };
  DataKind scenes;
  scenes.name = "synthetic";
  scenes.help = "synthetic scenes: a rectangle of each class on a background (the default)";
  scenes.make = [](const std::string&, const ModelConfig& c, uint64_t seed, OptionStyle) {
    return std::unique_ptr<DataSource>(std::make_unique<SyntheticScenes>(c, seed));
  };
  in.data = {scenes};
  ModelOption size = integer_option("image_size", "input height and width (default: the preset's)",
                                    OptionRange::integers(1, 4096), &ModelConfig::image_size);
  size.sizes_step = true;
  ModelOption classes =
      integer_option("num_classes", "classes (default: the preset's)",
                     OptionRange::integers(2, 1 << 16), &ModelConfig::num_classes);
  classes.sizes_parameters = true;
  ModelOption width = integer_option("width", "the U-Net's first level's channels (default 8)",
                                     OptionRange::integers(1, 1024), &ModelConfig::base_width);
  width.sizes_step = width.sizes_parameters = true;
  ModelOption levels =
      param_option("levels", "the U-Net's poolings (default 4)", OptionRange::integers(1, 6), 4);
  levels.sizes_parameters = true;
  in.options = {size, classes, width, levels};
  in.check = [](const ModelConfig& c, int64_t batch, OptionStyle style) {
    const int levels = levels_of(c);
    const int64_t step = int64_t{1} << levels;
    REGEN_CHECK(c.image_size % step == 0,
                option_setting("image_size", std::to_string(c.image_size), style),
                " is not a multiple of ", step, ", as the U-Net's ",
                option_setting("levels", std::to_string(levels), style), " poolings need");
    const int64_t side = c.image_size / step;
    REGEN_CHECK(batch >= 2 || side >= 2, option_setting("batch", std::to_string(batch), style),
                " at ", option_setting("image_size", std::to_string(c.image_size), style),
                ": the bottom level's batch norm needs at least 2 values per channel; use ",
                option_setting("batch", "2", style), " or more");
  };
  return in;
}

// Registers "unet": 64x64 images, 4 classes per pixel, width 8, 4 levels.
inline void register_unet() {
  ModelConfig preset;
  preset.base_width = 8;
  preset.num_classes = 4;
  preset.image_size = 64;
  register_model({"unet", "U-Net segmentation, concat skips (examples/unet)", preset,
                  [](const ModelConfig& c, Device d) { return std::make_unique<UNet>(c, d); },
                  unet_input()});
}

}  // namespace unet
