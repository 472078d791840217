// test-labels: unit concurrency
// PagedDelta: a delta's matrices banded into pool pages give the host copy's term bit for bit
// (every layout, both activation paths, mixed with host-copy rows in one step), keep serving
// with their extras after the host copy is gone, and lay every band out as promised (inside the
// given pages, cache-line aligned, multiples of 16 rows but for a matrix's last); a page too
// small for a band is an error naming the tensor.
#include "chorus/adapters/delta/paged_delta.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "chorus/adapters/delta/delta_synthetic.h"
#include "chorus/model/synthetic.h"

namespace chorus::delta {
namespace {

model::ModelConfig TinyConfig() {
  auto c = model::SyntheticConfig("tiny");
  CHORUS_CHECK(c.ok());
  return *c;
}

// A random delta of `spec` with one norm extra (layer 1's attention norm).
Delta MakeDelta(const model::ModelConfig& c, const RandomDeltaSpec& spec) {
  Delta d = MakeRandomDelta(c, spec);
  ExtraDelta norm;
  norm.name = model::HfLayerNormName(1, false);
  norm.shape = {c.n_embd};
  norm.values.assign(static_cast<size_t>(c.n_embd), 0.0f);
  for (int64_t k = 0; k < c.n_embd; ++k)
    norm.values[static_cast<size_t>(k)] = 0.01f * static_cast<float>(k % 7);
  d.extras.push_back(std::move(norm));
  return d;
}

const RandomDeltaSpec kSpecs[] = {
    {.bits = 1, .sparse24 = false, .group_size = 0},  // BitDelta
    {.bits = 4, .sparse24 = true, .group_size = 64},  // deltazip 4-bit 2:4
    {.bits = 2, .sparse24 = true, .group_size = 64},
    {.bits = 8, .sparse24 = false, .group_size = 128},
    {.bits = 3, .sparse24 = true, .group_size = 32},  // the f32 path
};

TEST(PagedDeltaTest, BandedPoolCopyGivesTheHostCopysTermBitwise) {
  const model::ModelConfig c = TinyConfig();
  for (const RandomDeltaSpec& spec : kSpecs) {
    // Pages small enough that many matrices take several bands (16 rows of 8-bit down_proj take
    // 5.8 KB).
    const int64_t kPageBytes = spec.bits == 8 ? 8192 : 4096;
    SCOPED_TRACE("bits " + std::to_string(spec.bits) + " sparse " + std::to_string(spec.sparse24) +
                 " group " + std::to_string(spec.group_size));
    const Delta d = MakeDelta(c, spec);
    // Two host copies of the same delta: one becomes the pool copy's source (and is then
    // dropped), the other is the comparison.
    auto source = DeltaWeights::Build(Delta(d), c, "d", nullptr, "0000000000000001-v1");
    auto host = DeltaWeights::Build(Delta(d), c, "d", nullptr, "0000000000000001-v1");
    ASSERT_TRUE(source.ok() && host.ok());
    auto need = PagedDelta::PagesNeeded(**source, kPageBytes);
    ASSERT_TRUE(need.ok()) << need.status().ToString();
    ASSERT_GT(*need, 1);
    memory::PagePool pool(*need + 2, kPageBytes);
    auto pages = pool.Allocate(*need, memory::PageKind::kAdapter);
    ASSERT_TRUE(pages.ok());
    auto made = PagedDelta::Create(*source, &pool, *pages);
    ASSERT_TRUE(made.ok()) << made.status().ToString();
    std::unique_ptr<PagedDelta> paged = std::move(*made);
    paged->CopyIn();
    paged->ReleaseHost();
    std::weak_ptr<const DeltaWeights> gone = *source;
    source->reset();
    ASSERT_TRUE(gone.expired()) << "the pool copy must not hold the host copy once released";

    EXPECT_EQ(paged->name(), "d");
    EXPECT_EQ(paged->identity(), "0000000000000001-v1");
    const uint8_t* lo = pool.PageData(0);
    const uint8_t* hi = pool.PageData(static_cast<int32_t>(pool.n_pages() - 1)) + kPageBytes;
    auto in_pages = [&](const void* p) {
      if (p == nullptr) return true;
      const auto* b = static_cast<const uint8_t*>(p);
      bool in_one = false;
      for (int32_t page : paged->pages())
        in_one = in_one || (b >= pool.PageData(page) && b < pool.PageData(page) + kPageBytes);
      return in_one && b >= lo && b < hi && reinterpret_cast<uintptr_t>(b) % 64 == 0;
    };
    size_t most_bands = 0;
    for (int64_t l = 0; l < c.n_layers; ++l) {
      for (int li = 0; li < model::kNumLinears; ++li) {
        const kernels::DeltaMatrixView& v = paged->at(l, static_cast<model::Linear>(li));
        ASSERT_GT(v.rows, 0);
        EXPECT_EQ(v.codes, nullptr);
        ASSERT_FALSE(v.bands.empty());
        most_bands = std::max(most_bands, v.bands.size());
        for (size_t b = 0; b < v.bands.size(); ++b) {
          const kernels::DeltaBand& band = v.bands[b];
          if (b + 1 < v.bands.size()) {
            EXPECT_EQ((band.row_end - band.row_begin) % PagedDelta::kBandRows, 0);
          }
          EXPECT_TRUE(in_pages(band.codes) && in_pages(band.mask) && in_pages(band.scales) &&
                      in_pages(band.positions));
        }
      }
    }
    EXPECT_GT(most_bands, 1u);
    // The extras survive the host copy.
    ASSERT_NE(paged->norm(1, model::LinearHook::Norm::kAttn), nullptr);
    EXPECT_EQ(*paged->norm(1, model::LinearHook::Norm::kAttn),
              *(*host)->norm(1, model::LinearHook::Norm::kAttn));

    // Rows 0–1 read the host copy, rows 2–3 the pool copy, row 4 none: every linear's term of
    // rows 2–3 equals that of rows 0–1 (same x) bit for bit, and the same rows all on the host
    // copy give the same again.
    std::mt19937 rng(5);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (kernels::DeltaActivations act :
         {kernels::DeltaActivations::kF32, kernels::DeltaActivations::kInt16}) {
      DeltaHook mixed(8, act), all_host(8, act);
      const DeltaView* h = host->get();
      const std::vector<const DeltaView*> rows_mixed = {h, h, paged.get(), paged.get(), nullptr};
      const std::vector<const DeltaView*> rows_host = {h, h, h, h, nullptr};
      ASSERT_TRUE(mixed.SetRows(rows_mixed).ok());
      ASSERT_TRUE(all_host.SetRows(rows_host).ok());
      ThreadPool threads(2);
      for (int64_t l = 0; l < c.n_layers; ++l) {
        for (int li = 0; li < model::kNumLinears; ++li) {
          const auto which = static_cast<model::Linear>(li);
          const int64_t in = model::LinearIn(c, which), out = model::LinearOut(c, which);
          std::vector<float> x(static_cast<size_t>(5 * in));
          for (int64_t k = 0; k < 2 * in; ++k) x[static_cast<size_t>(k)] = nd(rng);
          std::copy(x.begin(), x.begin() + 2 * in, x.begin() + 2 * in);  // rows 2–3 = rows 0–1
          std::vector<float> y1(static_cast<size_t>(5 * out), 0.125f), y2 = y1;
          mixed.Apply(l, which, x.data(), in, y1.data(), out, 5, &threads);
          all_host.Apply(l, which, x.data(), in, y2.data(), out, 5, &threads);
          ASSERT_EQ(y1, y2) << "layer " << l << " linear " << li;
          for (int64_t o = 0; o < 2 * out; ++o)
            ASSERT_EQ(y1[static_cast<size_t>(o)], y1[static_cast<size_t>(2 * out + o)]);
          for (int64_t o = 4 * out; o < 5 * out; ++o) ASSERT_EQ(y1[static_cast<size_t>(o)], 0.125f);
        }
      }
    }
  }
}

TEST(PagedDeltaTest, APageTooSmallForABandIsAnErrorNamingTheTensor) {
  const model::ModelConfig c = TinyConfig();
  auto host = DeltaWeights::Build(MakeRandomDelta(c, kSpecs[1]), c, "small");
  ASSERT_TRUE(host.ok());
  auto need = PagedDelta::PagesNeeded(**host, 256);
  ASSERT_FALSE(need.ok());
  EXPECT_NE(need.status().message().find("delta 'small'"), std::string::npos)
      << need.status().ToString();
  EXPECT_NE(need.status().message().find(model::HfLayerTensorName(0, model::Linear::kQ)),
            std::string::npos)
      << need.status().ToString();
  memory::PagePool pool(4, 256);
  auto pages = pool.Allocate(4, memory::PageKind::kAdapter);
  ASSERT_TRUE(pages.ok());
  EXPECT_FALSE(PagedDelta::Create(*host, &pool, *pages).ok());
  // Too few pages for the delta: refused, naming both counts.
  memory::PagePool big(2, 4096);
  auto two = big.Allocate(1, memory::PageKind::kAdapter);
  ASSERT_TRUE(two.ok());
  auto few = PagedDelta::Create(*host, &big, *two);
  ASSERT_FALSE(few.ok());
  EXPECT_NE(few.status().message().find("pool pages, 1 given"), std::string::npos)
      << few.status().ToString();
}

}  // namespace
}  // namespace chorus::delta
