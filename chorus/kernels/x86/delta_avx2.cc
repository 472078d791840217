// AVX2 delta kernel (kernels/delta_internal.h): the AVX-512 kernel's structure with 8-wide
// vectors (the portable order's 16 partial sums are two accumulators per input row). AVX2 has no
// expand: a 2:4 half-chunk of 8 columns (two groups, four kept values) is placed by one
// vpermps with an index vector chosen by the two groups' patterns (36 pairs), pruned columns
// zeroed by a mask from the same table.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "chorus/kernels/delta_internal.h"

namespace chorus::kernels::delta_internal::avx2 {
namespace {

// For two consecutive groups with patterns a and b (entry a + 6·b): the compact value each of
// the 8 columns takes (values 0–1 belong to group a, 2–3 to group b) and which columns are kept.
struct PairPlacement {
  alignas(32) int32_t index[36][8];
  alignas(32) int32_t keep[36][8];
  constexpr PairPlacement() : index(), keep() {
    for (int a = 0; a < 6; ++a) {
      for (int b = 0; b < 6; ++b) {
        const int e = a + 6 * b;
        for (int g = 0; g < 2; ++g) {
          const int p = g == 0 ? a : b;
          for (int j = 0; j < 2; ++j) {
            index[e][4 * g + kPairs24[p][j]] = 2 * g + j;
            keep[e][4 * g + kPairs24[p][j]] = -1;
          }
        }
      }
    }
  }
};
constexpr PairPlacement kPlacement;

// Eight consecutive B-bit codes that start on a byte boundary (B bytes).
template <int B>
inline __m256i Codes8(const uint8_t* p) {
  if constexpr (B == 8) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  } else {
    uint32_t u = 0;
    std::memcpy(&u, p, B);
    const __m256i shifts = _mm256_setr_epi32(0, B, 2 * B, 3 * B, 4 * B, 5 * B, 6 * B, 7 * B);
    return _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(u)), shifts),
                            _mm256_set1_epi32((1 << B) - 1));
  }
}

