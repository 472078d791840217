// Chat templates in the server (docs/chat_templates.md, docs/api.md): choosing the template
// at startup, rendering a chat request's messages with it, and the routes that show what a
// request becomes — vLLM's POST /tokenize and POST /detokenize and llama.cpp's
// POST /apply-template. No HTTP here (server.cc registers the routes), so every rule is
// testable on strings.
//
// Rendering follows transformers' apply_chat_template as vLLM calls it: the template sees
// `messages` (with tool_calls, tool_call_id, name, reasoning_content... as sent; a tool call's
// `arguments` JSON string becomes a mapping), `tools` and `documents` (None when absent),
// `add_generation_prompt`, `bos_token`, `eos_token`, and every key of `chat_template_kwargs`.
// Content given as a list of text parts is joined with "\n". A request's `chat_template`
// (vLLM's extension) replaces the server's template for that request.
//
// Thread-safety: functions are pure; ChatTemplateChoice is immutable once made.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "chorus/base/status.h"
#include "chorus/server/api_error.h"
#include "chorus/server/openai.h"
#include "chorus/tokenizer/chat_template.h"
#include "chorus/tokenizer/tokenizer.h"

namespace chorus::server {

// The template chat requests are rendered with, decided once at startup.
struct ChatTemplateChoice {
  tokenizer::ChatTemplate tmpl = tokenizer::DefaultChatTemplate();
  // Said at startup: "the model's own", "--chat-template <label>", or the ChatML fallback
  // for a model that ships no template.
  std::string note;
  bool is_fallback = false;  // ChatML because the model has none
};

// Chooses the template: `override_source` (the --chat-template text; empty = none) when
// given, else the tokenizer's own, else ChatML for a model that ships none. There is no
// silent fallback: a template that does not compile is an error (kInvalidArgument) naming
// its line, column and the missing feature, and for the model's own template the flag that
// replaces it.
Result<ChatTemplateChoice> ChooseChatTemplate(const tokenizer::Tokenizer& tok,
                                              std::string_view override_source,
                                              std::string_view override_label);

// Renders a chat request body's `messages` into the prompt text (fields above). Errors are 400s
// naming the field; a template error names the template's line. Tools (tool_calls.h): `tools`,
// `tool_choice`, `parallel_tool_calls` and the tool parts of messages are validated; the
// syntax is ctx.tool_syntax or detected from the template used; for the generic syntax the
// messages take the generic form (ApplyGenericToolForm) and the template sees no `tools`.
// `tools` / `syntax` (may be null) receive the parsed tool fields and the syntax.
std::optional<ApiError> RenderChatPrompt(std::string_view body, const ApiContext& ctx,
                                         std::string* prompt, ToolsRequest* tools = nullptr,
                                         ToolSyntax* syntax = nullptr);

// The token ids of a rendered chat prompt: special tokens recognised, BOS prepended when the
// tokenizer wants one and the text does not already start with it, no EOS.
std::vector<int32_t> EncodeChatPrompt(const tokenizer::Tokenizer& tok, const std::string& prompt);

// One route's answer.
struct RouteReply {
  int status = 200;
  std::string body;  // JSON
};

// POST /tokenize (vLLM): {"prompt": "...", "add_special_tokens": true} or {"messages": [...],
// ...chat fields..., "add_generation_prompt": true} → {"count", "max_model_len", "tokens",
// "token_strs"} ("return_token_strs": true fills token_strs).
RouteReply TokenizeRoute(std::string_view body, const ApiContext& ctx);
// POST /detokenize (vLLM): {"tokens": [ids]} → {"prompt": "text"}.
RouteReply DetokenizeRoute(std::string_view body, const ApiContext& ctx);
// POST /apply-template (llama.cpp): {"messages": [...], ...chat fields...} → {"prompt": "..."}.
RouteReply ApplyTemplateRoute(std::string_view body, const ApiContext& ctx);

// The routes above, for registration: path and handler.
struct TemplateRoute {
  const char* path;
  RouteReply (*handle)(std::string_view body, const ApiContext& ctx);
};
inline constexpr TemplateRoute kTemplateRoutes[] = {
    {"/tokenize", TokenizeRoute},
    {"/detokenize", DetokenizeRoute},
    {"/apply-template", ApplyTemplateRoute},
};
// The route's path when `path` is one of them (for metrics labels and 405s), else nullptr.
const char* TemplateRoutePath(std::string_view path);

}  // namespace chorus::server
