// test-labels: kernel concurrency
// Differential tests of every MatMul variant the machine supports against the scalar
// reference, plus independent oracles for the reference itself, batch invariance and Pack()
// validation.
#include "chorus/kernels/matmul.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "chorus/kernels/dispatch.h"
#include "chorus/kernels/matmul_internal.h"

namespace chorus::kernels {
namespace {

const DType kAllTypes[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_0};

std::vector<IsaLevel> SupportedLevels() {
  SetMaxIsa(kMaxIsaLevel);
  const IsaLevel best = ActiveIsa();
  std::vector<IsaLevel> out;
  for (int l = 0; l <= static_cast<int>(best); ++l) out.push_back(static_cast<IsaLevel>(l));
  return out;
}

// Restores the best ISA level when a test ends, whatever happens inside it.
struct IsaGuard {
  ~IsaGuard() { SetMaxIsa(kMaxIsaLevel); }
};

std::vector<float> RandomVec(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

PackedWeight MakeWeight(DType dt, int64_t n, int64_t k, uint32_t seed) {
  Tensor t = Tensor::FromF32(RandomVec(static_cast<size_t>(n * k), seed, 0.5f), dt, {n, k});
  auto pw = PackedWeight::Pack(t);
  CHORUS_CHECK(pw.ok()) << pw.status().ToString();
  return std::move(pw).value();
}

bool IsQuant(DType dt) { return dt == DType::kQ8_0 || dt == DType::kQ4_0; }

// Σ_e |x_e · w_e| for every output: the scale the float rounding error is relative to.
std::vector<double> AbsScale(const PackedWeight& w, const float* x, int64_t x_stride, int64_t m) {
  const std::vector<float> wf = w.source().ToF32();
  const int64_t n = w.n(), k = w.k();
  std::vector<double> s(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double a = 0;
      for (int64_t e = 0; e < k; ++e) a += std::fabs(double(x[i * x_stride + e]) * wf[j * k + e]);
      s[i * n + j] = a;
    }
  return s;
}

struct Shape {
  int64_t m, k, n;
};

std::string Name(DType dt, IsaLevel l, const Shape& s, int threads) {
  return std::string(DTypeName(dt)) + " " + IsaName(l) + " m=" + std::to_string(s.m) +
         " k=" + std::to_string(s.k) + " n=" + std::to_string(s.n) +
         " threads=" + std::to_string(threads);
}

// Compares MatMul (every ISA level, 1 and 2 threads, strided, accumulate on/off) with the
// reference: bit-exact for q8_0/q4_0, within 1e-5 of Σ|x·w| for float weights.
void CheckShape(DType dt, const Shape& s, ThreadPool* pool1, ThreadPool* pool2) {
  IsaGuard guard;
  const int64_t x_stride = s.k + 3, y_stride = s.n + 5;
  const PackedWeight w = MakeWeight(dt, s.n, s.k, static_cast<uint32_t>(s.m * 7 + s.k * 13 + s.n));
  const std::vector<float> x = RandomVec(static_cast<size_t>(s.m * x_stride), 99 + s.k);
  const std::vector<float> y0 = RandomVec(static_cast<size_t>(s.m * y_stride), 5);
  std::vector<double> scale;
  if (!IsQuant(dt)) {
    std::vector<float> xr(x);
    if (dt == DType::kBF16)
      for (auto& v : xr) v = BF16ToF32(F32ToBF16(v));
    scale = AbsScale(w, xr.data(), x_stride, s.m);
  }
  for (bool accumulate : {false, true}) {
    std::vector<float> ref(y0);
    reference::MatMul(w, x.data(), x_stride, s.m, ref.data(), y_stride, accumulate);
    for (IsaLevel level : SupportedLevels()) {
      SetMaxIsa(level);
      for (ThreadPool* pool : {pool1, pool2}) {
        std::vector<float> got(y0);
        MatMul(w, x.data(), x_stride, s.m, got.data(), y_stride, accumulate, pool);
        const std::string name = Name(dt, level, s, pool->size()) + (accumulate ? " acc" : "");
        int bad = 0;
        for (int64_t i = 0; i < s.m && bad < 5; ++i) {
          for (int64_t j = 0; j < y_stride && bad < 5; ++j) {
            const float g = got[i * y_stride + j], r = ref[i * y_stride + j];
            if (j >= s.n) {  // padding between rows must be untouched
              if (std::memcmp(&g, &y0[i * y_stride + j], 4) != 0) {
                ADD_FAILURE() << name << " wrote padding at row " << i << " col " << j;
                ++bad;
              }
              continue;
            }
            if (IsQuant(dt)) {
              if (std::memcmp(&g, &r, 4) != 0) {
                ADD_FAILURE() << name << " y[" << i << "," << j << "] = " << g << " ref " << r;
                ++bad;
              }
            } else {
              const double tol = 1e-5 * scale[i * s.n + j] + 1e-30;
              const double base = accumulate ? y0[i * y_stride + j] : 0.0;
              // Accumulation adds one rounding of |y0 + acc|.
              const double tol_acc = tol + (accumulate ? 1.2e-7 * std::fabs(base + r) : 0.0);
              if (!(std::fabs(double(g) - r) <= tol_acc)) {
                ADD_FAILURE() << name << " y[" << i << "," << j << "] = " << g << " ref " << r
                              << " tol " << tol_acc;
                ++bad;
              }
            }
          }
        }
      }
    }
  }
}

TEST(MatMulLevels, ReportsLevelsUnderTest) {
  std::string levels;
  for (IsaLevel l : SupportedLevels()) levels += IsaName(l) + " ";
  // Visible in the log: a machine without AVX-512 does not exercise the AVX-512 kernels.
  std::printf("MatMul kernels tested at ISA levels: %s(cpu: %s)\n", levels.c_str(),
              CpuFeaturesString().c_str());
  EXPECT_FALSE(levels.empty());
}

class MatMulTest : public ::testing::Test {
 protected:
  ThreadPool pool1_{1};
  ThreadPool pool2_{2};
};

TEST_F(MatMulTest, QuantizedMatchReferenceBitExact) {
  // n past one 64-column panel and not a multiple of it (80, 130, 200) checks the padded last
  // panel and the vectors inside a panel.
  const Shape shapes[] = {{1, 32, 1},    {3, 96, 5},    {8, 96, 17},     {64, 32, 17}, {1, 4096, 5},
                          {3, 4096, 17}, {8, 96, 4096}, {1, 4096, 1024}, {64, 96, 64}, {5, 64, 33},
                          {33, 32, 48},  {2, 64, 80},   {1, 128, 200},   {40, 64, 130}};
  for (DType dt : {DType::kQ8_0, DType::kQ4_0})
    for (const Shape& s : shapes) CheckShape(dt, s, &pool1_, &pool2_);
}

TEST_F(MatMulTest, FloatMatchReferenceWithinTolerance) {
  const Shape shapes[] = {{1, 1, 1},     {3, 7, 5},      {8, 33, 17},  {64, 32, 17}, {1, 96, 4096},
                          {3, 4096, 17}, {8, 4096, 64},  {64, 33, 40}, {5, 1, 33},   {2, 15, 9},
                          {4, 47, 19},   {1, 4096, 256}, {7, 33, 130}, {13, 1, 65},  {12, 64, 200}};
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16})
    for (const Shape& s : shapes) CheckShape(dt, s, &pool1_, &pool2_);
}

// Row i of y must be bitwise the same alone, inside 8 rows, inside 33 rows, on 1 or 2 threads.
TEST_F(MatMulTest, BatchInvariance) {
  IsaGuard guard;
  for (DType dt : kAllTypes) {
    const int64_t k = IsQuant(dt) ? 96 : 33, n = 37, rows = 33;
    const PackedWeight w = MakeWeight(dt, n, k, 1234);
    const std::vector<float> x = RandomVec(static_cast<size_t>(rows * k), 77);
    for (IsaLevel level : SupportedLevels()) {
      SetMaxIsa(level);
      std::vector<float> all(rows * n), all2(rows * n);
      MatMul(w, x.data(), k, rows, all.data(), n, false, &pool1_);
      MatMul(w, x.data(), k, rows, all2.data(), n, false, &pool2_);
      EXPECT_EQ(0, std::memcmp(all.data(), all2.data(), all.size() * 4))
          << DTypeName(dt) << " " << IsaName(level) << ": 1 vs 2 threads";
      for (int64_t i : {0, 3, 5, 17, 32}) {
        std::vector<float> alone(n);
        MatMul(w, x.data() + i * k, k, 1, alone.data(), n, false, &pool2_);
        EXPECT_EQ(0, std::memcmp(alone.data(), all.data() + i * n, n * 4))
            << DTypeName(dt) << " " << IsaName(level) << ": row " << i << " alone vs in 33";
        const int64_t start = std::min<int64_t>(std::max<int64_t>(0, i - 3), rows - 8);
        std::vector<float> eight(8 * n);
        MatMul(w, x.data() + start * k, k, 8, eight.data(), n, false, &pool1_);
        EXPECT_EQ(0, std::memcmp(eight.data() + (i - start) * n, all.data() + i * n, n * 4))
            << DTypeName(dt) << " " << IsaName(level) << ": row " << i << " in 8 vs in 33";
      }
    }
  }
}

// MatMulMulti (q/k/v-style fused outputs sharing one input) gives every output exactly what
// MatMul gives it alone, for every dtype, level, thread count and both activation-conversion
// paths (m ≤ 32: per thread; m > 32: split rows), and writes nothing outside its outputs.
// A step of more than 512 rows runs in blocks of rows (kMatMulRowBlock): its rows are those of
// one row alone, for every dtype and level, with accumulate and strided outputs.
TEST_F(MatMulTest, StepsBeyondOneRowBlockEqualRowsAlone) {
  IsaGuard guard;
  for (DType dt : kAllTypes) {
    const int64_t k = IsQuant(dt) ? 64 : 19, n = 21, rows = 1100, ys = n + 3;
    const PackedWeight w = MakeWeight(dt, n, k, 99);
    const std::vector<float> x = RandomVec(static_cast<size_t>(rows * k), 5);
    const std::vector<float> y0 = RandomVec(static_cast<size_t>(rows * ys), 6);
    for (IsaLevel level : SupportedLevels()) {
      SetMaxIsa(level);
      std::vector<float> all = y0;
      MatMul(w, x.data(), k, rows, all.data(), ys, /*accumulate=*/true, &pool2_);
      for (int64_t i : {int64_t{0}, int64_t{511}, int64_t{512}, int64_t{1023}, int64_t{1099}}) {
        std::vector<float> alone(y0.begin() + i * ys, y0.begin() + i * ys + n);
        MatMul(w, x.data() + i * k, k, 1, alone.data(), n, true, &pool2_);
        EXPECT_EQ(0, std::memcmp(alone.data(), all.data() + i * ys, n * 4))
            << DTypeName(dt) << " " << IsaName(level) << ": row " << i;
      }
    }
  }
}

TEST_F(MatMulTest, MultiEqualsSeparateBitwise) {
  IsaGuard guard;
  for (DType dt : kAllTypes) {
    const int64_t k = IsQuant(dt) ? 128 : 45;
    const int64_t ns[] = {200, 64, 17};
    std::vector<PackedWeight> ws;
    for (int j = 0; j < 3; ++j) ws.push_back(MakeWeight(dt, ns[j], k, 40 + j));
    for (int64_t m : {1, 5, 40}) {
      const int64_t x_stride = k + 1;
      const std::vector<float> x = RandomVec(static_cast<size_t>(m * x_stride), 8);
      for (IsaLevel level : SupportedLevels()) {
        SetMaxIsa(level);
        for (ThreadPool* pool : {&pool1_, &pool2_}) {
          for (bool accumulate : {false, true}) {
            std::vector<std::vector<float>> sep, got;
            std::vector<MatMulOut> outs;
            for (int j = 0; j < 3; ++j) {
              const int64_t y_stride = ns[j] + 2;
              sep.push_back(RandomVec(static_cast<size_t>(m * y_stride), 60 + j));
              got.push_back(sep.back());
              MatMul(ws[j], x.data(), x_stride, m, sep[j].data(), y_stride, accumulate, pool);
            }
            for (int j = 0; j < 3; ++j) outs.push_back({&ws[j], got[j].data(), ns[j] + 2});
            MatMulMulti(outs, x.data(), x_stride, m, accumulate, pool);
            for (int j = 0; j < 3; ++j) {
              EXPECT_EQ(0, std::memcmp(sep[j].data(), got[j].data(), sep[j].size() * 4))
                  << DTypeName(dt) << " " << IsaName(level) << " m=" << m << " output " << j
                  << " threads=" << pool->size() << (accumulate ? " acc" : "");
            }
          }
        }
      }
    }
  }
}

// The AMX tile GEMM itself (AmxTileQPanels, at every row count, including the 1..11 rows that
// MatMul gives the VNNI kernel) equals the AVX-512 VNNI kernel and the scalar reference bit for
// bit: odd block counts (k/32 = 1, 3, 5, 7: the four-block groups' tail), ragged 16-row tiles,
// a ragged last panel and column vector, strided x and y, accumulate on and off, 1 and 2
// threads.
TEST_F(MatMulTest, AmxTilesEqualVnniAndReferenceBitwise) {
  if (BestIsa() != IsaLevel::kAmx) {
    GTEST_SKIP() << "no amx level on this host: " << AmxUnavailableReason();
  }
  internal::IsaKernels tiles = internal::AmxKernels();
  tiles.q_panels = internal::AmxTileQPanels;
  const Shape shapes[] = {{1, 32, 1},    {2, 96, 17},   {3, 160, 64},  {5, 224, 65},
                          {15, 32, 130}, {16, 256, 48}, {17, 96, 200}, {31, 2048, 70},
                          {33, 160, 16}, {47, 64, 129}, {64, 288, 64}, {100, 544, 190}};
  for (DType dt : {DType::kQ8_0, DType::kQ4_0}) {
    for (const Shape& s : shapes) {
      const int64_t x_stride = s.k + 7, y_stride = s.n + 3;
      const PackedWeight w = MakeWeight(dt, s.n, s.k, static_cast<uint32_t>(s.m + 3 * s.k + s.n));
      const std::vector<float> x = RandomVec(static_cast<size_t>(s.m * x_stride), 17 + s.k);
      const std::vector<float> y0 = RandomVec(static_cast<size_t>(s.m * y_stride), 23);
      for (bool accumulate : {false, true}) {
        std::vector<float> ref(y0), vnni(y0);
        reference::MatMul(w, x.data(), x_stride, s.m, ref.data(), y_stride, accumulate);
        const MatMulOut vo{&w, vnni.data(), y_stride};
        internal::MatMulWithKernels(internal::Avx512Kernels(), {&vo, 1}, x.data(), x_stride, s.m,
                                    accumulate, &pool2_);
        ASSERT_EQ(0, std::memcmp(ref.data(), vnni.data(), ref.size() * 4));
        for (ThreadPool* pool : {&pool1_, &pool2_}) {
          std::vector<float> got(y0);
          const MatMulOut o{&w, got.data(), y_stride};
          internal::MatMulWithKernels(tiles, {&o, 1}, x.data(), x_stride, s.m, accumulate, pool);
          const std::string name =
              "amx tiles " + Name(dt, IsaLevel::kAmx, s, pool->size()) + (accumulate ? " acc" : "");
          int bad = 0;
          for (size_t i = 0; i < got.size() && bad < 5; ++i) {
            if (std::memcmp(&got[i], &ref[i], 4) != 0) {
              ADD_FAILURE() << name << " y[" << i / y_stride << "," << i % y_stride
                            << "] = " << got[i] << " ref " << ref[i];
              ++bad;
            }
          }
        }
      }
    }
  }
}

// A contract violation (weights of different k fused) stops the process with a clear message.
TEST(MatMulMultiDeathTest, RejectsMismatchedWeights) {
  const PackedWeight a = MakeWeight(DType::kQ8_0, 8, 64, 1), b = MakeWeight(DType::kQ8_0, 8, 96, 2);
  std::vector<float> x(96), ya(8), yb(8);
  const MatMulOut outs[] = {{&a, ya.data(), 8}, {&b, yb.data(), 8}};
  EXPECT_DEATH(MatMulMulti(outs, x.data(), 96, 1, false, nullptr), "differ in k or dtype");
}

// Independent oracle for the reference: integer-valued data that every format represents
// exactly, so y is exact too.
TEST_F(MatMulTest, ExactOnRepresentableData) {
  IsaGuard guard;
  const int64_t n = 19, k = 64, m = 3;
  std::vector<float> xv(m * k);
  // Weight blocks whose extreme value makes the block scale exactly 1: -8 for q4_0 (d = max/-8),
  // -127 for q8_0 (d = amax/127).
  auto weights = [&](DType dt) {
    std::vector<float> wv(n * k);
    for (int64_t j = 0; j < n; ++j)
      for (int64_t e = 0; e < k; ++e)
        wv[j * k + e] =
            (e % 32 == 0) ? (dt == DType::kQ8_0 ? -127.0f : -8.0f) : float((j + e) % 15 - 7);
    return wv;
  };
  // Activation blocks with amax 127 quantize exactly (d = 1).
  for (int64_t i = 0; i < m; ++i)
    for (int64_t e = 0; e < k; ++e)
      xv[i * k + e] = (e % 32 == 5) ? 127.0f : float((i * 5 + e) % 41 - 20);
  for (DType dt : kAllTypes) {
    const std::vector<float> wv = weights(dt);
    std::vector<double> want(m * n);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double a = 0;
        for (int64_t e = 0; e < k; ++e) a += double(xv[i * k + e]) * wv[j * k + e];
        want[i * n + j] = a;
      }
    auto pw = PackedWeight::Pack(Tensor::FromF32(wv, dt, {n, k}));
    ASSERT_TRUE(pw.ok()) << pw.status().ToString();
    std::vector<float> y(m * n);
    reference::MatMul(*pw, xv.data(), k, m, y.data(), n, false);
    for (int64_t i = 0; i < m * n; ++i) ASSERT_EQ(want[i], y[i]) << DTypeName(dt) << " ref " << i;
    for (IsaLevel level : SupportedLevels()) {
      SetMaxIsa(level);
      std::fill(y.begin(), y.end(), 0.0f);
      MatMul(*pw, xv.data(), k, m, y.data(), n, false, &pool2_);
      for (int64_t i = 0; i < m * n; ++i)
        ASSERT_EQ(want[i], y[i]) << DTypeName(dt) << " " << IsaName(level) << " " << i;
    }
  }
}

