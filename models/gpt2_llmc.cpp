// llm.c's checkpoint and token-shard formats (gpt2_llmc.h).
#include "regen/models/gpt2_llmc.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "regen/core/half.h"
#include "regen/core/io.h"
#include "regen/models/data.h"
#include "regen/models/gpt2.h"

namespace regen {

namespace {

constexpr int64_t kHeaderInts = 256;
constexpr int64_t kHeaderBytes = kHeaderInts * 4;

// The first 256 int32 of a file of `size` bytes whose first bytes are `bytes`.
std::vector<int32_t> header_of(const std::string& bytes, int64_t size, const std::string& what,
                               const std::string& path) {
  REGEN_CHECK(size >= kHeaderBytes && static_cast<int64_t>(bytes.size()) >= kHeaderBytes, what,
              " '", path, "' has ", size, " bytes, less than its header of 256 int32 (1024 bytes)");
  std::vector<int32_t> h(kHeaderInts);
  std::memcpy(h.data(), bytes.data(), kHeaderBytes);
  return h;
}

// The per-layer parameter kinds of a block, in llm.c's order.
const std::vector<std::string>& layer_kinds() {
  static const std::vector<std::string> kinds = {
      "ln_1.weight",        "ln_1.bias",        "attn.c_attn.weight", "attn.c_attn.bias",
      "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight",        "ln_2.bias",
      "mlp.c_fc.weight",    "mlp.c_fc.bias",    "mlp.c_proj.weight",  "mlp.c_proj.bias"};
  return kinds;
}

// The parameter names in llm.c's order for L layers.
std::vector<std::string> llmc_order(int64_t layers) {
  std::vector<std::string> out = {"wte.weight", "wpe.weight"};
  for (const std::string& kind : layer_kinds()) {
    for (int64_t l = 0; l < layers; ++l) out.push_back("h." + std::to_string(l) + "." + kind);
  }
  out.push_back("ln_f.weight");
  out.push_back("ln_f.bias");
  return out;
}

int64_t parameter_count(const LlmcHeader& h) {
  const int64_t C = h.channels;
  return h.padded_vocab * C + h.max_seq_len * C + h.layers * (12 * C * C + 13 * C) + 2 * C;
}

// `bytes`: the file's first bytes (its header at least, or all of it); `size`: the file's size.
LlmcHeader parse_header(const std::string& bytes, int64_t size, const std::string& path) {
  const std::vector<int32_t> v = header_of(bytes, size, "llm.c checkpoint", path);
  const std::string who = "llm.c checkpoint '" + path + "'";
  REGEN_CHECK(v[0] == kLlmcCheckpointMagic, who, ": bad magic ", v[0], " (expected ",
              kLlmcCheckpointMagic, "; a token shard has ", kLlmcTokensMagic, ")");
  REGEN_CHECK(v[1] == 3 || v[1] == 5, who, ": version ", v[1],
              " is not one regen reads (3: float32, 5: bfloat16, both with a padded vocabulary)");
  LlmcHeader h;
  h.version = v[1];
  h.max_seq_len = v[2];
  h.vocab = v[3];
  h.layers = v[4];
  h.heads = v[5];
  h.channels = v[6];
  h.padded_vocab = v[7];
  REGEN_CHECK(h.max_seq_len > 0 && h.vocab > 0 && h.layers > 0 && h.heads > 0 && h.channels > 0,
              who, ": sizes must be positive (maxT ", h.max_seq_len, ", V ", h.vocab, ", L ",
              h.layers, ", NH ", h.heads, ", C ", h.channels, ")");
  REGEN_CHECK(h.channels % h.heads == 0, who, ": width ", h.channels, " is not divisible by ",
              h.heads, " heads");
  REGEN_CHECK(h.padded_vocab >= h.vocab, who, ": padded vocabulary ", h.padded_vocab,
              " is smaller than the vocabulary ", h.vocab);
  REGEN_CHECK(h.channels <= (1 << 16) && h.layers <= (1 << 12) && h.max_seq_len <= (1 << 24) &&
                  h.padded_vocab <= (1 << 24),
              who, ": sizes too large to be a GPT-2 (maxT ", h.max_seq_len, ", Vp ", h.padded_vocab,
              ", L ", h.layers, ", C ", h.channels, ")");
  const int64_t elem = h.version == 3 ? 4 : 2;
  const int64_t want = kHeaderBytes + parameter_count(h) * elem;
  REGEN_CHECK(size == want, who, " has ", size, " bytes, but its header (maxT ", h.max_seq_len,
              ", V ", h.vocab, ", L ", h.layers, ", NH ", h.heads, ", C ", h.channels, ", Vp ",
              h.padded_vocab, ", ", h.version == 3 ? "float32" : "bfloat16", ") needs ", want,
              size < want ? " (truncated)" : "");
  return h;
}

const GPT2& as_gpt2(const Model& model, const std::string& path) {
  const GPT2* g = dynamic_cast<const GPT2*>(&model);
  REGEN_CHECK(g != nullptr, "llm.c checkpoint '", path, "': model '", model.config().name,
              "' is not a GPT-2 (llm.c's checkpoints hold GPT-2 weights only)");
  return *g;
}

std::string model_sizes(const ModelConfig& c, int64_t padded) {
  return "vocab " + std::to_string(c.vocab) + " (padded " + std::to_string(padded) + "), seq_len " +
         std::to_string(c.seq_len) + ", layers " + std::to_string(c.layers) + ", heads " +
         std::to_string(c.heads) + ", d_model " + std::to_string(c.d_model);
}

}  // namespace

bool is_llmc_checkpoint_path(const std::string& path) {
  return path.size() >= 4 && path.compare(path.size() - 4, 4, ".bin") == 0;
}

LlmcHeader read_llmc_header(const std::string& path) {
  // The header and the size only: the parameters are not read.
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  REGEN_CHECK(in.good() && std::filesystem::is_regular_file(path), "llm.c checkpoint '", path,
              "': cannot open it as a file");
  const int64_t size = static_cast<int64_t>(in.tellg());
  std::string head(static_cast<size_t>(std::min<int64_t>(size, kHeaderBytes)), '\0');
  in.seekg(0);
  in.read(&head[0], static_cast<std::streamsize>(head.size()));
  REGEN_CHECK(in.good() || head.empty(), "llm.c checkpoint '", path, "': cannot read it");
  return parse_header(head, size, path);
}

ModelConfig gpt2_config_from_llmc(const std::string& path, ModelConfig base) {
  const LlmcHeader h = read_llmc_header(path);
  base.vocab = h.vocab;
  base.seq_len = h.max_seq_len;
  base.layers = h.layers;
  base.heads = h.heads;
  base.d_model = h.channels;
  base.ff = 4 * h.channels;
  return base;
}

void load_llmc_checkpoint(Model& model, const std::string& path) {
  const GPT2& g = as_gpt2(model, path);
  const std::string bytes = read_file(path);
  const LlmcHeader h = parse_header(bytes, static_cast<int64_t>(bytes.size()), path);
  const ModelConfig& c = model.config();
  REGEN_CHECK(h.vocab == c.vocab && h.padded_vocab == g.padded_vocab() &&
                  h.max_seq_len == c.seq_len && h.layers == c.layers && h.heads == c.heads &&
                  h.channels == c.d_model && c.ff == 4 * c.d_model,
              "llm.c checkpoint '", path, "' holds a GPT-2 of vocab ", h.vocab, " (padded ",
              h.padded_vocab, "), seq_len ", h.max_seq_len, ", layers ", h.layers, ", heads ",
              h.heads, ", d_model ", h.channels, "; model '", c.name, "' has ",
              model_sizes(c, g.padded_vocab()));
  const NamedTensors params = model.named_parameters();
  auto find = [&](const std::string& name) -> const Tensor& {
    for (const auto& kv : params) {
      if (kv.first == name) return kv.second;
    }
    REGEN_FAIL("llm.c checkpoint '", path, "': model '", c.name, "' has no parameter ", name);
  };
  NamedTensors state;
  const char* at = bytes.data() + kHeaderBytes;
  for (const std::string& name : llmc_order(h.layers)) {
    const Tensor& p = find(name);
    Tensor host = empty(p.shape(), DType::f32, Device::cpu());
    float* dst = host.data<float>();
    const int64_t n = p.numel();
    if (h.version == 3) {
      std::memcpy(dst, at, static_cast<size_t>(n) * 4);
      at += n * 4;
    } else {
      for (int64_t i = 0; i < n; ++i) {
        uint16_t b;
        std::memcpy(&b, at + 2 * i, 2);
        dst[i] = half::from_bf16(b);
      }
      at += n * 2;
    }
    for (int64_t i = 0; i < n; ++i) {
      REGEN_CHECK(std::isfinite(dst[i]), "llm.c checkpoint '", path, "': ", name, " element ", i,
                  " is not finite (", dst[i], ")");
    }
    state.emplace_back(name, host);
  }
  model.load_state_dict(state, /*strict=*/true);
}

void save_llmc_checkpoint(const Model& model, const std::string& path) {
  const GPT2& g = as_gpt2(model, path);
  const ModelConfig& c = model.config();
  REGEN_CHECK(c.ff == 4 * c.d_model, "llm.c checkpoint '", path, "': model '", c.name,
              "' has a feed-forward width ", c.ff, ", not 4 x d_model (", 4 * c.d_model,
              ") as llm.c's format assumes");
  const int64_t limit = std::numeric_limits<int32_t>::max();
  REGEN_CHECK(c.seq_len <= limit && c.vocab <= limit && g.padded_vocab() <= limit,
              "llm.c checkpoint '", path, "': sizes do not fit its int32 header (",
              model_sizes(c, g.padded_vocab()), ")");
  std::vector<int32_t> header(kHeaderInts, 0);
  header[0] = kLlmcCheckpointMagic;
  header[1] = 3;
  header[2] = static_cast<int32_t>(c.seq_len);
  header[3] = static_cast<int32_t>(c.vocab);
  header[4] = static_cast<int32_t>(c.layers);
  header[5] = static_cast<int32_t>(c.heads);
  header[6] = static_cast<int32_t>(c.d_model);
  header[7] = static_cast<int32_t>(g.padded_vocab());
  const NamedTensors params = model.named_parameters();
  AtomicFileWriter out(path);
  out.write(header.data(), kHeaderBytes);
  for (const std::string& name : llmc_order(c.layers)) {
    const auto it = std::find_if(params.begin(), params.end(),
                                 [&](const auto& kv) { return kv.first == name; });
    REGEN_CHECK(it != params.end(), "llm.c checkpoint '", path, "': model '", c.name,
                "' has no parameter ", name);
    REGEN_CHECK(it->second.dtype() == DType::f32, "llm.c checkpoint '", path, "': ", name, " is ",
                dtype_name(it->second.dtype()), ", not float32");
    const Tensor host = it->second.to(Device::cpu());
    out.write(host.data<float>(), static_cast<uint64_t>(host.numel()) * 4);
  }
  out.commit();
}

// ---- Token shards ----------------------------------------------------------------------------

namespace {
std::vector<uint16_t> parse_tokens(const std::string& bytes, const std::string& path) {
  const std::vector<int32_t> h =
      header_of(bytes, static_cast<int64_t>(bytes.size()), "llm.c token shard", path);
  const std::string who = "llm.c token shard '" + path + "'";
  REGEN_CHECK(h[0] == kLlmcTokensMagic, who, ": bad magic ", h[0], " (expected ", kLlmcTokensMagic,
              "; a checkpoint has ", kLlmcCheckpointMagic, ")");
  REGEN_CHECK(h[1] == 1, who, ": version ", h[1], " is not 1 (uint16 tokens)");
  REGEN_CHECK(h[2] >= 0, who, ": a negative token count ", h[2]);
  const int64_t want = kHeaderBytes + 2 * static_cast<int64_t>(h[2]);
  REGEN_CHECK(static_cast<int64_t>(bytes.size()) == want, who, " has ", bytes.size(),
              " bytes, but its header's ", h[2], " tokens need ", want,
              static_cast<int64_t>(bytes.size()) < want ? " (truncated)" : "");
  std::vector<uint16_t> tokens(static_cast<size_t>(h[2]));
  std::memcpy(tokens.data(), bytes.data() + kHeaderBytes, tokens.size() * 2);
  return tokens;
}
}  // namespace

std::vector<uint16_t> read_llmc_tokens(const std::string& path) {
  return parse_tokens(read_file(path), path);
}

void write_llmc_tokens(const std::string& path, const std::vector<uint16_t>& tokens) {
  REGEN_CHECK(tokens.size() <= static_cast<size_t>(std::numeric_limits<int32_t>::max()),
              "llm.c token shard '", path, "': ", tokens.size(),
              " tokens do not fit its int32 count");
  std::vector<int32_t> header(kHeaderInts, 0);
  header[0] = kLlmcTokensMagic;
  header[1] = 1;
  header[2] = static_cast<int32_t>(tokens.size());
  AtomicFileWriter out(path);
  out.write(header.data(), kHeaderBytes);
  out.write(tokens.data(), tokens.size() * 2);
  out.commit();
}

namespace {

// A shard's tokens, every one checked against the model's vocabulary.
std::vector<uint16_t> shard_tokens(const std::string& path, const std::string& what,
                                   const ModelConfig& m) {
  std::vector<uint16_t> tokens = read_llmc_tokens(path);
  REGEN_CHECK(!tokens.empty(), what, ": '", path, "' holds no tokens");
  const auto top = std::max_element(tokens.begin(), tokens.end());
  REGEN_CHECK(*top < m.vocab, what, ": '", path, "' has token ", *top, " at position ",
              top - tokens.begin(), ", outside the vocabulary of model '", m.name, "' (", m.vocab,
              ")");
  return tokens;
}

// The tokens held out at the end of a shard for evaluation: floor(holdout * count).
int64_t held_out_tokens(size_t count, double holdout) {
  return static_cast<int64_t>(static_cast<double>(count) * holdout);
}

Batch windows_batch(const std::vector<uint16_t>& tokens, int64_t first_token, int64_t n,
                    int64_t seq, Device device) {
  std::vector<int64_t> in(static_cast<size_t>(n * seq)), out(in.size());
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t t = 0; t < seq; ++t) {
      const size_t at = static_cast<size_t>(first_token + i * seq + t);
      in[static_cast<size_t>(i * seq + t)] = tokens[at];
      out[static_cast<size_t>(i * seq + t)] = tokens[at + 1];
    }
  }
  return batch_on_device({{n, seq}, {}, std::move(in)}, {{n, seq}, {}, std::move(out)}, device);
}

