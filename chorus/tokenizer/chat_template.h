// Chat templates: renders OpenAI-style chat messages into a prompt with the model's own
// Hugging Face `chat_template` (tokenizer_config.json, or GGUF `tokenizer.chat_template`).
//
// The templates are Jinja2 source text. Chorus implements the subset real templates use,
// with the environment Hugging Face `apply_chat_template` uses (trim_blocks=True,
// lstrip_blocks=True, keep_trailing_newline=False, loop controls, no autoescape, immutable
// lists/dicts, `raise_exception`). The supported subset and the known gaps are listed in
// docs/chat_templates.md.
//
// Rendering is bounded: loop iterations and expression steps, bytes allocated for strings
// and lists, output size and macro recursion are capped (ChatRenderOptions), so a hostile
// template or request cannot hang the server or exhaust memory; hitting a cap is a
// kResourceExhausted error.
//
// Thread-safety: a ChatTemplate is immutable after Parse; Render is const and may be called
// from many threads at once. Copies share the parsed program.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "chorus/base/status.h"

namespace chorus::tokenizer {

namespace jinja {
struct Program;
}

// One chat message. `role` and `content` become message['role'] / message['content'].
struct ChatMessage {
  std::string role;
  std::string content;
  // Further fields of the message (e.g. "name", "tool_calls", "tool_call_id"), a JSON
  // object merged into the message mapping; a key here overrides role/content (e.g.
  // "content": null for an assistant turn that only calls tools). Ignored when not an object.
  // ordered_json keeps the request's key order, which `tojson` prints (as Hugging Face
  // does); a plain nlohmann::json converts implicitly (keys then come sorted).
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();
};

struct ChatRenderOptions {
  // Appends the header of an assistant turn (the `add_generation_prompt` variable).
  bool add_generation_prompt = true;
  // The `bos_token` / `eos_token` variables (the tokenizer's special-token strings).
  std::string bos_token;
  std::string eos_token;
  // Further variables as a JSON object (e.g. {"tools": [...], "unk_token": "<unk>"}).
  // `messages`, `add_generation_prompt`, `bos_token`, `eos_token` given here are ignored.
  // Key order is kept and shows in `tojson` output and dict iteration (tool schemas are
  // printed into the prompt): parse requests into nlohmann::ordered_json to match Hugging
  // Face exactly; a plain nlohmann::json converts implicitly with sorted keys.
  nlohmann::ordered_json extra_context = nlohmann::ordered_json::object();
  // The clock of the `strftime_now(format)` global, in seconds since the epoch (printed in
  // local time, as transformers' datetime.now() does). Negative: the current time.
  int64_t now_unix_seconds = -1;

  // --- Limits (exceeding one fails the render with kResourceExhausted) ---
  // Size of the rendered prompt (and of any one string built while rendering). Default 4 MiB.
  size_t max_output_bytes = size_t{4} << 20;
  // Evaluation steps: statements, loop iterations, element comparisons. Default 5M, far above
  // what any real template needs for a 1000-message conversation.
  int64_t max_steps = 5'000'000;
  // Bytes of strings/list slots allocated over the whole render. Default 64 MiB.
  int64_t max_alloc_bytes = int64_t{64} << 20;
  // Nesting of macro calls (recursion). Default 64.
  int max_call_depth = 64;
};

class ChatTemplate {
 public:
  // Parses a template once. Syntax errors and unsupported constructs (unknown filter or
  // test, {% include %}, ...) return kInvalidArgument with "line L, column C".
  static Result<ChatTemplate> Parse(std::string_view source);

  // Parses `source`, or returns DefaultChatTemplate() when it is empty or only whitespace
  // (a model without a template).
  static Result<ChatTemplate> ParseOrDefault(std::string_view source);

  // Renders with the variables `messages` (a list of mappings), `add_generation_prompt`,
  // `bos_token`, `eos_token` and opts.extra_context. Errors:
  //   * `raise_exception(msg)` in the template → kInvalidArgument whose message is exactly
  //     `msg` (e.g. "Conversation roles must alternate user/assistant/user/assistant/...");
  //   * runtime type errors (e.g. 'str' + int, attribute of an undefined value) →
  //     kInvalidArgument naming the template line;
  //   * a limit of `opts` exceeded → kResourceExhausted.
  Result<std::string> Render(const std::vector<ChatMessage>& messages,
                             const ChatRenderOptions& opts) const;

  // Same, with `messages` given as a JSON array of message objects (as in an OpenAI request
  // body: content may be a string, null or a list of parts; tool_calls, name, ...).
  // Use ordered_json to keep each message's key order (see ChatMessage::extra).
  Result<std::string> RenderJson(const nlohmann::ordered_json& messages,
                                 const ChatRenderOptions& opts) const;
  Result<std::string> RenderJson(const nlohmann::json& messages,
                                 const ChatRenderOptions& opts) const;

  // The template source this was parsed from.
  const std::string& source() const;

 private:
  explicit ChatTemplate(std::shared_ptr<const jinja::Program> program)
      : program_(std::move(program)) {}
  std::shared_ptr<const jinja::Program> program_;
};

// The template Chorus uses when a model has none: ChatML, the format Hugging Face
// transformers used as its class-level default —
//   <|im_start|>{role}\n{content}<|im_end|>\n   per message, then
//   <|im_start|>assistant\n                    when add_generation_prompt.
// Models whose vocabulary lacks <|im_start|>/<|im_end|> see them as plain text.
ChatTemplate DefaultChatTemplate();

// The source text of DefaultChatTemplate().
std::string_view DefaultChatTemplateSource();

}  // namespace chorus::tokenizer
