// The tape-based autograd engine. docs/architecture.md ("autograd") explains the data structures;
// tests: tests/test_autograd.cpp, tests/test_gradcheck.cpp.
//
// When grad mode is on and an op has an input that requires grad, the op appends a Node to the
// thread's Tape: its kind, attributes (a trivially copyable struct: no tensors can hide there),
// input and output Values, and the Values its backward reads. Backward reads forward data only
// through SavedTensor records, one per saved storage, which the tape owns. A SavedTensor knows
// its producer node and output slot, its bytes, category and state (resident, evicted, released);
// the remat runtime (remat/) evicts and regenerates them through TapeHooks.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "regen/core/tensor.h"

namespace regen {

// An op kind. Its enumerators come from the op list, autograd/op_list.h, which only the files that
// define or test ops include: the rest of the library (profiles, plans, the simulator, reports)
// names ops at run time through op_name and op_kind_by_name, so adding an op recompiles autograd,
// kernels and tests only.
enum class OpKind : uint16_t;
// No op: a default-constructed Node's or ProfileNode's kind, and what op_kind_by_name returns for
// an unknown name (op_name of it is "?").
constexpr OpKind kNoOpKind = static_cast<OpKind>(0xffff);
// How many op kinds the op list has (OpKind values 0 .. num_op_kinds() - 1).
int num_op_kinds();

// Attributes travel as a fixed-size, trivially copyable blob: a Node can be replayed from its
// attributes and input values alone, and no tensor can be hidden inside.
struct AttrBlob {
  static constexpr size_t kBytes = 96;
  alignas(8) std::array<unsigned char, kBytes> bytes{};
  size_t size = 0;

