// Scalar specification of paged attention (attention.h), llama2.c style: scores, softmax,
// weighted sum of V, one query head at a time.
#include "chorus/kernels/attention.h"

#include <cstddef>
#include <vector>

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

}  // namespace chorus::kernels::reference
