// OpenAI function calling (docs/api.md, "Tools"): the request side (`tools`, `tool_choice`,
// `parallel_tool_calls`, assistant `tool_calls` and `role: "tool"` messages), the choice of the
// model's tool-call syntax (detected from the chat template or named with --tool-call-parser),
// the generic system-prompt form for templates that do not show tools themselves, and the
// parsers that turn a reply into `message.tool_calls` — whole or streamed.
//
// Syntaxes (vLLM's --tool-call-parser names):
//   hermes       `<tool_call>{"name": N, "arguments": {...}}</tool_call>`, one block per call
//                (Hermes 2/3, Qwen2.5, Qwen3 and most fine-tunes trained on them);
//   llama3_json  the whole reply is `{"name": N, "parameters": {...}}` (or "arguments"),
//                optionally after `<|python_tag|>`, several calls separated by `;` (Llama 3.1+);
//   mistral      `[TOOL_CALLS][{"name": N, "arguments": {...}}, ...]` (v3 tokenizers) or
//                `[TOOL_CALLS]N[ARGS]{...}` per call (v11+ tokenizers);
//   generic      the hermes syntax, with the tools described in a system message Chorus adds
//                (GenericToolPrompt) because the template does not show `tools` itself.
// A block that does not parse as a call of a function the request offered stays content.
//
// Thread-safety: functions are pure; a ToolCallParser belongs to one choice of one request.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "chorus/server/api_error.h"

namespace chorus::server {

enum class ToolSyntax { kHermes, kLlama3Json, kMistral, kGeneric };

// "hermes", "llama3_json", "mistral", "generic".
const char* ToolSyntaxName(ToolSyntax s);
// The syntax named `name` (the names above); nullopt for anything else ("auto" included).
std::optional<ToolSyntax> ToolSyntaxFromName(std::string_view name);

// Whether a chat template shows the `tools` variable (the word `tools` outside string literals
// is enough: templates that take tools read that variable).
bool TemplateUsesTools(std::string_view template_source);
// The syntax a template's model uses, from the markers its source prints: `[TOOL_CALLS]` →
// mistral; `<tool_call>` → hermes; `<|python_tag|>` or Llama's `"parameters"` JSON form →
// llama3_json; a template that does not use `tools` → generic; any other template that uses
// `tools` → hermes (the most common syntax; --tool-call-parser overrides).
ToolSyntax DetectToolSyntax(std::string_view template_source);

enum class ToolChoice { kNone, kAuto, kRequired, kNamed };

struct ToolSpec {
  std::string name;
  nlohmann::ordered_json parameters;  // a JSON-schema object (key order kept); {} when none given
  bool strict = false;
};

// Limits on the tools of one request (OpenAI's).
inline constexpr int kMaxTools = 128;
inline constexpr size_t kMaxToolNameBytes = 64;

// The tool part of a chat request.
struct ToolsRequest {
  std::vector<ToolSpec> tools;
  // Absent tool_choice: auto when tools are given, none otherwise (OpenAI's default).
  ToolChoice choice = ToolChoice::kNone;
  std::string named;  // the function of ToolChoice::kNamed
  bool parallel = true;
  // Whether replies are parsed for tool calls.
  bool active() const { return !tools.empty() && choice != ToolChoice::kNone; }
  const ToolSpec* Find(std::string_view name) const;
};

// Parses and validates `tools`, `tool_choice` and `parallel_tool_calls` of a chat body. Errors
// are 400s whose `param` names the field (e.g. "tools[2].function.name").
std::optional<ApiError> ParseToolsRequest(const nlohmann::ordered_json& body, ToolsRequest* out);

// Validates the tool parts of `messages`: assistant `tool_calls` (a list of {id, type
// "function", function {name, arguments (a string)}}; content may then be null or absent) and
// `role: "tool"` messages (a string `tool_call_id`). `param` names the message, e.g.
// "messages[3].tool_call_id".
std::optional<ApiError> ValidateToolMessages(const nlohmann::ordered_json& messages);

// The generic form, for templates that do not show tools: a system message describing the
// tools and the hermes syntax is put first (appended to the request's own system message when
// there is one); assistant tool_calls become `<tool_call>` blocks in the assistant's content,
// and each run of `tool` messages one user message of `<tool_response>` blocks — so templates
// that only know user/assistant/system render the conversation. `messages` are as the template
// sees them (arguments already parsed).
void ApplyGenericToolForm(const nlohmann::ordered_json& tools, const ToolsRequest& req,
                          nlohmann::ordered_json* messages);
// The system text of the generic form.
std::string GenericToolPrompt(const nlohmann::ordered_json& tools, const ToolsRequest& req);

struct ToolCall {
  std::string id;  // "call_" + 24 random alphanumerics
  std::string name;
  std::string arguments;  // a JSON object, serialized
};

// What a piece of reply turned into.
struct ToolParseOutput {
  std::string content;          // text for message.content / delta.content
  std::vector<ToolCall> calls;  // calls completed by this piece
};

// Splits a reply, fed piece by piece as it streams, into content and tool calls. Text that may
// be the start of a call (a prefix of its marker, an open block) is held back until decided;
// whitespace around calls is not content. Feeding the reply in any split gives the same
// concatenated output as feeding it whole.
class ToolCallParser {
 public:
  ToolCallParser(ToolSyntax syntax, const ToolsRequest* req);
  ToolParseOutput Feed(std::string_view text);
  // The end of the reply: releases what is held back (an unclosed block is parsed as a call
  // when it is one, else it is content).
  ToolParseOutput Finish();
  int calls() const { return n_calls_; }

