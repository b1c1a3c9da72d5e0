// The remat executor (executor.h).
#include "regen/remat/execute/executor.h"

#include <utility>

#include "regen/kernels/kernels.h"
#include "regen/remat/plan/compress.h"

namespace regen {

namespace {
// The key of a state tensor tagged "<param>.<key>".
std::string state_key(const std::string& tag) {
  return tag.substr(tag.rfind('.') + 1);
}
}  // namespace

// Streams each parameter's host-tier state through the device around its update, one parameter
// ahead (copied in) and one behind (copied out), in the order the simulator replays
// (remat/simulate/simulator.cpp, run_state_stream): before the first update its state and the next
// one's are copied in; before each later update the next one's; after each update its state is
// copied out and the previous one's device blocks go once their copy is done; the last ones go when
// the step ends.
class RematExecutor::StateStream final : public OptimizerHooks {
 public:
  explicit StateStream(RematExecutor& ex) : ex_(ex) {}
  void set_optimizer(Optimizer* o) { optimizer_ = o; }

  void before_update(const std::string& name, std::map<std::string, Tensor>& state) override {
    const std::vector<StateGroup>& groups = ex_.schedule_.state_groups;
    if (groups.empty() || state.empty()) return;
    REGEN_CHECK(next_ < groups.size() && groups[next_].param == name,
                "remat: the optimizer updates parameter '", name, "' where the plan streams '",
                next_ < groups.size() ? groups[next_].param : std::string("nothing"),
                "' from the host: the optimizer or model changed since profiling");
    const size_t g = next_++;
    if (g == 0) issue_in(0);
    if (g + 1 < groups.size()) issue_in(g + 1);
    Slot& slot = slots_.at(g);
    for (size_t k = 0; k < slot.device.size(); ++k) {
      ex_.queue(CopyDirection::to_device).wait(slot.in[k]);
      Tensor& t = state.at(state_key(groups[g].tag[k]));
      slot.host.push_back(t);
      t = slot.device[k];
    }
  }

  void after_update(const std::string& name, std::map<std::string, Tensor>& state) override {
    const std::vector<StateGroup>& groups = ex_.schedule_.state_groups;
    if (groups.empty() || state.empty()) return;
    const size_t g = next_ - 1;
    REGEN_ASSERT(groups[g].param == name);
    Slot& slot = slots_.at(g);
    for (size_t k = 0; k < slot.device.size(); ++k) {
      state.at(state_key(groups[g].tag[k])) = slot.host[k];
      slot.out.push_back(ex_.queue(CopyDirection::to_host)
                             .issue(slot.host[k].impl()->storage, slot.device[k].impl()->storage));
    }
    if (g > 0) finish(g - 1);
  }

  void after_step() override {
    const std::vector<StateGroup>& groups = ex_.schedule_.state_groups;
    if (!groups.empty()) {
      REGEN_CHECK(next_ == groups.size(), "remat: the optimizer updated ", next_, " of the ",
                  groups.size(), " parameters whose state the plan streams from the host");
      finish(groups.size() - 1);
      next_ = 0;
      slots_.clear();
    }
    ex_.close_step_offload();
  }

 private:
  struct Slot {
    std::vector<Tensor> device, host;
    std::vector<uint64_t> in, out;
  };

  void issue_in(size_t g) {
    const StateGroup& grp = ex_.schedule_.state_groups[g];
    REGEN_CHECK(optimizer_, "remat: no optimizer to stream the state of");
    Slot& slot = slots_[g];
    CategoryScope category(Category::optimizer_state);
    for (size_t k = 0; k < grp.block.size(); ++k) {
      const Tensor host = optimizer_->state(grp.param, state_key(grp.tag[k]));
      REGEN_CHECK(host.defined() && static_cast<int64_t>(host.nbytes()) == grp.requested[k],
                  "remat: optimizer state '", grp.tag[k], "' is not the profiled one");
      TagScope tag(grp.tag[k]);
      auto impl = std::make_shared<TensorImpl>();
      impl->storage =
          std::make_shared<Storage>(ex_.device_, host.nbytes(), Category::optimizer_state);
      impl->shape = host.shape();
      impl->dtype = host.dtype();
      impl->device = ex_.device_;
      slot.device.emplace_back(std::move(impl));
      slot.in.push_back(ex_.queue(CopyDirection::to_device)
                            .issue(slot.device.back().impl()->storage, host.impl()->storage));
    }
  }

  // Waits for group g's copies out, then lets its device blocks go (in allocation order).
  void finish(size_t g) {
    Slot& slot = slots_.at(g);
    for (uint64_t t : slot.out) ex_.queue(CopyDirection::to_host).wait(t);
    for (Tensor& t : slot.device) t = Tensor();
    slots_.erase(g);
  }

