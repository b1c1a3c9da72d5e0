// The training metrics log (--log FILE, regen.Model.train(log=)): one row per training step and
// one per evaluation, written and flushed as they happen, so the file is whole up to the last step
// that finished. FILE.csv (.CSV too) is CSV with a header; any other name (FILE.jsonl) is JSON
// lines. Columns:
// kind (train or eval), step (optimizer steps done), loss, lr, grad_norm (empty/null when not
// computed), samples_per_s, ms, peak_allocated, peak_reserved (bytes, the allocator's peaks over
// the step or the evaluation), accuracy, perplexity (evaluation rows, as the model reports them),
// loss_scale and skipped (fp16 training rows: the step's loss scale, and 1 when its gradients
// overflowed and the optimizer skipped it, else 0; empty/null otherwise).
// tools/plot.py curves FILE draws them. Tests: tests/test_training.cpp, tests/test_cli.cpp.
#pragma once

#include <cstdio>
#include <string>

#include "regen/models/evaluate.h"
#include "regen/models/train.h"

namespace regen {

class MetricsLog {
 public:
  // A log to `path` (append: keep what it holds and add rows, as a resumed run does; a CSV header
  // is written only to an empty file). Throws regen::Error naming the path when it cannot be
  // written: an existing file that cannot be opened for writing, or a folder where it cannot be
  // created. The file is opened (created, or truncated unless appending) at the first row, so a
  // run that fails before any step leaves it as it was.
  explicit MetricsLog(const std::string& path, bool append = false);
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;

  // `examples`: the examples the step trained on (batch * micro-batches).
  void step(int64_t step, const StepResult& r, int64_t examples);
  void eval(int64_t step, const EvalResult& r);
  const std::string& path() const { return path_; }
  bool csv() const { return csv_; }

 private:
  void row(const char* kind, int64_t step, double loss, double lr, double grad_norm, double sps,
           double ms, int64_t peak_allocated, int64_t peak_reserved, double accuracy,
           double perplexity, double loss_scale, int skipped);
  void open();  // at the first row
  std::string path_;
  bool append_ = false;
  bool csv_ = false;
  std::FILE* f_ = nullptr;
};

}  // namespace regen
