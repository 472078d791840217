// Delta segment kernel (docs/deltas.md, docs/variants.md; DeltaZip's SBMM): the term of
// compressed full-model deltas for a step's rows, grouped into segments of consecutive rows
// that use the same delta:
//
//   y[i, o] += Σ_k x[i, k] · Δ̃_s[o, k]            i ∈ segment with slot s, o < rows of Δ̃_s
//
// Δ̃ is read in its packed form (docs/deltas.md, chorus/adapters/delta/delta_codec.h): per
// output row, `bits`-bit codes in little-endian bit order, value = scale · (code − (2^bits−1)/2),
// one scale per (row, group of `group_size` columns) or one per matrix (group_size 0), and with
// 2:4 sparsity one base-6 pattern triple per byte saying which 2 of every 4 columns are kept.
// Each output row of each slot is decoded once per call into an f32 row (in L1) and then dotted
// with every row of the slot's segments, so the packed bytes are streamed once per step
// whatever the number of rows.
//
// Batch invariance: every y[i, o] is one dot product in a fixed order (16 partial sums over k in
// steps of 16, then a fixed pairwise sum), computed whole by one thread; threads split output
// rows o, never k. So a row's result does not depend on the other rows, segments or threads.
// The reference sums sequentially, so the two agree to rounding, not bitwise.
//
// Activations in int16 (DeltaActivations::kInt16, the serving default where the CPU has the
// kernel): the f32 kernel above is compute-bound — every weight is decoded to f32 and
// multiplied, which two cores cannot do at memory speed for 0.1–0.4 bytes per weight. The int16
// path quantizes each input row once per call, symmetrically to int16 (x ≈ sx · q, sx =
// max|x| / 32767, the row's own scale: batch invariant), and dots it with the codes as signed
// integers w' = 2·code − (2^bits − 1) (value = w' · scale / 2; pruned columns 0) in exact int32
// sums over 64-column blocks — 32 products per VNNI instruction:
//
//   y[i, o] += sx_i · Σ_l acc_l,   acc_l ← fma(float(Σ_{c ∈ block, ⌊(c mod 64)/4⌋ = l} w'_c · q_c),
//                                              scale_block / 2, acc_l)   block after block
//
// with the 16 lane sums added pairwise (8, 4, 2, 1) at the end — except BitDelta's layout (1-bit
// codes, one scale per matrix), whose row of products is summed exactly as integers and
// converted once: y[i, o] += (float(Σ_c w'_c · q_c) · (scale / 2)) · sx_i, and whose rows are
// quantized to ±8191 instead (sx = max|x| / 8191: its kernel looks the products up in int16 tables
// of 4-column sums; docs/deltas.md "BitDelta by table lookup"). The integer sums are exact and
// the float steps fixed, so the SIMD kernel equals its scalar reference bit for bit and a row's
// result never depends on the other rows. Against the f32 path it differs by the rounding of x to
// 15 bits (relative error ≤ 2^-16 of the row's largest |x| per element; BitDelta's 13 bits,
// 2^-14). Layouts it takes: DeltaInt16Layout(); others run the f32 kernel even when int16 is
// asked.
//
// Thread-safety: stateless; weights are read-only.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "chorus/base/thread_pool.h"
#include "chorus/kernels/lora.h"

