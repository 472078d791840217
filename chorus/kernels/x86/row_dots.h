// Internal: AddInt8RowDots / AddF32RowDots (ops.h) written once over a vector type and compiled
// per ISA level (ops_avx2.cc: 8 lanes, ops_avx512.cc: 16 lanes). Everything has internal
// linkage, so each file compiles its own copy with its own ISA flags.
//
// A dot keeps one lane-wise partial sum (k in order, the row's last partial chunk zero-filled),
// reduced by VT::Sum and added with one explicit fma (an implicit a·b + c is contracted or not
// depending on the instantiation). Rows go four at a time and inputs VT::kInputsPerPass at a
// time, so each chunk of a row is widened once for all of them; neither grouping changes a
// dot's arithmetic, which is what makes the kernels batch invariant.
//
// VT provides: V, kLanes, kInputsPerPass, Zero(), Fma(a, b, c), Sum(v), LoadX(const float*),
// LoadXTail(const float*, n), Row(const T*), RowTail(const T*, n) (T = int8_t or float; rows
// widened to float; the tails give 0 past n).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace chorus::kernels::row_dots {
namespace {

// Rows [r0, r0 + NR) against inputs [0, NJ).
template <class VT, class T, int NR, int NJ>
void Block(const T* w, const float* scales, int64_t r0, int64_t cols, const float* x,
           int64_t x_stride, float* y, int64_t y_stride) {
  using V = typename VT::V;
  constexpr int64_t L = VT::kLanes;
  V acc[NR][NJ];
  for (int i = 0; i < NR; ++i)
    for (int j = 0; j < NJ; ++j) acc[i][j] = VT::Zero();
  int64_t k = 0;
  for (; k + L <= cols; k += L) {
    V xv[NJ];
    for (int j = 0; j < NJ; ++j) xv[j] = VT::LoadX(x + j * x_stride + k);
    for (int i = 0; i < NR; ++i) {
      const V wv = VT::Row(w + (r0 + i) * cols + k);
      for (int j = 0; j < NJ; ++j) acc[i][j] = VT::Fma(xv[j], wv, acc[i][j]);
    }
  }
  if (k < cols) {  // the same operations on zero-filled lanes
    const int64_t n = cols - k;
    V xv[NJ];
    for (int j = 0; j < NJ; ++j) xv[j] = VT::LoadXTail(x + j * x_stride + k, n);
    for (int i = 0; i < NR; ++i) {
      const V wv = VT::RowTail(w + (r0 + i) * cols + k, n);
      for (int j = 0; j < NJ; ++j) acc[i][j] = VT::Fma(xv[j], wv, acc[i][j]);
    }
  }
  for (int i = 0; i < NR; ++i) {
    for (int j = 0; j < NJ; ++j) {
      const float sum = VT::Sum(acc[i][j]);
      float& out = y[j * y_stride + r0 + i];
      out = scales != nullptr ? std::fma(scales[r0 + i], sum, out) : out + sum;
    }
  }
}

template <class VT, class T, int NJ>
void Rows(const T* w, const float* scales, int64_t rows, int64_t cols, const float* x,
          int64_t x_stride, float* y, int64_t y_stride) {
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) Block<VT, T, 4, NJ>(w, scales, r, cols, x, x_stride, y, y_stride);
  for (; r < rows; ++r) Block<VT, T, 1, NJ>(w, scales, r, cols, x, x_stride, y, y_stride);
}

// y[j·y_stride + r] += (scales[r] ·) Σ_k x[j·x_stride + k] · w[r·cols + k]; scales null: none.
template <class VT, class T>
void Add(const T* w, const float* scales, int64_t rows, int64_t cols, const float* x,
         int64_t x_stride, int64_t n, float* y, int64_t y_stride) {
  constexpr int64_t kMax = VT::kInputsPerPass;
  static_assert(kMax >= 1 && kMax <= 4);
  for (int64_t j = 0; j < n; j += kMax) {
    const float* xj = x + j * x_stride;
    float* yj = y + j * y_stride;
    const int64_t nj = std::min(kMax, n - j);
    if (nj == 1) {
      Rows<VT, T, 1>(w, scales, rows, cols, xj, x_stride, yj, y_stride);
    } else if (nj == 2) {
      if constexpr (kMax >= 2) Rows<VT, T, 2>(w, scales, rows, cols, xj, x_stride, yj, y_stride);
    } else if (nj == 3) {
      if constexpr (kMax >= 3) Rows<VT, T, 3>(w, scales, rows, cols, xj, x_stride, yj, y_stride);
    } else {
      if constexpr (kMax >= 4) Rows<VT, T, 4>(w, scales, rows, cols, xj, x_stride, yj, y_stride);
    }
  }
}

}  // namespace
}  // namespace chorus::kernels::row_dots
