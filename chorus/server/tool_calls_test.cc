// test-labels: unit
// Function calling: request validation, syntax detection, the generic form, each parser on
// canned replies in its family's syntax (malformed ones stay content), the streaming splitter
// (every split of a reply gives the whole-reply result) and the OpenAI response shapes.
#include "chorus/server/tool_calls.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>

#include "chorus/server/openai.h"

namespace chorus::server {
namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

std::optional<ApiError> ParseTools(const std::string& body, ToolsRequest* out) {
  return ParseToolsRequest(ojson::parse(body), out);
}

constexpr const char* kWeather =
    R"({"type":"function","function":{"name":"get_weather","description":"Weather of a city",)"
    R"("parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}})";
constexpr const char* kTime =
    R"({"type":"function","function":{"name":"get_time","parameters":{"type":"object"}}})";

ToolsRequest WeatherAndTime() {
  ToolsRequest r;
  EXPECT_FALSE(ParseTools(std::string(R"({"tools":[)") + kWeather + "," + kTime + "]}", &r));
  return r;
}

void ExpectBad(const std::string& body, const std::string& param) {
  ToolsRequest r;
  auto e = ParseTools(body, &r);
  ASSERT_TRUE(e.has_value()) << body;
  EXPECT_EQ(e->http_status, 400);
  EXPECT_EQ(e->param, param) << body << " -> " << e->message;
}

TEST(ToolsRequestTest, ValidRequests) {
  ToolsRequest r;
  ASSERT_FALSE(ParseTools("{}", &r));
  EXPECT_FALSE(r.active());
  ASSERT_FALSE(ParseTools(std::string(R"({"tools":[)") + kWeather + "]}", &r));
  EXPECT_EQ(r.choice, ToolChoice::kAuto);  // OpenAI's default with tools
  ASSERT_EQ(r.tools.size(), 1u);
  EXPECT_EQ(r.tools[0].name, "get_weather");
  EXPECT_EQ(r.tools[0].parameters["required"][0], "city");
  EXPECT_TRUE(r.parallel);
  ASSERT_FALSE(
      ParseTools(std::string(R"({"tools":[)") + kWeather + "," + kTime +
                     R"(],"tool_choice":{"type":"function","function":{"name":"get_time"}},)"
                     R"("parallel_tool_calls":false})",
                 &r));
  EXPECT_EQ(r.choice, ToolChoice::kNamed);
  EXPECT_EQ(r.named, "get_time");
  EXPECT_FALSE(r.parallel);
  EXPECT_TRUE(r.tools[1].parameters.is_object());
  ASSERT_FALSE(
      ParseTools(std::string(R"({"tools":[)") + kWeather + R"(],"tool_choice":"none"})", &r));
  EXPECT_FALSE(r.active());
  ASSERT_FALSE(ParseTools(R"({"tools":[],"tool_choice":"none"})", &r));
  ASSERT_FALSE(ParseTools(
      R"({"tools":[{"type":"function","function":{"name":"noargs"}}],"tool_choice":"required"})",
      &r));
  EXPECT_EQ(r.choice, ToolChoice::kRequired);
  EXPECT_EQ(r.tools[0].parameters, ojson::object());
}

