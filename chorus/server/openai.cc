#include "chorus/server/openai.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <random>

#include "chorus/engine/engine.h"
#include "chorus/engine/sampler.h"
#include "chorus/grammar/json_schema.h"
#include "chorus/server/template_routes.h"
#include "chorus/server/tool_grammar.h"

namespace chorus::server {
namespace {

using json = nlohmann::json;

// Logprobs of −inf (a token the model rules out) are reported as this, as vLLM does: JSON has
// no infinity.
constexpr double kMinLogprob = -9999.0;

std::string Clip(std::string_view s, size_t n = 64) {
  if (s.size() <= n) return std::string(s);
  return std::string(s.substr(0, n)) + "...";
}

const json* Field(const json& body, const char* key) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

std::optional<ApiError> GetBool(const json& body, const char* key, bool* out) {
  const json* v = Field(body, key);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) return BadRequest(std::string(key) + " must be a boolean", key);
  *out = v->get<bool>();
  return std::nullopt;
}

// A JSON number as an integer: integer literals, or floats with an integral value.
bool AsInt(const json& v, int64_t* out) {
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX)) return false;
    *out = static_cast<int64_t>(u);
    return true;
  }
  if (v.is_number_integer()) {
    *out = v.get<int64_t>();
    return true;
  }
  if (v.is_number_float()) {
    double d = v.get<double>();
    if (!std::isfinite(d) || std::floor(d) != d || std::fabs(d) > 9.0e15) return false;
    *out = static_cast<int64_t>(d);
    return true;
  }
  return false;
}

std::optional<ApiError> GetInt(const json& body, const char* key, int64_t lo, int64_t hi,
                               int64_t* out, bool* present = nullptr) {
  const json* v = Field(body, key);
  if (!v) return std::nullopt;
  int64_t x = 0;
  if (!AsInt(*v, &x)) return BadRequest(std::string(key) + " must be an integer", key);
  if (x < lo || x > hi) {
    return BadRequest(std::string(key) + " must be in [" + std::to_string(lo) + ", " +
                          std::to_string(hi) + "], got " + std::to_string(x),
                      key);
  }
  *out = x;
  if (present) *present = true;
  return std::nullopt;
}

// A number in [lo, hi] (open at lo when lo_open).
std::optional<ApiError> GetFloat(const json& body, const char* key, double lo, double hi,
                                 bool lo_open, float* out) {
  const json* v = Field(body, key);
  if (!v) return std::nullopt;
  if (!v->is_number()) return BadRequest(std::string(key) + " must be a number", key);
  double d = v->get<double>();
  if (!std::isfinite(d) || d < lo || d > hi || (lo_open && d == lo)) {
    char buf[160];
    std::snprintf(buf, sizeof(buf), "%s must be in %c%g, %g], got %g", key, lo_open ? '(' : '[', lo,
                  hi, d);
    return BadRequest(buf, key);
  }
  *out = static_cast<float>(d);
  return std::nullopt;
}

std::optional<ApiError> CheckTokenIds(const json& arr, int32_t vocab, const char* param,
                                      std::vector<int32_t>* out) {
  out->clear();
  out->reserve(arr.size());
  for (const json& t : arr) {
    int64_t id = 0;
    if (!AsInt(t, &id))
      return BadRequest(std::string(param) + " token ids must be integers", param);
    if (id < 0 || id >= vocab) {
      return BadRequest(std::string(param) + " token id " + std::to_string(id) +
                            " is outside the vocabulary [0, " + std::to_string(vocab) + ")",
                        param);
    }
    out->push_back(static_cast<int32_t>(id));
  }
  return std::nullopt;
}

std::optional<ApiError> ParsePrompt(const json& body, const ApiContext& ctx, ApiRequest* out) {
  return ParsePromptField(body, "prompt", ctx, kMaxPrompts, &out->prompts, &out->echo_text);
}

// Chat messages go through the chat template (template_routes.h renders them, with tools,
// documents and chat_template_kwargs; the raw body keeps the request's key order for tojson).
std::optional<ApiError> ParseMessages(std::string_view raw_body, const ApiContext& ctx,
                                      ApiRequest* out) {
  std::string rendered;
  if (auto e = RenderChatPrompt(raw_body, ctx, &rendered, &out->tools, &out->tool_syntax)) return e;
  if (ToolChoiceForced(out->tools)) {
    // The reply is forced to be a call (docs/api.md, "Tools"): its opening ends the prompt and
    // the grammar engine constrains the call object to an allowed function and its schema.
    if (out->gen.grammar.valid()) {
      return BadRequest(
          "tool_choice \"required\" or a named function cannot be combined with another "
          "constraint on the reply (response_format, grammar)",
          "tool_choice");
    }
    ToolConstraint tc;
    if (auto e = BuildToolConstraint(out->tool_syntax, out->tools, &tc)) return e;
    rendered += tc.opening;
    out->tool_opening = std::move(tc.opening);
    out->gen.grammar = std::move(tc.grammar);
  }
  // Mistral's [TOOL_CALLS] and Llama's <|python_tag|> are special tokens: keep them in the
  // text the parser reads (as vLLM does for these parsers).
  if (out->tools.active() &&
      (out->tool_syntax == ToolSyntax::kMistral || out->tool_syntax == ToolSyntax::kLlama3Json)) {
    out->gen.skip_special_tokens = false;
  }
  std::vector<int32_t> ids = EncodeChatPrompt(*ctx.tok, rendered);
  if (ids.empty()) return BadRequest("the rendered conversation is empty", "messages");
  out->prompts.push_back(std::move(ids));
  out->echo_text.push_back({});
  return std::nullopt;
}

