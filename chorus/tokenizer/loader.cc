// LoadTokenizer: format detection by content, and the HF side files (tokenizer_config.json,
// special_tokens_map.json, generation_config.json).
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <system_error>

#include "chorus/base/logging.h"
#include "chorus/base/mapped_file.h"
#include "chorus/formats/gguf.h"
#include "chorus/tokenizer/internal.h"

namespace chorus::tokenizer {
namespace internal {
namespace {

using Json = nlohmann::json;
namespace fs = std::filesystem;

Result<Json> ParseObject(std::string_view text, std::string_view name) {
  Json j;
  try {
    j = Json::parse(text.begin(), text.end());
  } catch (const Json::exception& e) {
    return InvalidArgumentError(std::string(name) + ": malformed JSON: " + e.what());
  }
  if (!j.is_object()) return InvalidArgumentError(std::string(name) + ": not a JSON object");
  return j;
}

// "bos_token": "<s>" or {"content": "<s>", ...} or null. Returns the id if the tokenizer knows
// the piece; an error only for a value of the wrong type.
Result<std::optional<int32_t>> TokenField(const Tokenizer& tok, const Json& obj, const char* key,
                                          std::string_view name) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return std::optional<int32_t>();
  std::string content;
  if (it->is_string()) {
    content = it->get<std::string>();
  } else if (it->is_object()) {
    auto c = it->find("content");
    if (c == it->end() || !c->is_string()) {
      return InvalidArgumentError(std::string(name) + ": '" + key + ".content' must be a string");
    }
    content = c->get<std::string>();
  } else {
    return InvalidArgumentError(std::string(name) + ": '" + key +
                                "' must be a string, an object or null");
  }
  return tok.PieceToId(content);
}

Result<bool> OptionalBool(const Json& obj, const char* key, std::string_view name,
                          std::optional<bool>* out) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return false;
  if (!it->is_boolean()) {
    return InvalidArgumentError(std::string(name) + ": '" + key + "' must be a boolean");
  }
  *out = it->get<bool>();
  return true;
}

void SetPrimaryEos(Tokenizer* tok, int32_t id) {
  std::vector<int32_t> eos{id};
  for (int32_t e : tok->eos_ids()) {
    if (e != id) eos.push_back(e);
  }
  tok->set_eos_ids(std::move(eos));
}

Status ApplyBosEos(Tokenizer* tok, const Json& j, std::string_view name) {
  CHORUS_ASSIGN_OR_RETURN(auto bos, TokenField(*tok, j, "bos_token", name));
  if (bos) tok->set_bos_id(*bos);
  CHORUS_ASSIGN_OR_RETURN(auto eos, TokenField(*tok, j, "eos_token", name));
  if (eos) SetPrimaryEos(tok, *eos);
  CHORUS_ASSIGN_OR_RETURN(auto pad, TokenField(*tok, j, "pad_token", name));
  if (pad) tok->set_pad_id(*pad);
  return OkStatus();
}

bool IsDirectory(const std::string& p) {
  std::error_code ec;
  return fs::is_directory(p, ec);
}
bool IsFile(const std::string& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec);
}

std::string Sibling(const std::string& path, std::string_view file) {
  return (fs::path(path).parent_path() / std::string(file)).string();
}

Status ApplySideFiles(Tokenizer* tok, const std::string& dir) {
  const std::pair<const char*, Status (*)(Tokenizer*, std::string_view, std::string_view)>
      kFiles[] = {{"special_tokens_map.json", ApplySpecialTokensMapJson},
                  {"tokenizer_config.json", ApplyTokenizerConfigJson},
                  {"generation_config.json", ApplyGenerationConfigJson}};
  for (const auto& [file, apply] : kFiles) {
    const std::string p = (fs::path(dir) / file).string();
    if (!IsFile(p)) continue;
    CHORUS_ASSIGN_OR_RETURN(std::string text, ReadFileToString(p, 64u << 20));
    CHORUS_RETURN_IF_ERROR(apply(tok, text, p));
  }
  return OkStatus();
}

std::string_view LStripWs(std::string_view s) {
  size_t i = 0;
  while (i < s.size() && (s[i] == ' ' || s[i] == '\n' || s[i] == '\r' || s[i] == '\t')) ++i;
  return s.substr(i);
}

