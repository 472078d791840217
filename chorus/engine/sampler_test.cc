// test-labels: unit
#include "chorus/engine/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "chorus/base/rng.h"

namespace chorus::engine {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// Logits whose softmax is exactly proportional to `probs` (up to float rounding).
std::vector<float> LogitsOf(const std::vector<double>& probs, double offset = 3.0) {
  std::vector<float> l;
  for (double p : probs) l.push_back(p > 0 ? static_cast<float>(std::log(p) + offset) : -kInf);
  return l;
}

std::vector<float> RandomLogits(int64_t n, uint64_t seed, float scale) {
  Rng rng(seed);
  std::vector<float> l(static_cast<size_t>(n));
  for (auto& x : l) x = rng.NextGaussian() * scale;
  return l;
}

// Counts of each token over `draws` samples from the same logits (no history).
std::vector<int64_t> Histogram(const SamplingParams& params, const std::vector<float>& logits,
                               int draws, uint64_t seed) {
  SamplingParams p = params;
  p.seed = seed;
  Sampler sampler(p, static_cast<int64_t>(logits.size()));
  SamplerScratch scratch;
  std::vector<int64_t> counts(logits.size(), 0);
  for (int i = 0; i < draws; ++i) ++counts[sampler.Sample(logits, {}, {}, &scratch)];
  return counts;
}

// Pearson's χ² of observed counts against expected probabilities (cells with p = 0 must be 0).
double ChiSquare(const std::vector<int64_t>& counts, const std::vector<double>& probs) {
  int64_t n = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  double chi2 = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (probs[i] == 0) {
      EXPECT_EQ(counts[i], 0) << "token " << i << " has probability 0";
      continue;
    }
    const double e = probs[i] * static_cast<double>(n);
    chi2 += (counts[i] - e) * (counts[i] - e) / e;
  }
  return chi2;
}

std::vector<double> Normalized(std::vector<double> v) {
  const double s = std::accumulate(v.begin(), v.end(), 0.0);
  for (double& x : v) x /= s;
  return v;
}

// χ² critical values at p = 0.001 (the seeds are fixed, so the tests are deterministic; the
// threshold only says how far from the law a correct sampler may land).
double Chi2Critical(int dof) {
  static const double kTable[] = {0, 10.83, 13.82, 16.27, 18.47, 20.52, 22.46, 24.32, 26.12};
  return kTable[dof];
}

TEST(SamplingParamsTest, DefaultsAreValidAndOff) {
  SamplingParams p;
  CHORUS_CHECK(p.Validate().ok());
  EXPECT_EQ(p.temperature, 1.0f);
  EXPECT_EQ(p.top_k, 0);
  EXPECT_EQ(p.top_p, 1.0f);
  EXPECT_EQ(p.min_p, 0.0f);
  EXPECT_FALSE(p.has_penalties());
  EXPECT_FALSE(p.greedy());
  EXPECT_FALSE(p.logprobs.has_value());
}

