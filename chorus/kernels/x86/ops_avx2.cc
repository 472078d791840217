// AVX2 + FMA variants of the element-wise kernels (ops.h). Tails use masked loads and stores
// (vmaskmovps), so every element goes through the same instructions wherever it sits.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "chorus/kernels/x86/exp_avx2.h"
#include "chorus/kernels/x86/ops_x86.h"
#include "chorus/kernels/x86/row_dots.h"

namespace chorus::kernels::avx2 {
namespace {

// Lanes [0, min(remaining, 8)) set.
inline __m256i TailMask(int64_t remaining) {
  const int r = remaining >= 8 ? 8 : static_cast<int>(remaining);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(r), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// Full-width loads and stores except in the tail (masked vmaskmovps stores are slow on AMD);
// the arithmetic on the loaded values is the same either way.
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

inline float HorizontalMax(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

}  // namespace

void RmsNorm(const float* x, const float* weight, int64_t m, int64_t n, float eps, float* out) {
  for (int64_t row = 0; row < m; ++row) {
    const float* xr = x + row * n;
    float* yr = out + row * n;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) {
      const __m256 a = _mm256_loadu_ps(xr + j), b = _mm256_loadu_ps(xr + j + 8);
      acc0 = _mm256_fmadd_ps(a, a, acc0);
      acc1 = _mm256_fmadd_ps(b, b, acc1);
    }
    for (; j < n; j += 8) {
      const __m256 a = Load(xr + j, n - j);
      acc0 = _mm256_fmadd_ps(a, a, acc0);
    }
    const float ss = HorizontalSum(_mm256_add_ps(acc0, acc1)) / static_cast<float>(n) + eps;
    const __m256 scale = _mm256_set1_ps(1.0f / std::sqrt(ss));
    for (j = 0; j < n; j += 8) {
      const __m256 a = Load(xr + j, n - j);
      const __m256 w = Load(weight + j, n - j);
      Store(yr + j, n - j, _mm256_mul_ps(_mm256_mul_ps(a, scale), w));
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
      for (int64_t i = 0; i < half; i += 8) {
        const int64_t rem = half - i;
        const __m256 a = Load(xa + i, rem), b = Load(xb + i, rem);
        const __m256 c = Load(cos_t + i, rem), s = Load(sin_t + i, rem);
        Store(xa + i, rem, _mm256_fmsub_ps(a, c, _mm256_mul_ps(b, s)));
        Store(xb + i, rem, _mm256_fmadd_ps(b, c, _mm256_mul_ps(a, s)));
      }
    }
    return;
  }
  // Interleaved: with cc = (c0, c0, c1, c1, …), ss = (−s0, s0, −s1, s1, …) and the pair-swapped
  // x̃ = (x1, x0, x3, x2, …), the rotation is x·cc + x̃·ss.
  alignas(32) float cc[kMaxRopeHeadDim], ss[kMaxRopeHeadDim];
  for (int64_t i = 0; i < half; ++i) {
    cc[2 * i] = cc[2 * i + 1] = cos_t[i];
    ss[2 * i] = -sin_t[i];
    ss[2 * i + 1] = sin_t[i];
  }
  for (int64_t h = 0; h < n_heads; ++h) {
    float* xh = x + h * head_dim;
    for (int64_t j = 0; j < head_dim; j += 8) {
      const int64_t rem = head_dim - j;
      const __m256 v = Load(xh + j, rem);
      const __m256 swapped = _mm256_permute_ps(v, 0xB1);
      const __m256 r =
          _mm256_fmadd_ps(v, Load(cc + j, rem), _mm256_mul_ps(swapped, Load(ss + j, rem)));
      Store(xh + j, rem, r);
    }
  }
}

void SiluMul(const float* gate, const float* up, int64_t n, float* out) {
  const __m256 one = _mm256_set1_ps(1.0f);
  for (int64_t i = 0; i < n; i += 8) {
    const __m256 g = Load(gate + i, n - i);
    const __m256 u = Load(up + i, n - i);
    const __m256 e = Exp(_mm256_sub_ps(_mm256_setzero_ps(), g));
    const __m256 silu = _mm256_div_ps(g, _mm256_add_ps(one, e));
    Store(out + i, n - i, _mm256_mul_ps(silu, u));
  }
}

// gelu_tanh(g) · u = g / (1 + e^(−2√(2/π)(g + 0.044715g³))) · u (ops.h).
void GeluTanhMul(const float* gate, const float* up, int64_t n, float* out) {
  const __m256 one = _mm256_set1_ps(1.0f), c = _mm256_set1_ps(-2.0f * 0.7978845608028654f);
  const __m256 k = _mm256_set1_ps(0.044715f);
  for (int64_t i = 0; i < n; i += 8) {
    const __m256 g = Load(gate + i, n - i);
    const __m256 u = Load(up + i, n - i);
    const __m256 inner = _mm256_fmadd_ps(_mm256_mul_ps(k, g), _mm256_mul_ps(g, g), g);
    const __m256 e = Exp(_mm256_mul_ps(c, inner));
    Store(out + i, n - i, _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), u));
  }
}

