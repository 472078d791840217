// Regex pre-tokenizer for byte-level BPE: splits text into words with the GPT-2 / Llama-3 /
// Qwen2 patterns (Unicode classes via PCRE2 in UTF + UCP mode, JIT-compiled). Invalid UTF-8 in
// the input never matches a pattern character (PCRE2_MATCH_INVALID_UTF), so such bytes end up
// in words of their own instead of failing the match.
//
// Thread-safety: immutable after Init(); Split is const and thread-safe (match data per call).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "chorus/base/status.h"

namespace chorus::tokenizer::internal {

// HF tokenizers ByteLevel(use_regex=true) / llama.cpp LLAMA_VOCAB_PRE_TYPE_GPT2.
inline constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// Llama 3 (llama.cpp "llama-bpe").
inline constexpr std::string_view kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Qwen2 (llama.cpp "qwen2"): like Llama 3 but single digits.
inline constexpr std::string_view kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

struct PreTokenizerStep {
  std::string pattern;          // PCRE2 syntax
  bool remove_matches = false;  // HF Split behavior "Removed" (else "Isolated")
};

class PreTokenizer {
 public:
  // Compiles every step; errors name the offending pattern.
  Status Init(const std::vector<PreTokenizerStep>& steps);
  bool empty() const { return steps_.empty(); }

  // Splits `text` into words (views into `text`), applying the steps in order; with no steps the
  // whole text is one word. Empty words are dropped.
  void Split(std::string_view text, std::vector<std::string_view>* words) const;

 private:
  struct Compiled;
  std::vector<std::shared_ptr<const Compiled>> steps_;
};

}  // namespace chorus::tokenizer::internal
