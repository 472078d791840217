#include "chorus/tokenizer/export.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <unordered_map>
#include <unordered_set>

#include "chorus/base/mapped_file.h"
#include "chorus/formats/gguf.h"
#include "chorus/tokenizer/bpe_tokenizer.h"
#include "chorus/tokenizer/internal.h"
#include "chorus/tokenizer/utf8.h"

namespace chorus::tokenizer {
namespace {

using internal::AddedToken;
using internal::BpeMode;
using internal::BpeSpec;
using internal::PrependScheme;
using internal::PreTokenizerStep;
using internal::TokenType;
// Written in insertion order, so the vocabulary appears by id as HF writes it.
using OJson = nlohmann::ordered_json;

constexpr std::string_view kSpmSpace = "\xE2\x96\x81";  // U+2581 "▁"

std::string ReplaceAll(std::string_view s, std::string_view from, std::string_view to) {
  std::string out;
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
// Types whose pieces take part in score-based merging (as BpeTokenizer builds it).
bool IsMergeableType(TokenType t) {
  return t == TokenType::kNormal || t == TokenType::kUserDefined || t == TokenType::kUndefined;
}

bool IsValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const size_t n = internal::ValidUtf8CharLen(s.substr(i));
    if (n == 0) return false;
    i += n;
  }
  return true;
}

// ---- SentencePiece ModelProto (the few fields export needs; protobuf wire format) -----------

class ProtoReader {
 public:
  explicit ProtoReader(std::string_view b) : b_(b) {}
  bool done() const { return pos_ >= b_.size(); }
  // Reads one field: its number, wire type and value (varint/fixed in *v, length-delimited in
  // *bytes). False on malformed input.
  bool Next(uint32_t* field, uint32_t* wire, uint64_t* v, std::string_view* bytes) {
    uint64_t key;
    if (!Varint(&key)) return false;
    *field = static_cast<uint32_t>(key >> 3);
    *wire = static_cast<uint32_t>(key & 7);
    switch (*wire) {
      case 0:
        return Varint(v);
      case 1:
        if (b_.size() - pos_ < 8) return false;
        std::memcpy(v, b_.data() + pos_, 8);
        pos_ += 8;
        return true;
      case 2: {
        uint64_t n;
        if (!Varint(&n) || n > b_.size() - pos_) return false;
        *bytes = b_.substr(pos_, n);
        pos_ += n;
        return true;
      }
      case 5: {
        if (b_.size() - pos_ < 4) return false;
        uint32_t x;
        std::memcpy(&x, b_.data() + pos_, 4);
        *v = x;
        pos_ += 4;
        return true;
      }
      default:
        return false;
    }
  }

