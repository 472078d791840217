// Constrained decoding through the engine on the real stories260K model (random text otherwise):
// every schema of tests/data/structured_output_schemas.json, all in one batch with unconstrained
// rows, n = 2, logprobs and stop strings. Every answer that finishes with kStop is a sentence of
// its grammar (Earley reference) and parses as JSON; schema validation by an independent
// validator is the e2e test's (tests/e2e/structured_outputs_e2e.py).
#include <fstream>
#include <nlohmann/json.hpp>

#include "chorus/engine/engine.h"
#include "chorus/grammar/json_schema.h"
#include "chorus/grammar/matcher.h"
#include "chorus/model/loader.h"
#include "tests/testutil/testutil.h"

namespace chorus::engine {
namespace {

using json = nlohmann::json;
const char* kModel = "stories260K/stories260K.bin";

struct Loaded {
  std::shared_ptr<const model::Model> model;
  std::shared_ptr<const tokenizer::Tokenizer> tok;
};

Loaded Load() {
  const std::string dir = testing::SharedModelsDir() + "/stories260K/";
  auto m = model::LoadModel(dir + "stories260K.bin");
  CHORUS_CHECK(m.ok()) << m.status().ToString();
  auto t = tokenizer::LoadTokenizer(dir + "tok512.bin");
  CHORUS_CHECK(t.ok()) << t.status().ToString();
  return {*m, std::shared_ptr<const tokenizer::Tokenizer>(std::move(*t))};
}

json Schemas() {
  std::ifstream in(std::string(CHORUS_SOURCE_DIR) + "/tests/data/structured_output_schemas.json");
  return json::parse(in);
}

struct Output {
  std::vector<int32_t> tokens;
  std::string text;
  std::vector<float> logprobs;
  FinishReason finish = FinishReason::kNone;
};

std::vector<Output> CollectAll(RequestHandle& h) {
  std::vector<Output> out(static_cast<size_t>(h.n_choices()));
  int done = 0;
  while (done < h.n_choices()) {
    auto ev = h.Next(std::chrono::milliseconds(60000));
    if (!ev) {
      ADD_FAILURE() << "no event within 60 s";
      break;
    }
    Output& o = out[static_cast<size_t>(ev->index)];
    if (ev->token >= 0) {
      o.tokens.push_back(ev->token);
      o.logprobs.push_back(ev->logprob);
    }
    o.text += ev->text;
    if (ev->finish != FinishReason::kNone) {
      o.finish = ev->finish;
      ++done;
    }
  }
  return out;
}

EngineOptions Opts() {
  EngineOptions o;
  o.threads = 2;
  o.max_batch_tokens = 256;
  o.max_running = 64;
  o.max_queue = 512;
  o.pool_bytes = 64 << 20;
  return o;
}

TEST(GrammarEngine, EverySchemaInOneBatchWithUnconstrainedRows) {
  CHORUS_REQUIRE_SHARED_MODEL(kModel);
  Loaded l = Load();
  auto e = Engine::Create(l.model, l.tok, Opts());
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  const json schemas = Schemas();
  ASSERT_GE(schemas.size(), 50u);
  struct Job {
    std::string name;
    grammar::Grammar g;
    std::shared_ptr<RequestHandle> h;
  };
  std::vector<Job> jobs;
  std::vector<std::shared_ptr<RequestHandle>> free_rows;
  for (size_t i = 0; i < schemas.size(); ++i) {
    auto g = grammar::CachedJsonSchema(schemas[i]["schema"]);
    ASSERT_TRUE(g.ok()) << schemas[i]["name"] << ": " << g.status().ToString();
    GenerationRequest r;
    r.prompt = {1, 403, 407, 261};
    r.max_tokens = 300;
    r.n = 2;
    r.sampling.temperature = 1.0f;
    r.sampling.seed = 100 + i;
    r.sampling.logprobs = 1;
    r.grammar = *g;
    auto h = (*e)->Submit(r);
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    jobs.push_back({schemas[i]["name"], *g, *h});
    if (i % 4 == 0) {  // unconstrained rows share the batches
      GenerationRequest u;
      u.prompt = {1, 403};
      u.max_tokens = 40;
      u.sampling.seed = i;
      auto hu = (*e)->Submit(u);
      ASSERT_TRUE(hu.ok());
      free_rows.push_back(*hu);
    }
  }
  int stops = 0, answers = 0;
  for (Job& j : jobs) {
    for (const Output& o : CollectAll(*j.h)) {
      ++answers;
      ASSERT_NE(o.finish, FinishReason::kError) << j.name;
      for (float lp : o.logprobs) EXPECT_TRUE(std::isfinite(lp)) << j.name;  // masked: finite
      if (o.finish != FinishReason::kStop) {
        EXPECT_EQ(o.finish, FinishReason::kLength);
        // Still a prefix of the grammar's language.
        EXPECT_GE(grammar::ReferenceRecognize(j.g, o.text), 0) << j.name << ": " << o.text;
        continue;
      }
      ++stops;
      EXPECT_EQ(grammar::ReferenceRecognize(j.g, o.text), 1) << j.name << ": " << o.text;
      EXPECT_TRUE(json::accept(o.text)) << j.name << ": " << o.text;
    }
  }
  for (auto& h : free_rows) {
    auto o = CollectAll(*h);
    EXPECT_EQ(o[0].finish, FinishReason::kLength);  // unconstrained rows are untouched
  }
  std::printf("%d of %d answers finished with stop\n", stops, answers);
  EXPECT_GE(stops * 2, answers);  // most schemas are bounded: most answers complete
  EXPECT_GT((*e)->metrics().grammar_masks_total.load(), 0u);
}

TEST(GrammarEngine, StopStringsStillApplyAndGreedyIsDeterministic) {
  CHORUS_REQUIRE_SHARED_MODEL(kModel);
  Loaded l = Load();
  auto e = Engine::Create(l.model, l.tok, Opts());
  ASSERT_TRUE(e.ok());
  auto g = grammar::CompileGbnf("root ::= \"{\" [a-z ]{0,60} \"}\"");
  ASSERT_TRUE(g.ok());
  GenerationRequest r;
  r.prompt = {1, 403, 407};
  r.max_tokens = 100;
  r.sampling.temperature = 0;
  r.grammar = *g;
  auto a = CollectAll(**(*e)->Submit(r));
  auto b = CollectAll(**(*e)->Submit(r));
  EXPECT_EQ(a[0].tokens, b[0].tokens);
  ASSERT_EQ(a[0].finish, FinishReason::kStop);
  EXPECT_EQ(grammar::ReferenceRecognize(*g, a[0].text), 1) << a[0].text;
  ASSERT_GT(a[0].text.size(), 3u);
  // A stop string inside the constrained text ends the answer there (not included).
  r.stop = {a[0].text.substr(2, 1)};
  auto c = CollectAll(**(*e)->Submit(r));
  EXPECT_EQ(c[0].finish, FinishReason::kStop);
  EXPECT_EQ(c[0].text, a[0].text.substr(0, a[0].text.find(r.stop[0])));
}

// A seeded constrained row gives the same tokens alone, among other rows (constrained with other
// schemas and unconstrained), and with its masks computed inline instead of on the mask worker.
TEST(GrammarEngine, BatchInvariantAndSameWithOrWithoutOverlap) {
  CHORUS_REQUIRE_SHARED_MODEL(kModel);
  Loaded l = Load();
  const json schemas = Schemas();
  auto request = [&](size_t i) {
    GenerationRequest r;
    r.prompt = {1, 403, 407, 261};
    r.max_tokens = 120;
    r.sampling.temperature = 0.8f;
    r.sampling.seed = 7 + i;
    r.grammar = *grammar::CachedJsonSchema(schemas[i]["schema"]);
    return r;
  };
  const std::vector<size_t> probe = {22, 25, 40, 45};  // objects, nested, recursion, person
  std::vector<std::vector<int32_t>> alone;
  {
    auto e = Engine::Create(l.model, l.tok, Opts());
    ASSERT_TRUE(e.ok());
    for (size_t i : probe) alone.push_back(CollectAll(**(*e)->Submit(request(i)))[0].tokens);
  }
  for (bool overlap : {true, false}) {
    EngineOptions o = Opts();
    o.overlap_grammar_masks = overlap;
    auto e = Engine::Create(l.model, l.tok, o);
    ASSERT_TRUE(e.ok());
    std::vector<std::shared_ptr<RequestHandle>> others, probes;
    for (size_t i = 0; i < 24; ++i) {  // other rows first, so the probes join a busy batch
      GenerationRequest r = i % 3 == 0 ? GenerationRequest{} : request(i + 1);
      if (i % 3 == 0) {
        r.prompt = {1, 300 + static_cast<int32_t>(i)};
        r.max_tokens = 60;
        r.sampling.seed = i;
      }
      others.push_back(*(*e)->Submit(r));
    }
    for (size_t i : probe) probes.push_back(*(*e)->Submit(request(i)));
    for (size_t k = 0; k < probe.size(); ++k) {
      EXPECT_EQ(CollectAll(*probes[k])[0].tokens, alone[k])
          << "schema " << probe[k] << (overlap ? " (mask worker)" : " (inline)");
    }
    for (auto& h : others) CollectAll(*h);
    if (!overlap) EXPECT_EQ((*e)->metrics().grammar_masks_total.load(), 0u);
  }
}

}  // namespace
}  // namespace chorus::engine
