// The analytic memory model (estimate.h). Each closed form counts the tensors regen's model code
// and ops make: which ops save what is in autograd/ops_*.cpp (OpDef::saves), the layers in
// models/resnet.cpp and models/transformer.cpp. All in bytes of f32 (4), i64 (8) or i32 (4).
#include "regen/remat/profile/estimate.h"

#include <algorithm>
#include <cstdio>

#include "regen/autograd/ops.h"
#include "regen/core/error.h"
#include "regen/kernels/kernels.h"
#include "regen/kernels/unary_ops.h"
#include "regen/models/data.h"
#include "regen/models/train.h"
#include "regen/remat/plan/planner.h"
#include "regen/remat/profile/profiler.h"

namespace regen {

const char* estimate_policy_name(EstimatePolicy p) {
  return p == EstimatePolicy::none ? "none" : "blocks";
}

EstimatePolicy parse_estimate_policy(const std::string& text) {
  if (text == "none") return EstimatePolicy::none;
  if (text == "blocks") return EstimatePolicy::blocks;
  REGEN_FAIL("unknown estimate policy '", text, "': the closed forms are for none and blocks");
}

namespace {

constexpr int64_t kF32 = 4, kI64 = 8, kI32 = 4;

// Bytes of a 1-bit mask of n elements (a packed relu save: whole 32-bit words).
int64_t mask_bytes(int64_t n) {
  return mask_words(n) * 4;
}

// One output side of a convolution or pooling window.
int64_t out_side(int64_t in, int64_t kernel, int64_t stride, int64_t pad) {
  return (in + 2 * pad - kernel) / stride + 1;
}

int64_t optimizer_state(const EstimateOptions& o, int64_t gradients) {
  if (o.optimizer == "adamw") return 2 * gradients;  // exp_avg, exp_avg_sq
  REGEN_CHECK(o.optimizer == "sgd", "estimate: unknown optimizer '", o.optimizer,
              "' (sgd or adamw)");
  return o.momentum != 0.0 ? gradients : 0;  // momentum_buffer
}

MemoryTerms resnet_terms(const ModelConfig& c, int64_t N, const EstimateOptions& o) {
  REGEN_CHECK(c.blocks.size() == 4, "estimate: ResNet '", c.name, "' needs 4 stages");
  const int64_t w = c.base_width, K = c.num_classes, R = c.image_size;
  const int64_t e = c.bottleneck ? 4 : 1;
  int64_t params = 0, buffers = 0;
  auto conv = [&](int64_t in, int64_t out, int64_t k) { params += in * out * k * k; };
  auto bn = [&](int64_t ch) {
    params += 2 * ch;   // weight, bias
    buffers += 2 * ch;  // running mean, running variance
  };
  // Stem: conv 7x7/2 (saved by bn1), bn1 (its batch mean and inverse deviation saved), relu
  // (saves its output, which max-pool reads; packed, a 1-bit mask, since max-pool saves no input),
  // max-pool 3x3/2 (saves its i32 argmax; packed, 4-bit window positions, each plane from a new
  // 32-bit word; its output is the first block's input, saved by that block's convolutions).
  conv(3, w, 7);
  bn(w);
  const int64_t s0 = out_side(R, 7, 2, 3), s1 = out_side(s0, 3, 2, 1);
  const int64_t relu0 = o.masks ? mask_bytes(N * w * s0 * s0) : N * w * s0 * s0 * kF32;
  const int64_t argmax = o.masks ? N * w * ((s1 * s1 + 7) / 8) * 4 : N * w * s1 * s1 * kI32;
  const int64_t stem =
      N * w * s0 * s0 * kF32 + relu0 + 2 * w * kF32 + argmax + N * w * s1 * s1 * kF32;
  // Blocks, in forward order: what each saves inside (regenerated under blocks), its output's size
  // and what it keeps of its output (saved by its last relu and the next block: a checkpoint under
  // blocks). The last block's output only its relu saves (global average pooling saves nothing):
  // packed, the block keeps a mask of it inside instead.
  std::vector<int64_t> inside, output, kept;
  int64_t in_ch = w, side = s1;
  for (int s = 0; s < 4; ++s) {
    const int64_t p = w << s;
    for (int64_t b = 0; b < c.blocks[static_cast<size_t>(s)]; ++b) {
      const int64_t stride = (b == 0 && s > 0) ? 2 : 1, out_ch = p * e;
      const int64_t so = out_side(side, 3, stride, 1);
      const bool down = stride != 1 || in_ch != out_ch;
      int64_t saved = 0;  // elements
      int64_t stats = 0;  // channels of the batch norms (2 f32 statistics each)
      if (c.bottleneck) {
        conv(in_ch, p, 1);
        conv(p, p, 3);
        conv(p, out_ch, 1);
        bn(p);
        bn(p);
        bn(out_ch);
        // conv1's output (bn1), relu's output (conv2), conv2's (bn2), relu's (conv3), conv3's.
        saved += 2 * N * p * side * side + 2 * N * p * so * so + N * out_ch * so * so;
        stats += p + p + out_ch;
      } else {
        conv(in_ch, p, 3);
        conv(p, p, 3);
        bn(p);
        bn(p);
        // conv1's output, relu's output, conv2's output.
        saved += 3 * N * p * so * so;
        stats += p + p;
      }
      if (down) {
        conv(in_ch, out_ch, 1);
        bn(out_ch);
        saved += N * out_ch * so * so;  // the downsample convolution's output (its bn)
        stats += out_ch;
      }
      inside.push_back(saved * kF32 + 2 * stats * kF32);
      output.push_back(N * out_ch * so * so * kF32);
      kept.push_back(output.back());
      in_ch = out_ch;
      side = so;
    }
  }
  if (o.masks) {
    inside.back() += mask_bytes(output.back() / kF32);
    kept.back() = 0;
  }
  params += in_ch * K + K;  // fc
  // Head: the pooled features (fc's input), the logits and their log-sum-exp (cross_entropy).
  const int64_t head = (N * in_ch + N * K + N) * kF32;

  MemoryTerms t;
  t.parameters = (params + buffers) * kF32;
  t.gradients = params * kF32;
  t.optimizer_state = optimizer_state(o, t.gradients);
  t.inputs = N * 3 * R * R * kF32 + N * kI64;
  // Backward's first ops: the logits' and fc's gradients (fc's weight gradient is a new tensor
  // added into the persistent one), then the last stage's gradients two at a time.
  const int64_t last = output.back();
  const int64_t head_grads = (N * K + N * in_ch + in_ch * K + K) * kF32;
  const int64_t grads = std::max(head_grads, 2 * last);
  int64_t all_outputs = 0, all_inside = 0;
  for (size_t k = 0; k < output.size(); ++k) {
    all_outputs += kept[k];
    all_inside += inside[k];
  }
  if (o.policy == EstimatePolicy::none) {
    t.activations = stem + all_inside + all_outputs + head;
    t.backward = grads;
  } else {
    // Every block's inside is regenerated in its backward, from its input; its output stays.
    t.activations = stem + all_outputs + head;
    int64_t most = head_grads + t.activations;  // backward's first ops, before any block
    int64_t held = stem;
    for (size_t k = 0; k < output.size(); ++k) {
      held += kept[k];  // block k's output is held until its own backward ends
      most = std::max(most, held + inside[k] + 2 * output[k]);
    }
    t.backward = most - t.activations;
  }
  t.peak = t.persistent() + t.inputs + t.activations + t.backward;
  return t;
}

MemoryTerms transformer_terms(const ModelConfig& c, int64_t B, const EstimateOptions& o) {
  const int64_t S = c.seq_len, d = c.d_model, L = c.layers, h = c.heads, f = c.ff, V = c.vocab;
  const int64_t per_layer_params = 3 * d * d + 3 * d + d * d + d + d * f + f + f * d + d + 4 * d;
  const int64_t params = V * d + S * d + L * per_layer_params + V * d + V;
  const int64_t BS = B * S;
  // A layer saves its input (in_proj), the packed q, k, v and the attention's output and
  // log-sum-exp (attention), the first residual sum and its normalization (norm1, linear1), the
  // feed-forward's two wide tensors (relu's output and the dropout after it read by linear2; one
  // tensor when the dropout is off, since relu's output is then linear2's input; gelu saves its
  // input), the second residual sum (norm2), two f32 statistics per row per norm, and its output
  // (the next layer's input). Dropouts save nothing: their masks are drawn again. With packed
  // saves, relu before a dropout keeps a 1-bit mask of its output instead (only relu saves it).
  const int64_t wide = (!c.gelu && c.dropout == 0.0f) ? 1 : 2;
  const bool relu_mask = o.masks && !c.gelu && c.dropout != 0.0f;
  const int64_t layer_inside =
      (7 * BS * d + (relu_mask ? 1 : wide) * BS * f + B * h * S + 4 * BS) * kF32 +
      (relu_mask ? mask_bytes(BS * f) : 0);
  const int64_t layer_output = BS * d * kF32;
  const int64_t embedded = BS * d * kF32;  // the embeddings' sum after dropout: layer 0's input
  // Head: the fused linear_cross_entropy computes its gradients in the forward and saves them:
  // the weight's and the bias's, and the input's in place of the input itself (the last layer's
  // output, counted above, which nothing else saves). Recomputing (head_recompute), it saves one
  // log-sum-exp per row besides that input. Unfused: the logits and one log-sum-exp per row.
  const bool fused = c.head_chunk_rows >= 0, recompute = fused && c.head_recompute != 0;
  const int64_t head = (!fused ? BS * V + BS : recompute ? BS : V * d + V) * kF32;
  // The head's working set: the chunk of logits (fused: in the forward, where the gradients are
  // made; the backward only scales them in place); recomputing, a block of logits as large in the
  // backward, with the input's, weight's and bias's gradients; unfused, the logits' gradient, the
  // input's gradient and the weight's and bias's (new tensors, added into the persistent ones).
  const int64_t rows = !fused                  ? BS
                       : c.head_chunk_rows > 0 ? std::min(c.head_chunk_rows, BS)
                                               : linear_cross_entropy_auto_rows(BS, V);
  const int64_t head_grads =
      (fused && !recompute ? rows * V : rows * V + BS * d + V * d + V) * kF32;

  MemoryTerms t;
  t.parameters = params * kF32;
  t.gradients = params * kF32;
  t.optimizer_state = optimizer_state(o, t.gradients);
  t.inputs = 2 * BS * kI64 + S * kI64;  // tokens, targets, and the positions the model keeps
  // A layer's backward holds about two of its gradients at once: the feed-forward's output and
  // inner one, or the attention's output and packed q, k, v.
  const int64_t layer_grads = std::max(BS * (d + f), 4 * BS * d) * kF32;
  if (o.policy == EstimatePolicy::none) {
    t.activations = embedded + L * (layer_inside + layer_output) + head;
    t.backward = head_grads;
  } else {
    // Each layer's output is a checkpoint; its inside is regenerated in its backward. When the
    // last layer's backward runs, the head's tensors and that layer's own output are gone.
    t.activations = embedded + L * layer_output + head;
    const int64_t last_layer = embedded + (L - 1) * layer_output + layer_inside + layer_grads;
    t.backward = std::max(t.activations + head_grads, last_layer) - t.activations;
  }
  t.peak = t.persistent() + t.inputs + t.activations + t.backward;
  return t;
}

}  // namespace

EstimateArch estimate_arch(const ModelConfig& config) {
  static const char* const resnets[] = {"resnet18",  "resnet34",  "resnet50",
                                        "resnet101", "resnet152", "resnet-tiny"};
  static const char* const transformers[] = {"transformer", "bert-base", "transformer-tiny"};
  for (const char* n : resnets) {
    if (config.name == n) return EstimateArch::resnet;
  }
  for (const char* n : transformers) {
    if (config.name == n) return EstimateArch::transformer;
  }
  return EstimateArch::none;
}

const char* estimate_arch_name(EstimateArch a) {
  switch (a) {
    case EstimateArch::resnet:
      return "resnet";
    case EstimateArch::transformer:
      return "transformer";
    case EstimateArch::none:
      break;
  }
  return "none";
}

namespace {

// Bytes above every term of a step of the closed forms, in floating point (the terms themselves
// are int64 products that could wrap): what the estimate must be able to count.
double bytes_bound(const ModelConfig& c, int64_t batch, EstimateArch arch) {
  const double N = static_cast<double>(batch);
  if (arch == EstimateArch::resnet) {
    double blocks = 2;
    for (const int64_t b : c.blocks) blocks += static_cast<double>(b);
    const double R = static_cast<double>(c.image_size), K = static_cast<double>(c.num_classes);
    const double widest = static_cast<double>(c.base_width) * 8 * (c.bottleneck ? 4 : 1);
    const double params = widest * widest * 9 * blocks + widest * K + K;
    return 8 * (N * R * R * widest * blocks + N * K) + 16 * params;
  }
  const double S = static_cast<double>(c.seq_len), d = static_cast<double>(c.d_model);
  const double L = static_cast<double>(c.layers) + 2, V = static_cast<double>(c.vocab);
  const double f = static_cast<double>(c.ff), h = static_cast<double>(c.heads);
  const double params = (2 * V + S) * d + L * (4 * d * d + 2 * d * f + 8 * d + f) + V;
  return 8 * N * S * (2 * V + L * (8 * d + 2 * f + h + 4)) + 16 * params;
}

}  // namespace

MemoryTerms estimate_memory(const ModelConfig& config, int64_t batch, const EstimateOptions& o) {
  REGEN_CHECK(batch > 0, "estimate: the batch must be positive, got ", batch);
  optimizer_state(o, 0);  // an unknown optimizer is refused whatever the model
  const EstimateArch arch = estimate_arch(config);
  REGEN_CHECK(arch != EstimateArch::none, "estimate: model '", config.name,
              "' has no closed form (the built-in ResNets and Transformers have one: resnet18, "
              "resnet34, resnet50, resnet101, resnet152, resnet-tiny, transformer, bert-base, "
              "transformer-tiny); a dry profile gives any model's terms exactly (--compare)");
  check_estimable(config, batch);
  return arch == EstimateArch::resnet ? resnet_terms(config, batch, o)
                                      : transformer_terms(config, batch, o);
}

MemoryTerms measure_memory_terms(const Profile& p, EstimatePolicy policy) {
  MemoryTerms t;
  for (const AllocatorState::SegmentRec& seg : p.start_state.segments) {
    for (const BlockInfo& b : seg.blocks) {
      if (!b.allocated) continue;
      const int64_t bytes = static_cast<int64_t>(b.requested);
      if (b.category == Category::parameter) t.parameters += bytes;
      if (b.category == Category::gradient) t.gradients += bytes;
      if (b.category == Category::optimizer_state) t.optimizer_state += bytes;
      if (b.category == Category::input) t.inputs += bytes;
    }
  }
  for (const ProfileEvent& e : p.events) {
    if (e.kind == MemoryEventKind::alloc && e.category == Category::input) t.inputs += e.requested;
  }
  const Simulator sim(p);
  Plan plan;
  if (policy == EstimatePolicy::none) {
    plan = make_plan(sim, "none", Budget());
  } else {
    plan = make_plan(sim, "blocks", Budget());
  }
  for (const ProfileSaved& s : p.saved) {
    const ProfileValue& root = p.values[static_cast<size_t>(s.value)];
    if (root.leaf || s.category != Category::activation) continue;
    if (plan.decisions[static_cast<size_t>(s.index)] == Decision::retain) {
      t.activations += static_cast<int64_t>(s.bytes);
      const ProfileNode& producer = p.nodes[static_cast<size_t>(root.producer)];
      // A cast of a leaf with a backward: of a parameter (the batch's casts have none).
      if (producer.op == "cast" && producer.bwd_rank >= 0 && !producer.inputs.empty() &&
          p.values[static_cast<size_t>(producer.inputs[0])].leaf) {
        t.weight_copies += static_cast<int64_t>(s.bytes);
      }
    }
  }
  t.peak = plan.predicted.peak_requested;
  t.peak_allocated = plan.predicted.peak_allocated;
  t.scratch_at_peak = plan.predicted.allocated_by_at_peak[static_cast<int>(Category::workspace)];
  t.backward = t.peak - (t.persistent() + t.inputs + t.activations);
  return t;
}

void check_estimable(const ModelConfig& config, int64_t batch) {
  const EstimateArch arch = estimate_arch(config);
  if (arch == EstimateArch::none) return;
  const double bound = bytes_bound(config, batch, arch);
  char bytes[32];
  std::snprintf(bytes, sizeof bytes, "%.3g", bound);
  REGEN_CHECK(bound < kMaxEstimateBytes, "estimate: a step of model '", config.name, "' at batch ",
              batch, " with these sizes may come to about ", bytes,
              " bytes, more than 2^60 (1 EiB): past any device's memory and near what 64-bit "
              "byte counts hold; lower the batch or the model's sizes");
}

namespace {

Profile dry_profile_of(const ModelConfig& config, int64_t batch, const EstimateOptions& o);

}  // namespace

Profile dry_profile(const ModelConfig& config, int64_t batch, const EstimateOptions& o) {
  optimizer_state(o, 0);
  REGEN_CHECK(batch > 0, "dry profile: the batch must be positive, got ", batch);
  check_estimable(config, batch);
  // No kernel runs, but the CPU kernels request their scratch as they would run (per sample and
  // head, per tile): the events of a dry step grow with the batch. Two small steps tell how fast;
  // a step that would record more than kMaxDryEvents (minutes and gigabytes) is refused.
  // Batches 2 and 3: batch norm trains on any map of two values a channel.
  if (batch > 3) {
    const double e2 = static_cast<double>(dry_profile_of(config, 2, o).events.size());
    const double e3 = static_cast<double>(dry_profile_of(config, 3, o).events.size());
    const double events = e2 + std::max(0.0, e3 - e2) * static_cast<double>(batch - 2);
    char count[32];
    std::snprintf(count, sizeof count, "%.3g", events);
    REGEN_CHECK(events <= kMaxDryEvents, "dry profile: a step of model '", config.name,
                "' at batch ", batch, " would record about ", count,
                " allocator events (its kernels request scratch space per sample), more than ",
                static_cast<int64_t>(kMaxDryEvents),
                ": too long to run even dry; profile a smaller batch (the closed form needs "
                "no run)");
  }
  return dry_profile_of(config, batch, o);
}

namespace {

Profile dry_profile_of(const ModelConfig& config, int64_t batch, const EstimateOptions& o) {
  const Device cpu = Device::cpu();
  kernels::prepare_device(cpu);
  std::shared_ptr<const PackedSaves> packed;
  if (o.masks) {
    packed =
        std::make_shared<const PackedSaves>(learn_packed_saves(config, batch, cpu, o.precision));
  }
  DryRunScope scope(cpu);
  Profile p;
  try {
    std::unique_ptr<Model> model = make_model(config, cpu);
    std::unique_ptr<Optimizer> optimizer;
    if (o.optimizer == "sgd") {
      SGDOptions so;
      so.momentum = o.momentum;
      optimizer = std::make_unique<SGD>(model->parameters(), so);
    } else {
      optimizer = std::make_unique<AdamW>(model->parameters(), AdamWOptions{});
    }
    std::unique_ptr<DataSource> data = make_shape_source(config);
    Trainer trainer(*model, *optimizer, *data, batch, cpu);
    trainer.set_precision(o.precision);
    trainer.set_packed_saves(packed);
    ProfileOptions po;
    po.warmup = 0;
    po.iterations = 1;
    po.model_name = config.name;
    p = profile_training(trainer, po);
  } catch (...) {
    Tape::current().clear();  // the step's tensors belong to the scope's allocator
    throw;
  }
  return p;
}

}  // namespace

}  // namespace regen
