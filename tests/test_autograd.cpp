// The autograd engine: the tape's records, saved tensors and their release, gradient
// accumulation, memory after backward, determinism with dropout, training an MLP and a CNN, the
// no-grad scope, and the errors (backward twice, mismatched shapes, wrong dtypes, mixed devices).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <thread>
#include <tuple>

#include "regen/autograd/op_list.h"
#include "regen/autograd/ops.h"
#include "regen/models/layers.h"
#include "regen/models/model.h"
#include "regen/models/optim.h"
#include "regen/models/train.h"
#include "tests/test_util.h"

using namespace regen;
using regen::testing::error_of;

namespace {
// A container so parameters get unique full names ("l1.weight").
class Net : public Module {
 public:
  template <class M>
  M& add(const std::string& name, std::unique_ptr<M> m) {
    M& ref = register_module(name, std::move(m));
    assign_full_names();
    return ref;
  }
};

}  // namespace

TEST_CASE("an op without a 16-bit path refuses a bf16 or f16 tensor by name") {
  for (DType dt : {DType::bf16, DType::f16}) {
    const Tensor logits = zeros({2, 3}, dt), targets = zeros({2}, DType::i64);
    const std::string e = error_of([&] { cross_entropy(logits, targets); });
    CHECK(e.find("cross_entropy: logits") != std::string::npos);
    CHECK(e.find(dtype_name(dt)) != std::string::npos);
    CHECK(e.find("are 16-bit; the loss is computed in f32 only") != std::string::npos);
    const Tensor x = zeros({2, 3}, dt), w = zeros({4, 3}, dt);
    CHECK(linear(x, w).dtype() == dt);  // linear has one
  }
}

TEST_CASE("named saves: backward reads what forward saved by its name, and nothing else") {
  Generator g(2);
  Tensor w = uniform({4, 3}, -1, 1, g).set_requires_grad(true);
  Tensor x = uniform({5, 3}, -1, 1, g);
  Tape& tape = Tape::current();
  REQUIRE(tape.empty());
  Tensor h = relu(linear(x, w));
  {
    // relu saves its output 0: read by that name it is the output's bytes; its input, its absent
    // output 1 and linear's unsaved output are refused, naming the op.
    BackwardContext c(tape, tape.node(1), {});
    const Tensor y = c.saved_output(0);
    CHECK(y.data<float>() == h.data<float>());
    testing::expect_error([&] { c.saved_input(0); },
                          {"relu backward: reads input 0", "OpDef::saves does not list"});
    testing::expect_error([&] { c.saved_output(1); },
                          {"relu backward: reads saved output 1", "1 outputs"});
    BackwardContext l(tape, tape.node(0), {});
    CHECK(l.saved_input(0).data<float>() == x.data<float>());
    CHECK(l.saved_input(1).data<float>() == w.data<float>());
    testing::expect_error([&] { l.saved_output(0); }, {"linear backward: reads output 0"});
  }
  tape.clear();
}

TEST_CASE("tape: nodes, values and saved tensors are recorded, then released by backward") {
  Generator g(1);
  Tensor w = uniform({4, 3}, -1, 1, g).set_requires_grad(true);
  Tensor x = uniform({5, 3}, -1, 1, g);
  Tape& tape = Tape::current();
  REQUIRE(tape.empty());
  Tensor h = relu(linear(x, w));
  Tensor loss = mean(h);
  h = Tensor();
  REQUIRE(tape.nodes().size() == 3);
  CHECK(tape.node(0).kind == OpKind::linear);
  CHECK(tape.node(1).kind == OpKind::relu);
  CHECK(tape.node(2).kind == OpKind::mean);
  // linear saves x and w (leaves); relu saves its output, an activation.
  const Node& r = tape.node(1);
  REQUIRE(r.saved.size() == 1);
  const Value& out = tape.value(r.saved[0]);
  CHECK(out.producer == 1);
  const SavedTensor& s = tape.saved_tensor(out.saved);
  CHECK(s.producer == 1);
  CHECK(s.bytes == 5 * 4 * 4);
  CHECK(s.category == Category::activation);
  CHECK(s.state == SavedState::resident);
  CHECK(s.readers == std::vector<int32_t>{1});
  backward(loss);
  CHECK(tape.empty());
  CHECK(w.grad().defined());
}

