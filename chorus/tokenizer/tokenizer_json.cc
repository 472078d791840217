// HF tokenizers' tokenizer.json (model BPE only) and GPT-2's vocab.json + merges.txt.
//
// Supported pieces of the pipeline (anything else is a clear kUnimplemented error):
//   normalizer:     null, Sequence, Prepend("▁"), Replace(" " -> "▁"), NFC (accepted, not
//                   applied: Chorus has no Unicode normalization tables; input is usually NFC)
//   pre_tokenizer:  null, Sequence, ByteLevel, Split(Regex|String, Isolated|Removed),
//                   Digits, Metaspace("▁")
//   model:          BPE (byte_fallback, fuse_unk, unk_token, ignore_merges)
//   post_processor: TemplateProcessing (BOS/EOS around the sequence), ByteLevel, null
//   decoder:        ByteLevel / Sequence[Replace, ByteFallback, Fuse, Strip] / Metaspace
//
// Every field is type-checked: malformed input yields kInvalidArgument, never an exception.
#include <algorithm>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "chorus/tokenizer/bpe_tokenizer.h"
#include "chorus/tokenizer/internal.h"

namespace chorus::tokenizer {
namespace internal {
namespace {

using Json = nlohmann::json;

constexpr std::string_view kSpmSpace = "\xE2\x96\x81";
// Ids may leave holes (unused ids), but not so many that a tiny file allocates gigabytes.
constexpr int64_t kMaxIdSlack = 1 << 16;

Result<Json> ParseJson(std::string_view text, std::string_view name) {
  try {
    return Json::parse(text.begin(), text.end());
  } catch (const Json::exception& e) {
    return InvalidArgumentError(std::string(name) + ": malformed JSON: " + e.what());
  }
}

Status TypeError(std::string_view name, std::string_view field, std::string_view want) {
  return InvalidArgumentError(std::string(name) + ": field '" + std::string(field) + "' must be " +
                              std::string(want));
}

// Optional typed fields: absent or null -> default.
Result<bool> GetBool(const Json& obj, const char* key, bool def, std::string_view name) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return def;
  if (!it->is_boolean()) return TypeError(name, key, "a boolean");
  return it->get<bool>();
}

Result<std::string> GetString(const Json& obj, const char* key, std::string_view name,
                              std::string def = {}) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return def;
  if (!it->is_string()) return TypeError(name, key, "a string");
  return it->get<std::string>();
}

std::string TypeOf(const Json& j) {
  if (!j.is_object()) return {};
  auto it = j.find("type");
  if (it == j.end() || !it->is_string()) return {};
  return it->get<std::string>();
}

// Escapes `s` for use as a literal inside a PCRE2 pattern.
std::string RegexQuote(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

struct JsonPipeline {
  bool byte_level = false;
  bool spm = false;  // "▁" handling seen (normalizer or Metaspace)
  BpeSpec* spec = nullptr;
};

// Nesting of Sequence normalizers/pre-tokenizers/decoders accepted (recursion bound).
constexpr int kMaxDepth = 16;

Status ParseNormalizer(const Json& n, std::string_view name, JsonPipeline* p, int depth = 0) {
  if (n.is_null()) return OkStatus();
  if (depth > kMaxDepth)
    return InvalidArgumentError(std::string(name) + ": normalizer nested too deeply");
  if (!n.is_object()) return TypeError(name, "normalizer", "an object or null");
  const std::string type = TypeOf(n);
  if (type == "Sequence") {
    auto it = n.find("normalizers");
    if (it == n.end() || !it->is_array()) return TypeError(name, "normalizers", "an array");
    for (const Json& sub : *it) CHORUS_RETURN_IF_ERROR(ParseNormalizer(sub, name, p, depth + 1));
    return OkStatus();
  }
  if (type == "Prepend") {
    CHORUS_ASSIGN_OR_RETURN(std::string s, GetString(n, "prepend", name));
    if (s != kSpmSpace) {
      return UnimplementedError(std::string(name) + ": normalizer Prepend('" + s +
                                "') is not supported (only \"\u2581\")");
    }
    p->spm = true;
    p->spec->prepend = PrependScheme::kAlways;
    return OkStatus();
  }
  if (type == "Replace") {
    auto pat = n.find("pattern");
    if (pat == n.end() || !pat->is_object()) return TypeError(name, "pattern", "an object");
    auto str = pat->find("String");
    CHORUS_ASSIGN_OR_RETURN(std::string content, GetString(n, "content", name));
    if (str == pat->end() || !str->is_string() || str->get<std::string>() != " " ||
        content != kSpmSpace) {
      return UnimplementedError(std::string(name) +
                                ": normalizer Replace is supported only for \" \" -> \"\u2581\"");
    }
    p->spm = true;
    return OkStatus();
  }
  if (type == "NFC") return OkStatus();  // see the file comment
  return UnimplementedError(std::string(name) + ": normalizer type '" + type +
                            "' is not supported");
}

Status ParsePreTokenizer(const Json& n, std::string_view name, JsonPipeline* p, int depth = 0) {
  if (n.is_null()) return OkStatus();
  if (depth > kMaxDepth)
    return InvalidArgumentError(std::string(name) + ": pre_tokenizer nested too deeply");
  if (!n.is_object()) return TypeError(name, "pre_tokenizer", "an object or null");
  const std::string type = TypeOf(n);
  if (type == "Sequence") {
    auto it = n.find("pretokenizers");
    if (it == n.end() || !it->is_array()) return TypeError(name, "pretokenizers", "an array");
    for (const Json& sub : *it) CHORUS_RETURN_IF_ERROR(ParsePreTokenizer(sub, name, p, depth + 1));
    return OkStatus();
  }
  if (type == "ByteLevel") {
    p->byte_level = true;
    CHORUS_ASSIGN_OR_RETURN(bool add_prefix, GetBool(n, "add_prefix_space", false, name));
    CHORUS_ASSIGN_OR_RETURN(bool use_regex, GetBool(n, "use_regex", true, name));
    p->spec->byte_level_add_prefix_space = add_prefix;
    if (use_regex) p->spec->pre_steps.push_back({std::string(kGpt2Pattern), false});
    return OkStatus();
  }
  if (type == "Split") {
    auto pat = n.find("pattern");
    if (pat == n.end() || !pat->is_object()) return TypeError(name, "pattern", "an object");
    std::string regex;
    if (auto r = pat->find("Regex"); r != pat->end() && r->is_string()) {
      regex = r->get<std::string>();
    } else if (auto s = pat->find("String"); s != pat->end() && s->is_string()) {
      regex = RegexQuote(s->get<std::string>());
    } else {
      return TypeError(name, "pattern", "{\"Regex\": ...} or {\"String\": ...}");
    }
    CHORUS_ASSIGN_OR_RETURN(std::string behavior, GetString(n, "behavior", name, "Isolated"));
    CHORUS_ASSIGN_OR_RETURN(bool invert, GetBool(n, "invert", false, name));
    if (invert || (behavior != "Isolated" && behavior != "Removed")) {
      return UnimplementedError(std::string(name) + ": pre_tokenizer Split with behavior '" +
                                behavior + "'" + (invert ? " and invert" : "") +
                                " is not supported");
    }
    p->spec->pre_steps.push_back({regex, behavior == "Removed"});
    return OkStatus();
  }
  if (type == "Digits") {
    CHORUS_ASSIGN_OR_RETURN(bool individual, GetBool(n, "individual_digits", false, name));
    p->spec->pre_steps.push_back({individual ? "\\p{N}" : "\\p{N}+", false});
    return OkStatus();
  }
  if (type == "Metaspace") {
    CHORUS_ASSIGN_OR_RETURN(std::string repl, GetString(n, "replacement", name, "\u2581"));
    if (repl != kSpmSpace) {
      return UnimplementedError(std::string(name) + ": Metaspace replacement '" + repl +
                                "' is not supported");
    }
    p->spm = true;
    CHORUS_ASSIGN_OR_RETURN(bool legacy_prefix, GetBool(n, "add_prefix_space", true, name));
    CHORUS_ASSIGN_OR_RETURN(std::string scheme, GetString(n, "prepend_scheme", name,
                                                          legacy_prefix ? "always" : "never"));
    if (scheme == "always") {
      p->spec->prepend = PrependScheme::kAlways;
    } else if (scheme == "first") {
      p->spec->prepend = PrependScheme::kFirst;
    } else if (scheme == "never") {
      p->spec->prepend = PrependScheme::kNever;
    } else {
      return InvalidArgumentError(std::string(name) + ": unknown Metaspace prepend_scheme '" +
                                  scheme + "'");
    }
    p->spec->prepend_only_if_missing = true;
    CHORUS_ASSIGN_OR_RETURN(p->spec->metaspace_split, GetBool(n, "split", true, name));
    return OkStatus();
  }
  return UnimplementedError(std::string(name) + ": pre_tokenizer type '" + type +
                            "' is not supported");
}

// Whether the decoder drops the first space of the text (SentencePiece-style decoders).
bool DecoderStripsLeadingSpace(const Json& d, int depth = 0) {
  if (depth > kMaxDepth) return false;
  const std::string type = TypeOf(d);
  if (type == "Sequence") {
    auto it = d.find("decoders");
    if (it == d.end() || !it->is_array()) return false;
    for (const Json& sub : *it) {
      if (DecoderStripsLeadingSpace(sub, depth + 1)) return true;
    }
    return false;
  }
  if (type == "Strip") {
    auto start = d.find("start");
    auto content = d.find("content");
    return start != d.end() && start->is_number_integer() && start->get<int64_t>() >= 1 &&
           content != d.end() && content->is_string() && content->get<std::string>() == " ";
  }
  if (type == "Metaspace") {
    auto scheme = d.find("prepend_scheme");
    if (scheme != d.end() && scheme->is_string()) return scheme->get<std::string>() != "never";
    auto add = d.find("add_prefix_space");
    return add == d.end() || !add->is_boolean() || add->get<bool>();
  }
  return false;
}

// Reads the "vocab" object into pieces (index = id); holes become unused empty pieces.
Status ReadVocab(const Json& vocab, std::string_view name, std::vector<std::string>* pieces,
                 std::vector<TokenType>* types) {
  if (!vocab.is_object()) return TypeError(name, "vocab", "an object {piece: id}");
  if (vocab.empty()) return InvalidArgumentError(std::string(name) + ": empty vocab");
  int64_t max_id = -1;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    if (!it.value().is_number_integer()) {
      return InvalidArgumentError(std::string(name) + ": vocab id of '" + it.key() +
                                  "' is not an integer");
    }
    const int64_t id = it.value().get<int64_t>();
    if (id < 0 || id >= static_cast<int64_t>(vocab.size()) + kMaxIdSlack) {
      return InvalidArgumentError(std::string(name) + ": vocab id " + std::to_string(id) + " of '" +
                                  it.key() + "' is out of range");
    }
    max_id = std::max(max_id, id);
  }
  pieces->assign(max_id + 1, std::string());
  types->assign(max_id + 1, TokenType::kUnused);
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    const int64_t id = it.value().get<int64_t>();
    if ((*types)[id] != TokenType::kUnused) {
      return InvalidArgumentError(std::string(name) + ": vocab id " + std::to_string(id) +
                                  " is used by two pieces");
    }
    (*pieces)[id] = it.key();
    (*types)[id] = TokenType::kNormal;
  }
  return OkStatus();
}

