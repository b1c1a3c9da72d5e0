// Layers (layers.h). Initializations follow torch.nn's defaults (and torchvision's ResNet for
// convolutions) so freshly built models have the usual scales; parity tests load weights.
#include "regen/models/layers.h"

#include <cmath>

namespace regen {

Tensor make_param(const std::string& name, const Shape& shape, Device device) {
  CategoryScope cat(Category::parameter);
  TagScope tag(name);
  return empty(shape, DType::f32, device);
}

namespace {
// Parameters are drawn on the host then copied, so every device gets the same values.
Tensor init_uniform(const std::string& name, const Shape& shape, double bound, Generator& gen,
                    Device device) {
  CategoryScope cat(Category::parameter);
  TagScope tag(name);
  return uniform(shape, -bound, bound, gen, DType::f32, device);
}
Tensor init_normal(const std::string& name, const Shape& shape, double stddev, Generator& gen,
                   Device device) {
  CategoryScope cat(Category::parameter);
  TagScope tag(name);
  return normal(shape, 0.0, stddev, gen, DType::f32, device);
}
Tensor init_const(const std::string& name, const Shape& shape, double value, Device device) {
  CategoryScope cat(Category::parameter);
  TagScope tag(name);
  return full(shape, value, DType::f32, device);
}
}  // namespace

Linear::Linear(const std::string& name, int64_t in, int64_t out, bool bias, Generator& gen,
               Device device)
    : Module(name) {
  REGEN_CHECK(in > 0 && out > 0, "Linear '", name, "': sizes must be positive, got ", in, " -> ",
              out);
  const double bound = 1.0 / std::sqrt(static_cast<double>(in));
  weight_ =
      &register_parameter("weight", init_uniform(name + ".weight", {out, in}, bound, gen, device));
  if (bias) {
    bias_ = &register_parameter("bias", init_uniform(name + ".bias", {out}, bound, gen, device));
  }
}

Tensor Linear::forward(const Tensor& x) const {
  ModuleScope scope(name());
  return linear(x, *weight_, bias_ ? *bias_ : Tensor());
}

Conv2d::Conv2d(const std::string& name, int64_t in, int64_t out, int64_t kernel, int64_t stride,
               int64_t padding, bool bias, Generator& gen, Device device)
    : Module(name), stride_(stride), padding_(padding) {
  REGEN_CHECK(in > 0 && out > 0 && kernel > 0, "Conv2d '", name, "': bad sizes ", in, " -> ", out,
              " kernel ", kernel);
  const double fan_out = static_cast<double>(out * kernel * kernel);
  weight_ = &register_parameter("weight", init_normal(name + ".weight", {out, in, kernel, kernel},
                                                      std::sqrt(2.0 / fan_out), gen, device));
  if (bias) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(in * kernel * kernel));
    bias_ = &register_parameter("bias", init_uniform(name + ".bias", {out}, bound, gen, device));
  }
}

Tensor Conv2d::forward(const Tensor& x) const {
  ModuleScope scope(name());
  return conv2d(x, *weight_, bias_ ? *bias_ : Tensor(), stride_, padding_);
}

BatchNorm2d::BatchNorm2d(const std::string& name, int64_t channels, Device device, double momentum,
                         double eps)
    : Module(name), momentum_(momentum), eps_(eps) {
  weight_ = &register_parameter("weight", init_const(name + ".weight", {channels}, 1.0, device));
  bias_ = &register_parameter("bias", init_const(name + ".bias", {channels}, 0.0, device));
  running_mean_ =
      &register_buffer("running_mean", init_const(name + ".running_mean", {channels}, 0.0, device));
  running_var_ =
      &register_buffer("running_var", init_const(name + ".running_var", {channels}, 1.0, device));
}

void BatchNorm2d::on_replayed_forward() {
  if (is_training()) ++num_batches_tracked_;  // as forward() counts it
}

Tensor BatchNorm2d::forward(const Tensor& x) {
  ModuleScope scope(name());
  if (is_training()) ++num_batches_tracked_;
  return batchnorm2d(x, *weight_, *bias_, *running_mean_, *running_var_, is_training(), momentum_,
                     eps_);
}

void BatchNorm2d::extra_state(NamedTensors& out, const std::string& prefix) const {
  out.emplace_back(prefix + "num_batches_tracked",
                   from_vector<int64_t>({num_batches_tracked_}, {}));
}

bool BatchNorm2d::load_extra_state(const std::string& name, const Tensor& value) {
  if (name != "num_batches_tracked") return false;
  REGEN_CHECK(value.dtype() == DType::i64 && value.numel() == 1,
              "num_batches_tracked must be one i64, got ", value.str());
  num_batches_tracked_ = value.item<int64_t>();
  return true;
}