TEST_CASE("backward: parameter gradients accumulate across calls, zero_grad keeps the buffers") {
  Generator g(2);
  Tensor w = uniform({8, 8}, -1, 1, g).set_requires_grad(true);
  Tensor x = uniform({16, 8}, -1, 1, g);
  backward(sum(relu(linear(relu(linear(x, w)), w))));  // w used twice: contributions add
  const std::vector<float> once = w.grad().to_vector<float>();
  backward(sum(relu(linear(relu(linear(x, w)), w))));
  const std::vector<float> twice = w.grad().to_vector<float>();
  for (size_t i = 0; i < once.size(); ++i) CHECK(twice[i] == doctest::Approx(2 * once[i]));
  zero_grad({w});
  for (float v : w.grad().to_vector<float>()) CHECK(v == 0.0f);
}

namespace {
// Parameters and inputs of the mixed graph below, in their own categories so that the
// activation category holds exactly what the graph computes.
struct MixedGraph {
  Tensor x, targets, key_pad;                       // inputs
  Tensor conv_w, conv_b, bn_g, bn_b, bn_rm, bn_rv;  // vision part
  Tensor ln_g, ln_b, w_qkv, w_out;                  // sequence part
  std::vector<Tensor> params() const {
    return {conv_w, conv_b, bn_g, bn_b, ln_g, ln_b, w_qkv, w_out};
  }
  MixedGraph() {
    Generator g(21);
    {
      CategoryScope cat(Category::input);
      x = uniform({2, 3, 8, 8}, -1, 1, g);
      std::vector<int64_t> t(32);
      for (int i = 0; i < 32; ++i) t[i] = i % 5 == 4 ? -100 : (i * 7) % 5;
      targets = from_vector<int64_t>(t, {32});
      std::vector<int32_t> pad(32, 0);
      pad[15] = pad[14] = 1;  // batch 0 pads its last two keys
      key_pad = from_vector<int32_t>(pad, {2, 16});
    }
    CategoryScope cat(Category::parameter);
    conv_w = uniform({4, 3, 3, 3}, -0.5, 0.5, g).set_requires_grad(true);
    conv_b = uniform({4}, -0.5, 0.5, g).set_requires_grad(true);
    bn_g = uniform({4}, 0.5, 1.5, g).set_requires_grad(true);
    bn_b = uniform({4}, -0.5, 0.5, g).set_requires_grad(true);
    bn_rm = zeros({4});
    bn_rv = ones({4});
    ln_g = uniform({4}, 0.5, 1.5, g).set_requires_grad(true);
    ln_b = uniform({4}, -0.5, 0.5, g).set_requires_grad(true);
    w_qkv = uniform({12, 4}, -0.5, 0.5, g).set_requires_grad(true);
    w_out = uniform({5, 4}, -0.5, 0.5, g).set_requires_grad(true);
  }
  // conv2d -> batchnorm2d -> gelu -> max_pool2d -> tokens -> layernorm -> linear -> attention
  // (dropout inside) -> dropout -> residual add -> linear -> cross_entropy. Only the loss is
  // returned: every intermediate handle is dropped, so what stays alive is what the tape saves.
  Tensor loss() const {
    Tensor h = conv2d(x, conv_w, conv_b, 1, 1);  // (2, 4, 8, 8)
    h = batchnorm2d(h, bn_g, bn_b, bn_rm, bn_rv, true);
    h = max_pool2d(gelu(h), 2, 2);                       // (2, 4, 4, 4)
    Tensor t = transpose(reshape(h, {2, 4, 16}), 1, 2);  // (2, 16, 4)
    h = Tensor();
    Tensor a = attention(linear(layernorm(t, ln_g, ln_b), w_qkv), 2, key_pad, false, 0.1f);
    a = add(dropout(a, 0.25f), t);
    return cross_entropy(linear(reshape(a, {32, 4}), w_out), targets);
  }
};

// Checks through the tape's hooks that every saved tensor is resident when backward reads it and
// released right after its last backward use, and that the activation category then holds
// exactly the resident saved activations plus what the caller still holds (`held` bytes).
class ReleaseChecker : public TapeHooks {
 public:
  explicit ReleaseChecker(int64_t held) : held_(held) {}
  int violations = 0, nodes_checked = 0, released_in_backward = 0;

