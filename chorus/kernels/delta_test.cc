// test-labels: kernel concurrency
// Delta segment kernel: the decode against an independent bit-by-bit decoder in the test, the
// scalar reference against a double-precision oracle, DeltaApply against the reference (every
// bit width, dense and 2:4, grouped and per-matrix scales, awkward widths, many / empty / rank-0
// segments), and bitwise batch invariance (a row alone = the same row in a mixed batch, at 1
// and 2 threads). The int16 path: its kept positions against the decode, every level against its
// scalar reference bitwise, its error against the double oracle within the bound of x's
// rounding, batch invariance, non-finite and zero rows, and layouts it leaves to the f32 path.
#include "chorus/kernels/delta.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "chorus/kernels/delta_internal.h"
#include "chorus/kernels/dispatch.h"

namespace chorus::kernels {
namespace {

// A random packed matrix and the storage its view points into.
struct Packed {
  DeltaMatrixView view;
  std::vector<uint8_t> codes, mask;
  std::vector<uint64_t> positions;  // 2:4: the int16 path's kept positions
  std::vector<float> scales;
  std::vector<double> dense;  // [rows, cols], decoded here independently of the kernel
};

Packed MakePacked(int64_t rows, int64_t cols, int bits, bool sparse24, int64_t group,
                  std::mt19937* rng) {
  Packed p;
  DeltaMatrixView& v = p.view;
  v.rows = rows;
  v.cols = cols;
  v.bits = bits;
  v.sparse24 = sparse24;
  v.group_size = group;
  const int64_t groups = group == 0 ? 1 : (cols + group - 1) / group;
  std::uniform_real_distribution<float> sd(0.001f, 0.05f);
  p.scales.resize(static_cast<size_t>(group == 0 ? 1 : rows * groups));
  for (float& s : p.scales) s = sd(*rng);
  p.codes.assign(static_cast<size_t>(rows * v.code_row_bytes()), 0);
  p.mask.assign(static_cast<size_t>(rows * v.mask_row_bytes()), 0);
  p.dense.assign(static_cast<size_t>(rows * cols), 0.0);
  std::uniform_int_distribution<int> code(0, (1 << bits) - 1), pat(0, 5);
  const int pairs[6][2] = {{0, 1}, {0, 2}, {0, 3}, {1, 2}, {1, 3}, {2, 3}};
  const double half = ((1 << bits) - 1) / 2.0;
  for (int64_t o = 0; o < rows; ++o) {
    uint8_t* crow = p.codes.data() + o * v.code_row_bytes();
    int64_t j = 0;  // kept value index
    auto put = [&](int64_t col) {
      const int c = code(*rng);
      for (int b = 0; b < bits; ++b) {
        const int64_t bit = j * bits + b;
        if ((c >> b) & 1) crow[bit / 8] |= static_cast<uint8_t>(1u << (bit % 8));
      }
      const double s =
          group == 0 ? p.scales[0] : p.scales[static_cast<size_t>(o * groups + col / group)];
      p.dense[static_cast<size_t>(o * cols + col)] = s * (c - half);
      ++j;
    };
    if (!sparse24) {
      for (int64_t c = 0; c < cols; ++c) put(c);
      continue;
    }
    uint8_t* mrow = p.mask.data() + o * v.mask_row_bytes();
    for (int64_t g = 0; g < cols / 4; ++g) {
      const int pt = pat(*rng);
      int mul = 1;
      for (int64_t t = 0; t < g % 3; ++t) mul *= 6;
      mrow[g / 3] = static_cast<uint8_t>(mrow[g / 3] + pt * mul);
      put(g * 4 + pairs[pt][0]);
      put(g * 4 + pairs[pt][1]);
    }
  }
  v.codes = p.codes.data();
  v.mask = sparse24 ? p.mask.data() : nullptr;
  v.scales = p.scales.data();
  if (sparse24) {
    p.positions = DeltaKeptPositions(v);
    v.positions = p.positions.data();
  }
  return p;
}

std::vector<float> RandomX(int64_t n, std::mt19937* rng) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& f : v) f = d(*rng);
  return v;
}

