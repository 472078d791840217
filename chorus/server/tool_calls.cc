#include "chorus/server/tool_calls.h"

#include <algorithm>
#include <cctype>
#include <random>

namespace chorus::server {
namespace {

using ojson = nlohmann::ordered_json;

constexpr std::string_view kHermesOpen = "<tool_call>";
constexpr std::string_view kHermesClose = "</tool_call>";
constexpr std::string_view kMistralMarker = "[TOOL_CALLS]";
constexpr std::string_view kMistralArgs = "[ARGS]";
constexpr std::string_view kPythonTag = "<|python_tag|>";

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

size_t SkipSpace(std::string_view s, size_t i = 0) {
  while (i < s.size() && IsSpace(s[i])) ++i;
  return i;
}

std::string_view Trim(std::string_view s) {
  const size_t b = SkipSpace(s);
  size_t e = s.size();
  while (e > b && IsSpace(s[e - 1])) --e;
  return s.substr(b, e - b);
}

// Arguments as the model wrote them: an object, or a string holding one (some fine-tunes
// quote them); absent means no arguments.
std::optional<std::string> ArgumentsText(const ojson& call, std::string_view key) {
  auto it = call.find(std::string(key));
  if (it == call.end() || it->is_null()) return std::string("{}");
  if (it->is_object()) return it->dump(-1, ' ', false, ojson::error_handler_t::replace);
  if (it->is_string()) {
    ojson parsed = ojson::parse(it->get_ref<const std::string&>(), nullptr, false);
    if (!parsed.is_discarded() && parsed.is_object())
      return parsed.dump(-1, ' ', false, ojson::error_handler_t::replace);
  }
  return std::nullopt;
}

// A call object {"name": N, <args_key>: {...}} naming one of the request's functions.
std::optional<ToolCall> CallFromObject(const ojson& obj, const ToolsRequest& req,
                                       std::initializer_list<std::string_view> args_keys,
                                       ToolSyntax syntax) {
  if (!obj.is_object()) return std::nullopt;
  auto name = obj.find("name");
  if (name == obj.end() || !name->is_string()) return std::nullopt;
  const std::string& n = name->get_ref<const std::string&>();
  if (req.Find(n) == nullptr) return std::nullopt;
  std::string_view key = *args_keys.begin();
  for (std::string_view k : args_keys) {
    if (obj.contains(std::string(k))) {
      key = k;
      break;
    }
  }
  auto args = ArgumentsText(obj, key);
  if (!args) return std::nullopt;
  return ToolCall{NewToolCallId(syntax), n, std::move(*args)};
}

std::optional<ToolCall> CallFromText(std::string_view text, const ToolsRequest& req,
                                     std::initializer_list<std::string_view> args_keys,
                                     ToolSyntax syntax) {
  ojson obj = ojson::parse(Trim(text), nullptr, false);
  if (obj.is_discarded()) return std::nullopt;
  return CallFromObject(obj, req, args_keys, syntax);
}

bool ValidName(std::string_view n) {
  if (n.empty() || n.size() > kMaxToolNameBytes) return false;
  return std::all_of(n.begin(), n.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-' || c == '.' || c == ':';
  });
}

std::string Idx(std::string_view base, size_t i) {
  return std::string(base) + "[" + std::to_string(i) + "]";
}

std::string DumpO(const ojson& j) {
  return j.dump(-1, ' ', false, ojson::error_handler_t::replace);
}

// Skips a string literal starting at s[i] (a quote); returns the index past it.
size_t SkipStringLiteral(std::string_view s, size_t i) {
  const char q = s[i++];
  while (i < s.size() && s[i] != q) i += s[i] == '\\' ? 2 : 1;
  return std::min(i + 1, s.size());
}

}  // namespace

const char* ToolSyntaxName(ToolSyntax s) {
  switch (s) {
    case ToolSyntax::kHermes:
      return "hermes";
    case ToolSyntax::kLlama3Json:
      return "llama3_json";
    case ToolSyntax::kMistral:
      return "mistral";
    case ToolSyntax::kGeneric:
      return "generic";
  }
  return "generic";
}

