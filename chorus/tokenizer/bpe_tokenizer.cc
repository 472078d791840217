#include "chorus/tokenizer/bpe_tokenizer.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>

#include "chorus/tokenizer/utf8.h"

namespace chorus::tokenizer::internal {
namespace {

constexpr std::string_view kSpmSpace = "\xE2\x96\x81";  // U+2581 "▁"

inline uint64_t PairKey(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

std::string ReplaceAll(std::string_view s, std::string_view from, std::string_view to) {
  std::string out;
  out.reserve(s.size() + s.size() / 4);
  size_t i = 0;
  while (i < s.size()) {
    const size_t j = s.find(from, i);
    if (j == std::string_view::npos) {
      out.append(s.substr(i));
      break;
    }
    out.append(s.substr(i, j - i));
    out.append(to);
    i = j + from.size();
  }
  return out;
}

bool IsSpecialType(TokenType t) {
  return t == TokenType::kControl || t == TokenType::kUnknown || t == TokenType::kUnused;
}

}  // namespace

void PairTable::Grow() {
  std::vector<uint64_t> old_keys = std::move(keys_);
  std::vector<MergeInfo> old_values = std::move(values_);
  const size_t cap = old_keys.empty() ? 1024 : old_keys.size() * 2;
  keys_.assign(cap, kEmpty);
  values_.assign(cap, MergeInfo{-1, 0});
  mask_ = cap - 1;
  size_ = 0;
  for (size_t i = 0; i < old_keys.size(); ++i) {
    if (old_keys[i] != kEmpty) Insert(old_keys[i], old_values[i]);
  }
}

void PairTable::Insert(uint64_t key, MergeInfo value) {
  if ((size_ + 1) * 2 > keys_.size()) Grow();  // load factor <= 1/2
  for (size_t i = Hash(key) & mask_;; i = (i + 1) & mask_) {
    if (keys_[i] == key) return;
    if (keys_[i] == kEmpty) {
      keys_[i] = key;
      values_[i] = value;
      ++size_;
      return;
    }
  }
}

Result<std::unique_ptr<BpeTokenizer>> BpeTokenizer::Create(BpeSpec spec) {
  std::unique_ptr<BpeTokenizer> tok(new BpeTokenizer());
  CHORUS_RETURN_IF_ERROR(tok->Build(std::move(spec)));
  return tok;
}

Status BpeTokenizer::Build(BpeSpec spec) {
  constexpr size_t kMaxVocab = size_t{1} << 24;
  if (spec.pieces.empty()) return InvalidArgumentError("empty vocabulary");
  if (spec.pieces.size() > kMaxVocab) {
    return InvalidArgumentError("vocabulary of " + std::to_string(spec.pieces.size()) +
                                " tokens is too large");
  }
  if (spec.types.empty()) spec.types.assign(spec.pieces.size(), TokenType::kNormal);
  if (spec.types.size() != spec.pieces.size()) {
    return InvalidArgumentError("token type count " + std::to_string(spec.types.size()) +
                                " != vocabulary size " + std::to_string(spec.pieces.size()));
  }
  if (spec.merges_from_scores && spec.scores.size() != spec.pieces.size()) {
    return InvalidArgumentError("score count " + std::to_string(spec.scores.size()) +
                                " != vocabulary size " + std::to_string(spec.pieces.size()));
  }
  mode_ = spec.mode;
  kind_ = std::move(spec.kind);
  byte_fallback_ = spec.byte_fallback;
  fuse_unk_ = spec.fuse_unk;
  ignore_merges_ = spec.ignore_merges;
  prepend_ = spec.prepend;
  prepend_only_if_missing_ = spec.prepend_only_if_missing;
  metaspace_split_ = spec.metaspace_split;
  byte_level_add_prefix_space_ = spec.byte_level_add_prefix_space;
  strip_leading_space_ = spec.strip_leading_space;
  llama2c_strip_after_bos_only_ = spec.llama2c_strip_after_bos_only;
  CHORUS_RETURN_IF_ERROR(pre_.Init(spec.pre_steps));
  pre_steps_ = spec.pre_steps;
  spec_byte_fallback_ = spec.byte_fallback;
  merges_from_scores_ = spec.merges_from_scores;

  // Added tokens may lie beyond the model vocabulary (HF added_tokens): extend it.
  const size_t n_model = spec.pieces.size();
  for (const auto& a : spec.added) {
    if (a.id < 0 || static_cast<size_t>(a.id) >= kMaxVocab) {
      return InvalidArgumentError("added token '" + a.content + "' has invalid id " +
                                  std::to_string(a.id));
    }
    if (static_cast<size_t>(a.id) >= spec.pieces.size()) {
      spec.pieces.resize(a.id + 1);
      spec.types.resize(a.id + 1, TokenType::kUnused);
      if (!spec.scores.empty()) spec.scores.resize(a.id + 1, 0.0f);
    }
  }
  for (const auto& a : spec.added) {
    if (static_cast<size_t>(a.id) >= n_model) spec.pieces[a.id] = a.content;
    if (a.special) {
      spec.types[a.id] = TokenType::kControl;
    } else if (spec.types[a.id] == TokenType::kUnused || static_cast<size_t>(a.id) >= n_model) {
      spec.types[a.id] = TokenType::kUserDefined;
    }
  }
  pieces_ = std::move(spec.pieces);
  types_ = std::move(spec.types);
  const int32_t n = static_cast<int32_t>(pieces_.size());
  unk_id_ = spec.unk_id < n ? spec.unk_id : -1;

  raw_to_id_.reserve(pieces_.size());
  internal_to_id_.reserve(pieces_.size());
  decoded_.resize(pieces_.size());
  std::vector<uint8_t> is_added(pieces_.size(), 0);
  for (const auto& a : spec.added) is_added[a.id] = 1;
  for (int32_t id = 0; id < n; ++id) {
    const std::string& p = pieces_[id];
    raw_to_id_.emplace(p, id);
    const TokenType t = types_[id];
    if (is_added[id] || t == TokenType::kUserDefined) {
      // Added tokens contribute their literal content (HF); llama.cpp unescapes "▁" in SPM
      // user-defined pieces.
      decoded_[id] = mode_ == BpeMode::kSpm ? ReplaceAll(p, kSpmSpace, " ") : p;
      internal_to_id_.emplace(p, id);
      continue;
    }
    if (IsSpecialType(t)) continue;  // decodes to nothing unless include_special
    const int b = (t == TokenType::kByte || mode_ != BpeMode::kByteLevel) ? ParseBytePiece(p) : -1;
    if (b >= 0 && (t == TokenType::kByte || byte_fallback_ || mode_ == BpeMode::kLlama2c)) {
      decoded_[id] = std::string(1, static_cast<char>(b));
    } else if (mode_ == BpeMode::kByteLevel) {
      decoded_[id] = ByteLevelDecode(p);
    } else if (mode_ == BpeMode::kSpm) {
      decoded_[id] = ReplaceAll(p, kSpmSpace, " ");
    } else {
      decoded_[id] = p;
    }
    internal_to_id_.emplace(mode_ == BpeMode::kByteLevel ? decoded_[id] : p, id);
  }

  // Byte symbols.
  std::fill(std::begin(byte_ids_), std::end(byte_ids_), -1);
  for (int b = 0; b < 256; ++b) {
    if (mode_ == BpeMode::kByteLevel) {
      byte_ids_[b] = InternalLookup(std::string(1, static_cast<char>(b)));
    } else {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "<0x%02X>", b);
      if (mode_ == BpeMode::kLlama2c) {
        // llama2.c falls back to id byte+3 unconditionally.
        if (b + 3 < n) byte_ids_[b] = b + 3;
      } else if (auto it = raw_to_id_.find(buf); it != raw_to_id_.end()) {
        byte_ids_[b] = it->second;
      }
    }
  }
  if (mode_ == BpeMode::kLlama2c) byte_fallback_ = true;
  for (int c = 0; c < 128; ++c)
    ascii_ids_[c] = InternalLookup(std::string(1, static_cast<char>(c)));

