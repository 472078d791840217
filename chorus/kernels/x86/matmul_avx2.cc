// AVX2 + FMA + F16C matmul kernels (compiled with -mavx2 -mfma -mf16c; run only when
// ActiveIsa() >= kAvx2).
//
// Quantized weights: vpmaddubsw (u8 × s8 → s16 pairs) + vpmaddwd. q8_0 uses the sign trick
// (|w| × sign(x, w)) so no pair sum can saturate (≤ 128·127·2); q4_0 nibbles (0..15) are
// unsigned already, so 8 k-groups of s16 pair sums (≤ 8·2·15·127 = 30480) accumulate in s16
// before one vpmaddwd, and the −8·Σx offset is added per block.
// K-quant weights: x86/matmul_ktile.h (vpmaddubsw pairs summed in int16 while they cannot
// overflow, vpmaddwd by the sub-block scale and for the mins).
// Float weights: lanes over k, one accumulator per (row, column), fixed horizontal sum.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "chorus/kernels/matmul_internal.h"
#include "chorus/kernels/x86/matmul_ftile.h"
#include "chorus/kernels/x86/matmul_ktile.h"
#include "chorus/kernels/x86/matmul_qtile.h"

namespace chorus::kernels::internal {
namespace {

struct Avx2Traits {
  static constexpr int kLanes = 8;
  static constexpr int kMaxR = 4;
  static constexpr int kMaxC = 2;
  static constexpr int64_t kL2Budget = 256 * 1024;
  // Batch 1 runs RowPanels (whole panels in address order): a tile covers 2 of a panel's 8 vectors.
  static constexpr bool kRowPanels = true;
  static int CFor(int rr) { return rr <= 2 ? 2 : 1; }

  using I = __m256i;
  using F = __m256;
  struct W {
    __m256i a;  // unsigned operand of vpmaddubsw
    __m256i s;  // q8_0: signed weights (for the sign trick)
  };

  static F FZero() { return _mm256_setzero_ps(); }
  static I Bcast(int32_t v) { return _mm256_set1_epi32(v); }
  static F FBcast(float v) { return _mm256_set1_ps(v); }