TEST(SamplingParamsTest, ValidateRejectsOutOfRange) {
  struct Case {
    void (*mutate)(SamplingParams&);
    const char* field;
  };
  const Case bad[] = {
      {[](SamplingParams& p) { p.temperature = -0.1f; }, "temperature"},
      {[](SamplingParams& p) { p.temperature = 100.5f; }, "temperature"},
      {[](SamplingParams& p) { p.temperature = std::nanf(""); }, "temperature"},
      {[](SamplingParams& p) { p.top_k = -2; }, "top_k"},
      {[](SamplingParams& p) { p.top_p = 0.0f; }, "top_p"},
      {[](SamplingParams& p) { p.top_p = 1.01f; }, "top_p"},
      {[](SamplingParams& p) { p.top_p = std::nanf(""); }, "top_p"},
      {[](SamplingParams& p) { p.min_p = -0.01f; }, "min_p"},
      {[](SamplingParams& p) { p.min_p = 1.5f; }, "min_p"},
      {[](SamplingParams& p) { p.repetition_penalty = 0.0f; }, "repetition_penalty"},
      {[](SamplingParams& p) { p.repetition_penalty = 10.5f; }, "repetition_penalty"},
      {[](SamplingParams& p) { p.presence_penalty = 2.5f; }, "presence_penalty"},
      {[](SamplingParams& p) { p.presence_penalty = -2.01f; }, "presence_penalty"},
      {[](SamplingParams& p) { p.frequency_penalty = -3.0f; }, "frequency_penalty"},
      {[](SamplingParams& p) { p.frequency_penalty = kInf; }, "frequency_penalty"},
      {[](SamplingParams& p) { p.logprobs = -1; }, "logprobs"},
      {[](SamplingParams& p) { p.logprobs = 21; }, "logprobs"},
  };
  for (const Case& c : bad) {
    SamplingParams p;
    c.mutate(p);
    Status s = p.Validate();
    ASSERT_FALSE(s.ok()) << c.field;
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find(c.field), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("got"), std::string::npos) << s.message();
  }
  const Case good[] = {
      {[](SamplingParams& p) { p.temperature = 0.0f; }, ""},
      {[](SamplingParams& p) { p.temperature = 100.0f; }, ""},
      {[](SamplingParams& p) { p.top_k = -1; }, ""},
      {[](SamplingParams& p) { p.top_k = 1; }, ""},
      {[](SamplingParams& p) { p.top_p = 1e-6f; }, ""},
      {[](SamplingParams& p) { p.min_p = 1.0f; }, ""},
      {[](SamplingParams& p) { p.repetition_penalty = 10.0f; }, ""},
      {[](SamplingParams& p) { p.presence_penalty = -2.0f; }, ""},
      {[](SamplingParams& p) { p.frequency_penalty = 2.0f; }, ""},
      {[](SamplingParams& p) { p.logprobs = 0; }, ""},
      {[](SamplingParams& p) { p.logprobs = 20; }, ""},
  };
  for (const Case& c : good) {
    SamplingParams p;
    c.mutate(p);
    EXPECT_TRUE(p.Validate().ok()) << p.Validate().ToString();
  }
}

TEST(SamplerTest, GreedyIsArgmaxLowestIdOnTies) {
  SamplingParams p;
  p.temperature = 0.0f;
  Sampler s(p, 6);
  SamplerScratch scratch;
  std::vector<float> l = {0.5f, 2.0f, -1.0f, 2.0f, 1.9f, -kInf};
  EXPECT_EQ(s.Sample(l, {}, {}, &scratch), 1);
  l = {-3.0f, -2.0f, -2.5f, -7.0f, -2.0f, -2.0f};
  EXPECT_EQ(s.Sample(l, {}, {}, &scratch), 1);
  l = {std::nanf(""), 0.0f, kInf, 1.0f, kInf, 0.0f};
  EXPECT_EQ(s.Sample(l, {}, {}, &scratch), 2);
  // A tiny positive temperature is greedy too.
  p.temperature = 1e-6f;
  Sampler s2(p, 6);
  l = {0.0f, 0.1f, 0.2f, 0.0f, 0.19999f, 0.0f};
  EXPECT_EQ(s2.Sample(l, {}, {}, &scratch), 2);
}

TEST(SamplerTest, SameSeedSameTokensDifferentSeedDifferent) {
  const std::vector<float> l = RandomLogits(1000, 7, 2.0f);
  auto run = [&](uint64_t seed) {
    SamplingParams p;
    p.seed = seed;
    p.top_p = 0.95f;
    p.top_k = 200;
    Sampler s(p, 1000);
    SamplerScratch scratch;
    std::vector<int32_t> out;
    for (int i = 0; i < 100; ++i) out.push_back(s.Sample(l, {}, out, &scratch));
    return out;
  };
  EXPECT_EQ(run(42), run(42));
  EXPECT_NE(run(42), run(43));
  // An unset seed falls back to the engine-provided default seed.
  SamplingParams p;
  Sampler a(p, 1000, /*default_seed=*/42), b(p, 1000, 42);
  p.seed = 42;
  Sampler c(p, 1000, /*default_seed=*/7);
  SamplerScratch scratch;
  for (int i = 0; i < 20; ++i) {
    const int32_t ta = a.Sample(l, {}, {}, &scratch);
    EXPECT_EQ(ta, b.Sample(l, {}, {}, &scratch));
    EXPECT_EQ(ta, c.Sample(l, {}, {}, &scratch));
  }
}

