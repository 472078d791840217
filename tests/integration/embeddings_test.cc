// Embeddings end to end on stories260K (GenerationRequest::embedding; docs/api.md,
// "Embeddings"). Two oracles outside the pooling code:
//   * last pooling, unnormalized, is the hidden state the next token's logits come from: the
//     output head applied to it gives the distribution the engine samples the first token from
//     (for the base and under a LoRA);
//   * causal attention makes position p's hidden state a function of tokens 0…p only, and the
//     batch-invariance rule (docs/architecture.md, "Attention") makes it bitwise the same however
//     the rows are computed, so mean pooling of a prompt is the mean of the last-pooled
//     embeddings of its prefixes, and cls pooling the last-pooled one-token prefix — bitwise.
// And the same bits alone, beside generations and other embeddings, in chunks of 7 rows, and
// with the prompt's blocks in the prefix cache (used by last pooling, never by mean).
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>

#include "chorus/adapters/adapter_cache.h"
#include "chorus/adapters/lora/lora_files.h"
#include "chorus/engine/engine.h"
#include "chorus/formats/gguf.h"
#include "chorus/kernels/matmul.h"
#include "chorus/model/convert.h"
#include "chorus/model/loader.h"
#include "tests/testutil/embed.h"
#include "tests/testutil/stories260k.h"
#include "tests/testutil/testutil.h"