 private:
  enum class State { kStart, kText, kInCall, kPlain };
  void Run(bool at_end, ToolParseOutput* out);
  bool StepHermes(bool at_end, ToolParseOutput* out);
  bool StepMistral(bool at_end, ToolParseOutput* out);
  bool StepLlama(bool at_end, ToolParseOutput* out);
  // Content text, with whitespace next to calls dropped.
  void EmitText(std::string_view t, ToolParseOutput* out);
  void EmitCall(ToolCall c, ToolParseOutput* out);
  // Emits `s` in kText while holding back a suffix that may begin `marker`.
  void EmitUpToMarker(std::string_view marker, ToolParseOutput* out);
  // In text: emits the text before `marker` and enters the call (true), or emits what cannot
  // start it (false; everything at the end).
  bool TextUntil(std::string_view marker, bool at_end, ToolParseOutput* out);
  // Drops the first `n` bytes of buf_.
  void Consume(size_t n);
  // Incremental scans of buf_ (each byte looked at once however the reply is split):
  // one past the JSON object/array starting at buf_[start], or npos while it is open;
  // the first `marker` outside JSON strings, or npos.
  size_t ScanBalanced(size_t start);
  size_t ScanOutsideStrings(std::string_view marker);

  ToolSyntax syntax_;
  const ToolsRequest* req_;
  State state_ = State::kStart;
  std::string buf_;  // undecided text
  struct Scan {
    size_t start = std::string::npos;  // where the scanned value starts in buf_
    size_t pos = 0;                    // next byte to look at
    int depth = 0;
    bool in_string = false, escaped = false;
  };
  Scan scan_;
  std::string ws_hold_;
  bool after_call_ = false;
  int n_calls_ = 0;
};

// Parses a whole reply (Feed + Finish of one parser).
ToolParseOutput ParseToolCalls(ToolSyntax syntax, const ToolsRequest& req, std::string_view text);

// A new tool-call id: "call_" + 24 random alphanumerics; for mistral 9 alphanumerics, the only
// form Mistral's chat templates accept back (they raise on any other).
std::string NewToolCallId(ToolSyntax syntax = ToolSyntax::kHermes);
inline constexpr size_t kMistralIdChars = 9;

// Mistral's templates require 9-character ids: tool call ids and tool_call_id values of
// `messages` longer than that are cut to their last 9 characters (as vLLM does), so a
// conversation with ids from another server still renders.
void ShortenMistralIds(nlohmann::ordered_json* messages);

}  // namespace chorus::server
