// test-labels: kernel
// Element-wise kernels: every ISA level the machine supports against the scalar reference and
// against direct double-precision formulas, over awkward lengths.
#include "chorus/kernels/ops.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "chorus/base/rng.h"
#include "chorus/kernels/dispatch.h"
#include "chorus/kernels/x86/ops_x86.h"

namespace chorus::kernels {

// Readable parameter names in gtest messages.
void PrintTo(IsaLevel level, std::ostream* os) { *os << IsaName(level); }

namespace {

const int64_t kLengths[] = {1, 2, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 4096, 4099};

bool Supported(IsaLevel level) {
  SetMaxIsa(kMaxIsaLevel);
  return static_cast<int>(ActiveIsa()) >= static_cast<int>(level);
}

// Caps the dispatch level for one test and restores the default afterwards.
class IsaTest : public ::testing::TestWithParam<IsaLevel> {
 protected:
  void SetUp() override {
    if (!Supported(GetParam())) GTEST_SKIP() << IsaName(GetParam()) << " not supported here";
    SetMaxIsa(GetParam());
    ASSERT_EQ(ActiveIsa(), GetParam());
  }
  void TearDown() override { SetMaxIsa(kMaxIsaLevel); }
};

std::vector<float> Random(int64_t n, uint64_t seed, float scale = 1.0f) {
  Rng rng(seed);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = rng.NextGaussian() * scale;
  return v;
}

void ExpectClose(const std::vector<float>& got, const std::vector<float>& want, double rel,
                 double abs, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const double tol = abs + rel * std::fabs(want[i]);
    ASSERT_NEAR(got[i], want[i], tol) << what << " at " << i;
  }
}

bool BitwiseEqual(const float* a, const float* b, int64_t n) {
  return std::memcmp(a, b, static_cast<size_t>(n) * sizeof(float)) == 0;
}

// ParseIsaLevel is IsaName's inverse and refuses anything else (chorus bench --isa).
TEST(DispatchTest, ParseIsaLevelInvertsIsaName) {
  for (IsaLevel level : {IsaLevel::kScalar, IsaLevel::kAvx2, IsaLevel::kAvx512, IsaLevel::kAmx})
    EXPECT_EQ(ParseIsaLevel(IsaName(level)), level);
  EXPECT_EQ(ParseIsaLevel("best"), std::nullopt);
  EXPECT_EQ(ParseIsaLevel("AVX2"), std::nullopt);
  EXPECT_EQ(ParseIsaLevel(""), std::nullopt);
}

TEST_P(IsaTest, RmsNormMatchesReferenceAndFormula) {
  for (int64_t n : kLengths) {
    const int64_t m = 3;
    std::vector<float> x = Random(m * n, 1 + n, 2.0f), w = Random(n, 100 + n);
    std::vector<float> got(x.size()), want(x.size());
    RmsNorm(x.data(), w.data(), m, n, 1e-5f, got.data());
    reference::RmsNorm(x.data(), w.data(), m, n, 1e-5f, want.data());
    ExpectClose(got, want, 2e-6, 1e-7, "rmsnorm n=" + std::to_string(n));
    // Independent formula in double.
    for (int64_t r = 0; r < m; ++r) {
      double ss = 0;
      for (int64_t j = 0; j < n; ++j) ss += double(x[r * n + j]) * x[r * n + j];
      const double scale = 1.0 / std::sqrt(ss / n + 1e-5);
      for (int64_t j = 0; j < n; ++j) {
        const double ref = x[r * n + j] * scale * w[j];
        ASSERT_NEAR(got[r * n + j], ref, 1e-5 * std::fabs(ref) + 1e-6) << n << " " << r << " " << j;
      }
    }
    // In place (out aliases x).
    std::vector<float> inplace = x;
    RmsNorm(inplace.data(), w.data(), m, n, 1e-5f, inplace.data());
    EXPECT_TRUE(BitwiseEqual(inplace.data(), got.data(), m * n)) << n;
  }
}

TEST_P(IsaTest, RmsNormRowDoesNotDependOnOtherRows) {
  const int64_t n = 65, m = 7;
  std::vector<float> x = Random(m * n, 5), w = Random(n, 6);
  std::vector<float> all(x.size()), one(static_cast<size_t>(n));
  RmsNorm(x.data(), w.data(), m, n, 1e-6f, all.data());
  for (int64_t r = 0; r < m; ++r) {
    RmsNorm(x.data() + r * n, w.data(), 1, n, 1e-6f, one.data());
    EXPECT_TRUE(BitwiseEqual(one.data(), all.data() + r * n, n)) << r;
  }
}

TEST_P(IsaTest, SiluMulMatchesReferenceAndFormula) {
  for (int64_t n : kLengths) {
    std::vector<float> g = Random(n, 10 + n, 4.0f), u = Random(n, 20 + n);
    if (n > 4) {  // saturated regions of the sigmoid
      g[0] = -100.0f;
      g[1] = 100.0f;
      g[2] = -20.0f;
      g[3] = 0.0f;
    }
    std::vector<float> got(g.size()), want(g.size());
    SiluMul(g.data(), u.data(), n, got.data());
    reference::SiluMul(g.data(), u.data(), n, want.data());
    ExpectClose(got, want, 1e-6, 1e-30, "silu n=" + std::to_string(n));
    for (int64_t i = 0; i < n; ++i) {
      const double ref = g[i] / (1.0 + std::exp(-double(g[i]))) * u[i];
      ASSERT_NEAR(got[i], ref, 1e-6 * std::fabs(ref) + 1e-30) << n << " " << i;
    }
    std::vector<float> inplace = g;
    SiluMul(inplace.data(), u.data(), n, inplace.data());
    EXPECT_TRUE(BitwiseEqual(inplace.data(), got.data(), n));
  }
}

// GeGLU (Gemma) at every level: against the reference and the formula in double (saturated
// regions included), in place, and each element the same wherever it sits in the array.
TEST_P(IsaTest, GeluTanhMulMatchesReferenceAndFormula) {
  for (int64_t n : kLengths) {
    std::vector<float> g = Random(n, 70 + n, 3.0f), u = Random(n, 71 + n);
    if (n > 4) {
      g[0] = -100.0f;
      g[1] = 100.0f;
      g[2] = -9.0f;
      g[3] = 0.0f;
    }
    std::vector<float> got(g.size()), want(g.size());
    GeluTanhMul(g.data(), u.data(), n, got.data());
    reference::GeluTanhMul(g.data(), u.data(), n, want.data());
    for (int64_t i = 0; i < n; ++i) {
      const double x = g[i];
      const double ref =
          0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x))) * u[i];
      ASSERT_NEAR(got[i], ref, 2e-6 * (std::fabs(ref) + std::fabs(u[i]))) << n << " " << i;
      ASSERT_NEAR(want[i], ref, 2e-6 * (std::fabs(ref) + std::fabs(u[i]))) << n << " " << i;
    }
    std::vector<float> inplace = g;
    GeluTanhMul(inplace.data(), u.data(), n, inplace.data());
    EXPECT_TRUE(BitwiseEqual(inplace.data(), got.data(), n));
  }
  const int64_t n = 37, m = 5;
  std::vector<float> g = Random(m * n, 5, 3.0f), u = Random(m * n, 6);
  std::vector<float> all(g.size()), one(static_cast<size_t>(n));
  GeluTanhMul(g.data(), u.data(), m * n, all.data());
  for (int64_t r = 0; r < m; ++r) {
    GeluTanhMul(g.data() + r * n, u.data() + r * n, n, one.data());
    EXPECT_TRUE(BitwiseEqual(one.data(), all.data() + r * n, n)) << r;
  }
}

