// test-labels: unit
#include "chorus/memory/kv_cache.h"

#include "tests/testutil/testutil.h"

namespace chorus::memory {
namespace {

KvLayout SmallLayout() { return {.n_layers = 2, .n_kv_heads = 2, .head_dim = 4, .block_size = 16}; }

TEST(KvCacheSharingTest, ForkSharesBlocksAndLastReleaseFreesThem) {
  KvLayout layout = SmallLayout();
  PagePool pool(8, layout.PageBytes());
  KvCache kv(layout, &pool);
  std::vector<int32_t> a;
  CHORUS_ASSERT_OK(kv.Reserve(&a, 40));  // 3 blocks, the last one partly filled
  std::vector<int32_t> b = kv.Fork(a);
  std::vector<int32_t> c = kv.Fork(a);
  EXPECT_EQ(b, a);
  EXPECT_EQ(pool.n_used(PageKind::kKv), 3);
  EXPECT_EQ(kv.n_shared(), 3);
  EXPECT_EQ(kv.RefCount(a[0]), 3);
  kv.Release(&a);
  EXPECT_EQ(pool.n_used(PageKind::kKv), 3);  // still held by b and c
  EXPECT_EQ(kv.RefCount(b[0]), 2);
  kv.Release(&b);
  EXPECT_EQ(kv.n_shared(), 0);
  EXPECT_EQ(kv.RefCount(c[2]), 1);
  kv.Release(&c);
  EXPECT_EQ(pool.n_free(), 8);
}

TEST(KvCacheSharingTest, PrepareWriteCopiesOnlyTheSharedBlocksItWrites) {
  KvLayout layout = SmallLayout();
  PagePool pool(8, layout.PageBytes());
  KvCache kv(layout, &pool);
  std::vector<int32_t> a;
  CHORUS_ASSERT_OK(kv.Reserve(&a, 40));
  *kv.K(1, a[2], 7, 0) = 5.0f;  // token 39, the last written one
  std::vector<int32_t> b = kv.Fork(a);
  // b writes token 40 (block 2, shared): it gets a private copy with a's history in it.
  EXPECT_EQ(kv.PagesToWrite(b, 40, 41), 1);
  CHORUS_ASSERT_OK(kv.PrepareWrite(&b, 40, 41));
  EXPECT_EQ(b[0], a[0]);
  EXPECT_EQ(b[1], a[1]);
  EXPECT_NE(b[2], a[2]);
  EXPECT_EQ(*kv.K(1, b[2], 7, 0), 5.0f);
  *kv.K(1, b[2], 8, 0) = 6.0f;
  EXPECT_NE(*kv.K(1, a[2], 8, 0), 6.0f);
  EXPECT_EQ(kv.RefCount(a[2]), 1);
  EXPECT_EQ(kv.n_shared(), 2);
  // a is now the only holder of its last block: writing into it copies nothing; growing past
  // it takes one new block.
  EXPECT_EQ(kv.PagesToWrite(a, 40, 49), 1);
  CHORUS_ASSERT_OK(kv.PrepareWrite(&a, 40, 49));
  EXPECT_EQ(a.size(), 4u);
  EXPECT_EQ(pool.n_used(PageKind::kKv), 5);
  kv.Release(&a);
  kv.Release(&b);
  EXPECT_EQ(pool.n_free(), 8);
}

// Sliding windows: blocks wholly behind a position are released and their slots marked, later
// slots keep their indices; a block another holder shares survives until that holder lets go,
// and every operation skips dropped slots.
TEST(KvCacheSharingTest, DropBeforeReleasesWholeBlocksBehindThePosition) {
  KvLayout layout = SmallLayout();
  PagePool pool(8, layout.PageBytes());
  KvCache kv(layout, &pool);
  std::vector<int32_t> t;
  ASSERT_TRUE(kv.Reserve(&t, 80).ok());  // 5 blocks
  const std::vector<int32_t> before = t;
  std::vector<int32_t> other = kv.Fork({t[0]});  // e.g. a prefix-cache reference on block 0
  EXPECT_EQ(kv.DropBefore(&t, 47), 2);           // tokens 0..31 behind, 32..46 still needed
  EXPECT_EQ(t[0], KvCache::kDroppedBlock);
  EXPECT_EQ(t[1], KvCache::kDroppedBlock);
  EXPECT_EQ(t[2], before[2]);
  EXPECT_EQ(pool.n_free(), 8 - 5 + 1);     // block 1 freed; block 0 still held by `other`
  EXPECT_EQ(kv.DropBefore(&t, 47), 0);     // idempotent
  std::vector<int32_t> fork = kv.Fork(t);  // skips the dropped slots
  EXPECT_TRUE(kv.PrepareWrite(&t, 64, 96).ok());
  EXPECT_EQ(t.size(), 6u);
  kv.Release(&fork);
  kv.Release(&t);
  kv.Release(&other);
  EXPECT_EQ(pool.n_free(), 8);
}

TEST(KvCacheSharingTest, PrepareWriteIsAllOrNothing) {
  KvLayout layout = SmallLayout();
  PagePool pool(4, layout.PageBytes());
  KvCache kv(layout, &pool);
  std::vector<int32_t> a;
  CHORUS_ASSERT_OK(kv.Reserve(&a, 40));  // 3 of 4 pages
  std::vector<int32_t> b = kv.Fork(a);
  const std::vector<int32_t> before = b;
  // Rewriting from token 0 to 70 needs 3 copies + 2 new blocks: only 1 page is free.
  EXPECT_EQ(kv.PrepareWrite(&b, 0, 70).code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(b, before);
  EXPECT_EQ(pool.n_free(), 1);
  EXPECT_EQ(kv.n_shared(), 3);
  kv.Release(&a);
  kv.Release(&b);
  EXPECT_EQ(pool.n_free(), 4);
}

}  // namespace
}  // namespace chorus::memory
