// Data sources (data.h).
#include "regen/models/data.h"

#include <sys/stat.h>
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "regen/core/io.h"
#include "regen/core/philox.h"

namespace regen {
namespace {

// Every batch's blocks, in this order, category and tags (make_shape_source allocates the same).
constexpr const char* kInputTag = "batch.input";
constexpr const char* kTargetTag = "batch.target";

Batch on_device(std::vector<float>* images, const Shape& ishape, std::vector<int64_t>* tokens,
                const Shape& tshape, std::vector<int64_t> targets, const Shape& yshape,
                Device device) {
  CategoryScope cat(Category::input);
  Batch b;
  {
    TagScope tag(kInputTag);
    b.input = images ? from_vector<float>(*images, ishape, device)
                     : from_vector<int64_t>(*tokens, tshape, device);
  }
  TagScope tag(kTargetTag);
  b.target = from_vector<int64_t>(targets, yshape, device);
  return b;
}

class ShapeSource final : public DataSource {
 public:
  explicit ShapeSource(const ModelConfig& m) : m_(m) {}
  Batch next(int64_t n, Device device) override {
    const bool images = m_.family == ModelFamily::resnet;
    CategoryScope cat(Category::input);
    Batch b;
    {
      TagScope tag(kInputTag);
      b.input = images ? empty({n, 3, m_.image_size, m_.image_size}, DType::f32, device)
                       : empty({n, m_.seq_len}, DType::i64, device);
    }
    TagScope tag(kTargetTag);
    b.target = empty(images ? Shape{n} : Shape{n, m_.seq_len}, DType::i64, device);
    return b;
  }
  std::string describe() const override { return "shapes only (a dry run)"; }

 private:
  ModelConfig m_;
};

// Images: per-class channel offsets plus noise, so a network can learn the labels.
class SyntheticImages final : public DataSource {
 public:
  SyntheticImages(const ModelConfig& m, uint64_t seed) : m_(m), seed_(seed) {}
  Batch next(int64_t n, Device device) override {
    const int64_t hw = m_.image_size * m_.image_size;
    std::vector<float> img(static_cast<size_t>(n * 3 * hw));
    std::vector<int64_t> labels(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      const uint64_t sample = counter_++;
      labels[i] = static_cast<int64_t>(philox_word(seed_, 1, sample) % m_.num_classes);
      for (int64_t c = 0; c < 3; ++c) {
        // A fixed offset per (class, channel) in [-1, 1).
        const float offset = 2.0f * philox_uniform01(philox_word(
                                        seed_, 2, static_cast<uint64_t>(labels[i] * 3 + c))) -
                             1.0f;
        float* p = img.data() + (i * 3 + c) * hw;
        for (int64_t e = 0; e < hw; ++e) {
          const uint64_t idx = (sample * 3 + static_cast<uint64_t>(c)) * static_cast<uint64_t>(hw) +
                               static_cast<uint64_t>(e);
          p[e] = offset + (philox_uniform01(philox_word(seed_, 3, idx)) - 0.5f);
        }
      }
    }
    return on_device(&img, {n, 3, m_.image_size, m_.image_size}, nullptr, {}, std::move(labels),
                     {n}, device);
  }
  std::string describe() const override {
    return "synthetic images " + std::to_string(m_.image_size) + "x" +
           std::to_string(m_.image_size) + ", " + std::to_string(m_.num_classes) +
           " classes (seed " + std::to_string(seed_) + ")";
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
    return on_device(nullptr, {}, &in, {n, S}, std::move(out), {n, S}, device);
  }
  std::string describe() const override {
    return "synthetic token motifs, sequence " + std::to_string(m_.seq_len) + ", vocabulary " +
           std::to_string(m_.vocab) + " (seed " + std::to_string(seed_) + ")";
  }

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

class Cifar10 final : public DataSource {
 public:
  static constexpr int64_t kRecord = 1 + 3 * 32 * 32;

  Cifar10(const std::string& dir, const ModelConfig& m, uint64_t seed) : dir_(dir), seed_(seed) {
    REGEN_CHECK(m.family == ModelFamily::resnet, "--data cifar10:", dir, " is image data; model '",
                m.name, "' is a Transformer (use text:FILE)");
    REGEN_CHECK(m.image_size == 32, "--data cifar10:", dir, ": CIFAR-10 images are 32x32 but the ",
                "model is set up for ", m.image_size, "x", m.image_size, " (use --image-size 32)");
    REGEN_CHECK(m.num_classes >= 10, "--data cifar10: needs at least 10 classes, model '", m.name,
                "' has ", m.num_classes);
    struct stat st;
    REGEN_CHECK(::stat(dir.c_str(), &st) == 0, "--data cifar10:", dir, ": cannot open '", dir,
                "': ", std::strerror(errno));
    REGEN_CHECK(
        S_ISDIR(st.st_mode), "--data cifar10:", dir, ": '", dir,
        "' is not a directory (expected the folder of data_batch_1.bin .. data_batch_5.bin)");
    for (int i = 1; i <= 5; ++i) {
      const std::string f = dir + "/data_batch_" + std::to_string(i) + ".bin";
      if (!file_exists(f)) continue;
      std::string bytes = read_file(f);
      REGEN_CHECK(!bytes.empty() && bytes.size() % kRecord == 0, "CIFAR-10 file '", f, "' has ",
                  bytes.size(), " bytes, not a whole number of ", kRecord,
                  "-byte records (truncated?)");
      for (size_t r = 0; r < bytes.size(); r += kRecord) {
        const unsigned char label = static_cast<unsigned char>(bytes[r]);
        REGEN_CHECK(label < 10, "CIFAR-10 file '", f, "': record ", r / kRecord, " has label ",
                    static_cast<int>(label), " (expected 0..9)");
      }
      data_ += bytes;
      files_ += 1;
    }
    REGEN_CHECK(files_ > 0, "--data cifar10:", dir,
                ": no data_batch_1.bin .. data_batch_5.bin found");
    records_ = static_cast<int64_t>(data_.size()) / kRecord;
    order_.resize(static_cast<size_t>(records_));
    shuffle();
  }

