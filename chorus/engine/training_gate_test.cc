// IterationCost and AdmitCost: the costs of the next training iteration and of the step that
// admits the deferred requests, as the deferred policy assumes them (engine/training_gate.h).
// Deterministic: samples are fed directly, no clocks.
#include "chorus/engine/training_gate.h"

#include <gtest/gtest.h>

namespace chorus::engine {
namespace {

TEST(IterationCostTest, SteadyIterationsConvergeOnTheirTime) {
  IterationCost c;
  EXPECT_EQ(c.upper(), 0);
  c.Add(0.020);
  // Unsure after one sample: mean ± half of it.
  EXPECT_DOUBLE_EQ(c.mean(), 0.020);
  EXPECT_DOUBLE_EQ(c.upper(), 0.040);
  for (int i = 0; i < 40; ++i) c.Add(0.020);
  EXPECT_NEAR(c.mean(), 0.020, 1e-12);
  EXPECT_NEAR(c.upper(), 0.020, 1e-6);  // the deviation decays by 3/4 per sample
  EXPECT_EQ(c.count(), 41);
}

TEST(IterationCostTest, VaryingIterationsAreCoveredByTheUpperEstimate) {
  // Iterations alternating between 10 and 50 ms (packed micro-batches of very different
  // lengths): the mean sits near 30 ms, so a request granted slack for the mean would wait up to
  // 20 ms longer than assumed; the upper estimate covers the long ones.
  IterationCost c;
  for (int i = 0; i < 40; ++i) {
    c.Add(i % 2 ? 0.050 : 0.010);
    if (i >= 8) {
      EXPECT_LT(c.mean(), 0.045) << i;
      EXPECT_GE(c.upper(), 0.050) << i;
    }
  }
  // Spread evenly over [10, 50] ms: mean + 2 · deviation lands near the longest.
  IterationCost even;
  for (int i = 0; i < 200; ++i) even.Add(0.010 + 0.040 * ((i * 7) % 41) / 40.0);
  EXPECT_GT(even.upper(), 0.045);
  EXPECT_LT(even.upper(), 0.065);
}

TEST(IterationCostTest, OneSlowIterationRaisesTheCostAndThenDecays) {
  IterationCost c;
  for (int i = 0; i < 20; ++i) c.Add(0.020);
  c.Add(0.500);  // a checkpoint step
  EXPECT_GT(c.upper(), 0.3);
  for (int i = 0; i < 40; ++i) c.Add(0.020);
  EXPECT_LT(c.upper(), 0.021);
}

TEST(AdmitCostTest, ScalesWithTheWaitingPromptRows) {
  // A decode step of 13 ms and prefill at 2.5 ms per prompt row (TinyLlama-1.1B q4_0 on two
  // Zen 5 cores): admitting eight deferred 16-token prompts takes about 13 + 320 ms, far more
  // than the average prefill step of one request (53 ms) the policy assumed before.
  AdmitCost c;
  EXPECT_EQ(c.Estimate(100), 0);
  for (int i = 0; i < 30; ++i) c.Add(0.013, 0);
  for (int i = 0; i < 30; ++i) c.Add(0.013 + 0.0025 * 16, 16);
  EXPECT_NEAR(c.decode_step(), 0.013, 1e-9);
  EXPECT_NEAR(c.per_prompt_row(), 0.0025, 1e-9);
  EXPECT_NEAR(c.Estimate(0), 0.013, 1e-9);
  EXPECT_NEAR(c.Estimate(8 * 16), 0.013 + 0.32, 1e-6);
  // Mixed steps (decode rows of running sequences next to a prompt chunk) fit the same model.
  c.Add(0.013 + 0.0025 * 64, 64);
  EXPECT_NEAR(c.per_prompt_row(), 0.0025, 1e-9);
}

TEST(AdmitCostTest, PrefillBeforeAnyDecodeStepIsNotUnderestimated) {
  // The first steps of a server are prefill steps: with no decode step measured, the whole step
  // counts per row (an overestimate), and the estimate never falls to 0.
  AdmitCost c;
  c.Add(0.100, 20);
  EXPECT_NEAR(c.per_prompt_row(), 0.005, 1e-12);
  EXPECT_GE(c.Estimate(20), 0.100);
  EXPECT_GT(c.Estimate(0), 0);
  // A step faster than the decode average (noise) gives a per-row cost of 0, never negative.
  AdmitCost d;
  d.Add(0.020, 0);
  for (int i = 0; i < 20; ++i) d.Add(0.010, 4);
  EXPECT_GE(d.per_prompt_row(), 0);
  EXPECT_GE(d.Estimate(4), 0.020);
}

}  // namespace
}  // namespace chorus::engine
