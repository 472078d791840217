// Random deltas (delta_synthetic.h) are valid delta files and servable: every layout round-trips
// through the file format's full validation and builds kernel views for its model.
#include "chorus/adapters/delta/delta_synthetic.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>

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

// Serving's Build(Delta) moves the matrices into one huge-page buffer: the views must hold the
// same bytes as Build(shared_ptr)'s (which point into the Delta), the Delta's copies are freed,
// and the accounting is unchanged.
TEST(DeltaSyntheticTest, ServingBuildMovesTheMatricesIntoOneBufferWithTheSameBytes) {
  auto base = model::MakeSyntheticModel({.shape = "tiny", .dtype = DType::kF32, .seed = 3});
  ASSERT_TRUE(base.ok());
  const model::ModelConfig& c = (*base)->config();
  for (const RandomDeltaSpec spec :
       {RandomDeltaSpec{.bits = 2, .sparse24 = true, .group_size = 64},
        RandomDeltaSpec{.bits = 1, .sparse24 = false, .group_size = 0},
        RandomDeltaSpec{.bits = 4, .sparse24 = false, .group_size = 32}}) {
    const Delta d = MakeRandomDelta(c, spec);
    auto kept = DeltaWeights::Build(std::make_shared<const Delta>(d), c, "kept");
    auto moved = DeltaWeights::Build(Delta(d), c, "moved");
    ASSERT_TRUE(kept.ok() && moved.ok());
    const DeltaWeights& a = **kept;
    const DeltaWeights& b = **moved;
    EXPECT_FALSE(a.streamed_buffer());
    EXPECT_TRUE(b.streamed_buffer());
    EXPECT_EQ(DeltaWeightsBytes(a), DeltaWeightsBytes(b));
    EXPECT_EQ(a.positions_bytes(), b.positions_bytes());
    for (const MatrixDelta& m : b.delta().matrices) {
      EXPECT_TRUE(m.packed.codes.empty() && m.packed.mask.empty() && m.packed.scales.empty())
          << m.name;
    }
    for (int64_t l = 0; l < c.n_layers; ++l) {
      for (int li = 0; li < model::kNumLinears; ++li) {
        const auto which = static_cast<model::Linear>(li);
        const kernels::DeltaMatrixView& x = a.at(l, which);
        const kernels::DeltaMatrixView& y = b.at(l, which);
        ASSERT_EQ(x.rows, y.rows);
        ASSERT_EQ(x.cols, y.cols);
        EXPECT_EQ(reinterpret_cast<uintptr_t>(y.codes) % 64, 0u);
        EXPECT_EQ(std::memcmp(x.codes, y.codes, static_cast<size_t>(x.rows * x.code_row_bytes())),
                  0);
        EXPECT_EQ(std::memcmp(x.scales, y.scales, static_cast<size_t>(x.n_scales() * 4)), 0);
        ASSERT_EQ(x.mask == nullptr, y.mask == nullptr);
        if (x.mask != nullptr) {
          EXPECT_EQ(std::memcmp(x.mask, y.mask, static_cast<size_t>(x.rows * x.mask_row_bytes())),
                    0);
        }
        ASSERT_EQ(x.positions == nullptr, y.positions == nullptr);
        if (x.positions != nullptr) {
          EXPECT_EQ(std::memcmp(x.positions, y.positions,
                                static_cast<size_t>(x.rows * x.position_row_words() * 8)),
                    0);
        }
      }
    }
  }
}

}  // namespace
}  // namespace chorus::delta