  RematExecutor& ex_;
  Optimizer* optimizer_ = nullptr;
  size_t next_ = 0;
  std::map<size_t, Slot> slots_;
};

RematExecutor::RematExecutor(const Profile& profile, Schedule schedule)
    : p_(profile),
      timer_(Device::parse(profile.device)),
      schedule_(std::move(schedule)),
      device_(Device::parse(profile.device)) {
  REGEN_CHECK(schedule_.evict_after.size() == p_.nodes.size(), "executor: the schedule has ",
              schedule_.evict_after.size(), " forward nodes, the profile ", p_.nodes.size());
  host_copy_.resize(schedule_.offloads.size());
  device_copy_.resize(schedule_.offloads.size());
  out_ticket_.assign(schedule_.offloads.size(), 0);
  in_ticket_.assign(schedule_.offloads.size(), 0);
  state_stream_ = std::make_unique<StateStream>(*this);
}

RematExecutor::~RematExecutor() {
  // Copies still queued (a step that threw) finish before their storages can go.
  try {
    if (to_host_) to_host_->drain();
    if (to_device_) to_device_->drain();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "regen: remat executor: waiting for its copies failed: %s\n", e.what());
  }
}

CopyQueue& RematExecutor::queue(CopyDirection d) {
  std::unique_ptr<CopyQueue>& q = d == CopyDirection::to_host ? to_host_ : to_device_;
  if (!q) q = CopyQueue::make(device_, d);
  return *q;
}

OptimizerHooks* RematExecutor::optimizer_hooks(Optimizer& optimizer) {
  state_stream_->set_optimizer(&optimizer);
  return state_stream_.get();
}

void RematExecutor::close_step_offload() {
  OffloadCounters c;
  c.offloads = cur_offloads_;
  cur_offloads_ = 0;
  if (to_host_) {
    c.stall_ms += to_host_->take_stall_ms();
    c.bytes_to_host = static_cast<int64_t>(to_host_->bytes()) - bytes_to_host_before_;
    bytes_to_host_before_ = static_cast<int64_t>(to_host_->bytes());
  }
  if (to_device_) {
    c.stall_ms += to_device_->take_stall_ms();
    c.bytes_to_device = static_cast<int64_t>(to_device_->bytes()) - bytes_to_device_before_;
    bytes_to_device_before_ = static_cast<int64_t>(to_device_->bytes());
  }
  offload_ = c;
}