TEST(SamplerTest, FrequenciesFollowTheDistribution) {
  const std::vector<double> probs = {0.1, 0.2, 0.3, 0.4};
  SamplingParams p;
  const auto counts = Histogram(p, LogitsOf(probs), 20000, 1);
  EXPECT_LT(ChiSquare(counts, probs), Chi2Critical(3));
  // The test can fail: the same counts are far from a different law.
  EXPECT_GT(ChiSquare(counts, {0.25, 0.25, 0.25, 0.25}), 100.0);
}

TEST(SamplerTest, TemperatureSharpensAndFlattens) {
  const std::vector<double> probs = {0.1, 0.2, 0.3, 0.4};
  for (double t : {0.5, 2.0}) {
    SamplingParams p;
    p.temperature = static_cast<float>(t);
    std::vector<double> want;
    for (double q : probs) want.push_back(std::pow(q, 1.0 / t));
    want = Normalized(want);
    const auto counts = Histogram(p, LogitsOf(probs), 20000, 2);
    EXPECT_LT(ChiSquare(counts, want), Chi2Critical(3)) << "T=" << t;
    EXPECT_GT(ChiSquare(counts, probs), 50.0) << "T=" << t;
  }
}

TEST(SamplerTest, TopKOneAndTinyTopPAreGreedy) {
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  SamplingParams k1;
  k1.top_k = 1;
  k1.seed = 3;
  SamplingParams p_small;
  p_small.top_p = 1e-4f;
  p_small.seed = 4;
  Sampler g(greedy, 500), a(k1, 500), b(p_small, 500);
  SamplerScratch scratch;
  for (uint64_t step = 0; step < 50; ++step) {
    const std::vector<float> l = RandomLogits(500, 100 + step, 3.0f);
    const int32_t want = g.Sample(l, {}, {}, &scratch);
    EXPECT_EQ(a.Sample(l, {}, {}, &scratch), want);
    EXPECT_EQ(b.Sample(l, {}, {}, &scratch), want);
  }
}

TEST(SamplerTest, TopKKeepsTheKMostLikely) {
  // Tokens in scrambled probability order.
  const std::vector<double> probs = {0.05, 0.3, 0.1, 0.25, 0.2, 0.1};
  SamplingParams p;
  p.top_k = 3;
  const auto counts = Histogram(p, LogitsOf(probs), 20000, 5);
  EXPECT_LT(ChiSquare(counts, Normalized({0, 0.3, 0, 0.25, 0.2, 0})), Chi2Critical(2));
}

TEST(SamplerTest, TopPKeepsTheSmallestPrefixReachingP) {
  const std::vector<double> probs = {0.1, 0.3, 0.2, 0.4};
  SamplingParams p;
  p.top_p = 0.5f;  // 0.4 < 0.5 ≤ 0.4 + 0.3: keeps tokens 3 and 1
  auto counts = Histogram(p, LogitsOf(probs), 20000, 6);
  EXPECT_LT(ChiSquare(counts, Normalized({0, 0.3, 0, 0.4})), Chi2Critical(1));
  p.top_p = 0.75f;  // 0.7 < 0.75: the third token (0.2) is needed too
  counts = Histogram(p, LogitsOf(probs), 20000, 7);
  EXPECT_LT(ChiSquare(counts, Normalized({0, 0.3, 0.2, 0.4})), Chi2Critical(2));
}

