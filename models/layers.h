// Layers with torch.nn parameter names and default initializations: Linear, Conv2d, BatchNorm2d,
// LayerNorm, Embedding, Dropout, MultiheadAttention, TransformerEncoderLayer. Each forward runs
// inside a ModuleScope of its name, so nodes and allocations are tagged "layer1.0.conv1/...".
#pragma once

#include "regen/models/module.h"

namespace regen {

// Creates a parameter tensor in the parameter category, tagged with `name`.
Tensor make_param(const std::string& name, const Shape& shape, Device device);

class Linear : public Module {
 public:
  Linear(const std::string& name, int64_t in, int64_t out, bool bias, Generator& gen,
         Device device = Device::cpu());
  Tensor forward(const Tensor& x) const;
  Tensor& weight() { return *weight_; }
  Tensor* bias() { return bias_; }

 private:
  Tensor* weight_;
  Tensor* bias_ = nullptr;
};

class Conv2d : public Module {
 public:
  // Kaiming-normal (fan_out, relu) initialization, as torchvision's ResNet.
  Conv2d(const std::string& name, int64_t in, int64_t out, int64_t kernel, int64_t stride,
         int64_t padding, bool bias, Generator& gen, Device device = Device::cpu());
  Tensor forward(const Tensor& x) const;

 private:
  Tensor* weight_;
  Tensor* bias_ = nullptr;
  int64_t stride_, padding_;
};

class BatchNorm2d : public Module {
 public:
  BatchNorm2d(const std::string& name, int64_t channels, Device device = Device::cpu(),
              double momentum = 0.1, double eps = 1e-5);
  Tensor forward(const Tensor& x);
  int64_t num_batches_tracked() const { return num_batches_tracked_; }

 protected:
  void extra_state(NamedTensors& out, const std::string& prefix) const override;
  bool load_extra_state(const std::string& name, const Tensor& value) override;
  void on_replayed_forward() override;

 private:
  Tensor *weight_, *bias_, *running_mean_, *running_var_;
  double momentum_, eps_;
  int64_t num_batches_tracked_ = 0;  // kept on the host; exported as a 0-d i64 tensor
};

class LayerNorm : public Module {
 public:
  LayerNorm(const std::string& name, int64_t dim, Device device = Device::cpu(), double eps = 1e-5);
  Tensor forward(const Tensor& x) const;

 private:
  Tensor *weight_, *bias_;
  double eps_;
};

class Embedding : public Module {
 public:
  Embedding(const std::string& name, int64_t num, int64_t dim, Generator& gen,
            Device device = Device::cpu());
  Tensor forward(const Tensor& ids) const;

 private:
  Tensor* weight_;
};

class Dropout : public Module {
 public:
  Dropout(const std::string& name, float p) : Module(name), p_(p) {}
  Tensor forward(const Tensor& x) const;

 private:
  float p_;
};

// torch.nn.MultiheadAttention (batch_first) as self-attention: in_proj_weight (3D, D),
// in_proj_bias (3D), out_proj.{weight,bias}; one fused attention op in between.
class MultiheadAttention : public Module {
 public:
  MultiheadAttention(const std::string& name, int64_t d_model, int64_t heads, float dropout,
                     Generator& gen, Device device = Device::cpu());
  // x: (B, S, D); key_padding_mask: (B, S) i32 (nonzero = pad) or undefined.
  Tensor forward(const Tensor& x, const Tensor& key_padding_mask, bool causal) const;

 private:
  int64_t heads_;
  float dropout_;
  Tensor *in_proj_weight_, *in_proj_bias_;
  Linear* out_proj_;
};

// torch.nn.TransformerEncoderLayer with its defaults: post-norm (norm_first=False), relu (or
// gelu), dropout after attention, inside the feed-forward and after it. Marks itself a block.
class TransformerEncoderLayer : public Module {
 public:
  TransformerEncoderLayer(const std::string& name, int64_t d_model, int64_t heads, int64_t ff,
                          float dropout, bool gelu, Generator& gen, Device device = Device::cpu());
  Tensor forward(const Tensor& x, const Tensor& key_padding_mask, bool causal) const;

 private:
  MultiheadAttention* self_attn_;
  Linear *linear1_, *linear2_;
  LayerNorm *norm1_, *norm2_;
  Dropout *dropout_, *dropout1_, *dropout2_;
  bool gelu_;
};

}  // namespace regen
