// test-labels: kernel concurrency
// LoRA segment kernels: the scalar reference against an independent double-precision oracle,
// every ISA variant the machine supports against the reference (ranks 1..256, awkward widths,
// many / empty / rank-0 segments, decode- and prefill-shaped steps, fused shrinks), and bitwise
// batch invariance of each variant (a row alone = the same row inside a mixed batch, at any
// thread count).
#include "chorus/kernels/lora.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "chorus/kernels/dispatch.h"
#include "chorus/tensor/dtype.h"

namespace chorus::kernels {
namespace {

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

std::vector<float> Random(size_t n, std::mt19937* rng, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& f : v) f = d(*rng);
  return v;
}

// Row pointers of a contiguous [rows, width] matrix.
std::vector<const float*> RowTable(const std::vector<float>& m, int64_t width) {
  std::vector<const float*> t;
  for (size_t off = 0; off + static_cast<size_t>(width) <= m.size();
       off += static_cast<size_t>(width))
    t.push_back(m.data() + off);
  return t;
}

// The rows of a [rows, width] matrix copied into `paged` in reverse order with gaps between
// them (as in pool pages), and the row table pointing at them: the kernels must not assume
// that row j + 1 follows row j.
std::vector<const float*> Scatter(const std::vector<float>& m, int64_t width,
                                  std::vector<float>* paged) {
  const int64_t rows = width == 0 ? 0 : static_cast<int64_t>(m.size()) / width;
  const int64_t pitch = width + 5;
  paged->assign(static_cast<size_t>(rows * pitch + 1), -7.0f);
  std::vector<const float*> t(static_cast<size_t>(rows));
  for (int64_t j = 0; j < rows; ++j) {
    float* dst = paged->data() + (rows - 1 - j) * pitch + 1;
    std::copy(m.begin() + j * width, m.begin() + (j + 1) * width, dst);
    t[static_cast<size_t>(j)] = dst;
  }
  return t;
}

// bf16 copies of the rows of a [rows, width] matrix (values already bf16-representable).
std::vector<const uint16_t*> Bf16Rows(const std::vector<float>& m, int64_t width,
                                      std::vector<uint16_t>* store) {
  store->resize(m.size());
  for (size_t i = 0; i < m.size(); ++i) (*store)[i] = F32ToBF16(m[i]);
  std::vector<const uint16_t*> t;
  for (size_t off = 0; off + static_cast<size_t>(width) <= m.size();
       off += static_cast<size_t>(width))
    t.push_back(store->data() + off);
  return t;
}

// Rounds every value to the nearest bf16 (so the f32 and bf16 paths see the same weights).
void RoundToBf16(std::vector<float>* v) {
  for (float& f : *v) f = BF16ToF32(F32ToBF16(f));
}

// One adapter per slot: A [rank, in], Bᵀ [rank, out], scale; the kernels read scattered copies
// (f32) or bf16 copies of the same (bf16-representable) values.
struct Adapter {
  int64_t rank = 0;
  float scale = 1.0f;
  std::vector<float> a, bt;                   // contiguous (the oracle reads these)
  std::vector<float> a_paged, bt_paged;       // scattered copies
  std::vector<const float*> a_rows, bt_rows;  // [rank] into the scattered copies
  std::vector<uint16_t> a16, bt16;
  std::vector<const uint16_t*> a16_rows, bt16_rows;
};

struct Problem {
  int64_t in = 0, out = 0, n_rows = 0;
  std::vector<Adapter> adapters;
  std::vector<LoraSegment> segments;
  std::vector<float> x;  // [n_rows, x_stride]
  int64_t x_stride = 0;
  int64_t max_rank = 0;
  bool bf16 = false;  // the kernels read the bf16 rows
};

Problem MakeProblem(int64_t in, int64_t out, const std::vector<int64_t>& ranks,
                    const std::vector<LoraSegment>& segments, int64_t n_rows, uint32_t seed) {
  std::mt19937 rng(seed);
  Problem p;
  p.in = in;
  p.out = out;
  p.n_rows = n_rows;
  p.x_stride = in + 3;  // rows not packed: the kernels must honour strides
  p.x = Random(static_cast<size_t>(n_rows * p.x_stride), &rng);
  for (int64_t r : ranks) {
    Adapter ad;
    ad.rank = r;
    ad.scale = 0.5f + static_cast<float>(p.adapters.size()) * 0.25f;
    ad.a = Random(static_cast<size_t>(r * in), &rng, 1.0f / std::sqrt(static_cast<float>(in)));
    ad.bt = Random(static_cast<size_t>(r * out), &rng, 0.1f);
    RoundToBf16(&ad.a);
    RoundToBf16(&ad.bt);
    ad.a16_rows = Bf16Rows(ad.a, in, &ad.a16);
    ad.bt16_rows = Bf16Rows(ad.bt, out, &ad.bt16);
    ad.a_rows = Scatter(ad.a, in, &ad.a_paged);
    ad.bt_rows = Scatter(ad.bt, out, &ad.bt_paged);
    p.max_rank = std::max(p.max_rank, r);
    p.adapters.push_back(std::move(ad));
  }
  p.segments = segments;
  return p;
}

std::vector<LoraShrinkWeight> ShrinkWeights(const Problem& p) {
  std::vector<LoraShrinkWeight> w;
  for (const Adapter& a : p.adapters) {
    if (p.bf16) {
      w.push_back({nullptr, a.rank, a.a16_rows.data()});
    } else {
      w.push_back({a.a_rows.data(), a.rank});
    }
  }
  return w;
}
std::vector<LoraExpandWeight> ExpandWeights(const Problem& p) {
  std::vector<LoraExpandWeight> w;
  for (const Adapter& a : p.adapters) {
    if (p.bf16) {
      w.push_back({nullptr, a.rank, 0, a.scale, a.bt16_rows.data()});
    } else {
      w.push_back({a.bt_rows.data(), a.rank, 0, a.scale});
    }
  }
  return w;
}

// y0 = random base output; returns y0 + adapter terms via shrink + expand (dispatching kernels
// when `pool_threads` > 0, the reference otherwise).
std::vector<float> RunLora(const Problem& p, const std::vector<float>& y0, int pool_threads) {
  const int64_t v_stride = std::max<int64_t>(p.max_rank, 1) + 1;
  std::vector<float> v(static_cast<size_t>(p.n_rows * v_stride), 0.0f);
  std::vector<float> y = y0;
  const auto sw = ShrinkWeights(p);
  const auto ew = ExpandWeights(p);
  if (pool_threads == 0) {
    reference::LoraShrink(p.segments, sw, p.x.data(), p.x_stride, p.in, v.data(), v_stride);
    reference::LoraExpand(p.segments, ew, v.data(), v_stride, p.out, y.data(), p.out + 1);
  } else {
    ThreadPool pool(pool_threads);
    LoraShrink(p.segments, sw, p.x.data(), p.x_stride, p.in, v.data(), v_stride, &pool);
    LoraExpand(p.segments, ew, v.data(), v_stride, p.out, y.data(), p.out + 1, &pool);
  }
  return y;
}

// Independent oracle in double: y[i] += s·B·(A·x[i]) for rows in segments.
std::vector<double> Oracle(const Problem& p, const std::vector<float>& y0) {
  std::vector<double> y(y0.begin(), y0.end());
  const int64_t ys = p.out + 1;
  for (const LoraSegment& s : p.segments) {
    const Adapter& ad = p.adapters[static_cast<size_t>(s.slot)];
    for (int64_t i = s.row_begin; i < s.row_end; ++i) {
      std::vector<double> t(static_cast<size_t>(ad.rank), 0.0);
      for (int64_t j = 0; j < ad.rank; ++j)
        for (int64_t k = 0; k < p.in; ++k)
          t[static_cast<size_t>(j)] +=
              static_cast<double>(p.x[static_cast<size_t>(i * p.x_stride + k)]) *
              ad.a[static_cast<size_t>(j * p.in + k)];
      for (int64_t c = 0; c < p.out; ++c) {
        double acc = 0;
        for (int64_t j = 0; j < ad.rank; ++j)
          acc += t[static_cast<size_t>(j)] * ad.bt[static_cast<size_t>(j * p.out + c)];
        y[static_cast<size_t>(i * ys + c)] += ad.scale * acc;
      }
    }
  }
  return y;
}

// max |a - b| / (1 + |b|) over all elements.
template <typename T>
double MaxRelErr(const std::vector<float>& a, const std::vector<T>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    m = std::max(m, std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i])) /
                        (1.0 + std::fabs(static_cast<double>(b[i]))));
  }
  return m;
}

