// test-labels: kernel
// The training matrix kernels: MatMulTransposed against finite differences of the forward
// MatMul, the scalar reference, and every ISA level the machine has (bitwise: one fma chain per
// element in every variant), over every weight dtype and awkward shapes; AccumulateOuter
// likewise; thread counts never change a bit.
#include "chorus/train/grad_kernels.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "chorus/base/rng.h"
#include "chorus/kernels/dispatch.h"

namespace chorus::kernels {
void PrintTo(IsaLevel level, std::ostream* os) { *os << IsaName(level); }
}  // namespace chorus::kernels

namespace chorus::train {
namespace {

using kernels::IsaLevel;

std::vector<float> Random(int64_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = rng.NextGaussian();
  return v;
}

kernels::PackedWeight Weight(DType dt, int64_t n, int64_t k, uint64_t seed) {
  Tensor t = Tensor::FromF32(Random(n * k, seed), dt, {n, k});
  return *kernels::PackedWeight::Pack(t);
}

class IsaTest : public ::testing::TestWithParam<IsaLevel> {
 protected:
  void SetUp() override {
    kernels::SetMaxIsa(kernels::kMaxIsaLevel);
    if (static_cast<int>(kernels::ActiveIsa()) < static_cast<int>(GetParam())) {
      GTEST_SKIP() << kernels::IsaName(GetParam()) << " not supported here";
    }
    kernels::SetMaxIsa(GetParam());
  }
  void TearDown() override { kernels::SetMaxIsa(kernels::kMaxIsaLevel); }
};

struct Shape {
  int64_t m, n, k;
};
const Shape kShapes[] = {{1, 1, 32},   {3, 5, 64},     {4, 64, 96},
                         {7, 65, 160}, {13, 130, 288}, {5, 3, 1000}};

TEST_P(IsaTest, MatMulTransposedEqualsReferenceBitwise) {
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_0}) {
    for (const Shape& s : kShapes) {
      if (DTypeIsQuantized(dt) && s.k % 32 != 0) continue;
      const kernels::PackedWeight w = Weight(dt, s.n, s.k, 7 + s.n);
      const std::vector<float> dy = Random(s.m * s.n, 11 + s.m);
      for (bool acc : {false, true}) {
        std::vector<float> want = Random(s.m * s.k, 3), got = want, got3 = want;
        reference::MatMulTransposed(w, dy.data(), s.n, s.m, want.data(), s.k, acc);
        MatMulTransposed(w, dy.data(), s.n, s.m, got.data(), s.k, acc, nullptr);
        ThreadPool pool(3);
        MatMulTransposed(w, dy.data(), s.n, s.m, got3.data(), s.k, acc, &pool);
        ASSERT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * 4))
            << DTypeName(dt) << " " << s.m << "x" << s.n << "x" << s.k << " acc " << acc;
        ASSERT_EQ(0, std::memcmp(want.data(), got3.data(), want.size() * 4));
      }
    }
  }
}

TEST_P(IsaTest, AccumulateOuterEqualsReferenceBitwise) {
  for (const Shape& s : kShapes) {
    // a [t=m, p=min(n, 16)], b [t, q=k]
    const int64_t t = s.m + 2, p = std::min<int64_t>(s.n, 16), q = s.k;
    const std::vector<float> a = Random(t * p, 1), b = Random(t * q, 2);
    std::vector<float> want = Random(p * q, 3), got = want, got3 = want;
    reference::AccumulateOuter(a.data(), p, p, b.data(), q, q, t, want.data(), q);
    AccumulateOuter(a.data(), p, p, b.data(), q, q, t, got.data(), q, nullptr);
    ThreadPool pool(3);
    AccumulateOuter(a.data(), p, p, b.data(), q, q, t, got3.data(), q, &pool);
    ASSERT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * 4)) << p << "x" << q;
    ASSERT_EQ(0, std::memcmp(want.data(), got3.data(), want.size() * 4));
  }
}

