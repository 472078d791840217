// Engine behaviour on the real stories260K model: batching, preemption, cancellation, limits.
#include <future>
#include <thread>

#include "chorus/engine/engine.h"
#include "chorus/model/loader.h"
#include "tests/testutil/testutil.h"

namespace chorus::engine {
namespace {

const char* kModel = "stories260K/stories260K.bin";

struct Loaded {
  std::shared_ptr<const model::Model> model;
  std::shared_ptr<const tokenizer::Tokenizer> tok;
};

Loaded Load() {
  const std::string dir = testing::SharedModelsDir() + "/stories260K/";
  auto m = model::LoadModel(dir + "stories260K.bin");
  CHORUS_CHECK(m.ok()) << m.status().ToString();
  auto t = tokenizer::LoadTokenizer(dir + "tok512.bin");
  CHORUS_CHECK(t.ok()) << t.status().ToString();
  return {*m, std::shared_ptr<const tokenizer::Tokenizer>(std::move(*t))};
}

struct Output {
  std::vector<int32_t> tokens;
  std::string text;
  FinishReason finish = FinishReason::kNone;
};

// Collects one choice's events until it finishes.
Output Collect(RequestHandle& h) {
  Output o;
  while (o.finish == FinishReason::kNone) {
    auto ev = h.Next(std::chrono::milliseconds(30000));
    if (!ev) {
      ADD_FAILURE() << "no event within 30 s";
      break;
    }
    if (ev->token >= 0) o.tokens.push_back(ev->token);
    o.text += ev->text;
    o.finish = ev->finish;
  }
  return o;
}

// The engine publishes its gauges at the end of a step, just after the last events: poll.
int64_t BlocksUsedWhenSettled(const Engine& e) {
  for (int i = 0; i < 200 && e.kv_blocks_used() != 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  return e.kv_blocks_used();
}

GenerationRequest Greedy(std::vector<int32_t> prompt, int64_t max_tokens) {
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.sampling.temperature = 0;
  return r;
}

std::vector<int32_t> PromptFor(int i) {
  std::vector<int32_t> p = {1};
  for (int j = 0; j < 3 + i % 7; ++j) p.push_back(static_cast<int32_t>(260 + (i * 31 + j * 17) % 250));
  return p;
}

EngineOptions Opts() {
  EngineOptions o;
  o.threads = 2;
  o.max_batch_tokens = 64;
  o.max_running = 16;
  o.max_queue = 64;
  o.pool_bytes = 64 << 20;
  return o;
}

TEST(EngineTest, SameTokensAloneAndAmongSixteenConcurrent) {
  CHORUS_REQUIRE_SHARED_MODEL(kModel);
  Loaded l = Load();
  std::vector<Output> alone;
  {
    auto e = Engine::Create(l.model, l.tok, Opts());
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    for (int i = 0; i < 16; ++i) {
      auto h = (*e)->Submit(Greedy(PromptFor(i), 40));
      ASSERT_TRUE(h.ok()) << h.status().ToString();
      alone.push_back(Collect(**h));
    }
  }
  auto e = Engine::Create(l.model, l.tok, Opts());
  ASSERT_TRUE(e.ok());
  std::vector<std::shared_ptr<RequestHandle>> hs;
  for (int i = 0; i < 16; ++i) {
    auto h = (*e)->Submit(Greedy(PromptFor(i), 40));
    ASSERT_TRUE(h.ok());
    hs.push_back(*h);
  }
  for (int i = 0; i < 16; ++i) {
    Output o = Collect(*hs[static_cast<size_t>(i)]);
    EXPECT_EQ(o.tokens, alone[static_cast<size_t>(i)].tokens) << "request " << i;
    EXPECT_EQ(o.text, alone[static_cast<size_t>(i)].text) << "request " << i;
    EXPECT_EQ(o.finish, FinishReason::kLength);
  }
  EXPECT_EQ(BlocksUsedWhenSettled(**e), 0);
}

TEST(EngineTest, PreemptionDoesNotChangeOutput) {
  CHORUS_REQUIRE_SHARED_MODEL(kModel);
  Loaded l = Load();
  auto run = [&](int64_t pool_blocks, uint64_t* preemptions) {
    EngineOptions o = Opts();
    const auto& c = l.model->config();
    const int64_t page = ((c.n_layers * 2 * 16 * c.kv_dim() * 4) + 63) / 64 * 64;
    o.pool_bytes = std::max<int64_t>(pool_blocks * page, 1 << 20);
    o.max_batch_tokens = 16;  // long prompts take several steps
    auto e = Engine::Create(l.model, l.tok, o);
    CHORUS_CHECK(e.ok()) << e.status().ToString();
    std::vector<std::shared_ptr<RequestHandle>> hs;
    for (int i = 0; i < 8; ++i) {
      GenerationRequest r = Greedy(PromptFor(i), 100);
      r.sampling.temperature = 0.8f;  // sampled, seeded: the RNG state must survive preemption too
      r.sampling.seed = 100 + i;
      auto h = (*e)->Submit(std::move(r));
      CHORUS_CHECK(h.ok());
      hs.push_back(*h);
    }
    std::vector<Output> outs;
    for (auto& h : hs) outs.push_back(Collect(*h));
    *preemptions = (*e)->metrics().preemptions_total.load();
    EXPECT_EQ(BlocksUsedWhenSettled(**e), 0);
    return outs;
  };
  uint64_t p_big = 0, p_small = 0;
  auto big = run(1000, &p_big);
  auto small = run(24, &p_small);  // 8 sequences × up to 8 blocks each do not fit in 24 blocks
  EXPECT_EQ(p_big, 0u);
  EXPECT_GT(p_small, 0u) << "the small pool was expected to force preemption";
  for (size_t i = 0; i < big.size(); ++i) {
    EXPECT_EQ(small[i].tokens, big[i].tokens) << "request " << i;
  }
}

TEST(EngineTest, CancelFreesBlocksWithinAStep) {
  CHORUS_REQUIRE_SHARED_MODEL(kModel);
  Loaded l = Load();
  auto e = Engine::Create(l.model, l.tok, Opts());
  ASSERT_TRUE(e.ok());
  GenerationRequest r = Greedy(PromptFor(1), 400);
  r.ignore_eos = true;
  auto h = (*e)->Submit(std::move(r));
  ASSERT_TRUE(h.ok());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE((*h)->Next(std::chrono::milliseconds(10000)).has_value());
  EXPECT_GT((*e)->kv_blocks_used(), 0);
  (*h)->Cancel();
  Output o = Collect(**h);
  EXPECT_EQ(o.finish, FinishReason::kCancelled);
  EXPECT_EQ(BlocksUsedWhenSettled(**e), 0);
}

TEST(EngineTest, StopStringEndsGenerationAndIsNotEmitted) {
  CHORUS_REQUIRE_SHARED_MODEL(kModel);
  Loaded l = Load();
  auto e = Engine::Create(l.model, l.tok, Opts());
  ASSERT_TRUE(e.ok());
  auto full = Collect(**(*e)->Submit(Greedy({1}, 60)));
  ASSERT_NE(full.text.find("Lily"), std::string::npos) << full.text;
  GenerationRequest r = Greedy({1}, 60);
  r.stop = {"Lily"};
  auto cut = Collect(**(*e)->Submit(std::move(r)));
  EXPECT_EQ(cut.finish, FinishReason::kStop);
  EXPECT_EQ(cut.text, full.text.substr(0, full.text.find("Lily")));
}

TEST(EngineTest, SeedsMakeSamplingReproducibleAndChoicesDiffer) {
  CHORUS_REQUIRE_SHARED_MODEL(kModel);
  Loaded l = Load();
  auto e = Engine::Create(l.model, l.tok, Opts());
  ASSERT_TRUE(e.ok());
  auto make = [] {
    GenerationRequest r = Greedy({1}, 30);
    r.sampling.temperature = 1.0f;
    r.sampling.seed = 7;
    r.n = 2;
    return r;
  };
  auto collect2 = [](RequestHandle& h) {
    std::vector<std::vector<int32_t>> t(2);
    int done = 0;
    while (done < 2) {
      auto ev = h.Next(std::chrono::milliseconds(30000));
      if (!ev) break;
      if (ev->token >= 0) t[static_cast<size_t>(ev->index)].push_back(ev->token);
      if (ev->finish != FinishReason::kNone) ++done;
    }
    return t;
  };
  auto a = collect2(**(*e)->Submit(make()));
  auto b = collect2(**(*e)->Submit(make()));
  EXPECT_EQ(a, b);
  EXPECT_NE(a[0], a[1]);
}

TEST(EngineTest, RejectsBadRequestsAndFullQueue) {
  CHORUS_REQUIRE_SHARED_MODEL(kModel);
  Loaded l = Load();
  EngineOptions o = Opts();
  o.max_queue = 2;
  o.max_running = 1;
  auto e = Engine::Create(l.model, l.tok, o);
  ASSERT_TRUE(e.ok());
  EXPECT_EQ((*e)->Submit(Greedy({}, 5)).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*e)->Submit(Greedy({1, 9999}, 5)).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*e)->Submit(Greedy({1}, 600)).status().code(), StatusCode::kOutOfRange);
  GenerationRequest bad = Greedy({1}, 5);
  bad.sampling.top_p = 0;
  EXPECT_EQ((*e)->Submit(std::move(bad)).status().code(), StatusCode::kInvalidArgument);
  // Fill the queue: one running (long), then two waiting; the fourth is refused.
  std::vector<std::shared_ptr<RequestHandle>> hs;
  GenerationRequest longr = Greedy({1}, 500);
  longr.ignore_eos = true;
  hs.push_back(*(*e)->Submit(longr));
  ASSERT_TRUE(hs[0]->Next(std::chrono::milliseconds(10000)).has_value());  // running now
  hs.push_back(*(*e)->Submit(longr));
  hs.push_back(*(*e)->Submit(longr));
  EXPECT_EQ((*e)->Submit(longr).status().code(), StatusCode::kResourceExhausted);
  for (auto& h : hs) h->Cancel();
  (*e)->Shutdown(std::chrono::milliseconds(0));
  EXPECT_EQ((*e)->Submit(Greedy({1}, 5)).status().code(), StatusCode::kUnavailable);
}

}  // namespace
}  // namespace chorus::engine
