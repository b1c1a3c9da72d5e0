// ResNet (resnet.h).
#include "regen/models/resnet.h"

namespace regen {

namespace {
// A container module named like torch.nn.Sequential's children ("0", "1").
class Sequential : public Module {
 public:
  explicit Sequential(const std::string& name) : Module(name) {}
  template <class M>
  M& add(const std::string& name, std::unique_ptr<M> m) {
    return register_module(name, std::move(m));
  }
};
}  // namespace

ResNetBlock::ResNetBlock(const std::string& name, int64_t inplanes, int64_t planes, int64_t stride,
                         bool bottleneck, Generator& gen, Device device)
    : Module(name), bottleneck_(bottleneck) {
  const int64_t out = planes * expansion(bottleneck);
  if (bottleneck) {
    conv1_ = &register_module(
        "conv1", std::make_unique<Conv2d>("conv1", inplanes, planes, 1, 1, 0, false, gen, device));
    bn1_ = &register_module("bn1", std::make_unique<BatchNorm2d>("bn1", planes, device));
    conv2_ = &register_module("conv2", std::make_unique<Conv2d>("conv2", planes, planes, 3, stride,
                                                                1, false, gen, device));
    bn2_ = &register_module("bn2", std::make_unique<BatchNorm2d>("bn2", planes, device));
    conv3_ = &register_module(
        "conv3", std::make_unique<Conv2d>("conv3", planes, out, 1, 1, 0, false, gen, device));
    bn3_ = &register_module("bn3", std::make_unique<BatchNorm2d>("bn3", out, device));
  } else {
    conv1_ = &register_module("conv1", std::make_unique<Conv2d>("conv1", inplanes, planes, 3,
                                                                stride, 1, false, gen, device));
    bn1_ = &register_module("bn1", std::make_unique<BatchNorm2d>("bn1", planes, device));
    conv2_ = &register_module(
        "conv2", std::make_unique<Conv2d>("conv2", planes, planes, 3, 1, 1, false, gen, device));
    bn2_ = &register_module("bn2", std::make_unique<BatchNorm2d>("bn2", planes, device));
  }
  if (stride != 1 || inplanes != out) {
    auto down = std::make_unique<Sequential>("downsample");
    down_conv_ = &down->add(
        "0", std::make_unique<Conv2d>("0", inplanes, out, 1, stride, 0, false, gen, device));
    down_bn_ = &down->add("1", std::make_unique<BatchNorm2d>("1", out, device));
    register_module("downsample", std::move(down));
  }
  // torchvision (zero_init_residual=False) leaves the last BN's weight at 1.
}

Tensor ResNetBlock::forward(const Tensor& x) {
  ModuleScope scope(name());
  BlockScope block("");
  Tensor out = relu(bn1_->forward(conv1_->forward(x)));
  out = bn2_->forward(conv2_->forward(out));
  if (bottleneck_) out = bn3_->forward(conv3_->forward(relu(out)));
  Tensor identity = x;
  if (down_conv_) {
    ModuleScope down("downsample");
    identity = down_bn_->forward(down_conv_->forward(x));
  }
  return relu(add(out, identity));
}

ModelInput ResNet::input() {
  ModelInput in = image_classifier_input();
  in.check = [](const ModelConfig& c, int64_t batch, OptionStyle style) {
    REGEN_CHECK(c.image_size >= 32,
                option_setting("image_size", std::to_string(c.image_size), style),
                " is too small for ResNet's five downsamplings (at least 32)");
    // Batch norm in training needs two values per channel; the last stage's map is the image
    // size over 32 (rounded up) on a side. (batch * side * side >= 2, without overflow.)
    const int64_t side = c.image_size / 32 + (c.image_size % 32 != 0);
    REGEN_CHECK(batch >= 2 || side >= 2, option_setting("batch", std::to_string(batch), style),
                " at ", option_setting("image_size", std::to_string(c.image_size), style),
                ": batch norm in training needs at least 2 values per channel, and the last "
                "stage's maps are ",
                side, "x", side, "; use ", option_setting("batch", "2", style), " or more");
  };
  return in;
}

ResNet::ResNet(const ModelConfig& c, Device device) : Model(c) {
  REGEN_CHECK(c.blocks.size() == 4, "ResNet '", c.name, "' needs 4 stages, got ", c.blocks.size());
  REGEN_CHECK(c.base_width > 0 && c.num_classes > 0, "ResNet '", c.name,
              "': base width and number of classes must be positive");
  Generator gen(c.seed);
  conv1_ = &register_module(
      "conv1", std::make_unique<Conv2d>("conv1", 3, c.base_width, 7, 2, 3, false, gen, device));
  bn1_ = &register_module("bn1", std::make_unique<BatchNorm2d>("bn1", c.base_width, device));
  int64_t inplanes = c.base_width;
  for (int s = 0; s < 4; ++s) {
    const std::string stage = "layer" + std::to_string(s + 1);
    auto seq = std::make_unique<Sequential>(stage);
    std::vector<ResNetBlock*> blocks;
    const int64_t planes = c.base_width << s;
    for (int64_t b = 0; b < c.blocks[s]; ++b) {
      const int64_t stride = (b == 0 && s > 0) ? 2 : 1;
      blocks.push_back(&seq->add(std::to_string(b),
                                 std::make_unique<ResNetBlock>(std::to_string(b), inplanes, planes,
                                                               stride, c.bottleneck, gen, device)));
      inplanes = planes * ResNetBlock::expansion(c.bottleneck);
    }
    register_module(stage, std::move(seq));
    stages_.push_back(std::move(blocks));
  }
  fc_ = &register_module(
      "fc", std::make_unique<Linear>("fc", inplanes, c.num_classes, true, gen, device));
  assign_full_names();
}

Tensor ResNet::forward(const Tensor& input) {
  Tensor x = relu(bn1_->forward(conv1_->forward(input)));
  {
    ModuleScope scope("maxpool");
    x = max_pool2d(x, 3, 2, 1);
  }
  for (size_t s = 0; s < stages_.size(); ++s) {
    ModuleScope scope("layer" + std::to_string(s + 1));
    for (ResNetBlock* b : stages_[s]) x = b->forward(x);
  }
  {
    ModuleScope scope("avgpool");
    x = flatten(global_avg_pool(x), 1);
  }
  return fc_->forward(x);
}

Tensor ResNet::loss(const Tensor& logits, const Tensor& target) const {
  ModuleScope scope("loss");
  return cross_entropy(logits, target);
}

void ResNet::check_batch(const Batch& b) const {
  REGEN_CHECK(b.input.defined() && b.input.dim() == 4 && b.input.size(1) == 3 &&
                  b.input.dtype() == DType::f32,
              config_.name, ": expected images f32 (N, 3, H, W), got ", b.input.str());
  REGEN_CHECK(b.target.defined() && b.target.dtype() == DType::i64 &&
                  b.target.shape() == Shape{b.input.size(0)},
              config_.name, ": expected labels i64 (", b.input.size(0), "), got ", b.target.str());
}

}  // namespace regen
