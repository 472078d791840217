#include "chorus/kernels/delta.h"

#include <algorithm>
#include <iterator>
#include <vector>

#include "chorus/base/check.h"
#include "chorus/kernels/delta_internal.h"
#include "chorus/kernels/dispatch.h"

namespace chorus::kernels {
namespace {

using delta_internal::kPairs24;

// Code j of a row's little-endian bit stream of `bits`-bit codes.
inline int CodeAt(const uint8_t* row, int64_t j, int bits) {
  const int64_t bit = j * bits;
  const int64_t byte = bit >> 3;
  const int shift = static_cast<int>(bit & 7);
  // Two bytes cover any code of ≤ 8 bits at any shift; the second is read only when needed.
  uint32_t v = row[byte];
  if (shift + bits > 8) v |= static_cast<uint32_t>(row[byte + 1]) << 8;
  return static_cast<int>((v >> shift) & ((1u << bits) - 1u));
}

// Σ_k a[k]·b[k] in the fixed order DeltaApply promises: 16 partial sums, then pairwise.
inline float Dot16(const float* a, const float* b, int64_t n) {
  float acc[16] = {};
  int64_t k = 0;
  for (; k + 16 <= n; k += 16)
    for (int l = 0; l < 16; ++l) acc[l] += a[k + l] * b[k + l];
  for (int l = 0; k + l < n; ++l) acc[l] += a[k + l] * b[k + l];
  for (int w = 8; w >= 1; w /= 2)
    for (int l = 0; l < w; ++l) acc[l] += acc[l + w];
  return acc[0];
}

void CheckArgs(std::span<const LoraSegment> segments, std::span<const DeltaMatrixView> weights) {
  for (const LoraSegment& s : segments) {
    CHORUS_CHECK(s.slot >= 0 && static_cast<size_t>(s.slot) < weights.size())
        << "delta segment slot " << s.slot << " of " << weights.size();
    CHORUS_CHECK(s.row_begin <= s.row_end);
  }
}

}  // namespace

// The three 2:4 patterns packed in one mask byte (p0 + 6·p1 + 36·p2), for every byte value.
struct PatternTriples {
  uint8_t p[216][3];
  constexpr PatternTriples() : p() {
    for (int v = 0; v < 216; ++v) {
      p[v][0] = static_cast<uint8_t>(v % 6);
      p[v][1] = static_cast<uint8_t>(v / 6 % 6);
      p[v][2] = static_cast<uint8_t>(v / 36);
    }
  }
};
constexpr PatternTriples kTriples;

namespace delta_internal {

void DecodeColumns(const DeltaMatrixView& m, int64_t o, int64_t c_begin, float* out) {
  const uint8_t* codes = m.codes + o * m.code_row_bytes();
  const float half = static_cast<float>((1 << m.bits) - 1) / 2.0f;
  // Scales change every group_size columns (or never): the dense path walks the row one scale
  // run at a time.
  const int64_t run = m.group_size == 0 ? m.cols : m.group_size;
  const float* row_scales = m.group_size == 0 ? m.scales : m.scales + o * m.groups();
  if (!m.sparse24) {
    for (int64_t c0 = c_begin; c0 < m.cols;) {
      const int64_t g = c0 / run;
      const float s = m.group_size == 0 ? row_scales[0] : row_scales[g];
      const int64_t c1 = std::min(m.cols, (g + 1) * run);
      if (m.bits == 4) {
        for (int64_t c = c0; c < c1; ++c)
          out[c - c_begin] = s * (static_cast<float>((codes[c >> 1] >> ((c & 1) * 4)) & 15) - half);
      } else {
        for (int64_t c = c0; c < c1; ++c)
          out[c - c_begin] = s * (static_cast<float>(CodeAt(codes, c, m.bits)) - half);
      }
      c0 = c1;
    }
    return;
  }
  CHORUS_CHECK(c_begin % 12 == 0) << "2:4 decode from column " << c_begin;
  const uint8_t* mask = m.mask + o * m.mask_row_bytes();
  std::fill(out, out + (m.cols - c_begin), 0.0f);
  const int64_t n_groups = m.cols / 4;
  const bool split_groups = m.group_size % 4 != 0;
  for (int64_t g = c_begin / 4; g < n_groups; ++g) {
    const int p = kTriples.p[mask[g / 3]][g % 3];
    const int64_t c = g * 4;
    const int64_t c0 = c + kPairs24[p][0], c1 = c + kPairs24[p][1];
    int q0, q1;
    if (m.bits == 4) {
      const uint8_t byte = codes[g];  // the group's two kept values, low nibble first
      q0 = byte & 15;
      q1 = byte >> 4;
    } else {
      q0 = CodeAt(codes, g * 2, m.bits);
      q1 = CodeAt(codes, g * 2 + 1, m.bits);
    }
    // The two kept columns share a scale unless a scale group boundary falls inside the 4.
    const float s0 = m.group_size == 0 ? row_scales[0] : row_scales[c0 / m.group_size];
    const float s1 = m.group_size == 0 || !split_groups ? s0 : row_scales[c1 / m.group_size];
    out[c0 - c_begin] = s0 * (static_cast<float>(q0) - half);
    out[c1 - c_begin] = s1 * (static_cast<float>(q1) - half);
  }
}

}  // namespace delta_internal

void DeltaDecodeRow(const DeltaMatrixView& m, int64_t o, float* out) {
  delta_internal::DecodeColumns(m, o, 0, out);
}

void DeltaApplyReference(std::span<const LoraSegment> segments,
                         std::span<const DeltaMatrixView> weights, const float* x, int64_t x_stride,
                         float* y, int64_t y_stride) {
  CheckArgs(segments, weights);
  std::vector<float> row;
  for (const LoraSegment& s : segments) {
    const DeltaMatrixView& m = weights[static_cast<size_t>(s.slot)];
    if (m.rows == 0) continue;
    row.resize(static_cast<size_t>(m.cols));
    for (int64_t o = 0; o < m.rows; ++o) {
      DeltaDecodeRow(m, o, row.data());
      for (int64_t i = s.row_begin; i < s.row_end; ++i) {
        float sum = 0;
        for (int64_t k = 0; k < m.cols; ++k)
          sum += x[i * x_stride + k] * row[static_cast<size_t>(k)];
        y[i * y_stride + o] += sum;
      }
    }
  }
}

namespace {

// The SIMD kernel of each level (indexed by IsaLevel; nullptr: the portable kernel). amx has no
// delta kernel of its own: tiles need int8 or bf16 operands and the delta term is f32.
constexpr delta_internal::ApplyRowsFn kApplyRows[] = {nullptr, delta_internal::avx2::ApplyRows,
                                                      delta_internal::avx512::ApplyRows,
                                                      delta_internal::avx512::ApplyRows};
static_assert(std::size(kApplyRows) == static_cast<size_t>(kMaxIsaLevel) + 1);

// The portable kernel for output rows [o_begin, o_end) of one segment: decode each row into L1,
// then one fixed-order dot product per input row.
void PortableRows(const DeltaMatrixView& m, int64_t o_begin, int64_t o_end, const float* x,
                  int64_t x_stride, int64_t n_rows, float* y, int64_t y_stride) {
  thread_local std::vector<float> row;
  if (row.size() < static_cast<size_t>(m.cols)) row.resize(static_cast<size_t>(m.cols));
  for (int64_t o = o_begin; o < o_end; ++o) {
    DeltaDecodeRow(m, o, row.data());
    for (int64_t i = 0; i < n_rows; ++i)
      y[i * y_stride + o] += Dot16(x + i * x_stride, row.data(), m.cols);
  }
}

}  // namespace

void DeltaApply(std::span<const LoraSegment> segments, std::span<const DeltaMatrixView> weights,
                const float* x, int64_t x_stride, float* y, int64_t y_stride, ThreadPool* pool) {
  CheckArgs(segments, weights);
  int64_t max_rows = 0;
  for (const LoraSegment& s : segments)
    if (s.row_end > s.row_begin)
      max_rows = std::max(max_rows, weights[static_cast<size_t>(s.slot)].rows);
  if (max_rows == 0) return;
  const delta_internal::ApplyRowsFn simd = kApplyRows[static_cast<int>(ActiveIsa())];
  // Thread t owns output rows [begin, end) of every slot: each output element is computed whole
  // by one thread (no split of k), so the split never changes a value.
  auto work = [&](int t, int nt) {
    int64_t begin, end;
    ThreadPool::Slice(max_rows, t, nt, 8, &begin, &end);
    for (const LoraSegment& s : segments) {
      const DeltaMatrixView& m = weights[static_cast<size_t>(s.slot)];
      if (m.rows == 0 || s.row_end <= s.row_begin || begin >= m.rows) continue;
      const auto rows_fn = simd != nullptr && delta_internal::SimdLayout(m) ? simd : PortableRows;
      rows_fn(m, begin, std::min(end, m.rows), x + s.row_begin * x_stride, x_stride,
              s.row_end - s.row_begin, y + s.row_begin * y_stride, y_stride);
    }
  };
  if (pool == nullptr || pool->size() == 1) {
    work(0, 1);
  } else {
    pool->Run(work);
  }
}

}  // namespace chorus::kernels
