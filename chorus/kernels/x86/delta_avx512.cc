// AVX-512 delta kernel (kernels/delta_internal.h): decodes 16 columns per vector in registers and
// dots them with up to four input rows at once. A 2:4 row needs no scatter: its 8 kept values of
// 16 columns are decoded side by side and vexpandps puts each at its column under the 16-bit
// keep mask of the chunk's pattern bytes (pruned columns +0, as the portable decode leaves them).
// Segments of more than four rows are taken four input rows at a time, decoding each chunk once
// per block (docs/deltas.md "Serving").
#if !defined(__clang__)  // GCC 12 bug 105593: spurious -Wmaybe-uninitialized in AVX-512 headers
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "chorus/base/check.h"
#include "chorus/kernels/delta_internal.h"
#include "chorus/kernels/x86/delta_avx512_common.h"

namespace chorus::kernels::delta_internal::avx512 {
namespace {

// 8-bit codes widened to int32 lanes (codes of ≤ 4 bits are decoded by table lookup instead).
inline __m256i Bytes8(const uint8_t* p) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}
inline __m512i Bytes16(const uint8_t* p) {
  return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// The 12-column keep masks of four pattern bytes (48 columns, three 16-column chunks).
inline uint64_t Keep48(const uint8_t* b) {
  return uint64_t{kPatternMasks.bits[b[0]]} | uint64_t{kPatternMasks.bits[b[1]]} << 12 |
         uint64_t{kPatternMasks.bits[b[2]]} << 24 | uint64_t{kPatternMasks.bits[b[3]]} << 36;
}

// Decodes 16-column chunks of one output row. Codes of ≤ 4 bits are decoded by table: vpermps
// looks each code up in a 16-entry vector table[i] = scale · ((i mod 2^B) − half), so a lane
// costs a shift and a lookup and its value is exactly the portable decode's
// scale · (float(code) − half); vpermps reads only the low 4 bits of an index, so the bits above
// a code need no mask (the table repeats every 2^B entries). 8-bit codes are converted.
template <int B, bool kSparse>
struct ChunkDecoder {
  const uint8_t* codes = nullptr;
  const float* scales = nullptr;  // the row's scales (or the matrix's one)
  int shift = 0;                  // chunk t uses scales[t >> shift]
  __m512 centered;                // B ≤ 4: (i mod 2^B) − half per lane; 8-bit: half

  void Init(const DeltaMatrixView& m, int64_t o, int scale_shift) {
    codes = m.codes + o * m.code_row_bytes();
    scales = m.group_size == 0 ? m.scales : m.scales + o * m.groups();
    shift = scale_shift;
    const float half = static_cast<float>((1 << B) - 1) / 2.0f;
    if constexpr (B <= 4) {
      alignas(64) float q[16];
      for (int i = 0; i < 16; ++i) q[i] = static_cast<float>(i % (1 << B)) - half;
      centered = _mm512_load_ps(q);
    } else {
      centered = _mm512_set1_ps(half);
    }
  }

  // Chunk t (columns 16t … 16t + 15); keep: its 16-bit keep mask (2:4 only).
  __m512 Chunk(int64_t t, __mmask16 keep) const {
    const __m512 s = _mm512_set1_ps(scales[t >> shift]);
    if constexpr (kSparse) {
      __m512 v;  // the chunk's 8 kept values in lanes 0–7
      if constexpr (B <= 4) {
        uint32_t u = 0;
        std::memcpy(&u, codes + t * B, B);
        const __m512i shifts = _mm512_setr_epi32(0, B, 2 * B, 3 * B, 4 * B, 5 * B, 6 * B, 7 * B, 0,
                                                 0, 0, 0, 0, 0, 0, 0);
        v = _mm512_permutexvar_ps(_mm512_srlv_epi32(_mm512_set1_epi32(static_cast<int>(u)), shifts),
                                  _mm512_mul_ps(centered, s));
      } else {
        const __m256 q = _mm256_cvtepi32_ps(Bytes8(codes + t * B));
        v = _mm512_zextps256_ps512(_mm256_mul_ps(_mm256_sub_ps(q, _mm512_castps512_ps256(centered)),
                                                 _mm512_castps512_ps256(s)));
      }
      return _mm512_maskz_expand_ps(keep, v);
    } else {
      if constexpr (B == 1) {
        // 16 sign bits are a lane mask: each lane takes scale · (0 − ½) or scale · (1 − ½).
        uint16_t bits = 0;
        std::memcpy(&bits, codes + t * 2, 2);
        const float scale = scales[t >> shift];
        return _mm512_mask_blend_ps(static_cast<__mmask16>(bits), _mm512_set1_ps(scale * -0.5f),
                                    _mm512_set1_ps(scale * 0.5f));
      } else if constexpr (B == 2) {
        uint32_t u = 0;  // 16 codes in one 32-bit word
        std::memcpy(&u, codes + t * 4, 4);
        const __m512i shifts =
            _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
        return _mm512_permutexvar_ps(
            _mm512_srlv_epi32(_mm512_set1_epi32(static_cast<int>(u)), shifts),
            _mm512_mul_ps(centered, s));
      } else if constexpr (B <= 4) {
        uint64_t u = 0;
        std::memcpy(&u, codes + t * 2 * B, 2 * B);
        const auto lo = static_cast<uint32_t>(u), hi = static_cast<uint32_t>(u >> (8 * B));
        const __m512i v =
            _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi32(static_cast<int>(lo))),
                               _mm256_set1_epi32(static_cast<int>(hi)), 1);
        const __m512i shifts = _mm512_setr_epi32(0, B, 2 * B, 3 * B, 4 * B, 5 * B, 6 * B, 7 * B, 0,
                                                 B, 2 * B, 3 * B, 4 * B, 5 * B, 6 * B, 7 * B);
        return _mm512_permutexvar_ps(_mm512_srlv_epi32(v, shifts), _mm512_mul_ps(centered, s));
      } else {
        const __m512 q = _mm512_cvtepi32_ps(Bytes16(codes + t * 16));
        return _mm512_mul_ps(_mm512_sub_ps(q, centered), s);
      }
    }
  }
};

