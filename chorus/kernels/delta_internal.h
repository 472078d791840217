// Internal contract between delta.cc (threading, dispatch, the portable kernel) and the per-ISA
// delta kernels (x86/delta_avx2.cc, x86/delta_avx512.cc). Not part of the public API.
//
// Every level computes exactly the portable kernel's arithmetic, so all levels agree bitwise:
//   * decode: w[c] = scale · (float(code) − half), pruned columns +0;
//   * dot: 16 partial sums, lane l taking columns k + l for k = 0, 16, 32, … (a separate
//     multiply and add, never a fused one: the SIMD files are built with -ffp-contract=off),
//     then pairwise halving (8, 4, 2, 1), then y += sum.
#pragma once

#include <cstdint>

#include "chorus/kernels/delta.h"

namespace chorus::kernels::delta_internal {

// Calls fn(view, lo, hi, first) for output rows [begin, end) of m: once with m itself, or for a
// banded m (DeltaBand) once per band those rows meet, with the band's view, the band's local rows
// [lo, hi) and the band's first row of m (where its outputs go).
template <typename Fn>
void ForEachBand(const DeltaMatrixView& m, int64_t begin, int64_t end, Fn fn) {
  if (m.bands.empty()) {
    if (begin < end) fn(m, begin, end, int64_t{0});
    return;
  }
  for (const DeltaBand& b : m.bands) {
    const int64_t lo = begin > b.row_begin ? begin : b.row_begin;
    const int64_t hi = end < b.row_end ? end : b.row_end;
    if (lo < hi) fn(DeltaBandView(m, b), lo - b.row_begin, hi - b.row_begin, b.row_begin);
  }
}

// The kept columns of each 2:4 pattern 0–5 within its group of 4.
inline constexpr int kPairs24[6][2] = {{0, 1}, {0, 2}, {0, 3}, {1, 2}, {1, 3}, {2, 3}};

// The 12-column keep mask of each 2:4 pattern byte (three groups, p0 + 6·p1 + 36·p2; bit 4·g + j
// = column j of group g kept). Bytes ≥ 216 never pass the file's validation and keep nothing.
struct PatternMasks {
  uint16_t bits[256];
  constexpr PatternMasks() : bits() {
    for (int v = 0; v < 216; ++v) {
      const int p[3] = {v % 6, v / 6 % 6, v / 36};
      int b = 0;
      for (int g = 0; g < 3; ++g)
        b |= (1 << (4 * g + kPairs24[p[g]][0])) | (1 << (4 * g + kPairs24[p[g]][1]));
      bits[v] = static_cast<uint16_t>(b);
    }
  }
};
inline constexpr PatternMasks kPatternMasks;

// Decodes columns [c_begin, cols) of row o into out[0, cols − c_begin). With 2:4, c_begin must be
// a multiple of 12 (a whole pattern byte).
void DecodeColumns(const DeltaMatrixView& m, int64_t o, int64_t c_begin, float* out);

// Whether the SIMD levels take this layout: bits 1–4 or 8 (2:4 with ≥ 2 bits), and one scale per
// matrix or scale groups of 16 · 2^j columns (each 16-column chunk has one scale, found by a
// shift: 16, 32, 64, 128, …). Other layouts run the portable kernel at every level.
inline bool SimdLayout(const DeltaMatrixView& m) {
  const bool bits_ok = m.bits == 1 || m.bits == 2 || m.bits == 3 || m.bits == 4 || m.bits == 8;
  const int64_t chunks_per_scale = m.group_size / 16;
  const bool groups_ok = m.group_size == 0 || (m.group_size % 16 == 0 && chunks_per_scale > 0 &&
                                               (chunks_per_scale & (chunks_per_scale - 1)) == 0);
  return bits_ok && !(m.sparse24 && m.bits == 1) && groups_ok;
}

// y[i, o] += Σ_k x[i, k] · Δ̃[o, k] for i < n_rows, o ∈ [o_begin, o_end), in the order above.
// Requires SimdLayout(m).
using ApplyRowsFn = void (*)(const DeltaMatrixView& m, int64_t o_begin, int64_t o_end,
                             const float* x, int64_t x_stride, int64_t n_rows, float* y,
                             int64_t y_stride);

namespace avx2 {
void ApplyRows(const DeltaMatrixView& m, int64_t o_begin, int64_t o_end, const float* x,
               int64_t x_stride, int64_t n_rows, float* y, int64_t y_stride);
}  // namespace avx2
namespace avx512 {
void ApplyRows(const DeltaMatrixView& m, int64_t o_begin, int64_t o_end, const float* x,
               int64_t x_stride, int64_t n_rows, float* y, int64_t y_stride);
}  // namespace avx512

// The int16 path (kernels/delta.h). An input row is quantized once per call, in one of two
// orders per 64-column block:
//  * pairs (dense matrices): positions 0–31 hold columns 4l, 4l + 1 and positions 32–63 columns
//    4l + 2, 4l + 3 (l = 0…15), so that one VNNI pair-dot of each half puts the block's columns
//    4l…4l + 3 in int32 lane l;
//  * columns (2:4 matrices, and BitDelta's signs): column order. For 2:4 the kernel gathers the
//    two kept columns of group l (DeltaMatrixView::positions) into the int16 pair of lane l, so
//    one pair-dot of the gathered x with the block's 32 kept values gives the same lanes, and
//    pruned columns cost nothing. For signs, see SignRowSum.
// Columns past the row are 0 in both.
namespace q16 {

// Quantized columns per row: cols rounded up to whole blocks.
inline int64_t PaddedCols(int64_t cols) { return (cols + 63) / 64 * 64; }

// BitDelta's layout (1-bit codes, one scale per matrix): the whole row's products ±q are summed
// exactly as integers and converted once, term = (float(Σ w'·q) · (scale / 2)) · sx — there is
// no per-block scale to apply, so the kernel skips the per-block float steps of the other
// layouts (a sign code costs two VNNI instructions per 64 columns).
inline bool SignRowSum(const DeltaMatrixView& m) {
  return m.bits == 1 && !m.sparse24 && m.group_size == 0;
}

// Whether m's rows are quantized in column order (above); otherwise pairs order.
inline bool ColumnOrder(const DeltaMatrixView& m) { return m.sparse24 || SignRowSum(m); }

// The largest |q| of a quantized row: 32767, except for SignRowSum matrices, whose rows are
// quantized to ±8191 (14 bits) so that the exact sum of any 4 of their products, ±(q0 + q1 + q2
// + q3), fits an int16 — what the AVX-512 table-lookup kernel's int16 tables hold (docs/deltas.md
// "BitDelta by table lookup"). A 1-bit delta's own error is far above 14-bit activations'.
constexpr int kMaxCode = 32767;
constexpr int kSignMaxCode = 8191;
inline int MaxCode(const DeltaMatrixView& m) { return SignRowSum(m) ? kSignMaxCode : kMaxCode; }

// Where column c sits in a quantized row, in column order or pairs order.
inline int64_t Q16Position(int64_t c, bool column_order) {
  if (column_order) return c;
  const int64_t l = c % 64 / 4, j = c % 4;
  return c / 64 * 64 + (j < 2 ? 2 * l + j : 32 + 2 * l + j - 2);
}

// Quantizes x [n, cols] (stride xs) into q [n, PaddedCols(cols)] in column or pairs order and
// scales[n] (x ≈ scale · q, scale = max|x| / max_code, |q| ≤ max_code ≤ 32767, rounded to
// nearest, ties to even). A row of zeros gets scale 0, and so does a row too small to scale
// (max_code / max|x| beyond float: every |x| < ~1e-34, a term below any float sum it joins); a
// row with an infinity or NaN gets scale NaN and q 0, so its term is NaN as the f32 path's would
// be.
void Quantize(const float* x, int64_t xs, int64_t n, int64_t cols, bool column_order, int max_code,
              int16_t* q, float* scales);
using QuantizeFn = decltype(&Quantize);

// y[i·ys + o] += the int16 term for rows i < n_rows, o ∈ [o_begin, o_end).
// Requires DeltaInt16Layout(m); q rows of PaddedCols(m.cols) int16.
using ApplyRowsFn = void (*)(const DeltaMatrixView& m, int64_t o_begin, int64_t o_end,
                             const int16_t* q, const float* x_scales, int64_t n_rows, float* y,
                             int64_t y_stride);

void PortableRows(const DeltaMatrixView& m, int64_t o_begin, int64_t o_end, const int16_t* q,
                  const float* x_scales, int64_t n_rows, float* y, int64_t y_stride);
namespace avx512 {
// Needs AVX-512 F/BW/VNNI/VBMI/VBMI2. Takes banded views itself (m's rows, y not offset): the
// BitDelta lookup builds its tables once per call for every band, not once per band.
void ApplyRows(const DeltaMatrixView& m, int64_t o_begin, int64_t o_end, const int16_t* q,
               const float* x_scales, int64_t n_rows, float* y, int64_t y_stride);
// Quantize's q and scales bit for bit, 16 columns an instruction: it runs on the caller's
// thread for every delta segment of every linear of a step (the portable loop's max|x| is a
// scalar chain, ~1 ns a column).
void Quantize(const float* x, int64_t xs, int64_t n, int64_t cols, bool column_order, int max_code,
              int16_t* q, float* scales);
}  // namespace avx512

}  // namespace q16

}  // namespace chorus::kernels::delta_internal
