// test-labels: unit
#include "chorus/memory/kv_cache.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "chorus/base/rng.h"
#include "chorus/kernels/dispatch.h"
#include "chorus/tensor/dtype.h"
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

// Under tensor parallelism the other ranks make the same page copies: with recording on, each
// copy-on-write copy is noted as (source, destination), in order, until cleared.
TEST(KvCacheSharingTest, RecordedCopiesNameSourceAndDestinationInOrder) {
  KvLayout layout = SmallLayout();
  PagePool pool(8, layout.PageBytes());
  KvCache kv(layout, &pool);
  std::vector<int32_t> a;
  CHORUS_ASSERT_OK(kv.Reserve(&a, 40));
  std::vector<int32_t> b = kv.Fork(a), c = kv.Fork(a);
  CHORUS_ASSERT_OK(kv.PrepareWrite(&b, 40, 41));  // not recording yet
  EXPECT_TRUE(kv.copies().empty());
  kv.RecordCopies(true);
  CHORUS_ASSERT_OK(kv.PrepareWrite(&c, 16, 41));  // blocks 1 and 2 shared with a: two copies
  EXPECT_EQ(kv.copies(), (std::vector<int32_t>{a[1], c[1], a[2], c[2]}));
  CHORUS_ASSERT_OK(kv.PrepareWrite(&a, 40, 41));  // a alone holds its blocks now: no copy
  EXPECT_EQ(kv.copies().size(), 4u);
  kv.ClearCopies();
  EXPECT_TRUE(kv.copies().empty());
  kv.Release(&a);
  kv.Release(&b);
  kv.Release(&c);
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
        float kbuf[4], vbuf[4];  // K in columns is gathered; V used by bf16 views only
        const float* kr = view.KeyRow(pos, 0, 4, kbuf);
        const float* vr = view.ValueRow(pos, 0, 4, vbuf);
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

// bf16 pages: half the bytes; WriteToken rounds to nearest even and every reader (ReadK/ReadV,
// the attention view) sees exactly the rounded values; copy-on-write copies them unchanged.
TEST(KvCacheBf16Test, WriteTokenRoundsToNearestEvenAndTheViewReadsBf16) {
  KvLayout f32 = SmallLayout();
  KvLayout layout = f32;
  layout.dtype = kernels::KvDtype::kBf16;
  EXPECT_EQ(layout.TokenBytes() * 2, f32.TokenBytes());
  EXPECT_EQ(layout.PageBytes(), 2 * 2 * 16 * 2 * 4 * 2);  // layers × K|V × slots × kv_dim × 2 B
  EXPECT_EQ(f32.PageBytes(), 2 * layout.PageBytes());
  PagePool pool(4, layout.PageBytes());
  KvCache kv(layout, &pool);
  std::vector<int32_t> a;
  CHORUS_ASSERT_OK(kv.Reserve(&a, 20));
  // One token: K and V of 2 heads × 4 dims. 1 + 2^-8 is a tie between 1 and 1 + 2^-7 (→ the
  // even 1); 1 + 3·2^-8 a tie between 1 + 2^-7 and 1 + 2^-6 (→ the even 1 + 2^-6); values
  // already in bf16 stay; NaN stays NaN.
  const float tie_down = 1.0f + 0x1p-8f, tie_up = 1.0f + 3 * 0x1p-8f;
  const float k[8] = {tie_down, tie_up, -tie_down, 0.15625f, 1e-3f, -2.5f, 65504.0f, 3.0e38f};
  float v[8];
  for (int i = 0; i < 8; ++i) v[i] = -k[i] * 3.0f;
  v[7] = std::numeric_limits<float>::quiet_NaN();
  kv.WriteToken(1, a[1], 3, k, v);  // token 19
  float got[4];
  for (int64_t g = 0; g < 2; ++g) {
    kv.ReadK(1, a[1], 3, g, got);
    for (int d = 0; d < 4; ++d) EXPECT_EQ(got[d], BF16ToF32(F32ToBF16(k[g * 4 + d]))) << g << d;
    kv.ReadV(1, a[1], 3, g, got);
    for (int d = 0; d < 4; ++d) {
      if (g == 1 && d == 3) {
        EXPECT_TRUE(std::isnan(got[d]));
      } else {
        EXPECT_EQ(got[d], BF16ToF32(F32ToBF16(v[g * 4 + d]))) << g << d;
      }
    }
  }
  kv.ReadK(1, a[1], 3, 0, got);
  EXPECT_EQ(got[0], 1.0f);
  EXPECT_EQ(got[1], 1.0f + 0x1p-6f);
  EXPECT_EQ(got[2], -1.0f);
  EXPECT_EQ(got[3], 0.15625f);
  // The view: bf16, head-major strides in elements, head 1's rows right after head 0's block,
  // K in columns.
  const kernels::PagedKv view = kv.View(1, 1, a.data());
  EXPECT_EQ(view.dtype, kernels::KvDtype::kBf16);
  EXPECT_EQ(view.kv_stride, 4);
  EXPECT_EQ(view.head_stride, 16 * 4);
  EXPECT_TRUE(view.k_columns);
  float buf[4];
  const float* row = view.KeyRow(19, 0, 4, buf);
  kv.ReadK(1, a[1], 3, 1, got);
  for (int d = 0; d < 4; ++d) EXPECT_EQ(row[d], got[d]);
  // Copy-on-write of a shared block keeps the rounded bits.
  std::vector<int32_t> b = kv.Fork(a);
  CHORUS_ASSERT_OK(kv.PrepareWrite(&b, 19, 20));
  EXPECT_NE(b[1], a[1]);
  float copy[4];
  kv.ReadK(1, b[1], 3, 0, copy);
  kv.ReadK(1, a[1], 3, 0, got);
  EXPECT_EQ(std::memcmp(copy, got, sizeof(got)), 0);
  kv.Release(&a);
  kv.Release(&b);
  EXPECT_EQ(pool.n_free(), 4);
}

// Attention over a bf16 cache filled through WriteToken: at every ISA level the tiled kernels
// with the f32 arithmetic (bf16_dot off; prefill blocks, one-token decode rows, split-K) give
// the bits they give over an f32 cache holding the same rounded values, and agree with the
// reference attention (reference::AttentionRow, which reads the bf16 view itself) and with a
// dense softmax in double over the rounded values. The cache's own view asks for bf16 dot
// products: the same bits over every chunking and split-K, within the probabilities' bf16
// rounding of the f32 result.
TEST(KvCacheBf16Test, AttentionOverBf16CacheEqualsF32CacheOfTheRoundedValues) {
  const int64_t n_layers = 2, n_kv = 2, hd = 64, group = 8, n_heads = n_kv * group;
  const int64_t n_ctx = 600, stride = n_heads * hd, kv_dim = n_kv * hd, layer = 1;
  KvLayout l32{.n_layers = n_layers, .n_kv_heads = n_kv, .head_dim = hd, .block_size = 16};
  KvLayout l16 = l32;
  l16.dtype = kernels::KvDtype::kBf16;
  const int64_t blocks = (n_ctx + 15) / 16;
  PagePool p32(blocks, l32.PageBytes()), p16(blocks, l16.PageBytes());
  KvCache c32(l32, &p32), c16(l16, &p16);
  std::vector<int32_t> t32, t16;
  CHORUS_ASSERT_OK(c32.Reserve(&t32, n_ctx));
  CHORUS_ASSERT_OK(c16.Reserve(&t16, n_ctx));
  Rng rng(77);
  std::vector<float> k(static_cast<size_t>(n_ctx * kv_dim)), v(k.size()), kr(k.size()),
      vr(k.size());
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = rng.NextGaussian(), v[i] = rng.NextGaussian();
    kr[i] = BF16ToF32(F32ToBF16(k[i])), vr[i] = BF16ToF32(F32ToBF16(v[i]));
  }
  for (int64_t t = 0; t < n_ctx; ++t) {
    const int64_t b = t / 16, slot = t % 16;
    c16.WriteToken(layer, t16[b], slot, k.data() + t * kv_dim, v.data() + t * kv_dim);  // rounds
    c32.WriteToken(layer, t32[b], slot, kr.data() + t * kv_dim, vr.data() + t * kv_dim);
  }
  std::vector<float> q(static_cast<size_t>(n_ctx * stride));
  for (float& x : q) x = 1.5f * rng.NextGaussian();
  const float scale = 0.125f;
  auto run = [&](const KvCache& c, const std::vector<int32_t>& table, int64_t chunk,
                 bool dot = false) {
    std::vector<float> out(q.size());
    std::vector<float> scratch(
        static_cast<size_t>(kernels::AttentionScratchFloats(chunk, group, hd)));
    for (int64_t pos0 = 0; pos0 < n_ctx; pos0 += chunk) {
      const int64_t n = std::min(chunk, n_ctx - pos0);
      for (int64_t g = 0; g < n_kv; ++g) {
        const int64_t off = pos0 * stride + g * group * hd;
        kernels::PagedKv view = c.View(layer, g, table.data());
        view.bf16_dot = dot;
        kernels::AttentionBlock(q.data() + off, stride, n, pos0, view, 0, group, hd, scale,
                                scratch.data(), out.data() + off, stride);
      }
    }
    return out;
  };
  for (kernels::IsaLevel level :
       {kernels::IsaLevel::kScalar, kernels::IsaLevel::kAvx2, kernels::IsaLevel::kAvx512}) {
    kernels::SetMaxIsa(kernels::kMaxIsaLevel);
    if (static_cast<int>(kernels::ActiveIsa()) < static_cast<int>(level)) continue;
    kernels::SetMaxIsa(level);
    const std::vector<float> want = run(c32, t32, 1);
    for (int64_t chunk : {int64_t{1}, int64_t{8}, int64_t{37}}) {
      const std::vector<float> got = run(c16, t16, chunk);
      ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
          << kernels::IsaName(level) << " chunk " << chunk;
    }
    EXPECT_TRUE(c16.View(layer, 0, t16.data()).bf16_dot);
    EXPECT_FALSE(c32.View(layer, 0, t32.data()).bf16_dot);
    const std::vector<float> dot = run(c16, t16, 1, /*dot=*/true);
    for (int64_t chunk : {int64_t{8}, int64_t{37}}) {
      const std::vector<float> got = run(c16, t16, chunk, /*dot=*/true);
      ASSERT_EQ(std::memcmp(got.data(), dot.data(), got.size() * sizeof(float)), 0)
          << kernels::IsaName(level) << " dot, chunk " << chunk;
    }
    for (size_t i = 0; i < dot.size(); ++i) {
      ASSERT_NEAR(dot[i], want[i], 1e-2) << kernels::IsaName(level) << " dot, element " << i;
    }
    // The last token split-K over the cache's own view (dot products), one segment per call,
    // merged.
    const int64_t pos = n_ctx - 1, n_seg = kernels::AttentionSegments(n_ctx);
    const int64_t pf = kernels::AttentionPartialFloats(group, hd);
    std::vector<float> scratch(static_cast<size_t>(kernels::AttentionScratchFloats(1, group, hd)));
    for (int64_t g = 0; g < n_kv; ++g) {
      std::vector<float> partials(static_cast<size_t>(n_seg * pf)), merged(group * hd);
      for (int64_t sg = 0; sg < n_seg; ++sg) {
        kernels::AttentionPartials(q.data() + pos * stride + g * group * hd, pos,
                                   c16.View(layer, g, t16.data()), 0, group, hd, scale, sg, sg + 1,
                                   scratch.data(), partials.data() + sg * pf);
      }
      kernels::AttentionMerge(partials.data(), n_seg, group, hd, merged.data());
      ASSERT_EQ(std::memcmp(merged.data(), dot.data() + pos * stride + g * group * hd,
                            merged.size() * sizeof(float)),
                0)
          << kernels::IsaName(level) << " g " << g;
    }
    // The reference over the bf16 view, and a dense softmax in double over the rounded values.
    for (int64_t i : {int64_t{0}, int64_t{300}, pos}) {
      std::vector<float> ref(static_cast<size_t>(group * hd)), rs(static_cast<size_t>(i + 1));
      for (int64_t g = 0; g < n_kv; ++g) {
        const float* qi = q.data() + i * stride + g * group * hd;
        kernels::reference::AttentionRow(qi, c16.View(layer, g, t16.data()), i + 1, group, 1, hd,
                                         scale, rs.data(), ref.data());
        for (int64_t h = 0; h < group; ++h) {
          std::vector<double> sc(static_cast<size_t>(i + 1));
          double mx = -1e300, sum = 0;
          for (int64_t t = 0; t <= i; ++t) {
            double dot = 0;
            for (int64_t d = 0; d < hd; ++d)
              dot += double(qi[h * hd + d]) * kr[static_cast<size_t>(t * kv_dim + g * hd + d)];
            sc[static_cast<size_t>(t)] = dot * scale;
            mx = std::max(mx, dot * scale);
          }
          for (double& x : sc) sum += (x = std::exp(x - mx));
          for (int64_t d = 0; d < hd; ++d) {
            double o = 0;
            for (int64_t t = 0; t <= i; ++t)
              o += sc[static_cast<size_t>(t)] / sum *
                   vr[static_cast<size_t>(t * kv_dim + g * hd + d)];
            const float fast = want[static_cast<size_t>(i * stride + (g * group + h) * hd + d)];
            ASSERT_NEAR(fast, o, 2e-5) << "token " << i << " head " << g * group + h;
            ASSERT_NEAR(ref[static_cast<size_t>(h * hd + d)], o, 2e-5) << "token " << i;
          }
        }
      }
    }
  }
  kernels::SetMaxIsa(kernels::kMaxIsaLevel);
}

TEST(KvCacheBf16Test, DtypeNamesParse) {
  EXPECT_EQ(*ParseKvDtype("f32"), kernels::KvDtype::kF32);
  EXPECT_EQ(*ParseKvDtype("bf16"), kernels::KvDtype::kBf16);
  EXPECT_STREQ(KvDtypeName(kernels::KvDtype::kBf16), "bf16");
  const Result<kernels::KvDtype> bad = ParseKvDtype("fp16");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("f32 or bf16"), std::string::npos);
}

}  // namespace
}  // namespace chorus::memory
