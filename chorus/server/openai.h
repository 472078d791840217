// The OpenAI API surface (docs/api.md): parsing /v1/completions and /v1/chat/completions
// bodies into engine requests, and building OpenAI-shaped responses and SSE chunks from the
// engine's stream events. No HTTP here (server.h does the transport), so every rule is testable
// on strings.
//
// Request semantics (vLLM / OpenAI):
//   * `model` may be absent (the served model is used); present, it must name the served model
//     (404 model_not_found otherwise).
//   * completions `prompt`: a string, a list of strings, a list of token ids, or a list of
//     token-id lists. Each prompt yields `n` choices; choice index = prompt_index × n + i.
//     Strings are tokenized with the tokenizer's BOS rule and special tokens recognised; token
//     ids are used as given. Empty prompts are rejected.
//   * chat `messages` are rendered with the model's chat template (ApiContext::chat_template),
//     then tokenized with special tokens recognised; BOS is prepended when the tokenizer wants
//     one and the rendered text does not already start with it.
//   * `max_tokens` / `max_completion_tokens` absent → as many as fit: min(context, KV pool) −
//     prompt length.
//   * Unknown fields are ignored (as vLLM does); known fields of the wrong type or out of range
//     are 400 with `param` naming the field.
//
// Thread-safety: functions are pure; a ResponseBuilder belongs to one request/thread.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "chorus/engine/request.h"
#include "chorus/server/api_error.h"
#include "chorus/server/tool_calls.h"
#include "chorus/tokenizer/chat_template.h"
#include "chorus/tokenizer/tokenizer.h"

namespace chorus::server {

enum class ApiKind { kCompletion, kChat };

// Limits on request shapes (beyond the body size limit, which the transport enforces).
inline constexpr int kMaxPrompts = 64;         // entries of a prompt list
inline constexpr int kMaxChoices = 16;         // n (the engine's own limit)
inline constexpr int kMaxStops = 16;           // stop strings
inline constexpr size_t kMaxStopBytes = 1024;  // bytes of one stop string
inline constexpr int kMaxMessages = 4096;      // chat messages
inline constexpr int kMaxJsonDepth = 64;       // nesting of the request body
// max_tokens of a completion request that does not give one (OpenAI's and vLLM's default).
inline constexpr int64_t kDefaultCompletionTokens = 16;

// What the parser needs to know about the served model.
struct ApiContext {
  const tokenizer::Tokenizer* tok = nullptr;
  const tokenizer::ChatTemplate* chat_template = nullptr;  // required for chat
  int32_t vocab_size = 0;    // token ids accepted in prompts: [0, vocab_size)
  int64_t max_context = 0;   // prompt + completion tokens one sequence may hold
  std::string served_model;  // the base model's name
  // Whether a `model` other than served_model may name a variant (the server resolves it after
  // parsing, ApiRequest::variant_name); false: such a request is 404 model_not_found here.
  bool serves_variants = false;
  // The tool-call syntax replies are parsed with (--tool-call-parser); nullopt: detected from
  // the chat template a request is rendered with (tool_calls.h, DetectToolSyntax).
  std::optional<ToolSyntax> tool_syntax;
};

// A parsed request: one engine request per prompt, sharing everything but the prompt.
struct ApiRequest {
  ApiKind kind = ApiKind::kCompletion;
  std::vector<std::vector<int32_t>> prompts;  // token ids, one list per prompt
  std::vector<std::string> echo_text;         // per prompt, when echo
  engine::GenerationRequest gen;              // prompt empty; max_tokens = -1 when absent
  // The `model` when it names something other than the base (ApiContext::serves_variants):
  // the caller resolves it to gen.variant. Empty for the base model.
  std::string variant_name;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool echo = false;           // completions only
  // Completions: the `logprobs` int; chat: `top_logprobs` when `logprobs` is true. -1 = none.
  // With `echo`, the prompt's tokens get logprobs too (gen.prompt_logprobs).
  int logprobs = -1;
  // Completions with echo and max_tokens 0 (OpenAI's legacy call that scores a prompt; vLLM):
  // the answer is the prompt alone, with its logprobs when asked; gen.max_tokens is 1 and the
  // one sampled token is left out of text, logprobs and usage.
  bool echo_only = false;
  // vLLM's `prompt_logprobs` (both endpoints, not with stream): -1 = none; N = each prompt
  // token's logprob, rank and the N most likely tokens there, in vLLM's form (a choice's
  // `prompt_logprobs` for completions, the response's for chat).
  int prompt_logprobs = -1;
  // Chat: tools, tool_choice and parallel_tool_calls, and the syntax replies are parsed with
  // when tools.active().
  ToolsRequest tools;
  ToolSyntax tool_syntax = ToolSyntax::kGeneric;
  // tool_choice required / named (tool_grammar.h): the call's opening, appended to the prompt
  // (and fed to the reply's parser first); gen.grammar constrains the rest.
  std::string tool_opening;
};

// A prompt field (completions' `prompt`, the embeddings' `input`): a string, a list of strings,
// a list of token ids or a list of token-id lists (at most `max_entries` entries), each entry
// non-empty; strings tokenized as above, ids checked against the vocabulary. Appends each
// entry's ids to *prompts and, when `texts` is not null, its text (ids decoded).
std::optional<ApiError> ParsePromptField(const nlohmann::json& body, const char* key,
                                         const ApiContext& ctx, size_t max_entries,
                                         std::vector<std::vector<int32_t>>* prompts,
                                         std::vector<std::string>* texts);

// Parses a request body. Returns nullopt and fills *out on success.
std::optional<ApiError> ParseApiRequest(ApiKind kind, std::string_view body, const ApiContext& ctx,
                                        ApiRequest* out);

// The engine request for prompt `i` with max_tokens resolved against the context. Errors:
// 400 context_length_exceeded when the prompt leaves no room.
std::optional<ApiError> MakeGenerationRequest(const ApiRequest& req, size_t i,
                                              const ApiContext& ctx,
                                              engine::GenerationRequest* out);

// Depth of [ and { nesting outside strings; stops counting past `limit` (cheap pre-check that
// keeps hostile bodies away from any recursive JSON code).
int JsonNestingDepth(std::string_view text, int limit);

// `prefix` followed by 24 random hex digits.
std::string RandomId(std::string_view prefix);
// "cmpl-" / "chatcmpl-" followed by 24 random hex digits.
std::string NewResponseId(ApiKind kind);

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  nlohmann::json ToJson() const;
};