TEST(ToolsRequestTest, BadRequestsNameTheField) {
  ExpectBad(R"({"tools":{}})", "tools");
  ExpectBad(R"({"tools":[5]})", "tools[0]");
  ExpectBad(R"({"tools":[{"function":{"name":"f"}}]})", "tools[0].type");
  ExpectBad(R"({"tools":[{"type":"retrieval","function":{"name":"f"}}]})", "tools[0].type");
  ExpectBad(R"({"tools":[{"type":"function"}]})", "tools[0].function");
  ExpectBad(R"({"tools":[{"type":"function","function":{"description":"no name"}}]})",
            "tools[0].function.name");
  ExpectBad(R"({"tools":[{"type":"function","function":{"name":""}}]})", "tools[0].function.name");
  ExpectBad(R"({"tools":[{"type":"function","function":{"name":"a b"}}]})",
            "tools[0].function.name");
  ExpectBad(std::string(R"({"tools":[{"type":"function","function":{"name":")") +
                std::string(65, 'x') + R"("}}]})",
            "tools[0].function.name");
  ExpectBad(std::string(R"({"tools":[)") + kTime + "," + kTime + "]}", "tools[1].function.name");
  ExpectBad(R"({"tools":[{"type":"function","function":{"name":"f","parameters":"x"}}]})",
            "tools[0].function.parameters");
  ExpectBad(R"({"tools":[{"type":"function","function":{"name":"f","parameters":[]}}]})",
            "tools[0].function.parameters");
  ExpectBad(R"({"tools":[{"type":"function","function":{"name":"f","description":1}}]})",
            "tools[0].function.description");
  ExpectBad(R"({"tools":[{"type":"function","function":{"name":"f","strict":"yes"}}]})",
            "tools[0].function.strict");
  const std::string one = std::string(R"({"tools":[)") + kWeather + "]";
  ExpectBad(one + R"(,"tool_choice":"always"})", "tool_choice");
  ExpectBad(one + R"(,"tool_choice":5})", "tool_choice");
  ExpectBad(one + R"(,"tool_choice":{"type":"function"}})", "tool_choice.function.name");
  ExpectBad(one + R"(,"tool_choice":{"type":"x","function":{"name":"get_weather"}}})",
            "tool_choice.type");
  ExpectBad(one + R"(,"tool_choice":{"type":"function","function":{"name":"nope"}}})",
            "tool_choice.function.name");
  ExpectBad(R"({"tool_choice":"required"})", "tool_choice");
  ExpectBad(R"({"tools":[],"tool_choice":"auto"})", "tool_choice");
  ExpectBad(R"({"tool_choice":{"type":"function","function":{"name":"f"}}})", "tool_choice");
  ExpectBad(one + R"(,"parallel_tool_calls":"no"})", "parallel_tool_calls");
  std::string many = R"({"tools":[)";
  for (int i = 0; i <= kMaxTools; ++i)
    many += (i ? "," : "") + std::string(R"({"type":"function","function":{"name":"f)") +
            std::to_string(i) + R"("}})";
  ExpectBad(many + "]}", "tools");
}

TEST(ToolsRequestTest, ToolMessages) {
  auto check = [](const std::string& messages) {
    return ValidateToolMessages(ojson::parse(messages));
  };
  EXPECT_FALSE(
      check(R"([{"role":"user","content":"weather?"},)"
            R"({"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function",)"
            R"("function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},)"
            R"({"role":"tool","tool_call_id":"call_1","content":"sunny"}])"));
  auto bad = [&](const std::string& messages, const std::string& param) {
    auto e = check(messages);
    ASSERT_TRUE(e.has_value()) << messages;
    EXPECT_EQ(e->param, param) << e->message;
  };
  bad(R"([{"role":"tool","content":"x"}])", "messages[0].tool_call_id");
  bad(R"([{"role":"tool","tool_call_id":7,"content":"x"}])", "messages[0].tool_call_id");
  bad(R"([{"role":"tool","tool_call_id":"c"}])", "messages[0].content");
  bad(R"([{"role":"user","content":"x"},{"role":"user","tool_calls":[]}])",
      "messages[1].tool_calls");
  bad(R"([{"role":"assistant","tool_calls":{}}])", "messages[0].tool_calls");
  bad(R"([{"role":"assistant","tool_calls":[{"id":"c","function":{"arguments":"{}"}}]}])",
      "messages[0].tool_calls[0].function.name");
  bad(R"([{"role":"assistant","tool_calls":[{"id":"c","function":{"name":"f"}}]}])",
      "messages[0].tool_calls[0].function.arguments");
  bad(R"([{"role":"assistant","tool_calls":[{"id":"c","type":"x","function":{"name":"f","arguments":"{}"}}]}])",
      "messages[0].tool_calls[0].type");
}