  static W PrepQ8(const uint8_t* p) {
    W w;
    w.s = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)),
                           _mm256_set1_epi8(static_cast<char>(0x80)));
    w.a = _mm256_abs_epi8(w.s);  // |-128| = 0x80 = 128 as u8
    return w;
  }
  static I DotQ8(I acc, const W& w, I x) {
    const __m256i p = _mm256_maddubs_epi16(w.a, _mm256_sign_epi8(x, w.s));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
  }
  static void PrepQ4(const uint8_t* p, W* lo, W* hi) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    const __m256i mask = _mm256_set1_epi8(0x0f);
    lo->a = _mm256_and_si256(v, mask);
    hi->a = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
  }
  // Accumulates s16 pair sums (see the file comment for the bound).
  static I DotQ4(I acc, const W& w, I x) {
    return _mm256_add_epi16(acc, _mm256_maddubs_epi16(w.a, x));
  }
  // Weight offset removed through QMeta::corr: q4_0 nibbles are q + 8; q8_0 is multiplied
  // signed (sign trick), so no offset.
  static int32_t Offset(int layout) { return layout == kLayoutQ4Panel ? 8 : 0; }
  template <bool kQ4>
  static I Init(const int32_t*) {
    return _mm256_setzero_si256();
  }
  // Exact isum of the block. q4_0: s16 pair sums → s32, plus corr = −8·Σx.
  template <bool kQ4>
  static I Finish(I ia, const int32_t* corr) {
    if constexpr (kQ4) {
      return _mm256_add_epi32(_mm256_madd_epi16(ia, _mm256_set1_epi16(1)),
                              _mm256_set1_epi32(*corr));
    } else {
      return ia;
    }
  }
  static F Scales(const uint16_t* d) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(d)));
  }
  static F Cvt(I v) { return _mm256_cvtepi32_ps(v); }
  static F Mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F Fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static void Store(float* y, F acc, int valid, bool accumulate) {
    if (valid == kLanes) {
      if (accumulate) acc = _mm256_add_ps(_mm256_loadu_ps(y), acc);
      _mm256_storeu_ps(y, acc);
      return;
    }
    alignas(32) float tmp[kLanes];
    _mm256_store_ps(tmp, acc);
    for (int i = 0; i < valid; ++i) y[i] = accumulate ? y[i] + tmp[i] : tmp[i];
  }

  // ---- K-quant primitives (x86/matmul_ktile.h) ----
  // Tiles of 1-2 rows × 2 vectors: 3 accumulators per (row, vector) in 16 registers.
  static constexpr int kKMaxR = 2;
  static constexpr int kKMaxC = 2;
  // vpmaddubsw pair sums (≤ 2·127·max code each) add up in int16 for this many k-groups.
  static constexpr int MaxGroups(int max_code) {
    const int g = 32767 / (2 * 127 * max_code);
    return g >= 8 ? 8 : g >= 4 ? 4 : 2;
  }
  // One row (ktile::RowPanels): a panel's 8 vectors already give 8 independent int16 chains,
  // and 16 more sums would not fit the 16 registers.
  static constexpr bool kKRowSplit = false;
  static I AddSums(I a, I b) { return _mm256_add_epi16(a, b); }
  static I Zero() { return _mm256_setzero_si256(); }
  static I Load(const uint8_t* p) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  }
  static I And(I a, I b) { return _mm256_and_si256(a, b); }
  static I Or(I a, I b) { return _mm256_or_si256(a, b); }
  static I Sub(I a, I b) { return _mm256_sub_epi32(a, b); }
  static I Set8(int v) { return _mm256_set1_epi8(static_cast<char>(v)); }
  template <int kN>
  static I Shift(I v) {
    if constexpr (kN > 0) return _mm256_slli_epi16(v, kN);
    if constexpr (kN < 0) return _mm256_srli_epi16(v, -kN);
    return v;
  }
  template <int kN>
  static I Shl16(I v) {
    return _mm256_slli_epi16(v, kN);
  }
  static I Dot(I acc, I w, I x) { return _mm256_add_epi16(acc, _mm256_maddubs_epi16(w, x)); }
  // (S_j, S_j) in each 32-bit lane: vpmaddwd of the int16 pair sums by it is S_j · their sum.
  static I SVec(const int8_t* pairs, int odd) {
    const __m256i v =
        _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(pairs)));
    return odd ? _mm256_shufflehi_epi16(_mm256_shufflelo_epi16(v, 0xf5), 0xf5)
               : _mm256_shufflehi_epi16(_mm256_shufflelo_epi16(v, 0xa0), 0xa0);
  }
  static I Flush(I isum, I ij, I sv) { return _mm256_add_epi32(isum, _mm256_madd_epi16(ij, sv)); }
  static I PairVec(const int8_t* pairs) {
    return _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(pairs)));
  }
  static I DotPairs(I acc, I a, I b) { return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b)); }
  static F Fnma(F a, F b, F c) { return _mm256_fnmadd_ps(a, b, c); }
};

// ---- activation conversion --------------------------------------------------------------

inline float HMax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

