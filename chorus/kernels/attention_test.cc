// test-labels: kernel
// Paged attention: every ISA level the machine supports against a naive dense
// softmax(q·Kᵀ·scale)·V computed in double, over a paged layout with a scrambled block table.
#include "chorus/kernels/attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "chorus/base/rng.h"
#include "chorus/kernels/attention_tiles.h"
#include "chorus/kernels/dispatch.h"
#include "chorus/tensor/dtype.h"
#if defined(__x86_64__)
#include "chorus/kernels/x86/attention_x86.h"
#endif

namespace chorus::kernels {

// Readable parameter names in gtest messages.
void PrintTo(IsaLevel level, std::ostream* os) { *os << IsaName(level); }

namespace {

bool Supported(IsaLevel level) {
  SetMaxIsa(kMaxIsaLevel);
  return static_cast<int>(ActiveIsa()) >= static_cast<int>(level);
}

class AttentionTest : public ::testing::TestWithParam<IsaLevel> {
 protected:
  void SetUp() override {
    if (!Supported(GetParam())) GTEST_SKIP() << IsaName(GetParam()) << " not supported here";
    SetMaxIsa(GetParam());
  }
  void TearDown() override { SetMaxIsa(kMaxIsaLevel); }
};

// One sequence's K and V, dense ([n_ctx, n_kv_heads, head_dim]) and paged into a pool of
// blocks whose order is scrambled; every float of the pool not holding a token is NaN, so a
// read outside the sequence poisons the result.
struct Paged {
  int64_t n_ctx, n_kv_heads, head_dim, block_size, kv_stride;
  std::vector<float> k_dense, v_dense;
  std::vector<float> pool_k, pool_v;       // [n_blocks_total, block_size, kv_stride]
  std::vector<const float*> k_ptr, v_ptr;  // [n_blocks_total]
  std::vector<int32_t> table;
  std::vector<int32_t> spare;  // blocks of the pool no token uses (all NaN)

  Paged(int64_t n_ctx_, int64_t n_kv_heads_, int64_t head_dim_, int64_t block_size_, uint64_t seed)
      : n_ctx(n_ctx_), n_kv_heads(n_kv_heads_), head_dim(head_dim_), block_size(block_size_) {
    kv_stride = n_kv_heads * head_dim + 3;  // padded: the kernel must use kv_stride, not kv_dim
    Rng rng(seed);
    const int64_t kv_dim = n_kv_heads * head_dim;
    k_dense.resize(static_cast<size_t>(n_ctx * kv_dim));
    v_dense.resize(k_dense.size());
    for (auto& x : k_dense) x = rng.NextGaussian();
    for (auto& x : v_dense) x = rng.NextGaussian();
    const int64_t n_used = (n_ctx + block_size - 1) / block_size;
    const int64_t n_total = n_used * 2 + 3;
    const float nan = std::numeric_limits<float>::quiet_NaN();
    pool_k.assign(static_cast<size_t>(n_total * block_size * kv_stride), nan);
    pool_v.assign(pool_k.size(), nan);
    std::vector<int32_t> ids(static_cast<size_t>(n_total));
    std::iota(ids.begin(), ids.end(), 0);
    for (int64_t i = n_total - 1; i > 0; --i) {  // Fisher–Yates with the test's Rng
      std::swap(ids[i], ids[rng.NextU64() % static_cast<uint64_t>(i + 1)]);
    }
    table.assign(ids.begin(), ids.begin() + n_used);
    spare.assign(ids.begin() + n_used, ids.end());
    for (int64_t t = 0; t < n_ctx; ++t) {
      const int64_t off = (table[t / block_size] * block_size + t % block_size) * kv_stride;
      std::copy_n(k_dense.begin() + t * kv_dim, kv_dim, pool_k.begin() + off);
      std::copy_n(v_dense.begin() + t * kv_dim, kv_dim, pool_v.begin() + off);
    }
    for (int64_t b = 0; b < n_total; ++b) {
      k_ptr.push_back(pool_k.data() + b * block_size * kv_stride);
      v_ptr.push_back(pool_v.data() + b * block_size * kv_stride);
    }
  }

  PagedKv View() const {
    PagedKv kv;
    kv.k_blocks = k_ptr.data();
    kv.v_blocks = v_ptr.data();
    kv.block_table = table.data();
    kv.block_size = block_size;
    kv.kv_stride = kv_stride;
    return kv;
  }

