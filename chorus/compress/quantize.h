// Per-matrix delta compressors (docs/deltas.md, "Methods"):
//   * Rtn — round to nearest: magnitude 2:4 (keep the 2 largest |Δ| of every 4 columns), per-group
//     scales from the group's largest kept |Δ|, codes by rounding. No calibration.
//   * Obs — ΔCompress (DeltaZip §4.2) in the SparseGPT / GPTQ form: columns are processed left to
//     right; at each 4-column block the 2:4 mask keeps the 2 columns of lowest OBS saliency loss
//     w²/[H⁻¹]_cc², each value is quantized, and its error is spread over the columns not yet
//     processed through the upper Cholesky factor U of H⁻¹ (H⁻¹ = UᵀU), which minimises
//     ‖ΔX − Δ̃X‖² for H = 2XXᵀ (damped by `damp` × mean diag(H)).
//   * Sign — 1 bit per weight, one scale per matrix (BitDelta init: scale/2 = mean |Δ| of kept).
//
// Δ is [rows, cols] row-major f32 (a row = one output feature; X columns are inputs).
// Thread-safety: pure functions; `pool` may be null (single-threaded).
#pragma once

#include <cstdint>
#include <vector>

#include "chorus/adapters/delta/delta_codec.h"
#include "chorus/base/status.h"
#include "chorus/base/thread_pool.h"

namespace chorus::compress {

delta::UnpackedMatrix RtnCompress(const std::vector<float>& d, const delta::MatrixLayout& layout);

// h: [cols, cols] (symmetric, e.g. 2·XᵀX / n, rows of X = activations). Dead inputs (zero
// diagonal) get Δ column 0. kFailedPrecondition when H + damping is not positive definite.
// Then up to `refine_sweeps` sweeps of local search on each row's (Δ − Δ̃)·H·(Δ − Δ̃)ᵀ (damped H):
// a kept value moves to the grid point nearest its optimum given the others, or a 2:4 block
// swaps a kept and a pruned column, whenever that lowers the objective.
Result<delta::UnpackedMatrix> ObsCompress(const std::vector<float>& d, std::vector<double> h,
                                          const delta::MatrixLayout& layout, double damp,
                                          ThreadPool* pool, int refine_sweeps = 0);

// The upper Cholesky factor U of H⁻¹ (H⁻¹ = UᵀU) for a symmetric positive definite H [C, C],
// as floats (ObsCompress's error propagation); kFailedPrecondition when H is not positive
// definite. Parallel over `pool` (may be null), with the same bits for any number of threads.
Result<std::vector<float>> InverseCholeskyUpper(const std::vector<double>& h, int64_t C,
                                                ThreadPool* pool);

// BitDelta's initial form: codes = sign bits, scale = 2·mean |kept Δ| (so values are ±mean|Δ|).
// Requires layout.bits == 1 and layout.group_size == 0.
delta::UnpackedMatrix SignCompress(const std::vector<float>& d, const delta::MatrixLayout& layout);

// ‖(A − B)·Xᵀ‖² / n for X [n, cols]: the output error of using B instead of A on inputs X.
double OutputError(const std::vector<float>& a, const std::vector<float>& b, int64_t rows,
                   int64_t cols, const std::vector<float>& x, int64_t n);

}  // namespace chorus::compress
