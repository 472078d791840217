// Random deltas (delta_synthetic.h) are valid delta files and servable: every layout round-trips
// through the file format's full validation and builds kernel views for its model.
#include "chorus/adapters/delta/delta_synthetic.h"

#include <gtest/gtest.h>

#include "chorus/adapters/delta/delta_hook.h"
#include "chorus/model/synthetic.h"

namespace chorus::delta {
namespace {

TEST(DeltaSyntheticTest, EveryLayoutIsAValidServableDelta) {
  auto base = model::MakeSyntheticModel({.shape = "tiny", .dtype = DType::kF32, .seed = 3});
  ASSERT_TRUE(base.ok());
  const model::ModelConfig& c = (*base)->config();
  for (const RandomDeltaSpec spec :
       {RandomDeltaSpec{.bits = 4, .sparse24 = true, .group_size = 64},
        RandomDeltaSpec{.bits = 3, .sparse24 = true, .group_size = 32},
        RandomDeltaSpec{.bits = 2, .sparse24 = false, .group_size = 16},
        RandomDeltaSpec{.bits = 1, .sparse24 = false, .group_size = 0}}) {
    Delta d = MakeRandomDelta(c, spec);
    EXPECT_EQ(d.matrices.size(), static_cast<size_t>(c.n_layers * model::kNumLinears));
    d.base_hash = BaseWeightsHash(**base);
    auto bytes = SerializeDelta(d);
    ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
    auto back = ParseDelta("random", *std::move(bytes));
    ASSERT_TRUE(back.ok()) << spec.bits << ": " << back.status().ToString();
    auto w = DeltaWeights::Build(std::make_shared<const Delta>(*std::move(back)), c, "random");
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    EXPECT_EQ(w->get()->at(0, model::Linear::kDown).cols, c.n_ff);
  }
}

}  // namespace
}  // namespace chorus::delta