std::optional<ApiError> ParseStop(const json& body, ApiRequest* out) {
  const json* s = Field(body, "stop");
  if (!s) return std::nullopt;
  auto add = [&](const json& v) -> std::optional<ApiError> {
    if (!v.is_string()) return BadRequest("stop must be a string or a list of strings", "stop");
    const auto& str = v.get_ref<const std::string&>();
    if (str.empty()) return BadRequest("stop strings must not be empty", "stop");
    if (str.size() > kMaxStopBytes) {
      return BadRequest("stop strings must be at most " + std::to_string(kMaxStopBytes) + " bytes",
                        "stop");
    }
    out->gen.stop.push_back(str);
    return std::nullopt;
  };
  if (s->is_string()) return add(*s);
  if (!s->is_array()) return BadRequest("stop must be a string or a list of strings", "stop");
  if (s->size() > static_cast<size_t>(kMaxStops)) {
    return BadRequest("at most " + std::to_string(kMaxStops) + " stop strings", "stop");
  }
  for (const json& v : *s) {
    if (auto e = add(v)) return e;
  }
  return std::nullopt;
}

// Structured outputs (docs/structured_outputs.md): OpenAI's response_format, and llama.cpp's
// `grammar` (GBNF) and `json_schema` fields, on both routes. At most one constraint; compiled
// grammars come from the shared cache (the same schema compiles once). A schema or grammar that
// cannot be compiled is a 400 naming the field, with the compiler's message (which names the
// keyword and its location).
// Schemas compile from an order-preserving parse of the body, so properties come out in the
// order the client wrote them (as OpenAI's structured outputs do).
// Most strings guided_choice may list (each one alternative of the grammar).
constexpr size_t kMaxGuidedChoices = 1024;

// `text` as a GBNF string literal: quotes, backslashes and control bytes escaped; other bytes
// (UTF-8 included) as they are.
std::string GbnfLiteral(const std::string& text) {
  std::string out = "\"";
  for (unsigned char ch : text) {
    switch (ch) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (ch < 0x20 || ch == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\x%02X", ch);
          out += buf;
        } else {
          out += static_cast<char>(ch);
        }
    }
  }
  return out + "\"";
}

