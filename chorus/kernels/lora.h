// LoRA segment kernels (docs/architecture.md): the adapter term s·(x·Aᵀ)·Bᵀ of a step's rows,
// grouped into segments of consecutive rows that use the same adapter (Punica SGMV; S-LoRA
// MBGMV/MBGMM: ranks differ per segment and nothing is padded to the largest rank).
//
// A segment is (row_begin, row_end, slot); `slot` indexes the per-call weight table, so one
// adapter may own several segments and rows outside every segment (base-model rows) cost
// nothing. A slot whose rank is 0 (the adapter does not target this linear) is skipped.
//
//   shrink:  v[i, v_col_a + j]  = Σ_k x[i, k] · A_a[j, k]          i ∈ segment, j < r_a
//   expand:  y[i, c]           += s_a · Σ_j v[i, v_col_a + j] · Bᵀ_a[j, c]      c < out
//
// Compute layout (f32 or bf16): the weights of a slot are given as a table of row pointers, one per
// rank row, so the rows may live anywhere — contiguous in a host-tier copy, or scattered over
// the pages of the unified pool (S-LoRA unified paging: an adapter's rows are packed into pool
// pages like KV blocks, never straddling a page). Each row itself is contiguous:
//   A_a  [r_a, in]   as PEFT stores lora_A: shrink is r_a dot products of length `in` per row,
//                    each streaming one row of A.
//   Bᵀ_a [r_a, out]  lora_B [out, r_a] transposed at load, so expand is r_a axpys of length
//                    `out` per row, streaming rows of Bᵀ (vectorised along out).
// bf16 rows (a slot gives `*_rows_bf16` instead of `*_rows`) halve the bytes a step streams
// (decode with many distinct adapters is bound by them); they are widened exactly to f32 in
// registers and take the f32 path, so a bf16 slot computes bitwise what an f32 slot holding the
// widened values computes. Slots of one call may mix f32 and bf16.
// Fused shrink: the A rows of several linears that read the same input (q|k|v, gate|up), one row
// table [r_q + r_k + r_v], is just a shrink of rank r_q + r_k + r_v; each expand then reads its
// own column range of v through `v_col`.
//
// Batch invariance (docs/architecture.md, "Kernels and batch invariance"): every output element is
// reduced in a fixed order that does not depend on the other rows, segments, their number or the
// thread count. shrink: one dot product per (row, j), computed whole by one thread with the same
// lane split and the same horizontal sum for every row; expand: acc = fma chain over j = 0..r-1 in
// order, then y = fma(s, acc, y), identical in vector lanes and the scalar tail. Threads split
// output columns only (shrink: the Σ r_a (segment, j) columns; expand: `out`), never the reduction.
//
// The x86 variants sum in a different order from the scalar reference (lane partial sums), so
// they agree with it to rounding, not bitwise; each variant is bitwise batch-invariant.
//
// Thread-safety: stateless. Weights are read-only and may be shared by concurrent calls.
#pragma once

#include <cstdint>
#include <span>

#include "chorus/base/thread_pool.h"

namespace chorus::kernels {

struct LoraSegment {
  int64_t row_begin = 0;  // first row of the step in the segment
  int64_t row_end = 0;    // one past the last (row_begin == row_end: empty, skipped)
  int32_t slot = 0;       // index into the weight table of the call
};

// One adapter's A for a (possibly fused) shrink.
struct LoraShrinkWeight {
  const float* const* a_rows = nullptr;          // [rank] rows of A, each [in]; null when rank == 0
  int64_t rank = 0;                              // 0 = this slot has no term here (segment skipped)
  const uint16_t* const* a_rows_bf16 = nullptr;  // bf16 rows instead of a_rows, when set
};

// One adapter's Bᵀ for an expand.
struct LoraExpandWeight {
  const float* const* bt_rows = nullptr;  // [rank] rows of Bᵀ (lora_B transposed), each [out]
  int64_t rank = 0;                       // 0 = no term (segment skipped)
  int64_t v_col = 0;                      // first column of v holding this adapter's rank values
  float scale = 1.0f;                     // s_a = alpha / r (or alpha / √r for rsLoRA)
  const uint16_t* const* bt_rows_bf16 = nullptr;  // bf16 rows instead of bt_rows, when set
};

// Requires: every segment's slot < weights.size(); segments do not overlap; for each used slot
// the rows of x have `in` floats, the rows of v at least weights[slot].rank columns
// (v_stride ≥ max rank used); x and v do not overlap. pool may be null (caller thread only).
void LoraShrink(std::span<const LoraSegment> segments, std::span<const LoraShrinkWeight> weights,
                const float* x, int64_t x_stride, int64_t in, float* v, int64_t v_stride,
                ThreadPool* pool);

// Requires: every segment's slot < weights.size(); segments do not overlap; for each used slot
// v has columns [v_col, v_col + rank) and y rows have `out` floats; v and y do not overlap.
void LoraExpand(std::span<const LoraSegment> segments, std::span<const LoraExpandWeight> weights,
                const float* v, int64_t v_stride, int64_t out, float* y, int64_t y_stride,
                ThreadPool* pool);

// One output of LoraShrinkExpand: its expand weights (one per slot) and where the term goes.
struct LoraExpandOut {
  std::span<const LoraExpandWeight> weights;
  int64_t out = 0;
  float* y = nullptr;
  int64_t y_stride = 0;
};
inline constexpr size_t kMaxLoraExpandOuts = 4;

// LoraShrink, then LoraExpand into each of `outs` (q|k|v after their fused shrink; o alone),
// bit for bit the same results. When the step has many segments (decode rows on distinct
// adapters) it runs as one pool dispatch in which threads take whole segments, largest rank
// first, and do a segment's shrink and then its expands: one dispatch and barrier instead of
// 1 + outs.size(), and each thread streams one adapter's A rows and then its Bᵀ rows end to end.
// Otherwise (few segments: prefill, one adapter) it is exactly the separate calls.
// Requires: what LoraShrink and LoraExpand require; 1..kMaxLoraExpandOuts outputs, each with a
// weight per slot.
void LoraShrinkExpand(std::span<const LoraSegment> segments,
                      std::span<const LoraShrinkWeight> weights, const float* x, int64_t x_stride,
                      int64_t in, float* v, int64_t v_stride, std::span<const LoraExpandOut> outs,
                      ThreadPool* pool);

namespace reference {
// The scalar specification (single thread). Same semantics; the shrink reduces k in order
// 0..in-1 with fma; the expand as stated above.
void LoraShrink(std::span<const LoraSegment> segments, std::span<const LoraShrinkWeight> weights,
                const float* x, int64_t x_stride, int64_t in, float* v, int64_t v_stride);
void LoraExpand(std::span<const LoraSegment> segments, std::span<const LoraExpandWeight> weights,
                const float* v, int64_t v_stride, int64_t out, float* y, int64_t y_stride);
}  // namespace reference

}  // namespace chorus::kernels
