// The backward engine (tape.h Tape::backward): which nodes run, gradient accumulation, the
// backward contexts ops read their saved tensors from, and the release of each saved tensor
// after its last use.
#include "regen/autograd/tape.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <string>

#include "regen/kernels/kernels.h"

namespace regen {

// ---- Gradient accumulation --------------------------------------------------------------------

namespace {
// dst += src; a 16-bit gradient is summed in f32 per element and rounded once (cpu::add_inplace).
template <class T>
void add_inplace_typed(const Tensor& dst, const Tensor& src) {
  REGEN_LAUNCH(dst.device(), T, add_inplace, dst.data<T>(), src.data<T>(), dst.numel());
}
}  // namespace

void accumulate_into(const Tensor& dst, const Tensor& src) {
  REGEN_CHECK(
      dst.shape() == src.shape() && dst.dtype() == src.dtype() && dst.device() == src.device(),
      "gradient accumulation: ", dst.str(), " += ", src.str(), " do not match");
  REGEN_FLOATING_LOWP(dst.dtype(), "gradient accumulation", add_inplace_typed, dst, src);
}

// ---- BackwardContext ----------------------------------------------------------------------------

BackwardContext::BackwardContext(Tape& tape, const Node& node, std::vector<Tensor> grad_outputs)
    : tape_(tape), node_(node), grad_outputs_(std::move(grad_outputs)) {
  grad_inputs_.resize(node.inputs.size());
}

Tensor BackwardContext::read_saved(bool output, int index) const {
  const char* what = output ? "output" : "input";
  const std::vector<int64_t>& ids = output ? node_.outputs : node_.inputs;
  REGEN_CHECK(index >= 0 && index < static_cast<int>(ids.size()), op_name(node_.kind),
              " backward: reads saved ", what, " ", index, " of a node with ", ids.size(), " ",
              what, "s");
  const int64_t v = ids[static_cast<size_t>(index)];
  REGEN_CHECK(v >= 0 && std::find(node_.saved.begin(), node_.saved.end(), v) != node_.saved.end(),
              op_name(node_.kind), " backward: reads ", what, " ", index,
              ", which its OpDef::saves does not list (backward reads forward data only through "
              "what forward saved)");
  const Value& val = tape_.value(v);
  tape_.ensure_resident(tape_.value(val.root).saved);
  for (TapeHooks* h : tape_.hooks_) h->on_saved_read(tape_, node_.index, v);
  return tape_.value_tensor(v);
}

Tensor BackwardContext::saved_input(int i) const {
  return read_saved(false, i);
}

Tensor BackwardContext::saved_output(int k) const {
  return read_saved(true, k);
}

Tensor BackwardContext::grad_output_or_zeros(int j) const {
  if (grad_outputs_[j].defined()) return grad_outputs_[j];
  const Value& v = tape_.value(node_.outputs[j]);
  Device dev = Device::cpu();
  for (int64_t in : node_.inputs) {
    if (in >= 0) {
      dev = tape_.value_tensor_device(in);
      break;
    }
  }
  return zeros(v.shape, v.dtype, dev);
}

bool BackwardContext::needs_grad(int input) const {
  const int64_t v = node_.inputs.at(static_cast<size_t>(input));
  return v >= 0 && tape_.value(v).requires_grad;
}

void BackwardContext::set_grad_input(int input, Tensor g) {
  REGEN_CHECK(input >= 0 && input < static_cast<int>(grad_inputs_.size()), op_name(node_.kind),
              " backward: input ", input, " out of range");
  const int64_t v = node_.inputs[input];
  if (v < 0 || !g.defined()) return;
  const Value& val = tape_.value(v);
  REGEN_CHECK(g.shape() == val.shape, op_name(node_.kind), " backward: gradient of input ", input,
              " has shape ", sh(g.shape()), ", expected ", sh(val.shape));
  // A gradient has its value's dtype (a bf16 activation's gradient is bf16; a master weight's,
  // through cast's backward, f32).
  REGEN_CHECK(g.dtype() == val.dtype, op_name(node_.kind), " backward: gradient of input ", input,
              " is ", dtype_name(g.dtype()), ", expected ", dtype_name(val.dtype),
              " (the dtype of the value it is the gradient of)");
  grad_inputs_[input] = std::move(g);
}

// ---- Backward -----------------------------------------------------------------------------------

void Tape::accumulate_grad(int64_t id, Tensor g, std::vector<Tensor>& grads) {
  const Value& v = value(id);
  if (!v.requires_grad) return;
  REGEN_CHECK(g.shape() == v.shape && g.dtype() == v.dtype, "backward: gradient ",
              dtype_name(g.dtype()), sh(g.shape()), " for a value ", dtype_name(v.dtype),
              sh(v.shape), " (a gradient has its value's shape and dtype)");
  if (v.producer < 0) {
    // A leaf (parameter): gradients accumulate (+=) in the gradient category.
    TensorImpl* leaf = v.leaf.get();
    if (!leaf || !leaf->requires_grad) return;
    if (!leaf->grad) {
      // The first gradient becomes the parameter's buffer. Take it over when nothing else can
      // see it (a gradient-category buffer of exactly its size, referenced only here); copy it
      // when it is shared (add passes one gradient to both inputs; a view shares its source).
      const TensorImpl* gi = g.impl().get();
      const bool exclusive = g.impl().use_count() == 1 && gi->storage &&
                             gi->storage.use_count() == 1 && gi->offset_bytes == 0 &&
                             gi->storage->bytes() == g.nbytes() &&
                             gi->storage->category() == Category::gradient && gi->grad == nullptr &&
                             !gi->requires_grad && gi->tape_value < 0;
      if (exclusive) {
        leaf->grad = g.impl();
      } else {
        CategoryScope cat(Category::gradient);
        TagScope tag(leaf->name.empty() ? std::string("leaf.grad") : leaf->name + ".grad");
        leaf->grad = g.clone().impl();
      }
    } else {
      accumulate_into(Tensor(leaf->grad), g);
    }
    return;
  }
  Tensor& slot = grads[static_cast<size_t>(id)];
  if (!slot.defined()) {
    slot = std::move(g);
    return;
  }
  // Add in place when we own the buffer alone; otherwise (shared with another gradient) make a
  // new one. Both choices depend only on the graph, so memory stays deterministic.
  const bool exclusive =
      slot.impl().use_count() == 1 && slot.impl()->storage && slot.impl()->storage.use_count() == 1;
  if (!exclusive) {
    CategoryScope cat(Category::gradient);
    slot = slot.clone();
  }
  accumulate_into(slot, g);
}

void Tape::backward(const Tensor& loss, const Tensor& grad) {
  REGEN_CHECK(loss.defined(), "backward: undefined loss tensor");
  const TensorImpl* li = loss.impl().get();
  REGEN_CHECK(li->tape_epoch == epoch_ || !li->produced, "backward: the tape that produced ",
              loss.str(),
              " was already released by an earlier backward() (backward twice over one graph)");
  REGEN_CHECK(li->produced && li->tape_epoch == epoch_ && li->tape_value >= 0 && !nodes_.empty(),
              "backward: ", loss.str(),
              " was not produced by a recorded op (does it depend on a "
              "tensor that requires grad?)");
  REGEN_CHECK(!in_backward_, "backward: already running");
  Tensor seed = grad;
  if (!seed.defined()) {
    REGEN_CHECK(loss.numel() == 1, "backward: loss ", loss.str(),
                " is not a scalar; pass a gradient of its shape");
    CategoryScope cat(Category::gradient);
    seed = ones(loss.shape(), loss.dtype(), loss.device());
  }
  REGEN_CHECK(seed.shape() == loss.shape() && seed.dtype() == loss.dtype(), "backward: gradient ",
              seed.str(), " does not match loss ", loss.str());

  struct Finish {
    Tape& t;
    ~Finish() {
      t.in_backward_ = false;
      t.clear();
    }
  } finish{*this};
  in_backward_ = true;
  NoGradScope no_grad;

  // Which nodes run: a reverse sweep from the loss over values that require grad.
  std::vector<char> need(values_.size(), 0);
  need[static_cast<size_t>(li->tape_value)] = 1;
  backward_order_.clear();
  for (int32_t i = static_cast<int32_t>(nodes_.size()) - 1; i >= 0; --i) {
    const Node& n = nodes_[static_cast<size_t>(i)];
    bool active = false;
    for (int k = 0; k < n.num_visible_outputs; ++k) active = active || need[n.outputs[k]];
    if (!active) continue;
    backward_order_.push_back(i);
    for (int64_t in : n.inputs) {
      if (in >= 0 && values_[static_cast<size_t>(in)].requires_grad) need[in] = 1;
    }
  }
  std::vector<char> active(nodes_.size(), 0);
  for (int32_t i : backward_order_) active[static_cast<size_t>(i)] = 1;
  for (size_t s = 0; s < saved_.size(); ++s) {
    int uses = 0;
    for (int32_t r : saved_[s].readers) uses += active[static_cast<size_t>(r)];
    saved_[s].backward_uses_left = uses;
  }
  for (size_t s = 0; s < saved_.size(); ++s) {
    if (saved_[s].backward_uses_left == 0) release_saved(static_cast<int32_t>(s));
  }
  for (TapeHooks* h : hooks_) h->on_backward_start(*this);

  std::vector<Tensor> grads(values_.size());
  grads[static_cast<size_t>(li->tape_value)] = seed;
  seed = Tensor();
  for (int32_t i : backward_order_) {
    for (TapeHooks* h : hooks_) h->on_backward_begin(*this, i);
    const Node& n = nodes_[static_cast<size_t>(i)];
    const OpDef& def = op_def(n.kind);
    std::vector<Tensor> gout(static_cast<size_t>(n.num_visible_outputs));
    for (int k = 0; k < n.num_visible_outputs; ++k) {
      gout[static_cast<size_t>(k)] = std::move(grads[static_cast<size_t>(n.outputs[k])]);
    }
    {
      BackwardContext ctx(*this, n, std::move(gout));
      {
        CategoryScope cat(Category::gradient);
        TagScope tag(n.tag);
        def.backward(ctx);
      }
      for (size_t k = 0; k < n.inputs.size(); ++k) {
        Tensor& g = ctx.grad_inputs()[k];
        if (g.defined()) accumulate_grad(n.inputs[k], std::move(g), grads);
      }
    }  // the gradients of this node's outputs are freed here
    // Release each saved storage after its last backward use (once per node).
    std::vector<int32_t> seen;
    for (int64_t sv : n.saved) {
      const int32_t s = values_[static_cast<size_t>(values_[static_cast<size_t>(sv)].root)].saved;
      if (std::find(seen.begin(), seen.end(), s) != seen.end()) continue;
      seen.push_back(s);
      if (--saved_[static_cast<size_t>(s)].backward_uses_left == 0) release_saved(s);
    }
    for (TapeHooks* h : hooks_) h->on_backward_end(*this, i);
  }
  grads.clear();
  for (TapeHooks* h : hooks_) h->on_backward_finish(*this);
}

}  // namespace regen