// lround(t) for |t| < 2^23 exactly: trunc(t) plus ±1 when the (exact) fraction is ≥ 0.5.
inline __m256i RoundHalfAway(__m256 t) {
  const __m256 tr = _mm256_round_ps(t, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  const __m256 frac = _mm256_sub_ps(t, tr);
  const __m256 sign_mask = _mm256_set1_ps(-0.0f);
  const __m256 afrac = _mm256_andnot_ps(sign_mask, frac);
  const __m256 ge = _mm256_cmp_ps(afrac, _mm256_set1_ps(0.5f), _CMP_GE_OQ);
  const __m256 one = _mm256_or_ps(_mm256_and_ps(t, sign_mask), _mm256_set1_ps(1.0f));
  return _mm256_cvttps_epi32(_mm256_add_ps(tr, _mm256_and_ps(ge, one)));
}

// The K-layout activation quantizer (ReferenceQuantizeRowK): one scale per 256, sums per 16.
void QuantizeRowsK(const float* x, int64_t x_stride, int64_t r0, int64_t r1, int64_t k,
                   const QRows& q) {
  const __m256 sign_mask = _mm256_set1_ps(-0.0f);
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * x_stride;
    int8_t* qs = q.qs + r * q.qs_stride;
    QMetaK* meta = KMetaRow(q, r);
    for (int64_t b = 0; b < k / 256; ++b) {
      const float* xb = xr + b * 256;
      __m256 amax = _mm256_setzero_ps();
      for (int i = 0; i < 32; ++i)
        amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign_mask, _mm256_loadu_ps(xb + 8 * i)));
      const float d = HMax(amax) / 127.0f;
      const float id = d != 0.0f ? 1.0f / d : 0.0f;
      const __m256 vid = _mm256_set1_ps(id);
      QMetaK& mt = meta[b];
      mt.d = d;
      for (int i = 0; i < 16; ++i) {  // 16 elements: two vectors
        const __m256i q0 = RoundHalfAway(_mm256_mul_ps(_mm256_loadu_ps(xb + 16 * i), vid));
        const __m256i q1 = RoundHalfAway(_mm256_mul_ps(_mm256_loadu_ps(xb + 16 * i + 8), vid));
        const __m256i s = _mm256_add_epi32(q0, q1);
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
        mt.s16[i] = static_cast<int16_t>(_mm_cvtsi128_si32(s4));
        const __m256i p = _mm256_packs_epi32(q0, q1);  // 0-3 8-11 | 4-7 12-15 (int16)
        const __m128i b16 =
            _mm_packs_epi16(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
        // b16 bytes: 0-3, 8-11, 4-7, 12-15 → element order.
        _mm_storeu_si128(reinterpret_cast<__m128i*>(qs + b * 256 + 16 * i),
                         _mm_shuffle_epi32(b16, _MM_SHUFFLE(3, 1, 2, 0)));
      }
      for (int g = 0; g < 8; ++g)
        mt.s32[g] = static_cast<int16_t>(mt.s16[2 * g] + mt.s16[2 * g + 1]);
    }
  }
}

void QuantizeRows(int layout, const float* x, int64_t x_stride, int64_t r0, int64_t r1, int64_t k,
                  const QRows& q) {
  if (IsKLayout(layout)) return QuantizeRowsK(x, x_stride, r0, r1, k, q);
  const int32_t offset = Avx2Traits::Offset(layout);
  const __m256 sign_mask = _mm256_set1_ps(-0.0f);
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * x_stride;
    int8_t* qs = q.qs + r * q.qs_stride;
    QMeta* meta = q.meta + r * q.meta_stride;
    for (int64_t b = 0; b < k / 32; ++b) {
      __m256 v[4];
      __m256 amax = _mm256_setzero_ps();
      CHORUS_UNROLL
      for (int i = 0; i < 4; ++i) {
        v[i] = _mm256_loadu_ps(xr + b * 32 + 8 * i);
        amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign_mask, v[i]));
      }
      const float d = HMax(amax) / 127.0f;
      const float id = d != 0.0f ? 1.0f / d : 0.0f;
      const __m256 vid = _mm256_set1_ps(id);
      __m256i qi[4];
      CHORUS_UNROLL
      for (int i = 0; i < 4; ++i) qi[i] = RoundHalfAway(_mm256_mul_ps(v[i], vid));
      __m256i s = _mm256_add_epi32(_mm256_add_epi32(qi[0], qi[1]), _mm256_add_epi32(qi[2], qi[3]));
      __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
      s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
      s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
      const __m256i p01 = _mm256_packs_epi32(qi[0], qi[1]);
      const __m256i p23 = _mm256_packs_epi32(qi[2], qi[3]);
      __m256i bytes = _mm256_packs_epi16(p01, p23);
      bytes = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(qs + b * 32), bytes);
      meta[b] = {d, -offset * _mm_cvtsi128_si32(s4)};
    }
  }
}

// x rounded to bf16 (round to nearest even, NaN kept quiet: the same bits as F32ToBF16) and
// returned as f32.
inline __m256 RoundToBF16(__m256 f) {
  const __m256i u = _mm256_castps_si256(f);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i hi = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
  const __m256i r =
      _mm256_and_si256(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), hi);
  const __m256i qnan = _mm256_and_si256(_mm256_or_si256(u, _mm256_set1_epi32(0x400000)), hi);
  const __m256 nan = _mm256_cmp_ps(f, f, _CMP_UNORD_Q);
  return _mm256_blendv_ps(_mm256_castsi256_ps(r), _mm256_castsi256_ps(qnan), nan);
}

