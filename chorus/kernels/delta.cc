#include "chorus/kernels/delta.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
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
  for (const DeltaMatrixView& m : weights) {
    if (m.bands.empty()) continue;
    int64_t next = 0;
    for (const DeltaBand& b : m.bands) {
      CHORUS_CHECK(b.row_begin == next && b.row_end > b.row_begin)
          << "delta bands must cover the rows in order: band [" << b.row_begin << ", " << b.row_end
          << ") after row " << next;
      next = b.row_end;
    }
    CHORUS_CHECK(next == m.rows) << "delta bands cover " << next << " of " << m.rows << " rows";
  }
}

}  // namespace

DeltaMatrixView DeltaBandView(const DeltaMatrixView& m, const DeltaBand& b) {
  DeltaMatrixView v = m;
  v.rows = b.row_end - b.row_begin;
  v.codes = b.codes;
  v.mask = b.mask;
  v.positions = b.positions;
  if (m.group_size != 0) v.scales = b.scales;
  v.bands = {};
  return v;
}

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

// The kept-position fields (DeltaMatrixView::positions: p0 | p1 << 2 per group) of a mask byte's
// three groups, group k at bits 4k; bytes above the largest pattern code (rejected when a delta
// is read) give 0.
struct TriplePositions {
  uint16_t f[256];
  constexpr TriplePositions() : f() {
    for (int v = 0; v < 216; ++v) {
      int field = 0;
      for (int k = 0; k < 3; ++k) {
        const int p = kTriples.p[v][k];
        field |= (kPairs24[p][0] | kPairs24[p][1] << 2) << (4 * k);
      }
      f[v] = static_cast<uint16_t>(field);
    }
  }
};
constexpr TriplePositions kTriplePositions;

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
  for (const DeltaBand& b : m.bands) {
    if (o >= b.row_begin && o < b.row_end) {
      delta_internal::DecodeColumns(DeltaBandView(m, b), o - b.row_begin, 0, out);
      return;
    }
  }
  CHORUS_CHECK(m.bands.empty()) << "row " << o << " is in no band";
  delta_internal::DecodeColumns(m, o, 0, out);
}

std::vector<uint64_t> DeltaKeptPositions(const DeltaMatrixView& m) {
  CHORUS_CHECK(m.sparse24) << "kept positions of a dense delta matrix";
  CHORUS_CHECK(m.bands.empty()) << "kept positions of a banded delta matrix";
  const int64_t words = m.position_row_words();
  std::vector<uint64_t> positions(static_cast<size_t>(m.rows * words), 0);
  const int64_t n4 = m.cols / 4, full_bytes = n4 / 3;
  for (int64_t o = 0; o < m.rows; ++o) {
    const uint8_t* mask = m.mask + o * m.mask_row_bytes();
    uint64_t* row = positions.data() + o * words;
    // 12 bits per mask byte appended to a bit stream of 4-bit fields (a delta of TinyLlama's
    // shape has 92 M mask bytes: this runs at load, per group it took ~3 s).
    uint64_t acc = 0;
    int n_bits = 0;
    auto push = [&](uint64_t bits, int n) {
      acc |= bits << n_bits;
      n_bits += n;
      if (n_bits >= 64) {
        *row++ = acc;
        n_bits -= 64;
        acc = n_bits > 0 ? bits >> (n - n_bits) : 0;
      }
    };
    for (int64_t b = 0; b < full_bytes; ++b) push(kTriplePositions.f[mask[b]], 12);
    for (int64_t g = 3 * full_bytes; g < n4; ++g) {
      push(kTriplePositions.f[mask[full_bytes]] >> (4 * (g % 3)) & 15u, 4);
    }
    if (n_bits > 0) *row = acc;
  }
  return positions;
}

bool DeltaInt16Layout(const DeltaMatrixView& m) {
  const uint64_t* positions = m.bands.empty() ? m.positions : m.bands.front().positions;
  const bool bits_ok = m.sparse24 ? (m.bits == 2 || m.bits == 4) && positions != nullptr
                                  : m.bits == 1 || m.bits == 2 || m.bits == 4 || m.bits == 8;
  return m.rows > 0 && bits_ok && (m.group_size == 0 || m.group_size % 64 == 0);
}

bool DeltaInt16Fast() {
  const CpuFeatures& f = DetectCpu();
  return static_cast<int>(ActiveIsa()) >= static_cast<int>(IsaLevel::kAvx512) && f.avx512vbmi &&
         f.avx512vbmi2;
}