TEST(DeltaKernelTest, DecodeMatchesAnIndependentDecoder) {
  std::mt19937 rng(1);
  for (int bits : {1, 2, 3, 4, 8}) {
    for (bool sparse : {false, true}) {
      for (int64_t group : {int64_t{0}, int64_t{6}, int64_t{16}, int64_t{64}}) {
        const int64_t cols = sparse ? 100 : 37;
        Packed p = MakePacked(5, cols, bits, sparse, group, &rng);
        std::vector<float> row(static_cast<size_t>(cols));
        for (int64_t o = 0; o < 5; ++o) {
          DeltaDecodeRow(p.view, o, row.data());
          for (int64_t c = 0; c < cols; ++c) {
            ASSERT_FLOAT_EQ(row[static_cast<size_t>(c)],
                            static_cast<float>(p.dense[static_cast<size_t>(o * cols + c)]))
                << bits << " " << sparse << " " << group << " row " << o << " col " << c;
          }
        }
      }
    }
  }
}

TEST(DeltaKernelTest, ReferenceMatchesOracleAndKernelMatchesReference) {
  std::mt19937 rng(2);
  ThreadPool pool(2);
  for (int bits : {1, 2, 4, 8}) {
    for (bool sparse : {false, true}) {
      // Three deltas of different shapes' slots, one with no term (rows = 0).
      const int64_t in = sparse ? 132 : 131, out = 45;
      std::vector<Packed> packed;
      for (int s = 0; s < 3; ++s)
        packed.push_back(MakePacked(out, in, bits, sparse, s == 1 ? 0 : 32, &rng));
      std::vector<DeltaMatrixView> views;
      for (const Packed& p : packed) views.push_back(p.view);
      views.push_back(DeltaMatrixView{});  // slot 3: no term
      const int64_t n = 11;
      const std::vector<LoraSegment> segments = {
          {0, 3, 2}, {3, 3, 0}, {3, 4, 3}, {4, 8, 0}, {9, 11, 1}};  // row 8: the base model
      const std::vector<float> x = RandomX(n * in, &rng);
      std::vector<float> y_ref(static_cast<size_t>(n * out), 0.5f), y_fast = y_ref;
      DeltaApplyReference(segments, views, x.data(), in, y_ref.data(), out);
      DeltaApply(segments, views, x.data(), in, y_fast.data(), out, &pool);
      for (const LoraSegment& s : segments) {
        for (int64_t i = s.row_begin; i < s.row_end; ++i) {
          for (int64_t o = 0; o < out; ++o) {
            double want = 0.5;
            if (views[static_cast<size_t>(s.slot)].rows > 0) {
              const Packed& p = packed[static_cast<size_t>(s.slot)];
              for (int64_t k = 0; k < in; ++k)
                want += static_cast<double>(x[static_cast<size_t>(i * in + k)]) *
                        p.dense[static_cast<size_t>(o * in + k)];
            }
            const float ref = y_ref[static_cast<size_t>(i * out + o)];
            EXPECT_NEAR(ref, want, 1e-4 * (1 + std::fabs(want))) << i << " " << o;
            EXPECT_NEAR(y_fast[static_cast<size_t>(i * out + o)], ref, 1e-5 * (1 + std::fabs(ref)));
          }
        }
      }
      for (int64_t o = 0; o < out; ++o) {  // the base-model row is untouched
        EXPECT_EQ(y_fast[static_cast<size_t>(8 * out + o)], 0.5f);
        EXPECT_EQ(y_ref[static_cast<size_t>(8 * out + o)], 0.5f);
      }
    }
  }
}

// With either activations (int16 rounds each row with its own scale).
TEST(DeltaKernelTest, ARowAloneEqualsTheSameRowInAMixedBatchBitwise) {
  std::mt19937 rng(3);
  const int64_t in = 320, out = 70;
  Packed a = MakePacked(out, in, 4, true, 64, &rng), b = MakePacked(out, in, 2, false, 64, &rng);
  const std::vector<DeltaMatrixView> views = {a.view, b.view};
  const int64_t n = 9;
  const std::vector<float> x = RandomX(n * in, &rng);
  for (DeltaActivations act : {DeltaActivations::kF32, DeltaActivations::kInt16}) {
    for (int threads : {1, 2}) {
      ThreadPool pool(threads);
      std::vector<float> batch(static_cast<size_t>(n * out), 0.0f);
      DeltaApply(std::vector<LoraSegment>{{0, 5, 0}, {5, 9, 1}}, views, x.data(), in, batch.data(),
                 out, &pool, act);
      for (int64_t i = 0; i < n; ++i) {
        std::vector<float> alone(static_cast<size_t>(out), 0.0f);
        ThreadPool one(1);
        DeltaApply(std::vector<LoraSegment>{{0, 1, i < 5 ? 0 : 1}}, views, x.data() + i * in, in,
                   alone.data(), out, &one, act);
        for (int64_t o = 0; o < out; ++o)
          ASSERT_EQ(alone[static_cast<size_t>(o)], batch[static_cast<size_t>(i * out + o)])
              << DeltaActivationsName(act) << " threads " << threads << " row " << i << " col "
              << o;
      }
    }
  }
}

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

