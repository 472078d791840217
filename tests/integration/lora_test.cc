// LoRA end to end (correctness): the batched unmerged path (Forward + LoraHook)
// equals merged weights W + s·B·A for PEFT and GGUF files of the same adapter, on the real
// stories260K (llama2.c, interleaved q/k rows) and a synthetic HF-layout model, prefill and
// decode, ranks 1..64 mixed in one batch; the real trained adapter of stories260K-finetunes
// applies through the q/k permutation and shows its fine-tune; a row's logits are bitwise the
// same alone or in a batch of 16 rows over 8 adapters + base.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

#include "chorus/adapters/lora/lora_adapter.h"
#include "chorus/adapters/lora/lora_files.h"
#include "chorus/adapters/lora/lora_hook.h"
#include "chorus/base/thread_pool.h"
#include "chorus/kernels/dispatch.h"
#include "chorus/memory/kv_cache.h"
#include "chorus/model/convert.h"
#include "chorus/model/forward.h"
#include "chorus/model/loader.h"
#include "chorus/model/synthetic.h"
#include "chorus/tokenizer/tokenizer.h"
#include "tests/testutil/testutil.h"

namespace chorus {
namespace {

using adapters::LoraAdapter;
using adapters::LoraWeights;
using ModelPtr = std::shared_ptr<const model::Model>;

const char* kModel = "stories260K/stories260K.bin";
const char* kTok = "stories260K/tok512.bin";
const char* kRealLora = "stories260K-finetunes/things/lora";

std::string ModelsPath(const std::string& rel) { return testing::SharedModelsDir() + "/" + rel; }

struct Seq {
  std::vector<int32_t> tokens;           // prompt followed by forced decode tokens
  const LoraAdapter* adapter = nullptr;  // nullptr = base
};

// Runs the sequences together: one step prefilling every prompt (`prompt_len` tokens each, rows
// in the order given), then `n_decode` steps of one row per sequence. When `forced` is false the
// decode tokens are the greedy choices (tokens beyond the prompt are ignored). Returns per
// sequence the logits of every step, concatenated [(n_decode + 1) × vocab], and in `generated`
// the greedy tokens.
std::vector<std::vector<float>> RunBatch(const ModelPtr& m, const std::vector<Seq>& seqs,
                                         size_t prompt_len, int n_decode, bool forced, int threads,
                                         std::vector<std::vector<int32_t>>* generated = nullptr) {
  const auto& c = m->config();
  const int64_t n = static_cast<int64_t>(seqs.size());
  model::Forward fwd(m, 512, n);
  memory::KvLayout layout{
      .n_layers = c.n_layers, .n_kv_heads = c.n_kv_heads, .head_dim = c.head_dim, .block_size = 16};
  memory::PagePool pages(256, layout.PageBytes());
  memory::KvCache kv(layout, &pages);
  ThreadPool pool(threads);
  adapters::LoraHook hook(c, 512);
  std::vector<std::vector<int32_t>> tables(seqs.size());
  std::vector<const int32_t*> tps;
  for (auto& t : tables) {
    EXPECT_TRUE(kv.Reserve(&t, static_cast<int64_t>(prompt_len) + n_decode + 1).ok());
    tps.push_back(t.data());
  }
  std::vector<std::vector<float>> out(seqs.size());
  std::vector<std::vector<int32_t>> gen(seqs.size());
  std::vector<float> logits(static_cast<size_t>(n * c.vocab_size));
  std::vector<int32_t> toks, pos, seq, lrows;
  std::vector<const LoraAdapter*> row_adapters;
  for (size_t s = 0; s < seqs.size(); ++s) {
    for (size_t j = 0; j < prompt_len; ++j) {
      toks.push_back(seqs[s].tokens[j]);
      pos.push_back(static_cast<int32_t>(j));
      seq.push_back(static_cast<int32_t>(s));
      row_adapters.push_back(seqs[s].adapter);
    }
    lrows.push_back(static_cast<int32_t>(toks.size() - 1));
  }
  for (int step = 0; step <= n_decode; ++step) {
    EXPECT_TRUE(hook.SetRows(row_adapters).ok());
    fwd.Run({toks, pos, seq, tps, lrows, &hook}, &kv, &pool, logits.data());
    toks.clear();
    pos.clear();
    seq.clear();
    lrows.clear();
    row_adapters.clear();
    for (size_t s = 0; s < seqs.size(); ++s) {
      const float* lg = logits.data() + s * static_cast<size_t>(c.vocab_size);
      out[s].insert(out[s].end(), lg, lg + c.vocab_size);
      const int32_t greedy = static_cast<int32_t>(std::max_element(lg, lg + c.vocab_size) - lg);
      gen[s].push_back(greedy);
      const size_t p = prompt_len + static_cast<size_t>(step);
      toks.push_back(forced ? seqs[s].tokens[p] : greedy);
      pos.push_back(static_cast<int32_t>(p));
      seq.push_back(static_cast<int32_t>(s));
      lrows.push_back(static_cast<int32_t>(s));
      row_adapters.push_back(seqs[s].adapter);
    }
  }
  if (generated) *generated = gen;
  return out;
}

// max |a − b| / max |b|.
double RelDiff(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, std::fabs(static_cast<double>(a[i]) - b[i]));
    den = std::max(den, std::fabs(static_cast<double>(b[i])));
  }
  return num / den;
}