namespace {
// −1: automatic; else a DeltaActivations value.
std::atomic<int> g_delta_activations{-1};
}  // namespace

DeltaActivations DefaultDeltaActivations() {
  const int forced = g_delta_activations.load(std::memory_order_relaxed);
  if (forced >= 0) return static_cast<DeltaActivations>(forced);
  return DeltaInt16Fast() ? DeltaActivations::kInt16 : DeltaActivations::kF32;
}

void SetDeltaActivations(std::optional<DeltaActivations> activations) {
  g_delta_activations.store(activations ? static_cast<int>(*activations) : -1);
}

std::string DeltaActivationsName(DeltaActivations activations) {
  return activations == DeltaActivations::kInt16 ? "int16" : "f32";
}

bool ParseDeltaActivations(const std::string& name, std::optional<DeltaActivations>* out) {
  if (name == "auto") {
    *out = std::nullopt;
  } else if (name == "int16") {
    *out = DeltaActivations::kInt16;
  } else if (name == "f32") {
    *out = DeltaActivations::kF32;
  } else {
    return false;
  }
  return true;
}

namespace delta_internal::q16 {

void Quantize(const float* x, int64_t xs, int64_t n, int64_t cols, bool column_order, int max_code,
              int16_t* q, float* scales) {
  const int64_t padded = PaddedCols(cols);
  const auto top = static_cast<float>(max_code);
  for (int64_t i = 0; i < n; ++i) {
    const float* row = x + i * xs;
    int16_t* out = q + i * padded;
    std::fill(out, out + padded, int16_t{0});
    // max|x| on the bits: with the sign cleared, a float's bits order as its value does, and an
    // infinity or NaN has bits ≥ 0x7F800000 (a float comparison would drop a NaN).
    uint32_t max_bits = 0;
    for (int64_t c = 0; c < cols; ++c) {
      uint32_t b;
      std::memcpy(&b, row + c, 4);
      b &= 0x7FFFFFFFu;
      max_bits = b > max_bits ? b : max_bits;
    }
    if (max_bits >= 0x7F800000u) {
      scales[i] = std::nanf("");
      continue;
    }
    float max_abs;
    std::memcpy(&max_abs, &max_bits, 4);
    const float inv = top / max_abs;  // +inf for a zero row
    if (!(inv <= std::numeric_limits<float>::max())) {
      scales[i] = 0;
      continue;
    }
    // Round to nearest, ties to even (std::nearbyint's default mode, without its library call):
    // for |v| < 2^22, v + 1.5·2^23 lands where the float spacing is 1.
    constexpr float kRound = 12582912.0f;
    auto quantize = [&](int64_t c) {
      const float v = std::clamp((row[c] * inv + kRound) - kRound, -top, top);
      return static_cast<int16_t>(v);
    };
    if (column_order) {
      for (int64_t c = 0; c < cols; ++c) out[c] = quantize(c);
    } else {
      for (int64_t c = 0; c < cols; ++c) out[Q16Position(c, false)] = quantize(c);
    }
    scales[i] = max_abs / top;
  }
}

namespace {

// Row o's integer weights w' = 2·code − (2^bits − 1), pruned columns and columns ≥ cols 0,
// decoded from the codes and the pattern bytes (not the kept positions the SIMD kernel reads).
void IntegerRow(const DeltaMatrixView& m, int64_t o, int16_t* w) {
  const int64_t padded = PaddedCols(m.cols);
  std::fill(w, w + padded, int16_t{0});
  const uint8_t* codes = m.codes + o * m.code_row_bytes();
  const int offset = (1 << m.bits) - 1;
  auto value = [&](int64_t j) {
    return static_cast<int16_t>(2 * CodeAt(codes, j, m.bits) - offset);
  };
  if (!m.sparse24) {
    for (int64_t c = 0; c < m.cols; ++c) w[c] = value(c);
    return;
  }
  const uint8_t* mask = m.mask + o * m.mask_row_bytes();
  for (int64_t g = 0; g < m.cols / 4; ++g) {
    const int p = kTriples.p[mask[g / 3]][g % 3];
    w[4 * g + kPairs24[p][0]] = value(2 * g);
    w[4 * g + kPairs24[p][1]] = value(2 * g + 1);
  }
}

}  // namespace

void PortableRows(const DeltaMatrixView& m, int64_t o_begin, int64_t o_end, const int16_t* q,
                  const float* x_scales, int64_t n_rows, float* y, int64_t y_stride) {
  const int64_t padded = PaddedCols(m.cols);
  thread_local std::vector<int16_t> w;
  w.resize(static_cast<size_t>(padded));
  const bool column_order = ColumnOrder(m);
  for (int64_t o = o_begin; o < o_end; ++o) {
    IntegerRow(m, o, w.data());
    const float* row_scales = m.group_size == 0 ? m.scales : m.scales + o * m.groups();
    for (int64_t i = 0; i < n_rows; ++i) {
      const int16_t* qi = q + i * padded;
      if (SignRowSum(m)) {
        int64_t total = 0;
        for (int64_t c = 0; c < padded; ++c)
          total += int64_t{w[static_cast<size_t>(c)]} * int64_t{qi[c]};
        const float term = (static_cast<float>(total) * (row_scales[0] * 0.5f)) * x_scales[i];
        y[i * y_stride + o] += term;
        continue;
      }
      float acc[16] = {};
      for (int64_t b = 0; b < padded / 64; ++b) {
        const float half_scale =
            (m.group_size == 0 ? row_scales[0] : row_scales[64 * b / m.group_size]) * 0.5f;
        for (int l = 0; l < 16; ++l) {
          int32_t sum = 0;
          for (int64_t c = 64 * b + 4 * l; c < 64 * b + 4 * l + 4; ++c)
            sum += int32_t{w[static_cast<size_t>(c)]} * int32_t{qi[Q16Position(c, column_order)]};
          acc[l] = std::fma(static_cast<float>(sum), half_scale, acc[l]);
        }
      }
      for (int width = 8; width >= 1; width /= 2)
        for (int l = 0; l < width; ++l) acc[l] += acc[l + width];
      const float term = acc[0] * x_scales[i];
      y[i * y_stride + o] += term;
    }
  }
}

}  // namespace delta_internal::q16

