// The float-weight GEMM driver shared by the AVX2 and AVX-512 kernels (f32, f16, bf16 weights in
// their row layout): which register-tile shape covers which rows and columns, and the column
// blocking. The tile itself (FloatTile<D, R, C>) is each ISA's own; everything here is a template
// instantiated in that file with its own ISA flags (as matmul_qtile.h), so no code is shared
// across flags. Every output column is computed by one tile whatever its shape, in the same
// per-column order, so the shape a column falls into never changes its value.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "chorus/base/check.h"
#include "chorus/tensor/dtype.h"

namespace chorus::kernels::internal::ftile {
namespace {

template <int N>
using Int = std::integral_constant<int, N>;

// Calls fn(Int<R>{}, Int<C>{}) for the tile shape (rr, cc), 1 ≤ rr ≤ MaxR, 1 ≤ cc ≤ MaxC, so
// the tile takes its shape as template arguments and keeps its accumulators in registers.
template <int MaxR, int MaxC, int R = MaxR, int C = MaxC, class Fn>
inline void ForTileShape(int rr, int cc, Fn&& fn) {
  if (rr == R && cc == C) {
    fn(Int<R>{}, Int<C>{});
  } else if constexpr (C > 1) {
    ForTileShape<MaxR, MaxC, R, C - 1>(rr, cc, fn);
  } else if constexpr (R > 1) {
    ForTileShape<MaxR, MaxC, R - 1, MaxC>(rr, cc, fn);
  }
}

// Columns [c0, c1) of an m-row product in blocks whose weight rows (row_bytes each) fill about
// 256 KiB (a multiple of max_c columns): for each block, rows in tiles of `rows_per_tile`, each
// tile's columns in runs of cols_for(rr); tile(rr, cc, r0, c) computes one.
template <class ColsFor, class Tile>
inline void BlockedColumns(int64_t row_bytes, int64_t m, int64_t c0, int64_t c1, int max_c,
                           int rows_per_tile, ColsFor&& cols_for, Tile&& tile) {
  const int64_t nc = std::max<int64_t>(max_c, (256 * 1024 / row_bytes) / max_c * max_c);
  for (int64_t cb = c0; cb < c1; cb += nc) {
    const int64_t ce = std::min(c1, cb + nc);
    for (int64_t r0 = 0; r0 < m; r0 += rows_per_tile) {
      const int rr = static_cast<int>(std::min<int64_t>(rows_per_tile, m - r0));
      const int cmax = cols_for(rr);
      for (int64_t c = cb; c < ce; c += cmax) {
        const int cc = static_cast<int>(std::min<int64_t>(cmax, ce - c));
        tile(rr, cc, r0, c);
      }
    }
  }
}

// Calls fn(std::integral_constant<DType, D>{}) for the float weight dtype `dtype`.
template <class Fn>
inline void ForFloatDType(DType dtype, const char* isa, Fn&& fn) {
  switch (dtype) {
    case DType::kF32:
      return fn(std::integral_constant<DType, DType::kF32>{});
    case DType::kF16:
      return fn(std::integral_constant<DType, DType::kF16>{});
    case DType::kBF16:
      return fn(std::integral_constant<DType, DType::kBF16>{});
    default:
      CHORUS_CHECK(false) << "matmul " << isa << ": unexpected dtype " << DTypeName(dtype);
  }
}

}  // namespace
}  // namespace chorus::kernels::internal::ftile
