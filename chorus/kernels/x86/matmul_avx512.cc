// AVX-512 (F/BW/VL/VNNI/BF16) matmul kernels; run only when ActiveIsa() == kAvx512.
//
// K-quant weights: x86/matmul_ktile.h (vpdpbusd per sub-block, vpmulld by its scale, vpdpwssd
// for the mins).
// Quantized weights: vpdpbusd (u8 × s8 → s32, 4 products per lane, no saturation). The packed
// weights are unsigned (q8_0: q + 128, q4_0: the GGML nibble q + 8), the activations signed, and
// the offset is removed per block with −128·Σx or −8·Σx (Σx precomputed when quantizing x).
// bf16 weights: vdpbf16ps on bf16-rounded activations; repacked k-pair panels (lanes = columns,
// one broadcast activation pair per row) or, for a weight left in place, lanes over k.
// f32/f16 weights: FMA, lanes over k, masked tails.
// GCC 12's _mm512_undefined_* helpers (used inside _mm512_cvtph_ps, _mm512_reduce_*) trip
// -Wuninitialized once inlined; the values are never read.
#pragma GCC diagnostic ignored "-Wuninitialized"
#if !defined(__clang__)  // clang has no such group (and no such false positive)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "chorus/kernels/matmul_internal.h"
#include "chorus/kernels/x86/matmul_ftile.h"
#include "chorus/kernels/x86/matmul_ktile.h"
#include "chorus/kernels/x86/matmul_qtile.h"

namespace chorus::kernels::internal {
namespace {

struct Avx512Traits {
  static constexpr int kLanes = 16;
  static constexpr int kMaxR = 2;
  static constexpr int kMaxC = 4;
  static constexpr int64_t kL2Budget = 256 * 1024;
  // Tiles of 1-2 rows × 4 vectors (8 int + 8 float accumulators): 4 vectors are a whole
  // 64-column panel, so every tile reads its panel as one contiguous stream. (4 rows × 2
  // vectors read every other cache line of a panel and made batch-8 decode ~1.4x slower.)
  static constexpr bool kRowPanels = false;
  static int CFor(int) { return 4; }

  using I = __m512i;
  using F = __m512;
  struct W {
    __m512i a;  // unsigned operand of vpdpbusd
  };

  static F FZero() { return _mm512_setzero_ps(); }
  static I Bcast(int32_t v) { return _mm512_set1_epi32(v); }
  static F FBcast(float v) { return _mm512_set1_ps(v); }

