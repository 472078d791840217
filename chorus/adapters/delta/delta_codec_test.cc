#include "chorus/adapters/delta/delta_codec.h"

#include <gtest/gtest.h>

#include <random>

namespace chorus::delta {
namespace {

UnpackedMatrix RandomMatrix(const MatrixLayout& l, uint64_t seed) {
  std::mt19937_64 rng(seed);
  UnpackedMatrix m;
  m.layout = l;
  m.codes.resize(static_cast<size_t>(l.rows * l.kept_per_row()));
  for (auto& c : m.codes) c = static_cast<uint8_t>(rng() % (1u << l.bits));
  if (l.sparse24) {
    m.patterns.resize(static_cast<size_t>(l.rows * l.cols / 4));
    for (auto& p : m.patterns) p = static_cast<uint8_t>(rng() % 6);
  }
  m.scales.resize(static_cast<size_t>(l.n_scales()));
  for (auto& s : m.scales) s = RoundToF16(0.001f * static_cast<float>(1 + rng() % 100));
  return m;
}

TEST(DeltaCodecTest, PackUnpackRoundTripsEveryLayout) {
  for (int bits : {1, 2, 3, 4, 8}) {
    for (bool sparse : {false, true}) {
      for (int64_t cols : {4, 12, 20, 172, 64}) {
        for (int64_t group : {int64_t{0}, int64_t{4}, int64_t{64}}) {
          if (group > cols) continue;
          MatrixLayout l{
              .rows = 3, .cols = cols, .bits = bits, .sparse24 = sparse, .group_size = group};
          ASSERT_TRUE(ValidateLayout(l, "m").ok());
          UnpackedMatrix m = RandomMatrix(l, static_cast<uint64_t>(bits * 1000 + cols + group));
          PackedMatrix p = Pack(m);
          EXPECT_EQ(static_cast<int64_t>(p.codes.size()), l.rows * l.code_row_bytes());
          EXPECT_EQ(static_cast<int64_t>(p.mask.size()), l.rows * l.mask_row_bytes());
          auto back = Unpack(p, "m");
          ASSERT_TRUE(back.ok()) << back.status().ToString();
          EXPECT_EQ(back->codes, m.codes);
          EXPECT_EQ(back->patterns, m.patterns);
          EXPECT_EQ(back->Decode(), m.Decode());
        }
      }
    }
  }
}

TEST(DeltaCodecTest, DecodeFollowsTheFormula) {
  // 2 bits, 2:4, one row of 8 columns, group 4: values scale·(code − 1.5) at the kept columns.
  MatrixLayout l{.rows = 1, .cols = 8, .bits = 2, .sparse24 = true, .group_size = 4};
  UnpackedMatrix m;
  m.layout = l;
  m.patterns = {static_cast<uint8_t>(Pattern24(1, 3)), static_cast<uint8_t>(Pattern24(0, 2))};
  m.codes = {0, 3, 1, 2};
  m.scales = {2.0f, 0.5f};
  std::vector<float> want = {0, -3.0f, 0, 3.0f, -0.25f, 0, 0.25f, 0};
  EXPECT_EQ(m.Decode(), want);
  // Mask byte: patterns p0 + 6·p1.
  PackedMatrix p = Pack(m);
  ASSERT_EQ(p.mask.size(), 1u);
  EXPECT_EQ(p.mask[0], Pattern24(1, 3) + 6 * Pattern24(0, 2));
  // Codes little-endian in bit order: 0 | 3<<2 | 1<<4 | 2<<6.
  ASSERT_EQ(p.codes.size(), 1u);
  EXPECT_EQ(p.codes[0], 0 | (3 << 2) | (1 << 4) | (2 << 6));
}

TEST(DeltaCodecTest, QuantizeIsNearestOnTheMidRiseGrid) {
  MatrixLayout l{.rows = 1, .cols = 4, .bits = 2};
  EXPECT_EQ(QuantizeCode(0.1f, 1.0f, l), 2);    // +0.5
  EXPECT_EQ(QuantizeCode(-0.1f, 1.0f, l), 1);   // −0.5
  EXPECT_EQ(QuantizeCode(1.2f, 1.0f, l), 3);    // +1.5
  EXPECT_EQ(QuantizeCode(-100.f, 1.0f, l), 0);  // clamped
  EXPECT_EQ(QuantizeCode(100.f, 1.0f, l), 3);
  for (float x = -2; x <= 2; x += 0.01f) {
    const int c = QuantizeCode(x, 1.0f, l);
    for (int o = 0; o < 4; ++o)
      EXPECT_LE(std::fabs(Dequantize(c, 1.0f, l) - x),
                std::fabs(Dequantize(o, 1.0f, l) - x) + 1e-6f);
  }
}

TEST(DeltaCodecTest, CorruptPackedFormsAreRefusedWithTheMatrixName) {
  MatrixLayout l{.rows = 2, .cols = 12, .bits = 3, .sparse24 = true, .group_size = 4};
  PackedMatrix p = Pack(RandomMatrix(l, 7));
  {
    PackedMatrix q = p;
    q.mask[0] = 216;
    auto r = Unpack(q, "layers.0.q");
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("layers.0.q"), std::string::npos);
    EXPECT_NE(r.status().message().find("mask"), std::string::npos);
  }
  {
    PackedMatrix q = p;
    q.codes.back() |= 0x80;  // 6 values × 3 bits = 18 bits in 3 bytes: bit 23 is padding
    auto r = Unpack(q, "m");
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("padding"), std::string::npos);
  }
  {
    PackedMatrix q = p;
    q.codes.pop_back();
    EXPECT_FALSE(Unpack(q, "m").ok());
  }
  {
    PackedMatrix q = p;
    q.scales[1] = std::nanf("");
    EXPECT_FALSE(Unpack(q, "m").ok());
  }
  {
    PackedMatrix q = p;
    q.layout.bits = 5;
    auto r = Unpack(q, "m");
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("bits 5"), std::string::npos);
  }
  {
    PackedMatrix q = p;
    q.layout.cols = 10;  // 2:4 needs a multiple of 4
    EXPECT_FALSE(Unpack(q, "m").ok());
  }
}