  template <class A>
  static AttrBlob of(const A& a) {
    static_assert(std::is_trivially_copyable<A>::value, "op attributes must be trivially copyable");
    static_assert(sizeof(A) <= kBytes, "op attributes too large for AttrBlob");
    AttrBlob b;
    std::memcpy(b.bytes.data(), &a, sizeof(A));
    b.size = sizeof(A);
    return b;
  }
  template <class A>
  const A& as() const {
    static_assert(std::is_trivially_copyable<A>::value, "op attributes must be trivially copyable");
    return *reinterpret_cast<const A*>(bytes.data());
  }
};
struct NoAttrs {};

// ---- Values, saved tensors, nodes ----------------------------------------------------------

// Every tensor an op reads or writes while recording is a Value: leaves (parameters, inputs,
// buffers) and node outputs alike. Views (reshape) share their root's storage.
struct Value {
  int64_t id = -1;
  int32_t producer = -1;  // node index; -1 for a leaf
  int32_t slot = 0;       // output slot of the producer
  int64_t root = -1;      // the value that owns the storage (itself unless a view)
  Shape shape;
  DType dtype = DType::f32;
  uint64_t offset_bytes = 0;  // into the root's storage
  uint64_t bytes = 0;         // of this value's elements
  bool requires_grad = false;
  Device device;  // where its bytes live
  // Leaves only. The tape pins a leaf only where it must: `leaf` is a strong reference kept for
  // leaves that require grad (their gradient accumulates into leaf->grad). Every other leaf is
  // held weakly through `leaf_storage`: an input no op saves (add's operands, an activation
  // computed under no-grad) is freed when its owner drops it, as the allocator and the remat
  // planner see. A saved leaf is held by its SavedTensor, like any saved value.
  std::shared_ptr<TensorImpl> leaf;
  std::weak_ptr<Storage> leaf_storage;
  // A small leaf that needs no gradient (at most kHeldLeafBytes: a constant made in forward,
  // zeros or a mask) is held until the tape is cleared, so a remat replay can still read it after
  // its owner dropped it; a larger one is not, and what depends on it cannot be recomputed (the
  // plan's note names it).
  static constexpr uint64_t kHeldLeafBytes = 64 * 1024;
  std::shared_ptr<Storage> held;
  std::vector<int32_t> consumers;  // nodes that read it as an input, in order
  int32_t saved = -1;              // index into Tape::saved() of its root, when saved
};

enum class SavedState : uint8_t { resident, evicted, released };
const char* saved_state_name(SavedState s);

// One per saved storage (saved views of the same storage share one record).
struct SavedTensor {
  int64_t value = -1;     // the root value
  int32_t producer = -1;  // producer node of the root (-1: a leaf, e.g. a parameter)
  int32_t slot = 0;
  uint64_t bytes = 0;  // storage bytes
  Category category = Category::other;
  SavedState state = SavedState::resident;
  std::shared_ptr<Storage> storage;  // the tape's reference; null once released
  std::vector<int32_t> readers;      // nodes whose backward reads it, in forward order
  int32_t backward_uses_left = 0;    // set when backward starts
  bool is_leaf() const { return producer < 0; }
};

struct Node {
  int32_t index = -1;
  OpKind kind = kNoOpKind;
  AttrBlob attrs;
  std::vector<int64_t> inputs;   // value ids (-1 for an absent optional input)
  std::vector<int64_t> outputs;  // value ids, all slots (hidden ones included)
  int num_visible_outputs = 0;
  std::vector<int64_t> saved;  // value ids backward reads, in the op's order
  uint32_t scope = 0;          // interned module path, e.g. "layer1.0.conv1"
  int32_t block = -1;          // enclosing block (residual or encoder layer), -1 if none
  uint32_t tag = 0;            // interned allocation tag: "<scope>/<op>#<index>"
  bool needs_input_grad_any = false;
  // The node saves the packed form its op offers (OpDef::packed_output) instead of the full
  // output; its replays produce the same form (PackedSaves below).
  bool packed = false;
  template <class A>
  const A& attr() const {
    return attrs.as<A>();
  }
};

// A checkpointable block, marked by models with BlockScope: residual blocks, encoder layers.
struct BlockInfoRec {
  int32_t index = -1;
  uint32_t name = 0;  // interned
  int32_t first_node = -1, last_node = -1;
};

class Tape;

// Observers of recording and backward. The profiler (timing, memory events) and the remat
// executor (evict after the last forward use, regenerate before the first backward use) use
// these; several may be installed at once and are called in installation order.
class TapeHooks {
 public:
  virtual ~TapeHooks() = default;
  virtual void on_forward_begin(Tape&, int32_t /*node*/) {}
  // The op of `node` threw after on_forward_begin (its forward, or a hook's on_forward_end): the
  // tape has removed the node, and index `node` will be reused by the next op. Must not throw.
  virtual void on_forward_abort(Tape&, int32_t /*node*/) {}
  // `outputs` holds every output slot of the node (hidden ones included).
  virtual void on_forward_end(Tape&, int32_t /*node*/, const std::vector<Tensor>& /*outputs*/) {}
  virtual void on_backward_start(Tape&) {}
  virtual void on_backward_begin(Tape&, int32_t /*node*/) {}
  virtual void on_backward_end(Tape&, int32_t /*node*/) {}
  // The backward of `node` read saved value `value` (one of its Node::saved) through
  // BackwardContext::saved_input / saved_output, after it was made resident. The op table checks
  // with it that every op's backward reads everything the op saved (tests/test_op_table.cpp).
  virtual void on_saved_read(Tape&, int32_t /*node*/, int64_t /*value*/) {}
  virtual void on_backward_finish(Tape&) {}
  // An op's inputs may include saved tensors a remat runtime evicted (DTR, remat/execute/dtr.h):
  // the runtime makes them resident again in on_forward_begin, which runs before the op reads them;
  // the tape checks that it did.
  // Backward is about to read saved tensor `saved` while it is evicted. Return true after making
  // it resident; false lets the next hook try (and finally the engine throws).
  virtual bool regenerate(Tape&, int32_t /*saved*/) { return false; }
};

// Installs hooks on the calling thread's tape for a scope and removes them when the scope ends,
// also when an exception leaves it; a null pointer installs nothing. Declare the hooks before the
// scope, so they outlive their registration.
class HooksScope {
 public:
  explicit HooksScope(TapeHooks* hooks);
  ~HooksScope();
  HooksScope(const HooksScope&) = delete;
  HooksScope& operator=(const HooksScope&) = delete;

 private:
  Tape* tape_;
  TapeHooks* hooks_;
};

// ---- Forward / backward contexts the ops implement against ----------------------------------

struct OpContext {
  const AttrBlob& attrs;
  const std::vector<Tensor>& inputs;  // undefined entries for absent optional inputs
  std::vector<Tensor> outputs;        // the op fills every slot, hidden ones included
  bool replay = false;  // re-run by the remat runtime: no side effects (running stats...)
  // Produce the packed form of OpDef::packed_output as well (the node saves it; PackedSaves).
  bool packed = false;
  template <class A>
  const A& attr() const {
    return attrs.as<A>();
  }
};

class BackwardContext {
 public:
  BackwardContext(Tape& tape, const Node& node, std::vector<Tensor> grad_outputs);
  // What forward saved, read by the name OpDef::saves gave it (SaveList::input(i) / output(k)),
  // resident (regenerated first if the planner evicted it). Reading anything the op's saves did
  // not list fails, naming the op: backward reads forward data only through SavedTensors.
  Tensor saved_input(int i) const;
  Tensor saved_output(int k) const;
  // Gradient flowing into visible output j; undefined when none flowed.
  const Tensor& grad_output(int j) const { return grad_outputs_[j]; }
  // Gradient of output j, or zeros of its shape when none flowed.
  Tensor grad_output_or_zeros(int j) const;
  bool needs_grad(int input) const;
  // Writes (=, not +=) the gradient of input i; the engine accumulates across consumers.
  void set_grad_input(int input, Tensor g);
  const Node& node() const { return node_; }
  Tape& tape() const { return tape_; }
  template <class A>
  const A& attr() const {
    return node_.attrs.as<A>();
  }
  std::vector<Tensor>& grad_inputs() { return grad_inputs_; }

