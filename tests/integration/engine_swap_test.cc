// --swap-full-models (engine/full_models.h, docs/deltas.md "Swapping full models"): whole
// fine-tunes swapped in and out of one engine. On stories260K with synthetic fine-tunes written
// as GGUF files: each fine-tune's greedy tokens and embeddings equal those of an engine serving
// that file as its only model, whichever other models and the base share the run; swaps,
// evictions and bytes are counted; bad files fail at start-up naming the model.
#include <cstdio>
#include <filesystem>
#include <thread>

#include "chorus/compress/compress.h"
#include "chorus/engine/engine.h"
#include "chorus/model/convert.h"
#include "chorus/model/loader.h"
#include "chorus/model/synthetic.h"
#include "tests/testutil/embed.h"
#include "tests/testutil/testutil.h"

namespace chorus::engine {
namespace {

struct Output {
  std::vector<int32_t> tokens;
  FinishReason finish = FinishReason::kNone;
  std::string error;
};

Output Collect(RequestHandle& h) {
  Output o;
  while (o.finish == FinishReason::kNone) {
    auto ev = h.Next(std::chrono::milliseconds(60000));
    if (!ev) {
      ADD_FAILURE() << "no event within 60 s";
      break;
    }
    if (ev->token >= 0) o.tokens.push_back(ev->token);
    o.finish = ev->finish;
    if (!ev->error.empty()) o.error = ev->error;
  }
  return o;
}

GenerationRequest Greedy(int i, int64_t max_tokens) {
  GenerationRequest r;
  r.prompt = {1};
  for (int j = 0; j < 3 + i % 5; ++j)
    r.prompt.push_back(static_cast<int32_t>(260 + (i * 37 + j * 13) % 240));
  r.max_tokens = max_tokens;
  r.sampling.temperature = 0;
  return r;
}

EngineOptions Opts() {
  EngineOptions o;
  o.threads = 2;
  o.max_batch_tokens = 64;
  o.max_running = 16;
  o.max_queue = 256;
  o.pool_bytes = 32 << 20;
  return o;
}

class SwapTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string models = testing::SharedModelsDir();
    CHORUS_REQUIRE_SHARED_MODEL("stories260K/stories260K.bin");
    auto base = model::LoadModel(models + "/stories260K/stories260K.bin");
    ASSERT_TRUE(base.ok()) << base.status().ToString();
    base_ = *base;
    auto t = tokenizer::LoadTokenizer(models + "/stories260K/tok512.bin");
    ASSERT_TRUE(t.ok());
    tok_ = std::shared_ptr<const tokenizer::Tokenizer>(std::move(*t));
    dir_ = testing::TempDir() + "/engine_swap";
    std::filesystem::create_directories(dir_);
    // Three fine-tunes far enough from the base (30–50 % relative change per matrix) that their
    // greedy continuations differ from the base's: a served "fine-tune" that silently ran the
    // base would be caught.
    for (int i = 0; i < 3; ++i) {
      auto ft = compress::MakeSyntheticFineTune(*base_, 0.3, 0.5, 100 + static_cast<uint64_t>(i));
      ASSERT_TRUE(ft.ok()) << ft.status().ToString();
      model::ConvertOptions co;
      co.output = dir_ + "/ft" + std::to_string(i) + ".gguf";
      ASSERT_TRUE(model::ConvertModel(**ft, co).ok());
      paths_.push_back(co.output);
    }
  }

  // The greedy tokens of requests `ids` on an engine whose only model is the file `path`.
  std::vector<std::vector<int32_t>> Alone(const std::string& path, const std::vector<int>& ids,
                                          int64_t max_tokens) {
    auto m = model::LoadModel(path);
    CHORUS_CHECK(m.ok()) << m.status().ToString();
    auto e = Engine::Create(*m, tok_, Opts());
    CHORUS_CHECK(e.ok()) << e.status().ToString();
    std::vector<std::vector<int32_t>> out;
    for (int i : ids) {
      auto h = (*e)->Submit(Greedy(i, max_tokens));
      CHORUS_CHECK(h.ok());
      out.push_back(Collect(**h).tokens);
    }
    return out;
  }

  std::shared_ptr<const model::Model> base_;
  std::shared_ptr<const tokenizer::Tokenizer> tok_;
  std::string dir_;
  std::vector<std::string> paths_;
};