 private:
  bool Varint(uint64_t* out) {
    uint64_t r = 0;
    for (int shift = 0; shift < 64 && pos_ < b_.size(); shift += 7) {
      const uint8_t c = static_cast<uint8_t>(b_[pos_++]);
      r |= static_cast<uint64_t>(c & 0x7F) << shift;
      if (c < 0x80) {
        *out = r;
        return true;
      }
    }
    return false;
  }
  std::string_view b_;
  size_t pos_ = 0;
};

// A SentencePiece BPE model as a BpeSpec. Refuses what the BPE engine would tokenize
// differently from libsentencepiece: unigram/word/char models, normalization rules, whitespace
// collapsing, whitespace as suffix.
Result<BpeSpec> SpecFromSentencePiece(std::string_view proto) {
  const Status malformed = InvalidArgumentError("SentencePiece model: malformed protobuf");
  BpeSpec spec;
  spec.mode = BpeMode::kSpm;
  spec.kind = "spm-bpe";
  spec.merges_from_scores = true;
  uint64_t model_type = 1;  // UNIGRAM (the proto default)
  bool add_dummy_prefix = true, remove_extra_whitespaces = true, escape_whitespaces = true;
  bool whitespace_as_suffix = false;
  std::string normalizer_name;
  size_t charsmap_bytes = 0;
  ProtoReader top(proto);
  uint32_t field, wire;
  uint64_t v = 0;
  std::string_view bytes;
  while (!top.done()) {
    if (!top.Next(&field, &wire, &v, &bytes)) return malformed;
    if (field == 1 && wire == 2) {  // SentencePiece {1: piece, 2: score, 3: type}
      ProtoReader p(bytes);
      std::string piece;
      float score = 0;
      TokenType type = TokenType::kNormal;
      while (!p.done()) {
        if (!p.Next(&field, &wire, &v, &bytes)) return malformed;
        if (field == 1 && wire == 2) piece.assign(bytes);
        if (field == 2 && wire == 5) {
          const uint32_t x = static_cast<uint32_t>(v);
          std::memcpy(&score, &x, 4);
        }
        if (field == 3 && wire == 0)
          type = v >= 1 && v <= 6 ? static_cast<TokenType>(v) : TokenType::kNormal;
      }
      spec.pieces.push_back(std::move(piece));
      spec.scores.push_back(score);
      spec.types.push_back(type);
    } else if (field == 2 && wire == 2) {  // TrainerSpec
      ProtoReader t(bytes);
      while (!t.done()) {
        if (!t.Next(&field, &wire, &v, &bytes)) return malformed;
        if (wire != 0) continue;
        if (field == 3) model_type = v;
        if (field == 24) whitespace_as_suffix = v != 0;
        if (field == 35) spec.byte_fallback = v != 0;
      }
    } else if (field == 3 && wire == 2) {  // NormalizerSpec
      ProtoReader n(bytes);
      while (!n.done()) {
        if (!n.Next(&field, &wire, &v, &bytes)) return malformed;
        if (field == 1 && wire == 2) normalizer_name.assign(bytes);
        if (field == 2 && wire == 2) charsmap_bytes = bytes.size();
        if (field == 3 && wire == 0) add_dummy_prefix = v != 0;
        if (field == 4 && wire == 0) remove_extra_whitespaces = v != 0;
        if (field == 5 && wire == 0) escape_whitespaces = v != 0;
      }
    }
  }
  if (spec.pieces.empty()) return InvalidArgumentError("SentencePiece model has no pieces");
  if (model_type != 2) {
    return UnimplementedError(
        "SentencePiece model type " + std::to_string(model_type) +
        " cannot be exported: only BPE models (type 2) are (unigram needs "
        "a Unigram tokenizer, which Chorus's tokenizer.json/GGUF readers lack)");
  }
  if (charsmap_bytes > 0) {
    return UnimplementedError("SentencePiece normalizer '" + normalizer_name +
                              "' cannot be exported (Chorus's tokenizer.json/GGUF readers do not "
                              "normalize; only the identity normalizer is exact)");
  }
  if (remove_extra_whitespaces || !escape_whitespaces || whitespace_as_suffix) {
    return UnimplementedError(
        "SentencePiece model with remove_extra_whitespaces, escape_whitespaces=false or "
        "treat_whitespace_as_suffix cannot be exported exactly");
  }
  for (size_t i = 0; i < spec.pieces.size(); ++i) {
    const int32_t id = static_cast<int32_t>(i);
    const TokenType t = spec.types[i];
    if (t == TokenType::kUnknown && spec.unk_id < 0) spec.unk_id = id;
    // libsentencepiece matches user-defined pieces in the text always; Chorus's wrapper splits at
    // control (and unknown) pieces when parse_special is set.
    if (t == TokenType::kControl || t == TokenType::kUnknown) {
      spec.added.push_back(AddedToken{spec.pieces[i], id, /*special=*/true});
    } else if (t == TokenType::kUserDefined) {
      spec.added.push_back(AddedToken{spec.pieces[i], id, /*special=*/false});
    }
  }
  spec.prepend = add_dummy_prefix ? PrependScheme::kAlways : PrependScheme::kNever;
  // Chorus's SentencePiece wrapper drops the first space of the decoded text.
  spec.strip_leading_space = true;
  return spec;
}

// ---- the vocabulary in its export form -------------------------------------------------------

// spec.mode is kSpm or kByteLevel; pieces are spelled as the targets want them ("▁" for SPM
// spaces); types are final (unknown, control, byte, user-defined, unused); `added` holds every
// token HF must treat as an added token, sorted by id.
struct Vocab {
  BpeSpec spec;
  const Tokenizer* tok = nullptr;
  bool from_llama2c = false;
  int32_t size() const { return static_cast<int32_t>(spec.pieces.size()); }
  bool byte_level() const { return spec.mode == BpeMode::kByteLevel; }
};

Result<Vocab> Prepare(const Tokenizer& tok) {
  Vocab v;
  v.tok = &tok;
  if (const auto* bpe = dynamic_cast<const internal::BpeTokenizer*>(&tok)) {
    v.spec = bpe->ToSpec();
  } else if (auto proto = internal::SentencePieceModelProto(tok)) {
    CHORUS_ASSIGN_OR_RETURN(v.spec, SpecFromSentencePiece(*proto));
  } else {
    return UnimplementedError("tokenizer kind '" + std::string(tok.kind()) +
                              "' cannot be exported");
  }
  BpeSpec& s = v.spec;
  if (static_cast<int64_t>(s.pieces.size()) != tok.vocab_size() ||
      s.types.size() != s.pieces.size()) {
    return InternalError("tokenizer export: vocabulary size mismatch");
  }
  const int32_t n = v.size();

  if (s.mode == BpeMode::kLlama2c) {
    // llama2.c stores "▁" as " " and its specials as "\n<s>\n" / "\n</s>\n".
    v.from_llama2c = true;
    s.mode = BpeMode::kSpm;
    s.kind = "spm-bpe";
    s.byte_fallback = true;  // llama2.c always falls back to byte tokens
    for (int32_t id = 0; id < n; ++id) {
      std::string& p = s.pieces[id];
      const TokenType t = s.types[id];
      if (t == TokenType::kControl || t == TokenType::kUnknown) {
        const size_t b = p.find_first_not_of(" \t\r\n");
        const size_t e = p.find_last_not_of(" \t\r\n");
        if (b != std::string::npos) p = p.substr(b, e - b + 1);
      } else if (t != TokenType::kByte) {
        p = ReplaceAll(p, " ", kSpmSpace);
      }
    }
  }

  if (s.unk_id < 0 || s.unk_id >= n) {
    s.unk_id = -1;
    for (int32_t id = 0; id < n && s.unk_id < 0; ++id) {
      if (s.types[id] == TokenType::kUnknown) s.unk_id = id;  // llama2.c: <unk> at 0
    }
  }

  // Final token types.
  for (int32_t id = 0; id < n; ++id) {
    TokenType& t = s.types[id];
    if (t == TokenType::kUndefined) t = TokenType::kNormal;
    if (id == s.unk_id) {
      t = TokenType::kUnknown;
    } else if (tok.IsSpecial(id) && (t == TokenType::kNormal || t == TokenType::kUserDefined)) {
      t = TokenType::kControl;  // e.g. marked special by tokenizer_config.json
    } else if (s.mode == BpeMode::kSpm && s.byte_fallback && t == TokenType::kNormal &&
               internal::ParseBytePiece(s.pieces[id]) >= 0) {
      t = TokenType::kByte;
    }
  }

  // Added tokens: the source's (keeping lstrip/rstrip), plus every control/unknown/user-defined
  // token, so that HF never splits them.
  std::unordered_map<int32_t, size_t> added_at;
  std::vector<AddedToken> added;
  for (AddedToken a : s.added) {
    if (a.id < 0 || a.id >= n || added_at.count(a.id)) continue;
    if (v.from_llama2c) a.content = s.pieces[a.id];  // renamed above
    a.special = a.special || IsSpecialType(s.types[a.id]);
    added_at[a.id] = added.size();
    added.push_back(std::move(a));
  }
  for (int32_t id = 0; id < n; ++id) {
    const TokenType t = s.types[id];
    if (added_at.count(id) || s.pieces[id].empty()) continue;
    if (t == TokenType::kControl || t == TokenType::kUnknown || t == TokenType::kUserDefined) {
      added.push_back(AddedToken{s.pieces[id], id, /*special=*/t != TokenType::kUserDefined});
    }
  }
  std::sort(added.begin(), added.end(),
            [](const AddedToken& a, const AddedToken& b) { return a.id < b.id; });
  s.added = std::move(added);
  return v;
}

// Piece -> id over the pieces BPE works with (not control/unknown/unused), first id wins; the
// same lookup BpeTokenizer's score-based merge table uses.
std::unordered_map<std::string_view, int32_t> MergeableLookup(const BpeSpec& s) {
  std::unordered_map<std::string_view, int32_t> m;
  m.reserve(s.pieces.size());
  for (size_t id = 0; id < s.pieces.size(); ++id) {
    if (!IsSpecialType(s.types[id])) m.emplace(s.pieces[id], static_cast<int32_t>(id));
  }
  return m;
}

int32_t Find(const std::unordered_map<std::string_view, int32_t>& m, std::string_view s) {
  auto it = m.find(s);
  return it == m.end() ? -1 : it->second;
}

// SentencePiece BPE merges from scores, ordered as HF's converters order them (generate_merges):
// every split of every piece into two vocabulary pieces, grouped per piece in id order and sorted
// by (left id, right id) within a piece, then stably sorted by the piece's score (descending),
// then by the lengths of the left and right parts in characters (descending).
std::vector<std::pair<int32_t, int32_t>> MergesFromScores(const BpeSpec& s) {
  const auto lookup = MergeableLookup(s);
  struct M {
    int32_t l, r;
    float score;
    size_t len_l, len_r;
  };
  std::vector<M> merges;
  std::vector<M> local;
  for (size_t id = 0; id < s.pieces.size(); ++id) {
    const std::string& p = s.pieces[id];
    if (!IsMergeableType(s.types[id]) || p.size() < 2 ||
        Find(lookup, p) != static_cast<int32_t>(id)) {
      continue;
    }
    local.clear();
    for (size_t k = 1; k < p.size(); ++k) {
      const std::string_view left = std::string_view(p).substr(0, k);
      const std::string_view right = std::string_view(p).substr(k);
      const int32_t l = Find(lookup, left), r = Find(lookup, right);
      if (l < 0 || r < 0) continue;
      local.push_back(
          M{l, r, s.scores[id], internal::CountUtf8Chars(left), internal::CountUtf8Chars(right)});
    }
    std::sort(local.begin(), local.end(),
              [](const M& a, const M& b) { return a.l != b.l ? a.l < b.l : a.r < b.r; });
    merges.insert(merges.end(), local.begin(), local.end());
  }
  std::stable_sort(merges.begin(), merges.end(), [](const M& a, const M& b) {
    if (a.score != b.score) return a.score > b.score;
    if (a.len_l != b.len_l) return a.len_l > b.len_l;
    return a.len_r > b.len_r;
  });
  std::vector<std::pair<int32_t, int32_t>> out;
  out.reserve(merges.size());
  for (const M& m : merges) out.emplace_back(m.l, m.r);
  return out;
}

// Scores that make score-based merging (GGUF "llama") reproduce rank-based merges: a piece's
// score is minus the rank of the first merge producing it. Exact when every split of a piece
// into two vocabulary pieces is itself a listed merge (true of merges HF derived from a
// SentencePiece model); anything else is refused.
Result<std::vector<float>> ScoresFromMerges(const BpeSpec& s) {
  const auto lookup = MergeableLookup(s);
  std::unordered_map<std::string_view, int32_t> any_id;  // merges name pieces of any type
  for (size_t id = 0; id < s.pieces.size(); ++id)
    any_id.emplace(s.pieces[id], static_cast<int32_t>(id));
  const size_t n = s.pieces.size();
  std::vector<int64_t> first_rank(n, -1);
  std::unordered_set<uint64_t> pairs;
  auto key = [](int32_t l, int32_t r) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(l)) << 32) | static_cast<uint32_t>(r);
  };
  for (size_t rank = 0; rank < s.merges.size(); ++rank) {
    const auto& [a, b] = s.merges[rank];
    const int32_t l = Find(any_id, a), r = Find(any_id, b), m = Find(any_id, a + b);
    if (l < 0 || r < 0 || m < 0) continue;  // BpeTokenizer::Build refuses these already
    pairs.insert(key(l, r));
    if (first_rank[m] < 0) first_rank[m] = static_cast<int64_t>(rank);
  }
  std::vector<float> scores(n, 0.0f);
  const float never = -static_cast<float>(s.merges.size() + 1);
  for (size_t id = 0; id < n; ++id) {
    const std::string& p = s.pieces[id];
    const TokenType t = s.types[id];
    if (!IsMergeableType(t)) continue;
    scores[id] = first_rank[id] >= 0 ? -static_cast<float>(first_rank[id]) : never;
    // User-defined pieces are matched in the text before BPE runs, so how they could be merged
    // never matters.
    if (t != TokenType::kNormal || p.size() < 2 || Find(lookup, p) != static_cast<int32_t>(id)) {
      continue;
    }
    for (size_t k = 1; k < p.size(); ++k) {
      const int32_t l = Find(lookup, std::string_view(p).substr(0, k));
      const int32_t r = Find(lookup, std::string_view(p).substr(k));
      if (l < 0 || r < 0 || pairs.count(key(l, r))) continue;
      return UnimplementedError("merges cannot be expressed as GGUF \"llama\" scores: piece '" + p +
                                "' (id " + std::to_string(id) + ") splits into '" + s.pieces[l] +
                                "' + '" + s.pieces[r] + "', which is not a listed merge");
    }
  }
  return scores;
}