 private:
  Tensor read_saved(bool output, int index) const;
  Tape& tape_;
  const Node& node_;
  std::vector<Tensor> grad_outputs_;
  std::vector<Tensor> grad_inputs_;
};

// What backward reads, named by where it comes from: input i or output slot k of the node.
struct SaveRef {
  bool output;
  int index;
};
// What an op saves for backward, by name: OpDef::saves fills it with s.input(0).output(1) (the
// order is free), and backward reads each by the same name, c.saved_input(0), c.saved_output(1).
// Each becomes a SavedTensor the remat planner can evict and replay.
class SaveList {
 public:
  // `packed`: the node saves its op's packed form (OpDef::packed_output) instead of that output.
  explicit SaveList(bool packed = false) : packed_(packed) {}
  bool packed() const { return packed_; }
  SaveList& input(int i) {
    refs_.push_back({false, i});
    return *this;
  }
  SaveList& output(int k) {
    refs_.push_back({true, k});
    return *this;
  }
  const std::vector<SaveRef>& refs() const { return refs_; }

 private:
  bool packed_ = false;
  std::vector<SaveRef> refs_;
};

// OpDef::num_outputs and num_visible_outputs of an op whose output count depends on its
// attributes (split): every slot its forward fills is an output, all of them visible.
constexpr int kVariableOutputs = -1;

struct OpDef {
  const char* name;
  int num_outputs;          // all slots (or kVariableOutputs)
  int num_visible_outputs;  // returned to the caller; the rest are backward-only (e.g. BN stats)
  bool is_view;             // output 0 shares input 0's storage (reshape)
  void (*forward)(OpContext&);
  void (*backward)(BackwardContext&);
  // Which inputs and outputs backward reads (may depend on attributes); SaveList above.
  void (*saves)(const AttrBlob&, SaveList&);
  // Packed saves (docs/ops.md, "Packed saves"): the output slot whose full saved copy the op can
  // replace by a packed form its backward runs from, bit for bit (relu: output 0, by a 1-bit mask
  // of y > 0 in a hidden output; max_pool2d: output 1, its argmax, by window positions in a few
  // bits), or -1. With OpContext::packed (and SaveList::packed) set, forward makes the packed form
  // and saves name it. Which nodes do is PackedSaves' decision, below.
  int packed_output = -1;
};
const OpDef& op_def(OpKind kind);
const char* op_name(OpKind kind);  // "?" for a value outside the list
// The kind whose op_name is `name`, or kNoOpKind.
OpKind op_kind_by_name(const std::string& name);
// Each op file registers its OpDef at static initialization (linked whenever the op is used).
bool register_op(OpKind kind, const OpDef* def);

// ---- Packed saves ------------------------------------------------------------------------------

// Which nodes of a step save the packed form their op offers (OpDef::packed_output), by node index.
// A packed form pays only where nothing else keeps the output it replaces: a relu whose output the
// next convolution saves anyway gains nothing from a mask (the mask would cost bytes on top). So
// the decision is made on a recording of the same step with nothing packed (decide_packed_saves): a
// node saves its packed form exactly when no other node's backward reads the output it replaces
// (through any view of it). The tape applies the decisions while they are installed
// (PackedSavesScope), by node index; a node whose op differs from the one decided for (a step whose
// graph changed) saves its full form. Models are static, so the decisions made on one recording
// hold for every step of the run (models/train.h learn_packed_saves makes them from a dry run).
struct PackedSaves {
  std::vector<OpKind> kinds;    // per node index: the op recorded there
  std::vector<uint8_t> packed;  // per node index: 1 when that node saves its packed form
  // Whether node `index`, an op of `kind`, saves its packed form.
  bool packs(int32_t index, OpKind kind) const {
    const size_t i = static_cast<size_t>(index);
    return index >= 0 && i < packed.size() && kinds[i] == kind && packed[i] != 0;
  }
  // How many nodes save their packed form.
  int64_t count() const;
};
// The decisions for a recording made with nothing packed (throws regen::Error for one that has a
// packed node): every node whose op offers a packed form and whose replaced output no other node's
// backward reads.
PackedSaves decide_packed_saves(const Tape& tape);

// ---- The tape ---------------------------------------------------------------------------------

class Tape {
 public:
  Tape();
  // The calling thread's tape.
  static Tape& current();

  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<Value>& values() const { return values_; }
  const std::vector<SavedTensor>& saved() const { return saved_; }
  const std::vector<BlockInfoRec>& blocks() const { return blocks_; }
  const Node& node(int32_t i) const { return nodes_.at(static_cast<size_t>(i)); }
  const Value& value(int64_t id) const { return values_.at(static_cast<size_t>(id)); }
  const SavedTensor& saved_tensor(int32_t i) const { return saved_.at(static_cast<size_t>(i)); }
  uint64_t epoch() const { return epoch_; }
  bool empty() const { return nodes_.empty(); }
  // Backward-active nodes in the order backward runs them (valid from on_backward_start).
  const std::vector<int32_t>& backward_order() const { return backward_order_; }

