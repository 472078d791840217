// test-labels: unit
#include <set>

#include "chorus/memory/kv_cache.h"
#include "chorus/memory/page_pool.h"
#include "tests/testutil/testutil.h"

namespace chorus::memory {
namespace {

TEST(PagePoolTest, AllocateFreeAndCountByKind) {
  PagePool pool(8, 128);
  auto a = pool.Allocate(5, PageKind::kKv);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(pool.n_free(), 3);
  EXPECT_EQ(pool.n_used(PageKind::kKv), 5);
  EXPECT_EQ(pool.Allocate(4, PageKind::kAdapter).status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(pool.n_free(), 3);  // all-or-nothing
  int32_t p = pool.AllocateOne(PageKind::kAdapter);
  EXPECT_GE(p, 0);
  EXPECT_EQ(pool.n_used(PageKind::kAdapter), 1);
  std::set<int32_t> distinct(a->begin(), a->end());
  distinct.insert(p);
  EXPECT_EQ(distinct.size(), 6u);
  pool.Free(*a);
  pool.FreeOne(p);
  EXPECT_EQ(pool.n_free(), 8);
  EXPECT_EQ(pool.n_used(PageKind::kKv), 0);
}

TEST(KvCacheTest, ReserveGrowsAndReleases) {
  KvLayout layout{.n_layers = 2, .n_kv_heads = 2, .head_dim = 4, .block_size = 16};
  PagePool pool(4, layout.PageBytes());
  KvCache kv(layout, &pool);
  std::vector<int32_t> table;
  CHORUS_ASSERT_OK(kv.Reserve(&table, 17));
  EXPECT_EQ(table.size(), 2u);
  CHORUS_ASSERT_OK(kv.Reserve(&table, 32));
  EXPECT_EQ(table.size(), 2u);
  EXPECT_EQ(kv.Reserve(&table, 100).code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(table.size(), 2u);
  // Writes to different layers/blocks never overlap.
  *kv.K(1, table[1], 15) = 3.0f;
  *kv.V(0, table[0], 0) = 4.0f;
  EXPECT_EQ(*kv.K(1, table[1], 15), 3.0f);
  auto view = kv.View(1, 1, table.data());
  EXPECT_EQ(view.k_blocks[table[1]] + 15 * view.kv_stride - 4, kv.K(1, table[1], 15));
  kv.Release(&table);
  EXPECT_TRUE(table.empty());
  EXPECT_EQ(pool.n_free(), 4);
}

}  // namespace
}  // namespace chorus::memory