// CheckPacked (what reading a delta file runs) refuses a pattern byte above the largest code of
// the patterns it holds — 3 (< 216) in every byte of a row but its last, which holds 1 (< 6),
// 2 (< 36) or 3 — naming the first such byte, and accepts the largest valid codes.
TEST(DeltaCodecTest, CheckPackedRefusesEachRowsBadPatternBytes) {
  for (int64_t cols : {int64_t{16}, int64_t{20}, int64_t{24}}) {
    MatrixLayout l{.rows = 2, .cols = cols, .bits = 2, .sparse24 = true, .group_size = 0};
    PackedMatrix p = Pack(RandomMatrix(l, 11));
    const int64_t mrb = l.mask_row_bytes();
    ASSERT_EQ(mrb, 2);
    const int last_limit = cols == 16 ? 6 : cols == 20 ? 36 : 216;
    PackedMatrix q = p;
    q.mask[static_cast<size_t>(mrb + 1)] = static_cast<uint8_t>(last_limit - 1);
    q.mask[static_cast<size_t>(mrb)] = 215;
    EXPECT_TRUE(CheckPacked(q, "m").ok()) << cols;
    EXPECT_TRUE(Unpack(q, "m").ok()) << cols;
    q.mask[static_cast<size_t>(mrb + 1)] =
        static_cast<uint8_t>(last_limit == 216 ? 255 : last_limit);
    Status st = CheckPacked(q, "m");
    ASSERT_FALSE(st.ok()) << cols;
    EXPECT_NE(st.message().find("mask byte 3"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("largest pattern code " + std::to_string(last_limit - 1)),
              std::string::npos)
        << st.message();
    q.mask[static_cast<size_t>(mrb)] = 216;  // an earlier bad byte of the same row is named first
    st = CheckPacked(q, "m");
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find("mask byte 2 is 216"), std::string::npos) << st.message();
  }
}

}  // namespace
}  // namespace chorus::delta
