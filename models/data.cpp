// Data sources (data.h).
#include "regen/models/data.h"

#include <sys/stat.h>
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <functional>

#include "regen/core/io.h"
#include "regen/core/philox.h"

namespace regen {

void DataSource::set_position(const std::string& position) {
  REGEN_CHECK(position.empty(), "data ", describe(), " keeps no position, but one was given ('",
              position, "')");
}

namespace {

// Positions as text: "key=value,key=value" of unsigned integers.
std::string position_text(const std::vector<std::pair<std::string, uint64_t>>& fields) {
  std::string out;
  for (const auto& [k, v] : fields) out += (out.empty() ? "" : ",") + k + "=" + std::to_string(v);
  return out;
}
// The values of `keys` in a position_text, in order; throws naming the source and the text.
std::vector<uint64_t> parse_position(const std::string& text, const std::vector<std::string>& keys,
                                     const std::string& who) {
  std::vector<uint64_t> out;
  size_t at = 0;
  for (const std::string& k : keys) {
    const std::string want = k + "=";
    bool ok = text.compare(at, want.size(), want) == 0;
    size_t end = ok ? text.find(',', at) : std::string::npos;
    if (end == std::string::npos) end = text.size();
    const std::string digits = ok ? text.substr(at + want.size(), end - at - want.size()) : "";
    const int64_t v = ok ? parse_count(digits) : -1;
    REGEN_CHECK(v >= 0, "data ", who, ": cannot read the position '", text, "' (expected ", k,
                "=N, N at most ", INT64_MAX, keys.size() > 1 ? ", and the others" : "", ")");
    out.push_back(static_cast<uint64_t>(v));
    at = end + 1;
  }
  REGEN_CHECK(at >= text.size(), "data ", who, ": the position '", text, "' has more than ",
              keys.size(), " field(s)");
  return out;
}

// Every batch's blocks, in this order, category and tags (make_shape_source allocates the same).
constexpr const char* kInputTag = "batch.input";
constexpr const char* kTargetTag = "batch.target";

// A data kind's text in messages: "--data cifar10:DIR" or "data='cifar10:DIR'".
std::string data_setting(const std::string& spec, OptionStyle style) {
  return option_setting("data", style == OptionStyle::keyword ? "'" + spec + "'" : spec, style);
}

class ShapeSource final : public DataSource {
 public:
  explicit ShapeSource(const ModelConfig& m) : m_(m), input_(model_info(m.name).input) {}
  Batch next(int64_t n, Device device) override {
    const BatchSpec spec = input_.batch(m_, n);
    CategoryScope cat(Category::input);
    Batch b;
    {
      TagScope tag(kInputTag);
      b.input = empty(spec.input.shape, spec.input.dtype, device);
    }
    TagScope tag(kTargetTag);
    b.target = empty(spec.target.shape, spec.target.dtype, device);
    return b;
  }
  std::string describe() const override { return "shapes only (a dry run)"; }
  void skip(int64_t) override {}

 private:
  ModelConfig m_;
  const ModelInput& input_;  // the registry's: registrations never move or go
};

// Images: per-class channel offsets plus noise, so a network can learn the labels.
class SyntheticImages final : public DataSource {
 public:
  SyntheticImages(const ModelConfig& m, uint64_t seed) : m_(m), seed_(seed) {}
  Batch next(int64_t n, Device device) override {
    const int64_t hw = m_.image_size * m_.image_size;
    std::vector<float> img(static_cast<size_t>(n * 3 * hw));
    std::vector<int64_t> labels(static_cast<size_t>(n));
    const uint64_t first = counter_;
    counter_ += static_cast<uint64_t>(n);
    for (int64_t i = 0; i < n; ++i) {
      labels[i] = static_cast<int64_t>(philox_word(seed_, 1, first + static_cast<uint64_t>(i)) %
                                       m_.num_classes);
    }
    // Every element is a function of its own index, so the planes are filled in parallel (at
    // 224x224 a batch is millions of Philox draws: on one thread, tens of milliseconds a step).
#pragma omp parallel for schedule(static)
    for (int64_t plane = 0; plane < n * 3; ++plane) {
      const int64_t i = plane / 3, c = plane % 3;
      const uint64_t sample = first + static_cast<uint64_t>(i);
      // A fixed offset per (class, channel) in [-1, 1).
      const float offset =
          2.0f * philox_uniform01(philox_word(seed_, 2, static_cast<uint64_t>(labels[i] * 3 + c))) -
          1.0f;
      float* p = img.data() + plane * hw;
      for (int64_t e = 0; e < hw; ++e) {
        const uint64_t idx = (sample * 3 + static_cast<uint64_t>(c)) * static_cast<uint64_t>(hw) +
                             static_cast<uint64_t>(e);
        p[e] = offset + (philox_uniform01(philox_word(seed_, 3, idx)) - 0.5f);
      }
    }
    return batch_on_device({{n, 3, m_.image_size, m_.image_size}, std::move(img), {}},
                           {{n}, {}, std::move(labels)}, device);
  }
  std::string describe() const override {
    return "synthetic images " + std::to_string(m_.image_size) + "x" +
           std::to_string(m_.image_size) + ", " + std::to_string(m_.num_classes) +
           " classes (seed " + std::to_string(seed_) + ")";
  }
  std::string position() const override {
    return position_text({{"sample", counter_}});
  }
  void set_position(const std::string& p) override {
    counter_ = parse_position(p, {"sample"}, describe())[0];
  }
  void skip(int64_t samples) override {
    counter_ += static_cast<uint64_t>(samples);
  }

