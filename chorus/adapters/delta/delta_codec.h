// The codec of a compressed full-model delta matrix Δ̃ ≈ W_ft − W_base (docs/deltas.md):
// symmetric mid-rise quantization in groups along a row, optionally 2:4 structured sparsity,
// packed into byte arrays a kernel (or another tool) can decode without Chorus.
//
//   value(code) = scale · (code − (2^bits − 1) / 2),   code ∈ [0, 2^bits)
//
// so 1 bit is ±scale/2 (BitDelta's α·sign with scale = 2α), 2 bits are {±0.5, ±1.5}·scale, 4 bits
// ±0.5 … ±7.5. The grid has no zero on purpose: with 2:4 the kept values are the larger half, and
// a dense delta's small values are within half a step either way.
//
// Layout of one matrix [rows, cols] (row-major, a row = one output feature):
//   * 2:4 pattern (sparsity 2:4 only): each group of 4 consecutive columns keeps 2; which 2 is a
//     pattern p ∈ [0, 6) indexing kPairs24 ((0,1), (0,2), (0,3), (1,2), (1,3), (2,3)). Three
//     consecutive patterns share one byte as p0 + 6·p1 + 36·p2 (< 216), so a row of cols/4
//     patterns takes ceil(cols/12) bytes (0.67 bit per weight instead of 1 for two 2-bit indices).
//   * codes: the row's kept values (cols/2 with 2:4, cols dense) in column order, `bits` each,
//     packed little-endian bit order (value j occupies bits [j·bits, (j+1)·bits) of the row's
//     bit stream; bit k is bit k%8 of byte k/8), the row padded to a whole byte.
//   * scales: one per (row, group) where a group is `group_size` consecutive ORIGINAL columns (the
//     last group of a row may be shorter) — or, with group_size 0, one scale for the whole
//     matrix (BitDelta).
//
// Thread-safety: value types and pure functions.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "chorus/base/status.h"

namespace chorus::delta {

inline constexpr std::array<std::pair<int, int>, 6> kPairs24 = {
    {{0, 1}, {0, 2}, {0, 3}, {1, 2}, {1, 3}, {2, 3}}};
// The pattern index of keeping columns a < b of a group of 4; -1 if a == b or out of range.
int Pattern24(int a, int b);

struct MatrixLayout {
  int64_t rows = 0, cols = 0;
  int bits = 4;            // 1, 2, 3, 4 or 8
  bool sparse24 = false;   // 2:4 structured sparsity (requires cols % 4 == 0)
  int64_t group_size = 0;  // columns per scale; 0 = one scale for the matrix

  int64_t kept_per_row() const { return sparse24 ? cols / 2 : cols; }
  int64_t code_row_bytes() const { return (kept_per_row() * bits + 7) / 8; }
  int64_t mask_row_bytes() const { return sparse24 ? (cols / 4 + 2) / 3 : 0; }
  int64_t groups_per_row() const {
    return group_size == 0 ? 0 : (cols + group_size - 1) / group_size;
  }
  int64_t n_scales() const { return group_size == 0 ? 1 : rows * groups_per_row(); }
  // Half the code range: value = scale · (code − half_range()).
  float half_range() const { return static_cast<float>((1 << bits) - 1) / 2.0f; }
  int max_code() const { return (1 << bits) - 1; }
  // Bytes of the packed form (codes + patterns + scales at `scale_bytes` each).
  int64_t PackedBytes(int scale_bytes) const {
    return rows * (code_row_bytes() + mask_row_bytes()) + n_scales() * scale_bytes;
  }
};

// Checks the layout's numbers (bits, sizes, 2:4 divisibility, group size). `what` names the
// matrix in the message.
Status ValidateLayout(const MatrixLayout& l, const std::string& what);

// A compressed matrix in unpacked form: what compressors produce and kernels' tests read.
struct UnpackedMatrix {
  MatrixLayout layout;
  std::vector<uint8_t> patterns;  // [rows, cols/4] pattern indices (2:4 only, else empty)
  std::vector<uint8_t> codes;     // [rows, kept_per_row] codes
  std::vector<float> scales;      // [n_scales] row-major [rows, groups_per_row] or [1]

  // Scale of (row, original column).
  float Scale(int64_t row, int64_t col) const {
    return layout.group_size == 0 ? scales[0]
                                  : scales[static_cast<size_t>(row * layout.groups_per_row() +
                                                               col / layout.group_size)];
  }
  // Original column of kept value j of `row` (j itself when dense).
  int64_t KeptColumn(int64_t row, int64_t j) const;
  // Dense f32 values [rows, cols] (pruned entries 0).
  std::vector<float> Decode() const;
};

// The packed form as stored (docs/deltas.md): the byte arrays and scales above.
struct PackedMatrix {
  MatrixLayout layout;
  std::vector<uint8_t> codes;  // [rows, code_row_bytes]
  std::vector<uint8_t> mask;   // [rows, mask_row_bytes] (2:4 only)
  std::vector<float> scales;   // [n_scales]
};

PackedMatrix Pack(const UnpackedMatrix& m);
// Checks the layout, sizes, pattern bytes (each below its largest pattern code), padding bits
// of codes (zero) and finite scales, without unpacking (what reading a delta file checks);
// `what` names the matrix in errors.
Status CheckPacked(const PackedMatrix& p, const std::string& what);
// The same over bytes held elsewhere (a mapped delta file: delta_file.h, ReadDeltaMapped).
Status CheckPackedBytes(const MatrixLayout& l, const uint8_t* codes, size_t n_codes,
                        const uint8_t* mask, size_t n_mask, const std::vector<float>& scales,
                        const std::string& what);
// CheckPacked, then the codes and patterns one per byte.
Result<UnpackedMatrix> Unpack(const PackedMatrix& p, const std::string& what);

// Rounds to the nearest f16 value (scales are stored as f16 when grouped).
float RoundToF16(float x);

// Round-to-nearest code of `x` at `scale` (scale > 0): clamp(round(x/scale + half), 0, max).
inline int QuantizeCode(float x, float scale, const MatrixLayout& l) {
  const float q = std::floor(x / scale + l.half_range() + 0.5f);
  if (!(q > 0)) return 0;  // also NaN
  return q >= static_cast<float>(l.max_code()) ? l.max_code() : static_cast<int>(q);
}
inline float Dequantize(int code, float scale, const MatrixLayout& l) {
  return scale * (static_cast<float>(code) - l.half_range());
}
// The symmetric scale whose extreme codes reach ±max_abs: max_abs / half_range, rounded to
// f16 when `f16` (never 0: a zero group gets the smallest normal f16 so decoding stays finite).
float ScaleForMaxAbs(float max_abs, const MatrixLayout& l, bool f16);

}  // namespace chorus::delta