Status ReadMerges(const Json& merges, std::string_view name,
                  std::vector<std::pair<std::string, std::string>>* out) {
  if (merges.is_null()) return OkStatus();
  if (!merges.is_array()) return TypeError(name, "merges", "an array");
  out->reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const Json& m = merges[i];
    if (m.is_string()) {
      const std::string& s = m.get_ref<const std::string&>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || sp == 0 || sp + 1 >= s.size() ||
          s.find(' ', sp + 1) != std::string::npos) {
        return InvalidArgumentError(std::string(name) + ": merge " + std::to_string(i) + " '" + s +
                                    "' is not two pieces separated by one space");
      }
      out->emplace_back(s.substr(0, sp), s.substr(sp + 1));
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      out->emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    } else {
      return InvalidArgumentError(std::string(name) + ": merge " + std::to_string(i) +
                                  " is neither \"a b\" nor [\"a\", \"b\"]");
    }
  }
  return OkStatus();
}

Status ReadAddedTokens(const Json& added, std::string_view name, size_t vocab_size,
                       std::vector<AddedToken>* out) {
  if (added.is_null()) return OkStatus();
  if (!added.is_array()) return TypeError(name, "added_tokens", "an array");
  for (const Json& a : added) {
    if (!a.is_object()) return TypeError(name, "added_tokens[]", "objects");
    auto id = a.find("id");
    if (id == a.end() || !id->is_number_integer())
      return TypeError(name, "added_tokens[].id", "an integer");
    const int64_t v = id->get<int64_t>();
    if (v < 0 || v >= static_cast<int64_t>(vocab_size) + kMaxIdSlack) {
      return InvalidArgumentError(std::string(name) + ": added token id " + std::to_string(v) +
                                  " is out of range");
    }
    AddedToken t;
    t.id = static_cast<int32_t>(v);
    CHORUS_ASSIGN_OR_RETURN(t.content, GetString(a, "content", name));
    if (t.content.empty())
      return InvalidArgumentError(std::string(name) + ": added token " + std::to_string(v) +
                                  " has empty content");
    CHORUS_ASSIGN_OR_RETURN(t.special, GetBool(a, "special", false, name));
    CHORUS_ASSIGN_OR_RETURN(t.lstrip, GetBool(a, "lstrip", false, name));
    CHORUS_ASSIGN_OR_RETURN(t.rstrip, GetBool(a, "rstrip", false, name));
    out->push_back(std::move(t));
  }
  return OkStatus();
}