std::optional<ApiError> ParseStructuredOutput(const json& j, std::string_view body,
                                              engine::GenerationRequest* g) {
  std::optional<nlohmann::ordered_json> ordered;
  auto ordered_at = [&](std::initializer_list<const char*> path) -> const nlohmann::ordered_json* {
    if (!ordered)
      ordered = nlohmann::ordered_json::parse(body, nullptr, /*allow_exceptions=*/false);
    const nlohmann::ordered_json* node = &*ordered;
    for (const char* key : path) {
      if (!node->is_object()) return nullptr;
      auto it = node->find(key);
      if (it == node->end()) return nullptr;
      node = &*it;
    }
    return node;
  };
  auto schema_grammar = [&](const json& plain, std::initializer_list<const char*> path) {
    const nlohmann::ordered_json* o = ordered_at(path);
    return o != nullptr ? grammar::CachedOrderedJsonSchema(*o) : grammar::CachedJsonSchema(plain);
  };
  const char* source = nullptr;
  auto once = [&](const char* field) -> std::optional<ApiError> {
    if (source != nullptr) {
      return BadRequest(std::string("only one of response_format, grammar, json_schema and "
                                    "guided_* may constrain the output (got ") +
                            source + " and " + field + ")",
                        field);
    }
    source = field;
    return std::nullopt;
  };
  auto compiled = [&](Result<grammar::Grammar> r, const char* param,
                      const std::string& what) -> std::optional<ApiError> {
    if (!r.ok()) return BadRequest("invalid " + what + ": " + r.status().message(), param);
    g->grammar = *r;
    return std::nullopt;
  };
  if (const json* rf = Field(j, "response_format")) {
    if (!rf->is_object()) return BadRequest("response_format must be an object", "response_format");
    auto type = rf->find("type");
    if (type == rf->end() || !type->is_string()) {
      return BadRequest(
          "response_format.type must be one of \"text\", \"json_object\", "
          "\"json_schema\"",
          "response_format.type");
    }
    const std::string& t = type->get_ref<const std::string&>();
    if (t == "json_object") {
      if (auto e = once("response_format")) return e;
      g->grammar = grammar::AnyJsonObjectGrammar();
    } else if (t == "json_schema") {
      if (auto e = once("response_format")) return e;
      auto js = rf->find("json_schema");
      if (js == rf->end() || !js->is_object()) {
        return BadRequest("response_format.json_schema must be an object with a schema",
                          "response_format.json_schema");
      }
      if (auto n = js->find("name"); n != js->end() && !n->is_string()) {
        return BadRequest("response_format.json_schema.name must be a string",
                          "response_format.json_schema.name");
      }
      if (auto st = js->find("strict"); st != js->end() && !st->is_null() && !st->is_boolean()) {
        return BadRequest("response_format.json_schema.strict must be a boolean",
                          "response_format.json_schema.strict");
      }
      auto schema = js->find("schema");
      if (schema == js->end() || !(schema->is_object() || schema->is_boolean())) {
        return BadRequest("response_format.json_schema.schema must be a JSON schema object",
                          "response_format.json_schema.schema");
      }
      // Enforced whatever `strict` says: the output always validates (docs/structured_outputs.md).
      if (auto e = compiled(schema_grammar(*schema, {"response_format", "json_schema", "schema"}),
                            "response_format.json_schema.schema", "JSON schema"))
        return e;
    } else if (t != "text") {
      return BadRequest(
          "response_format.type must be one of \"text\", \"json_object\", "
          "\"json_schema\", got \"" +
              Clip(t) + "\"",
          "response_format.type");
    }
  }
  if (const json* gr = Field(j, "grammar")) {
    if (!gr->is_string()) return BadRequest("grammar must be a GBNF string", "grammar");
    if (auto e = once("grammar")) return e;
    if (auto e =
            compiled(grammar::CachedGbnf(gr->get_ref<const std::string&>()), "grammar", "grammar"))
      return e;
  }
  if (const json* js = Field(j, "json_schema")) {
    if (!(js->is_object() || js->is_boolean()))
      return BadRequest("json_schema must be a JSON schema object", "json_schema");
    if (auto e = once("json_schema")) return e;
    if (auto e = compiled(schema_grammar(*js, {"json_schema"}), "json_schema", "JSON schema"))
      return e;
  }
  // vLLM's extensions (extra body fields of its OpenAI server; docs/structured_outputs.md).
  if (const json* gj = Field(j, "guided_json"); gj != nullptr && !gj->is_null()) {
    if (auto e = once("guided_json")) return e;
    if (gj->is_string()) {  // a schema sent as a JSON string
      const std::string& text = gj->get_ref<const std::string&>();
      auto parsed = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
      if (parsed.is_discarded() || !(parsed.is_object() || parsed.is_boolean()))
        return BadRequest("guided_json must be a JSON schema (an object or its JSON text)",
                          "guided_json");
      if (auto e = compiled(grammar::CachedOrderedJsonSchema(parsed), "guided_json", "JSON schema"))
        return e;
    } else if (gj->is_object() || gj->is_boolean()) {
      if (auto e = compiled(schema_grammar(*gj, {"guided_json"}), "guided_json", "JSON schema"))
        return e;
    } else {
      return BadRequest("guided_json must be a JSON schema (an object or its JSON text)",
                        "guided_json");
    }
  }
  if (const json* gc = Field(j, "guided_choice"); gc != nullptr && !gc->is_null()) {
    if (auto e = once("guided_choice")) return e;
    if (!gc->is_array() || gc->empty() || gc->size() > kMaxGuidedChoices)
      return BadRequest(
          "guided_choice must be a list of 1 to " + std::to_string(kMaxGuidedChoices) + " strings",
          "guided_choice");
    // The output is exactly one of the strings: root ::= "a" | "b" | …
    std::string gbnf = "root ::= ";
    for (size_t k = 0; k < gc->size(); ++k) {
      const json& c = (*gc)[k];
      if (!c.is_string() || c.get_ref<const std::string&>().empty())
        return BadRequest("guided_choice[" + std::to_string(k) + "] must be a non-empty string",
                          "guided_choice");
      gbnf += (k == 0 ? "" : " | ") + GbnfLiteral(c.get_ref<const std::string&>());
    }
    if (auto e = compiled(grammar::CachedGbnf(gbnf), "guided_choice", "guided_choice")) return e;
  }
  if (const json* gg = Field(j, "guided_grammar"); gg != nullptr && !gg->is_null()) {
    if (!gg->is_string())
      return BadRequest("guided_grammar must be a GBNF string", "guided_grammar");
    if (auto e = once("guided_grammar")) return e;
    if (auto e = compiled(grammar::CachedGbnf(gg->get_ref<const std::string&>()), "guided_grammar",
                          "grammar"))
      return e;
  }
  if (const json* gr = Field(j, "guided_regex"); gr != nullptr && !gr->is_null()) {
    if (!gr->is_string() || gr->get_ref<const std::string&>().empty())
      return BadRequest("guided_regex must be a non-empty regex string", "guided_regex");
    if (auto e = once("guided_regex")) return e;
    if (auto e = compiled(grammar::CachedRegex(gr->get_ref<const std::string&>(), ""),
                          "guided_regex", "guided_regex"))
      return e;
  }
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> ParsePromptField(const json& body, const char* key, const ApiContext& ctx,
                                         size_t max_entries,
                                         std::vector<std::vector<int32_t>>* prompts,
                                         std::vector<std::string>* texts) {
  const std::string name(key);
  const json* p = Field(body, key);
  if (!p) return BadRequest(name + " is required", key);
  tokenizer::EncodeOptions eo;
  eo.add_bos = ctx.tok->add_bos();
  eo.parse_special = true;
  auto add_text = [&](const std::string& s) -> std::optional<ApiError> {
    if (s.empty()) return BadRequest(name + " must not be empty", key);
    std::vector<int32_t> ids = ctx.tok->Encode(s, eo);
    if (ids.empty()) return BadRequest(name + " must not be empty", key);
    prompts->push_back(std::move(ids));
    if (texts != nullptr) texts->push_back(s);
    return std::nullopt;
  };
  auto add_ids = [&](const json& arr) -> std::optional<ApiError> {
    if (arr.empty()) return BadRequest(name + " must not be empty", key);
    std::vector<int32_t> ids;
    if (auto e = CheckTokenIds(arr, ctx.vocab_size, key, &ids)) return e;
    if (texts != nullptr) texts->push_back(ctx.tok->Decode(ids));
    prompts->push_back(std::move(ids));
    return std::nullopt;
  };
  if (p->is_string()) return add_text(p->get_ref<const std::string&>());
  if (!p->is_array())
    return BadRequest(name + " must be a string, a list of strings or a list of token ids", key);
  if (p->empty()) return BadRequest(name + " must not be empty", key);
  const json& first = (*p)[0];
  if (first.is_number()) return add_ids(*p);
  if (p->size() > max_entries) {
    return BadRequest(
        "at most " + std::to_string(max_entries) + " entries in " + name + " per request", key);
  }
  for (const json& e : *p) {
    if (first.is_string() && e.is_string()) {
      if (auto err = add_text(e.get_ref<const std::string&>())) return err;
    } else if (first.is_array() && e.is_array()) {
      if (auto err = add_ids(e)) return err;
    } else {
      return BadRequest(name +
                            " must be a string, a list of strings, a list of token ids or a list "
                            "of token-id lists",
                        key);
    }
  }
  return std::nullopt;
}

int JsonNestingDepth(std::string_view text, int limit) {
  int depth = 0, max_depth = 0;
  bool in_string = false, escaped = false;
  for (char ch : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (ch == '\\') {
        escaped = true;
      } else if (ch == '"') {
        in_string = false;
      }
      continue;
    }
    if (ch == '"') {
      in_string = true;
    } else if (ch == '[' || ch == '{') {
      if (++depth > max_depth) {
        max_depth = depth;
        if (max_depth > limit) return max_depth;
      }
    } else if (ch == ']' || ch == '}') {
      if (depth > 0) --depth;
    }
  }
  return max_depth;
}