std::vector<int32_t> ForcedTokens(size_t n, int64_t vocab, uint32_t seed) {
  std::vector<int32_t> t = {1};
  uint32_t x = seed;
  while (t.size() < n) {
    x = x * 1664525u + 1013904223u;
    t.push_back(static_cast<int32_t>(3 + (x >> 8) % static_cast<uint32_t>(vocab - 3)));
  }
  return t;
}

// Random adapters of ranks 1, 8, 16, 64 written as PEFT and as GGUF, read back and run in ONE
// batch (with a base row in the middle); each row must equal its merged-weights oracle.
// `storage`: how the compute copies hold A and B; the oracle merges exactly those values
// (bf16: rounded once at load), so the tolerance stays 1e-3.
void CheckUnmergedEqualsMerged(const ModelPtr& base, const std::string& what,
                               adapters::LoraStorage storage = adapters::LoraStorage::kF32) {
  const auto& c = base->config();
  const size_t prompt_len = 11;
  const int n_decode = 4;
  const std::string dir = testing::TempDir();
  std::vector<LoraWeights> weights;
  std::vector<std::shared_ptr<const LoraAdapter>> peft, gguf;
  for (int64_t rank : {1, 8, 16, 64}) {
    adapters::RandomLoraSpec spec;
    spec.rank = rank;
    spec.alpha = static_cast<float>(2 * rank);
    spec.b_std = 0.05f;
    spec.seed = static_cast<uint64_t>(100 + rank);
    weights.push_back(adapters::MakeRandomLora(c, spec));
    const std::string pd = dir + "/peft" + std::to_string(rank);
    const std::string gp = dir + "/lora" + std::to_string(rank) + ".gguf";
    ASSERT_TRUE(adapters::WritePeftLora(pd, weights.back(), c).ok());
    ASSERT_TRUE(adapters::WriteGgufLora(gp, weights.back(), c).ok());
    adapters::LoraLoadOptions lo;
    lo.limits.storage = storage;
    auto p = adapters::LoadLoraAdapter(pd, c, lo);
    auto g = adapters::LoadLoraAdapter(gp, c, lo);
    EXPECT_EQ((*p)->storage(), storage);
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    peft.push_back(*p);
    gguf.push_back(*g);
  }
  // Batch: peft r1, peft r8, base, peft r16, peft r64, gguf r1, gguf r8, gguf r16, gguf r64.
  std::vector<Seq> batch;
  std::vector<int> which;  // adapter index per sequence, -1 = base
  for (int i = 0; i < 9; ++i) {
    const int ad = i < 2 ? i : i == 2 ? -1 : i < 5 ? i - 1 : i - 5;
    const LoraAdapter* a = ad < 0 ? nullptr : (i < 5 ? peft : gguf)[static_cast<size_t>(ad)].get();
    batch.push_back(
        {ForcedTokens(prompt_len + n_decode + 1, c.vocab_size, 7u + static_cast<uint32_t>(i)), a});
    which.push_back(ad);
  }
  const auto got = RunBatch(base, batch, prompt_len, n_decode, /*forced=*/true, 2);
  for (size_t i = 0; i < batch.size(); ++i) {
    ModelPtr oracle = base;
    if (which[i] >= 0) {
      auto merged = adapters::MergeLora(
          *base, adapters::RoundedAsStored(weights[static_cast<size_t>(which[i])], storage));
      ASSERT_TRUE(merged.ok()) << merged.status().ToString();
      oracle = *merged;
    }
    const auto want = RunBatch(oracle, {{batch[i].tokens, nullptr}}, prompt_len, n_decode, true, 1);
    const auto base_alone =
        RunBatch(base, {{batch[i].tokens, nullptr}}, prompt_len, n_decode, true, 1);
    // Prefill (first vocab logits) and decode steps separately.
    const size_t v = static_cast<size_t>(c.vocab_size);
    const std::vector<float> got_prefill(got[i].begin(), got[i].begin() + static_cast<long>(v));
    const std::vector<float> want_prefill(want[0].begin(), want[0].begin() + static_cast<long>(v));
    EXPECT_LT(RelDiff(got_prefill, want_prefill), 1e-3) << what << " seq " << i << " prefill";
    EXPECT_LT(RelDiff(got[i], want[0]), 1e-3) << what << " seq " << i << " all steps";
    std::printf("%s seq %zu (adapter %d): unmerged vs merged rel diff %.2e, adapter effect %.2e\n",
                what.c_str(), i, which[i], RelDiff(got[i], want[0]),
                RelDiff(want[0], base_alone[0]));
    if (which[i] >= 0) {
      // The adapter does change the output (so the comparison above can fail).
      EXPECT_GT(RelDiff(want[0], base_alone[0]), 3e-3) << what << " seq " << i;
    } else {
      EXPECT_EQ(got[i], base_alone[0]) << what << ": a base row in a LoRA batch is unaffected";
    }
  }
}