  static W PrepQ8(const uint8_t* p) { return W{_mm512_loadu_si512(p)}; }
  static I DotQ8(I acc, const W& w, I x) { return _mm512_dpbusd_epi32(acc, w.a, x); }
  static void PrepQ4(const uint8_t* p, W* lo, W* hi) {
    const __m512i v = _mm512_loadu_si512(p);
    const __m512i mask = _mm512_set1_epi8(0x0f);
    lo->a = _mm512_and_si512(v, mask);
    hi->a = _mm512_and_si512(_mm512_srli_epi16(v, 4), mask);
  }
  static I DotQ4(I acc, const W& w, I x) { return _mm512_dpbusd_epi32(acc, w.a, x); }
  // Weights are unsigned: q8_0 as q + 128, q4_0 nibbles q + 8. The accumulator starts at
  // corr = −offset·Σx (a broadcast load), so after the 8 vpdpbusd it holds the exact isum.
  static int32_t Offset(int layout) { return layout == kLayoutQ4Panel ? 8 : 128; }
  template <bool kQ4>
  static I Init(const int32_t* corr) {
    return _mm512_set1_epi32(*corr);
  }
  template <bool kQ4>
  static I Finish(I ia, const int32_t*) {
    return ia;
  }
  static F Scales(const uint16_t* d) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(d)));
  }
  static F Cvt(I v) { return _mm512_cvtepi32_ps(v); }
  static F Mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F Fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static void Store(float* y, F acc, int valid, bool accumulate) {
    const __mmask16 m = static_cast<__mmask16>((1u << valid) - 1u);
    if (accumulate) acc = _mm512_add_ps(_mm512_maskz_loadu_ps(m, y), acc);
    _mm512_mask_storeu_ps(y, m, acc);
  }

  // ---- K-quant primitives (x86/matmul_ktile.h) ----
  // Tiles of 1-2 rows × 4 vectors: 8 sub-block sums, 8 super-block sums and 8 float
  // accumulators, and whole panels read as one stream, as for q4_0.
  static constexpr int kKMaxR = 2;
  static constexpr int kKMaxC = 4;
  static constexpr int MaxGroups(int) { return 8; }  // vpdpbusd sums in int32: no bound
  // One row (ktile::RowPanels): two vpdpbusd chains per vector (low and high k-group).
  static constexpr bool kKRowSplit = true;
  static I AddSums(I a, I b) { return _mm512_add_epi32(a, b); }
  static I Zero() { return _mm512_setzero_si512(); }
  static I Load(const uint8_t* p) { return _mm512_loadu_si512(p); }
  static I And(I a, I b) { return _mm512_and_si512(a, b); }
  static I Or(I a, I b) { return _mm512_or_si512(a, b); }
  static I Sub(I a, I b) { return _mm512_sub_epi32(a, b); }
  static I Set8(int v) { return _mm512_set1_epi8(static_cast<char>(v)); }
  template <int kN>  // 16-bit lanes shifted left by kN (right when negative)
  static I Shift(I v) {
    if constexpr (kN > 0) return _mm512_slli_epi16(v, kN);
    if constexpr (kN < 0) return _mm512_srli_epi16(v, -kN);
    return v;
  }
  template <int kN>
  static I Shl16(I v) {
    return _mm512_slli_epi16(v, kN);
  }
  static I Dot(I acc, I w, I x) { return _mm512_dpbusd_epi32(acc, w, x); }
  // S_j of 16 columns as int32, from a pair row (byte 2c + odd).
  static I SVec(const int8_t* pairs, int odd) {
    const __m512i v =
        _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(pairs)));
    return odd ? _mm512_srai_epi32(v, 16) : _mm512_srai_epi32(_mm512_slli_epi32(v, 16), 16);
  }
  static I Flush(I isum, I ij, I sv) { return _mm512_add_epi32(isum, _mm512_mullo_epi32(ij, sv)); }
  static I PairVec(const int8_t* pairs) {
    return _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(pairs)));
  }
  static I DotPairs(I acc, I a, I b) { return _mm512_dpwssd_epi32(acc, a, b); }
  static F Fnma(F a, F b, F c) { return _mm512_fnmadd_ps(a, b, c); }
};

// ---- activation conversion --------------------------------------------------------------

// lround(t) for |t| < 2^23 exactly: trunc(t) plus ±1 when the (exact) fraction is ≥ 0.5.
inline __m512i RoundHalfAway(__m512 t) {
  const __m512 tr = _mm512_roundscale_ps(t, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  const __m512 afrac = _mm512_abs_ps(_mm512_sub_ps(t, tr));
  const __mmask16 ge = _mm512_cmp_ps_mask(afrac, _mm512_set1_ps(0.5f), _CMP_GE_OQ);
  const __m512i sign = _mm512_and_si512(_mm512_castps_si512(t), _mm512_set1_epi32(INT32_MIN));
  const __m512 one =
      _mm512_castsi512_ps(_mm512_or_si512(sign, _mm512_castps_si512(_mm512_set1_ps(1.0f))));
  return _mm512_cvttps_epi32(_mm512_mask_add_ps(tr, ge, tr, one));
}

// The K-layout activation quantizer (ReferenceQuantizeRowK): one scale per 256, sums per 16.
void QuantizeRowsK(const float* x, int64_t x_stride, int64_t r0, int64_t r1, int64_t k,
                   const QRows& q) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * x_stride;
    int8_t* qs = q.qs + r * q.qs_stride;
    QMetaK* meta = KMetaRow(q, r);
    for (int64_t b = 0; b < k / 256; ++b) {
      const float* xb = xr + b * 256;
      __m512 amax = _mm512_setzero_ps();
      for (int i = 0; i < 16; ++i)
        amax = _mm512_max_ps(amax, _mm512_abs_ps(_mm512_loadu_ps(xb + 16 * i)));
      const float d = _mm512_reduce_max_ps(amax) / 127.0f;
      const float id = d != 0.0f ? 1.0f / d : 0.0f;
      const __m512 vid = _mm512_set1_ps(id);
      QMetaK& mt = meta[b];
      mt.d = d;
      for (int i = 0; i < 16; ++i) {
        const __m512i qi = RoundHalfAway(_mm512_mul_ps(_mm512_loadu_ps(xb + 16 * i), vid));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(qs + b * 256 + 16 * i),
                         _mm512_cvtepi32_epi8(qi));
        mt.s16[i] = static_cast<int16_t>(_mm512_reduce_add_epi32(qi));
      }
      for (int g = 0; g < 8; ++g)
        mt.s32[g] = static_cast<int16_t>(mt.s16[2 * g] + mt.s16[2 * g + 1]);
    }
  }
}