class TokenShard final : public DataSource {
 public:
  // With `holdout` > 0, the shard's last floor(holdout * count) tokens are left out (the held-out
  // split).
  TokenShard(const std::string& path, const std::string& what, const ModelConfig& m,
             double holdout = 0)
      : path_(path), seq_(m.seq_len), tokens_(shard_tokens(path, what, m)) {
    held_out_ = held_out_tokens(tokens_.size(), holdout);
    tokens_.resize(tokens_.size() - static_cast<size_t>(held_out_));
    REGEN_CHECK(static_cast<int64_t>(tokens_.size()) > seq_, what, ": '", path, "' has ",
                tokens_.size(), " tokens", held_out_ > 0 ? " before its held-out tail" : "",
                "; it needs more than the sequence length ", seq_);
    windows_ = (static_cast<int64_t>(tokens_.size()) - 1) / seq_;
  }
  std::string position() const override { return "sample=" + std::to_string(counter_); }
  void set_position(const std::string& p) override {
    const std::string key = "sample=";
    const int64_t v = p.rfind(key, 0) == 0 ? parse_count(p.substr(key.size())) : -1;
    REGEN_CHECK(v >= 0, "data ", describe(), ": cannot read the position '", p,
                "' (expected sample=N, N at most ", INT64_MAX, ")");
    counter_ = static_cast<uint64_t>(v);
  }
  Batch next(int64_t n, Device device) override {
    std::vector<int64_t> in(static_cast<size_t>(n * seq_)), out(in.size());
    for (int64_t i = 0; i < n; ++i) {
      const int64_t start =
          static_cast<int64_t>(counter_++ % static_cast<uint64_t>(windows_)) * seq_;
      for (int64_t t = 0; t < seq_; ++t) {
        in[static_cast<size_t>(i * seq_ + t)] = tokens_[static_cast<size_t>(start + t)];
        out[static_cast<size_t>(i * seq_ + t)] = tokens_[static_cast<size_t>(start + t + 1)];
      }
    }
    return batch_on_device({{n, seq_}, {}, std::move(in)}, {{n, seq_}, {}, std::move(out)}, device);
  }
  std::string describe() const override {
    return "llm.c tokens " + path_ + " (" + std::to_string(tokens_.size()) + " tokens, " +
           std::to_string(windows_) + " windows of " + std::to_string(seq_) +
           (held_out_ > 0 ? ", the last " + std::to_string(held_out_) + " held out" : "") + ")";
  }
  void skip(int64_t samples) override { counter_ += static_cast<uint64_t>(samples); }