TEST(LoraIntegrationTest, SyntheticHfModelUnmergedEqualsMerged) {
  auto m = model::MakeSyntheticModel({.shape = "tiny", .dtype = DType::kF32, .seed = 3});
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_EQ((*m)->config().rope_layout, kernels::RopeLayout::kHalf);
  CheckUnmergedEqualsMerged(*m, "synthetic tiny");
}

TEST(LoraIntegrationTest, Stories260KUnmergedEqualsMerged) {
  CHORUS_REQUIRE_SHARED_MODEL(kModel);
  auto m = model::LoadModel(ModelsPath(kModel));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_EQ((*m)->config().rope_layout, kernels::RopeLayout::kInterleaved);
  CheckUnmergedEqualsMerged(*m, "stories260K");
}

TEST(LoraIntegrationTest, Bf16StorageUnmergedEqualsMergedOfRoundedWeights) {
  auto m = model::MakeSyntheticModel({.shape = "tiny", .dtype = DType::kF32, .seed = 3});
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  CheckUnmergedEqualsMerged(*m, "synthetic tiny bf16", adapters::LoraStorage::kBF16);
  CHORUS_REQUIRE_SHARED_MODEL(kModel);
  auto s = model::LoadModel(ModelsPath(kModel));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  CheckUnmergedEqualsMerged(*s, "stories260K bf16", adapters::LoraStorage::kBF16);
}