float Max(const float* x, int64_t n) {
  const __m256 neg_inf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  __m256 m = neg_inf;
  for (int64_t i = 0; i < n; i += 8) {
    const __m256 v = Load(x + i, n - i);
    m = _mm256_max_ps(
        m, n - i >= 8 ? v : _mm256_blendv_ps(neg_inf, v, _mm256_castsi256_ps(TailMask(n - i))));
  }
  return HorizontalMax(m);
}

float ExpShiftSum(float* x, int64_t n, float shift) {
  const __m256 sh = _mm256_set1_ps(shift);
  __m256 sum = _mm256_setzero_ps();
  for (int64_t i = 0; i < n; i += 8) {
    const int64_t rem = n - i;
    const __m256 e = Exp(_mm256_sub_ps(Load(x + i, rem), sh));
    Store(x + i, rem, e);
    sum = _mm256_add_ps(sum, rem >= 8 ? e : _mm256_and_ps(e, _mm256_castsi256_ps(TailMask(rem))));
  }
  return HorizontalSum(sum);
}

void Softmax(float* x, int64_t n) {
  const float max = Max(x, n);
  const __m256 sum = _mm256_set1_ps(ExpShiftSum(x, n, max));
  for (int64_t i = 0; i < n; i += 8) {
    Store(x + i, n - i, _mm256_div_ps(Load(x + i, n - i), sum));
  }
}

void Add(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; i += 8) {
    Store(y + i, n - i, _mm256_add_ps(Load(y + i, n - i), Load(x + i, n - i)));
  }
}

namespace {

// The vector of row_dots.h at 8 lanes. A row's last, partial chunk is copied into a zero-filled
// buffer and loaded like a full one.
struct RowDotsVec {
  using V = __m256;
  static constexpr int64_t kLanes = 8;
  static constexpr int64_t kInputsPerPass = 2;  // 16 ymm registers: 4 rows × 2 inputs
  static V Zero() { return _mm256_setzero_ps(); }
  static V Fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static float Sum(V v) { return HorizontalSum(v); }
  static V LoadX(const float* p) { return _mm256_loadu_ps(p); }
  static V Row(const int8_t* p) {
    return _mm256_cvtepi32_ps(
        _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  static V Row(const float* p) { return _mm256_loadu_ps(p); }
  template <class T>
  static V Padded(const T* p, int64_t n) {
    T t[8] = {};
    std::copy(p, p + n, t);
    return Row(t);
  }
  static V LoadXTail(const float* p, int64_t n) { return Padded(p, n); }
  static V RowTail(const int8_t* p, int64_t n) { return Padded(p, n); }
  static V RowTail(const float* p, int64_t n) { return Padded(p, n); }
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

}  // namespace chorus::kernels::avx2
