// Pieces both AVX-512 delta kernels use (x86/delta_avx512.cc, the f32 path, and
// x86/delta_q16_avx512.cc, the int16 path). Included only by files built with AVX-512 flags.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace chorus::kernels::delta_internal::avx512_common {

// Sixteen lanes summed in the portable order: halves 8, 4, 2, 1.
inline float Reduce(__m512 a) {
  const __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(a),
                                  _mm512_castps512_ps256(_mm512_shuffle_f32x4(a, a, 0xEE)));
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

// Input rows four at a time, so that a decoded block serves up to four rows: calls
// fn(i, std::integral_constant<int, NR>{}) for i = 0, 4, 8, … < n with NR = min(4, n − i).
template <class Fn>
inline void ForRowsInFours(int64_t n, Fn&& fn) {
  for (int64_t i = 0; i < n; i += 4) {
    switch (std::min<int64_t>(4, n - i)) {
      case 1:
        fn(i, std::integral_constant<int, 1>{});
        break;
      case 2:
        fn(i, std::integral_constant<int, 2>{});
        break;
      case 3:
        fn(i, std::integral_constant<int, 3>{});
        break;
      default:
        fn(i, std::integral_constant<int, 4>{});
        break;
    }
  }
}

}  // namespace chorus::kernels::delta_internal::avx512_common