// The regex steps of Chorus's GGUF pre-tokenizer "default" (llama.cpp
// LLAMA_VOCAB_PRE_TYPE_DEFAULT); must stay equal to gguf_tokenizer.cc's (a test round-trips it).
const std::vector<std::string>& DefaultPreSteps() {
  static const std::vector<std::string> steps = {
      R"([\p{P}\$\+<=>\^~\|]+)",
      R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))", R"(\p{N}+)",
      R"([0-9][0-9][0-9])"};
  return steps;
}

// The llama.cpp pre-tokenizer name of a byte-level regex sequence.
Result<std::string> PreName(const std::vector<PreTokenizerStep>& steps) {
  std::vector<std::string> patterns;
  for (const auto& st : steps) {
    if (st.remove_matches) {
      return UnimplementedError(
          "a pre-tokenizer Split with behavior Removed has no GGUF equivalent");
    }
    patterns.push_back(st.pattern);
  }
  if (patterns.size() == 1 && patterns[0] == internal::kGpt2Pattern) return std::string("gpt-2");
  if (patterns.size() == 1 && patterns[0] == internal::kLlama3Pattern)
    return std::string("llama-bpe");
  if (patterns.size() == 1 && patterns[0] == internal::kQwen2Pattern) return std::string("qwen2");
  if (patterns == DefaultPreSteps()) return std::string("default");
  return UnimplementedError(
      "the byte-level pre-tokenizer regexes match none of the GGUF pre-tokenizers Chorus knows "
      "(gpt-2, llama-bpe, qwen2, default)");
}