namespace chorus::kernels {

// Rows [row_begin, row_end) of a matrix stored apart from its other rows: a pool copy packs a
// delta into pool pages (adapters/delta/paged_delta.h), a band of consecutive rows in each, with
// the band's codes, 2:4 patterns, kept positions and scale groups laid out as in a whole matrix
// (row_begin's first). A band's kernel work is exactly that of the same rows of the whole matrix:
// banding never changes a value.
struct DeltaBand {
  int64_t row_begin = 0, row_end = 0;
  const uint8_t* codes = nullptr;
  const uint8_t* mask = nullptr;
  const float* scales = nullptr;  // grouped scales only; a per-matrix scale is the matrix's
  const uint64_t* positions = nullptr;
};

// One delta matrix Δ̃ [rows, cols] in the packed layout (pointers into its host or pool copy).
struct DeltaMatrixView {
  int64_t rows = 0, cols = 0;  // rows = 0: this slot has no term here (segment skipped)
  int bits = 4;                // 1, 2, 3, 4 or 8
  bool sparse24 = false;
  int64_t group_size = 0;          // columns per scale; 0 = scales[0] for the whole matrix
  const uint8_t* codes = nullptr;  // [rows, code_row_bytes]
  const uint8_t* mask = nullptr;   // [rows, mask_row_bytes] (2:4 only)
  const float* scales = nullptr;   // [rows, groups] or [1]
  // 2:4 only, for the int16 path: where each group of 4 columns keeps its two values — group g
  // is 4 bits at bit 4·(g mod 16) of word g / 16, the first kept column's offset p0 in bits 0–1
  // and the second's p1 > p0 in bits 2–3 (groups ≥ cols / 4: 0). Built from `mask` by
  // DeltaKeptPositions (1 bit per column against the mask's 2/3: the kernel then needs no table
  // lookups per pattern, and gathers x at these columns). Null: the f32 path.
  const uint64_t* positions = nullptr;  // [rows, position_row_words()]
  int64_t position_row_words() const { return (cols + 63) / 64; }
  int64_t code_row_bytes() const { return ((sparse24 ? cols / 2 : cols) * bits + 7) / 8; }
  int64_t mask_row_bytes() const { return sparse24 ? (cols / 4 + 2) / 3 : 0; }
  int64_t groups() const { return group_size == 0 ? 0 : (cols + group_size - 1) / group_size; }
  // Entries of `scales`: one per (row, group), or one for the matrix.
  int64_t n_scales() const { return group_size == 0 ? 1 : rows * groups(); }
  // Non-empty: the rows live in these bands (in row order, covering [0, rows) without gaps), and
  // codes / mask / positions above are null; `scales` still holds a per-matrix scale. Only
  // DeltaApply, DeltaApplyReference, DeltaDecodeRow and DeltaInt16Layout take banded views.
  std::span<const DeltaBand> bands;
};

// The view of band `b` of `m` alone: rows [0, b.row_end − b.row_begin) are m's rows
// [b.row_begin, b.row_end).
DeltaMatrixView DeltaBandView(const DeltaMatrixView& m, const DeltaBand& b);

// How DeltaApply multiplies (see the top of this file).
enum class DeltaActivations { kF32, kInt16 };

// Decodes row `o` of `m` into out[0, cols) (pruned columns 0).
void DeltaDecodeRow(const DeltaMatrixView& m, int64_t o, float* out);

// The kept positions of a 2:4 matrix (DeltaMatrixView::positions), [rows,
// position_row_words()]. Requires: m.sparse24.
std::vector<uint64_t> DeltaKeptPositions(const DeltaMatrixView& m);

// Whether the int16 path takes m: codes of 1, 2, 4 or 8 bits dense or 2 and 4 bits 2:4 (with
// kept positions), one scale per matrix or scale groups of a multiple of 64 columns.
bool DeltaInt16Layout(const DeltaMatrixView& m);
// Whether the active ISA level has the SIMD int16 kernel (AVX-512 with VNNI, VBMI and VBMI2);
// elsewhere kInt16 runs its scalar reference, slower than the f32 kernels.
bool DeltaInt16Fast();
// What serving uses: the SetDeltaActivations override if any, else kInt16 where
// DeltaInt16Fast(), else kF32.
DeltaActivations DefaultDeltaActivations();
// Overrides DefaultDeltaActivations for delta hooks built afterwards (`chorus serve
// --delta-activations`); nullopt restores the automatic choice. Thread-safe.
void SetDeltaActivations(std::optional<DeltaActivations> activations);
// "f32" / "int16". ParseDeltaActivations also takes "auto" (*out = nullopt); false for any
// other name.
std::string DeltaActivationsName(DeltaActivations activations);
bool ParseDeltaActivations(const std::string& name, std::optional<DeltaActivations>* out);

// Requires: every segment's slot < weights.size(); segments do not overlap; for each used slot
// x rows have weights[slot].cols floats and y rows weights[slot].rows floats; x and y do not
// overlap. pool may be null (caller thread only).
void DeltaApply(std::span<const LoraSegment> segments, std::span<const DeltaMatrixView> weights,
                const float* x, int64_t x_stride, float* y, int64_t y_stride, ThreadPool* pool,
                DeltaActivations activations = DeltaActivations::kF32);

// Scalar reference (the specification of DeltaApply): kF32 decodes, then sequential dot
// products; kInt16 is the int16 path's exact arithmetic, one lane at a time.
void DeltaApplyReference(std::span<const LoraSegment> segments,
                         std::span<const DeltaMatrixView> weights, const float* x, int64_t x_stride,
                         float* y, int64_t y_stride,
                         DeltaActivations activations = DeltaActivations::kF32);

}  // namespace chorus::kernels
