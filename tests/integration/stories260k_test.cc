// End-to-end correctness on the real stories260K model (llama2.c format), against llama2.c's own
// expected greedy output, plus format cross-checks and batch invariance.
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

#include "chorus/base/thread_pool.h"
#include "chorus/memory/kv_cache.h"
#include "chorus/model/convert.h"
#include "chorus/model/forward.h"
#include "chorus/model/loader.h"
#include "chorus/model/step_builder.h"
#include "chorus/tokenizer/tokenizer.h"
#include "tests/testutil/testutil.h"

namespace chorus {
namespace {

const char* kModel = "stories260K/stories260K.bin";
const char* kTok = "stories260K/tok512.bin";

std::string ModelsPath(const std::string& rel) { return testing::SharedModelsDir() + "/" + rel; }

std::vector<int32_t> ReadIds(const std::string& path) {
  std::ifstream in(path);
  std::vector<int32_t> ids;
  int32_t x;
  while (in >> x) ids.push_back(x);
  return ids;
}

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Runs one sequence greedily from `prompt`, feeding one token per step after a prefill of the
// prompt in one step. Returns generated ids; `all_logits` gets the logits of every step.
std::vector<int32_t> Greedy(std::shared_ptr<const model::Model> m,
                            const std::vector<int32_t>& prompt, int n,
                            std::vector<std::vector<float>>* all_logits = nullptr,
                            int threads = 2) {
  const auto& c = m->config();
  model::Forward fwd(m, 512, 8);
  memory::KvLayout layout{
      .n_layers = c.n_layers, .n_kv_heads = c.n_kv_heads, .head_dim = c.head_dim, .block_size = 16};
  memory::PagePool pages(64, layout.PageBytes());
  memory::KvCache kv(layout, &pages);
  ThreadPool pool(threads);
  std::vector<int32_t> table;
  std::vector<float> logits(static_cast<size_t>(c.vocab_size));
  std::vector<int32_t> toks = prompt, out;
  int64_t computed = 0;
  for (int step = 0; step < n; ++step) {
    EXPECT_TRUE(kv.Reserve(&table, static_cast<int64_t>(toks.size())).ok());
    model::StepBuilder builder(512, 1);
    builder.AddSequence(std::span<const int32_t>(toks).subspan(static_cast<size_t>(computed)),
                        computed, table.data(), /*want_logits=*/true);
    fwd.Run(builder.Input(), &kv, &pool, logits.data());
    computed = static_cast<int64_t>(toks.size());
    if (all_logits) all_logits->push_back(logits);
    int32_t next =
        static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    out.push_back(next);
    toks.push_back(next);
  }
  return out;
}

TEST(Stories260KTest, GreedyMatchesLlama2cExpectedOutput) {
  CHORUS_REQUIRE_SHARED_MODEL(kModel);
  auto m = model::LoadModel(ModelsPath(kModel));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ((*m)->config().n_embd, 64);
  auto tok = tokenizer::LoadTokenizer(ModelsPath(kTok));
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  const auto expected_ids = ReadIds(ModelsPath("stories260K/expected_greedy_t0_200steps.ids.txt"));
  ASSERT_EQ(expected_ids.size(), 200u);
  // llama2.c's run: BOS then 200 steps; the BOS step's output is the first generated token.
  auto ids = Greedy(*m, {1}, 200);
  EXPECT_EQ(ids, expected_ids);
  std::vector<int32_t> with_bos = {1};
  with_bos.insert(with_bos.end(), ids.begin(), ids.end());
  std::string text = (*tok)->Decode(with_bos);  // the space after BOS is stripped, as in llama2.c
  EXPECT_EQ(text, ReadText(ModelsPath("stories260K/expected_greedy_t0_200steps.txt")));
}

TEST(Stories260KTest, HfAndGgufConversionsGiveSameTokensAndLogits) {
  CHORUS_REQUIRE_SHARED_MODEL(kModel);
  auto m = model::LoadModel(ModelsPath(kModel));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  std::vector<std::vector<float>> ref_logits;
  auto ref = Greedy(*m, {1}, 40, &ref_logits);
  const std::string dir = testing::TempDir();
  struct Case {
    model::OutputFormat format;
    std::string path;
  };
  for (const Case& cs : {Case{model::OutputFormat::kHfDirectory, dir + "/hf"},
                         Case{model::OutputFormat::kGguf, dir + "/m.gguf"}}) {
    model::ConvertOptions o;
    o.format = cs.format;
    o.dtype = DType::kF32;
    o.output = cs.path;
    CHORUS_ASSERT_OK(model::ConvertModel(**m, o));
    auto m2 = model::LoadModel(cs.path);
    ASSERT_TRUE(m2.ok()) << m2.status().ToString();
    EXPECT_EQ((*m2)->config().rope_layout, cs.format == model::OutputFormat::kGguf
                                               ? kernels::RopeLayout::kInterleaved
                                               : kernels::RopeLayout::kHalf);
    std::vector<std::vector<float>> logits;
    auto ids = Greedy(*m2, {1}, 40, &logits);
    EXPECT_EQ(ids, ref) << cs.path;
    ASSERT_EQ(logits.size(), ref_logits.size());
    float max_diff = 0;
    for (size_t s = 0; s < logits.size(); ++s)
      for (size_t i = 0; i < logits[s].size(); ++i)
        max_diff = std::max(max_diff, std::fabs(logits[s][i] - ref_logits[s][i]));
    EXPECT_LT(max_diff, 1e-4f) << cs.path;
  }
}

TEST(Stories260KTest, RowAloneOrInBatchOfEightHasBitwiseIdenticalLogits) {
  CHORUS_REQUIRE_SHARED_MODEL(kModel);
  auto mr = model::LoadModel(ModelsPath(kModel));
  ASSERT_TRUE(mr.ok()) << mr.status().ToString();
  auto m = *mr;
  const auto& c = m->config();
  memory::KvLayout layout{
      .n_layers = c.n_layers, .n_kv_heads = c.n_kv_heads, .head_dim = c.head_dim, .block_size = 16};
  ThreadPool pool(2);
  // Eight sequences with different prompts; sequence 3 is also run alone.
  std::vector<std::vector<int32_t>> prompts;
  for (int s = 0; s < 8; ++s) {
    std::vector<int32_t> p = {1};
    for (int j = 0; j < 5 + 3 * s; ++j)
      p.push_back(static_cast<int32_t>(3 + (s * 37 + j * 11) % 500));
    prompts.push_back(p);
  }
  auto run = [&](const std::vector<int>& which) {
    model::Forward fwd(m, 512, 8);
    memory::PagePool pages(64, layout.PageBytes());
    memory::KvCache kv(layout, &pages);
    std::vector<std::vector<int32_t>> tables(which.size());
    std::vector<const int32_t*> tps;
    // Prefill each sequence alone, then decode 6 steps with all sequences in one step.
    std::vector<float> logits(static_cast<size_t>(8 * c.vocab_size));
    std::vector<int32_t> last_tok(which.size());
    for (size_t i = 0; i < which.size(); ++i) {
      const auto& p = prompts[static_cast<size_t>(which[i])];
      EXPECT_TRUE(kv.Reserve(&tables[i], static_cast<int64_t>(p.size()) + 8).ok());
    }
    for (auto& t : tables) tps.push_back(t.data());
    std::vector<int32_t> toks, pos, seq, lrows;
    for (size_t i = 0; i < which.size(); ++i) {
      const auto& p = prompts[static_cast<size_t>(which[i])];
      for (size_t j = 0; j < p.size(); ++j) {
        toks.push_back(p[j]);
        pos.push_back(static_cast<int32_t>(j));
        seq.push_back(static_cast<int32_t>(i));
      }
      lrows.push_back(static_cast<int32_t>(toks.size() - 1));
    }
    std::vector<std::vector<float>> seq_logits(which.size());
    fwd.Run({toks, pos, seq, tps, lrows}, &kv, &pool, logits.data());
    for (int step = 0; step < 6; ++step) {
      std::vector<int32_t> t2, p2, s2, l2;
      for (size_t i = 0; i < which.size(); ++i) {
        const float* lg = logits.data() + i * static_cast<size_t>(c.vocab_size);
        seq_logits[i].insert(seq_logits[i].end(), lg, lg + c.vocab_size);
        t2.push_back(static_cast<int32_t>(std::max_element(lg, lg + c.vocab_size) - lg));
        p2.push_back(static_cast<int32_t>(prompts[static_cast<size_t>(which[i])].size()) + step);
        s2.push_back(static_cast<int32_t>(i));
        l2.push_back(static_cast<int32_t>(i));
      }
      fwd.Run({t2, p2, s2, tps, l2}, &kv, &pool, logits.data());
    }
    return seq_logits;
  };
  auto alone = run({3});
  auto batched = run({0, 1, 2, 3, 4, 5, 6, 7});
  ASSERT_EQ(alone[0].size(), batched[3].size());
  EXPECT_EQ(0, std::memcmp(alone[0].data(), batched[3].data(), alone[0].size() * sizeof(float)))
      << "logits of a row differ between running alone and inside a batch of 8";
}

}  // namespace
}  // namespace chorus