// Requests for three whole fine-tunes and the base, interleaved and concurrent, with one model
// resident at a time: every request's tokens equal its model's alone tokens; the fine-tunes'
// differ from the base's; each swap-in is counted with the file's bytes, and the one resident
// slot forced evictions.
TEST_F(SwapTest, SwappedModelsAnswerAsEachModelAlone) {
  constexpr int64_t kTokens = 12;
  const std::vector<int> ids = {0, 1, 2, 3, 4, 5};
  std::vector<std::vector<std::vector<int32_t>>> want;
  for (const std::string& p : paths_) want.push_back(Alone(p, ids, kTokens));
  std::vector<std::vector<int32_t>> want_base;
  {
    auto e = Engine::Create(base_, tok_, Opts());
    ASSERT_TRUE(e.ok());
    for (int i : ids) want_base.push_back(Collect(**(*e)->Submit(Greedy(i, kTokens))).tokens);
  }
  int differ = 0;
  for (size_t m = 0; m < want.size(); ++m)
    for (size_t k = 0; k < ids.size(); ++k) differ += want[m][k] != want_base[k];
  EXPECT_GT(differ, static_cast<int>(ids.size()));  // the fine-tunes are not the base

  EngineOptions o = Opts();
  o.served_model_name = "base";
  for (size_t m = 0; m < paths_.size(); ++m)
    o.full_models.push_back({"ft" + std::to_string(m), paths_[m]});
  o.max_resident_models = 1;
  auto e = Engine::Create(base_, tok_, o);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  const auto& refs = (*e)->full_models();
  ASSERT_EQ(refs.size(), 3u);
  EXPECT_EQ((*e)->metrics().full_model_swaps.load(), 0u);  // validated at start, not resident

  // Round 1 in order (model 0, 1, 2, 0, ...: each request needs a swap), round 2 all at once.
  for (int round = 0; round < 2; ++round) {
    std::vector<std::shared_ptr<RequestHandle>> handles;
    std::vector<std::pair<int, int>> which;  // (model or -1 for the base, id index)
    for (size_t k = 0; k < ids.size(); ++k) {
      for (int m = -1; m < 3; ++m) {
        GenerationRequest r = Greedy(ids[k], kTokens);
        if (m >= 0) r.variant = refs[static_cast<size_t>(m)];
        auto h = (*e)->Submit(std::move(r));
        ASSERT_TRUE(h.ok()) << h.status().ToString();
        if (round == 0) {
          const Output out = Collect(**h);
          EXPECT_EQ(out.tokens, m < 0 ? want_base[k] : want[static_cast<size_t>(m)][k])
              << "model " << m << " prompt " << k;
        } else {
          handles.push_back(*h);
          which.emplace_back(m, static_cast<int>(k));
        }
      }
    }
    for (size_t j = 0; j < handles.size(); ++j) {
      const auto [m, k] = which[j];
      const Output out = Collect(*handles[j]);
      EXPECT_EQ(out.finish, FinishReason::kLength) << out.error;
      EXPECT_EQ(out.tokens, m < 0 ? want_base[static_cast<size_t>(k)]
                                  : want[static_cast<size_t>(m)][static_cast<size_t>(k)])
          << "model " << m << " prompt " << k << " (concurrent)";
    }
  }
  const EngineMetrics& mt = (*e)->metrics();
  // Round 1 alone swaps at every fine-tune request after the first of a run of the same model:
  // 6 prompts × 3 models, one resident.
  EXPECT_GE(mt.full_model_swaps.load(), 18u);
  EXPECT_EQ(mt.full_model_evictions.load() + 1, mt.full_model_swaps.load());
  EXPECT_LE(mt.full_models_resident.load(), 1);
  EXPECT_EQ(mt.full_model_swap_errors.load(), 0u);
  const auto size = static_cast<uint64_t>(std::filesystem::file_size(paths_[0]));
  EXPECT_GE(mt.full_model_swap_file_bytes.load(), 18 * size);
  const auto h = mt.full_model_swap_seconds.Get();
  EXPECT_EQ(h.count, mt.full_model_swaps.load());
  EXPECT_GT(h.sum, 0);
}