  // softmax(scale · q_h · K[:, g]ᵀ) · V[:, g] in double over keys [0, n_keys) (all when -1).
  std::vector<double> Naive(const std::vector<float>& q, int64_t n_heads, double scale,
                            int64_t n_keys = -1) const {
    return NaiveOver(q.data(), n_heads, scale, n_keys < 0 ? n_ctx : n_keys);
  }
  std::vector<double> NaiveOver(const float* q, int64_t n_heads, double scale,
                                int64_t n_ctx) const {
    const int64_t group = n_heads / n_kv_heads, kv_dim = n_kv_heads * head_dim;
    std::vector<double> out(static_cast<size_t>(n_heads * head_dim), 0.0),
        s(static_cast<size_t>(n_ctx));
    for (int64_t h = 0; h < n_heads; ++h) {
      const int64_t g = h / group;
      double max = -1e300;
      for (int64_t t = 0; t < n_ctx; ++t) {
        double dot = 0;
        for (int64_t d = 0; d < head_dim; ++d) {
          dot += double(q[h * head_dim + d]) * k_dense[t * kv_dim + g * head_dim + d];
        }
        s[t] = dot * scale;
        max = std::max(max, s[t]);
      }
      double sum = 0;
      for (int64_t t = 0; t < n_ctx; ++t) sum += (s[t] = std::exp(s[t] - max));
      for (int64_t t = 0; t < n_ctx; ++t) {
        for (int64_t d = 0; d < head_dim; ++d) {
          out[h * head_dim + d] += s[t] / sum * v_dense[t * kv_dim + g * head_dim + d];
        }
      }
    }
    return out;
  }
};

// Windows and soft caps (attention.h, AttentionScores) as written, in double: for each query
// head h of q ([n_heads, head_dim]), s_t = scale · q_h · K_t[g] for keys t ∈ [first, pos], then
// s → cap·tanh(s/cap) when cap > 0, softmax, Σ p_t · V_t[g]. Out: [n_heads, head_dim].
std::vector<double> NaiveWindow(const Paged& p, const float* q, int64_t n_heads, double scale,
                                int64_t first, int64_t pos, double cap) {
  const int64_t hd = p.head_dim, group = n_heads / p.n_kv_heads, kv_dim = p.n_kv_heads * hd;
  std::vector<double> out(static_cast<size_t>(n_heads * hd), 0.0);
  for (int64_t h = 0; h < n_heads; ++h) {
    const int64_t g = h / group;
    std::vector<double> s;
    double mx = -1e300;
    for (int64_t t = first; t <= pos; ++t) {
      double dot = 0;
      for (int64_t d = 0; d < hd; ++d)
        dot += double(q[h * hd + d]) * p.k_dense[static_cast<size_t>(t * kv_dim + g * hd + d)];
      double v = dot * scale;
      if (cap > 0) v = cap * std::tanh(v / cap);
      s.push_back(v);
      mx = std::max(mx, v);
    }
    double sum = 0;
    for (double& v : s) sum += (v = std::exp(v - mx));
    for (int64_t t = first; t <= pos; ++t) {
      for (int64_t d = 0; d < hd; ++d) {
        out[static_cast<size_t>(h * hd + d)] +=
            s[static_cast<size_t>(t - first)] / sum *
            p.v_dense[static_cast<size_t>(t * kv_dim + g * hd + d)];
      }
    }
  }
  return out;
}

std::vector<float> RandomQ(int64_t n, uint64_t seed, float scale) {
  Rng rng(seed);
  std::vector<float> q(static_cast<size_t>(n));
  for (auto& x : q) x = rng.NextGaussian() * scale;
  return q;
}

void CheckCase(int64_t n_ctx, int64_t n_kv_heads, int64_t ratio, int64_t head_dim,
               int64_t block_size, float q_scale) {
  const int64_t n_heads = n_kv_heads * ratio;
  const uint64_t seed =
      static_cast<uint64_t>(n_ctx * 1000003 + n_kv_heads * 101 + ratio * 7 + head_dim);
  Paged p(n_ctx, n_kv_heads, head_dim, block_size, seed);
  const std::vector<float> q = RandomQ(n_heads * head_dim, seed + 1, q_scale);
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  std::vector<float> scratch(static_cast<size_t>(AttentionScratchFloats(1, ratio, head_dim)), 0.0f);
  std::vector<float> out(static_cast<size_t>(n_heads * head_dim), -7.0f);
  AttentionRow(q.data(), p.View(), n_ctx, n_heads, n_kv_heads, head_dim, scale, scratch.data(),
               out.data());
  const std::vector<double> want = p.Naive(q, n_heads, scale);
  for (size_t i = 0; i < want.size(); ++i) {
    // Outputs are convex combinations of N(0,1) values: an absolute bound is the right scale.
    ASSERT_NEAR(out[i], want[i], 2e-5)
        << "n_ctx=" << n_ctx << " kv=" << n_kv_heads << " ratio=" << ratio << " hd=" << head_dim
        << " bs=" << block_size << " i=" << i;
  }
}

TEST_P(AttentionTest, MatchesDenseOverGqaRatios) {
  for (int64_t ratio : {1, 2, 4, 8}) {
    for (int64_t n_ctx : {1, 2, 15, 16, 17, 31, 32, 33, 100}) {
      CheckCase(n_ctx, /*n_kv_heads=*/2, ratio, /*head_dim=*/64, /*block_size=*/16, 1.0f);
    }
  }
}

TEST_P(AttentionTest, AwkwardHeadDimsAndBlockSizes) {
  for (int64_t head_dim : {1, 8, 20, 37, 128}) {
    for (int64_t block_size : {1, 7, 16, 32}) {
      CheckCase(/*n_ctx=*/45, /*n_kv_heads=*/3, /*ratio=*/2, head_dim, block_size, 1.0f);
    }
  }
}

// Groups wider than the kernels' sub-group of heads (12 and 32 query heads per KV head, MQA).
TEST_P(AttentionTest, WideGroupsAndMqa) {
  CheckCase(70, 2, 12, 32, 16, 1.0f);
  CheckCase(70, 1, 32, 64, 16, 1.0f);
  CheckCase(5, 1, 3, 16, 4, 1.0f);
}

// Peaked scores (large q) exercise the online-softmax rescaling when the max moves late.
TEST_P(AttentionTest, PeakedScores) {
  CheckCase(300, 2, 4, 64, 16, 6.0f);
  CheckCase(97, 1, 8, 128, 16, 10.0f);
}

TEST_P(AttentionTest, LongContext) { CheckCase(4100, 2, 4, 64, 16, 1.0f); }

// The forward pass calls the kernel once per KV head with a view shifted to that head; the
// result must equal the all-heads call bit for bit.
TEST_P(AttentionTest, PerKvHeadCallsEqualFullCall) {
  const int64_t n_ctx = 77, n_kv = 4, ratio = 4, hd = 64, n_heads = n_kv * ratio;
  Paged p(n_ctx, n_kv, hd, 16, 99);
  const std::vector<float> q = RandomQ(n_heads * hd, 98, 1.0f);
  std::vector<float> scratch(static_cast<size_t>(AttentionScratchFloats(1, ratio, hd)));
  std::vector<float> full(static_cast<size_t>(n_heads * hd)), split(full.size());
  AttentionRow(q.data(), p.View(), n_ctx, n_heads, n_kv, hd, 0.125f, scratch.data(), full.data());
  for (int64_t g = 0; g < n_kv; ++g) {
    std::vector<const float*> k_g, v_g;
    for (size_t b = 0; b < p.k_ptr.size(); ++b) {
      k_g.push_back(p.k_ptr[b] + g * hd);
      v_g.push_back(p.v_ptr[b] + g * hd);
    }
    PagedKv view = p.View();
    view.k_blocks = k_g.data();
    view.v_blocks = v_g.data();
    AttentionRow(q.data() + g * ratio * hd, view, n_ctx, ratio, 1, hd, 0.125f, scratch.data(),
                 split.data() + g * ratio * hd);
  }
  EXPECT_EQ(std::memcmp(full.data(), split.data(), full.size() * sizeof(float)), 0);
}

// ---- Tiled kernels: blocks of tokens (prefill), split-K (decode), invariance ----

// Every token of a prompt, computed as blocks of `chunk` tokens (a chunked prefill) over the
// sequence's KV heads. q, out: [n_tokens, n_heads, head_dim].
// The same over any view of a sequence's KV with n_kv_heads heads of hd floats.
void RunChunkedOver(const PagedKv& kv, int64_t n_kv_heads, int64_t hd, const std::vector<float>& q,
                    int64_t n_tokens, int64_t n_heads, int64_t chunk, float scale,
                    std::vector<float>* out) {
  const int64_t group = n_heads / n_kv_heads, stride = n_heads * hd;
  std::vector<float> scratch(static_cast<size_t>(AttentionScratchFloats(chunk, group, hd)));
  out->assign(static_cast<size_t>(n_tokens * stride), -7.0f);
  for (int64_t pos0 = 0; pos0 < n_tokens; pos0 += chunk) {
    const int64_t n = std::min(chunk, n_tokens - pos0);
    for (int64_t g = 0; g < n_kv_heads; ++g) {
      const int64_t off = pos0 * stride + g * group * hd;
      AttentionBlock(q.data() + off, stride, n, pos0, kv, g, group, hd, scale, scratch.data(),
                     out->data() + off, stride);
    }
  }
}
void RunChunked(const Paged& p, const std::vector<float>& q, int64_t n_tokens, int64_t n_heads,
                int64_t chunk, float scale, std::vector<float>* out) {
  RunChunkedOver(p.View(), p.n_kv_heads, p.head_dim, q, n_tokens, n_heads, chunk, scale, out);
}

// A prompt of n_ctx tokens: each token against the dense reference over its own keys, and the
// same bits whatever the chunking (one token at a time = what a decode row computes; chunks
// whose boundaries fall inside a tile; the whole prompt at once).
void CheckPrefill(int64_t n_ctx, int64_t n_kv, int64_t ratio, int64_t hd, int64_t block_size,
                  std::initializer_list<int64_t> chunks) {
  const int64_t n_heads = n_kv * ratio, stride = n_heads * hd;
  Paged p(n_ctx, n_kv, hd, block_size, static_cast<uint64_t>(n_ctx * 31 + ratio * 7 + hd));
  const std::vector<float> q = RandomQ(n_ctx * stride, 17 + static_cast<uint64_t>(ratio), 1.5f);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  std::vector<float> one, other;
  RunChunked(p, q, n_ctx, n_heads, 1, scale, &one);
  for (int64_t i = 0; i < n_ctx; ++i) {
    const std::vector<double> want = p.NaiveOver(q.data() + i * stride, n_heads, scale, i + 1);
    for (int64_t j = 0; j < stride; ++j) {
      ASSERT_NEAR(one[static_cast<size_t>(i * stride + j)], want[static_cast<size_t>(j)], 2e-5)
          << "token " << i << " of " << n_ctx << " ratio " << ratio << " hd " << hd;
    }
  }
  for (int64_t chunk : chunks) {
    RunChunked(p, q, n_ctx, n_heads, chunk, scale, &other);
    ASSERT_EQ(std::memcmp(one.data(), other.data(), one.size() * sizeof(float)), 0)
        << "chunk " << chunk << " n_ctx " << n_ctx << " ratio " << ratio;
  }
}

TEST_P(AttentionTest, PrefillBlocksEqualOneTokenAtATimeOverGqaRatios) {
  for (int64_t ratio : {1, 2, 3, 4, 8, 12, 32}) {
    CheckPrefill(/*n_ctx=*/77, /*n_kv=*/2, ratio, /*hd=*/64, /*block_size=*/16, {5, 8, 33, 77});
  }
}

TEST_P(AttentionTest, PrefillOddLengthsHeadDimsAndBlockSizes) {
  CheckPrefill(1, 1, 8, 64, 16, {4});
  CheckPrefill(31, 2, 4, 37, 7, {3, 31});
  CheckPrefill(65, 3, 2, 20, 1, {13, 64});
  CheckPrefill(129, 1, 8, 128, 32, {9, 100});
  CheckPrefill(40, 4, 1, 8, 16, {6});
}

// Past one segment (512 keys): chunks crossing segment and tile boundaries.
TEST_P(AttentionTest, PrefillAcrossSegments) { CheckPrefill(1100, 1, 4, 32, 16, {45, 512, 1100}); }

// Split-K: the partials of any split of a row's segments, merged, equal the one-token block bit
// for bit (and the dense reference within rounding).
TEST_P(AttentionTest, SplitKEqualsUnsplit) {
  for (int64_t n_ctx : {1, 511, 512, 513, 1500, 4100}) {
    for (int64_t ratio : {1, 4, 8}) {
      const int64_t n_kv = 2, hd = 64, n_heads = n_kv * ratio;
      Paged p(n_ctx, n_kv, hd, 16, static_cast<uint64_t>(n_ctx + ratio));
      const std::vector<float> q = RandomQ(n_heads * hd, 5, 3.0f);
      const float scale = 0.125f;
      std::vector<float> whole(static_cast<size_t>(n_heads * hd));
      std::vector<float> scratch(static_cast<size_t>(AttentionScratchFloats(1, ratio, hd)));
      AttentionRow(q.data(), p.View(), n_ctx, n_heads, n_kv, hd, scale, scratch.data(),
                   whole.data());
      const std::vector<double> want = p.Naive(q, n_heads, scale);
      for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(whole[i], want[i], 2e-5) << n_ctx;
      const int64_t n_seg = AttentionSegments(n_ctx);
      const int64_t pf = AttentionPartialFloats(ratio, hd);
      // Splits: all at once, one segment per part, and three uneven parts.
      std::vector<std::vector<int64_t>> splits = {{0, n_seg}, {}, {0}};
      for (int64_t s = 0; s <= n_seg; ++s) splits[1].push_back(s);
      if (n_seg > 2) splits[2].push_back(1);
      if (n_seg > 3) splits[2].push_back(n_seg - 1);
      splits[2].push_back(n_seg);
      for (const auto& cuts : splits) {
        for (int64_t g = 0; g < n_kv; ++g) {
          std::vector<float> partials(static_cast<size_t>(n_seg * pf), -3.0f);
          for (size_t c = 0; c + 1 < cuts.size(); ++c) {
            AttentionPartials(q.data() + g * ratio * hd, n_ctx - 1, p.View(), g, ratio, hd, scale,
                              cuts[c], cuts[c + 1], scratch.data(), partials.data() + cuts[c] * pf);
          }
          std::vector<float> merged(static_cast<size_t>(ratio * hd));
          AttentionMerge(partials.data(), n_seg, ratio, hd, merged.data());
          ASSERT_EQ(std::memcmp(merged.data(), whole.data() + g * ratio * hd,
                                merged.size() * sizeof(float)),
                    0)
              << "n_ctx " << n_ctx << " ratio " << ratio << " g " << g << " parts "
              << cuts.size() - 1;
        }
      }
    }
  }
}

// n > 1 choices: two sequences share their prompt's full blocks and continue in blocks of their
// own; each one's rows equal its own dense attention, and the shared pages change nothing.
TEST_P(AttentionTest, ForksSharingPromptBlocks) {
  const int64_t bs = 16, n_kv = 2, ratio = 4, hd = 64, n_heads = n_kv * ratio;
  const int64_t stride = n_heads * hd, kv_dim = n_kv * hd;
  const int64_t prompt = 70, total = 100;  // blocks 0..3 (64 tokens) are shared
  Paged a(total, n_kv, hd, bs, 123);
  const int64_t shared_blocks = prompt / bs;
  // Fork b: same blocks for the first 64 tokens, then its own copies holding its own tokens.
  Paged b = a;
  b.k_ptr.clear();
  b.v_ptr.clear();
  for (size_t i = 0; i < a.k_ptr.size(); ++i) {  // b reads a's pool: one pool, two tables
    b.k_ptr.push_back(a.k_ptr[i]);
    b.v_ptr.push_back(a.v_ptr[i]);
  }
  Rng rng(77);
  for (int64_t t = shared_blocks * bs; t < total; ++t) {
    for (int64_t j = 0; j < kv_dim; ++j) {
      b.k_dense[static_cast<size_t>(t * kv_dim + j)] = rng.NextGaussian();
      b.v_dense[static_cast<size_t>(t * kv_dim + j)] = rng.NextGaussian();
    }
  }
  const int64_t own = (total + bs - 1) / bs - shared_blocks;
  ASSERT_LE(own, static_cast<int64_t>(a.spare.size()));
  for (int64_t i = 0; i < own; ++i) {
    b.table[static_cast<size_t>(shared_blocks + i)] = a.spare[static_cast<size_t>(i)];
  }
  auto& pool_k = a.pool_k;
  auto& pool_v = a.pool_v;
  for (int64_t t = shared_blocks * bs; t < total; ++t) {
    const int64_t off = (b.table[t / bs] * bs + t % bs) * a.kv_stride;
    std::copy_n(b.k_dense.begin() + t * kv_dim, kv_dim, pool_k.begin() + off);
    std::copy_n(b.v_dense.begin() + t * kv_dim, kv_dim, pool_v.begin() + off);
  }
  const std::vector<float> q = RandomQ(total * stride, 9, 1.0f);
  const float scale = 0.125f;
  for (const Paged* p : {&a, &b}) {
    std::vector<float> blocks, one;
    RunChunked(*p, q, total, n_heads, 1, scale, &one);
    RunChunked(*p, q, total, n_heads, 24, scale, &blocks);
    ASSERT_EQ(std::memcmp(one.data(), blocks.data(), one.size() * sizeof(float)), 0);
    for (int64_t i = prompt; i < total; ++i) {
      const std::vector<double> want = p->NaiveOver(q.data() + i * stride, n_heads, scale, i + 1);
      for (int64_t j = 0; j < stride; ++j) {
        ASSERT_NEAR(one[static_cast<size_t>(i * stride + j)], want[static_cast<size_t>(j)], 2e-5)
            << (p == &a ? "a" : "b") << " token " << i;
      }
    }
  }
}

// The same tokens as `p` (same block table) in head-major blocks, [kv_head][slot][head_dim] as
// KvCache lays them out, with padding between rows and between heads (NaN, like every float no
// token uses), so the kernels must follow kv_stride and head_stride. With `k_columns`, K is in
// columns ([kv_head][head_dim][slot], KvCache's layout: d stride exactly block_size); with
// `bf16`, the pools hold bf16 (every element rounded, NaN kept).
struct HeadMajor {
  std::vector<float> pool_k, pool_v;
  std::vector<uint16_t> k16, v16;
  std::vector<const float*> k_ptr, v_ptr;
  const int32_t* table;
  int64_t block_size, kv_stride, head_stride;
  bool k_columns, bf16;
  explicit HeadMajor(const Paged& p, bool k_columns_ = false, bool bf16_ = false)
      : table(p.table.data()), block_size(p.block_size), k_columns(k_columns_), bf16(bf16_) {
    kv_stride = p.head_dim + 2;
    head_stride = p.block_size * kv_stride + 5;
    const int64_t block_floats = p.n_kv_heads * head_stride;
    const int64_t n_total = static_cast<int64_t>(p.k_ptr.size());
    const float nan = std::numeric_limits<float>::quiet_NaN();
    pool_k.assign(static_cast<size_t>(n_total * block_floats), nan);
    pool_v.assign(pool_k.size(), nan);
    const int64_t kv_dim = p.n_kv_heads * p.head_dim;
    for (int64_t t = 0; t < p.n_ctx; ++t) {
      for (int64_t g = 0; g < p.n_kv_heads; ++g) {
        const int64_t head =
            p.table[static_cast<size_t>(t / block_size)] * block_floats + g * head_stride;
        const int64_t off = head + (t % block_size) * kv_stride;
        const auto k = p.k_dense.begin() + t * kv_dim + g * p.head_dim;
        if (k_columns) {
          for (int64_t d = 0; d < p.head_dim; ++d)
            pool_k[static_cast<size_t>(head + d * block_size + t % block_size)] = k[d];
        } else {
          std::copy_n(k, p.head_dim, pool_k.begin() + off);
        }
        std::copy_n(p.v_dense.begin() + t * kv_dim + g * p.head_dim, p.head_dim,
                    pool_v.begin() + off);
      }
    }
    if (bf16) {
      k16.resize(pool_k.size());
      v16.resize(pool_v.size());
      for (size_t i = 0; i < k16.size(); ++i) {
        k16[i] = F32ToBF16(pool_k[i]);
        v16[i] = F32ToBF16(pool_v[i]);
      }
    }
    for (int64_t b = 0; b < n_total; ++b) {
      if (bf16) {
        k_ptr.push_back(reinterpret_cast<const float*>(k16.data() + b * block_floats));
        v_ptr.push_back(reinterpret_cast<const float*>(v16.data() + b * block_floats));
      } else {
        k_ptr.push_back(pool_k.data() + b * block_floats);
        v_ptr.push_back(pool_v.data() + b * block_floats);
      }
    }
  }
  PagedKv View() const {
    PagedKv kv;
    kv.k_blocks = k_ptr.data();
    kv.v_blocks = v_ptr.data();
    kv.block_table = table;
    kv.block_size = block_size;
    kv.kv_stride = kv_stride;
    kv.head_stride = head_stride;
    kv.dtype = bf16 ? KvDtype::kBf16 : KvDtype::kF32;
    kv.k_columns = k_columns;
    return kv;
  }
};

// Head-major blocks change where a key's floats are, never the arithmetic: prefill blocks over
// any chunking, one-token rows and split-K partials give the token-major results bit for bit.
TEST_P(AttentionTest, HeadMajorBlocksEqualTokenMajor) {
  for (int64_t ratio : {1, 3, 8}) {
    for (int64_t block_size : {1, 7, 16}) {
      const int64_t n_ctx = 530, n_kv = 2, hd = 24, n_heads = n_kv * ratio;  // two segments
      const int64_t stride = n_heads * hd, group = ratio;
      Paged p(n_ctx, n_kv, hd, block_size, static_cast<uint64_t>(ratio * 31 + block_size));
      const HeadMajor h(p);
      const std::vector<float> q = RandomQ(n_ctx * stride, 3 + static_cast<uint64_t>(ratio), 1.5f);
      const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
      std::vector<float> want;  // token-major, one token at a time
      RunChunked(p, q, n_ctx, n_heads, 1, scale, &want);
      for (int64_t chunk : {int64_t{1}, int64_t{45}}) {
        std::vector<float> got;
        RunChunkedOver(h.View(), n_kv, hd, q, n_ctx, n_heads, chunk, scale, &got);
        ASSERT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0)
            << "ratio " << ratio << " block " << block_size << " chunk " << chunk;
      }
      for (int64_t i : {int64_t{0}, int64_t{511}, n_ctx - 1}) {  // and the dense reference
        const std::vector<double> ref = p.NaiveOver(q.data() + i * stride, n_heads, scale, i + 1);
        for (int64_t j = 0; j < stride; ++j)
          ASSERT_NEAR(want[static_cast<size_t>(i * stride + j)], ref[static_cast<size_t>(j)], 2e-5);
      }
      // Split-K of the last token, one segment per call, merged: the same bits as its row.
      const int64_t n_seg = AttentionSegments(n_ctx), pf = AttentionPartialFloats(group, hd);
      const float* q_last = q.data() + (n_ctx - 1) * stride;
      std::vector<float> scratch(static_cast<size_t>(AttentionScratchFloats(1, group, hd)));
      for (int64_t g = 0; g < n_kv; ++g) {
        std::vector<float> partials(static_cast<size_t>(n_seg * pf)), merged(group * hd);
        for (int64_t s = 0; s < n_seg; ++s) {
          AttentionPartials(q_last + g * group * hd, n_ctx - 1, h.View(), g, group, hd, scale, s,
                            s + 1, scratch.data(), partials.data() + s * pf);
        }
        AttentionMerge(partials.data(), n_seg, group, hd, merged.data());
        ASSERT_EQ(std::memcmp(merged.data(), want.data() + (n_ctx - 1) * stride + g * group * hd,
                              merged.size() * sizeof(float)),
                  0)
            << "ratio " << ratio << " block " << block_size << " g " << g;
      }
      // The reference reads head-major blocks too.
      std::vector<float> ref_out(static_cast<size_t>(stride)), ref_scratch(n_ctx);
      reference::AttentionRow(q_last, h.View(), n_ctx, n_heads, n_kv, hd, scale, ref_scratch.data(),
                              ref_out.data());
      const std::vector<double> ref = p.NaiveOver(q_last, n_heads, scale, n_ctx);
      for (int64_t j = 0; j < stride; ++j) ASSERT_NEAR(ref_out[j], ref[j], 2e-5);
    }
  }
}

// bf16 KV blocks: the kernels widen each row exactly, so over bf16 blocks they must give the
// f32 kernels' bits on the same (bf16-representable) values — prefill chunkings, one-token rows,
// split-K and the window path — at every level, and the reference must read them too.
TEST_P(AttentionTest, Bf16BlocksEqualF32BlocksOfTheSameValues) {
  for (int64_t ratio : {1, 8}) {
    const int64_t n_ctx = 530, n_kv = 2, hd = 24, n_heads = n_kv * ratio, block_size = 16;
    const int64_t stride = n_heads * hd, group = ratio;
    Paged p(n_ctx, n_kv, hd, block_size, static_cast<uint64_t>(ratio * 13 + 1));
    for (auto* dense : {&p.k_dense, &p.v_dense})  // values a bf16 cache can hold
      for (float& x : *dense) x = BF16ToF32(F32ToBF16(x));
    const HeadMajor f32(p);  // f32 head-major blocks of the rounded values
    // The same layout with bf16 elements: every element of the f32 pool rounded (NaN stays NaN).
    std::vector<uint16_t> k16(f32.pool_k.size()), v16(f32.pool_v.size());
    for (size_t i = 0; i < k16.size(); ++i) {
      k16[i] = F32ToBF16(f32.pool_k[i]);
      v16[i] = F32ToBF16(f32.pool_v[i]);
    }
    std::vector<const float*> kb, vb;
    for (size_t b = 0; b < f32.k_ptr.size(); ++b) {
      kb.push_back(reinterpret_cast<const float*>(k16.data() + (f32.k_ptr[b] - f32.pool_k.data())));
      vb.push_back(reinterpret_cast<const float*>(v16.data() + (f32.v_ptr[b] - f32.pool_v.data())));
    }
    PagedKv bf = f32.View();
    bf.k_blocks = kb.data();
    bf.v_blocks = vb.data();
    bf.dtype = KvDtype::kBf16;
    const std::vector<float> q = RandomQ(n_ctx * stride, 40 + static_cast<uint64_t>(ratio), 1.5f);
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    for (int64_t chunk : {int64_t{1}, int64_t{45}}) {
      std::vector<float> want(static_cast<size_t>(n_ctx * stride)), got(want.size());
      std::vector<float> scratch(static_cast<size_t>(AttentionScratchFloats(chunk, group, hd)));
      for (int64_t pos0 = 0; pos0 < n_ctx; pos0 += chunk) {
        const int64_t n = std::min(chunk, n_ctx - pos0);
        for (int64_t g = 0; g < n_kv; ++g) {
          const int64_t off = pos0 * stride + g * group * hd;
          AttentionBlock(q.data() + off, stride, n, pos0, f32.View(), g, group, hd, scale,
                         scratch.data(), want.data() + off, stride);
          AttentionBlock(q.data() + off, stride, n, pos0, bf, g, group, hd, scale, scratch.data(),
                         got.data() + off, stride);
        }
      }
      ASSERT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0)
          << "ratio " << ratio << " chunk " << chunk;
      const std::vector<double> ref =
          p.NaiveOver(q.data() + (n_ctx - 1) * stride, n_heads, scale, n_ctx);
      for (int64_t j = 0; j < stride; ++j)
        ASSERT_NEAR(got[static_cast<size_t>((n_ctx - 1) * stride + j)], ref[static_cast<size_t>(j)],
                    2e-5);
    }
    // Split-K partials of the last token over bf16 blocks equal those over f32 blocks.
    const int64_t n_seg = AttentionSegments(n_ctx), pf = AttentionPartialFloats(group, hd);
    const float* q_last = q.data() + (n_ctx - 1) * stride;
    std::vector<float> scratch(static_cast<size_t>(AttentionScratchFloats(1, group, hd)));
    for (int64_t g = 0; g < n_kv; ++g) {
      std::vector<float> pa(static_cast<size_t>(n_seg * pf)), pb(pa.size());
      AttentionPartials(q_last + g * group * hd, n_ctx - 1, f32.View(), g, group, hd, scale, 0,
                        n_seg, scratch.data(), pa.data());
      AttentionPartials(q_last + g * group * hd, n_ctx - 1, bf, g, group, hd, scale, 0, n_seg,
                        scratch.data(), pb.data());
      ASSERT_EQ(std::memcmp(pa.data(), pb.data(), pa.size() * sizeof(float)), 0) << g;
    }
    // The reference and the window path read bf16 blocks as their widened values.
    std::vector<float> ra(static_cast<size_t>(stride)), rb(ra.size()), rs(n_ctx + hd);
    reference::AttentionRow(q_last, f32.View(), n_ctx, n_heads, n_kv, hd, scale, rs.data(),
                            ra.data());
    reference::AttentionRow(q_last, bf, n_ctx, n_heads, n_kv, hd, scale, rs.data(), rb.data());
    ASSERT_EQ(std::memcmp(ra.data(), rb.data(), ra.size() * sizeof(float)), 0);
    for (int64_t g = 0; g < n_kv; ++g) {
      PagedKv fg = f32.View(), bg = bf;
      std::vector<const float*> fk(f32.k_ptr), fv(f32.v_ptr), bk(kb), bv(vb);
      for (size_t b = 0; b < fk.size(); ++b) {  // the KvCache::View convention: head g's view
        fk[b] += g * f32.head_stride, fv[b] += g * f32.head_stride;
        bk[b] = reinterpret_cast<const float*>(reinterpret_cast<const uint16_t*>(bk[b]) +
                                               g * f32.head_stride);
        bv[b] = reinterpret_cast<const float*>(reinterpret_cast<const uint16_t*>(bv[b]) +
                                               g * f32.head_stride);
      }
      fg.k_blocks = fk.data(), fg.v_blocks = fv.data();
      bg.k_blocks = bk.data(), bg.v_blocks = bv.data();
      reference::AttentionRowWindow(q_last + g * group * hd, 100, n_ctx - 1, fg, group, hd, scale,
                                    0.0f, rs.data(), ra.data());
      reference::AttentionRowWindow(q_last + g * group * hd, 100, n_ctx - 1, bg, group, hd, scale,
                                    0.0f, rs.data(), rb.data());
      ASSERT_EQ(std::memcmp(ra.data(), rb.data(), group * hd * sizeof(float)), 0) << g;
    }
  }
}