 private:
  std::string path_;
  int64_t seq_;
  std::vector<uint16_t> tokens_;
  int64_t held_out_ = 0;
  int64_t windows_ = 0;
  uint64_t counter_ = 0;
};

// The held-out tail of a shard: its windows of seq_len tokens in order.
class TokenEval final : public EvalSource {
 public:
  TokenEval(const std::string& path, const std::string& what, const ModelConfig& m, double holdout)
      : path_(path), seq_(m.seq_len) {
    std::vector<uint16_t> all = shard_tokens(path, what, m);
    const int64_t tail = held_out_tokens(all.size(), holdout);
    tokens_.assign(all.end() - tail, all.end());
    size_ = tail > 0 ? (tail - 1) / seq_ : 0;
    REGEN_CHECK(size_ >= 1, what, ": the held-out last ", tail, " tokens of '", path,
                "' (a fraction ", holdout, " of ", all.size(),
                ") hold no window of the sequence length ", seq_,
                " and its next token: a longer shard, a larger held-out fraction or a shorter "
                "sequence");
  }
  int64_t size() const override { return size_; }
  void reset() override { pos_ = 0; }
  Batch next(int64_t n, Device device) override {
    REGEN_CHECK(n > 0 && pos_ < size_, "evaluation data ", describe(), ": no examples left (",
                size_, " in all)");
    const int64_t take = std::min(n, size_ - pos_);
    Batch b = windows_batch(tokens_, pos_ * seq_, take, seq_, device);
    pos_ += take;
    return b;
  }
  std::string describe() const override {
    return "llm.c tokens " + path_ + " (the last " + std::to_string(tokens_.size()) + " tokens, " +
           std::to_string(size_) + " windows of " + std::to_string(seq_) + ")";
  }