// The forward pass calls SiluMul once over [n_rows × n_ff]; each element must come out the same
// as in a call on its own row (no scalar tail path with different rounding).
TEST_P(IsaTest, SiluMulIsPositionInvariant) {
  const int64_t n = 37, m = 5;
  std::vector<float> g = Random(m * n, 3, 3.0f), u = Random(m * n, 4);
  std::vector<float> all(g.size()), one(static_cast<size_t>(n));
  SiluMul(g.data(), u.data(), m * n, all.data());
  for (int64_t r = 0; r < m; ++r) {
    SiluMul(g.data() + r * n, u.data() + r * n, n, one.data());
    EXPECT_TRUE(BitwiseEqual(one.data(), all.data() + r * n, n)) << r;
  }
}

TEST_P(IsaTest, SoftmaxMatchesReference) {
  for (int64_t n : kLengths) {
    std::vector<float> x = Random(n, 30 + n, 5.0f);
    std::vector<float> got = x, want = x;
    Softmax(got.data(), n);
    reference::Softmax(want.data(), n);
    ExpectClose(got, want, 1e-5, 1e-12, "softmax n=" + std::to_string(n));
    double sum = 0;
    for (float p : got) sum += p;
    EXPECT_NEAR(sum, 1.0, 1e-5) << n;
  }
}

