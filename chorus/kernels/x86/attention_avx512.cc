// AVX-512 paged attention (attention.h). The query heads that share a KV head are processed
// together (up to kSubHeads at a time) so each K and V row is read from memory once per group,
// with an online softmax over chunks of kChunk tokens (running max m, running sum l, output
// rescaled by e^(m_old − m_new) when the max grows). Only the query's own row and its
// sequence's KV enter the computation, in an order fixed by n_ctx alone (batch invariance).
// GCC 12 (bug 105593) reports -W(maybe-)uninitialized from inside the AVX-512 intrinsics that
// take an _mm512_undefined_ps() operand; the warnings are spurious, so they are silenced here.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "chorus/kernels/x86/ops_x86.h"

namespace chorus::kernels::avx512 {
namespace {

constexpr int64_t kSubHeads = 8;
constexpr int64_t kChunk = 32;

inline __mmask16 TailMask(int64_t remaining) {
  return remaining >= 16 ? static_cast<__mmask16>(0xFFFF)
                         : static_cast<__mmask16>((1u << remaining) - 1u);
}

inline float Dot(const float* a, const float* b, int64_t n) {
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  int64_t d = 0;
  for (; d + 32 <= n; d += 32) {
    acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + d), _mm512_loadu_ps(b + d), acc0);
    acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + d + 16), _mm512_loadu_ps(b + d + 16), acc1);
  }
  for (; d < n; d += 16) {
    const __mmask16 k = TailMask(n - d);
    acc0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(k, a + d), _mm512_maskz_loadu_ps(k, b + d), acc0);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
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
    alignas(64) float p[kSubHeads][kChunk];
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
      for (int64_t d = 0; d < head_dim; d += 16) {
        const __mmask16 k = TailMask(head_dim - d);
        for (int64_t i = 0; i < nh; ++i) {
          float* o = out + (h0 + i) * head_dim + d;
          __m512 acc = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, o), _mm512_set1_ps(alpha[i]));
          for (int64_t c = 0; c < nc; ++c) {
            acc = _mm512_fmadd_ps(_mm512_set1_ps(p[i][c]), _mm512_maskz_loadu_ps(k, vp[c] + d), acc);
          }
          _mm512_mask_storeu_ps(o, k, acc);
        }
      }
    }
    for (int64_t i = 0; i < nh; ++i) {
      const __m512 inv = _mm512_set1_ps(1.0f / l[i]);
      float* o = out + (h0 + i) * head_dim;
      for (int64_t d = 0; d < head_dim; d += 16) {
        const __mmask16 k = TailMask(head_dim - d);
        _mm512_mask_storeu_ps(o + d, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, o + d), inv));
      }
    }
  }
}

}  // namespace chorus::kernels::avx512