namespace {

// x rows of the segments the int16 path takes, quantized once per call (segment k's rows at
// offsets[k]; −1: the segment runs the f32 path) by `quantize` (the portable Quantize or its
// AVX-512 form: the same bits).
struct QuantizedRows {
  std::vector<int16_t> q;
  std::vector<float> scales;
  std::vector<int64_t> q_offset, scale_offset;

  void Build(std::span<const LoraSegment> segments, std::span<const DeltaMatrixView> weights,
             const float* x, int64_t x_stride, delta_internal::q16::QuantizeFn quantize) {
    q_offset.assign(segments.size(), -1);
    scale_offset.assign(segments.size(), -1);
    int64_t q_size = 0, n_scales = 0;
    for (size_t k = 0; k < segments.size(); ++k) {
      const LoraSegment& s = segments[k];
      const DeltaMatrixView& m = weights[static_cast<size_t>(s.slot)];
      if (s.row_end <= s.row_begin || !DeltaInt16Layout(m)) continue;
      q_offset[k] = q_size;
      scale_offset[k] = n_scales;
      q_size += (s.row_end - s.row_begin) * delta_internal::q16::PaddedCols(m.cols);
      n_scales += s.row_end - s.row_begin;
    }
    q.resize(static_cast<size_t>(q_size));
    scales.resize(static_cast<size_t>(n_scales));
    for (size_t k = 0; k < segments.size(); ++k) {
      if (q_offset[k] < 0) continue;
      const LoraSegment& s = segments[k];
      quantize(x + s.row_begin * x_stride, x_stride, s.row_end - s.row_begin,
               weights[static_cast<size_t>(s.slot)].cols,
               delta_internal::q16::ColumnOrder(weights[static_cast<size_t>(s.slot)]),
               delta_internal::q16::MaxCode(weights[static_cast<size_t>(s.slot)]),
               q.data() + q_offset[k], scales.data() + scale_offset[k]);
    }
  }
};

}  // namespace