TEST_P(IsaTest, SoftmaxMaskedAndExtremeValues) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> x = {-inf, 1000.0f, -inf, 999.0f, -1000.0f, -inf, -inf, -inf, -inf, 1000.0f};
  Softmax(x.data(), static_cast<int64_t>(x.size()));
  const double e = std::exp(-1.0), z = 2.0 + e;
  EXPECT_EQ(x[0], 0.0f);
  EXPECT_EQ(x[2], 0.0f);
  EXPECT_EQ(x[4], 0.0f);  // e^-2000 underflows
  EXPECT_EQ(x[8], 0.0f);
  EXPECT_NEAR(x[1], 1.0 / z, 1e-6);
  EXPECT_NEAR(x[3], e / z, 1e-6);
  EXPECT_NEAR(x[9], 1.0 / z, 1e-6);
  std::vector<float> one = {-3.5f};
  Softmax(one.data(), 1);
  EXPECT_EQ(one[0], 1.0f);
}

TEST_P(IsaTest, AddIsExact) {
  for (int64_t n : kLengths) {
    std::vector<float> y = Random(n, 40 + n), x = Random(n, 50 + n);
    std::vector<float> want = y;
    for (int64_t i = 0; i < n; ++i) want[i] += x[i];
    Add(y.data(), x.data(), n);
    EXPECT_TRUE(BitwiseEqual(y.data(), want.data(), n)) << n;
  }
}

// Rope against the rotation written out with double-precision cos/sin.
TEST_P(IsaTest, RopeMatchesDirectFormulaBothLayouts) {
  for (int64_t head_dim : {2, 6, 16, 34, 64, 128}) {
    const int64_t n_heads = 3, half = head_dim / 2;
    std::vector<float> inv_freq(static_cast<size_t>(half));
    for (int64_t i = 0; i < half; ++i) inv_freq[i] = std::pow(10000.0f, -2.0f * i / head_dim);
    for (int64_t pos : {0, 1, 17, 4095, 100000}) {
      for (RopeLayout layout : {RopeLayout::kInterleaved, RopeLayout::kHalf}) {
        std::vector<float> x = Random(n_heads * head_dim, 60 + head_dim + pos);
        std::vector<float> got = x, ref = x;
        Rope(got.data(), n_heads, head_dim, pos, inv_freq.data(), layout);
        reference::Rope(ref.data(), n_heads, head_dim, pos, inv_freq.data(), layout);
        for (int64_t h = 0; h < n_heads; ++h) {
          for (int64_t i = 0; i < half; ++i) {
            const int64_t ia = layout == RopeLayout::kInterleaved ? 2 * i : i;
            const int64_t ib = layout == RopeLayout::kInterleaved ? 2 * i + 1 : i + half;
            const double th = double(pos) * inv_freq[i];
            const double a = x[h * head_dim + ia], b = x[h * head_dim + ib];
            const double wa = a * std::cos(th) - b * std::sin(th);
            const double wb = a * std::sin(th) + b * std::cos(th);
            ASSERT_NEAR(got[h * head_dim + ia], wa, 1e-6 * (std::fabs(a) + std::fabs(b)) + 1e-7)
                << "hd=" << head_dim << " pos=" << pos << " h=" << h << " i=" << i;
            ASSERT_NEAR(got[h * head_dim + ib], wb, 1e-6 * (std::fabs(a) + std::fabs(b)) + 1e-7);
          }
        }
        ExpectClose(got, ref, 1e-6, 1e-6, "rope vs reference");
        // The table form gives the same bits.
        std::vector<float> cos_t(static_cast<size_t>(half)), sin_t(static_cast<size_t>(half));
        std::vector<float> tab = x;
        RopeTable(pos, inv_freq.data(), half, cos_t.data(), sin_t.data());
        RopeApply(tab.data(), n_heads, head_dim, cos_t.data(), sin_t.data(), layout);
        EXPECT_TRUE(BitwiseEqual(tab.data(), got.data(), n_heads * head_dim));
      }
    }
  }
}

