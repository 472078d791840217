// Chat-template rendering cost per request (docs/chat_templates.md): a 100-message
// conversation through
//   * large — the six prompt-shaped templates of the differential-test corpus (turn
//     headers, system/alternation checks, tool schemas as JSON, content parts, reasoning and
//     tool turns, a dated header layout) concatenated into one ~14 KiB template: larger than
//     the templates models ship, and doing six templates' work per request;
//   * corpus — every corpus template that accepts a plain conversation, concatenated (~25 KiB,
//     every filter, test, method and statement; a stress case printing ~300 KiB per render);
//   * tool_turns — the corpus's ChatML-style template with reasoning and tool calls, on a
//     conversation with tool calls and results (the shape of agent traffic);
//   * chatml — the built-in ChatML default (the baseline: the cheapest useful template).
// The template is parsed once (as the server does at startup); each iteration renders from
// the JSON messages, which is what a request costs.
//
//   ./chat_template_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "chorus/base/logging.h"
#include "chorus/tokenizer/chat_template.h"

namespace chorus::tokenizer {
namespace {

using ojson = nlohmann::ordered_json;

std::string ReadCorpusFile(const std::string& name) {
  std::ifstream f(std::string(CHORUS_SOURCE_DIR) + "/tests/chat_templates/corpus/" + name);
  std::stringstream ss;
  ss << f.rdbuf();
  CHORUS_CHECK(!ss.str().empty()) << "missing corpus file " << name;
  return ss.str();
}

ojson Tools() {
  return ojson::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "search", "description": "Web search",
      "parameters": {"type": "object", "properties": {"q": {"type": "string"}},
        "required": ["q"]}}}])");
}

// System prompt, then user/assistant turns of a few sentences each (100 messages).
ojson PlainConversation() {
  ojson m = ojson::array();
  m.push_back({{"role", "system"}, {"content", "You are a careful assistant. Answer briefly."}});
  for (int i = 1; i < 100; ++i) {
    const bool user = i % 2 == 1;
    std::string text = user ? "Question " + std::to_string(i) +
                                  ": what changed in the quarterly report, and why does it matter?"
                            : "Answer " + std::to_string(i) +
                                  ": revenue rose 4% while costs fell; margins improved as a "
                                  "result.";
    m.push_back({{"role", user ? "user" : "assistant"}, {"content", text}});
  }
  return m;
}

// Agent traffic: user asks, assistant calls a tool, the tool answers, assistant replies.
ojson ToolConversation() {
  ojson m = ojson::array();
  m.push_back({{"role", "system"}, {"content", "Use tools when needed."}});
  for (int i = 0; m.size() < 100; ++i) {
    m.push_back({{"role", "user"}, {"content", "Weather in city " + std::to_string(i) + "?"}});
    ojson call = {{"id", "call_" + std::to_string(i)},
                  {"type", "function"},
                  {"function",
                   {{"name", "get_weather"},
                    {"arguments", {{"city", "City " + std::to_string(i)}, {"unit", "celsius"}}}}}};
    m.push_back({{"role", "assistant"},
                 {"content", "<think>look it up</think>"},
                 {"tool_calls", ojson::array({call})}});
    m.push_back({{"role", "tool"},
                 {"tool_call_id", "call_" + std::to_string(i)},
                 {"content", "{\"temp\": 18.5}"}});
    m.push_back({{"role", "assistant"}, {"content", "It is 18.5 degrees."}});
  }
  while (m.size() > 100) m.erase(m.end() - 1);
  return m;
}

void Run(benchmark::State& state, const std::string& source, const ojson& messages,
         bool with_tools) {
  auto t = ChatTemplate::Parse(source);
  CHORUS_CHECK(t.ok()) << t.status().ToString();
  ChatRenderOptions o;
  o.bos_token = "<s>";
  o.eos_token = "</s>";
  o.now_unix_seconds = 1721988000;
  o.extra_context = {{"tools", with_tools ? Tools() : ojson(nullptr)},
                     {"documents", ojson::parse(R"([{"title": "A", "text": "t", "year": 1}])")}};
  size_t bytes = 0;
  for (auto _ : state) {
    auto r = t->RenderJson(messages, o);
    CHORUS_CHECK(r.ok()) << r.status().ToString();
    bytes = r->size();
    benchmark::DoNotOptimize(r->data());
  }
  state.counters["template_bytes"] = static_cast<double>(source.size());
  state.counters["prompt_bytes"] = static_cast<double>(bytes);
  state.counters["messages"] = static_cast<double>(messages.size());
}

std::string Concat(const std::vector<std::string>& files) {
  std::string s;
  for (const auto& f : files) s += ReadCorpusFile(f);
  return s;
}

void BM_Large100(benchmark::State& state) {
  static const std::string src = Concat(
      {"01_turns.jinja", "02_system_and_alternation.jinja", "03_tools_json.jinja",
       "17_content_parts.jinja", "20_reasoning_and_tool_turns.jinja", "21_header_layout.jinja"});
  static const ojson conv = PlainConversation();
  Run(state, src, conv, true);
}
BENCHMARK(BM_Large100)->Unit(benchmark::kMicrosecond);

// Corpus templates that render any plain conversation (the others raise on purpose, e.g. for
// tool messages or to test errors).
void BM_Corpus100(benchmark::State& state) {
  static const std::string src =
      Concat({"01_turns.jinja", "02_system_and_alternation.jinja", "03_tools_json.jinja",
              "04_namespace_loop.jinja", "05_macros.jinja", "06_string_filters.jinja",
              "07_list_filters.jinja", "08_numbers.jinja", "09_str_methods.jinja", "10_dicts.jinja",
              "11_tests.jinja", "12_whitespace.jinja", "13_statements.jinja",
              "17_content_parts.jinja", "18_slicing.jinja", "19_printing.jinja",
              "20_reasoning_and_tool_turns.jinja", "21_header_layout.jinja"});
  static const ojson conv = PlainConversation();
  Run(state, src, conv, true);
}
BENCHMARK(BM_Corpus100)->Unit(benchmark::kMicrosecond);

void BM_ToolTurns100(benchmark::State& state) {
  static const std::string src = ReadCorpusFile("20_reasoning_and_tool_turns.jinja");
  static const ojson conv = ToolConversation();
  Run(state, src, conv, true);
}
BENCHMARK(BM_ToolTurns100)->Unit(benchmark::kMicrosecond);

void BM_ChatMl100(benchmark::State& state) {
  static const ojson conv = PlainConversation();
  Run(state, std::string(DefaultChatTemplateSource()), conv, false);
}
BENCHMARK(BM_ChatMl100)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace chorus::tokenizer

BENCHMARK_MAIN();
