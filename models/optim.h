// Optimizers: SGD and AdamW with the semantics of torch.optim.SGD and torch.optim.AdamW, running
// the fused update launchers of kernels/kernels.h on the parameters' device. State tensors are
// created at the first step that sees a parameter's gradient, in the optimizer_state category and
// tagged "<parameter name>.<state>", so memory reports show them by name.
// Tests: tests/test_ops_nlp.cpp (against a plain transcription of torch's formulas),
// tests/test_train_block.cpp (a Transformer-style block that learns).
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "regen/core/tensor.h"

namespace regen {

// Hooks around each parameter's update, for a runtime that keeps the optimizer state elsewhere
// between steps (remat's executor streams it from the host tier through the device, docs/remat.md
// "Offload"): before_update may replace the state tensors the update reads and writes (`state`, by
// key; empty for a parameter without state), after_update puts them back, after_step runs once
// every parameter is updated.
class OptimizerHooks {
 public:
  virtual ~OptimizerHooks() = default;
  virtual void before_update(const std::string& /*name*/,
                             std::map<std::string, Tensor>& /*state*/) {}
  virtual void after_update(const std::string& /*name*/, std::map<std::string, Tensor>& /*state*/) {
  }
  virtual void after_step() {}
};

class Optimizer {
 public:
  // Parameters are named by Tensor::name() (the state tags and state() keys); names must be
  // unique, and an unnamed tensor is called "param<i>" after its position. `kind` names the
  // optimizer in messages.
  Optimizer(const char* kind, std::vector<Tensor> params, double lr);
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One update of every parameter that has a gradient; parameters without one are skipped and
  // their state does not advance (as in torch).
  void step();
  // A step whose kernels a CUDA graph replayed (remat/execute/cuda_graph.h): the step counts of
  // the parameters step() would update move on, as step() moves them, and nothing else happens.
  void count_replayed_step();
  // Zeroes every existing gradient in place, keeping its memory.
  void zero_grad();
  // Creates every state tensor now (zeroed) instead of at the first step, so it is allocated
  // before any training step (the trainer's canonical start). Semantics are unchanged: the first
  // step still initializes momentum buffers from the gradient.
  void initialize_state();

  double lr() const { return lr_; }
  void set_lr(double lr);  // for learning-rate schedules

  const std::vector<Tensor>& params() const { return params_; }
  const std::vector<std::string>& names() const { return names_; }
  // State `key` ("momentum_buffer", "exp_avg", "exp_avg_sq") of parameter `name`; undefined until
  // the first step that updated it and for keys this optimizer does not keep (SGD without
  // momentum has no buffer). Throws when no parameter has that name.
  Tensor state(const std::string& name, const std::string& key) const;
  // Number of updates parameter `name` has received.
  int64_t step_count(const std::string& name) const;
  // Every state tensor as "<name>.<key>" (for checkpoints and memory reports).
  std::map<std::string, Tensor> named_state() const;
  // The update count of every parameter, in params() order (for checkpoints).
  std::vector<int64_t> step_counts() const;
  // Restores a checkpoint's state (named as named_state() names it, and the step counts): values
  // are copied into the state tensors, created first where missing (initialize_state), so they keep
  // their place in the allocator. Throws regen::Error naming an entry that is missing, unexpected
  // or of another shape, before anything is changed.
  void load_state(const std::map<std::string, Tensor>& state, const std::vector<int64_t>& steps);
  // Replaces state `key` of parameter `name` with `t`, which must have its shape and dtype (on any
  // device: the host tier keeps it between steps); the old tensor is let go here.
  void replace_state(const std::string& name, const std::string& key, Tensor t);
  // Installs hooks around the updates (nullptr: none); the caller keeps them alive meanwhile.
  void set_hooks(OptimizerHooks* hooks) { hooks_ = hooks; }
  OptimizerHooks* hooks() const { return hooks_; }

 protected:
  struct ParamState {
    int64_t steps = 0;
    std::map<std::string, Tensor> tensors;
  };
  // Updates parameter i with its gradient `grad`; state.steps has already been incremented.
  virtual void update(size_t i, const Tensor& grad, ParamState& state) = 0;
  // Creates parameter i's missing state tensors.
  virtual void create_state(size_t i, ParamState& state) = 0;
  // A state tensor of parameter i's shape, dtype and device, created in the optimizer_state
  // category and tagged "<name>.<key>", zero-filled when `zero` is set.
  Tensor make_state(size_t i, const std::string& key, bool zero) const;
  size_t index_of(const std::string& name) const;

  const char* kind_;
  std::vector<Tensor> params_;
  std::vector<std::string> names_;
  std::vector<ParamState> states_;
  double lr_;
  OptimizerHooks* hooks_ = nullptr;
};

// Installs hooks on an optimizer for a scope and removes them at its end (also when an exception
// leaves it).
class OptimizerHooksScope {
 public:
  OptimizerHooksScope(Optimizer& optimizer, OptimizerHooks* hooks) : optimizer_(optimizer) {
    optimizer_.set_hooks(hooks);
  }
  ~OptimizerHooksScope() { optimizer_.set_hooks(nullptr); }
  OptimizerHooksScope(const OptimizerHooksScope&) = delete;
  OptimizerHooksScope& operator=(const OptimizerHooksScope&) = delete;

 private:
  Optimizer& optimizer_;
};

struct SGDOptions {
  double lr = 0.01;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
};

// torch.optim.SGD: d = g + weight_decay * p; with momentum, buf = d at the first step and
// buf = momentum * buf + (1 - dampening) * d after; d = nesterov ? d + momentum * buf : buf;
// p -= lr * d. State: "momentum_buffer" (only with momentum).
class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> params, const SGDOptions& options);
  const SGDOptions& options() const { return options_; }

 private:
  void update(size_t i, const Tensor& grad, ParamState& state) override;
  void create_state(size_t i, ParamState& state) override;
  SGDOptions options_;
};

// The parameters weight decay applies to: every one (torch.optim.AdamW given all parameters in
// one group), or the matrices only: the parameters of two or more dimensions (linear weights and
// embeddings), not the biases nor the layer norms' gains and shifts, as nanoGPT's two parameter
// groups and llm.c's CUDA trainer decay GPT-2.
enum class DecayScope { all, matrices };

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
  DecayScope decay = DecayScope::all;
};

// torch.optim.AdamW: p *= 1 - lr * weight_decay (for the parameters options.decay selects);
// Adam moments with bias correction. State: "exp_avg", "exp_avg_sq".
class AdamW : public Optimizer {
 public:
  AdamW(std::vector<Tensor> params, const AdamWOptions& options);
  const AdamWOptions& options() const { return options_; }
  // Whether parameter `name` is decayed (options().weight_decay > 0 and in options().decay).
  bool decays(const std::string& name) const { return decays_[index_of(name)]; }

 private:
  void update(size_t i, const Tensor& grad, ParamState& state) override;
  void create_state(size_t i, ParamState& state) override;
  AdamWOptions options_;
  std::vector<bool> decays_;  // per parameter, in params() order
};

}  // namespace regen
