// AVX-512 tiled attention (attention.h, attention_tiles.h): 16 rows of a block per vector, 8 keys
// by 2 row vectors per score tile (16 accumulators), 8 heads × 32 floats per PV tile.
#if !defined(__clang__)  // GCC 12 bug 105593: spurious -Wmaybe-uninitialized in AVX-512 headers
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <cstring>

#include "chorus/kernels/attention_tiles.h"
#include "chorus/kernels/x86/attention_x86.h"

namespace chorus::kernels::avx512 {

// dst[j] = Bf16Pair(scale · src[2j], scale · src[2j + 1]) for j < 16 (attention_tiles.h): the
// same integer rounding as Bf16Bits, 16 elements at a time (vcvtneps2bf16 would flush
// denormals, which Bf16Bits keeps), then each element's low half packed in order, so words 2j
// and 2j + 1 form pair j.
void ScaledBf16Pairs16(const float* src, float scale, uint32_t* dst) {
  const __m512 s = _mm512_set1_ps(scale);
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
  const __m512i one = _mm512_set1_epi32(1), bias = _mm512_set1_epi32(0x7fff);
  const __m512i quiet = _mm512_set1_epi32(0x40);
  for (int half = 0; half < 2; ++half) {
    const __m512i u = _mm512_castps_si512(_mm512_mul_ps(_mm512_loadu_ps(src + 16 * half), s));
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, abs_mask), inf);
    const __m512i hi = _mm512_srli_epi32(u, 16);
    const __m512i rounded = _mm512_srli_epi32(
        _mm512_add_epi32(_mm512_add_epi32(u, bias), _mm512_and_si512(hi, one)), 16);
    const __m512i bits = _mm512_mask_or_epi32(rounded, nan, hi, quiet);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 8 * half), _mm512_cvtepi32_epi16(bits));
  }
}

