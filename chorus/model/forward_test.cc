// test-labels: unit
// Batch invariance of the forward pass over long contexts (docs/architecture.md, "Attention"):
// a row's logits do not depend on how its prompt was chunked, on the other rows of its step, or
// on whether its attention was split across threads (split-K) — bit for bit.
#include "chorus/model/forward.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "chorus/model/step_builder.h"
#include "chorus/model/synthetic.h"

namespace chorus::model {
namespace {

constexpr int64_t kPrompt = 1000;  // two attention segments of 512 keys
constexpr int kDecodeSteps = 4;

std::vector<int32_t> Prompt(int s, int64_t n) {
  std::vector<int32_t> p;
  for (int64_t j = 0; j < n; ++j) p.push_back(static_cast<int32_t>(1 + (s * 131 + j * 17) % 500));
  return p;
}

// Prefills sequence `target` (plus `others` companion sequences, prefilled alone first) in
// chunks of `chunk` tokens, then decodes kDecodeSteps greedy steps with all sequences in each
// step. Returns the logits of `target`'s last prompt row and of each of its decode rows.
std::vector<float> RunSequences(const std::shared_ptr<const Model>& m, int64_t chunk, int others,
                                int threads, kernels::KvDtype kv_dtype = kernels::KvDtype::kF32) {
  const ModelConfig& c = m->config();
  memory::KvLayout layout{.n_layers = c.n_layers,
                          .n_kv_heads = c.n_kv_heads,
                          .head_dim = c.head_dim,
                          .block_size = 16,
                          .dtype = kv_dtype};
  ThreadPool pool(threads);
  const int n_seqs = others + 1;
  Forward fwd(m, kPrompt, n_seqs);
  StepBuilder b(kPrompt, n_seqs);
  memory::PagePool pages(n_seqs * ((kPrompt + kDecodeSteps) / 16 + 2), layout.PageBytes());
  memory::KvCache kv(layout, &pages);
  std::vector<std::vector<int32_t>> tables(static_cast<size_t>(n_seqs));
  for (auto& t : tables) EXPECT_TRUE(kv.Reserve(&t, kPrompt + kDecodeSteps).ok());
  std::vector<float> logits(static_cast<size_t>(n_seqs * c.vocab_size)), out;
  for (int s = 1; s < n_seqs; ++s) {  // companions: other prompts, other lengths
    const std::vector<int32_t> p = Prompt(s, kPrompt - 40 * s);
    b.Clear();
    b.AddSequence(p, 0, tables[static_cast<size_t>(s)].data(), false);
    fwd.Run(b.Input(), &kv, &pool, logits.data());
  }
  const std::vector<int32_t> p = Prompt(0, kPrompt);
  for (int64_t pos = 0; pos < kPrompt; pos += chunk) {
    const int64_t n = std::min(chunk, kPrompt - pos);
    b.Clear();
    b.AddSequence(
        std::span<const int32_t>(p).subspan(static_cast<size_t>(pos), static_cast<size_t>(n)), pos,
        tables[0].data(), pos + n == kPrompt);
    fwd.Run(b.Input(), &kv, &pool, logits.data());
  }
  out.insert(out.end(), logits.begin(), logits.begin() + c.vocab_size);
  std::vector<int32_t> next(static_cast<size_t>(n_seqs), 7);
  for (int step = 0; step < kDecodeSteps; ++step) {
    next[0] = static_cast<int32_t>(std::max_element(logits.begin(), logits.begin() + c.vocab_size) -
                                   logits.begin());
    b.Clear();
    for (int s = 0; s < n_seqs; ++s) {
      const int64_t len = s == 0 ? kPrompt : kPrompt - 40 * s;
      b.AddSequence(std::span<const int32_t>(&next[static_cast<size_t>(s)], 1), len + step,
                    tables[static_cast<size_t>(s)].data(), true);
    }
    fwd.Run(b.Input(), &kv, &pool, logits.data());
    out.insert(out.end(), logits.begin(), logits.begin() + c.vocab_size);
  }
  return out;
}

TEST(ForwardTest, LongContextRowIsTheSameWhateverTheChunkingBatchAndSplit) {
  auto mr = MakeSyntheticModel({.shape = "tiny", .dtype = DType::kF32, .seed = 3});
  ASSERT_TRUE(mr.ok()) << mr.status().ToString();
  std::shared_ptr<const Model> m = *mr;
  // Alone with 2 threads: decode rows are split across the threads (split-K).
  const std::vector<float> want = RunSequences(m, kPrompt, 0, 2);
  struct Case {
    int64_t chunk;
    int others, threads;
  };
  for (const Case& k : {Case{100, 0, 2}, Case{37, 0, 2}, Case{1000, 7, 2}, Case{45, 7, 1},
                        Case{512, 3, 2}, Case{kPrompt, 0, 1}}) {
    const std::vector<float> got = RunSequences(m, k.chunk, k.others, k.threads);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0)
        << "chunk " << k.chunk << " others " << k.others << " threads " << k.threads;
  }
}

// The same with a bf16 KV cache: values are rounded when written, and every property above
// holds within the dtype. (Its logits differ from the f32 cache's, by the rounding.)
TEST(ForwardTest, LongContextRowIsTheSameWhateverTheChunkingBatchAndSplitWithBf16Kv) {
  auto mr = MakeSyntheticModel({.shape = "tiny", .dtype = DType::kF32, .seed = 3});
  ASSERT_TRUE(mr.ok()) << mr.status().ToString();
  std::shared_ptr<const Model> m = *mr;
  const kernels::KvDtype bf16 = kernels::KvDtype::kBf16;
  const std::vector<float> want = RunSequences(m, kPrompt, 0, 2, bf16);
  struct Case {
    int64_t chunk;
    int others, threads;
  };
  for (const Case& k : {Case{100, 0, 2}, Case{37, 0, 2}, Case{1000, 7, 2}, Case{45, 7, 1},
                        Case{512, 3, 2}, Case{kPrompt, 0, 1}}) {
    const std::vector<float> got = RunSequences(m, k.chunk, k.others, k.threads, bf16);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0)
        << "chunk " << k.chunk << " others " << k.others << " threads " << k.threads;
  }
  const std::vector<float> f32 = RunSequences(m, kPrompt, 0, 2);
  EXPECT_NE(std::memcmp(f32.data(), want.data(), want.size() * sizeof(float)), 0)
      << "the bf16 cache was not used";
}

}  // namespace
}  // namespace chorus::model
