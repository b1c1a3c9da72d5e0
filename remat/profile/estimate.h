// The analytic memory model (the seed's "Memory Estimation with Checkpointing", worked out for
// regen's own models): closed forms, in a ResNet's or the Transformer's configuration sizes, for
// what one training step holds at its peak: parameters, gradients, optimizer state, the inputs,
// the activations saved for backward (without remat, or with every block checkpointed as the
// blocks planner does it), and what backward adds on top. No run. measure_memory_terms gives the
// same terms exactly from a profile of the step, to judge the closed forms; dry_profile makes that
// profile in milliseconds (a dry run: shapes, no kernels). docs/results.md has the comparison
// over every preset; tests/test_estimate.cpp checks which terms are exact.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "regen/autograd/precision.h"
#include "regen/models/model.h"
#include "regen/models/optim.h"
#include "regen/remat/profile/profile.h"

namespace regen {

enum class EstimatePolicy { none, blocks };
const char* estimate_policy_name(EstimatePolicy p);  // "none", "blocks"
// Throws regen::Error naming the two for anything else.
EstimatePolicy parse_estimate_policy(const std::string& text);

struct EstimateOptions {
  std::string optimizer = "sgd";  // "sgd" or "adamw"
  double momentum = 0.9;          // SGD: no state without momentum
  EstimatePolicy policy = EstimatePolicy::none;
  // Packed saves (SessionOptions::masks): relu's 1-bit masks and max_pool2d's packed argmax where
  // the step keeps them (autograd/tape.h PackedSaves).
  bool masks = true;
  // The precision the step trains in (dry_profile only: the closed forms count an fp32 step).
  Precision precision = Precision::fp32;
};

// Bytes of one step, by term. The closed forms count requested bytes (elements x element size);
// the allocator's rounding to 512-byte blocks and its unsplit remainders come on top
// (measure_memory_terms reports both).
struct MemoryTerms {
  int64_t parameters = 0;       // parameters and buffers (batch norm's running statistics)
  int64_t gradients = 0;        // one per parameter
  int64_t optimizer_state = 0;  // SGD's momentum, AdamW's two moments
  int64_t inputs = 0;           // the batch, and what a model keeps (the Transformer's positions)
  int64_t activations = 0;      // saved for backward and held when backward starts
  // What the peak holds beyond those: gradients in flight, under blocks the regenerated inside of
  // one block, the Transformer's head workspace; kernel scratch (workspace) only when measured.
  int64_t backward = 0;
  int64_t peak = 0;  // the sum: the step's peak
  // Measured only (0 in an estimate): the peak of allocated bytes, rounding included, and the
  // kernels' scratch (workspace category) allocated at that peak, part of `backward`.
  int64_t peak_allocated = 0;
  int64_t scratch_at_peak = 0;
  // Measured only: the part of `activations` that is 16-bit copies of weights (autocast's casts
  // of a parameter, saved by the op that reads them), not the forward's activations proper.
  int64_t weight_copies = 0;
  int64_t persistent() const { return parameters + gradients + optimizer_state; }
};

// Which closed form a model has: the built-in ResNets (resnet18 ... resnet152, resnet-tiny) and
// Transformers (transformer, bert-base, transformer-tiny) by the preset their configuration is
// named after; none for a model registered by a program, whose layers the forms do not know.
enum class EstimateArch { none, resnet, transformer };
EstimateArch estimate_arch(const ModelConfig& config);
const char* estimate_arch_name(EstimateArch a);  // "none", "resnet", "transformer"

// The closed forms for a ResNet or Transformer configuration (model.h) and batch. Throws
// regen::Error for a model without a closed form (estimate_arch) or an unknown optimizer.
MemoryTerms estimate_memory(const ModelConfig& config, int64_t batch, const EstimateOptions& o);

// The most bytes a step may come to for estimate_memory and dry_profile (2^60, 1 EiB): far past
// any device's memory, and below what the terms' 64-bit byte counts hold.
inline constexpr double kMaxEstimateBytes = 1152921504606846976.0;
// Refuses, with a regen::Error naming the model and the batch, a configuration and batch whose
// step could come to more than kMaxEstimateBytes (by a bound of the closed forms computed in
// floating point, so that nothing wraps): estimate_memory and dry_profile call it first. Models
// without a closed form pass.
void check_estimable(const ModelConfig& config, int64_t batch);

// The same terms from a profile of the step: parameters, gradients and optimizer state from the
// blocks live at its start, the inputs it allocates and keeps, the saved activations (all of them,
// or what the blocks planner retains), and the peak of the step simulated without remat or under
// that plan (requested bytes; peak_allocated with the allocator's rounding). The rest of the peak
// is `backward`.
MemoryTerms measure_memory_terms(const Profile& profile, EstimatePolicy policy);

// The most allocator events a dry profile may record (dry_profile refuses a batch whose step
// would record more, from two small steps' counts): a few seconds of a dry run.
inline constexpr double kMaxDryEvents = 2e6;

// One step of `config` on the CPU, profiled dry (core/allocator.h DryRunScope: every request a
// real step makes, on the Null arena, no kernel run), in milliseconds at usual sizes; its
// timings mean nothing, its graph and memory are exact. The optimizer as `o` says. Its kernels
// still request their scratch as they would run, so its time grows with the batch: a batch whose
// step would record more than kMaxDryEvents events is refused (check_estimable first).
Profile dry_profile(const ModelConfig& config, int64_t batch, const EstimateOptions& o);

}  // namespace regen