// Template fragments in each family's style (enough for detection).
TEST(ToolSyntaxTest, DetectedFromTheTemplate) {
  EXPECT_EQ(DetectToolSyntax(
                "{%- if tools %}<|im_start|>system\n# Tools\n<tools>{% for t in tools %}{{ t | "
                "tojson }}{% endfor %}</tools>\nreturn <tool_call>\n{\"name\": ...}\n</tool_call>"
                "{% endif %}{% for m in messages %}{{ m.content }}{% endfor %}"),
            ToolSyntax::kHermes);
  EXPECT_EQ(DetectToolSyntax("{% if tools is not none %}Respond in the format {\"name\": function "
                             "name, \"parameters\": dictionary of argument name and its value}"
                             "{% endif %}{% if m.tool_calls %}<|python_tag|>{% endif %}"),
            ToolSyntax::kLlama3Json);
  EXPECT_EQ(DetectToolSyntax("{%- if tools is not none %}[AVAILABLE_TOOLS]{{ tools|tojson }}"
                             "[/AVAILABLE_TOOLS]{% endif %}{% for m in messages %}"
                             "{% if m.tool_calls %}[TOOL_CALLS]{% endif %}{% endfor %}"),
            ToolSyntax::kMistral);
  EXPECT_EQ(DetectToolSyntax(tokenizer::DefaultChatTemplateSource()), ToolSyntax::kGeneric);
  // Uses tools but prints no known marker: hermes, the common syntax.
  EXPECT_EQ(DetectToolSyntax("{{ tools | tojson }}"), ToolSyntax::kHermes);
  // The word outside tags or in a string literal is not the variable.
  EXPECT_FALSE(TemplateUsesTools("tools: {{ messages[0].content }} {{ 'tools' }}"));
  EXPECT_FALSE(TemplateUsesTools("{{ custom_tools_x }}{{ m.tools2 }}"));
  EXPECT_TRUE(TemplateUsesTools("{%- if tools is defined and tools %}x{% endif %}"));
  EXPECT_EQ(ToolSyntaxFromName("llama3_json"), ToolSyntax::kLlama3Json);
  EXPECT_FALSE(ToolSyntaxFromName("auto").has_value());
}

TEST(ToolSyntaxTest, GenericFormRewritesTheConversation) {
  ToolsRequest req = WeatherAndTime();
  req.choice = ToolChoice::kRequired;
  const ojson tools = ojson::parse(std::string("[") + kWeather + "," + kTime + "]");
  ojson msgs = ojson::parse(
      R"([{"role":"system","content":"Be brief."},{"role":"user","content":"Paris and Rome?"},)"
      R"({"role":"assistant","content":null,"tool_calls":[)"
      R"({"id":"a","type":"function","function":{"name":"get_weather","arguments":{"city":"Paris"}}},)"
      R"({"id":"b","type":"function","function":{"name":"get_weather","arguments":{"city":"Rome"}}}]},)"
      R"({"role":"tool","tool_call_id":"a","content":"sunny"},)"
      R"({"role":"tool","tool_call_id":"b","content":"rain"}])");
  ApplyGenericToolForm(tools, req, &msgs);
  ASSERT_EQ(msgs.size(), 4u);
  const std::string sys = msgs[0]["content"];
  EXPECT_TRUE(sys.starts_with("Be brief.\n\n# Tools")) << sys;
  EXPECT_NE(sys.find(R"({"type":"function","function":{"name":"get_weather")"), std::string::npos);
  EXPECT_NE(sys.find("You must call a function."), std::string::npos);
  EXPECT_EQ(msgs[2]["role"], "assistant");
  EXPECT_FALSE(msgs[2].contains("tool_calls"));
  EXPECT_EQ(
      msgs[2]["content"],
      "<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"}}\n</tool_call>\n"
      "<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Rome\"}}\n</tool_call>");
  EXPECT_EQ(msgs[3]["role"], "user");
  EXPECT_EQ(msgs[3]["content"],
            "<tool_response>\nsunny\n</tool_response>\n<tool_response>\nrain\n</tool_response>");
  // The form is what the generic parser reads back.
  auto back = ParseToolCalls(ToolSyntax::kGeneric, req, msgs[2]["content"].get<std::string>());
  ASSERT_EQ(back.calls.size(), 2u);
  EXPECT_EQ(back.calls[1].arguments, R"({"city":"Rome"})");
  // No system message of its own: one is added first; tool_choice none adds none.
  ojson plain = ojson::parse(R"([{"role":"user","content":"hi"}])");
  ApplyGenericToolForm(tools, req, &plain);
  ASSERT_EQ(plain.size(), 2u);
  EXPECT_EQ(plain[0]["role"], "system");
  req.choice = ToolChoice::kNone;
  plain = ojson::parse(R"([{"role":"user","content":"hi"}])");
  ApplyGenericToolForm(tools, req, &plain);
  EXPECT_EQ(plain.size(), 1u);
}