 private:
  ModelConfig m_;
  uint64_t seed_;
  uint64_t counter_ = 0;
};

// Tokens: a random motif of 8 tokens repeated along the sequence, so a causal model can learn
// to predict by copying from 8 positions back.
class SyntheticTokens final : public DataSource {
 public:
  SyntheticTokens(const ModelConfig& m, uint64_t seed) : m_(m), seed_(seed) {}
  Batch next(int64_t n, Device device) override {
    const int64_t S = m_.seq_len;
    std::vector<int64_t> in(static_cast<size_t>(n * S)), out(static_cast<size_t>(n * S));
    for (int64_t i = 0; i < n; ++i) {
      const uint64_t sample = counter_++;
      int64_t motif[kMotif];
      for (int k = 0; k < kMotif; ++k) {
        motif[k] = static_cast<int64_t>(philox_word(seed_, 4, sample * kMotif + k) % m_.vocab);
      }
      for (int64_t t = 0; t < S; ++t) {
        in[i * S + t] = motif[t % kMotif];
        out[i * S + t] = motif[(t + 1) % kMotif];
      }
    }
    return batch_on_device({{n, S}, {}, std::move(in)}, {{n, S}, {}, std::move(out)}, device);
  }
  std::string describe() const override {
    return "synthetic token motifs, sequence " + std::to_string(m_.seq_len) + ", vocabulary " +
           std::to_string(m_.vocab) + " (seed " + std::to_string(seed_) + ")";
  }
  std::string position() const override { return position_text({{"sample", counter_}}); }
  void set_position(const std::string& p) override {
    counter_ = parse_position(p, {"sample"}, describe())[0];
  }
  void skip(int64_t samples) override { counter_ += static_cast<uint64_t>(samples); }

 private:
  static constexpr int kMotif = 8;
  ModelConfig m_;
  uint64_t seed_;
  uint64_t counter_ = 0;
};

bool file_exists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

constexpr int64_t kCifarRecord = 1 + 3 * 32 * 32;

// A CIFAR-10 binary file, checked: whole records, labels 0..9.
std::string read_cifar_file(const std::string& f) {
  std::string bytes = read_file(f);
  REGEN_CHECK(!bytes.empty() && bytes.size() % kCifarRecord == 0, "CIFAR-10 file '", f, "' has ",
              bytes.size(), " bytes, not a whole number of ", kCifarRecord,
              "-byte records (truncated?)");
  for (size_t r = 0; r < bytes.size(); r += kCifarRecord) {
    const unsigned char label = static_cast<unsigned char>(bytes[r]);
    REGEN_CHECK(label < 10, "CIFAR-10 file '", f, "': record ", r / kCifarRecord, " has label ",
                static_cast<int>(label), " (expected 0..9)");
  }
  return bytes;
}

// One record's label, and its image normalized by the channel means and deviations into img
// (3 * 1024 floats).
int64_t decode_cifar_record(const unsigned char* rec, float* img) {
  static const float mean[3] = {0.4914f, 0.4822f, 0.4465f};
  static const float stdv[3] = {0.2470f, 0.2435f, 0.2616f};
  for (int c = 0; c < 3; ++c) {
    for (int e = 0; e < 1024; ++e) {
      img[c * 1024 + e] = (rec[1 + c * 1024 + e] / 255.0f - mean[c]) / stdv[c];
    }
  }
  return rec[0];
}

class Cifar10 final : public DataSource {
 public:
  static constexpr int64_t kRecord = kCifarRecord;