namespace {

// vpermt2w indices of Vec512::PairIndex: idx[h] word 2i ← first[16h + i], word 2i + 1 ←
// second[16h + i].
struct PairIndexTable {
  alignas(64) int16_t idx[2][32];
  constexpr PairIndexTable() : idx() {
    for (int h = 0; h < 2; ++h) {
      for (int i = 0; i < 16; ++i) {
        idx[h][2 * i] = static_cast<int16_t>(16 * h + i);
        idx[h][2 * i + 1] = static_cast<int16_t>(32 + 16 * h + i);
      }
    }
  }
};
inline constexpr PairIndexTable kPairIndex;

struct Vec512 {
  using V = __m512;
  static constexpr int64_t kLanes = 16;
  // bf16 dot products (PagedKv::bf16_dot, attention_tiles.h): P holds 16 pairs of bf16 (a
  // 32-bit word each, the pair's first element in the low half); B 16 bf16 values.
  static constexpr bool kBf16Dot = true;
  using P = __m512i;
  using B = __m256i;
  static P LoadPairs(const uint32_t* p) { return _mm512_loadu_si512(p); }
  static void StorePairs(uint32_t* p, P v) { _mm512_storeu_si512(p, v); }
  static void StoreHalfPairs(uint32_t* p, B v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v);
  }
  static P BroadcastPair(uint32_t x) { return _mm512_set1_epi32(static_cast<int>(x)); }
  static void ScaledBf16Pairs16(const float* src, float scale, uint32_t* dst) {
    avx512::ScaledBf16Pairs16(src, scale, dst);
  }
  static P ZeroPairs() { return _mm512_setzero_si512(); }
  // acc + a·b per lane over its pair: the second elements' product first, then the first's,
  // each rounded once (vdpbf16ps).
  static V Dot(V acc, P a, P b) { return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b); }
  static B RoundBf16(V v) { return (__m256i)_mm512_cvtneps_pbh(v); }  // nearest even
  static V WidenBf16(B b) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
  }
  static B ZeroBf16() { return _mm256_setzero_si256(); }
  // Pair i = (first[i], second[i]).
  static P Interleave(B first, B second) {
    return _mm512_permutex2var_epi16(_mm512_castsi256_si512(first), PairIndex(0),
                                     _mm512_castsi256_si512(second));
  }
  static P InterleaveBf16(const uint16_t* first, const uint16_t* second) {
    return Interleave(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(first)),
                      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(second)));
  }
  // Elements [0, n) of two bf16 rows (n ≤ 32; the rest read as 0) as pairs: lo elements 0–15,
  // hi 16–31.
  static void InterleaveRows(const uint16_t* first, const uint16_t* second, int64_t n, P* lo,
                             P* hi) {
    const __mmask32 m = n >= 32 ? ~__mmask32{0} : (__mmask32{1} << n) - 1;
    const __m512i a = _mm512_maskz_loadu_epi16(m, first), b = _mm512_maskz_loadu_epi16(m, second);
    *lo = _mm512_permutex2var_epi16(a, PairIndex(0), b);
    *hi = _mm512_permutex2var_epi16(a, PairIndex(16), b);
  }
  // The first element of each pair kept, the second zeroed.
  static P EvenOnly(P v) { return _mm512_maskz_mov_epi16(0x55555555u, v); }
  // vpermt2w indices: word 2i ← first[base + i], word 2i + 1 ← second[base + i] (base 0, 16).
  static __m512i PairIndex(int base) { return _mm512_load_si512(kPairIndex.idx[base / 16]); }
  static constexpr int kKeyGroup = 8;
  static constexpr int64_t kHeadBlock = 8;
  static __mmask16 Mask(int64_t n) {
    return n >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << n) - 1u);
  }
  static V Zero() { return _mm512_setzero_ps(); }
  // 16 bf16 values at p widened to f32 (the bits shifted into the high half: exact).
  static V LoadBf16(const uint16_t* p) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  static V Set1(float x) { return _mm512_set1_ps(x); }
  static V Load(const float* p) { return _mm512_loadu_ps(p); }
  static V LoadN(const float* p, int64_t n) { return _mm512_maskz_loadu_ps(Mask(n), p); }
  static void Store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static void StoreN(float* p, int64_t n, V v) { _mm512_mask_storeu_ps(p, Mask(n), v); }
  static V Fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V Mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V Add(V a, V b) { return _mm512_add_ps(a, b); }
  static V Sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static V Max(V a, V b) { return _mm512_max_ps(a, b); }
  // Column decode (attention_tiles.h): lanes [n, 16) of v replaced by fill (all when n ≤ 0);
  // the largest lane; 8 floats at p in the low lanes, zeros above; and the transpose of 8
  // vectors (row h = x[h], 16 keys) stored as 16 rows of 8 floats, row c at dst + c · stride.
  static V MaskTail(V v, int64_t n, V fill) {
    return n >= 16 ? v : _mm512_mask_mov_ps(fill, Mask(n < 0 ? 0 : n), v);
  }
  // Lanes [0, n) of v replaced by fill (none when n ≤ 0): keys before a window's first.
  static V MaskHead(V v, int64_t n, V fill) {
    return n <= 0 ? v : _mm512_mask_mov_ps(v, Mask(n), fill);
  }
  static float ReduceMax(V v) { return _mm512_reduce_max_ps(v); }
  static V LoadHalf(const float* p) { return _mm512_zextps256_ps512(_mm256_loadu_ps(p)); }
  static void StoreTransposed8(const V* x, float* dst, int64_t stride) {
    V t[8], u[8];
    for (int i = 0; i < 4; ++i) {  // per 128-bit lane: rows 2i, 2i + 1 interleaved
      t[2 * i] = _mm512_unpacklo_ps(x[2 * i], x[2 * i + 1]);
      t[2 * i + 1] = _mm512_unpackhi_ps(x[2 * i], x[2 * i + 1]);
    }
    for (int g = 0; g < 2; ++g) {  // u[4g + k], lane L: rows 4g..4g+3 of key 4L + k
      const __m512d a = _mm512_castps_pd(t[4 * g]), b = _mm512_castps_pd(t[4 * g + 2]);
      const __m512d c = _mm512_castps_pd(t[4 * g + 1]), d = _mm512_castps_pd(t[4 * g + 3]);
      u[4 * g + 0] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
      u[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
      u[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(c, d));
      u[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(c, d));
    }
    const __m512i lo = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
    const __m512i hi =
        _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
    auto store2 = [&](V v, int64_t key_a, int64_t key_b) {
      _mm256_storeu_ps(dst + key_a * stride, _mm512_castps512_ps256(v));
      _mm256_storeu_ps(dst + key_b * stride,
                       _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    };
    for (int k = 0; k < 4; ++k) {
      store2(_mm512_permutex2var_ps(u[k], lo, u[4 + k]), k, k + 4);
      store2(_mm512_permutex2var_ps(u[k], hi, u[4 + k]), k + 8, k + 12);
    }
  }
  static V ZeroIfNegInf(V m) {
    const __mmask16 k =
        _mm512_cmp_ps_mask(m, _mm512_set1_ps(attention_internal::kNegInf), _CMP_EQ_OQ);
    return _mm512_mask_mov_ps(m, k, _mm512_setzero_ps());
  }
  static V MaskBelow(V pos, float key, V s, V fill) {
    return _mm512_mask_mov_ps(s, _mm512_cmp_ps_mask(pos, _mm512_set1_ps(key), _CMP_LT_OQ), fill);
  }
  // e^x for x ≤ 0 (every argument here is a score minus a running max that includes it, or
  // −∞): x = n·ln2 + r with |r| ≤ ln2/2, e^r by its degree-6 Taylor polynomial (truncation error
  // < 1.3e-7 relative), 2^n by vscalefps; x is clamped below at -104 so that exp(-inf) = 0.
  // tanh x = ±(1 − e)/(1 + e) with e = e^(−2|x|) ∈ (0, 1] (Exp's domain), the sign of x (soft
  // caps, AttentionScores).
  static V Tanh(V x) {
    const V e = Exp(_mm512_mul_ps(_mm512_set1_ps(-2.0f), _mm512_abs_ps(x)));
    const V one = _mm512_set1_ps(1.0f);
    const V t = _mm512_div_ps(_mm512_sub_ps(one, e), _mm512_add_ps(one, e));
    const __m512i sign = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(INT32_MIN));
    return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(t), sign));
  }
  static V Exp(V x) {
    const V xc = _mm512_max_ps(_mm512_set1_ps(-104.0f), x);
    const V n = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    V r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), xc);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187045e-06f), r);
    V p = _mm512_set1_ps(1.0f / 720.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
  }
};

}  // namespace