  // Records (when grad mode is on and an input requires grad) and runs an op. Strong exception
  // guarantee: if the op throws (bad input found by a kernel, OutOfMemory, ...), the tape, its
  // blocks, values and saved tensors and the inputs' tape fields are as they were before the call
  // (under autocast, the cast nodes recorded for its inputs stay: they are whole nodes, which
  // nothing reads, and backward skips them).
  // Under autocast (AutocastScope, autograd/precision.h; not in backward, not for cast itself) the
  // op's floating inputs are first cast, by recorded cast nodes, to the dtypes its precision rule
  // gives (autograd/precision.cpp).
  std::vector<Tensor> apply(OpKind kind, const AttrBlob& attrs, std::vector<Tensor> inputs);

  // Runs backward from a scalar (or from `grad` of the loss's shape), accumulates parameter
  // gradients, then releases the tape. Throws if the tape was already released.
  void backward(const Tensor& loss, const Tensor& grad = Tensor());
  // Drops everything recorded (e.g. after a forward-only evaluation with grad mode on).
  void clear();

  // ---- For the remat runtime (remat/execute/executor.cpp) ----
  // A tensor for value `id`: a leaf that requires grad is returned itself; anything else is
  // built on its root's storage, which must be a resident saved tensor or a leaf that is still
  // alive (a leaf the tape holds only weakly fails with an error once its owner released it).
  Tensor value_tensor(int64_t id) const;
  // Whether value `id`'s bytes are available right now.
  bool value_resident(int64_t id) const;
  Device value_tensor_device(int64_t id) const;
  // Re-runs node `i`'s forward on `inputs` without recording, in replay mode; returns all slots.
  std::vector<Tensor> replay(int32_t i, const std::vector<Tensor>& inputs);
  // Frees a saved storage's bytes (all views of it see them go) / re-attaches freshly computed
  // bytes from `fresh`, which must be the regenerated root tensor.
  void evict(int32_t saved);
  void restore(int32_t saved, const Tensor& fresh);

  void add_hooks(TapeHooks* hooks);
  void remove_hooks(TapeHooks* hooks);
  size_t num_hooks() const { return hooks_.size(); }

  // The packed-save decisions applied to nodes recorded from now on (nullptr: none; every node
  // saves its full form). PackedSavesScope installs them for a scope.
  void set_packed_saves(const PackedSaves* decisions) { packed_saves_ = decisions; }
  const PackedSaves* packed_saves() const { return packed_saves_; }

  // Block scopes (models mark residual blocks and encoder layers).
  int32_t begin_block(uint32_t name);
  void end_block(int32_t block);

 private:
  friend class BackwardContext;
  int64_t register_input(const Tensor& t);
  // Autocast (autograd/precision.h AutocastScope): replaces each floating input whose dtype differs
  // from what op `kind`'s precision rule asks for under the scope's 16-bit dtype by cast(input).
  void autocast_inputs(OpKind kind, std::vector<Tensor>& inputs);
  // apply's recording path; apply undoes what it did if it throws. `hooks_begun` counts the
  // hooks whose on_forward_begin was called (they get on_forward_abort).
  std::vector<Tensor> record(const OpDef& def, OpKind kind, const AttrBlob& attrs,
                             const std::vector<Tensor>& inputs, OpContext& ctx, int32_t index,
                             int32_t block, size_t& hooks_begun);
  void ensure_resident(int32_t saved);
  // Whether `t` is a value of this recording whose storage is a saved tensor in state evicted.
  bool evicted_saved_input(const Tensor& t) const;
  void release_saved(int32_t saved);
  void accumulate_grad(int64_t value, Tensor g, std::vector<Tensor>& grads);