  // `what` names the data in messages ("--data cifar10:DIR").
  Cifar10(const std::string& dir, const std::string& what, uint64_t seed) : dir_(dir), seed_(seed) {
    struct stat st;
    REGEN_CHECK(::stat(dir.c_str(), &st) == 0, what, ": cannot open '", dir,
                "': ", std::strerror(errno));
    REGEN_CHECK(
        S_ISDIR(st.st_mode), what, ": '", dir,
        "' is not a directory (expected the folder of data_batch_1.bin .. data_batch_5.bin)");
    for (int i = 1; i <= 5; ++i) {
      const std::string f = dir + "/data_batch_" + std::to_string(i) + ".bin";
      if (!file_exists(f)) continue;
      data_ += read_cifar_file(f);
      files_ += 1;
    }
    REGEN_CHECK(files_ > 0, what, ": no data_batch_1.bin .. data_batch_5.bin found");
    records_ = static_cast<int64_t>(data_.size()) / kRecord;
    order_.resize(static_cast<size_t>(records_));
    shuffle();
  }

  Batch next(int64_t n, Device device) override {
    std::vector<float> img(static_cast<size_t>(n * 3 * 1024));
    std::vector<int64_t> labels(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      if (pos_ == records_) {
        ++epoch_;
        shuffle();
      }
      const unsigned char* rec =
          reinterpret_cast<const unsigned char*>(data_.data()) + order_[pos_++] * kRecord;
      labels[i] = decode_cifar_record(rec, img.data() + i * 3 * 1024);
    }
    return batch_on_device({{n, 3, 32, 32}, std::move(img), {}}, {{n}, {}, std::move(labels)},
                           device);
  }
  std::string describe() const override {
    return "CIFAR-10 from " + dir_ + " (" + std::to_string(records_) + " images in " +
           std::to_string(files_) + " files)";
  }
  // The epoch (its shuffled order follows from the seed and the epoch) and the place in it.
  std::string position() const override {
    return position_text({{"epoch", epoch_}, {"index", static_cast<uint64_t>(pos_)}});
  }
  void set_position(const std::string& p) override {
    const std::vector<uint64_t> v = parse_position(p, {"epoch", "index"}, describe());
    REGEN_CHECK(v[1] <= static_cast<uint64_t>(records_), "data ", describe(), ": the position '", p,
                "' is past the ", records_, " images of an epoch");
    epoch_ = v[0];
    shuffle();
    pos_ = static_cast<int64_t>(v[1]);
  }
  // As next() advances: a new epoch's order is drawn when its first record is taken.
  void skip(int64_t samples) override {
    while (samples > 0) {
      if (pos_ == records_) {
        ++epoch_;
        shuffle();
      }
      const int64_t take = std::min(samples, records_ - pos_);
      pos_ += take;
      samples -= take;
    }
  }

 private:
  void shuffle() {
    for (int64_t i = 0; i < records_; ++i) order_[i] = i;
    for (int64_t i = records_ - 1; i > 0; --i) {  // Fisher-Yates from the Philox stream
      const uint64_t r = philox_word(seed_, 5 + epoch_, static_cast<uint64_t>(i));
      std::swap(order_[i], order_[r % static_cast<uint64_t>(i + 1)]);
    }
    pos_ = 0;
  }
  std::string dir_;
  uint64_t seed_;
  std::string data_;
  int files_ = 0;
  int64_t records_ = 0, pos_ = 0;
  uint64_t epoch_ = 0;
  std::vector<int64_t> order_;
};

// Returns the offset of the first invalid UTF-8 sequence, or -1.
int64_t first_invalid_utf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    int len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (len == 0 || i + len > s.size()) return static_cast<int64_t>(i);
    for (int k = 1; k < len; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) >> 6) != 0x2) return static_cast<int64_t>(i);
    }
    i += static_cast<size_t>(len);
  }
  return -1;
}

