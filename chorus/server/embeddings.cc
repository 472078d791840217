#include "chorus/server/embeddings.h"

#include <cstring>
#include <nlohmann/json.hpp>

#include "chorus/server/template_routes.h"

namespace chorus::server {
namespace {

using json = nlohmann::json;

}  // namespace

std::string Base64Encode(std::string_view bytes) {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 3 <= bytes.size(); i += 3) {
    const uint32_t v = static_cast<uint32_t>(static_cast<uint8_t>(bytes[i])) << 16 |
                       static_cast<uint32_t>(static_cast<uint8_t>(bytes[i + 1])) << 8 |
                       static_cast<uint8_t>(bytes[i + 2]);
    for (int k = 3; k >= 0; --k) out.push_back(kAlphabet[v >> (6 * k) & 63]);
  }
  const size_t rest = bytes.size() - i;
  if (rest > 0) {
    uint32_t v = static_cast<uint32_t>(static_cast<uint8_t>(bytes[i])) << 16;
    if (rest == 2) v |= static_cast<uint32_t>(static_cast<uint8_t>(bytes[i + 1])) << 8;
    out.push_back(kAlphabet[v >> 18 & 63]);
    out.push_back(kAlphabet[v >> 12 & 63]);
    out.push_back(rest == 2 ? kAlphabet[v >> 6 & 63] : '=');
    out.push_back('=');
  }
  return out;
}

std::optional<ApiError> ParseEmbeddingRequest(std::string_view body, const ApiContext& ctx,
                                              engine::Pooling pooling, int64_t width,
                                              EmbeddingApiRequest* out) {
  *out = EmbeddingApiRequest{};
  out->options.pooling = pooling;
  if (JsonNestingDepth(body, kMaxJsonDepth) > kMaxJsonDepth)
    return BadRequest("request body is nested too deeply");
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return BadRequest("request body is not valid JSON (or not UTF-8)");
  if (!j.is_object()) return BadRequest("request body must be a JSON object");

  if (auto it = j.find("model"); it != j.end() && !it->is_null()) {
    if (!it->is_string()) return BadRequest("model must be a string", "model");
    const std::string& name = it->get_ref<const std::string&>();
    if (name != ctx.served_model) {
      if (!ctx.serves_variants) {
        ApiError e =
            NotFound("The model `" + name.substr(0, 64) + "` does not exist.", "model_not_found");
        e.param = "model";
        return e;
      }
      out->variant_name = name;
    }
  }
  if (auto it = j.find("encoding_format"); it != j.end() && !it->is_null()) {
    const bool ok = it->is_string() && (*it == "float" || *it == "base64");
    if (!ok)
      return BadRequest("encoding_format must be \"float\" or \"base64\"", "encoding_format");
    out->base64 = *it == "base64";
  }
  if (auto it = j.find("dimensions"); it != j.end() && !it->is_null()) {
    if (!it->is_number_integer() || it->get<int64_t>() != width) {
      return BadRequest("dimensions must be this model's embedding width, " +
                            std::to_string(width) + " (it cannot return shortened embeddings)",
                        "dimensions");
    }
  }
  if (auto it = j.find("normalize"); it != j.end() && !it->is_null()) {
    if (!it->is_boolean()) return BadRequest("normalize must be a boolean", "normalize");
    out->options.normalize = it->get<bool>();
  }
  if (auto it = j.find("user"); it != j.end() && !it->is_null() && !it->is_string())
    return BadRequest("user must be a string", "user");
  int64_t truncate = 0;  // 0: none
  if (auto it = j.find("truncate_prompt_tokens"); it != j.end() && !it->is_null()) {
    const bool ok = it->is_number_integer() &&
                    (it->get<int64_t>() == -1 ||
                     (it->get<int64_t>() >= 1 && it->get<int64_t>() <= ctx.max_context));
    if (!ok) {
      return BadRequest("truncate_prompt_tokens must be -1 (the context length) or in [1, " +
                            std::to_string(ctx.max_context) + "]",
                        "truncate_prompt_tokens");
    }
    truncate = it->get<int64_t>() == -1 ? ctx.max_context : it->get<int64_t>();
  }

  if (j.contains("messages")) {
    // vLLM's chat embeddings: one conversation, rendered by the chat template as chat
    // completions renders it (add_generation_prompt, chat_template, chat_template_kwargs).
    if (j.contains("input")) return BadRequest("give either input or messages, not both", "input");
    std::string rendered;
    if (auto e = RenderChatPrompt(body, ctx, &rendered)) return e;
    std::vector<int32_t> ids = EncodeChatPrompt(*ctx.tok, rendered);
    if (ids.empty()) return BadRequest("the rendered conversation is empty", "messages");
    out->inputs.push_back(std::move(ids));
  } else if (auto e =
                 ParsePromptField(j, "input", ctx, kMaxEmbeddingInputs, &out->inputs, nullptr)) {
    return e;
  }
  for (size_t i = 0; i < out->inputs.size(); ++i) {
    std::vector<int32_t>& ids = out->inputs[i];
    const auto n = static_cast<int64_t>(ids.size());
    if (truncate > 0 && n > truncate) {
      ids.erase(ids.begin(), ids.begin() + (n - truncate));  // keeps the last tokens, as vLLM
    } else if (n > ctx.max_context) {
      return BadRequest("This model's maximum context length is " +
                            std::to_string(ctx.max_context) + " tokens, but input " +
                            std::to_string(i) + " has " + std::to_string(n) +
                            " tokens; shorten it or set truncate_prompt_tokens",
                        "input", "context_length_exceeded");
    }
  }
  return std::nullopt;
}

std::string EmbeddingResponseJson(const std::vector<std::vector<float>>& vectors, bool base64,
                                  const std::string& model, int64_t prompt_tokens,
                                  const std::string& id, int64_t created) {
  json data = json::array();
  for (size_t i = 0; i < vectors.size(); ++i) {
    json e = {{"object", "embedding"}, {"index", i}};
    if (base64) {
      // float32 little-endian, as the OpenAI SDKs decode it (x86-64 and AArch64 Linux are
      // little-endian).
      std::string bytes(vectors[i].size() * sizeof(float), '\0');
      if (!bytes.empty()) std::memcpy(bytes.data(), vectors[i].data(), bytes.size());
      e["embedding"] = Base64Encode(bytes);
    } else {
      json arr = json::array();
      for (float v : vectors[i]) arr.push_back(static_cast<double>(v));
      e["embedding"] = std::move(arr);
    }
    data.push_back(std::move(e));
  }
  json out = {{"id", id},
              {"object", "list"},
              {"created", created},
              {"data", std::move(data)},
              {"model", model},
              {"usage", {{"prompt_tokens", prompt_tokens}, {"total_tokens", prompt_tokens}}}};
  return out.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace chorus::server