// With two resident slots, two fine-tunes run in the same steps (one forward pass each): the
// outputs still equal each model's alone, and no model is swapped twice when only two are used.
TEST_F(SwapTest, TwoResidentModelsShareSteps) {
  constexpr int64_t kTokens = 10;
  const std::vector<int> ids = {0, 1, 2, 3};
  std::vector<std::vector<std::vector<int32_t>>> want;
  for (int m = 0; m < 2; ++m) want.push_back(Alone(paths_[static_cast<size_t>(m)], ids, kTokens));
  EngineOptions o = Opts();
  o.full_models = {{"a", paths_[0]}, {"b", paths_[1]}};
  o.max_resident_models = 2;
  auto e = Engine::Create(base_, tok_, o);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  std::vector<std::shared_ptr<RequestHandle>> hs;
  for (int i : ids) {
    for (int m = 0; m < 2; ++m) {
      GenerationRequest r = Greedy(i, kTokens);
      r.variant = (*e)->full_models()[static_cast<size_t>(m)];
      hs.push_back(*(*e)->Submit(std::move(r)));
    }
  }
  for (size_t j = 0; j < hs.size(); ++j)
    EXPECT_EQ(Collect(*hs[j]).tokens, want[j % 2][j / 2]) << "request " << j;
  EXPECT_EQ((*e)->metrics().full_model_swaps.load(), 2u);
  EXPECT_EQ((*e)->metrics().full_model_evictions.load(), 0u);
  EXPECT_EQ((*e)->metrics().full_models_resident.load(), 2);
}

// /v1/embeddings of a swapped-in fine-tune (last and mean pooling): the vectors an engine serving
// that file alone gives, bit for bit, whether the model was resident or had to be swapped in
// between the base's and the other fine-tunes' requests; and not the base's.
TEST_F(SwapTest, SwappedModelsEmbedAsEachModelAlone) {
  auto embed = [](Engine& e, int i, Pooling pooling, std::optional<adapters::VariantRef> variant) {
    return testing::Embed(e, Greedy(i, 0).prompt, pooling, /*normalize=*/true, std::move(variant));
  };
  const std::vector<int> ids = {0, 3};
  const std::vector<Pooling> poolings = {Pooling::kLast, Pooling::kMean};
  // want[model][id][pooling]; model 3 = the base.
  std::vector<std::vector<std::vector<std::vector<float>>>> want(4);
  for (size_t m = 0; m < 4; ++m) {
    std::shared_ptr<const model::Model> alone = base_;
    if (m < 3) {
      auto loaded = model::LoadModel(paths_[m]);
      ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
      alone = *loaded;
    }
    auto e = Engine::Create(alone, tok_, Opts());
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    for (int i : ids) {
      want[m].emplace_back();
      for (Pooling p : poolings) want[m].back().push_back(embed(**e, i, p, std::nullopt));
    }
  }
  for (size_t m = 0; m < 3; ++m) EXPECT_NE(want[m][0][0], want[3][0][0]) << "fine-tune " << m;

  EngineOptions o = Opts();
  for (size_t m = 0; m < paths_.size(); ++m)
    o.full_models.push_back({"ft" + std::to_string(m), paths_[m]});
  o.max_resident_models = 1;
  auto e = Engine::Create(base_, tok_, o);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  // Model by model, then again: every fine-tune's requests after another model's need a swap.
  for (int round = 0; round < 2; ++round) {
    for (size_t k = 0; k < ids.size(); ++k) {
      for (size_t m = 0; m < 4; ++m) {
        for (size_t p = 0; p < poolings.size(); ++p) {
          std::optional<adapters::VariantRef> variant;
          if (m < 3) variant = (*e)->full_models()[m];
          EXPECT_EQ(embed(**e, ids[k], poolings[p], variant), want[m][k][p])
              << "model " << m << " prompt " << k << " pooling " << p << " round " << round;
        }
      }
    }
  }
  EXPECT_GE((*e)->metrics().full_model_swaps.load(), 12u);
}

TEST_F(SwapTest, BadModelsFailAtStartNamingThem) {
  EngineOptions o = Opts();
  o.full_models = {{"gone", dir_ + "/missing.gguf"}};
  auto e = Engine::Create(base_, tok_, o);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("full model 'gone'"), std::string::npos);
  EXPECT_NE(e.status().message().find("no such file"), std::string::npos);

  // Another shape: the embedded "tiny" synthetic model (dim 128) against stories260K (dim 64).
  auto tiny = model::MakeSyntheticModel({.shape = "tiny"});
  ASSERT_TRUE(tiny.ok());
  model::ConvertOptions co;
  co.output = dir_ + "/tiny.gguf";
  ASSERT_TRUE(model::ConvertModel(**tiny, co).ok());
  o.full_models = {{"ok", paths_[0]}, {"other", co.output}};
  e = Engine::Create(base_, tok_, o);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("full model 'other'"), std::string::npos)
      << e.status().ToString();
  EXPECT_NE(e.status().message().find("not the base model's shape"), std::string::npos);

  // A file that is no model at all.
  const std::string junk = dir_ + "/junk.gguf";
  {
    std::FILE* fp = std::fopen(junk.c_str(), "wb");
    ASSERT_NE(fp, nullptr);
    std::fputs("not a model", fp);
    std::fclose(fp);
  }
  o.full_models = {{"junk", junk}};
  e = Engine::Create(base_, tok_, o);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("full model 'junk'"), std::string::npos);

  // Names: twice, or the base's.
  o.full_models = {{"x", paths_[0]}, {"x", paths_[1]}};
  e = Engine::Create(base_, tok_, o);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("given twice"), std::string::npos);
  o.served_model_name = "base";
  o.full_models = {{"base", paths_[0]}};
  e = Engine::Create(base_, tok_, o);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("base model's served name"), std::string::npos);
  o.full_models = {{"a", paths_[0]}};
  o.max_resident_models = 0;
  e = Engine::Create(base_, tok_, o);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("max-resident-models"), std::string::npos);
}

