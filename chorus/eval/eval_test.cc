#include "chorus/eval/eval.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "chorus/kernels/matmul.h"
#include "chorus/kernels/ops.h"
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

// A slice of the layers computes what the same layers compute inside a whole pass: slices of
// one layer each compose to the whole stack bit for bit, and the final norm and output head on
// the stack's residual stream give the whole pass's logits bit for bit.
TEST(EvalTest, LayerSlicesComposeToTheWholePass) {
  auto m = Tiny(3);
  const auto& c = m->config();
  ASSERT_GE(c.n_layers, 2);
  const int64_t n = 37, d = c.n_embd;
  auto tokens = RandomTokens(n, c.vocab_size, 9);
  ThreadPool pool(2);
  LogitsRunner runner(m, n, 16);  // steps of 16 rows: slices cross step boundaries too
  std::vector<float> whole(static_cast<size_t>(n * d)), sliced(whole.size()), next(whole.size());
  ASSERT_TRUE(runner.RunLayers(tokens, 0, c.n_layers, nullptr, whole.data(), nullptr, &pool).ok());
  ASSERT_TRUE(runner.RunLayers(tokens, 0, 0, nullptr, sliced.data(), nullptr, &pool).ok());
  for (int64_t l = 0; l < c.n_layers; ++l) {
    ASSERT_TRUE(
        runner.RunLayers(tokens, l, l + 1, sliced.data(), next.data(), nullptr, &pool).ok());
    sliced.swap(next);
  }
  ASSERT_EQ(whole, sliced);

  std::vector<float> logits, normed(whole.size()), head(static_cast<size_t>(n * c.vocab_size));
  ASSERT_TRUE(runner.Run(tokens, 0, nullptr, &pool, &logits).ok());
  kernels::RmsNorm(whole.data(), static_cast<const float*>(m->weights().output_norm.data()), n, d,
                   c.norm_eps, normed.data());
  kernels::MatMul(m->weights().output, normed.data(), d, n, head.data(), c.vocab_size, false,
                  &pool);
  ASSERT_EQ(logits, head);

  // A slice after layer 0 needs its input; layers past the model are refused.
  EXPECT_EQ(runner.RunLayers(tokens, 1, 2, nullptr, next.data(), nullptr, &pool).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(
      runner.RunLayers(tokens, 0, c.n_layers + 1, nullptr, next.data(), nullptr, &pool).code(),
      StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace chorus::eval