  void on_backward_start(Tape& tape) override {
    const std::vector<int32_t>& order = tape.backward_order();
    position_.assign(tape.nodes().size(), -1);
    for (size_t p = 0; p < order.size(); ++p)
      position_[static_cast<size_t>(order[p])] = static_cast<int>(p);
    last_use_.assign(tape.saved().size(), -1);
    for (size_t s = 0; s < tape.saved().size(); ++s) {
      for (int32_t r : tape.saved()[s].readers) {
        last_use_[s] = std::max(last_use_[s], position_[static_cast<size_t>(r)]);
      }
    }
    check(tape, -1);  // saved tensors that backward never reads are released before it starts
  }
  void on_backward_begin(Tape& tape, int32_t node) override {
    for (int64_t v : tape.node(node).saved) {
      const SavedTensor& s = tape.saved_tensor(tape.value(tape.value(v).root).saved);
      if (s.state != SavedState::resident || !s.storage) {
        ++violations;
        MESSAGE("node ", node, " (", op_name(tape.node(node).kind),
                ") reads a saved tensor that is ", saved_state_name(s.state));
      }
    }
  }
  void on_backward_end(Tape& tape, int32_t node) override {
    ++nodes_checked;
    check(tape, position_[static_cast<size_t>(node)]);
  }

 private:
  void check(const Tape& tape, int position) {
    int64_t resident_activation = 0;
    for (size_t s = 0; s < tape.saved().size(); ++s) {
      const SavedTensor& st = tape.saved()[s];
      const bool should_be_released = last_use_[s] <= position;
      const bool released = st.state == SavedState::released && !st.storage;
      if (released != should_be_released) {
        ++violations;
        MESSAGE("after backward position ", position, ": saved tensor ", s, " (value ", st.value,
                ", last use at ", last_use_[s], ") is ", saved_state_name(st.state));
      }
      if (released && last_use_[s] == position && position >= 0) ++released_in_backward;
      if (!released && st.category == Category::activation)
        resident_activation += static_cast<int64_t>(st.bytes);
    }
    // Nothing else of the forward pass is alive: a released saved tensor's bytes are gone.
    const int64_t live = allocated_requested(Category::activation);
    if (live != resident_activation + held_) {
      ++violations;
      MESSAGE("after backward position ", position, ": activation bytes ", live, ", expected ",
              resident_activation, " saved + ", held_, " held");
    }
  }
  static int64_t allocated_requested(Category c) {
    return allocator_for(Device::cpu()).stats().requested_by[static_cast<int>(c)].current;
  }
  int64_t held_;
  std::vector<int> position_, last_use_;
};

int64_t requested(Category c) {
  return allocator_for(Device::cpu()).stats().requested_by[static_cast<int>(c)].current;
}

}  // namespace