// The quantized path is close to the exact product of the dequantized weights (the only extra
// error is the q8_0 quantization of the activations: ≤ d_x/2 per element).
TEST_F(MatMulTest, QuantizedCloseToDequantizedProduct) {
  const int64_t n = 40, k = 256, m = 4;
  const std::vector<float> x = RandomVec(m * k, 3);
  for (DType dt : {DType::kQ8_0, DType::kQ4_0}) {
    const PackedWeight w = MakeWeight(dt, n, k, 8);
    const std::vector<float> wf = w.source().ToF32();
    std::vector<float> y(m * n);
    MatMul(w, x.data(), k, m, y.data(), n, false, &pool2_);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double exact = 0, bound = 0;
        for (int64_t b = 0; b < k / 32; ++b) {
          float amax = 0;
          for (int e = 0; e < 32; ++e) amax = std::max(amax, std::fabs(x[i * k + b * 32 + e]));
          for (int e = 0; e < 32; ++e) {
            const int64_t idx = b * 32 + e;
            exact += double(x[i * k + idx]) * wf[j * k + idx];
            bound += std::fabs(wf[j * k + idx]) * (amax / 127.0) * 0.5;
          }
        }
        EXPECT_NEAR(y[i * n + j], exact, bound * 1.01 + 1e-4)
            << DTypeName(dt) << " " << i << "," << j;
      }
  }
}

