#include "chorus/eval/eval.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "chorus/model/synthetic.h"

namespace chorus::eval {
namespace {

std::shared_ptr<const model::Model> Tiny(uint64_t seed) {
  model::SyntheticSpec spec;
  spec.shape = "tiny";
  spec.seed = seed;
  return *model::MakeSyntheticModel(spec);
}

std::vector<int32_t> RandomTokens(int64_t n, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab));
  return t;
}

TEST(EvalTest, ScoresOfAKnownDistribution) {
  // Logits log(p) with p = (1/2, 1/4, 1/8, 1/8): targets 0 and 1 once each → ppl = exp((ln2 +
  // ln4)/2).
  std::vector<float> lg = {std::log(0.5f), std::log(0.25f), std::log(0.125f), std::log(0.125f)};
  Scores s;
  s.Add(lg, 0);
  s.Add(lg, 1);
  EXPECT_NEAR(s.perplexity(), std::exp((std::log(2.0) + std::log(4.0)) / 2), 1e-6);
  EXPECT_FALSE(s.has_reference());
  // KL(p ‖ uniform) = ln 4 − H(p) = ln4 − 1.75 ln2.
  std::vector<float> uniform(4, 0.0f);
  EXPECT_NEAR(KlDivergence(lg, uniform), std::log(4.0) - 1.75 * std::log(2.0), 1e-6);
  EXPECT_NEAR(KlDivergence(lg, lg), 0.0, 1e-12);
  Scores r;
  std::vector<float> top3 = {0, 0, 0, 1};
  r.Add(top3, 0, lg);  // top token 3 vs the reference's 0
  EXPECT_EQ(r.same_top(), 0.0);
  r.Add(lg, 0, lg);
  EXPECT_EQ(r.same_top(), 0.5);
  EXPECT_NEAR(r.mean_kl(), KlDivergence(lg, top3) / 2, 1e-12);
}

TEST(EvalTest, WindowsFollowLlamaPerplexity) {
  auto w = PlanWindows(1000, 128);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(w->n_chunks, 7);
  EXPECT_EQ(w->first, 64);
  EXPECT_EQ(w->scored_per_chunk(), 63);
  EXPECT_FALSE(PlanWindows(255, 128).ok());  // needs 2·ctx tokens
}

TEST(EvalTest, UniformModelHasPerplexityVocab) {
  // Zero embeddings (tied or not, and the head): every logit is 0, so every token has
  // probability 1/vocab and the perplexity is exactly the vocabulary size.
  auto m = Tiny(1);
  model::Model::NamedTensors ts;
  for (const auto& [n, t] : m->tensors()) {
    if (n == "model.embed_tokens.weight" || n == "lm_head.weight") {
      ts.emplace_back(n, Tensor::Zeros(DType::kF32, t.shape()));
    } else {
      ts.emplace_back(n, t);
    }
  }
  auto zero = model::Model::Build(m->config(), ts, m->format(), "zero");
  ASSERT_TRUE(zero.ok()) << zero.status().ToString();
  const int64_t vocab = m->config().vocab_size;
  auto tokens = RandomTokens(300, vocab, 3);
  ThreadPool pool(2);
  auto r =
      Evaluate(*zero, nullptr, nullptr, tokens, {.ctx = 64, .bos_id = 1, .max_rows = 24}, &pool);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->scores.tokens(), 4 * 31);
  EXPECT_NEAR(r->scores.perplexity(), static_cast<double>(vocab), 1e-3 * vocab);
}

TEST(EvalTest, ModelAgainstItselfHasZeroKlAndSameTop) {
  auto m = Tiny(1);
  auto tokens = RandomTokens(400, m->config().vocab_size, 4);
  ThreadPool pool(2);
  auto r = Evaluate(m, nullptr, m, tokens, {.ctx = 100, .bos_id = -1, .max_rows = 32}, &pool);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->scores.has_reference());
  EXPECT_NEAR(r->scores.mean_kl(), 0.0, 1e-9);
  EXPECT_EQ(r->scores.same_top(), 1.0);
  // Another model is measurably different.
  auto r2 =
      Evaluate(m, nullptr, Tiny(2), tokens, {.ctx = 100, .bos_id = -1, .max_rows = 32}, &pool);
  ASSERT_TRUE(r2.ok());
  EXPECT_GT(r2->scores.mean_kl(), 1e-3);
}

TEST(EvalTest, LogitsDoNotDependOnTheStepSize) {
  auto m = Tiny(1);
  auto tokens = RandomTokens(90, m->config().vocab_size, 5);
  ThreadPool pool(1);
  LogitsRunner a(m, 90, 90), b(m, 90, 7);
  std::vector<float> la, lb;
  ASSERT_TRUE(a.Run(tokens, 40, nullptr, &pool, &la).ok());
  ASSERT_TRUE(b.Run(tokens, 40, nullptr, &pool, &lb).ok());
  ASSERT_EQ(la.size(), lb.size());
  for (size_t i = 0; i < la.size(); ++i) ASSERT_NEAR(la[i], lb[i], 1e-4f * (1 + std::fabs(la[i])));
}

}  // namespace
}  // namespace chorus::eval