std::optional<ApiError> ParseApiRequest(ApiKind kind, std::string_view body, const ApiContext& ctx,
                                        ApiRequest* out) {
  *out = ApiRequest{};
  out->kind = kind;
  if (JsonNestingDepth(body, kMaxJsonDepth) > kMaxJsonDepth)
    return BadRequest("request body is nested too deeply");
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return BadRequest("request body is not valid JSON (or not UTF-8)");
  if (!j.is_object()) return BadRequest("request body must be a JSON object");

  if (const json* m = Field(j, "model")) {
    if (!m->is_string()) return BadRequest("model must be a string", "model");
    const std::string& name = m->get_ref<const std::string&>();
    if (name != ctx.served_model) {
      if (ctx.serves_variants) {
        out->variant_name = name;
      } else {
        ApiError e = NotFound("The model `" + Clip(name) + "` does not exist.", "model_not_found");
        e.param = "model";
        return e;
      }
    }
  }

  // Everything except the prompt first (cheap), then the prompt (tokenization, rendering).
  auto& g = out->gen;
  g.max_tokens = -1;
  bool present = false;
  int64_t v = 0;
  constexpr int64_t kMaxTokensLimit = int64_t{1} << 30;
  if (kind == ApiKind::kChat) {
    present = false;
    if (auto e = GetInt(j, "max_completion_tokens", 1, kMaxTokensLimit, &v, &present)) return e;
    if (present) g.max_tokens = v;
  }
  if (g.max_tokens < 0) {
    // 0 is a completions request scoring its prompt (with echo; checked below).
    present = false;
    if (auto e = GetInt(j, "max_tokens", kind == ApiKind::kCompletion ? 0 : 1, kMaxTokensLimit, &v,
                        &present))
      return e;
    if (present) g.max_tokens = v;
  }
  v = 1;
  if (auto e = GetInt(j, "n", 1, kMaxChoices, &v)) return e;
  g.n = static_cast<int>(v);
  if (const json* b = Field(j, "best_of")) {
    int64_t best_of = 0;
    if (!AsInt(*b, &best_of) || best_of != g.n) {
      return BadRequest("best_of other than n is not supported", "best_of", "unsupported");
    }
  }

  auto& sp = g.sampling;
  if (auto e = GetFloat(j, "temperature", 0.0, engine::kMaxTemperature, false, &sp.temperature))
    return e;
  if (auto e = GetFloat(j, "top_p", 0.0, 1.0, true, &sp.top_p)) return e;
  v = 0;
  if (auto e = GetInt(j, "top_k", -1, INT32_MAX, &v)) return e;
  sp.top_k = static_cast<int32_t>(v);
  if (auto e = GetFloat(j, "min_p", 0.0, 1.0, false, &sp.min_p)) return e;
  if (auto e = GetFloat(j, "presence_penalty", -2.0, 2.0, false, &sp.presence_penalty)) return e;
  if (auto e = GetFloat(j, "frequency_penalty", -2.0, 2.0, false, &sp.frequency_penalty)) return e;
  if (auto e = GetFloat(j, "repetition_penalty", 0.0, engine::kMaxRepetitionPenalty, true,
                        &sp.repetition_penalty))
    return e;
  if (const json* s = Field(j, "seed")) {
    if (s->is_number_unsigned()) {
      sp.seed = s->get<uint64_t>();
    } else {
      int64_t seed = 0;
      if (!AsInt(*s, &seed)) return BadRequest("seed must be an integer", "seed");
      sp.seed = static_cast<uint64_t>(seed);
    }
  }
  if (auto e = ParseStop(j, out)) return e;
  if (const json* ids = Field(j, "stop_token_ids")) {
    if (!ids->is_array())
      return BadRequest("stop_token_ids must be a list of token ids", "stop_token_ids");
    if (ids->size() > 256) return BadRequest("at most 256 stop_token_ids", "stop_token_ids");
    if (auto e = CheckTokenIds(*ids, ctx.vocab_size, "stop_token_ids", &g.stop_token_ids)) return e;
  }
  if (auto e = GetBool(j, "ignore_eos", &g.ignore_eos)) return e;
  // SLO overrides (docs/scheduling.md): absent keeps the server's default (negative here).
  for (auto [key, out] :
       {std::pair{"ttft_slo_ms", &g.ttft_slo_ms}, std::pair{"tpot_slo_ms", &g.tpot_slo_ms}}) {
    const json* v = Field(j, key);
    if (!v) continue;
    if (!v->is_number()) return BadRequest(std::string(key) + " must be a number", key);
    const double d = v->get<double>();
    if (!std::isfinite(d) || d < 0 || d > engine::kMaxSloMs) {
      char buf[160];
      std::snprintf(buf, sizeof(buf), "%s must be in [0, %.0f] milliseconds (0 = none), got %g",
                    key, engine::kMaxSloMs, d);
      return BadRequest(buf, key);
    }
    *out = d;
  }
  if (auto e = GetBool(j, "stream", &out->stream)) return e;
  if (const json* so = Field(j, "stream_options")) {
    if (!so->is_object()) return BadRequest("stream_options must be an object", "stream_options");
    if (!out->stream)
      return BadRequest("stream_options is only allowed when stream is true", "stream_options");
    if (auto e = GetBool(*so, "include_usage", &out->include_usage)) {
      e->param = "stream_options.include_usage";
      return e;
    }
  }
  if (kind == ApiKind::kCompletion) {
    v = -1;
    if (auto e = GetInt(j, "logprobs", 0, engine::kMaxLogprobs, &v)) return e;
    out->logprobs = static_cast<int>(v);
    if (auto e = GetBool(j, "echo", &out->echo)) return e;
    // echo with logprobs: the prompt's tokens come back with their logprobs too (OpenAI's
    // legacy completions, vLLM; what lm-evaluation-harness's loglikelihood tasks read).
    if (out->echo && out->logprobs >= 0) g.prompt_logprobs = out->logprobs;
    if (g.max_tokens == 0) {
      if (!out->echo) {
        return BadRequest(
            "max_tokens must be at least 1 (0 only with echo, to return the prompt alone)",
            "max_tokens");
      }
      // The engine samples one token, which the response leaves out.
      out->echo_only = true;
      g.max_tokens = 1;
    }
    if (const json* s = Field(j, "suffix")) {
      if (!s->is_string() || !s->get_ref<const std::string&>().empty()) {
        return BadRequest("suffix is not supported", "suffix", "unsupported");
      }
    }
  } else {
    bool logprobs = false;
    if (auto e = GetBool(j, "logprobs", &logprobs)) return e;
    bool top_present = false;
    v = 0;
    if (auto e = GetInt(j, "top_logprobs", 0, engine::kMaxLogprobs, &v, &top_present)) return e;
    if (top_present && !logprobs)
      return BadRequest("top_logprobs requires logprobs to be true", "top_logprobs");
    out->logprobs = logprobs ? static_cast<int>(v) : -1;
  }
  {
    // vLLM's prompt_logprobs: not streamed (vLLM refuses it with stream too).
    const json* pl = Field(j, "prompt_logprobs");
    if (pl != nullptr && !pl->is_null()) {
      v = 0;
      if (auto e = GetInt(j, "prompt_logprobs", 0, engine::kMaxLogprobs, &v)) return e;
      if (out->stream) {
        return BadRequest("prompt_logprobs is not available when stream is true",
                          "prompt_logprobs");
      }
      out->prompt_logprobs = static_cast<int>(v);
      g.prompt_logprobs = std::max(g.prompt_logprobs, out->prompt_logprobs);
    }
  }
  if (auto e = ParseStructuredOutput(j, body, &g)) return e;
  if (out->logprobs >= 0) sp.logprobs = out->logprobs;
  if (const json* lb = Field(j, "logit_bias"); lb != nullptr && !lb->is_null()) {
    // OpenAI's form: {"<token id>": bias in [-100, 100], ...}.
    if (!lb->is_object())
      return BadRequest("logit_bias must be an object of token ids to biases", "logit_bias");
    if (lb->size() > engine::kMaxLogitBiasTokens) {
      return BadRequest("logit_bias has " + std::to_string(lb->size()) + " entries; at most " +
                            std::to_string(engine::kMaxLogitBiasTokens),
                        "logit_bias");
    }
    for (auto it = lb->begin(); it != lb->end(); ++it) {
      const std::string& key = it.key();
      int64_t id = -1;
      const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
      if (ec != std::errc() || end != key.data() + key.size() || id < 0 || id >= ctx.vocab_size) {
        return BadRequest("logit_bias key '" + Clip(key) + "' is not a token id in [0, " +
                              std::to_string(ctx.vocab_size) + ")",
                          "logit_bias");
      }
      if (!it.value().is_number()) {
        return BadRequest("logit_bias value of token " + key + " must be a number", "logit_bias");
      }
      const double bias = it.value().get<double>();
      if (!(bias >= -engine::kMaxLogitBias && bias <= engine::kMaxLogitBias)) {
        return BadRequest("logit_bias value of token " + key + " must be in [-100, 100]",
                          "logit_bias");
      }
      sp.logit_bias.push_back({static_cast<int32_t>(id), static_cast<float>(bias)});
    }
  }
  v = 0;
  if (auto e = GetInt(j, "min_tokens", 0, kMaxTokensLimit, &v)) return e;
  g.min_tokens = v;
  if (g.max_tokens >= 0 && g.min_tokens > g.max_tokens) {
    return BadRequest("min_tokens (" + std::to_string(g.min_tokens) +
                          ") must not exceed max_tokens (" + std::to_string(g.max_tokens) + ")",
                      "min_tokens");
  }
  if (Status s = sp.Validate(); !s.ok()) return ErrorFromStatus(s);

  if (kind == ApiKind::kCompletion) {
    if (auto e = ParsePrompt(j, ctx, out)) return e;
  } else {
    if (auto e = ParseMessages(body, ctx, out)) return e;
  }
  if (out->prompts.size() * static_cast<size_t>(g.n) >
      static_cast<size_t>(kMaxPrompts) * kMaxChoices) {
    return BadRequest("too many choices (prompts x n)", "n");
  }
  return std::nullopt;
}