// Turns engine events into OpenAI responses. Feed every event of every choice (Add) and take
// FinalJson() for a non-streamed response, or turn each event into SSE text (Chunk) for a
// streamed one.
class ResponseBuilder {
 public:
  ResponseBuilder(const ApiRequest& req, const ApiContext& ctx, std::string id, int64_t created);

  // Choice index of event `ev` of prompt `prompt_index`.
  int ChoiceIndex(size_t prompt_index, const engine::StreamEvent& ev) const;

  // Non-streaming: accumulate.
  void Add(size_t prompt_index, const engine::StreamEvent& ev);
  std::string FinalJson(const Usage& usage) const;

  // Streaming. Opening chunks: chat → one role chunk per choice; completions with echo → the
  // prompt text per choice (with echo and logprobs: sent with the prompt's logprobs before the
  // choice's first token instead, once they are known). May be empty.
  std::string OpeningChunks();
  // SSE text for one event ("data: {...}\n\n"), or "" when the event carries nothing to send.
  std::string Chunk(size_t prompt_index, const engine::StreamEvent& ev);
  // The usage chunk (empty choices) when include_usage, then "data: [DONE]\n\n".
  std::string ClosingChunks(const Usage& usage) const;
  // An error in the middle of a stream: "data: {"error": ...}\n\n".
  static std::string ErrorChunk(const ApiError& e);

 private:
  struct Choice {
    size_t prompt = 0;        // the prompt it answers
    bool echo_sent = false;   // streamed: its echo chunk went out
    int32_t prev_token = -1;  // for token text in logprobs
    std::string text;
    std::string finish;  // "stop" / "length" / ""
    // Requests with active tools: the reply split into content and calls (streamed: as the
    // text arrives; else at the end).
    std::optional<ToolCallParser> tool_parser;
    int tool_calls_sent = 0;
    // completions logprobs
    nlohmann::json tokens = nlohmann::json::array();
    nlohmann::json token_logprobs = nlohmann::json::array();
    nlohmann::json top_logprobs = nlohmann::json::array();
    nlohmann::json text_offset = nlohmann::json::array();
    // chat logprobs
    nlohmann::json content = nlohmann::json::array();
  };
  // A prompt's own logprobs (GenerationRequest::prompt_logprobs), built as its prompt events
  // arrive (before any token of its choices), shown by every choice of that prompt.
  struct PromptScores {
    int32_t prev_token = -1;
    int64_t text_end = 0;  // bytes of the token texts so far: the next text_offset
    // Completions' logprobs form (echo with logprobs): the first token's entry is null.
    nlohmann::json tokens = nlohmann::json::array();
    nlohmann::json token_logprobs = nlohmann::json::array();
    nlohmann::json top_logprobs = nlohmann::json::array();
    nlohmann::json text_offset = nlohmann::json::array();
    nlohmann::json vllm = nlohmann::json::array();  // vLLM's prompt_logprobs form
  };
  void AddPromptScore(size_t prompt_index, const engine::StreamEvent& ev);
  // Echo with logprobs: the completions logprobs of prompt `p`'s tokens followed by the
  // choice's own.
  nlohmann::json EchoLogprobs(const Choice& c) const;
  bool echo_logprobs() const { return req_.echo && req_.logprobs >= 0; }
  std::string TokenText(int32_t prev, int32_t id) const;
  // Appends the logprob entries of `ev` to `c` (and to `delta`, the chunk's own logprobs).
  void AddLogprobs(Choice* c, const engine::StreamEvent& ev, nlohmann::json* delta) const;
  nlohmann::json ChunkEnvelope() const;
  // SSE chunks of a choice whose reply is parsed for tool calls.
  std::string ToolChunks(Choice* c, int idx, const engine::StreamEvent& ev, nlohmann::json lp,
                         std::string finish);
  const std::string& ModelName() const;
  static std::string Sse(const nlohmann::json& j);

  const ApiRequest& req_;
  const ApiContext& ctx_;
  std::string id_;
  int64_t created_;
  std::vector<Choice> choices_;
  std::vector<PromptScores> prompt_scores_;  // per prompt, when gen.prompt_logprobs ≥ 0
};

// Serializes JSON for the wire: invalid UTF-8 replaced by U+FFFD, never thrown.
std::string DumpJson(const nlohmann::json& j);

}  // namespace chorus::server
