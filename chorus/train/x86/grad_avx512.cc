// The avx512 variant of the training panel (grad_kernels.h): 16-float lanes over output columns,
// tiles of up to 4 rows × 4 vectors, one exact fma per (row, column, i) in the order of the spec.
#include <immintrin.h>

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

template <int V>
void Columns(const PanelArgs& a, int64_t c0) {
  int64_t r0 = 0;
  for (; r0 + 4 <= a.rows; r0 += 4) Tile<4, V>(a, r0, c0);
  switch (a.rows - r0) {
    case 3:
      Tile<3, V>(a, r0, c0);
      break;
    case 2:
      Tile<2, V>(a, r0, c0);
      break;
    case 1:
      Tile<1, V>(a, r0, c0);
      break;
    default:
      break;
  }
}

}  // namespace

int64_t Avx512Panel(const PanelArgs& a) {
  int64_t c0 = 0;
  for (; c0 + 4 * kW <= a.cols; c0 += 4 * kW) Columns<4>(a, c0);
  for (; c0 + kW <= a.cols; c0 += kW) Columns<1>(a, c0);
  return c0;
}

}  // namespace chorus::train::internal
