// test-labels: unit concurrency
// LoRA under tensor parallelism (adapters/lora/lora_tp.h, docs/scaleout.md): S-LoRA §6's split —
// each rank's LoraHook over its part of the adapters, with the all-gather / all-reduce of the
// shrinks and the forward pass's two all-reduces completing the term — against the whole model
// with the whole adapters; ranks as threads of this process.
#include "chorus/adapters/lora/lora_tp.h"

#include <gtest/gtest.h>

#include "chorus/dist/thread_communicator.h"
#include "chorus/model/synthetic.h"
#include "chorus/model/tensor_parallel.h"
#include "chorus/model/tensor_parallel_testing.h"

namespace chorus::adapters {
namespace {

using model::Linear;

struct TpCase {
  std::string shape = "tiny";
  int64_t n_layers = 0;  // 0: the shape's
  int ranks = 2;
  std::vector<int64_t> lora_ranks = {8, 16};
  int32_t second_slot = 1;  // sequence 1's adapter (−1: the base)
  LoraStorage storage = LoraStorage::kF32;
  DType a_dtype = DType::kF32;  // lora_A's dtype in the weights (a GGUF adapter may quantize it)
};

// Adapters of the listed ranks on all seven linears; sequence 0 on the first, sequence 1 on
// `second_slot`.
void CheckLoraUnderTp(const TpCase& tc) {
  auto full = model::MakeSyntheticModel(
      {.shape = tc.shape, .dtype = DType::kF32, .seed = 4, .n_layers = tc.n_layers});
  ASSERT_TRUE(full.ok()) << full.status().ToString();
  const model::ModelConfig& c = (*full)->config();
  std::vector<LoraWeights> weights;
  for (int64_t r : tc.lora_ranks) {
    RandomLoraSpec spec;
    spec.rank = r;
    spec.alpha = 2.0f * static_cast<float>(r);
    spec.b_std = 0.05f;
    spec.seed = 70 + static_cast<uint64_t>(r);
    LoraWeights w = MakeRandomLora(c, spec);
    if (tc.a_dtype != DType::kF32) {
      for (LoraModuleWeights& m : w.modules) {
        if (m.present()) m.a = Tensor::FromF32(m.a.ToF32(), tc.a_dtype, m.a.shape());
      }
    }
    weights.push_back(std::move(w));
  }
  const LoraLimits limits{.storage = tc.storage};
  auto table_for = [&](int rank, int size) {
    std::vector<std::shared_ptr<const LoraAdapter>> t;
    for (size_t i = 0; i < weights.size(); ++i) {
      auto a =
          LoraAdapter::BuildShard(weights[i], c, rank, size, "lora" + std::to_string(i), limits);
      EXPECT_TRUE(a.ok()) << a.status().ToString();
      t.push_back(*a);
    }
    return t;
  };
  std::vector<std::shared_ptr<const model::Model>> shards;
  LoraSlotHook ref(c, 16, nullptr, table_for(0, 1));
  for (int r = 0; r < tc.ranks; ++r) {
    auto s = model::ShardModel(*full, r, tc.ranks);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    shards.push_back(*s);
  }
  model::testing::TpVariants v;
  v.ref = [&](std::span<const int32_t> s) { return ref.ForRows(s); };
  for (int r = 0; r < tc.ranks; ++r) {
    const model::ModelConfig sc = shards[static_cast<size_t>(r)]->config();
    auto table = table_for(r, tc.ranks);
    v.ranks.push_back([sc, table](dist::Communicator* comm) -> model::TpHookForRows {
      auto h = std::make_shared<LoraSlotHook>(sc, 16, comm, table);
      return [h](std::span<const int32_t> s) { return h->ForRows(s); };
    });
  }
  v.seq_slots = {0, tc.second_slot};
  const auto cmp = model::testing::CompareVariantsUnderTp(*full, shards, v);
  EXPECT_LE(cmp.with.max_abs_diff, 1e-4f);
  EXPECT_EQ(cmp.with.token_mismatches, 0) << cmp.with.first_mismatch;
  EXPECT_GT(cmp.without_variants_max_abs_diff, 1e-2f)
      << "the adapters change nothing: the test would not see them";
}

TEST(LoraTensorParallelTest, TwoAdaptersTwoRanks) { CheckLoraUnderTp({}); }
TEST(LoraTensorParallelTest, AdapterBesideTheBase) { CheckLoraUnderTp({.second_slot = -1}); }
TEST(LoraTensorParallelTest, Qwen3TinyTwoRanks) { CheckLoraUnderTp({.shape = "qwen3-tiny"}); }
TEST(LoraTensorParallelTest, Bf16Storage) { CheckLoraUnderTp({.storage = LoraStorage::kBF16}); }

// Ranks that four ranks do not divide: rank 5 splits 1/1/1/2, rank 2 leaves two ranks without
// a row of A for q/k/v/gate/up (they still expand with all of B's columns).
TEST(LoraTensorParallelTest, FourRanksUnevenChunks) {
  CheckLoraUnderTp({.shape = "tinyllama-1.1b", .n_layers = 1, .ranks = 4, .lora_ranks = {5, 2}});
}

// A q8_0 lora_A (as a GGUF adapter may store it): down's 176-column halves split inside a block
// of 32, which is fine because A is decoded before it is sliced.
TEST(LoraTensorParallelTest, QuantizedASplitsInsideABlock) {
  CheckLoraUnderTp({.a_dtype = DType::kQ8_0});
}

TEST(LoraTensorParallelTest, ShardHoldsItsPartOfEveryMatrix) {
  auto c = model::SyntheticConfig("tiny");  // d 128, q_dim 128, kv_dim 64, n_ff 352
  ASSERT_TRUE(c.ok());
  RandomLoraSpec spec;
  spec.rank = 4;
  const LoraWeights w = MakeRandomLora(*c, spec);
  auto whole = LoraAdapter::Build(w, *c, "whole");
  auto part = LoraAdapter::BuildShard(w, *c, 1, 2, "part");
  ASSERT_TRUE(whole.ok() && part.ok()) << part.status().ToString();
  EXPECT_EQ((*part)->tp_rank(), 1);
  EXPECT_EQ((*part)->tp_size(), 2);
  EXPECT_EQ((*part)->memory_bytes() * 2, (*whole)->memory_bytes()) << "1/N of every matrix";
  EXPECT_EQ((*part)->max_rank(), 4);
  EXPECT_EQ((*part)->max_fused_rank(), 12) << "the whole q|k|v shrink, as gathered";

  const LoraView::Module& q = (*part)->module(0, Linear::kQ);
  const LoraView::Module& wq = (*whole)->module(0, Linear::kQ);
  EXPECT_EQ(q.rank, 4);
  EXPECT_EQ(q.a_rank, 2);
  EXPECT_EQ(q.a_first, 2);
  EXPECT_EQ(q.in, 128);
  EXPECT_EQ(q.out, 64);
  EXPECT_EQ(q.fused_col, 0);
  EXPECT_EQ((*part)->module(0, Linear::kV).fused_col, 8) << "columns of the whole shrink";
  EXPECT_EQ((*part)->fused(0, model::LinearGroup::kQkv).rank, 6) << "rows held: 2 + 2 + 2";
  // Rank 1's first A row of q is the whole adapter's third; its Bᵀ rows are the second halves.
  EXPECT_EQ(std::vector<float>(q.a_rows[0], q.a_rows[0] + 128),
            std::vector<float>(wq.a_rows[2], wq.a_rows[2] + 128));
  EXPECT_EQ(std::vector<float>(q.bt_rows[3], q.bt_rows[3] + 64),
            std::vector<float>(wq.bt_rows[3] + 64, wq.bt_rows[3] + 128));

  const LoraView::Module& down = (*part)->module(0, Linear::kDown);
  const LoraView::Module& wdown = (*whole)->module(0, Linear::kDown);
  EXPECT_EQ(down.a_rank, 4);
  EXPECT_EQ(down.in, 176);
  EXPECT_EQ(down.out, 64);
  EXPECT_EQ(down.out_first, 64);
  EXPECT_EQ(std::vector<float>(down.a_rows[1], down.a_rows[1] + 176),
            std::vector<float>(wdown.a_rows[1] + 176, wdown.a_rows[1] + 352));
  EXPECT_EQ(std::vector<float>(down.bt_rows[2], down.bt_rows[2] + 64),
            std::vector<float>(wdown.bt_rows[2] + 64, wdown.bt_rows[2] + 128));
  EXPECT_FLOAT_EQ(down.scale, wdown.scale) << "s = alpha / r of the whole rank";
}

TEST(LoraTensorParallelTest, HookRefusesAnotherRanksPart) {
  auto c = model::SyntheticConfig("tiny");
  ASSERT_TRUE(c.ok());
  auto sc = model::ShardConfig(*c, 2);
  ASSERT_TRUE(sc.ok());
  const LoraWeights w = MakeRandomLora(*c, {});
  auto part1 = LoraAdapter::BuildShard(w, *c, 1, 2, "sql");
  auto whole = LoraAdapter::Build(w, *c, "sql");
  ASSERT_TRUE(part1.ok() && whole.ok());
  auto comms = dist::MakeThreadCommunicators(2);
  LoraHook rank0(*sc, 4, comms[0].get());
  const LoraAdapter* rows[] = {part1->get()};
  Status s = rank0.SetRows(rows);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("part 1 of 2"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("needs part 0 of 2"), std::string::npos) << s.message();
  const LoraAdapter* whole_rows[] = {whole->get()};
  EXPECT_FALSE(rank0.SetRows(whole_rows).ok()) << "a whole adapter on a rank of two";
  LoraHook one_process(*c, 4);
  EXPECT_FALSE(one_process.SetRows(rows).ok()) << "a part without the other ranks";
  EXPECT_TRUE(one_process.SetRows(whole_rows).ok());
}

}  // namespace
}  // namespace chorus::adapters
