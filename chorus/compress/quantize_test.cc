#include "chorus/compress/quantize.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "chorus/kernels/dispatch.h"

namespace chorus::compress {
namespace {

using delta::MatrixLayout;

std::vector<float> Gaussian(int64_t n, uint64_t seed, float sd = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> g(0, sd);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = g(rng);
  return v;
}

// Σ_t x_t·x_tᵀ over the n rows of xs [n, cols], in double.
std::vector<double> Gram(const std::vector<float>& xs, int64_t n, int64_t cols) {
  std::vector<double> h(static_cast<size_t>(cols * cols), 0);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t i = 0; i < cols; ++i)
      for (int64_t j = 0; j < cols; ++j)
        h[static_cast<size_t>(i * cols + j)] +=
            static_cast<double>(xs[static_cast<size_t>(t * cols + i)]) *
            xs[static_cast<size_t>(t * cols + j)];
  return h;
}

TEST(QuantizeTest, RtnKeepsTheTwoLargestAndRoundsToNearest) {
  MatrixLayout l{.rows = 8, .cols = 64, .bits = 4, .sparse24 = true, .group_size = 16};
  auto d = Gaussian(l.rows * l.cols, 1);
  auto m = RtnCompress(d, l);
  auto dec = m.Decode();
  for (int64_t r = 0; r < l.rows; ++r) {
    for (int64_t g = 0; g < l.cols / 4; ++g) {
      // The kept two are the largest magnitudes of the block.
      int nz = 0;
      float min_kept = 1e9f, max_pruned = 0;
      for (int j = 0; j < 4; ++j) {
        const size_t i = static_cast<size_t>(r * l.cols + g * 4 + j);
        if (dec[i] != 0) {
          ++nz;
          min_kept = std::min(min_kept, std::fabs(d[i]));
        } else {
          max_pruned = std::max(max_pruned, std::fabs(d[i]));
        }
      }
      EXPECT_EQ(nz, 2);
      EXPECT_GE(min_kept, max_pruned);
    }
    // Every kept value is within half a step of its original, and the group's largest one is
    // exactly representable at the edge of the grid (scale = max / half range, rounded to f16).
    for (int64_t c = 0; c < l.cols; ++c) {
      const size_t i = static_cast<size_t>(r * l.cols + c);
      if (dec[i] == 0) continue;
      EXPECT_LE(std::fabs(dec[i] - d[i]), 0.5f * m.Scale(r, c) * 1.01f);
    }
  }
}

TEST(QuantizeTest, RtnIsExactOnTheGrid) {
  // Values that are grid points of their group scale come back exactly.
  MatrixLayout l{.rows = 2, .cols = 16, .bits = 2, .sparse24 = false, .group_size = 8};
  std::vector<float> d;
  for (int i = 0; i < 32; ++i) d.push_back(0.25f * ((i % 4) - 1.5f));  // {-.375, -.125, .125, .375}
  auto dec = RtnCompress(d, l).Decode();
  for (size_t i = 0; i < d.size(); ++i) EXPECT_FLOAT_EQ(dec[i], d[i]);
}

TEST(QuantizeTest, SignKeepsSignsAndTheMeanMagnitude) {
  MatrixLayout l{.rows = 4, .cols = 32, .bits = 1, .sparse24 = false, .group_size = 0};
  auto d = Gaussian(l.rows * l.cols, 3);
  auto m = SignCompress(d, l);
  double mean = 0;
  for (float v : d) mean += std::fabs(v);
  mean /= static_cast<double>(d.size());
  auto dec = m.Decode();
  for (size_t i = 0; i < d.size(); ++i) {
    EXPECT_EQ(dec[i] > 0, d[i] >= 0);
    EXPECT_NEAR(std::fabs(dec[i]), mean, 1e-5);
  }
}

// Inputs with correlated features, as activations have: OBS must beat RTN on ‖ΔX − Δ̃X‖².
TEST(QuantizeTest, ObsReducesTheOutputErrorVersusRtn) {
  const int64_t rows = 32, cols = 64, n = 512;
  auto base = Gaussian(n * 8, 11);
  auto mix = Gaussian(8 * cols, 12);
  auto noise = Gaussian(n * cols, 13, 0.1f);
  std::vector<float> x(static_cast<size_t>(n * cols));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t c = 0; c < cols; ++c) {
      float s = noise[static_cast<size_t>(t * cols + c)];
      for (int k = 0; k < 8; ++k)
        s += base[static_cast<size_t>(t * 8 + k)] * mix[static_cast<size_t>(k * cols + c)];
      x[static_cast<size_t>(t * cols + c)] = s;
    }
  std::vector<double> h(static_cast<size_t>(cols * cols), 0);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t i = 0; i < cols; ++i)
      for (int64_t j = 0; j < cols; ++j)
        h[static_cast<size_t>(i * cols + j)] +=
            2.0 * x[static_cast<size_t>(t * cols + i)] * x[static_cast<size_t>(t * cols + j)] / n;
  auto d = Gaussian(rows * cols, 14, 0.01f);
  for (bool sparse : {true, false}) {
    for (int bits : {2, 4}) {
      MatrixLayout l{
          .rows = rows, .cols = cols, .bits = bits, .sparse24 = sparse, .group_size = 16};
      const double e_rtn = OutputError(d, RtnCompress(d, l).Decode(), rows, cols, x, n);
      auto obs = ObsCompress(d, h, l, 0.01, nullptr);
      ASSERT_TRUE(obs.ok());
      const double e_obs = OutputError(d, obs->Decode(), rows, cols, x, n);
      auto refined = ObsCompress(d, h, l, 0.01, nullptr, 4);
      ASSERT_TRUE(refined.ok());
      const double e_ref = OutputError(d, refined->Decode(), rows, cols, x, n);
      EXPECT_LT(e_obs, 0.8 * e_rtn) << "bits " << bits << " sparse " << sparse;
      EXPECT_LE(e_ref, e_obs * 1.0001) << "bits " << bits << " sparse " << sparse;
      // The packed form of the result is valid.
      EXPECT_TRUE(delta::Unpack(delta::Pack(*refined), "m").ok());
    }
  }
}