// ---- GGUF ------------------------------------------------------------------------------------

Status WriteGguf(const Vocab& v, formats::GgufWriter* w, const GgufExportOptions& opts) {
  const BpeSpec& s = v.spec;
  const Tokenizer& tok = *v.tok;
  const int32_t n = v.size();
  if (opts.pad_to_vocab_size != 0 && opts.pad_to_vocab_size < n) {
    return InvalidArgumentError("tokenizer has " + std::to_string(n) +
                                " tokens, more than the requested vocabulary size " +
                                std::to_string(opts.pad_to_vocab_size));
  }
  if (opts.pad_to_vocab_size > (int64_t{1} << 24)) {
    return InvalidArgumentError("vocabulary size " + std::to_string(opts.pad_to_vocab_size) +
                                " is too large");
  }
  std::vector<float> scores;
  std::string pre;
  if (v.byte_level()) {
    if (s.byte_level_add_prefix_space) {
      return UnimplementedError("ByteLevel add_prefix_space has no GGUF equivalent");
    }
    CHORUS_ASSIGN_OR_RETURN(pre, PreName(s.pre_steps));
    // llama.cpp applies ignore_merges for its llama-bpe pre-tokenizer only.
    if (s.ignore_merges && pre != "llama-bpe") {
      return UnimplementedError("BPE ignore_merges has no GGUF equivalent for pre-tokenizer '" +
                                pre + "'");
    }
  } else {
    if (s.metaspace_split) {
      return UnimplementedError(
          "Metaspace split=true (a word at every \u2581) has no GGUF \"llama\" equivalent");
    }
    pre = "default";
    if (s.merges_from_scores) {
      scores = s.scores;
    } else {
      CHORUS_ASSIGN_OR_RETURN(scores, ScoresFromMerges(s));
    }
    if (scores.size() != static_cast<size_t>(n))
      return InternalError("tokenizer export: score count mismatch");
  }

  std::vector<std::string> tokens = s.pieces;
  std::vector<int32_t> types(n);
  for (int32_t id = 0; id < n; ++id) types[id] = static_cast<int32_t>(s.types[id]);
  for (int64_t id = n; id < opts.pad_to_vocab_size; ++id) {
    tokens.push_back("[PAD" + std::to_string(id) + "]");
    types.push_back(static_cast<int32_t>(TokenType::kUnused));
    if (!v.byte_level()) scores.push_back(0.0f);
  }

  w->SetString("tokenizer.ggml.model", v.byte_level() ? "gpt2" : "llama");
  w->SetString("tokenizer.ggml.pre", pre);
  w->SetStringArray("tokenizer.ggml.tokens", std::move(tokens));
  if (!v.byte_level()) w->SetFloat32Array("tokenizer.ggml.scores", std::move(scores));
  w->SetInt32Array("tokenizer.ggml.token_type", std::move(types));
  if (v.byte_level()) {
    std::vector<std::string> merges;
    merges.reserve(s.merges.size());
    for (const auto& [a, b] : s.merges) {
      if (a.empty() || a.find(' ') != std::string::npos || b.find(' ') != std::string::npos) {
        return UnimplementedError("merge '" + a + "' '" + b +
                                  "' contains a space; GGUF merges are written \"a b\"");
      }
      merges.push_back(a + " " + b);
    }
    w->SetStringArray("tokenizer.ggml.merges", std::move(merges));
  }
  auto set_id = [&](const char* key, int32_t id) {
    if (id >= 0 && id < n) w->SetUint32(key, static_cast<uint32_t>(id));
  };
  set_id("tokenizer.ggml.bos_token_id", tok.bos_id());
  // Chorus's GGUF reader stops at eos, eot and eom: the first three end-of-generation ids.
  static const char* const kEosKeys[] = {
      "tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"};
  for (size_t i = 0; i < tok.eos_ids().size() && i < 3; ++i) set_id(kEosKeys[i], tok.eos_ids()[i]);
  set_id("tokenizer.ggml.unknown_token_id", s.unk_id);
  set_id("tokenizer.ggml.padding_token_id", tok.pad_id());
  w->SetBool("tokenizer.ggml.add_bos_token", tok.add_bos());
  w->SetBool("tokenizer.ggml.add_eos_token", tok.add_eos());
  if (!v.byte_level())
    w->SetBool("tokenizer.ggml.add_space_prefix", s.prepend != PrependScheme::kNever);
  if (!tok.chat_template().empty()) w->SetString("tokenizer.chat_template", tok.chat_template());
  return OkStatus();
}