struct Canned {
  ToolSyntax syntax;
  std::string text;
  std::string content;                                     // expected content
  std::vector<std::pair<std::string, std::string>> calls;  // name, arguments
};

std::vector<Canned> CannedReplies() {
  using S = ToolSyntax;
  return {
      // Hermes / Qwen.
      {S::kHermes,
       "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
       "\"Paris\"}}\n</tool_call>",
       "",
       {{"get_weather", R"({"city":"Paris"})"}}},
      {S::kHermes,
       "Let me look that up.\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
       "\"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": "
       "{}}\n</tool_call>",
       "Let me look that up.",
       {{"get_weather", R"({"city":"Paris"})"}, {"get_time", "{}"}}},
      {S::kHermes,  // a string inside the arguments holds the closing tag's characters
       "<tool_call>{\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"<tool>\\\"}\"}"
       "</tool_call>",
       "",
       {{"get_weather", R"({"city":"<tool>"})"}}},
      {S::kHermes,  // the closing tag inside a string of the arguments is not the end
       "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"</tool_call>\\\"\"}}"
       "</tool_call>",
       "",
       {{"get_weather", R"({"city":"</tool_call>\""})"}}},
      {S::kHermes,  // unclosed at the end of the reply, but a whole call
       "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"UTC\"}}",
       "",
       {{"get_time", R"({"tz":"UTC"})"}}},
      {S::kHermes, "No tools needed: 4.", "No tools needed: 4.", {}},
      {S::kHermes,  // malformed JSON: content
       "Hi <tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": }</tool_call> bye",
       "Hi <tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": }</tool_call> bye",
       {}},
      {S::kHermes,  // a function the request did not offer: content
       "<tool_call>{\"name\": \"rm_rf\", \"arguments\": {}}</tool_call>",
       "<tool_call>{\"name\": \"rm_rf\", \"arguments\": {}}</tool_call>",
       {}},
      {S::kHermes,  // arguments not an object: content
       "<tool_call>{\"name\": \"get_time\", \"arguments\": [1]}</tool_call>",
       "<tool_call>{\"name\": \"get_time\", \"arguments\": [1]}</tool_call>",
       {}},
      {S::kHermes, "a <tool_call> that never closes", "a <tool_call> that never closes", {}},
      {S::kHermes, "ends with a prefix <tool_c", "ends with a prefix <tool_c", {}},
      {S::kGeneric,
       "Checking.<tool_call>{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Oslo\"}}</"
       "tool_call>"
       "  Done.",
       "Checking.Done.",
       {{"get_weather", R"({"city":"Oslo"})"}}},
      // Llama 3.x JSON.
      {S::kLlama3Json,
       "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
       "",
       {{"get_weather", R"({"city":"Paris"})"}}},
      {S::kLlama3Json,
       "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}; "
       "{\"name\": \"get_time\", \"arguments\": {}}",
       "",
       {{"get_weather", R"({"city":"Paris"})"}, {"get_time", "{}"}}},
      {S::kLlama3Json, "  The weather is {unknown}.", "  The weather is {unknown}.", {}},
      {S::kLlama3Json, "{\"answer\": 42}", "{\"answer\": 42}", {}},
      {S::kLlama3Json,
       "{\"name\": \"get_weather\", \"parameters\": {\"city\": ",
       "{\"name\": \"get_weather\", \"parameters\": {\"city\": ",
       {}},
      {S::kLlama3Json,  // JSON later in the reply is not a call in this syntax
       "Sure: {\"name\": \"get_time\", \"parameters\": {}}",
       "Sure: {\"name\": \"get_time\", \"parameters\": {}}",
       {}},
      {S::kLlama3Json,
       "<|python_tag|>brave_search.call(query=\"x\")",
       "brave_search.call(query=\"x\")",
       {}},
      // Mistral.
      {S::kMistral,
       "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, {\"name\": "
       "\"get_time\", \"arguments\": {}}]",
       "",
       {{"get_weather", R"({"city":"Paris"})"}, {"get_time", "{}"}}},
      {S::kMistral,
       "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]get_time[ARGS]{}",
       "",
       {{"get_weather", R"({"city":"Paris"})"}, {"get_time", "{}"}}},
      {S::kMistral,
       "Sure.[TOOL_CALLS][{\"name\": \"get_time\", \"arguments\": {}}]",
       "Sure.",
       {{"get_time", "{}"}}},
      {S::kMistral,
       "[TOOL_CALLS][{\"name\": \"get_time\", \"arguments\": ",
       "[TOOL_CALLS][{\"name\": \"get_time\", \"arguments\": ",
       {}},
      {S::kMistral,
       "[TOOL_CALLS][{\"name\": \"nope\", \"arguments\": {}}]",
       "[TOOL_CALLS][{\"name\": \"nope\", \"arguments\": {}}]",
       {}},
      {S::kMistral, "Plain [TOOL] text.", "Plain [TOOL] text.", {}},
  };
}

