// test-labels: unit concurrency
// Deltas under tensor parallelism (adapters/delta/delta_tp.h, docs/scaleout.md): each shard
// decodes to exactly its slice of the whole delta, boundaries inside a group are refused, and
// each rank's DeltaHook over its shard, completed by the forward pass's all-reduces, gives the
// logits of the whole model with the whole delta — ranks as threads of this process.
#include "chorus/adapters/delta/delta_tp.h"

#include <gtest/gtest.h>

#include "chorus/adapters/delta/delta_synthetic.h"
#include "chorus/model/synthetic.h"
#include "chorus/model/tensor_parallel_testing.h"

namespace chorus::delta {
namespace {

std::vector<float> Decoded(const MatrixDelta& m) {
  auto u = Unpack(m.packed, m.name);
  EXPECT_TRUE(u.ok()) << u.status().ToString();
  return u->Decode();
}

void CheckSlices(const RandomDeltaSpec& spec) {
  auto c = model::SyntheticConfig("tiny");  // q 128 x 128, k/v 64 x 128, o 128 x 128, n_ff 352
  ASSERT_TRUE(c.ok());
  const Delta whole = MakeRandomDelta(*c, spec);
  for (int rank = 0; rank < 2; ++rank) {
    auto shard = ShardDelta(whole, *c, rank, 2);
    ASSERT_TRUE(shard.ok()) << shard.status().ToString();
    ASSERT_EQ(shard->matrices.size(), whole.matrices.size());
    for (size_t i = 0; i < whole.matrices.size(); ++i) {
      const MatrixDelta& w = whole.matrices[i];
      const MatrixDelta& s = shard->matrices[i];
      const std::vector<float> wd = Decoded(w), sd = Decoded(s);
      const int64_t rows = w.packed.layout.rows, cols = w.packed.layout.cols;
      const int64_t srows = s.packed.layout.rows, scols = s.packed.layout.cols;
      const bool by_columns = w.name.find("o_proj") != std::string::npos ||
                              w.name.find("down_proj") != std::string::npos;
      if (by_columns) {
        ASSERT_EQ(srows, rows);
        ASSERT_EQ(scols * 2, cols) << w.name;
      } else {
        ASSERT_EQ(scols, cols);
        ASSERT_EQ(srows * 2, rows) << w.name;
      }
      for (int64_t r = 0; r < srows; ++r) {
        for (int64_t k = 0; k < scols; ++k) {
          const int64_t wr = by_columns ? r : rank * srows + r;
          const int64_t wc = by_columns ? rank * scols + k : k;
          ASSERT_EQ(sd[static_cast<size_t>(r * scols + k)], wd[static_cast<size_t>(wr * cols + wc)])
              << w.name << " rank " << rank << " (" << r << ", " << k << ")";
        }
      }
    }
  }
}

TEST(DeltaTensorParallelTest, ShardsDecodeToTheirSlicesExactly) {
  CheckSlices({.bits = 4, .sparse24 = true, .group_size = 16, .seed = 3});  // 2:4, scale groups
  CheckSlices({.bits = 2, .sparse24 = false, .group_size = 16, .seed = 4});
  CheckSlices({.bits = 1, .sparse24 = false, .group_size = 0, .seed = 5});  // BitDelta: anywhere
}

TEST(DeltaTensorParallelTest, ABoundaryInsideAGroupIsRefused) {
  auto c = model::SyntheticConfig("tiny");
  ASSERT_TRUE(c.ok());
  // down's 352 inputs split at 176: not on a scale group of 64.
  auto s = ShardDelta(MakeRandomDelta(*c, {.group_size = 64}), *c, 1, 2);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("down_proj.weight cannot be split for tensor parallelism"),
            std::string::npos)
      << s.status().message();
  EXPECT_NE(s.status().message().find("--group-size"), std::string::npos);
}

// A hook over a table of deltas by slot (-1 = base), as the worker ranks keep them.
class DeltaSlots {
 public:
  DeltaSlots(std::vector<std::shared_ptr<const DeltaWeights>> table)
      : table_(std::move(table)), hook_(16) {}
  Result<const model::LinearHook*> ForRows(std::span<const int32_t> slots) {
    rows_.clear();
    for (int32_t s : slots) rows_.push_back(s < 0 ? nullptr : table_[static_cast<size_t>(s)].get());
    CHORUS_RETURN_IF_ERROR(hook_.SetRows(rows_));
    return static_cast<const model::LinearHook*>(&hook_);
  }

 private:
  std::vector<std::shared_ptr<const DeltaWeights>> table_;
  DeltaHook hook_;
  std::vector<const DeltaView*> rows_;
};

TEST(DeltaTensorParallelTest, TwoRanksGiveTheWholeModelsLogits) {
  auto full = model::MakeSyntheticModel({.shape = "tiny", .dtype = DType::kF32, .seed = 4});
  ASSERT_TRUE(full.ok()) << full.status().ToString();
  const model::ModelConfig& c = (*full)->config();
  // Large enough to change the logits well beyond the 1e-4 the comparison allows.
  const Delta d = MakeRandomDelta(
      c, {.bits = 4, .sparse24 = true, .group_size = 16, .scale = 2e-2f, .seed = 9});
  auto whole = DeltaWeights::Build(std::make_shared<const Delta>(d), c, "d");
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  DeltaSlots ref({*whole});
  std::vector<std::shared_ptr<const model::Model>> shards;
  std::vector<std::unique_ptr<DeltaSlots>> hooks;
  for (int r = 0; r < 2; ++r) {
    auto s = model::ShardModel(*full, r, 2);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    shards.push_back(*s);
    auto sd = ShardDelta(d, c, r, 2);
    ASSERT_TRUE(sd.ok()) << sd.status().ToString();
    auto w =
        DeltaWeights::Build(std::make_shared<const Delta>(std::move(*sd)), (*s)->config(), "d");
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    hooks.push_back(
        std::make_unique<DeltaSlots>(std::vector<std::shared_ptr<const DeltaWeights>>{*w}));
  }
  model::testing::TpVariants v;
  v.ref = [&](std::span<const int32_t> s) { return ref.ForRows(s); };
  for (int r = 0; r < 2; ++r) {
    DeltaSlots* h = hooks[static_cast<size_t>(r)].get();
    v.ranks.push_back([h](dist::Communicator*) -> model::TpHookForRows {
      return [h](std::span<const int32_t> s) { return h->ForRows(s); };
    });
  }
  v.seq_slots = {0, -1};  // the delta beside the base
  const auto cmp = model::testing::CompareVariantsUnderTp(*full, shards, v);
  EXPECT_LE(cmp.with.max_abs_diff, 1e-4f);
  EXPECT_EQ(cmp.with.token_mismatches, 0) << cmp.with.first_mismatch;
  EXPECT_GT(cmp.without_variants_max_abs_diff, 1e-2f)
      << "the delta change nothing: the test would not see them";
}

}  // namespace
}  // namespace chorus::delta