TEST_CASE("memory: saved tensors are freed after their last backward use, no activation left") {
  // conv2d, batchnorm2d, gelu, max_pool2d, layernorm, attention, dropout, cross_entropy.
  Tape::current().clear();
  REQUIRE(requested(Category::activation) == 0);
  REQUIRE(requested(Category::gradient) == 0);
  manual_seed(8);
  MixedGraph m;
  int64_t param_bytes = 0;
  for (const Tensor& p : m.params()) param_bytes += static_cast<int64_t>(p.nbytes());
  {
    Tensor loss = m.loss();
    const Tape& tape = Tape::current();
    // Every saved activation is in the tape's records, and nothing else of the forward is alive.
    int64_t saved_activation = 0;
    for (const SavedTensor& s : tape.saved()) {
      if (s.category == Category::activation) saved_activation += static_cast<int64_t>(s.bytes);
    }
    CHECK(requested(Category::activation) ==
          saved_activation + static_cast<int64_t>(loss.nbytes()));
    std::vector<OpKind> kinds;
    for (const Node& n : tape.nodes()) kinds.push_back(n.kind);
    for (OpKind k :
         {OpKind::conv2d, OpKind::batchnorm2d, OpKind::gelu, OpKind::max_pool2d, OpKind::layernorm,
          OpKind::attention, OpKind::dropout, OpKind::cross_entropy}) {
      CHECK_MESSAGE(std::find(kinds.begin(), kinds.end(), k) != kinds.end(), op_name(k),
                    " not recorded");
    }
    ReleaseChecker checker(static_cast<int64_t>(loss.nbytes()));
    {
      const HooksScope guard(&checker);  // removed even when a REQUIRE throws
      backward(loss);
    }
    CHECK(checker.violations == 0);
    CHECK(checker.nodes_checked == static_cast<int>(kinds.size()));
    CHECK(checker.released_in_backward > 0);
    CHECK(Tape::current().empty());
    CHECK(requested(Category::activation) == static_cast<int64_t>(loss.nbytes()));
  }
  CHECK(requested(Category::activation) == 0);
  // Gradient memory: exactly one buffer per parameter; every activation gradient was freed.
  CHECK(requested(Category::gradient) == param_bytes);
  for (const Tensor& p : m.params()) CHECK(p.grad().defined());

  // A tape destroyed with a recording still on it (its thread ends without backward) frees all.
  int64_t in_thread = 0;
  std::thread([&] {
    Tensor loss = m.loss();
    in_thread = requested(Category::activation);
  }).join();
  CHECK(in_thread > 0);
  CHECK(requested(Category::activation) == 0);
  // clear() drops a forward-only recording the same way.
  {
    Tensor loss = m.loss();
    loss = Tensor();
    CHECK(requested(Category::activation) > 0);
    Tape::current().clear();
    CHECK(requested(Category::activation) == 0);
  }
  CHECK(requested(Category::gradient) == param_bytes);  // untouched by recordings without backward
}

TEST_CASE("tape: a leaf no op saves is not pinned, a saved leaf is held by its SavedTensor") {
  Tape::current().clear();
  const int64_t n = 1 << 20;  // 4 MiB of f32
  const int64_t bytes = n * 4;
  Tensor w;
  {
    CategoryScope cat(Category::parameter);
    w = ones({n}).set_requires_grad(true);
  }
  const int64_t base = requested(Category::activation);
  Tensor act, act2;
  {
    NoGradScope no_grad;  // activations that do not require grad: leaves to the tape
    act = scale(ones({n}), 2.0);
    act2 = scale(ones({n}), 3.0);
  }
  REQUIRE(requested(Category::activation) == base + 2 * bytes);
  Tensor y = add(w, act);  // add saves nothing
  const int64_t act_value = act.impl()->tape_value;
  Tensor z = mul(w, act2);  // mul saves both operands
  const int64_t act2_value = act2.impl()->tape_value;
  Tape& tape = Tape::current();
  CHECK(tape.value_resident(act_value));
  act = Tensor();
  act2 = Tensor();
  // act's 4 MiB went with its owner; act2's stay, visible as a saved leaf.
  CHECK(requested(Category::activation) == base + 3 * bytes);  // act2, y, z
  CHECK_FALSE(tape.value_resident(act_value));
  const std::string msg = regen::testing::error_of([&] { tape.value_tensor(act_value); });
  CHECK(msg.find("f32[1048576]") != std::string::npos);
  CHECK(msg.find("released") != std::string::npos);
  const Value& v2 = tape.value(act2_value);
  REQUIRE(v2.saved >= 0);
  const SavedTensor& s2 = tape.saved_tensor(v2.saved);
  CHECK(s2.is_leaf());
  CHECK(s2.bytes == static_cast<uint64_t>(bytes));
  CHECK(s2.category == Category::activation);
  CHECK(tape.value_tensor(act2_value).to_vector<float>()[0] == 3.0f);
  CHECK_FALSE(tape.value(act_value).leaf);  // only leaves that require grad are pinned
  CHECK(tape.value(w.impl()->tape_value).leaf == w.impl());
  backward(sum(add(y, z)));  // d/dw (w + 2) + (w * 3) = 4
  CHECK(w.grad().to_vector<float>()[0] == 4.0f);
  y = Tensor();
  z = Tensor();
  CHECK(requested(Category::activation) == base);
}

