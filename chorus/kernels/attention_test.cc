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
#include <vector>

#include "chorus/base/rng.h"
#include "chorus/kernels/dispatch.h"

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

  // softmax(scale · q_h · K[:, g]ᵀ) · V[:, g] in double.
  std::vector<double> Naive(const std::vector<float>& q, int64_t n_heads, double scale) const {
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
  std::vector<float> scratch(static_cast<size_t>(n_ctx), 0.0f);
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
  std::vector<float> scratch(static_cast<size_t>(n_ctx));
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

INSTANTIATE_TEST_SUITE_P(Levels, AttentionTest,
                         ::testing::Values(IsaLevel::kScalar, IsaLevel::kAvx2, IsaLevel::kAvx512,
                                           IsaLevel::kAmx),
                         [](const ::testing::TestParamInfo<IsaLevel>& info) {
                           return IsaName(info.param);
                         });

}  // namespace
}  // namespace chorus::kernels