// TemplateProcessing "single": [SpecialToken?, Sequence A, SpecialToken?] -> BOS / EOS ids.
void ReadPostProcessor(const Json& pp, const Tokenizer& tok, std::optional<int32_t>* bos,
                       std::optional<int32_t>* eos) {
  if (TypeOf(pp) != "TemplateProcessing") return;
  auto single = pp.find("single");
  if (single == pp.end() || !single->is_array()) return;
  auto special_id = [&](const Json& item) -> std::optional<int32_t> {
    if (!item.is_object()) return std::nullopt;
    auto st = item.find("SpecialToken");
    if (st == item.end() || !st->is_object()) return std::nullopt;
    auto id = st->find("id");
    if (id == st->end() || !id->is_string()) return std::nullopt;
    return tok.PieceToId(id->get<std::string>());
  };
  bool seen_sequence = false;
  for (const Json& item : *single) {
    if (item.is_object() && item.contains("Sequence")) {
      seen_sequence = true;
      continue;
    }
    auto id = special_id(item);
    if (!id) continue;
    if (!seen_sequence && !bos->has_value()) *bos = id;
    if (seen_sequence) *eos = id;
  }
}

std::optional<int32_t> FirstPresent(const Tokenizer& tok,
                                    std::initializer_list<std::string_view> names) {
  for (auto n : names) {
    if (auto id = tok.PieceToId(n)) return id;
  }
  return std::nullopt;
}

