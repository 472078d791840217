// Mixed-adapter batches through the engine: each request's tokens are the same whether it runs
// alone or in a batch with other adapters and the base model (correctness).
#include <filesystem>
#include <thread>

#include "chorus/adapters/lora/lora_adapter.h"
#include "chorus/adapters/lora/lora_files.h"
#include "chorus/engine/engine.h"
#include "chorus/model/loader.h"
#include "tests/testutil/stories260k.h"
#include "tests/testutil/testutil.h"

namespace chorus::engine {
namespace {

const char* kModel = "stories260K/stories260K.bin";

std::vector<int32_t> RunToEnd(RequestHandle& h) {
  std::vector<int32_t> toks;
  for (;;) {
    auto ev = h.Next(std::chrono::milliseconds(30000));
    if (!ev) {
      ADD_FAILURE() << "timeout";
      return toks;
    }
    if (ev->token >= 0) toks.push_back(ev->token);
    if (ev->finish != FinishReason::kNone) return toks;
  }
}

// An adapter as the server hands it to the engine: PEFT files on disk and a VariantRef (name,
// id, path). The engine's residency loads it through its host cache (the serving path).
adapters::VariantRef WriteVariant(const model::ModelConfig& c, const adapters::LoraWeights& w,
                                  const std::string& name) {
  static uint64_t next_version = 1;
  const std::string dir = testing::TempDir() + "/engine_lora_" + name;
  std::filesystem::remove_all(dir);
  CHORUS_CHECK(adapters::WritePeftLora(dir, w, c).ok());
  return {.name = name, .id = {adapters::Fnv1a64(name), next_version++}, .path = dir};
}

// Engine options with a host cache (adapters are loaded through it).
EngineOptions WithCache(EngineOptions o, const model::ModelConfig& c,
                        adapters::LoraStorage storage = adapters::LoraLimits{}.storage) {
  adapters::LoraLimits limits;
  limits.storage = storage;
  o.adapter_cache = std::make_shared<adapters::AdapterCache>(c, int64_t{64} << 20, limits);
  return o;
}

TEST(EngineLoraTest, SixteenRequestsOverEightAdaptersMatchAlone) {
  CHORUS_REQUIRE_SHARED_MODEL(kModel);
  const std::string dir = testing::SharedModelsDir() + "/stories260K/";
  auto m = model::LoadModel(dir + "stories260K.bin");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  auto t = tokenizer::LoadTokenizer(dir + "tok512.bin");
  ASSERT_TRUE(t.ok());
  std::shared_ptr<const tokenizer::Tokenizer> tok(std::move(*t));
  // Eight adapters of mixed ranks (and one with only attention targets).
  std::vector<adapters::VariantRef> loras;
  const int64_t ranks[] = {1, 8, 16, 64, 4, 8, 32, 2};
  for (int i = 0; i < 8; ++i) {
    adapters::RandomLoraSpec spec;
    spec.rank = ranks[i];
    spec.seed = 1000 + static_cast<uint64_t>(i);
    spec.b_std = 0.2f;  // visible effect on the tiny model
    if (i == 4) spec.targets = {model::Linear::kQ, model::Linear::kV};
    std::string name = "a";  // appended: GCC 12 -O2 reports a false -Wrestrict for "a" + ...
    name += std::to_string(i);
    loras.push_back(
        WriteVariant((*m)->config(), adapters::MakeRandomLora((*m)->config(), spec), name));
  }
  auto request = [&](int i) {
    GenerationRequest r;
    r.prompt = {1};
    for (int j = 0; j < 2 + i % 5; ++j)
      r.prompt.push_back(static_cast<int32_t>(300 + (i * 13 + j * 7) % 200));
    r.max_tokens = 24;
    r.sampling.temperature = 0;
    if (i % 2 == 1) r.variant = loras[static_cast<size_t>(i / 2)];  // 8 base, 8 on adapters
    return r;
  };
  EngineOptions o;
  o.threads = 2;
  o.max_batch_tokens = 64;
  o.max_running = 16;
  o.pool_bytes = 64 << 20;
  o = WithCache(o, (*m)->config());
  std::vector<std::vector<int32_t>> alone;
  {
    auto e = Engine::Create(*m, tok, o);
    ASSERT_TRUE(e.ok());
    for (int i = 0; i < 16; ++i) alone.push_back(RunToEnd(**(*e)->Submit(request(i))));
  }
  // Adapters must change the output, or the comparison below proves nothing.
  int differs = 0;
  for (int i = 1; i < 16; i += 2)
    differs += alone[static_cast<size_t>(i)] != alone[static_cast<size_t>(i - 1)] ? 1 : 0;
  EXPECT_GE(differs, 4);
  std::vector<std::shared_ptr<RequestHandle>> hs;
  auto e2 = Engine::Create(*m, tok, o);  // its own host cache: every adapter starts cold
  ASSERT_TRUE(e2.ok());
  for (int i = 0; i < 16; ++i) hs.push_back(*(*e2)->Submit(request(i)));
  for (int i = 0; i < 16; ++i)
    EXPECT_EQ(RunToEnd(*hs[static_cast<size_t>(i)]), alone[static_cast<size_t>(i)])
        << "request " << i;
}

// ---- Residency: unified paging, loader threads, cold start (docs/architecture.md, "Memory tiers")
// ----

adapters::LoraWeights Weights(const model::ModelConfig& c, int64_t rank, uint64_t seed) {
  adapters::RandomLoraSpec spec;
  spec.rank = rank;
  spec.seed = seed;
  spec.b_std = 0.2f;
  return adapters::MakeRandomLora(c, spec);
}

adapters::VariantRef Adapter(const model::ModelConfig& c, int64_t rank, uint64_t seed) {
  std::string name = "r";  // appended: GCC 12 -O2 reports a false -Wrestrict for "r" + ...
  name += std::to_string(rank);
  name += "s";
  name += std::to_string(seed);
  return WriteVariant(c, Weights(c, rank, seed), name);
}

GenerationRequest Req(int i, std::optional<adapters::VariantRef> variant, int64_t max_tokens) {
  GenerationRequest r;
  r.prompt = {1};
  for (int j = 0; j < 3 + i % 4; ++j)
    r.prompt.push_back(static_cast<int32_t>(300 + (i * 17 + j * 5) % 200));
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  r.sampling.temperature = 0;
  r.variant = std::move(variant);
  return r;
}

EngineOptions SmallOptions(const testing::Stories260K& s, int64_t pool_bytes,
                           adapters::LoraStorage storage = adapters::LoraLimits{}.storage) {
  EngineOptions o;
  o.threads = 2;
  o.max_batch_tokens = 64;
  o.max_running = 16;
  o.pool_bytes = pool_bytes;
  return WithCache(o, s.model->config(), storage);
}

// Gauges are published at the end of the step that pushed the last event: wait for them.
template <typename Pred>
bool WaitFor(Pred pred) {
  for (int i = 0; i < 2000; ++i) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return pred();
}

std::vector<int32_t> Alone(const testing::Stories260K& s, GenerationRequest r) {
  auto e = Engine::Create(s.model, s.tok, SmallOptions(s, 64 << 20));
  CHORUS_CHECK(e.ok());
  return RunToEnd(**(*e)->Submit(std::move(r)));
}

class EngineResidencyStorageTest : public ::testing::TestWithParam<adapters::LoraStorage> {};

TEST_P(EngineResidencyStorageTest, ColdRequestEqualsWarmAndAdapterPagesComeFromThePool) {
  CHORUS_REQUIRE_SHARED_MODEL(kModel);
  testing::Stories260K s = testing::LoadStories260K();
  const auto a = WriteVariant(s.model->config(), Weights(s.model->config(), 16, 7), "cold");
  EngineOptions host_only = SmallOptions(s, 64 << 20, GetParam());
  host_only.adapter_pool_copies = false;
  std::vector<int32_t> host_tokens;
  {
    auto e = Engine::Create(s.model, s.tok, host_only);
    ASSERT_TRUE(e.ok());
    host_tokens = RunToEnd(**(*e)->Submit(Req(0, a, 24)));
    EXPECT_EQ((*e)->metrics().pool_pages_adapter.load(), 0);
  }
  auto e = Engine::Create(s.model, s.tok, SmallOptions(s, 64 << 20, GetParam()));
  ASSERT_TRUE(e.ok());
  const auto& m = (*e)->metrics();
  // Cold: the adapter is not resident; the request starts from the host copy once it is read.
  EXPECT_EQ(RunToEnd(**(*e)->Submit(Req(0, a, 24))), host_tokens);
  EXPECT_EQ(m.adapter_pool_misses.load(), 1u);
  EXPECT_GT(m.pool_pages_adapter.load(), 0);  // the pool copy's pages (kind kAdapter)
  EXPECT_GT(m.pool_pages_total.load(), m.pool_pages_adapter.load());
  // Warm: once the loader's copy has landed, the same request reads the pool copy.
  for (int i = 0; i < 100 && m.adapter_pool_hits.load() == 0; ++i) {
    EXPECT_EQ(RunToEnd(**(*e)->Submit(Req(0, a, 24))), host_tokens) << "run " << i;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_GE(m.adapter_pool_hits.load(), 1u);
  EXPECT_EQ(m.adapter_pool_loads.load(), 1u);
  EXPECT_EQ(m.adapters_resident.load(), 1);
  EXPECT_EQ(RunToEnd(**(*e)->Submit(Req(0, a, 24))), host_tokens);
}

INSTANTIATE_TEST_SUITE_P(Storage, EngineResidencyStorageTest,
                         ::testing::Values(adapters::LoraStorage::kF32,
                                           adapters::LoraStorage::kBF16),
                         [](const auto& info) {
                           return std::string(adapters::LoraStorageName(info.param));
                         });

// 80 pages of 20 KiB (one stories260K KV block of 16 tokens); a rank-32 adapter on every linear
// takes ~37 of them.
constexpr int64_t kSmallPool = 80 * 20480;

// The small pool, f32 adapters, and no prefix cache: these tests count which pages KV takes
// from whom, and cached blocks of finished requests would add a third party (their eviction
// order is tested in tests/integration/prefix_cache_test.cc).
EngineOptions SmallPoolOptions(const testing::Stories260K& s) {
  EngineOptions o = SmallOptions(s, kSmallPool, adapters::LoraStorage::kF32);
  o.prefix_cache = false;
  return o;
}

TEST(EngineResidencyTest, KvEvictsUnpinnedAdaptersBeforePreempting) {
  CHORUS_REQUIRE_SHARED_MODEL(kModel);
  testing::Stories260K s = testing::LoadStories260K();
  auto a = Adapter(s.model->config(), 32, 8);
  auto e = Engine::Create(s.model, s.tok, SmallPoolOptions(s));
  ASSERT_TRUE(e.ok());
  const auto& m = (*e)->metrics();
  for (int i = 0; i < 100 && m.adapter_pool_hits.load() == 0; ++i) {
    RunToEnd(**(*e)->Submit(Req(1, a, 4)));
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(m.adapters_resident.load(), 1);
  const int64_t adapter_pages = m.pool_pages_adapter.load();
  ASSERT_GE(adapter_pages, 30);
  // Two base requests of 28 blocks each: they fit only if the idle adapter makes room.
  const auto want0 = Alone(s, Req(2, std::nullopt, 440)),
             want1 = Alone(s, Req(3, std::nullopt, 440));
  auto h0 = *(*e)->Submit(Req(2, std::nullopt, 440));
  auto h1 = *(*e)->Submit(Req(3, std::nullopt, 440));
  EXPECT_EQ(RunToEnd(*h0), want0);
  EXPECT_EQ(RunToEnd(*h1), want1);
  EXPECT_GE(m.adapter_pool_evictions.load(), 1u);
  EXPECT_EQ(m.preemptions_total.load(), 0u);  // KV won without preempting anyone
  EXPECT_TRUE(WaitFor([&] { return m.adapters_resident.load() == 0; }));
}

TEST(EngineResidencyTest, PinnedAdapterIsNeverEvictedKvPreemptsInstead) {
  CHORUS_REQUIRE_SHARED_MODEL(kModel);
  testing::Stories260K s = testing::LoadStories260K();
  auto a = Adapter(s.model->config(), 32, 9);
  // a: 28 blocks, b and c: 16 each. With a's ~37 adapter pages pinned, 60 blocks do not fit in
  // the 43 left; once a finishes, b and c fit without touching the (then unpinned) copy.
  const auto want_a = Alone(s, Req(4, a, 440));
  const auto want_b = Alone(s, Req(5, std::nullopt, 240)),
             want_c = Alone(s, Req(6, std::nullopt, 240));
  auto e = Engine::Create(s.model, s.tok, SmallPoolOptions(s));
  ASSERT_TRUE(e.ok());
  const auto& m = (*e)->metrics();
  auto ha = *(*e)->Submit(Req(4, a, 440));
  auto hb = *(*e)->Submit(Req(5, std::nullopt, 240));
  auto hc = *(*e)->Submit(Req(6, std::nullopt, 240));
  EXPECT_EQ(RunToEnd(*ha), want_a);
  EXPECT_EQ(RunToEnd(*hb), want_b);
  EXPECT_EQ(RunToEnd(*hc), want_c);
  EXPECT_EQ(m.adapter_pool_loads.load(), 1u);      // the copy landed while `a` ran...
  EXPECT_GE(m.preemptions_total.load(), 1u);       // ...KV ran out...
  EXPECT_EQ(m.adapter_pool_evictions.load(), 0u);  // ...and the pinned copy stayed
}

TEST(EngineResidencyTest, DiskLoadInBackgroundColdEqualsWarmErrorsFinishTheRequest) {
  CHORUS_REQUIRE_SHARED_MODEL(kModel);
  testing::Stories260K s = testing::LoadStories260K();
  const auto& c = s.model->config();
  const std::string dir = testing::TempDir() + "/engine_residency_peft";
  std::filesystem::remove_all(dir);
  CHORUS_ASSERT_OK(adapters::WritePeftLora(dir, Weights(c, 8, 11), c));
  const adapters::VariantRef disk{.name = "disk", .id = {42, 1}, .path = dir};
  const auto want_adapter = Alone(s, Req(7, disk, 32));
  const auto want_base = Alone(s, Req(8, std::nullopt, 200));

  auto e = Engine::Create(s.model, s.tok, SmallOptions(s, 64 << 20));
  ASSERT_TRUE(e.ok());
  const auto& m = (*e)->metrics();
  auto base = *(*e)->Submit(Req(8, std::nullopt, 200));
  ASSERT_TRUE(
      base->Next(std::chrono::milliseconds(30000)).has_value());  // the base request is stepping
  GenerationRequest cold = Req(7, disk, 32);
  GenerationRequest broken =
      Req(9, adapters::VariantRef{.name = "gone", .id = {43, 1}, .path = dir + "/vanished"}, 32);
  auto hc = (*e)->Submit(std::move(cold));
  auto hb = (*e)->Submit(std::move(broken));
  ASSERT_TRUE(hc.ok() && hb.ok());  // queued at once; the loads run on the loader thread
  EXPECT_EQ(RunToEnd(**hc), want_adapter);
  auto ev = (*hb)->Next(std::chrono::milliseconds(30000));
  ASSERT_TRUE(ev.has_value());
  EXPECT_EQ(ev->finish, FinishReason::kError);
  EXPECT_EQ(ev->error_code, StatusCode::kInternal);
  EXPECT_NE(ev->error.find("adapter 'gone' could not be loaded"), std::string::npos) << ev->error;
  std::vector<int32_t> base_tokens = RunToEnd(*base);
  EXPECT_EQ(base_tokens.size() + 1, want_base.size());  // one token was read above
  EXPECT_TRUE(std::equal(base_tokens.begin(), base_tokens.end(), want_base.begin() + 1));
  EXPECT_EQ(m.adapter_disk_loads.load(), 2u);
  EXPECT_EQ(m.adapter_disk_load_errors.load(), 1u);
}

TEST(EngineResidencyTest, MaxAdaptersPerStepIsRespected) {
  CHORUS_REQUIRE_SHARED_MODEL(kModel);
  testing::Stories260K s = testing::LoadStories260K();
  std::vector<adapters::VariantRef> loras;
  for (int i = 0; i < 6; ++i)
    loras.push_back(Adapter(s.model->config(), 4 + 4 * i, 20 + static_cast<uint64_t>(i)));
  std::vector<std::vector<int32_t>> want;
  for (int i = 0; i < 7; ++i)
    want.push_back(
        Alone(s, Req(i, i < 6 ? std::optional(loras[static_cast<size_t>(i)]) : std::nullopt, 16)));
  for (int64_t cap : {int64_t{0}, int64_t{2}}) {
    EngineOptions o = SmallOptions(s, 64 << 20);
    o.max_adapters_per_step = cap;
    auto e = Engine::Create(s.model, s.tok, o);
    ASSERT_TRUE(e.ok());
    std::vector<std::shared_ptr<RequestHandle>> hs;
    for (int i = 0; i < 7; ++i)
      hs.push_back(*(*e)->Submit(
          Req(i, i < 6 ? std::optional(loras[static_cast<size_t>(i)]) : std::nullopt, 16)));
    for (int i = 0; i < 7; ++i)
      EXPECT_EQ(RunToEnd(*hs[static_cast<size_t>(i)]), want[static_cast<size_t>(i)])
          << cap << " " << i;
    if (cap == 0) {
      EXPECT_GT((*e)->metrics().adapters_per_step_max.load(),
                2);  // the workload can exceed the cap
    } else {
      EXPECT_EQ((*e)->metrics().adapters_per_step_max.load(), cap);
    }
  }
}

// The queue of the fairness tests below, on an engine with a cap of 1 adapter per step and two
// running slots: a long request for adapter A, then one for B, then 20 short ones for A.
EngineOptions CappedOptions(const testing::Stories260K& s) {
  EngineOptions o = SmallOptions(s, 64 << 20);
  o.max_adapters_per_step = 1;
  o.max_running = 2;
  return o;
}
struct CappedQueue {
  std::shared_ptr<RequestHandle> long_a, b;
  std::vector<std::shared_ptr<RequestHandle>> short_a;
};
CappedQueue SubmitCappedQueue(Engine* e, const adapters::VariantRef& a,
                              const adapters::VariantRef& b, int64_t long_tokens) {
  // Both adapters in the host cache first, so the queue's order is the admission order (not the
  // order in which two loader threads happen to finish reading them).
  RunToEnd(**e->Submit(Req(0, a, 1)));
  RunToEnd(**e->Submit(Req(0, b, 1)));
  // One SubmitAll: the scheduler sees the whole queue at its next step. (Submitted one by one,
  // a test thread descheduled after B let B be passed over kMaxPasses times by the long request
  // alone, so that no short one could overtake it.)
  std::vector<GenerationRequest> reqs;
  reqs.push_back(Req(0, a, long_tokens));
  reqs.push_back(Req(1, b, 8));
  for (int i = 0; i < 20; ++i) reqs.push_back(Req(2 + i, a, 3));
  auto handles = e->SubmitAll(std::move(reqs));
  CHORUS_CHECK(handles.ok()) << handles.status().ToString();
  CappedQueue q;
  q.long_a = (*handles)[0];
  q.b = (*handles)[1];
  q.short_a.assign(handles->begin() + 2, handles->end());
  return q;
}

// Fairness under --max-adapters-per-step: the request for B waits behind the long request for
// A and the 20 short A requests, which could be admitted one after another forever (A is always
// in the step). B may be overtaken only a bounded number of times (FcfsPolicy::kMaxPasses = 8 in
// engine/policy.h); then nothing newer is admitted before it, and it runs as soon as A leaves the
// step. Without that bound B would start after all 20.
TEST(EngineResidencyTest, CappedAdapterIsOvertakenOnlyBoundedTimes) {
  CHORUS_REQUIRE_SHARED_MODEL(kModel);
  testing::Stories260K s = testing::LoadStories260K();
  auto a = Adapter(s.model->config(), 8, 40), b = Adapter(s.model->config(), 16, 41);
  const auto want_b = Alone(s, Req(1, b, 8));
  auto e = Engine::Create(s.model, s.tok, CappedOptions(s));
  ASSERT_TRUE(e.ok());
  CappedQueue q = SubmitCappedQueue(e->get(), a, b, 48);
  EXPECT_EQ(RunToEnd(*q.b), want_b);
  RunToEnd(*q.long_a);
  for (auto& h : q.short_a) RunToEnd(*h);
  // All were submitted at once; first tokens are steps apart, so TTFT orders them.
  int ahead_of_b = 0;
  for (auto& h : q.short_a) ahead_of_b += h->ttft_seconds() < q.b->ttft_seconds() ? 1 : 0;
  EXPECT_GE(ahead_of_b, 1);  // overtaking is allowed (A is in the step) ...
  EXPECT_LE(ahead_of_b, 8);  // ... but bounded
  EXPECT_LT(q.b->ttft_seconds(), q.short_a.back()->ttft_seconds());
  EXPECT_EQ((*e)->metrics().adapters_per_step_max.load(), 1);
}

// The fairness barrier holds back newer requests that would keep an adapter in the step, not
// base-model requests: those take no adapter slot. The same queue plus one base request
// submitted last: it starts while B still waits for A to leave the step.
TEST(EngineResidencyTest, BaseRequestsPassTheAdapterFairnessBarrier) {
  CHORUS_REQUIRE_SHARED_MODEL(kModel);
  testing::Stories260K s = testing::LoadStories260K();
  auto a = Adapter(s.model->config(), 8, 40), b = Adapter(s.model->config(), 16, 41);
  const auto want_base = Alone(s, Req(30, std::nullopt, 4));
  auto e = Engine::Create(s.model, s.tok, CappedOptions(s));
  ASSERT_TRUE(e.ok());
  // A 400-token request holds A in the step for a long time.
  CappedQueue q = SubmitCappedQueue(e->get(), a, b, 400);
  auto base = *(*e)->Submit(Req(30, std::nullopt, 4));
  EXPECT_EQ(RunToEnd(*base), want_base);
  // The base request got in once the barrier formed (~8 short requests of 3 tokens in), long
  // before the 400-token request ends; before this rule it started together with B, after it.
  EXPECT_LT(q.long_a->completion_tokens(), 400);
  RunToEnd(*q.b);
  RunToEnd(*q.long_a);
  for (auto& h : q.short_a) RunToEnd(*h);
  EXPECT_LT(base->ttft_seconds(), q.b->ttft_seconds());
  EXPECT_LT(base->ttft_seconds(), q.short_a.back()->ttft_seconds());
}

TEST(EngineResidencyTest, UnloadWhileInUseFinishesThenFrees) {
  CHORUS_REQUIRE_SHARED_MODEL(kModel);
  testing::Stories260K s = testing::LoadStories260K();
  auto a = Adapter(s.model->config(), 32, 30);
  const auto want = Alone(s, Req(10, a, 120));
  for (bool forget : {false, true}) {
    auto e = Engine::Create(s.model, s.tok, SmallOptions(s, 64 << 20));
    ASSERT_TRUE(e.ok());
    const auto& m = (*e)->metrics();
    auto h = *(*e)->Submit(Req(10, a, 120));
    std::vector<int32_t> got;
    for (int i = 0; i < 60; ++i) got.push_back(h->Next(std::chrono::milliseconds(30000))->token);
    EXPECT_GT(m.pool_pages_adapter.load(), 0);
    if (forget) (*e)->ForgetAdapter(a.name);
    for (int32_t t : RunToEnd(*h)) got.push_back(t);
    EXPECT_EQ(got, want);  // the running request finished undisturbed
    if (forget) {
      EXPECT_TRUE(
          WaitFor([&] { return m.pool_pages_adapter.load() == 0; }));  // freed after its last user
      EXPECT_EQ(m.adapters_resident.load(), 0);
    } else {
      EXPECT_GT(m.pool_pages_adapter.load(), 0);  // control: kept cached when not unloaded
    }
  }
}

}  // namespace
}  // namespace chorus::engine