TEST(SamplerTest, MinPDropsTokensBelowFractionOfTop) {
  const std::vector<double> probs = {0.05, 0.5, 0.15, 0.3};
  SamplingParams p;
  p.min_p = 0.2f;  // threshold 0.1: token 0 (0.05) goes
  const auto counts = Histogram(p, LogitsOf(probs), 20000, 8);
  EXPECT_LT(ChiSquare(counts, Normalized({0, 0.5, 0.15, 0.3})), Chi2Critical(2));
}

// The truncation spec written out naively in double (full sort, min-p → top-k → top-p, inverse
// CDF most likely first); the sampler must pick the same token for the same uniform draw.
int32_t NaiveDraw(const std::vector<float>& logits, const SamplingParams& p, double u) {
  const size_t v = logits.size();
  double max = -1e300;
  for (float x : logits) max = std::max<double>(max, x / p.temperature);
  std::vector<double> prob(v);
  double z = 0;
  for (size_t i = 0; i < v; ++i) z += prob[i] = std::exp(logits[i] / p.temperature - max);
  double pmax = 0;
  for (double& q : prob) pmax = std::max(pmax, q /= z);
  std::vector<int32_t> order;
  for (size_t i = 0; i < v; ++i) {
    if (prob[i] >= p.min_p * pmax) order.push_back(static_cast<int32_t>(i));
  }
  // Most likely first when a top-k/top-p cut needs the order; ids ascending otherwise.
  if ((p.top_k > 0 && static_cast<size_t>(p.top_k) < v) || p.top_p < 1.0f) {
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
      return prob[a] > prob[b] || (prob[a] == prob[b] && a < b);
    });
  }
  if (p.top_k > 0 && static_cast<size_t>(p.top_k) < order.size())
    order.resize(static_cast<size_t>(p.top_k));
  double total = 0;
  for (int32_t t : order) total += prob[t];
  if (p.top_p < 1.0f) {
    double cum = 0;
    size_t keep = order.size();
    for (size_t i = 0; i < order.size(); ++i) {
      cum += prob[order[i]];
      if (cum >= p.top_p * total) {
        keep = i + 1;
        break;
      }
    }
    order.resize(keep);
    total = 0;
    for (int32_t t : order) total += prob[t];
  }
  double cum = 0;
  for (int32_t t : order) {
    cum += prob[t];
    if (cum > u * total) return t;
  }
  return order.back();
}

TEST(SamplerTest, TruncationMatchesNaiveSpecOnLargeVocab) {
  struct Config {
    float t, top_p, min_p;
    int32_t top_k;
  };
  const Config configs[] = {
      {1.0f, 0.9f, 0.0f, 0},  {0.7f, 0.95f, 0.0f, 50}, {1.3f, 1.0f, 0.0f, 1000},
      {1.0f, 0.5f, 0.05f, 0}, {0.8f, 1.0f, 0.01f, 0},  {1.0f, 0.999f, 0.0f, 0},
  };
  const int64_t vocab = 32000;
  for (const Config& c : configs) {
    SamplingParams p;
    p.temperature = c.t;
    p.top_p = c.top_p;
    p.top_k = c.top_k;
    p.min_p = c.min_p;
    p.seed = 11;
    Sampler s(p, vocab);
    Rng mirror(11);  // the sampler draws exactly one NextDouble() per step
    SamplerScratch scratch;
    int mismatches = 0;
    for (uint64_t step = 0; step < 30; ++step) {
      const std::vector<float> l = RandomLogits(vocab, 1000 + step, 2.5f);
      const int32_t got = s.Sample(l, {}, {}, &scratch);
      mismatches += got != NaiveDraw(l, p, mirror.NextDouble());
    }
    // float vs double probabilities may move a draw sitting within ~1e-6 of a CDF boundary.
    EXPECT_LE(mismatches, 1) << "T=" << c.t << " top_p=" << c.top_p << " top_k=" << c.top_k
                             << " min_p=" << c.min_p;
  }
}