TEST(ToolParserTest, MistralIdsAreNineAlphanumerics) {
  const ToolsRequest req = WeatherAndTime();
  auto o = ParseToolCalls(ToolSyntax::kMistral, req,
                          R"([TOOL_CALLS][{"name": "get_time", "arguments": {}}])");
  ASSERT_EQ(o.calls.size(), 1u);
  EXPECT_EQ(o.calls[0].id.size(), 9u);
  EXPECT_TRUE(std::all_of(o.calls[0].id.begin(), o.calls[0].id.end(),
                          [](char c) { return std::isalnum(static_cast<unsigned char>(c)); }));
  ojson msgs = ojson::parse(
      R"([{"role":"assistant","tool_calls":[{"id":"call_abcdefghijklmnop","type":"function",)"
      R"("function":{"name":"get_time","arguments":{}}}]},)"
      R"({"role":"tool","tool_call_id":"call_abcdefghijklmnop","content":"x"},)"
      R"({"role":"tool","tool_call_id":"short","content":"y"}])");
  ShortenMistralIds(&msgs);
  EXPECT_EQ(msgs[0]["tool_calls"][0]["id"], "hijklmnop");
  EXPECT_EQ(msgs[1]["tool_call_id"], "hijklmnop");
  EXPECT_EQ(msgs[2]["tool_call_id"], "short");
}

void ExpectResult(const Canned& c, const ToolParseOutput& o, const std::string& how) {
  EXPECT_EQ(o.content, c.content) << ToolSyntaxName(c.syntax) << " " << how << ": " << c.text;
  ASSERT_EQ(o.calls.size(), c.calls.size())
      << ToolSyntaxName(c.syntax) << " " << how << ": " << c.text;
  for (size_t i = 0; i < c.calls.size(); ++i) {
    EXPECT_EQ(o.calls[i].name, c.calls[i].first) << c.text;
    EXPECT_EQ(o.calls[i].arguments, c.calls[i].second) << c.text;
    if (c.syntax == ToolSyntax::kMistral) {
      EXPECT_EQ(o.calls[i].id.size(), 9u) << o.calls[i].id;
    } else {
      EXPECT_TRUE(o.calls[i].id.starts_with("call_")) << o.calls[i].id;
      EXPECT_EQ(o.calls[i].id.size(), 29u);
    }
  }
}