std::vector<float> BaseOutput(const Problem& p, uint32_t seed) {
  std::mt19937 rng(seed);
  return Random(static_cast<size_t>(p.n_rows * (p.out + 1)), &rng);
}

struct Case {
  std::string name;
  int64_t in, out;
  std::vector<int64_t> ranks;
  std::vector<LoraSegment> segments;
  int64_t n_rows;
};

std::vector<Case> Cases() {
  std::vector<Case> cs;
  // One long prefill segment per rank, at awkward widths.
  for (int64_t r : {1, 8, 16, 64, 256}) {
    cs.push_back({"prefill_r" + std::to_string(r), 67, 45, {r}, {{0, 37, 0}}, 37});
    cs.push_back({"prefill_wide_r" + std::to_string(r), 256, 272, {r}, {{0, 9, 0}}, 9});
  }
  // Decode: one row per segment, mixed ranks, slots reused, a base row between segments.
  cs.push_back({"decode_mixed",
                130,
                99,
                {1, 8, 16, 64, 256},
                {{0, 1, 0}, {1, 2, 1}, {2, 3, 2}, {4, 5, 3}, {5, 6, 4}, {6, 7, 1}, {7, 8, 0}},
                9});
  // Many segments, including empty ones and a rank-0 slot (adapter without this linear).
  {
    Case c{"many_segments", 33, 17, {3, 0, 8, 64, 1}, {}, 0};
    int64_t row = 0;
    for (int s = 0; s < 40; ++s) {
      const int64_t len = (s * 7) % 5;  // 0..4 rows, some empty
      c.segments.push_back({row, row + len, s % 5});
      row += len + (s % 3 == 0 ? 1 : 0);  // gaps = base-model rows
    }
    c.n_rows = row;
    cs.push_back(c);
  }
  // Outputs wider than one expand block (streamed passes of 1024 columns below 4 rows; packed
  // blocks of ≤ 2048 columns from 4 rows): segments of 1, 2, 3 and 5 rows.
  cs.push_back({"wide_blocks",
                40,
                2100,
                {64, 8, 3, 256},
                {{0, 1, 0}, {1, 3, 1}, {3, 6, 2}, {6, 11, 0}, {11, 12, 3}, {12, 16, 3}},
                16});
  // Tiny widths (below one vector) and exactly one vector.
  cs.push_back({"tiny", 5, 3, {2, 1}, {{0, 3, 0}, {3, 5, 1}}, 6});
  cs.push_back({"one_vector", 16, 16, {16, 8}, {{0, 4, 1}, {4, 9, 0}}, 9});
  cs.push_back({"eight", 8, 8, {8}, {{0, 5, 0}}, 5});
  return cs;
}