std::string Continue(const ModelPtr& m, const LoraAdapter* ad, const tokenizer::Tokenizer& tok,
                     const std::string& prompt, int n) {
  std::vector<int32_t> ids = tok.Encode(prompt, {});
  std::vector<std::vector<int32_t>> gen;
  RunBatch(m, {{ids, ad}}, ids.size(), n - 1, /*forced=*/false, 2, &gen);
  return tok.Decode(gen[0]);
}

TEST(LoraIntegrationTest, RealTrainedAdapterOnStories260K) {
  CHORUS_REQUIRE_SHARED_MODEL(kModel);
  CHORUS_REQUIRE_SHARED_MODEL(kRealLora);
  auto mr = model::LoadModel(ModelsPath(kModel));
  ASSERT_TRUE(mr.ok()) << mr.status().ToString();
  const ModelPtr base = *mr;
  const auto& c = base->config();
  auto w = adapters::ReadLora(ModelsPath(kRealLora), c);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(w->MaxRank(), 8);
  EXPECT_FLOAT_EQ(w->Scale(0, model::Linear::kQ), 2.0f);  // alpha 16 / r 8
  auto ad = adapters::LoraAdapter::Build(*w, c, "things");
  ASSERT_TRUE(ad.ok()) << ad.status().ToString();

  // 1. Unmerged equals the merged oracle (q/k lora_B rows permuted into the llama2.c order).
  const size_t prompt_len = 9;
  const int n_decode = 5;
  const auto toks = ForcedTokens(prompt_len + n_decode + 1, c.vocab_size, 42);
  auto merged = adapters::MergeLora(*base, *w);
  ASSERT_TRUE(merged.ok()) << merged.status().ToString();
  const auto got = RunBatch(base, {{toks, ad->get()}}, prompt_len, n_decode, true, 2);
  const auto want = RunBatch(*merged, {{toks, nullptr}}, prompt_len, n_decode, true, 2);
  EXPECT_LT(RelDiff(got[0], want[0]), 1e-3);

  // 2. Independent check of the permutation: the same adapter, unpermuted, on a Hugging Face
  // export of the base (rotate-half rows) gives the same logits.
  const std::string hf = testing::TempDir() + "/hf";
  model::ConvertOptions co;
  co.format = model::OutputFormat::kHfDirectory;
  co.dtype = DType::kF32;
  co.output = hf;
  CHORUS_ASSERT_OK(model::ConvertModel(*base, co));
  auto hf_model = model::LoadModel(hf);
  ASSERT_TRUE(hf_model.ok()) << hf_model.status().ToString();
  ASSERT_EQ((*hf_model)->config().rope_layout, kernels::RopeLayout::kHalf);
  auto hf_ad = adapters::LoadLoraAdapter(ModelsPath(kRealLora), (*hf_model)->config());
  ASSERT_TRUE(hf_ad.ok()) << hf_ad.status().ToString();
  const auto got_hf = RunBatch(*hf_model, {{toks, hf_ad->get()}}, prompt_len, n_decode, true, 2);
  EXPECT_LT(RelDiff(got_hf[0], got[0]), 1e-4);
  // And a wrong layout would be visible: the unpermuted adapter on the llama2.c base differs.
  LoraWeights wrong = *w;
  wrong.qk_layout = kernels::RopeLayout::kInterleaved;
  auto wrong_ad = adapters::LoraAdapter::Build(wrong, c, "wrong");
  ASSERT_TRUE(wrong_ad.ok());
  const auto got_wrong = RunBatch(base, {{toks, wrong_ad->get()}}, prompt_len, n_decode, true, 2);
  EXPECT_GT(RelDiff(got_wrong[0], got[0]), 1e-3);

  // 3. The fine-tune's effect (eval.json: greedy task hit rate base 0.33, lora 0.67): the
  // 12-token greedy continuation contains one of the swapped-in words.
  CHORUS_REQUIRE_SHARED_MODEL(kTok);
  auto tok = tokenizer::LoadTokenizer(ModelsPath(kTok));
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  int base_hits = 0, lora_hits = 0;
  for (const char* prompt : {"They went to the", "She played with her", "He had a pet"}) {
    const std::string b = Continue(base, nullptr, **tok, prompt, 12);
    const std::string l = Continue(base, ad->get(), **tok, prompt, 12);
    auto hit = [](const std::string& s) {
      return s.find("beach") != std::string::npos || s.find("kite") != std::string::npos ||
             s.find("cat") != std::string::npos;
    };
    base_hits += hit(b);
    lora_hits += hit(l);
    std::printf("%-22s base: %s\n%-22s lora: %s\n", prompt, b.c_str(), "", l.c_str());
  }
  std::printf("task hit rate: base %d/3, lora %d/3 (eval.json: 1/3, 2/3)\n", base_hits, lora_hits);
  EXPECT_EQ(base_hits, 1);
  EXPECT_EQ(lora_hits, 2);
}