TEST(ToolParserTest, CannedRepliesOfEachFamily) {
  const ToolsRequest req = WeatherAndTime();
  for (const Canned& c : CannedReplies())
    ExpectResult(c, ParseToolCalls(c.syntax, req, c.text), "whole");
}

// Streaming: any split of the reply gives the whole-reply result.
TEST(ToolParserTest, StreamingSplitsAgreeWithWholeReplies) {
  const ToolsRequest req = WeatherAndTime();
  for (const Canned& c : CannedReplies()) {
    auto feed = [&](const std::vector<std::string_view>& pieces) {
      ToolCallParser p(c.syntax, &req);
      ToolParseOutput all;
      for (std::string_view piece : pieces) {
        ToolParseOutput o = p.Feed(piece);
        all.content += o.content;
        for (auto& call : o.calls) all.calls.push_back(call);
      }
      ToolParseOutput o = p.Finish();
      all.content += o.content;
      for (auto& call : o.calls) all.calls.push_back(call);
      EXPECT_EQ(p.calls(), static_cast<int>(all.calls.size()));
      return all;
    };
    const std::string_view t = c.text;
    std::vector<std::string_view> chars;
    for (size_t i = 0; i < t.size(); ++i) chars.push_back(t.substr(i, 1));
    ExpectResult(c, feed(chars), "char by char");
    for (size_t i = 0; i <= t.size(); ++i) {
      for (size_t j = i; j <= t.size(); j += 7) {
        ExpectResult(c, feed({t.substr(0, i), t.substr(i, j - i), t.substr(j)}),
                     "split at " + std::to_string(i) + "," + std::to_string(j));
      }
    }
  }
}

TEST(ToolParserTest, HoldsBackOnlyWhatMayStartACall) {
  const ToolsRequest req = WeatherAndTime();
  ToolCallParser p(ToolSyntax::kHermes, &req);
  EXPECT_EQ(p.Feed("Hello there").content, "Hello there");
  EXPECT_EQ(p.Feed(" <tool").content, "");  // the space and a marker prefix wait
  EXPECT_EQ(p.Feed("box>").content, " <toolbox>");
  ToolParseOutput o = p.Feed("<tool_call>{\"name\":\"get_time\",\"arguments\":{}}</tool_call>");
  EXPECT_EQ(o.content, "");
  ASSERT_EQ(o.calls.size(), 1u);  // a closed call is emitted at once, before the reply ends
  EXPECT_EQ(p.Finish().content, "");

  ToolCallParser m(ToolSyntax::kMistral, &req);
  EXPECT_EQ(m.Feed("ok [TOOL_").content, "ok");
  EXPECT_EQ(m.Feed("CALLS][{\"name\":\"get_time\",\"arguments\":{}}").calls.size(), 0u);
  EXPECT_EQ(m.Feed("]").calls.size(), 1u);
}

TEST(ToolParserTest, ParallelToolCallsFalseKeepsTheFirstCall) {
  ToolsRequest req = WeatherAndTime();
  req.parallel = false;
  auto o = ParseToolCalls(ToolSyntax::kHermes, req,
                          "<tool_call>{\"name\":\"get_time\",\"arguments\":{}}</tool_call>"
                          "<tool_call>{\"name\":\"get_weather\",\"arguments\":{\"city\":\"x\"}}"
                          "</tool_call>");
  ASSERT_EQ(o.calls.size(), 1u);
  EXPECT_EQ(o.calls[0].name, "get_time");
  EXPECT_EQ(o.content, "");
}

// The OpenAI shapes: message.tool_calls with finish_reason "tool_calls"; streamed as
// delta.tool_calls with index, the first delta of a call with id/type/name.
class ToolResponseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    req_.kind = ApiKind::kChat;
    req_.prompts = {{1, 2, 3}};
    req_.tools = WeatherAndTime();
    req_.tool_syntax = ToolSyntax::kHermes;
    ctx_.served_model = "m";
  }
  std::vector<engine::StreamEvent> Events(const std::vector<std::string>& pieces) {
    std::vector<engine::StreamEvent> evs;
    for (size_t i = 0; i < pieces.size(); ++i) {
      engine::StreamEvent ev;
      ev.token = 5;
      ev.text = pieces[i];
      if (i + 1 == pieces.size()) ev.finish = engine::FinishReason::kStop;
      evs.push_back(ev);
    }
    return evs;
  }
  ApiRequest req_;
  ApiContext ctx_;
};