std::optional<ApiError> MakeGenerationRequest(const ApiRequest& req, size_t i,
                                              const ApiContext& ctx,
                                              engine::GenerationRequest* out) {
  *out = req.gen;
  out->prompt = req.prompts[i];
  const int64_t n_prompt = static_cast<int64_t>(out->prompt.size());
  const std::string param = req.kind == ApiKind::kChat ? "messages" : "prompt";
  if (out->max_tokens < 0) {
    // Absent max_tokens: completions generate at most kDefaultCompletionTokens (OpenAI's and
    // vLLM's default), chat up to the end of the context (vLLM's behaviour; docs/api.md).
    out->max_tokens = ctx.max_context - n_prompt;
    if (req.kind == ApiKind::kCompletion)
      out->max_tokens = std::min<int64_t>(out->max_tokens, kDefaultCompletionTokens);
    if (out->max_tokens < 1) {
      return BadRequest("this model's maximum context length is " +
                            std::to_string(ctx.max_context) + " tokens, but the prompt has " +
                            std::to_string(n_prompt) + " tokens",
                        param, "context_length_exceeded");
    }
  } else if (n_prompt + out->max_tokens > ctx.max_context) {
    return BadRequest("this model's maximum context length is " + std::to_string(ctx.max_context) +
                          " tokens, but the request needs " + std::to_string(n_prompt) +
                          " prompt + " + std::to_string(out->max_tokens) + " completion tokens",
                      param, "context_length_exceeded");
  }
  return std::nullopt;
}