namespace chorus::engine {
namespace {

const char* kModel = "stories260K/stories260K.bin";

using testing::Embed;

std::unique_ptr<Engine> MakeEngine(const testing::Stories260K& s, int64_t max_batch_tokens,
                                   bool prefix_cache) {
  EngineOptions o;
  o.threads = 2;
  o.max_batch_tokens = max_batch_tokens;
  o.max_running = std::min<int64_t>(8, max_batch_tokens);
  o.pool_bytes = 16 << 20;
  o.prefix_cache = prefix_cache;
  o.adapter_cache = std::make_shared<adapters::AdapterCache>(s.model->config(), int64_t{64} << 20);
  auto e = Engine::Create(s.model, s.tok, o);
  CHORUS_CHECK(e.ok()) << e.status().ToString();
  return std::move(*e);
}

std::vector<int32_t> Prompt(const testing::Stories260K& s, const char* text) {
  tokenizer::EncodeOptions eo;
  eo.add_bos = true;
  return s.tok->Encode(text, eo);
}

void CheckLastPoolingGivesTheNextTokenLogits(std::optional<adapters::VariantRef> variant) {
  testing::Stories260K s = testing::LoadStories260K();
  const auto& c = s.model->config();
  auto e = MakeEngine(s, 64, false);
  const std::vector<int32_t> prompt = Prompt(s, "Once upon a time, there was a little girl");
  const std::vector<float> h = Embed(*e, prompt, Pooling::kLast, /*normalize=*/false, variant);
  ASSERT_EQ(static_cast<int64_t>(h.size()), c.n_embd);

  // The engine's first greedy token with its 5 most likely alternatives.
  GenerationRequest g;
  g.prompt = prompt;
  g.max_tokens = 1;
  g.sampling.temperature = 0;
  g.sampling.logprobs = 5;
  g.variant = variant;
  auto handle = e->Submit(g);
  ASSERT_TRUE(handle.ok());
  auto ev = (*handle)->Next(std::chrono::milliseconds(30000));
  ASSERT_TRUE(ev.has_value());
  ASSERT_EQ(ev->top_logprobs.size(), 5u);

  // The output head over the embedding, log-softmax in double.
  std::vector<float> logits(static_cast<size_t>(c.vocab_size));
  kernels::MatMul(s.model->weights().output, h.data(), c.n_embd, 1, logits.data(), c.vocab_size,
                  false, nullptr);
  double mx = -1e300, sum = 0;
  for (float v : logits) mx = std::max(mx, static_cast<double>(v));
  for (float v : logits) sum += std::exp(static_cast<double>(v) - mx);
  const double lse = mx + std::log(sum);
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + 5, order.end(),
                    [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  EXPECT_EQ(ev->token, order[0]);
  for (size_t k = 0; k < 5; ++k) {
    EXPECT_EQ(ev->top_logprobs[k].token, order[k]) << k;
    EXPECT_NEAR(ev->top_logprobs[k].logprob, logits[static_cast<size_t>(order[k])] - lse, 1e-4)
        << k;
  }
}

TEST(EmbeddingsE2E, LastPoolingIsTheHiddenStateTheNextTokenLogitsComeFrom) {
  CHORUS_REQUIRE_SHARED_MODEL(kModel);
  CheckLastPoolingGivesTheNextTokenLogits(std::nullopt);
}

TEST(EmbeddingsE2E, LastPoolingUnderALoraIsTheHiddenStateItsLogitsComeFrom) {
  CHORUS_REQUIRE_SHARED_MODEL(kModel);
  testing::Stories260K s = testing::LoadStories260K();
  const auto& c = s.model->config();
  adapters::RandomLoraSpec spec;
  spec.rank = 8;
  spec.seed = 11;
  spec.b_std = 0.2f;
  const std::string dir = testing::TempDir() + "/embeddings_lora";
  std::filesystem::remove_all(dir);
  CHORUS_ASSERT_OK(adapters::WritePeftLora(dir, adapters::MakeRandomLora(c, spec), c));
  const adapters::VariantRef lora{.name = "lora", .id = {0x11, 1}, .path = dir};
  CheckLastPoolingGivesTheNextTokenLogits(lora);
  // And the adapter changes the embedding.
  auto e = MakeEngine(s, 64, false);
  const std::vector<int32_t> prompt = Prompt(s, "Lily and Ben went to the park");
  EXPECT_NE(Embed(*e, prompt, Pooling::kMean, true), Embed(*e, prompt, Pooling::kMean, true, lora));
}

TEST(EmbeddingsE2E, MeanAndClsPoolingAreTheLastPooledEmbeddingsOfThePromptsPrefixes) {
  CHORUS_REQUIRE_SHARED_MODEL(kModel);
  testing::Stories260K s = testing::LoadStories260K();
  auto e = MakeEngine(s, 64, false);
  const std::vector<int32_t> prompt =
      Prompt(s, "Once upon a time, there was a little dog named Max. He liked to run.");
  ASSERT_GE(prompt.size(), 15u);
  std::vector<double> sum;
  for (size_t p = 1; p <= prompt.size(); ++p) {
    const std::vector<float> row =
        Embed(*e, std::vector<int32_t>(prompt.begin(), prompt.begin() + static_cast<long>(p)),
              Pooling::kLast, false);
    sum.resize(row.size(), 0.0);
    for (size_t i = 0; i < row.size(); ++i) sum[i] += row[i];
    if (p == 1) {
      EXPECT_EQ(Embed(*e, prompt, Pooling::kFirst, false), row);
    }
  }
  const double n = static_cast<double>(prompt.size());
  std::vector<float> mean, unit;
  double norm2 = 0;
  for (double v : sum) norm2 += (v / n) * (v / n);
  for (double v : sum) mean.push_back(static_cast<float>(v / n));
  for (double v : sum) unit.push_back(static_cast<float>(v * (1.0 / n / std::sqrt(norm2))));
  EXPECT_EQ(Embed(*e, prompt, Pooling::kMean, false), mean);
  const std::vector<float> got = Embed(*e, prompt, Pooling::kMean, true);
  EXPECT_EQ(got, unit);
  double got_norm2 = 0;
  for (float v : got) got_norm2 += static_cast<double>(v) * v;
  EXPECT_NEAR(got_norm2, 1.0, 1e-5);
}

TEST(EmbeddingsE2E, SameBitsAloneBesideOtherRequestsInChunksAndFromThePrefixCache) {
  CHORUS_REQUIRE_SHARED_MODEL(kModel);
  testing::Stories260K s = testing::LoadStories260K();
  const std::vector<int32_t> prompt =
      Prompt(s,
             "Once upon a time, there was a little girl named Lily. She loved to play outside in "
             "the sun with her friends.");
  ASSERT_GE(prompt.size(), 30u);
  std::vector<float> alone[2];
  {
    auto e = MakeEngine(s, 64, false);
    alone[0] = Embed(*e, prompt, Pooling::kLast, true);
    alone[1] = Embed(*e, prompt, Pooling::kMean, true);
  }
  // Chunks of 7 rows, the prefix cache on, beside two generations and each other.
  auto e = MakeEngine(s, 7, true);
  const uint64_t steps = e->metrics().steps_total.load();
  EXPECT_EQ(Embed(*e, prompt, Pooling::kLast, true), alone[0]);
  EXPECT_GE(e->metrics().steps_total.load() - steps, (prompt.size() + 6) / 7);  // in chunks
  GenerationRequest g;
  g.prompt = Prompt(s, "Lily and Ben");
  g.max_tokens = 30;
  g.ignore_eos = true;
  auto gen1 = e->Submit(g);
  GenerationRequest r;
  r.prompt = prompt;
  r.embedding = EmbeddingOptions{.pooling = Pooling::kMean};
  auto mean = e->Submit(r);
  r.embedding->pooling = Pooling::kLast;
  auto last = e->Submit(r);
  g.prompt = prompt;  // a generation of the same prompt: its blocks enter the prefix cache
  auto gen2 = e->Submit(g);
  ASSERT_TRUE(gen1.ok() && mean.ok() && last.ok() && gen2.ok());
  auto final_event = [](RequestHandle& h) {
    std::optional<StreamEvent> ev;
    do {
      ev = h.Next(std::chrono::milliseconds(30000));
    } while (ev && ev->finish == FinishReason::kNone);
    return ev.value_or(StreamEvent{});
  };
  EXPECT_EQ(final_event(**mean).embedding, alone[1]);
  EXPECT_EQ(final_event(**last).embedding, alone[0]);
  final_event(**gen1);
  final_event(**gen2);
  // The prompt's blocks are cached now: last pooling takes them, mean pooling never asks.
  const auto& m = e->metrics();
  const uint64_t hits = m.prefix_cache_hit_tokens.load();
  const uint64_t queried = m.prefix_cache_query_tokens.load();
  EXPECT_EQ(Embed(*e, prompt, Pooling::kLast, true), alone[0]);
  EXPECT_GT(m.prefix_cache_hit_tokens.load(), hits);
  const uint64_t queried_after_last = m.prefix_cache_query_tokens.load();
  EXPECT_GT(queried_after_last, queried);
  EXPECT_EQ(Embed(*e, prompt, Pooling::kMean, true), alone[1]);
  EXPECT_EQ(m.prefix_cache_query_tokens.load(), queried_after_last);
}

// An embedding model's files say how it pools (chorus serve --pooling auto uses it): GGUF
// `{arch}.pooling_type` in llama.cpp's numbering, kept by `chorus convert`, and a
// sentence-transformers export's 1_Pooling/config.json.
TEST(EmbeddingsE2E, TheModelsOwnPoolingIsReadFromGgufAndSentenceTransformersFiles) {
  CHORUS_REQUIRE_SHARED_MODEL(kModel);
  testing::Stories260K s = testing::LoadStories260K();
  EXPECT_EQ(s.model->config().pooling, "");  // a generative model declares none
  const std::string dir = testing::TempDir() + "/embeddings_pooling";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  for (auto [type, want] : {std::pair{1u, "mean"}, {2u, "cls"}, {3u, "last"}, {0u, ""}}) {
    model::ConvertOptions o;
    o.output = dir + "/m" + std::to_string(type) + ".gguf";
    CHORUS_ASSERT_OK(model::ConvertModel(*s.model, o, [&](formats::GgufWriter* w) {
      w->SetUint32("llama.pooling_type", type);
      return OkStatus();
    }));
    auto m = model::LoadModel(o.output);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    EXPECT_EQ((*m)->config().pooling, want) << type;
    // Converted again, the file keeps it.
    model::ConvertOptions again;
    again.output = dir + "/again" + std::to_string(type) + ".gguf";
    CHORUS_ASSERT_OK(model::ConvertModel(**m, again, nullptr));
    auto m2 = model::LoadModel(again.output);
    ASSERT_TRUE(m2.ok()) << m2.status().ToString();
    EXPECT_EQ((*m2)->config().pooling, want) << type;
  }
  model::ConvertOptions hf;
  hf.format = model::OutputFormat::kHfDirectory;
  hf.output = dir + "/hf";
  CHORUS_ASSERT_OK(model::ConvertModel(*s.model, hf, nullptr));
  std::filesystem::create_directories(hf.output + "/1_Pooling");
  auto write = [&](const std::string& text) {
    std::ofstream(hf.output + "/1_Pooling/config.json") << text;
  };
  write(R"({"word_embedding_dimension": 64, "pooling_mode_cls_token": false,
            "pooling_mode_mean_tokens": false, "pooling_mode_lasttoken": true})");
  auto m = model::LoadModel(hf.output);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ((*m)->config().pooling, "last");
  write(R"({"pooling_mode_mean_tokens": true})");
  EXPECT_EQ((*model::LoadModel(hf.output))->config().pooling, "mean");
  write("not json");
  auto bad = model::LoadModel(hf.output);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("1_Pooling/config.json"), std::string::npos)
      << bad.status().ToString();
}

TEST(EmbeddingsE2E, GenerationFieldsAreRefused) {
  CHORUS_REQUIRE_SHARED_MODEL(kModel);
  testing::Stories260K s = testing::LoadStories260K();
  auto e = MakeEngine(s, 64, false);
  GenerationRequest r;
  r.prompt = {1, 403, 407};
  r.embedding = EmbeddingOptions{};
  r.n = 2;
  auto h = e->Submit(r);
  ASSERT_FALSE(h.ok());
  EXPECT_NE(h.status().message().find("one choice"), std::string::npos);
  r.n = 1;
  r.prompt_logprobs = 1;
  h = e->Submit(r);
  ASSERT_FALSE(h.ok());
  EXPECT_NE(h.status().message().find("prompt logprobs"), std::string::npos);
}

}  // namespace
}  // namespace chorus::engine