TEST_CASE("backward: a first parameter gradient takes over an unshared buffer (no copy)") {
  Tape::current().clear();
  const int64_t n = 1 << 18;  // 1 MiB of f32
  Tensor w;
  {
    CategoryScope cat(Category::parameter);
    w = ones({n}).set_requires_grad(true);
  }
  CachingAllocator& alloc = allocator_for(Device::cpu());
  const int64_t grad_base = requested(Category::gradient);
  alloc.reset_peak();
  backward(sum(scale(w, 2.0)));
  // At the peak, scale's backward holds its output's gradient (n) and its input's (n), which
  // becomes w's gradient; a copy would add a third n-sized buffer.
  const int64_t peak = alloc.stats().requested_by[static_cast<int>(Category::gradient)].peak;
  CHECK(peak - grad_base == 2 * n * 4);
  CHECK(requested(Category::gradient) - grad_base == n * 4);
  CHECK(w.grad().to_vector<float>()[n - 1] == 2.0f);
  // Shared: add hands one gradient to both inputs; the first use must be copied, not taken.
  Tensor u;
  {
    CategoryScope cat(Category::parameter);
    u = ones({4}).set_requires_grad(true);
  }
  backward(sum(add(u, u)));
  CHECK(u.grad().to_vector<float>() == std::vector<float>(4, 2.0f));
}

TEST_CASE("conv2d backward: a bias-only gradient computes no weight gradient") {
  Tape::current().clear();
  Generator g(41);
  const Tensor x = uniform({2, 16, 6, 6}, -1, 1, g), w = uniform({8, 16, 3, 3}, -1, 1, g);
  Tensor b;
  {
    CategoryScope cat(Category::parameter);
    b = uniform({8}, -1, 1, g).set_requires_grad(true);
  }
  CachingAllocator& alloc = allocator_for(Device::cpu());
  const int64_t grad_base = requested(Category::gradient);
  alloc.reset_peak();
  backward(sum(conv2d(x, w, b, 1, 1)));  // y: (2, 8, 6, 6)
  // At the peak: y's gradient and the bias gradient; no (8, 16, 3, 3) weight gradient.
  const int64_t peak = alloc.stats().requested_by[static_cast<int>(Category::gradient)].peak;
  CHECK(peak - grad_base == (2 * 8 * 6 * 6 + 8) * 4);
  // The same values as the filter-gradient path, which sums in double (here: sums of 72 ones).
  for (float v : b.grad().to_vector<float>()) CHECK(v == 72.0f);
}