// One view per KV head of kv, head g at kv_head 0 (as KvCache::View gives them, what
// AttentionPartialsHeads takes); `ptrs` keeps their block pointers.
std::vector<PagedKv> HeadViews(const PagedKv& kv, int64_t n_kv, int64_t hd, int64_t n_ctx,
                               std::vector<std::vector<const float*>>* ptrs) {
  int64_t n_blocks = 0;
  for (int64_t b = 0; b < (n_ctx + kv.block_size - 1) / kv.block_size; ++b) {
    n_blocks = std::max<int64_t>(n_blocks, kv.block_table[b * kv.table_stride] + 1);
  }
  const int64_t elem = kv.dtype == KvDtype::kBf16 ? 2 : 4;
  ptrs->assign(static_cast<size_t>(2 * n_kv), {});
  std::vector<PagedKv> views;
  for (int64_t g = 0; g < n_kv; ++g) {
    const int64_t off = g * (kv.head_stride > 0 ? kv.head_stride : hd) * elem;
    auto& k = (*ptrs)[static_cast<size_t>(2 * g)];
    auto& v = (*ptrs)[static_cast<size_t>(2 * g + 1)];
    for (int64_t b = 0; b < n_blocks; ++b) {
      k.push_back(
          reinterpret_cast<const float*>(reinterpret_cast<const char*>(kv.k_blocks[b]) + off));
      v.push_back(
          reinterpret_cast<const float*>(reinterpret_cast<const char*>(kv.v_blocks[b]) + off));
    }
    PagedKv view = kv;
    view.k_blocks = k.data();
    view.v_blocks = v.data();
    views.push_back(view);
  }
  return views;
}