class TextBytes final : public DataSource {
 public:
  // `what` names the data in messages ("--data text:FILE").
  // With `holdout` > 0, the last floor(holdout * size) bytes are left out (the held-out split).
  TextBytes(const std::string& path, const std::string& what, const ModelConfig& m, uint64_t seed,
            double holdout = 0)
      : path_(path), seq_(m.seq_len), seed_(seed) {
    struct stat st;
    REGEN_CHECK(::stat(path.c_str(), &st) == 0, what, ": cannot open '", path,
                "': ", std::strerror(errno));
    REGEN_CHECK(S_ISREG(st.st_mode), what, ": '", path, "' is ",
                S_ISDIR(st.st_mode) ? "a directory, " : "", "not a regular file");
    text_ = read_file(path);
    REGEN_CHECK(!text_.empty(), what, ": the file is empty");
    REGEN_CHECK(static_cast<int64_t>(text_.size()) > seq_, "text file '", path, "' has ",
                text_.size(), " bytes; it needs more than the sequence length ", seq_);
    const int64_t bad = first_invalid_utf8(text_);
    REGEN_CHECK(bad < 0, "text file '", path, "' is not valid UTF-8 (byte offset ", bad, ")");
    if (holdout > 0) {
      const int64_t tail = static_cast<int64_t>(static_cast<double>(text_.size()) * holdout);
      held_out_ = tail;
      REGEN_CHECK(static_cast<int64_t>(text_.size()) - tail > seq_, "text file '", path, "' has ",
                  text_.size(), " bytes: after the held-out ", tail,
                  " at its end, the training part needs more than the sequence length ", seq_);
      text_.resize(text_.size() - static_cast<size_t>(tail));
    }
  }
  std::string position() const override { return position_text({{"sample", counter_}}); }
  void set_position(const std::string& p) override {
    counter_ = parse_position(p, {"sample"}, describe())[0];
  }
  Batch next(int64_t n, Device device) override {
    const int64_t windows = static_cast<int64_t>(text_.size()) - seq_;
    std::vector<int64_t> in(static_cast<size_t>(n * seq_)), out(static_cast<size_t>(n * seq_));
    for (int64_t i = 0; i < n; ++i) {
      const int64_t start =
          static_cast<int64_t>(philox_word(seed_, 6, counter_++) % static_cast<uint64_t>(windows));
      for (int64_t t = 0; t < seq_; ++t) {
        in[i * seq_ + t] = static_cast<unsigned char>(text_[start + t]);
        out[i * seq_ + t] = static_cast<unsigned char>(text_[start + t + 1]);
      }
    }
    return batch_on_device({{n, seq_}, {}, std::move(in)}, {{n, seq_}, {}, std::move(out)}, device);
  }
  std::string describe() const override {
    return "text " + path_ + " (" + std::to_string(text_.size()) + " bytes as byte tokens" +
           (held_out_ > 0 ? ", the last " + std::to_string(held_out_) + " held out" : "") + ")";
  }
  void skip(int64_t samples) override { counter_ += static_cast<uint64_t>(samples); }

 private:
  std::string path_;
  int64_t held_out_ = 0;
  int64_t seq_;
  uint64_t seed_;
  uint64_t counter_ = 0;
  std::string text_;
};

// ---- Held-out splits ----------------------------------------------------------------------

// A split of `size` examples in order; `take(first, n)` makes examples [first, first + n).
class OrderedEval final : public EvalSource {
 public:
  using Take = std::function<Batch(int64_t first, int64_t n, Device device)>;
  OrderedEval(int64_t size, std::string what, Take take)
      : size_(size), what_(std::move(what)), take_(std::move(take)) {}
  int64_t size() const override { return size_; }
  void reset() override { pos_ = 0; }
  Batch next(int64_t n, Device device) override {
    REGEN_CHECK(n > 0 && pos_ < size_, "evaluation data ", what_, ": no examples left (", size_,
                " in all)");
    const int64_t take = std::min(n, size_ - pos_);
    Batch b = take_(pos_, take, device);
    pos_ += take;
    return b;
  }
  std::string describe() const override { return what_; }

 private:
  int64_t size_;
  std::string what_;
  Take take_;
  int64_t pos_ = 0;
};

// Synthetic held-out examples: the training generator's (the same seed, so the same task: the
// same class offsets), from sample 2^40 on, which no training run reaches.
constexpr uint64_t kEvalFirstSample = uint64_t{1} << 40;
std::unique_ptr<EvalSource> synthetic_eval(std::unique_ptr<DataSource> gen, int64_t size) {
  std::shared_ptr<DataSource> g(std::move(gen));
  const std::string what = "held-out " + g->describe() + ", " + std::to_string(size) +
                           " examples no training step draws";
  return std::make_unique<OrderedEval>(size, what, [g](int64_t first, int64_t n, Device device) {
    g->set_position("sample=" + std::to_string(kEvalFirstSample + static_cast<uint64_t>(first)));
    return g->next(n, device);
  });
}