// 16 sequences over 8 adapters (ranks 1..64) + base, prefilled together then decoded greedily
// together: every sequence's logits are bitwise those of running it alone (1 thread vs 2).
TEST(LoraIntegrationTest, MixedAdapterBatchOf16IsBitwiseBatchInvariant) {
  CHORUS_REQUIRE_SHARED_MODEL(kModel);
  auto mr = model::LoadModel(ModelsPath(kModel));
  ASSERT_TRUE(mr.ok()) << mr.status().ToString();
  const ModelPtr base = *mr;
  const auto& c = base->config();
  std::vector<std::shared_ptr<const LoraAdapter>> ads;
  const int64_t ranks[8] = {1, 8, 16, 64, 1, 8, 16, 64};
  for (int i = 0; i < 8; ++i) {
    adapters::RandomLoraSpec spec;
    spec.rank = ranks[i];
    spec.alpha = 16;
    spec.b_std = 0.05f;
    spec.seed = static_cast<uint64_t>(1000 + i);
    if (i == 5) spec.targets = {model::Linear::kQ, model::Linear::kV, model::Linear::kDown};
    std::string name = "a";  // appended: "a" + to_string trips a false GCC 12 -Wrestrict
    name += std::to_string(i);
    auto a = LoraAdapter::Build(adapters::MakeRandomLora(c, spec), c, name);
    ASSERT_TRUE(a.ok());
    ads.push_back(*a);
  }
  const size_t prompt_len = 7;
  const int n_decode = 5;
  std::vector<Seq> seqs;
  for (int s = 0; s < 16; ++s) {
    const int ad = s % 9;  // 0..7 adapters, 8 = base; grouped by adapter below
    seqs.push_back({ForcedTokens(prompt_len, c.vocab_size, 500u + static_cast<uint32_t>(s)),
                    ad == 8 ? nullptr : ads[static_cast<size_t>(ad)].get()});
  }
  std::stable_sort(seqs.begin(), seqs.end(),
                   [](const Seq& a, const Seq& b) { return a.adapter < b.adapter; });
  const auto batched = RunBatch(base, seqs, prompt_len, n_decode, /*forced=*/false, 2);
  for (size_t s = 0; s < seqs.size(); ++s) {
    const auto alone = RunBatch(base, {seqs[s]}, prompt_len, n_decode, false, 1);
    ASSERT_EQ(alone[0].size(), batched[s].size());
    EXPECT_EQ(0, std::memcmp(alone[0].data(), batched[s].data(), alone[0].size() * sizeof(float)))
        << "sequence " << s << " differs alone vs in the batch of 16";
  }
}