void RematExecutor::move_optimizer_state(Optimizer& optimizer, StatePlace to) {
  state_stream_->set_optimizer(&optimizer);
  if (schedule_.state_groups.empty()) return;
  CachingAllocator& host = host_allocator_for(device_);
  if (to == StatePlace::host) {
    // The host tier starts from nothing, so its layout is the simulator's.
    host.empty_cache();
    REGEN_CHECK(host.stats().live_blocks == 0, "remat: the host tier of ", device_.str(), " holds ",
                format_bytes(host.stats().allocated.current),
                " already; the optimizer state cannot be placed there as planned:\n",
                live_allocations_report());
  }
  kernels::synchronize(device_);
  CategoryScope category(Category::optimizer_state);
  for (const StateGroup& g : schedule_.state_groups) {
    for (size_t k = 0; k < g.block.size(); ++k) {
      const std::string key = state_key(g.tag[k]);
      Tensor old = optimizer.state(g.param, key);
      REGEN_CHECK(old.defined() && static_cast<int64_t>(old.nbytes()) == g.requested[k],
                  "remat: the optimizer has no state '", g.tag[k], "' of ",
                  format_bytes(g.requested[k]),
                  " as profiled: the optimizer or model changed since profiling; profile again");
      TagScope tag(g.tag[k]);
      auto impl = std::make_shared<TensorImpl>();
      const Device dst = to == StatePlace::host ? Device::cpu() : device_;
      impl->storage =
          to == StatePlace::host
              ? std::make_shared<Storage>(host, old.nbytes(), Category::optimizer_state)
              : std::make_shared<Storage>(device_, old.nbytes(), Category::optimizer_state);
      impl->shape = old.shape();
      impl->dtype = old.dtype();
      impl->device = dst;
      Tensor fresh(std::move(impl));
      copy_bytes(fresh.raw_data(), dst, old.raw_data(), old.device(), old.nbytes());
      optimizer.replace_state(g.param, key, std::move(fresh));
      old = Tensor();  // the last handle: its block goes now, in allocation order
    }
  }
  kernels::synchronize(device_);
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

void RematExecutor::on_forward_begin(Tape&, int32_t node) {
  if (node != 0) return;
  timer_.restart();
  cur_evictions_ = cur_replays_ = cur_narrowed_ = 0;
  narrow_.clear();  // empty unless an iteration threw: its tape is gone
}

void RematExecutor::on_forward_end(Tape& tape, int32_t node, const std::vector<Tensor>& outputs) {
  check_node(tape, node, outputs);
  auto check_saved = [&](int32_t s) {
    REGEN_CHECK(s < static_cast<int32_t>(tape.saved().size()) &&
                    tape.saved_tensor(s).value == p_.saved[static_cast<size_t>(s)].value,
                "remat: saved tensor ", s, " does not match the profile's '",
                p_.saved[static_cast<size_t>(s)].name, "'");
  };
  for (int32_t s : schedule_.evict_after[static_cast<size_t>(node)]) {
    check_saved(s);
    tape.evict(s);
    ++cur_evictions_;
  }
  // Offloads: copies out of what this node made, then the blocks whose copies must be done.
  for (int32_t i : schedule_.offload_issue_after[static_cast<size_t>(node)]) {
    // The node's own output (the op that saves it may not have run yet): its storage is the one
    // the saved tensor will hold.
    const OffloadOp& op = schedule_.offloads[static_cast<size_t>(i)];
    const ProfileValue& v =
        p_.values[static_cast<size_t>(p_.saved[static_cast<size_t>(op.saved)].value)];
    REGEN_ASSERT(v.producer == node && static_cast<size_t>(v.slot) < outputs.size());
    const std::shared_ptr<Storage>& storage = outputs[static_cast<size_t>(v.slot)].impl()->storage;
    REGEN_CHECK(storage && storage->bytes() == op.bytes, "remat: output ", v.slot, " of op ", node,
                " does not hold the ", format_bytes(static_cast<int64_t>(op.bytes)),
                " the profile offloads");
    TagScope tag(p_.nodes[static_cast<size_t>(op.issue_after)].name);
    host_copy_[static_cast<size_t>(i)] =
        std::make_shared<Storage>(host_allocator_for(device_), op.bytes, Category::activation);
    out_ticket_[static_cast<size_t>(i)] =
        queue(CopyDirection::to_host).issue(host_copy_[static_cast<size_t>(i)], storage);
    ++cur_offloads_;
  }
  for (int32_t i : schedule_.offload_free_after[static_cast<size_t>(node)]) {
    const OffloadOp& op = schedule_.offloads[static_cast<size_t>(i)];
    check_saved(op.saved);
    queue(CopyDirection::to_host).wait(out_ticket_[static_cast<size_t>(i)]);
    tape.evict(op.saved);
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
  return replays;
}

void ReplayTimer::finish() {
  std::swap(cur_, last_);
  cur_.clear();
  read_ = false;
}

double ReplayTimer::last_ms() {
  if (!read_) {
    // Pairs of marks; an unpaired last one (a program that threw) is not counted.
    const std::vector<double> t = last_.elapsed();
    last_ms_ = 0;
    for (size_t i = 0; i + 1 < t.size(); i += 2) last_ms_ += t[i + 1] - t[i];
    read_ = true;
  }
  return last_ms_;
}

void RematExecutor::run_program(Tape& tape, const RegenProgram& prog) {
  timer_.start();
  cur_replays_ += run_program_on_tape(tape, p_, prog);
  timer_.stop();
}

void RematExecutor::on_backward_begin(Tape& tape, int32_t node) {
  // Offloads: copies back issued here, then those needed here waited for and restored.
  for (int32_t i : schedule_.prefetch_issue_before[static_cast<size_t>(node)]) {
    const OffloadOp& op = schedule_.offloads[static_cast<size_t>(i)];
    TagScope tag(p_.nodes[static_cast<size_t>(op.issue_after)].name);
    device_copy_[static_cast<size_t>(i)] =
        std::make_shared<Storage>(device_, op.bytes, Category::activation);
    in_ticket_[static_cast<size_t>(i)] =
        queue(CopyDirection::to_device)
            .issue(device_copy_[static_cast<size_t>(i)], host_copy_[static_cast<size_t>(i)]);
  }
  for (int32_t i : schedule_.prefetch_wait_before[static_cast<size_t>(node)]) {
    const OffloadOp& op = schedule_.offloads[static_cast<size_t>(i)];
    queue(CopyDirection::to_device).wait(in_ticket_[static_cast<size_t>(i)]);
    const ProfileValue& v =
        p_.values[static_cast<size_t>(p_.saved[static_cast<size_t>(op.saved)].value)];
    auto impl = std::make_shared<TensorImpl>();
    impl->storage = std::move(device_copy_[static_cast<size_t>(i)]);
    impl->shape = v.shape;
    impl->dtype = v.dtype;
    impl->device = device_;
    tape.restore(op.saved, Tensor(std::move(impl)));  // the saved tensor takes the new block
    host_copy_[static_cast<size_t>(i)].reset();       // the host copy goes
  }
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
  timer_.finish();
  cur_evictions_ = cur_replays_ = 0;
}

bool RematExecutor::regenerate(Tape&, int32_t saved) {
  REGEN_FAIL("remat: backward read saved tensor ", saved, " ('",
             p_.saved[static_cast<size_t>(saved)].name,
             "') while it was evicted and its schedule had no regeneration for it");
}

}  // namespace regen