void QuantizeRows(int layout, const float* x, int64_t x_stride, int64_t r0, int64_t r1, int64_t k,
                  const QRows& q) {
  if (IsKLayout(layout)) return QuantizeRowsK(x, x_stride, r0, r1, k, q);
  const int32_t offset = Avx512Traits::Offset(layout);
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * x_stride;
    int8_t* qs = q.qs + r * q.qs_stride;
    QMeta* meta = q.meta + r * q.meta_stride;
    for (int64_t b = 0; b < k / 32; ++b) {
      const __m512 v0 = _mm512_loadu_ps(xr + b * 32);
      const __m512 v1 = _mm512_loadu_ps(xr + b * 32 + 16);
      const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
      const float d = amax / 127.0f;
      const float id = d != 0.0f ? 1.0f / d : 0.0f;
      const __m512 vid = _mm512_set1_ps(id);
      const __m512i q0 = RoundHalfAway(_mm512_mul_ps(v0, vid));
      const __m512i q1 = RoundHalfAway(_mm512_mul_ps(v1, vid));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(qs + b * 32), _mm512_cvtepi32_epi8(q0));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(qs + b * 32 + 16), _mm512_cvtepi32_epi8(q1));
      meta[b] = {d, -offset * _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1))};
    }
  }
}

// Round to nearest even, NaN kept quiet: the same bits as F32ToBF16 (vcvtneps2bf16 would
// flush denormals, which the scalar spec does not).
inline __m256i ToBF16x16(__m512 f) {
  const __m512i u = _mm512_castps_si512(f);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i r =
      _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(f, f, _CMP_UNORD_Q);
  const __m512i qnan = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  return _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(r, nan, qnan));
}

void Bf16Rows(const float* x, int64_t x_stride, int64_t r0, int64_t r1, int64_t k, void* out,
              int64_t out_stride) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * x_stride;
    uint16_t* o = static_cast<uint16_t*>(out) + r * out_stride;
    for (int64_t e = 0; e < k; e += 16) {
      const int64_t rem = std::min<int64_t>(16, k - e);
      const __mmask16 m = static_cast<__mmask16>((1u << rem) - 1u);
      // All 16 lanes are stored (out_stride is a multiple of 32): the tail's lanes are zero,
      // which the k-pair kernel reads as the partner of an odd k's last element.
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + e),
                          ToBF16x16(_mm512_maskz_loadu_ps(m, xr + e)));
    }
  }
}

// ---- float weights ----------------------------------------------------------------------

template <DType D>
struct FloatIo;
template <>
struct FloatIo<DType::kF32> {
  using WT = float;
  using XT = float;
  using V = __m512;
  static constexpr int kStep = 16;
  static V LoadW(const WT* p, int64_t rem) {
    return rem >= kStep ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(Mask(rem), p);
  }
  static V LoadX(const XT* p, int64_t rem) { return LoadW(p, rem); }
  static __mmask16 Mask(int64_t rem) { return static_cast<__mmask16>((1u << rem) - 1u); }
  static __m512 Dot(__m512 acc, V x, V w) { return _mm512_fmadd_ps(x, w, acc); }
};
template <>
struct FloatIo<DType::kF16> {
  using WT = uint16_t;
  using XT = float;
  using V = __m512;
  static constexpr int kStep = 16;
  static __mmask16 Mask(int64_t rem) { return static_cast<__mmask16>((1u << rem) - 1u); }
  static V LoadW(const WT* p, int64_t rem) {
    const __m256i h = rem >= kStep ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))
                                   : _mm256_maskz_loadu_epi16(Mask(rem), p);
    return _mm512_cvtph_ps(h);
  }
  static V LoadX(const XT* p, int64_t rem) {
    return rem >= kStep ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(Mask(rem), p);
  }
  static __m512 Dot(__m512 acc, V x, V w) { return _mm512_fmadd_ps(x, w, acc); }
};
template <>
struct FloatIo<DType::kBF16> {
  using WT = uint16_t;
  using XT = uint16_t;
  using V = __m512i;
  static constexpr int kStep = 32;
  static V LoadW(const WT* p, int64_t rem) {
    return rem >= kStep ? _mm512_loadu_si512(p)
                        : _mm512_maskz_loadu_epi16(static_cast<__mmask32>((1ull << rem) - 1ull), p);
  }
  static V LoadX(const XT* p, int64_t rem) { return LoadW(p, rem); }
  static __m512 Dot(__m512 acc, V x, V w) {
    return _mm512_dpbf16_ps(acc, reinterpret_cast<__m512bh&>(x), reinterpret_cast<__m512bh&>(w));
  }
};

