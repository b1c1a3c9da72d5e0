// llm.c's file formats for GPT-2 (models/gpt2.h), read and written by regen's own code:
//   a checkpoint (gpt2_124M.bin): a header of 256 int32 (magic 20240326, version, maxT, V, L,
//     NH, C, Vp; the rest 0), then the parameters, float32 (version 3) or bfloat16 (version 5,
//     read only), in llm.c's order: wte (Vp, C), wpe (maxT, C), then each of ln_1.weight,
//     ln_1.bias, attn.c_attn.weight, attn.c_attn.bias, attn.c_proj.weight, attn.c_proj.bias,
//     ln_2.weight, ln_2.bias, mlp.c_fc.weight, mlp.c_fc.bias, mlp.c_proj.weight, mlp.c_proj.bias
//     for layers 0..L-1 in turn (one stacked tensor per kind), then ln_f.weight, ln_f.bias. The
//     weights are (out, in), as regen's.
//   a token shard: a header of 256 int32 (magic 20240520, version 1, the token count), then the
//     tokens as uint16.
// Every malformed file is a regen::Error naming the file and what is wrong (magic, version,
// sizes, a size that does not match the model, a token outside the vocabulary).
// `--data tokens:FILE`, and `--load`/`--save` of a .bin file, use these. Tests:
// tests/test_gpt2_llmc.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "regen/models/model.h"

namespace regen {

constexpr int32_t kLlmcCheckpointMagic = 20240326;
constexpr int32_t kLlmcTokensMagic = 20240520;

// A checkpoint's header.
struct LlmcHeader {
  int32_t version = 3;  // 3: float32; 5: bfloat16
  int64_t max_seq_len = 0, vocab = 0, layers = 0, heads = 0, channels = 0, padded_vocab = 0;
};
// Reads and checks a checkpoint's header and its size (the parameters the header implies must
// follow it exactly).
LlmcHeader read_llmc_header(const std::string& path);
// `base` (a GPT-2 preset) with the sizes of the checkpoint at `path`.
ModelConfig gpt2_config_from_llmc(const std::string& path, ModelConfig base);
// Loads the parameters of an llm.c checkpoint into a GPT-2 model (models/gpt2.h) of the same
// sizes; refuses another model, other sizes or weights that are not finite, before changing any.
void load_llmc_checkpoint(Model& model, const std::string& path);
// Writes the model's parameters as an llm.c checkpoint (version 3, float32), atomically.
void save_llmc_checkpoint(const Model& model, const std::string& path);

// A token shard's tokens.
std::vector<uint16_t> read_llmc_tokens(const std::string& path);
void write_llmc_tokens(const std::string& path, const std::vector<uint16_t>& tokens);

// `--data tokens:FILE`: an llm.c token shard. Sample k is the window of seq_len tokens that
// starts at token (k mod W) * seq_len, W = (count - 1) / seq_len, with its next tokens as
// targets: B consecutive samples are llm.c's batch of B * T + 1 consecutive tokens. Its held-out
// split (--eval-every) is the shard's last --eval-split fraction, in windows, which training then
// skips. Refuses a shard with a token at or above the model's vocabulary.
DataKind llmc_tokens_data();

// Whether `path` names an llm.c checkpoint by its extension (.bin).
bool is_llmc_checkpoint_path(const std::string& path);

}  // namespace regen