TEST(LoraKernelTest, ReferenceMatchesDoubleOracle) {
  for (const Case& c : Cases()) {
    Problem p = MakeProblem(c.in, c.out, c.ranks, c.segments, c.n_rows, 11);
    auto y0 = BaseOutput(p, 5);
    auto got = RunLora(p, y0, 0);
    auto want = Oracle(p, y0);
    EXPECT_LT(MaxRelErr(got, want), 2e-5) << c.name;
  }
}

TEST(LoraKernelTest, RowsOutsideSegmentsAreUntouched) {
  Problem p = MakeProblem(40, 24, {8}, {{2, 4, 0}}, 7, 3);
  auto y0 = BaseOutput(p, 9);
  for (IsaLevel level : SupportedLevels()) {
    IsaGuard g;
    SetMaxIsa(level);
    auto y = RunLora(p, y0, 2);
    for (int64_t i = 0; i < p.n_rows; ++i) {
      if (i >= 2 && i < 4) continue;
      EXPECT_EQ(0, std::memcmp(y.data() + i * (p.out + 1), y0.data() + i * (p.out + 1),
                               static_cast<size_t>(p.out + 1) * sizeof(float)))
          << IsaName(level) << " row " << i;
    }
    // The padding column of every row (beyond `out`) is never written.
    for (int64_t i = 2; i < 4; ++i)
      EXPECT_EQ(y[static_cast<size_t>(i * (p.out + 1) + p.out)],
                y0[static_cast<size_t>(i * (p.out + 1) + p.out)]);
  }
}

