// The server's input fuzzers' bodies (fuzz_entry.h).
#include "chorus/server/fuzz_entry.h"

#include <nlohmann/json.hpp>
#include <string_view>

#include "chorus/base/check.h"
#include "chorus/server/openai.h"
#include "chorus/server/template_routes.h"
#include "chorus/server/tool_calls.h"
#include "chorus/tokenizer/fuzz_entry.h"

namespace chorus::server {
namespace {

using ojson = nlohmann::ordered_json;

// The served model the API fuzzer parses against: the byte-level BPE test tokenizer (every
// byte has a token, so any prompt text tokenizes) and the ChatML template.
struct Served {
  std::unique_ptr<tokenizer::Tokenizer> tok;
  tokenizer::ChatTemplate tmpl = tokenizer::DefaultChatTemplate();
  ApiContext ctx;
};

const Served& ServedModel() {
  static const Served* s = [] {
    auto* m = new Served;
    auto tok = tokenizer::TokenizerFromJsonString(tokenizer::SmallByteLevelTokenizerJson());
    CHORUS_CHECK(tok.ok());
    m->tok = std::move(*tok);
    m->ctx.tok = m->tok.get();
    m->ctx.chat_template = &m->tmpl;
    m->ctx.vocab_size = static_cast<int32_t>(m->tok->vocab_size());
    m->ctx.max_context = 256;
    m->ctx.served_model = "fuzz-model";
    m->ctx.serves_variants = true;
    return m;
  }();
  return *s;
}

enum class Route { kCompletion, kChat, kTokenize, kDetokenize, kApplyTemplate };
constexpr int kRoutes = 5;
constexpr int kSyntaxes = 5;  // detected from the template, or one of the four

void CheckErrorBody(const std::string& body) {
  const auto j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  CHORUS_CHECK(j.is_object() && j.contains("error") && j["error"].is_object() &&
               j["error"].contains("message") && j["error"]["message"].is_string());
}

}  // namespace

bool FuzzApiRequestInput(const uint8_t* data, size_t size) {
  if (size == 0) return false;
  const Route route = static_cast<Route>(data[0] % kRoutes);
  const int syntax = (data[0] / kRoutes) % kSyntaxes;
  const std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
  ApiContext ctx = ServedModel().ctx;
  if (syntax > 0) ctx.tool_syntax = static_cast<ToolSyntax>(syntax - 1);

  if (route == Route::kTokenize || route == Route::kDetokenize || route == Route::kApplyTemplate) {
    const RouteReply r = route == Route::kTokenize     ? TokenizeRoute(body, ctx)
                         : route == Route::kDetokenize ? DetokenizeRoute(body, ctx)
                                                       : ApplyTemplateRoute(body, ctx);
    CHORUS_CHECK(r.status == 200 || (r.status >= 400 && r.status < 500)) << r.status;
    if (r.status != 200) {
      CheckErrorBody(r.body);
      return false;
    }
    CHORUS_CHECK(!nlohmann::json::parse(r.body, nullptr, false).is_discarded());
    return true;
  }

  const ApiKind kind = route == Route::kChat ? ApiKind::kChat : ApiKind::kCompletion;
  ApiRequest req;
  if (auto e = ParseApiRequest(kind, body, ctx, &req)) {
    CHORUS_CHECK(e->http_status >= 400 && e->http_status < 500) << e->http_status;
    CHORUS_CHECK(!e->message.empty());
    CheckErrorBody(e->ToJson());
    return false;
  }
  CHORUS_CHECK(!req.prompts.empty() && req.prompts.size() <= static_cast<size_t>(kMaxPrompts));
  if (kind == ApiKind::kChat) CHORUS_CHECK(req.prompts.size() == 1);
  CHORUS_CHECK(req.gen.n >= 1 && req.gen.n <= kMaxChoices) << req.gen.n;
  for (size_t i = 0; i < req.prompts.size(); ++i) {
    const auto& p = req.prompts[i];
    CHORUS_CHECK(!p.empty());
    for (int32_t id : p) CHORUS_CHECK(id >= 0 && id < ctx.vocab_size) << id;
    engine::GenerationRequest gen;
    if (auto e = MakeGenerationRequest(req, i, ctx, &gen)) {
      CHORUS_CHECK(e->http_status == 400) << e->http_status;
      continue;
    }
    CHORUS_CHECK(gen.prompt == p);
    CHORUS_CHECK(gen.max_tokens >= 1 &&
                 static_cast<int64_t>(p.size()) + gen.max_tokens <= ctx.max_context)
        << gen.max_tokens;
  }
  return true;
}

namespace {

// Prefixes `body` with the selector byte of `route` and syntax index `syntax`.
std::string Sel(Route route, int syntax, std::string_view body) {
  std::string s(1, static_cast<char>(static_cast<int>(route) + kRoutes * syntax));
  return s.append(body);
}

}  // namespace

std::vector<std::string> ApiRequestFuzzSeeds() {
  std::vector<std::string> s;
  const char* const completions[] = {
      R"({"prompt": "hello world", "max_tokens": 8})",
      R"({"model": "fuzz-model", "prompt": ["hello", "the world"], "n": 2, "temperature": 0.7,
          "top_p": 0.9, "top_k": 40, "min_p": 0.05, "seed": 7, "stop": ["\n", "wor"],
          "presence_penalty": 0.5, "frequency_penalty": -0.5, "repetition_penalty": 1.1,
          "logprobs": 2, "echo": true, "stream": true, "stream_options": {"include_usage": true}})",
      R"({"prompt": [1, 2, 3, 268], "max_tokens": 4, "ignore_eos": true, "logit_bias": {"5": -100}})",
      R"({"prompt": [[1, 2], [3, 4, 5]], "max_tokens": null, "user": "u"})",
      R"({"model": "my-adapter", "prompt": "x", "response_format": {"type": "json_object"}})",
      R"({"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {"name": "a",
          "schema": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}}}})",
      R"({"prompt": "x", "guided_grammar": "root ::= \"yes\" | \"no\""})",
      R"({"prompt": "", "max_tokens": -1, "temperature": "hot", "n": 100})",
  };
  for (const char* b : completions) s.push_back(Sel(Route::kCompletion, 0, b));
  const char* const chats[] = {
      R"({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello"}],
          "max_completion_tokens": 8, "logprobs": true, "top_logprobs": 3})",
      R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "text", "text": "there"}]}],
          "n": 3, "stream": true})",
      R"({"messages": [{"role": "user", "content": "weather in Paris?"}],
          "tools": [{"type": "function", "function": {"name": "get_weather", "description": "d",
            "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
            "required": ["city"]}}}, {"type": "function", "function": {"name": "get_time"}}],
          "tool_choice": "auto", "parallel_tool_calls": false})",
      R"({"messages": [{"role": "user", "content": "q"}],
          "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}, "strict": true}}],
          "tool_choice": {"type": "function", "function": {"name": "f"}}})",
      R"({"messages": [{"role": "user", "content": "q"}], "tools": [{"type": "function", "function": {"name": "f"}}],
          "tool_choice": "required"})",
      R"({"messages": [{"role": "user", "content": "q"},
          {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "f", "arguments": "{\"a\": 1}"}}]},
          {"role": "tool", "tool_call_id": "call_1", "content": "42"}],
          "tools": [{"type": "function", "function": {"name": "f"}}]})",
      R"({"messages": [{"role": "user", "content": "q"}], "response_format": {"type": "json_object"},
          "chat_template_kwargs": {"enable_thinking": false}, "add_generation_prompt": true})",
      R"({"messages": [{"role": "user", "content": "q"}], "chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}"})",
      R"({"messages": [], "tool_choice": "required"})",
  };
  for (int syntax = 0; syntax < kSyntaxes; ++syntax) {
    for (const char* b : chats) s.push_back(Sel(Route::kChat, syntax, b));
  }
  s.push_back(Sel(Route::kTokenize, 0, R"({"prompt": "hello world", "add_special_tokens": true})"));
  s.push_back(
      Sel(Route::kTokenize, 0,
          R"({"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": true})"));
  s.push_back(Sel(Route::kDetokenize, 0, R"({"tokens": [1, 2, 256, 266, 268]})"));
  s.push_back(Sel(
      Route::kApplyTemplate, 0,
      R"({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]})"));
  s.push_back(Sel(Route::kApplyTemplate, 1,
                  R"({"messages": [{"role": "user", "content": "u"}], "tools": [{"type": "function",
                      "function": {"name": "f"}}]})"));
  return s;
}

}  // namespace chorus::server
