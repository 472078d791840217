// test-labels: unit
// Chat templates: the real Hugging Face templates of common chat models rendered against
// expected prompts derived by hand from each template (the derivation is in the comment
// above each expectation), the Jinja features those templates rely on, and bad input:
// syntax errors, unknown filters, raise_exception, hostile templates hitting the limits.
#include "chorus/tokenizer/chat_template.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "chorus/tokenizer/fuzz_entry.h"
#include "tests/testutil/testutil.h"

namespace chorus::tokenizer {
namespace {

// Templates are kept exactly as they appear as the JSON string value of "chat_template" in
// each model's tokenizer_config.json (JSON escapes included) and decoded here, so the test
// sees byte-for-byte what a loader sees.
std::string FromJsonString(const char* json_literal) {
  return nlohmann::json::parse(json_literal).get<std::string>();
}

// meta-llama/Llama-2-7b-chat-hf, tokenizer_config.json "chat_template".
const char* const kLlama2ChatJson =
    R"json("{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}")json";

// meta-llama/Meta-Llama-3-8B-Instruct, tokenizer_config.json "chat_template".
const char* const kLlama3InstructJson =
    R"json("{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")json";

// mistralai/Mistral-7B-Instruct-v0.2 (and Mixtral-8x7B-Instruct-v0.1), "chat_template".
const char* const kMistralV02Json =
    R"json("{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}")json";

// mistralai/Mistral-7B-Instruct-v0.1, "chat_template" (eos_token followed by a space).
const char* const kMistralV01Json =
    R"json("{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token + ' ' }}{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}")json";

// Qwen/Qwen2-7B-Instruct, "chat_template" (ChatML with a default system turn).
const char* const kQwen2InstructJson =
    R"json("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")json";

// teknium/OpenHermes-2.5-Mistral-7B, "chat_template" (plain ChatML).
const char* const kChatMlJson =
    R"json("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")json";

// HuggingFaceH4/zephyr-7b-beta, "chat_template". Note the newlines between the tags: the
// prompt only comes out right with trim_blocks.
const char* const kZephyrJson =
    R"json("{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ '<|user|>\n' + message['content'] + eos_token }}\n{% elif message['role'] == 'system' %}\n{{ '<|system|>\n' + message['content'] + eos_token }}\n{% elif message['role'] == 'assistant' %}\n{{ '<|assistant|>\n'  + message['content'] + eos_token }}\n{% endif %}\n{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n{% endfor %}")json";

// meta-llama/Llama-3.1-8B-Instruct, "chat_template" (tool calling: tools in the first user
// turn, one tool call per assistant turn, tool results as ipython turns).
const char* const kLlama31InstructJson =
    R"json("{{- bos_token }}\n{%- if custom_tools is defined %}\n    {%- set tools = custom_tools %}\n{%- endif %}\n{%- if not tools_in_user_message is defined %}\n    {%- set tools_in_user_message = true %}\n{%- endif %}\n{%- if not date_string is defined %}\n    {%- set date_string = \"26 Jul 2024\" %}\n{%- endif %}\n{%- if not tools is defined %}\n    {%- set tools = none %}\n{%- endif %}\n\n{#- This block extracts the system message, so we can slot it into the right place. #}\n{%- if messages[0]['role'] == 'system' %}\n    {%- set system_message = messages[0]['content']|trim %}\n    {%- set messages = messages[1:] %}\n{%- else %}\n    {%- set system_message = \"\" %}\n{%- endif %}\n\n{#- System message + builtin tools #}\n{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}\n{%- if builtin_tools is defined or tools is not none %}\n    {{- \"Environment: ipython\\n\" }}\n{%- endif %}\n{%- if builtin_tools is defined %}\n    {{- \"Tools: \" + builtin_tools | reject('equalto', 'code_interpreter') | join(\", \") + \"\\n\\n\"}}\n{%- endif %}\n{{- \"Cutting Knowledge Date: December 2023\\n\" }}\n{{- \"Today Date: \" + date_string + \"\\n\\n\" }}\n{%- if tools is not none and not tools_in_user_message %}\n    {{- \"You have access to the following functions. To call a function, please respond with JSON for a function call.\" }}\n    {{- 'Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name and its value}.' }}\n    {{- \"Do not use variables.\\n\\n\" }}\n    {%- for t in tools %}\n        {{- t | tojson(indent=4) }}\n        {{- \"\\n\\n\" }}\n    {%- endfor %}\n{%- endif %}\n{{- system_message }}\n{{- \"<|eot_id|>\" }}\n\n{#- Custom tools are passed in a user message with some extra guidance #}\n{%- if tools_in_user_message and not tools is none %}\n    {#- Extract the first user message so we can plug it in here #}\n    {%- if messages | length != 0 %}\n        {%- set first_user_message = messages[0]['content']|trim %}\n        {%- set messages = messages[1:] %}\n    {%- else %}\n        {{- raise_exception(\"Cannot put tools in the first user message when there's no first user message!\") }}\n{%- endif %}\n    {{- '<|start_header_id|>user<|end_header_id|>\\n\\n' -}}\n    {{- \"Given the following functions, please respond with a JSON for a function call \" }}\n    {{- \"with its proper arguments that best answers the given prompt.\\n\\n\" }}\n    {{- 'Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name and its value}.' }}\n    {{- \"Do not use variables.\\n\\n\" }}\n    {%- for t in tools %}\n        {{- t | tojson(indent=4) }}\n        {{- \"\\n\\n\" }}\n    {%- endfor %}\n    {{- first_user_message + \"<|eot_id|>\"}}\n{%- endif %}\n\n{%- for message in messages %}\n    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}\n        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}\n    {%- elif 'tool_calls' in message %}\n        {%- if not message.tool_calls|length == 1 %}\n            {{- raise_exception(\"This model only supports single tool-calls at once!\") }}\n        {%- endif %}\n        {%- set tool_call = message.tool_calls[0].function %}\n        {%- if builtin_tools is defined and tool_call.name in builtin_tools %}\n            {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}\n            {{- \"<|python_tag|>\" + tool_call.name + \".call(\" }}\n            {%- for arg_name, arg_val in tool_call.arguments | items %}\n                {{- arg_name + '=\"' + arg_val + '\"' }}\n                {%- if not loop.last %}\n                    {{- \", \" }}\n                {%- endif %}\n                {%- endfor %}\n            {{- \")\" }}\n        {%- else  %}\n            {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}\n            {{- '{\"name\": \"' + tool_call.name + '\", ' }}\n            {{- '\"parameters\": ' }}\n            {{- tool_call.arguments | tojson }}\n            {{- \"}\" }}\n        {%- endif %}\n        {%- if builtin_tools is defined %}\n            {#- This means we're in ipython mode #}\n            {{- \"<|eom_id|>\" }}\n        {%- else %}\n            {{- \"<|eot_id|>\" }}\n        {%- endif %}\n    {%- elif message.role == \"tool\" or message.role == \"ipython\" %}\n        {{- \"<|start_header_id|>ipython<|end_header_id|>\\n\\n\" }}\n        {%- if message.content is mapping or message.content is iterable %}\n            {{- message.content | tojson }}\n        {%- else %}\n            {{- message.content }}\n        {%- endif %}\n        {{- \"<|eot_id|>\" }}\n    {%- endif %}\n{%- endfor %}\n{%- if add_generation_prompt %}\n    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n{%- endif %}\n")json";

// The conversation used for every model: a system prompt, and an assistant turn with
// surrounding whitespace so that templates which strip (Llama-2 .strip(), Llama-3 | trim)
// and templates which do not (ChatML, Mistral, Zephyr) are told apart.
std::vector<ChatMessage> WithSystem() {
  return {
      {"system", "You are a helpful assistant.", {}},
      {"user", "Hello!", {}},
      {"assistant", "  Hi! How can I help?\n", {}},
      {"user", "What is 2+2?", {}},
  };
}
std::vector<ChatMessage> WithoutSystem() {
  return {
      {"user", "Hello!", {}},
      {"assistant", "  Hi! How can I help?\n", {}},
      {"user", "What is 2+2?", {}},
  };
}

ChatRenderOptions Opts(bool add_generation_prompt, std::string bos, std::string eos) {
  ChatRenderOptions o;
  o.add_generation_prompt = add_generation_prompt;
  o.bos_token = std::move(bos);
  o.eos_token = std::move(eos);
  return o;
}

ChatTemplate MustParse(const std::string& src) {
  auto t = ChatTemplate::Parse(src);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  if (!t.ok()) return DefaultChatTemplate();
  return std::move(t).value();
}

std::string MustRender(const ChatTemplate& t, const std::vector<ChatMessage>& msgs,
                       const ChatRenderOptions& o) {
  auto r = t.Render(msgs, o);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? r.value() : std::string("<error>");
}

// Renders a small template with the WithSystem() conversation and no extra options.
std::string Eval(const std::string& src, const nlohmann::json& extra = nlohmann::json::object()) {
  auto t = ChatTemplate::Parse(src);
  if (!t.ok()) return "<parse error: " + t.status().ToString() + ">";
  ChatRenderOptions o = Opts(true, "<s>", "</s>");
  o.extra_context = extra;
  auto r = t->Render(WithSystem(), o);
  if (!r.ok()) return "<render error: " + r.status().ToString() + ">";
  return r.value();
}

Status RenderStatus(const std::string& src, const ChatRenderOptions& o,
                    const std::vector<ChatMessage>& msgs = WithSystem()) {
  auto t = ChatTemplate::Parse(src);
  if (!t.ok()) return t.status();
  return t->Render(msgs, o).status();
}

// ============================================================ real templates

TEST(ChatTemplateModels, Llama2Chat) {
  const ChatTemplate t = MustParse(FromJsonString(kLlama2ChatJson));
  // messages[0] is the system turn → loop_messages = messages[1:], system_message set.
  // Turn 0 (user): content = '<<SYS>>\n' + system + '\n<</SYS>>\n\n' + 'Hello!', printed as
  //   bos + '[INST] ' + content.strip() + ' [/INST]'.
  // Turn 1 (assistant): ' ' + '  Hi! How can I help?\n'.strip() + ' ' + eos.
  // Turn 2 (user): bos + '[INST] What is 2+2? [/INST]'.
  // add_generation_prompt is not used by this template.
  const std::string expected =
      "<s>[INST] <<SYS>>\nYou are a helpful assistant.\n<</SYS>>\n\nHello! [/INST]"
      " Hi! How can I help? </s>"
      "<s>[INST] What is 2+2? [/INST]";
  EXPECT_EQ(MustRender(t, WithSystem(), Opts(true, "<s>", "</s>")), expected);
  EXPECT_EQ(MustRender(t, WithSystem(), Opts(false, "<s>", "</s>")), expected);
  // Without a system turn: system_message = false, so no <<SYS>> block.
  EXPECT_EQ(MustRender(t, WithoutSystem(), Opts(true, "<s>", "</s>")),
            "<s>[INST] Hello! [/INST] Hi! How can I help? </s><s>[INST] What is 2+2? [/INST]");
}

TEST(ChatTemplateModels, Llama2ChatRejectsNonAlternatingRoles) {
  const ChatTemplate t = MustParse(FromJsonString(kLlama2ChatJson));
  // Two user turns in a row: the second has index0 = 1, (True) != (1 % 2 == 0) → raise.
  const std::vector<ChatMessage> bad = {{"user", "a", {}}, {"user", "b", {}}};
  auto r = t.Render(bad, Opts(true, "<s>", "</s>"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(),
            "Conversation roles must alternate user/assistant/user/assistant/...");
}

TEST(ChatTemplateModels, Llama3Instruct) {
  const ChatTemplate t = MustParse(FromJsonString(kLlama3InstructJson));
  // Each message: '<|start_header_id|>' + role + '<|end_header_id|>\n\n' + (content | trim)
  // + '<|eot_id|>' — the filter binds tighter than '+', so only the content is trimmed; the
  // first message gets bos_token in front. add_generation_prompt appends the assistant header.
  const std::string body =
      "<|begin_of_text|>"
      "<|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant.<|eot_id|>"
      "<|start_header_id|>user<|end_header_id|>\n\nHello!<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\nHi! How can I help?<|eot_id|>"
      "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>";
  EXPECT_EQ(MustRender(t, WithSystem(), Opts(true, "<|begin_of_text|>", "<|end_of_text|>")),
            body + "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(MustRender(t, WithSystem(), Opts(false, "<|begin_of_text|>", "<|end_of_text|>")), body);
}

TEST(ChatTemplateModels, MistralInstructV02) {
  const ChatTemplate t = MustParse(FromJsonString(kMistralV02Json));
  // bos, then '[INST] ' + content + ' [/INST]' for users and content + eos for the
  // assistant (content is not stripped). No generation prompt: the prompt ends in [/INST].
  const std::string expected =
      "<s>[INST] Hello! [/INST]  Hi! How can I help?\n</s>[INST] What is 2+2? [/INST]";
  EXPECT_EQ(MustRender(t, WithoutSystem(), Opts(true, "<s>", "</s>")), expected);
  EXPECT_EQ(MustRender(t, WithoutSystem(), Opts(false, "<s>", "</s>")), expected);
}

TEST(ChatTemplateModels, MistralInstructV01) {
  const ChatTemplate t = MustParse(FromJsonString(kMistralV01Json));
  // As v0.2 but the assistant turn ends with eos + ' '.
  EXPECT_EQ(MustRender(t, WithoutSystem(), Opts(true, "<s>", "</s>")),
            "<s>[INST] Hello! [/INST]  Hi! How can I help?\n</s> [INST] What is 2+2? [/INST]");
}

TEST(ChatTemplateModels, MistralRejectsSystemAndNonAlternatingRoles) {
  const ChatTemplate t = MustParse(FromJsonString(kMistralV02Json));
  // A system turn at index 0: (role == 'user') is False != (0 % 2 == 0) True → alternation
  // error before the role check is reached.
  auto r = t.Render(WithSystem(), Opts(true, "<s>", "</s>"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(),
            "Conversation roles must alternate user/assistant/user/assistant/...");
  // assistant first → alternation error.
  r = t.Render({{"assistant", "x", {}}}, Opts(true, "<s>", "</s>"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(),
            "Conversation roles must alternate user/assistant/user/assistant/...");
  // A system turn at an odd index passes the parity check and hits the role check.
  r = t.Render({{"user", "x", {}}, {"system", "y", {}}}, Opts(true, "<s>", "</s>"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "Only user and assistant roles are supported!");
}

TEST(ChatTemplateModels, Qwen2Instruct) {
  const ChatTemplate t = MustParse(FromJsonString(kQwen2InstructJson));
  // Each message: '<|im_start|>' + role + '\n' + content + '<|im_end|>\n'; a system turn is
  // given so no default system is inserted; content is not stripped.
  const std::string body =
      "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
      "<|im_start|>user\nHello!<|im_end|>\n"
      "<|im_start|>assistant\n  Hi! How can I help?\n<|im_end|>\n"
      "<|im_start|>user\nWhat is 2+2?<|im_end|>\n";
  EXPECT_EQ(MustRender(t, WithSystem(), Opts(true, "", "<|im_end|>")),
            body + "<|im_start|>assistant\n");
  EXPECT_EQ(MustRender(t, WithSystem(), Opts(false, "", "<|im_end|>")), body);
  // Without a system turn, loop.first and messages[0].role != 'system' inserts the default
  // system turn; the rest is identical.
  EXPECT_EQ(MustRender(t, WithoutSystem(), Opts(false, "", "<|im_end|>")), body);
}

TEST(ChatTemplateModels, ChatMlIsTheDefaultTemplate) {
  const ChatTemplate t = MustParse(FromJsonString(kChatMlJson));
  EXPECT_EQ(t.source(), std::string(DefaultChatTemplateSource()));
  // Like Qwen2 without the default system turn.
  const std::string body =
      "<|im_start|>user\nHello!<|im_end|>\n"
      "<|im_start|>assistant\n  Hi! How can I help?\n<|im_end|>\n"
      "<|im_start|>user\nWhat is 2+2?<|im_end|>\n";
  EXPECT_EQ(MustRender(t, WithoutSystem(), Opts(true, "", "")), body + "<|im_start|>assistant\n");
  EXPECT_EQ(MustRender(DefaultChatTemplate(), WithoutSystem(), Opts(true, "", "")),
            body + "<|im_start|>assistant\n");
  EXPECT_EQ(MustRender(DefaultChatTemplate(), WithoutSystem(), Opts(false, "", "")), body);
}

TEST(ChatTemplateModels, Zephyr) {
  const ChatTemplate t = MustParse(FromJsonString(kZephyrJson));
  // trim_blocks removes the newline after every {% ... %}; the newline after each
  // {{ ... }} stays. So each message renders '<|role|>\n' + content + eos + '\n', and on the
  // last message add_generation_prompt adds '<|assistant|>' + '\n'.
  const std::string body =
      "<|system|>\nYou are a helpful assistant.</s>\n"
      "<|user|>\nHello!</s>\n"
      "<|assistant|>\n  Hi! How can I help?\n</s>\n"
      "<|user|>\nWhat is 2+2?</s>\n";
  EXPECT_EQ(MustRender(t, WithSystem(), Opts(true, "<s>", "</s>")), body + "<|assistant|>\n");
  EXPECT_EQ(MustRender(t, WithSystem(), Opts(false, "<s>", "</s>")), body);
}

TEST(ChatTemplateModels, Phi3FromTokenizerConfig) {
  CHORUS_REQUIRE_SHARED_MODEL("phi3-tokenizer/tokenizer_config.json");
  std::ifstream f(testing::SharedModelsDir() + "/phi3-tokenizer/tokenizer_config.json");
  std::stringstream ss;
  ss << f.rdbuf();
  const auto config = nlohmann::json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  ASSERT_TRUE(config.is_object());
  ASSERT_TRUE(config.contains("chat_template"));
  const ChatTemplate t = MustParse(config["chat_template"].get<std::string>());
  const std::string bos = config.value("bos_token", "");
  const std::string eos = config.value("eos_token", "");
  EXPECT_EQ(bos, "<s>");
  // The template: bos, then for a user turn '<|user|>\n' + content + '<|end|>\n<|assistant|>\n'
  // and for an assistant turn content + '<|end|>\n'. System turns are dropped (no branch for
  // them) and the assistant header is always emitted after a user turn, whatever
  // add_generation_prompt says.
  const std::string expected =
      "<s><|user|>\nHello!<|end|>\n<|assistant|>\n"
      "  Hi! How can I help?\n<|end|>\n"
      "<|user|>\nWhat is 2+2?<|end|>\n<|assistant|>\n";
  EXPECT_EQ(MustRender(t, WithSystem(), Opts(true, bos, eos)), expected);
  EXPECT_EQ(MustRender(t, WithSystem(), Opts(false, bos, eos)), expected);
}

TEST(ChatTemplateModels, ModelsWithoutTemplateFallBackToChatMl) {
  // The Llama 2 (base) and phi-2 tokenizer configs carry no chat_template.
  for (const char* rel :
       {"llama2-tokenizer/tokenizer_config.json", "phi2-tokenizer/tokenizer_config.json"}) {
    CHORUS_REQUIRE_SHARED_MODEL(rel);
    std::ifstream f(testing::SharedModelsDir() + "/" + rel);
    std::stringstream ss;
    ss << f.rdbuf();
    const auto config = nlohmann::json::parse(ss.str(), nullptr, false);
    ASSERT_TRUE(config.is_object()) << rel;
    const std::string src = config.contains("chat_template") && config["chat_template"].is_string()
                                ? config["chat_template"].get<std::string>()
                                : std::string();
    EXPECT_TRUE(src.empty()) << rel;
    auto t = ChatTemplate::ParseOrDefault(src);
    ASSERT_TRUE(t.ok());
    EXPECT_EQ(t->source(), std::string(DefaultChatTemplateSource()));
    EXPECT_EQ(MustRender(*t, {{"user", "Hi", {}}}, Opts(true, "", "")),
              "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  }
}

TEST(ChatTemplateModels, Llama31InstructWithTools) {
  const ChatTemplate t = MustParse(FromJsonString(kLlama31InstructJson));
  // Key order of the tool schema is kept (ordered_json) because tojson prints it.
  const auto tools = nlohmann::ordered_json::parse(R"([{"type": "function", "function": {
      "name": "get_weather", "description": "Get weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                     "required": ["city"]}}}])");
  const auto msgs = nlohmann::ordered_json::parse(R"([
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": "", "tool_calls": [{"type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
      {"role": "tool", "content": "18C"}])");
  ChatRenderOptions o = Opts(true, "<|begin_of_text|>", "<|eot_id|>");
  o.extra_context = {{"tools", tools}};
  auto r = t.RenderJson(msgs, o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  // Derivation: the system turn is pulled out (system_message = "Be brief.", trimmed);
  // tools is defined, so the system header gets "Environment: ipython\n"; date_string is
  // undefined → "26 Jul 2024"; tools_in_user_message defaults to true, so the tool list goes
  // into the first user turn as tojson(indent=4) followed by "\n\n" and that turn's content;
  // the assistant turn has one tool call → '{"name": "get_weather", "parameters": ' +
  // arguments|tojson + '}' + <|eot_id|>; the tool turn becomes an ipython turn, and since a
  // string `is iterable`, its content goes through tojson → "\"18C\"".
  const std::string expected =
      "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
      "Environment: ipython\nCutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
      "Be brief.<|eot_id|>"
      "<|start_header_id|>user<|end_header_id|>\n\n"
      "Given the following functions, please respond with a JSON for a function call with its "
      "proper arguments that best answers the given prompt.\n\n"
      "Respond in the format {\"name\": function name, \"parameters\": dictionary of argument "
      "name and its value}.Do not use variables.\n\n"
      "{\n    \"type\": \"function\",\n    \"function\": {\n        \"name\": \"get_weather\",\n"
      "        \"description\": \"Get weather\",\n        \"parameters\": {\n"
      "            \"type\": \"object\",\n            \"properties\": {\n"
      "                \"city\": {\n                    \"type\": \"string\"\n                }\n"
      "            },\n            \"required\": [\n                \"city\"\n            ]\n"
      "        }\n    }\n}\n\n"
      "Weather in Paris?<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\n"
      "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}<|eot_id|>"
      "<|start_header_id|>ipython<|end_header_id|>\n\n\"18C\"<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\n";
  EXPECT_EQ(r.value(), expected);
  // Two tool calls in one turn: the template's own error.
  auto two = msgs;
  two[2]["tool_calls"].push_back(two[2]["tool_calls"][0]);
  r = t.RenderJson(two, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "This model only supports single tool-calls at once!");
}

TEST(ChatTemplateModels, RenderJsonMatchesRender) {
  const ChatTemplate t = MustParse(FromJsonString(kLlama3InstructJson));
  nlohmann::json msgs = nlohmann::json::array();
  for (const auto& m : WithSystem()) msgs.push_back({{"role", m.role}, {"content", m.content}});
  auto a = t.RenderJson(msgs, Opts(true, "<|begin_of_text|>", ""));
  auto b = t.Render(WithSystem(), Opts(true, "<|begin_of_text|>", ""));
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(a.value(), b.value());
  EXPECT_FALSE(t.RenderJson(nlohmann::json::object(), Opts(true, "", "")).ok());
}

// ============================================================ whitespace control

TEST(ChatTemplateWhitespace, TrimAndLstripBlocks) {
  // The newline after {% if %} goes (trim_blocks); the line holding only {% endif %} loses
  // its indentation (lstrip_blocks); the template's single trailing newline is dropped.
  EXPECT_EQ(Eval("{% if true %}\n  yes\n  {% endif %}\n"), "  yes\n");
  EXPECT_EQ(Eval("a\n    {% if true %}b{% endif %}"), "a\nb");
  // Not at the start of a line: no lstrip.
  EXPECT_EQ(Eval("a  {% if true %}b{% endif %}"), "a  b");
  // {{ }} is neither trimmed nor lstripped.
  EXPECT_EQ(Eval("a\n  {{ 'b' }}\nc"), "a\n  b\nc");
  // Comments behave like blocks.
  EXPECT_EQ(Eval("a\n  {# note #}\nb"), "a\nb");
  // Two trailing newlines: only one is dropped.
  EXPECT_EQ(Eval("x\n\n"), "x\n");
}

TEST(ChatTemplateWhitespace, ExplicitControl) {
  EXPECT_EQ(Eval("a  \n  {%- if true -%}  \n b {%- endif %}"), "ab");
  EXPECT_EQ(Eval("x  {{- 'y' -}}  \n z"), "xyz");
  EXPECT_EQ(Eval("a \n {#- c -#} \n b"), "ab");
  // {%+ disables lstrip_blocks, +%} disables trim_blocks.
  EXPECT_EQ(Eval("a\n  {%+ if true %}b{% endif %}"), "a\n  b");
  EXPECT_EQ(Eval("{% if true +%}\nb{% endif %}"), "\nb");
  EXPECT_EQ(Eval("a\n{# c +#}\nb"), "a\n\nb");
  // \r\n is normalised.
  EXPECT_EQ(Eval("{% if true %}\r\nb\r\n{% endif %}"), "b\n");
}

TEST(ChatTemplateWhitespace, RawBlock) {
  EXPECT_EQ(Eval("{% raw %}{{ not parsed }}{% if %}{% endraw %}!"), "{{ not parsed }}{% if %}!");
  EXPECT_EQ(Eval("{%- raw -%}  x  {%- endraw -%}"), "x");
}

// ============================================================ features

TEST(ChatTemplateFeatures, Loops) {
  EXPECT_EQ(
      Eval("{% for x in ['a','b','c'] %}{{ loop.index0 }}{{ loop.index }}{{ x }}"
           "{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.revindex }}|{% endfor %}"),
      "01aTrueFalse33|12bFalseFalse32|23cFalseTrue31|");
  EXPECT_EQ(Eval("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}"),
            "a=1;b=2;");
  EXPECT_EQ(Eval("{% for k, v in {'x': [1], 'y': none} | items %}{{ k }}:{{ v }} {% endfor %}"),
            "x:[1] y:None ");
  EXPECT_EQ(Eval("{% for k in {'b': 1, 'a': 2} %}{{ k }}{% endfor %}"), "ba");
  EXPECT_EQ(Eval("{% for x in [] %}x{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(Eval("{% for m in messages if m.role != 'system' %}{{ loop.index }}{{ m.role[0] }}"
                 "{% endfor %}"),
            "1u2a3u");
  EXPECT_EQ(Eval("{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}"
                 "{% if i == 5 %}{% break %}{% endif %}{{ i }}{% endfor %}"),
            "0134");
  EXPECT_EQ(Eval("{% for i in range(1, 10, 3) %}{{ i }}{% endfor %}"), "147");
  EXPECT_EQ(Eval("{% for c in 'hé!' %}[{{ c }}]{% endfor %}"), "[h][é][!]");
  EXPECT_EQ(Eval("{% for x in [1,2,3] %}{{ loop.cycle('a', 'b') }}{% endfor %}"), "aba");
  EXPECT_EQ(Eval("{% for a in [1, 2] %}{% for b in [3, 4] %}{{ a * b }} {% endfor %}{% endfor %}"),
            "3 4 6 8 ");
}

TEST(ChatTemplateFeatures, SetScopingAndNamespace) {
  // A set inside a loop does not leak out of it; namespace() attributes do.
  EXPECT_EQ(Eval("{% set x = 1 %}{% for i in [1,2] %}{% set x = i * 10 %}{{ x }},{% endfor %}"
                 "{{ x }}"),
            "10,20,1");
  EXPECT_EQ(Eval("{% set ns = namespace(found=false, n=0) %}{% for m in messages %}"
                 "{% if m.role == 'system' %}{% set ns.found = true %}{% endif %}"
                 "{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.found }} {{ ns.n }}"),
            "True 4");
  // set inside if is not scoped.
  EXPECT_EQ(Eval("{% if true %}{% set y = 'in' %}{% endif %}{{ y }}"), "in");
  EXPECT_EQ(Eval("{% set a, b = [1, 2] %}{{ b }}{{ a }}"), "21");
  EXPECT_EQ(Eval("{% set t = 1, 2 %}{{ t }}"), "(1, 2)");
  EXPECT_EQ(Eval("{% set x %}a{{ 1 + 1 }}b{% endset %}[{{ x }}]"), "[a2b]");
  EXPECT_EQ(Eval("{% generation %}hi{% endgeneration %}"), "hi");
}

TEST(ChatTemplateFeatures, Macros) {
  EXPECT_EQ(Eval("{% macro greet(name, punct='!') %}Hello {{ name }}{{ punct }}{% endmacro %}"
                 "{{ greet('Bob') }} {{ greet('Al', punct='?') }} {{ greet(name='Cy') }}"),
            "Hello Bob! Hello Al? Hello Cy!");
  // Macros see the template's variables, and their own sets stay local.
  EXPECT_EQ(Eval("{% macro m() %}{% set bos_token = 'X' %}{{ bos_token }}{{ messages | length }}"
                 "{% endmacro %}{{ m() }}{{ bos_token }}"),
            "X4<s>");
  EXPECT_EQ(Eval("{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}"
                 "{{ f(3) }}"),
            "321");
}

TEST(ChatTemplateFeatures, Filters) {
  EXPECT_EQ(
      Eval("{{ '  hi \n' | trim }}|{{ [1,2,3] | length }}|{{ 'héllo' | length }}|"
           "{{ {'a': 1} | length }}|{{ 'abc' | upper }}|{{ 'ABC' | lower }}|"
           "{{ nope | default('dflt') }}|{{ '' | default('e', true) }}|{{ 'v' | default('x') }}|"
           "{{ ['a','b'] | join(', ') }}|{{ [1,2] | first }}|{{ [1,2] | last }}|"
           "{{ 42 | string }}|{{ 'hello World' | capitalize }}|"
           "{{ 'a-b-c' | replace('-', '+') }}|{{ '<x>' | safe }}|{{ 'hello world' | title }}|"
           "{{ 'xyx' | trim('x') }}|{{ '3' | int + 1 }}|{{ [3, 1] | reverse | list }}"),
      "hi|3|5|1|ABC|abc|dflt|e|v|a, b|1|2|42|Hello world|a+b+c|<x>|Hello World|y|4|[1, 3]");
  // The title filter splits words at whitespace and '-' only; str.title() at any non-letter.
  EXPECT_EQ(Eval("{{ \"o'neil x2y-z\" | title }}|{{ \"o'neil x2y-z\".title() }}"),
            "O'neil X2y-Z|O'Neil X2Y-Z");
  EXPECT_EQ(Eval("{{ messages | map(attribute='role') | join(',') }}"),
            "system,user,assistant,user");
  EXPECT_EQ(Eval("{{ messages | selectattr('role', 'equalto', 'user') | map(attribute='content')"
                 " | list }}"),
            "['Hello!', 'What is 2+2?']");
  EXPECT_EQ(Eval("{{ messages | rejectattr('role', 'in', ['system', 'user']) | list | length }}"),
            "1");
  EXPECT_EQ(Eval("{{ [1, none, 2] | select('number') | list }}{{ [0, 1, ''] | reject | list }}"),
            "[1, 2][0, '']");
}

TEST(ChatTemplateFeatures, ToJson) {
  // Hugging Face's tojson is json.dumps(ensure_ascii=False): ", " / ": " separators.
  EXPECT_EQ(Eval("{{ {'name': 'f', 'args': [1, 2.5, true, none, 'q\"é\\n']} | tojson }}"),
            R"({"name": "f", "args": [1, 2.5, true, null, "q\"é\n"]})");
  EXPECT_EQ(Eval("{{ {'a': [1, 2], 'b': {}} | tojson(indent=2) }}"),
            "{\n  \"a\": [\n    1,\n    2\n  ],\n  \"b\": {}\n}");
  // Tool definitions from the request go through extra_context.
  nlohmann::json extra = {{"tools", nlohmann::json::array({{{"type", "function"}}})}};
  EXPECT_EQ(Eval("{% for t in tools %}{{ t | tojson }}{% endfor %}", extra),
            R"({"type": "function"})");
}

TEST(ChatTemplateFeatures, Tests) {
  EXPECT_EQ(Eval("{{ x is defined }}{{ none is none }}{{ 'a' is string }}{{ {} is mapping }}"
                 "{{ [] is iterable }}{{ 3 is number }}{{ x is not defined }}{{ 1 is not none }}"
                 "{{ 'a' is mapping }}{{ 3 is odd }}{{ 4 is divisibleby 2 }}{{ 4 is even }}"
                 "{{ true is boolean }}{{ 1.5 is float }}{{ 1 is integer }}"),
            "FalseTrueTrueTrueTrueTrueTrueTrueFalseTrueTrueTrueTrueTrueTrue");
  EXPECT_EQ(Eval("{{ messages[0].content is string }}{{ messages[0].name is defined }}"
                 "{{ messages[0]['role'] is equalto 'system' }}"),
            "TrueFalseTrue");
  // Python's bool is an int and floats have parity too.
  EXPECT_EQ(Eval("{{ true is odd }}{{ 3.0 is odd }}{{ 4 is even }}"), "TrueTrueTrue");
}

TEST(ChatTemplateFeatures, Operators) {
  EXPECT_EQ(Eval("{{ 1 + 2 * 3 }}|{{ 7 // 2 }}|{{ -7 // 2 }}|{{ 7 % 3 }}|{{ -7 % 3 }}|"
                 "{{ 7 / 2 }}|{{ 'a' ~ 1 ~ none }}|{{ 'b' in 'abc' }}|{{ 2 not in [1,3] }}|"
                 "{{ 1 < 2 and not (3 <= 2) or false }}|{{ 2 ** 10 }}|{{ 'x' * 3 }}|"
                 "{{ 1 == 1.0 }}|{{ 'a' != 'b' }}|{{ [1] + [2] }}|{{ 'k' in {'k': 1} }}|"
                 "{{ (1, 2) }}|{{ -(3) }}|{{ 'b' > 'a' }}|{{ 0 or 'x' }}|{{ 1 and 2 }}|{{ (1,) }}"),
            "7|3|-4|1|2|3.5|a1None|True|True|True|1024|xxx|True|True|[1, 2]|True|(1, 2)|-3|True|"
            "x|2|(1,)");
  // Chained comparisons: 3 > 2 > 1 is (3 > 2) and (2 > 1).
  EXPECT_EQ(Eval("{{ 3 > 2 > 1 }}{{ 1 < 3 < 2 }}{{ 1 == 1 in [1] }}"), "TrueFalseTrue");
  // Sequences compare lexicographically.
  EXPECT_EQ(Eval("{{ (1, 2) < (1, 3) }}{{ [1, [2]] < [1, [3]] }}{{ [1] < [1, 0] }}"),
            "TrueTrueTrue");
  // ~ binds tighter than +, filters tighter than both.
  EXPECT_EQ(Eval("{{ 'a' + 'b' ~ 'c' }}|{{ 'x' ~ ' y ' | trim }}"), "abc|xy");
  EXPECT_EQ(Eval("{{ 'a' if true else 'b' }}{{ 'c' if false else 'd' }}{{ 'e' if false }}"), "ad");
  EXPECT_EQ(Eval("{% if false %}1{% elif none %}2{% elif 'x' %}3{% else %}4{% endif %}"), "3");
}

TEST(ChatTemplateFeatures, Values) {
  EXPECT_EQ(Eval("{{ 1.0 }}|{{ 0.1 + 0.2 }}|{{ 1e20 }}|{{ 2.5e-5 }}|{{ 100.0 / 4 }}|{{ 1_000 }}"),
            "1.0|0.30000000000000004|1e+20|2.5e-05|25.0|1000");
  EXPECT_EQ(Eval("{{ none }}|{{ true }}|{{ [1, 'a', none, {'k': \"it's\"}] }}|{{ undefined_x }}|"),
            "None|True|[1, 'a', None, {'k': \"it's\"}]||");
  EXPECT_EQ(Eval("{{ 'tab\\there' }}|{{ \"dq\\\"\" }}|{{ '\\u00e9' }}|{{ 'a' 'b' }}"),
            "tab\there|dq\"|é|ab");
}

TEST(ChatTemplateFeatures, IndexingAndSlicing) {
  EXPECT_EQ(Eval("{{ [1,2,3,4][1:] }}|{{ [1,2,3,4][::-1] }}|{{ 'hello'[1:3] }}|"
                 "{{ 'hello'[::-1] }}|{{ [1,2,3][-1] }}|{{ [1,2,3,4,5][1:4:2] }}|"
                 "{{ [1,2,3][5:] }}|{{ [1,2,3][:-1] }}|{{ 'héllo'[1] }}"),
            "[2, 3, 4]|[4, 3, 2, 1]|el|olleh|3|[2, 4]|[]|[1, 2]|é");
  EXPECT_EQ(Eval("{{ messages[1].role }}{{ messages[1]['role'] }}{{ messages[-1].content }}"),
            "useruserWhat is 2+2?");
  // Out-of-range index and missing key are undefined (printing nothing), not errors.
  EXPECT_EQ(Eval("[{{ messages[10] }}][{{ messages[0].nope }}][{{ {'a': 1}['b'] }}]"), "[][][]");
  EXPECT_EQ(Eval("{{ messages[0].get('role') }}{{ messages[0].get('x', 'dflt') }}"
                 "{{ messages[0].keys() | list }}"),
            "systemdflt['role', 'content']");
}

TEST(ChatTemplateFeatures, StringMethods) {
  EXPECT_EQ(
      Eval("{{ '  x  '.strip() }}|{{ '  x'.lstrip() }}|{{ 'x  '.rstrip() }}|"
           "{{ 'abc'.startswith('ab') }}|{{ 'abc'.endswith('bc') }}|"
           "{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'aB'.upper() }}|"
           "{{ 'aB'.lower() }}|{{ 'hello there'.title() }}|{{ 'xxaxx'.strip('x') }}|"
           "{{ 'a b c'.split(' ', 1) }}|{{ 'abc'.replace('b', 'B') }}|"
           "{{ '-'.join(['a', 'b']) }}|{{ 'abc'.find('c') }}|{{ 'abc'.startswith(('z', 'a')) }}"),
      "x|x|x|True|True|['a', 'b', '', 'c']|['a', 'b']|AB|ab|Hello There|a|"
      "['a', 'b c']|aBc|a-b|2|True");
}

TEST(ChatTemplateFeatures, MessagesWithToolCallsAndContentParts) {
  // An OpenAI-shaped request: null content with tool_calls, and a list of content parts.
  const auto msgs = nlohmann::json::parse(R"([
    {"role": "user", "content": [{"type": "text", "text": "Weather in "}, {"type": "text", "text": "Paris?"}]},
    {"role": "assistant", "content": null,
     "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
    {"role": "tool", "content": "18C", "tool_call_id": "c1"}
  ])");
  auto t = ChatTemplate::Parse(
      "{%- for m in messages %}"
      "{%- if m.content is string %}{{ m.role }}: {{ m.content }}"
      "{%- elif m.content is none %}{{ m.role }} calls"
      "{%- for c in m.tool_calls %} {{ c.function.name }}({{ c.function.arguments | tojson }})"
      "{%- endfor %}"
      "{%- else %}{{ m.role }}: {% for p in m.content %}{{ p.text }}{% endfor %}"
      "{%- endif %}{{ '\\n' }}"
      "{%- endfor %}");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  auto r = t->RenderJson(msgs, Opts(false, "", ""));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r.value(),
            "user: Weather in Paris?\nassistant calls get_weather({\"city\": \"Paris\"})\n"
            "tool: 18C\n");
  // ChatMessage.extra reaches the template too and may override content.
  std::vector<ChatMessage> cm = {{"tool", "ignored", {{"content", nullptr}, {"name", "fn"}}}};
  auto t2 = ChatTemplate::Parse("{{ messages[0].name }}|{{ messages[0].content is none }}");
  ASSERT_TRUE(t2.ok());
  auto r2 = t2->Render(cm, Opts(false, "", ""));
  ASSERT_TRUE(r2.ok()) << r2.status().ToString();
  EXPECT_EQ(r2.value(), "fn|True");
}

// ============================================================ errors

void ExpectParseError(const std::string& src, const std::string& needle) {
  auto t = ChatTemplate::Parse(src);
  ASSERT_FALSE(t.ok()) << "parsed: " << src;
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument) << t.status().ToString();
  EXPECT_NE(t.status().message().find(needle), std::string::npos)
      << "'" << needle << "' not in: " << t.status().message();
}

TEST(ChatTemplateErrors, SyntaxErrorsCarryPositions) {
  ExpectParseError("ab\n{{ x", "line 2, column 1: unclosed '{{'");
  ExpectParseError("{% if x", "unclosed '{%'");
  ExpectParseError("{# never closed", "unclosed comment");
  ExpectParseError("{{ 'abc }}", "unterminated string");
  ExpectParseError("x\n  {% if true %}yes",
                   "line 2, column 6: unclosed block: missing {% endif %}");
  ExpectParseError("{% for x in y %}", "missing {% endfor %}");
  ExpectParseError("{% endif %}", "unexpected {% endif %}");
  ExpectParseError("{{ 1 + }}", "unexpected '}}'");
  ExpectParseError("{{ a b }}", "expected '}}'");
  ExpectParseError("{{ x | frobnicate }}", "line 1, column 8: no filter named 'frobnicate'");
  ExpectParseError("{{ x is shiny }}", "no test named 'shiny'");
  // Outside an `if`, a loop body is a hard frame again (Jinja's compiler).
  ExpectParseError("{% if x %}{% for y in x %}{{ y | nope }}{% endfor %}{% endif %}",
                   "no filter named 'nope'");
  ExpectParseError("{% do x %}", "unsupported tag 'do'");
  ExpectParseError("{% break %}", "'break' outside of a for loop");
  ExpectParseError("{{ $ }}", "unexpected character '$'");
  ExpectParseError("{% raw %}never ended", "missing {% endraw %}");
  ExpectParseError("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}",
                   "nests too deeply");
  ExpectParseError("{{ " + std::string(5000, '[') + std::string(5000, ']') + " }}",
                   "nests too deeply");
  ExpectParseError("{{ " + std::string(5000, '[') + " }}", "unclosed '{{'");
}

// Widths and counts near 2^63 in the padding methods hit the output limit instead of wrapping
// around or allocating.
TEST(ChatTemplateErrors, HugeWidthsHitTheLimit) {
  ChatRenderOptions o = Opts(true, "", "");
  for (const char* src :
       {"{{ 'x'.center(9223372036854775807) }}", "{{ 'x'.ljust(9223372036854775000, '.') }}",
        "{{ 'x' | center(9223372036854775807) }}", "{{ 'a\tb'.expandtabs(9223372036854775807) }}",
        "{{ '7'.zfill(9223372036854775807) }}", "{{ '{:>99999999}'.format(1) }}",
        "{{ '%99999999d' % 1 }}", "{{ '%.999999999f' % 1.5 }}", "{{ '{:.999999999f}'.format(2) }}",
        "{{ 'x' | indent(9223372036854775807) }}"}) {
    Status s = RenderStatus(src, o);
    EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << src << ": " << s.ToString();
  }
}

// Jinja 3: an unknown filter or test inside an `if` or a conditional expression is an error
// only when that code runs.
TEST(ChatTemplateErrors, UnknownFilterInUntakenBranchIsLazy) {
  ChatRenderOptions o = Opts(true, "", "");
  auto t = ChatTemplate::Parse(
      "{% if false %}{{ x | from_json }}{% elif false and y is shiny %}b{% endif %}"
      "{{ 'a' if true else z | from_json }}");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  auto r = t->Render(std::vector<ChatMessage>{}, o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, "a");
  Status s = RenderStatus("x\n{% if true %}{{ 1 | from_json }}{% endif %}", o);
  EXPECT_NE(s.message().find("line 2, column 21: No filter named 'from_json' found."),
            std::string::npos)
      << s.message();
}

TEST(ChatTemplateFeatures, StrftimeNowUsesTheRenderClock) {
  ChatRenderOptions o = Opts(true, "", "");
  o.now_unix_seconds = 86400 * 365;  // 1971-01-01 in UTC
  setenv("TZ", "UTC", 1);
  auto t = ChatTemplate::Parse("{{ strftime_now('%Y-%m-%d %d %B %Y') }}");
  ASSERT_TRUE(t.ok());
  auto r = t->Render(std::vector<ChatMessage>{}, o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, "1971-01-01 01 January 1971");
}

TEST(ChatTemplateErrors, RaiseException) {
  ChatRenderOptions o = Opts(true, "", "");
  Status s = RenderStatus("before{{ raise_exception('System role not supported') }}", o);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "System role not supported");
  // From inside a macro and a loop, with a computed message.
  s = RenderStatus(
      "{% macro check(m) %}{% if m.role == 'assistant' %}"
      "{{ raise_exception('bad role: ' ~ m.role) }}{% endif %}{% endmacro %}"
      "{% for m in messages %}{{ check(m) }}{% endfor %}",
      o);
  EXPECT_EQ(s.message(), "bad role: assistant");
}

TEST(ChatTemplateErrors, RuntimeErrors) {
  ChatRenderOptions o = Opts(true, "", "");
  Status s = RenderStatus("{{ foo.bar }}", o);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("line 1, column 7: 'foo' is undefined"), std::string::npos)
      << s.message();
  s = RenderStatus("\n{{ 'a' + 1 }}", o);
  EXPECT_NE(s.message().find("line 2"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("'str' and 'int'"), std::string::npos) << s.message();
  EXPECT_FALSE(RenderStatus("{{ messages.append(1) }}", o).ok());
  EXPECT_FALSE(RenderStatus("{{ 1 // 0 }}", o).ok());
  s = RenderStatus("{% include 'other.jinja' %}", o);
  EXPECT_NE(s.message().find("no loader"), std::string::npos) << s.message();
  EXPECT_FALSE(RenderStatus("{% for x in 3 %}{% endfor %}", o).ok());
  EXPECT_FALSE(RenderStatus("{% set ns = namespace() %}{% set ns.me = ns %}", o).ok());
  EXPECT_FALSE(RenderStatus("{% set x = 1 %}{% set x.y = 2 %}", o).ok());
  EXPECT_FALSE(RenderStatus("{% for a, b in [1, 2] %}{% endfor %}", o).ok());
  EXPECT_FALSE(RenderStatus("{{ {'a': 1} | tojson(indent='x') }}", o).ok());
  EXPECT_FALSE(RenderStatus("{{ nope | tojson }}", o).ok());
  EXPECT_FALSE(RenderStatus("{{ nope | int }}", o).ok());
  EXPECT_FALSE(RenderStatus("{{ 3[1:] }}", o).ok());
  EXPECT_FALSE(RenderStatus("{{ 9223372036854775807 + 1 }}", o).ok());
  // Bad options and context.
  ChatRenderOptions bad = o;
  bad.max_steps = 0;
  EXPECT_FALSE(RenderStatus("x", bad).ok());
  bad = o;
  bad.extra_context = nlohmann::json::array();
  EXPECT_FALSE(RenderStatus("x", bad).ok());
}

TEST(ChatTemplateErrors, RunawayLoopsAreCapped) {
  ChatRenderOptions o = Opts(true, "", "");
  o.max_steps = 200'000;
  Status s = RenderStatus(
      "{% for i in range(100000) %}{% for j in range(100000) %}"
      "{% endfor %}{% endfor %}",
      o);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
  EXPECT_NE(s.message().find("evaluation steps"), std::string::npos) << s.message();
  // A huge range fails on the allocation budget before allocating.
  s = RenderStatus("{% for i in range(9000000000000000000) %}{% endfor %}", o);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
}

TEST(ChatTemplateErrors, MemoryAndOutputAreCapped) {
  ChatRenderOptions o = Opts(true, "", "");
  o.max_output_bytes = 1 << 20;
  // Doubling a string 100 times.
  Status s = RenderStatus(
      "{% set ns = namespace(s='ab') %}{% for i in range(100) %}"
      "{% set ns.s = ns.s + ns.s %}{% endfor %}",
      o);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
  s = RenderStatus("{{ 'x' * 9000000000000 }}", o);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
  s = RenderStatus("{{ [1, 2] * 9000000000000 }}", o);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
  // Output larger than the cap.
  s = RenderStatus("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}", o);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
  // Many small allocations (a growing list copied each iteration) hit the byte budget.
  o.max_alloc_bytes = 1 << 20;
  s = RenderStatus(
      "{% set ns = namespace(l=[]) %}{% for i in range(100000) %}"
      "{% set ns.l = ns.l + [i] %}{% endfor %}",
      o);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
  // Nesting lists one level per iteration is stopped at the depth cap.
  s = RenderStatus(
      "{% set ns = namespace(x=[]) %}{% for i in range(1000) %}"
      "{% set ns.x = [ns.x] %}{% endfor %}",
      Opts(true, "", ""));
  EXPECT_FALSE(s.ok());
  // Shared sub-lists doubling in size: printing is bounded by the output cap.
  o = Opts(true, "", "");
  o.max_output_bytes = 1 << 20;
  s = RenderStatus(
      "{% set ns = namespace(x=[1]) %}{% for i in range(40) %}"
      "{% set ns.x = [ns.x, ns.x] %}{% endfor %}{{ ns.x }}",
      o);
  EXPECT_FALSE(s.ok());
  // ... and so is comparing them (step budget).
  s = RenderStatus(
      "{% set ns = namespace(x=[1], y=[1]) %}{% for i in range(40) %}"
      "{% set ns.x = [ns.x, ns.x] %}{% set ns.y = [ns.y, ns.y] %}{% endfor %}"
      "{{ ns.x == ns.y }}",
      o);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
}

TEST(ChatTemplateErrors, RecursionIsCapped) {
  Status s =
      RenderStatus("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", Opts(true, "", ""));
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
  // Deep JSON input is rejected rather than recursed into.
  nlohmann::json deep = "x";
  for (int i = 0; i < 1000; ++i) deep = nlohmann::json::array({deep});
  ChatRenderOptions o = Opts(true, "", "");
  o.extra_context = {{"deep", deep}};
  EXPECT_FALSE(RenderStatus("{{ deep }}", o).ok());
}

// Mutated real templates must parse and render to a value or an error — never crash, hang
// or throw. (Deterministic seed; the assertion is that the loop completes.)
TEST(ChatTemplateErrors, MutatedTemplatesNeverCrash) {
  const std::vector<std::string> seeds = {
      FromJsonString(kLlama2ChatJson), FromJsonString(kLlama3InstructJson),
      FromJsonString(kMistralV02Json), FromJsonString(kQwen2InstructJson),
      FromJsonString(kZephyrJson)};
  const std::string alphabet = "{}%#-+()[]'\".|,:=~*/ \nabx0";
  std::mt19937 rng(1234);
  ChatRenderOptions o = Opts(true, "<s>", "</s>");
  o.max_steps = 100'000;
  int parsed = 0, rendered = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::string s = seeds[static_cast<size_t>(iter) % seeds.size()];
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits && !s.empty(); ++e) {
      const size_t pos = rng() % s.size();
      switch (rng() % 3) {
        case 0:
          s.erase(pos, 1 + rng() % 3);
          break;
        case 1:
          s.insert(pos, 1, alphabet[rng() % alphabet.size()]);
          break;
        default:
          s[pos] = alphabet[rng() % alphabet.size()];
          break;
      }
    }
    auto t = ChatTemplate::Parse(s);
    if (!t.ok()) continue;
    ++parsed;
    if (t->Render(WithSystem(), o).ok()) ++rendered;
  }
  EXPECT_GT(parsed, 0);
  EXPECT_GT(rendered, 0);
}

// The fuzz target's body (fuzz/fuzz_chat_template.cc) on the differential-test corpus and
// 2000 seeded mutations of it (byte flips, deletions, duplications, splices of template syntax):
// every input parses or fails cleanly and renders or fails with a clean Status.
TEST(ChatTemplateFuzz, CorpusAndMutationsThroughTheFuzzEntry) {
  std::vector<std::string> seeds;
  for (const auto& e : std::filesystem::directory_iterator(std::string(CHORUS_SOURCE_DIR) +
                                                           "/tests/chat_templates/corpus")) {
    std::ifstream f(e.path(), std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    seeds.push_back(ss.str());
  }
  std::sort(seeds.begin(), seeds.end());
  ASSERT_GE(seeds.size(), 15u);
  int parsed = 0;
  for (const auto& s : seeds) {
    parsed += FuzzChatTemplateInput(reinterpret_cast<const uint8_t*>(s.data()), s.size());
  }
  EXPECT_EQ(parsed, static_cast<int>(seeds.size()));
  static constexpr std::string_view kSnippets[] = {
      "{%",          "%}",      "{{",        "}}", "{#", "#}",   "-",    "|",      "(",
      ")",           "[",       "]",         "'",  "\"", "loop", " if ", " else ", "{% endfor %}",
      "{% endif %}", "|tojson", "|batch(2)", "*",  "%"};
  std::mt19937 rng(7);
  for (int i = 0; i < 2000; ++i) {
    std::string s = seeds[rng() % seeds.size()];
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < edits && !s.empty(); ++k) {
      const size_t pos = rng() % s.size();
      switch (rng() % 4) {
        case 0:
          s[pos] = static_cast<char>(rng() % 256);
          break;
        case 1:
          s.erase(pos, 1 + rng() % 16);
          break;
        case 2:
          s.insert(pos, kSnippets[rng() % std::size(kSnippets)]);
          break;
        default:
          s.insert(pos, s.substr(rng() % s.size(), 1 + rng() % 32));
      }
    }
    FuzzChatTemplateInput(reinterpret_cast<const uint8_t*>(s.data()), s.size());
  }
}

}  // namespace
}  // namespace chorus::tokenizer
