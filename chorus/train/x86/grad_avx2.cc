// The avx2 variant of the training panel (grad_kernels.h): 8-float lanes over output columns,
// tiles of up to kTileRows rows × 4 vectors, one exact fma per (row, column, i) in the order of the
// spec.
#include <immintrin.h>

#include "chorus/tensor/dtype.h"
#include "chorus/train/grad_kernels.h"

namespace chorus::train::internal {
namespace {

constexpr int64_t kW = 8;

template <int R, int V>
void Tile(const PanelArgs& a, int64_t r0, int64_t c0) {
  __m256 acc[R][V];
  for (int r = 0; r < R; ++r) {
    float* out = a.out + (r0 + r) * a.out_stride + c0;
    for (int v = 0; v < V; ++v)
      acc[r][v] = a.init_zero ? _mm256_setzero_ps() : _mm256_loadu_ps(out + v * kW);
  }
  const float* l = a.l + r0 * a.l_row;
  for (int64_t i = 0; i < a.n; ++i) {
    const float* p = a.p + i * a.p_stride + c0;
    __m256 w[V];
    for (int v = 0; v < V; ++v) w[v] = _mm256_loadu_ps(p + v * kW);
    const float* li = l + i * a.l_inner;
    for (int r = 0; r < R; ++r) {
      const __m256 x = _mm256_set1_ps(li[r * a.l_row]);
      for (int v = 0; v < V; ++v) acc[r][v] = _mm256_fmadd_ps(x, w[v], acc[r][v]);
    }
  }
  for (int r = 0; r < R; ++r) {
    float* out = a.out + (r0 + r) * a.out_stride + c0;
    for (int v = 0; v < V; ++v) _mm256_storeu_ps(out + v * kW, acc[r][v]);
  }
}

// Rows per tile: 2 rows × 4 vectors of accumulators, the 4 weight vectors and a broadcast
// fit the 16 vector registers.
constexpr int kTileRows = 2;

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

int64_t Avx2Panel(const PanelArgs& a) {
  int64_t c0 = 0;
  for (; c0 + 4 * kW <= a.cols; c0 += 4 * kW) Columns<4>(a, c0);
  for (; c0 + kW <= a.cols; c0 += kW) Columns<1>(a, c0);
  return c0;
}

bool Avx2DequantQ(DType dtype, const void* src, float* dst, int64_t n) {
  if (dtype != DType::kQ8_0 && dtype != DType::kQ4_0) return false;
  for (int64_t b = 0; b < n / 32; ++b, dst += 32) {
    const BlockQ8_0* q8 = dtype == DType::kQ8_0 ? static_cast<const BlockQ8_0*>(src) + b : nullptr;
    const BlockQ4_0* q4 = dtype == DType::kQ4_0 ? static_cast<const BlockQ4_0*>(src) + b : nullptr;
    const uint16_t blk_d = q8 ? q8->d : q4->d;
    const __m256 d = _mm256_set1_ps(F16ToF32(blk_d));
    if (q8) {
      for (int h = 0; h < 4; ++h) {
        const __m128i b8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q8->qs + 8 * h));
        _mm256_storeu_ps(dst + 8 * h,
                         _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b8))));
      }
    } else {
      const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q4->qs));
      const __m128i m = _mm_set1_epi8(0x0f);
      const __m128i lo8 = _mm_and_si128(raw, m), hi8 = _mm_and_si128(_mm_srli_epi16(raw, 4), m);
      const __m256i eight = _mm256_set1_epi32(8);
      const __m128i parts[4] = {lo8, _mm_srli_si128(lo8, 8), hi8, _mm_srli_si128(hi8, 8)};
      for (int h = 0; h < 4; ++h) {
        const __m256i v = _mm256_sub_epi32(_mm256_cvtepu8_epi32(parts[h]), eight);
        _mm256_storeu_ps(dst + 8 * h, _mm256_mul_ps(d, _mm256_cvtepi32_ps(v)));
      }
    }
  }
  return true;
}

}  // namespace chorus::train::internal