// Sixteen lanes (lo = 0–7, hi = 8–15) summed in the portable order: halves 8, 4, 2, 1.
inline float Reduce(__m256 lo, __m256 hi) {
  const __m256 s8 = _mm256_add_ps(lo, hi);
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

// One output row of Δ̃ decoded in steps of kStep columns into 8-column vectors.
template <int B, bool kSparse>
class RowDecoder {
 public:
  static constexpr int64_t kStep = kSparse ? 48 : 16;

  RowDecoder(const DeltaMatrixView& m, int64_t o)
      : m_(m),
        o_(o),
        codes_(m.codes + o * m.code_row_bytes()),
        mask_(kSparse ? m.mask + o * m.mask_row_bytes() : nullptr),
        scales_(m.group_size == 0 ? m.scales : m.scales + o * m.groups()),
        half_(static_cast<float>((1 << B) - 1) / 2.0f) {}

  // Columns [c, c + kStep) into w[0, kStep / 8); c a multiple of kStep.
  void Decode(int64_t c, __m256* w) const {
    const __m256 half = _mm256_set1_ps(half_);
    if constexpr (kSparse) {
      int pattern[12];
      for (int b = 0; b < 4; ++b) {
        const int v = mask_[c / 12 + b];
        pattern[3 * b] = v % 6;
        pattern[3 * b + 1] = v / 6 % 6;
        pattern[3 * b + 2] = v / 36 % 6;  // bytes ≥ 216 fail the file's validation
      }
      for (int j = 0; j < 3; ++j) {
        const __m256 q = _mm256_cvtepi32_ps(Codes8<B>(codes_ + (c / 2 + 8 * j) * B / 8));
        const __m256 v = _mm256_mul_ps(_mm256_sub_ps(q, half), _mm256_set1_ps(Scale(c + 16 * j)));
        for (int h = 0; h < 2; ++h) {
          const int e = pattern[4 * j + 2 * h] + 6 * pattern[4 * j + 2 * h + 1];
          __m256i index = _mm256_load_si256(reinterpret_cast<const __m256i*>(kPlacement.index[e]));
          index = _mm256_add_epi32(index, _mm256_set1_epi32(4 * h));
          const __m256 keep = _mm256_castsi256_ps(
              _mm256_load_si256(reinterpret_cast<const __m256i*>(kPlacement.keep[e])));
          w[2 * j + h] = _mm256_and_ps(_mm256_permutevar8x32_ps(v, index), keep);
        }
      }
    } else {
      const __m256 s = _mm256_set1_ps(Scale(c));
      for (int h = 0; h < 2; ++h) {
        const __m256 q = _mm256_cvtepi32_ps(Codes8<B>(codes_ + (c + 8 * h) * B / 8));
        w[h] = _mm256_mul_ps(_mm256_sub_ps(q, half), s);
      }
    }
  }
  // Columns [c, cols) (fewer than kStep) into tail.
  void Tail(int64_t c, float* tail) const { DecodeColumns(m_, o_, c, tail); }

 private:
  float Scale(int64_t c) const {
    return m_.group_size == 0 ? scales_[0] : scales_[c / m_.group_size];
  }

  const DeltaMatrixView& m_;
  const int64_t o_;
  const uint8_t* const codes_;
  const uint8_t* const mask_;
  const float* const scales_;
  const float half_;
};

// A row already decoded into memory (16-column steps).
class DecodedRow {
 public:
  static constexpr int64_t kStep = 16;
  DecodedRow(const float* row, int64_t cols) : row_(row), cols_(cols) {}
  void Decode(int64_t c, __m256* w) const {
    w[0] = _mm256_loadu_ps(row_ + c);
    w[1] = _mm256_loadu_ps(row_ + c + 8);
  }
  void Tail(int64_t c, float* tail) const {
    std::memcpy(tail, row_ + c, (cols_ - c) * sizeof(float));
  }

 private:
  const float* row_;
  int64_t cols_;
};

// y[r·ys + o] += Σ_k x[r·xs + k] · w[k] for r < NR, w from src, in the portable order.
template <int NR, class Src>
inline void DotRows(const Src& src, int64_t cols, const float* x, int64_t xs, float* y, int64_t ys,
                    int64_t o) {
  constexpr int64_t kStep = Src::kStep;
  __m256 acc[NR][2];
  for (int r = 0; r < NR; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  __m256 w[kStep / 8];
  int64_t c = 0;
  for (; c + kStep <= cols; c += kStep) {
    src.Decode(c, w);
    for (int j = 0; j < kStep / 8; ++j)
      for (int r = 0; r < NR; ++r)
        acc[r][j & 1] = _mm256_add_ps(acc[r][j & 1],
                                      _mm256_mul_ps(_mm256_loadu_ps(x + r * xs + c + 8 * j), w[j]));
  }
  if (c < cols) {
    // The last partial columns in scalar code, lane by lane as the portable kernel adds them.
    alignas(32) float tail[kStep];
    src.Tail(c, tail);
    for (int r = 0; r < NR; ++r) {
      alignas(32) float lanes[16];
      _mm256_store_ps(lanes, acc[r][0]);
      _mm256_store_ps(lanes + 8, acc[r][1]);
      for (int64_t k = c; k < cols; ++k) lanes[(k - c) % 16] += x[r * xs + k] * tail[k - c];
      acc[r][0] = _mm256_load_ps(lanes);
      acc[r][1] = _mm256_load_ps(lanes + 8);
    }
  }
  for (int r = 0; r < NR; ++r) y[r * ys + o] += Reduce(acc[r][0], acc[r][1]);
}

template <class Src>
inline void DotUpTo4(const Src& src, int64_t cols, const float* x, int64_t xs, int64_t n, float* y,
                     int64_t ys, int64_t o) {
  switch (n) {
    case 1:
      DotRows<1>(src, cols, x, xs, y, ys, o);
      break;
    case 2:
      DotRows<2>(src, cols, x, xs, y, ys, o);
      break;
    case 3:
      DotRows<3>(src, cols, x, xs, y, ys, o);
      break;
    default:
      DotRows<4>(src, cols, x, xs, y, ys, o);
      break;
  }
}

template <int B, bool kSparse>
void Apply(const DeltaMatrixView& m, int64_t o_begin, int64_t o_end, const float* x, int64_t xs,
           int64_t n, float* y, int64_t ys) {
  using Decoder = RowDecoder<B, kSparse>;
  if (n <= 4) {  // decode in registers, once per output row
    for (int64_t o = o_begin; o < o_end; ++o) DotUpTo4(Decoder(m, o), m.cols, x, xs, n, y, ys, o);
    return;
  }
  // Many rows (prefill): decode each output row once into L1, then dot it four input rows at a
  // time.
  thread_local std::vector<float> row;
  if (row.size() < static_cast<size_t>(m.cols)) row.resize(static_cast<size_t>(m.cols));
  for (int64_t o = o_begin; o < o_end; ++o) {
    const Decoder d(m, o);
    int64_t c = 0;
    __m256 w[Decoder::kStep / 8];
    for (; c + Decoder::kStep <= m.cols; c += Decoder::kStep) {
      d.Decode(c, w);
      for (int j = 0; j < Decoder::kStep / 8; ++j) _mm256_storeu_ps(row.data() + c + 8 * j, w[j]);
    }
    if (c < m.cols) d.Tail(c, row.data() + c);
    const DecodedRow src(row.data(), m.cols);
    for (int64_t i = 0; i < n; i += 4)
      DotUpTo4(src, m.cols, x + i * xs, xs, std::min<int64_t>(4, n - i), y + i * ys, ys, o);
  }
}

}  // namespace

void ApplyRows(const DeltaMatrixView& m, int64_t o_begin, int64_t o_end, const float* x,
               int64_t x_stride, int64_t n_rows, float* y, int64_t y_stride) {
  auto run = [&](auto fn) { fn(m, o_begin, o_end, x, x_stride, n_rows, y, y_stride); };
  if (m.sparse24) {
    switch (m.bits) {
      case 2:
        return run(Apply<2, true>);
      case 3:
        return run(Apply<3, true>);
      case 4:
        return run(Apply<4, true>);
      default:
        return run(Apply<8, true>);
    }
  }
  switch (m.bits) {
    case 1:
      return run(Apply<1, false>);
    case 2:
      return run(Apply<2, false>);
    case 3:
      return run(Apply<3, false>);
    case 4:
      return run(Apply<4, false>);
    default:
      return run(Apply<8, false>);
  }
}

}  // namespace chorus::kernels::delta_internal::avx2
