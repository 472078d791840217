// Token-level matching of a byte-level grammar (docs/structured_outputs.md).
//
// Vocabulary: every token's bytes (as the detokenizer emits them after an ordinary token) in a
// prefix tree, built once per tokenizer. Special tokens and tokens without bytes are never
// allowed; the end-of-generation tokens are allowed exactly where the grammar accepts.
//
// Matcher: one per sequence. Its state is a set of parse stacks (llama.cpp's grammar design:
// each stack is the list of grammar positions still to match, its top always a byte class),
// with three changes that make it cheap per token:
//   * stacks are hash-consed (a stack is a node id: its top position plus the id of the stack
//     below), so a set of stacks is a sorted vector of ints and equal sets are equal ids;
//   * a rule referenced last in an alternative replaces its caller's frame instead of pushing on
//     top of it, so repetitions (right-recursive auxiliary rules) keep the stacks flat and the
//     set of stacks inside e.g. a JSON string returns to the same id after every character;
//   * (set id, byte) → set id transitions are memoised, i.e. the matcher builds, lazily, the
//     part of the grammar's DFA that the row visits; the allowed-token mask of a set id is
//     cached too (bounded), so a state seen before costs a copy of its mask.
// The mask walks the vocabulary's prefix tree once: a subtree whose prefix is rejected is
// skipped, so shared prefixes are matched once. Why stacks rather than Earley: the stack sets
// of JSON-schema grammars stay tiny (one or a few stacks), a set is a cheap memo key, and there
// is no per-byte chart to build; the price is that left-recursive grammars are rejected at
// compile time (Grammar::FromAst) and highly ambiguous grammars may hold many stacks — a set is
// capped at kMaxStacks (extra stacks dropped: the mask can only get narrower, never admit a
// byte the grammar rejects).
//
// Thread-safety: Vocabulary is immutable (shared by all matchers). A Matcher is used by one
// thread at a time; copies are independent (n > 1 forks copy the state).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "chorus/base/status.h"
#include "chorus/grammar/grammar.h"

namespace chorus::tokenizer {
class Tokenizer;
}

namespace chorus::grammar {

// One bit per token id.
class TokenMask {
 public:
  TokenMask() = default;
  explicit TokenMask(int64_t n) { Resize(n); }
  void Resize(int64_t n) {
    n_ = n;
    words_.assign(static_cast<size_t>((n + 63) / 64), 0);
  }
  void Clear() { std::fill(words_.begin(), words_.end(), 0); }
  int64_t size() const { return n_; }
  bool Test(int64_t i) const { return (words_[static_cast<size_t>(i >> 6)] >> (i & 63)) & 1; }
  void Set(int64_t i) { words_[static_cast<size_t>(i >> 6)] |= uint64_t{1} << (i & 63); }
  int64_t Count() const;
  const std::vector<uint64_t>& words() const { return words_; }
  std::vector<uint64_t>& words() { return words_; }
  bool operator==(const TokenMask& o) const { return n_ == o.n_ && words_ == o.words_; }

 private:
  int64_t n_ = 0;
  std::vector<uint64_t> words_;
};

class Vocabulary {
 public:
  // `token_bytes[i]`: token i's bytes (empty = never allowed); `eos_ids`: allowed where the
  // grammar accepts; `never`: ids never allowed whatever their bytes (special tokens).
  static std::shared_ptr<const Vocabulary> Create(std::vector<std::string> token_bytes,
                                                  std::vector<int32_t> eos_ids,
                                                  const std::vector<int32_t>& never = {});
  // From a tokenizer; ids in [tok.vocab_size(), n_logits) (padding rows of the model's output
  // matrix) are never allowed.
  static std::shared_ptr<const Vocabulary> FromTokenizer(const tokenizer::Tokenizer& tok,
                                                         int64_t n_logits);

  int64_t size() const { return static_cast<int64_t>(bytes_.size()); }
  const std::string& bytes(int32_t id) const { return bytes_[static_cast<size_t>(id)]; }
  bool IsEos(int32_t id) const;
  const std::vector<int32_t>& eos_ids() const { return eos_; }
  int64_t trie_nodes() const { return static_cast<int64_t>(node_byte_.size()); }

 private:
  friend class Matcher;
  std::vector<std::string> bytes_;
  std::vector<int32_t> eos_;  // sorted
  // Prefix tree in preorder, root excluded: node i consumes node_byte_[i] at depth
  // node_depth_[i] (1-based); its subtree is [i, node_end_[i]); the tokens whose bytes end
  // there are token_ids_[node_tok_[i] .. node_tok_[i + 1]).
  std::vector<uint8_t> node_byte_;
  std::vector<uint16_t> node_depth_;
  std::vector<uint32_t> node_end_;
  std::vector<uint32_t> node_tok_;
  std::vector<int32_t> token_ids_;
  int max_depth_ = 0;
};

namespace detail {

// Open-addressed map from a 64-bit key to an int32, without an allocation per entry (the
// matcher's expansion does one lookup per grammar position it passes, so node-based hash
// tables spent most of its time in malloc). Clear() is O(1): entries carry the epoch they were
// written in.
class FlatIndex {
 public:
  // The value stored for `key`, inserting `value` first when absent; `inserted` tells which.
  int32_t FindOrInsert(uint64_t key, int32_t value, bool* inserted);
  void Clear();

