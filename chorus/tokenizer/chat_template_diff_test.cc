// test-labels: unit
// Differential test of the chat-template engine against Python Jinja2 configured as Hugging
// Face transformers configures it (tests/chat_templates/hf_render.py): every template of the
// corpus in tests/chat_templates/corpus, rendered on every conversation of
// tests/chat_templates/conversations.json, must give byte-identical output, or both engines
// must fail. The corpus is written for this suite and together exercises every builtin filter,
// test and statement (checked below). docs/chat_templates.md describes the setup.
//
// The reference is Debian's python3-jinja2 (scripts/setup.sh installs it). Without it the test
// is skipped, or fails when CHORUS_REQUIRE_MODELS=1 (CI), like a missing model asset.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "chorus/tokenizer/chat_template.h"
#include "chorus/tokenizer/jinja_ast.h"
#include "tests/testutil/testutil.h"

namespace chorus::tokenizer {
namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

// A fixed clock for strftime_now (2024-07-26 10:00:00 UTC), the same for both engines.
constexpr int64_t kNow = 1721988000;

std::string CorpusDir() { return std::string(CHORUS_SOURCE_DIR) + "/tests/chat_templates"; }

std::string ReadFile(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The interpreter with python3-jinja2: CHORUS_JINJA_PYTHON, else Debian's /usr/bin/python3.
std::string ReferencePython() {
  if (const char* p = std::getenv("CHORUS_JINJA_PYTHON"); p != nullptr && *p != '\0') return p;
  return "/usr/bin/python3";
}

bool HaveReference() {
  const std::string cmd = ReferencePython() + " -c 'import jinja2' >/dev/null 2>&1";
  return std::system(cmd.c_str()) == 0;
}

#define CHORUS_REQUIRE_JINJA2()                                                                \
  do {                                                                                         \
    if (!HaveReference()) {                                                                    \
      if (::chorus::testing::ModelsRequired()) {                                               \
        FAIL() << "python3-jinja2 is missing (CHORUS_REQUIRE_MODELS=1): " << ReferencePython() \
               << " cannot import jinja2; scripts/setup.sh installs it";                       \
      }                                                                                        \
      GTEST_SKIP() << "python3-jinja2 not installed (" << ReferencePython()                    \
                   << " cannot import jinja2); scripts/setup.sh installs it";                  \
    }                                                                                          \
  } while (0)

struct Corpus {
  std::vector<std::pair<std::string, std::string>> templates;  // file name, source
  ojson conversations;
};

// CHORUS_CHAT_TEMPLATE_CORPUS=DIR compares the *.jinja files of DIR instead (e.g. the templates
// of models you have locally; vendors' templates are not kept in the repository).
Corpus LoadCorpus(bool allow_override = true) {
  Corpus c;
  std::vector<fs::path> files;
  std::string dir = CorpusDir() + "/corpus";
  if (const char* d = std::getenv("CHORUS_CHAT_TEMPLATE_CORPUS");
      allow_override && d != nullptr && *d != '\0') {
    dir = d;
  }
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() == ".jinja") files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  for (const auto& f : files) c.templates.emplace_back(f.filename().string(), ReadFile(f));
  c.conversations = ojson::parse(ReadFile(CorpusDir() + "/conversations.json"));
  return c;
}

// The render variables as transformers passes them: messages, tools, documents,
// add_generation_prompt, the special tokens, then the chat_template_kwargs.
ojson Context(const ojson& conv) {
  ojson ctx = ojson::object();
  ctx["messages"] = conv["messages"];
  ctx["tools"] = conv["tools"];
  ctx["documents"] = conv["documents"];
  ctx["add_generation_prompt"] = conv["add_generation_prompt"];
  ctx["bos_token"] = conv["bos_token"];
  ctx["eos_token"] = conv["eos_token"];
  if (conv.contains("kwargs")) {
    for (auto it = conv["kwargs"].begin(); it != conv["kwargs"].end(); ++it) {
      ctx[it.key()] = it.value();
    }
  }
  return ctx;
}

struct Outcome {
  bool ok = false;
  std::string text;  // output, or the error message
};

Outcome RenderChorus(const std::string& source, const ojson& conv) {
  auto t = ChatTemplate::Parse(source);
  if (!t.ok()) return {false, t.status().ToString()};
  ChatRenderOptions o;
  o.add_generation_prompt = conv["add_generation_prompt"].get<bool>();
  o.bos_token = conv["bos_token"].get<std::string>();
  o.eos_token = conv["eos_token"].get<std::string>();
  o.now_unix_seconds = kNow;
  ojson ctx = Context(conv);
  ctx.erase("messages");
  ctx.erase("add_generation_prompt");
  ctx.erase("bos_token");
  ctx.erase("eos_token");
  o.extra_context = ctx;
  auto r = t->RenderJson(conv["messages"], o);
  if (!r.ok()) return {false, r.status().ToString()};
  return {true, *r};
}

// Renders every case with the reference in one Python process.
std::vector<Outcome> RenderReference(const ojson& cases) {
  const std::string dir = ::chorus::testing::TempDir();
  const std::string in = dir + "/cases.json", out = dir + "/results.json";
  {
    std::ofstream f(in, std::ios::binary);
    ojson req = {{"now", kNow}, {"cases", cases}};
    f << req.dump();
  }
  const std::string cmd =
      ReferencePython() + " " + CorpusDir() + "/hf_render.py " + in + " " + out + " 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::vector<Outcome> results;
  const ojson r = ojson::parse(ReadFile(out), nullptr, /*allow_exceptions=*/false);
  if (!r.is_array()) return results;
  for (const auto& e : r) {
    if (e["ok"].get<bool>()) {
      results.push_back({true, e["out"].get<std::string>()});
    } else {
      results.push_back({false, e["error"].get<std::string>()});
    }
  }
  return results;
}

class ChatTemplateDiffTest : public ::testing::Test {
 protected:
  // Both engines read the clock in local time; pin the zone.
  void SetUp() override { setenv("TZ", "UTC", 1); }
};

struct DiffCounts {
  size_t cases = 0;
  int identical = 0, both_failed = 0;
  std::vector<std::string> identical_names;  // "<template> × <conversation>" rendered identically
};

// Renders every template on every conversation in both engines; each case must be identical or
// fail in both (a failure names the case and the first differing line).
DiffCounts CompareWithJinja2(const std::vector<std::pair<std::string, std::string>>& templates,
                             const std::vector<ojson>& conversations) {
  ojson cases = ojson::array();
  std::vector<std::string> names;
  std::vector<const ojson*> convs;
  for (const auto& [file, source] : templates) {
    for (const auto& conv : conversations) {
      cases.push_back({{"template", source}, {"context", Context(conv)}});
      names.push_back(file + " × " + conv["name"].get<std::string>());
      convs.push_back(&conv);
    }
  }
  DiffCounts counts;
  counts.cases = cases.size();
  const std::vector<Outcome> want = RenderReference(cases);
  EXPECT_EQ(want.size(), cases.size());
  if (want.size() != cases.size()) return counts;
  for (size_t i = 0; i < cases.size(); ++i) {
    const Outcome got = RenderChorus(cases[i]["template"].get<std::string>(), *convs[i]);
    if (want[i].ok) {
      EXPECT_TRUE(got.ok) << names[i] << ": Chorus failed where Jinja2 rendered:\n"
                          << got.text << "\nJinja2:\n"
                          << want[i].text;
      if (got.ok) {
        if (got.text != want[i].text) {
          // The first differing line, for a readable failure.
          std::istringstream g(got.text), w(want[i].text);
          std::string gl, wl;
          int line = 0;
          while (true) {
            ++line;
            const bool gm = static_cast<bool>(std::getline(g, gl));
            const bool wm = static_cast<bool>(std::getline(w, wl));
            if (gl != wl || gm != wm) break;
            if (!gm) break;
          }
          ADD_FAILURE() << names[i] << ": output differs at line " << line << "\n  chorus: " << gl
                        << "\n  jinja2: " << wl;
        } else {
          ++counts.identical;
          counts.identical_names.push_back(names[i]);
        }
      }
    } else {
      EXPECT_FALSE(got.ok) << names[i] << ": Jinja2 failed (" << want[i].text
                           << ") but Chorus rendered:\n"
                           << got.text;
      counts.both_failed += !got.ok;
    }
  }
  return counts;
}

TEST_F(ChatTemplateDiffTest, CorpusMatchesJinja2ByteForByte) {
  CHORUS_REQUIRE_JINJA2();
  const Corpus corpus = LoadCorpus();
  ASSERT_GE(corpus.templates.size(), std::getenv("CHORUS_CHAT_TEMPLATE_CORPUS") ? 1u : 15u);
  ASSERT_GE(corpus.conversations.size(), 5u);
  const std::vector<ojson> convs(corpus.conversations.begin(), corpus.conversations.end());
  const DiffCounts d = CompareWithJinja2(corpus.templates, convs);
  // The corpus is meant to render, not to fail: most cases must produce text.
  EXPECT_GT(d.identical, static_cast<int>(d.cases) * 3 / 4);
  std::printf("chat template corpus: %zu cases, %d identical, %d failing in both engines\n",
              d.cases, d.identical, d.both_failed);
}

// The published templates of the model families Chorus runs (tests/chat_templates/models,
// PROVENANCE.md there: Qwen3 with its thinking and tool parts, Phi-3.5, Gemma 2, Gemma 3) on the
// shared conversations plus conversations reaching Qwen3's reasoning and multi-step tool
// branches. System prompts, multi-turn history and tools must render where the template
// supports them (Gemma 2 refuses a system role and Gemma's alternation check refuses tool turns,
// in both engines).
TEST_F(ChatTemplateDiffTest, FamilyTemplatesMatchJinja2) {
  CHORUS_REQUIRE_JINJA2();
  const std::string dir = CorpusDir() + "/models";
  std::vector<std::pair<std::string, std::string>> templates;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".jinja")
      templates.emplace_back(e.path().filename().string(), ReadFile(e.path()));
  std::sort(templates.begin(), templates.end());
  ASSERT_EQ(templates.size(), 4u);
  std::vector<ojson> convs;
  for (const auto& c : ojson::parse(ReadFile(CorpusDir() + "/conversations.json")))
    convs.push_back(c);
  for (const auto& c : ojson::parse(ReadFile(dir + "/conversations.json"))) convs.push_back(c);
  const DiffCounts d = CompareWithJinja2(templates, convs);
  const std::set<std::string> ok(d.identical_names.begin(), d.identical_names.end());
  for (const char* t : {"qwen3.jinja", "phi3.5.jinja", "gemma3.jinja"}) {
    EXPECT_TRUE(ok.count(std::string(t) + " × system_multi_turn")) << t;
  }
  EXPECT_TRUE(ok.count("gemma2.jinja × single_user"));
  // (The shared tools_and_results has an assistant turn with content null, which Qwen3's
  // template cannot test for '</think>': it fails in both engines; multi_step_tools passes "".)
  for (const char* c : {"multi_step_tools", "qwen3_reasoning_history", "qwen3_thinking_off",
                        "system_multi_turn", "non_ascii"}) {
    EXPECT_TRUE(ok.count(std::string("qwen3.jinja × ") + c)) << c;
  }
  std::printf("family chat templates: %zu cases, %d identical, %d failing in both engines\n",
              d.cases, d.identical, d.both_failed);
}