  Batch next(int64_t n, Device device) override {
    static const float mean[3] = {0.4914f, 0.4822f, 0.4465f};
    static const float stdv[3] = {0.2470f, 0.2435f, 0.2616f};
    std::vector<float> img(static_cast<size_t>(n * 3 * 1024));
    std::vector<int64_t> labels(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      if (pos_ == records_) {
        ++epoch_;
        shuffle();
      }
      const unsigned char* rec =
          reinterpret_cast<const unsigned char*>(data_.data()) + order_[pos_++] * kRecord;
      labels[i] = rec[0];
      for (int c = 0; c < 3; ++c) {
        for (int e = 0; e < 1024; ++e) {
          img[(i * 3 + c) * 1024 + e] = (rec[1 + c * 1024 + e] / 255.0f - mean[c]) / stdv[c];
        }
      }
    }
    return on_device(&img, {n, 3, 32, 32}, nullptr, {}, std::move(labels), {n}, device);
  }
  std::string describe() const override {
    return "CIFAR-10 from " + dir_ + " (" + std::to_string(records_) + " images in " +
           std::to_string(files_) + " files)";
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
  TextBytes(const std::string& path, const ModelConfig& m, uint64_t seed)
      : path_(path), seq_(m.seq_len), seed_(seed) {
    REGEN_CHECK(m.family == ModelFamily::transformer, "--data text:", path,
                " is token data; model '", m.name, "' is a ResNet (use cifar10:DIR)");
    REGEN_CHECK(m.vocab >= 256, "--data text:", path, " feeds byte tokens (0..255), but model '",
                m.name, "' has a vocabulary of ", m.vocab, ": pass --vocab 256");
    struct stat st;
    REGEN_CHECK(::stat(path.c_str(), &st) == 0, "--data text:", path, ": cannot open '", path,
                "': ", std::strerror(errno));
    REGEN_CHECK(S_ISREG(st.st_mode), "--data text:", path, ": '", path, "' is ",
                S_ISDIR(st.st_mode) ? "a directory, " : "", "not a regular file");
    text_ = read_file(path);
    REGEN_CHECK(!text_.empty(), "--data text:", path, ": the file is empty");
    REGEN_CHECK(static_cast<int64_t>(text_.size()) > seq_, "text file '", path, "' has ",
                text_.size(), " bytes; it needs more than the sequence length ", seq_);
    const int64_t bad = first_invalid_utf8(text_);
    REGEN_CHECK(bad < 0, "text file '", path, "' is not valid UTF-8 (byte offset ", bad, ")");
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
    return on_device(nullptr, {}, &in, {n, seq_}, std::move(out), {n, seq_}, device);
  }
  std::string describe() const override {
    return "text " + path_ + " (" + std::to_string(text_.size()) + " bytes as byte tokens)";
  }

 private:
  std::string path_;
  int64_t seq_;
  uint64_t seed_;
  uint64_t counter_ = 0;
  std::string text_;
};

}  // namespace

std::unique_ptr<DataSource> make_data_source(const std::string& spec, const ModelConfig& m,
                                             uint64_t seed) {
  if (spec.empty() || spec == "synthetic") {
    if (m.family == ModelFamily::resnet) return std::make_unique<SyntheticImages>(m, seed);
    return std::make_unique<SyntheticTokens>(m, seed);
  }
  const auto colon = spec.find(':');
  const std::string kind = spec.substr(0, colon);
  const std::string arg = colon == std::string::npos ? "" : spec.substr(colon + 1);
  REGEN_CHECK(colon != std::string::npos && !arg.empty() && (kind == "cifar10" || kind == "text"),
              "bad --data '", spec, "': expected synthetic, cifar10:DIR or text:FILE");
  if (kind == "cifar10") return std::make_unique<Cifar10>(arg, m, seed);
  return std::make_unique<TextBytes>(arg, m, seed);
}

std::unique_ptr<DataSource> make_shape_source(const ModelConfig& model) {
  return std::make_unique<ShapeSource>(model);
}

}  // namespace regen