 private:
  void Grow();
  std::vector<uint64_t> keys_;
  std::vector<int32_t> values_;
  std::vector<uint32_t> epochs_;
  uint32_t epoch_ = 1;
  size_t size_ = 0;
};

}  // namespace detail

class Matcher {
 public:
  static constexpr size_t kMaxStacks = 4096;
  // Work bounds: grammar positions one transition may expand, and that one FillMask may expand
  // in total. A grammar whose sets of stacks are huge (e.g. a nullable item repeated thousands
  // of times: every byte may belong to any copy) would otherwise cost seconds per token. Past
  // a bound the expansion stops and what it did not reach is dropped — like kMaxStacks this can
  // only narrow the mask, never admit a byte the grammar rejects — and truncated() says so.
  static constexpr int64_t kMaxStepWork = int64_t{1} << 16;
  static constexpr int64_t kMaxMaskWork = int64_t{1} << 18;

  Matcher(Grammar grammar, std::shared_ptr<const Vocabulary> vocab);

  // The tokens allowed next: those whose bytes keep the output a prefix of the grammar's
  // language, plus the EOS tokens when the output so far is a complete sentence.
  void FillMask(TokenMask* mask);
  // Advances by `token`; false (state unchanged) when the grammar does not allow it. An EOS
  // token is accepted only where the grammar accepts, and ends the matcher (Done()).
  bool Accept(int32_t token);
  // Advances by raw bytes (tests, prefilled text); false (state unchanged) when rejected.
  bool AcceptBytes(std::string_view bytes);
  // The output so far is a complete sentence of the grammar.
  bool CanEnd() const;
  // Nothing more can follow (the grammar is complete, or an EOS was accepted).
  bool Done() const;

  const Vocabulary& vocab() const { return *vocab_; }
  // Benchmarks: turn the per-state mask cache off (every FillMask walks the prefix tree).
  void set_mask_cache(bool on) { mask_cache_on_ = on; }
  // Figures for benchmarks and tests.
  int64_t n_states() const { return static_cast<int64_t>(sets_.size()); }
  int64_t n_stacks() const { return static_cast<int64_t>(nodes_.size()); }
  int64_t mask_cache_hits() const { return mask_hits_; }
  // Transitions (or masks) cut short by kMaxStacks, kMaxStepWork or kMaxMaskWork so far.
  int64_t truncated() const { return truncated_; }
  // Work units (positions expanded + stacks scanned) the last FillMask spent, against
  // kMaxMaskWork.
  int64_t last_mask_work() const { return mask_work_; }

 private:
  struct Node {
    uint32_t pos;
    int32_t parent;  // -1: the bottom of the stack
  };
  int32_t InternNode(uint32_t pos, int32_t parent);
  void Expand(uint32_t pos, int32_t parent, std::vector<int32_t>* out);
  int32_t InternSet(std::vector<int32_t>* stacks);  // sorts; -1 for the empty set
  int32_t Step(int32_t state, uint8_t byte);
  void Compact();

  Grammar grammar_;
  const LoweredGrammar* g_;
  std::shared_ptr<const Vocabulary> vocab_;
  std::vector<Node> nodes_;
  detail::FlatIndex node_ids_;
  std::vector<std::vector<int32_t>> sets_;  // -1 in a set: the empty stack (accepting)
  std::unordered_map<uint64_t, std::vector<int32_t>> set_ids_;  // hash → candidate ids
  std::vector<int32_t> trans_;  // [state * 256 + byte]: -2 unknown, -1 dead
  std::unordered_map<int32_t, std::vector<uint64_t>> mask_cache_;
  size_t mask_cache_bytes_ = 0;
  int64_t mask_hits_ = 0;
  int32_t state_ = -1;
  bool ended_ = false;
  bool mask_cache_on_ = true;
  std::vector<int32_t> scratch_, walk_, step_scratch_;
  detail::FlatIndex expand_seen_;                          // (pos, parent) expanded in this Step
  std::vector<std::pair<uint32_t, int32_t>> expand_todo_;  // Expand's depth-first stack
  int64_t step_work_ = 0;                                  // positions expanded in this Step
  int64_t mask_work_ = 0;  // ... and stacks scanned in this FillMask (reset by FillMask)
  bool in_mask_ = false;
  bool expand_cut_ = false;  // a work bound stopped an expansion of this Step
  int64_t truncated_ = 0;
};

// Brute-force reference for tests: token ids whose bytes, appended to `prefix`, keep it a
// prefix of the grammar's language (checked by an Earley recognizer over the lowered grammar,
// independent of the matcher's stacks), plus EOS ids when `prefix` is a sentence.
TokenMask ReferenceMask(const Grammar& g, const Vocabulary& vocab, std::string_view prefix);
// Earley: 1 when `text` is a sentence, 0 when it is only a viable prefix, -1 when neither.
int ReferenceRecognize(const Grammar& g, std::string_view text);

}  // namespace chorus::grammar
