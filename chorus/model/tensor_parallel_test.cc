// test-labels: unit concurrency
// Tensor-parallel sharding without MPI (docs/scaleout.md): the refusals of ShardConfig and
// ShardModel, and the sharded forward of two ranks run as two threads of this process over an
// in-process communicator, against the whole model — so the split and the step protocol are
// tested in every build; tests/tp runs the same comparison over real MPI.
#include "chorus/model/tensor_parallel.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstring>
#include <thread>

#include "chorus/memory/page_pool.h"
#include "chorus/model/step_builder.h"
#include "chorus/model/synthetic.h"

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

// Two ranks as two threads: each collective meets at a barrier, rank order fixed.
struct PairState {
  std::barrier<> sync{2};
  void* ptr[2] = {nullptr, nullptr};
};

class PairCommunicator final : public dist::Communicator {
 public:
  PairCommunicator(PairState* st, int rank) : st_(st), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return 2; }
  void AllReduceSum(float* data, int64_t n) override {
    st_->ptr[rank_] = data;
    st_->sync.arrive_and_wait();
    const auto* a = static_cast<const float*>(st_->ptr[0]);
    const auto* b = static_cast<const float*>(st_->ptr[1]);
    tmp_.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) tmp_[static_cast<size_t>(i)] = a[i] + b[i];
    st_->sync.arrive_and_wait();  // both have read both inputs
    std::memcpy(data, tmp_.data(), static_cast<size_t>(n) * sizeof(float));
    st_->sync.arrive_and_wait();
    stats_.all_reduces += 1;
  }
  void Broadcast(void* data, int64_t bytes, int root) override {
    st_->ptr[rank_] = data;
    st_->sync.arrive_and_wait();
    if (rank_ != root) std::memcpy(data, st_->ptr[root], static_cast<size_t>(bytes));
    st_->sync.arrive_and_wait();
    stats_.broadcasts += 1;
  }
  void Gather(const float*, int64_t, float*, int) override { ADD_FAILURE() << "unused"; }
  void Barrier() override { st_->sync.arrive_and_wait(); }
  const char* kind() const override { return "pair"; }

 private:
  PairState* st_;
  int rank_;
  std::vector<float> tmp_;
};

// Steps of prefill chunks and decode rows for 2 sequences through the whole model and through
// 2 shards (rank 1 on a thread running RunTpWorker); logits within `tolerance`, greedy tokens
// equal. f32 weights agree within 1e-4. With bf16 / q8_0 / q4_0 weights the activations are
// rounded to bf16 / int8 before each matmul, so the last-bit difference the split leaves in
// the residual stream (o and down summed in two halves) can move an activation across a rounding
// boundary, one quantum of change; the logits then differ by up to ~1e-2 (docs/scaleout.md).
void CheckShardedForward(const SyntheticSpec& spec, float tolerance) {
  auto full = MakeSyntheticModel(spec);
  ASSERT_TRUE(full.ok()) << full.status().ToString();
  auto s0 = ShardModel(*full, 0, 2), s1 = ShardModel(*full, 1, 2);
  ASSERT_TRUE(s0.ok()) << s0.status().ToString();
  ASSERT_TRUE(s1.ok()) << s1.status().ToString();
  PairState st;
  PairCommunicator c0(&st, 0), c1(&st, 1);
  Status worker_status;
  std::thread worker([&] { worker_status = RunTpWorker(&c1, *s1); });
  const ModelConfig& c = (*full)->config();
  constexpr int64_t kPages = 32, kRows = 16, kSeqs = 2;
  {
    TpLeader leader(&c0);
    leader.Start({.max_rows = kRows,
                  .max_seqs = kSeqs,
                  .max_logit_rows = kSeqs,
                  .n_pages = kPages,
                  .block_size = 16,
                  .kv_dtype = 0,
                  .threads = 1});
    const memory::KvLayout lr = KvLayoutFor(c), lt = KvLayoutFor((*s0)->config());
    memory::PagePool pr(kPages, lr.PageBytes()), pt(kPages, lt.PageBytes());
    memory::KvCache kr(lr, &pr), kt(lt, &pt);
    std::vector<std::vector<int32_t>> tr(2), tt(2);
    for (int s = 0; s < 2; ++s) {
      ASSERT_TRUE(kr.Reserve(&tr[static_cast<size_t>(s)], 40).ok());
      ASSERT_TRUE(kt.Reserve(&tt[static_cast<size_t>(s)], 40).ok());
    }
    Forward fr(*full, kRows, kSeqs), ft(*s0, kRows, kSeqs, &c0);
    ThreadPool pool(1);
    std::vector<std::vector<int32_t>> toks = {{1, 10, 20, 30, 40, 50, 60, 70, 80, 90, 11},
                                              {1, 7, 3}};
    std::vector<int64_t> done(2, 0);
    std::vector<float> lg_r(static_cast<size_t>(kSeqs * c.vocab_size)), lg_t(lg_r.size());
    StepBuilder br(kRows, kSeqs), bt(kRows, kSeqs);
    for (int step = 0; step < 8; ++step) {
      br.Clear();
      bt.Clear();
      for (int s = 0; s < 2; ++s) {
        auto& tk = toks[static_cast<size_t>(s)];
        const int64_t from = done[static_cast<size_t>(s)];
        // Sequence 0's prompt in chunks of 6 tokens: a chunk continuing over cached KV.
        const int64_t count = std::min<int64_t>(static_cast<int64_t>(tk.size()) - from, 6);
        const std::span<const int32_t> rows(tk.data() + from, static_cast<size_t>(count));
        br.AddSequence(rows, from, tr[static_cast<size_t>(s)].data(), true);
        bt.AddSequence(rows, from, tt[static_cast<size_t>(s)].data(), true);
        done[static_cast<size_t>(s)] += count;
      }
      fr.Run(br.Input(), &kr, &pool, lg_r.data());
      leader.Step(bt.Input(), kt);
      ft.Run(bt.Input(), &kt, &pool, lg_t.data());
      for (int s = 0; s < 2; ++s) {
        const float* a = lg_r.data() + s * c.vocab_size;
        const float* b = lg_t.data() + s * c.vocab_size;
        float worst = 0;
        for (int64_t v = 0; v < c.vocab_size; ++v) worst = std::max(worst, std::fabs(a[v] - b[v]));
        EXPECT_LE(worst, tolerance) << "step " << step << " sequence " << s;
        const auto ta = static_cast<int32_t>(std::max_element(a, a + c.vocab_size) - a);
        const auto tb = static_cast<int32_t>(std::max_element(b, b + c.vocab_size) - b);
        EXPECT_EQ(ta, tb) << "step " << step << " sequence " << s;
        auto& tk = toks[static_cast<size_t>(s)];
        if (done[static_cast<size_t>(s)] == static_cast<int64_t>(tk.size())) tk.push_back(ta);
      }
    }
  }  // the leader's destructor stops the worker
  worker.join();
  EXPECT_TRUE(worker_status.ok()) << worker_status.ToString();
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