void AttentionBlock(const float* q, int64_t q_stride, int64_t n_tokens, int64_t pos0,
                    const PagedKv& kv, int64_t kv_head, int64_t group, int64_t head_dim,
                    float scale, float* scratch, float* out, int64_t out_stride,
                    AttentionScores scores) {
  attention_internal::Block<Vec512>(q, q_stride, n_tokens, pos0, kv, kv_head, group, head_dim,
                                    scale, scratch, out, out_stride, scores);
}

void AttentionPartials(const float* q, int64_t pos, const PagedKv& kv, int64_t kv_head,
                       int64_t group, int64_t head_dim, float scale, int64_t seg_begin,
                       int64_t seg_end, float* scratch, float* partials, AttentionScores scores) {
  attention_internal::Partials<Vec512>(q, pos, kv, kv_head, group, head_dim, scale, seg_begin,
                                       seg_end, scratch, partials, scores);
}

void AttentionPartialsHeads(const float* q, int64_t pos, const PagedKv* kv, int64_t n_heads,
                            int64_t group, int64_t head_dim, float scale, int64_t seg_begin,
                            int64_t seg_end, float* scratch, float* partials, int64_t head_partials,
                            AttentionScores scores) {
  attention_internal::PartialsHeads<Vec512>(q, pos, kv, n_heads, group, head_dim, scale, seg_begin,
                                            seg_end, scratch, partials, head_partials, scores);
}

void AttentionMerge(const float* partials, int64_t n_segments, int64_t group, int64_t head_dim,
                    float* out) {
  attention_internal::Merge<Vec512>(partials, n_segments, group, head_dim, out);
}

}  // namespace chorus::kernels::avx512
