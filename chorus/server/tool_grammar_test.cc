// test-labels: unit
// Forced tool calls (tool_choice required / named): the grammar of each syntax accepts exactly
// calls of the allowed functions whose arguments follow their schema; random walks through the
// matcher always produce a reply the syntax's parser reads back as one such call; unsupported
// schemas are 400s naming the tool.
#include "chorus/server/tool_grammar.h"

#include <gtest/gtest.h>

#include <random>

#include "chorus/grammar/matcher.h"

namespace chorus::server {
namespace {

using ojson = nlohmann::ordered_json;

ToolsRequest Tools(const std::string& choice_json) {
  ToolsRequest r;
  auto e = ParseToolsRequest(
      ojson::parse(R"({"tools":[{"type":"function","function":{"name":"get_weather","parameters":)"
                   R"({"type":"object","properties":{"city":{"type":"string","maxLength":10},)"
                   R"("unit":{"enum":["c","f"]}},"required":["city","unit"]}}},)"
                   R"({"type":"function","function":{"name":"get_time"}}],"tool_choice":)" +
                   choice_json + "}"),
      &r);
  EXPECT_FALSE(e.has_value()) << e->message;
  return r;
}

constexpr ToolSyntax kSyntaxes[] = {ToolSyntax::kHermes, ToolSyntax::kGeneric,
                                    ToolSyntax::kLlama3Json, ToolSyntax::kMistral};

// The reply text of a call of `name` with `args` in `syntax` (after the opening).
std::string Reply(ToolSyntax syntax, const std::string& name, const std::string& args) {
  const std::string key = syntax == ToolSyntax::kLlama3Json ? "parameters" : "arguments";
  const std::string call = "{\"name\": \"" + name + "\", \"" + key + "\": " + args + "}";
  if (syntax == ToolSyntax::kMistral) return "[" + call + "]";
  if (syntax == ToolSyntax::kLlama3Json) return call;
  return call + "\n</tool_call>";
}

TEST(ToolGrammarTest, AcceptsExactlyAllowedCallsWithValidArguments) {
  for (ToolSyntax syntax : kSyntaxes) {
    SCOPED_TRACE(ToolSyntaxName(syntax));
    ToolConstraint tc;
    ASSERT_FALSE(BuildToolConstraint(syntax, Tools(R"("required")"), &tc));
    EXPECT_EQ(tc.opening, syntax == ToolSyntax::kMistral      ? "[TOOL_CALLS]"
                          : syntax == ToolSyntax::kLlama3Json ? ""
                                                              : "<tool_call>\n");
    const grammar::Grammar& g = tc.grammar;
    EXPECT_EQ(grammar::ReferenceRecognize(
                  g, Reply(syntax, "get_weather", R"({"city": "Paris", "unit": "c"})")),
              1);
    EXPECT_EQ(grammar::ReferenceRecognize(g, Reply(syntax, "get_time", "{}")), 1);
    // Unknown function, a missing required property, a value outside the enum, too long.
    EXPECT_EQ(grammar::ReferenceRecognize(g, Reply(syntax, "rm", "{}")), -1);
    EXPECT_EQ(grammar::ReferenceRecognize(g, Reply(syntax, "get_weather", R"({"city": "x"})")), -1);
    EXPECT_EQ(grammar::ReferenceRecognize(
                  g, Reply(syntax, "get_weather", R"({"city": "x", "unit": "k"})")),
              -1);
    EXPECT_EQ(
        grammar::ReferenceRecognize(
            g, Reply(syntax, "get_weather", R"({"city": "Llanfairpwllgwyngyll", "unit": "c"})")),
        -1);
    // Named: only that function.
    ASSERT_FALSE(BuildToolConstraint(
        syntax, Tools(R"({"type":"function","function":{"name":"get_time"}})"), &tc));
    EXPECT_EQ(grammar::ReferenceRecognize(tc.grammar, Reply(syntax, "get_time", "{}")), 1);
    EXPECT_EQ(grammar::ReferenceRecognize(
                  tc.grammar, Reply(syntax, "get_weather", R"({"city": "Paris", "unit": "c"})")),
              -1);
  }
}

TEST(ToolGrammarTest, UnsupportedSchemaIsABadRequestNamingTheTool) {
  ToolsRequest r;
  ASSERT_FALSE(ParseToolsRequest(
      ojson::parse(
          R"({"tools":[{"type":"function","function":{"name":"a"}},)"
          R"({"type":"function","function":{"name":"b","parameters":)"
          R"({"type":"object","patternProperties":{"x":{}}}}}],"tool_choice":"required"})"),
      &r));
  ToolConstraint tc;
  auto e = BuildToolConstraint(ToolSyntax::kHermes, r, &tc);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->http_status, 400);
  EXPECT_EQ(e->param, "tools[1].function.parameters");
  EXPECT_NE(e->message.find("patternProperties"), std::string::npos) << e->message;
  // Named "a" only compiles a's schema: fine.
  r.choice = ToolChoice::kNamed;
  r.named = "a";
  EXPECT_FALSE(BuildToolConstraint(ToolSyntax::kHermes, r, &tc).has_value());
}

// Random walks: a vocabulary of single bytes and a few multi-byte tokens; every step samples
// uniformly among the tokens the matcher allows. Whatever the walk, the parser reads one call
// of an allowed function with arguments that hold the schema's required keys.
TEST(ToolGrammarTest, RandomWalksAlwaysParseAsOneAllowedCall) {
  std::vector<std::string> bytes;
  for (int b = 0x20; b < 0x7f; ++b) bytes.push_back(std::string(1, static_cast<char>(b)));
  for (const char* t : {"\n", "{\"", "\": \"", "\", \"", "get_", "weather", "time", "city", "unit",
                        "</tool_call>", "\n</", "arguments", "parameters", "name", "\"}"}) {
    bytes.push_back(t);
  }
  const int32_t eos = static_cast<int32_t>(bytes.size());
  bytes.push_back("");  // EOS: no bytes
  auto vocab = grammar::Vocabulary::Create(bytes, {eos});
  std::mt19937 rng(7);
  for (ToolSyntax syntax : kSyntaxes) {
    for (const char* choice :
         {R"("required")", R"({"type":"function","function":{"name":"get_weather"}})"}) {
      const ToolsRequest req = Tools(choice);
      ToolConstraint tc;
      ASSERT_FALSE(BuildToolConstraint(syntax, req, &tc));
      for (int walk = 0; walk < 40; ++walk) {
        grammar::Matcher m(tc.grammar, vocab);
        grammar::TokenMask mask(vocab->size());
        std::string text;
        bool ended = false;
        for (int step = 0; step < 400 && !ended; ++step) {
          m.FillMask(&mask);
          std::vector<int32_t> allowed;
          for (int32_t t = 0; t < vocab->size(); ++t) {
            if (mask.Test(t)) allowed.push_back(t);
          }
          ASSERT_FALSE(allowed.empty()) << text;
          const int32_t t = allowed[rng() % allowed.size()];
          ASSERT_TRUE(m.Accept(t));
          if (t == eos) break;
          text += bytes[static_cast<size_t>(t)];
          ended = m.Done();
        }
        ASSERT_TRUE(ended || m.CanEnd()) << ToolSyntaxName(syntax) << ": " << text;
        ToolParseOutput o = ParseToolCalls(syntax, req, tc.opening + text);
        ASSERT_EQ(o.calls.size(), 1u) << ToolSyntaxName(syntax) << ": " << text;
        EXPECT_EQ(o.content, "") << text;
        const ToolCall& c = o.calls[0];
        if (req.choice == ToolChoice::kNamed) {
          EXPECT_EQ(c.name, "get_weather");
        }
        if (c.name == "get_time") {
          EXPECT_EQ(c.arguments, "{}");
        }
        const ojson args = ojson::parse(c.arguments);
        ASSERT_TRUE(args.is_object());
        if (c.name == "get_weather") {
          ASSERT_TRUE(args.contains("city") && args["city"].is_string()) << c.arguments;
          EXPECT_LE(args["city"].get<std::string>().size(), 10u);
          EXPECT_TRUE(args["unit"] == "c" || args["unit"] == "f") << c.arguments;
        }
      }
    }
  }
}

}  // namespace
}  // namespace chorus::server
