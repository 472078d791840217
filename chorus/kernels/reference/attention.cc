// Scalar specification of paged attention (attention.h), llama2.c style: scores, softmax,
// weighted sum of V, one query head at a time.
#include "chorus/kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "chorus/base/check.h"
#include "chorus/kernels/ops.h"

namespace chorus::kernels::reference {

void AttentionRow(const float* q, const PagedKv& kv, int64_t n_ctx, int64_t n_heads,
                  int64_t n_kv_heads, int64_t head_dim, float scale, float* scratch, float* out) {
  const int64_t group = n_heads / n_kv_heads;
  std::vector<float> row(static_cast<std::size_t>(head_dim));  // a bf16 row widened to f32
  for (int64_t h = 0; h < n_heads; ++h) {
    const int64_t g = h / group;
    const float* qh = q + h * head_dim;
    for (int64_t t = 0; t < n_ctx; ++t) {
      const float* k = kv.KeyRow(t, g, head_dim, row.data());
      float dot = 0.0f;
      for (int64_t d = 0; d < head_dim; ++d) dot += qh[d] * k[d];
      scratch[t] = dot * scale;
    }
    Softmax(scratch, n_ctx);
    float* oh = out + h * head_dim;
    for (int64_t d = 0; d < head_dim; ++d) oh[d] = 0.0f;
    for (int64_t t = 0; t < n_ctx; ++t) {
      const float* v = kv.ValueRow(t, g, head_dim, row.data());
      for (int64_t d = 0; d < head_dim; ++d) oh[d] += scratch[t] * v[d];
    }
  }
}

void AttentionRowWindow(const float* q, int64_t first, int64_t pos, const PagedKv& kv,
                        int64_t group, int64_t head_dim, float scale, float softcap, float* scratch,
                        float* out) {
  CHORUS_CHECK(0 <= first && first <= pos && group >= 1 && head_dim >= 1)
      << "keys [" << first << ", " << pos << "]";
  const int64_t n = pos + 1 - first;
  float* row = scratch + n;  // a bf16 row widened to f32
  for (int64_t h = 0; h < group; ++h) {
    const float* qh = q + h * head_dim;
    float mx = -INFINITY;
    for (int64_t j = 0; j < n; ++j) {
      const int64_t t = first + j;
      const float* k = kv.KeyRow(t, 0, head_dim, row);
      float dot = 0.0f;
      for (int64_t d = 0; d < head_dim; ++d) dot = std::fma(qh[d], k[d], dot);
      float s = dot * scale;
      if (softcap > 0) s = softcap * std::tanh(s / softcap);
      scratch[j] = s;
      mx = std::max(mx, s);
    }
    float sum = 0.0f;
    for (int64_t j = 0; j < n; ++j) {
      scratch[j] = std::exp(scratch[j] - mx);
      sum += scratch[j];
    }
    const float inv = 1.0f / sum;
    float* oh = out + h * head_dim;
    std::fill_n(oh, head_dim, 0.0f);
    for (int64_t j = 0; j < n; ++j) {
      const int64_t t = first + j;
      const float* v = kv.ValueRow(t, 0, head_dim, row);
      const float p = scratch[j] * inv;
      for (int64_t d = 0; d < head_dim; ++d) oh[d] = std::fma(p, v[d], oh[d]);
    }
  }
}

}  // namespace chorus::kernels::reference