// Every level computes the portable kernel's arithmetic (kernels/delta_internal.h), so every
// level equals the scalar level bit for bit: every packed layout, scale groups the SIMD levels
// take (0, 16, 64) and one they leave to the portable kernel (6), widths with and without a
// partial last step, segments of 1–4 rows (decoded in registers) and of 5–9 rows (decoded into
// L1), 1 and 2 threads.
TEST(DeltaKernelTest, EveryIsaLevelEqualsTheScalarLevelBitwise) {
  std::mt19937 rng(4);
  std::string levels;
  for (IsaLevel l : SupportedLevels()) levels += IsaName(l) + " ";
  std::cout << "delta kernels tested at ISA levels: " << levels << "\n";
  for (int bits : {1, 2, 3, 4, 8}) {
    for (bool sparse : {false, true}) {
      if (sparse && bits == 1) continue;
      for (int64_t group : {int64_t{0}, int64_t{16}, int64_t{64}, int64_t{6}}) {
        for (int64_t in : {int64_t{96}, int64_t{144}, int64_t{204}, int64_t{2048}}) {
          const int64_t cols = sparse ? in : in - 3;  // dense: a partial last chunk too
          const int64_t out = 37;
          Packed a = MakePacked(out, cols, bits, sparse, group, &rng);
          Packed b = MakePacked(out, cols, bits, sparse, group == 6 ? 0 : group, &rng);
          const std::vector<DeltaMatrixView> views = {a.view, b.view};
          const int64_t n = 16;
          const std::vector<LoraSegment> segments = {{0, 1, 0}, {1, 3, 1},  {3, 6, 0},
                                                     {6, 7, 1}, {7, 11, 1}, {11, 16, 0}};
          const std::vector<float> x = RandomX(n * cols, &rng);
          std::vector<float> want(static_cast<size_t>(n * out), 0.25f);
          {
            IsaGuard g;
            SetMaxIsa(IsaLevel::kScalar);
            ThreadPool one(1);
            DeltaApply(segments, views, x.data(), cols, want.data(), out, &one);
          }
          for (IsaLevel level : SupportedLevels()) {
            for (int threads : {1, 2}) {
              IsaGuard g;
              SetMaxIsa(level);
              ThreadPool pool(threads);
              std::vector<float> got(static_cast<size_t>(n * out), 0.25f);
              DeltaApply(segments, views, x.data(), cols, got.data(), out, &pool);
              for (size_t e = 0; e < got.size(); ++e)
                ASSERT_EQ(got[e], want[e])
                    << IsaName(level) << " bits " << bits << " sparse " << sparse << " group "
                    << group << " cols " << cols << " threads " << threads << " element " << e;
            }
          }
        }
      }
    }
  }
}

TEST(DeltaKernelTest, KeptPositionsAreTheDecodedNonZeroColumns) {
  std::mt19937 rng(5);
  for (int bits : {2, 4, 8}) {
    for (int64_t cols : {int64_t{64}, int64_t{100}, int64_t{172}, int64_t{2048}}) {
      Packed p = MakePacked(7, cols, bits, true, 64, &rng);
      const int64_t words = p.view.position_row_words();
      ASSERT_EQ(static_cast<int64_t>(p.positions.size()), 7 * words);
      std::vector<float> row(static_cast<size_t>(cols));
      for (int64_t o = 0; o < 7; ++o) {
        DeltaDecodeRow(p.view, o, row.data());
        for (int64_t g = 0; g < words * 16; ++g) {
          const uint64_t field =
              (p.positions[static_cast<size_t>(o * words + g / 16)] >> (4 * (g % 16))) & 15;
          if (4 * g >= cols) {  // past the row: nothing
            ASSERT_EQ(field, 0u) << "bits " << bits << " cols " << cols << " group " << g;
            continue;
          }
          const int64_t p0 = static_cast<int64_t>(field & 3), p1 = static_cast<int64_t>(field >> 2);
          ASSERT_LT(p0, p1) << "bits " << bits << " cols " << cols << " group " << g;
          for (int64_t j = 0; j < 4; ++j) {
            // A kept value can decode to 0 only if its code is the middle one, which an even
            // number of levels does not have.
            const bool nonzero = row[static_cast<size_t>(4 * g + j)] != 0.0f;
            ASSERT_EQ(j == p0 || j == p1, nonzero)
                << "bits " << bits << " cols " << cols << " row " << o << " col " << 4 * g + j;
          }
        }
      }
    }
  }
}

