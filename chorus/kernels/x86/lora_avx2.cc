// AVX2 tiles of the LoRA segment kernels (lora.h, lora_internal.h). Same structure as the
// AVX-512 tiles with 8 lanes: shrink tiles of NR ≤ 4 rows × NJ ≤ 2 rank columns, one 8-lane
// accumulator per (row, j) over k in steps of 8 (masked tail) and a fixed horizontal sum;
// expand tiles of NR ≤ 4 rows × 16 columns with masked column tails. bf16 weights are widened
// to f32 in registers (zero-extend, shift left 16: exact) and take the same fma sequence.
#include <immintrin.h>

#include <cstring>

#include "chorus/kernels/lora_internal.h"

namespace chorus::kernels::lora_internal::avx2 {
namespace {

// Lane mask for `remaining` (≥ 1) valid floats out of 8.
inline __m256i TailMask(int64_t remaining) {
  const int n = remaining >= 8 ? 8 : static_cast<int>(remaining);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

inline float HorizontalSum(__m256 v) {
  const __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  __m128 s = _mm_add_ps(lo, hi);
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// 8 weights as f32: all 8 (`remaining` ≥ 8), or the first `remaining` (others zero, not read).
inline __m256 LoadW(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 LoadW(const uint16_t* p) {
  const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}
inline __m256 LoadWTail(const float* p, int64_t remaining) {
  if (remaining <= 0) return _mm256_setzero_ps();
  return _mm256_maskload_ps(p, TailMask(remaining));
}
inline __m256 LoadWTail(const uint16_t* p, int64_t remaining) {
  if (remaining >= 8) return LoadW(p);
  alignas(16) uint16_t tmp[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  if (remaining > 0) std::memcpy(tmp, p, static_cast<size_t>(remaining) * sizeof(uint16_t));
  return LoadW(tmp);
}

template <int NR, int NJ, typename T>
inline void ShrinkMicro(const float* x, int64_t x_stride, const T* const* a, int64_t in, int64_t j0,
                        float* v, int64_t v_stride) {
  __m256 acc[NR][NJ];
#pragma GCC unroll 4
  for (int r = 0; r < NR; ++r)
#pragma GCC unroll 4
    for (int q = 0; q < NJ; ++q) acc[r][q] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= in; k += 8) {
    __m256 xv[NR];
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) xv[r] = _mm256_loadu_ps(x + r * x_stride + k);
#pragma GCC unroll 4
    for (int q = 0; q < NJ; ++q) {
      const __m256 av = LoadW(a[j0 + q] + k);
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) acc[r][q] = _mm256_fmadd_ps(xv[r], av, acc[r][q]);
    }
  }
  if (k < in) {
    const __m256i m = TailMask(in - k);
    __m256 xv[NR];
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) xv[r] = _mm256_maskload_ps(x + r * x_stride + k, m);
#pragma GCC unroll 4
    for (int q = 0; q < NJ; ++q) {
      const __m256 av = LoadWTail(a[j0 + q] + k, in - k);
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) acc[r][q] = _mm256_fmadd_ps(xv[r], av, acc[r][q]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < NR; ++r)
#pragma GCC unroll 4
    for (int q = 0; q < NJ; ++q) v[r * v_stride + j0 + q] = HorizontalSum(acc[r][q]);
}

template <int NR, typename T>
inline void ShrinkRows(const float* x, int64_t x_stride, const T* const* a, int64_t in,
                       int64_t j_begin, int64_t j_end, float* v, int64_t v_stride) {
  int64_t j = j_begin;
  for (; j + 2 <= j_end; j += 2) ShrinkMicro<NR, 2>(x, x_stride, a, in, j, v, v_stride);
  if (j < j_end) ShrinkMicro<NR, 1>(x, x_stride, a, in, j, v, v_stride);
}

template <int NR, typename T>
inline void ExpandRows(const float* v, int64_t v_stride, const T* const* bt, int64_t rank,
                       float scale, int64_t c_begin, int64_t c_end, float* y, int64_t y_stride) {
  const __m256 s = _mm256_set1_ps(scale);
  for (int64_t c = c_begin; c < c_end; c += 16) {
    const __m256i m0 = TailMask(c_end - c);
    const __m256i m1 = c + 8 < c_end ? TailMask(c_end - c - 8) : _mm256_setzero_si256();
    const bool full = c + 16 <= c_end;
    __m256 acc0[NR], acc1[NR];
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) acc0[r] = acc1[r] = _mm256_setzero_ps();
    for (int64_t j = 0; j < rank; ++j) {
      const T* b = bt[j] + c;
      const __m256 b0 = full ? LoadW(b) : LoadWTail(b, c_end - c);
      const __m256 b1 = full ? LoadW(b + 8) : LoadWTail(b + 8, c_end - c - 8);
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) {
        const __m256 vv = _mm256_broadcast_ss(v + r * v_stride + j);
        acc0[r] = _mm256_fmadd_ps(vv, b0, acc0[r]);
        acc1[r] = _mm256_fmadd_ps(vv, b1, acc1[r]);
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      float* yr = y + r * y_stride + c;
      _mm256_maskstore_ps(yr, m0, _mm256_fmadd_ps(s, acc0[r], _mm256_maskload_ps(yr, m0)));
      _mm256_maskstore_ps(yr + 8, m1,
                          _mm256_fmadd_ps(s, acc1[r], _mm256_maskload_ps(yr + 8, m1)));
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

}  // namespace chorus::kernels::lora_internal::avx2