// AttentionPartialsHeads over [seg_begin, seg_end) equals AttentionPartials head by head, bit
// for bit.
void ExpectPartialsHeadsEqualPerHead(const PagedKv& kv, const float* q_row, int64_t pos,
                                     int64_t n_kv, int64_t group, int64_t hd, float scale,
                                     int64_t seg_begin, int64_t seg_end, const std::string& where,
                                     AttentionScores scores = {}) {
  const int64_t n_seg = seg_end - seg_begin, pf = AttentionPartialFloats(group, hd);
  std::vector<std::vector<const float*>> ptrs;
  const std::vector<PagedKv> views = HeadViews(kv, n_kv, hd, pos + 1, &ptrs);
  std::vector<float> scratch(static_cast<size_t>(AttentionScratchFloats(1, group, hd)));
  std::vector<float> heads_scratch(
      static_cast<size_t>(AttentionPartialsHeadsScratchFloats(n_kv, group, hd)));
  std::vector<float> want(static_cast<size_t>(n_kv * n_seg * pf)), got(want.size(), -3.0f);
  for (int64_t g = 0; g < n_kv; ++g) {
    AttentionPartials(q_row + g * group * hd, pos, kv, g, group, hd, scale, seg_begin, seg_end,
                      scratch.data(), want.data() + g * n_seg * pf, scores);
  }
  AttentionPartialsHeads(q_row, pos, views.data(), n_kv, group, hd, scale, seg_begin, seg_end,
                         heads_scratch.data(), got.data(), n_seg * pf, scores);
  ASSERT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0)
      << where << " heads together, segments [" << seg_begin << ", " << seg_end << ")";
}