// ---- Hugging Face ----------------------------------------------------------------------------

OJson ReplaceJson(std::string_view from, std::string_view to) {
  return OJson{{"type", "Replace"}, {"pattern", {{"String", from}}}, {"content", to}};
}

OJson ByteLevelJson(bool add_prefix_space, bool trim_offsets, bool use_regex) {
  return OJson{{"type", "ByteLevel"},
               {"add_prefix_space", add_prefix_space},
               {"trim_offsets", trim_offsets},
               {"use_regex", use_regex}};
}

// TemplateProcessing for add_bos / add_eos (null when neither applies).
OJson PostProcessor(const Vocab& v) {
  const Tokenizer& tok = *v.tok;
  const int32_t n = v.size();
  std::vector<std::pair<std::string, int32_t>> before, after;
  if (tok.add_bos() && tok.bos_id() >= 0 && tok.bos_id() < n) {
    before.emplace_back(v.spec.pieces[tok.bos_id()], tok.bos_id());
  }
  if (tok.add_eos() && !tok.eos_ids().empty() && tok.eos_ids()[0] < n) {
    after.emplace_back(v.spec.pieces[tok.eos_ids()[0]], tok.eos_ids()[0]);
  }
  if (before.empty() && after.empty()) return nullptr;
  auto special = [](const std::string& content, int type_id) {
    return OJson{{"SpecialToken", {{"id", content}, {"type_id", type_id}}}};
  };
  auto sequence = [](const char* id, int type_id) {
    return OJson{{"Sequence", {{"id", id}, {"type_id", type_id}}}};
  };
  OJson single = OJson::array(), pair = OJson::array();
  for (const auto& [c, id] : before) single.push_back(special(c, 0));
  single.push_back(sequence("A", 0));
  for (const auto& [c, id] : after) single.push_back(special(c, 0));
  pair = single;
  for (const auto& [c, id] : before) pair.push_back(special(c, 1));
  pair.push_back(sequence("B", 1));
  for (const auto& [c, id] : after) pair.push_back(special(c, 1));
  OJson specials = OJson::object();
  for (const auto* list : {&before, &after}) {
    for (const auto& [c, id] : *list) {
      specials[c] = OJson{{"id", c}, {"ids", {id}}, {"tokens", {c}}};
    }
  }
  return OJson{{"type", "TemplateProcessing"},
               {"single", std::move(single)},
               {"pair", std::move(pair)},
               {"special_tokens", std::move(specials)}};
}