// A head stored in "half" order becomes "interleaved" order under the permutation
// P: half index i → 2i, half index i + hd/2 → 2i + 1; rotating commutes with P.
TEST_P(IsaTest, RopeLayoutsRelatedByPermutation) {
  for (int64_t head_dim : {2, 10, 64, 128}) {
    const int64_t n_heads = 4, half = head_dim / 2;
    std::vector<float> inv_freq(static_cast<size_t>(half));
    for (int64_t i = 0; i < half; ++i) inv_freq[i] = std::pow(500000.0f, -2.0f * i / head_dim);
    std::vector<float> xh = Random(n_heads * head_dim, 70 + head_dim);
    std::vector<float> xi(xh.size());
    auto permute = [&](const std::vector<float>& src, std::vector<float>& dst) {
      for (int64_t h = 0; h < n_heads; ++h) {
        for (int64_t i = 0; i < half; ++i) {
          dst[h * head_dim + 2 * i] = src[h * head_dim + i];
          dst[h * head_dim + 2 * i + 1] = src[h * head_dim + i + half];
        }
      }
    };
    permute(xh, xi);
    Rope(xh.data(), n_heads, head_dim, 1234, inv_freq.data(), RopeLayout::kHalf);
    Rope(xi.data(), n_heads, head_dim, 1234, inv_freq.data(), RopeLayout::kInterleaved);
    std::vector<float> permuted(xh.size());
    permute(xh, permuted);
    EXPECT_TRUE(BitwiseEqual(permuted.data(), xi.data(), n_heads * head_dim)) << head_dim;
  }
}

