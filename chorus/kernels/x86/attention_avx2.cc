// AVX2 + FMA paged attention (attention.h). Same algorithm as the AVX-512 variant: the query
// heads sharing a KV head are processed together (up to kSubHeads at a time) so each K and V
// row is read once per group, with an online softmax over chunks of kChunk tokens. The order
// of operations depends only on n_ctx and the shapes (batch invariance).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "chorus/kernels/x86/ops_x86.h"

namespace chorus::kernels::avx2 {
namespace {

constexpr int64_t kSubHeads = 8;
constexpr int64_t kChunk = 32;

inline __m256i TailMask(int64_t remaining) {
  const int r = remaining >= 8 ? 8 : static_cast<int>(remaining);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(r), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
inline __m256 Load(const float* p, int64_t remaining) {
  return remaining >= 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, TailMask(remaining));
}
inline void Store(float* p, int64_t remaining, __m256 v) {
  if (remaining >= 8) {
    _mm256_storeu_ps(p, v);
  } else {
    _mm256_maskstore_ps(p, TailMask(remaining), v);
  }
}

inline float HorizontalSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline float Dot(const float* a, const float* b, int64_t n) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t d = 0;
  for (; d + 16 <= n; d += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + d), _mm256_loadu_ps(b + d), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + d + 8), _mm256_loadu_ps(b + d + 8), acc1);
  }
  for (; d < n; d += 8) acc0 = _mm256_fmadd_ps(Load(a + d, n - d), Load(b + d, n - d), acc0);
  return HorizontalSum(_mm256_add_ps(acc0, acc1));
}

}  // namespace

void AttentionRow(const float* q, const PagedKv& kv, int64_t n_ctx, int64_t n_heads,
                  int64_t n_kv_heads, int64_t head_dim, float scale, float* /*scratch*/,
                  float* out) {
  const int64_t group = n_heads / n_kv_heads;
  int64_t nh = 0;
  for (int64_t h0 = 0; h0 < n_heads; h0 += nh) {
    // Heads [h0, h0 + nh) share KV head g (a sub-group never straddles two KV heads).
    const int64_t g = h0 / group;
    nh = std::min(kSubHeads, (g + 1) * group - h0);
    float m[kSubHeads], l[kSubHeads];
    alignas(32) float p[kSubHeads][kChunk];
    const float* kp[kChunk];
    const float* vp[kChunk];
    for (int64_t i = 0; i < nh; ++i) {
      m[i] = -std::numeric_limits<float>::infinity();
      l[i] = 0.0f;
      float* o = out + (h0 + i) * head_dim;
      for (int64_t d = 0; d < head_dim; ++d) o[d] = 0.0f;
    }
    for (int64_t t0 = 0; t0 < n_ctx; t0 += kChunk) {
      const int64_t nc = std::min(kChunk, n_ctx - t0);
      for (int64_t c = 0; c < nc; ++c) {
        const int64_t t = t0 + c;
        const int32_t block = kv.block_table[t / kv.block_size];
        const int64_t off = (t % kv.block_size) * kv.kv_stride + g * head_dim;
        kp[c] = kv.k_blocks[block] + off;
        vp[c] = kv.v_blocks[block] + off;
      }
      float alpha[kSubHeads];
      for (int64_t i = 0; i < nh; ++i) {
        const float* qh = q + (h0 + i) * head_dim;
        float mc = m[i];
        for (int64_t c = 0; c < nc; ++c) {
          p[i][c] = Dot(qh, kp[c], head_dim) * scale;
          mc = p[i][c] > mc ? p[i][c] : mc;
        }
        alpha[i] = std::exp(m[i] - mc);  // 0 on the first chunk (m = -inf)
        m[i] = mc;
        l[i] = l[i] * alpha[i] + ExpShiftSum(p[i], nc, mc);
      }
      for (int64_t d = 0; d < head_dim; d += 8) {
        const int64_t rem = head_dim - d;
        for (int64_t i = 0; i < nh; ++i) {
          float* o = out + (h0 + i) * head_dim + d;
          __m256 acc = _mm256_mul_ps(Load(o, rem), _mm256_set1_ps(alpha[i]));
          for (int64_t c = 0; c < nc; ++c) {
            acc = _mm256_fmadd_ps(_mm256_set1_ps(p[i][c]), Load(vp[c] + d, rem), acc);
          }
          Store(o, rem, acc);
        }
      }
    }
    for (int64_t i = 0; i < nh; ++i) {
      const __m256 inv = _mm256_set1_ps(1.0f / l[i]);
      float* o = out + (h0 + i) * head_dim;
      for (int64_t d = 0; d < head_dim; d += 8) {
        Store(o + d, head_dim - d, _mm256_mul_ps(Load(o + d, head_dim - d), inv));
      }
    }
  }
}

}  // namespace chorus::kernels::avx2