Result<std::string> TokenizerJson(const Vocab& v) {
  const BpeSpec& s = v.spec;
  const int32_t n = v.size();
  // Vocabulary: every non-empty piece (holes left out), unique, valid UTF-8.
  OJson vocab = OJson::object();
  // ordered_json's operator[] searches linearly; keys are checked unique here and appended.
  auto& vocab_items = vocab.get_ref<OJson::object_t&>();
  vocab_items.reserve(static_cast<size_t>(n));
  std::unordered_map<std::string_view, int32_t> seen;
  for (int32_t id = 0; id < n; ++id) {
    const std::string& p = s.pieces[id];
    if (p.empty()) {
      if (s.types[id] == TokenType::kUnused) continue;
      return UnimplementedError("token " + std::to_string(id) +
                                " is empty; tokenizer.json cannot hold it");
    }
    if (!IsValidUtf8(p)) {
      return UnimplementedError("token " + std::to_string(id) +
                                " is not valid UTF-8; tokenizer.json cannot hold it");
    }
    if (auto [it, fresh] = seen.emplace(p, id); !fresh) {
      return UnimplementedError("tokens " + std::to_string(it->second) + " and " +
                                std::to_string(id) + " are both '" + p +
                                "'; a tokenizer.json vocabulary cannot hold both");
    }
    vocab_items.emplace_back(p, id);
  }
  std::vector<std::pair<std::string_view, std::string_view>> merges;
  if (s.merges_from_scores) {
    for (const auto& [l, r] : MergesFromScores(s)) merges.emplace_back(s.pieces[l], s.pieces[r]);
  } else {
    for (const auto& [a, b] : s.merges) merges.emplace_back(a, b);
  }
  // "a b" strings load in every tokenizers version; pairs only where a piece holds a space.
  const bool pair_form = std::any_of(merges.begin(), merges.end(), [](const auto& m) {
    return m.first.find(' ') != std::string_view::npos ||
           m.second.find(' ') != std::string_view::npos;
  });
  OJson merges_json = OJson::array();
  for (const auto& [a, b] : merges) {
    if (pair_form) {
      merges_json.push_back(OJson::array({a, b}));
    } else {
      std::string m;
      m.reserve(a.size() + b.size() + 1);
      m.append(a).push_back(' ');
      m.append(b);
      merges_json.push_back(std::move(m));
    }
  }

  OJson added = OJson::array();
  for (const AddedToken& a : s.added) {
    added.push_back(OJson{{"id", a.id},
                          {"content", a.content},
                          {"single_word", false},
                          {"lstrip", a.lstrip},
                          {"rstrip", a.rstrip},
                          {"normalized", false},
                          {"special", a.special}});
  }

  OJson normalizer = nullptr, pre_tokenizer = nullptr, decoder;
  const bool spm = !v.byte_level();
  if (spm) {
    if (s.prepend_only_if_missing || s.metaspace_split) {
      const char* scheme = s.prepend == PrependScheme::kAlways  ? "always"
                           : s.prepend == PrependScheme::kFirst ? "first"
                                                                : "never";
      pre_tokenizer = OJson{{"type", "Metaspace"},
                            {"replacement", kSpmSpace},
                            {"prepend_scheme", scheme},
                            {"split", s.metaspace_split}};
    } else {
      // HF's legacy Llama pipeline. (llama2.c's prefix only at the text start becomes a prefix
      // of every segment between added tokens, as in SentencePiece.)
      OJson seq = OJson::array();
      if (s.prepend != PrependScheme::kNever)
        seq.push_back(OJson{{"type", "Prepend"}, {"prepend", kSpmSpace}});
      seq.push_back(ReplaceJson(" ", kSpmSpace));
      normalizer = OJson{{"type", "Sequence"}, {"normalizers", std::move(seq)}};
    }
    OJson decoders = OJson::array();
    decoders.push_back(ReplaceJson(kSpmSpace, " "));
    decoders.push_back(OJson{{"type", "ByteFallback"}});
    decoders.push_back(OJson{{"type", "Fuse"}});
    if (s.strip_leading_space) {
      decoders.push_back(OJson{{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
    }
    decoder = OJson{{"type", "Sequence"}, {"decoders", std::move(decoders)}};
  } else {
    const bool plain_gpt2 = s.pre_steps.size() == 1 && !s.pre_steps[0].remove_matches &&
                            s.pre_steps[0].pattern == internal::kGpt2Pattern;
    if (plain_gpt2) {
      pre_tokenizer = ByteLevelJson(s.byte_level_add_prefix_space, true, true);
    } else {
      OJson seq = OJson::array();
      for (const PreTokenizerStep& st : s.pre_steps) {
        seq.push_back(OJson{{"type", "Split"},
                            {"pattern", {{"Regex", st.pattern}}},
                            {"behavior", st.remove_matches ? "Removed" : "Isolated"},
                            {"invert", false}});
      }
      seq.push_back(ByteLevelJson(s.byte_level_add_prefix_space, true, false));
      pre_tokenizer = OJson{{"type", "Sequence"}, {"pretokenizers", std::move(seq)}};
    }
    decoder = ByteLevelJson(true, true, true);
  }
  OJson post = PostProcessor(v);
  if (post.is_null() && !spm) post = ByteLevelJson(true, false, true);

  OJson model{
      {"type", "BPE"},
      {"dropout", nullptr},
      {"unk_token", s.unk_id >= 0 && s.unk_id < n ? OJson(s.pieces[s.unk_id]) : OJson(nullptr)},
      {"continuing_subword_prefix", nullptr},
      {"end_of_word_suffix", nullptr},
      // HF's SentencePiece converters set fuse_unk for SPM vocabularies.
      {"fuse_unk", s.fuse_unk || (spm && s.merges_from_scores)},
      {"byte_fallback", spm && s.byte_fallback},
      {"ignore_merges", s.ignore_merges},
      {"vocab", std::move(vocab)},
      {"merges", std::move(merges_json)}};
  OJson root{{"version", "1.0"},
             {"truncation", nullptr},
             {"padding", nullptr},
             {"added_tokens", std::move(added)},
             {"normalizer", std::move(normalizer)},
             {"pre_tokenizer", std::move(pre_tokenizer)},
             {"post_processor", std::move(post)},
             {"decoder", std::move(decoder)},
             {"model", std::move(model)}};
  try {
    return root.dump(2) + "\n";
  } catch (const OJson::exception& e) {
    return UnimplementedError(std::string("tokenizer.json: ") + e.what());
  }
}

Result<std::string> TokenizerConfigJson(const Vocab& v) {
  const Tokenizer& tok = *v.tok;
  const BpeSpec& s = v.spec;
  const int32_t n = v.size();
  auto content = [&](int32_t id) {
    return id >= 0 && id < n ? OJson(s.pieces[id]) : OJson(nullptr);
  };
  OJson decoder = OJson::object();
  for (const AddedToken& a : s.added) {
    decoder[std::to_string(a.id)] =
        OJson{{"content", a.content}, {"lstrip", a.lstrip},   {"normalized", false},
              {"rstrip", a.rstrip},   {"single_word", false}, {"special", a.special}};
  }
  OJson j{{"add_bos_token", tok.add_bos()},
          {"add_eos_token", tok.add_eos()},
          {"added_tokens_decoder", std::move(decoder)},
          {"bos_token", content(tok.bos_id())},
          {"eos_token", content(tok.eos_ids().empty() ? -1 : tok.eos_ids()[0])},
          {"unk_token", content(s.unk_id)},
          {"pad_token", content(tok.pad_id())},
          {"clean_up_tokenization_spaces", false}};
  if (!tok.chat_template().empty()) j["chat_template"] = tok.chat_template();
  if (!v.byte_level()) j["legacy"] = true;
  j["tokenizer_class"] = v.byte_level() ? "PreTrainedTokenizerFast" : "LlamaTokenizerFast";
  try {
    return j.dump(2) + "\n";
  } catch (const OJson::exception& e) {
    return UnimplementedError(std::string("tokenizer_config.json: ") + e.what());
  }
}

}  // namespace

Status ExportToGguf(const Tokenizer& tok, formats::GgufWriter* w, const GgufExportOptions& opts) {
  CHORUS_ASSIGN_OR_RETURN(Vocab v, Prepare(tok));
  return WriteGguf(v, w, opts).WithContext("GGUF tokenizer export");
}

Result<HfTokenizerFiles> ExportToHfFiles(const Tokenizer& tok) {
  CHORUS_ASSIGN_OR_RETURN(Vocab v, Prepare(tok));
  HfTokenizerFiles files;
  CHORUS_ASSIGN_OR_RETURN(files.tokenizer_json, TokenizerJson(v));
  CHORUS_ASSIGN_OR_RETURN(files.tokenizer_config_json, TokenizerConfigJson(v));
  if (tok.eos_ids().size() > 1) {
    OJson g = OJson::object();
    if (tok.bos_id() >= 0) g["bos_token_id"] = tok.bos_id();
    g["eos_token_id"] = tok.eos_ids();
    files.generation_config_json = g.dump(2) + "\n";
  }
  return files;
}

Status ExportToHfDirectory(const Tokenizer& tok, const std::string& dir) {
  CHORUS_ASSIGN_OR_RETURN(HfTokenizerFiles files, ExportToHfFiles(tok));
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return InternalError("cannot create directory " + dir + ": " + ec.message());
  const std::filesystem::path d(dir);
  CHORUS_RETURN_IF_ERROR(
      WriteFileAtomically((d / "tokenizer.json").string(), files.tokenizer_json));
  CHORUS_RETURN_IF_ERROR(
      WriteFileAtomically((d / "tokenizer_config.json").string(), files.tokenizer_config_json));
  if (!files.generation_config_json.empty()) {
    CHORUS_RETURN_IF_ERROR(
        WriteFileAtomically((d / "generation_config.json").string(), files.generation_config_json));
  }
  return OkStatus();
}

}  // namespace chorus::tokenizer