TEST_CASE("tape: an op that throws leaves the tape as it was, gradients as without the call") {
  Tape::current().clear();
  // A recording with parameters that require grad, a block scope, a dropout before and after the
  // failing call (a failed call must not shift the Philox streams), one backward.
  Generator g(31);
  Tensor emb, w1, w2;
  {
    CategoryScope cat(Category::parameter);
    emb = uniform({10, 8}, -1, 1, g).set_requires_grad(true);
    w1 = uniform({8, 8}, -1, 1, g).set_requires_grad(true);
    w2 = uniform({6, 8}, -1, 1, g).set_requires_grad(true);
  }
  const Tensor ids = from_vector<int64_t>({1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2}, {12});
  const Tensor targets = from_vector<int64_t>({0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5}, {12});
  const Tensor bad_ids = from_vector<int64_t>({1, 2, 10}, {3});  // 10 is out of range
  const Tensor bad_targets = from_vector<int64_t>({0, 7, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4}, {12});
  // A tape summary: everything apply touches.
  auto fingerprint = [](const Tape& t) {
    std::string s;
    for (const Node& n : t.nodes()) {
      s += std::string(op_name(n.kind)) + "(";
      for (int64_t i : n.inputs) s += std::to_string(i) + ",";
      s += ")->";
      for (int64_t o : n.outputs) s += std::to_string(o) + ",";
      s += " saves ";
      for (int64_t v : n.saved) s += std::to_string(v) + ",";
      s += " block " + std::to_string(n.block) + "\n";
    }
    for (const Value& v : t.values()) {
      s += "v" + std::to_string(v.id) + " p" + std::to_string(v.producer) + " r" +
           std::to_string(v.root) + " s" + std::to_string(v.saved) + " c";
      for (int32_t c : v.consumers) s += std::to_string(c) + ",";
      s += "\n";
    }
    for (const SavedTensor& st : t.saved()) {
      s += "saved " + std::to_string(st.value) + " readers ";
      for (int32_t r : st.readers) s += std::to_string(r) + ",";
      s += "\n";
    }
    for (const BlockInfoRec& b : t.blocks()) {
      s += "block " + std::to_string(b.first_node) + ".." + std::to_string(b.last_node) + "\n";
    }
    return s;
  };
  struct AbortCounter : TapeHooks {
    int begun = 0, aborted = 0;
    void on_forward_begin(Tape&, int32_t) override { ++begun; }
    void on_forward_abort(Tape&, int32_t) override { ++aborted; }
  };

  // failures: 0 = none; otherwise every kind of failing call is tried mid-graph.
  auto run = [&](bool failures, AbortCounter* counter) {
    manual_seed(5);
    for (Tensor* p : {&emb, &w1, &w2}) p->impl()->grad.reset();
    Tape& tape = Tape::current();
    const HooksScope guard(counter);
    Tensor loss;
    {
      BlockScope block("layer");
      Tensor h = dropout(embedding(ids, emb), 0.3f);  // (12, 8)
      h = relu(linear(h, w1));
      if (failures) {
        const std::string before = fingerprint(tape);
        const int64_t h_value = h.impl()->tape_value;
        // A kernel rejects an id: embedding's weight requires grad, so the node was being recorded.
        const std::string msg = regen::testing::error_of([&] { embedding(bad_ids, emb); });
        CHECK(msg.find("embedding: id 10") != std::string::npos);
        CHECK(fingerprint(tape) == before);
        CHECK(h.impl()->tape_value == h_value);
        CHECK(bad_ids.impl()->tape_value == -1);  // registered by the failed call, then undone
        // Out of memory inside dropout: a 16 MiB output over the allocator's hard limit.
        Tensor big;
        {
          CategoryScope cat(Category::input);
          big = zeros({1 << 22}).set_requires_grad(true);
        }
        CachingAllocator& alloc = allocator_for(Device::cpu());
        alloc.empty_cache();
        alloc.set_limit(alloc.stats().reserved.current);
        bool oom = false;
        try {
          dropout(big, 0.5f);
        } catch (const OutOfMemory&) {
          oom = true;
        }
        alloc.set_limit(0);
        CHECK(oom);
        CHECK(fingerprint(tape) == before);
      }
      h = dropout(h, 0.4f);  // must draw the stream it draws without the failed dropout
      Tensor logits = linear(h, w2);
      if (failures) {
        const std::string before = fingerprint(tape);
        // A kernel rejects a target; cross_entropy has a hidden output and saves three tensors.
        const std::string msg =
            regen::testing::error_of([&] { cross_entropy(logits, bad_targets); });
        CHECK(msg.find("cross_entropy: target 7") != std::string::npos);
        CHECK(fingerprint(tape) == before);
        CHECK(bad_targets.impl()->tape_value == -1);
      }
      loss = cross_entropy(logits, targets);
    }
    const std::string recorded = fingerprint(tape);
    const double value = loss.item<float>();
    backward(loss);
    std::vector<std::vector<float>> grads;
    for (Tensor* p : {&emb, &w1, &w2}) grads.push_back(p->grad().to_vector<float>());
    return std::make_tuple(recorded, value, grads);
  };
  AbortCounter clean_count, failing_count;
  const auto clean = run(false, &clean_count);
  const auto failing = run(true, &failing_count);
  CHECK(std::get<0>(failing) == std::get<0>(clean));  // the same recording
  CHECK(std::get<1>(failing) == std::get<1>(clean));  // the same loss, bit for bit
  CHECK(std::get<2>(failing) == std::get<2>(clean));  // the same gradients, bit for bit
  CHECK(clean_count.aborted == 0);
  CHECK(failing_count.aborted == 3);  // embedding, cross_entropy, dropout
  CHECK(Tape::current().empty());
}