// Rows of x rounded to bf16, stored as f32 in groups of 16 permuted like FloatIo<kBF16>::Widen
// ({0-3, 8-11}, {4-7, 12-15}) so the kernel loads them without unpacking; the last group is
// zero-padded.
void Bf16Rows(const float* x, int64_t x_stride, int64_t r0, int64_t r1, int64_t k, void* out,
              int64_t out_stride) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * x_stride;
    float* o = static_cast<float*>(out) + r * out_stride;
    for (int64_t e = 0; e < k; e += 16) {
      alignas(32) float tmp[16] = {};
      const float* src = xr + e;
      if (k - e < 16) {
        std::memcpy(tmp, xr + e, static_cast<size_t>(k - e) * 4);
        src = tmp;
      }
      const __m256 v0 = RoundToBF16(_mm256_loadu_ps(src));
      const __m256 v1 = RoundToBF16(_mm256_loadu_ps(src + 8));
      _mm256_storeu_ps(o + e, _mm256_permute2f128_ps(v0, v1, 0x20));
      _mm256_storeu_ps(o + e + 8, _mm256_permute2f128_ps(v0, v1, 0x31));
    }
  }
}

// ---- float weights ----------------------------------------------------------------------

inline float HSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Element type traits: kStep elements per iteration, loaded as kParts f32 vectors.
template <DType D>
struct FloatIo;
template <>
struct FloatIo<DType::kF32> {
  using WT = float;
  using XT = float;
  static constexpr int kStep = 8, kParts = 1;
  static constexpr bool kXPadded = false;
  static void LoadW(const WT* p, __m256* o) { o[0] = _mm256_loadu_ps(p); }
  static void LoadX(const XT* p, __m256* o) { o[0] = _mm256_loadu_ps(p); }
};
template <>
struct FloatIo<DType::kF16> {
  using WT = uint16_t;
  using XT = float;
  static constexpr int kStep = 8, kParts = 1;
  static constexpr bool kXPadded = false;
  static void LoadW(const WT* p, __m256* o) {
    o[0] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static void LoadX(const XT* p, __m256* o) { o[0] = _mm256_loadu_ps(p); }
};
template <>
struct FloatIo<DType::kBF16> {
  using WT = uint16_t;
  using XT = float;  // bf16-rounded, pre-widened and permuted by Bf16Rows
  static constexpr int kStep = 16, kParts = 2;
  static constexpr bool kXPadded = true;
  // The weights widen to ({0-3, 8-11}, {4-7, 12-15}), the order Bf16Rows stored x in.
  static void LoadW(const WT* p, __m256* o) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    const __m256i z = _mm256_setzero_si256();
    o[0] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(z, v));
    o[1] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, v));
  }
  static void LoadX(const XT* p, __m256* o) {
    o[0] = _mm256_loadu_ps(p);
    o[1] = _mm256_loadu_ps(p + 8);
  }
};

template <DType D, int R, int C>
__attribute__((noinline)) void FloatTile(const typename FloatIo<D>::WT* w, int64_t k,
                                         const typename FloatIo<D>::XT* x, int64_t x_stride,
                                         int64_t r0, int64_t c0, float* y, int64_t y_stride,
                                         bool accumulate) {
  using Io = FloatIo<D>;
  constexpr int kStep = Io::kStep, kP = Io::kParts;
  __m256 acc[R][C];
  CHORUS_UNROLL
  for (int r = 0; r < R; ++r) {
    CHORUS_UNROLL
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  }
  auto step = [&](const typename Io::WT* const* wp, const typename Io::XT* const* xp) {
    __m256 wv[C][kP];
    CHORUS_UNROLL
    for (int c = 0; c < C; ++c) Io::LoadW(wp[c], wv[c]);
    CHORUS_UNROLL
    for (int r = 0; r < R; ++r) {
      __m256 xv[kP];
      Io::LoadX(xp[r], xv);
      CHORUS_UNROLL
      for (int c = 0; c < C; ++c) {
        CHORUS_UNROLL
        for (int p = 0; p < kP; ++p) acc[r][c] = _mm256_fmadd_ps(xv[p], wv[c][p], acc[r][c]);
      }
    }
  };
  const typename Io::WT* wp[C];
  const typename Io::XT* xp[R];
  int64_t e = 0;
  for (; e + kStep <= k; e += kStep) {
    CHORUS_UNROLL
    for (int c = 0; c < C; ++c) wp[c] = w + (c0 + c) * k + e;
    CHORUS_UNROLL
    for (int r = 0; r < R; ++r) xp[r] = x + (r0 + r) * x_stride + e;
    step(wp, xp);
  }
  if (e < k) {  // tail: zero-padded copies, the same for every row
    typename Io::WT wt[C][kStep] = {};
    typename Io::XT xt[R][kStep] = {};
    const size_t rem = static_cast<size_t>(k - e);
    CHORUS_UNROLL
    for (int c = 0; c < C; ++c) {
      std::memcpy(wt[c], w + (c0 + c) * k + e, rem * sizeof(typename Io::WT));
      wp[c] = wt[c];
    }
    CHORUS_UNROLL
    for (int r = 0; r < R; ++r) {
      if constexpr (Io::kXPadded) {
        xp[r] = x + (r0 + r) * x_stride + e;
      } else {
        std::memcpy(xt[r], x + (r0 + r) * x_stride + e, rem * sizeof(typename Io::XT));
        xp[r] = xt[r];
      }
    }
    step(wp, xp);
  }
  CHORUS_UNROLL
  for (int r = 0; r < R; ++r) {
    CHORUS_UNROLL
    for (int c = 0; c < C; ++c) {
      float* out = y + (r0 + r) * y_stride + c0 + c;
      const float s = HSum(acc[r][c]);
      *out = accumulate ? *out + s : s;
    }
  }
}

