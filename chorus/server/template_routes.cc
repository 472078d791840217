#include "chorus/server/template_routes.h"

#include <utility>

namespace chorus::server {

namespace {

using ojson = nlohmann::ordered_json;

std::string ClipText(std::string_view s, size_t n) {
  if (s.size() <= n) return std::string(s);
  return std::string(s.substr(0, n)) + "...";
}

// Variables the request may not set through chat_template_kwargs (transformers passes them
// itself, and a second value would be ambiguous).
constexpr std::string_view kReservedVariables[] = {
    "messages", "tools", "documents", "add_generation_prompt", "bos_token", "eos_token"};

// OpenAI content: a string, null, or a list of text parts (joined with "\n", as vLLM's
// "string" content format does).
std::optional<ApiError> FlattenContent(ojson* content) {
  if (content->is_string() || content->is_null()) return std::nullopt;
  if (!content->is_array()) {
    return BadRequest("message content must be a string or a list of parts", "messages");
  }
  std::string text;
  bool first = true;
  for (const ojson& part : *content) {
    if (!part.is_object()) return BadRequest("message content parts must be objects", "messages");
    auto type = part.find("type");
    if (type == part.end() || !type->is_string() || *type != "text") {
      return BadRequest("only text content parts are supported", "messages", "unsupported");
    }
    auto t = part.find("text");
    if (t == part.end() || !t->is_string()) {
      return BadRequest("a text part needs a string `text`", "messages");
    }
    if (!first) text += "\n";
    text += t->get_ref<const std::string&>();
    first = false;
  }
  *content = std::move(text);
  return std::nullopt;
}

// One request message as the template sees it.
std::optional<ApiError> PrepareMessage(ojson* m) {
  if (!m->is_object()) return BadRequest("each message must be an object", "messages");
  auto role = m->find("role");
  if (role == m->end() || !role->is_string() || role->get_ref<const std::string&>().empty()) {
    return BadRequest("each message needs a string `role`", "messages");
  }
  if (auto c = m->find("content"); c != m->end()) {
    if (auto e = FlattenContent(&*c)) return e;
  }
  auto calls = m->find("tool_calls");
  if (calls == m->end() || calls->is_null()) return std::nullopt;
  if (!calls->is_array()) return BadRequest("tool_calls must be a list", "messages");
  for (ojson& call : *calls) {
    if (!call.is_object()) return BadRequest("each tool call must be an object", "messages");
    auto fn = call.find("function");
    if (fn == call.end() || !fn->is_object()) continue;
    auto args = fn->find("arguments");
    if (args == fn->end() || !args->is_string()) continue;
    // OpenAI sends arguments as a JSON string; templates print them with tojson or iterate
    // them, so they get the parsed value (vLLM does the same).
    ojson parsed = ojson::parse(args->get_ref<const std::string&>(), nullptr, false);
    if (parsed.is_discarded()) {
      return BadRequest("tool_calls[].function.arguments is not valid JSON", "messages");
    }
    *args = std::move(parsed);
  }
  return std::nullopt;
}

std::optional<ApiError> ParseObject(std::string_view body, ojson* out) {
  if (JsonNestingDepth(body, kMaxJsonDepth) > kMaxJsonDepth) {
    return BadRequest("request body is nested too deeply");
  }
  *out = ojson::parse(body, nullptr, /*allow_exceptions=*/false);
  if (out->is_discarded()) return BadRequest("request body is not valid JSON (or not UTF-8)");
  if (!out->is_object()) return BadRequest("request body must be a JSON object");
  return std::nullopt;
}

RouteReply Reply(const ApiError& e) { return {e.http_status, e.ToJson()}; }
RouteReply Reply(const ojson& j) {
  return {200, j.dump(-1, ' ', false, ojson::error_handler_t::replace)};
}

std::optional<ApiError> RenderChatObject(const ojson& j, const ApiContext& ctx, std::string* prompt,
                                         ToolsRequest* tools_out = nullptr,
                                         ToolSyntax* syntax_out = nullptr) {
  auto m = j.find("messages");
  if (m == j.end()) return BadRequest("messages is required", "messages");
  if (!m->is_array()) return BadRequest("messages must be a list", "messages");
  if (m->empty()) return BadRequest("messages must not be empty", "messages");
  if (m->size() > static_cast<size_t>(kMaxMessages)) {
    return BadRequest("at most " + std::to_string(kMaxMessages) + " messages per request",
                      "messages");
  }
  ToolsRequest tools;
  if (auto e = ParseToolsRequest(j, &tools)) return e;
  if (auto e = ValidateToolMessages(*m)) return e;
  ojson messages = *m;
  for (ojson& msg : messages) {
    if (auto e = PrepareMessage(&msg)) return e;
  }

  tokenizer::ChatRenderOptions ro;
  ro.add_generation_prompt = true;
  if (auto a = j.find("add_generation_prompt"); a != j.end() && !a->is_null()) {
    if (!a->is_boolean()) {
      return BadRequest("add_generation_prompt must be a boolean", "add_generation_prompt");
    }
    ro.add_generation_prompt = a->get<bool>();
  }
  // transformers always passes tools and documents (None when the request has none).
  ro.extra_context = ojson::object();
  for (const char* key : {"tools", "documents"}) {
    auto v = j.find(key);
    if (v == j.end() || v->is_null()) {
      ro.extra_context[key] = nullptr;
    } else if (!v->is_array()) {
      return BadRequest(std::string(key) + " must be a list", key);
    } else {
      ro.extra_context[key] = *v;
    }
  }
  if (auto kw = j.find("chat_template_kwargs"); kw != j.end() && !kw->is_null()) {
    if (!kw->is_object()) {
      return BadRequest("chat_template_kwargs must be an object", "chat_template_kwargs");
    }
    for (auto it = kw->begin(); it != kw->end(); ++it) {
      for (std::string_view r : kReservedVariables) {
        if (it.key() == r) {
          return BadRequest("chat_template_kwargs may not set '" + it.key() + "'",
                            "chat_template_kwargs");
        }
      }
      ro.extra_context[it.key()] = it.value();
    }
  }
  const tokenizer::Tokenizer& tok = *ctx.tok;
  if (tok.bos_id() >= 0) ro.bos_token = std::string(tok.Piece(tok.bos_id()));
  if (!tok.eos_ids().empty()) ro.eos_token = std::string(tok.Piece(tok.eos_ids()[0]));

  const tokenizer::ChatTemplate* tmpl = ctx.chat_template;
  std::optional<tokenizer::ChatTemplate> own;
  if (auto ct = j.find("chat_template"); ct != j.end() && !ct->is_null()) {
    if (!ct->is_string()) return BadRequest("chat_template must be a string", "chat_template");
    auto parsed = tokenizer::ChatTemplate::Parse(ct->get_ref<const std::string&>());
    if (!parsed.ok()) {
      return BadRequest(
          "chat_template does not compile: " + ClipText(parsed.status().message(), 300),
          "chat_template");
    }
    own = std::move(*parsed);
    tmpl = &*own;
  }
  if (tmpl == nullptr) {
    return ErrorFromStatus(FailedPreconditionError(
        "the server has no usable chat template; restart it with --chat-template"));
  }
  const ToolSyntax syntax = ctx.tool_syntax ? *ctx.tool_syntax : DetectToolSyntax(tmpl->source());
  if (syntax == ToolSyntax::kGeneric) {
    // The template does not show tools: the generic form describes them in a system message.
    auto t = j.find("tools");
    ApplyGenericToolForm(t != j.end() && t->is_array() ? *t : ojson::array(), tools, &messages);
    ro.extra_context["tools"] = nullptr;
  }
  if (syntax == ToolSyntax::kMistral) ShortenMistralIds(&messages);
  if (tools_out) *tools_out = std::move(tools);
  if (syntax_out) *syntax_out = syntax;
  auto rendered = tmpl->RenderJson(messages, ro);
  if (!rendered.ok()) {
    // Whatever the template says (raise_exception, an error at a line, a render limit) is about
    // this request: the client's messages do not fit the template.
    return BadRequest("chat template: " + ClipText(rendered.status().message(), 300), "messages");
  }
  *prompt = std::move(*rendered);
  return std::nullopt;
}

}  // namespace

Result<ChatTemplateChoice> ChooseChatTemplate(const tokenizer::Tokenizer& tok,
                                              std::string_view override_source,
                                              std::string_view override_label) {
  ChatTemplateChoice c;
  if (!override_source.empty()) {
    auto t = tokenizer::ChatTemplate::Parse(override_source);
    if (!t.ok()) {
      return InvalidArgumentError("--chat-template " + std::string(override_label) +
                                  " does not compile: " + t.status().message());
    }
    c.tmpl = std::move(*t);
    c.note = "--chat-template " + std::string(override_label);
    return c;
  }
  const std::string& own = tok.chat_template();
  if (own.find_first_not_of(" \t\r\n") == std::string::npos) {
    c.note = "ChatML (the model ships no chat template; --chat-template sets one)";
    c.is_fallback = true;
    return c;
  }
  auto t = tokenizer::ChatTemplate::Parse(own);
  if (!t.ok()) {
    return InvalidArgumentError(
        "the model's chat template does not compile: " + t.status().message() +
        " (pass --chat-template FILE|STRING to serve the model with another template)");
  }
  c.tmpl = std::move(*t);
  c.note = "the model's own";
  return c;
}

std::optional<ApiError> RenderChatPrompt(std::string_view body, const ApiContext& ctx,
                                         std::string* prompt, ToolsRequest* tools,
                                         ToolSyntax* syntax) {
  ojson j;
  if (auto e = ParseObject(body, &j)) return e;
  return RenderChatObject(j, ctx, prompt, tools, syntax);
}

std::vector<int32_t> EncodeChatPrompt(const tokenizer::Tokenizer& tok, const std::string& prompt) {
  std::string bos_piece;
  if (tok.bos_id() >= 0) bos_piece = std::string(tok.Piece(tok.bos_id()));
  tokenizer::EncodeOptions eo;
  eo.parse_special = true;
  eo.add_eos = false;
  // A template that prints bos_token already put BOS in the text (transformers then does not
  // add another).
  eo.add_bos = tok.add_bos() && !(!bos_piece.empty() && prompt.starts_with(bos_piece));
  return tok.Encode(prompt, eo);
}

RouteReply TokenizeRoute(std::string_view body, const ApiContext& ctx) {
  ojson j;
  if (auto e = ParseObject(body, &j)) return Reply(*e);
  bool token_strs = false;
  if (auto r = j.find("return_token_strs"); r != j.end() && !r->is_null()) {
    if (!r->is_boolean()) {
      return Reply(BadRequest("return_token_strs must be a boolean", "return_token_strs"));
    }
    token_strs = r->get<bool>();
  }
  std::vector<int32_t> ids;
  const bool has_messages = j.contains("messages");
  const bool has_prompt = j.contains("prompt");
  if (has_messages == has_prompt) {
    return Reply(BadRequest("give either prompt or messages", has_prompt ? "prompt" : "messages"));
  }
  if (has_messages) {
    std::string prompt;
    if (auto e = RenderChatObject(j, ctx, &prompt)) return Reply(*e);
    ids = EncodeChatPrompt(*ctx.tok, prompt);
  } else {
    const ojson& p = j["prompt"];
    if (!p.is_string()) return Reply(BadRequest("prompt must be a string", "prompt"));
    bool add_special = true;
    if (auto a = j.find("add_special_tokens"); a != j.end() && !a->is_null()) {
      if (!a->is_boolean()) {
        return Reply(BadRequest("add_special_tokens must be a boolean", "add_special_tokens"));
      }
      add_special = a->get<bool>();
    }
    tokenizer::EncodeOptions eo;
    eo.parse_special = true;
    eo.add_bos = add_special;
    eo.add_eos = add_special;
    ids = ctx.tok->Encode(p.get_ref<const std::string&>(), eo);
  }
  // vLLM's field order.
  ojson out = {{"count", ids.size()}, {"max_model_len", ctx.max_context}, {"tokens", ids}};
  if (token_strs) {
    ojson strs = ojson::array();
    for (int32_t id : ids) strs.push_back(std::string(ctx.tok->Piece(id)));
    out["token_strs"] = std::move(strs);
  } else {
    out["token_strs"] = nullptr;
  }
  return Reply(out);
}

RouteReply DetokenizeRoute(std::string_view body, const ApiContext& ctx) {
  ojson j;
  if (auto e = ParseObject(body, &j)) return Reply(*e);
  auto t = j.find("tokens");
  if (t == j.end() || !t->is_array()) {
    return Reply(BadRequest("tokens must be a list of token ids", "tokens"));
  }
  std::vector<int32_t> ids;
  ids.reserve(t->size());
  for (const ojson& v : *t) {
    if (!v.is_number_integer()) return Reply(BadRequest("tokens must be integers", "tokens"));
    const int64_t id = v.get<int64_t>();
    if (id < 0 || id >= ctx.vocab_size) {
      return Reply(BadRequest("token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                                  std::to_string(ctx.vocab_size) + ")",
                              "tokens"));
    }
    ids.push_back(static_cast<int32_t>(id));
  }
  // As vLLM (transformers' decode): special tokens are part of the text.
  return Reply(ojson{{"prompt", ctx.tok->Decode(ids, /*include_special=*/true)}});
}

RouteReply ApplyTemplateRoute(std::string_view body, const ApiContext& ctx) {
  std::string prompt;
  if (auto e = RenderChatPrompt(body, ctx, &prompt)) return Reply(*e);
  return Reply(ojson{{"prompt", prompt}});
}

const char* TemplateRoutePath(std::string_view path) {
  for (const auto& r : kTemplateRoutes) {
    if (path == r.path) return r.path;
  }
  return nullptr;
}

}  // namespace chorus::server