LayerNorm::LayerNorm(const std::string& name, int64_t dim, Device device, double eps)
    : Module(name), eps_(eps) {
  weight_ = &register_parameter("weight", init_const(name + ".weight", {dim}, 1.0, device));
  bias_ = &register_parameter("bias", init_const(name + ".bias", {dim}, 0.0, device));
}

Tensor LayerNorm::forward(const Tensor& x) const {
  ModuleScope scope(name());
  return layernorm(x, *weight_, *bias_, eps_);
}

Embedding::Embedding(const std::string& name, int64_t num, int64_t dim, Generator& gen,
                     Device device)
    : Module(name) {
  weight_ =
      &register_parameter("weight", init_normal(name + ".weight", {num, dim}, 1.0, gen, device));
}

Tensor Embedding::forward(const Tensor& ids) const {
  ModuleScope scope(name());
  return embedding(ids, *weight_);
}

Tensor Dropout::forward(const Tensor& x) const {
  ModuleScope scope(name());
  return dropout(x, p_, is_training());
}

MultiheadAttention::MultiheadAttention(const std::string& name, int64_t d_model, int64_t heads,
                                       float dropout, Generator& gen, Device device)
    : Module(name), heads_(heads), dropout_(dropout) {
  REGEN_CHECK(heads > 0 && d_model % heads == 0, "MultiheadAttention '", name, "': d_model ",
              d_model, " is not divisible by ", heads, " heads");
  const double xavier = std::sqrt(6.0 / static_cast<double>(d_model + 3 * d_model));
  in_proj_weight_ = &register_parameter(
      "in_proj_weight",
      init_uniform(name + ".in_proj_weight", {3 * d_model, d_model}, xavier, gen, device));
  in_proj_bias_ = &register_parameter(
      "in_proj_bias", init_const(name + ".in_proj_bias", {3 * d_model}, 0.0, device));
  out_proj_ = &register_module(
      "out_proj", std::make_unique<Linear>("out_proj", d_model, d_model, true, gen, device));
  // torch zeroes the output projection's bias.
  fill_(*out_proj_->bias(), 0.0);
}

Tensor MultiheadAttention::forward(const Tensor& x, const Tensor& key_padding_mask,
                                   bool causal) const {
  ModuleScope scope(name());
  Tensor qkv;
  {
    ModuleScope in_proj("in_proj");
    qkv = linear(x, *in_proj_weight_, *in_proj_bias_);
  }
  Tensor ctx = attention(qkv, heads_, key_padding_mask, causal, is_training() ? dropout_ : 0.0f);
  return out_proj_->forward(ctx);
}

TransformerEncoderLayer::TransformerEncoderLayer(const std::string& name, int64_t d_model,
                                                 int64_t heads, int64_t ff, float dropout,
                                                 bool gelu, Generator& gen, Device device)
    : Module(name), gelu_(gelu) {
  self_attn_ = &register_module(
      "self_attn",
      std::make_unique<MultiheadAttention>("self_attn", d_model, heads, dropout, gen, device));
  linear1_ = &register_module("linear1",
                              std::make_unique<Linear>("linear1", d_model, ff, true, gen, device));
  dropout_ = &register_module("dropout", std::make_unique<Dropout>("dropout", dropout));
  linear2_ = &register_module("linear2",
                              std::make_unique<Linear>("linear2", ff, d_model, true, gen, device));
  norm1_ = &register_module("norm1", std::make_unique<LayerNorm>("norm1", d_model, device));
  norm2_ = &register_module("norm2", std::make_unique<LayerNorm>("norm2", d_model, device));
  dropout1_ = &register_module("dropout1", std::make_unique<Dropout>("dropout1", dropout));
  dropout2_ = &register_module("dropout2", std::make_unique<Dropout>("dropout2", dropout));
}

Tensor TransformerEncoderLayer::forward(const Tensor& x, const Tensor& key_padding_mask,
                                        bool causal) const {
  ModuleScope scope(name());
  BlockScope block("");
  Tensor sa = dropout1_->forward(self_attn_->forward(x, key_padding_mask, causal));
  Tensor h = norm1_->forward(add(x, sa));
  Tensor hidden = linear1_->forward(h);
  hidden = gelu_ ? gelu(hidden) : relu(hidden);
  Tensor f = dropout2_->forward(linear2_->forward(dropout_->forward(hidden)));
  return norm2_->forward(add(h, f));
}

}  // namespace regen
