// The avx512 variant of the training panel (grad_kernels.h): 16-float lanes over output columns,
// tiles of up to kTileRows rows × 4 vectors, one exact fma per (row, column, i) in the order of the
// spec.
#if !defined(__clang__)  // GCC 12 bug 105593: spurious -Wmaybe-uninitialized in AVX-512 headers
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>

#include "chorus/tensor/dtype.h"
#include "chorus/train/grad_kernels.h"

namespace chorus::train::internal {
namespace {

constexpr int64_t kW = 16;

template <int R, int V>
void Tile(const PanelArgs& a, int64_t r0, int64_t c0) {
  __m512 acc[R][V];
  for (int r = 0; r < R; ++r) {
    float* out = a.out + (r0 + r) * a.out_stride + c0;
    for (int v = 0; v < V; ++v)
      acc[r][v] = a.init_zero ? _mm512_setzero_ps() : _mm512_loadu_ps(out + v * kW);
  }
  const float* l = a.l + r0 * a.l_row;
  for (int64_t i = 0; i < a.n; ++i) {
    const float* p = a.p + i * a.p_stride + c0;
    __m512 w[V];
    for (int v = 0; v < V; ++v) w[v] = _mm512_loadu_ps(p + v * kW);
    const float* li = l + i * a.l_inner;
    for (int r = 0; r < R; ++r) {
      const __m512 x = _mm512_set1_ps(li[r * a.l_row]);
      for (int v = 0; v < V; ++v) acc[r][v] = _mm512_fmadd_ps(x, w[v], acc[r][v]);
    }
  }
  for (int r = 0; r < R; ++r) {
    float* out = a.out + (r0 + r) * a.out_stride + c0;
    for (int v = 0; v < V; ++v) _mm512_storeu_ps(out + v * kW, acc[r][v]);
  }
}

// Rows per tile: 6 rows × 4 vectors of accumulators, the 4 weight vectors and a broadcast
// fit the 32 vector registers.
constexpr int kTileRows = 6;

// Tile<R, V> for the R = rows < kTileRows left at the bottom.
template <int V, int R = kTileRows - 1>
void RowTail(const PanelArgs& a, int64_t r0, int64_t c0, int64_t rows) {
  if constexpr (R > 0) {
    if (rows == R) {
      Tile<R, V>(a, r0, c0);
      return;
    }
    RowTail<V, R - 1>(a, r0, c0, rows);
  }
}

template <int V>
void Columns(const PanelArgs& a, int64_t c0) {
  int64_t r0 = 0;
  for (; r0 + kTileRows <= a.rows; r0 += kTileRows) Tile<kTileRows, V>(a, r0, c0);
  if (r0 < a.rows) RowTail<V>(a, r0, c0, a.rows - r0);
}

}  // namespace

int64_t Avx512Panel(const PanelArgs& a) {
  int64_t c0 = 0;
  for (; c0 + 4 * kW <= a.cols; c0 += 4 * kW) Columns<4>(a, c0);
  for (; c0 + kW <= a.cols; c0 += kW) Columns<1>(a, c0);
  return c0;
}

bool Avx512DequantQ(DType dtype, const void* src, float* dst, int64_t n) {
  if (dtype != DType::kQ8_0 && dtype != DType::kQ4_0) return false;
  for (int64_t b = 0; b < n / 32; ++b, dst += 32) {
    const BlockQ8_0* q8 = dtype == DType::kQ8_0 ? static_cast<const BlockQ8_0*>(src) + b : nullptr;
    const BlockQ4_0* q4 = dtype == DType::kQ4_0 ? static_cast<const BlockQ4_0*>(src) + b : nullptr;
    const uint16_t blk_d = q8 ? q8->d : q4->d;
    const __m512 d = _mm512_set1_ps(F16ToF32(blk_d));
    if (q8) {
      const __m128i* qs = reinterpret_cast<const __m128i*>(q8->qs);
      _mm512_storeu_ps(
          dst, _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(qs)))));
      _mm512_storeu_ps(
          dst + 16,
          _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(qs + 1)))));
    } else {
      const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q4->qs));
      const __m128i m = _mm_set1_epi8(0x0f);
      const __m512i eight = _mm512_set1_epi32(8);
      const __m512i lo = _mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm_and_si128(raw, m)), eight);
      const __m512i hi =
          _mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(raw, 4), m)), eight);
      _mm512_storeu_ps(dst, _mm512_mul_ps(d, _mm512_cvtepi32_ps(lo)));
      _mm512_storeu_ps(dst + 16, _mm512_mul_ps(d, _mm512_cvtepi32_ps(hi)));
    }
  }
  return true;
}

}  // namespace chorus::train::internal
