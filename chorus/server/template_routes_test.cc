// test-labels: unit
// Chat templates in the server: the startup choice (no silent fallback), what a chat request's
// fields become inside the template, and the /tokenize, /detokenize and /apply-template
// routes, on a small real tokenizer.json (fuzz_entry.h's fixture).
#include "chorus/server/template_routes.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "chorus/tokenizer/fuzz_entry.h"
#include "tests/testutil/testutil.h"

namespace chorus::server {
namespace {

using json = nlohmann::json;

class TemplateRoutesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto t = tokenizer::TokenizerFromJsonString(tokenizer::SmallSpmTokenizerJson(),
                                                R"({"bos_token": "<s>", "eos_token": "</s>"})");
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    tok_ = std::move(*t);
    Use("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}");
  }
  void Use(const std::string& source) {
    auto t = tokenizer::ChatTemplate::Parse(source);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    template_ = std::move(*t);
    ctx_.tok = tok_.get();
    ctx_.chat_template = &template_;
    ctx_.vocab_size = tok_->vocab_size();
    ctx_.max_context = 4096;
  }
  std::string Render(const std::string& body) {
    std::string prompt;
    auto e = RenderChatPrompt(body, ctx_, &prompt);
    if (e)
      return "<error " + std::to_string(e->http_status) + " " + e->param + ": " + e->message + ">";
    return prompt;
  }

  std::unique_ptr<tokenizer::Tokenizer> tok_;
  tokenizer::ChatTemplate template_ = tokenizer::DefaultChatTemplate();
  ApiContext ctx_;
};

TEST_F(TemplateRoutesTest, ChoiceRefusesATemplateThatDoesNotCompile) {
  tok_->set_chat_template(
      "{{ bos_token }}\n{% for m in messages %}{{ m | dictsortt }}{% endfor %}");
  auto c = ChooseChatTemplate(*tok_, "", "");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  const std::string& m = c.status().message();
  EXPECT_NE(m.find("line 2, column 31"), std::string::npos) << m;
  EXPECT_NE(m.find("no filter named 'dictsortt'"), std::string::npos) << m;
  EXPECT_NE(m.find("--chat-template"), std::string::npos) << m;

  // --chat-template replaces it; a broken override is named as such.
  auto o = ChooseChatTemplate(*tok_, "{{ messages[0].content }}", "t.jinja");
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->note, "--chat-template t.jinja");
  EXPECT_FALSE(o->is_fallback);
  auto bad = ChooseChatTemplate(*tok_, "{% if %}", "(inline)");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("--chat-template (inline) does not compile: "),
            std::string::npos)
      << bad.status().message();

  // A filter Jinja only looks up when the branch runs does not stop startup.
  tok_->set_chat_template("{% if false %}{{ x | from_json }}{% endif %}ok");
  EXPECT_TRUE(ChooseChatTemplate(*tok_, "", "").ok());
}

TEST_F(TemplateRoutesTest, ChatMlOnlyForAModelWithoutTemplate) {
  tok_->set_chat_template("  \n");
  auto c = ChooseChatTemplate(*tok_, "", "");
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->is_fallback);
  EXPECT_NE(c->note.find("ChatML"), std::string::npos);
  EXPECT_EQ(c->tmpl.source(), tokenizer::DefaultChatTemplateSource());
}

TEST_F(TemplateRoutesTest, RequestFieldsReachTheTemplate) {
  Use("{{ tools | tojson }}|{{ documents }}|{{ tools is none }}|{{ flavor | default('-') }}|"
      "{{ bos_token }}{{ eos_token }}|{{ add_generation_prompt }}|"
      "{% for m in messages %}{{ m.role }}:{{ m.content }}:{{ m.tool_call_id | default('') }}"
      "{% for c in m.tool_calls or [] %}{{ c.function.arguments.city }}{% endfor %};{% endfor %}");
  EXPECT_EQ(Render(R"({"messages":[{"role":"user","content":"hi"}]})"),
            "null|None|True|-|<s></s>|True|user:hi:;");
  EXPECT_EQ(
      Render(
          R"({"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},)"
          R"({"role":"assistant","content":null,"tool_calls":[{"id":"1","type":"function",)"
          R"("function":{"name":"w","arguments":"{\"city\": \"Oslo\"}"}}]},)"
          R"({"role":"tool","tool_call_id":"1","content":"5"}],)"
          R"("tools":[{"type":"function","function":{"name":"w","parameters":{"z":1,"a":2}}}],)"
          R"("documents":[{"text":"d"}],"add_generation_prompt":false,)"
          R"("chat_template_kwargs":{"flavor":"mint"}})"),
      R"([{"type": "function", "function": {"name": "w", "parameters": {"z": 1, "a": 2}}}])"
      "|[{'text': 'd'}]|False|mint|<s></s>|False|user:a\nb:;assistant:None:Oslo;tool:5:1;");
}

