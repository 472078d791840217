// test-labels: unit
#include "chorus/adapters/adapter_cache.h"

#include <thread>

#include "chorus/model/synthetic.h"
#include "tests/testutil/testutil.h"

namespace chorus::adapters {
namespace {

struct Fixture {
  model::ModelConfig base;
  std::string dir;
  std::vector<AdapterKey> keys;
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
    std::string path = f.dir + "/a" + std::to_string(i);
    CHORUS_CHECK(WritePeftLora(path, w, f.base).ok());
    f.keys.push_back({"a" + std::to_string(i), path, 100u + static_cast<uint64_t>(i), 1});
  }
  auto probe = LoadLoraAdapter(f.keys[0].path, f.base);
  CHORUS_CHECK(probe.ok());
  f.bytes_each = (*probe)->memory_bytes();
  return f;
}

TEST(AdapterCacheTest, HitsMissesAndLruEvictionOfUnpinnedEntries) {
  Fixture f = Make(3);
  AdapterCache cache(f.base, 2 * f.bytes_each);  // room for two
  auto a0 = cache.Get(f.keys[0]);
  ASSERT_TRUE(a0.ok()) << a0.status().ToString();
  // Loaded copies carry the content identity (hash + version) that pool copies are keyed by.
  EXPECT_EQ(f.keys[0].ContentId(), "0000000000000064-v1");
  EXPECT_EQ((*a0)->identity(), f.keys[0].ContentId());
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
  AdapterKey k2 = f.keys[0];
  k2.version = 2;
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
  AdapterKey bad{"missing", f.dir + "/nope", 1, 1};
  EXPECT_FALSE(cache.Get(bad).ok());
  EXPECT_FALSE(cache.Get(bad).ok());
  EXPECT_EQ(cache.stats().load_errors, 2u);
  EXPECT_EQ(cache.stats().entries, 1);
  uint64_t in_buckets = 0;  // failed loads are not in the latency histogram
  for (uint64_t n : cache.stats().load_seconds_buckets) in_buckets += n;
  EXPECT_EQ(in_buckets, 1u);
}

}  // namespace
}  // namespace chorus::adapters