TEST(SamplerTest, RepetitionPenaltyHfStyle) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.repetition_penalty = 1.1f;
  Sampler s(p, 4);
  SamplerScratch scratch;
  const std::vector<int32_t> prompt = {0, 0, 3};
  // Positive logit divided: 2.0 / 1.1 = 1.82 < 1.9.
  EXPECT_EQ(s.Sample(std::vector<float>{2.0f, 1.9f, -5.0f, -5.0f}, prompt, {}, &scratch), 1);
  // Negative logit multiplied: -1.0 · 1.1 = -1.1 < -1.05.
  Sampler s2(p, 4);
  EXPECT_EQ(s2.Sample(std::vector<float>{-1.0f, -1.05f, -5.0f, -5.0f}, prompt, {}, &scratch), 1);
  // Generated tokens count too.
  Sampler s3(p, 4);
  const std::vector<int32_t> gen = {2};
  EXPECT_EQ(s3.Sample(std::vector<float>{-5.0f, 1.9f, 2.0f, -5.0f}, {}, gen, &scratch), 1);
  // Without the penalty the argmax stays.
  p.repetition_penalty = 1.0f;
  Sampler s4(p, 4);
  EXPECT_EQ(s4.Sample(std::vector<float>{2.0f, 1.9f, -5.0f, -5.0f}, prompt, {}, &scratch), 0);
}

TEST(SamplerTest, FrequencyAndPresencePenaltiesOnGeneratedOnly) {
  const std::vector<float> l = {2.0f, 1.9f, 0.0f};
  SamplerScratch scratch;
  const std::vector<int32_t> gen = {0, 0, 0};
  auto greedy_with = [&](float freq, float pres, std::span<const int32_t> prompt,
                         std::span<const int32_t> generated) {
    SamplingParams p;
    p.temperature = 0.0f;
    p.frequency_penalty = freq;
    p.presence_penalty = pres;
    Sampler s(p, 3);
    return s.Sample(l, prompt, generated, &scratch);
  };
  EXPECT_EQ(greedy_with(0.1f, 0.0f, {}, gen), 1);   // 2.0 − 3·0.1 = 1.7
  EXPECT_EQ(greedy_with(0.02f, 0.0f, {}, gen), 0);  // 2.0 − 0.06 = 1.94
  EXPECT_EQ(greedy_with(0.0f, 0.2f, {}, gen), 1);   // 2.0 − 0.2 = 1.8 (once, whatever the count)
  EXPECT_EQ(greedy_with(0.0f, 0.05f, {}, gen), 0);
  const std::vector<int32_t> prompt = {0, 0, 0, 0};
  EXPECT_EQ(greedy_with(2.0f, 2.0f, prompt, {}), 0);  // the prompt does not count
  // Negative penalties encourage repetition.
  const std::vector<int32_t> gen1 = {1};
  EXPECT_EQ(greedy_with(-0.2f, 0.0f, {}, gen1), 1);
}

TEST(SamplerTest, HistoryIsCountedIncrementally) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.frequency_penalty = 0.5f;
  Sampler s(p, 5);
  SamplerScratch scratch;
  const std::vector<float> l = {3.0f, 2.6f, 2.2f, -9.0f, -9.0f};
  const std::vector<int32_t> prompt = {4, 4, 3};
  std::vector<int32_t> gen;
  // Each pick is penalised 0.5 per occurrence: 0, 1, 0 (3 − 0.5 = 2.5 vs 2.6 → 1), …
  std::vector<int32_t> want = {0, 1, 0, 2, 1, 0};
  for (size_t i = 0; i < want.size(); ++i) {
    const int32_t t = s.Sample(l, prompt, gen, &scratch);
    ASSERT_EQ(t, want[i]) << "step " << i;
    gen.push_back(t);
  }
  EXPECT_EQ(s.tracked_tokens(), 3);  // only generated tokens matter for this penalty set…
  // …but the prompt is tracked too (for the repetition penalty), and ids out of range are
  // ignored: 3 and 4 from the prompt plus 0, 1, 2.
  SamplingParams rp = p;
  rp.repetition_penalty = 1.2f;
  Sampler s2(rp, 5);
  const std::vector<int32_t> odd_prompt = {4, 3, -1, 99};
  s2.Sample(l, odd_prompt, gen, &scratch);
  EXPECT_EQ(s2.tracked_tokens(), 5);
  // A rewritten history is recounted: same answer as a fresh sampler.
  std::vector<int32_t> other = {1, 1, 1};
  Sampler fresh(p, 5);
  EXPECT_EQ(s.Sample(l, prompt, other, &scratch), fresh.Sample(l, prompt, other, &scratch));
  EXPECT_EQ(s.Sample(l, prompt, other, &scratch), 0);  // 1 is down to 2.6 − 1.5 = 1.1
}