TEST(LoraKernelTest, EveryIsaLevelMatchesReference) {
  std::string levels;
  for (IsaLevel l : SupportedLevels()) levels += IsaName(l) + " ";
  std::printf("ISA levels exercised: %s\n", levels.c_str());
  for (const Case& c : Cases()) {
    Problem p = MakeProblem(c.in, c.out, c.ranks, c.segments, c.n_rows, 21);
    auto y0 = BaseOutput(p, 7);
    auto ref = RunLora(p, y0, 0);
    for (IsaLevel level : SupportedLevels()) {
      IsaGuard g;
      SetMaxIsa(level);
      for (int threads : {1, 2, 3}) {
        auto got = RunLora(p, y0, threads);
        EXPECT_LT(MaxRelErr(got, ref), 1e-5) << c.name << " " << IsaName(level) << " t" << threads;
        if (level == IsaLevel::kScalar) {
          EXPECT_EQ(0, std::memcmp(got.data(), ref.data(), got.size() * sizeof(float)))
              << "scalar dispatch must equal the reference bitwise: " << c.name;
        }
      }
    }
  }
}

TEST(LoraKernelTest, FusedShrinkEqualsSeparateShrinks) {
  // q|k|v of two adapters with different per-linear ranks (0 = not targeted).
  std::mt19937 rng(4);
  const int64_t in = 72, n_rows = 6;
  const int64_t outs[3] = {40, 24, 24};
  const int64_t ranks[2][3] = {{8, 0, 4}, {16, 16, 16}};
  std::vector<float> x = Random(static_cast<size_t>(n_rows * in), &rng);
  std::vector<std::vector<float>> a_sep[2], bt[2], a_cat(2);
  for (int ad = 0; ad < 2; ++ad) {
    for (int l = 0; l < 3; ++l) {
      a_sep[ad].push_back(Random(static_cast<size_t>(ranks[ad][l] * in), &rng));
      bt[ad].push_back(Random(static_cast<size_t>(ranks[ad][l] * outs[l]), &rng));
      a_cat[static_cast<size_t>(ad)].insert(a_cat[static_cast<size_t>(ad)].end(),
                                            a_sep[ad].back().begin(), a_sep[ad].back().end());
    }
  }
  const std::vector<LoraSegment> segs = {{0, 2, 1}, {3, 6, 0}};
  for (IsaLevel level : SupportedLevels()) {
    IsaGuard g;
    SetMaxIsa(level);
    ThreadPool pool(2);
    // Fused: one shrink of rank Σr into v [n_rows, 48], expands read their column ranges.
    const int64_t vs = 48;
    std::vector<float> v(static_cast<size_t>(n_rows * vs), 0.0f);
    const auto cat0 = RowTable(a_cat[0], in), cat1 = RowTable(a_cat[1], in);
    std::vector<LoraShrinkWeight> fw = {{cat0.data(), 12}, {cat1.data(), 48}};
    LoraShrink(segs, fw, x.data(), in, in, v.data(), vs, &pool);
    for (int l = 0; l < 3; ++l) {
      std::vector<float> y_fused(static_cast<size_t>(n_rows * outs[l]), 1.0f), y_sep = y_fused;
      std::vector<LoraExpandWeight> ew(2);
      std::vector<const float*> bt_rows[2];
      for (int ad = 0; ad < 2; ++ad) {
        int64_t col = 0;
        for (int q = 0; q < l; ++q) col += ranks[ad][q];
        bt_rows[ad] = RowTable(bt[ad][static_cast<size_t>(l)], outs[l]);
        ew[static_cast<size_t>(ad)] = {bt_rows[ad].data(), ranks[ad][l], col, 2.0f};
      }
      LoraExpand(segs, ew, v.data(), vs, outs[l], y_fused.data(), outs[l], &pool);
      // Separate shrink per linear.
      std::vector<float> v2(static_cast<size_t>(n_rows * 16), 0.0f);
      const auto sep0 = RowTable(a_sep[0][static_cast<size_t>(l)], in);
      const auto sep1 = RowTable(a_sep[1][static_cast<size_t>(l)], in);
      std::vector<LoraShrinkWeight> sw = {{sep0.data(), ranks[0][l]}, {sep1.data(), ranks[1][l]}};
      LoraShrink(segs, sw, x.data(), in, in, v2.data(), 16, &pool);
      std::vector<LoraExpandWeight> ew2 = ew;
      for (auto& w : ew2) w.v_col = 0;
      LoraExpand(segs, ew2, v2.data(), 16, outs[l], y_sep.data(), outs[l], &pool);
      // Each (row, j) dot product is computed the same way in both: bitwise equal.
      EXPECT_EQ(0, std::memcmp(y_fused.data(), y_sep.data(), y_sep.size() * sizeof(float)))
          << IsaName(level) << " linear " << l;
    }
  }
}

