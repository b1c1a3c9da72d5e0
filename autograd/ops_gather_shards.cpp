// gather_shards: ZeRO-3's whole parameter from every rank's shard (autograd/sharded_parameters.h),
// and the registry of sharded parameters that Tape::apply consults. Forward: the shard copied into
// its place in a flat buffer of ranks x chunk elements (the output itself when the chunks fill it
// exactly, else a staging buffer, category workspace), all-gathered in place; the output is the
// parameter's first elements. Backward: the gradient added into the parameter's whole gradient
// (ShardCollectives::shard_gradient: zero past the end), and at the parameter's last use that
// buffer reduce-scattered: this rank's chunk, averaged over the ranks, is the shard's gradient (the
// engine adds it into the leaf's). Every buffer comes from the allocator and a dry run takes the
// same ones (nothing is communicated). Tests: tests/op_table.h (one rank: the identity),
// tests/test_mpi.cpp.
#include <atomic>
#include <mutex>
#include <unordered_map>

#include "regen/autograd/op_util.h"
#include "regen/autograd/sharded_parameters.h"

namespace regen {

using namespace detail;

namespace {

struct GatherShardsAttrs {
  ShardCollectives* collectives = nullptr;
  int64_t numel = 0;  // of the whole parameter
  ShapeAttr shape;
};

char* element_ptr(const Tensor& t, int64_t elements) {
  return static_cast<char*>(t.raw_data()) + static_cast<int64_t>(dtype_size(t.dtype())) * elements;
}

void gather_shards_forward(OpContext& c) {
  const GatherShardsAttrs& a = c.attr<GatherShardsAttrs>();
  const Tensor& shard = c.inputs[0];  // (chunk,)
  const int64_t chunk = shard.numel();
  const int ranks = a.collectives->ranks();
  // The output owns exactly the parameter's bytes (a saved tensor's storage is its value's). When
  // the chunks fill it, they are gathered into it; otherwise into a staging buffer of ranks x
  // chunk elements (category workspace, not communication: every micro-batch of an accumulated
  // step makes it, and only the last may communicate), whose first elements are copied out.
  Tensor out = empty(a.shape.shape(), shard.dtype(), shard.device());
  Tensor flat = out;
  if (chunk * ranks != a.numel) {
    CategoryScope cat(Category::workspace);
    flat = empty({chunk * ranks}, shard.dtype(), shard.device());
  }
  if (!dry_run_active() && chunk > 0) {
    copy_bytes(element_ptr(flat, a.collectives->rank() * chunk), flat.device(), shard.raw_data(),
               shard.device(), shard.nbytes());
  }
  // Called in a dry run too, where an owner that prefetches records the gather it leaves in flight.
  a.collectives->gather_into(flat, out, chunk);
  c.outputs = {out};
}

void gather_shards_backward(BackwardContext& c) {
  const GatherShardsAttrs& a = c.node().attr<GatherShardsAttrs>();
  const Tensor& dy = c.grad_output(0);  // the parameter's shape
  const Value& in = c.tape().value(c.node().inputs[0]);
  const int64_t chunk = in.shape.empty() ? 1 : in.shape[0];
  // The parameter's whole gradient so far: this use's gradient added to it, as --shard none adds
  // every use's into the parameter's gradient (in backward order).
  ShardCollectives::Gradient g =
      a.collectives->shard_gradient(in.leaf.get(), c.node().index, dy.dtype(), dy.device(), chunk);
  REGEN_CHECK(g.whole.defined() && g.whole.numel() == chunk * a.collectives->ranks() &&
                  g.whole.dtype() == dy.dtype(),
              "gather_shards: the whole gradient of a shard of ", chunk, " elements is ",
              g.whole.defined() ? g.whole.str() : std::string("undefined"));
  if (!dry_run_active()) accumulate_into(g.whole.narrow0(0, a.numel).reshape(dy.shape()), dy);
  if (!g.reduce) return;  // a later node (or micro-batch) reduces it
  Tensor dx = a.collectives->reduce_gradient(in.leaf.get(), std::move(g.whole), chunk);
  if (dx.defined()) c.set_grad_input(0, dx);  // else the collectives write the shard's gradient
}

constexpr OpDef kGatherShards{"gather_shards",        1,       1, false, gather_shards_forward,
                              gather_shards_backward, no_saves};
REGEN_REGISTER_OP(gather_shards, kGatherShards);

struct Registered {
  std::weak_ptr<TensorImpl> full;  // its address may be reused once it is gone
  Tensor shard;
  ShardCollectives* collectives = nullptr;
};
std::mutex g_mutex;
std::unordered_map<const TensorImpl*, Registered>& registry() {
  static auto* r = new std::unordered_map<const TensorImpl*, Registered>();
  return *r;
}
std::atomic<int64_t> g_registered{0};

}  // namespace

ShardCollectives::Gradient ShardCollectives::shard_gradient(const TensorImpl*, int32_t, DType dtype,
                                                            Device device, int64_t chunk) {
  CategoryScope cat(Category::communication);
  return {zeros({chunk * ranks()}, dtype, device), true};
}

void ShardCollectives::gather_into(const Tensor& flat, const Tensor& out, int64_t chunk) {
  if (dry_run_active() || chunk == 0) return;
  all_gather(flat.dtype(), flat.raw_data(), chunk);
  if (!flat.same(out)) {
    copy_bytes(out.raw_data(), out.device(), flat.raw_data(), flat.device(), out.nbytes());
  }
}

Tensor ShardCollectives::gather_parameter(const Tensor& shard, const Shape& shape) {
  return gather_shards(shard, shape, this);
}

Tensor ShardCollectives::reduce_gradient(const TensorImpl*, Tensor whole, int64_t chunk) {
  Tensor scratch, dx;
  {
    // The reduction's buffers, communication: in an accumulated step only the last micro-batch
    // makes them.
    CategoryScope cat(Category::communication);
    const int64_t s = scratch_elements(chunk);
    if (s > 0) scratch = empty({s}, whole.dtype(), whole.device());
    dx = empty({chunk}, whole.dtype(), whole.device());
  }
  if (!dry_run_active()) {
    reduce_scatter_mean(whole.dtype(), whole.raw_data(), dx.raw_data(), chunk,
                        scratch.defined() ? scratch.raw_data() : nullptr);
  }
  whole = Tensor();  // a buffer of this reduction alone goes before the engine adds dx
  scratch = Tensor();
  return dx;
}

Tensor gather_shards(const Tensor& shard, const Shape& shape, ShardCollectives* collectives) {
  check_defined("gather_shards", shard, "shard");
  REGEN_CHECK(collectives != nullptr, "gather_shards: no collectives");
  REGEN_CHECK(shard.dim() == 1 && is_floating(shard.dtype()), "gather_shards: the shard ",
              shard.str(), " must be a 1-D floating tensor");
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  REGEN_CHECK(numel <= shard.numel() * collectives->ranks(),
              "gather_shards: ", collectives->ranks(), " shards of ", shard.numel(),
              " elements cannot hold ", sh(shape));
  GatherShardsAttrs a;
  a.collectives = collectives;
  a.numel = numel;
  a.shape = ShapeAttr::of(shape);
  return apply_op(OpKind::gather_shards, a, {shard})[0];
}

void register_sharded_parameter(const Tensor& full, const Tensor& shard,
                                ShardCollectives* collectives) {
  REGEN_CHECK(full.defined() && shard.defined() && collectives != nullptr,
              "register_sharded_parameter: undefined parameter, shard or collectives");
  std::lock_guard<std::mutex> lock(g_mutex);
  auto& r = registry();
  if (r.erase(full.impl().get()) == 0) ++g_registered;
  r[full.impl().get()] = {full.impl(), shard, collectives};
}

void unregister_sharded_parameter(const Tensor& full) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (registry().erase(full.impl().get()) > 0) --g_registered;
}

bool any_sharded_parameters() {
  return g_registered.load(std::memory_order_relaxed) > 0;
}

Tensor gathered_parameter(const Tensor& full) {
  if (!full.defined()) return full;
  Registered entry;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    const auto it = registry().find(full.impl().get());
    if (it == registry().end() || it->second.full.lock() != full.impl()) return full;
    entry = it->second;
  }
  return entry.collectives->gather_parameter(entry.shard, full.shape());
}

}  // namespace regen