std::vector<double> LogSoftmax(const std::vector<float>& l) {
  double max = -1e300, z = 0;
  for (float x : l) max = std::max<double>(max, x);
  for (float x : l) z += std::exp(x - max);
  std::vector<double> out;
  for (float x : l) out.push_back(x - max - std::log(z));
  return out;
}

TEST(SamplerTest, RawLogprobsIgnorePenaltiesAndTemperature) {
  const std::vector<float> l = {1.0f, 3.0f, 2.0f, 2.0f, -1.0f, 0.5f};
  SamplingParams p;
  p.temperature = 0.5f;
  p.repetition_penalty = 2.0f;
  p.logprobs = 3;
  p.seed = 9;
  Sampler s(p, 6);
  SamplerScratch scratch;
  SampleResult r;
  const std::vector<int32_t> prompt = {1};
  const std::vector<double> want = LogSoftmax(l);
  for (int i = 0; i < 20; ++i) {
    const int32_t t = s.Sample(l, prompt, {}, &scratch, &r);
    EXPECT_EQ(r.token, t);
    EXPECT_NEAR(r.logprob, want[t], 1e-5);
    int64_t rank = 1;
    for (float x : l) rank += x > l[t];
    EXPECT_EQ(r.rank, rank);
    ASSERT_EQ(r.top.size(), 3u);
    EXPECT_EQ(r.top[0].token, 1);
    EXPECT_EQ(r.top[1].token, 2);  // tie with 3: lower id first
    EXPECT_EQ(r.top[2].token, 3);
    EXPECT_NEAR(r.top[0].logprob, want[1], 1e-5);
    EXPECT_NEAR(r.top[2].logprob, want[3], 1e-5);
  }
}

