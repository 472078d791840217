// test-labels: unit concurrency
// LoRA under tensor parallelism (adapters/lora/lora_tp.h, docs/scaleout.md): each rank's
// LoraHook over its shard of the adapters, the forward pass's two all-reduces completing the
// term, against the whole model with the whole adapters — ranks as threads of this process.
#include "chorus/adapters/lora/lora_tp.h"

#include <gtest/gtest.h>

#include "chorus/model/synthetic.h"
#include "chorus/model/tensor_parallel_testing.h"

namespace chorus::adapters {
namespace {

// Two adapters of ranks 8 and 16 on all seven linears; sequence 0 on the first, sequence 1 on
// the second (or the base, slot −1).
void CheckLoraUnderTp(const std::string& shape, int n, int32_t second_slot) {
  auto full = model::MakeSyntheticModel({.shape = shape, .dtype = DType::kF32, .seed = 4});
  ASSERT_TRUE(full.ok()) << full.status().ToString();
  const model::ModelConfig& c = (*full)->config();
  std::vector<LoraWeights> weights;
  for (int64_t r : {8, 16}) {
    RandomLoraSpec spec;
    spec.rank = r;
    spec.alpha = 2.0f * static_cast<float>(r);
    spec.b_std = 0.05f;
    spec.seed = 70 + static_cast<uint64_t>(r);
    weights.push_back(MakeRandomLora(c, spec));
  }
  auto table_for = [&](const model::ModelConfig& cfg, int rank,
                       int size) -> std::vector<std::shared_ptr<const LoraAdapter>> {
    std::vector<std::shared_ptr<const LoraAdapter>> t;
    for (size_t i = 0; i < weights.size(); ++i) {
      auto w = ShardLoraWeights(weights[i], c, rank, size);
      EXPECT_TRUE(w.ok()) << w.status().ToString();
      auto a = LoraAdapter::Build(*w, cfg, "lora" + std::to_string(i));
      EXPECT_TRUE(a.ok()) << a.status().ToString();
      t.push_back(*a);
    }
    return t;
  };
  std::vector<std::shared_ptr<const model::Model>> shards;
  std::vector<std::unique_ptr<LoraSlotHook>> hooks;
  LoraSlotHook ref(c, 16, table_for(c, 0, 1));
  for (int r = 0; r < n; ++r) {
    auto s = model::ShardModel(*full, r, n);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    shards.push_back(*s);
    hooks.push_back(
        std::make_unique<LoraSlotHook>((*s)->config(), 16, table_for((*s)->config(), r, n)));
  }
  model::testing::TpVariants v;
  v.ref = [&](std::span<const int32_t> s) { return ref.ForRows(s); };
  for (int r = 0; r < n; ++r) {
    LoraSlotHook* h = hooks[static_cast<size_t>(r)].get();
    v.ranks.push_back([h](std::span<const int32_t> s) { return h->ForRows(s); });
  }
  v.seq_slots = {0, second_slot};
  const auto cmp = model::testing::CompareVariantsUnderTp(*full, shards, v);
  EXPECT_LE(cmp.with.max_abs_diff, 1e-4f);
  EXPECT_EQ(cmp.with.token_mismatches, 0) << cmp.with.first_mismatch;
  EXPECT_GT(cmp.without_variants_max_abs_diff, 1e-2f)
      << "the adapters change nothing: the test would not see them";
}

TEST(LoraTensorParallelTest, TwoAdaptersTwoRanks) { CheckLoraUnderTp("tiny", 2, 1); }
TEST(LoraTensorParallelTest, AdapterBesideTheBase) { CheckLoraUnderTp("tiny", 2, -1); }
TEST(LoraTensorParallelTest, Qwen3TinyTwoRanks) { CheckLoraUnderTp("qwen3-tiny", 2, 1); }

TEST(LoraTensorParallelTest, ShardShapes) {
  auto c = model::SyntheticConfig("tiny");  // q_dim 128, kv_dim 64, n_ff 352
  ASSERT_TRUE(c.ok());
  RandomLoraSpec spec;
  spec.rank = 4;
  const LoraWeights w = MakeRandomLora(*c, spec);
  auto s = ShardLoraWeights(w, *c, 1, 2);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->at(0, model::Linear::kQ).a.shape(), (std::vector<int64_t>{4, 128}));  // A whole
  EXPECT_EQ(s->at(0, model::Linear::kQ).b.shape(), (std::vector<int64_t>{64, 4}));   // B half
  EXPECT_EQ(s->at(0, model::Linear::kO).a.shape(), (std::vector<int64_t>{4, 64}));   // A half
  EXPECT_EQ(s->at(0, model::Linear::kO).b.shape(), (std::vector<int64_t>{128, 4}));  // B whole
  EXPECT_EQ(s->at(0, model::Linear::kDown).a.shape(), (std::vector<int64_t>{4, 176}));
  // Rank 1's rows of B are the second half of the whole B.
  const auto whole = w.at(0, model::Linear::kGate).b.ToF32();
  const auto half = s->at(0, model::Linear::kGate).b.ToF32();
  ASSERT_EQ(half.size() * 2, whole.size());
  EXPECT_EQ(half.front(), whole[whole.size() / 2]);
}

}  // namespace
}  // namespace chorus::adapters