// Loads one file whose format is detected from its bytes. *hf_style: whether HF side files
// (tokenizer_config.json, ...) apply to it (not to llama2.c .bin or GGUF, which carry their
// own settings).
Result<std::unique_ptr<Tokenizer>> LoadFile(const std::string& path, bool* hf_style) {
  *hf_style = false;
  CHORUS_ASSIGN_OR_RETURN(auto file, MappedFile::Open(path));
  const std::string_view bytes = file->view();
  if (bytes.substr(0, 4) == "GGUF") {
    CHORUS_ASSIGN_OR_RETURN(auto gguf, formats::GgufFile::Open(path));
    return TokenizerFromGguf(*gguf);
  }
  const std::string_view body = LStripWs(bytes);
  if (!body.empty() && body[0] == '{') {
    // tokenizer.json has a "model"; a GPT-2 vocab.json is a flat {piece: id} object and needs
    // merges.txt beside it. Decide by parsing.
    Json j;
    try {
      j = Json::parse(bytes.begin(), bytes.end());
    } catch (const Json::exception& e) {
      return InvalidArgumentError(path + ": malformed JSON: " + e.what());
    }
    // (A vocab.json may well contain the piece "model", mapped to an integer.)
    if (j.is_object() && j.contains("model") && !j["model"].is_number()) {
      *hf_style = true;
      return TokenizerFromJsonString(bytes, {}, path);
    }
    const std::string merges_path = Sibling(path, "merges.txt");
    if (!IsFile(merges_path)) {
      return InvalidArgumentError(path +
                                  ": JSON without a \"model\" (not a tokenizer.json); as a "
                                  "vocab.json it needs merges.txt beside it");
    }
    CHORUS_ASSIGN_OR_RETURN(std::string merges, ReadFileToString(merges_path));
    *hf_style = true;
    return TokenizerFromVocabMerges(bytes, merges, path);
  }
  if (LooksLikeLlama2cTokenizer(bytes)) return Llama2cTokenizerFromBytes(bytes, path);
  // SentencePiece protobufs start with field 1 (pieces), wire type 2: byte 0x0A.
  Result<std::unique_ptr<Tokenizer>> sp = InvalidArgumentError("");
  if (!bytes.empty() && bytes[0] == 0x0A) {
    sp = SentencePieceFromBytes(bytes, path);
    if (sp.ok()) {
      *hf_style = true;
      return sp;
    }
  }
  // A plausible llama2.c header (int32 max_token_length): report what is wrong with the file.
  if (bytes.size() >= 4) {
    int32_t max_len;
    std::memcpy(&max_len, bytes.data(), 4);
    if (max_len >= 1 && max_len <= (1 << 16)) return Llama2cTokenizerFromBytes(bytes, path);
  }
  if (!sp.ok() && !sp.status().message().empty()) return sp.status();
  return InvalidArgumentError(path +
                              ": unrecognized tokenizer format (expected tokenizer.json, "
                              "tokenizer.model, a llama2.c tokenizer .bin, vocab.json or GGUF)");
}

}  // namespace

Status ApplyTokenizerConfigJson(Tokenizer* tok, std::string_view json, std::string_view name) {
  if (json.empty()) return OkStatus();
  CHORUS_ASSIGN_OR_RETURN(Json j, ParseObject(json, name));
  try {
    std::optional<bool> b;
    CHORUS_ASSIGN_OR_RETURN(bool has, OptionalBool(j, "add_bos_token", name, &b));
    if (has) tok->set_add_bos(*b);
    b.reset();
    CHORUS_ASSIGN_OR_RETURN(has, OptionalBool(j, "add_eos_token", name, &b));
    if (has) tok->set_add_eos(*b);
    if (auto it = j.find("added_tokens_decoder"); it != j.end() && !it->is_null()) {
      if (!it->is_object()) {
        return InvalidArgumentError(std::string(name) +
                                    ": 'added_tokens_decoder' must be an object");
      }
      std::vector<int32_t> special = tok->special_ids();
      for (auto a = it->begin(); a != it->end(); ++a) {
        int64_t id = -1;
        const std::string& key = a.key();
        if (key.empty() || key.size() > 9 ||
            !std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; })) {
          return InvalidArgumentError(std::string(name) + ": added_tokens_decoder key '" + key +
                                      "' is not a token id");
        }
        id = std::stoll(key);
        if (!a.value().is_object()) {
          return InvalidArgumentError(std::string(name) + ": added_tokens_decoder['" + key +
                                      "'] must be an object");
        }
        auto sp = a.value().find("special");
        if (sp != a.value().end() && !sp->is_boolean()) {
          return InvalidArgumentError(std::string(name) + ": added_tokens_decoder['" + key +
                                      "'].special must be a boolean");
        }
        if (sp != a.value().end() && sp->get<bool>() && id < tok->vocab_size()) {
          special.push_back(static_cast<int32_t>(id));
        }
      }
      tok->set_special_ids(std::move(special));
    }
    CHORUS_RETURN_IF_ERROR(ApplyBosEos(tok, j, name));
    if (auto it = j.find("chat_template"); it != j.end() && !it->is_null()) {
      if (it->is_string()) {
        tok->set_chat_template(it->get<std::string>());
      } else if (it->is_array()) {
        // [{"name": "default", "template": "..."}, {"name": "tool_use", ...}]
        std::string chosen;
        for (const Json& t : *it) {
          if (!t.is_object()) continue;
          auto n = t.find("name");
          auto tpl = t.find("template");
          if (tpl == t.end() || !tpl->is_string()) continue;
          const bool is_default =
              n != t.end() && n->is_string() && n->get<std::string>() == "default";
          if (chosen.empty() || is_default) chosen = tpl->get<std::string>();
          if (is_default) break;
        }
        tok->set_chat_template(std::move(chosen));
      } else {
        return InvalidArgumentError(std::string(name) +
                                    ": 'chat_template' must be a string or a list of templates");
      }
    }
  } catch (const Json::exception& e) {
    return InvalidArgumentError(std::string(name) + ": " + e.what());
  }
  return OkStatus();
}

