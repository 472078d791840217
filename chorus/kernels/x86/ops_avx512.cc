// AVX-512 variants of the element-wise kernels (ops.h). Tails use masked loads and stores, so
// every element goes through the same instructions wherever it sits in the array.
// GCC 12 (bug 105593) reports -W(maybe-)uninitialized from inside the AVX-512 intrinsics that
// take an _mm512_undefined_ps() operand; the warnings are spurious, so they are silenced here.
#if !defined(__clang__)  // clang has no such group (and no such false positive)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "chorus/base/check.h"
#include "chorus/kernels/x86/ops_x86.h"
#include "chorus/kernels/x86/row_dots.h"

namespace chorus::kernels::avx512 {
namespace {

inline __mmask16 TailMask(int64_t remaining) {
  return remaining >= 16 ? static_cast<__mmask16>(0xFFFF)
                         : static_cast<__mmask16>((1u << remaining) - 1u);
}

// e^x: x = n·ln2 + r with |r| ≤ ln2/2, e^r by its degree-7 Taylor polynomial (truncation
// error < 1.2e-9 relative), 2^n applied by vscalefps which handles overflow (+inf), gradual
// underflow and 0 for x ≤ -104 (so exp(-inf) = 0). NaN propagates.
inline __m512 Exp(__m512 x) {
  // max(lo, x) / min(hi, x) with the constant first keep a NaN x (the second operand wins).
  const __m512 xc = _mm512_min_ps(_mm512_set1_ps(89.0f), _mm512_max_ps(_mm512_set1_ps(-104.0f), x));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  // ln2 split in a high part with few significant bits (n·hi is exact) and the remainder.
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), xc);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187045e-06f), r);
  __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

}  // namespace

void RmsNorm(const float* x, const float* weight, int64_t m, int64_t n, float eps, float* out) {
  for (int64_t row = 0; row < m; ++row) {
    const float* xr = x + row * n;
    float* yr = out + row * n;
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    int64_t j = 0;
    for (; j + 32 <= n; j += 32) {
      const __m512 a = _mm512_loadu_ps(xr + j), b = _mm512_loadu_ps(xr + j + 16);
      acc0 = _mm512_fmadd_ps(a, a, acc0);
      acc1 = _mm512_fmadd_ps(b, b, acc1);
    }
    for (; j < n; j += 16) {
      const __m512 a = _mm512_maskz_loadu_ps(TailMask(n - j), xr + j);
      acc0 = _mm512_fmadd_ps(a, a, acc0);
    }
    const float ss = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1)) / static_cast<float>(n) + eps;
    const __m512 scale = _mm512_set1_ps(1.0f / std::sqrt(ss));
    for (j = 0; j < n; j += 16) {
      const __mmask16 k = TailMask(n - j);
      const __m512 a = _mm512_maskz_loadu_ps(k, xr + j);
      const __m512 w = _mm512_maskz_loadu_ps(k, weight + j);
      _mm512_mask_storeu_ps(yr + j, k, _mm512_mul_ps(_mm512_mul_ps(a, scale), w));
    }
  }
}

void RopeApply(float* x, int64_t n_heads, int64_t head_dim, const float* cos_t, const float* sin_t,
               RopeLayout layout) {
  const int64_t half = head_dim / 2;
  // Both layouts evaluate a' = fma(a, c, −(b·s)), b' = fma(b, c, a·s), so they give identical
  // bits for the same pair.
  if (layout == RopeLayout::kHalf) {
    for (int64_t h = 0; h < n_heads; ++h) {
      float* xa = x + h * head_dim;
      float* xb = xa + half;
      for (int64_t i = 0; i < half; i += 16) {
        const __mmask16 k = TailMask(half - i);
        const __m512 a = _mm512_maskz_loadu_ps(k, xa + i), b = _mm512_maskz_loadu_ps(k, xb + i);
        const __m512 c = _mm512_maskz_loadu_ps(k, cos_t + i),
                     s = _mm512_maskz_loadu_ps(k, sin_t + i);
        _mm512_mask_storeu_ps(xa + i, k, _mm512_fmsub_ps(a, c, _mm512_mul_ps(b, s)));
        _mm512_mask_storeu_ps(xb + i, k, _mm512_fmadd_ps(b, c, _mm512_mul_ps(a, s)));
      }
    }
    return;
  }
  // Interleaved: with cc = (c0, c0, c1, c1, …), ss = (−s0, s0, −s1, s1, …) and the pair-swapped
  // x̃ = (x1, x0, x3, x2, …), the rotation is x·cc + x̃·ss.
  alignas(64) float cc[kMaxRopeHeadDim], ss[kMaxRopeHeadDim];
  for (int64_t i = 0; i < half; ++i) {
    cc[2 * i] = cc[2 * i + 1] = cos_t[i];
    ss[2 * i] = -sin_t[i];
    ss[2 * i + 1] = sin_t[i];
  }
  for (int64_t h = 0; h < n_heads; ++h) {
    float* xh = x + h * head_dim;
    for (int64_t j = 0; j < head_dim; j += 16) {
      const __mmask16 k = TailMask(head_dim - j);
      const __m512 v = _mm512_maskz_loadu_ps(k, xh + j);
      const __m512 swapped = _mm512_permute_ps(v, 0xB1);
      const __m512 r = _mm512_fmadd_ps(v, _mm512_maskz_loadu_ps(k, cc + j),
                                       _mm512_mul_ps(swapped, _mm512_maskz_loadu_ps(k, ss + j)));
      _mm512_mask_storeu_ps(xh + j, k, r);
    }
  }
}

