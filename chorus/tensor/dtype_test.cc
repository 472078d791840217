#include "chorus/tensor/dtype.h"

#include <cmath>
#include <vector>

#include "chorus/base/rng.h"
#include "chorus/tensor/tensor.h"
#include "tests/testutil/testutil.h"

namespace chorus {
namespace {

TEST(DTypeTest, F16RoundTripsExactValues) {
  for (float f : {0.0f, -0.0f, 1.0f, -2.5f, 65504.0f, 6.103515625e-05f, 5.960464477539063e-08f}) {
    EXPECT_EQ(F16ToF32(F32ToF16(f)), f) << f;
  }
  EXPECT_TRUE(std::isinf(F16ToF32(F32ToF16(1e6f))));
  EXPECT_TRUE(std::isnan(F16ToF32(F32ToF16(NAN))));
  // Every f16 bit pattern (but NaNs) survives f16 -> f32 -> f16.
  for (uint32_t h = 0; h < 65536; ++h) {
    if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) continue;
    EXPECT_EQ(F32ToF16(F16ToF32(static_cast<uint16_t>(h))), h) << h;
  }
}

TEST(DTypeTest, BF16RoundsToNearestEven) {
  EXPECT_EQ(BF16ToF32(F32ToBF16(1.0f)), 1.0f);
  EXPECT_EQ(F32ToBF16(1.00390625f), F32ToBF16(1.0f));  // tie -> even
  EXPECT_TRUE(std::isnan(BF16ToF32(F32ToBF16(NAN))));
}

TEST(DTypeTest, QuantizedRoundTripErrorIsBounded) {
  Rng rng(7);
  std::vector<float> x(256);
  for (auto& v : x) v = rng.NextGaussian();
  for (DType t : {DType::kQ8_0, DType::kQ4_0, DType::kBF16, DType::kF16}) {
    Tensor q = Tensor::FromF32(x, t, {2, 128});
    std::vector<float> y = q.ToF32();
    float max_err = 0, amax = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      max_err = std::max(max_err, std::fabs(x[i] - y[i]));
      amax = std::max(amax, std::fabs(x[i]));
    }
    float bound = t == DType::kQ4_0 ? amax / 7 : t == DType::kQ8_0 ? amax / 100 : amax / 100;
    EXPECT_LT(max_err, bound) << DTypeName(t);
  }
  EXPECT_EQ(DTypeBytes(DType::kQ4_0, 64), 36);
  EXPECT_EQ(DTypeBytes(DType::kQ8_0, 64), 68);
}

TEST(DTypeTest, ParseNames) {
  EXPECT_EQ(*ParseDType("Q4_0"), DType::kQ4_0);
  EXPECT_EQ(*ParseDType("q5_k"), DType::kQ5_K);
  EXPECT_EQ(*ParseDType("Q6_K"), DType::kQ6_K);
  EXPECT_FALSE(ParseDType("q5_1").ok());
  EXPECT_FALSE(ParseDType("q4_k_m").ok());  // a mix of types, not a dtype (model/quant_mix.h)
}

// Chorus's K quantizers: RMS error relative to the data's RMS for Gaussian rows, below bounds
// a few percent above what the formats reach (docs/kernels.md records the measured figures).
TEST(DTypeTest, KQuantRoundTripErrorIsBounded) {
  Rng rng(11);
  std::vector<float> x(16 * 256);
  for (auto& v : x) v = rng.NextGaussian();
  const struct {
    DType t;
    double max_rel_rmse;
    int64_t bytes_per_256;
  } cases[] = {{DType::kQ2_K, 0.40, 84},
               {DType::kQ3_K, 0.20, 110},
               {DType::kQ4_K, 0.10, 144},
               {DType::kQ5_K, 0.05, 176},
               {DType::kQ6_K, 0.025, 210}};
  for (const auto& c : cases) {
    Tensor q = Tensor::FromF32(x, c.t, {16, 256});
    EXPECT_EQ(q.view().NumBytes(), 16 * c.bytes_per_256) << DTypeName(c.t);
    std::vector<float> y = q.ToF32();
    double se = 0, sx = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      se += (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
      sx += double(x[i]) * x[i];
    }
    EXPECT_LT(std::sqrt(se / sx), c.max_rel_rmse) << DTypeName(c.t);
    // Quantizing the decoded values again is (nearly) lossless: the codes are reachable.
    std::vector<float> z = Tensor::FromF32(y, c.t, {16, 256}).ToF32();
    double se2 = 0;
    for (size_t i = 0; i < y.size(); ++i) se2 += (double(y[i]) - z[i]) * (double(y[i]) - z[i]);
    EXPECT_LT(std::sqrt(se2 / sx), c.max_rel_rmse / 4) << DTypeName(c.t);
  }
  EXPECT_EQ(DTypeBlockElems(DType::kQ4_K), 256);
  EXPECT_TRUE(DTypeIsKQuant(DType::kQ6_K));
  EXPECT_FALSE(DTypeIsKQuant(DType::kQ4_0));
}

}  // namespace
}  // namespace chorus