// y[r·ys + o + u] += Σ_k x[r·xs + k] · Δ̃[o + u, k] for r < NR, u < NO, in the portable order. NO
// output rows advance together so that NO · NR accumulation chains are in flight.
template <int B, bool kSparse, int NO, int NR>
void Rows(const DeltaMatrixView& m, int64_t o, const float* x, int64_t xs, float* y, int64_t ys,
          int scale_shift) {
  ChunkDecoder<B, kSparse> dec[NO];
  for (int u = 0; u < NO; ++u) dec[u].Init(m, o + u, scale_shift);
  __m512 acc[NO][NR];
  for (int u = 0; u < NO; ++u)
    for (int r = 0; r < NR; ++r) acc[u][r] = _mm512_setzero_ps();
  auto add_chunk = [&](int u, int64_t t, __m512 w) {
    for (int r = 0; r < NR; ++r)
      acc[u][r] = _mm512_add_ps(acc[u][r], _mm512_mul_ps(_mm512_loadu_ps(x + r * xs + 16 * t), w));
  };
  const int64_t chunks = m.cols / 16;
  int64_t t = 0;
  if constexpr (kSparse) {
    const int64_t mask_bytes = m.mask_row_bytes();
    const uint8_t* mask[NO];
    for (int u = 0; u < NO; ++u) mask[u] = m.mask + (o + u) * mask_bytes;
    // Whole 48-column steps whose four pattern bytes lie inside the row.
    const int64_t steps = std::min(chunks / 3, mask_bytes / 4);
    for (int64_t st = 0; st < steps; ++st, t += 3) {
      uint64_t keep[NO];
      for (int u = 0; u < NO; ++u) keep[u] = Keep48(mask[u] + 4 * st);
      for (int j = 0; j < 3; ++j)
        for (int u = 0; u < NO; ++u)
          add_chunk(u, t + j, dec[u].Chunk(t + j, static_cast<__mmask16>(keep[u] >> (16 * j))));
    }
    // The last whole chunks, with pattern bytes read up to the row's end.
    for (; t < chunks; ++t) {
      for (int u = 0; u < NO; ++u) {
        uint8_t b[4] = {0, 0, 0, 0};
        const int64_t first = t / 3 * 4;
        std::memcpy(b, mask[u] + first,
                    static_cast<size_t>(std::min<int64_t>(4, mask_bytes - first)));
        add_chunk(u, t, dec[u].Chunk(t, static_cast<__mmask16>(Keep48(b) >> (16 * (t % 3)))));
      }
    }
  } else {
    for (; t < chunks; ++t)
      for (int u = 0; u < NO; ++u) add_chunk(u, t, dec[u].Chunk(t, 0));
  }
  const int64_t c = chunks * 16;
  if (c < m.cols) {  // the last cols % 16 columns, decoded by the portable code
    const auto lanes = static_cast<__mmask16>((1u << (m.cols - c)) - 1);
    for (int u = 0; u < NO; ++u) {
      alignas(64) float decoded[64];
      // The portable decode of a 2:4 row starts at a pattern byte (a multiple of 12 columns).
      const int64_t from = kSparse ? c / 12 * 12 : c;
      DecodeColumns(m, o + u, from, decoded);
      const __m512 w = _mm512_maskz_loadu_ps(lanes, decoded + (c - from));
      for (int r = 0; r < NR; ++r) {
        const __m512 xv = _mm512_maskz_loadu_ps(lanes, x + r * xs + c);
        // Lanes past the row are left alone (the portable kernel adds nothing there).
        acc[u][r] = _mm512_mask_add_ps(acc[u][r], lanes, acc[u][r], _mm512_mul_ps(xv, w));
      }
    }
  }
  for (int u = 0; u < NO; ++u)
    for (int r = 0; r < NR; ++r) y[r * ys + o + u] += avx512_common::Reduce(acc[u][r]);
}