template <DType D, int R, int C>
__attribute__((noinline)) void FloatTile(const typename FloatIo<D>::WT* w, int64_t k,
                                         const typename FloatIo<D>::XT* x, int64_t x_stride,
                                         int64_t r0, int64_t c0, float* y, int64_t y_stride,
                                         bool accumulate) {
  using Io = FloatIo<D>;
  __m512 acc[R][C];
  CHORUS_UNROLL
  for (int r = 0; r < R; ++r) {
    CHORUS_UNROLL
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  }
  for (int64_t e = 0; e < k; e += Io::kStep) {
    const int64_t rem = k - e;
    typename Io::V wv[C];
    CHORUS_UNROLL
    for (int c = 0; c < C; ++c) wv[c] = Io::LoadW(w + (c0 + c) * k + e, rem);
    CHORUS_UNROLL
    for (int r = 0; r < R; ++r) {
      const typename Io::V xv = Io::LoadX(x + (r0 + r) * x_stride + e, rem);
      CHORUS_UNROLL
      for (int c = 0; c < C; ++c) acc[r][c] = Io::Dot(acc[r][c], xv, wv[c]);
    }
  }
  CHORUS_UNROLL
  for (int r = 0; r < R; ++r) {
    CHORUS_UNROLL
    for (int c = 0; c < C; ++c) {
      float* out = y + (r0 + r) * y_stride + c0 + c;
      const float s = _mm512_reduce_add_ps(acc[r][c]);
      *out = accumulate ? *out + s : s;
    }
  }
}

constexpr int kFloatMaxR = 4;
constexpr int kFloatMaxC = 4;

template <DType D>
void FloatColsT(const void* wv, int64_t k, const void* xv, int64_t x_stride, int64_t m, int64_t c0,
                int64_t c1, float* y, int64_t y_stride, bool accumulate) {
  const auto* w = static_cast<const typename FloatIo<D>::WT*>(wv);
  const auto* x = static_cast<const typename FloatIo<D>::XT*>(xv);
  ftile::BlockedColumns(
      k * static_cast<int64_t>(sizeof(typename FloatIo<D>::WT)), m, c0, c1, kFloatMaxC, kFloatMaxR,
      [](int) { return kFloatMaxC; },
      [&](int rr, int cc, int64_t r0, int64_t c) {
        ftile::ForTileShape<kFloatMaxR, kFloatMaxC>(rr, cc, [&](auto r, auto cols) {
          FloatTile<D, decltype(r)::value, decltype(cols)::value>(w, k, x, x_stride, r0, c, y,
                                                                  y_stride, accumulate);
        });
      });
}

void FloatCols(DType dtype, const void* w, int64_t k, const void* x, int64_t x_stride, int64_t m,
               int64_t c0, int64_t c1, float* y, int64_t y_stride, bool accumulate) {
  ftile::ForFloatDType(dtype, "avx512", [&](auto d) {
    FloatColsT<decltype(d)::value>(w, k, x, x_stride, m, c0, c1, y, y_stride, accumulate);
  });
}

// ---- bf16 weights in k-pair panels ------------------------------------------------------

// 6 rows × 4 column vectors: 24 accumulators + 4 weight vectors + 1 broadcast of 32 registers.
constexpr int kBf16MaxR = 6;

inline __m512i BroadcastPair(const uint16_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof(v));
  return _mm512_set1_epi32(v);
}