// Split-K of a prompt's last token (one segment per AttentionPartials call, merged) equals its
// row in `rows` ([n_ctx, n_kv · group, hd], as RunChunkedOver gives) bit for bit, every KV head.
void ExpectSplitKEqualsLastRow(const PagedKv& kv, const std::vector<float>& q,
                               const std::vector<float>& rows, int64_t n_ctx, int64_t n_kv,
                               int64_t group, int64_t hd, float scale, const std::string& where) {
  const int64_t stride = n_kv * group * hd;
  const int64_t n_seg = AttentionSegments(n_ctx), pf = AttentionPartialFloats(group, hd);
  const float* q_last = q.data() + (n_ctx - 1) * stride;
  std::vector<float> scratch(static_cast<size_t>(AttentionScratchFloats(1, group, hd)));
  for (int64_t g = 0; g < n_kv; ++g) {
    std::vector<float> partials(static_cast<size_t>(n_seg * pf)), merged(group * hd);
    for (int64_t sg = 0; sg < n_seg; ++sg) {
      AttentionPartials(q_last + g * group * hd, n_ctx - 1, kv, g, group, hd, scale, sg, sg + 1,
                        scratch.data(), partials.data() + sg * pf);
    }
    AttentionMerge(partials.data(), n_seg, group, hd, merged.data());
    ASSERT_EQ(std::memcmp(merged.data(), rows.data() + (n_ctx - 1) * stride + g * group * hd,
                          merged.size() * sizeof(float)),
              0)
        << where << " split-K, g " << g;
  }
  ExpectPartialsHeadsEqualPerHead(kv, q_last, n_ctx - 1, n_kv, group, hd, scale, 0, n_seg, where);
  if (n_seg > 1) {
    ExpectPartialsHeadsEqualPerHead(kv, q_last, n_ctx - 1, n_kv, group, hd, scale, 1, n_seg, where);
  }
}

// All KV heads of a decode row at once (AttentionPartialsHeads: heads advance tile by tile
// together, at most kAttentionHeadsTogether at a time) equal head-by-head partials bit for bit:
// more heads than one pass takes, f32 and bf16 blocks (dot products), K in rows and columns, any
// range of segments.
TEST_P(AttentionTest, PartialsOfAllHeadsAtOnceEqualHeadByHead) {
  for (int64_t n_kv : {1, 3, 11}) {
    for (int64_t group : {1, 4, 8}) {
      for (int bf16 = 0; bf16 < 2; ++bf16) {
        for (bool k_columns : {true, false}) {
          const int64_t n_ctx = 1100, hd = 64, bs = 16;
          Paged p(n_ctx, n_kv, hd, bs, static_cast<uint64_t>(n_kv * 31 + group));
          const HeadMajor blocks(p, k_columns, bf16 == 1);
          PagedKv kv = blocks.View();
          kv.bf16_dot = bf16 == 1;
          const std::vector<float> q =
              RandomQ(n_kv * group * hd, 90 + static_cast<uint64_t>(n_kv), 2.0f);
          const std::string where = "kv " + std::to_string(n_kv) + " group " +
                                    std::to_string(group) + (bf16 ? " bf16" : " f32") +
                                    (k_columns ? " columns" : " rows");
          const int64_t n_seg = AttentionSegments(n_ctx);
          ExpectPartialsHeadsEqualPerHead(kv, q.data(), n_ctx - 1, n_kv, group, hd, 0.125f, 0,
                                          n_seg, where);
          ExpectPartialsHeadsEqualPerHead(kv, q.data(), n_ctx - 1, n_kv, group, hd, 0.125f, 1, 2,
                                          where);
          ExpectPartialsHeadsEqualPerHead(kv, q.data(), n_ctx - 1, n_kv, group, hd, 0.125f, 2,
                                          n_seg, where);
          // A row whose last segment holds a single key.
          ExpectPartialsHeadsEqualPerHead(kv, q.data(), 1024, n_kv, group, hd, 0.125f, 0, 3,
                                          where + " pos 1024");
        }
      }
    }
  }
}