constexpr int kFloatMaxR = 4;
constexpr int kFloatMaxC = 4;
// Register tile per dtype (16 ymm registers; measured on Zen 3): f32/f16 3 rows × 3 columns,
// bf16 (two widened halves per step) 4 × 2; a single row takes 4 columns.
template <DType D>
constexpr int FloatRows() {
  return D == DType::kBF16 ? 4 : 3;
}
template <DType D>
inline int FloatCFor(int rr) {
  if (rr == 1) return 4;
  return D == DType::kBF16 ? 2 : 3;
}

template <DType D>
void FloatColsT(const void* wv, int64_t k, const void* xv, int64_t x_stride, int64_t m, int64_t c0,
                int64_t c1, float* y, int64_t y_stride, bool accumulate) {
  const auto* w = static_cast<const typename FloatIo<D>::WT*>(wv);
  const auto* x = static_cast<const typename FloatIo<D>::XT*>(xv);
  ftile::BlockedColumns(
      k * static_cast<int64_t>(sizeof(typename FloatIo<D>::WT)), m, c0, c1, kFloatMaxC,
      FloatRows<D>(), [](int rr) { return FloatCFor<D>(rr); },
      [&](int rr, int cc, int64_t r0, int64_t c) {
        ftile::ForTileShape<kFloatMaxR, kFloatMaxC>(rr, cc, [&](auto r, auto cols) {
          FloatTile<D, decltype(r)::value, decltype(cols)::value>(w, k, x, x_stride, r0, c, y,
                                                                  y_stride, accumulate);
        });
      });
}

void FloatCols(DType dtype, const void* w, int64_t k, const void* x, int64_t x_stride, int64_t m,
               int64_t c0, int64_t c1, float* y, int64_t y_stride, bool accumulate) {
  ftile::ForFloatDType(dtype, "avx2", [&](auto d) {
    FloatColsT<decltype(d)::value>(w, k, x, x_stride, m, c0, c1, y, y_stride, accumulate);
  });
}

void QPanels(int layout, const uint8_t* packed, int64_t n, int64_t k, const QRows& q, int64_t m,
             int64_t p0, int64_t p1, float* y, int64_t y_stride, bool accumulate) {
  if (IsKLayout(layout)) {
    ktile::AnyPanels<Avx2Traits>(layout, packed, n, k, q, m, p0, p1, y, y_stride, accumulate);
  } else if (layout == kLayoutQ4Panel) {
    qtile::Panels<Avx2Traits, true>(packed, n, k, q, m, p0, p1, y, y_stride, accumulate);
  } else {
    qtile::Panels<Avx2Traits, false>(packed, n, k, q, m, p0, p1, y, y_stride, accumulate);
  }
}

}  // namespace

const IsaKernels& Avx2Kernels() {
  static const IsaKernels k{QuantizeRows, Bf16Rows, QPanels, FloatCols, nullptr};
  return k;
}

}  // namespace chorus::kernels::internal
