// Traces for the simulator (sim/trace.h): the JSONL format round-trips, malformed lines are
// refused naming the line and the field, and the generator gives the rate, burstiness,
// popularity and lengths it was asked for, deterministically.
#include "chorus/sim/trace.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>

namespace chorus::sim {
namespace {

TEST(TraceTest, JsonlRoundTripsAndSkipsBlankAndCommentLines) {
  const std::string text =
      "# a comment\n"
      "{\"arrival_s\": 0, \"prompt_tokens\": 10, \"output_tokens\": 3}\n"
      "\n"
      "{\"arrival_s\": 0.5, \"prompt_tokens\": 7, \"output_tokens\": 1, \"adapter\": \"x\", "
      "\"rank\": 16, \"ttft_slo_ms\": 100, \"tpot_slo_ms\": 20}\r\n";
  auto t = ParseTrace(text);
  ASSERT_TRUE(t.ok()) << t.status().message();
  ASSERT_EQ(t->size(), 2u);
  EXPECT_EQ((*t)[0].adapter, "");
  EXPECT_EQ((*t)[0].rank, 0);
  EXPECT_EQ((*t)[1].adapter, "x");
  EXPECT_EQ((*t)[1].rank, 16);
  EXPECT_EQ((*t)[1].tpot_slo_ms, 20);
  auto again = ParseTrace(TraceToJsonl(*t));
  ASSERT_TRUE(again.ok());
  ASSERT_EQ(again->size(), 2u);
  EXPECT_EQ((*again)[1].arrival_s, 0.5);
  EXPECT_EQ((*again)[1].prompt_tokens, 7);
  EXPECT_EQ((*again)[1].ttft_slo_ms, 100);
}

TEST(TraceTest, MalformedLinesNameTheLineAndField) {
  const std::string ok = "{\"arrival_s\": 0, \"prompt_tokens\": 10, \"output_tokens\": 3}\n";
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"{\"arrival_s\": 1, \"prompt_tokens\": 10", "line 2: not JSON"},
      {"[1,2]", "line 2: not a JSON object"},
      {"{\"prompt_tokens\": 10, \"output_tokens\": 3}", "line 2: missing field 'arrival_s'"},
      {"{\"arrival_s\": \"x\", \"prompt_tokens\": 1, \"output_tokens\": 3}",
       "line 2: field 'arrival_s' is not a number"},
      {"{\"arrival_s\": 1, \"prompt_tokens\": 0, \"output_tokens\": 3}",
       "line 2: field 'prompt_tokens' must be an integer"},
      {"{\"arrival_s\": 1, \"prompt_tokens\": 2.5, \"output_tokens\": 3}",
       "line 2: field 'prompt_tokens' must be an integer"},
      {"{\"arrival_s\": 1, \"prompt_tokens\": 2}", "line 2: missing field 'output_tokens'"},
      {"{\"arrival_s\": 1, \"prompt_tokens\": 2, \"output_tokens\": 3, \"adapter\": \"a\"}",
       "line 2: missing field 'rank'"},
      {"{\"arrival_s\": 1, \"prompt_tokens\": 2, \"output_tokens\": 3, \"adapter\": 5}",
       "line 2: field 'adapter' is not a string"},
      {"{\"arrival_s\": 1, \"prompt_tokens\": 2, \"output_tokens\": 3, \"rank\": 8}",
       "line 2: field 'rank' without an 'adapter'"},
      {"{\"arrival_s\": 1, \"prompt_tokens\": 2, \"output_tokens\": 3, \"tpot_slo_ms\": -1}",
       "line 2: an SLO is negative"},
  };
  for (const auto& [line, want] : bad) {
    auto t = ParseTrace(ok + line + "\n");
    ASSERT_FALSE(t.ok()) << line;
    EXPECT_NE(t.status().message().find(want), std::string::npos) << t.status().message();
  }
  auto back = ParseTrace(
      "{\"arrival_s\": 2, \"prompt_tokens\": 1, \"output_tokens\": 1}\n"
      "{\"arrival_s\": 1, \"prompt_tokens\": 1, \"output_tokens\": 1}\n");
  ASSERT_FALSE(back.ok());
  EXPECT_NE(back.status().message().find("line 2: field 'arrival_s' goes back"), std::string::npos);
  EXPECT_FALSE(ParseTrace("\n# nothing\n").ok());
  auto missing = LoadTrace("/nonexistent/trace.jsonl");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("/nonexistent/trace.jsonl"), std::string::npos);
}

TEST(TraceTest, LengthDistributionsParse) {
  EXPECT_EQ(LengthDist::Parse("64")->a, 64);
  auto u = LengthDist::Parse("uniform:8:32");
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(u->kind, LengthDist::Kind::kUniform);
  EXPECT_TRUE(LengthDist::Parse("lognormal:100:0.5:1000").ok());
  for (const char* bad : {"0", "x", "uniform:9:8", "uniform:1", "lognormal:1:2", "gauss:1:2", ""})
    EXPECT_FALSE(LengthDist::Parse(bad).ok()) << bad;
}

