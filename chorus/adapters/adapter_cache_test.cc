// test-labels: unit concurrency
#include "chorus/adapters/adapter_cache.h"

#include <cstring>
#include <thread>

#include "chorus/adapters/delta/delta_file.h"
#include "chorus/adapters/delta/delta_synthetic.h"
#include "chorus/memory/host_arena.h"
#include "chorus/model/synthetic.h"
#include "tests/testutil/testutil.h"

namespace chorus::adapters {
namespace {

struct Fixture {
  model::ModelConfig base;
  std::string dir;
  std::vector<VariantRef> keys;
  int64_t bytes_each = 0;
};

Fixture Make(int n) {
  Fixture f;
  f.base = *model::SyntheticConfig("tiny");
  f.dir = testing::TempDir();
  for (int i = 0; i < n; ++i) {
    RandomLoraSpec spec;
    spec.rank = 8;
    spec.seed = 10 + static_cast<uint64_t>(i);
    auto w = MakeRandomLora(f.base, spec);
    // Appended, not "a" + to_string(i): GCC 12 -O2 reports a false -Wrestrict for the latter.
    std::string name = "a";
    name += std::to_string(i);
    const std::string path = f.dir + "/" + name;
    CHORUS_CHECK(WritePeftLora(path, w, f.base).ok());
    f.keys.push_back({.name = name, .id = {100u + static_cast<uint64_t>(i), 1}, .path = path});
  }
  auto probe = LoadLoraAdapter(f.keys[0].path, f.base);
  CHORUS_CHECK(probe.ok());
  f.bytes_each = (*probe)->memory_bytes();
  return f;
}

// Decoded copies are built in the cache's own arena (prefaulted by the engine) and give their
// chunks back when the last holder drops them; copies that do not fit use ordinary memory.
TEST(AdapterCacheTest, CopiesLiveInTheArenaUntilTheLastHolderDropsThem) {
  Fixture f = Make(2);
  AdapterCache cache(f.base, 2 * f.bytes_each);
  ASSERT_NE(cache.arena(), nullptr);
  EXPECT_GE(cache.arena()->bytes(), static_cast<size_t>(2 * f.bytes_each));
  std::shared_ptr<const LoraAdapter> held;
  {
    auto a = cache.Get(f.keys[0]);
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    held = *a;
  }
  EXPECT_GE(cache.arena()->bytes_in_use(), static_cast<size_t>(f.bytes_each));
  cache.Erase("a0");  // the cache drops its reference; `held` keeps the chunks
  EXPECT_GE(cache.arena()->bytes_in_use(), static_cast<size_t>(f.bytes_each));
  // Bitwise the same rows as a copy built outside any arena.
  auto plain = LoadLoraAdapter(f.keys[0].path, f.base);
  ASSERT_TRUE(plain.ok());
  ASSERT_EQ((*plain)->n_rows(), held->n_rows());
  for (int64_t i = 0; i < held->n_rows(); ++i) {
    EXPECT_TRUE(cache.arena()->Contains(held->row_data(i)));
    ASSERT_EQ(std::memcmp(held->row_data(i), (*plain)->row_data(i),
                          static_cast<size_t>(held->row_bytes(i))),
              0)
        << "row " << i;
  }
  held.reset();
  EXPECT_EQ(cache.arena()->bytes_in_use(), 0u);

  // An arena too small for one copy: loads still work, from ordinary memory.
  LoraLimits tiny;
  tiny.arena = std::make_shared<memory::HostArena>(1);
  AdapterCache small(f.base, 4 * f.bytes_each, tiny);
  auto b = small.Get(f.keys[1]);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  if (f.bytes_each > static_cast<int64_t>(memory::HostArena::kChunkBytes)) {
    EXPECT_EQ(small.arena()->bytes_in_use(), 0u);
  }
}

TEST(AdapterCacheTest, HitsMissesAndLruEvictionOfUnpinnedEntries) {
  Fixture f = Make(3);
  AdapterCache cache(f.base, 2 * f.bytes_each);  // room for two
  auto a0 = cache.Get(f.keys[0]);
  ASSERT_TRUE(a0.ok()) << a0.status().ToString();
  // Loaded copies carry the content identity (hash + version) that pool copies are keyed by.
  EXPECT_EQ(f.keys[0].id.ToString(), "0000000000000064-v1");
  EXPECT_EQ((*a0)->id(), f.keys[0].id);
  auto again = cache.Get(f.keys[0]);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(a0->get(), again->get());
  auto s = cache.stats();
  EXPECT_EQ(s.misses, 1u);
  EXPECT_EQ(s.hits, 1u);
  EXPECT_EQ(s.loads, 1u);
  a0 = Result<std::shared_ptr<const LoraAdapter>>(InternalError("dropped"));
  again = Result<std::shared_ptr<const LoraAdapter>>(InternalError("dropped"));
  ASSERT_TRUE(cache.Get(f.keys[1]).ok());
  {
    auto pinned = cache.Get(f.keys[2]);  // over budget: evicts the LRU unpinned entry (a0)
    ASSERT_TRUE(pinned.ok());
    s = cache.stats();
    EXPECT_EQ(s.evictions, 1u);
    EXPECT_EQ(s.entries, 2);
  }
  ASSERT_TRUE(cache.Get(f.keys[0]).ok());  // reloaded
  s = cache.stats();
  EXPECT_EQ(s.loads, 4u);
  // Every successful load lands in exactly one latency bucket; the buckets' bounds are
  // increasing and span 1 ms .. 10 s.
  ASSERT_EQ(s.load_seconds_buckets.size(), AdapterCache::LoadSecondsBounds().size() + 1);
  uint64_t in_buckets = 0;
  for (uint64_t n : s.load_seconds_buckets) in_buckets += n;
  EXPECT_EQ(in_buckets, s.loads);
  const auto& b = AdapterCache::LoadSecondsBounds();
  EXPECT_EQ(b.front(), 0.001);
  EXPECT_EQ(b.back(), 10.0);
  for (size_t i = 1; i < b.size(); ++i) EXPECT_LT(b[i - 1], b[i]);
  // The last load's bucket is the one whose range holds last_load_seconds.
  size_t want = 0;
  while (want < b.size() && s.last_load_seconds > b[want]) ++want;
  EXPECT_GE(s.load_seconds_buckets[want], 1u);
}

TEST(AdapterCacheTest, NewVersionNeverSharesCachedWeights) {
  Fixture f = Make(1);
  AdapterCache cache(f.base, int64_t{1} << 30);
  auto v1 = cache.Get(f.keys[0]);
  VariantRef k2 = f.keys[0];
  k2.id.version = 2;
  auto v2 = cache.Get(k2);
  ASSERT_TRUE(v1.ok() && v2.ok());
  EXPECT_NE(v1->get(), v2->get());
  cache.Erase(f.keys[0].name);
  EXPECT_EQ(cache.stats().entries, 0);
  EXPECT_NE((*v1)->n_layers(), 0);  // holders keep their copy after Erase
}

TEST(AdapterCacheTest, ConcurrentMissesLoadOnceAndErrorsAreNotCached) {
  Fixture f = Make(1);
  AdapterCache cache(f.base, int64_t{1} << 30);
  std::vector<std::thread> ts;
  std::vector<const LoraAdapter*> got(4);
  for (int i = 0; i < 4; ++i)
    ts.emplace_back([&, i] { got[static_cast<size_t>(i)] = cache.Get(f.keys[0])->get(); });
  for (auto& t : ts) t.join();
  for (auto* p : got) EXPECT_EQ(p, got[0]);
  EXPECT_EQ(cache.stats().loads, 1u);
  VariantRef bad{.name = "missing", .id = {1, 1}, .path = f.dir + "/nope"};
  EXPECT_FALSE(cache.Get(bad).ok());
  EXPECT_FALSE(cache.Get(bad).ok());
  EXPECT_EQ(cache.stats().load_errors, 2u);
  EXPECT_EQ(cache.stats().entries, 1);
  uint64_t in_buckets = 0;  // failed loads are not in the latency histogram
  for (uint64_t n : cache.stats().load_seconds_buckets) in_buckets += n;
  EXPECT_EQ(in_buckets, 1u);
}

// Deltas share the host tier's single-flight loading: callers that miss one delta while it is
// being loaded wait for that load (a TinyLlama-shape delta is ~120 MB; a saturated delta server
// with two loader threads read one cold delta twice before). A failed load is not cached, and
// an erased delta is loaded anew.
TEST(AdapterCacheTest, ConcurrentDeltaMissesLoadOnceAndErrorsAreNotCached) {
  Fixture f = Make(1);  // for its base config and directory
  const std::string path = f.dir + "/delta.safetensors";
  delta::Delta d = delta::MakeRandomDelta(f.base, {.bits = 1, .sparse24 = false, .group_size = 0});
  d.base_hash = "0123456789abcdef";  // the cache below checks no base hash
  ASSERT_TRUE(delta::WriteDelta(path, d).ok());
  AdapterCache cache(f.base, int64_t{1} << 30);
  const VariantRef ref{.name = "d", .id = {7, 1}, .kind = "delta", .path = path};
  constexpr int kThreads = 6;
  std::vector<std::thread> ts;
  std::vector<const delta::DeltaWeights*> got(kThreads);
  for (int i = 0; i < kThreads; ++i) {
    ts.emplace_back([&, i] {
      auto w = cache.GetDelta(ref);
      got[static_cast<size_t>(i)] = w.ok() ? w->get() : nullptr;
    });
  }
  for (auto& t : ts) t.join();
  ASSERT_NE(got[0], nullptr) << cache.GetDelta(ref).status().ToString();
  for (const auto* p : got) EXPECT_EQ(p, got[0]);
  AdapterCache::Stats st = cache.stats();
  EXPECT_EQ(st.loads, 1u);
  EXPECT_EQ(st.misses, 1u);
  EXPECT_EQ(st.hits, static_cast<uint64_t>(kThreads - 1));
  EXPECT_EQ(st.entries, 1);
  EXPECT_EQ(cache.GetDeltaIfCached(ref.id).get(), got[0]);

  const VariantRef bad{.name = "gone", .id = {8, 1}, .kind = "delta", .path = f.dir + "/nope"};
  EXPECT_FALSE(cache.GetDelta(bad).ok());
  EXPECT_FALSE(cache.GetDelta(bad).ok());
  EXPECT_EQ(cache.stats().load_errors, 2u);
  EXPECT_EQ(cache.GetDeltaIfCached(bad.id), nullptr);
  EXPECT_EQ(cache.stats().entries, 1);

  cache.Erase("d");
  EXPECT_EQ(cache.stats().entries, 0);
  EXPECT_EQ(cache.GetDeltaIfCached(ref.id), nullptr);
  ASSERT_TRUE(cache.GetDelta(ref).ok());
  EXPECT_EQ(cache.stats().loads, 2u);
}

// A delta's host copy is built in the same arena as LoRA copies (prefaulted by the engine), so a
// delta server does not pay a first touch of fresh memory at every load; the chunks come back
// when the last holder drops it.
TEST(AdapterCacheTest, DeltaCopiesLiveInTheArenaUntilTheLastHolderDropsThem) {
  Fixture f = Make(1);  // for its base config and directory
  const std::string path = f.dir + "/arena-delta.safetensors";
  delta::Delta d = delta::MakeRandomDelta(f.base, {.bits = 4, .sparse24 = true, .group_size = 64});
  d.base_hash = "0123456789abcdef";
  ASSERT_TRUE(delta::WriteDelta(path, d).ok());
  AdapterCache cache(f.base, int64_t{64} << 20);
  ASSERT_NE(cache.arena(), nullptr);
  const VariantRef ref{.name = "d", .id = {9, 1}, .kind = "delta", .path = path};
  std::shared_ptr<const delta::DeltaWeights> held;
  {
    auto w = cache.GetDelta(ref);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    held = *w;
  }
  EXPECT_TRUE(held->streamed_in_arena());
  EXPECT_TRUE(cache.arena()->Contains(held->at(0, model::Linear::kQ).codes));
  const auto in_use = static_cast<int64_t>(cache.arena()->bytes_in_use());
  EXPECT_GE(in_use, delta::DeltaWeightsBytes(*held));
  EXPECT_EQ(cache.stats().arena_used_bytes, in_use);
  cache.Erase("d");  // the cache drops its reference; `held` keeps the chunks
  EXPECT_EQ(static_cast<int64_t>(cache.arena()->bytes_in_use()), in_use);
  held.reset();
  EXPECT_EQ(cache.arena()->bytes_in_use(), 0u);
}

}  // namespace
}  // namespace chorus::adapters
