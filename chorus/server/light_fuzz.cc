// The bodies of the server's two light fuzzers (fuzz_entry.h): the --tenants file and the
// tool-call parser of replies. Apart from the API request fuzzer (fuzz_entry.cc) because they
// need only tenants.cc / tool_calls.cc, so their fuzz targets build from those sources alone.
#include <nlohmann/json.hpp>
#include <set>
#include <string_view>

#include "chorus/base/check.h"
#include "chorus/server/fuzz_entry.h"
#include "chorus/server/tenants.h"
#include "chorus/server/tool_calls.h"

namespace chorus::server {

using ojson = nlohmann::ordered_json;

bool FuzzTenantsInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto specs = ParseTenants(text, "tenants.json");
  if (!specs.ok()) {
    CHORUS_CHECK(specs.status().code() == StatusCode::kInvalidArgument);
    CHORUS_CHECK(specs.status().message().rfind("tenants.json: ", 0) == 0);
    return false;
  }
  std::set<std::string> names, keys;
  for (const TenantSpec& t : *specs) {
    CHORUS_CHECK(!t.name.empty() && t.name.size() <= 64);
    CHORUS_CHECK(names.insert(t.name).second);
    CHORUS_CHECK(!t.keys.empty());
    for (const std::string& k : t.keys) {
      CHORUS_CHECK(k.size() >= 8 && k.size() <= 256);
      CHORUS_CHECK(keys.insert(k).second);
    }
    CHORUS_CHECK(t.limits.max_concurrent >= 0 && t.limits.tokens_per_second >= 0);
  }
  return true;
}

bool FuzzToolCallsInput(const uint8_t* data, size_t size) {
  if (size == 0) return false;
  const ToolSyntax syntax = static_cast<ToolSyntax>(data[0] % 4);
  const std::string_view reply(reinterpret_cast<const char*>(data + 1), size - 1);
  static const ToolsRequest* tools = [] {
    auto* r = new ToolsRequest;
    const auto body = ojson::parse(
        R"({"tools": [{"type": "function", "function": {"name": "get_weather", "parameters":
              {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
            {"type": "function", "function": {"name": "get_time"}}], "tool_choice": "auto"})");
    CHORUS_CHECK(!ParseToolsRequest(body, r).has_value());
    return r;
  }();
  auto feed = [&](const std::vector<std::string_view>& pieces) {
    ToolCallParser p(syntax, tools);
    ToolParseOutput all;
    auto add = [&](ToolParseOutput o) {
      all.content += o.content;
      for (ToolCall& c : o.calls) {
        CHORUS_CHECK(tools->Find(c.name) != nullptr) << c.name;
        CHORUS_CHECK(nlohmann::json::parse(c.arguments, nullptr, false).is_object()) << c.arguments;
        all.calls.push_back(std::move(c));
      }
    };
    for (std::string_view piece : pieces) add(p.Feed(piece));
    add(p.Finish());
    CHORUS_CHECK(p.calls() == static_cast<int>(all.calls.size()));
    return all;
  };
  const ToolParseOutput whole = feed({reply});
  // Two splits derived from the input (deterministic), and one byte at a time for short replies.
  std::vector<std::vector<std::string_view>> splits;
  const size_t n = reply.size();
  const size_t a = n == 0 ? 0 : (data[0] * 31u + n) % (n + 1);
  const size_t b = a + (n - a) / 2;
  splits.push_back({reply.substr(0, a), reply.substr(a, b - a), reply.substr(b)});
  if (n <= 256) {
    std::vector<std::string_view> bytes;
    for (size_t i = 0; i < n; ++i) bytes.push_back(reply.substr(i, 1));
    splits.push_back(std::move(bytes));
  }
  for (const auto& pieces : splits) {
    const ToolParseOutput o = feed(pieces);
    CHORUS_CHECK(o.content == whole.content)
        << "'" << o.content << "' vs '" << whole.content << "'";
    CHORUS_CHECK(o.calls.size() == whole.calls.size());
    for (size_t i = 0; i < o.calls.size(); ++i) {
      CHORUS_CHECK(o.calls[i].name == whole.calls[i].name);
      CHORUS_CHECK(o.calls[i].arguments == whole.calls[i].arguments);
    }
  }
  return !whole.calls.empty();
}

std::vector<std::string> TenantsFuzzSeeds() {
  return {
      R"({"tenants": {"acme": {"keys": ["sk-acme-1", "sk-acme-2"], "max_concurrent": 8,
          "tokens_per_second": 500}, "blue": {"keys": ["sk-blue-key"]}}})",
      R"({"tenants": {"a.b-c_1": {"keys": ["01234567"], "max_concurrent": 0, "tokens_per_second": 0.5}}})",
      R"({"tenants": {}})",
      R"({"tenants": {"x": {"keys": ["dup-key-1"]}, "y": {"keys": ["dup-key-1"]}}})",
      R"({"tenants": {"x": {"keys": ["short"], "max_concurrent": -1, "extra": true}}, "other": 1})",
  };
}

std::vector<std::string> ToolCallsFuzzSeeds() {
  auto sel = [](ToolSyntax s, std::string_view text) {
    std::string out(1, static_cast<char>(s));
    return out.append(text);
  };
  return {
      sel(ToolSyntax::kHermes,
          "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
          "\"Paris\"}}\n</tool_call>\n<tool_call>{\"name\": \"get_time\", \"arguments\": {}}"
          "</tool_call>"),
      sel(ToolSyntax::kGeneric,
          "Checking.<tool_call>{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Oslo\"}}"
          "</tool_call>  Done."),
      sel(ToolSyntax::kLlama3Json,
          "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}; "
          "{\"name\": \"get_time\", \"arguments\": {}}"),
      sel(ToolSyntax::kLlama3Json,
          "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"a\\\"}\"}}"),
      sel(ToolSyntax::kMistral,
          "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, "
          "{\"name\": \"get_time\", \"arguments\": {}}]"),
      sel(ToolSyntax::kMistral,
          "Sure.[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]get_time[ARGS]{}"),
      // Last: a reply without a call (the fuzzer's "accepted" means a call was found).
      sel(ToolSyntax::kHermes, "no call here <tool_c"),
  };
}

}  // namespace chorus::server
