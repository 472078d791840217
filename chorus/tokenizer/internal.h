// Factories of the concrete tokenizers, shared by the loader, GGUF reader and tests.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "chorus/base/status.h"
#include "chorus/tokenizer/tokenizer.h"

namespace chorus::tokenizer::internal {

// llama2.c tokenizer.bin: int32 max_token_length, then per token {f32 score, i32 len, bytes}
// until the end of the file. BOS = 1, EOS = 2 (llama2.c's convention).
Result<std::unique_ptr<Tokenizer>> Llama2cTokenizerFromBytes(std::string_view bytes,
                                                             std::string_view name);
// True when `bytes` parse exactly as a llama2.c tokenizer (used to detect the format).
bool LooksLikeLlama2cTokenizer(std::string_view bytes);

// A SentencePiece model (tokenizer.model protobuf) through libsentencepiece.
Result<std::unique_ptr<Tokenizer>> SentencePieceFromBytes(std::string_view bytes,
                                                          std::string_view name);

// The serialized ModelProto of a tokenizer made by SentencePieceFromBytes (for export);
// std::nullopt for any other tokenizer.
std::optional<std::string> SentencePieceModelProto(const Tokenizer& tok);

// GPT-2 style vocab.json ({"piece": id}) + merges.txt ("#version" header, "a b" lines).
Result<std::unique_ptr<Tokenizer>> TokenizerFromVocabMerges(std::string_view vocab_json,
                                                            std::string_view merges_txt,
                                                            std::string_view name);

// Applies tokenizer_config.json / special_tokens_map.json / generation_config.json text
// (each may be empty = absent): BOS/EOS ids, add_bos/add_eos, extra special tokens, chat
// template. `name` names the file in errors.
Status ApplyTokenizerConfigJson(Tokenizer* tok, std::string_view json, std::string_view name);
Status ApplySpecialTokensMapJson(Tokenizer* tok, std::string_view json, std::string_view name);
Status ApplyGenerationConfigJson(Tokenizer* tok, std::string_view json, std::string_view name);

}  // namespace chorus::tokenizer::internal