// The int16 layouts, and a few the int16 path leaves to the f32 kernel (3 bits, groups of 16).
struct Int16Case {
  int bits;
  bool sparse;
  int64_t group;
};
const Int16Case kInt16Cases[] = {{1, false, 0},   {2, false, 64}, {4, false, 64}, {4, false, 0},
                                 {8, false, 128}, {2, true, 64},  {4, true, 64},  {4, true, 192},
                                 {4, true, 0},    {3, false, 64}, {4, true, 16}};

TEST(DeltaKernelTest, Int16PathEqualsItsReferenceBitwiseAtEveryLevel) {
  std::mt19937 rng(6);
  std::cout << "int16 delta kernel: " << (DeltaInt16Fast() ? "AVX-512 VNNI/VBMI2" : "portable")
            << " at the best level\n";
  for (const Int16Case& k : kInt16Cases) {
    for (int64_t in : {int64_t{64}, int64_t{172}, int64_t{200}, int64_t{2048}}) {
      const int64_t cols = k.sparse ? in : in - 3;
      const int64_t out = 21;
      Packed a = MakePacked(out, cols, k.bits, k.sparse, k.group, &rng);
      // b: per-matrix scales where a has groups of 64 (both run the same path).
      Packed b = MakePacked(out, cols, k.bits, k.sparse, k.group == 64 ? 0 : k.group, &rng);
      const std::vector<DeltaMatrixView> views = {a.view, b.view};
      const int64_t n = 16;
      const std::vector<LoraSegment> segments = {{0, 1, 0}, {1, 3, 1},  {3, 6, 0},
                                                 {6, 7, 1}, {7, 11, 1}, {11, 16, 0}};
      std::vector<float> x = RandomX(n * cols, &rng);
      x[static_cast<size_t>(2 * cols + 5)] = 40.0f;  // an outlier sets row 2's scale
      for (int64_t c = 0; c < cols; ++c) x[static_cast<size_t>(9 * cols + c)] = 0.0f;  // a zero row
      std::vector<float> want(static_cast<size_t>(n * out), 0.25f);
      DeltaApplyReference(segments, views, x.data(), cols, want.data(), out,
                          DeltaActivations::kInt16);
      if (!DeltaInt16Layout(a.view)) {  // left to the f32 path: the f32 reference exactly
        std::vector<float> f32(static_cast<size_t>(n * out), 0.25f);
        DeltaApplyReference(segments, views, x.data(), cols, f32.data(), out);
        ASSERT_EQ(f32, want) << "bits " << k.bits << " group " << k.group;
      }
      for (int64_t o = 0; o < out; ++o) ASSERT_EQ(want[static_cast<size_t>(9 * out + o)], 0.25f);
      for (IsaLevel level : SupportedLevels()) {
        for (int threads : {1, 2}) {
          IsaGuard g;
          SetMaxIsa(level);
          ThreadPool pool(threads);
          std::vector<float> got(static_cast<size_t>(n * out), 0.25f);
          DeltaApply(segments, views, x.data(), cols, got.data(), out, &pool,
                     DeltaActivations::kInt16);
          const bool int16 = DeltaInt16Layout(a.view);
          for (size_t e = 0; e < got.size(); ++e) {
            // Layouts the int16 path leaves to the f32 kernel agree to the f32 kernel's rounding.
            if (int16) {
              ASSERT_EQ(got[e], want[e])
                  << IsaName(level) << " bits " << k.bits << " sparse " << k.sparse << " group "
                  << k.group << " cols " << cols << " threads " << threads << " element " << e;
            } else {
              ASSERT_NEAR(got[e], want[e], 1e-5 * (1 + std::fabs(want[e])));
            }
          }
        }
      }
    }
  }
}

