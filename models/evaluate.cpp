// Evaluation on a held-out split (evaluate.h).
#include "regen/models/evaluate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "regen/autograd/tape.h"
#include "regen/kernels/kernels.h"

namespace regen {
namespace {

// The number of rows of `logits` (..., C) whose largest entry is at the target's class; the
// first of equal largest entries counts, as torch.argmax picks it.
int64_t top1_hits(const Tensor& logits, const Tensor& target) {
  REGEN_CHECK(logits.dim() >= 1 && logits.numel() / logits.shape().back() == target.numel(),
              "evaluation: accuracy needs forward()'s output to hold one row of class scores per "
              "target, but it is ",
              logits.str(), " for targets ", target.str());
  const int64_t classes = logits.shape().back();
  const std::vector<float> v = logits.dtype() == DType::f64
                                   ? [&] {
                                       std::vector<float> f;
                                       for (double d : logits.to_vector<double>())
                                         f.push_back(static_cast<float>(d));
                                       return f;
                                     }()
                                   : is_low_precision(logits.dtype())
                                         // A mixed precision's 16-bit scores, widened exactly.
                                         ? logits.to(DType::f32).to_vector<float>()
                                         : logits.to_vector<float>();
  const std::vector<int64_t> t = target.to_vector<int64_t>();
  int64_t hits = 0;
  for (size_t r = 0; r < t.size(); ++r) {
    const float* row = v.data() + r * static_cast<size_t>(classes);
    const int64_t best = std::max_element(row, row + classes) - row;
    hits += best == t[r] ? 1 : 0;
  }
  return hits;
}

}  // namespace

EvalResult evaluate(Model& model, EvalSource& data, int64_t batch, int64_t max_batches) {
  REGEN_CHECK(batch > 0, "evaluation: the batch size must be positive, got ", batch);
  REGEN_CHECK(max_batches >= 0, "evaluation: the batch limit must be >= 0, got ", max_batches);
  const ModelInfo& info = model_info(model.config().name);
  const auto wants = [&](const char* m) {
    return std::find(info.input.metrics.begin(), info.input.metrics.end(), m) !=
           info.input.metrics.end();
  };
  const bool accuracy = wants("accuracy");
  const Device device = model.device();
  CachingAllocator& alloc = allocator_for(device);
  kernels::synchronize(device);
  alloc.empty_cache();
  alloc.reset_peak();
  EvalResult r;
  r.persistent = alloc.stats().allocated.current;
  // Restores what evaluation changes: train mode and the dropout streams' position.
  struct Restore {
    Model& model;
    bool training;
    uint64_t seed, stream;
    ~Restore() {
      model.train(training);
      set_rng_state(seed, stream);
    }
  } restore{model, model.is_training(), rng_seed(), rng_stream_position()};
  model.eval();
  NoGradScope no_grad;
  const auto t0 = std::chrono::steady_clock::now();
  double loss_sum = 0;
  int64_t hits = 0;
  data.reset();
  while (r.examples < data.size() && (max_batches == 0 || r.batches < max_batches)) {
    Batch b = data.next(batch, device);
    const int64_t n = b.input.shape().front();
    const int64_t targets = b.target.numel();
    double loss = 0;
    {
      Tensor l;
      if (accuracy) {
        Tensor logits = model.forward(b.input);
        hits += top1_hits(logits, b.target);
        l = model.loss(logits, b.target);
      } else {
        // The model's own training loss (the Transformer's fused head: no logits made).
        l = model.forward_loss(b.input, b.target);
      }
      loss = l.dtype() == DType::f64 ? l.item<double>() : l.item<float>();
    }
    loss_sum += loss * static_cast<double>(targets);
    r.examples += n;
    r.targets += targets;
    r.batches += 1;
  }
  kernels::synchronize(device);
  r.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  REGEN_CHECK(r.targets > 0, "evaluation: ", data.describe(), " gave no examples");
  r.loss = loss_sum / static_cast<double>(r.targets);
  if (accuracy) r.accuracy = static_cast<double>(hits) / static_cast<double>(r.targets);
  if (wants("perplexity")) r.perplexity = std::exp(r.loss);
  r.memory = alloc.stats();
  return r;
}

std::string eval_summary(const EvalResult& r) {
  char buf[160];
  int n = std::snprintf(buf, sizeof buf, "loss %.4f", r.loss);
  if (r.accuracy >= 0)
    n += std::snprintf(buf + n, sizeof buf - n, ", accuracy %.2f%%", 100.0 * r.accuracy);
  if (r.perplexity >= 0)
    n += std::snprintf(buf + n, sizeof buf - n, ", perplexity %.3f", r.perplexity);
  std::snprintf(buf + n, sizeof buf - n, " (%lld examples)", static_cast<long long>(r.examples));
  return buf;
}

}  // namespace regen