double Cv(const std::vector<TraceRequest>& t) {
  std::vector<double> gaps;
  double prev = 0;
  for (const auto& r : t) {
    gaps.push_back(r.arrival_s - prev);
    prev = r.arrival_s;
  }
  double mean = 0, var = 0;
  for (double g : gaps) mean += g;
  mean /= static_cast<double>(gaps.size());
  for (double g : gaps) var += (g - mean) * (g - mean);
  var /= static_cast<double>(gaps.size());
  return std::sqrt(var) / mean;
}

TEST(TraceTest, GeneratorGivesTheRateBurstinessPopularityAndLengthsAskedFor) {
  TraceSpec spec;
  spec.requests = 20000;
  spec.rate = 50;
  spec.adapters = 100;
  spec.zipf = 1.0;
  spec.prompt = *LengthDist::Parse("uniform:10:20");
  spec.output = *LengthDist::Parse("lognormal:50:0.5:120");
  for (double cv : {1.0, 2.0, 0.5}) {
    spec.cv = cv;
    auto t = GenerateTrace(spec);
    ASSERT_TRUE(t.ok());
    const double rate = static_cast<double>(t->size()) / t->back().arrival_s;
    EXPECT_NEAR(rate, 50, 50 * (cv > 1 ? 0.06 : 0.03)) << cv;
    EXPECT_NEAR(Cv(*t), cv, 0.06 * cv) << cv;
  }
  auto t = GenerateTrace(spec);
  std::map<std::string, int> count;
  std::map<std::string, int64_t> rank;
  for (const auto& r : *t) {
    ++count[r.adapter];
    EXPECT_GE(r.prompt_tokens, 10);
    EXPECT_LE(r.prompt_tokens, 20);
    EXPECT_GE(r.output_tokens, 1);
    EXPECT_LE(r.output_tokens, 120);
    EXPECT_TRUE(r.rank == 8 || r.rank == 16 || r.rank == 32 || r.rank == 64);
    // An adapter has one rank.
    auto [it, fresh] = rank.emplace(r.adapter, r.rank);
    if (!fresh) {
      EXPECT_EQ(it->second, r.rank);
    }
  }
  // zipf 1 over 100 adapters: the first takes 1/H(100) ≈ 19.3 %, the second half that.
  EXPECT_NEAR(count["a0"] / 20000.0, 0.193, 0.015);
  EXPECT_NEAR(static_cast<double>(count["a1"]) / count["a0"], 0.5, 0.07);
  // Deterministic; the rate only scales the arrivals, the requests stay the same.
  auto same = GenerateTrace(spec);
  spec.rate = 100;
  auto faster = GenerateTrace(spec);
  for (size_t i = 0; i < t->size(); i += 997) {
    EXPECT_EQ((*same)[i].arrival_s, (*t)[i].arrival_s);
    EXPECT_EQ((*faster)[i].adapter, (*t)[i].adapter);
    EXPECT_EQ((*faster)[i].prompt_tokens, (*t)[i].prompt_tokens);
    EXPECT_NEAR((*faster)[i].arrival_s * 2, (*t)[i].arrival_s, 1e-9 * (*t)[i].arrival_s + 1e-12);
  }
  spec.seed = 2;
  EXPECT_NE((*GenerateTrace(spec))[5].arrival_s, (*faster)[5].arrival_s);
  spec.zipf = 0;
  spec.adapters = 4;
  count.clear();
  // (Named: a range-for over *GenerateTrace(...) would iterate a vector the temporary Result
  // takes with it — ASan's stack-use-after-scope.)
  const auto uniform = GenerateTrace(spec);
  for (const auto& r : *uniform) ++count[r.adapter];
  for (const auto& [a, n] : count) EXPECT_NEAR(n / 20000.0, 0.25, 0.02) << a;
  spec.requests = 0;
  EXPECT_FALSE(GenerateTrace(spec).ok());
}

TEST(TraceTest, ScaleToRateKeepsThePatternAtTheNewMeanRate) {
  TraceSpec spec;
  spec.requests = 1000;
  spec.rate = 5;
  spec.cv = 2;
  auto t = GenerateTrace(spec);
  ASSERT_TRUE(t.ok());
  auto s = ScaleToRate(*t, 40);
  EXPECT_NEAR(1000 / s.back().arrival_s, 40, 1e-9);
  EXPECT_NEAR(Cv(s), Cv(*t), 1e-9);
  EXPECT_EQ(s[7].adapter, (*t)[7].adapter);
}

}  // namespace
}  // namespace chorus::sim