// BitDelta's signs run a table-lookup kernel over panels of 16 output rows and 512-column chunks
// (x86/delta_q16_avx512.cc), the rows past the last whole panel the per-row kernel: both must
// equal the reference bitwise at every panel and chunk boundary, for any number of input rows
// (1–4 share a pass, more take turns), on 1 and 2 threads (whose row split can cut a panel).
TEST(DeltaKernelTest, SignLookupKernelEqualsTheReferenceAcrossPanelsChunksAndRowCounts) {
  std::mt19937 rng(21);
  for (int64_t out : {int64_t{16}, int64_t{37}, int64_t{160}}) {
    for (int64_t cols : {int64_t{8}, int64_t{500}, int64_t{512}, int64_t{1037}, int64_t{2048}}) {
      Packed a = MakePacked(out, cols, 1, false, 0, &rng);
      Packed b = MakePacked(out, cols, 1, false, 0, &rng);
      const std::vector<DeltaMatrixView> views = {a.view, b.view};
      // Segments of 1, 9 (4 + 4 + 1) and 3 rows.
      const std::vector<LoraSegment> segments = {{0, 1, 1}, {1, 10, 0}, {10, 13, 1}};
      const int64_t n = 13;
      const std::vector<float> x = RandomX(n * cols, &rng);
      std::vector<float> want(static_cast<size_t>(n * out), 0.5f);
      DeltaApplyReference(segments, views, x.data(), cols, want.data(), out,
                          DeltaActivations::kInt16);
      for (int threads : {1, 2}) {
        ThreadPool pool(threads);
        std::vector<float> got(static_cast<size_t>(n * out), 0.5f);
        DeltaApply(segments, views, x.data(), cols, got.data(), out, &pool,
                   DeltaActivations::kInt16);
        ASSERT_EQ(got, want) << "rows " << out << " cols " << cols << " threads " << threads;
      }
    }
  }
}

// The lookup kernel sums a whole row in one int32 lane and each group
// of 4 columns in an int16 table entry: at its widest (262 144 columns) with every |q| = 8191
// (SignRowSum rows' largest code) and every sign alike, the entries (±4 · 8191) and the sum
// (±262 144 · 8191) are still exact.
TEST(DeltaKernelTest, SignLookupKernelSumsTheWidestRowExactly) {
  std::mt19937 rng(22);
  const int64_t out = 32, cols = 262144;
  Packed p = MakePacked(out, cols, 1, false, 0, &rng);
  // Rows 0–15 all +1, rows 16–31 all −1.
  for (int64_t o = 0; o < out; ++o)
    std::fill_n(p.codes.begin() + o * p.view.code_row_bytes(), p.view.code_row_bytes(),
                static_cast<uint8_t>(o < 16 ? 0xFF : 0x00));
  const std::vector<DeltaMatrixView> views = {p.view};
  const std::vector<float> x(static_cast<size_t>(3 * cols), 3.0f);  // q = 8191 everywhere
  std::vector<float> want(static_cast<size_t>(3 * out), 0.0f), got = want;
  const std::vector<LoraSegment> segments = {{0, 3, 0}};
  DeltaApplyReference(segments, views, x.data(), cols, want.data(), out, DeltaActivations::kInt16);
  DeltaApply(segments, views, x.data(), cols, got.data(), out, nullptr, DeltaActivations::kInt16);
  EXPECT_EQ(got, want);
  // The term itself: a 1-bit value is ±scale / 2, so ±cols · 3 · scale / 2 (to x's rounding).
  const double term = cols * 3.0 * p.scales[0] / 2;
  EXPECT_NEAR(got[0], term, 1e-4 * term);
  EXPECT_NEAR(got[3 * out - 1], -term, 1e-4 * term);
}