  // Merge table.
  if (spec.merges_from_scores) {
    for (int32_t id = 0; id < n; ++id) {
      const TokenType t = types_[id];
      if (t != TokenType::kNormal && t != TokenType::kUserDefined && t != TokenType::kUndefined) {
        continue;
      }
      const std::string& p = pieces_[id];
      if (p.size() < 2 || InternalLookup(p) != id) continue;
      const float priority = -spec.scores[id];
      for (size_t k = 1; k < p.size(); ++k) {
        const int32_t l = InternalLookup(std::string_view(p).substr(0, k));
        if (l < 0) continue;
        const int32_t r = InternalLookup(std::string_view(p).substr(k));
        if (r < 0) continue;
        merges_.Insert(PairKey(l, r), MergeInfo{id, priority});
      }
    }
    scores_ = std::move(spec.scores);
  } else {
    merge_ids_.reserve(spec.merges.size());
    for (size_t rank = 0; rank < spec.merges.size(); ++rank) {
      const auto& [a, b] = spec.merges[rank];
      auto ia = raw_to_id_.find(a);
      auto ib = raw_to_id_.find(b);
      auto im = raw_to_id_.find(a + b);
      if (ia == raw_to_id_.end() || ib == raw_to_id_.end() || im == raw_to_id_.end()) {
        return InvalidArgumentError("merge " + std::to_string(rank) + " ('" + a + "' '" + b +
                                    "') refers to a token that is not in the vocabulary");
      }
      merges_.Insert(PairKey(ia->second, ib->second),
                     MergeInfo{im->second, static_cast<float>(rank)});
      merge_ids_.emplace_back(ia->second, ib->second);
    }
  }