std::string RandomId(std::string_view prefix) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char* kHex = "0123456789abcdef";
  std::string id(prefix);
  for (int i = 0; i < 24; ++i) id += kHex[rng() & 15];
  return id;
}

std::string NewResponseId(ApiKind kind) {
  return RandomId(kind == ApiKind::kChat ? "chatcmpl-" : "cmpl-");
}

std::string DumpJson(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

json Usage::ToJson() const {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens}};
}

ResponseBuilder::ResponseBuilder(const ApiRequest& req, const ApiContext& ctx, std::string id,
                                 int64_t created)
    : req_(req), ctx_(ctx), id_(std::move(id)), created_(created) {
  const size_t n = static_cast<size_t>(req.gen.n);
  choices_.resize(req.prompts.size() * n);
  if (req.gen.prompt_logprobs >= 0) {
    // The first token has no logprob (nothing before it): null entries, as OpenAI and vLLM.
    prompt_scores_.resize(req.prompts.size());
    for (size_t p = 0; p < req.prompts.size(); ++p) {
      PromptScores& ps = prompt_scores_[p];
      if (req.prompts[p].empty()) continue;
      ps.prev_token = req.prompts[p][0];
      const std::string text = TokenText(-1, ps.prev_token);
      ps.tokens.push_back(text);
      ps.token_logprobs.push_back(nullptr);
      ps.top_logprobs.push_back(nullptr);
      ps.text_offset.push_back(0);
      ps.vllm.push_back(nullptr);
      ps.text_end = static_cast<int64_t>(text.size());
    }
  }
  for (size_t p = 0; p < req.prompts.size(); ++p) {
    for (size_t i = 0; i < n; ++i) {
      Choice& c = choices_[p * n + i];
      c.prompt = p;
      c.prev_token = req.prompts[p].empty() ? -1 : req.prompts[p].back();
      if (req.echo) c.text = req.echo_text[p];
      if (req.kind == ApiKind::kChat && req.tools.active()) {
        c.tool_parser.emplace(req.tool_syntax, &req.tools);
        c.tool_parser->Feed(req.tool_opening);  // only opens the call: no output
      }
    }
  }
}

int ResponseBuilder::ChoiceIndex(size_t prompt_index, const engine::StreamEvent& ev) const {
  return static_cast<int>(prompt_index) * req_.gen.n + ev.index;
}

std::string ResponseBuilder::TokenText(int32_t prev, int32_t id) const {
  if (id < 0 || id >= ctx_.tok->vocab_size()) return {};
  if (prev >= ctx_.tok->vocab_size()) prev = -1;
  return ctx_.tok->TokenBytes(prev, id, /*include_special=*/true);
}

namespace {
double ClampLogprob(float lp) { return std::isfinite(lp) ? static_cast<double>(lp) : kMinLogprob; }
}  // namespace

void ResponseBuilder::AddPromptScore(size_t prompt_index, const engine::StreamEvent& ev) {
  if (prompt_index >= prompt_scores_.size()) return;
  PromptScores& ps = prompt_scores_[prompt_index];
  const std::string text = TokenText(ps.prev_token, ev.token);
  if (echo_logprobs()) {
    json top = json::object();
    const size_t n_top = std::min(ev.top_logprobs.size(), static_cast<size_t>(req_.logprobs));
    for (size_t k = 0; k < n_top; ++k) {
      const auto& t = ev.top_logprobs[k];
      top[TokenText(ps.prev_token, t.token)] = ClampLogprob(t.logprob);
    }
    top[text] = ClampLogprob(ev.logprob);
    ps.tokens.push_back(text);
    ps.token_logprobs.push_back(ClampLogprob(ev.logprob));
    ps.top_logprobs.push_back(std::move(top));
    ps.text_offset.push_back(ps.text_end);
  }
  if (req_.prompt_logprobs >= 0) {
    // vLLM's form: {"<id>": {"logprob", "rank", "decoded_token"}} with the prompt token first.
    json entry = json::object();
    entry[std::to_string(ev.token)] = {
        {"logprob", ClampLogprob(ev.logprob)}, {"rank", ev.rank}, {"decoded_token", text}};
    const size_t n_top =
        std::min(ev.top_logprobs.size(), static_cast<size_t>(req_.prompt_logprobs));
    for (size_t k = 0; k < n_top; ++k) {
      const auto& t = ev.top_logprobs[k];
      const std::string key = std::to_string(t.token);
      if (entry.contains(key)) continue;
      // Sorted descending: the rank is 1 + the entries before it that are strictly higher.
      int64_t rank = 1;
      for (size_t i = 0; i < k; ++i) rank += ev.top_logprobs[i].logprob > t.logprob;
      entry[key] = {{"logprob", ClampLogprob(t.logprob)},
                    {"rank", rank},
                    {"decoded_token", TokenText(ps.prev_token, t.token)}};
    }
    ps.vllm.push_back(std::move(entry));
  }
  ps.text_end += static_cast<int64_t>(text.size());
  ps.prev_token = ev.token;
}

json ResponseBuilder::EchoLogprobs(const Choice& c) const {
  const PromptScores& ps = prompt_scores_[c.prompt];
  auto join = [](const json& a, const json& b) {
    json out = a;
    for (const auto& x : b) out.push_back(x);
    return out;
  };
  return {{"tokens", join(ps.tokens, c.tokens)},
          {"token_logprobs", join(ps.token_logprobs, c.token_logprobs)},
          {"top_logprobs", join(ps.top_logprobs, c.top_logprobs)},
          {"text_offset", join(ps.text_offset, c.text_offset)}};
}

