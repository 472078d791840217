// Added tokens ("<|im_start|>", "</s>", phi-2's whitespace runs, ...): matched in the raw text
// before the model runs, leftmost-longest (as HF tokenizers' AddedVocabulary and llama.cpp's
// special-token partitioning do).
//
// Thread-safety: immutable after Build(); Split is const and thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace chorus::tokenizer::internal {

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = true;  // matched only when EncodeOptions::parse_special; hidden when decoding
  bool lstrip = false;  // swallow whitespace to the left of the match
  bool rstrip = false;  // swallow whitespace to the right of the match
};

// A piece of the input: raw text (id < 0) or one added token (id >= 0).
struct Segment {
  std::string_view text;
  int32_t id = -1;
  size_t offset = 0;  // byte offset of `text` in the input
};

class AddedTokenMatcher {
 public:
  // Tokens with empty content are ignored. A later duplicate of a content string is ignored.
  void Build(std::vector<AddedToken> tokens);
  bool empty() const { return tokens_.empty(); }
  const std::vector<AddedToken>& tokens() const { return tokens_; }

  // Splits `text` at added tokens (non-special ones always, special ones when `parse_special`).
  // Empty text segments are dropped.
  std::vector<Segment> Split(std::string_view text, bool parse_special) const;

 private:
  std::vector<AddedToken> tokens_;
  // For each first byte, indices into tokens_, longest content first.
  std::array<std::vector<uint32_t>, 256> by_first_byte_;
};

}  // namespace chorus::tokenizer::internal
