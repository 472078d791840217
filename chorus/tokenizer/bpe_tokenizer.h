// BpeTokenizer: Chorus's own BPE engine behind every non-libsentencepiece tokenizer:
//   * "spm-bpe"  — SentencePiece-style BPE over characters with "▁" for spaces and byte
//                  fallback (tokenizer.json BPE + Prepend/Replace normalizer or Metaspace;
//                  GGUF tokenizer.ggml.model == "llama", merges derived from scores);
//   * "byte-bpe" — GPT-2 byte-level BPE with a regex pre-tokenizer (tokenizer.json ByteLevel,
//                  vocab.json + merges.txt, GGUF tokenizer.ggml.model == "gpt2");
//   * "llama2c"  — the llama2.c tokenizer.bin (scores, " " for spaces, byte tokens at 3..258).
//
// The merge loop is the classic linked list of symbols plus a priority queue of adjacent pairs
// keyed by (priority, left position): O(n log n) per word instead of rescanning every pair per
// merge. Pairs come from a hash map (left id, right id) -> (merged id, priority), built once:
// from the merges list (priority = rank) or, for score-based vocabularies, from every split of
// every piece into two pieces (priority = -score of the merged piece). Ties go to the leftmost
// pair, as in SentencePiece, llama.cpp, llama2.c and HF tokenizers.
//
// Thread-safety: immutable after construction; Encode/Decode are const and thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "chorus/base/status.h"
#include "chorus/tokenizer/added_tokens.h"
#include "chorus/tokenizer/pretokenizer.h"
#include "chorus/tokenizer/tokenizer.h"

namespace chorus::tokenizer::internal {

// GGUF/SentencePiece token types (llama.cpp's LLAMA_TOKEN_TYPE_* numbering).
enum class TokenType : uint8_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

enum class BpeMode : uint8_t {
  kSpm,  // characters, spaces as "▁", byte fallback <0xXX>
  kByteLevel,
  kLlama2c,  // characters, spaces as " ", byte tokens at id byte+3
};

// When the "▁"/" " prefix is added to a text segment (HF Prepend normalizer / Metaspace
// prepend_scheme / llama.cpp add_space_prefix / llama2.c dummy prefix).
enum class PrependScheme : uint8_t {
  kNever,
  kFirst,   // only to the segment at the very start of the text
  kAlways,  // to every non-empty text segment (i.e. also after an added token)
};

// Everything needed to build a BpeTokenizer. Filled by the format readers.
struct BpeSpec {
  BpeMode mode = BpeMode::kSpm;
  std::string kind;                 // Tokenizer::kind()
  std::vector<std::string> pieces;  // raw vocabulary strings, index = id
  std::vector<TokenType> types;     // same size as pieces (kNormal when unknown)
  // Explicit merges in rank order (HF / GPT-2 / GGUF gpt2): pairs of raw piece strings.
  std::vector<std::pair<std::string, std::string>> merges;
  // Score-based vocabularies (SentencePiece BPE / llama2.c): merges derived from scores.
  bool merges_from_scores = false;
  std::vector<float> scores;
  bool byte_fallback = false;
  int32_t unk_id = -1;
  bool fuse_unk = false;
  bool ignore_merges = false;  // HF: a word that is itself in the vocab is not split
  PrependScheme prepend = PrependScheme::kNever;
  // Metaspace semantics: no prefix when the (space-replaced) segment already starts with "▁".
  bool prepend_only_if_missing = false;
  bool metaspace_split = false;  // Metaspace(split=true): a word starts at every "▁"
  bool byte_level_add_prefix_space = false;
  std::vector<PreTokenizerStep> pre_steps;  // byte-level regex splits
  std::vector<AddedToken> added;            // matched in the text before the model runs
  bool strip_leading_space = false;         // decode: drop the first " " of the text (SPM decoders)
  bool llama2c_strip_after_bos_only = false;
};

// (left id, right id) -> merge result: open addressing with linear probing. The merge loop does
// one lookup per adjacent pair, so this is the hot data structure of encoding.
struct MergeInfo {
  int32_t merged;
  float priority;  // lower merges first
};
class PairTable {
 public:
  // Inserts unless `key` is present (the first insertion wins).
  void Insert(uint64_t key, MergeInfo value);
  const MergeInfo* Find(uint64_t key) const {
    if (keys_.empty()) return nullptr;
    for (size_t i = Hash(key) & mask_;; i = (i + 1) & mask_) {
      if (keys_[i] == key) return &values_[i];
      if (keys_[i] == kEmpty) return nullptr;
    }
  }
  size_t size() const { return size_; }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};  // ids are < 2^24, so never a real key
  static uint64_t Hash(uint64_t x) {                // splitmix64 finalizer
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
  }
  void Grow();
  std::vector<uint64_t> keys_;
  std::vector<MergeInfo> values_;
  size_t mask_ = 0;
  size_t size_ = 0;
};