std::unique_ptr<EvalSource> cifar_eval(const std::string& dir, const std::string& what) {
  const std::string f = dir + "/test_batch.bin";
  REGEN_CHECK(file_exists(f), what, ": no test_batch.bin in '", dir,
              "' (CIFAR-10's held-out split, which evaluation reads)");
  auto bytes = std::make_shared<std::string>(read_cifar_file(f));
  const int64_t n = static_cast<int64_t>(bytes->size()) / kCifarRecord;
  return std::make_unique<OrderedEval>(
      n, "CIFAR-10 " + f + " (" + std::to_string(n) + " images)",
      [bytes](int64_t first, int64_t count, Device device) {
        std::vector<float> img(static_cast<size_t>(count * 3 * 1024));
        std::vector<int64_t> labels(static_cast<size_t>(count));
        for (int64_t i = 0; i < count; ++i) {
          const unsigned char* rec =
              reinterpret_cast<const unsigned char*>(bytes->data()) + (first + i) * kCifarRecord;
          labels[static_cast<size_t>(i)] = decode_cifar_record(rec, img.data() + i * 3 * 1024);
        }
        return batch_on_device({{count, 3, 32, 32}, std::move(img), {}},
                               {{count}, {}, std::move(labels)}, device);
      });
}

// The last floor(holdout * size) bytes of a text file, as consecutive windows of seq_len tokens
// (each predicting the next byte), one after the other.
std::unique_ptr<EvalSource> text_eval(const std::string& path, const std::string& what,
                                      const ModelConfig& m, double holdout) {
  REGEN_CHECK(file_exists(path), what, ": cannot open '", path, "'");
  const std::string text = read_file(path);
  const int64_t tail = static_cast<int64_t>(static_cast<double>(text.size()) * holdout);
  const int64_t seq = m.seq_len;
  const int64_t windows = tail > 0 ? (tail - 1) / seq : 0;
  REGEN_CHECK(
      windows >= 1, what, ": the held-out last ", tail, " bytes of '", path, "' (a fraction ",
      holdout, " of ", text.size(), ") hold no window of the sequence length ", seq,
      " and its next byte: a longer file, a larger held-out fraction or a shorter sequence");
  auto held = std::make_shared<std::string>(text.substr(text.size() - static_cast<size_t>(tail)));
  return std::make_unique<OrderedEval>(
      windows,
      "text " + path + " (the last " + std::to_string(tail) + " bytes, " + std::to_string(windows) +
          " windows of " + std::to_string(seq) + ")",
      [held, seq](int64_t first, int64_t count, Device device) {
        std::vector<int64_t> in(static_cast<size_t>(count * seq)), out(in.size());
        for (int64_t i = 0; i < count; ++i) {
          const int64_t start = (first + i) * seq;
          for (int64_t t = 0; t < seq; ++t) {
            in[static_cast<size_t>(i * seq + t)] =
                static_cast<unsigned char>((*held)[static_cast<size_t>(start + t)]);
            out[static_cast<size_t>(i * seq + t)] =
                static_cast<unsigned char>((*held)[static_cast<size_t>(start + t + 1)]);
          }
        }
        return batch_on_device({{count, seq}, {}, std::move(in)},
                               {{count, seq}, {}, std::move(out)}, device);
      });
}

}  // namespace

void DataSource::skip(int64_t samples) {
  REGEN_CHECK(samples == 0, "data ", describe(),
              " cannot skip samples (DataSource::skip), so it cannot give each rank of a "
              "data-parallel run its own shard of the global batch: run it in one process, or "
              "implement skip() for it");
}

Batch batch_on_device(const HostArray& input, const HostArray& target, Device device) {
  auto make = [device](const HostArray& a, const char* what) {
    const bool f32 = a.i64.empty();
    REGEN_CHECK(a.f32.empty() != a.i64.empty() || (f32 && shape_numel(a.shape) == 0),
                "batch_on_device: the ", what, " has values of both dtypes or of neither");
    const int64_t n = static_cast<int64_t>(f32 ? a.f32.size() : a.i64.size());
    REGEN_CHECK(n == shape_numel(a.shape), "batch_on_device: the ", what, " has ", n,
                " values for shape ", sh(a.shape));
    return f32 ? from_vector<float>(a.f32, a.shape, device)
               : from_vector<int64_t>(a.i64, a.shape, device);
  };
  CategoryScope cat(Category::input);
  Batch b;
  {
    TagScope tag(kInputTag);
    b.input = make(input, "input");
  }
  TagScope tag(kTargetTag);
  b.target = make(target, "target");
  return b;
}

