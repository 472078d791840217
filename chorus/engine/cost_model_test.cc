// CostModel without a model: the fit recovers known coefficients from synthetic steps, the
// JSON round-trips, and malformed files are refused naming the problem.
#include "chorus/engine/cost_model.h"

#include <gtest/gtest.h>

#include <cmath>

#include "chorus/base/rng.h"

namespace chorus::engine {
namespace {

std::vector<StepSample> Synthetic(const CostModel& truth, int n, double noise, uint64_t seed) {
  Rng rng(seed);
  std::vector<StepSample> out;
  for (int i = 0; i < n; ++i) {
    StepFeatures f;
    const int64_t prefill = static_cast<int64_t>(rng.NextU64() % 300);
    if (prefill > 0) f.AddChunk(static_cast<int64_t>(rng.NextU64() % 500), prefill, true, 16);
    const int64_t decode = 1 + static_cast<int64_t>(rng.NextU64() % 40);
    for (int64_t d = 0; d < decode; ++d)
      f.AddChunk(static_cast<int64_t>(rng.NextU64() % 1000), 1, false, d % 3 == 0 ? 0 : 32);
    f.adapters = static_cast<double>(rng.NextU64() % 9);
    f.sum_ranks = f.adapters * 8 * static_cast<double>(1 + rng.NextU64() % 8);
    f.deltas = static_cast<double>(rng.NextU64() % 3);
    const double e = 1 + noise * (2 * rng.NextFloat() - 1);
    out.push_back({.f = f, .seconds = truth.Predict(f) * e});
  }
  return out;
}

// The correction starts at the profile's clock, follows a lasting change within ~20 steps,
// shrugs off a single outlier, and stays within its bounds; bad samples are ignored.
TEST(CostCorrectionTest, FollowsTheMeasuredStepsWithinBounds) {
  CostCorrection c;
  EXPECT_EQ(c.factor(), 1.0);
  for (int i = 0; i < 30; ++i) c.Observe(0.010, 0.020);  // steps run 2× slower than predicted
  EXPECT_NEAR(c.factor(), 2.0, 2.0 * 0.05);              // 1 − 0.9³⁰ = 96 % of the way (log)
  EXPECT_EQ(c.steps(), 30);
  const double before = c.factor();
  c.Observe(0.010, 10.0);  // one step descheduled for 10 s: clamped to 8×, a tenth of the way
  EXPECT_LT(c.factor(), before * 1.25);
  for (int i = 0; i < 60; ++i) c.Observe(0.010, 0.005);  // then 2× faster
  EXPECT_NEAR(c.factor(), 0.5, 0.5 * 0.05);
  for (int i = 0; i < 200; ++i) c.Observe(0.001, 1.0);  // far slower than any bound
  EXPECT_EQ(c.factor(), CostCorrection::kMaxFactor);
  const int64_t n = c.steps();
  for (double bad : {0.0, -1.0, std::nan(""), static_cast<double>(INFINITY)}) {
    c.Observe(bad, 0.01);
    c.Observe(0.01, bad);
  }
  EXPECT_EQ(c.steps(), n);
  EXPECT_EQ(c.factor(), CostCorrection::kMaxFactor);
}

TEST(CostModelTest, FitRecoversKnownCoefficients) {
  for (auto kind : {CostModel::Kind::kLinear, CostModel::Kind::kExtended}) {
    std::vector<double> want = {2e-3, 4e-5, 3e-4, 1e-6, 5e-4, 2e-3, 2e-8};
    if (kind == CostModel::Kind::kExtended) {
      want.push_back(3e-7);
      want.push_back(1e-4);
      want.push_back(-1.8e-8);  // a prefill row's context costs a tenth of a decode row's
    }
    auto truth = CostModel::FromCoefficients(kind, want);
    ASSERT_TRUE(truth.ok());
    auto fit = CostModel::Fit(kind, Synthetic(*truth, 400, 0.0, 7));
    ASSERT_TRUE(fit.ok()) << fit.status().ToString();
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_NEAR(fit->coefficients()[i], want[i], 1e-6 * std::fabs(want[i]) + 1e-12)
          << CostModel::TermNames(kind)[i];
    // With ±5 % noise the held-out error stays near the noise.
    auto noisy = CostModel::Fit(kind, Synthetic(*truth, 400, 0.05, 8));
    ASSERT_TRUE(noisy.ok());
    const FitQuality q = noisy->Evaluate(Synthetic(*truth, 200, 0.05, 9));
    EXPECT_LT(q.median_ape, 0.05);
    EXPECT_GT(q.r2, 0.97);
  }
}

TEST(CostModelTest, TermsAbsentFromEverySampleGetZero) {
  auto truth =
      CostModel::FromCoefficients(CostModel::Kind::kLinear, {1e-3, 1e-5, 1e-4, 0, 0, 0, 1e-8});
  ASSERT_TRUE(truth.ok());
  std::vector<StepSample> s;
  for (int i = 1; i <= 30; ++i) {
    StepFeatures f;
    f.AddChunk(0, i * 7, true, 0);
    f.AddChunk(100 + i, 1, false, 0);
    s.push_back({.f = f, .seconds = truth->Predict(f)});
  }
  auto fit = CostModel::Fit(CostModel::Kind::kLinear, s);
  ASSERT_TRUE(fit.ok()) << fit.status().ToString();
  EXPECT_EQ(fit->coefficients()[3], 0);  // sum_ranks
  EXPECT_EQ(fit->coefficients()[5], 0);  // deltas
  EXPECT_LT(fit->Evaluate(s).median_ape, 1e-6);
}

TEST(CostModelTest, FitRefusesTooFewOrBadSamples) {
  EXPECT_FALSE(CostModel::Fit(CostModel::Kind::kLinear, {}).ok());
  std::vector<StepSample> s(20);
  for (auto& x : s) x.f.AddChunk(0, 4, true, 0);
  s[3].seconds = -1;
  EXPECT_FALSE(CostModel::Fit(CostModel::Kind::kLinear, s).ok());
  EXPECT_FALSE(CostModel::FromCoefficients(CostModel::Kind::kLinear, {1, 2}).ok());
  EXPECT_FALSE(CostModel::FromCoefficients(CostModel::Kind::kLinear, {1, 2, 3, 4, 5, 6, NAN}).ok());
}

TEST(CostModelTest, JsonRoundTripAndMalformedFiles) {
  CostModelFile f;
  f.models.push_back({.model = *CostModel::FromCoefficients(
                          CostModel::Kind::kLinear, {1e-3, 2e-5, 3e-4, 4e-6, 5e-4, 0, 7e-9}),
                      .heldout = {.r2 = 0.9, .median_ape = 0.05, .p90_ape = 0.1, .n = 40}});
  f.models.push_back({.model = *CostModel::FromCoefficients(CostModel::Kind::kExtended,
                                                            {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}),
                      .heldout = {}});
  f.use = 1;
  f.clock = "thread-cpu";
  auto back = CostModelFile::Parse(f.ToJson());
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ASSERT_EQ(back->models.size(), 2u);
  EXPECT_EQ(back->use, 1u);
  EXPECT_EQ(back->models[0].model.coefficients(), f.models[0].model.coefficients());
  EXPECT_EQ(back->models[0].heldout.median_ape, 0.05);
  EXPECT_EQ(back->clock, "thread-cpu");

  struct Bad {
    std::string text, says;
  };
  for (const Bad& b : std::vector<Bad>{
           {"not json", "not a JSON object"},
           {R"({"models":[]})", "format"},
           {R"({"format":"chorus-cost-model","models":[]})", "non-empty list"},
           {R"({"format":"chorus-cost-model","models":[{"kind":"cubic"}]})", "kind must be"},
           {R"({"format":"chorus-cost-model","models":[{"kind":"linear","seconds_per_term":{}}]})",
            "lacks the number \"1\""},
           {R"({"format":"chorus-cost-model","use":"extended","models":[{"kind":"linear",
              "seconds_per_term":{"1":0,"prefill_tokens":0,"decode_rows":0,"sum_ranks":0,
              "adapters":0,"deltas":0,"context_tokens":0}}]})",
            "does not hold"},
       }) {
    auto r = CostModelFile::Parse(b.text);
    ASSERT_FALSE(r.ok()) << b.text;
    EXPECT_NE(r.status().message().find(b.says), std::string::npos) << r.status().ToString();
  }
  EXPECT_FALSE(CostModelFile::Load("/nonexistent/cost.json").ok());
}

