// AVX2 tiles of the LoRA segment kernels (lora.h, lora_internal.h). Same structure as the
// AVX-512 tiles with 8 lanes: shrink tiles of NR ≤ 4 rows × NJ ≤ 2 rank columns, one 8-lane
// accumulator per (row, j) over k in steps of 8 (masked tail) and a fixed horizontal sum;
// expand as the AVX-512 tiles (streamed below 4 rows, packed panels of 16 columns from 4 rows).
// bf16 weights are widened to f32 in registers (zero-extend, shift left 16: exact) and take the
// same fma sequence.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "chorus/kernels/lora_internal.h"
#include "chorus/kernels/x86/lora_tiles.h"

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
#pragma GCC unroll 8
    for (int q = 0; q < NJ; ++q) acc[r][q] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= in; k += 8) {
    __m256 xv[NR];
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) xv[r] = _mm256_loadu_ps(x + r * x_stride + k);
#pragma GCC unroll 8
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
#pragma GCC unroll 8
    for (int q = 0; q < NJ; ++q) {
      const __m256 av = LoadWTail(a[j0 + q] + k, in - k);
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) acc[r][q] = _mm256_fmadd_ps(xv[r], av, acc[r][q]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < NR; ++r)
#pragma GCC unroll 8
    for (int q = 0; q < NJ; ++q) v[r * v_stride + j0 + q] = HorizontalSum(acc[r][q]);
}

template <int NR, typename T>
inline void ShrinkRows(const float* x, int64_t x_stride, const T* const* a, int64_t in,
                       int64_t j_begin, int64_t j_end, float* v, int64_t v_stride) {
  int64_t j = j_begin;
  if constexpr (NR == 1) {  // one row: 8 A rows at once, 8 streams in flight (decode)
    for (; j + 8 <= j_end; j += 8) ShrinkMicro<1, 8>(x, x_stride, a, in, j, v, v_stride);
  }
  for (; j + 2 <= j_end; j += 2) ShrinkMicro<NR, 2>(x, x_stride, a, in, j, v, v_stride);
  if (j < j_end) ShrinkMicro<NR, 1>(x, x_stride, a, in, j, v, v_stride);
}

template <typename T>
void ShrinkTileT(const float* x, int64_t x_stride, int64_t n_rows, const T* const* a, int64_t in,
                 int64_t j_begin, int64_t j_end, float* v, int64_t v_stride) {
  ForRowTiles(n_rows, [&](auto nr, int64_t i) {
    ShrinkRows<decltype(nr)::value>(x + i * x_stride, x_stride, a, in, j_begin, j_end,
                                    v + i * v_stride, v_stride);
  });
}

// Expand, as in the AVX-512 tiles (see there for why): fewer than 4 rows are streamed row by
// row of Bᵀ into accumulators in L1; 4-row tiles read blocks of Bᵀ packed into an f32 panel.
constexpr int64_t kStreamBlock = 1024;  // columns per streamed pass
constexpr int64_t kSub = 16;            // columns per sub-panel: 2 vectors
constexpr int64_t kMaxBlock = 2048;
constexpr int64_t kPanelFloats = 64 * 1024;

template <int NR, int NJ, typename T>
inline void StreamRowsJ(const float* v, int64_t v_stride, const T* const* bt, int64_t j0,
                        int64_t cb, int64_t width, float* acc) {
  const T* b[NJ];
#pragma GCC unroll 8
  for (int q = 0; q < NJ; ++q) b[q] = bt[j0 + q] + cb;
  // acc[r][c, c+8) += Σ_q v[r][j0+q] · w[q], q in order (the same chain for full and tail).
  auto accumulate = [&](const __m256* w, int64_t c) {
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      __m256 a = _mm256_load_ps(acc + r * kStreamBlock + c);
#pragma GCC unroll 8
      for (int q = 0; q < NJ; ++q)
        a = _mm256_fmadd_ps(_mm256_broadcast_ss(v + r * v_stride + j0 + q), w[q], a);
      _mm256_store_ps(acc + r * kStreamBlock + c, a);
    }
  };
  __m256 w[NJ];
  int64_t c = 0;
  for (; c + 8 <= width; c += 8) {
#pragma GCC unroll 8
    for (int q = 0; q < NJ; ++q) w[q] = LoadW(b[q] + c);
    accumulate(w, c);
  }
  if (c < width) {
#pragma GCC unroll 8
    for (int q = 0; q < NJ; ++q) w[q] = LoadWTail(b[q] + c, width - c);
    accumulate(w, c);
  }
}