TEST_F(ToolResponseTest, NonStreamingAndStreamingShapes) {
  const std::vector<std::string> pieces = {
      "Checking", ". <tool_", "call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Pa",
      "ris\"}}</tool_call>\n<tool_call>{\"name\":\"get_time\",\"arguments\":{}}</tool_call>", ""};
  ResponseBuilder whole(req_, ctx_, "chatcmpl-x", 1);
  for (const auto& ev : Events(pieces)) whole.Add(0, ev);
  json r = json::parse(whole.FinalJson(Usage{}));
  const json& ch = r["choices"][0];
  EXPECT_EQ(ch["finish_reason"], "tool_calls");
  EXPECT_EQ(ch["message"]["content"], "Checking.");
  ASSERT_EQ(ch["message"]["tool_calls"].size(), 2u);
  const json& call = ch["message"]["tool_calls"][0];
  EXPECT_EQ(call["type"], "function");
  EXPECT_TRUE(call["id"].get<std::string>().starts_with("call_"));
  EXPECT_EQ(call["function"]["name"], "get_weather");
  EXPECT_EQ(json::parse(call["function"]["arguments"].get<std::string>()),
            json({{"city", "Paris"}}));

  ResponseBuilder stream(req_, ctx_, "chatcmpl-x", 1);
  std::string sse = stream.OpeningChunks();
  for (const auto& ev : Events(pieces)) sse += stream.Chunk(0, ev);
  std::string content, finish;
  std::vector<json> calls;
  size_t pos = 0;
  int first_delta_chunks = 0;
  while ((pos = sse.find("data: ", pos)) != std::string::npos) {
    const size_t end = sse.find("\n\n", pos);
    json chunk = json::parse(sse.substr(pos + 6, end - pos - 6));
    pos = end;
    const json& c = chunk["choices"][0];
    if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
    const json& d = c["delta"];
    if (d.contains("content")) content += d["content"].get<std::string>();
    if (!d.contains("tool_calls")) continue;
    ASSERT_EQ(d["tool_calls"].size(), 1u);
    const json& tc = d["tool_calls"][0];
    const size_t index = tc["index"];
    if (tc.contains("id")) {
      ++first_delta_chunks;
      EXPECT_EQ(index, calls.size());
      EXPECT_EQ(tc["type"], "function");
      calls.push_back({{"id", tc["id"]}, {"name", tc["function"]["name"]}, {"arguments", ""}});
    } else {
      ASSERT_LT(index, calls.size());
      EXPECT_FALSE(tc.contains("type"));
      calls[index]["arguments"] = calls[index]["arguments"].get<std::string>() +
                                  tc["function"]["arguments"].get<std::string>();
    }
  }
  EXPECT_EQ(first_delta_chunks, 2);
  EXPECT_EQ(content, "Checking.");
  EXPECT_EQ(finish, "tool_calls");
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0]["name"], "get_weather");
  EXPECT_EQ(calls[0]["arguments"], R"({"city":"Paris"})");
  EXPECT_EQ(calls[1]["name"], "get_time");
}

TEST_F(ToolResponseTest, NoCallKeepsTheReplyAndStop) {
  ResponseBuilder whole(req_, ctx_, "chatcmpl-x", 1);
  for (const auto& ev : Events({"Just <b>text</b> ", "here."})) whole.Add(0, ev);
  json r = json::parse(whole.FinalJson(Usage{}));
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(r["choices"][0]["message"]["content"], "Just <b>text</b> here.");
  EXPECT_FALSE(r["choices"][0]["message"].contains("tool_calls"));
}

}  // namespace
}  // namespace chorus::server
