// test-labels: unit concurrency
// Tensor-parallel sharding without MPI (docs/scaleout.md): the refusals of ShardConfig and
// ShardModel, and the sharded forward of two ranks run as two threads of this process over an
// in-process communicator, against the whole model — so the split and the step protocol are
// tested in every build; tests/tp runs the same comparison over real MPI.
#include "chorus/model/tensor_parallel.h"

#include <gtest/gtest.h>

#include "chorus/model/synthetic.h"
#include "chorus/model/tensor_parallel_testing.h"

namespace chorus::model {
namespace {

TEST(ShardConfigTest, SplitsHeadsKvHeadsAndMlp) {
  auto c = SyntheticConfig("tinyllama-1.1b");
  ASSERT_TRUE(c.ok());
  auto s = ShardConfig(*c, 2);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->n_heads, 16);
  EXPECT_EQ(s->n_kv_heads, 2);
  EXPECT_EQ(s->n_ff, 2816);
  EXPECT_EQ(s->n_embd, c->n_embd);
  EXPECT_EQ(s->head_dim, c->head_dim);
}

TEST(ShardConfigTest, RefusesFewerKvHeadsThanRanks) {
  auto c = SyntheticConfig("tinyllama-1.1b");  // 4 KV heads
  ASSERT_TRUE(c.ok());
  auto s = ShardConfig(*c, 8);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("4 KV heads are fewer than the ranks"), std::string::npos)
      << s.status().ToString();
  auto t = ShardConfig(*c, 3);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("do not divide evenly"), std::string::npos);
}

TEST(ShardModelTest, RefusesAColumnSplitInsideAQuantBlock) {
  // tiny: n_ff 352, so down's columns split at 176 — inside a q8_0 block of 32.
  auto full = MakeSyntheticModel({.shape = "tiny", .dtype = DType::kQ8_0});
  ASSERT_TRUE(full.ok());
  auto s = ShardModel(*full, 0, 2);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("blocks of 32"), std::string::npos) << s.status().ToString();
  EXPECT_NE(s.status().message().find("down_proj"), std::string::npos) << s.status().ToString();
}

// Steps of prefill chunks and decode rows for 2 sequences through the whole model and through
// `n` shards (ranks 1 … n − 1 on threads running RunTpWorker); logits within `tolerance`, greedy
// tokens equal. f32 weights agree within 1e-4. With bf16 / q8_0 / q4_0 weights the activations
// are rounded to bf16 / int8 before each matmul, so the last-bit difference the split leaves in
// the residual stream (o and down summed in parts) can move an activation across a rounding
// boundary, one quantum of change; the logits then differ by up to ~1e-2 (docs/scaleout.md).
void CheckShardedForward(const SyntheticSpec& spec, float tolerance, int n = 2) {
  auto full = MakeSyntheticModel(spec);
  ASSERT_TRUE(full.ok()) << full.status().ToString();
  std::vector<std::shared_ptr<const Model>> shards;
  for (int r = 0; r < n; ++r) {
    auto s = ShardModel(*full, r, n);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    shards.push_back(*s);
  }
  const testing::TpComparison cmp = testing::CompareTensorParallel(*full, shards);
  EXPECT_LE(cmp.max_abs_diff, tolerance);
  EXPECT_EQ(cmp.token_mismatches, 0) << cmp.first_mismatch;
}

TEST(ShardedForwardTest, TinyF32MatchesTheWholeModel) {
  CheckShardedForward({.shape = "tiny", .dtype = DType::kF32, .seed = 5}, 1e-4f);
}

// One layer at the TinyLlama shape: q8_0 and q4_0 column splits on block boundaries (1024 and
// 2816 columns per rank).
TEST(ShardedForwardTest, TinyLlamaShapeQ8_0MatchesTheWholeModel) {
  CheckShardedForward({.shape = "tinyllama-1.1b", .dtype = DType::kQ8_0, .seed = 3, .n_layers = 2},
                      5e-2f);
}

TEST(ShardedForwardTest, TinyLlamaShapeQ4_0MatchesTheWholeModel) {
  CheckShardedForward({.shape = "tinyllama-1.1b", .dtype = DType::kQ4_0, .seed = 5, .n_layers = 1},
                      5e-2f);
}

// The TinyLlama shape's 4 KV heads over 4 ranks, one each (8 query heads, 1408 MLP rows).
TEST(ShardedForwardTest, FourRanksOneKvHeadEach) {
  CheckShardedForward({.shape = "tinyllama-1.1b", .dtype = DType::kF32, .seed = 5, .n_layers = 1},
                      1e-4f, 4);
}

// The families' switches under the split: qk-norm (Qwen3), sandwich norms after the all-reduce,
// soft-capping and sliding windows (Gemma 2), Phi-3's fused projections split at load.
TEST(ShardedForwardTest, FamilyTestShapes) {
  for (const char* shape : {"qwen3-tiny", "gemma2-tiny", "phi3-tiny"}) {
    SCOPED_TRACE(shape);
    CheckShardedForward({.shape = shape, .dtype = DType::kF32, .seed = 5}, 1e-4f);
  }
}

}  // namespace
}  // namespace chorus::model