template <int NR, typename T>
void ExpandStream(const float* v, int64_t v_stride, const T* const* bt, int64_t rank, float scale,
                  int64_t c_begin, int64_t c_end, float* y, int64_t y_stride) {
  alignas(32) float acc[NR * kStreamBlock];
  const __m256 s = _mm256_set1_ps(scale);
  constexpr int kJ = NR == 1 ? 8 : 4;
  for (int64_t cb = c_begin; cb < c_end; cb += kStreamBlock) {
    const int64_t width = std::min(kStreamBlock, c_end - cb);
    for (int r = 0; r < NR; ++r)
      for (int64_t c = 0; c < width; c += 8)
        _mm256_store_ps(acc + r * kStreamBlock + c, _mm256_setzero_ps());
    int64_t j = 0;
    for (; j + kJ <= rank; j += kJ) StreamRowsJ<NR, kJ>(v, v_stride, bt, j, cb, width, acc);
    for (; j < rank; ++j) StreamRowsJ<NR, 1>(v, v_stride, bt, j, cb, width, acc);
    for (int r = 0; r < NR; ++r) {
      float* yr = y + r * y_stride + cb;
      for (int64_t c = 0; c < width; c += 8) {
        const __m256i m = TailMask(width - c);
        _mm256_maskstore_ps(yr + c, m,
                            _mm256_fmadd_ps(s, _mm256_load_ps(acc + r * kStreamBlock + c),
                                            _mm256_maskload_ps(yr + c, m)));
      }
    }
  }
}

// panel[(s · rank + j) · kSub + c] = Bᵀ[j][cb + s · kSub + c], zero past `width`.
template <typename T>
void PackBlock(const T* const* bt, int64_t rank, int64_t cb, int64_t width, float* panel) {
  const int64_t n_sub = (width + kSub - 1) / kSub;
  for (int64_t j = 0; j < rank; ++j) {
    const T* b = bt[j] + cb;
    for (int64_t sp = 0; sp < n_sub; ++sp) {
      float* dst = panel + (sp * rank + j) * kSub;
      const int64_t col = sp * kSub;
      _mm256_store_ps(dst, LoadWTail(b + col, width - col));
      _mm256_store_ps(dst + 8, LoadWTail(b + col + 8, width - col - 8));
    }
  }
}

template <int NR>
inline void ExpandSubPanel(const float* v, int64_t v_stride, const float* panel, int64_t rank,
                           __m256 s, int64_t width, float* y, int64_t y_stride) {
  __m256 acc0[NR], acc1[NR];
#pragma GCC unroll 4
  for (int r = 0; r < NR; ++r) acc0[r] = acc1[r] = _mm256_setzero_ps();
  for (int64_t j = 0; j < rank; ++j) {
    const __m256 w0 = _mm256_load_ps(panel + j * kSub), w1 = _mm256_load_ps(panel + j * kSub + 8);
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      const __m256 vv = _mm256_broadcast_ss(v + r * v_stride + j);
      acc0[r] = _mm256_fmadd_ps(vv, w0, acc0[r]);
      acc1[r] = _mm256_fmadd_ps(vv, w1, acc1[r]);
    }
  }
  const __m256i m0 = TailMask(width);
  const __m256i m1 = width > 8 ? TailMask(width - 8) : _mm256_setzero_si256();
#pragma GCC unroll 4
  for (int r = 0; r < NR; ++r) {
    float* yr = y + r * y_stride;
    _mm256_maskstore_ps(yr, m0, _mm256_fmadd_ps(s, acc0[r], _mm256_maskload_ps(yr, m0)));
    _mm256_maskstore_ps(yr + 8, m1, _mm256_fmadd_ps(s, acc1[r], _mm256_maskload_ps(yr + 8, m1)));
  }
}

// One tile of NR rows across the block, sub-panel by sub-panel (y rows written in order).
template <int NR>
void ExpandRowsFromPanel(const float* v, int64_t v_stride, const float* panel, int64_t rank,
                         __m256 s, int64_t width, float* y, int64_t y_stride) {
  for (int64_t sp = 0; sp * kSub < width; ++sp) {
    ExpandSubPanel<NR>(v, v_stride, panel + sp * rank * kSub, rank, s,
                       std::min(kSub, width - sp * kSub), y + sp * kSub, y_stride);
  }
}

template <typename T>
void ExpandTileT(const float* v, int64_t v_stride, int64_t n_rows, const T* const* bt, int64_t rank,
                 float scale, int64_t c_begin, int64_t c_end, float* y, int64_t y_stride) {
  if (n_rows < 8) {  // too few rows to pay for packing: stream 4 rows, then the rest
    return ForRowTiles(n_rows, [&](auto nr, int64_t i) {
      ExpandStream<decltype(nr)::value>(v + i * v_stride, v_stride, bt, rank, scale, c_begin, c_end,
                                        y + i * y_stride, y_stride);
    });
  }
  const __m256 s = _mm256_set1_ps(scale);
  ExpandByPanels(
      n_rows, rank, c_begin, c_end, kSub, kMaxBlock, kPanelFloats,
      [&](int64_t cb, int64_t width, float* panel) { PackBlock(bt, rank, cb, width, panel); },
      [&](auto nr, int64_t i, const float* panel, int64_t cb, int64_t width) {
        ExpandRowsFromPanel<decltype(nr)::value>(v + i * v_stride, v_stride, panel, rank, s, width,
                                                 y + i * y_stride + cb, y_stride);
      });
}

}  // namespace

CHORUS_LORA_TILE_DEFS(ShrinkTileT, ExpandTileT)

}  // namespace chorus::kernels::lora_internal::avx2