  std::vector<Node> nodes_;
  std::vector<Value> values_;
  std::vector<SavedTensor> saved_;
  std::vector<BlockInfoRec> blocks_;
  std::vector<int32_t> block_stack_;
  std::vector<int32_t> backward_order_;
  std::vector<TapeHooks*> hooks_;
  const PackedSaves* packed_saves_ = nullptr;
  uint64_t epoch_;
  bool in_backward_ = false;
};

// Installs packed-save decisions on the calling thread's tape for a scope (nullptr: none) and puts
// back the ones before when it ends, also when an exception leaves it. The decisions must outlive
// the scope.
class PackedSavesScope {
 public:
  explicit PackedSavesScope(const PackedSaves* decisions);
  ~PackedSavesScope();
  PackedSavesScope(const PackedSavesScope&) = delete;
  PackedSavesScope& operator=(const PackedSavesScope&) = delete;

 private:
  Tape* tape_;
  const PackedSaves* before_;
};

// ---- Modes and scopes -------------------------------------------------------------------------

bool grad_mode_enabled();
class NoGradScope {
 public:
  NoGradScope();
  ~NoGradScope();
  NoGradScope(const NoGradScope&) = delete;
  NoGradScope& operator=(const NoGradScope&) = delete;

 private:
  bool saved_;
};

// The module path nodes are recorded under ("layer1.0.conv1"); models push one per module.
class ModuleScope {
 public:
  explicit ModuleScope(const std::string& name);
  ~ModuleScope();
  ModuleScope(const ModuleScope&) = delete;
  ModuleScope& operator=(const ModuleScope&) = delete;
  static const std::string& current_path();

 private:
  size_t saved_size_;
};

// Marks a checkpointable block (the unit of the `blocks` and `sqrt` planners).
class BlockScope {
 public:
  explicit BlockScope(const std::string& name);
  ~BlockScope();
  BlockScope(const BlockScope&) = delete;
  BlockScope& operator=(const BlockScope&) = delete;

 private:
  int32_t block_;
};

// Convenience: records and runs an op with typed attributes.
template <class A>
std::vector<Tensor> apply_op(OpKind kind, const A& attrs, std::vector<Tensor> inputs) {
  return Tape::current().apply(kind, AttrBlob::of(attrs), std::move(inputs));
}

// dst += src (same shape, dtype and device), on any device.
void accumulate_into(const Tensor& dst, const Tensor& src);

// backward(loss) on the current tape; zero_grad on a set of parameters (keeps their memory).
void backward(const Tensor& loss);
void zero_grad(const std::vector<Tensor>& params);

// Global RNG state for ops that draw random numbers (dropout). Each call to next_rng_stream()
// returns a fresh Philox subsequence, stored in the node's attributes so a replay reuses it.
void manual_seed(uint64_t seed);
uint64_t rng_seed();
uint64_t next_rng_stream();
// The stream the next draw takes, and setting seed and position back (a resumed run, or code that
// must not shift later draws, such as evaluation).
uint64_t rng_stream_position();
void set_rng_state(uint64_t seed, uint64_t stream);

// Saves the global RNG's stream counter and puts it back when the scope ends: a recording made only
// to learn the step's shape (learn_packed_saves) must not shift the dropout masks of the steps that
// follow.
class RngStreamRestore {
 public:
  RngStreamRestore();
  ~RngStreamRestore();
  RngStreamRestore(const RngStreamRestore&) = delete;
  RngStreamRestore& operator=(const RngStreamRestore&) = delete;

 private:
  uint64_t seed_, stream_;
};

// Draws a stream for one op call and gives it back if the call does not complete: an op that
// throws must not shift the streams of every later op (a run with a failed call then draws the
// same masks as a run without it). Usage: RngStreamDraw d; a.stream = d.stream(); apply...;
// d.commit();
class RngStreamDraw {
 public:
  RngStreamDraw() : stream_(next_rng_stream()) {}
  ~RngStreamDraw();
  RngStreamDraw(const RngStreamDraw&) = delete;
  RngStreamDraw& operator=(const RngStreamDraw&) = delete;
  uint64_t stream() const { return stream_; }
  void commit() { committed_ = true; }

 private:
  uint64_t stream_;
  bool committed_ = false;
};

}  // namespace regen