 private:
  std::string path_;
  int64_t seq_;
  std::vector<uint16_t> tokens_;
  int64_t size_ = 0, pos_ = 0;
};

std::string tokens_setting(const std::string& path, OptionStyle style) {
  return option_setting(
      "data", style == OptionStyle::keyword ? "'tokens:" + path + "'" : "tokens:" + path, style);
}

}  // namespace

DataKind llmc_tokens_data() {
  DataKind d;
  d.name = "tokens";
  d.arg = "FILE";
  d.help = "an llm.c token shard (a header of 256 int32, magic 20240520, then uint16 tokens)";
  d.make = [](const std::string& path, const ModelConfig& m, uint64_t, OptionStyle style) {
    return std::unique_ptr<DataSource>(
        std::make_unique<TokenShard>(path, tokens_setting(path, style), m));
  };
  d.held_out = "the last part of FILE (--eval-split, 10% by default), which training then skips";
  d.make_eval = [](const std::string& path, const ModelConfig& m, uint64_t, double holdout,
                   OptionStyle style) {
    return std::unique_ptr<EvalSource>(
        std::make_unique<TokenEval>(path, tokens_setting(path, style), m, holdout));
  };
  d.make_split = [](const std::string& path, const ModelConfig& m, uint64_t, double holdout,
                    OptionStyle style) {
    return std::unique_ptr<DataSource>(
        std::make_unique<TokenShard>(path, tokens_setting(path, style), m, holdout));
  };
  return d;
}

}  // namespace regen