// An extended model written before the prefill-context term reads with that coefficient 0,
// i.e. it predicts what it always did; the term splits the context between row kinds.
TEST(CostModelTest, ExtendedFilesWithoutThePrefillContextTermStillLoad) {
  auto f = CostModelFile::Parse(R"({"format":"chorus-cost-model","use":"extended","models":[
      {"kind":"extended","seconds_per_term":{"1":0.001,"prefill_tokens":0,"decode_rows":0,
       "sum_ranks":0,"adapters":0,"deltas":0,"context_tokens":1e-6,"row_ranks":0,
       "min_rows_32":0}}]})");
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  ASSERT_EQ(f->best().coefficients().size(), 10u);
  EXPECT_EQ(f->best().coefficients().back(), 0);
  StepFeatures s;
  s.AddChunk(/*start=*/100, /*count=*/10, /*prefill=*/true, 0);
  s.AddChunk(/*start=*/500, /*count=*/1, /*prefill=*/false, 0);
  EXPECT_EQ(s.context_tokens, 10 * 100 + 55 + 501);
  EXPECT_EQ(s.prefill_context, 10 * 100 + 55);
  EXPECT_DOUBLE_EQ(f->best().Predict(s), 0.001 + 1e-6 * (1055 + 501));
}

}  // namespace
}  // namespace chorus::engine