// BitDelta's layout (1-bit signs, one scale for the matrix): Δ̃[o, k] = ±h with h = scale · ½, so
// x·Δ̃[o, k] = ±(x·h) exactly (IEEE products are symmetric in sign). xh holds x·h, computed once
// per call; a chunk then costs a mask load, a masked sign flip and an add. x is used for the
// last cols % 16 columns, which the portable code decodes.
template <int NO, int NR>
void SignRows(const DeltaMatrixView& m, int64_t o, const float* x, int64_t xs, const float* xh,
              float* y, int64_t ys) {
  const uint8_t* codes[NO];
  for (int u = 0; u < NO; ++u) codes[u] = m.codes + (o + u) * m.code_row_bytes();
  __m512 acc[NO][NR];
  for (int u = 0; u < NO; ++u)
    for (int r = 0; r < NR; ++r) acc[u][r] = _mm512_setzero_ps();
  const __m512i sign = _mm512_set1_epi32(static_cast<int>(0x80000000u));
  const int64_t chunks = m.cols / 16;
  for (int64_t t = 0; t < chunks; ++t) {
    for (int u = 0; u < NO; ++u) {
      uint16_t bits = 0;
      std::memcpy(&bits, codes[u] + 2 * t, 2);
      const auto negate = static_cast<__mmask16>(~bits);  // code 0: −h
      for (int r = 0; r < NR; ++r) {
        const __m512i v = _mm512_castps_si512(_mm512_loadu_ps(xh + r * m.cols + 16 * t));
        acc[u][r] = _mm512_add_ps(acc[u][r],
                                  _mm512_castsi512_ps(_mm512_mask_xor_epi32(v, negate, v, sign)));
      }
    }
  }
  const int64_t c = chunks * 16;
  if (c < m.cols) {
    const auto lanes = static_cast<__mmask16>((1u << (m.cols - c)) - 1);
    for (int u = 0; u < NO; ++u) {
      alignas(64) float decoded[16];
      DecodeColumns(m, o + u, c, decoded);
      const __m512 w = _mm512_maskz_loadu_ps(lanes, decoded);
      for (int r = 0; r < NR; ++r) {
        const __m512 xv = _mm512_maskz_loadu_ps(lanes, x + r * xs + c);
        acc[u][r] = _mm512_mask_add_ps(acc[u][r], lanes, acc[u][r], _mm512_mul_ps(xv, w));
      }
    }
  }
  for (int u = 0; u < NO; ++u)
    for (int r = 0; r < NR; ++r) y[r * ys + o + u] += avx512_common::Reduce(acc[u][r]);
}