namespace {

// "synthetic, cifar10:DIR"
std::string data_kinds_text(const ModelInput& in) {
  std::vector<std::string> names;
  for (const DataKind& d : in.data) names.push_back(d.arg.empty() ? d.name : d.name + ":" + d.arg);
  return join_names(names);
}

// The model's data kind for `spec`, with its argument; refuses a kind it does not take.
const DataKind& data_kind_of(const std::string& spec, const ModelConfig& m, OptionStyle style,
                             std::string& arg) {
  const ModelInput& in = model_info(m.name).input;
  if (spec.empty()) {
    arg.clear();
    return in.data.front();
  }
  const auto colon = spec.find(':');
  const std::string kind = spec.substr(0, colon);
  arg = colon == std::string::npos ? "" : spec.substr(colon + 1);
  const DataKind* d = in.data_kind(kind);
  REGEN_CHECK(d != nullptr, "bad ", data_setting(spec, style), ": model '", m.name, "' takes ",
              data_kinds_text(in), " (", in.help, ")");
  REGEN_CHECK(d->arg.empty() ? colon == std::string::npos : !arg.empty(), "bad ",
              data_setting(spec, style), ": ",
              d->arg.empty() ? "'" + kind + "' takes nothing after it"
                             : "'" + kind + "' needs a " + d->arg + " after the colon",
              " (model '", m.name, "' takes ", data_kinds_text(in), ")");
  return *d;
}

}  // namespace

void check_data_spec(const std::string& spec, const ModelConfig& m, OptionStyle style) {
  std::string arg;
  const DataKind& d = data_kind_of(spec, m, style, arg);
  if (d.check) d.check(m, style);
}

std::unique_ptr<DataSource> make_data_source(const std::string& spec, const ModelConfig& m,
                                             uint64_t seed, OptionStyle style) {
  std::string arg;
  const DataKind& d = data_kind_of(spec, m, style, arg);
  if (d.check) d.check(m, style);
  return d.make(arg, m, seed, style);
}

std::vector<std::string> data_input_files(const std::string& spec, const ModelConfig& m,
                                          OptionStyle style) {
  std::string arg;
  const DataKind& d = data_kind_of(spec, m, style, arg);
  if (d.files) return d.files(arg);
  if (d.arg.empty() || arg.empty()) return {};
  return {arg};
}

std::unique_ptr<EvalSource> make_eval_source(const std::string& spec, const ModelConfig& m,
                                             uint64_t seed, double holdout, OptionStyle style) {
  std::string arg;
  const DataKind& d = data_kind_of(spec, m, style, arg);
  if (d.check) d.check(m, style);
  REGEN_CHECK(d.make_eval != nullptr, data_setting(spec.empty() ? d.name : spec, style),
              " has no held-out split to evaluate on (model '", m.name, "' takes ",
              data_kinds_text(model_info(m.name).input), ")");
  REGEN_CHECK(holdout > 0 && holdout < 1, "the held-out fraction ", holdout,
              " must be between 0 and 1");
  return d.make_eval(arg, m, seed, holdout, style);
}

std::unique_ptr<DataSource> make_training_source(const std::string& spec, const ModelConfig& m,
                                                 uint64_t seed, double holdout, OptionStyle style) {
  std::string arg;
  const DataKind& d = data_kind_of(spec, m, style, arg);
  if (holdout <= 0 || !d.make_split) return make_data_source(spec, m, seed, style);
  if (d.check) d.check(m, style);
  return d.make_split(arg, m, seed, holdout, style);
}

bool data_split_by_holdout(const std::string& spec, const ModelConfig& m, OptionStyle style) {
  std::string arg;
  return data_kind_of(spec, m, style, arg).make_split != nullptr;
}

std::unique_ptr<DataSource> make_shape_source(const ModelConfig& model) {
  return std::make_unique<ShapeSource>(model);
}