class BpeTokenizer final : public Tokenizer {
 public:
  static Result<std::unique_ptr<BpeTokenizer>> Create(BpeSpec spec);

  std::vector<int32_t> Encode(std::string_view text, const EncodeOptions& opts) const override;
  std::string TokenBytes(int32_t prev_id, int32_t id, bool include_special) const override;
  std::string_view Piece(int32_t id) const override;
  int32_t vocab_size() const override { return static_cast<int32_t>(pieces_.size()); }
  std::string_view kind() const override { return kind_; }
  std::optional<int32_t> PieceToId(std::string_view piece) const override;

  TokenType type(int32_t id) const { return types_[id]; }
  const AddedTokenMatcher& added() const { return added_; }
  BpeMode mode() const { return mode_; }
  int32_t unk_id() const { return unk_id_; }

  // A spec that rebuilds an equivalent tokenizer (Create(ToSpec()) encodes and decodes the same):
  // the full vocabulary (added tokens included, with the types Build gave them), the merges in
  // rank order or the scores, and every option. Used to export the vocabulary (export.h).
  BpeSpec ToSpec() const;

  // Encodes one text segment without added-token splitting or BOS (exposed for tests).
  void EncodeSegment(std::string_view text, bool at_text_start, std::vector<int32_t>* out) const;

 private:
  BpeTokenizer() = default;
  Status Build(BpeSpec spec);
  // BPE over one pre-tokenized word (internal form: "▁"-escaped text, or raw bytes).
  void EncodeWord(std::string_view word, std::vector<int32_t>* out) const;
  const MergeInfo* FindMerge(int32_t left, int32_t right) const;
  int32_t InternalLookup(std::string_view s) const;

  BpeMode mode_ = BpeMode::kSpm;
  std::string kind_;
  std::vector<std::string> pieces_;
  std::vector<TokenType> types_;
  std::vector<std::string> decoded_;  // bytes each token contributes to the text
  std::unordered_map<std::string, int32_t> raw_to_id_;
  // Lookup by internal form: the piece for SPM/llama2c, the decoded bytes for byte-level.
  std::unordered_map<std::string, int32_t> internal_to_id_;
  PairTable merges_;
  // Kept for ToSpec(): explicit merges as (left id, right id) in rank order, or the scores of
  // score-based vocabularies (empty otherwise); the pre-tokenizer steps; the spec's byte_fallback.
  std::vector<std::pair<int32_t, int32_t>> merge_ids_;
  std::vector<float> scores_;
  std::vector<PreTokenizerStep> pre_steps_;
  bool merges_from_scores_ = false;
  bool spec_byte_fallback_ = false;
  int32_t byte_ids_[256];   // byte-level: id of each byte; SPM: id of <0xXX> (or -1)
  int32_t ascii_ids_[128];  // SPM/llama2c: id of each one-byte character piece (or -1)  //
                            // byte-level: id of each byte; SPM: id of <0xXX> (or -1)
  bool byte_fallback_ = false;
  int32_t unk_id_ = -1;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;
  PrependScheme prepend_ = PrependScheme::kNever;
  bool prepend_only_if_missing_ = false;
  bool metaspace_split_ = false;
  bool byte_level_add_prefix_space_ = false;
  PreTokenizer pre_;
  AddedTokenMatcher added_;
  bool strip_leading_space_ = false;
  bool llama2c_strip_after_bos_only_ = false;
};

}  // namespace chorus::tokenizer::internal