void SiluMul(const float* gate, const float* up, int64_t n, float* out) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = TailMask(n - i);
    const __m512 g = _mm512_maskz_loadu_ps(k, gate + i);
    const __m512 u = _mm512_maskz_loadu_ps(k, up + i);
    const __m512 e = Exp(_mm512_sub_ps(_mm512_setzero_ps(), g));
    const __m512 silu = _mm512_div_ps(g, _mm512_add_ps(one, e));
    _mm512_mask_storeu_ps(out + i, k, _mm512_mul_ps(silu, u));
  }
}

// gelu_tanh(g) · u = g / (1 + e^(−2√(2/π)(g + 0.044715g³))) · u (ops.h).
void GeluTanhMul(const float* gate, const float* up, int64_t n, float* out) {
  const __m512 one = _mm512_set1_ps(1.0f), c = _mm512_set1_ps(-2.0f * 0.7978845608028654f);
  const __m512 k = _mm512_set1_ps(0.044715f);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = TailMask(n - i);
    const __m512 g = _mm512_maskz_loadu_ps(m, gate + i);
    const __m512 u = _mm512_maskz_loadu_ps(m, up + i);
    const __m512 inner = _mm512_fmadd_ps(_mm512_mul_ps(k, g), _mm512_mul_ps(g, g), g);
    const __m512 e = Exp(_mm512_mul_ps(c, inner));
    _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(one, e)), u));
  }
}

float Max(const float* x, int64_t n) {
  __m512 m = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t i = 0; i < n; i += 16) {
    m = _mm512_max_ps(m, _mm512_mask_loadu_ps(m, TailMask(n - i), x + i));
  }
  return _mm512_reduce_max_ps(m);
}

float ExpShiftSum(float* x, int64_t n, float shift) {
  const __m512 sh = _mm512_set1_ps(shift);
  __m512 sum = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = TailMask(n - i);
    const __m512 e = Exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), sh));
    _mm512_mask_storeu_ps(x + i, k, e);
    sum = _mm512_mask_add_ps(sum, k, sum, e);
  }
  return _mm512_reduce_add_ps(sum);
}

void Softmax(float* x, int64_t n) {
  const float max = Max(x, n);
  const __m512 sum = _mm512_set1_ps(ExpShiftSum(x, n, max));
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = TailMask(n - i);
    _mm512_mask_storeu_ps(x + i, k, _mm512_div_ps(_mm512_maskz_loadu_ps(k, x + i), sum));
  }
}

void Add(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = TailMask(n - i);
    _mm512_mask_storeu_ps(
        y + i, k, _mm512_add_ps(_mm512_maskz_loadu_ps(k, y + i), _mm512_maskz_loadu_ps(k, x + i)));
  }
}

namespace {

// The vector of row_dots.h at 16 lanes. Full chunks use plain loads (masked byte loads measured
// 2× slower here); a row's last, partial chunk uses masked loads, 0 past n (no fault).
struct RowDotsVec {
  using V = __m512;
  static constexpr int64_t kLanes = 16;
  static constexpr int64_t kInputsPerPass = 4;  // 4 rows × 4 inputs: 16 accumulators
  static V Zero() { return _mm512_setzero_ps(); }
  static V Fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static float Sum(V v) { return _mm512_reduce_add_ps(v); }
  static V LoadX(const float* p) { return _mm512_loadu_ps(p); }
  static V LoadXTail(const float* p, int64_t n) { return _mm512_maskz_loadu_ps(TailMask(n), p); }
  static V Row(const int8_t* p) {
    return _mm512_cvtepi32_ps(
        _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  static V Row(const float* p) { return _mm512_loadu_ps(p); }
  static V RowTail(const int8_t* p, int64_t n) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(TailMask(n), p)));
  }
  static V RowTail(const float* p, int64_t n) { return _mm512_maskz_loadu_ps(TailMask(n), p); }
};

}  // namespace

void AddInt8RowDots(const int8_t* q, const float* row_scales, int64_t rows, int64_t cols,
                    const float* x, int64_t x_stride, int64_t n, float* y, int64_t y_stride) {
  row_dots::Add<RowDotsVec>(q, row_scales, rows, cols, x, x_stride, n, y, y_stride);
}

void AddF32RowDots(const float* w, int64_t rows, int64_t cols, const float* x, int64_t x_stride,
                   int64_t n, float* y, int64_t y_stride) {
  row_dots::Add<RowDotsVec>(w, static_cast<const float*>(nullptr), rows, cols, x, x_stride, n, y,
                            y_stride);
}

}  // namespace chorus::kernels::avx512