Status ApplySpecialTokensMapJson(Tokenizer* tok, std::string_view json, std::string_view name) {
  if (json.empty()) return OkStatus();
  CHORUS_ASSIGN_OR_RETURN(Json j, ParseObject(json, name));
  try {
    return ApplyBosEos(tok, j, name);
  } catch (const Json::exception& e) {
    return InvalidArgumentError(std::string(name) + ": " + e.what());
  }
}

Status ApplyGenerationConfigJson(Tokenizer* tok, std::string_view json, std::string_view name) {
  if (json.empty()) return OkStatus();
  CHORUS_ASSIGN_OR_RETURN(Json j, ParseObject(json, name));
  try {
    auto valid = [&](const Json& v) {
      return v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() < tok->vocab_size();
    };
    if (auto it = j.find("bos_token_id"); it != j.end() && !it->is_null()) {
      if (!valid(*it)) {
        return InvalidArgumentError(std::string(name) + ": 'bos_token_id' must be a token id");
      }
      tok->set_bos_id(it->get<int32_t>());
    }
    if (auto it = j.find("eos_token_id"); it != j.end() && !it->is_null()) {
      std::vector<int32_t> ids;
      if (it->is_array()) {
        for (const Json& v : *it) {
          if (!valid(v)) {
            return InvalidArgumentError(std::string(name) +
                                        ": 'eos_token_id' entries must be token ids");
          }
          ids.push_back(v.get<int32_t>());
        }
      } else if (valid(*it)) {
        ids.push_back(it->get<int32_t>());
      } else {
        return InvalidArgumentError(std::string(name) +
                                    ": 'eos_token_id' must be a token id or a list of them");
      }
      // The generation config's list comes first (it names the model's real stop tokens);
      // tokenizer EOS ids not in it are kept after.
      for (int32_t e : tok->eos_ids()) {
        if (std::find(ids.begin(), ids.end(), e) == ids.end()) ids.push_back(e);
      }
      tok->set_eos_ids(std::move(ids));
    }
  } catch (const Json::exception& e) {
    return InvalidArgumentError(std::string(name) + ": " + e.what());
  }
  return OkStatus();
}

}  // namespace internal

Result<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& path) {
  using internal::IsDirectory;
  using internal::IsFile;
  namespace fs = std::filesystem;
  std::unique_ptr<Tokenizer> tok;
  std::string side_dir;
  bool hf_style = false;
  if (IsDirectory(path)) {
    const fs::path dir(path);
    const std::string json = (dir / "tokenizer.json").string();
    const std::string model = (dir / "tokenizer.model").string();
    const std::string vocab = (dir / "vocab.json").string();
    const std::string bin = (dir / "tokenizer.bin").string();
    // Candidates in order of preference. A file that exists but does not load is skipped for
    // the next one with a warning naming it and why (a broken tokenizer.json beside a good
    // tokenizer.model still serves); when none loads, the first one's error is returned.
    std::vector<std::string> candidates;
    if (IsFile(json)) candidates.push_back(json);
    if (IsFile(model)) candidates.push_back(model);
    if (IsFile(vocab) && IsFile((dir / "merges.txt").string())) candidates.push_back(vocab);
    if (IsFile(bin)) candidates.push_back(bin);
    if (candidates.empty()) {
      return NotFoundError(path +
                           ": no tokenizer.json, tokenizer.model, vocab.json + merges.txt or "
                           "tokenizer.bin in this directory");
    }
    Status first_error;
    for (const std::string& file : candidates) {
      bool file_hf_style = false;
      auto loaded = internal::LoadFile(file, &file_hf_style);
      if (loaded.ok()) {
        if (!first_error.ok()) {
          CHORUS_LOG(WARNING) << "tokenizer: " << first_error.message() << "; using " << file
                              << " instead";
        }
        tok = std::move(*loaded);
        hf_style = file_hf_style;
        break;
      }
      Status s = loaded.status();
      if (s.message().find(file) == std::string::npos) s = s.WithContext(file);
      if (first_error.ok()) first_error = s;
    }
    if (!tok) return first_error;
    side_dir = path;
  } else {
    if (!IsFile(path)) {
      std::error_code ec;
      if (!fs::exists(path, ec)) return NotFoundError(path + ": no such tokenizer file");
      return InvalidArgumentError(path + ": not a regular file");
    }
    CHORUS_ASSIGN_OR_RETURN(tok, internal::LoadFile(path, &hf_style));
    const fs::path parent = fs::path(path).parent_path();
    std::error_code ec;
    side_dir = (parent.empty() ? fs::current_path(ec) : parent).string();
  }
  if (hf_style) CHORUS_RETURN_IF_ERROR(internal::ApplySideFiles(tok.get(), side_dir));
  return tok;
}

}  // namespace chorus::tokenizer