// AddInt8RowDots / AddF32RowDots (an output-head delta): within reassociation of the
// sequential reference, and batch invariant — an input's results are bitwise the same alone as
// among six inputs, and whatever split of the rows the calls cover (threads split the vocabulary).
TEST_P(IsaTest, RowDotsMatchReferenceAndAreBatchInvariant) {
  for (int64_t cols : {1, 7, 8, 9, 15, 16, 17, 33, 64, 100, 2048}) {
    const int64_t rows = 13, n = 6;
    Rng rng(static_cast<uint64_t>(cols));
    std::vector<int8_t> q(static_cast<size_t>(rows * cols));
    for (auto& v : q) v = static_cast<int8_t>(static_cast<int>(rng.NextU64() % 255) - 127);
    std::vector<float> scales = Random(rows, 3 + cols, 1e-2f);
    const std::vector<float> w = Random(rows * cols, 5 + cols);
    const std::vector<float> x = Random(n * cols, 7 + cols);
    const std::vector<float> y0 = Random(n * rows, 9 + cols);
    for (bool int8 : {true, false}) {
      auto run = [&](int64_t r0, int64_t nr, int64_t j0, int64_t nj, float* y, bool ref) {
        const float* xj = x.data() + j0 * cols;
        float* yj = y + j0 * rows + r0;
        if (int8) {
          (ref ? reference::AddInt8RowDots : AddInt8RowDots)(
              q.data() + r0 * cols, scales.data() + r0, nr, cols, xj, cols, nj, yj, rows);
        } else {
          (ref ? reference::AddF32RowDots : AddF32RowDots)(w.data() + r0 * cols, nr, cols, xj, cols,
                                                           nj, yj, rows);
        }
      };
      std::vector<float> want = y0, got = y0;
      run(0, rows, 0, n, want.data(), true);
      run(0, rows, 0, n, got.data(), false);
      for (int64_t j = 0; j < n; ++j) {
        for (int64_t r = 0; r < rows; ++r) {
          double mag = 0;  // Σ |x·w| of the dot: the scale of its rounding
          for (int64_t k = 0; k < cols; ++k) {
            const double wk = int8 ? q[static_cast<size_t>(r * cols + k)] *
                                         static_cast<double>(scales[static_cast<size_t>(r)])
                                   : w[static_cast<size_t>(r * cols + k)];
            mag += std::fabs(x[static_cast<size_t>(j * cols + k)] * wk);
          }
          const size_t i = static_cast<size_t>(j * rows + r);
          ASSERT_NEAR(got[i], want[i], 1e-5 * mag + 1e-6 * std::fabs(y0[i]))
              << (int8 ? "int8" : "f32") << " cols " << cols << " input " << j << " row " << r;
        }
      }
      // Each input alone, over rows [0, 5) and [5, rows) in two calls: the same bits.
      for (int64_t j = 0; j < n; ++j) {
        std::vector<float> alone = y0;
        run(0, 5, j, 1, alone.data(), false);
        run(5, rows - 5, j, 1, alone.data(), false);
        EXPECT_TRUE(BitwiseEqual(alone.data() + j * rows, got.data() + j * rows, rows))
            << (int8 ? "int8" : "f32") << " cols " << cols << " input " << j;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Levels, IsaTest,
                         ::testing::Values(IsaLevel::kScalar, IsaLevel::kAvx2, IsaLevel::kAvx512,
                                           IsaLevel::kAmx),
                         [](const ::testing::TestParamInfo<IsaLevel>& info) {
                           return IsaName(info.param);
                         });

// The vector exp used by Softmax, SiluMul and attention, measured directly against double.
template <typename Fn>
void CheckExp(Fn exp_shift_sum, bool denormals_kept) {
  std::vector<float> x;
  for (double v = -87.0; v <= 88.3; v += 0.01) x.push_back(static_cast<float>(v));
  for (float v : {0.0f, -0.0f, 1e-8f, -1e-8f, 0.34657f, -0.34657f}) x.push_back(v);
  std::vector<float> y = x;
  exp_shift_sum(y.data(), static_cast<int64_t>(y.size()), 0.0f);
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double want = std::exp(double(x[i]));
    worst = std::max(worst, std::fabs(y[i] - want) / want);
  }
  EXPECT_LT(worst, 2.5e-7) << "max relative error of exp";  // ~2 ulp
  // The shift and the returned sum (softmax-style use), over lengths with masked tails.
  for (int64_t n : {1, 5, 8, 13, 16, 29}) {
    std::vector<float> s(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) s[i] = 3.0f - 0.7f * static_cast<float>(i);
    const std::vector<float> in = s;
    const float sum = exp_shift_sum(s.data(), n, 3.0f);
    double want_sum = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double want = std::exp(double(in[i] - 3.0f));
      want_sum += want;
      EXPECT_NEAR(s[i], want, want * 2.5e-7) << n << " " << i;
    }
    EXPECT_NEAR(sum, want_sum, want_sum * 1e-6) << n;
  }
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> special = {-inf, inf, std::nanf(""), -200.0f, 200.0f, -100.0f};
  exp_shift_sum(special.data(), static_cast<int64_t>(special.size()), 0.0f);
  EXPECT_EQ(special[0], 0.0f);
  EXPECT_EQ(special[1], inf);
  EXPECT_TRUE(std::isnan(special[2]));
  EXPECT_EQ(special[3], 0.0f);
  EXPECT_EQ(special[4], inf);
  if (denormals_kept) {
    EXPECT_NEAR(special[5], std::exp(-100.0), 1e-45);
  } else {
    EXPECT_EQ(special[5], 0.0f);
  }
}

TEST(VectorExp, Avx2Accuracy) {
  if (!Supported(IsaLevel::kAvx2)) GTEST_SKIP();
  CheckExp(avx2::ExpShiftSum, /*denormals_kept=*/false);
}

TEST(VectorExp, Avx512Accuracy) {
  if (!Supported(IsaLevel::kAvx512)) GTEST_SKIP();
  CheckExp(avx512::ExpShiftSum, /*denormals_kept=*/true);
}

}  // namespace
}  // namespace chorus::kernels
