// The training metrics log (metrics_log.h).
#include "regen/models/metrics_log.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>

#include <unistd.h>

#include "regen/core/error.h"

namespace regen {
namespace {

// A number for the log: empty (CSV) or null (JSON) when absent (negative) or not finite.
std::string field(double v, bool csv, bool present) {
  if (!present || !std::isfinite(v)) return csv ? "" : "null";
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

}  // namespace

MetricsLog::MetricsLog(const std::string& path, bool append) : path_(path), append_(append) {
  // The extension in any case: run.CSV is CSV too.
  const auto dot = path.find_last_of('.');
  std::string ext = dot == std::string::npos ? std::string() : path.substr(dot);
  for (char& ch : ext) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  csv_ = ext == ".csv";
  // Checked now, opened at the first row: a run that fails before its first step (a profile or a
  // plan refused) leaves an existing log as it was and creates none.
  if (std::FILE* probe = std::fopen(path.c_str(), "r+")) {
    std::fclose(probe);
    return;
  }
  REGEN_CHECK(errno == ENOENT, "--log ", path,
              ": cannot open it for writing: ", std::strerror(errno));
  const auto slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash + 1);
  REGEN_CHECK(::access(dir.c_str(), W_OK | X_OK) == 0, "--log ", path, ": cannot create it in ",
              dir, ": ", std::strerror(errno));
}

void MetricsLog::open() {
  if (f_ != nullptr) return;
  f_ = std::fopen(path_.c_str(), append_ ? "a" : "w");
  REGEN_CHECK(f_ != nullptr, "--log ", path_,
              ": cannot open it for writing: ", std::strerror(errno));
  if (csv_ && std::ftell(f_) == 0) {
    std::fputs(
        "kind,step,loss,lr,grad_norm,samples_per_s,ms,peak_allocated,peak_reserved,accuracy,"
        "perplexity,loss_scale,skipped\n",
        f_);
    std::fflush(f_);
  }
}

MetricsLog::~MetricsLog() {
  if (f_) std::fclose(f_);
}

void MetricsLog::row(const char* kind, int64_t step, double loss, double lr, double grad_norm,
                     double sps, double ms, int64_t peak_allocated, int64_t peak_reserved,
                     double accuracy, double perplexity, double loss_scale, int skipped) {
  open();
  const bool c = csv_;
  const std::string v[] = {field(loss, c, true),
                           field(lr, c, lr >= 0),
                           field(grad_norm, c, grad_norm >= 0),
                           field(sps, c, sps >= 0),
                           field(ms, c, true),
                           field(accuracy, c, accuracy >= 0),
                           field(perplexity, c, perplexity >= 0),
                           field(loss_scale, c, loss_scale > 0),
                           skipped < 0 ? (c ? "" : "null") : std::to_string(skipped)};
  if (c) {
    std::fprintf(f_, "%s,%lld,%s,%s,%s,%s,%s,%lld,%lld,%s,%s,%s,%s\n", kind,
                 static_cast<long long>(step), v[0].c_str(), v[1].c_str(), v[2].c_str(),
                 v[3].c_str(), v[4].c_str(), static_cast<long long>(peak_allocated),
                 static_cast<long long>(peak_reserved), v[5].c_str(), v[6].c_str(), v[7].c_str(),
                 v[8].c_str());
  } else {
    std::fprintf(f_,
                 "{\"kind\": \"%s\", \"step\": %lld, \"loss\": %s, \"lr\": %s, \"grad_norm\": %s, "
                 "\"samples_per_s\": %s, \"ms\": %s, \"peak_allocated\": %lld, "
                 "\"peak_reserved\": %lld, \"accuracy\": %s, \"perplexity\": %s, "
                 "\"loss_scale\": %s, \"skipped\": %s}\n",
                 kind, static_cast<long long>(step), v[0].c_str(), v[1].c_str(), v[2].c_str(),
                 v[3].c_str(), v[4].c_str(), static_cast<long long>(peak_allocated),
                 static_cast<long long>(peak_reserved), v[5].c_str(), v[6].c_str(), v[7].c_str(),
                 v[8].c_str());
  }
  std::fflush(f_);
  REGEN_CHECK(!std::ferror(f_), "--log ", path_, ": writing failed: ", std::strerror(errno));
}

void MetricsLog::step(int64_t step, const StepResult& r, int64_t examples) {
  const double sps = r.ms > 0 ? 1000.0 * static_cast<double>(examples) / r.ms : -1;
  row("train", step, r.loss, r.lr, r.grad_norm, sps, r.ms, r.memory.allocated.peak,
      r.memory.reserved.peak, -1, -1, r.loss_scale, r.loss_scale > 0 ? (r.skipped ? 1 : 0) : -1);
}

void MetricsLog::eval(int64_t step, const EvalResult& r) {
  const double sps = r.ms > 0 ? 1000.0 * static_cast<double>(r.examples) / r.ms : -1;
  row("eval", step, r.loss, -1, -1, sps, r.ms, r.memory.allocated.peak, r.memory.reserved.peak,
      r.accuracy, r.perplexity, 0, -1);
}

}  // namespace regen
