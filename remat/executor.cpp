// The remat executor (executor.h).
#include "regen/remat/executor.h"

#include <chrono>

#include "regen/kernels/kernels.h"
#include "regen/remat/compress.h"

namespace regen {

RematExecutor::RematExecutor(const Profile& profile, Schedule schedule)
    : p_(profile), schedule_(std::move(schedule)) {
  REGEN_CHECK(schedule_.evict_after.size() == p_.nodes.size(), "executor: the schedule has ",
              schedule_.evict_after.size(), " forward nodes, the profile ", p_.nodes.size());
}

void RematExecutor::check_node(const Tape& tape, int32_t node,
                               const std::vector<Tensor>& outputs) const {
  REGEN_CHECK(node < static_cast<int32_t>(p_.nodes.size()), "remat: the iteration records more ",
              "ops than the profiled one (", p_.nodes.size(),
              "): the model or batch changed since ", "profiling; profile again");
  const ProfileNode& want = p_.nodes[static_cast<size_t>(node)];
  const Node& got = tape.node(node);
  bool same = got.kind == want.kind && outputs.size() == want.outputs.size();
  for (size_t k = 0; same && k < outputs.size(); ++k) {
    same = outputs[k].shape() == p_.values[static_cast<size_t>(want.outputs[k])].shape;
  }
  REGEN_CHECK(same, "remat: op ", node, " is ", op_name(got.kind), " '", tag_name(got.tag),
              "' but the profile has ", want.op, " '", want.name,
              "' with other shapes: the model, batch or input size changed since profiling; "
              "profile again");
}

void RematExecutor::on_forward_end(Tape& tape, int32_t node, const std::vector<Tensor>& outputs) {
  check_node(tape, node, outputs);
  for (int32_t s : schedule_.evict_after[static_cast<size_t>(node)]) {
    REGEN_CHECK(s < static_cast<int32_t>(tape.saved().size()) &&
                    tape.saved_tensor(s).value == p_.saved[static_cast<size_t>(s)].value,
                "remat: saved tensor ", s, " does not match the profile's '",
                p_.saved[static_cast<size_t>(s)].name, "'");
    tape.evict(s);
    ++cur_evictions_;
  }
  for (int32_t s : schedule_.narrow_after[static_cast<size_t>(node)]) narrow(tape, s);
}

void RematExecutor::narrow(Tape& tape, int32_t s) {
  const ProfileSaved& sv = p_.saved[static_cast<size_t>(s)];
  REGEN_CHECK(
      s < static_cast<int32_t>(tape.saved().size()) && tape.saved_tensor(s).value == sv.value,
      "remat: saved tensor ", s, " does not match the profile's '", sv.name, "'");
  const Tensor full = tape.value_tensor(sv.value);
  const int64_t n = full.numel();
  Tensor narrow;
  {
    CategoryScope cat(Category::activation);
    TagScope tag(narrow_tag(p_, s));
    narrow = empty({(n + 1) / 2}, DType::i32, full.device());
  }
  REGEN_LAUNCH(full.device(), float, narrow_to_half, full.data<float>(),
               reinterpret_cast<uint16_t*>(narrow.data<int32_t>()), n, schedule_.compress);
  tape.evict(s);  // the f32 bytes go; every view of them sees it
  narrow_[s] = std::move(narrow);
  ++cur_narrowed_;
}

void RematExecutor::widen(Tape& tape, int32_t s) {
  auto it = narrow_.find(s);
  REGEN_CHECK(it != narrow_.end(), "remat: saved tensor ", s, " ('",
              p_.saved[static_cast<size_t>(s)].name, "') is widened but was not narrowed");
  const ProfileValue& root = p_.values[static_cast<size_t>(p_.saved[static_cast<size_t>(s)].value)];
  Tensor wide;
  {
    CategoryScope cat(Category::activation);
    TagScope tag(widen_tag(p_, s));
    wide = empty(root.shape, DType::f32, it->second.device());
  }
  REGEN_LAUNCH(wide.device(), float, widen_from_half,
               reinterpret_cast<const uint16_t*>(it->second.data<int32_t>()), wide.data<float>(),
               wide.numel(), schedule_.compress);
  tape.restore(s, wide);
  narrow_.erase(it);  // the narrow form goes
}

void RematExecutor::on_backward_start(Tape& tape) {
  REGEN_CHECK(tape.nodes().size() == p_.nodes.size() && tape.backward_order() == p_.backward_order,
              "remat: backward runs ", tape.backward_order().size(), " of ", tape.nodes().size(),
              " ops where the profile ran ", p_.backward_order.size(), " of ", p_.nodes.size(),
              ": the loss or model changed since profiling");
}

int64_t run_program_on_tape(Tape& tape, const Profile& p, const RegenProgram& prog,
                            const std::function<void(size_t)>& after_step) {
  int64_t replays = 0;
  auto replay = [&](const ReplayStep& st, const auto& lookup) {
    std::vector<Tensor> inputs;
    inputs.reserve(st.inputs.size());
    for (int64_t v : st.inputs) {
      const Tensor* kept = v >= 0 ? lookup(v) : nullptr;
      inputs.push_back(v < 0 ? Tensor() : kept ? *kept : tape.value_tensor(v));
    }
    ++replays;
    return tape.replay(st.node, inputs);  // the inputs go before any output is let go
  };
  auto restore = [&](int32_t saved, Tensor&& out) {
    tape.restore(saved, out);  // the saved tensor adopts the bytes; `out` is left empty
    return tape.value_tensor(p.saved[static_cast<size_t>(saved)].value);
  };
  interpret_program<Tensor>(p, prog, replay, restore, [&](size_t i) {
    if (after_step) after_step(i);
  });
  kernels::synchronize(
      tape.value_tensor_device(p.saved[static_cast<size_t>(prog.targets[0])].value));
  return replays;
}

void RematExecutor::run_program(Tape& tape, const RegenProgram& prog) {
  const auto t0 = std::chrono::steady_clock::now();
  cur_replays_ += run_program_on_tape(tape, p_, prog);
  cur_regen_ms_ +=
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

void RematExecutor::on_backward_begin(Tape& tape, int32_t node) {
  for (int32_t s : schedule_.widen_before[static_cast<size_t>(node)]) widen(tape, s);
  const int32_t pi = schedule_.program_of_node[static_cast<size_t>(node)];
  if (pi >= 0) run_program(tape, schedule_.programs[static_cast<size_t>(pi)]);
}

void RematExecutor::on_backward_finish(Tape&) {
  REGEN_CHECK(narrow_.empty(), "remat: ", narrow_.size(),
              " narrowed saved tensor(s) were never widened");
  narrowed_ = cur_narrowed_;
  cur_narrowed_ = 0;
  evictions_ = cur_evictions_;
  replays_ = cur_replays_;
  regen_ms_ = cur_regen_ms_;
  cur_evictions_ = cur_replays_ = 0;
  cur_regen_ms_ = 0;
}

bool RematExecutor::regenerate(Tape&, int32_t saved) {
  REGEN_FAIL("remat: backward read saved tensor ", saved, " ('",
             p_.saved[static_cast<size_t>(saved)].name,
             "') while it was evicted and its schedule had no regeneration for it");
}

}  // namespace regen