TEST_F(TemplateRoutesTest, BadRequestsNameTheField) {
  EXPECT_EQ(Render(R"({"messages":[]})"), "<error 400 messages: messages must not be empty>");
  EXPECT_EQ(Render(R"({"messages":[{"role":"user","content":"x"}],"tools":{}})"),
            "<error 400 tools: tools must be a list>");
  EXPECT_EQ(Render(R"({"messages":[{"role":"user","content":"x"}],"chat_template_kwargs":[]})"),
            "<error 400 chat_template_kwargs: chat_template_kwargs must be an object>");
  EXPECT_EQ(
      Render(
          R"({"messages":[{"role":"user","content":"x"}],"chat_template_kwargs":{"messages":1}})"),
      "<error 400 chat_template_kwargs: chat_template_kwargs may not set 'messages'>");
  EXPECT_EQ(Render(R"({"messages":[{"role":"assistant","tool_calls":[{"function":{"name":"f",)"
                   R"("arguments":"{not json"}}]}]})"),
            "<error 400 messages: tool_calls[].function.arguments is not valid JSON>");
  // Per-request template: validated on arrival, naming line and column.
  EXPECT_EQ(
      Render(R"({"messages":[{"role":"user","content":"x"}],"chat_template":"a\n{{ 1 | nah }}"})"),
      "<error 400 chat_template: chat_template does not compile: chat template syntax error "
      "at line 2, column 8: no filter named 'nah'>");
  EXPECT_EQ(
      Render(
          R"({"messages":[{"role":"user","content":"x"}],"chat_template":"[{{ messages[0].content }}]"})"),
      "[x]");
  // A render error is a 400 naming the template line; raise_exception's text is passed on.
  Use("line one\n{{ messages[0].content + 1 }}");
  const std::string r = Render(R"({"messages":[{"role":"user","content":"x"}]})");
  EXPECT_NE(r.find("<error 400 messages: chat template: chat template error at line 2, column"),
            std::string::npos)
      << r;
  Use("{{ raise_exception('roles must alternate') }}");
  EXPECT_EQ(Render(R"({"messages":[{"role":"user","content":"x"}]})"),
            "<error 400 messages: chat template: roles must alternate>");
  ctx_.chat_template = nullptr;
  EXPECT_NE(Render(R"({"messages":[{"role":"user","content":"x"}]})").find("--chat-template"),
            std::string::npos);
}

TEST_F(TemplateRoutesTest, TokenizeDetokenizeApplyTemplate) {
  RouteReply r = ApplyTemplateRoute(R"({"messages":[{"role":"user","content":"hello"}]})", ctx_);
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, R"({"prompt":"<user>hello<assistant>"})");

  r = TokenizeRoute(R"({"prompt":"hello world"})", ctx_);
  ASSERT_EQ(r.status, 200) << r.body;
  json j = json::parse(r.body);
  const std::vector<int32_t> want =
      tok_->Encode("hello world", tokenizer::EncodeOptions{.add_bos = true, .add_eos = true});
  EXPECT_EQ(j["tokens"].get<std::vector<int32_t>>(), want);
  EXPECT_EQ(j["count"], want.size());
  EXPECT_EQ(j["max_model_len"], 4096);
  EXPECT_TRUE(j["token_strs"].is_null());
  EXPECT_EQ(r.body.find("{\"count\""), 0u) << "vLLM's field order";

  r = TokenizeRoute(R"({"prompt":"hello","add_special_tokens":false,"return_token_strs":true})",
                    ctx_);
  j = json::parse(r.body);
  ASSERT_EQ(j["tokens"].size(), j["token_strs"].size());
  EXPECT_EQ(j["token_strs"][0], "\u2581hello");

  // Messages: exactly the ids /v1/chat/completions feeds the model.
  r = TokenizeRoute(R"({"messages":[{"role":"user","content":"hello"}]})", ctx_);
  j = json::parse(r.body);
  EXPECT_EQ(j["tokens"].get<std::vector<int32_t>>(),
            EncodeChatPrompt(*tok_, "<user>hello<assistant>"));

  r = DetokenizeRoute(json({{"tokens", j["tokens"]}}).dump(), ctx_);
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(json::parse(r.body)["prompt"],
            tok_->Decode(j["tokens"].get<std::vector<int32_t>>(), true));

  EXPECT_EQ(TokenizeRoute(R"({"prompt":"x","messages":[]})", ctx_).status, 400);
  EXPECT_EQ(TokenizeRoute(R"({})", ctx_).status, 400);
  EXPECT_EQ(TokenizeRoute(R"({"prompt":5})", ctx_).status, 400);
  EXPECT_EQ(TokenizeRoute("not json", ctx_).status, 400);
  EXPECT_EQ(DetokenizeRoute(R"({"tokens":[1,-1]})", ctx_).status, 400);
  EXPECT_EQ(DetokenizeRoute(R"({"tokens":[100000]})", ctx_).status, 400);
  EXPECT_EQ(DetokenizeRoute(R"({"tokens":"1"})", ctx_).status, 400);
  EXPECT_EQ(ApplyTemplateRoute(R"({"messages":"hi"})", ctx_).status, 400);

  EXPECT_STREQ(TemplateRoutePath("/tokenize"), "/tokenize");
  EXPECT_EQ(TemplateRoutePath("/tokenizer"), nullptr);
}

}  // namespace
}  // namespace chorus::server
