// The tokenizer embedded in GGUF metadata (llama.cpp's tokenizer.ggml.* keys):
//   tokenizer.ggml.model = "llama" -> SentencePiece BPE by scores ("spm-bpe")
//   tokenizer.ggml.model = "gpt2"  -> byte-level BPE with tokenizer.ggml.merges and the
//                                     pre-tokenizer named by tokenizer.ggml.pre ("byte-bpe")
// Token types (tokenizer.ggml.token_type) decide what is matched as an added token: CONTROL and
// UNKNOWN tokens are special (parse_special), USER_DEFINED ones are always matched.
#include <algorithm>

#include "chorus/formats/gguf.h"
#include "chorus/tokenizer/bpe_tokenizer.h"
#include "chorus/tokenizer/internal.h"

namespace chorus::tokenizer {
namespace {

using internal::AddedToken;
using internal::BpeMode;
using internal::BpeSpec;
using internal::PrependScheme;
using internal::PreTokenizerStep;
using internal::TokenType;

// llama.cpp's pre-tokenizer names -> regex sequences (applied in order, each split Isolated).
Result<std::vector<PreTokenizerStep>> PreStepsFor(const std::string& pre) {
  using internal::kGpt2Pattern;
  using internal::kLlama3Pattern;
  using internal::kQwen2Pattern;
  if (pre == "default") {
    // llama.cpp LLAMA_VOCAB_PRE_TYPE_DEFAULT.
    return std::vector<PreTokenizerStep>{
        {R"([\p{P}\$\+<=>\^~\|]+)", false},
        {R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))", false},
        {R"(\p{N}+)", false},
        {R"([0-9][0-9][0-9])", false}};
  }
  static const char* const kGpt2Names[] = {"gpt-2", "gpt2", "phi-2", "roberta-bpe", "olmo", "jais"};
  static const char* const kLlama3Names[] = {"llama3", "llama-v3", "llama-bpe", "falcon3",
                                             "pixtral"};
  static const char* const kQwen2Names[] = {"qwen2", "deepseek-r1-qwen", "stablelm2", "megrez"};
  auto in = [&](const auto& names) {
    return std::any_of(std::begin(names), std::end(names), [&](const char* n) { return pre == n; });
  };
  if (in(kGpt2Names)) return std::vector<PreTokenizerStep>{{std::string(kGpt2Pattern), false}};
  if (in(kLlama3Names)) {
    return std::vector<PreTokenizerStep>{{std::string(kLlama3Pattern), false}};
  }
  if (in(kQwen2Names)) return std::vector<PreTokenizerStep>{{std::string(kQwen2Pattern), false}};
  return UnimplementedError("tokenizer.ggml.pre '" + pre +
                            "' is not supported (supported: default, gpt-2, llama-bpe/llama3, "
                            "qwen2 and their aliases)");
}

template <typename T>
Result<std::optional<T>> OptionalKey(Result<T> r) {
  if (r.ok()) return std::optional<T>(std::move(r).value());
  if (r.status().code() == StatusCode::kNotFound) return std::optional<T>();
  return r.status();
}

Result<std::unique_ptr<Tokenizer>> Build(const formats::GgufFile& gguf) {
  CHORUS_ASSIGN_OR_RETURN(std::string model, gguf.GetString("tokenizer.ggml.model"));
  BpeSpec spec;
  if (model == "llama") {
    spec.mode = BpeMode::kSpm;
    spec.kind = "spm-bpe";
  } else if (model == "gpt2") {
    spec.mode = BpeMode::kByteLevel;
    spec.kind = "byte-bpe";
  } else {
    return UnimplementedError("tokenizer.ggml.model '" + model +
                              "' is not supported (supported: llama, gpt2)");
  }
  CHORUS_ASSIGN_OR_RETURN(spec.pieces, gguf.GetStringArray("tokenizer.ggml.tokens"));
  const size_t n = spec.pieces.size();
  if (n == 0) return InvalidArgumentError("tokenizer.ggml.tokens is empty");

  CHORUS_ASSIGN_OR_RETURN(auto types, OptionalKey(gguf.GetIntArray("tokenizer.ggml.token_type")));
  spec.types.assign(n, TokenType::kNormal);
  if (types) {
    if (types->size() != n) {
      return InvalidArgumentError("tokenizer.ggml.token_type has " + std::to_string(types->size()) +
                                  " entries for " + std::to_string(n) + " tokens");
    }
    for (size_t i = 0; i < n; ++i) {
      const int64_t t = (*types)[i];
      spec.types[i] = (t >= 1 && t <= 6) ? static_cast<TokenType>(t) : TokenType::kNormal;
    }
  }
  for (size_t i = 0; i < n; ++i) {
    const TokenType t = spec.types[i];
    if (t == TokenType::kControl || t == TokenType::kUnknown || t == TokenType::kUserDefined) {
      spec.added.push_back(AddedToken{spec.pieces[i], static_cast<int32_t>(i),
                                      /*special=*/t != TokenType::kUserDefined});
    }
  }

  CHORUS_ASSIGN_OR_RETURN(auto unk, OptionalKey(gguf.GetInt("tokenizer.ggml.unknown_token_id")));
  if (unk && *unk >= 0 && *unk < static_cast<int64_t>(n)) spec.unk_id = static_cast<int32_t>(*unk);

  if (spec.mode == BpeMode::kSpm) {
    CHORUS_ASSIGN_OR_RETURN(auto scores, gguf.GetFloatArray("tokenizer.ggml.scores"));
    if (scores.size() != n) {
      return InvalidArgumentError("tokenizer.ggml.scores has " + std::to_string(scores.size()) +
                                  " entries for " + std::to_string(n) + " tokens");
    }
    spec.scores.assign(scores.begin(), scores.end());
    spec.merges_from_scores = true;
    spec.byte_fallback = true;
    CHORUS_ASSIGN_OR_RETURN(auto space_prefix,
                            OptionalKey(gguf.GetInt("tokenizer.ggml.add_space_prefix")));
    // llama.cpp prefixes every raw-text fragment (the text start and after each special token).
    spec.prepend =
        (!space_prefix || *space_prefix != 0) ? PrependScheme::kAlways : PrependScheme::kNever;
    spec.strip_leading_space = spec.prepend != PrependScheme::kNever;
  } else {
    CHORUS_ASSIGN_OR_RETURN(auto merges, gguf.GetStringArray("tokenizer.ggml.merges"));
    spec.merges.reserve(merges.size());
    for (size_t i = 0; i < merges.size(); ++i) {
      const std::string& m = merges[i];
      const size_t sp = m.find(' ', 1);
      if (sp == std::string::npos || sp + 1 >= m.size()) {
        return InvalidArgumentError("tokenizer.ggml.merges[" + std::to_string(i) + "] '" + m +
                                    "' is not two pieces separated by a space");
      }
      spec.merges.emplace_back(m.substr(0, sp), m.substr(sp + 1));
    }
    CHORUS_ASSIGN_OR_RETURN(auto pre, OptionalKey(gguf.GetString("tokenizer.ggml.pre")));
    CHORUS_ASSIGN_OR_RETURN(spec.pre_steps, PreStepsFor(pre ? *pre : "default"));
  }

  CHORUS_ASSIGN_OR_RETURN(auto built, internal::BpeTokenizer::Create(std::move(spec)));
  std::unique_ptr<Tokenizer> tok = std::move(built);

  auto valid_id = [&](const std::optional<int64_t>& v) {
    return v && *v >= 0 && *v < static_cast<int64_t>(n);
  };
  CHORUS_ASSIGN_OR_RETURN(auto bos, OptionalKey(gguf.GetInt("tokenizer.ggml.bos_token_id")));
  CHORUS_ASSIGN_OR_RETURN(auto eos, OptionalKey(gguf.GetInt("tokenizer.ggml.eos_token_id")));
  CHORUS_ASSIGN_OR_RETURN(auto eot, OptionalKey(gguf.GetInt("tokenizer.ggml.eot_token_id")));
  CHORUS_ASSIGN_OR_RETURN(auto eom, OptionalKey(gguf.GetInt("tokenizer.ggml.eom_token_id")));
  CHORUS_ASSIGN_OR_RETURN(auto add_bos, OptionalKey(gguf.GetInt("tokenizer.ggml.add_bos_token")));
  CHORUS_ASSIGN_OR_RETURN(auto add_eos, OptionalKey(gguf.GetInt("tokenizer.ggml.add_eos_token")));
  if (valid_id(bos)) tok->set_bos_id(static_cast<int32_t>(*bos));
  std::vector<int32_t> eos_ids;
  for (const auto& e : {eos, eot, eom}) {
    if (valid_id(e) && std::find(eos_ids.begin(), eos_ids.end(), *e) == eos_ids.end()) {
      eos_ids.push_back(static_cast<int32_t>(*e));
    }
  }
  tok->set_eos_ids(std::move(eos_ids));
  // llama.cpp's defaults: SPM vocabularies add BOS, BPE ones do not.
  tok->set_add_bos(add_bos ? *add_bos != 0 : model == "llama");
  tok->set_add_eos(add_eos && *add_eos != 0);
  CHORUS_ASSIGN_OR_RETURN(auto tpl, OptionalKey(gguf.GetString("tokenizer.chat_template")));
  if (tpl) tok->set_chat_template(std::move(*tpl));
  return tok;
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> TokenizerFromGguf(const formats::GgufFile& gguf) {
  auto r = Build(gguf);
  if (!r.ok()) return r.status().WithContext(gguf.path());
  return r;
}

}  // namespace chorus::tokenizer
