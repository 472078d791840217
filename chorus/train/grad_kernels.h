// The matrix kernels of LoRA training's backward pass (docs/finetuning.md, "Kernels").
//
//   MatMulTransposed:  dx[m, k] (+)= dy[m, n] · W[n, k]
//     The input gradient through a frozen base linear y = x·Wᵀ. W is read from its stored
//     blocks (PackedWeight::source(): f32, f16, bf16, q8_0, q4_0 rows as the file holds them):
//     each thread dequantizes a strip of kStripRows rows × one column chunk into a small
//     scratch (16 KiB at most) and reuses it for every row of dy, so the base is never copied
//     to a dense f32 matrix and the dequantization costs 1/m of the multiply-adds.
//   AccumulateOuter:  g[p, q] += Σ_t a[t, p] · b[t, q]
//     The LoRA weight gradients: dA = dzᵀ·x ([r, in]) and dBᵀ = (s·u)ᵀ·dy ([r, out]).
//
// Determinism: every output element is one fma chain in a fixed order — MatMulTransposed:
// acc = (accumulate ? dx : 0), then acc = fma(dy[r, i], W[i, c], acc) for i = 0..n-1;
// AccumulateOuter: acc = g, then acc = fma(a[t, p], b[t, q], acc) for t = 0..T-1. Threads split
// output columns only, never the reduction, and the vector variants run the same chain per lane
// (the dequantized weight value d·q is the same float in every variant), so the scalar, AVX2 and
// AVX-512 results are bitwise equal, whatever the thread count and whatever the other rows.
//
// Thread-safety: stateless; safe from any number of threads on disjoint outputs.
#pragma once

#include <cstdint>

#include "chorus/base/thread_pool.h"
#include "chorus/kernels/matmul.h"

namespace chorus::train {

// Requires: dy has m rows of w.n() floats, dx m rows of at least w.k() floats, no overlap.
// pool may be null (the calling thread only).
void MatMulTransposed(const kernels::PackedWeight& w, const float* dy, int64_t dy_stride, int64_t m,
                      float* dx, int64_t dx_stride, bool accumulate, ThreadPool* pool);

// Requires: a [T, ≥P] with stride a_stride, b [T, ≥Q] with stride b_stride, g [P, ≥Q] with
// stride g_stride; g overlaps neither.
void AccumulateOuter(const float* a, int64_t a_stride, int64_t p, const float* b, int64_t b_stride,
                     int64_t q, int64_t t, float* g, int64_t g_stride, ThreadPool* pool);

namespace reference {
// The scalar specifications: plain loops in the stated order, one thread, W dequantized one
// element at a time (DequantizeRow of its row).
void MatMulTransposed(const kernels::PackedWeight& w, const float* dy, int64_t dy_stride, int64_t m,
                      float* dx, int64_t dx_stride, bool accumulate);
void AccumulateOuter(const float* a, int64_t a_stride, int64_t p, const float* b, int64_t b_stride,
                     int64_t q, int64_t t, float* g, int64_t g_stride);
}  // namespace reference

namespace internal {
// The shared inner loop of both kernels, one ISA variant each:
//   out[r, c] = fma chain over i < n of L[r·l_row + i·l_inner] · P[i·p_stride + c]
// starting from out[r, c] (init_zero: from 0), for r < rows, c < cols.
// The x86 variants handle cols in whole vectors (64 / 32 columns) and leave the rest to
// ScalarPanel, which computes the same chain.
struct PanelArgs {
  const float* l;
  int64_t l_row, l_inner;
  const float* p;
  int64_t p_stride;
  int64_t n, rows, cols;
  float* out;
  int64_t out_stride;
  bool init_zero;
};
void ScalarPanel(const PanelArgs& a);
// Columns the variant handled (a multiple of its vector chunk); the caller finishes the rest.
int64_t Avx2Panel(const PanelArgs& a);
int64_t Avx512Panel(const PanelArgs& a);
// n elements (n % 32 == 0) of q8_0 / q4_0 blocks to f32, exactly DequantizeRow's values (d·q);
// false for other dtypes (the caller then uses DequantizeRow).
bool Avx2DequantQ(DType dtype, const void* src, float* dst, int64_t n);
bool Avx512DequantQ(DType dtype, const void* src, float* dst, int64_t n);
}  // namespace internal

}  // namespace chorus::train