// A fine-tune whose file disappears or is overwritten with junk after start-up: the swap-in
// fails, every request waiting for that model finishes with an error naming it (kInternal: the
// server's problem, a 5xx), the other models and the base keep answering as before, and once the
// file is back the next request for it swaps it in and answers as the model alone.
TEST_F(SwapTest, SwapInFailureFailsOnlyThatModelsRequestsUntilTheFileIsBack) {
  constexpr int64_t kTokens = 8;
  const std::vector<std::vector<int32_t>> want_a = Alone(paths_[0], {0, 1}, kTokens);
  const std::vector<std::vector<int32_t>> want_b = Alone(paths_[1], {0, 1}, kTokens);
  EngineOptions o = Opts();
  o.full_models = {{"a", paths_[0]}, {"b", paths_[1]}};
  o.max_resident_models = 1;
  auto e = Engine::Create(base_, tok_, o);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  const auto& refs = (*e)->full_models();
  auto submit = [&](int model, int id) {
    GenerationRequest r = Greedy(id, kTokens);
    if (model >= 0) r.variant = refs[static_cast<size_t>(model)];
    auto h = (*e)->Submit(std::move(r));
    CHORUS_CHECK(h.ok()) << h.status().ToString();
    return *h;
  };
  EXPECT_EQ(Collect(*submit(0, 0)).tokens, want_a[0]);  // a is resident now

  // b's file goes away (moved aside), then comes back as junk: both fail b's requests only.
  const std::string aside = paths_[1] + ".aside";
  std::filesystem::rename(paths_[1], aside);
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (attempt == 1) {
      std::FILE* fp = std::fopen(paths_[1].c_str(), "wb");
      ASSERT_NE(fp, nullptr);
      std::fputs("GGUF but not really", fp);
      std::fclose(fp);
    }
    auto hb1 = submit(1, 0), hb2 = submit(1, 1), ha = submit(0, 1), hbase = submit(-1, 0);
    for (auto* h : {&hb1, &hb2}) {
      const Output out = Collect(**h);
      EXPECT_EQ(out.finish, FinishReason::kError) << "attempt " << attempt;
      EXPECT_TRUE(out.tokens.empty());
      EXPECT_NE(out.error.find("model 'b' could not be swapped in"), std::string::npos)
          << out.error;
    }
    EXPECT_EQ(Collect(*ha).tokens, want_a[1]) << "attempt " << attempt;
    EXPECT_EQ(Collect(*hbase).finish, FinishReason::kLength);
  }
  EXPECT_EQ((*e)->metrics().full_model_swap_errors.load(), 2u);

  // The file is back: b swaps in and answers as alone; a still answers after its eviction.
  std::filesystem::remove(paths_[1]);
  std::filesystem::rename(aside, paths_[1]);
  EXPECT_EQ(Collect(*submit(1, 1)).tokens, want_b[1]);
  EXPECT_EQ(Collect(*submit(0, 0)).tokens, want_a[0]);
  EXPECT_EQ((*e)->metrics().full_model_swap_errors.load(), 2u);
  EXPECT_LE((*e)->metrics().full_models_resident.load(), 1);
}

// A request naming a whole fine-tune the engine does not serve is refused at Submit.
TEST_F(SwapTest, UnknownFullModelIsRefused) {
  EngineOptions o = Opts();
  o.full_models = {{"a", paths_[0]}};
  auto e = Engine::Create(base_, tok_, o);
  ASSERT_TRUE(e.ok());
  GenerationRequest r = Greedy(0, 4);
  r.variant = adapters::VariantRef{.name = "nope", .id = {1, 1}, .kind = "full", .path = "x"};
  auto h = (*e)->Submit(std::move(r));
  ASSERT_FALSE(h.ok());
  EXPECT_NE(h.status().message().find("'nope'"), std::string::npos);
}

}  // namespace
}  // namespace chorus::engine