TEST(DeltaKernelTest, Int16PathIsWithinTheRoundingOfXOfTheExactTerm) {
  std::mt19937 rng(7);
  ThreadPool pool(2);
  for (const Int16Case& k : kInt16Cases) {
    const int64_t cols = k.sparse ? 1024 : 1021, out = 33, n = 5;
    Packed a = MakePacked(out, cols, k.bits, k.sparse, k.group, &rng);
    const std::vector<DeltaMatrixView> views = {a.view};
    std::vector<float> x = RandomX(n * cols, &rng);
    x[17] = -25.0f;  // row 0 has an outlier: its other values keep fewer bits
    std::vector<float> y(static_cast<size_t>(n * out), 0.0f);
    DeltaApply(std::vector<LoraSegment>{{0, n, 0}}, views, x.data(), cols, y.data(), out, &pool,
               DeltaActivations::kInt16);
    for (int64_t i = 0; i < n; ++i) {
      double max_abs = 0;
      for (int64_t c = 0; c < cols; ++c)
        max_abs =
            std::max(max_abs, std::fabs(static_cast<double>(x[static_cast<size_t>(i * cols + c)])));
      for (int64_t o = 0; o < out; ++o) {
        double exact = 0, sum_abs_w = 0, sum_abs = 0;
        for (int64_t c = 0; c < cols; ++c) {
          const double w = a.dense[static_cast<size_t>(o * cols + c)];
          const double xv = x[static_cast<size_t>(i * cols + c)];
          exact += w * xv;
          sum_abs_w += std::fabs(w);
          sum_abs += std::fabs(w * xv);
        }
        // x rounded to max_code steps (32767; BitDelta's signs 8191) moves each product by
        // ≤ |w|·max|x| / (2·max_code); float sums add ~1e-6.
        const double half_step = max_abs / (2.0 * delta_internal::q16::MaxCode(a.view));
        const double bound = sum_abs_w * half_step * 1.001 + 2e-6 * sum_abs + 1e-12;
        ASSERT_NEAR(y[static_cast<size_t>(i * out + o)], exact, bound)
            << "bits " << k.bits << " sparse " << k.sparse << " group " << k.group << " row " << i
            << " col " << o;
      }
    }
  }
}

TEST(DeltaKernelTest, Int16QuantizationRoundsToNearestEvenInBothOrders) {
  // max|x| = max_code makes the scale 1, so x itself is rounded: ties go to the even neighbour,
  // as std::nearbyint does in the default rounding mode — for the int16 codes (32767) and
  // BitDelta's signs' (8191) alike.
  for (const int max_code : {delta_internal::q16::kMaxCode, delta_internal::q16::kSignMaxCode}) {
    const auto top = static_cast<float>(max_code);
    std::vector<float> x = {top,   0.5f,  1.5f,   2.5f, -0.5f,      -1.5f,
                            -2.5f, 3.49f, -3.51f, 0.0f, top - 0.5f, -top + 1.5f};
    std::mt19937 rng(11);
    std::uniform_real_distribution<float> d(-top, top);
    while (x.size() < 130) x.push_back(d(rng));
    const auto cols = static_cast<int64_t>(x.size());
    for (bool column_order : {true, false}) {
      std::vector<int16_t> q(static_cast<size_t>(delta_internal::q16::PaddedCols(cols)), 7);
      float scale = 0;
      delta_internal::q16::Quantize(x.data(), cols, 1, cols, column_order, max_code, q.data(),
                                    &scale);
      ASSERT_EQ(scale, 1.0f);
      for (int64_t c = 0; c < cols; ++c) {
        const auto want = static_cast<int16_t>(std::nearbyint(x[static_cast<size_t>(c)]));
        ASSERT_EQ(q[static_cast<size_t>(delta_internal::q16::Q16Position(c, column_order))], want)
            << "column " << c << " value " << x[static_cast<size_t>(c)] << " column order "
            << column_order << " max code " << max_code;
      }
      for (int64_t c = cols; c < static_cast<int64_t>(q.size()); ++c)
        ASSERT_EQ(q[static_cast<size_t>(delta_internal::q16::Q16Position(c, column_order))], 0);
    }
  }
}

