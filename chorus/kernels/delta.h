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
// Thread-safety: stateless; weights are read-only.
#pragma once

#include <cstdint>
#include <span>

#include "chorus/base/thread_pool.h"
#include "chorus/kernels/lora.h"

namespace chorus::kernels {

// One delta matrix Δ̃ [rows, cols] in the packed layout (pointers into its host or pool copy).
struct DeltaMatrixView {
  int64_t rows = 0, cols = 0;  // rows = 0: this slot has no term here (segment skipped)
  int bits = 4;                // 1, 2, 3, 4 or 8
  bool sparse24 = false;
  int64_t group_size = 0;          // columns per scale; 0 = scales[0] for the whole matrix
  const uint8_t* codes = nullptr;  // [rows, code_row_bytes]
  const uint8_t* mask = nullptr;   // [rows, mask_row_bytes] (2:4 only)
  const float* scales = nullptr;   // [rows, groups] or [1]
  int64_t code_row_bytes() const { return ((sparse24 ? cols / 2 : cols) * bits + 7) / 8; }
  int64_t mask_row_bytes() const { return sparse24 ? (cols / 4 + 2) / 3 : 0; }
  int64_t groups() const { return group_size == 0 ? 0 : (cols + group_size - 1) / group_size; }
};

// Decodes row `o` of `m` into out[0, cols) (pruned columns 0).
void DeltaDecodeRow(const DeltaMatrixView& m, int64_t o, float* out);

// Requires: every segment's slot < weights.size(); segments do not overlap; for each used slot
// x rows have weights[slot].cols floats and y rows weights[slot].rows floats; x and y do not
// overlap. pool may be null (caller thread only).
void DeltaApply(std::span<const LoraSegment> segments, std::span<const DeltaMatrixView> weights,
                const float* x, int64_t x_stride, float* y, int64_t y_stride, ThreadPool* pool);

// Scalar reference: decode, then sequential dot products (the specification of DeltaApply).
void DeltaApplyReference(std::span<const LoraSegment> segments,
                         std::span<const DeltaMatrixView> weights, const float* x, int64_t x_stride,
                         float* y, int64_t y_stride);

}  // namespace chorus::kernels