Result<std::unique_ptr<Tokenizer>> FromJsonImpl(std::string_view text, std::string_view name) {
  CHORUS_ASSIGN_OR_RETURN(Json root, ParseJson(text, name));
  if (!root.is_object()) return TypeError(name, "(root)", "an object");
  auto model_it = root.find("model");
  if (model_it == root.end() || !model_it->is_object())
    return TypeError(name, "model", "an object");
  const Json& model = *model_it;
  std::string type = TypeOf(model);
  if (type.empty() && model.contains("merges")) type = "BPE";
  if (type != "BPE") {
    return UnimplementedError(std::string(name) + ": tokenizer.json model type '" + type +
                              "' is not supported");
  }
  BpeSpec spec;
  auto vocab_it = model.find("vocab");
  if (vocab_it == model.end()) return TypeError(name, "model.vocab", "present");
  CHORUS_RETURN_IF_ERROR(ReadVocab(*vocab_it, name, &spec.pieces, &spec.types));
  if (auto m = model.find("merges"); m != model.end()) {
    CHORUS_RETURN_IF_ERROR(ReadMerges(*m, name, &spec.merges));
  }
  CHORUS_ASSIGN_OR_RETURN(spec.byte_fallback, GetBool(model, "byte_fallback", false, name));
  CHORUS_ASSIGN_OR_RETURN(spec.fuse_unk, GetBool(model, "fuse_unk", false, name));
  CHORUS_ASSIGN_OR_RETURN(spec.ignore_merges, GetBool(model, "ignore_merges", false, name));
  CHORUS_ASSIGN_OR_RETURN(std::string prefix, GetString(model, "continuing_subword_prefix", name));
  CHORUS_ASSIGN_OR_RETURN(std::string suffix, GetString(model, "end_of_word_suffix", name));
  if (!prefix.empty() || !suffix.empty()) {
    return UnimplementedError(std::string(name) +
                              ": BPE continuing_subword_prefix / end_of_word_suffix are not "
                              "supported");
  }
  CHORUS_ASSIGN_OR_RETURN(std::string unk, GetString(model, "unk_token", name));
  if (auto added = root.find("added_tokens"); added != root.end()) {
    CHORUS_RETURN_IF_ERROR(ReadAddedTokens(*added, name, spec.pieces.size(), &spec.added));
  }

  JsonPipeline p;
  p.spec = &spec;
  if (auto it = root.find("normalizer"); it != root.end()) {
    CHORUS_RETURN_IF_ERROR(ParseNormalizer(*it, name, &p));
  }
  if (auto it = root.find("pre_tokenizer"); it != root.end()) {
    CHORUS_RETURN_IF_ERROR(ParsePreTokenizer(*it, name, &p));
  }
  const Json* decoder = nullptr;
  if (auto it = root.find("decoder"); it != root.end()) decoder = &*it;
  if (!p.byte_level && decoder != nullptr && TypeOf(*decoder) == "ByteLevel") p.byte_level = true;
  if (p.byte_level && p.spm) {
    return UnimplementedError(std::string(name) +
                              ": mixing ByteLevel with \u2581 (SentencePiece) handling is not "
                              "supported");
  }
  if (p.byte_level) {
    spec.mode = BpeMode::kByteLevel;
    spec.kind = "byte-bpe";
  } else if (p.spm) {
    spec.mode = BpeMode::kSpm;
    spec.kind = "spm-bpe";
    if (!spec.pre_steps.empty()) {
      return UnimplementedError(std::string(name) +
                                ": regex pre-tokenizers with SentencePiece-style BPE are not "
                                "supported");
    }
    spec.strip_leading_space = decoder != nullptr && DecoderStripsLeadingSpace(*decoder);
  } else {
    return UnimplementedError(std::string(name) +
                              ": BPE without a ByteLevel pre-tokenizer or a SentencePiece-style "
                              "(\u2581) normalizer is not supported");
  }
  if (!unk.empty()) {
    auto it = std::find(spec.pieces.begin(), spec.pieces.end(), unk);
    if (it != spec.pieces.end()) {
      spec.unk_id = static_cast<int32_t>(it - spec.pieces.begin());
      spec.types[spec.unk_id] = TokenType::kUnknown;
    } else {
      for (const auto& a : spec.added) {
        if (a.content == unk) spec.unk_id = a.id;
      }
    }
  }

  auto built = BpeTokenizer::Create(std::move(spec));
  if (!built.ok()) return built.status().WithContext(name);
  std::unique_ptr<Tokenizer> tok = std::move(built).value();

  std::optional<int32_t> bos, eos;
  if (auto it = root.find("post_processor"); it != root.end())
    ReadPostProcessor(*it, *tok, &bos, &eos);
  tok->set_add_bos(bos.has_value());
  tok->set_add_eos(eos.has_value());
  if (!bos) bos = FirstPresent(*tok, {"<s>", "<|begin_of_text|>", "<bos>"});
  if (bos) tok->set_bos_id(*bos);
  if (!eos) {
    eos = FirstPresent(*tok, {"</s>", "<|endoftext|>", "<|end_of_text|>", "<eos>", "<|im_end|>"});
  }
  if (eos) tok->set_eos_ids({*eos});
  return tok;
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> TokenizerFromVocabMerges(std::string_view vocab_json,
                                                            std::string_view merges_txt,
                                                            std::string_view name) {
  try {
    CHORUS_ASSIGN_OR_RETURN(Json vocab, ParseJson(vocab_json, name));
    BpeSpec spec;
    spec.mode = BpeMode::kByteLevel;
    spec.kind = "byte-bpe";
    CHORUS_RETURN_IF_ERROR(ReadVocab(vocab, name, &spec.pieces, &spec.types));
    size_t pos = 0;
    size_t line_no = 0;
    while (pos < merges_txt.size()) {
      size_t end = merges_txt.find('\n', pos);
      if (end == std::string_view::npos) end = merges_txt.size();
      std::string_view line = merges_txt.substr(pos, end - pos);
      pos = end + 1;
      ++line_no;
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      if (line.empty() || (line_no == 1 && line.starts_with("#version"))) continue;
      const size_t sp = line.find(' ');
      if (sp == std::string_view::npos || sp == 0 || sp + 1 >= line.size()) {
        return InvalidArgumentError(std::string(name) + ": merges.txt line " +
                                    std::to_string(line_no) + " is not two pieces");
      }
      spec.merges.emplace_back(std::string(line.substr(0, sp)), std::string(line.substr(sp + 1)));
    }
    spec.pre_steps.push_back({std::string(kGpt2Pattern), false});
    const auto eot = std::find(spec.pieces.begin(), spec.pieces.end(), "<|endoftext|>");
    if (eot != spec.pieces.end()) {
      spec.added.push_back(
          AddedToken{*eot, static_cast<int32_t>(eot - spec.pieces.begin()), /*special=*/true});
    }
    auto built = BpeTokenizer::Create(std::move(spec));
    if (!built.ok()) return built.status().WithContext(name);
    std::unique_ptr<Tokenizer> tok = std::move(built).value();
    tok->set_add_bos(false);
    if (auto id = tok->PieceToId("<|endoftext|>")) {
      tok->set_bos_id(*id);
      tok->set_eos_ids({*id});
    }
    return tok;
  } catch (const std::exception& e) {
    return InvalidArgumentError(std::string(name) + ": " + e.what());
  }
}

}  // namespace internal

Result<std::unique_ptr<Tokenizer>> TokenizerFromJsonString(std::string_view json,
                                                           std::string_view config_json,
                                                           std::string_view name) {
  try {
    CHORUS_ASSIGN_OR_RETURN(auto tok, internal::FromJsonImpl(json, name));
    if (!config_json.empty()) {
      CHORUS_RETURN_IF_ERROR(
          internal::ApplyTokenizerConfigJson(tok.get(), config_json, "tokenizer_config.json"));
    }
    return tok;
  } catch (const std::exception& e) {
    // Defensive: every field is type-checked above, but no exception may escape.
    return InvalidArgumentError(std::string(name) + ": " + e.what());
  }
}

}  // namespace chorus::tokenizer