  std::vector<int32_t> special;
  for (int32_t id = 0; id < n; ++id) {
    if (IsSpecialType(types_[id])) special.push_back(id);
  }
  set_special_ids(std::move(special));
  added_.Build(std::move(spec.added));
  return OkStatus();
}

BpeSpec BpeTokenizer::ToSpec() const {
  BpeSpec spec;
  spec.mode = mode_;
  spec.kind = kind_;
  spec.pieces = pieces_;
  spec.types = types_;
  spec.merges.reserve(merge_ids_.size());
  for (const auto& [l, r] : merge_ids_) spec.merges.emplace_back(pieces_[l], pieces_[r]);
  spec.merges_from_scores = merges_from_scores_;
  spec.scores = scores_;
  spec.byte_fallback = spec_byte_fallback_;
  spec.unk_id = unk_id_;
  spec.fuse_unk = fuse_unk_;
  spec.ignore_merges = ignore_merges_;
  spec.prepend = prepend_;
  spec.prepend_only_if_missing = prepend_only_if_missing_;
  spec.metaspace_split = metaspace_split_;
  spec.byte_level_add_prefix_space = byte_level_add_prefix_space_;
  spec.pre_steps = pre_steps_;
  spec.added = added_.tokens();
  spec.strip_leading_space = strip_leading_space_;
  spec.llama2c_strip_after_bos_only = llama2c_strip_after_bos_only_;
  return spec;
}

int32_t BpeTokenizer::InternalLookup(std::string_view s) const {
  // std::unordered_map<std::string, ...> has no heterogeneous lookup in C++20 without a
  // transparent hash; the temporaries are short.
  auto it = internal_to_id_.find(std::string(s));
  return it == internal_to_id_.end() ? -1 : it->second;
}

const MergeInfo* BpeTokenizer::FindMerge(int32_t left, int32_t right) const {
  return merges_.Find(PairKey(left, right));
}

void BpeTokenizer::EncodeWord(std::string_view word, std::vector<int32_t>* out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    const int32_t id = InternalLookup(word);
    if (id >= 0) {
      out->push_back(id);
      return;
    }
  }
  struct Sym {
    int32_t id;  // -1 once merged into its left neighbour
    int32_t prev;
    int32_t next;
  };
  std::vector<Sym> syms;
  syms.reserve(word.size());
  auto push = [&](int32_t id) {
    const int32_t idx = static_cast<int32_t>(syms.size());
    syms.push_back(Sym{id, idx - 1, -1});
    if (idx > 0) syms[idx - 1].next = idx;
  };
  bool last_was_unk = false;
  if (mode_ == BpeMode::kByteLevel) {
    for (char c : word) {
      const int32_t id = byte_ids_[static_cast<uint8_t>(c)];
      if (id >= 0) push(id);
    }
  } else {
    std::string ch;
    size_t i = 0;
    while (i < word.size()) {
      size_t len = ValidUtf8CharLen(word.substr(i));
      if (len == 0) len = 1;
      const std::string_view c = word.substr(i, len);
      i += len;
      if (len == 1 && static_cast<uint8_t>(c[0]) < 128 &&
          ascii_ids_[static_cast<uint8_t>(c[0])] >= 0) {
        push(ascii_ids_[static_cast<uint8_t>(c[0])]);
        last_was_unk = false;
        continue;
      }
      ch.assign(c);
      auto it = internal_to_id_.find(ch);
      if (it != internal_to_id_.end()) {
        push(it->second);
        last_was_unk = false;
        continue;
      }
      bool all_bytes = byte_fallback_;
      for (size_t k = 0; all_bytes && k < c.size(); ++k) {
        all_bytes = byte_ids_[static_cast<uint8_t>(c[k])] >= 0;
      }
      if (all_bytes) {
        for (char b : c) push(byte_ids_[static_cast<uint8_t>(b)]);
        last_was_unk = false;
      } else if (unk_id_ >= 0) {
        if (!(fuse_unk_ && last_was_unk)) push(unk_id_);
        last_was_unk = true;
      }
    }
  }
  if (syms.empty()) return;