// Decode rows over K in columns (the column decode at 16 lanes, attention_tiles.h): one-token
// blocks must equal the same tokens computed inside multi-token blocks (the key-major tile) bit
// for bit — groups 1–9 (chunks of 8 heads full, partial, and one past), head dims below, at and
// past the lane count with tails, f32 and bf16 blocks, split-K partials — and the dense
// reference within rounding.
TEST_P(AttentionTest, DecodeRowsEqualPrefillRowsOverGroupsHeadDimsAndDtypes) {
  for (int64_t group : {1, 2, 3, 4, 5, 6, 7, 8, 9}) {
    for (int64_t hd : {4, 16, 37, 64}) {
      for (bool bf16 : {false, true}) {
        const int64_t n_ctx = group == 8 ? 530 : 75, n_kv = 2, n_heads = n_kv * group;
        const int64_t stride = n_heads * hd;
        Paged p(n_ctx, n_kv, hd, 16, static_cast<uint64_t>(group * 100 + hd + (bf16 ? 7 : 0)));
        if (bf16) {
          for (auto* dense : {&p.k_dense, &p.v_dense})
            for (float& x : *dense) x = BF16ToF32(F32ToBF16(x));
        }
        const HeadMajor cols(p, /*k_columns=*/true, bf16);  // KvCache's layout
        const PagedKv kv = cols.View();
        const std::vector<float> q =
            RandomQ(n_ctx * stride, 90 + static_cast<uint64_t>(group), 2.0f);
        const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
        // Every token as a one-token block (column decode) and in blocks of 8 tokens.
        std::vector<float> one(static_cast<size_t>(n_ctx * stride)), eight(one.size());
        for (int64_t chunk : {int64_t{1}, int64_t{8}}) {
          std::vector<float>& out = chunk == 1 ? one : eight;
          std::vector<float> scratch(static_cast<size_t>(AttentionScratchFloats(chunk, group, hd)));
          for (int64_t pos0 = 0; pos0 < n_ctx; pos0 += chunk) {
            const int64_t n = std::min(chunk, n_ctx - pos0);
            for (int64_t g = 0; g < n_kv; ++g) {
              const int64_t off = pos0 * stride + g * group * hd;
              AttentionBlock(q.data() + off, stride, n, pos0, kv, g, group, hd, scale,
                             scratch.data(), out.data() + off, stride);
            }
          }
        }
        ASSERT_EQ(std::memcmp(one.data(), eight.data(), one.size() * sizeof(float)), 0)
            << "group " << group << " hd " << hd << " bf16 " << bf16;
        for (int64_t i : {int64_t{0}, int64_t{31}, int64_t{32}, n_ctx - 1}) {
          const std::vector<double> ref = p.NaiveOver(q.data() + i * stride, n_heads, scale, i + 1);
          for (int64_t j = 0; j < stride; ++j) {
            ASSERT_NEAR(one[static_cast<size_t>(i * stride + j)], ref[static_cast<size_t>(j)], 2e-5)
                << "group " << group << " hd " << hd << " token " << i;
          }
        }
        // Split-K of the last token: partials of single segments, merged.
        ExpectSplitKEqualsLastRow(kv, q, one, n_ctx, n_kv, group, hd, scale,
                                  "group " + std::to_string(group) + " hd " + std::to_string(hd));
      }
    }
  }
}

// K in columns changes where a key's floats are, never the arithmetic: over f32 and bf16
// blocks, groups that fill a chunk of 8 heads or not (1, 3, 8, 12), head dims with
// tails, block sizes that hold a 16-key half (16, 32: the column decode at 16 lanes) or not (7),
// prefill chunkings, one-token rows and split-K give the token-major rows' bits (of the same
// values), and the reference and the window path read columns too.
TEST_P(AttentionTest, KColumnsEqualRows) {
  for (int64_t group : {1, 3, 8, 12}) {
    for (int64_t hd : {16, 37, 64}) {
      for (int64_t block_size : {7, 16, 32}) {
        for (bool bf16 : {false, true}) {
          if (hd == 64 && group != 8) continue;
          const bool long_case = hd == 64 && block_size == 16;
          const int64_t n_ctx = long_case ? 530 : 75, n_kv = 2, n_heads = n_kv * group;
          const int64_t stride = n_heads * hd;
          std::ostringstream what_os;
          what_os << "group " << group << " hd " << hd << " block " << block_size
                  << (bf16 ? " bf16" : " f32");
          const std::string what = what_os.str();
          Paged p(n_ctx, n_kv, hd, block_size,
                  static_cast<uint64_t>(group * 1000 + hd * 10 + block_size));
          if (bf16) {
            for (auto* dense : {&p.k_dense, &p.v_dense})
              for (float& x : *dense) x = BF16ToF32(F32ToBF16(x));
          }
          Paged rows = p;
          for (int64_t t = 0; t < n_ctx; ++t) {  // rows of the (rounded) dense values
            const int64_t kv_dim = n_kv * hd;
            const int64_t off =
                (p.table[t / block_size] * block_size + t % block_size) * p.kv_stride;
            std::copy_n(p.k_dense.begin() + t * kv_dim, kv_dim, rows.pool_k.begin() + off);
            std::copy_n(p.v_dense.begin() + t * kv_dim, kv_dim, rows.pool_v.begin() + off);
          }
          for (size_t b = 0; b < rows.k_ptr.size(); ++b) {
            rows.k_ptr[b] = rows.pool_k.data() + b * block_size * rows.kv_stride;
            rows.v_ptr[b] = rows.pool_v.data() + b * block_size * rows.kv_stride;
          }
          const HeadMajor cols(rows, /*k_columns=*/true, bf16);
          const std::vector<float> q =
              RandomQ(n_ctx * stride, 70 + static_cast<uint64_t>(group + hd), 2.0f);
          const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
          std::vector<float> want;
          RunChunked(rows, q, n_ctx, n_heads, 1, scale, &want);
          for (int64_t chunk : {int64_t{1}, int64_t{8}, int64_t{45}}) {
            std::vector<float> got;
            RunChunkedOver(cols.View(), n_kv, hd, q, n_ctx, n_heads, chunk, scale, &got);
            ASSERT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0)
                << what << " chunk " << chunk;
          }
          const float* q_last = q.data() + (n_ctx - 1) * stride;
          const std::vector<double> ref = rows.NaiveOver(q_last, n_heads, scale, n_ctx);
          for (int64_t j = 0; j < stride; ++j) {
            ASSERT_NEAR(want[static_cast<size_t>((n_ctx - 1) * stride + j)],
                        ref[static_cast<size_t>(j)], 2e-5)
                << what;
          }
          // Split-K of the last token, one segment per call, merged.
          const int64_t n_seg = AttentionSegments(n_ctx), pf = AttentionPartialFloats(group, hd);
          std::vector<float> scratch(static_cast<size_t>(AttentionScratchFloats(1, group, hd)));
          for (int64_t g = 0; g < n_kv; ++g) {
            std::vector<float> partials(static_cast<size_t>(n_seg * pf)), merged(group * hd);
            for (int64_t sg = 0; sg < n_seg; ++sg) {
              AttentionPartials(q_last + g * group * hd, n_ctx - 1, cols.View(), g, group, hd,
                                scale, sg, sg + 1, scratch.data(), partials.data() + sg * pf);
            }
            AttentionMerge(partials.data(), n_seg, group, hd, merged.data());
            ASSERT_EQ(
                std::memcmp(merged.data(), want.data() + (n_ctx - 1) * stride + g * group * hd,
                            merged.size() * sizeof(float)),
                0)
                << what << " g " << g;
          }
          // The reference and the window path read columns as the rows they hold.
          std::vector<float> ra(static_cast<size_t>(stride)), rb(ra.size()), rs(n_ctx + hd);
          reference::AttentionRow(q_last, rows.View(), n_ctx, n_heads, n_kv, hd, scale, rs.data(),
                                  ra.data());
          reference::AttentionRow(q_last, cols.View(), n_ctx, n_heads, n_kv, hd, scale, rs.data(),
                                  rb.data());
          ASSERT_EQ(std::memcmp(ra.data(), rb.data(), ra.size() * sizeof(float)), 0) << what;
          for (int64_t g = 0; g < n_kv; ++g) {
            PagedKv rg = rows.View(), cg = cols.View();
            std::vector<const float*> rk(rows.k_ptr), rv(rows.v_ptr), ck(cols.k_ptr),
                cv(cols.v_ptr);
            const int64_t esz = bf16 ? 2 : 4;
            for (size_t b = 0; b < rk.size(); ++b) {  // the KvCache::View convention
              rk[b] += g * hd, rv[b] += g * hd;
              ck[b] = reinterpret_cast<const float*>(reinterpret_cast<const char*>(ck[b]) +
                                                     g * cols.head_stride * esz);
              cv[b] = reinterpret_cast<const float*>(reinterpret_cast<const char*>(cv[b]) +
                                                     g * cols.head_stride * esz);
            }
            rg.k_blocks = rk.data(), rg.v_blocks = rv.data();
            cg.k_blocks = ck.data(), cg.v_blocks = cv.data();
            reference::AttentionRowWindow(q_last + g * group * hd, n_ctx / 3, n_ctx - 1, rg, group,
                                          hd, scale, 0.0f, rs.data(), ra.data());
            reference::AttentionRowWindow(q_last + g * group * hd, n_ctx / 3, n_ctx - 1, cg, group,
                                          hd, scale, 0.0f, rs.data(), rb.data());
            ASSERT_EQ(std::memcmp(ra.data(), rb.data(), group * hd * sizeof(float)), 0)
                << what << " window g " << g;
          }
        }
      }
    }
  }
}