// bf16 rows are widened exactly and take the f32 path: every ISA level (and the reference)
// gives bitwise the result of its f32 path on the same values, at any thread count.
TEST(LoraKernelTest, Bf16RowsEqualF32RowsOfTheSameValues) {
  for (const Case& c : Cases()) {
    Problem p = MakeProblem(c.in, c.out, c.ranks, c.segments, c.n_rows, 31);
    auto y0 = BaseOutput(p, 3);
    Problem q = p;
    q.bf16 = true;
    EXPECT_EQ(RunLora(p, y0, 0), RunLora(q, y0, 0)) << "reference " << c.name;
    for (IsaLevel level : SupportedLevels()) {
      IsaGuard g;
      SetMaxIsa(level);
      for (int threads : {1, 2, 3}) {
        EXPECT_EQ(RunLora(p, y0, threads), RunLora(q, y0, threads))
            << c.name << " " << IsaName(level) << " t" << threads;
      }
    }
  }
}

// The two batch shapes of the bitwise tests: prefill-like, 6 adapters on segments of 3..9 rows
// (threads split the columns), or decode-like, 12 adapters on one row each (threads take whole
// segments). Slot s holds ranks[s]; *n_rows gets the batch's row count.
std::vector<int64_t> BatchRanks(bool decode) {
  std::vector<int64_t> ranks = {1, 8, 16, 64, 256, 5};
  if (decode) ranks.insert(ranks.end(), {7, 32, 2, 64, 16, 128});
  return ranks;
}
std::vector<LoraSegment> BatchSegments(size_t n_adapters, bool decode, int64_t* n_rows) {
  std::vector<LoraSegment> segs;
  int64_t row = 0;
  for (int64_t s = 0; s < static_cast<int64_t>(n_adapters); ++s) {
    const int64_t len = decode ? 1 : 3 + (s * 5) % 7;
    segs.push_back({row, row + len, static_cast<int32_t>(s)});
    row += len;
  }
  *n_rows = row;
  return segs;
}

// Runs fn(decode, bf16, level, ranks, segments, n_rows) for both batch shapes, f32 and bf16
// weights, at every ISA level the machine supports (set while fn runs).
template <class Fn>
void ForEachBatchShape(Fn&& fn) {
  for (bool decode : {false, true})
    for (bool bf16 : {false, true})
      for (IsaLevel level : SupportedLevels()) {
        IsaGuard g;
        SetMaxIsa(level);
        const std::vector<int64_t> ranks = BatchRanks(decode);
        int64_t n_rows = 0;
        const std::vector<LoraSegment> segs = BatchSegments(ranks.size(), decode, &n_rows);
        fn(decode, bf16, level, ranks, segs, n_rows);
      }
}

