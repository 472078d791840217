// test-labels: unit concurrency
// AdapterResidency: pool copies made by a loader thread and marked resident by Poll(); pinned
// copies never evicted; unpinned ones evicted LRU first for KV; Forget() frees an unloaded
// adapter's copy once its last user unpins; disk loads through the host cache complete tickets.
#include "chorus/engine/adapter_residency.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <thread>

#include "chorus/adapters/delta/delta_synthetic.h"
#include "chorus/adapters/lora/lora_files.h"
#include "chorus/model/synthetic.h"
#include "tests/testutil/testutil.h"

namespace chorus::engine {
namespace {

using adapters::LoraAdapter;

model::ModelConfig TinyConfig() {
  auto c = model::SyntheticConfig("tiny");
  CHORUS_CHECK(c.ok());
  return *c;
}

std::shared_ptr<const LoraAdapter> MakeAdapter(const model::ModelConfig& c, uint64_t seed,
                                               const std::string& name) {
  adapters::RandomLoraSpec s;
  s.rank = 8;
  s.seed = seed;
  auto a = LoraAdapter::Build(adapters::MakeRandomLora(c, s), c, name);
  CHORUS_CHECK(a.ok()) << a.status().ToString();
  return *a;
}

std::shared_ptr<const delta::DeltaWeights> MakeDelta(const model::ModelConfig& c, uint64_t seed,
                                                     const std::string& name,
                                                     const std::string& identity) {
  delta::Delta d =
      delta::MakeRandomDelta(c, {.bits = 4, .sparse24 = true, .group_size = 64, .seed = seed});
  auto w = delta::DeltaWeights::Build(std::move(d), c, name, nullptr, identity);
  CHORUS_CHECK(w.ok()) << w.status().ToString();
  return *w;
}

// Polls until `a` (an adapter or a delta) is resident (the loader thread copies in the
// background).
template <class Variant>
bool WaitResident(AdapterResidency* r, const Variant* a) {
  for (int i = 0; i < 2000; ++i) {
    r->Poll();
    if (r->Resident(a)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return false;
}

struct Fixture {
  model::ModelConfig c = TinyConfig();
  memory::PagePool pool{256, 8192};
  EngineMetrics metrics;
  AdapterResidency res{&pool, &metrics, nullptr, nullptr, {}};
};

TEST(AdapterResidencyTest, PoolCopyPinnedNeverEvictedUnpinnedEvictedLru) {
  Fixture f;
  auto a = MakeAdapter(f.c, 1, "a"), b = MakeAdapter(f.c, 2, "b");
  const int64_t need = *adapters::PagedLora::PagesNeeded(*a, f.pool.page_bytes());
  f.res.Pin(a);
  EXPECT_EQ(f.metrics.adapter_pool_misses.load(), 1u);
  EXPECT_EQ(f.res.View(a.get()), a.get());  // cold: the host copy serves at once
  f.res.Prefetch(a, 0, /*may_evict=*/true);
  EXPECT_EQ(f.pool.n_used(memory::PageKind::kAdapter), need);  // allocated by the engine thread
  ASSERT_TRUE(WaitResident(&f.res, a.get()));
  EXPECT_NE(f.res.View(a.get()), a.get());  // now the pool copy
  EXPECT_EQ(f.metrics.adapter_pool_loads.load(), 1u);
  f.res.PublishGauges();
  EXPECT_EQ(f.metrics.pool_pages_adapter.load(), need);
  EXPECT_EQ(f.metrics.adapters_resident.load(), 1);

  // Pinned: never evicted, even when KV asks for the whole pool.
  EXPECT_FALSE(f.res.EvictFor(f.pool.n_pages()));
  EXPECT_TRUE(f.res.Resident(a.get()));
  f.res.Unpin(a.get());
  EXPECT_TRUE(f.res.Resident(a.get()));  // stays cached while unpinned
  f.res.Pin(a);
  EXPECT_EQ(f.metrics.adapter_pool_hits.load(), 1u);
  f.res.Unpin(a.get());

  // b prefetched (unpinned), then a used: b is the least recently used.
  f.res.Prefetch(b, 0, /*may_evict=*/false);
  ASSERT_TRUE(WaitResident(&f.res, b.get()));
  f.res.View(a.get());
  EXPECT_TRUE(f.res.EvictFor(f.pool.n_free() + 1));
  EXPECT_FALSE(f.res.Resident(b.get()));
  EXPECT_TRUE(f.res.Resident(a.get()));
  EXPECT_EQ(f.metrics.adapter_pool_evictions.load(), 1u);
  EXPECT_TRUE(f.res.EvictFor(f.pool.n_pages()));
  EXPECT_EQ(f.pool.n_used(memory::PageKind::kAdapter), 0);
  EXPECT_EQ(f.pool.n_free(), f.pool.n_pages());
}

// A delta takes the same tiers as an adapter: pinned while used, a banded pool copy made by the
// loader thread (the host copy serves until it lands), kept while unpinned, found again by a
// reloaded host copy of the same identity, evicted LRU among adapters, dropped by Forget.
TEST(AdapterResidencyTest, DeltasTakeTheSameTiersPinsAndLruAsAdapters) {
  Fixture f;
  auto d = MakeDelta(f.c, 1, "d", "00000000000000d1-v1");
  auto a = MakeAdapter(f.c, 2, "a");
  const int64_t need = *delta::PagedDelta::PagesNeeded(*d, f.pool.page_bytes());
  ASSERT_GT(need, 1);
  f.res.Pin(d);
  EXPECT_EQ(f.metrics.adapter_pool_misses.load(), 1u);
  EXPECT_EQ(f.res.View(d.get()), d.get());  // cold: the host copy serves at once
  f.res.Prefetch(d, 0, /*may_evict=*/true);
  EXPECT_TRUE(f.res.Loading(d.get()));
  EXPECT_EQ(f.pool.n_used(memory::PageKind::kAdapter), need);
  ASSERT_TRUE(WaitResident(&f.res, d.get()));
  const delta::DeltaView* pooled = f.res.View(d.get());
  ASSERT_NE(pooled, d.get());
  EXPECT_FALSE(pooled->at(0, model::Linear::kQ).bands.empty());
  EXPECT_EQ(f.metrics.adapter_pool_loads.load(), 1u);
  EXPECT_FALSE(f.res.EvictFor(f.pool.n_pages()));  // pinned
  f.res.Unpin(d.get());
  EXPECT_TRUE(f.res.Resident(d.get()));

  // The host tier evicted its copy and a request loaded it again: same identity, new object.
  std::weak_ptr<const delta::DeltaWeights> first = d;
  d.reset();
  EXPECT_TRUE(first.expired()) << "a resident pool copy must not keep its host copy";
  auto reloaded = MakeDelta(f.c, 1, "d", "00000000000000d1-v1");
  f.res.Pin(reloaded);
  EXPECT_EQ(f.metrics.adapter_pool_hits.load(), 1u);
  EXPECT_EQ(f.res.View(reloaded.get()), pooled);
  f.res.Unpin(reloaded.get());
  // Another registration's delta (another version) is not that copy.
  auto replaced = MakeDelta(f.c, 1, "d", "00000000000000d1-v2");
  EXPECT_FALSE(f.res.Resident(replaced.get()));

  // LRU across kinds: the adapter is used after the delta, so the delta goes first.
  f.res.Prefetch(a, 0, /*may_evict=*/false);
  ASSERT_TRUE(WaitResident(&f.res, a.get()));
  f.res.View(a.get());
  EXPECT_TRUE(f.res.EvictFor(f.pool.n_free() + 1));
  EXPECT_FALSE(f.res.Resident(reloaded.get()));
  EXPECT_TRUE(f.res.Resident(a.get()));
  EXPECT_EQ(f.res.View(reloaded.get()), reloaded.get());  // back to the host copy

  // Forget frees a delta's pool copy as an adapter's.
  f.res.Prefetch(reloaded, 0, /*may_evict=*/false);
  ASSERT_TRUE(WaitResident(&f.res, reloaded.get()));
  f.res.Forget("d");
  f.res.Poll();
  EXPECT_FALSE(f.res.Resident(reloaded.get()));
  EXPECT_TRUE(f.res.EvictFor(f.pool.n_pages()));
  EXPECT_EQ(f.pool.n_used(memory::PageKind::kAdapter), 0);
}

TEST(AdapterResidencyTest, PrefetchKeepsPagesFreeForKv) {
  Fixture f;
  auto a = MakeAdapter(f.c, 1, "a");
  const int64_t need = *adapters::PagedLora::PagesNeeded(*a, f.pool.page_bytes());
  f.res.Prefetch(a, f.pool.n_pages() - need + 1, /*may_evict=*/false);  // would leave too few free
  EXPECT_FALSE(f.res.Loading(a.get()) || f.res.Resident(a.get()));
  EXPECT_EQ(f.pool.n_used(memory::PageKind::kAdapter), 0);
}

TEST(AdapterResidencyTest, ForgetFreesAfterLastUser) {
  Fixture f;
  auto a = MakeAdapter(f.c, 1, "a");
  f.res.Pin(a);
  f.res.Prefetch(a, 0, true);
  ASSERT_TRUE(WaitResident(&f.res, a.get()));
  f.res.Forget("a");
  f.res.Poll();
  EXPECT_TRUE(f.res.Resident(a.get()));  // still in use: kept
  EXPECT_GT(f.pool.n_used(memory::PageKind::kAdapter), 0);
  f.res.Unpin(a.get());
  EXPECT_FALSE(f.res.Resident(a.get()));
  EXPECT_EQ(f.pool.n_used(memory::PageKind::kAdapter), 0);
}

TEST(AdapterResidencyTest, ReplacedAdapterNeverSharesThePoolCopy) {
  Fixture f;
  auto old_version = MakeAdapter(f.c, 1, "x"), new_version = MakeAdapter(f.c, 2, "x");
  f.res.Prefetch(old_version, 0, true);
  ASSERT_TRUE(WaitResident(&f.res, old_version.get()));
  // Same name, another content hash / version: another host copy, so no pool copy yet.
  EXPECT_FALSE(f.res.Resident(new_version.get()));
  EXPECT_EQ(f.res.View(new_version.get()), new_version.get());
  f.res.Forget("x");  // the registry replaced it: the predecessor's pages are freed
  f.res.Poll();
  EXPECT_FALSE(f.res.Resident(old_version.get()));
  EXPECT_EQ(f.pool.n_used(memory::PageKind::kAdapter), 0);
}

// Pool copies are keyed by content identity (hash + version), not by the host object: after the
// host tier dropped its copy and loaded it again (a new LoraAdapter object with the same
// identity), the resident pool copy serves it — no second copy. A resident copy does not hold
// its host copy, so the host tier can evict it at all.
TEST(AdapterResidencyTest, ReloadedHostCopyReusesTheResidentPoolCopy) {
  Fixture f;
  adapters::RandomLoraSpec s;
  s.rank = 8;
  const adapters::LoraWeights w = adapters::MakeRandomLora(f.c, s);
  auto load = [&](adapters::VariantId id) {
    auto a = LoraAdapter::Build(w, f.c, "x", {}, id);
    CHORUS_CHECK(a.ok());
    return *a;
  };
  auto first = load({0xab, 3});
  f.res.Pin(first);
  f.res.Prefetch(first, 0, /*may_evict=*/true);
  ASSERT_TRUE(WaitResident(&f.res, first.get()));
  const adapters::LoraView* pool_view = f.res.View(first.get());
  ASSERT_NE(pool_view, first.get());
  EXPECT_EQ(pool_view->id().ToString(), "00000000000000ab-v3");
  f.res.Unpin(first.get());
  const int64_t pages = f.pool.n_used(memory::PageKind::kAdapter);
  EXPECT_EQ(first.use_count(), 1);  // only this test holds the host copy now
  std::weak_ptr<const LoraAdapter> gone = first;
  first.reset();  // the host tier evicts it
  EXPECT_TRUE(gone.expired());

  auto reloaded = load({0xab, 3});
  EXPECT_TRUE(f.res.Resident(reloaded.get()));
  EXPECT_EQ(f.res.View(reloaded.get()), pool_view);
  f.res.Pin(reloaded);
  EXPECT_EQ(f.metrics.adapter_pool_hits.load(), 1u);
  f.res.Prefetch(reloaded, 0, /*may_evict=*/true);  // nothing to do
  f.res.Poll();
  EXPECT_FALSE(f.res.Loading(reloaded.get()));
  EXPECT_EQ(f.pool.n_used(memory::PageKind::kAdapter), pages);
  EXPECT_EQ(f.metrics.adapter_pool_loads.load(), 1u);
  f.res.Unpin(reloaded.get());

  // Another version of the same bytes (a re-registration) is another adapter: its own copy.
  auto next_version = load({0xab, 4});
  EXPECT_FALSE(f.res.Resident(next_version.get()));
  EXPECT_EQ(f.res.View(next_version.get()), next_version.get());
  f.res.Prefetch(next_version, 0, /*may_evict=*/true);
  ASSERT_TRUE(WaitResident(&f.res, next_version.get()));
  EXPECT_EQ(f.pool.n_used(memory::PageKind::kAdapter), 2 * pages);

  // Unloading the name frees both (neither is pinned).
  f.res.Forget("x");
  f.res.Poll();
  EXPECT_EQ(f.pool.n_used(memory::PageKind::kAdapter), 0);
  EXPECT_FALSE(f.res.Resident(reloaded.get()));
}

// Without an identity an adapter is only ever the same as itself: an equal copy built
// separately does not see its pool copy, and the entry keeps its host copy alive (so the
// address that keys it cannot be reused by another adapter).
TEST(AdapterResidencyTest, AdapterWithoutIdentityMatchesOnlyItself) {
  Fixture f;
  auto a = MakeAdapter(f.c, 1, "a"), twin = MakeAdapter(f.c, 1, "a");
  EXPECT_TRUE(a->id().empty());
  f.res.Prefetch(a, 0, true);
  ASSERT_TRUE(WaitResident(&f.res, a.get()));
  EXPECT_GT(a.use_count(), 1);
  EXPECT_FALSE(f.res.Resident(twin.get()));
  EXPECT_EQ(f.res.View(twin.get()), twin.get());
}

TEST(AdapterResidencyTest, DiskLoadsCompleteTicketsOnLoaderThread) {
  const auto c = TinyConfig();
  const std::string dir = testing::TempDir() + "/residency_peft";
  std::filesystem::remove_all(dir);
  adapters::RandomLoraSpec s;
  s.rank = 4;
  CHORUS_ASSERT_OK(adapters::WritePeftLora(dir, adapters::MakeRandomLora(c, s), c));
  auto cache = std::make_shared<adapters::AdapterCache>(c, int64_t{64} << 20);
  memory::PagePool pool(16, 8192);
  EngineMetrics metrics;
  std::atomic<int> wakes{0};
  AdapterResidency res(&pool, &metrics, cache, [&] { wakes.fetch_add(1); }, {});
  auto ok = res.Load({.name = "x", .id = {1, 1}, .path = dir});
  auto bad = res.Load({.name = "y", .id = {2, 1}, .path = dir + "/missing"});
  for (int i = 0; i < 5000 && !(ok->done.load() && bad->done.load()); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_TRUE(ok->done.load() && bad->done.load());
  CHORUS_ASSERT_OK(ok->status);
  ASSERT_NE(ok->adapter, nullptr);
  EXPECT_EQ(ok->adapter->max_rank(), 4);
  EXPECT_EQ(ok->adapter->id(), (adapters::VariantId{1, 1}));  // the reference's id
  // Once cached, the same id is handed over at once, without a loader thread.
  auto hit = res.Load({.name = "x", .id = {1, 1}, .path = dir});
  EXPECT_TRUE(hit->done.load());
  EXPECT_EQ(hit->adapter, ok->adapter);
  EXPECT_FALSE(bad->status.ok());
  EXPECT_NE(bad->status.message().find("missing"), std::string::npos) << bad->status.ToString();
  EXPECT_EQ(wakes.load(), 2);
  EXPECT_EQ(metrics.adapter_disk_loads.load(), 2u);
  EXPECT_EQ(metrics.adapter_disk_load_errors.load(), 1u);
}

}  // namespace
}  // namespace chorus::engine
