// PrefixCache over a KvCache without a model: matches are whole blocks of the same variant and
// the same tokens from the start, verified block by block; a sequence's references keep its
// blocks; blocks no sequence holds are evicted least recently used, deepest first.
#include "chorus/memory/prefix_cache.h"

#include <gtest/gtest.h>

#include <numeric>

namespace chorus::memory {
namespace {

class PrefixCacheTest : public ::testing::Test {
 protected:
  PrefixCacheTest()
      : layout_{.n_layers = 1, .n_kv_heads = 1, .head_dim = 4, .block_size = 4},
        pool_(32, layout_.PageBytes()),
        kv_(layout_, &pool_),
        cache_(&kv_) {}

  // A sequence that computed `tokens` (its blocks reserved) and registered its full blocks.
  std::vector<int32_t> Computed(uint64_t variant, const std::vector<int32_t>& tokens) {
    std::vector<int32_t> table;
    EXPECT_TRUE(kv_.Reserve(&table, static_cast<int64_t>(tokens.size())).ok());
    PrefixChain chain;
    cache_.Insert(variant, tokens, static_cast<int64_t>(tokens.size()), table, &chain);
    EXPECT_EQ(chain.blocks, static_cast<int64_t>(tokens.size()) / 4);
    return table;
  }

  static std::vector<int32_t> Tokens(int n, int first = 100) {
    std::vector<int32_t> t(static_cast<size_t>(n));
    std::iota(t.begin(), t.end(), first);
    return t;
  }

  KvLayout layout_;
  PagePool pool_;
  KvCache kv_;
  PrefixCache cache_;
};

TEST_F(PrefixCacheTest, MatchesWholeBlocksOfTheSameVariantAndTokens) {
  const auto tokens = Tokens(10);  // 2 full blocks + 2 tokens
  std::vector<int32_t> a = Computed(0, tokens);
  EXPECT_EQ(cache_.n_cached(), 2);
  EXPECT_EQ(kv_.RefCount(a[0]), 2);  // the sequence and the cache
  EXPECT_EQ(kv_.RefCount(a[2]), 1);  // the partial block is not cached

  std::vector<int32_t> b;
  PrefixChain chain;
  EXPECT_EQ(cache_.Match(0, tokens, 9, &b, &chain), 8);
  EXPECT_EQ(b, std::vector<int32_t>(a.begin(), a.begin() + 2));
  EXPECT_EQ(kv_.RefCount(a[0]), 3);
  EXPECT_EQ(chain.blocks, 2);
  kv_.Release(&b);

  // At most max_tokens: the last token is always left to compute.
  EXPECT_EQ(cache_.Match(0, Tokens(8), 7, &b, &chain), 4);
  kv_.Release(&b);
  // Another variant: nothing (its K/V differ).
  EXPECT_EQ(cache_.Match(PrefixVariantKey(7, 1), tokens, 9, &b, &chain), 0);
  EXPECT_TRUE(b.empty());
  // A divergence in block 1: only block 0.
  auto other = tokens;
  other[5] = 7;
  EXPECT_EQ(cache_.Match(0, other, 9, &b, &chain), 4);
  kv_.Release(&b);
  // The same second block after another first block: nothing (a block is its whole prefix).
  auto shifted = tokens;
  shifted[0] = 1;
  EXPECT_EQ(cache_.Match(0, shifted, 9, &b, &chain), 0);
  kv_.Release(&a);
}

TEST_F(PrefixCacheTest, ChainsContinueAcrossSequencesAndDuplicatesAreNotCachedTwice) {
  const auto tokens = Tokens(16);
  std::vector<int32_t> a = Computed(3, std::vector<int32_t>(tokens.begin(), tokens.begin() + 8));
  // A second sequence matches a's two blocks, computes two more, registers only those.
  std::vector<int32_t> b;
  PrefixChain chain;
  ASSERT_EQ(cache_.Match(3, tokens, 15, &b, &chain), 8);
  ASSERT_TRUE(kv_.Reserve(&b, 16).ok());
  cache_.Insert(3, tokens, 16, b, &chain);
  EXPECT_EQ(chain.blocks, 4);
  EXPECT_EQ(cache_.n_cached(), 4);
  // A third sequence that computed the same 8 tokens itself: nothing new is cached.
  std::vector<int32_t> c;
  ASSERT_TRUE(kv_.Reserve(&c, 8).ok());
  PrefixChain c_chain;
  cache_.Insert(3, std::vector<int32_t>(tokens.begin(), tokens.begin() + 8), 8, c, &c_chain);
  EXPECT_EQ(c_chain.blocks, 2);
  EXPECT_EQ(cache_.n_cached(), 4);
  EXPECT_EQ(kv_.RefCount(c[0]), 1);  // its own copy stays its own
  std::vector<int32_t> d;
  EXPECT_EQ(cache_.Match(3, tokens, 16, &d, &chain), 16);
  for (auto* t : {&a, &b, &c, &d}) kv_.Release(t);
}

TEST_F(PrefixCacheTest, EvictsOnlyUnheldBlocksLeastRecentlyUsedDeepestFirst) {
  std::vector<int32_t> held = Computed(0, Tokens(8, 0));      // 2 blocks, still held
  std::vector<int32_t> old_one = Computed(0, Tokens(8, 50));  // 2 blocks, released below
  std::vector<int32_t> recent = Computed(0, Tokens(8, 90));   // 2 blocks, released below
  kv_.Release(&old_one);
  kv_.Release(&recent);
  EXPECT_EQ(cache_.n_evictable(), 4);
  const int64_t free0 = pool_.n_free();
  // One page: the deepest block of the least recently used chain.
  ASSERT_TRUE(cache_.EvictFor(free0 + 1));
  EXPECT_EQ(cache_.evictions(), 1u);
  std::vector<int32_t> t;
  PrefixChain chain;
  EXPECT_EQ(cache_.Match(0, Tokens(8, 50), 8, &t, &chain), 4);  // its first block survives
  EXPECT_EQ(cache_.n_evictable(), 2);  // held again by `t`: not evictable while it is
  kv_.Release(&t);
  EXPECT_EQ(cache_.n_evictable(), 3);
  EXPECT_EQ(cache_.Match(0, Tokens(8, 90), 8, &t, &chain), 8);
  kv_.Release(&t);
  // Everything not held, never what a sequence holds.
  EXPECT_FALSE(cache_.EvictFor(pool_.n_pages()));
  EXPECT_EQ(cache_.n_cached(), 2);
  EXPECT_EQ(cache_.n_evictable(), 0);
  EXPECT_EQ(cache_.Match(0, Tokens(8, 0), 8, &t, &chain), 8);
  kv_.Release(&t);
  kv_.Release(&held);
  EXPECT_TRUE(cache_.EvictFor(pool_.n_pages()));
  EXPECT_EQ(pool_.n_free(), pool_.n_pages());
}

}  // namespace
}  // namespace chorus::memory

