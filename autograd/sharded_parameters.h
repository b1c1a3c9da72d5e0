// ZeRO-3's sharded parameters as the tape sees them (docs/distributed.md, "ZeRO-3"). A parameter
// whose bytes data parallelism dropped (each rank keeps only its shard: a flat leaf that requires
// grad) is registered here; every op that reads the parameter then reads the output of a recorded
// `gather_shards` node instead (Tape::apply), whose input is the shard and whose output is the
// whole parameter, all-gathered from every rank. The output is a tape value like any op's: an op
// that saves the weight saves it, so a remat plan keeps it from forward to backward or frees it
// and gathers again for backward (a replay of the node, collective on every rank in the same
// order, since every rank runs the same plan). Backward adds the gradient of its output into the
// parameter's whole gradient (ShardCollectives::shard_gradient says where: a buffer of the step, or
// one kept across micro-batches), and the node that finishes it reduce-scatters it into the
// shard's gradient: each rank's chunk averaged over the ranks in rank order, the same sum
// DataParallel's buckets take under --shard none. A parameter read by several ops is gathered
// for each, and its uses' gradients are summed whole, in backward order, before one
// reduce-scatter: the additions --shard none makes into the parameter's gradient.
//
// Autograd sits below dist: the collectives go through ShardCollectives, which dist implements.
// The op is in autograd/ops_gather_shards.cpp; tests: tests/test_dist.cpp (one rank),
// tests/test_mpi.cpp (two ranks).
#pragma once

#include <cstdint>

#include "regen/core/tensor.h"

namespace regen {

// The collectives a gather_shards node runs. By default blocking: a node's output is whole when its
// forward returns, and the shard's gradient reduced when its backward does. An owner that runs
// training steps (dist::DataParallel) may instead gather a parameter before the op that reads it
// asks for it (gather_parameter), and reduce gradients while backward goes on (reduce_gradient),
// waiting for each at a point the graph fixes.
class ShardCollectives {
 public:
  virtual ~ShardCollectives() = default;
  virtual int rank() const = 0;
  virtual int ranks() const = 0;
  // Elements of scratch reduce_scatter_mean needs for chunks of `chunk` elements.
  virtual int64_t scratch_elements(int64_t chunk) const = 0;
  // `data` holds ranks() chunks of `chunk` elements; every rank's own chunk to every rank.
  virtual void all_gather(DType dtype, void* data, int64_t chunk) = 0;
  // A gather_shards node's collective: every rank's chunk of `flat` (ranks() x chunk elements,
  // this rank's already in place) to every rank, then, when `flat` is a staging buffer and not
  // `out`, its first out.numel() elements copied into `out`. Called in dry runs too. This default
  // runs it blocking (nothing in a dry run); an override may leave it in flight when it issued the
  // gather itself (gather_parameter), and wait for it before handing `out` to an op.
  virtual void gather_into(const Tensor& flat, const Tensor& out, int64_t chunk);
  // The whole parameter for an op that reads it (gathered_parameter): by default a gather_shards
  // node made now. An override may return one it recorded earlier and left in flight (a prefetch),
  // finished by then.
  virtual Tensor gather_parameter(const Tensor& shard, const Shape& shape);
  // `out` (chunk elements) = the mean over the ranks of their chunk rank() of `data`.
  virtual void reduce_scatter_mean(DType dtype, void* data, void* out, int64_t chunk,
                                   void* scratch) = 0;
  // Where the backward of gather_shards node `node` (of the tape running backward) adds the
  // gradient of its output: `whole`, ranks() x chunk elements of the parameter's dtype (zero past
  // its end; the parameter's gradient so far), and whether this node then reduce-scatters it into
  // the gradient of `shard` (its last use in backward). This default, for a caller that runs no
  // step (a test): a new zeroed buffer (category communication), reduced at once.
  struct Gradient {
    Tensor whole;
    bool reduce = true;
  };
  virtual Gradient shard_gradient(const TensorImpl* shard, int32_t node, DType dtype, Device device,
                                  int64_t chunk);
  // Reduce-scatters `whole` (a finished whole gradient of shard `shard`, ranks() x chunk elements):
  // the shard's gradient is this rank's chunk, averaged over the ranks. This default runs it
  // blocking into a new tensor (category communication) and returns it, for the engine to add into
  // the shard's gradient. An override may instead write the shard's gradient itself, with the
  // collective still running when it returns (an undefined tensor): it then keeps `whole` and its
  // scratch until it waits, at a point the graph fixes, before anything reads the gradient.
  virtual Tensor reduce_gradient(const TensorImpl* shard, Tensor whole, int64_t chunk);
};

// The op: the whole parameter of shape `shape` from every rank's `shard` (1-D, chunk elements).
Tensor gather_shards(const Tensor& shard, const Shape& shape, ShardCollectives* collectives);

// `full` (a parameter) is read from now on as the all-gather of `shard` (a 1-D leaf that requires
// grad, of chunk elements: rank r keeps elements [r chunk, (r + 1) chunk) of the flattened
// parameter, zero past its end). `collectives` must outlive the registration.
void register_sharded_parameter(const Tensor& full, const Tensor& shard,
                                ShardCollectives* collectives);
void unregister_sharded_parameter(const Tensor& full);
// The whole parameter `full` stands for: a recorded gather_shards node's output (grad mode on), a
// plain all-gather otherwise; `full` itself when it is not registered.
Tensor gathered_parameter(const Tensor& full);
// Any parameter registered (a cheap test for Tape::apply).
bool any_sharded_parameters();

}  // namespace regen