  // Candidates are (priority, left position) packed in one uint64 so the heap is compact; a
  // candidate is checked when popped: if its left symbol is gone or the pair now there merges
  // with a different priority, it is stale. (If the pair there has the same priority, it has an
  // identical candidate of its own, so merging it now is what the algorithm does anyway.)
  auto key = [](float priority, int32_t left) {
    uint32_t bits;
    std::memcpy(&bits, &priority, 4);
    bits = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);  // order-preserving
    return (static_cast<uint64_t>(bits) << 32) | static_cast<uint32_t>(left);
  };
  std::vector<uint64_t> heap;
  heap.reserve(syms.size());
  auto try_add = [&](int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    const MergeInfo* m = FindMerge(syms[l].id, syms[r].id);
    if (m == nullptr) return;
    heap.push_back(key(m->priority, l));
    std::push_heap(heap.begin(), heap.end(), std::greater<>());
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(syms.size()); ++i) {
    const MergeInfo* m = FindMerge(syms[i].id, syms[i + 1].id);
    if (m != nullptr) heap.push_back(key(m->priority, i));
  }
  std::make_heap(heap.begin(), heap.end(), std::greater<>());

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<>());
    const uint64_t top = heap.back();
    heap.pop_back();
    const int32_t left = static_cast<int32_t>(static_cast<uint32_t>(top));
    Sym& l = syms[left];
    if (l.id < 0 || l.next < 0) continue;
    Sym& r = syms[l.next];
    const MergeInfo* m = FindMerge(l.id, r.id);
    if (m == nullptr || key(m->priority, left) != top) continue;
    l.id = m->merged;
    l.next = r.next;
    if (r.next >= 0) syms[r.next].prev = left;
    r.id = -1;
    try_add(l.prev, left);
    try_add(left, l.next);
  }
  for (int32_t i = 0; i >= 0; i = syms[i].next) out->push_back(syms[i].id);
}

void BpeTokenizer::EncodeSegment(std::string_view text, bool at_text_start,
                                 std::vector<int32_t>* out) const {
  if (text.empty()) return;
  const bool want_prefix =
      prepend_ == PrependScheme::kAlways || (prepend_ == PrependScheme::kFirst && at_text_start);
  switch (mode_) {
    case BpeMode::kLlama2c: {
      if (want_prefix) {
        std::string s;
        s.reserve(text.size() + 1);
        s.push_back(' ');
        s.append(text);
        EncodeWord(s, out);
      } else {
        EncodeWord(text, out);
      }
      return;
    }
    case BpeMode::kSpm: {
      std::string s = ReplaceAll(text, " ", kSpmSpace);
      if (want_prefix && !(prepend_only_if_missing_ && s.starts_with(kSpmSpace))) {
        s.insert(0, kSpmSpace);
      }
      if (!metaspace_split_) {
        EncodeWord(s, out);
        return;
      }
      size_t start = 0;
      while (start < s.size()) {
        size_t next = s.find(kSpmSpace, start + 1);
        if (next == std::string::npos) next = s.size();
        EncodeWord(std::string_view(s).substr(start, next - start), out);
        start = next;
      }
      return;
    }
    case BpeMode::kByteLevel: {
      std::string prefixed;
      if (byte_level_add_prefix_space_ && text[0] != ' ') {
        prefixed.reserve(text.size() + 1);
        prefixed.push_back(' ');
        prefixed.append(text);
        text = prefixed;
      }
      std::vector<std::string_view> words;
      pre_.Split(text, &words);
      for (std::string_view w : words) EncodeWord(w, out);
      return;
    }
  }
}

std::vector<int32_t> BpeTokenizer::Encode(std::string_view text, const EncodeOptions& opts) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  if (opts.add_bos && add_bos_ && bos_id_ >= 0) out.push_back(bos_id_);
  if (added_.empty()) {
    EncodeSegment(text, /*at_text_start=*/true, &out);
  } else {
    for (const Segment& seg : added_.Split(text, opts.parse_special)) {
      if (seg.id >= 0) {
        out.push_back(seg.id);
      } else {
        EncodeSegment(seg.text, seg.offset == 0, &out);
      }
    }
  }
  if (opts.add_eos && add_eos_ && !eos_ids_.empty()) out.push_back(eos_ids_.front());
  return out;
}

std::string BpeTokenizer::TokenBytes(int32_t prev_id, int32_t id, bool include_special) const {
  if (id < 0 || id >= vocab_size()) return {};
  if (IsSpecial(id)) return include_special ? pieces_[id] : std::string();
  const std::string& s = decoded_[id];
  if (strip_leading_space_ && !s.empty() && s[0] == ' ') {
    const bool strip = llama2c_strip_after_bos_only_
                           ? (prev_id >= 0 && prev_id == bos_id_)
                           : (prev_id < 0 || (!include_special && prev_id == bos_id_));
    if (strip) return s.substr(1);
  }
  return s;
}

std::string_view BpeTokenizer::Piece(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return {};
  return pieces_[id];
}

std::optional<int32_t> BpeTokenizer::PieceToId(std::string_view piece) const {
  auto it = raw_to_id_.find(std::string(piece));
  if (it == raw_to_id_.end()) return std::nullopt;
  return it->second;
}

}  // namespace chorus::tokenizer::internal