namespace chorus::memory {
namespace {

// Layer groups (kv_cache.h): an entry holds the block of each group; under pressure the cache
// gives up windowed blocks it alone holds once no whole entry is free, a match then ends where
// the window's blocks are all there, and a sequence that computes a given-up block again gives
// the cache its copy.
TEST(PrefixCacheGroupsTest, WindowedBlocksAreTrimmedUnderPressureAndMatchesStopBeforeThem) {
  KvLayout layout{.n_layers = 2, .n_kv_heads = 1, .head_dim = 4, .block_size = 16};
  layout.layer_windows = {0, 20};  // a global layer and a windowed one: two groups
  PagePool pool(32, layout.PageBytes());
  KvCache kv(layout, &pool);
  PrefixCache cache(&kv);
  std::vector<int32_t> tokens(80);
  std::iota(tokens.begin(), tokens.end(), 100);
  // Sequence a computed 80 tokens (5 blocks per group), registered them, and released its
  // windowed blocks behind the window (keys < 60: blocks 0..2).
  std::vector<int32_t> a;
  ASSERT_TRUE(kv.Reserve(&a, 80).ok());
  PrefixChain chain_a;
  cache.Insert(0, tokens, 80, a, &chain_a);
  EXPECT_EQ(cache.n_cached(), 5);
  EXPECT_EQ(kv.DropBehindWindows(&a, 80), 3);
  EXPECT_EQ(cache.n_evictable(), 3);  // the windowed blocks 0..2 only the cache holds
  // Sequence b matches the first 2 blocks (touching them: blocks 2, 3, 4 are now the LRU end).
  std::vector<int32_t> b;
  PrefixChain chain_b;
  EXPECT_EQ(cache.Match(0, std::span(tokens).first(33), 32, &b, &chain_b), 32);
  EXPECT_EQ(b.size(), 4u);
  // One page wanted: no entry is free as a whole (a holds every global block), so the cache
  // gives up the least recently used windowed block it alone holds: block 2's.
  const int64_t free_before = pool.n_free();
  EXPECT_TRUE(cache.EvictFor(free_before + 1));
  EXPECT_EQ(pool.n_free(), free_before + 1);
  EXPECT_EQ(cache.n_cached(), 5);
  EXPECT_EQ(cache.evictions(), 0u);
  // A match of 79 tokens would end at block 4, whose next row reads keys 44..63: block 2's
  // windowed keys are gone, and so for 3 blocks (keys 28..47); 2 blocks (keys 12..31) it is.
  std::vector<int32_t> c;
  PrefixChain chain_c;
  EXPECT_EQ(cache.Match(0, tokens, 79, &c, &chain_c), 32);
  EXPECT_EQ(c, b);
  // c computes tokens 32..79 itself and registers them: block 2's windowed copy is back.
  ASSERT_TRUE(kv.PrepareWrite(&c, 32, 80).ok());
  cache.Insert(0, tokens, 80, c, &chain_c);
  EXPECT_EQ(chain_c.blocks, 5);
  std::vector<int32_t> d;
  PrefixChain chain_d;
  EXPECT_EQ(cache.Match(0, tokens, 79, &d, &chain_d), 64);
  EXPECT_EQ(d.size(), 8u);
  for (auto* t : {&a, &b, &c, &d}) kv.Release(t);
  // The cache's own blocks are all that is left; evicting everything empties the pool.
  EXPECT_TRUE(cache.EvictFor(32));
  EXPECT_EQ(pool.n_free(), 32);
}

}  // namespace
}  // namespace chorus::memory