// bf16 dot products (PagedKv::bf16_dot; AVX-512 computes with vdpbf16ps, other levels ignore
// the flag): every token against the dense reference with scale·q rounded to bf16 as the kernel
// rounds it (the probabilities' bf16 rounding is the tolerance: ≤ 2^-8 relative per weight), and
// bit for bit the same whatever the chunking — one token at a time (the column decode where it
// applies), blocks of 5 and 8 and the whole prompt — and under split-K; over KvCache's layout
// and token-major rows, groups in and past a chunk of 8 heads, head dims with tails, block sizes
// that hold a 16-key half or not. At a level with the instructions the results must differ from
// the widened f32 arithmetic (the flag is not ignored there).
TEST_P(AttentionTest, Bf16DotProductsAreBatchInvariantAndMatchTheReference) {
  for (int64_t group : {1, 3, 8, 9}) {
    for (int64_t hd : {16, 38, 64}) {
      for (int64_t bs : {16, 7}) {
        for (bool k_columns : {true, false}) {
          const int64_t n_ctx = group == 8 ? 530 : 75, n_kv = 2, n_heads = n_kv * group;
          const int64_t stride = n_heads * hd;
          Paged p(n_ctx, n_kv, hd, bs, static_cast<uint64_t>(group * 100 + hd + bs));
          for (auto* dense : {&p.k_dense, &p.v_dense})
            for (float& x : *dense) x = BF16ToF32(F32ToBF16(x));
          const HeadMajor blocks(p, k_columns, /*bf16=*/true);
          PagedKv kv = blocks.View();
          kv.bf16_dot = true;
          const std::vector<float> q =
              RandomQ(n_ctx * stride, 70 + static_cast<uint64_t>(group), 2.0f);
          const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
          const std::string where = "group " + std::to_string(group) + " hd " + std::to_string(hd) +
                                    " bs " + std::to_string(bs) +
                                    (k_columns ? " columns" : " rows");
          std::vector<float> one, other;
          RunChunkedOver(kv, n_kv, hd, q, n_ctx, n_heads, 1, scale, &one);
          for (int64_t chunk : {int64_t{5}, int64_t{8}, n_ctx}) {
            RunChunkedOver(kv, n_kv, hd, q, n_ctx, n_heads, chunk, scale, &other);
            ASSERT_EQ(std::memcmp(one.data(), other.data(), one.size() * sizeof(float)), 0)
                << where << " chunk " << chunk;
          }
          // What the kernel multiplies: bf16(scale·q) with the instructions, else scale·q.
          const bool dot = static_cast<int>(GetParam()) >= static_cast<int>(IsaLevel::kAvx512);
          std::vector<float> q_scaled(q.size());
          for (size_t i = 0; i < q.size(); ++i) {
            q_scaled[i] = dot ? BF16ToF32(F32ToBF16(scale * q[i])) : scale * q[i];
          }
          for (int64_t i = 0; i < n_ctx; ++i) {
            const std::vector<double> ref =
                p.NaiveOver(q_scaled.data() + i * stride, n_heads, 1.0, i + 1);
            for (int64_t j = 0; j < stride; ++j) {
              ASSERT_NEAR(one[static_cast<size_t>(i * stride + j)], ref[static_cast<size_t>(j)],
                          dot ? 4e-3 : 2e-5)
                  << where << " token " << i;
            }
          }
          ExpectSplitKEqualsLastRow(kv, q, one, n_ctx, n_kv, group, hd, scale, where);
          kv.bf16_dot = false;
          RunChunkedOver(kv, n_kv, hd, q, n_ctx, n_heads, 8, scale, &other);
          const bool same = std::memcmp(one.data(), other.data(), one.size() * sizeof(float)) == 0;
          EXPECT_EQ(same, static_cast<int>(GetParam()) < static_cast<int>(IsaLevel::kAvx512))
              << where;
        }
      }
    }
  }
}

// Sliding windows and soft caps in the tiled kernels (attention.h, "Sliding windows",
// AttentionScores): every token of a prompt over keys [AttentionFirstKey(pos, window), pos], its
// scores capped where a cap is given — against the formula in double, bit for bit
// the same whatever the chunking (1, 5, 8, 33 tokens, whole; 45 and 512 across segments: chunk
// and window edges inside tiles and segments), split-K from the first segment, heads together
// — with the table as a
// windowed KvCache leaves it: blocks wholly behind the window of the chunk's first token point at
// NaN blocks, so a read of them poisons the result. Windows of 1 key, inside a tile, a tile
// and one past, across segments; groups 1, 3, 8 (the column decode's chunk), f32 and bf16
// (dot products), K in columns (KvCache's layout) and rows, blocks of 16 and 7; caps with and
// without a window (Gemma 2: 50 on every layer, a window on every other).
TEST_P(AttentionTest, WindowedTokensMatchTheFormulaWhateverTheChunkingAndDroppedBlocks) {
  const bool dot_level = static_cast<int>(GetParam()) >= static_cast<int>(IsaLevel::kAvx512);
  const AttentionScores cases[] = {{.window = 1},
                                   {.window = 7},
                                   {.window = 32},
                                   {.window = 33, .softcap = 3.5f},
                                   {.window = 600},
                                   {.window = 0, .softcap = 3.5f},
                                   {.window = 600, .softcap = 50.0f}};
  for (const AttentionScores& scores : cases) {
    const int64_t window = scores.window;
    const float cap = scores.softcap;
    const bool long_case = window == 600;
    for (int64_t group : {1, 3, 8}) {
      for (int64_t hd : {16, 37, 64}) {
        for (int64_t bs : {16, 7}) {
          for (int bf16 = 0; bf16 < 2; ++bf16) {
            for (bool k_columns : {true, false}) {
              if ((hd == 37) != (group == 3)) continue;  // odd head dims once, with odd groups
              // The long case once, at the vector levels (a minute at the scalar level, whose
              // segments run the same template code).
              if (long_case && (group != 8 || bs != 16 || GetParam() == IsaLevel::kScalar))
                continue;
              const int64_t n_ctx = long_case ? 1100 : 90, n_kv = 2, n_heads = n_kv * group;
              const int64_t stride = n_heads * hd;
              Paged p(n_ctx, n_kv, hd, bs,
                      static_cast<uint64_t>(window * 7 + group * 3 + hd + (cap > 0 ? 1 : 0)));
              if (bf16 == 1) {
                for (auto* dense : {&p.k_dense, &p.v_dense})
                  for (float& x : *dense) x = BF16ToF32(F32ToBF16(x));
              }
              const HeadMajor blocks(p, k_columns, bf16 == 1);
              PagedKv full = blocks.View();
              full.bf16_dot = bf16 == 1;
              const std::vector<float> q =
                  RandomQ(n_ctx * stride, 30 + static_cast<uint64_t>(group), 2.0f);
              const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
              std::ostringstream os;
              os << "window " << window << " cap " << cap << " group " << group << " hd " << hd
                 << " bs " << bs << (bf16 ? " bf16" : " f32") << (k_columns ? " columns" : " rows");
              const std::string where = os.str();
              // The table a windowed cache holds when a chunk starting at pos0 runs: blocks
              // wholly behind the window of position pos0 − 1 dropped (KvCache::DropBehindWindows;
              // none without a window).
              const int32_t poison = p.spare.front();
              auto table_at = [&](int64_t pos0) {
                std::vector<int32_t> t = p.table;
                const int64_t dropped = window > 0 ? std::max<int64_t>(0, pos0 - window) / bs : 0;
                for (int64_t b = 0; b < dropped; ++b) t[static_cast<size_t>(b)] = poison;
                return t;
              };
              std::vector<float> one, other;
              // (The long case: chunks of 45 and 512 — a whole 1100-token block walks every
              // key from its first token's window on.)
              const std::vector<int64_t> chunks = long_case
                                                      ? std::vector<int64_t>{1, 45, 512}
                                                      : std::vector<int64_t>{1, 5, 8, 33, n_ctx};
              for (int64_t chunk : chunks) {
                std::vector<float>& out = chunk == 1 ? one : other;
                out.assign(static_cast<size_t>(n_ctx * stride), -7.0f);
                std::vector<float> scratch(
                    static_cast<size_t>(AttentionScratchFloats(chunk, group, hd)));
                for (int64_t pos0 = 0; pos0 < n_ctx; pos0 += chunk) {
                  const std::vector<int32_t> table = table_at(pos0);
                  PagedKv kv = full;
                  kv.block_table = table.data();
                  const int64_t n = std::min(chunk, n_ctx - pos0);
                  for (int64_t g = 0; g < n_kv; ++g) {
                    const int64_t off = pos0 * stride + g * group * hd;
                    AttentionBlock(q.data() + off, stride, n, pos0, kv, g, group, hd, scale,
                                   scratch.data(), out.data() + off, stride, scores);
                  }
                }
                if (chunk > 1) {
                  ASSERT_EQ(std::memcmp(one.data(), other.data(), one.size() * sizeof(float)), 0)
                      << where << " chunk " << chunk;
                }
              }
              // The formula over the window, in double; with the dot products, on what the
              // kernel multiplies (bf16(scale·q), probabilities rounded: 4e-3).
              const bool dot = dot_level && bf16 == 1 && hd % 2 == 0;  // odd: widened, f32
              for (int64_t i = 0; i < n_ctx; i += (i < 40 ? 1 : 13)) {
                const int64_t first = AttentionFirstKey(i, window);
                // What the kernel multiplies: scale·q, rounded to bf16 by the dot products.
                std::vector<float> q_scaled(static_cast<size_t>(stride));
                for (int64_t e = 0; e < stride; ++e) {
                  const float qs = scale * q[static_cast<size_t>(i * stride + e)];
                  q_scaled[static_cast<size_t>(e)] = dot ? BF16ToF32(F32ToBF16(qs)) : qs;
                }
                const std::vector<double> want =
                    NaiveWindow(p, q_scaled.data(), n_heads, 1.0, first, i, cap);
                for (int64_t e = 0; e < stride; ++e) {
                  ASSERT_NEAR(one[static_cast<size_t>(i * stride + e)],
                              want[static_cast<size_t>(e)], dot ? 4e-3 : 2e-5)
                      << where << " token " << i << " element " << e;
                }
              }
              // Split-K of the last token from its first segment (one segment per call, then
              // merged), and all heads at once, over the table of its decode step.
              const int64_t pos = n_ctx - 1;
              const std::vector<int32_t> table = table_at(pos);
              PagedKv kv = full;
              kv.block_table = table.data();
              const int64_t s0 = AttentionFirstSegment(pos, window);
              const int64_t n_seg = AttentionSegments(pos + 1) - s0;
              const int64_t pf = AttentionPartialFloats(group, hd);
              std::vector<float> scratch(static_cast<size_t>(AttentionScratchFloats(1, group, hd)));
              for (int64_t g = 0; g < n_kv; ++g) {
                const float* qg = q.data() + pos * stride + g * group * hd;
                std::vector<float> partials(static_cast<size_t>(n_seg * pf)), merged(group * hd);
                for (int64_t sg = 0; sg < n_seg; ++sg) {
                  AttentionPartials(qg, pos, kv, g, group, hd, scale, s0 + sg, s0 + sg + 1,
                                    scratch.data(), partials.data() + sg * pf, scores);
                }
                AttentionMerge(partials.data(), n_seg, group, hd, merged.data());
                ASSERT_EQ(std::memcmp(merged.data(), one.data() + pos * stride + g * group * hd,
                                      merged.size() * sizeof(float)),
                          0)
                    << where << " split-K, g " << g;
              }
              ExpectPartialsHeadsEqualPerHead(kv, q.data() + pos * stride, pos, n_kv, group, hd,
                                              scale, s0, s0 + n_seg, where, scores);
            }
          }
        }
      }
    }
  }
}

