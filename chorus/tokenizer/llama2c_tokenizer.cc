// The llama2.c tokenizer (.bin written by llama2.c's tokenizer.py export): its encode is
// SentencePiece BPE by scores with a dummy-prefix space and byte fallback to id byte+3, and it
// stores "▁" as a plain space.
#include <cstring>

#include "chorus/tokenizer/bpe_tokenizer.h"
#include "chorus/tokenizer/internal.h"
#include "chorus/tokenizer/utf8.h"

namespace chorus::tokenizer::internal {
namespace {

constexpr int32_t kMaxTokenLength = 1 << 16;

struct Llama2cVocab {
  int32_t max_token_length = 0;
  std::vector<std::string> pieces;
  std::vector<float> scores;
};

Status ParseLlama2c(std::string_view bytes, std::string_view name, Llama2cVocab* v) {
  auto err = [&](const std::string& what) {
    return DataLossError(std::string(name) + ": not a valid llama2.c tokenizer: " + what);
  };
  if (bytes.size() < 4) return err("file shorter than its 4-byte header");
  int32_t max_len;
  std::memcpy(&max_len, bytes.data(), 4);
  if (max_len <= 0 || max_len > kMaxTokenLength) {
    return err("max_token_length " + std::to_string(max_len) + " out of range [1, " +
               std::to_string(kMaxTokenLength) + "]");
  }
  v->max_token_length = max_len;
  size_t pos = 4;
  while (pos < bytes.size()) {
    if (bytes.size() - pos < 8) {
      return err("truncated record of token " + std::to_string(v->pieces.size()) + " at offset " +
                 std::to_string(pos));
    }
    float score;
    int32_t len;
    std::memcpy(&score, bytes.data() + pos, 4);
    std::memcpy(&len, bytes.data() + pos + 4, 4);
    pos += 8;
    if (len < 0 || len > kMaxTokenLength) {
      return err("token " + std::to_string(v->pieces.size()) + " has length " +
                 std::to_string(len));
    }
    if (bytes.size() - pos < static_cast<size_t>(len)) {
      return err("token " + std::to_string(v->pieces.size()) + " (length " + std::to_string(len) +
                 ") runs past the end of the file");
    }
    v->pieces.emplace_back(bytes.substr(pos, len));
    v->scores.push_back(score);
    pos += len;
  }
  if (v->pieces.size() < 3) return err("fewer than 3 tokens (need <unk>, BOS, EOS)");
  return OkStatus();
}

}  // namespace

bool LooksLikeLlama2cTokenizer(std::string_view bytes) {
  Llama2cVocab v;
  return ParseLlama2c(bytes, "", &v).ok();
}

Result<std::unique_ptr<Tokenizer>> Llama2cTokenizerFromBytes(std::string_view bytes,
                                                             std::string_view name) {
  Llama2cVocab v;
  CHORUS_RETURN_IF_ERROR(ParseLlama2c(bytes, name, &v));
  BpeSpec spec;
  spec.mode = BpeMode::kLlama2c;
  spec.kind = "llama2c";
  spec.types.assign(v.pieces.size(), TokenType::kNormal);
  spec.types[0] = TokenType::kUnknown;
  spec.types[1] = TokenType::kControl;
  spec.types[2] = TokenType::kControl;
  for (size_t i = 3; i < v.pieces.size(); ++i) {
    if (ParseBytePiece(v.pieces[i]) >= 0) spec.types[i] = TokenType::kByte;
  }
  spec.pieces = std::move(v.pieces);
  spec.scores = std::move(v.scores);
  spec.merges_from_scores = true;
  spec.prepend = PrependScheme::kFirst;  // llama2.c's dummy prefix, only at the text start
  spec.strip_leading_space = true;
  spec.llama2c_strip_after_bos_only = true;
  auto tok = BpeTokenizer::Create(std::move(spec));
  if (!tok.ok()) return tok.status().WithContext(name);
  std::unique_ptr<Tokenizer> out = std::move(tok).value();
  out->set_bos_id(1);
  // llama2.c's run.c ends generation when the model samples BOS (token 1): its models were
  // trained with BOS between stories and never emit EOS (2). Both stop generation here.
  out->set_eos_ids({2, 1});
  out->set_add_bos(true);
  return out;
}

}  // namespace chorus::tokenizer::internal