void ResponseBuilder::AddLogprobs(Choice* c, const engine::StreamEvent& ev, json* delta) const {
  if (req_.logprobs < 0 || ev.token < 0) return;
  auto clamp = ClampLogprob;
  const std::string text = TokenText(c->prev_token, ev.token);
  if (req_.kind == ApiKind::kCompletion) {
    json top = json::object();
    for (const auto& t : ev.top_logprobs) top[TokenText(c->prev_token, t.token)] = clamp(t.logprob);
    top[text] = clamp(ev.logprob);
    // An offset into the response's text; after an echo with logprobs, the prompt's offsets
    // count its token texts (as vLLM's), so the generated ones continue from their end.
    int64_t offset = static_cast<int64_t>(c->text.size());
    if (echo_logprobs() && c->prompt < prompt_scores_.size()) {
      offset += prompt_scores_[c->prompt].text_end -
                static_cast<int64_t>(req_.echo_text[c->prompt].size());
    }
    offset = std::max<int64_t>(offset, 0);
    c->tokens.push_back(text);
    c->token_logprobs.push_back(clamp(ev.logprob));
    c->top_logprobs.push_back(top);
    c->text_offset.push_back(offset);
    if (delta) {
      *delta = {{"tokens", json::array({text})},
                {"token_logprobs", json::array({clamp(ev.logprob)})},
                {"top_logprobs", json::array({top})},
                {"text_offset", json::array({offset})}};
    }
  } else {
    auto bytes = [](const std::string& s) {
      json b = json::array();
      for (unsigned char ch : s) b.push_back(static_cast<int>(ch));
      return b;
    };
    json top = json::array();
    for (const auto& t : ev.top_logprobs) {
      std::string tt = TokenText(c->prev_token, t.token);
      top.push_back({{"token", tt}, {"logprob", clamp(t.logprob)}, {"bytes", bytes(tt)}});
    }
    json entry = {{"token", text},
                  {"logprob", clamp(ev.logprob)},
                  {"bytes", bytes(text)},
                  {"top_logprobs", top}};
    c->content.push_back(entry);
    if (delta) *delta = {{"content", json::array({entry})}};
  }
  c->prev_token = ev.token;
}

void ResponseBuilder::Add(size_t prompt_index, const engine::StreamEvent& ev) {
  if (ev.prompt) return AddPromptScore(prompt_index, ev);
  const int idx = ChoiceIndex(prompt_index, ev);
  if (idx < 0 || idx >= static_cast<int>(choices_.size())) return;
  Choice& c = choices_[static_cast<size_t>(idx)];
  if (req_.echo_only) {  // the one sampled token is not part of the answer
    if (ev.finish == engine::FinishReason::kStop || ev.finish == engine::FinishReason::kLength)
      c.finish = "length";
    return;
  }
  AddLogprobs(&c, ev, nullptr);
  c.text += ev.text;
  if (ev.finish == engine::FinishReason::kStop || ev.finish == engine::FinishReason::kLength) {
    c.finish = engine::FinishReasonName(ev.finish);
  }
}

std::string ResponseBuilder::FinalJson(const Usage& usage) const {
  const bool chat = req_.kind == ApiKind::kChat;
  json out = {{"id", id_},
              {"object", chat ? "chat.completion" : "text_completion"},
              {"created", created_},
              {"model", ModelName()}};
  json choices = json::array();
  for (size_t i = 0; i < choices_.size(); ++i) {
    const Choice& c = choices_[i];
    json ch = {{"index", i}};
    json lp = nullptr;
    if (echo_logprobs()) {
      lp = EchoLogprobs(c);
    } else if (req_.logprobs >= 0) {
      lp = chat ? json{{"content", c.content}}
                : json{{"tokens", c.tokens},
                       {"token_logprobs", c.token_logprobs},
                       {"top_logprobs", c.top_logprobs},
                       {"text_offset", c.text_offset}};
    }
    std::string finish = c.finish;
    if (chat && req_.tools.active()) {
      ToolParseOutput parsed =
          ParseToolCalls(req_.tool_syntax, req_.tools, req_.tool_opening + c.text);
      json msg = {{"role", "assistant"}};
      msg["content"] =
          parsed.calls.empty() || !parsed.content.empty() ? json(parsed.content) : json(nullptr);
      if (!parsed.calls.empty()) {
        json calls = json::array();
        for (const ToolCall& call : parsed.calls) {
          calls.push_back({{"id", call.id},
                           {"type", "function"},
                           {"function", {{"name", call.name}, {"arguments", call.arguments}}}});
        }
        msg["tool_calls"] = std::move(calls);
        if (!finish.empty()) finish = "tool_calls";
      }
      ch["message"] = std::move(msg);
    } else if (chat) {
      ch["message"] = {{"role", "assistant"}, {"content", c.text}};
    } else {
      ch["text"] = c.text;
    }
    ch["logprobs"] = lp;
    ch["finish_reason"] = finish.empty() ? json(nullptr) : json(finish);
    if (!chat && req_.prompt_logprobs >= 0) ch["prompt_logprobs"] = prompt_scores_[c.prompt].vllm;
    choices.push_back(std::move(ch));
  }
  out["choices"] = std::move(choices);
  if (chat && req_.prompt_logprobs >= 0 && !prompt_scores_.empty())
    out["prompt_logprobs"] = prompt_scores_[0].vllm;
  out["usage"] = usage.ToJson();
  return DumpJson(out);
}

json ResponseBuilder::ChunkEnvelope() const {
  const bool chat = req_.kind == ApiKind::kChat;
  json out = {{"id", id_},
              {"object", chat ? "chat.completion.chunk" : "text_completion"},
              {"created", created_},
              {"model", ModelName()}};
  return out;
}

// The variant the request named (an adapter), as vLLM and OpenAI echo it; else the base.
const std::string& ResponseBuilder::ModelName() const {
  return req_.gen.variant ? req_.gen.variant->name : ctx_.served_model;
}

std::string ResponseBuilder::Sse(const json& j) { return "data: " + DumpJson(j) + "\n\n"; }