// The AVX-512 q packing of the bf16 dot products rounds as Bf16Pair bit for bit: ties to even
// both ways, denormals kept (vcvtneps2bf16 would flush them), NaNs quieted with their sign and
// payload's top bits, overflow to infinity, zeros of both signs.
TEST(AttentionBf16Pairs, VectorPackingEqualsBf16PairBitwise) {
#if defined(__x86_64__)
  if (!Supported(IsaLevel::kAvx512)) GTEST_SKIP() << "avx512 not supported here";
  SetMaxIsa(kMaxIsaLevel);
  auto from_bits = [](uint32_t u) {
    float f;
    std::memcpy(&f, &u, sizeof(f));
    return f;
  };
  std::vector<float> special = {0.0f,
                                -0.0f,
                                1e-40f,
                                -1e-40f,
                                std::numeric_limits<float>::denorm_min(),
                                std::numeric_limits<float>::min(),
                                std::numeric_limits<float>::max(),
                                -std::numeric_limits<float>::max(),
                                std::numeric_limits<float>::infinity(),
                                -std::numeric_limits<float>::infinity(),
                                std::numeric_limits<float>::quiet_NaN(),
                                from_bits(0x7f800001u),
                                from_bits(0xffc12345u),
                                from_bits(0x7fbfffffu),
                                from_bits(0x3f808000u),
                                from_bits(0x3f818000u),
                                from_bits(0x3f80ffffu),
                                from_bits(0x3f807fffu),
                                from_bits(0x7f7f8000u),
                                from_bits(0x807fffffu),
                                1.0f,
                                -2.5f};
  Rng rng(7);
  while (special.size() % 32 != 0) special.push_back(rng.NextGaussian() * 100.0f);
  for (int i = 0; i < 3200; ++i) special.push_back(rng.NextGaussian());
  for (const float scale : {1.0f, 0.125f, 3.0f, 1e-30f}) {
    for (size_t at = 0; at < special.size(); at += 32) {
      uint32_t got[16];
      avx512::ScaledBf16Pairs16(special.data() + at, scale, got);
      for (int j = 0; j < 16; ++j) {
        const uint32_t want = attention_internal::Bf16Pair(scale * special[at + 2 * j],
                                                           scale * special[at + 2 * j + 1]);
        ASSERT_EQ(got[j], want) << "scale " << scale << " elements " << at + 2 * j;
      }
    }
  }
#else
  GTEST_SKIP() << "x86 only";
#endif
}

TEST(AttentionReference, MatchesDense) {
  for (int64_t ratio : {1, 2, 4, 8}) {
    Paged p(50, 2, 24, 7, 5 + ratio);
    const int64_t n_heads = 2 * ratio;
    const std::vector<float> q = RandomQ(n_heads * 24, 6, 2.0f);
    std::vector<float> scratch(50), out(static_cast<size_t>(n_heads * 24));
    reference::AttentionRow(q.data(), p.View(), 50, n_heads, 2, 24, 0.2f, scratch.data(),
                            out.data());
    const std::vector<double> want = p.Naive(q, n_heads, 0.2f);
    for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(out[i], want[i], 2e-5) << i;
  }
}

// The general path (sliding windows, soft-capped scores): keys [first, pos] of one KV head, with
// s → cap·tanh(s/cap), against the formula in double; NaN-filled blocks outside the window
// (and the pool's spare blocks) must never be read.
TEST(AttentionRowWindow, MatchesDenseWithWindowAndSoftcap) {
  for (int64_t ratio : {1, 3}) {
    for (float cap : {0.0f, 2.5f}) {
      const int64_t n_ctx = 70, hd = 20, kv_heads = 2;
      Paged p(n_ctx, kv_heads, hd, 8, 11 + ratio);
      const int64_t n_heads = kv_heads * ratio, pos = n_ctx - 1;
      const std::vector<float> q = RandomQ(n_heads * hd, 12, 2.0f);
      for (int64_t first : {int64_t{0}, int64_t{17}, pos}) {
        // Poison the blocks wholly before the window: the kernel must not touch them.
        Paged win = p;
        for (int64_t b = 0; b < first / win.block_size; ++b) {
          float* k = win.pool_k.data() + win.table[b] * win.block_size * win.kv_stride;
          std::fill_n(k, win.block_size * win.kv_stride, std::numeric_limits<float>::quiet_NaN());
        }
        for (int64_t b = 0; b < static_cast<int64_t>(win.k_ptr.size()); ++b) {
          win.k_ptr[b] = win.pool_k.data() + b * win.block_size * win.kv_stride;
          win.v_ptr[b] = win.pool_v.data() + b * win.block_size * win.kv_stride;
        }
        std::vector<float> scratch(static_cast<size_t>(n_ctx)),
            out(static_cast<size_t>(n_heads * hd));
        const float scale = 0.3f;
        for (int64_t g = 0; g < kv_heads; ++g) {
          PagedKv kv = win.View();
          // The KvCache::View convention: the view starts at KV head g.
          std::vector<const float*> kb(win.k_ptr), vb(win.v_ptr);
          for (auto& ptr : kb) ptr += g * hd;
          for (auto& ptr : vb) ptr += g * hd;
          kv.k_blocks = kb.data();
          kv.v_blocks = vb.data();
          reference::AttentionRowWindow(q.data() + g * ratio * hd, first, pos, kv, ratio, hd, scale,
                                        cap, scratch.data(), out.data() + g * ratio * hd);
        }
        const std::vector<double> want = NaiveWindow(p, q.data(), n_heads, scale, first, pos, cap);
        for (size_t e = 0; e < want.size(); ++e) {
          ASSERT_NEAR(out[e], want[e], 2e-5)
              << "ratio " << ratio << " cap " << cap << " first " << first << " element " << e;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Levels, AttentionTest,
                         ::testing::Values(IsaLevel::kScalar, IsaLevel::kAvx2, IsaLevel::kAvx512,
                                           IsaLevel::kAmx),
                         [](const ::testing::TestParamInfo<IsaLevel>& info) {
                           return IsaName(info.param);
                         });

}  // namespace
}  // namespace chorus::kernels