TEST(SamplerTest, ProcessedLogprobsAfterPenaltiesAndTemperature) {
  const std::vector<float> l = {1.0f, 3.0f, 2.0f, -1.0f};
  SamplingParams p;
  p.temperature = 0.5f;
  p.repetition_penalty = 2.0f;
  p.top_k = 1;  // truncation does not affect the reported distribution
  p.logprobs = 4;
  p.logprobs_mode = LogprobsMode::kProcessed;
  Sampler s(p, 4);
  SamplerScratch scratch;
  SampleResult r;
  const std::vector<int32_t> prompt = {1, 3};
  // Penalised: {1, 1.5, 2, -2}; / 0.5: {2, 3, 4, -4}.
  const std::vector<double> want = LogSoftmax({2.0f, 3.0f, 4.0f, -4.0f});
  EXPECT_EQ(s.Sample(l, prompt, {}, &scratch, &r), 2);
  EXPECT_NEAR(r.logprob, want[2], 1e-5);
  EXPECT_EQ(r.rank, 1);
  ASSERT_EQ(r.top.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(r.top[i].logprob, want[r.top[i].token], 1e-5);
  EXPECT_EQ(r.top[3].token, 3);
  // logprobs = 0: only the sampled token's.
  p.logprobs = 0;
  Sampler s0(p, 4);
  s0.Sample(l, prompt, {}, &scratch, &r);
  EXPECT_TRUE(r.top.empty());
  EXPECT_NEAR(r.logprob, want[2], 1e-5);
}

TEST(SamplerTest, BrokenLogitsNeverCrashOrPickNaN) {
  SamplingParams p;
  p.seed = 1;
  p.top_p = 0.9f;
  p.logprobs = 2;
  Sampler s(p, 5);
  SamplerScratch scratch;
  SampleResult r;
  const float nan = std::nanf("");
  for (int i = 0; i < 50; ++i) {
    const int32_t t =
        s.Sample(std::vector<float>{nan, 1.0f, nan, 1.2f, -kInf}, {}, {}, &scratch, &r);
    EXPECT_TRUE(t == 1 || t == 3) << t;
    EXPECT_TRUE(std::isfinite(r.logprob));
  }
  EXPECT_EQ(s.Sample(std::vector<float>{nan, nan, -kInf, nan, -kInf}, {}, {}, &scratch, &r), 0);
  const int32_t t =
      s.Sample(std::vector<float>{kInf, 0.0f, kInf, 1.0f, 0.0f}, {}, {}, &scratch, &r);
  EXPECT_TRUE(t == 0 || t == 2) << t;
}

// The scratch is per thread and shared: two samplers interleaved on one scratch give the same
// tokens as each alone.
TEST(SamplerTest, SharedScratchDoesNotLeakBetweenRequests) {
  const std::vector<float> la = RandomLogits(300, 1, 2.0f), lb = RandomLogits(300, 2, 2.0f);
  SamplingParams p;
  p.top_p = 0.9f;
  p.seed = 5;
  Sampler a(p, 300), b(p, 300), a_alone(p, 300);
  SamplerScratch shared, own;
  for (int i = 0; i < 30; ++i) {
    const int32_t ta = a.Sample(la, {}, {}, &shared);
    b.Sample(lb, {}, {}, &shared);
    EXPECT_EQ(ta, a_alone.Sample(la, {}, {}, &own));
  }
}

// A grammar mask: disallowed tokens are never drawn (greedy or sampled, whatever the
// penalties), and logprobs in both modes are those of the masked distribution.
TEST(SamplerTest, AllowedMaskIsEnforcedAndLogprobsAreMasked) {
  const std::vector<float> l = {5.0f, 1.0f, 0.0f, 4.0f, 2.0f};
  grammar::TokenMask allowed(5);
  allowed.Set(1);
  allowed.Set(2);
  allowed.Set(4);
  SamplerScratch scratch;
  SamplingParams greedy;
  greedy.temperature = 0;
  greedy.logprobs = 2;
  Sampler g(greedy, 5);
  SampleResult r;
  EXPECT_EQ(g.Sample(l, {}, {}, &scratch, &r, &allowed), 4);
  // Masked: log-softmax over {1, 2, 4} only.
  const double z = std::log(std::exp(1.0) + std::exp(0.0) + std::exp(2.0));
  EXPECT_NEAR(r.logprob, 2.0 - z, 1e-5);
  EXPECT_EQ(r.rank, 1);
  ASSERT_EQ(r.top.size(), 2u);
  EXPECT_EQ(r.top[0].token, 4);
  EXPECT_EQ(r.top[1].token, 1);
  SamplingParams hot;
  hot.temperature = 5.0f;
  hot.presence_penalty = -2.0f;
  hot.logprobs = 0;
  hot.logprobs_mode = LogprobsMode::kProcessed;
  hot.seed = 3;
  Sampler s(hot, 5);
  std::vector<int32_t> out;
  for (int i = 0; i < 2000; ++i) {
    const int32_t t = s.Sample(l, {}, out, &scratch, &r, &allowed);
    ASSERT_TRUE(allowed.Test(t)) << t;
    EXPECT_TRUE(std::isfinite(r.logprob));
    out.push_back(t);
  }
  // A row whose allowed logits are all −inf still yields an allowed token.
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> dead = {1.0f, -inf, -inf, 3.0f, -inf};
  Sampler g2(greedy, 5);
  EXPECT_EQ(g2.Sample(dead, {}, {}, &scratch, nullptr, &allowed), 1);
}

TEST(SamplerTest, LogitBiasShiftsTheDrawButNotRawLogprobs) {
  const std::vector<float> l = {1.0f, 3.0f, 2.0f, 0.0f};
  SamplerScratch scratch;
  SampleResult r;
  SamplingParams greedy;
  greedy.temperature = 0;
  greedy.logprobs = 1;
  greedy.logit_bias = {{3, 100.0f}, {9, 50.0f}};  // id 9 is outside the vocabulary: ignored
  Sampler forced(greedy, 4);
  EXPECT_EQ(forced.Sample(l, {}, {}, &scratch, &r), 3);
  const std::vector<double> raw = LogSoftmax(l);
  EXPECT_NEAR(r.logprob, raw[3], 1e-5);  // raw logprobs: the model's own distribution
  EXPECT_EQ(r.top[0].token, 1);
  // −100 on the most likely token: the next one; processed logprobs see the bias.
  greedy.logit_bias = {{1, -100.0f}};
  greedy.logprobs_mode = LogprobsMode::kProcessed;
  Sampler banned(greedy, 4);
  EXPECT_EQ(banned.Sample(l, {}, {}, &scratch, &r), 2);
  const std::vector<double> biased = LogSoftmax({1.0f, -97.0f, 2.0f, 0.0f});
  EXPECT_NEAR(r.logprob, biased[2], 1e-5);
  // Sampling at T = 1 with −100: the token is (practically) never drawn; +5 on token 0 makes
  // it the most frequent.
  SamplingParams hot;
  hot.logit_bias = {{1, -100.0f}, {0, 5.0f}};
  const auto counts = Histogram(hot, l, 4000, 17);
  EXPECT_EQ(counts[1], 0);
  EXPECT_GT(counts[0], counts[2]);
  EXPECT_GT(counts[0], counts[3]);
  // Validation.
  SamplingParams bad;
  bad.logit_bias = {{2, 100.5f}};
  EXPECT_FALSE(bad.Validate().ok());
  bad.logit_bias = {{-1, 1.0f}};
  EXPECT_FALSE(bad.Validate().ok());
  bad.logit_bias = {{2, std::numeric_limits<float>::quiet_NaN()}};
  EXPECT_FALSE(bad.Validate().ok());
  bad.logit_bias.assign(kMaxLogitBiasTokens + 1, TokenBias{1, 1.0f});
  EXPECT_FALSE(bad.Validate().ok());
}

TEST(SamplerTest, SuppressedTokensAreNotDrawnUnlessNothingElseIsLeft) {
  const std::vector<float> l = {1.0f, 3.0f, 2.0f, 0.0f};
  SamplerScratch scratch;
  SampleResult r;
  SamplingParams greedy;
  greedy.temperature = 0;
  greedy.logprobs = 0;
  Sampler g(greedy, 4);
  const std::vector<int32_t> end = {1, 7};  // 7: outside the vocabulary, ignored
  EXPECT_EQ(g.Sample(l, {}, {}, &scratch, &r, nullptr, end), 2);
  EXPECT_NEAR(r.logprob, LogSoftmax(l)[2], 1e-5);  // raw logprobs
  // Only the suppressed token is possible: it is drawn all the same.
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> only = {-inf, 3.0f, -inf, -inf};
  EXPECT_EQ(g.Sample(only, {}, {}, &scratch, &r, nullptr, end), 1);
  SamplingParams hot;
  hot.seed = 4;
  Sampler s(hot, 4);
  for (int i = 0; i < 500; ++i) EXPECT_NE(s.Sample(l, {}, {}, &scratch, nullptr, nullptr, end), 1);
}

}  // namespace
}  // namespace chorus::engine