// DeltaApply quantizes x with the AVX-512 quantizer where the int16 kernel runs: it must write
// the portable Quantize's q (padding included) and scales bit for bit — ties, both orders, both
// code ranges, row tails, and the special rows (zeros, signed zeros, a subnormal-only row too
// small to scale, NaN and infinities).
TEST(DeltaKernelTest, AvxQuantizerEqualsThePortableOneBitwise) {
  if (!DeltaInt16Fast())
    GTEST_SKIP() << "no AVX-512 VBMI2 on this CPU: the portable quantizer runs";
  std::mt19937 rng(31);
  std::uniform_real_distribution<float> d(-3.0f, 3.0f);
  for (const int64_t cols :
       {int64_t{1}, int64_t{15}, int64_t{16}, int64_t{17}, int64_t{63}, int64_t{64}, int64_t{65},
        int64_t{130}, int64_t{2048}, int64_t{5632}}) {
    const int64_t n = 9, xs = cols + 3;
    std::vector<float> x(static_cast<size_t>(n * xs));
    for (float& v : x) v = d(rng);
    auto row = [&](int64_t i) { return x.begin() + i * xs; };
    std::fill(row(1), row(1) + cols, 0.0f);
    std::fill(row(2), row(2) + cols, -0.0f);
    std::fill(row(3), row(3) + cols, 1e-40f);  // subnormal: max_code / max|x| overflows
    row(4)[cols / 2] = std::nanf("");
    row(5)[cols - 1] = INFINITY;
    row(6)[0] = -INFINITY;
    // max|x| = 8191: BitDelta's codes quantize with scale 1, so every ±(k + ½) is a tie.
    for (int64_t c = 0; c < cols; ++c)
      row(7)[c] = static_cast<float>(c % 2 == 0 ? 1 : -1) * (0.5f + static_cast<float>(c % 9));
    row(7)[cols / 3] = 8191.0f;
    row(8)[0] = 1e30f;  // the rest rounds to 0
    for (const int max_code : {delta_internal::q16::kMaxCode, delta_internal::q16::kSignMaxCode}) {
      for (const bool column_order : {true, false}) {
        const auto size = static_cast<size_t>(n * delta_internal::q16::PaddedCols(cols));
        std::vector<int16_t> want(size, 7), got(size, -7);
        std::vector<float> want_scales(n, 5.0f), got_scales(n, -5.0f);
        delta_internal::q16::Quantize(x.data(), xs, n, cols, column_order, max_code, want.data(),
                                      want_scales.data());
        delta_internal::q16::avx512::Quantize(x.data(), xs, n, cols, column_order, max_code,
                                              got.data(), got_scales.data());
        ASSERT_EQ(got, want) << "cols " << cols << " max code " << max_code << " column order "
                             << column_order;
        ASSERT_EQ(std::memcmp(got_scales.data(), want_scales.data(), n * sizeof(float)), 0)
            << "cols " << cols << " max code " << max_code;
        EXPECT_TRUE(std::isnan(want_scales[4]) && std::isnan(want_scales[5]) &&
                    std::isnan(want_scales[6]));
        EXPECT_EQ(want_scales[1], 0.0f);
        EXPECT_EQ(want_scales[3], 0.0f);
      }
    }
  }
}

TEST(DeltaKernelTest, Int16RowWithANonFiniteValueGivesNaNAndLeavesTheOtherRowsAlone) {
  std::mt19937 rng(9);
  const int64_t in = 128, out = 16;
  Packed a = MakePacked(out, in, 4, true, 64, &rng);
  const std::vector<DeltaMatrixView> views = {a.view};
  std::vector<float> x = RandomX(3 * in, &rng);
  x[static_cast<size_t>(in + 7)] = std::nanf("");
  x[static_cast<size_t>(2 * in + 3)] = INFINITY;
  ThreadPool pool(2);
  std::vector<float> y(static_cast<size_t>(3 * out), 0.0f), y0(static_cast<size_t>(out), 0.0f);
  DeltaApply(std::vector<LoraSegment>{{0, 3, 0}}, views, x.data(), in, y.data(), out, &pool,
             DeltaActivations::kInt16);
  DeltaApply(std::vector<LoraSegment>{{0, 1, 0}}, views, x.data(), in, y0.data(), out, &pool,
             DeltaActivations::kInt16);
  for (int64_t o = 0; o < out; ++o) {
    EXPECT_EQ(y[static_cast<size_t>(o)], y0[static_cast<size_t>(o)]);
    EXPECT_TRUE(std::isfinite(y[static_cast<size_t>(o)]));
    EXPECT_TRUE(std::isnan(y[static_cast<size_t>(out + o)]));
    EXPECT_TRUE(std::isnan(y[static_cast<size_t>(2 * out + o)]));
  }
}

