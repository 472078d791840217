// AVX2 + FMA paged attention (attention.h), also used at the AVX-512 level. The query
// heads sharing a KV head are processed together (up to kSubHeads at a time) so each chunk of K
// and V rows is read from memory once per group and then from L1, with an online softmax over
// chunks of kChunk tokens. Scores are computed 8 tokens at a time (one joint reduction), and V
// is accumulated in 4 independent FMA chains. The order of operations depends only on n_ctx and
// the shapes (batch invariance).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "chorus/kernels/x86/ops_x86.h"

namespace chorus::kernels::avx2 {
namespace {

constexpr int64_t kSubHeads = 8;
constexpr int64_t kChunk = 32;

// Lanes [0, remaining) set (none when remaining ≤ 0).
inline __m256i TailMask(int64_t remaining) {
  const int r = remaining >= 8 ? 8 : remaining <= 0 ? 0 : static_cast<int>(remaining);
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

// Lane j of the result = the sum of the 8 lanes of a[j].
inline __m256 Reduce8(const __m256 a[8]) {
  const __m256 s01 = _mm256_hadd_ps(a[0], a[1]), s23 = _mm256_hadd_ps(a[2], a[3]);
  const __m256 s45 = _mm256_hadd_ps(a[4], a[5]), s67 = _mm256_hadd_ps(a[6], a[7]);
  // [a0 a1 a2 a3 | a0 a1 a2 a3] partial sums of the low and high 128-bit halves.
  const __m256 s0123 = _mm256_hadd_ps(s01, s23), s4567 = _mm256_hadd_ps(s45, s67);
  return _mm256_add_ps(_mm256_permute2f128_ps(s0123, s4567, 0x20),
                       _mm256_permute2f128_ps(s0123, s4567, 0x31));
}

// Lane j = q · k[j] over n floats, for 8 rows k[j]: the 8 sums are reduced together, so a dot
// product costs no horizontal reduction of its own.
inline __m256 Dot8(const float* q, const float* const* k, int64_t n) {
  __m256 acc[8];
  // Fully unrolled (GCC -O2 would otherwise keep acc[] on the stack).
#pragma GCC unroll 8
  for (auto& a : acc) a = _mm256_setzero_ps();
  int64_t d = 0;
  for (; d + 8 <= n; d += 8) {
    const __m256 qv = _mm256_loadu_ps(q + d);
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) acc[j] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k[j] + d), acc[j]);
  }
  if (d < n) {
    const __m256i mask = TailMask(n - d);
    const __m256 qv = _mm256_maskload_ps(q + d, mask);
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j)
      acc[j] = _mm256_fmadd_ps(qv, _mm256_maskload_ps(k[j] + d, mask), acc[j]);
  }
  return Reduce8(acc);
}

// o[0, 32) = o · alpha + Σ_c p[c] · v[c][d0 + 0, 32), as 4 independent accumulator chains.
// kFull: all 32 floats exist; otherwise `rem` (< 32) of them.
template <bool kFull>
inline void AccumulateV(float* o, const float* const* v, int64_t d0, const float* p, int64_t nc,
                        __m256 alpha, int64_t rem) {
  auto load = [&](const float* ptr, int j) {
    return kFull ? _mm256_loadu_ps(ptr + 8 * j)
                 : _mm256_maskload_ps(ptr + 8 * j, TailMask(rem - 8 * j));
  };
  __m256 acc[4];
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) acc[j] = _mm256_mul_ps(load(o, j), alpha);
  for (int64_t c = 0; c < nc; ++c) {
    const __m256 pc = _mm256_set1_ps(p[c]);
    const float* vc = v[c] + d0;
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) acc[j] = _mm256_fmadd_ps(pc, load(vc, j), acc[j]);
  }
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {
    if (kFull) {
      _mm256_storeu_ps(o + 8 * j, acc[j]);
    } else {
      _mm256_maskstore_ps(o + 8 * j, TailMask(rem - 8 * j), acc[j]);
    }
  }
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
      // The rows are scattered over blocks with a stride of kv_stride: prefetch the next
      // chunk's K and V while this one computes (the hardware prefetchers miss this pattern).
      const int64_t next_end = std::min(n_ctx, t0 + 2 * kChunk);
      for (int64_t t = t0 + kChunk; t < next_end; ++t) {
        const int32_t block = kv.block_table[t / kv.block_size];
        const int64_t off = (t % kv.block_size) * kv.kv_stride + g * head_dim;
        const char* kr = reinterpret_cast<const char*>(kv.k_blocks[block] + off);
        const char* vr = reinterpret_cast<const char*>(kv.v_blocks[block] + off);
        for (int64_t b = 0; b < head_dim * 4; b += 64) {
          _mm_prefetch(kr + b, _MM_HINT_T0);
          _mm_prefetch(vr + b, _MM_HINT_T0);
        }
      }
      float alpha[kSubHeads];
      for (int64_t i = 0; i < nh; ++i) {
        const float* qh = q + (h0 + i) * head_dim;
        for (int64_t c = 0; c < nc; c += 8) {
          // Past the last token the group repeats it; those scores are never used.
          const float* k8[8];
          for (int64_t j = 0; j < 8; ++j) k8[j] = kp[std::min(c + j, nc - 1)];
          _mm256_store_ps(p[i] + c, _mm256_mul_ps(Dot8(qh, k8, head_dim), _mm256_set1_ps(scale)));
        }
        float mc = m[i];
        for (int64_t c = 0; c < nc; ++c) mc = p[i][c] > mc ? p[i][c] : mc;
        alpha[i] = std::exp(m[i] - mc);  // 0 on the first chunk (m = -inf)
        m[i] = mc;
        l[i] = l[i] * alpha[i] + ExpShiftSum(p[i], nc, mc);
      }
      for (int64_t i = 0; i < nh; ++i) {
        float* o = out + (h0 + i) * head_dim;
        const __m256 a = _mm256_set1_ps(alpha[i]);
        int64_t d = 0;
        for (; d + 32 <= head_dim; d += 32) AccumulateV<true>(o + d, vp, d, p[i], nc, a, 32);
        if (d < head_dim) AccumulateV<false>(o + d, vp, d, p[i], nc, a, head_dim - d);
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