TEST_CASE("backward twice over a released tape is an error naming backward and the tensor") {
  Generator g(3);
  Tensor w = uniform({3}, -1, 1, g).set_requires_grad(true);
  Tensor loss = sum(mul(w, w));
  backward(loss);
  const std::string msg = error_of([&] { backward(loss); });
  CHECK(msg.find("backward") == 0);
  CHECK(msg.find("already released") != std::string::npos);
  CHECK(msg.find("backward twice") != std::string::npos);
  CHECK(msg.find("f32[] on cpu") != std::string::npos);
  // A tensor that never required grad.
  const std::string never = error_of([&] { backward(sum(ones({3}))); });
  CHECK(never.find("backward: f32[] on cpu was not produced by a recorded op") !=
        std::string::npos);
  // A non-scalar loss.
  Tensor v = mul(w, w);
  CHECK(error_of([&] { backward(v); }).find("backward: loss f32[3] on cpu is not a scalar") !=
        std::string::npos);
  Tape::current().clear();
}

TEST_CASE("no-grad scope records nothing") {
  Tensor w = ones({3}).set_requires_grad(true);
  {
    NoGradScope ng;
    Tensor y = mul(w, w);
    CHECK(Tape::current().empty());
    CHECK_FALSE(y.requires_grad());
  }
  CHECK(grad_mode_enabled());
}

TEST_CASE("bad input: errors name the op and the shapes, dtypes and devices involved") {
  auto has = [](const std::string& m, const std::string& part) {
    const bool found = m.find(part) != std::string::npos;
    if (!found) MESSAGE("'", part, "' missing from: ", m);
    return found;
  };
  Tensor a = zeros({2, 3}), b = zeros({4, 5});
  std::string m = error_of([&] { linear(a, b); });
  CHECK(has(m, "linear"));
  CHECK(has(m, "[2, 3]"));
  CHECK(has(m, "[4, 5]"));
  m = error_of([&] { matmul(a, b); });
  CHECK(has(m, "matmul: shapes [2, 3] and [4, 5]"));
  m = error_of([&] { add(a, zeros({2})); });
  CHECK(has(m, "add: shapes [2, 3] and [2] do not broadcast"));
  m = error_of([&] { mul(a, zeros({2, 3}, DType::f64)); });
  CHECK(has(m, "mul: dtype mismatch between f32[2, 3] on cpu and f64[2, 3] on cpu"));
  m = error_of([&] { conv2d(zeros({1, 3, 8, 8}, DType::f64), zeros({4, 3, 3, 3})); });
  CHECK(has(m, "conv2d: dtype mismatch between f64[1, 3, 8, 8] on cpu and f32[4, 3, 3, 3] on cpu"));
  m = error_of([&] { relu(zeros({3}, DType::i64)); });
  CHECK(has(m, "relu: expected a floating-point tensor, got i64[3] on cpu"));
  // A zero-element tensor that claims to live on cuda:0 is enough to reach the device check.
  auto impl = std::make_shared<TensorImpl>();
  impl->shape = {2, 0};
  impl->device = Device::cuda(0);
  Tensor on_gpu(impl);
  m = error_of([&] { add(zeros({2, 0}), on_gpu); });
  CHECK(has(m, "add: inputs on different devices: f32[2, 0] on cpu and f32[2, 0] on cuda:0"));
  m = error_of([&] { conv2d(zeros({1, 3, 8, 8}), zeros({4, 2, 3, 3})); });
  CHECK(has(m, "conv2d"));
  CHECK(has(m, "[1, 3, 8, 8]"));
  CHECK(has(m, "[4, 2, 3, 3]"));
}

TEST_CASE("determinism: same seed, bitwise equal losses and gradients at every step, dropout on") {
  struct Result {
    std::vector<double> losses;
    std::vector<std::vector<float>> grads;  // all parameters' gradients, after each step
  };
  // Parameters come from the model's own seed; manual_seed only keys the dropout masks.
  auto run = [](uint64_t dropout_seed, float p) {
    ModelConfig c = model_preset("transformer-tiny");
    c.dropout = p;
    auto model = make_model(c);
    AdamW opt(model->parameters(), AdamWOptions{});
    auto data = make_data_source("", c, 5);
    Trainer t(*model, opt, *data, 3, Device::cpu());
    manual_seed(dropout_seed);
    Result r;
    for (int i = 0; i < 3; ++i) {
      r.losses.push_back(t.step().loss);
      std::vector<float> grads;
      for (const Tensor& prm : model->parameters()) {
        const std::vector<float> g = prm.grad().to_vector<float>();
        grads.insert(grads.end(), g.begin(), g.end());
      }
      r.grads.push_back(std::move(grads));
    }
    return r;
  };
  const Result a = run(77, 0.2f), b = run(77, 0.2f);
  CHECK(a.losses == b.losses);
  REQUIRE(a.grads.size() == 3);
  for (size_t i = 0; i < a.grads.size(); ++i) {
    REQUIRE(a.grads[i].size() == b.grads[i].size());
    CHECK_MESSAGE(
        std::memcmp(a.grads[i].data(), b.grads[i].data(), a.grads[i].size() * sizeof(float)) == 0,
        "step ", i + 1);
  }
  // Dropout is active: another dropout seed changes the very first loss...
  const Result other = run(78, 0.2f);
  CHECK(other.losses[0] != a.losses[0]);
  // ...and without dropout the seed changes nothing.
  CHECK(run(77, 0.0f).losses == run(78, 0.0f).losses);
}