// A pool copy stores a matrix in bands of rows (DeltaBand, adapters/delta/paged_delta.h). The
// same rows cut into bands — at a 16-row panel boundary, inside panels, a band of one row — give
// the unbanded matrix's outputs bit for bit: in both activation paths, at every level, on 1 and
// 2 threads (whose row split falls inside bands), in the references, and in DeltaDecodeRow.
TEST(DeltaKernelTest, BandedMatricesEqualTheWholeMatrixBitwise) {
  std::mt19937 rng(11);
  for (const Int16Case& k : kInt16Cases) {
    const int64_t cols = k.sparse ? 512 : 509, out = 70, n = 6;
    Packed a = MakePacked(out, cols, k.bits, k.sparse, k.group, &rng);
    const DeltaMatrixView& m = a.view;
    // The bands' bytes in buffers of their own (a pool page each), filled with a marker first.
    const int64_t cuts[] = {0, 16, 19, 20, 48, 70};
    std::vector<std::vector<uint8_t>> codes, masks;
    std::vector<std::vector<float>> scales;
    std::vector<std::vector<uint64_t>> positions;
    std::vector<DeltaBand> bands;
    for (size_t b = 0; b + 1 < std::size(cuts); ++b) {
      const int64_t r0 = cuts[b], r1 = cuts[b + 1];
      auto slice = [&](const auto* src, int64_t per_row, auto& store) {
        using T = std::remove_cv_t<std::remove_pointer_t<decltype(src)>>;
        store.emplace_back(src == nullptr ? 0 : static_cast<size_t>((r1 - r0) * per_row), T{});
        if (src != nullptr) std::copy(src + r0 * per_row, src + r1 * per_row, store.back().begin());
        return src == nullptr ? nullptr : store.back().data();
      };
      DeltaBand band{.row_begin = r0, .row_end = r1};
      band.codes = slice(m.codes, m.code_row_bytes(), codes);
      band.mask = slice(m.mask, m.mask_row_bytes(), masks);
      band.scales = m.group_size == 0 ? nullptr : slice(m.scales, m.groups(), scales);
      band.positions = slice(m.positions, m.position_row_words(), positions);
      bands.push_back(band);
    }
    DeltaMatrixView banded = m;
    banded.codes = nullptr;
    banded.mask = nullptr;
    banded.positions = nullptr;
    if (m.group_size != 0) banded.scales = nullptr;
    banded.bands = bands;
    ASSERT_EQ(DeltaInt16Layout(banded), DeltaInt16Layout(m));
    std::vector<float> whole_row(static_cast<size_t>(cols)), band_row(whole_row.size());
    for (int64_t o = 0; o < out; ++o) {
      DeltaDecodeRow(m, o, whole_row.data());
      DeltaDecodeRow(banded, o, band_row.data());
      ASSERT_EQ(whole_row, band_row) << "row " << o;
    }
    const std::vector<LoraSegment> segments = {{0, 1, 0}, {1, 4, 1}, {4, 6, 0}};
    const std::vector<float> x = RandomX(n * cols, &rng);
    for (DeltaActivations act : {DeltaActivations::kF32, DeltaActivations::kInt16}) {
      // Slot 1 is the whole matrix in the banded run and the banded one in the whole run: a
      // step may mix pool and host copies.
      const std::vector<DeltaMatrixView> whole = {m, banded}, cut = {banded, m};
      std::vector<float> want(static_cast<size_t>(n * out), 0.5f), got(want.size(), 0.5f);
      DeltaApplyReference(segments, whole, x.data(), cols, want.data(), out, act);
      DeltaApplyReference(segments, cut, x.data(), cols, got.data(), out, act);
      ASSERT_EQ(want, got) << "reference, bits " << k.bits << " sparse " << k.sparse;
      for (IsaLevel level : SupportedLevels()) {
        for (int threads : {1, 2}) {
          IsaGuard g;
          SetMaxIsa(level);
          ThreadPool pool(threads);
          std::vector<float> w(want.size(), 0.5f), c(want.size(), 0.5f);
          DeltaApply(segments, whole, x.data(), cols, w.data(), out, &pool, act);
          DeltaApply(segments, cut, x.data(), cols, c.data(), out, &pool, act);
          ASSERT_EQ(w, c) << IsaName(level) << " threads " << threads << " bits " << k.bits
                          << " sparse " << k.sparse << " group " << k.group << " int16 "
                          << (act == DeltaActivations::kInt16);
        }
      }
    }
  }
}

}  // namespace
}  // namespace chorus::kernels
