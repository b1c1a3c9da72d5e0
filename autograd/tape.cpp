// The tape: recording, replays, saved tensors and their states (tape.h). The backward engine is
// in engine.cpp, the op registry in op_registry.cpp, modes and RNG in modes.cpp.
// docs/architecture.md walks through one recording.
#include "regen/autograd/tape.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <unordered_map>

#include "regen/autograd/op_list.h"
#include "regen/autograd/ops.h"
#include "regen/autograd/precision.h"
#include "regen/autograd/sharded_parameters.h"
#include "regen/kernels/kernels.h"

namespace regen {

namespace {
std::atomic<uint64_t> g_epoch{1};  // a tape's values are valid for one epoch

// The output slots of one call and how many of them are visible: fixed by the OpDef, or, for an
// op with kVariableOutputs (split), every slot its forward filled, all visible.
int output_slots(const OpDef& def, const OpContext& ctx) {
  return def.num_outputs == kVariableOutputs ? static_cast<int>(ctx.outputs.size())
                                             : def.num_outputs;
}
int visible_slots(const OpDef& def, const OpContext& ctx) {
  return def.num_visible_outputs == kVariableOutputs ? static_cast<int>(ctx.outputs.size())
                                                     : def.num_visible_outputs;
}
}  // namespace

// ---- Tape -------------------------------------------------------------------------------------

Tape::Tape() : epoch_(g_epoch++) {}

Tape& Tape::current() {
  thread_local Tape tape;
  return tape;
}

void Tape::add_hooks(TapeHooks* hooks) {
  REGEN_CHECK(hooks != nullptr, "add_hooks: null hooks");
  hooks_.push_back(hooks);
}

void Tape::remove_hooks(TapeHooks* hooks) {
  hooks_.erase(std::remove(hooks_.begin(), hooks_.end(), hooks), hooks_.end());
}

HooksScope::HooksScope(TapeHooks* hooks) : tape_(&Tape::current()), hooks_(hooks) {
  if (hooks_) tape_->add_hooks(hooks_);
}
HooksScope::~HooksScope() {
  if (hooks_) tape_->remove_hooks(hooks_);
}

PackedSavesScope::PackedSavesScope(const PackedSaves* decisions)
    : tape_(&Tape::current()), before_(tape_->packed_saves()) {
  tape_->set_packed_saves(decisions);
}
PackedSavesScope::~PackedSavesScope() {
  tape_->set_packed_saves(before_);
}

int64_t PackedSaves::count() const {
  int64_t n = 0;
  for (uint8_t p : packed) n += p != 0;
  return n;
}

PackedSaves decide_packed_saves(const Tape& tape) {
  PackedSaves d;
  d.kinds.reserve(tape.nodes().size());
  d.packed.reserve(tape.nodes().size());
  for (const Node& n : tape.nodes()) {
    REGEN_CHECK(!n.packed, "decide_packed_saves: node ", n.index, " (", tag_name(n.tag),
                ") was recorded packed; decide on a recording with nothing packed");
    const OpDef& def = op_def(n.kind);
    bool pack = false;
    if (def.packed_output >= 0 && static_cast<size_t>(def.packed_output) < n.outputs.size()) {
      // The replaced output, as the tape holds it: one saved record per storage root, read by the
      // nodes whose backward reads it through any view.
      const Value& root =
          tape.value(tape.value(n.outputs[static_cast<size_t>(def.packed_output)]).root);
      if (root.saved >= 0) {
        const std::vector<int32_t>& readers = tape.saved_tensor(root.saved).readers;
        pack = readers.size() == 1 && readers[0] == n.index;
      }
    }
    d.kinds.push_back(n.kind);
    d.packed.push_back(pack ? 1 : 0);
  }
  return d;
}

int32_t Tape::begin_block(uint32_t name) {
  BlockInfoRec b;
  b.index = static_cast<int32_t>(blocks_.size());
  b.name = name;
  blocks_.push_back(b);
  block_stack_.push_back(b.index);
  return b.index;
}

void Tape::end_block(int32_t block) {
  if (!block_stack_.empty() && block_stack_.back() == block) block_stack_.pop_back();
}

int64_t Tape::register_input(const Tensor& t) {
  TensorImpl* impl = t.impl().get();
  if (impl->tape_epoch == epoch_ && impl->tape_value >= 0) return impl->tape_value;
  REGEN_CHECK(!impl->produced || impl->tape_epoch == epoch_, "tensor ", t.str(),
              " was produced by a tape that backward() already released; detach it (clone "
              "under NoGradScope) before using it again");
  Value v;
  v.id = static_cast<int64_t>(values_.size());
  v.root = v.id;
  v.shape = impl->shape;
  v.dtype = impl->dtype;
  v.offset_bytes = impl->offset_bytes;
  v.bytes = t.nbytes();
  v.requires_grad = impl->requires_grad;
  v.device = impl->device;
  if (impl->requires_grad) v.leaf = t.impl();  // see Value: only gradient targets are pinned
  v.leaf_storage = impl->storage;
  if (!impl->requires_grad && v.bytes <= Value::kHeldLeafBytes) v.held = impl->storage;
  impl->tape_value = v.id;
  impl->tape_epoch = epoch_;
  values_.push_back(std::move(v));
  return values_.back().id;
}

namespace {
// Autocast's copies of the weights, as PyTorch's autocast cache keeps them: a parameter (a leaf
// that requires grad) cast again to the same dtype within one recording of a tape reuses its first
// copy while the tape holds it (a saved tensor: some op's backward reads it), so a weight read by
// two ops in a forward is copied once and the planner sees one saved tensor with two readers. The
// cache holds value ids, not bytes: it keeps no copy alive, so it changes no lifetime and nothing a
// plan decides. A copy no op saved is gone after its op and is made again at the next use; one a
// remat runtime evicted is read as any evicted input (the reading op's hooks make it resident).
struct WeightCopies {
  const Tape* tape = nullptr;
  uint64_t epoch = 0;
  struct Entry {
    std::weak_ptr<TensorImpl> weight;  // the weight itself: its address may be reused
    int64_t copy = -1;                 // the copy's value id in this recording
  };
  std::unordered_map<const TensorImpl*, Entry> copies;
};
thread_local WeightCopies g_weight_copies;

WeightCopies& weight_copies(const Tape& tape) {
  WeightCopies& w = g_weight_copies;
  if (w.tape != &tape || w.epoch != tape.epoch()) {
    w.copies.clear();
    w.tape = &tape;
    w.epoch = tape.epoch();
  }
  return w;
}

// Value `id` of `tape` (a weight's copy) as an input tensor, if it has dtype `want` and the tape
// holds its bytes as a saved tensor, resident or evicted; else an undefined tensor.
Tensor held_copy(const Tape& tape, int64_t id, DType want) {
  const Value& v = tape.value(id);
  if (v.dtype != want || v.root != v.id) return Tensor();
  if (v.saved < 0) return Tensor();
  const SavedTensor& s = tape.saved_tensor(v.saved);
  if (!s.storage || !(s.state == SavedState::resident || s.state == SavedState::evicted)) {
    return Tensor();
  }
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = s.storage;
  impl->offset_bytes = v.offset_bytes;
  impl->shape = v.shape;
  impl->dtype = v.dtype;
  impl->device = v.device;
  impl->requires_grad = v.requires_grad;
  impl->produced = true;
  impl->tape_value = v.id;
  impl->tape_epoch = tape.epoch();
  return Tensor(std::move(impl));
}
}  // namespace

void Tape::autocast_inputs(OpKind kind, std::vector<Tensor>& inputs) {
  const DType low = autocast_dtype();
  std::vector<DType> floating;
  for (const Tensor& t : inputs) {
    if (t.defined() && is_floating(t.dtype())) floating.push_back(t.dtype());
  }
  if (floating.empty()) return;
  const bool statistics = precision_rule(kind).fp32_statistics;
  const DType compute = compute_dtype(kind, low, floating);
  for (size_t i = 0; i < inputs.size(); ++i) {
    Tensor& t = inputs[i];
    if (!t.defined() || !is_floating(t.dtype())) continue;  // ids, masks, targets stay as they are
    // An op that keeps fp32 statistics computes in its first input's dtype and reads its
    // parameters (the other inputs) in f32.
    const DType want = statistics && i > 0 ? DType::f32 : compute;
    if (t.dtype() == want) continue;
    const TensorImpl* impl = t.impl().get();
    if (!(impl->requires_grad && !impl->produced && grad_mode_enabled())) {
      t = cast(t, want);  // recorded on this tape like any op
      continue;
    }
    // A weight: its copy of this recording while the tape holds it, else a new one remembered.
    auto& copies = weight_copies(*this).copies;
    auto it = copies.find(impl);
    if (it != copies.end() && it->second.weight.lock() == t.impl()) {
      Tensor held = held_copy(*this, it->second.copy, want);
      if (held.defined()) {
        t = std::move(held);
        continue;
      }
    }
    Tensor c = cast(t, want);
    if (c.impl()->tape_epoch == epoch_ && c.impl()->tape_value >= 0) {
      copies[impl] = {t.impl(), c.impl()->tape_value};
    }
    t = std::move(c);
  }
}

std::vector<Tensor> Tape::apply(OpKind kind, const AttrBlob& attrs, std::vector<Tensor> inputs) {
  const OpDef& def = op_def(kind);
  // ZeRO-3 (autograd/sharded_parameters.h): a parameter whose bytes data parallelism dropped is
  // read as its whole, all-gathered from every rank's shard by a gather_shards node recorded here
  // (replays run that node again). Before autocast, which then casts the whole parameter.
  if (kind != OpKind::gather_shards && any_sharded_parameters()) {
    for (Tensor& t : inputs) {
      if (t.defined() && !t.impl()->produced && t.requires_grad()) t = gathered_parameter(t);
    }
  }
  // Autocast: the inputs cast to the dtypes the op's precision rule asks for, each by a recorded
  // cast node, before the op is recorded. Never in backward (gradients keep their values' dtypes)
  // nor for a cast itself; replays (Tape::replay) run recorded nodes, casts included, and do not
  // come through here. Grad mode off (evaluation) autocasts too.
  if (autocast_dtype() != DType::f32 && !in_backward_ && kind != OpKind::cast) {
    autocast_inputs(kind, inputs);
  }
  // Inputs: all on one device, all with their bytes.
  const Tensor* first = nullptr;
  for (const Tensor& t : inputs) {
    if (!t.defined()) continue;
    if (!first) first = &t;
    REGEN_CHECK(t.device() == first->device(), def.name,
                ": inputs on different devices: ", first->str(), " and ", t.str());
    // An input a remat runtime evicted (a saved tensor of this tape) is made resident again by
    // the hooks' on_forward_begin (record() checks that it was); anything else without bytes is
    // an error here.
    REGEN_CHECK(t.has_storage() || evicted_saved_input(t), def.name, ": input ", t.str(),
                " has no bytes (evicted and not regenerated)");
  }
  REGEN_CHECK(first != nullptr, def.name, ": no input tensors");
  bool recording = grad_mode_enabled();
  if (recording) {
    recording = false;
    for (const Tensor& t : inputs) recording = recording || (t.defined() && t.requires_grad());
  }
  REGEN_CHECK(!(recording && in_backward_), def.name,
              ": ops cannot be recorded during backward (higher-order gradients are unsupported)");

  OpContext ctx{attrs, inputs, {}, false};
  if (!recording) {
    for (const Tensor& t : inputs) {
      REGEN_CHECK(!t.defined() || t.has_storage(), def.name, ": input ", t.str(),
                  " was evicted by the remat runtime, and only a recorded op (grad mode on, an "
                  "input that requires grad) has it regenerated");
    }
    CategoryScope cat(Category::activation);
    def.forward(ctx);
    REGEN_ASSERT(static_cast<int>(ctx.outputs.size()) == output_slots(def, ctx));
    ctx.outputs.resize(static_cast<size_t>(visible_slots(def, ctx)));
    return std::move(ctx.outputs);
  }

  // Recording. Everything this call changes is undone if the op or a hook throws, so no
  // half-built node (one without outputs) is ever left for backward to trip over.
  const int32_t index = static_cast<int32_t>(nodes_.size());
  const size_t values_before = values_.size(), saved_before = saved_.size();
  std::vector<std::pair<int64_t, uint64_t>> input_marks;  // inputs' (tape_value, tape_epoch)
  input_marks.reserve(inputs.size());
  for (const Tensor& t : inputs) {
    input_marks.emplace_back(t.defined() ? t.impl()->tape_value : -1,
                             t.defined() ? t.impl()->tape_epoch : 0);
  }
  const int32_t block = block_stack_.empty() ? -1 : block_stack_.back();
  ctx.packed = def.packed_output >= 0 && packed_saves_ && packed_saves_->packs(index, kind);
  const BlockInfoRec block_before =
      block >= 0 ? blocks_[static_cast<size_t>(block)] : BlockInfoRec{};
  size_t hooks_begun = 0;
  try {
    return record(def, kind, attrs, inputs, ctx, index, block, hooks_begun);
  } catch (...) {
    for (size_t h = 0; h < hooks_begun && h < hooks_.size(); ++h) {
      try {
        hooks_[h]->on_forward_abort(*this, index);
      } catch (...) {  // a hook must not mask the op's error
      }
    }
    // Saved records: drop this node as a reader, then the records it created.
    for (size_t s = 0; s < saved_before; ++s) {
      std::vector<int32_t>& readers = saved_[s].readers;
      if (!readers.empty() && readers.back() == index) readers.pop_back();
    }
    for (size_t s = saved_before; s < saved_.size(); ++s) {
      const size_t root = static_cast<size_t>(saved_[s].value);
      if (root < values_before) values_[root].saved = -1;
    }
    saved_.resize(saved_before);
    for (size_t v = 0; v < values_before; ++v) {
      std::vector<int32_t>& consumers = values_[v].consumers;
      while (!consumers.empty() && consumers.back() == index) consumers.pop_back();
    }
    values_.erase(values_.begin() + static_cast<std::ptrdiff_t>(values_before), values_.end());
    for (size_t k = 0; k < inputs.size(); ++k) {
      if (!inputs[k].defined()) continue;
      inputs[k].impl()->tape_value = input_marks[k].first;
      inputs[k].impl()->tape_epoch = input_marks[k].second;
    }
    if (nodes_.size() > static_cast<size_t>(index)) nodes_.resize(static_cast<size_t>(index));
    if (block >= 0) blocks_[static_cast<size_t>(block)] = block_before;
    throw;
  }
}

std::vector<Tensor> Tape::record(const OpDef& def, OpKind kind, const AttrBlob& attrs,
                                 const std::vector<Tensor>& inputs, OpContext& ctx, int32_t index,
                                 int32_t block, size_t& hooks_begun) {
  {
    Node n;
    n.index = index;
    n.kind = kind;
    n.attrs = attrs;
    n.num_visible_outputs = std::max(def.num_visible_outputs, 0);  // variable: set after forward
    const std::string& path = ModuleScope::current_path();
    n.scope = intern_tag(path);
    n.block = block;
    n.packed = ctx.packed;
    n.tag = intern_tag(path + (path.empty() ? "" : "/") + def.name + "#" + std::to_string(index));
    nodes_.push_back(std::move(n));
    // Registered after the push, so a throw here is undone like any other.
    for (const Tensor& t : inputs) {
      nodes_.back().inputs.push_back(t.defined() ? register_input(t) : -1);
    }
  }
  if (block >= 0) {
    BlockInfoRec& b = blocks_[static_cast<size_t>(block)];
    if (b.first_node < 0) b.first_node = index;
    b.last_node = index;
  }
  for (TapeHooks* h : hooks_) {
    ++hooks_begun;
    h->on_forward_begin(*this, index);
  }
  for (const Tensor& t : inputs) {
    REGEN_CHECK(!t.defined() || t.has_storage(), def.name, ": input ", t.str(),
                " is evicted and no remat runtime regenerated it before the op");
  }
  {
    CategoryScope cat(Category::activation);
    TagScope tag(nodes_.back().tag);
    def.forward(ctx);
  }
  const int slots = output_slots(def, ctx), visible = visible_slots(def, ctx);
  REGEN_CHECK(static_cast<int>(ctx.outputs.size()) == slots && slots > 0, def.name, " produced ",
              ctx.outputs.size(), " outputs, expected ", slots);
  for (const Tensor& out : ctx.outputs) {
    REGEN_CHECK(out.defined(), def.name, " left an output slot undefined");
  }
  Node& node = nodes_.back();
  node.num_visible_outputs = visible;
  for (int k = 0; k < slots; ++k) {
    const Tensor& out = ctx.outputs[static_cast<size_t>(k)];
    Value v;
    v.id = static_cast<int64_t>(values_.size());
    v.producer = index;
    v.slot = k;
    v.root = (def.is_view && k == 0) ? values_[static_cast<size_t>(node.inputs[0])].root : v.id;
    v.shape = out.shape();
    v.dtype = out.dtype();
    v.device = out.device();
    v.offset_bytes = out.impl()->offset_bytes;
    v.bytes = out.nbytes();
    v.requires_grad = k < visible && is_floating(out.dtype());
    node.outputs.push_back(v.id);
    values_.push_back(std::move(v));
  }
  for (int64_t in : node.inputs) {
    if (in >= 0) values_[static_cast<size_t>(in)].consumers.push_back(index);
  }
  // What backward reads: one SavedTensor per storage root.
  SaveList save_list(ctx.packed);
  def.saves(attrs, save_list);
  for (const SaveRef& r : save_list.refs()) {
    const int64_t vid = r.output ? node.outputs.at(static_cast<size_t>(r.index))
                                 : node.inputs.at(static_cast<size_t>(r.index));
    REGEN_CHECK(vid >= 0, def.name, ": saves an absent input ", r.index);
    node.saved.push_back(vid);
    Value& root = values_[static_cast<size_t>(values_[static_cast<size_t>(vid)].root)];
    if (root.saved < 0) {
      const Tensor& t = r.output ? ctx.outputs[static_cast<size_t>(r.index)]
                                 : inputs[static_cast<size_t>(r.index)];
      SavedTensor s;
      s.value = root.id;
      s.producer = root.producer;
      s.slot = root.slot;
      s.storage = t.impl()->storage;
      // A leaf's own bytes: a parameter may be a view into a larger storage (data parallelism's
      // flat buckets under ZeRO, dist/data_parallel.h); anything else owns its storage whole.
      s.bytes = !s.storage ? 0 : root.producer < 0 ? root.bytes : s.storage->bytes();
      s.category = s.storage ? s.storage->category() : Category::other;
      saved_.push_back(std::move(s));
      root.saved = static_cast<int32_t>(saved_.size() - 1);
    }
    std::vector<int32_t>& readers = saved_[static_cast<size_t>(root.saved)].readers;
    if (readers.empty() || readers.back() != index) readers.push_back(index);
  }
  // The outputs belong to this tape now (if a hook throws below, they are dropped unseen).
  for (int k = 0; k < slots; ++k) {
    TensorImpl* impl = ctx.outputs[static_cast<size_t>(k)].impl().get();
    const Value& v = values_[static_cast<size_t>(node.outputs[static_cast<size_t>(k)])];
    impl->tape_value = v.id;
    impl->tape_epoch = epoch_;
    impl->produced = true;
    impl->requires_grad = v.requires_grad;
  }
  for (TapeHooks* h : hooks_) h->on_forward_end(*this, index, ctx.outputs);
  ctx.outputs.resize(static_cast<size_t>(visible));
  return std::move(ctx.outputs);
}

Tensor Tape::value_tensor(int64_t id) const {
  const Value& v = value(id);
  if (v.producer < 0 && v.leaf) return Tensor(v.leaf);
  const Value& root = value(v.root);
  std::shared_ptr<Storage> storage;
  if (root.producer < 0) {
    // A leaf (or a view of one): its own bytes while anyone holds them. A saved leaf is never
    // evicted, and after its last backward use its owner may still hold it (a remat replay of a
    // later op can read it then).
    storage = root.leaf ? root.leaf->storage : root.leaf_storage.lock();
    REGEN_CHECK(storage || v.bytes == 0, "value ", id, " (", dtype_name(v.dtype), sh(v.shape),
                ") is a leaf that the tape no longer holds (it does not require grad and no "
                "unreleased saved tensor keeps it) and its owner has released it");
  } else if (root.saved >= 0) {
    const SavedTensor& s = saved_tensor(root.saved);
    REGEN_CHECK(s.storage && s.storage->resident(), "value ", id, " (", sh(v.shape), ") is ",
                saved_state_name(s.state));
    storage = s.storage;
  } else {
    REGEN_FAIL("value ", id, " (", sh(v.shape),
               ") is not held by the tape: only saved values and leaves can be read back");
  }
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::move(storage);
  impl->offset_bytes = v.offset_bytes;
  impl->shape = v.shape;
  impl->dtype = v.dtype;
  impl->device = v.device;
  return Tensor(std::move(impl));
}

Device Tape::value_tensor_device(int64_t id) const {
  return value(id).device;
}

bool Tape::value_resident(int64_t id) const {
  const Value& root = value(value(id).root);
  if (root.producer < 0) return root.leaf || root.bytes == 0 || !root.leaf_storage.expired();
  if (root.saved < 0) return false;
  const SavedTensor& s = saved_tensor(root.saved);
  return s.storage && s.storage->resident();
}

std::vector<Tensor> Tape::replay(int32_t i, const std::vector<Tensor>& inputs) {
  const Node& n = node(i);
  const OpDef& def = op_def(n.kind);
  REGEN_CHECK(inputs.size() == n.inputs.size(), "replay of node ", i, " (", def.name,
              "): ", inputs.size(), " inputs given, expected ", n.inputs.size());
  NoGradScope no_grad;
  OpContext ctx{n.attrs, inputs, {}, true};
  ctx.packed = n.packed;
  {
    CategoryScope cat(Category::activation);
    TagScope tag(n.tag);
    def.forward(ctx);
  }
  REGEN_ASSERT(ctx.outputs.size() == n.outputs.size());
  return std::move(ctx.outputs);
}

void Tape::evict(int32_t saved) {
  SavedTensor& s = saved_.at(static_cast<size_t>(saved));
  REGEN_CHECK(!s.is_leaf(), "evict: saved tensor ", saved, " is a leaf (parameter or input)");
  REGEN_CHECK(s.state == SavedState::resident && s.storage, "evict: saved tensor ", saved, " is ",
              saved_state_name(s.state));
  s.storage->evict();
  s.state = SavedState::evicted;
}

void Tape::restore(int32_t saved, const Tensor& fresh) {
  SavedTensor& s = saved_.at(static_cast<size_t>(saved));
  REGEN_CHECK(s.state == SavedState::evicted && s.storage, "restore: saved tensor ", saved, " is ",
              saved_state_name(s.state));
  REGEN_CHECK(fresh.impl()->storage && fresh.impl()->offset_bytes == 0, "restore: saved tensor ",
              saved, " needs a freshly computed root tensor");
  s.storage->adopt(*fresh.impl()->storage);
  s.state = SavedState::resident;
}

bool Tape::evicted_saved_input(const Tensor& t) const {
  const TensorImpl* impl = t.impl().get();
  if (impl->tape_epoch != epoch_ || impl->tape_value < 0) return false;
  const Value& root = value(value(impl->tape_value).root);
  return root.saved >= 0 && saved_tensor(root.saved).state == SavedState::evicted;
}

void Tape::ensure_resident(int32_t saved) {
  if (saved < 0) return;
  SavedTensor& s = saved_.at(static_cast<size_t>(saved));
  if (s.state == SavedState::resident) return;
  REGEN_CHECK(s.state != SavedState::released, "saved tensor ", saved, " (value ", s.value,
              ") was already released: backward read it after its last use");
  for (TapeHooks* h : hooks_) {
    if (h->regenerate(*this, saved) && s.state == SavedState::resident) return;
  }
  REGEN_FAIL("saved tensor ", saved, " (value ", s.value, ", ", format_bytes(s.bytes),
             ") is evicted and no remat runtime regenerated it");
}

void Tape::release_saved(int32_t saved) {
  SavedTensor& s = saved_.at(static_cast<size_t>(saved));
  s.storage.reset();
  s.state = SavedState::released;
}

void Tape::clear() {
  nodes_.clear();
  values_.clear();
  saved_.clear();
  blocks_.clear();
  block_stack_.clear();
  backward_order_.clear();
  epoch_ = g_epoch++;
}

void backward(const Tensor& loss) {
  Tape::current().backward(loss);
}

void zero_grad(const std::vector<Tensor>& params) {
  for (const Tensor& p : params) {
    if (p.impl()->grad) zero_(Tensor(p.impl()->grad));
  }
}

}  // namespace regen
