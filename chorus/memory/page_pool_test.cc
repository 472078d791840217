// test-labels: unit
#include "chorus/memory/page_pool.h"

#include <sys/mman.h>
#include <unistd.h>

#include <set>

#include "chorus/memory/kv_cache.h"
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

// Fraction of the pool's arena that is resident in memory (mincore).
double ResidentFraction(PagePool& pool) {
  const size_t os_page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(pool.PageData(0)) / os_page * os_page;
  const uintptr_t end = reinterpret_cast<uintptr_t>(pool.PageData(0)) +
                        static_cast<uintptr_t>(pool.n_pages() * pool.page_bytes());
  std::vector<unsigned char> vec((end - begin + os_page - 1) / os_page);
  CHORUS_CHECK(::mincore(reinterpret_cast<void*>(begin), end - begin, vec.data()) == 0);
  size_t resident = 0;
  for (unsigned char v : vec) resident += v & 1;
  return static_cast<double>(resident) / static_cast<double>(vec.size());
}

TEST(PagePoolTest, PrefaultMakesTheWholeArenaResident) {
  // 96 MiB: above glibc's largest mmap threshold, so the arena is a fresh, untouched mapping.
  PagePool pool(96, 1 << 20);
  EXPECT_LT(ResidentFraction(pool), 0.5);
  pool.Prefault();
  EXPECT_EQ(ResidentFraction(pool), 1.0);
  // Still an ordinary pool.
  auto pages = pool.Allocate(96, PageKind::kKv);
  ASSERT_TRUE(pages.ok());
  for (int32_t p : *pages) pool.PageData(p)[pool.page_bytes() - 1] = 1;
  pool.Free(*pages);
  EXPECT_EQ(pool.n_free(), 96);
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
  *kv.K(1, table[1], 15, 1) = 3.0f;
  *kv.V(0, table[0], 0, 0) = 4.0f;
  EXPECT_EQ(*kv.K(1, table[1], 15, 1), 3.0f);
  EXPECT_EQ(*kv.V(0, table[0], 0, 0), 4.0f);
  // Head-major blocks: the view of KV head 1 walks that head's V rows, head_dim floats apart,
  // and its K columns: slot t's element d at t + d · block_size.
  auto view = kv.View(1, 1, table.data());
  EXPECT_EQ(view.kv_stride, 4);
  EXPECT_TRUE(view.k_columns);
  EXPECT_EQ(view.v_blocks[table[1]] + 15 * view.kv_stride, kv.V(1, table[1], 15, 1));
  EXPECT_EQ(view.k_blocks[table[1]] + 15, kv.K(1, table[1], 15, 1));
  EXPECT_EQ(kv.V(1, table[1], 1, 0), kv.V(1, table[1], 0, 0) + 4);
  EXPECT_EQ(kv.K(1, table[1], 1, 0), kv.K(1, table[1], 0, 0) + 1);
  EXPECT_EQ(kv.K(1, table[1], 0, 1), kv.K(1, table[1], 0, 0) + 16 * 4);
  kv.Release(&table);
  EXPECT_TRUE(table.empty());
  EXPECT_EQ(pool.n_free(), 4);
}

}  // namespace
}  // namespace chorus::memory
