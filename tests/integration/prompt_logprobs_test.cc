// Prompt logprobs end to end on stories260K (GenerationRequest::prompt_logprobs; docs/api.md,
// "Prompt logprobs"). The oracle is the engine's own decode path: a greedy request reports each
// generated token's logprob and top alternatives from a decode row; the same tokens fed back as
// a prompt must be scored with bitwise the same numbers from prefill rows — cut into chunks of
// max_prompt_logprob_rows, beside other requests, with the prompt's blocks already in the prefix
// cache (which must not skip them), for the base model and for a LoRA variant.
#include <filesystem>

#include "chorus/adapters/adapter_cache.h"
#include "chorus/adapters/lora/lora_files.h"
#include "chorus/engine/engine.h"
#include "chorus/model/loader.h"
#include "tests/testutil/stories260k.h"
#include "tests/testutil/testutil.h"

namespace chorus::engine {
namespace {

const char* kModel = "stories260K/stories260K.bin";

// One scored token: a generated token's or a prompt token's.
struct Scored {
  int32_t token = -1;
  float logprob = 0;
  std::vector<TokenLogprob> top;
};

struct Outcome {
  std::vector<int32_t> generated;
  std::vector<Scored> generated_scores;
  std::vector<int64_t> prompt_positions;
  std::vector<Scored> prompt_scores;
  int prompt_events_of_other_choices = 0;
};

Outcome Collect(RequestHandle& h) {
  Outcome o;
  int done = 0;
  while (done < h.n_choices()) {
    auto ev = h.Next(std::chrono::milliseconds(30000));
    if (!ev) {
      ADD_FAILURE() << "timeout";
      return o;
    }
    EXPECT_NE(ev->finish, FinishReason::kError) << ev->error;
    if (ev->prompt) {
      EXPECT_EQ(ev->finish, FinishReason::kNone);
      EXPECT_TRUE(ev->text.empty());
      if (ev->index != 0) ++o.prompt_events_of_other_choices;
      o.prompt_positions.push_back(ev->position);
      o.prompt_scores.push_back({ev->token, ev->logprob, ev->top_logprobs});
    } else if (ev->token >= 0 && ev->index == 0) {
      o.generated.push_back(ev->token);
      o.generated_scores.push_back({ev->token, ev->logprob, ev->top_logprobs});
    }
    if (ev->finish != FinishReason::kNone) ++done;
  }
  return o;
}

GenerationRequest Greedy(std::vector<int32_t> prompt, int64_t max_tokens, int32_t logprobs) {
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  r.sampling.temperature = 0;
  if (logprobs >= 0) r.sampling.logprobs = logprobs;
  return r;
}

void ExpectSameScores(const Scored& got, const Scored& want, size_t at) {
  EXPECT_EQ(got.token, want.token) << at;
  EXPECT_EQ(got.logprob, want.logprob) << at;  // bitwise: the same logits row
  ASSERT_EQ(got.top.size(), want.top.size()) << at;
  for (size_t k = 0; k < got.top.size(); ++k) {
    EXPECT_EQ(got.top[k].token, want.top[k].token) << at << " top " << k;
    EXPECT_EQ(got.top[k].logprob, want.top[k].logprob) << at << " top " << k;
  }
}

void CheckPromptScoresEqualDecodeScores(std::optional<adapters::VariantRef> variant) {
  testing::Stories260K s = testing::LoadStories260K();
  EngineOptions o;
  o.threads = 2;
  o.max_batch_tokens = 64;
  o.max_running = 8;
  o.pool_bytes = 16 << 20;
  o.prefix_cache = true;
  o.max_prompt_logprob_rows = 7;  // a 45-token prompt in 7 chunks, boundaries inside blocks
  o.adapter_cache = std::make_shared<adapters::AdapterCache>(s.model->config(), int64_t{64} << 20);
  auto e = Engine::Create(s.model, s.tok, o);
  ASSERT_TRUE(e.ok()) << e.status().ToString();

  // 40 greedy tokens after "Once upon a time", each with its logprob and 3 alternatives.
  std::vector<int32_t> start = s.tok->Encode("Once upon a time", tokenizer::EncodeOptions{});
  ASSERT_GE(start.size(), 4u);
  GenerationRequest gen = Greedy(start, 40, 3);
  gen.variant = variant;
  const Outcome decoded = Collect(**(*e)->Submit(gen));
  ASSERT_EQ(decoded.generated.size(), 40u);
  EXPECT_TRUE(decoded.prompt_scores.empty());  // not asked for

  // The prompt and those tokens as one prompt, scored with 3 alternatives, n = 2 (only choice 0
  // reports them). The first generation left this prompt's blocks in the prefix cache; the
  // scored request computes them anyway (it never asks the cache).
  std::vector<int32_t> full = start;
  full.insert(full.end(), decoded.generated.begin(), decoded.generated.end());
  GenerationRequest scored = Greedy(full, 2, 3);
  scored.variant = variant;
  scored.prompt_logprobs = 3;
  scored.n = 2;
  const auto& m = (*e)->metrics();
  const uint64_t queried = m.prefix_cache_query_tokens.load();
  const Outcome got = Collect(**(*e)->Submit(scored));
  EXPECT_EQ(m.prefix_cache_query_tokens.load(), queried);
  // Again beside two unrelated requests (other rows, other chunking of the step): the same.
  auto other1 =
      (*e)->Submit(Greedy(s.tok->Encode("Lily and Ben", tokenizer::EncodeOptions{}), 30, 0));
  auto again = (*e)->Submit(scored);
  auto other2 = (*e)->Submit(Greedy(start, 30, 0));
  ASSERT_TRUE(other1.ok() && again.ok() && other2.ok());
  const Outcome got_again = Collect(**again);
  Collect(**other1);
  Collect(**other2);
  ASSERT_EQ(got_again.prompt_scores.size(), got.prompt_scores.size());
  for (size_t i = 0; i < got.prompt_scores.size(); ++i)
    ExpectSameScores(got_again.prompt_scores[i], got.prompt_scores[i], i);

  // Positions 1 … n − 1, each once, in order; the token at each is the prompt's.
  ASSERT_EQ(got.prompt_positions.size(), full.size() - 1);
  EXPECT_EQ(got.prompt_events_of_other_choices, 0);
  for (size_t i = 0; i < got.prompt_positions.size(); ++i) {
    EXPECT_EQ(got.prompt_positions[i], static_cast<int64_t>(i + 1));
    EXPECT_EQ(got.prompt_scores[i].token, full[i + 1]);
    EXPECT_LE(got.prompt_scores[i].logprob, 0.0f);
    ASSERT_EQ(got.prompt_scores[i].top.size(), 3u);
    EXPECT_GE(got.prompt_scores[i].top[0].logprob, got.prompt_scores[i].top[1].logprob);
  }
  // The generated part of the prompt: bitwise the decode path's scores.
  for (size_t j = 0; j < decoded.generated_scores.size(); ++j) {
    const size_t at = start.size() - 1 + j;  // prompt event of position start.size() + j
    ExpectSameScores(got.prompt_scores[at], decoded.generated_scores[j], j);
  }
  // Greedy: each of those tokens was the most likely one.
  for (size_t j = 0; j < decoded.generated.size(); ++j)
    EXPECT_EQ(got.prompt_scores[start.size() - 1 + j].top[0].token, decoded.generated[j]);
  // And the request still generates what the same prompt generates without scoring.
  GenerationRequest plain = Greedy(full, 2, -1);
  plain.variant = variant;
  EXPECT_EQ(got.generated, Collect(**(*e)->Submit(plain)).generated);
}

TEST(PromptLogprobsE2E, PromptScoresEqualTheDecodePathsScoresOfTheSameTokens) {
  CHORUS_REQUIRE_SHARED_MODEL(kModel);
  CheckPromptScoresEqualDecodeScores(std::nullopt);
}

TEST(PromptLogprobsE2E, PromptScoresEqualTheDecodePathsScoresUnderALora) {
  CHORUS_REQUIRE_SHARED_MODEL(kModel);
  testing::Stories260K s = testing::LoadStories260K();
  const auto& c = s.model->config();
  adapters::RandomLoraSpec spec;
  spec.rank = 8;
  spec.seed = 5;
  spec.b_std = 0.2f;
  const std::string dir = testing::TempDir() + "/prompt_logprobs_lora";
  std::filesystem::remove_all(dir);
  CHORUS_ASSERT_OK(adapters::WritePeftLora(dir, adapters::MakeRandomLora(c, spec), c));
  CheckPromptScoresEqualDecodeScores(
      adapters::VariantRef{.name = "lora", .id = {0x5eed, 1}, .path = dir});
}

TEST(PromptLogprobsE2E, OutOfRangeIsRefused) {
  CHORUS_REQUIRE_SHARED_MODEL(kModel);
  testing::Stories260K s = testing::LoadStories260K();
  EngineOptions o;
  o.threads = 1;
  o.pool_bytes = 16 << 20;
  auto e = Engine::Create(s.model, s.tok, o);
  ASSERT_TRUE(e.ok());
  GenerationRequest r = Greedy({1, 403, 407}, 1, -1);
  r.prompt_logprobs = kMaxLogprobs + 1;
  auto h = (*e)->Submit(r);
  ASSERT_FALSE(h.ok());
  EXPECT_NE(h.status().message().find("prompt_logprobs"), std::string::npos);
}

}  // namespace
}  // namespace chorus::engine
