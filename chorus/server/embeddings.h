// /v1/embeddings (OpenAI's; vLLM's, llama.cpp's and LoRAX's servers answer it too): parsing the
// body into engine requests and building the response. No HTTP here (server.cc runs the
// requests), so every rule is testable on strings.
//
// Request (docs/api.md, "Embeddings"):
//   * `input`: a string, a list of strings, a list of token ids or a list of token-id lists, at
//     most kMaxEmbeddingInputs entries (OpenAI's limit), each non-empty and at most the context
//     length (400 context_length_exceeded otherwise; vLLM's `truncate_prompt_tokens` N keeps the
//     last N tokens instead). Strings are tokenized as completions' prompts are.
//   * or vLLM's `messages` (one conversation, rendered by the chat template as for chat
//     completions, with its add_generation_prompt, chat_template and chat_template_kwargs);
//   * `model` as for completions: the base or a variant (a LoRA adapter or a delta), whose
//     weights then compute the hidden states.
//   * `encoding_format`: "float" (default) or "base64" (the little-endian float32 bytes; the
//     OpenAI SDKs ask for it by default); `dimensions` only as the model's width (no matryoshka
//     truncation); vLLM's `normalize` (default true); `user` is accepted and ignored.
// The pooling (last, mean or cls position) is the server's (--pooling), as in vLLM and
// llama.cpp.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "chorus/engine/request.h"
#include "chorus/server/api_error.h"
#include "chorus/server/openai.h"

namespace chorus::server {

inline constexpr int kMaxEmbeddingInputs = 2048;

struct EmbeddingApiRequest {
  std::vector<std::vector<int32_t>> inputs;  // token ids, one list per input
  // The `model` when it names something other than the base (as ApiRequest::variant_name).
  std::string variant_name;
  engine::EmbeddingOptions options;
  bool base64 = false;
};

// Parses a body. `pooling` is the server's; `width` the model's hidden size (`dimensions`).
std::optional<ApiError> ParseEmbeddingRequest(std::string_view body, const ApiContext& ctx,
                                              engine::Pooling pooling, int64_t width,
                                              EmbeddingApiRequest* out);

// The response: {"id","object":"list","created","data":[{"object":"embedding","index":i,
// "embedding":…}],"model","usage":{"prompt_tokens","total_tokens"}} (OpenAI's fields and vLLM's
// id and created), vectors in input order.
std::string EmbeddingResponseJson(const std::vector<std::vector<float>>& vectors, bool base64,
                                  const std::string& model, int64_t prompt_tokens,
                                  const std::string& id, int64_t created);

// RFC 4648 base64 (with padding) of `bytes`.
std::string Base64Encode(std::string_view bytes);

}  // namespace chorus::server