std::string ResponseBuilder::OpeningChunks() {
  std::string out;
  for (size_t i = 0; i < choices_.size(); ++i) {
    json choice;
    if (req_.kind == ApiKind::kChat) {
      choice = {{"index", i},
                {"delta", {{"role", "assistant"}, {"content", ""}}},
                {"logprobs", nullptr},
                {"finish_reason", nullptr}};
    } else if (req_.echo && !echo_logprobs()) {
      choice = {{"index", i},
                {"text", choices_[i].text},
                {"logprobs", nullptr},
                {"finish_reason", nullptr}};
    } else {
      continue;
    }
    json chunk = ChunkEnvelope();
    chunk["choices"] = json::array({choice});
    if (req_.include_usage) chunk["usage"] = nullptr;
    out += Sse(chunk);
  }
  return out;
}

std::string ResponseBuilder::Chunk(size_t prompt_index, const engine::StreamEvent& ev) {
  if (ev.prompt) {
    AddPromptScore(prompt_index, ev);
    return {};
  }
  const int idx = ChoiceIndex(prompt_index, ev);
  if (idx < 0 || idx >= static_cast<int>(choices_.size())) return {};
  Choice& c = choices_[static_cast<size_t>(idx)];
  std::string out;
  if (echo_logprobs() && !c.echo_sent) {
    // The prompt's logprobs arrived before this first event of the choice: its echo chunk.
    c.echo_sent = true;
    json choice = {{"index", idx},
                   {"text", c.text},
                   {"logprobs", EchoLogprobs(c)},
                   {"finish_reason", nullptr}};
    json chunk = ChunkEnvelope();
    chunk["choices"] = json::array({std::move(choice)});
    if (req_.include_usage) chunk["usage"] = nullptr;
    out += Sse(chunk);
  }
  json lp = nullptr;
  std::string finish;
  if (req_.echo_only) {  // the one sampled token is not part of the answer
    if (ev.finish != engine::FinishReason::kStop && ev.finish != engine::FinishReason::kLength)
      return out;
    finish = c.finish = "length";
    json choice = {{"index", idx}, {"text", ""}, {"logprobs", nullptr}, {"finish_reason", finish}};
    json chunk = ChunkEnvelope();
    chunk["choices"] = json::array({std::move(choice)});
    if (req_.include_usage) chunk["usage"] = nullptr;
    return out + Sse(chunk);
  }
  AddLogprobs(&c, ev, &lp);
  c.text += ev.text;
  if (ev.finish == engine::FinishReason::kStop || ev.finish == engine::FinishReason::kLength) {
    finish = engine::FinishReasonName(ev.finish);
    c.finish = finish;
  }
  if (c.tool_parser) return out + ToolChunks(&c, idx, ev, std::move(lp), std::move(finish));
  if (ev.text.empty() && lp.is_null() && finish.empty()) return out;
  json choice = {{"index", idx}};
  if (req_.kind == ApiKind::kChat) {
    choice["delta"] = ev.text.empty() ? json::object() : json{{"content", ev.text}};
  } else {
    choice["text"] = ev.text;
  }
  choice["logprobs"] = lp;
  choice["finish_reason"] = finish.empty() ? json(nullptr) : json(finish);
  json chunk = ChunkEnvelope();
  chunk["choices"] = json::array({std::move(choice)});
  if (req_.include_usage) chunk["usage"] = nullptr;
  return out + Sse(chunk);
}

// As OpenAI streams tool calls: per call, a first delta with its index, id, type and name
// (arguments ""), then its arguments. Text that may begin a call is held back by the parser
// until decided, so a chunk may carry only logprobs.
std::string ResponseBuilder::ToolChunks(Choice* c, int idx, const engine::StreamEvent& ev, json lp,
                                        std::string finish) {
  ToolParseOutput o = c->tool_parser->Feed(ev.text);
  if (!finish.empty()) {
    ToolParseOutput end = c->tool_parser->Finish();
    o.content += end.content;
    for (ToolCall& call : end.calls) o.calls.push_back(std::move(call));
    if (c->tool_parser->calls() > 0) finish = "tool_calls";
    c->finish = finish;
  }
  std::vector<json> deltas;
  if (!o.content.empty()) deltas.push_back({{"content", o.content}});
  for (const ToolCall& call : o.calls) {
    const int k = c->tool_calls_sent++;
    deltas.push_back(
        {{"tool_calls", json::array({{{"index", k},
                                      {"id", call.id},
                                      {"type", "function"},
                                      {"function", {{"name", call.name}, {"arguments", ""}}}}})}});
    deltas.push_back(
        {{"tool_calls",
          json::array({{{"index", k}, {"function", {{"arguments", call.arguments}}}}})}});
  }
  if (deltas.empty() && (!lp.is_null() || !finish.empty())) deltas.push_back(json::object());
  std::string out;
  for (size_t k = 0; k < deltas.size(); ++k) {
    const bool last = k + 1 == deltas.size();
    json choice = {{"index", idx},
                   {"delta", std::move(deltas[k])},
                   {"logprobs", k == 0 ? lp : json(nullptr)},
                   {"finish_reason", last && !finish.empty() ? json(finish) : json(nullptr)}};
    json chunk = ChunkEnvelope();
    chunk["choices"] = json::array({std::move(choice)});
    if (req_.include_usage) chunk["usage"] = nullptr;
    out += Sse(chunk);
  }
  return out;
}

std::string ResponseBuilder::ClosingChunks(const Usage& usage) const {
  std::string out;
  if (req_.include_usage) {
    json chunk = ChunkEnvelope();
    chunk["choices"] = json::array();
    chunk["usage"] = usage.ToJson();
    out += Sse(chunk);
  }
  out += "data: [DONE]\n\n";
  return out;
}

std::string ResponseBuilder::ErrorChunk(const ApiError& e) {
  return "data: " + e.ToJson() + "\n\n";
}

}  // namespace chorus::server