void DeltaApplyReference(std::span<const LoraSegment> segments,
                         std::span<const DeltaMatrixView> weights, const float* x, int64_t x_stride,
                         float* y, int64_t y_stride, DeltaActivations activations) {
  CheckArgs(segments, weights);
  QuantizedRows quantized;
  if (activations == DeltaActivations::kInt16)
    quantized.Build(segments, weights, x, x_stride, delta_internal::q16::Quantize);
  std::vector<float> row;
  for (size_t k = 0; k < segments.size(); ++k) {
    const LoraSegment& s = segments[k];
    const DeltaMatrixView& m = weights[static_cast<size_t>(s.slot)];
    if (m.rows == 0) continue;
    if (activations == DeltaActivations::kInt16 && quantized.q_offset[k] >= 0) {
      delta_internal::ForEachBand(
          m, 0, m.rows, [&](const DeltaMatrixView& v, int64_t lo, int64_t hi, int64_t first) {
            delta_internal::q16::PortableRows(v, lo, hi, quantized.q.data() + quantized.q_offset[k],
                                              quantized.scales.data() + quantized.scale_offset[k],
                                              s.row_end - s.row_begin,
                                              y + s.row_begin * y_stride + first, y_stride);
          });
      continue;
    }
    row.resize(static_cast<size_t>(m.cols));
    delta_internal::ForEachBand(
        m, 0, m.rows, [&](const DeltaMatrixView& v, int64_t lo, int64_t hi, int64_t first) {
          for (int64_t o = lo; o < hi; ++o) {
            DeltaDecodeRow(v, o, row.data());
            for (int64_t i = s.row_begin; i < s.row_end; ++i) {
              float sum = 0;
              for (int64_t k2 = 0; k2 < m.cols; ++k2)
                sum += x[i * x_stride + k2] * row[static_cast<size_t>(k2)];
              y[i * y_stride + first + o] += sum;
            }
          }
        });
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
                const float* x, int64_t x_stride, float* y, int64_t y_stride, ThreadPool* pool,
                DeltaActivations activations) {
  CheckArgs(segments, weights);
  int64_t max_rows = 0;
  for (const LoraSegment& s : segments)
    if (s.row_end > s.row_begin)
      max_rows = std::max(max_rows, weights[static_cast<size_t>(s.slot)].rows);
  if (max_rows == 0) return;
  const delta_internal::ApplyRowsFn simd = kApplyRows[static_cast<int>(ActiveIsa())];
  // The int16 path: x quantized here, once per call, on the caller's thread (the workers read it).
  const bool int16 = activations == DeltaActivations::kInt16;
  thread_local QuantizedRows quantized;
  const bool fast = DeltaInt16Fast();
  if (int16) {
    quantized.Build(segments, weights, x, x_stride,
                    fast ? delta_internal::q16::avx512::Quantize : delta_internal::q16::Quantize);
  }
  const delta_internal::q16::ApplyRowsFn int16_fn =
      fast ? delta_internal::q16::avx512::ApplyRows : delta_internal::q16::PortableRows;
  const QuantizedRows* qr = &quantized;
  // Thread t owns output rows [begin, end) of every slot: each output element is computed whole
  // by one thread (no split of k), so the split never changes a value.
  auto work = [&](int t, int nt) {
    int64_t begin, end;
    ThreadPool::Slice(max_rows, t, nt, 8, &begin, &end);
    for (size_t k = 0; k < segments.size(); ++k) {
      const LoraSegment& s = segments[k];
      const DeltaMatrixView& m = weights[static_cast<size_t>(s.slot)];
      if (m.rows == 0 || s.row_end <= s.row_begin || begin >= m.rows) continue;
      float* ys = y + s.row_begin * y_stride;
      if (int16 && qr->q_offset[k] >= 0) {
        const int16_t* q = qr->q.data() + qr->q_offset[k];
        const float* x_scales = qr->scales.data() + qr->scale_offset[k];
        const int64_t n = s.row_end - s.row_begin;
        if (fast) {  // takes banded views itself
          int16_fn(m, begin, std::min(end, m.rows), q, x_scales, n, ys, y_stride);
        } else {
          delta_internal::ForEachBand(
              m, begin, std::min(end, m.rows),
              [&](const DeltaMatrixView& v, int64_t lo, int64_t hi, int64_t first) {
                int16_fn(v, lo, hi, q, x_scales, n, ys + first, y_stride);
              });
        }
        continue;
      }
      delta_internal::ForEachBand(
          m, begin, std::min(end, m.rows),
          [&](const DeltaMatrixView& v, int64_t lo, int64_t hi, int64_t first) {
            const auto rows_fn =
                simd != nullptr && delta_internal::SimdLayout(v) ? simd : PortableRows;
            rows_fn(v, lo, hi, x + s.row_begin * x_stride, x_stride, s.row_end - s.row_begin,
                    ys + first, y_stride);
          });
    }
  };
  if (pool == nullptr || pool->size() == 1) {
    work(0, 1);
  } else {
    pool->Run(work);
  }
}

}  // namespace chorus::kernels
