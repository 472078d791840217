// AVX-512 tiles of the LoRA segment kernels (lora.h, lora_internal.h).
//
// Shrink: register tiles of NR ≤ 4 rows × NJ ≤ 4 rank columns; each (row, j) owns one 16-lane
// accumulator fed by fma over k in steps of 16 (masked tail), then _mm512_reduce_add_ps. The op
// sequence of an element is the same in every tile shape, so the value does not depend on which
// other rows or columns share its tile.
// Expand: tiles of NR ≤ 4 rows × 32 columns; acc = fma chain over j in order, y = fma(s, acc, y);
// column tails use masked loads/stores so every column goes through the same instructions.
// bf16 weights (the *Bf16 tiles) are widened to f32 in registers (exact: a 16-bit shift) and go
// through the same fma sequence: a bf16 row gives bitwise what the f32 tiles give for the
// widened values, while the bytes streamed per row halve.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include "chorus/kernels/lora_internal.h"

namespace chorus::kernels::lora_internal::avx512 {
namespace {

inline __mmask16 TailMask(int64_t remaining) {
  return remaining >= 16 ? static_cast<__mmask16>(0xFFFF)
                         : static_cast<__mmask16>((1u << remaining) - 1u);
}

// 16 weights as f32 (masked-out lanes zero, never read).
inline __m512 LoadW(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
inline __m512 LoadW(const uint16_t* p, __mmask16 m) {
  const __m512i w = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}

template <int NR, int NJ, typename T>
inline void ShrinkMicro(const float* x, int64_t x_stride, const T* const* a, int64_t in, int64_t j0,
                        float* v, int64_t v_stride) {
  __m512 acc[NR][NJ];
#pragma GCC unroll 4
  for (int r = 0; r < NR; ++r)
#pragma GCC unroll 4
    for (int q = 0; q < NJ; ++q) acc[r][q] = _mm512_setzero_ps();
  for (int64_t k = 0; k < in; k += 16) {
    const __mmask16 m = TailMask(in - k);
    __m512 xv[NR];
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) xv[r] = _mm512_maskz_loadu_ps(m, x + r * x_stride + k);
#pragma GCC unroll 4
    for (int q = 0; q < NJ; ++q) {
      const __m512 av = LoadW(a[j0 + q] + k, m);
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) acc[r][q] = _mm512_fmadd_ps(xv[r], av, acc[r][q]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < NR; ++r)
#pragma GCC unroll 4
    for (int q = 0; q < NJ; ++q) v[r * v_stride + j0 + q] = _mm512_reduce_add_ps(acc[r][q]);
}

template <int NR, typename T>
inline void ShrinkRows(const float* x, int64_t x_stride, const T* const* a, int64_t in,
                       int64_t j_begin, int64_t j_end, float* v, int64_t v_stride) {
  int64_t j = j_begin;
  for (; j + 4 <= j_end; j += 4) ShrinkMicro<NR, 4>(x, x_stride, a, in, j, v, v_stride);
  switch (j_end - j) {
    case 3: ShrinkMicro<NR, 3>(x, x_stride, a, in, j, v, v_stride); break;
    case 2: ShrinkMicro<NR, 2>(x, x_stride, a, in, j, v, v_stride); break;
    case 1: ShrinkMicro<NR, 1>(x, x_stride, a, in, j, v, v_stride); break;
    default: break;
  }
}

template <int NR, typename T>
inline void ExpandRows(const float* v, int64_t v_stride, const T* const* bt, int64_t rank,
                       float scale, int64_t c_begin, int64_t c_end, float* y, int64_t y_stride) {
  const __m512 s = _mm512_set1_ps(scale);
  for (int64_t c = c_begin; c < c_end; c += 32) {
    const __mmask16 m0 = TailMask(c_end - c);
    const __mmask16 m1 = c + 16 < c_end ? TailMask(c_end - c - 16) : static_cast<__mmask16>(0);
    __m512 acc0[NR], acc1[NR];
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) acc0[r] = acc1[r] = _mm512_setzero_ps();
    for (int64_t j = 0; j < rank; ++j) {
      const T* b = bt[j] + c;
      const __m512 b0 = LoadW(b, m0);
      const __m512 b1 = LoadW(b + 16, m1);
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) {
        const __m512 vv = _mm512_set1_ps(v[r * v_stride + j]);
        acc0[r] = _mm512_fmadd_ps(vv, b0, acc0[r]);
        acc1[r] = _mm512_fmadd_ps(vv, b1, acc1[r]);
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      float* yr = y + r * y_stride + c;
      _mm512_mask_storeu_ps(yr, m0, _mm512_fmadd_ps(s, acc0[r], _mm512_maskz_loadu_ps(m0, yr)));
      _mm512_mask_storeu_ps(yr + 16, m1,
                            _mm512_fmadd_ps(s, acc1[r], _mm512_maskz_loadu_ps(m1, yr + 16)));
    }
  }
}

template <typename T>
void ShrinkTileT(const float* x, int64_t x_stride, int64_t n_rows, const T* const* a, int64_t in,
                 int64_t j_begin, int64_t j_end, float* v, int64_t v_stride) {
  int64_t i = 0;
  for (; i + 4 <= n_rows; i += 4) {
    ShrinkRows<4>(x + i * x_stride, x_stride, a, in, j_begin, j_end, v + i * v_stride, v_stride);
  }
  const float* xr = x + i * x_stride;
  float* vr = v + i * v_stride;
  switch (n_rows - i) {
    case 3: ShrinkRows<3>(xr, x_stride, a, in, j_begin, j_end, vr, v_stride); break;
    case 2: ShrinkRows<2>(xr, x_stride, a, in, j_begin, j_end, vr, v_stride); break;
    case 1: ShrinkRows<1>(xr, x_stride, a, in, j_begin, j_end, vr, v_stride); break;
    default: break;
  }
}

template <typename T>
void ExpandTileT(const float* v, int64_t v_stride, int64_t n_rows, const T* const* bt, int64_t rank,
                 float scale, int64_t c_begin, int64_t c_end, float* y, int64_t y_stride) {
  int64_t i = 0;
  for (; i + 4 <= n_rows; i += 4) {
    ExpandRows<4>(v + i * v_stride, v_stride, bt, rank, scale, c_begin, c_end, y + i * y_stride,
                  y_stride);
  }
  const float* vr = v + i * v_stride;
  float* yr = y + i * y_stride;
  switch (n_rows - i) {
    case 3:
      ExpandRows<3>(vr, v_stride, bt, rank, scale, c_begin, c_end, yr, y_stride);
      break;
    case 2:
      ExpandRows<2>(vr, v_stride, bt, rank, scale, c_begin, c_end, yr, y_stride);
      break;
    case 1:
      ExpandRows<1>(vr, v_stride, bt, rank, scale, c_begin, c_end, yr, y_stride);
      break;
    default: break;
  }
}

}  // namespace

CHORUS_LORA_TILE_DEFS(ShrinkTileT, ExpandTileT)

}  // namespace chorus::kernels::lora_internal::avx512
