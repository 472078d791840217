// Prefix caching end to end on stories260K: a request whose prompt shares a prefix with an
// earlier one skips the cached blocks and still produces bitwise the same tokens (greedy and
// seeded sampling, n > 1) as without the cache; a variant never reuses another's blocks (a LoRA
// on k/v changes the keys); cached blocks make way for new KV without preempting anyone.
#include <filesystem>
#include <thread>

#include "chorus/adapters/adapter_cache.h"
#include "chorus/adapters/lora/lora_files.h"
#include "chorus/engine/engine.h"
#include "chorus/model/loader.h"
#include "tests/testutil/stories260k.h"
#include "tests/testutil/testutil.h"

namespace chorus::engine {
namespace {

const char* kModel = "stories260K/stories260K.bin";

// Gauges are published at the end of the step that pushed the last event: wait for them.
template <typename Pred>
bool WaitFor(Pred pred) {
  for (int i = 0; i < 2000 && !pred(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return pred();
}

std::vector<std::vector<int32_t>> RunToEnd(RequestHandle& h) {
  std::vector<std::vector<int32_t>> toks(static_cast<size_t>(h.n_choices()));
  int done = 0;
  while (done < h.n_choices()) {
    auto ev = h.Next(std::chrono::milliseconds(30000));
    if (!ev) {
      ADD_FAILURE() << "timeout";
      return toks;
    }
    if (ev->token >= 0) toks[static_cast<size_t>(ev->index)].push_back(ev->token);
    if (ev->finish != FinishReason::kNone) ++done;
  }
  return toks;
}

// A 70-token prompt: a shared 64-token "system prompt" (4 blocks of 16) and a 6-token question.
GenerationRequest Req(int question, std::optional<adapters::VariantRef> variant = std::nullopt) {
  GenerationRequest r;
  r.prompt = {1};
  for (int j = 0; j < 63; ++j) r.prompt.push_back(static_cast<int32_t>(260 + (j * 7) % 200));
  for (int j = 0; j < 6; ++j)
    r.prompt.push_back(static_cast<int32_t>(300 + (question * 11 + j * 3) % 150));
  r.max_tokens = 24;
  r.ignore_eos = true;
  r.sampling.temperature = 0;
  r.variant = std::move(variant);
  return r;
}

EngineOptions Options(const testing::Stories260K& s, bool prefix_cache,
                      kernels::KvDtype kv_dtype = kernels::KvDtype::kF32) {
  EngineOptions o;
  o.kv_dtype = kv_dtype;
  o.threads = 2;
  o.max_batch_tokens = 64;
  o.max_running = 8;
  o.pool_bytes = 16 << 20;
  o.prefix_cache = prefix_cache;
  o.adapter_cache = std::make_shared<adapters::AdapterCache>(s.model->config(), int64_t{64} << 20);
  return o;
}

std::vector<std::vector<int32_t>> Alone(const testing::Stories260K& s, GenerationRequest r,
                                        kernels::KvDtype kv_dtype = kernels::KvDtype::kF32) {
  auto e = Engine::Create(s.model, s.tok, Options(s, /*prefix_cache=*/false, kv_dtype));
  CHORUS_CHECK(e.ok());
  return RunToEnd(**(*e)->Submit(std::move(r)));
}

void CheckSharedPrefixIsReused(kernels::KvDtype kv_dtype) {
  testing::Stories260K s = testing::LoadStories260K();
  GenerationRequest sampled = Req(3);
  sampled.sampling.temperature = 0.8f;
  sampled.sampling.seed = 1234;
  sampled.n = 3;
  const auto want0 = Alone(s, Req(0), kv_dtype), want1 = Alone(s, Req(1), kv_dtype),
             want_s = Alone(s, sampled, kv_dtype);
  auto e = Engine::Create(s.model, s.tok, Options(s, true, kv_dtype));
  ASSERT_TRUE(e.ok());
  const auto& m = (*e)->metrics();
  EXPECT_EQ(RunToEnd(**(*e)->Submit(Req(0))), want0);
  EXPECT_EQ(m.prefix_cache_hit_tokens.load(), 0u);  // nothing cached yet
  EXPECT_GT(m.prefix_cache_blocks.load(), 4);       // the prompt's and the output's full blocks
  // Another question after the same 64 tokens: its 4 blocks come from the cache.
  EXPECT_EQ(RunToEnd(**(*e)->Submit(Req(1))), want1);
  EXPECT_EQ(m.prefix_cache_hit_tokens.load(), 64u);
  // The same prompt again: every full block of it (the last token is always computed).
  EXPECT_EQ(RunToEnd(**(*e)->Submit(Req(0))), want0);
  EXPECT_EQ(m.prefix_cache_hit_tokens.load(), 128u);
  // Seeded sampling with n = 3 choices forking the (partly cached) prompt.
  EXPECT_EQ(RunToEnd(**(*e)->Submit(sampled)), want_s);
  EXPECT_EQ(m.prefix_cache_hit_tokens.load(), 192u);
  EXPECT_GT(m.prefix_cache_query_tokens.load(), m.prefix_cache_hit_tokens.load());
  // Idle: cached blocks that nobody holds do not count as used.
  EXPECT_TRUE(WaitFor([&] { return m.kv_blocks_used.load() == 0; })) << m.kv_blocks_used.load();
  EXPECT_EQ(m.preemptions_total.load(), 0u);
}

TEST(PrefixCacheE2E, SharedPrefixIsReusedAndOutputsAreBitwiseTheSame) {
  CHORUS_REQUIRE_SHARED_MODEL(kModel);
  CheckSharedPrefixIsReused(kernels::KvDtype::kF32);
}

// The same with a bf16 KV cache: cached blocks hold the rounded values a recompute would write.
TEST(PrefixCacheE2E, SharedPrefixIsReusedAndOutputsAreBitwiseTheSameWithBf16Kv) {
  CHORUS_REQUIRE_SHARED_MODEL(kModel);
  CheckSharedPrefixIsReused(kernels::KvDtype::kBf16);
}

TEST(PrefixCacheE2E, AVariantNeverReusesAnotherVariantsBlocks) {
  CHORUS_REQUIRE_SHARED_MODEL(kModel);
  testing::Stories260K s = testing::LoadStories260K();
  const auto& c = s.model->config();
  // A LoRA on k and v only: it changes the keys and values themselves.
  adapters::RandomLoraSpec spec;
  spec.rank = 8;
  spec.seed = 77;
  spec.b_std = 0.2f;
  spec.targets = {model::Linear::kK, model::Linear::kV};
  const std::string dir = testing::TempDir() + "/prefix_cache_kv_lora";
  std::filesystem::remove_all(dir);
  CHORUS_ASSERT_OK(adapters::WritePeftLora(dir, adapters::MakeRandomLora(c, spec), c));
  const adapters::VariantRef kv_lora{.name = "kv", .id = {0xabc, 1}, .path = dir};
  const auto want_base = Alone(s, Req(0)), want_lora = Alone(s, Req(0, kv_lora));
  ASSERT_NE(want_base, want_lora);  // the adapter matters, or this proves nothing

  auto e = Engine::Create(s.model, s.tok, Options(s, true));
  ASSERT_TRUE(e.ok());
  const auto& m = (*e)->metrics();
  EXPECT_EQ(RunToEnd(**(*e)->Submit(Req(0))), want_base);
  EXPECT_EQ(RunToEnd(**(*e)->Submit(Req(0, kv_lora))), want_lora);
  EXPECT_EQ(m.prefix_cache_hit_tokens.load(), 0u);  // same tokens, other variant: no reuse
  EXPECT_EQ(RunToEnd(**(*e)->Submit(Req(1, kv_lora))), Alone(s, Req(1, kv_lora)));
  EXPECT_EQ(m.prefix_cache_hit_tokens.load(), 64u);  // its own blocks: reused
  // A new registration of the same files is another variant (a new version): no reuse.
  adapters::VariantRef replaced = kv_lora;
  replaced.id.version = 2;
  EXPECT_EQ(RunToEnd(**(*e)->Submit(Req(0, replaced))), want_lora);
  EXPECT_EQ(m.prefix_cache_hit_tokens.load(), 64u);
}

TEST(PrefixCacheE2E, CachedBlocksMakeWayForNewKvWithoutPreemption) {
  CHORUS_REQUIRE_SHARED_MODEL(kModel);
  testing::Stories260K s = testing::LoadStories260K();
  EngineOptions o = Options(s, true);
  o.pool_bytes = 64 * 20480;  // 64 blocks of 16 tokens
  auto e = Engine::Create(s.model, s.tok, o);
  ASSERT_TRUE(e.ok());
  const auto& m = (*e)->metrics();
  // Each request holds 70 + 200 tokens (17 blocks); five in turn leave more cached blocks
  // than the pool can keep, so later ones evict earlier ones' blocks.
  for (int q = 0; q < 5; ++q) {
    GenerationRequest r = Req(q);
    r.prompt[1] = static_cast<int32_t>(400 + q);  // different from the first block on
    r.max_tokens = 200;
    const auto want = Alone(s, r);
    EXPECT_EQ(RunToEnd(**(*e)->Submit(std::move(r))), want) << q;
  }
  EXPECT_GT(m.prefix_cache_evictions.load(), 0u);
  EXPECT_EQ(m.preemptions_total.load(), 0u);
  EXPECT_TRUE(WaitFor([&] { return m.kv_blocks_used.load() == 0; })) << m.kv_blocks_used.load();
}

}  // namespace
}  // namespace chorus::engine