std::optional<ToolSyntax> ToolSyntaxFromName(std::string_view name) {
  for (ToolSyntax s :
       {ToolSyntax::kHermes, ToolSyntax::kLlama3Json, ToolSyntax::kMistral, ToolSyntax::kGeneric}) {
    if (name == ToolSyntaxName(s)) return s;
  }
  return std::nullopt;
}

bool TemplateUsesTools(std::string_view src) {
  // Inside {{ }} / {% %} only, outside string literals: the word `tools` read as a variable.
  size_t i = 0;
  while (i < src.size()) {
    size_t open = src.find('{', i);
    if (open == std::string_view::npos || open + 1 >= src.size()) return false;
    const char kind = src[open + 1];
    if (kind != '{' && kind != '%') {
      i = open + 1;
      continue;
    }
    const std::string_view close = kind == '{' ? "}}" : "%}";
    size_t j = open + 2;
    while (j < src.size() && src.compare(j, 2, close) != 0) {
      const char c = src[j];
      if (c == '"' || c == '\'') {
        j = SkipStringLiteral(src, j);
        continue;
      }
      if (src.compare(j, 5, "tools") == 0) {
        const bool left = j == 0 || !(std::isalnum(static_cast<unsigned char>(src[j - 1])) ||
                                      src[j - 1] == '_' || src[j - 1] == '.');
        const bool right =
            j + 5 >= src.size() ||
            !(std::isalnum(static_cast<unsigned char>(src[j + 5])) || src[j + 5] == '_');
        if (left && right) return true;
      }
      ++j;
    }
    i = j + 2;
  }
  return false;
}

ToolSyntax DetectToolSyntax(std::string_view src) {
  if (!TemplateUsesTools(src)) return ToolSyntax::kGeneric;
  if (src.find(kMistralMarker) != std::string_view::npos) return ToolSyntax::kMistral;
  if (src.find(kHermesOpen) != std::string_view::npos) return ToolSyntax::kHermes;
  if (src.find(kPythonTag) != std::string_view::npos ||
      src.find("\"parameters\": ") != std::string_view::npos)
    return ToolSyntax::kLlama3Json;
  return ToolSyntax::kHermes;
}

