// test-labels: kernel
// K-quant (q2_k..q6_k) MatMul: every ISA level the machine has against the scalar reference, bit
// for bit (odd shapes, 1..100 rows, strided, accumulate, 1 and 2 threads); the reference against
// an independent double-precision oracle on the dequantized weights; batch invariance; the
// activation quantizers of each level against ReferenceQuantizeRowK; Pack() validation.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "chorus/kernels/dispatch.h"
#include "chorus/kernels/matmul.h"
#include "chorus/kernels/matmul_internal.h"

namespace chorus::kernels {
namespace {

const DType kKTypes[] = {DType::kQ4_K, DType::kQ6_K, DType::kQ5_K, DType::kQ3_K, DType::kQ2_K};

std::vector<IsaLevel> SupportedLevels() {
  SetMaxIsa(kMaxIsaLevel);
  const IsaLevel best = ActiveIsa();
  std::vector<IsaLevel> out;
  for (int l = 0; l <= static_cast<int>(best); ++l) out.push_back(static_cast<IsaLevel>(l));
  return out;
}

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

// Weights with a per-row offset and a few outliers, so that mins, negative scales (q3_k, q6_k)
// and large codes all occur.
PackedWeight MakeWeight(DType dt, int64_t n, int64_t k, uint32_t seed) {
  std::vector<float> v = RandomVec(static_cast<size_t>(n * k), seed, 0.5f);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t e = 0; e < k; ++e) {
      float& x = v[static_cast<size_t>(r * k + e)];
      x += 0.05f * static_cast<float>(r % 7 - 3);
      if ((r * 31 + e) % 97 == 0) x *= 6.0f;
    }
  Tensor t = Tensor::FromF32(v, dt, {n, k});
  auto pw = PackedWeight::Pack(t);
  CHORUS_CHECK(pw.ok()) << pw.status().ToString();
  return std::move(pw).value();
}

class MatMulKQuantTest : public ::testing::Test {
 protected:
  ThreadPool pool1_{1};
  ThreadPool pool2_{2};
};

struct Shape {
  int64_t m, k, n;
};

void CheckShape(DType dt, const Shape& s, ThreadPool* pool1, ThreadPool* pool2) {
  IsaGuard guard;
  const int64_t x_stride = s.k + 3, y_stride = s.n + 5;
  const PackedWeight w = MakeWeight(dt, s.n, s.k, static_cast<uint32_t>(s.m * 7 + s.k + s.n));
  const std::vector<float> x = RandomVec(static_cast<size_t>(s.m * x_stride), 99 + s.n);
  const std::vector<float> y0 = RandomVec(static_cast<size_t>(s.m * y_stride), 5);
  for (bool accumulate : {false, true}) {
    std::vector<float> ref(y0);
    reference::MatMul(w, x.data(), x_stride, s.m, ref.data(), y_stride, accumulate);
    for (IsaLevel level : SupportedLevels()) {
      SetMaxIsa(level);
      for (ThreadPool* pool : {pool1, pool2}) {
        std::vector<float> got(y0);
        MatMul(w, x.data(), x_stride, s.m, got.data(), y_stride, accumulate, pool);
        const std::string name =
            std::string(DTypeName(dt)) + " " + IsaName(level) + " m=" + std::to_string(s.m) +
            " k=" + std::to_string(s.k) + " n=" + std::to_string(s.n) +
            " threads=" + std::to_string(pool->size()) + (accumulate ? " acc" : "");
        int bad = 0;
        for (int64_t i = 0; i < s.m && bad < 5; ++i)
          for (int64_t j = 0; j < y_stride && bad < 5; ++j) {
            const float g = got[i * y_stride + j];
            const float r = j < s.n ? ref[i * y_stride + j] : y0[i * y_stride + j];
            if (std::memcmp(&g, &r, 4) != 0) {
              ADD_FAILURE() << name << " y[" << i << "," << j << "] = " << g << " want " << r;
              ++bad;
            }
          }
      }
    }
  }
}

TEST_F(MatMulKQuantTest, EveryLevelMatchesReferenceBitExact) {
  // n past one 64-column panel and not a multiple of it checks the padded last panel and the
  // vectors inside a panel; m covers the row tiles and both activation-conversion paths.
  const Shape shapes[] = {{1, 256, 1},    {2, 256, 17},  {3, 512, 64},   {5, 768, 80},
                          {1, 1024, 130}, {17, 256, 33}, {33, 512, 100}, {100, 256, 70}};
  for (DType dt : kKTypes)
    for (const Shape& s : shapes) CheckShape(dt, s, &pool1_, &pool2_);
}

// One row runs the batch-1 path (ktile::RowPanels: whole panels in address order), not the
// register tiles: odd n (a part of a panel, one column, several panels), several super-blocks,
// strided and accumulating, 1 and 2 threads (a thread's run of panels starts mid-weight).
TEST_F(MatMulKQuantTest, OneRowMatchesReferenceBitExact) {
  const Shape shapes[] = {{1, 256, 1},  {1, 256, 63},   {1, 512, 64},   {1, 768, 65},
                          {1, 256, 17}, {1, 2048, 200}, {1, 1280, 257}, {1, 512, 448}};
  for (DType dt : kKTypes)
    for (const Shape& s : shapes) CheckShape(dt, s, &pool1_, &pool2_);
}

// Largest codes against the largest activations (±127 everywhere): the int16 partial sums of the
// AVX2 kernel are at their bound (random data never gets near it).
TEST_F(MatMulKQuantTest, ExtremeCodesMatchReference) {
  IsaGuard guard;
  const int64_t n = 70, k = 512, m = 3;
  for (DType dt : kKTypes) {
    const bool sym = dt == DType::kQ3_K || dt == DType::kQ6_K;
    std::vector<float> wv(n * k);
    for (int64_t r = 0; r < n; ++r)
      for (int64_t e = 0; e < k; ++e) {
        // Symmetric types: one −1 per 16 maps to the most negative code, the rest to the most
        // positive. Asymmetric: one 0 per 16 (the min), the rest the max code.
        const bool first = e % 16 == 0;
        float v = sym ? (first ? -1.0f : (dt == DType::kQ6_K ? 31.0f / 32.0f : 0.75f))
                      : (first ? 0.0f : 1.0f);
        if (r % 3 == 1) v = -v;
        wv[r * k + e] = v;
      }
    auto pw = PackedWeight::Pack(Tensor::FromF32(wv, dt, {n, k}));
    ASSERT_TRUE(pw.ok());
    std::vector<float> x(m * k);
    for (int64_t e = 0; e < k; ++e) {
      x[e] = 1.0f;
      x[k + e] = -1.0f;
      x[2 * k + e] = e % 2 ? 1.0f : -1.0f;
    }
    std::vector<float> ref(m * n);
    reference::MatMul(*pw, x.data(), k, m, ref.data(), n, false);
    for (IsaLevel level : SupportedLevels()) {
      SetMaxIsa(level);
      std::vector<float> got(m * n);
      MatMul(*pw, x.data(), k, m, got.data(), n, false, &pool2_);
      EXPECT_EQ(0, std::memcmp(got.data(), ref.data(), got.size() * 4))
          << DTypeName(dt) << " " << IsaName(level);
      // Each row alone: the one-row path at the same bounds.
      for (int64_t i = 0; i < m; ++i) {
        std::vector<float> one(n);
        MatMul(*pw, x.data() + i * k, k, 1, one.data(), n, false, &pool2_);
        EXPECT_EQ(0, std::memcmp(one.data(), ref.data() + i * n, n * 4))
            << DTypeName(dt) << " " << IsaName(level) << " row " << i << " alone";
      }
    }
  }
}

// The AMX tile kernel at any row count (the amx level itself uses it from 12 rows) against the
// reference, bit for bit.
TEST_F(MatMulKQuantTest, AmxTilesMatchReferenceBitExact) {
  if (BestIsa() != IsaLevel::kAmx) {
    GTEST_SKIP() << "no amx level on this host: " << AmxUnavailableReason();
  }
  internal::IsaKernels tiles = internal::AmxKernels();
  tiles.q_panels = internal::AmxTileQPanels;
  const Shape shapes[] = {{1, 256, 1},    {5, 512, 17},  {12, 256, 64},  {16, 768, 70},
                          {17, 256, 130}, {33, 512, 48}, {100, 256, 100}};
  for (DType dt : kKTypes) {
    for (const Shape& s : shapes) {
      const int64_t x_stride = s.k + 7, y_stride = s.n + 3;
      const PackedWeight w = MakeWeight(dt, s.n, s.k, static_cast<uint32_t>(s.m + s.k + s.n));
      const std::vector<float> x = RandomVec(static_cast<size_t>(s.m * x_stride), 17 + s.k);
      const std::vector<float> y0 = RandomVec(static_cast<size_t>(s.m * y_stride), 23);
      for (bool accumulate : {false, true}) {
        std::vector<float> ref(y0), got(y0);
        reference::MatMul(w, x.data(), x_stride, s.m, ref.data(), y_stride, accumulate);
        const MatMulOut o{&w, got.data(), y_stride};
        internal::MatMulWithKernels(tiles, {&o, 1}, x.data(), x_stride, s.m, accumulate, &pool2_);
        int bad = 0;
        for (size_t i = 0; i < got.size() && bad < 5; ++i) {
          if (std::memcmp(&got[i], &ref[i], 4) != 0) {
            ADD_FAILURE() << "amx " << DTypeName(dt) << " m=" << s.m << " k=" << s.k << " n=" << s.n
                          << " y[" << i / y_stride << "," << i % y_stride << "] = " << got[i]
                          << " ref " << ref[i];
            ++bad;
          }
        }
      }
    }
  }
}

// The reference against double-precision sums of the dequantized weights (DequantizeRow, which
// equals llama.cpp's) times the quantized activations: they differ only by float rounding.
TEST_F(MatMulKQuantTest, ReferenceMatchesDequantizedOracle) {
  const int64_t n = 23, k = 512, m = 3;
  const std::vector<float> x = RandomVec(m * k, 3);
  for (DType dt : kKTypes) {
    const PackedWeight w = MakeWeight(dt, n, k, 8);
    const std::vector<float> wf = w.source().ToF32();
    std::vector<float> y(m * n);
    reference::MatMul(w, x.data(), k, m, y.data(), n, false);
    std::vector<int8_t> qx(k);
    std::vector<internal::QMetaK> meta(k / 256);
    for (int64_t i = 0; i < m; ++i) {
      internal::ReferenceQuantizeRowK(x.data() + i * k, k, qx.data(), meta.data());
      for (int64_t j = 0; j < n; ++j) {
        double exact = 0, mag = 0, vs_f32 = 0, err_bound = 0;
        for (int64_t e = 0; e < k; ++e) {
          const double xe = double(meta[e / 256].d) * qx[e];
          exact += xe * wf[j * k + e];
          mag += std::fabs(xe * wf[j * k + e]);
          vs_f32 += double(x[i * k + e]) * wf[j * k + e];
          err_bound += std::fabs(wf[j * k + e]) * meta[e / 256].d * 0.5;
        }
        EXPECT_NEAR(y[i * n + j], exact, 2e-6 * mag + 1e-6)
            << DTypeName(dt) << " " << i << "," << j;
        // And the activation quantization error is what it should be (≤ half a step per element).
        EXPECT_NEAR(y[i * n + j], vs_f32, err_bound * 1.01 + 2e-6 * mag + 1e-5) << DTypeName(dt);
      }
    }
  }
}

// Row i of y must be bitwise the same alone, inside 8 rows, inside 33 rows, on 1 or 2 threads.
TEST_F(MatMulKQuantTest, BatchInvariance) {
  IsaGuard guard;
  for (DType dt : kKTypes) {
    const int64_t k = 512, n = 37, rows = 33;
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

// Each level's K activation quantizer writes what ReferenceQuantizeRowK writes.
TEST_F(MatMulKQuantTest, ActivationQuantizersMatchReference) {
  const int64_t k = 768, m = 3;
  std::vector<float> x = RandomVec(m * k, 11, 2.0f);
  x[5] = 0.5f * 127.0f / 127.0f;  // ties and zeros
  for (int e = 256; e < 512; ++e) x[e] = 0.0f;
  std::vector<int8_t> rq(m * k);
  std::vector<internal::QMetaK> rm(m * k / 256);
  for (int64_t i = 0; i < m; ++i)
    internal::ReferenceQuantizeRowK(x.data() + i * k, k, rq.data() + i * k,
                                    rm.data() + i * k / 256);
  std::vector<const internal::IsaKernels*> kernels;
  const IsaLevel best = BestIsa();
  if (best >= IsaLevel::kAvx2) kernels.push_back(&internal::Avx2Kernels());
  if (best >= IsaLevel::kAvx512) kernels.push_back(&internal::Avx512Kernels());
  for (const internal::IsaKernels* kern : kernels) {
    std::vector<int8_t> qs(16 * k);
    std::vector<internal::QMeta> meta(m * k / 32);
    internal::QRows q{qs.data(), meta.data(), k, k / 32};
    kern->quantize_rows(internal::kLayoutQ4K, x.data(), k, 0, m, k, q);
    for (int64_t i = 0; i < m; ++i) {
      EXPECT_EQ(0, std::memcmp(qs.data() + i * k, rq.data() + i * k, k));
      const internal::QMetaK* got = internal::KMetaRow(q, i);
      for (int64_t b = 0; b < k / 256; ++b) {
        const internal::QMetaK& want = rm[i * k / 256 + b];
        EXPECT_EQ(got[b].d, want.d);
        EXPECT_EQ(0, std::memcmp(got[b].s16, want.s16, sizeof(want.s16)));
        EXPECT_EQ(0, std::memcmp(got[b].s32, want.s32, sizeof(want.s32)));
      }
    }
  }
}

TEST_F(MatMulKQuantTest, PackValidates) {
  std::vector<uint8_t> bytes(4096);
  for (DType dt : kKTypes) {
    TensorView v;
    v.dtype = dt;
    v.shape = {2, 128};  // k not a multiple of 256 (a malformed file could claim this)
    v.data = bytes.data();
    auto r = PackedWeight::Pack(Tensor(v, nullptr));
    ASSERT_FALSE(r.ok()) << DTypeName(dt);
    EXPECT_NE(r.status().ToString().find("256"), std::string::npos) << r.status().ToString();
    auto ok = PackedWeight::Pack(Tensor::Zeros(dt, {17, 512}));
    ASSERT_TRUE(ok.ok());
    EXPECT_EQ(ok->packed_bytes(),
              internal::KPanelBytes(internal::KLayoutOf(dt), 512));  // one padded panel
  }
}

}  // namespace
}  // namespace chorus::kernels
