// Evaluation on a held-out split (data.h EvalSource): the model in eval mode (batch norm on its
// running statistics, dropout off), every op run without recording, so there is no tape and no
// saved tensor; every example of the split (or the first `max_batches` batches) in order. Reports
// the mean loss per target and the metrics the model's input names (ModelInput::metrics): top-1
// accuracy, perplexity. Its memory is the allocator's, as everything's: the cache is emptied and
// the peaks reset before it starts, so the peaks it reports are the persistent state (parameters,
// gradients, optimizer state) plus what evaluation takes. The global RNG position is put back
// afterwards, so a run that evaluates draws the same dropout masks as one that does not.
// Tests: tests/test_training.cpp (against a plain loop over forward()), tests/test_cli.cpp
// (`regen eval`, --eval-every), tests/python/test_training.py.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "regen/models/data.h"

namespace regen {

struct EvalResult {
  int64_t examples = 0;  // examples evaluated
  int64_t targets = 0;   // targets among them (tokens for a language model)
  int64_t batches = 0;
  double loss = 0;  // mean loss per target
  // Among ModelInput::metrics: top-1 accuracy over the targets (-1 when not asked for), and
  // exp(loss) (-1 when not asked for).
  double accuracy = -1;
  double perplexity = -1;
  double ms = 0;           // wall time
  MemoryStats memory;      // the allocator's, peaks over the evaluation
  int64_t persistent = 0;  // bytes allocated when it started (the model's state)
};

// Evaluates `model` on `data` in batches of `batch` examples (the last one may be smaller),
// at most `max_batches` batches (0: the whole split). The model's train/eval mode is restored.
// Throws regen::Error when the model produces no output of the right shape for a metric.
EvalResult evaluate(Model& model, EvalSource& data, int64_t batch, int64_t max_batches = 0);

// "loss 0.4132, accuracy 88.00%" or "loss 1.2345, perplexity 3.44" (with the examples).
std::string eval_summary(const EvalResult& r);

}  // namespace regen