const ToolSpec* ToolsRequest::Find(std::string_view name) const {
  for (const ToolSpec& t : tools) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

std::optional<ApiError> ParseToolsRequest(const ojson& body, ToolsRequest* out) {
  *out = ToolsRequest{};
  auto tools = body.find("tools");
  if (tools != body.end() && !tools->is_null()) {
    if (!tools->is_array()) return BadRequest("tools must be a list", "tools");
    if (tools->size() > static_cast<size_t>(kMaxTools)) {
      return BadRequest("at most " + std::to_string(kMaxTools) + " tools per request", "tools");
    }
    for (size_t i = 0; i < tools->size(); ++i) {
      const ojson& t = (*tools)[i];
      const std::string p = Idx("tools", i);
      if (!t.is_object()) return BadRequest(p + " must be an object", p);
      auto type = t.find("type");
      if (type == t.end() || *type != "function") {
        return BadRequest(p + ".type must be \"function\"", p + ".type");
      }
      auto fn = t.find("function");
      if (fn == t.end() || !fn->is_object()) {
        return BadRequest(p + ".function must be an object", p + ".function");
      }
      ToolSpec spec;
      auto name = fn->find("name");
      if (name == fn->end() || !name->is_string()) {
        return BadRequest(p + ".function.name is required (a string)", p + ".function.name");
      }
      spec.name = name->get<std::string>();
      if (!ValidName(spec.name)) {
        return BadRequest(p + ".function.name must be 1 to 64 of a-z, A-Z, 0-9, _ - . :",
                          p + ".function.name");
      }
      if (out->Find(spec.name) != nullptr) {
        return BadRequest(p + ".function.name '" + spec.name + "' is given twice",
                          p + ".function.name");
      }
      if (auto d = fn->find("description"); d != fn->end() && !d->is_null() && !d->is_string()) {
        return BadRequest(p + ".function.description must be a string",
                          p + ".function.description");
      }
      spec.parameters = ojson::object();
      if (auto pa = fn->find("parameters"); pa != fn->end() && !pa->is_null()) {
        if (!pa->is_object()) {
          return BadRequest(p + ".function.parameters must be a JSON schema object",
                            p + ".function.parameters");
        }
        spec.parameters = *pa;
      }
      if (auto s = fn->find("strict"); s != fn->end() && !s->is_null()) {
        if (!s->is_boolean()) {
          return BadRequest(p + ".function.strict must be a boolean", p + ".function.strict");
        }
        spec.strict = s->get<bool>();
      }
      out->tools.push_back(std::move(spec));
    }
  }
  out->choice = out->tools.empty() ? ToolChoice::kNone : ToolChoice::kAuto;
  if (auto tc = body.find("tool_choice"); tc != body.end() && !tc->is_null()) {
    if (tc->is_string()) {
      const std::string& s = tc->get_ref<const std::string&>();
      if (s == "none") {
        out->choice = ToolChoice::kNone;
      } else if (s == "auto") {
        out->choice = ToolChoice::kAuto;
      } else if (s == "required") {
        out->choice = ToolChoice::kRequired;
      } else {
        return BadRequest(
            "tool_choice must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
            "\"function\": {\"name\": ...}}",
            "tool_choice");
      }
    } else if (tc->is_object()) {
      auto type = tc->find("type");
      auto fn = tc->find("function");
      if (type == tc->end() || *type != "function") {
        return BadRequest("tool_choice.type must be \"function\"", "tool_choice.type");
      }
      const ojson* name = nullptr;
      if (fn != tc->end() && fn->is_object()) {
        if (auto n = fn->find("name"); n != fn->end() && n->is_string()) name = &*n;
      }
      if (name == nullptr) {
        return BadRequest("tool_choice.function.name is required (a string)",
                          "tool_choice.function.name");
      }
      out->choice = ToolChoice::kNamed;
      out->named = name->get<std::string>();
      if (!out->tools.empty() && out->Find(out->named) == nullptr) {
        return BadRequest("tool_choice names the function '" + out->named.substr(0, 64) +
                              "', which is not in tools",
                          "tool_choice.function.name");
      }
    } else {
      return BadRequest("tool_choice must be a string or an object", "tool_choice");
    }
    if (out->choice != ToolChoice::kNone && out->tools.empty()) {
      return BadRequest("tool_choice other than \"none\" needs tools", "tool_choice");
    }
  }
  if (auto ptc = body.find("parallel_tool_calls"); ptc != body.end() && !ptc->is_null()) {
    if (!ptc->is_boolean()) {
      return BadRequest("parallel_tool_calls must be a boolean", "parallel_tool_calls");
    }
    out->parallel = ptc->get<bool>();
  }
  return std::nullopt;
}

std::optional<ApiError> ValidateToolMessages(const ojson& messages) {
  if (!messages.is_array()) return std::nullopt;  // the caller reports it
  for (size_t i = 0; i < messages.size(); ++i) {
    const ojson& m = messages[i];
    if (!m.is_object()) continue;
    const std::string p = Idx("messages", i);
    auto role = m.find("role");
    const bool is_tool = role != m.end() && *role == "tool";
    auto calls = m.find("tool_calls");
    if (calls != m.end() && !calls->is_null()) {
      if (role == m.end() || *role != "assistant") {
        return BadRequest(p + ".tool_calls is only allowed on assistant messages",
                          p + ".tool_calls");
      }
      if (!calls->is_array())
        return BadRequest(p + ".tool_calls must be a list", p + ".tool_calls");
      for (size_t k = 0; k < calls->size(); ++k) {
        const ojson& c = (*calls)[k];
        const std::string q = p + Idx(".tool_calls", k);
        if (!c.is_object()) return BadRequest(q + " must be an object", q);
        if (auto id = c.find("id"); id != c.end() && !id->is_string()) {
          return BadRequest(q + ".id must be a string", q + ".id");
        }
        if (auto type = c.find("type"); type != c.end() && *type != "function") {
          return BadRequest(q + ".type must be \"function\"", q + ".type");
        }
        auto fn = c.find("function");
        if (fn == c.end() || !fn->is_object()) {
          return BadRequest(q + ".function must be an object", q + ".function");
        }
        auto name = fn->find("name");
        if (name == fn->end() || !name->is_string() ||
            name->get_ref<const std::string&>().empty()) {
          return BadRequest(q + ".function.name is required (a string)", q + ".function.name");
        }
        auto args = fn->find("arguments");
        if (args == fn->end() || !(args->is_string() || args->is_object())) {
          return BadRequest(q + ".function.arguments must be a JSON string",
                            q + ".function.arguments");
        }
      }
    }
    if (is_tool) {
      auto id = m.find("tool_call_id");
      if (id == m.end() || !id->is_string()) {
        return BadRequest(p + ".tool_call_id is required (a string) on tool messages",
                          p + ".tool_call_id");
      }
      auto content = m.find("content");
      if (content == m.end() || content->is_null()) {
        return BadRequest(p + ".content is required on tool messages", p + ".content");
      }
    }
  }
  return std::nullopt;
}

std::string GenericToolPrompt(const ojson& tools, const ToolsRequest& req) {
  std::string s = "# Tools\nFunctions you may call (JSON schemas):\n<tools>\n";
  for (const ojson& t : tools) s += DumpO(t) + "\n";
  s += "</tools>\nTo call functions, reply with one block per call:\n<tool_call>\n{\"name\": "
       "<name>, \"arguments\": <JSON object>}\n</tool_call>\nResults come back in "
       "<tool_response></tool_response>.";
  if (req.choice == ToolChoice::kRequired) s += "\nYou must call a function.";
  if (req.choice == ToolChoice::kNamed) s += "\nYou must call \"" + req.named + "\".";
  if (!req.parallel) s += "\nCall one function at most.";
  return s;
}

void ApplyGenericToolForm(const ojson& tools, const ToolsRequest& req, ojson* messages) {
  ojson out = ojson::array();
  size_t start = 0;
  if (req.active()) {
    const std::string prompt = GenericToolPrompt(tools, req);
    const ojson* first = messages->empty() ? nullptr : &(*messages)[0];
    if (first != nullptr && first->is_object() && first->value("role", "") == "system" &&
        first->contains("content") && (*first)["content"].is_string()) {
      ojson sys = *first;
      sys["content"] = sys["content"].get<std::string>() + "\n\n" + prompt;
      out.push_back(std::move(sys));
      start = 1;
    } else {
      out.push_back(ojson{{"role", "system"}, {"content", prompt}});
    }
  }
  bool merging_tool = false;  // the last message of `out` holds tool responses
  for (size_t i = start; i < messages->size(); ++i) {
    ojson m = (*messages)[i];
    if (!m.is_object()) {
      out.push_back(std::move(m));
      merging_tool = false;
      continue;
    }
    const std::string role = m.value("role", "");
    if (role == "tool") {
      std::string text = m.contains("content") && m["content"].is_string()
                             ? m["content"].get<std::string>()
                             : std::string();
      const std::string block = "<tool_response>\n" + text + "\n</tool_response>";
      if (merging_tool) {
        out.back()["content"] = out.back()["content"].get<std::string>() + "\n" + block;
      } else {
        out.push_back(ojson{{"role", "user"}, {"content", block}});
        merging_tool = true;
      }
      continue;
    }
    merging_tool = false;
    auto calls = m.find("tool_calls");
    if (role == "assistant" && calls != m.end() && calls->is_array() && !calls->empty()) {
      std::string text = m.contains("content") && m["content"].is_string()
                             ? m["content"].get<std::string>()
                             : std::string();
      for (const ojson& c : *calls) {
        const ojson& fn = c["function"];
        ojson call = {{"name", fn["name"]}, {"arguments", fn.value("arguments", ojson::object())}};
        if (!text.empty()) text += "\n";
        text += std::string(kHermesOpen) + "\n" + DumpO(call) + "\n" + std::string(kHermesClose);
      }
      m["content"] = text;
      m.erase("tool_calls");
    }
    out.push_back(std::move(m));
  }
  *messages = std::move(out);
}

std::string NewToolCallId(ToolSyntax syntax) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  static constexpr char kAlnum[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
  const bool mistral = syntax == ToolSyntax::kMistral;
  std::string id = mistral ? "" : "call_";
  for (size_t i = 0; i < (mistral ? kMistralIdChars : 24); ++i) id += kAlnum[rng() % 62];
  return id;
}

void ShortenMistralIds(ojson* messages) {
  auto shorten = [](ojson* id) {
    if (id->is_string() && id->get_ref<const std::string&>().size() > kMistralIdChars) {
      const std::string& s = id->get_ref<const std::string&>();
      *id = s.substr(s.size() - kMistralIdChars);
    }
  };
  if (!messages->is_array()) return;
  for (ojson& m : *messages) {
    if (!m.is_object()) continue;
    if (auto id = m.find("tool_call_id"); id != m.end()) shorten(&*id);
    auto calls = m.find("tool_calls");
    if (calls == m.end() || !calls->is_array()) continue;
    for (ojson& c : *calls) {
      if (!c.is_object()) continue;
      if (auto id = c.find("id"); id != c.end()) shorten(&*id);
    }
  }
}

ToolCallParser::ToolCallParser(ToolSyntax syntax, const ToolsRequest* req)
    : syntax_(syntax), req_(req) {}

void ToolCallParser::EmitText(std::string_view t, ToolParseOutput* out) {
  if (t.empty()) return;
  if (SkipSpace(t) == t.size()) {  // whitespace only: held (or dropped after a call)
    if (!after_call_) ws_hold_.append(t);
    return;
  }
  std::string s = std::move(ws_hold_);
  ws_hold_.clear();
  s.append(t);
  size_t b = 0;
  if (after_call_) {
    b = SkipSpace(s);
    if (b == s.size()) return;  // whitespace after a call is not content
    after_call_ = false;
  }
  size_t e = s.size();
  while (e > b && IsSpace(s[e - 1])) --e;
  out->content.append(s, b, e - b);
  ws_hold_ = s.substr(e);
}

void ToolCallParser::Consume(size_t n) {
  buf_.erase(0, n);
  scan_ = Scan{};  // positions moved
}

size_t ToolCallParser::ScanBalanced(size_t start) {
  if (scan_.start != start) scan_ = Scan{.start = start, .pos = start};
  for (; scan_.pos < buf_.size(); ++scan_.pos) {
    const char c = buf_[scan_.pos];
    if (scan_.in_string) {
      if (scan_.escaped) {
        scan_.escaped = false;
      } else if (c == '\\') {
        scan_.escaped = true;
      } else if (c == '"') {
        scan_.in_string = false;
      }
    } else if (c == '"') {
      scan_.in_string = true;
    } else if (c == '{' || c == '[') {
      ++scan_.depth;
    } else if ((c == '}' || c == ']') && --scan_.depth == 0) {
      return scan_.pos + 1;
    }
  }
  return std::string::npos;
}

size_t ToolCallParser::ScanOutsideStrings(std::string_view marker) {
  if (scan_.start != 0) scan_ = Scan{.start = 0, .pos = 0};
  for (; scan_.pos < buf_.size(); ++scan_.pos) {
    const char c = buf_[scan_.pos];
    if (scan_.in_string) {
      if (scan_.escaped) {
        scan_.escaped = false;
      } else if (c == '\\') {
        scan_.escaped = true;
      } else if (c == '"') {
        scan_.in_string = false;
      }
    } else if (c == '"') {
      scan_.in_string = true;
    } else if (c == marker[0]) {
      const std::string_view rest = std::string_view(buf_).substr(scan_.pos);
      if (rest.starts_with(marker)) return scan_.pos;
      if (marker.starts_with(rest)) return std::string::npos;  // may complete: look again
    }
  }
  return std::string::npos;
}

void ToolCallParser::EmitCall(ToolCall c, ToolParseOutput* out) {
  ws_hold_.clear();  // whitespace before a call is not content
  after_call_ = true;
  if (!req_->parallel && n_calls_ > 0) return;  // parallel_tool_calls false: the first call only
  ++n_calls_;
  out->calls.push_back(std::move(c));
}

void ToolCallParser::EmitUpToMarker(std::string_view marker, ToolParseOutput* out) {
  size_t keep = 0;
  for (size_t k = std::min(marker.size() - 1, buf_.size()); k > 0; --k) {
    if (std::string_view(buf_).ends_with(marker.substr(0, k))) {
      keep = k;
      break;
    }
  }
  EmitText(std::string_view(buf_).substr(0, buf_.size() - keep), out);
  Consume(buf_.size() - keep);
}

bool ToolCallParser::TextUntil(std::string_view marker, bool at_end, ToolParseOutput* out) {
  const size_t pos = buf_.find(marker);
  if (pos == std::string::npos) {
    if (at_end) {
      EmitText(buf_, out);
      Consume(buf_.size());
    } else {
      EmitUpToMarker(marker, out);
    }
    return false;
  }
  EmitText(std::string_view(buf_).substr(0, pos), out);
  Consume(pos + marker.size());
  state_ = State::kInCall;
  return true;
}

bool ToolCallParser::StepHermes(bool at_end, ToolParseOutput* out) {
  if (state_ == State::kStart) state_ = State::kText;
  if (state_ == State::kText) return TextUntil(kHermesOpen, at_end, out);
  const size_t end = ScanOutsideStrings(kHermesClose);
  if (end == std::string::npos && !at_end) return false;
  const std::string_view body = std::string_view(buf_).substr(0, end);
  if (auto call = CallFromText(body, *req_, {"arguments", "parameters"}, syntax_)) {
    EmitCall(std::move(*call), out);
  } else {
    std::string raw = std::string(kHermesOpen) + std::string(body);
    if (end != std::string::npos) raw += kHermesClose;
    EmitText(raw, out);
  }
  Consume(end == std::string::npos ? buf_.size() : end + kHermesClose.size());
  state_ = State::kText;
  return !buf_.empty();
}

bool ToolCallParser::StepMistral(bool at_end, ToolParseOutput* out) {
  if (state_ == State::kStart) state_ = State::kText;
  if (state_ == State::kText) return TextUntil(kMistralMarker, at_end, out);
  // After the marker: a JSON list of calls, or `name[ARGS]{...}`.
  auto give_up = [&](size_t n) {
    EmitText(std::string(kMistralMarker) + buf_.substr(0, n), out);
    Consume(n);
    state_ = State::kText;
    return !buf_.empty();
  };
  const size_t i = SkipSpace(buf_);
  if (i == buf_.size()) return at_end ? give_up(buf_.size()) : false;
  const std::string_view rest = std::string_view(buf_).substr(i);
  if (rest[0] == '[') {
    const size_t stop = ScanBalanced(i);
    if (stop == std::string::npos) return at_end ? give_up(buf_.size()) : false;
    const size_t end = stop - i;
    ojson list = ojson::parse(rest.substr(0, end), nullptr, false);
    std::vector<ToolCall> calls;
    if (!list.is_discarded() && list.is_array() && !list.empty()) {
      for (const ojson& c : list) {
        auto call = CallFromObject(c, *req_, {"arguments", "parameters"}, syntax_);
        if (!call) {
          calls.clear();
          break;
        }
        calls.push_back(std::move(*call));
      }
    }
    if (calls.empty()) return give_up(i + end);
    for (ToolCall& c : calls) EmitCall(std::move(c), out);
    Consume(i + end);
    state_ = State::kText;
    return !buf_.empty();
  }
  // `name[ARGS]` must fit in a tool name's length. Only that window is looked at and given up on
  // (the rest is scanned again as text), so a reply streamed in pieces is decided on the same
  // bytes as the whole reply.
  const size_t window = kMaxToolNameBytes + kMistralArgs.size();
  const size_t args = rest.substr(0, window).find(kMistralArgs);
  if (args == std::string_view::npos) {
    if (rest.size() > window) return give_up(i + window);
    return at_end ? give_up(buf_.size()) : false;
  }
  const std::string name(Trim(rest.substr(0, args)));
  const size_t obj = SkipSpace(rest, args + kMistralArgs.size());
  if (obj == rest.size()) return at_end ? give_up(buf_.size()) : false;
  if (rest[obj] != '{' || req_->Find(name) == nullptr) return give_up(i + obj);
  const size_t stop = ScanBalanced(i + obj);
  if (stop == std::string::npos) return at_end ? give_up(buf_.size()) : false;
  const size_t end = stop - i - obj;
  ojson a = ojson::parse(rest.substr(obj, end), nullptr, false);
  if (a.is_discarded() || !a.is_object()) return give_up(i + obj + end);
  EmitCall(ToolCall{NewToolCallId(syntax_), name, DumpO(a)}, out);
  Consume(i + obj + end);
  state_ = State::kText;
  return !buf_.empty();
}

bool ToolCallParser::StepLlama(bool at_end, ToolParseOutput* out) {
  if (state_ != State::kPlain) {
    // Leading whitespace: held as content (dropped next to a call), so it is scanned once.
    const size_t ws = SkipSpace(buf_);
    EmitText(std::string_view(buf_).substr(0, ws), out);
    Consume(ws);
  }
  if (state_ == State::kStart) {
    const size_t i = 0;
    if (buf_.empty()) return false;
    const std::string_view rest = std::string_view(buf_).substr(i);
    if (rest.starts_with(kPythonTag)) {
      Consume(i + kPythonTag.size());
      state_ = State::kInCall;
      return true;
    }
    if (kPythonTag.starts_with(rest) && !at_end) return false;
    state_ = rest[0] == '{' ? State::kInCall : State::kPlain;
    return true;
  }
  if (state_ == State::kPlain) {
    EmitText(buf_, out);
    Consume(buf_.size());
    return false;
  }
  const size_t i = 0;
  if (buf_.empty()) return false;
  if (buf_[i] == ';' && n_calls_ > 0) {
    Consume(i + 1);
    return true;
  }
  if (buf_[i] != '{') {
    state_ = State::kPlain;
    return true;
  }
  const size_t stop = ScanBalanced(i);
  if (stop == std::string::npos) {
    if (!at_end) return false;
    state_ = State::kPlain;
    return true;
  }
  const std::string_view rest = std::string_view(buf_).substr(i);
  const size_t end = stop - i;
  auto call = CallFromText(rest.substr(0, end), *req_, {"parameters", "arguments"}, syntax_);
  if (!call) {
    state_ = State::kPlain;
    return true;
  }
  EmitCall(std::move(*call), out);
  Consume(i + end);
  return true;
}

void ToolCallParser::Run(bool at_end, ToolParseOutput* out) {
  for (;;) {
    bool more = false;
    switch (syntax_) {
      case ToolSyntax::kHermes:
      case ToolSyntax::kGeneric:
        more = StepHermes(at_end, out);
        break;
      case ToolSyntax::kMistral:
        more = StepMistral(at_end, out);
        break;
      case ToolSyntax::kLlama3Json:
        more = StepLlama(at_end, out);
        break;
    }
    if (!more) break;
  }
}

ToolParseOutput ToolCallParser::Feed(std::string_view text) {
  ToolParseOutput out;
  buf_.append(text);
  Run(false, &out);
  return out;
}

ToolParseOutput ToolCallParser::Finish() {
  ToolParseOutput out;
  Run(true, &out);
  if (!after_call_) out.content += ws_hold_;
  ws_hold_.clear();
  return out;
}

ToolParseOutput ParseToolCalls(ToolSyntax syntax, const ToolsRequest& req, std::string_view text) {
  ToolCallParser p(syntax, &req);
  ToolParseOutput out = p.Feed(text);
  ToolParseOutput end = p.Finish();
  out.content += end.content;
  for (ToolCall& c : end.calls) out.calls.push_back(std::move(c));
  return out;
}

}  // namespace chorus::server
