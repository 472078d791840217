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

// Sliding windows: a windowed group's blocks wholly behind n_computed − window are released and
// their slots marked, later slots keep their indices, a global group's blocks stay; a block
// another holder shares survives until that holder lets go, and every operation skips dropped
// slots.
TEST(KvCacheSharingTest, DropBehindWindowsReleasesOnlyWindowedBlocks) {
  KvLayout layout = SmallLayout();
  layout.layer_windows = {0, 20};  // layer 0 global, layer 1 a window of 20: two groups
  PagePool pool(16, layout.PageBytes());
  KvCache kv(layout, &pool);
  ASSERT_EQ(kv.n_groups(), 2);
  std::vector<int32_t> t;
  ASSERT_TRUE(kv.Reserve(&t, 80).ok());  // 5 blocks per group, interleaved
  ASSERT_EQ(t.size(), 10u);
  const std::vector<int32_t> before = t;
  const int32_t g1 = kv.groups().group_of[1];
  std::vector<int32_t> other = kv.Fork({t[g1]});  // e.g. a prefix-cache reference on block 0
  // n_computed 67: rows read keys > 47; key 47 is kept too, so tokens 0..31 are behind.
  EXPECT_EQ(kv.DropBehindWindows(&t, 67), 2);
  for (int64_t i = 0; i < 5; ++i) {
    const size_t global = static_cast<size_t>(i * 2 + (1 - g1)), windowed = i * 2 + g1;
    EXPECT_EQ(t[global], before[global]) << i;
    EXPECT_EQ(t[windowed], i < 2 ? KvCache::kDroppedBlock : before[windowed]) << i;
  }
  EXPECT_EQ(pool.n_free(), 16 - 10 + 1);       // block 1 freed; block 0 still held by `other`
  EXPECT_EQ(kv.DropBehindWindows(&t, 67), 0);  // idempotent
  EXPECT_EQ(kv.DropBehindWindows(&t, 68), 1);  // key 48 behind now: block 2 goes
  std::vector<int32_t> fork = kv.Fork(t);      // skips the dropped slots
  EXPECT_EQ(kv.PagesToWrite(t, 68, 96), 4);    // both groups: block 4 shared by the fork, block 5
  EXPECT_TRUE(kv.PrepareWrite(&t, 68, 96).ok());
  EXPECT_EQ(t.size(), 12u);
  kv.Release(&fork);
  kv.Release(&t);
  kv.Release(&other);
  EXPECT_EQ(pool.n_free(), 16);
}

// How layers are grouped: one group of every layer without windows (the page as before);
// Gemma 2 (every other layer slides) two groups of half; Gemma 3 (five of six slide) pages of
// the global layers' count, the windowed layers cut into groups of that size.
TEST(KvCacheGroupsTest, LayersAreGroupedByWindow) {
  KvLayout plain{.n_layers = 26, .n_kv_heads = 1, .head_dim = 256, .block_size = 16};
  const int64_t per_layer = 2 * 16 * 256 * 4;
  EXPECT_EQ(plain.PageBytes(), 26 * per_layer);
  KvGroups g = plain.Groups();
  EXPECT_EQ(g.n_groups(), 1);
  EXPECT_FALSE(g.any_window());
  EXPECT_EQ(g.slot_of[25], 25);

  KvLayout gemma2 = plain;
  for (int64_t l = 0; l < 26; ++l) gemma2.layer_windows.push_back(l % 2 == 0 ? 4096 : 0);
  g = gemma2.Groups();
  EXPECT_EQ(g.layers_per_page, 13);
  EXPECT_EQ(g.window, (std::vector<int64_t>{0, 4096}));
  EXPECT_EQ(gemma2.PageBytes(), 13 * per_layer);
  EXPECT_EQ(g.group_of[0], 1);
  EXPECT_EQ(g.group_of[1], 0);
  EXPECT_EQ(g.slot_of[1], 0);
  EXPECT_EQ(g.slot_of[25], 12);
  EXPECT_EQ(g.slot_of[24], 12);

  KvLayout gemma3 = plain;
  for (int64_t l = 0; l < 26; ++l) gemma3.layer_windows.push_back((l + 1) % 6 != 0 ? 512 : 0);
  g = gemma3.Groups();
  EXPECT_EQ(g.layers_per_page, 4);  // layers 5, 11, 17, 23
  EXPECT_EQ(g.window, (std::vector<int64_t>{0, 512, 512, 512, 512, 512, 512}));
  EXPECT_EQ(g.group_of[23], 0);
  EXPECT_EQ(g.slot_of[23], 3);
  EXPECT_EQ(g.group_of[0], 1);
  EXPECT_EQ(g.group_of[4], 2);   // the fifth windowed layer opens the second windowed group
  EXPECT_EQ(g.group_of[25], 6);  // the 22nd: the last group holds 2 of 4
  EXPECT_EQ(g.slot_of[25], 1);
  // 32768 tokens in chunks of 512: every block of the global group, ~2 windows of the others.
  EXPECT_EQ(g.PagesFor(32768, 512, 16), 2048 + 6 * (64 + 1));

  KvLayout phi3 = plain;
  phi3.layer_windows.assign(26, 2047);
  g = phi3.Groups();
  EXPECT_EQ(g.n_groups(), 1);
  EXPECT_TRUE(g.any_window());
  EXPECT_EQ(phi3.PageBytes(), plain.PageBytes());
}

// Each layer's K/V live in its own group's block at its place in the page, and the attention
// view of a layer walks that group's entries of the interleaved table.
TEST(KvCacheGroupsTest, ViewsReadEachLayersGroup) {
  KvLayout layout = SmallLayout();
  layout.n_layers = 3;
  layout.layer_windows = {8, 0, 8};  // one global layer: pages of 1 layer, groups {1}, {0}, {2}
  PagePool pool(32, layout.PageBytes());
  KvCache kv(layout, &pool);
  ASSERT_EQ(kv.n_groups(), 3);
  std::vector<int32_t> t;
  ASSERT_TRUE(kv.Reserve(&t, 40).ok());
  std::vector<float> k(static_cast<size_t>(layout.kv_dim())), v(k.size());
  for (int64_t pos = 0; pos < 40; ++pos) {
    for (int64_t l = 0; l < 3; ++l) {
      for (size_t j = 0; j < k.size(); ++j) {
        k[j] = static_cast<float>(1000 * l + 10 * pos) + static_cast<float>(j);
        v[j] = -k[j];
      }
      kv.WriteToken(l, kv.BlockAt(t.data(), l, pos), pos % 16, k.data(), v.data());
    }
  }
  for (int64_t l = 0; l < 3; ++l) {
    for (int64_t h = 0; h < 2; ++h) {
      const kernels::PagedKv view = kv.View(l, h, t.data());
      for (int64_t pos = 0; pos < 40; ++pos) {
        const float* kr = view.KeyRow(pos, 0, 4, nullptr);
        const float* vr = view.ValueRow(pos, 0, 4, nullptr);
        EXPECT_EQ(kr[1], static_cast<float>(1000 * l + 10 * pos + 4 * h + 1)) << l << " " << pos;
        EXPECT_EQ(vr[1], -kr[1]);
      }
    }
  }
  kv.Release(&t);
  EXPECT_EQ(pool.n_free(), 32);
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