DataKind synthetic_images_data() {
  DataKind d;
  d.name = "synthetic";
  d.help = "synthetic images: per-class channel offsets plus noise (the default)";
  d.make = [](const std::string&, const ModelConfig& m, uint64_t seed, OptionStyle) {
    return std::unique_ptr<DataSource>(std::make_unique<SyntheticImages>(m, seed));
  };
  d.held_out = "1024 synthetic images no training step draws";
  d.make_eval = [](const std::string&, const ModelConfig& m, uint64_t seed, double, OptionStyle) {
    return synthetic_eval(std::make_unique<SyntheticImages>(m, seed), 1024);
  };
  return d;
}

DataKind cifar10_data() {
  DataKind d;
  d.name = "cifar10";
  d.arg = "DIR";
  d.help = "CIFAR-10 binary batches (data_batch_1.bin .. data_batch_5.bin in DIR)";
  d.check = [](const ModelConfig& m, OptionStyle style) {
    const std::string what = data_setting("cifar10:DIR", style);
    REGEN_CHECK(m.image_size == 32, what,
                ": CIFAR-10 images are 32x32 but the model is set up for ", m.image_size, "x",
                m.image_size, " (use ", option_setting("image_size", "32", style), ")");
    REGEN_CHECK(m.num_classes >= 10, what, " needs at least 10 classes, model '", m.name, "' has ",
                m.num_classes);
  };
  d.make = [](const std::string& dir, const ModelConfig&, uint64_t seed, OptionStyle style) {
    return std::unique_ptr<DataSource>(
        std::make_unique<Cifar10>(dir, data_setting("cifar10:" + dir, style), seed));
  };
  d.files = [](const std::string& dir) {
    std::vector<std::string> files;
    for (int i = 1; i <= 5; ++i) files.push_back(dir + "/data_batch_" + std::to_string(i) + ".bin");
    files.push_back(dir + "/test_batch.bin");
    return files;
  };
  d.held_out = "test_batch.bin in DIR";
  d.make_eval = [](const std::string& dir, const ModelConfig&, uint64_t, double,
                   OptionStyle style) {
    return cifar_eval(dir, data_setting("cifar10:" + dir, style));
  };
  return d;
}

DataKind synthetic_tokens_data() {
  DataKind d;
  d.name = "synthetic";
  d.help = "synthetic token motifs: 8 tokens repeated along the sequence (the default)";
  d.make = [](const std::string&, const ModelConfig& m, uint64_t seed, OptionStyle) {
    return std::unique_ptr<DataSource>(std::make_unique<SyntheticTokens>(m, seed));
  };
  d.held_out = "256 synthetic sequences no training step draws";
  d.make_eval = [](const std::string&, const ModelConfig& m, uint64_t seed, double, OptionStyle) {
    return synthetic_eval(std::make_unique<SyntheticTokens>(m, seed), 256);
  };
  return d;
}

DataKind text_data() {
  DataKind d;
  d.name = "text";
  d.arg = "FILE";
  d.help = "a UTF-8 text file as byte tokens (needs a vocabulary of 256 or more)";
  d.check = [](const ModelConfig& m, OptionStyle style) {
    // Byte tokens take the values 0..255: the embedding and the head need 256 rows.
    REGEN_CHECK(m.vocab >= 256, data_setting("text:FILE", style),
                " feeds byte tokens (0..255), but model '", m.name, "' has a vocabulary of ",
                m.vocab, ": pass ", option_setting("vocab", "256", style), " or more");
  };
  d.make = [](const std::string& path, const ModelConfig& m, uint64_t seed, OptionStyle style) {
    return std::unique_ptr<DataSource>(
        std::make_unique<TextBytes>(path, data_setting("text:" + path, style), m, seed));
  };
  d.held_out = "the last part of FILE (--eval-split, 10% by default), which training then skips";
  d.make_eval = [](const std::string& path, const ModelConfig& m, uint64_t, double holdout,
                   OptionStyle style) {
    return text_eval(path, data_setting("text:" + path, style), m, holdout);
  };
  d.make_split = [](const std::string& path, const ModelConfig& m, uint64_t seed, double holdout,
                    OptionStyle style) {
    return std::unique_ptr<DataSource>(
        std::make_unique<TextBytes>(path, data_setting("text:" + path, style), m, seed, holdout));
  };
  return d;
}

