// PagedLora (unified paging): an adapter's rows packed into kAdapter pages of the shared pool,
// never straddling a page; the pool copy computes bitwise what the host copy computes; pages
// return to the pool with the right kind accounting.
#include "chorus/adapters/paged_lora.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "chorus/adapters/lora/lora_hook.h"
#include "chorus/model/synthetic.h"
#include "tests/testutil/testutil.h"

namespace chorus::adapters {
namespace {

using model::Linear;

model::ModelConfig TinyConfig() {
  auto c = model::SyntheticConfig("tiny");
  CHORUS_CHECK(c.ok());
  return *c;
}

std::shared_ptr<const LoraAdapter> MakeAdapter(const model::ModelConfig& c, int64_t rank,
                                               uint64_t seed,
                                               LoraStorage storage = LoraStorage::kF32) {
  RandomLoraSpec s;
  s.rank = rank;
  s.seed = seed;
  LoraLimits limits;
  limits.storage = storage;
  std::string name = "a";  // appended: "a" + to_string trips a false GCC 12 -Wrestrict
  name += std::to_string(seed);
  auto a = LoraAdapter::Build(MakeRandomLora(c, s), c, name, limits);
  CHORUS_CHECK(a.ok()) << a.status().ToString();
  return *a;
}

TEST(PagedLoraTest, RowsPackedIntoAdapterPagesWithoutStraddling) {
  const auto c = TinyConfig();
  auto host = MakeAdapter(c, 8, 1);
  const int64_t page_bytes = 4096;
  memory::PagePool pool(128, page_bytes);
  auto need = PagedLora::PagesNeeded(*host, page_bytes);
  ASSERT_TRUE(need.ok()) << need.status().ToString();
  // Rows are at most n_ff = 352 floats (1408 bytes): two per page at least, so fewer pages than
  // rows.
  EXPECT_LT(*need, host->n_rows());
  int64_t bytes = 0;
  for (int64_t i = 0; i < host->n_rows(); ++i) bytes += host->row_bytes(i);
  EXPECT_GE(*need * page_bytes, bytes);

  const int32_t kv_page =
      pool.AllocateOne(memory::PageKind::kKv);  // KV and adapters share the pool
  auto pages = pool.Allocate(*need, memory::PageKind::kAdapter);
  ASSERT_TRUE(pages.ok());
  EXPECT_EQ(pool.n_used(memory::PageKind::kAdapter), *need);
  EXPECT_EQ(pool.n_used(memory::PageKind::kKv), 1);
  auto paged = PagedLora::Create(host, &pool, *pages);
  ASSERT_TRUE(paged.ok()) << paged.status().ToString();
  (*paged)->CopyIn();
  ASSERT_EQ((*paged)->n_rows(), host->n_rows());
  for (int64_t i = 0; i < host->n_rows(); ++i) {
    const auto* p = static_cast<const uint8_t*>((*paged)->row_data(i));
    // Inside one adapter page, whole, 64-byte aligned.
    bool inside = false;
    for (int32_t pg : *pages) {
      const uint8_t* base = pool.PageData(pg);
      if (p >= base && p + (*paged)->row_bytes(i) <= base + page_bytes) inside = true;
    }
    EXPECT_TRUE(inside) << "row " << i;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
    EXPECT_EQ(0, std::memcmp(p, host->row_data(i), static_cast<size_t>(host->row_bytes(i))))
        << "row " << i;
  }
  // The module tables are views into the same rows.
  EXPECT_EQ((*paged)->module(1, Linear::kK).rank, 8);
  EXPECT_EQ((*paged)->module(1, Linear::kK).a, nullptr);  // not contiguous in the pool
  EXPECT_EQ((*paged)->fused(1, LoraView::Group::kQkv).a_rows[8],
            (*paged)->module(1, Linear::kK).a_rows[0]);
  paged->reset();
  pool.Free(*pages);
  pool.FreeOne(kv_page);
  EXPECT_EQ(pool.n_used(memory::PageKind::kAdapter), 0);
  EXPECT_EQ(pool.n_free(), 128);
}

TEST(PagedLoraTest, PoolCopyComputesBitwiseLikeHostCopy) {
  for (LoraStorage st : {LoraStorage::kF32, LoraStorage::kBF16}) {
    SCOPED_TRACE(LoraStorageName(st));
    const auto c = TinyConfig();
    auto a = MakeAdapter(c, 16, 2, st), b = MakeAdapter(c, 1, 3, st);
    EXPECT_EQ(a->storage(), st);
    memory::PagePool pool(256, 8192);
    std::vector<std::unique_ptr<PagedLora>> paged;
    for (const auto& h : {a, b}) {
      auto need = PagedLora::PagesNeeded(*h, pool.page_bytes());
      ASSERT_TRUE(need.ok());
      auto pages = pool.Allocate(*need, memory::PageKind::kAdapter);
      ASSERT_TRUE(pages.ok());
      auto p = PagedLora::Create(h, &pool, *pages);
      ASSERT_TRUE(p.ok());
      (*p)->CopyIn();
      paged.push_back(std::move(*p));
    }
    const int64_t rows = 5, in = c.n_embd;
    std::mt19937 rng(7);
    std::normal_distribution<float> d;
    std::vector<float> x(static_cast<size_t>(rows * in));
    for (float& f : x) f = d(rng);
    auto run = [&](std::vector<const LoraView*> views, Linear which) {
      LoraHook hook(c, rows);
      CHORUS_CHECK(hook.SetRows(views).ok());
      const int64_t out = LinearOut(c, which);
      std::vector<float> y(static_cast<size_t>(rows * out), 0.5f);
      hook.Apply(1, which, x.data(), in, y.data(), out, rows, nullptr);
      return y;
    };
    for (Linear which : {Linear::kQ, Linear::kK, Linear::kV, Linear::kGate, Linear::kUp}) {
      auto host = run({a.get(), a.get(), nullptr, b.get(), a.get()}, which);
      auto pool_copy =
          run({paged[0].get(), paged[0].get(), nullptr, paged[1].get(), paged[0].get()}, which);
      auto mixed = run({a.get(), a.get(), nullptr, paged[1].get(), a.get()}, which);
      EXPECT_EQ(host, pool_copy) << model::LinearName(which);
      EXPECT_EQ(host, mixed) << model::LinearName(which);
    }
  }
}

TEST(PagedLoraTest, RowLargerThanAPageIsRefused) {
  const auto c = TinyConfig();
  auto host = MakeAdapter(c, 4, 4);
  auto need = PagedLora::PagesNeeded(*host, 512);  // an n_ff row (1408 bytes) does not fit
  EXPECT_EQ(need.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(need.status().message().find("larger than a pool page"), std::string::npos);
}

}  // namespace
}  // namespace chorus::adapters