// The corpus mentions every builtin filter (`| name` or `map('name')`) and test (`is name`,
// or a test name passed to select/reject), so the differential test covers them all.
TEST_F(ChatTemplateDiffTest, CorpusExercisesEveryFilterAndTest) {
  const Corpus corpus = LoadCorpus(/*allow_override=*/false);
  std::string all;
  for (const auto& [file, source] : corpus.templates) all += source + "\n";
  auto normalized = [&](std::string s) {
    // Collapse runs of spaces so "|  name" and "| name" look alike.
    std::string out;
    for (char c : s) {
      if (c == ' ' && !out.empty() && out.back() == ' ') continue;
      out.push_back(c);
    }
    return out;
  };
  all = normalized(all);
  for (const std::string marker : {"{%-", "{%+"}) {
    for (size_t p = all.find(marker); p != std::string::npos; p = all.find(marker, p)) {
      all.replace(p, 3, "{%");
    }
  }
  for (const auto& f : jinja::FilterNames()) {
    const bool used = all.find("| " + f) != std::string::npos ||
                      all.find("|" + f) != std::string::npos ||
                      all.find("map('" + f + "'") != std::string::npos ||
                      all.find("{% filter " + f) != std::string::npos;
    EXPECT_TRUE(used) << "no corpus template uses the filter '" << f << "'";
  }
  for (const auto& t : jinja::TestNames()) {
    const bool used = all.find("is " + t + " ") != std::string::npos ||
                      all.find("is " + t + "(") != std::string::npos ||
                      all.find("is " + t + " }}") != std::string::npos ||
                      all.find("is not " + t) != std::string::npos ||
                      all.find("('" + t + "'") != std::string::npos ||
                      all.find(", '" + t + "'") != std::string::npos;
    EXPECT_TRUE(used) << "no corpus template uses the test '" << t << "'";
  }
  for (const std::string stmt :
       {"{% for",      "{% if",        "{% elif",         "{% else",       "{% set",
        "{% macro",    "{% call",      "{% filter",       "{% with",       "{% break",
        "{% continue", "{% raw",       "{% generation",   "{% block",      "namespace(",
        "loop.cycle",  "loop.changed", "loop.previtem",   "loop.nextitem", "caller(",
        "varargs",     "kwargs",       "raise_exception", "strftime_now",  ".format(",
        "' % "}) {
    EXPECT_NE(all.find(stmt), std::string::npos) << "no corpus template uses " << stmt;
  }
}

}  // namespace
}  // namespace chorus::tokenizer