// A mixed batch (4 adapters of ranks 1..64 + base) on q8_0 and q4_0 bases: at the amx level the
// multi-row steps (the 108-row prefill, the 12-row decode steps) run the int8 tile GEMM and a
// sequence alone decodes on the VNNI kernel (1 row), so "bitwise alone = batched" checks the two
// kernels against each other end to end; and the batched logits are bitwise those of the
// avx512 level (every other kernel is the same at both levels).
TEST(LoraIntegrationTest, QuantizedMixedBatchIsBitwiseInvariantAcrossLevels) {
  struct Restore {
    ~Restore() { kernels::SetMaxIsa(kernels::kMaxIsaLevel); }
  } restore;
  kernels::SetMaxIsa(kernels::kMaxIsaLevel);
  const kernels::IsaLevel best = kernels::ActiveIsa();
  if (best != kernels::IsaLevel::kAmx) {
    std::printf("no amx level here (%s): batch invariance at %s only\n",
                kernels::AmxUnavailableReason().c_str(), kernels::IsaName(best).c_str());
  }
  for (DType dt : {DType::kQ8_0, DType::kQ4_0}) {
    auto mr = model::MakeSyntheticModel({.shape = "tiny", .dtype = dt, .seed = 5});
    ASSERT_TRUE(mr.ok()) << mr.status().ToString();
    const ModelPtr base = *mr;
    const auto& c = base->config();
    std::vector<std::shared_ptr<const LoraAdapter>> ads;
    const int64_t ranks[4] = {1, 8, 16, 64};
    for (int i = 0; i < 4; ++i) {
      adapters::RandomLoraSpec spec;
      spec.rank = ranks[i];
      spec.alpha = 16;
      spec.b_std = 0.05f;
      spec.seed = static_cast<uint64_t>(2000 + i);
      std::string name = "q";
      name += std::to_string(i);
      auto a = LoraAdapter::Build(adapters::MakeRandomLora(c, spec), c, name);
      ASSERT_TRUE(a.ok());
      ads.push_back(*a);
    }
    const size_t prompt_len = 9;
    const int n_decode = 4;
    std::vector<Seq> seqs;
    for (int s = 0; s < 12; ++s) {
      const int ad = s % 5;  // 0..3 adapters, 4 = base
      seqs.push_back({ForcedTokens(prompt_len, c.vocab_size, 700u + static_cast<uint32_t>(s)),
                      ad == 4 ? nullptr : ads[static_cast<size_t>(ad)].get()});
    }
    std::stable_sort(seqs.begin(), seqs.end(),
                     [](const Seq& a, const Seq& b) { return a.adapter < b.adapter; });
    std::vector<std::vector<float>> at_best;
    for (kernels::IsaLevel level : {best, kernels::IsaLevel::kAvx512}) {
      if (level > best || (level == kernels::IsaLevel::kAvx512 && best != kernels::IsaLevel::kAmx))
        continue;
      kernels::SetMaxIsa(level);
      const std::string what = std::string(DTypeName(dt)) + " " + kernels::IsaName(level);
      const auto batched = RunBatch(base, seqs, prompt_len, n_decode, /*forced=*/false, 2);
      for (size_t s = 0; s < seqs.size(); ++s) {
        const auto alone = RunBatch(base, {seqs[s]}, prompt_len, n_decode, false, 1);
        ASSERT_EQ(alone[0].size(), batched[s].size());
        EXPECT_EQ(0,
                  std::memcmp(alone[0].data(), batched[s].data(), alone[0].size() * sizeof(float)))
            << what << ": sequence " << s << " differs alone vs in the batch of 12";
      }
      if (level == best) {
        at_best = batched;
      } else {
        for (size_t s = 0; s < seqs.size(); ++s) {
          EXPECT_EQ(0, std::memcmp(at_best[s].data(), batched[s].data(),
                                   batched[s].size() * sizeof(float)))
              << what << ": sequence " << s << " differs between amx and avx512";
        }
      }
    }
  }
}

}  // namespace
}  // namespace chorus
