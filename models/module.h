// A small module system: named parameters and buffers, child modules, train/eval mode, state
// dicts with torch.nn parameter names, device moves. Layers are in layers.h; models in resnet.h
// and transformer.h. Tests: tests/test_models.cpp.
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "regen/autograd/ops.h"

namespace regen {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

class Module {
 public:
  explicit Module(std::string name = "") : name_(std::move(name)) {}
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  const std::string& name() const { return name_; }

  // Parameters live in the parameter category, tagged with their full name once registered.
  NamedTensors named_parameters() const;
  std::vector<Tensor> parameters() const;
  // Buffers (e.g. batch-norm running statistics) are state that is not trained.
  NamedTensors named_buffers() const;
  // Parameters and buffers in registration order, named like torch.nn's state_dict().
  NamedTensors state_dict() const;
  // Copies values into parameters and buffers. strict: every name must match both ways; shapes
  // and dtypes must match. Throws regen::Error naming the offending entries.
  void load_state_dict(const NamedTensors& state, bool strict = true);
  int64_t num_parameters() const;

  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }

  // Moves every parameter and buffer to `device` (new storage in the parameter category).
  void to(Device device);
  // Where the parameters and buffers are (layers create them on the device they are given, and
  // to() moves them together); a module with none reports its last to() (cpu before any).
  Device device() const;

  void zero_grad();

  // A training step whose device work a CUDA graph replayed (remat/execute/cuda_graph.h): the
  // host state a forward pass moves on (batch norm's num_batches_tracked) moves on as that
  // forward pass would have moved it, in this module and every child.
  void replayed_forward();

  // Sets every parameter's and buffer's TensorImpl name to its full dotted name (so gradients,
  // optimizer state and memory tags read "layer1.0.conv1.weight.grad").
  void assign_full_names();

 protected:
  // Registration returns a reference that stays valid for the module's life.
  Tensor& register_parameter(const std::string& name, Tensor value);
  Tensor& register_buffer(const std::string& name, Tensor value);
  template <class M>
  M& register_module(const std::string& name, std::unique_ptr<M> m) {
    M& ref = *m;
    children_.emplace_back(name, std::move(m));
    return ref;
  }
  // Called by state_dict/load_state_dict for buffers kept on the host (e.g. a step counter).
  virtual void extra_state(NamedTensors& /*out*/, const std::string& /*prefix*/) const {}
  virtual bool load_extra_state(const std::string& /*name*/, const Tensor& /*value*/) {
    return false;
  }
  virtual void on_train(bool) {}
  virtual void on_replayed_forward() {}

 private:
  void collect(const std::string& prefix, NamedTensors* params, NamedTensors* buffers,
               NamedTensors* extra) const;
  std::string name_;
  // deques: register_* hands out references that must survive later registrations.
  std::deque<std::pair<std::string, Tensor>> params_;
  std::deque<std::pair<std::string, Tensor>> buffers_;
  std::vector<std::pair<std::string, std::unique_ptr<Module>>> children_;
  bool training_ = true;
  Device device_ = Device::cpu();
};

}  // namespace regen
