// AVX2 + FMA tiled attention (attention.h, attention_tiles.h): 8 rows of a block per vector,
// 4 keys by 2 row vectors per score tile and 6 heads × 16 floats per PV tile (16 ymm registers).
#include <immintrin.h>

#include <cstring>
#include <limits>

#include "chorus/kernels/attention_tiles.h"
#include "chorus/kernels/x86/attention_x86.h"
#include "chorus/kernels/x86/exp_avx2.h"

namespace chorus::kernels::avx2 {
namespace {

struct Vec256 {
  using V = __m256;
  static constexpr bool kBf16Dot = false;  // the f32 arithmetic on widened bf16 values
  static constexpr int64_t kLanes = 8;
  static constexpr int kKeyGroup = 4;
  static constexpr int64_t kHeadBlock = 6;
  static __m256i Mask(int64_t n) {
    const int r = n >= 8 ? 8 : n <= 0 ? 0 : static_cast<int>(n);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(r), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static V Zero() { return _mm256_setzero_ps(); }
  // 8 bf16 values at p widened to f32 (the bits shifted into the high half: exact).
  static V LoadBf16(const uint16_t* p) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  static V Set1(float x) { return _mm256_set1_ps(x); }
  static V Load(const float* p) { return _mm256_loadu_ps(p); }
  static V LoadN(const float* p, int64_t n) { return _mm256_maskload_ps(p, Mask(n)); }
  static void Store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static void StoreN(float* p, int64_t n, V v) { _mm256_maskstore_ps(p, Mask(n), v); }
  static V Fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V Mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V Add(V a, V b) { return _mm256_add_ps(a, b); }
  static V Sub(V a, V b) { return _mm256_sub_ps(a, b); }
  static V Max(V a, V b) { return _mm256_max_ps(a, b); }
  // Column decode (attention_tiles.h): lanes [n, 8) of v replaced by fill (all when n ≤ 0);
  // the largest lane.
  static V MaskTail(V v, int64_t n, V fill) {
    return n >= 8 ? v : _mm256_blendv_ps(fill, v, _mm256_castsi256_ps(Mask(n)));
  }
  // Lanes [0, n) of v replaced by fill (none when n ≤ 0): keys before a window's first.
  static V MaskHead(V v, int64_t n, V fill) {
    return n <= 0 ? v : _mm256_blendv_ps(v, fill, _mm256_castsi256_ps(Mask(n)));
  }
  static float ReduceMax(V v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
  }
  static V ZeroIfNegInf(V m) {
    const V is_neg_inf = _mm256_cmp_ps(m, _mm256_set1_ps(attention_internal::kNegInf), _CMP_EQ_OQ);
    return _mm256_blendv_ps(m, _mm256_setzero_ps(), is_neg_inf);
  }
  static V MaskBelow(V pos, float key, V s, V fill) {
    return _mm256_blendv_ps(s, fill, _mm256_cmp_ps(pos, _mm256_set1_ps(key), _CMP_LT_OQ));
  }
  // e^x as ops_avx2.cc computes it (x86/exp_avx2.h).
  static V Exp(V x) { return avx2::Exp(x); }
  // tanh x = ±(1 − e)/(1 + e) with e = e^(−2|x|), the sign of x (soft caps, AttentionScores).
  static V Tanh(V x) {
    const V sign_bit = _mm256_set1_ps(-0.0f);
    const V e = Exp(_mm256_mul_ps(_mm256_set1_ps(-2.0f), _mm256_andnot_ps(sign_bit, x)));
    const V one = _mm256_set1_ps(1.0f);
    const V t = _mm256_div_ps(_mm256_sub_ps(one, e), _mm256_add_ps(one, e));
    return _mm256_or_ps(t, _mm256_and_ps(x, sign_bit));
  }
};

}  // namespace

void AttentionBlock(const float* q, int64_t q_stride, int64_t n_tokens, int64_t pos0,
                    const PagedKv& kv, int64_t kv_head, int64_t group, int64_t head_dim,
                    float scale, float* scratch, float* out, int64_t out_stride,
                    AttentionScores scores) {
  attention_internal::Block<Vec256>(q, q_stride, n_tokens, pos0, kv, kv_head, group, head_dim,
                                    scale, scratch, out, out_stride, scores);
}

void AttentionPartials(const float* q, int64_t pos, const PagedKv& kv, int64_t kv_head,
                       int64_t group, int64_t head_dim, float scale, int64_t seg_begin,
                       int64_t seg_end, float* scratch, float* partials, AttentionScores scores) {
  attention_internal::Partials<Vec256>(q, pos, kv, kv_head, group, head_dim, scale, seg_begin,
                                       seg_end, scratch, partials, scores);
}

void AttentionPartialsHeads(const float* q, int64_t pos, const PagedKv* kv, int64_t n_heads,
                            int64_t group, int64_t head_dim, float scale, int64_t seg_begin,
                            int64_t seg_end, float* scratch, float* partials, int64_t head_partials,
                            AttentionScores scores) {
  attention_internal::PartialsHeads<Vec256>(q, pos, kv, n_heads, group, head_dim, scale, seg_begin,
                                            seg_end, scratch, partials, head_partials, scores);
}

void AttentionMerge(const float* partials, int64_t n_segments, int64_t group, int64_t head_dim,
                    float* out) {
  attention_internal::Merge<Vec256>(partials, n_segments, group, head_dim, out);
}

}  // namespace chorus::kernels::avx2