TEST(QuantizeTest, ObsMatchesOnePoolOrNone) {
  const int64_t rows = 40, cols = 32;
  auto d = Gaussian(rows * cols, 21, 0.02f);
  auto xs = Gaussian(64 * cols, 22);
  std::vector<double> h = Gram(xs, 64, cols);
  MatrixLayout l{.rows = rows, .cols = cols, .bits = 3, .sparse24 = true, .group_size = 8};
  ThreadPool pool(2);
  auto a = ObsCompress(d, h, l, 0.01, nullptr, 2);
  auto b = ObsCompress(d, h, l, 0.01, &pool, 2);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->codes, b->codes);
  EXPECT_EQ(a->patterns, b->patterns);
  EXPECT_EQ(a->scales, b->scales);
}

// H·(UᵀU) = I for a random well-conditioned H wide enough (300 columns) that the
// factorization runs on the pool, with the same bits as without it.
TEST(QuantizeTest, InverseCholeskyFactorInvertsTheHessianOnAnyPool) {
  const int64_t C = 300, n = 600;
  auto xs = Gaussian(n * C, 31);
  std::vector<double> h = Gram(xs, n, C);
  for (double& v : h) v /= n;
  for (int64_t i = 0; i < C; ++i) h[static_cast<size_t>(i * C + i)] += 0.1;
  ThreadPool pool(2);
  auto a = InverseCholeskyUpper(h, C, nullptr);
  auto b = InverseCholeskyUpper(h, C, &pool);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, *b);
  const std::vector<float>& U = *a;
  for (int64_t i = 0; i < C; ++i)
    for (int64_t j = 0; j < i; ++j) ASSERT_EQ(U[static_cast<size_t>(i * C + j)], 0.0f);
  // M = UᵀU, then (H·M)[i][j] against the identity.
  std::vector<double> m(static_cast<size_t>(C * C), 0);
  for (int64_t k = 0; k < C; ++k)
    for (int64_t i = k; i < C; ++i)
      for (int64_t j = k; j < C; ++j)
        m[static_cast<size_t>(i * C + j)] +=
            static_cast<double>(U[static_cast<size_t>(k * C + i)]) *
            U[static_cast<size_t>(k * C + j)];
  double worst = 0;
  for (int64_t i = 0; i < C; ++i) {
    for (int64_t j = 0; j < C; ++j) {
      double s = 0;
      for (int64_t k = 0; k < C; ++k)
        s += h[static_cast<size_t>(i * C + k)] * m[static_cast<size_t>(k * C + j)];
      worst = std::max(worst, std::fabs(s - (i == j ? 1.0 : 0.0)));
    }
  }
  EXPECT_LT(worst, 1e-4);

  std::vector<double> indefinite = h;
  indefinite[static_cast<size_t>(7 * C + 7)] = -1;
  EXPECT_EQ(InverseCholeskyUpper(indefinite, C, &pool).status().code(),
            StatusCode::kFailedPrecondition);
}

// The row loops run at the CPU's vector width (kernels::ActiveIsa); every level gives the same
// codes, patterns and scales, on a matrix wide enough for the parallel paths.
TEST(QuantizeTest, ObsGivesTheSameBitsAtEveryIsaLevel) {
  const int64_t rows = 24, cols = 320, n = 400;
  auto d = Gaussian(rows * cols, 41, 0.02f);
  auto xs = Gaussian(n * cols, 42);
  std::vector<double> h = Gram(xs, n, cols);
  MatrixLayout l{.rows = rows, .cols = cols, .bits = 2, .sparse24 = true, .group_size = 64};
  ThreadPool pool(2);
  const kernels::IsaLevel best = kernels::BestIsa();
  std::vector<delta::UnpackedMatrix> results;
  for (auto level :
       {kernels::IsaLevel::kScalar, kernels::IsaLevel::kAvx2, kernels::IsaLevel::kAvx512}) {
    if (level > best) continue;
    kernels::SetMaxIsa(level);
    auto m = ObsCompress(d, h, l, 0.01, &pool, 4);
    ASSERT_TRUE(m.ok());
    results.push_back(*std::move(m));
  }
  kernels::SetMaxIsa(kernels::kMaxIsaLevel);
  for (size_t i = 1; i < results.size(); ++i) {
    EXPECT_EQ(results[i].codes, results[0].codes);
    EXPECT_EQ(results[i].patterns, results[0].patterns);
    EXPECT_EQ(results[i].scales, results[0].scales);
  }
}

}  // namespace
}  // namespace chorus::compress
