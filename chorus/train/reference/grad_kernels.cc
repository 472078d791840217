#include "chorus/train/grad_kernels.h"

#include <cmath>
#include <vector>

#include "chorus/tensor/dtype.h"

namespace chorus::train::reference {

void MatMulTransposed(const kernels::PackedWeight& w, const float* dy, int64_t dy_stride, int64_t m,
                      float* dx, int64_t dx_stride, bool accumulate) {
  const int64_t n = w.n(), k = w.k();
  const TensorView& src = w.source().view();
  std::vector<float> row(static_cast<size_t>(k));
  for (int64_t r = 0; r < m; ++r) {
    if (!accumulate) {
      for (int64_t c = 0; c < k; ++c) dx[r * dx_stride + c] = 0.0f;
    }
  }
  // Row by row of W: the chain for each (r, c) still runs over i in order.
  for (int64_t i = 0; i < n; ++i) {
    DequantizeRow(src.dtype, src.Row(i), row.data(), k);
    for (int64_t r = 0; r < m; ++r) {
      const float g = dy[r * dy_stride + i];
      float* out = dx + r * dx_stride;
      for (int64_t c = 0; c < k; ++c) out[c] = std::fma(g, row[static_cast<size_t>(c)], out[c]);
    }
  }
}

void AccumulateOuter(const float* a, int64_t a_stride, int64_t p, const float* b, int64_t b_stride,
                     int64_t q, int64_t t, float* g, int64_t g_stride) {
  for (int64_t i = 0; i < p; ++i) {
    for (int64_t j = 0; j < q; ++j) {
      float acc = g[i * g_stride + j];
      for (int64_t s = 0; s < t; ++s) acc = std::fma(a[s * a_stride + i], b[s * b_stride + j], acc);
      g[i * g_stride + j] = acc;
    }
  }
}

}  // namespace chorus::train::reference
