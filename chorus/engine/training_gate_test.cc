// IterationCost: the cost of the next training iteration the deferred policy assumes
// (engine/training_gate.h). Deterministic: samples are fed directly, no clocks.
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

}  // namespace
}  // namespace chorus::engine