// A row's result is bitwise the same alone, in a batch of mixed adapters, in a different tile
// position, and at any thread count (f32 and bf16 weights).
TEST(LoraKernelTest, BatchInvariantBitwise) {
  const int64_t in = 200, out = 136;
  // Each probe row (row 2 of its segment, or the row of a one-row segment) must match the same
  // row computed alone (one segment: columns split) bitwise.
  ForEachBatchShape([&](bool decode, bool bf16, IsaLevel level, const std::vector<int64_t>& ranks,
                        const std::vector<LoraSegment>& segs, int64_t row) {
    for (int64_t target_slot = 0; target_slot < static_cast<int64_t>(ranks.size()); ++target_slot) {
      const int64_t probe_row = segs[static_cast<size_t>(target_slot)].row_begin + (decode ? 0 : 2);
      Problem batch = MakeProblem(in, out, ranks, segs, row, 99);
      batch.bf16 = bf16;
      auto y0 = BaseOutput(batch, 1);
      // Alone: the same adapters, one segment of one row holding the probe row's input.
      Problem alone = batch;
      alone.n_rows = 1;
      alone.x.assign(batch.x.begin() + probe_row * batch.x_stride,
                     batch.x.begin() + (probe_row + 1) * batch.x_stride);
      alone.segments = {{0, 1, static_cast<int32_t>(target_slot)}};
      std::vector<float> y0_alone(y0.begin() + probe_row * (out + 1),
                                  y0.begin() + (probe_row + 1) * (out + 1));
      auto want = RunLora(alone, y0_alone, 1);
      for (int threads : {1, 2, 3}) {
        auto got = RunLora(batch, y0, threads);
        EXPECT_EQ(0, std::memcmp(got.data() + probe_row * (out + 1), want.data(),
                                 static_cast<size_t>(out) * sizeof(float)))
            << IsaName(level) << (decode ? " decode" : " prefill") << " slot " << target_slot
            << " threads " << threads;
      }
    }
  });
}

// LoraShrinkExpand (one dispatch, threads taking whole segments when there are many) gives
// bitwise what LoraShrink followed by LoraExpand per output gives, for outputs of different
// widths sharing one shrink, on every ISA level and thread count.
TEST(LoraKernelTest, ShrinkExpandEqualsSeparateCallsBitwise) {
  const int64_t in = 200;
  const int64_t outs_w[] = {256, 136, 2048};
  ForEachBatchShape([&](bool decode, bool bf16, IsaLevel level, const std::vector<int64_t>& ranks,
                        const std::vector<LoraSegment>& segs, int64_t row) {
    std::vector<Problem> probs;
    for (int o = 0; o < 3; ++o) {
      probs.push_back(MakeProblem(in, outs_w[o], ranks, segs, row, 31 + o));
      probs.back().bf16 = bf16;
    }
    const Problem& p0 = probs[0];
    const int64_t v_stride = p0.max_rank + 1;
    const auto sw = ShrinkWeights(p0);
    std::vector<std::vector<LoraExpandWeight>> ew;
    std::vector<std::vector<float>> y0;
    for (const Problem& p : probs) {
      ew.push_back(ExpandWeights(p));
      y0.push_back(BaseOutput(p, 3));
    }
    for (int threads : {1, 2, 3}) {
      ThreadPool pool(threads);
      std::vector<float> v(static_cast<size_t>(row * v_stride), 0.0f);
      std::vector<std::vector<float>> want = y0, got = y0;
      LoraShrink(segs, sw, p0.x.data(), p0.x_stride, in, v.data(), v_stride, &pool);
      for (int o = 0; o < 3; ++o)
        LoraExpand(segs, ew[o], v.data(), v_stride, outs_w[o], want[o].data(), outs_w[o] + 1,
                   &pool);
      std::vector<float> v2(v.size(), 0.0f);
      std::vector<LoraExpandOut> outs;
      for (int o = 0; o < 3; ++o) outs.push_back({ew[o], outs_w[o], got[o].data(), outs_w[o] + 1});
      LoraShrinkExpand(segs, sw, p0.x.data(), p0.x_stride, in, v2.data(), v_stride, outs, &pool);
      for (int o = 0; o < 3; ++o) {
        EXPECT_EQ(0, std::memcmp(want[o].data(), got[o].data(), want[o].size() * 4))
            << IsaName(level) << (decode ? " decode" : " prefill") << (bf16 ? " bf16" : "")
            << " out " << outs_w[o] << " threads " << threads;
      }
    }
  });
}

}  // namespace
}  // namespace chorus::kernels