template <int NR>
void SignRowsOf(const DeltaMatrixView& m, int64_t o_begin, int64_t o_end, const float* x,
                int64_t xs, float* y, int64_t ys) {
  thread_local std::vector<float> xh;
  xh.resize(static_cast<size_t>(NR * m.cols));
  const float h = m.scales[0] * 0.5f;
  for (int r = 0; r < NR; ++r)
    for (int64_t k = 0; k < m.cols; ++k)
      xh[static_cast<size_t>(r * m.cols + k)] = x[r * xs + k] * h;
  int64_t o = o_begin;
  for (; o + 2 <= o_end; o += 2) SignRows<2, NR>(m, o, x, xs, xh.data(), y, ys);
  if (o < o_end) SignRows<1, NR>(m, o, x, xs, xh.data(), y, ys);
}

template <int B, bool kSparse, int NR>
void RowsOf(const DeltaMatrixView& m, int64_t o_begin, int64_t o_end, const float* x, int64_t xs,
            float* y, int64_t ys, int shift) {
  if constexpr (B == 1 && !kSparse) {
    if (m.group_size == 0) return SignRowsOf<NR>(m, o_begin, o_end, x, xs, y, ys);
  }
  int64_t o = o_begin;
  for (; o + 2 <= o_end; o += 2) Rows<B, kSparse, 2, NR>(m, o, x, xs, y, ys, shift);
  if (o < o_end) Rows<B, kSparse, 1, NR>(m, o, x, xs, y, ys, shift);
}

template <int B, bool kSparse>
void Apply(const DeltaMatrixView& m, int64_t o_begin, int64_t o_end, const float* x, int64_t xs,
           int64_t n, float* y, int64_t ys, int shift) {
  // Input rows four at a time: a chunk is decoded once per output row and block of four.
  avx512_common::ForRowsInFours(n, [&](int64_t i, auto nr) {
    RowsOf<B, kSparse, decltype(nr)::value>(m, o_begin, o_end, x + i * xs, xs, y + i * ys, ys,
                                            shift);
  });
}

}  // namespace

void ApplyRows(const DeltaMatrixView& m, int64_t o_begin, int64_t o_end, const float* x,
               int64_t x_stride, int64_t n_rows, float* y, int64_t y_stride) {
  // Chunk t's scale is scales[t >> shift]: scale groups of 16 · 2^shift columns (SimdLayout
  // admits multiples of 16; others than powers of two times 16 are turned away below), or one.
  int shift = 62;
  if (m.group_size != 0) {
    const int64_t chunks_per_scale = m.group_size / 16;
    shift = __builtin_ctzll(static_cast<uint64_t>(chunks_per_scale));
    CHORUS_CHECK(chunks_per_scale == (int64_t{1} << shift))
        << "delta scale groups of " << m.group_size << " columns reached the AVX-512 kernel";
  }
  auto run = [&](auto fn) { fn(m, o_begin, o_end, x, x_stride, n_rows, y, y_stride, shift); };
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

}  // namespace chorus::kernels::delta_internal::avx512