ModelInput image_classifier_input(int64_t min_image_size) {
  ModelInput in;
  in.help = "images (N, 3, S, S) f32 with class labels (N) i64";
  in.batch = [](const ModelConfig& c, int64_t n) {
    return BatchSpec{{{n, 3, c.image_size, c.image_size}, DType::f32}, {{n}, DType::i64}};
  };
  in.data = {synthetic_images_data(), cifar10_data()};
  in.metrics = {"accuracy"};
  ModelOption size = integer_option("image_size", "input height and width (default: the preset's)",
                                    OptionRange::integers(1), &ModelConfig::image_size);
  size.sizes_step = true;
  ModelOption classes =
      integer_option("num_classes", "classes (default: the preset's)",
                     OptionRange::integers(2, 1 << 24), &ModelConfig::num_classes);
  classes.sizes_parameters = true;
  in.options = {size, classes};
  if (min_image_size > 1) {
    in.check = [min_image_size](const ModelConfig& c, int64_t, OptionStyle style) {
      REGEN_CHECK(c.image_size >= min_image_size,
                  option_setting("image_size", std::to_string(c.image_size), style),
                  " is too small for model '", c.name, "' (at least ", min_image_size, ")");
    };
  }
  return in;
}

void check_lm_head_recompute(const ModelConfig& c) {
  REGEN_CHECK(c.head_recompute == 0 || c.head_recompute == 1, c.name, ": head_recompute ",
              c.head_recompute, " must be 0 (gradients in the forward) or 1 (recomputed logits)");
  REGEN_CHECK(c.head_recompute == 0 || c.head_chunk_rows >= 0, c.name,
              ": head_recompute 1 recomputes the fused head's logits, yet head_chunk_rows ",
              c.head_chunk_rows, " asks for the unfused head (lm_head_chunk -1)");
}

void check_lm_targets(const ModelConfig& c, const Tensor& tokens, const Tensor& target) {
  REGEN_CHECK(target.defined() && target.dtype() == DType::i64 && target.shape() == tokens.shape(),
              c.name, ": expected targets i64 ", sh(tokens.shape()), ", got ",
              target.defined() ? target.str() : std::string("nothing"));
}

void check_lm_head_options(const ModelConfig& c, int64_t, OptionStyle style) {
  REGEN_CHECK(c.head_recompute == 0 || c.head_chunk_rows >= 0,
              option_setting("lm_head_recompute", std::to_string(c.head_recompute), style),
              " recomputes the fused LM head's logits in the backward, but ",
              option_setting("lm_head_chunk", std::to_string(c.head_chunk_rows), style),
              " asks for the unfused head (the whole logits, saved as PyTorch saves them): pass ",
              option_setting("lm_head_chunk", "0", style), " (or a row count) with it, or ",
              option_setting("lm_head_recompute", "0", style));
}

ModelOption lm_head_chunk_option() {
  ModelOption head = integer_option(
      "lm_head_chunk",
      "LM head + loss in training: 0 fused and chunked automatically (about 32 MiB of logits per "
      "chunk; the default), N fused with N rows per chunk, -1 unfused (the whole (batch x seq, "
      "vocab) logits, as PyTorch)",
      OptionRange::integers(-1, 2147483647), &ModelConfig::head_chunk_rows);
  head.recorded = true;  // how a run computed its loss; the head's parameters are the same
  return head;
}

ModelOption lm_head_recompute_option() {
  ModelOption o = integer_option(
      "lm_head_recompute",
      "fused LM head in training: 0 computes its gradients in the forward with the loss (the "
      "default; the head weight's f32 gradient is held until the backward), 1 recomputes the "
      "logits in the backward (one product more, and that gradient is not held across the step)",
      OptionRange::integers(0, 1), &ModelConfig::head_recompute);
  o.recorded = true;  // how a run computed its gradients; the parameters are the same
  return o;
}

ModelInput token_lm_input() {
  ModelInput in;
  in.help = "tokens (B, S) i64 with next-token targets (B, S) i64";
  in.batch = [](const ModelConfig& c, int64_t n) {
    return BatchSpec{{{n, c.seq_len}, DType::i64}, {{n, c.seq_len}, DType::i64}};
  };
  in.data = {synthetic_tokens_data(), text_data()};
  in.metrics = {"perplexity"};
  ModelOption seq = integer_option("seq_len", "sequence length (default: the preset's)",
                                   OptionRange::integers(1), &ModelConfig::seq_len);
  seq.sizes_step = true;
  seq.sizes_parameters = true;  // one position embedding per position
  ModelOption vocab = integer_option(
      "vocab", "vocabulary size (default: the preset's; text data needs at least 256)",
      OptionRange::integers(2), &ModelConfig::vocab);
  vocab.sizes_parameters = true;
  in.options = {seq, vocab};
  return in;
}

}  // namespace regen