TEST_F(MatMulTest, PackValidates) {
  EXPECT_FALSE(PackedWeight::Pack(Tensor()).ok());
  EXPECT_FALSE(PackedWeight::Pack(Tensor::Zeros(DType::kF32, {8})).ok());        // 1-D
  EXPECT_FALSE(PackedWeight::Pack(Tensor::Zeros(DType::kF32, {2, 3, 4})).ok());  // 3-D
  EXPECT_FALSE(PackedWeight::Pack(Tensor::Zeros(DType::kI32, {4, 4})).ok());     // dtype
  EXPECT_FALSE(PackedWeight::Pack(Tensor::Zeros(DType::kF32, {0, 4})).ok());     // empty
  // A q8_0 view with k % 32 != 0 (a malformed file could claim this): rejected before any read.
  std::vector<uint8_t> bytes(1024);
  for (DType dt : {DType::kQ8_0, DType::kQ4_0}) {
    TensorView v;
    v.dtype = dt;
    v.shape = {4, 48};
    v.data = bytes.data();
    auto r = PackedWeight::Pack(Tensor(v, nullptr));
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().ToString().find("32"), std::string::npos) << r.status().ToString();
  }
  auto ok = PackedWeight::Pack(Tensor::Zeros(DType::kQ4_0, {17, 64}));
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->n(), 17);
  EXPECT_EQ(ok->k(), 64);
  EXPECT_EQ(ok->dtype(), DType::kQ4_0);
  EXPECT_GT(ok->packed_bytes(), 0);
  // bf16 is repacked into k-pair panels only for the AVX-512 kernels.
  auto f = internal::PackForIsa(Tensor::Zeros(DType::kBF16, {17, 65}), IsaLevel::kAvx2);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->packed_bytes(), 0);
  auto fp = internal::PackForIsa(Tensor::Zeros(DType::kBF16, {17, 65}), IsaLevel::kAvx512);
  ASSERT_TRUE(fp.ok());
  EXPECT_EQ(fp->packed_bytes(), internal::Bf16PanelBytes(65));
}

TEST_F(MatMulTest, ZeroRowsIsANoOp) {
  const PackedWeight w = MakeWeight(DType::kQ8_0, 4, 32, 1);
  float y = 42.0f;
  MatMul(w, nullptr, 32, 0, &y, 4, false, &pool2_);
  EXPECT_EQ(y, 42.0f);
}

}  // namespace
}  // namespace chorus::kernels