// y[r][0..cols) (+)= rows x[r] · panel for r < R. Each lane (a column) accumulates its k-pairs in
// order in one register, so the value does not depend on R (batch invariance).
template <int R>
__attribute__((noinline)) void Bf16PairTile(const uint8_t* panel, int64_t kp, const uint16_t* x,
                                            int64_t x_stride, int cols, float* y, int64_t y_stride,
                                            bool accumulate) {
  __m512 acc[R][4];
  CHORUS_UNROLL
  for (int r = 0; r < R; ++r) {
    CHORUS_UNROLL
    for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_setzero_ps();
  }
  for (int64_t j = 0; j < kp; ++j) {
    const uint8_t* wp = panel + j * kChunkBytes;
    __m512i wv[4];
    CHORUS_UNROLL
    for (int c = 0; c < 4; ++c) wv[c] = _mm512_loadu_si512(wp + 64 * c);
    CHORUS_UNROLL
    for (int r = 0; r < R; ++r) {
      const __m512i xv = BroadcastPair(x + r * x_stride + 2 * j);
      CHORUS_UNROLL
      for (int c = 0; c < 4; ++c) {
        acc[r][c] = _mm512_dpbf16_ps(acc[r][c], reinterpret_cast<const __m512bh&>(xv),
                                     reinterpret_cast<const __m512bh&>(wv[c]));
      }
    }
  }
  CHORUS_UNROLL
  for (int c = 0; c < 4; ++c) {
    const int valid = std::clamp(cols - 16 * c, 0, 16);
    if (valid == 0) break;
    CHORUS_UNROLL
    for (int r = 0; r < R; ++r)
      Avx512Traits::Store(y + r * y_stride + 16 * c, acc[r][c], valid, accumulate);
  }
}

template <int R = kBf16MaxR>
inline void Bf16PairDispatch(int rr, const uint8_t* panel, int64_t kp, const uint16_t* x,
                             int64_t x_stride, int cols, float* y, int64_t y_stride,
                             bool accumulate) {
  if (rr == R) {
    Bf16PairTile<R>(panel, kp, x, x_stride, cols, y, y_stride, accumulate);
  } else if constexpr (R > 1) {
    Bf16PairDispatch<R - 1>(rr, panel, kp, x, x_stride, cols, y, y_stride, accumulate);
  }
}

void Bf16Panels(const uint8_t* packed, int64_t n, int64_t k, const uint16_t* x, int64_t x_stride,
                int64_t m, int64_t p0, int64_t p1, float* y, int64_t y_stride, bool accumulate) {
  const int64_t kp = (k + 1) / 2;
  const int64_t panel_bytes = Bf16PanelBytes(k);
  for (int64_t p = p0; p < p1; ++p) {
    const uint8_t* panel = packed + p * panel_bytes;
    const int cols = static_cast<int>(std::min<int64_t>(kPanelCols, n - p * kPanelCols));
    for (int64_t r0 = 0; r0 < m; r0 += kBf16MaxR) {
      const int rr = static_cast<int>(std::min<int64_t>(kBf16MaxR, m - r0));
      Bf16PairDispatch(rr, panel, kp, x + r0 * x_stride, x_stride, cols,
                       y + r0 * y_stride + p * kPanelCols, y_stride, accumulate);
    }
  }
}

void QPanels(int layout, const uint8_t* packed, int64_t n, int64_t k, const QRows& q, int64_t m,
             int64_t p0, int64_t p1, float* y, int64_t y_stride, bool accumulate) {
  if (IsKLayout(layout)) {
    ktile::AnyPanels<Avx512Traits>(layout, packed, n, k, q, m, p0, p1, y, y_stride, accumulate);
  } else if (layout == kLayoutQ4Panel) {
    qtile::Panels<Avx512Traits, true>(packed, n, k, q, m, p0, p1, y, y_stride, accumulate);
  } else {
    qtile::Panels<Avx512Traits, false>(packed, n, k, q, m, p0, p1, y, y_stride, accumulate);
  }
}

}  // namespace

const IsaKernels& Avx512Kernels() {
  static const IsaKernels k{QuantizeRows, Bf16Rows, QPanels, FloatCols, Bf16Panels};
  return k;
}

}  // namespace chorus::kernels::internal