INSTANTIATE_TEST_SUITE_P(Levels, IsaTest,
                         ::testing::Values(IsaLevel::kScalar, IsaLevel::kAvx2, IsaLevel::kAvx512,
                                           IsaLevel::kAmx),
                         [](const ::testing::TestParamInfo<IsaLevel>& info) {
                           return kernels::IsaName(info.param);
                         });

// dx = dy·W is the gradient of L(x) = Σ dy ∘ (x·Wᵀ): checked by central differences of the
// forward MatMul (f32 weights: the forward is exactly linear up to rounding).
TEST(MatMulTransposedTest, FiniteDifferencesOfTheForward) {
  const int64_t m = 3, n = 40, k = 48;
  const kernels::PackedWeight w = Weight(DType::kF32, n, k, 5);
  const std::vector<float> dy = Random(m * n, 6);
  std::vector<float> x = Random(m * k, 7), dx(static_cast<size_t>(m * k));
  MatMulTransposed(w, dy.data(), n, m, dx.data(), k, false, nullptr);
  auto loss = [&](const std::vector<float>& xs) {
    std::vector<float> y(static_cast<size_t>(m * n));
    kernels::reference::MatMul(w, xs.data(), k, m, y.data(), n, false);
    double s = 0;
    for (size_t i = 0; i < y.size(); ++i) s += static_cast<double>(y[i]) * dy[i];
    return s;
  };
  const float h = 1e-2f;
  for (int64_t i = 0; i < m * k; i += 5) {
    std::vector<float> xp = x, xm = x;
    xp[static_cast<size_t>(i)] += h;
    xm[static_cast<size_t>(i)] -= h;
    const double fd = (loss(xp) - loss(xm)) / (2.0 * h);
    EXPECT_NEAR(fd, dx[static_cast<size_t>(i)], 2e-3 * (1.0 + std::fabs(fd))) << i;
  }
}

// The quantized path reads the stored blocks: its result equals the f32 path over the
// dequantized matrix (a dense copy made here only as the oracle).
TEST(MatMulTransposedTest, QuantizedEqualsDequantizedF32) {
  const int64_t m = 5, n = 70, k = 128;
  for (DType dt : {DType::kQ8_0, DType::kQ4_0, DType::kBF16, DType::kF16}) {
    const kernels::PackedWeight wq = Weight(dt, n, k, 9);
    const kernels::PackedWeight wf =
        *kernels::PackedWeight::Pack(Tensor::FromF32(wq.source().ToF32(), DType::kF32, {n, k}));
    const std::vector<float> dy = Random(m * n, 10);
    std::vector<float> a(static_cast<size_t>(m * k)), b(a.size());
    MatMulTransposed(wq, dy.data(), n, m, a.data(), k, false, nullptr);
    MatMulTransposed(wf, dy.data(), n, m, b.data(), k, false, nullptr);
    ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4)) << DTypeName(dt);
  }
}

// g += aᵀ·b is the gradient of L(g0) = ... checked directly against a double-precision sum.
TEST(AccumulateOuterTest, MatchesDoubleSum) {
  const int64_t t = 33, p = 5, q = 70;
  const std::vector<float> a = Random(t * p, 1), b = Random(t * q, 2);
  std::vector<float> g(static_cast<size_t>(p * q), 0.5f);
  AccumulateOuter(a.data(), p, p, b.data(), q, q, t, g.data(), q, nullptr);
  for (int64_t i = 0; i < p; ++i) {
    for (int64_t j = 0; j < q; ++j) {
      double s = 0.5;
      for (int64_t r = 0; r < t; ++r) s += static_cast<double>(a[r * p + i]) * b[r * q + j];
      EXPECT_NEAR(g[static_cast<size_t>(i * q + j)], s, 1e-4 * (1 + std::fabs(s)));
    }
  }
}

}  // namespace
}  // namespace chorus::train
