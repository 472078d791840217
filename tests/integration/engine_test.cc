// Engine behaviour on the real stories260K model: batching, preemption, cancellation, limits.
#include "chorus/engine/engine.h"

#include <future>
#include <thread>

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
  for (int i = 0; i < 200 && e.kv_blocks_used() != 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
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
  for (int j = 0; j < 3 + i % 7; ++j)
    p.push_back(static_cast<int32_t>(260 + (i * 31 + j * 17) % 250));
  return p;
}

EngineOptions Opts(kernels::KvDtype kv_dtype = kernels::KvDtype::kF32) {
  EngineOptions o;
  o.threads = 2;
  o.max_batch_tokens = 64;
  o.max_running = 16;
  o.max_queue = 64;
  o.pool_bytes = 64 << 20;
  o.kv_dtype = kv_dtype;
  return o;
}

// Bytes of one KV block of `model` (16 tokens) in `kv_dtype`.
int64_t PageBytes(const model::Model& model, kernels::KvDtype kv_dtype) {
  const auto& c = model.config();
  return ((c.n_layers * 2 * 16 * c.kv_dim() * (kv_dtype == kernels::KvDtype::kBf16 ? 2 : 4)) + 63) /
         64 * 64;
}

void CheckSameTokensAloneAndAmongSixteen(kernels::KvDtype kv_dtype) {
  Loaded l = Load();
  std::vector<Output> alone;
  {
    auto e = Engine::Create(l.model, l.tok, Opts(kv_dtype));
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    for (int i = 0; i < 16; ++i) {
      auto h = (*e)->Submit(Greedy(PromptFor(i), 40));
      ASSERT_TRUE(h.ok()) << h.status().ToString();
      alone.push_back(Collect(**h));
    }
  }
  auto e = Engine::Create(l.model, l.tok, Opts(kv_dtype));
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

TEST(EngineTest, SameTokensAloneAndAmongSixteenConcurrent) {
  CHORUS_REQUIRE_SHARED_MODEL(kModel);
  CheckSameTokensAloneAndAmongSixteen(kernels::KvDtype::kF32);
}

TEST(EngineTest, SameTokensAloneAndAmongSixteenConcurrentWithBf16Kv) {
  CHORUS_REQUIRE_SHARED_MODEL(kModel);
  CheckSameTokensAloneAndAmongSixteen(kernels::KvDtype::kBf16);
}

void CheckPreemptionDoesNotChangeOutput(kernels::KvDtype kv_dtype) {
  Loaded l = Load();
  // The pool is at least 1 MiB (51 f32 blocks of this model, 102 bf16 ones): in bf16, twice the
  // sequences (each up to 8 blocks) so that the small pool still runs out.
  const bool bf16 = kv_dtype == kernels::KvDtype::kBf16;
  const int n_requests = bf16 ? 16 : 8;
  auto run = [&](int64_t pool_blocks, uint64_t* preemptions) {
    EngineOptions o = Opts(kv_dtype);
    const int64_t page = PageBytes(*l.model, kv_dtype);
    o.pool_bytes = std::max<int64_t>(pool_blocks * page, 1 << 20);
    o.max_batch_tokens = 16;  // long prompts take several steps
    auto e = Engine::Create(l.model, l.tok, o);
    CHORUS_CHECK(e.ok()) << e.status().ToString();
    std::vector<std::shared_ptr<RequestHandle>> hs;
    for (int i = 0; i < n_requests; ++i) {
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

TEST(EngineTest, PreemptionDoesNotChangeOutput) {
  CHORUS_REQUIRE_SHARED_MODEL(kModel);
  CheckPreemptionDoesNotChangeOutput(kernels::KvDtype::kF32);
}

// Recompute after preemption writes the same rounded values into the bf16 cache.
TEST(EngineTest, PreemptionDoesNotChangeOutputWithBf16Kv) {
  CHORUS_REQUIRE_SHARED_MODEL(kModel);
  CheckPreemptionDoesNotChangeOutput(kernels::KvDtype::kBf16);
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

// llama2.c models end a story by sampling BOS (run.c stops there; they never emit EOS): the
// engine stops at it too, so no generated text runs on into the next story.
TEST(EngineTest, Llama2cModelStopsAtBos) {
  CHORUS_REQUIRE_SHARED_MODEL(kModel);
  Loaded l = Load();
  EXPECT_TRUE(l.tok->IsEos(1));
  auto e = Engine::Create(l.model, l.tok, Opts());
  ASSERT_TRUE(e.ok());
  int stopped = 0;
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    GenerationRequest r = Greedy({1}, 400);
    r.sampling.temperature = 1.0f;
    r.sampling.seed = seed;
    Output o = Collect(**(*e)->Submit(std::move(r)));
    ASSERT_FALSE(o.tokens.empty());
    for (size_t i = 0; i + 1 < o.tokens.size(); ++i) {
      EXPECT_NE(o.tokens[i], 1) << "seed " << seed << ": generation went on past BOS at " << i;
    }
    if (o.finish == FinishReason::kStop) ++stopped;
  }
  EXPECT_GT(stopped, 0) << "no sampled story ended within 400 tokens";
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

// Collects every choice of a request with `n` choices.
std::vector<Output> CollectChoices(RequestHandle& h, int n) {
  std::vector<Output> o(static_cast<size_t>(n));
  int done = 0;
  while (done < n) {
    auto ev = h.Next(std::chrono::milliseconds(30000));
    if (!ev) {
      ADD_FAILURE() << "no event within 30 s";
      break;
    }
    Output& c = o[static_cast<size_t>(ev->index)];
    if (ev->token >= 0) c.tokens.push_back(ev->token);
    c.text += ev->text;
    c.finish = ev->finish;
    if (ev->finish != FinishReason::kNone) ++done;
  }
  return o;
}

// A prompt of exactly `len` tokens.
std::vector<int32_t> LongPrompt(int64_t len) {
  std::vector<int32_t> p = {1};
  for (int64_t j = 1; j < len; ++j) p.push_back(static_cast<int32_t>(260 + (j * 37) % 250));
  return p;
}

GenerationRequest Seeded(std::vector<int32_t> prompt, int64_t max_tokens, uint64_t seed, int n) {
  GenerationRequest r = Greedy(std::move(prompt), max_tokens);
  r.sampling.temperature = 0.9f;
  r.sampling.seed = seed;
  r.ignore_eos = true;
  r.n = n;
  return r;
}

// Choice i of an n-choice request (which shares the prompt's blocks) == the same request with
// seed + i run alone, for sampled and greedy requests, prompts on and off block boundaries, and
// with fewer running slots than choices (the choices that wait recompute one token).
void CheckChoicesSharingThePromptEqualSeparateRuns(kernels::KvDtype kv_dtype) {
  Loaded l = Load();
  for (int64_t max_running : {16, 2}) {
    for (int64_t len : {int64_t{5}, int64_t{48}, int64_t{77}}) {
      EngineOptions o = Opts(kv_dtype);
      o.max_running = max_running;
      auto e = Engine::Create(l.model, l.tok, o);
      ASSERT_TRUE(e.ok());
      std::vector<Output> separate;
      for (int i = 0; i < 4; ++i) {
        separate.push_back(Collect(**(*e)->Submit(Seeded(LongPrompt(len), 40, 500 + i, 1))));
      }
      const uint64_t prompt_before = (*e)->metrics().prompt_tokens_total.load();
      auto shared = CollectChoices(**(*e)->Submit(Seeded(LongPrompt(len), 40, 500, 4)), 4);
      const uint64_t prompt_rows = (*e)->metrics().prompt_tokens_total.load() - prompt_before;
      for (size_t i = 0; i < 4; ++i) {
        EXPECT_EQ(shared[i].tokens, separate[i].tokens)
            << "choice " << i << " len " << len << " running " << max_running;
        EXPECT_EQ(shared[i].text, separate[i].text) << "choice " << i;
        EXPECT_EQ(shared[i].finish, FinishReason::kLength);
      }
      EXPECT_NE(shared[0].tokens, shared[1].tokens);
      // The prompt is computed once (plus the last prompt token of each choice that waited).
      EXPECT_LE(prompt_rows, static_cast<uint64_t>(len + (max_running < 4 ? 3 : 0)))
          << "len " << len;
      // Greedy choices are all the single greedy run.
      GenerationRequest g = Greedy(LongPrompt(len), 30);
      auto alone = Collect(**(*e)->Submit(g));
      g.n = 4;
      for (const Output& c : CollectChoices(**(*e)->Submit(g), 4))
        EXPECT_EQ(c.tokens, alone.tokens);
      EXPECT_EQ(BlocksUsedWhenSettled(**e), 0);
    }
  }
}

TEST(EngineTest, ChoicesSharingThePromptEqualSeparateRuns) {
  CHORUS_REQUIRE_SHARED_MODEL(kModel);
  CheckChoicesSharingThePromptEqualSeparateRuns(kernels::KvDtype::kF32);
}

// Forks share bf16 blocks and copy them on write unchanged.
TEST(EngineTest, ChoicesSharingThePromptEqualSeparateRunsWithBf16Kv) {
  CHORUS_REQUIRE_SHARED_MODEL(kModel);
  CheckChoicesSharingThePromptEqualSeparateRuns(kernels::KvDtype::kBf16);
}

// While 4 choices of a long prompt run, the pool holds the prompt's blocks once.
TEST(EngineTest, ChoicesUseFewerBlocksThanSeparateRequests) {
  CHORUS_REQUIRE_SHARED_MODEL(kModel);
  Loaded l = Load();
  auto e = Engine::Create(l.model, l.tok, Opts());
  ASSERT_TRUE(e.ok());
  const int64_t len = 160;  // 10 blocks of 16
  auto blocks_while_running = [&](int n) {
    auto h = (*e)->Submit(Seeded(LongPrompt(len), 300, 9, n));
    CHORUS_CHECK(h.ok());
    std::vector<int> seen(static_cast<size_t>(n), 0);
    int ready = 0;
    // Every choice has produced 3 tokens: all are running, and the gauges published at the end
    // of the step that produced the 2nd one cover position 160 (the 11th block).
    while (ready < n) {
      auto ev = (*h)->Next(std::chrono::milliseconds(30000));
      CHORUS_CHECK(ev.has_value());
      if (++seen[static_cast<size_t>(ev->index)] == 3) ++ready;
    }
    const int64_t used = (*e)->kv_blocks_used();
    (*h)->Cancel();
    CollectChoices(**h, n);
    EXPECT_EQ(BlocksUsedWhenSettled(**e), 0) << "n " << n;
    return used;
  };
  const int64_t one = blocks_while_running(1);
  const int64_t four = blocks_while_running(4);
  EXPECT_GE(one, 11);
  // Unshared, 4 choices would hold 4 × 11 blocks; shared: the 10 prompt blocks + 1-2 each.
  EXPECT_LE(four, 10 + 4 * 2) << "one choice used " << one;
  EXPECT_LT(four, 2 * one);
}

// Preemption (a small pool) and cancellation of choices that share blocks: outputs unchanged,
// every block back in the pool.
TEST(EngineTest, ChoicesSurvivePreemptionAndCancellation) {
  CHORUS_REQUIRE_SHARED_MODEL(kModel);
  Loaded l = Load();
  const auto& c = l.model->config();
  const int64_t page = ((c.n_layers * 2 * 16 * c.kv_dim() * 4) + 63) / 64 * 64;
  auto run = [&](int64_t pool_blocks, uint64_t* preemptions) {
    EngineOptions o = Opts();
    o.pool_bytes = std::max<int64_t>(pool_blocks * page, 1 << 20);
    o.max_batch_tokens = 16;
    auto e = Engine::Create(l.model, l.tok, o);
    CHORUS_CHECK(e.ok()) << e.status().ToString();
    std::vector<std::shared_ptr<RequestHandle>> hs;
    for (int i = 0; i < 3; ++i)
      hs.push_back(*(*e)->Submit(Seeded(LongPrompt(40 + 9 * i), 90, 70 + i, 4)));
    std::vector<std::vector<Output>> outs;
    for (auto& h : hs) outs.push_back(CollectChoices(*h, 4));
    *preemptions = (*e)->metrics().preemptions_total.load();
    EXPECT_EQ(BlocksUsedWhenSettled(**e), 0) << "pool " << pool_blocks;
    return outs;
  };
  uint64_t p_big = 0, p_small = 0;
  auto big = run(1000, &p_big);
  auto small = run(20, &p_small);  // 12 choices need up to 9 blocks each
  EXPECT_EQ(p_big, 0u);
  EXPECT_GT(p_small, 0u) << "the small pool was expected to force preemption";
  for (size_t r = 0; r < big.size(); ++r) {
    for (size_t i = 0; i < 4; ++i)
      EXPECT_EQ(small[r][i].tokens, big[r][i].tokens) << "request " << r << " choice " << i;
  }

  // Cancelling an n=4 request mid-generation, and one still queued behind it, frees everything.
  EngineOptions o = Opts();
  o.max_running = 4;
  auto e = Engine::Create(l.model, l.tok, o);
  ASSERT_TRUE(e.ok());
  auto a = *(*e)->Submit(Seeded(LongPrompt(70), 400, 1, 4));
  auto b = *(*e)->Submit(Seeded(LongPrompt(70), 400, 2, 4));
  ASSERT_TRUE(a->Next(std::chrono::milliseconds(10000)).has_value());
  ASSERT_TRUE(a->Next(std::chrono::milliseconds(10000)).has_value());
  b->Cancel();
  a->Cancel();
  for (const Output& out : CollectChoices(*a, 4)) EXPECT_EQ(out.finish, FinishReason::kCancelled);
  for (const Output& out : CollectChoices(*b, 4)) EXPECT_EQ(out.finish, FinishReason::kCancelled);
  EXPECT_EQ(BlocksUsedWhenSettled(**e), 0);
  EXPECT_EQ((*e)->metrics().queue_length.load(), 0);
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

// SubmitAll queues all of its requests or none: one bad request refuses the lot, and no other
// is left running; a good lot gives each request what it gives alone.
TEST(EngineTest, SubmitAllQueuesAllOrNone) {
  CHORUS_REQUIRE_SHARED_MODEL(kModel);
  Loaded l = Load();
  EngineOptions o = Opts();
  o.max_queue = 4;
  auto e = Engine::Create(l.model, l.tok, o);
  ASSERT_TRUE(e.ok());
  auto lot = [](GenerationRequest last) {
    std::vector<GenerationRequest> v;
    v.push_back(Greedy(PromptFor(0), 8));
    v.push_back(Greedy(PromptFor(1), 8));
    v.push_back(std::move(last));
    return v;
  };
  EXPECT_EQ((*e)->SubmitAll(lot(Greedy({1, 9999}, 5))).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ((*e)->SubmitAll(lot(Greedy({1}, 600))).status().code(), StatusCode::kOutOfRange);
  GenerationRequest too_many = Greedy(PromptFor(2), 8);
  too_many.n = 3;  // 5 sequences in all, the queue holds 4
  EXPECT_EQ((*e)->SubmitAll(lot(std::move(too_many))).status().code(),
            StatusCode::kResourceExhausted);
  EXPECT_EQ((*e)->metrics().requests_total.load(), 0u);  // nothing of the refused lots queued
  EXPECT_EQ((*e)->metrics().queue_length.load(), 0);
  auto hs = (*e)->SubmitAll(lot(Greedy(PromptFor(2), 8)));
  ASSERT_TRUE(hs.ok()) << hs.status().ToString();
  ASSERT_EQ(hs->size(), 3u);
  for (int i = 0; i < 3; ++i) {
    auto alone = Engine::Create(l.model, l.tok, Opts());
    ASSERT_TRUE(alone.ok());
    auto h = (*alone)->Submit(Greedy(PromptFor(i), 8));
    ASSERT_TRUE(h.ok());
    EXPECT_EQ(Collect(*(*hs)[static_cast<size_t>(i)]).tokens, Collect(**h).tokens) << i;
  }
  EXPECT_EQ((*e)->metrics().requests_total.load(), 3u);
}

}  // namespace
}  // namespace chorus::engine
