#include "chorus/tokenizer/chat_template.h"

#include <exception>
#include <unordered_map>
#include <utility>

#include "chorus/tokenizer/jinja_ast.h"
#include "chorus/tokenizer/jinja_interp.h"
#include "chorus/tokenizer/jinja_value.h"

namespace chorus::tokenizer {

namespace {

// Real templates are a few KiB (the largest tool-calling ones ~20 KiB); anything far larger
// is not a chat template.
constexpr size_t kMaxTemplateBytes = size_t{1} << 20;

// The exact text of transformers' former class-level default (teknium/OpenHermes-2.5 uses the
// same): the newlines are real newline characters inside the Jinja string literals.
constexpr std::string_view kDefaultTemplate =
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

Status ValidateOptions(const ChatRenderOptions& o) {
  if (o.max_output_bytes == 0 || o.max_steps <= 0 || o.max_alloc_bytes <= 0 ||
      o.max_call_depth <= 0) {
    return InvalidArgumentError("ChatRenderOptions limits must be positive");
  }
  return OkStatus();
}

Result<std::string> RenderValues(const jinja::Program& program, jinja::Value messages,
                                 const ChatRenderOptions& opts) {
  CHORUS_RETURN_IF_ERROR(ValidateOptions(opts));
  std::unordered_map<std::string, jinja::Value> globals;
  if (opts.extra_context.is_object()) {
    for (auto it = opts.extra_context.begin(); it != opts.extra_context.end(); ++it) {
      CHORUS_ASSIGN_OR_RETURN(jinja::Value v, jinja::FromJson(it.value()));
      globals[it.key()] = std::move(v);
    }
  } else if (!opts.extra_context.is_null()) {
    return InvalidArgumentError("ChatRenderOptions.extra_context must be a JSON object");
  }
  globals["messages"] = std::move(messages);
  globals["add_generation_prompt"] = jinja::Value::Bool(opts.add_generation_prompt);
  globals["bos_token"] = jinja::Value::Str(opts.bos_token);
  globals["eos_token"] = jinja::Value::Str(opts.eos_token);

  jinja::Limits limits;
  limits.max_output_bytes = opts.max_output_bytes;
  limits.max_steps = opts.max_steps;
  limits.max_alloc_bytes = opts.max_alloc_bytes;
  limits.max_call_depth = opts.max_call_depth;
  jinja::Interp interp(limits, std::move(globals));
  interp.now_unix = opts.now_unix_seconds;
  std::string out;
  CHORUS_RETURN_IF_ERROR(interp.Run(program.body, &out));
  return out;
}

}  // namespace

Result<ChatTemplate> ChatTemplate::Parse(std::string_view source) {
  if (source.size() > kMaxTemplateBytes) {
    return InvalidArgumentError("chat template is larger than " +
                                std::to_string(kMaxTemplateBytes) + " bytes");
  }
  try {
    CHORUS_ASSIGN_OR_RETURN(auto program, jinja::ParseProgram(source));
    return ChatTemplate(std::move(program));
  } catch (const std::exception& e) {
    return InternalError(std::string("chat template parse failed: ") + e.what());
  }
}

Result<ChatTemplate> ChatTemplate::ParseOrDefault(std::string_view source) {
  for (char c : source) {
    if (c != ' ' && c != '\t' && c != '\n' && c != '\r') return Parse(source);
  }
  return DefaultChatTemplate();
}

Result<std::string> ChatTemplate::Render(const std::vector<ChatMessage>& messages,
                                         const ChatRenderOptions& opts) const {
  try {
    std::vector<jinja::Value> items;
    items.reserve(messages.size());
    for (const auto& m : messages) {
      auto d = std::make_shared<jinja::DictData>();
      d->Set("role", jinja::Value::Str(m.role));
      d->Set("content", jinja::Value::Str(m.content));
      if (m.extra.is_object()) {
        for (auto it = m.extra.begin(); it != m.extra.end(); ++it) {
          CHORUS_ASSIGN_OR_RETURN(jinja::Value v, jinja::FromJson(it.value()));
          d->Set(it.key(), std::move(v));
        }
      }
      items.push_back(jinja::Value::Dict(std::move(d)));
    }
    return RenderValues(*program_, jinja::Value::List(std::move(items)), opts);
  } catch (const std::exception& e) {
    return InternalError(std::string("chat template render failed: ") + e.what());
  }
}

Result<std::string> ChatTemplate::RenderJson(const nlohmann::json& messages,
                                             const ChatRenderOptions& opts) const {
  if (!messages.is_array()) {
    return InvalidArgumentError("chat template messages must be a JSON array");
  }
  try {
    CHORUS_ASSIGN_OR_RETURN(jinja::Value v, jinja::FromJson(messages));
    return RenderValues(*program_, std::move(v), opts);
  } catch (const std::exception& e) {
    return InternalError(std::string("chat template render failed: ") + e.what());
  }
}

Result<std::string> ChatTemplate::RenderJson(const nlohmann::ordered_json& messages,
                                             const ChatRenderOptions& opts) const {
  if (!messages.is_array()) {
    return InvalidArgumentError("chat template messages must be a JSON array");
  }
  try {
    CHORUS_ASSIGN_OR_RETURN(jinja::Value v, jinja::FromJson(messages));
    return RenderValues(*program_, std::move(v), opts);
  } catch (const std::exception& e) {
    return InternalError(std::string("chat template render failed: ") + e.what());
  }
}

const std::string& ChatTemplate::source() const { return program_->source; }

std::string_view DefaultChatTemplateSource() { return kDefaultTemplate; }

ChatTemplate DefaultChatTemplate() {
  static const auto* const kTemplate = [] {
    auto r = ChatTemplate::Parse(kDefaultTemplate);
    CHORUS_CHECK(r.ok()) << r.status().ToString();
    return new ChatTemplate(std::move(r).value());
  }();
  return *kTemplate;
}

}  // namespace chorus::tokenizer