TEST_CASE("training: an MLP's loss falls below 20% of its start within 100 steps") {
  // y = class of the sign pattern of x's first two coordinates (4 classes), fixed data.
  Generator g(11);
  Tensor x = uniform({64, 8}, -1, 1, g);
  std::vector<int64_t> labels(64);
  const std::vector<float> xv = x.to_vector<float>();
  for (int i = 0; i < 64; ++i) labels[i] = (xv[i * 8] > 0 ? 1 : 0) + (xv[i * 8 + 1] > 0 ? 2 : 0);
  Tensor y = from_vector<int64_t>(labels, {64});
  Net net;
  Linear& l1 = net.add("l1", std::make_unique<Linear>("l1", 8, 32, true, g));
  Linear& l2 = net.add("l2", std::make_unique<Linear>("l2", 32, 4, true, g));
  AdamW opt(net.parameters(), AdamWOptions{0.01, 0.9, 0.999, 1e-8, 0.0});
  double first = 0, last = 0;
  for (int step = 0; step < 100; ++step) {
    opt.zero_grad();
    Tensor loss = cross_entropy(l2.forward(relu(l1.forward(x))), y);
    last = loss.item<float>();
    if (step == 0) first = last;
    backward(loss);
    opt.step();
  }
  MESSAGE("MLP loss ", first, " -> ", last);
  CHECK(last < 0.2 * first);
}

TEST_CASE("training: a small CNN's loss falls below 30% of its start within 60 steps") {
  // 8x8 single-channel images whose class is which quadrant holds a bright square.
  std::vector<float> img(32 * 64, 0.0f);
  std::vector<int64_t> labels(32);
  Generator noise_gen(5);
  const std::vector<float> noise = uniform({32 * 64}, -0.1, 0.1, noise_gen).to_vector<float>();
  for (int i = 0; i < 32; ++i) {
    labels[i] = i % 4;
    const int oy = (labels[i] / 2) * 4, ox = (labels[i] % 2) * 4;
    for (int p = 0; p < 64; ++p) img[i * 64 + p] = noise[i * 64 + p];
    for (int yy = 0; yy < 3; ++yy) {
      for (int xx = 0; xx < 3; ++xx) img[i * 64 + (oy + yy) * 8 + ox + xx] += 1.0f;
    }
  }
  Tensor x = from_vector<float>(img, {32, 1, 8, 8});
  Tensor y = from_vector<int64_t>(labels, {32});
  Generator g(6);
  Net net;
  Conv2d& c1 = net.add("c1", std::make_unique<Conv2d>("c1", 1, 8, 3, 1, 1, true, g));
  BatchNorm2d& bn = net.add("bn", std::make_unique<BatchNorm2d>("bn", 8));
  Linear& fc = net.add("fc", std::make_unique<Linear>("fc", 8 * 4 * 4, 4, true, g));
  SGD opt(net.parameters(), SGDOptions{0.05, 0.9, 0.0, 0.0, false});
  double first = 0, last = 0;
  for (int step = 0; step < 60; ++step) {
    opt.zero_grad();
    Tensor h = max_pool2d(relu(bn.forward(c1.forward(x))), 2, 2);
    Tensor loss = cross_entropy(fc.forward(flatten(h, 1)), y);
    last = loss.item<float>();
    if (step == 0) first = last;
    backward(loss);
    opt.step();
  }
  MESSAGE("CNN loss ", first, " -> ", last);
  CHECK(last < 0.3 * first);
}
