// AVX-512 kernel of the int16 delta path (kernels/delta.h, kernels/delta_internal.h): a
// 64-column block of one output row is decoded into signed bytes w' = 2·code − (2^bits − 1)
// (vpmultishiftqb pulls the codes out of their bit stream, vpexpandb spreads 2:4 values to their
// columns under the keep bits, pruned columns 0), then two vpshufb make the block's int16
// operands — columns 4l, 4l + 1 and 4l + 2, 4l + 3 of int32 lane l — and two vpdpwssd dot them
// with the quantized input row: 64 products in 2 instructions, exact in int32.
//
// Codes of ≤ 4 bits go to the high byte of each int16 (vpshufb cannot sign-extend), so the lane
// sums are 256 × the true ones, and the scale taken at full value (not halved): every float is
// then 512 × the reference's, a power of two that commutes with each rounding, and the final
// ×1/512 is exact — the result equals the scalar reference bit for bit. 8-bit codes are
// widened to int16 (factor 2). Built with -ffp-contract=off: the only fused operations are the
// explicit fmadd, which the reference computes with std::fma.
#if !defined(__clang__)  // GCC 12 bug 105593: spurious -Wmaybe-uninitialized in AVX-512 headers
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "chorus/kernels/delta_internal.h"
#include "chorus/kernels/x86/delta_avx512_common.h"

namespace chorus::kernels::delta_internal::q16::avx512 {
namespace {

// vpshufb controls, the same in each 128-bit lane (dword d = columns 4d…4d + 3 of the lane).
// High: byte c of w' into the high byte of an int16 (low byte 0); low: into the low byte.
inline __m512i Control(bool second_pair, bool high) {
  alignas(16) int8_t b[16];
  for (int d = 0; d < 4; ++d) {
    const int c0 = 4 * d + (second_pair ? 2 : 0);
    const int8_t z = static_cast<int8_t>(0x80);
    b[4 * d + 0] = high ? z : static_cast<int8_t>(c0);
    b[4 * d + 1] = high ? static_cast<int8_t>(c0) : z;
    b[4 * d + 2] = high ? z : static_cast<int8_t>(c0 + 1);
    b[4 * d + 3] = high ? static_cast<int8_t>(c0 + 1) : z;
  }
  return _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(b)));
}

// Bytes [p, p + n) of a code row with `avail` bytes left from p (n ≤ 64); bytes past the row are
// not read (masked loads do not fault) and come back 0.
inline __mmask64 Avail(int n, int64_t avail) {
  const int64_t k = std::min<int64_t>(n, avail);
  return k >= 64 ? ~__mmask64{0} : (__mmask64{1} << k) - 1;
}

// The int16 operands of one output row's blocks (see the top of the file).
template <int B, bool kSparse>
struct BlockDecoder {
  static constexpr int kBlockBytes = (kSparse ? 32 : 64) * B / 8;  // code bytes per block
  const uint8_t* codes = nullptr;
  const uint64_t* keep = nullptr;
  int64_t row_bytes = 0;
  __m512i lo_pair, hi_pair;  // vpshufb controls

  void Init(const DeltaMatrixView& m, int64_t o) {
    row_bytes = m.code_row_bytes();
    codes = m.codes + o * row_bytes;
    keep = kSparse ? m.keep + o * m.keep_row_words() : nullptr;
    lo_pair = Control(false, B <= 4);
    hi_pair = Control(true, B <= 4);
  }

  // Whole blocks: those whose code bytes all lie inside the row (the last may be partial).
  int64_t WholeBlocks() const { return row_bytes / kBlockBytes; }

  // w' of block b as 64 signed bytes (≤ 4 bits) or 8-bit codes as unsigned bytes. kWhole: the
  // block's code bytes are all inside the row; otherwise only the row's are read.
  template <bool kWhole>
  __m512i Bytes(int64_t b) const {
    const uint8_t* p = codes + b * kBlockBytes;
    const int64_t avail = kWhole ? kBlockBytes : row_bytes - b * kBlockBytes;
    if constexpr (B == 8) {  // dense only (DeltaInt16Layout)
      return kWhole ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi8(Avail(64, avail), p);
    } else if constexpr (B == 1) {
      uint64_t bits = 0;
      std::memcpy(&bits, p, static_cast<size_t>(std::min<int64_t>(8, avail)));
      return _mm512_mask_blend_epi8(bits, _mm512_set1_epi8(-1), _mm512_set1_epi8(1));
    } else {
      // Codes of qword q (8 of them, B bits each) → bytes 8q…8q + 7 by vpmultishiftqb.
      const __m512i shifts = B == 4 ? _mm512_set1_epi64(0x1C1814100C080400LL)
                                    : _mm512_set1_epi64(0x0E0C0A0806040200LL);
      // 2^B − 1: the mask of a code's bits, and the offset in w' = 2·code − (2^B − 1).
      const __m512i max_code = _mm512_set1_epi8(static_cast<char>((1 << B) - 1));
      __m512i q;  // qword q: the B·8 bits of codes 8q…8q + 7
      if constexpr (!kSparse && B == 4) {
        const __m256i raw =
            kWhole ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))
                   : _mm256_maskz_loadu_epi8(static_cast<__mmask32>(Avail(32, avail)), p);
        q = _mm512_cvtepu32_epi64(raw);
      } else if constexpr (!kSparse && B == 2) {
        const __m128i raw = kWhole
                                ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(p))
                                : _mm_maskz_loadu_epi8(static_cast<__mmask16>(Avail(16, avail)), p);
        q = _mm512_cvtepu16_epi64(raw);
      } else if constexpr (B == 4) {  // 2:4: 32 codes in 16 bytes
        const __m128i raw = kWhole
                                ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(p))
                                : _mm_maskz_loadu_epi8(static_cast<__mmask16>(Avail(16, avail)), p);
        q = _mm512_zextsi256_si512(_mm256_cvtepu32_epi64(raw));
      } else {  // 2:4, 2 bits: 32 codes in 8 bytes
        const __m128i raw = kWhole
                                ? _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))
                                : _mm_maskz_loadu_epi8(static_cast<__mmask16>(Avail(8, avail)), p);
        q = _mm512_zextsi256_si512(_mm256_cvtepu16_epi64(raw));
      }
      const __m512i c = _mm512_and_si512(_mm512_multishift_epi64_epi8(shifts, q), max_code);
      const __m512i w = _mm512_sub_epi8(_mm512_add_epi8(c, c), max_code);
      if constexpr (kSparse) return _mm512_maskz_expand_epi8(keep[b], w);
      return w;
    }
  }

  // Block b's two int16 operands: columns 4l, 4l + 1 (first) and 4l + 2, 4l + 3 (second).
  template <bool kWhole>
  void Block(int64_t b, __m512i* first, __m512i* second) const {
    const __m512i bytes = Bytes<kWhole>(b);
    *first = _mm512_shuffle_epi8(bytes, lo_pair);
    *second = _mm512_shuffle_epi8(bytes, hi_pair);
    if constexpr (B == 8) {  // w' = 2·code − 255 in int16
      const __m512i off = _mm512_set1_epi16(255);
      *first = _mm512_sub_epi16(_mm512_add_epi16(*first, *first), off);
      *second = _mm512_sub_epi16(_mm512_add_epi16(*second, *second), off);
    }
  }
};

// y[r·ys + o + u] += the int16 term for r < NR, u < NO.
template <int B, bool kSparse, int NO, int NR>
void Rows(const DeltaMatrixView& m, int64_t o, const int16_t* q, int64_t padded,
          const float* x_scales, float* y, int64_t ys) {
  BlockDecoder<B, kSparse> dec[NO];
  const float* scales[NO];
  for (int u = 0; u < NO; ++u) {
    dec[u].Init(m, o + u);
    scales[u] = m.group_size == 0 ? m.scales : m.scales + (o + u) * m.groups();
  }
  __m512 acc[NO][NR];
  for (int u = 0; u < NO; ++u)
    for (int r = 0; r < NR; ++r) acc[u][r] = _mm512_setzero_ps();
  const int64_t blocks = padded / 64;
  const int64_t blocks_per_scale = m.group_size == 0 ? blocks : m.group_size / 64;
  int64_t g = 0, in_group = 0;
  auto block = [&]<bool kWhole>(int64_t b) {
    __m512i first[NO], second[NO];
    for (int u = 0; u < NO; ++u) dec[u].template Block<kWhole>(b, &first[u], &second[u]);
    for (int r = 0; r < NR; ++r) {
      const int16_t* qb = q + r * padded + 64 * b;
      const __m512i qa = _mm512_loadu_si512(qb), qc = _mm512_loadu_si512(qb + 32);
      for (int u = 0; u < NO; ++u) {
        const __m512i sum = _mm512_dpwssd_epi32(
            _mm512_dpwssd_epi32(_mm512_setzero_si512(), first[u], qa), second[u], qc);
        acc[u][r] =
            _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_set1_ps(scales[u][g]), acc[u][r]);
      }
    }
    if (++in_group == blocks_per_scale) {
      in_group = 0;
      ++g;
    }
  };
  // Every row of a matrix has the same code bytes, so dec[0] speaks for all.
  const int64_t whole = std::min(blocks, dec[0].WholeBlocks());
  for (int64_t b = 0; b < whole; ++b) block.template operator()<true>(b);
  for (int64_t b = whole; b < blocks; ++b) block.template operator()<false>(b);
  // The accumulators hold 512× (≤ 4 bits) or 2× (8 bits) the reference's: exact to undo.
  const float unscale = B <= 4 ? 1.0f / 512.0f : 0.5f;
  for (int u = 0; u < NO; ++u) {
    for (int r = 0; r < NR; ++r) {
      const float term = (avx512_common::Reduce(acc[u][r]) * unscale) * x_scales[r];
      y[r * ys + o + u] += term;
    }
  }
}

template <int B, bool kSparse, int NR>
void RowsOf(const DeltaMatrixView& m, int64_t o_begin, int64_t o_end, const int16_t* q,
            int64_t padded, const float* x_scales, float* y, int64_t ys) {
  // More output rows in flight for one input row: more independent streams and chains.
  constexpr int kNO = NR == 1 ? 4 : 2;
  int64_t o = o_begin;
  for (; o + kNO <= o_end; o += kNO) Rows<B, kSparse, kNO, NR>(m, o, q, padded, x_scales, y, ys);
  for (; o < o_end; ++o) Rows<B, kSparse, 1, NR>(m, o, q, padded, x_scales, y, ys);
}

template <int B, bool kSparse>
void Apply(const DeltaMatrixView& m, int64_t o_begin, int64_t o_end, const int16_t* q,
           const float* x_scales, int64_t n, float* y, int64_t ys) {
  const int64_t padded = PaddedCols(m.cols);
  // Input rows four at a time: a block is decoded once per output row and group of four.
  avx512_common::ForRowsInFours(n, [&](int64_t i, auto nr) {
    RowsOf<B, kSparse, decltype(nr)::value>(m, o_begin, o_end, q + i * padded, padded, x_scales + i,
                                            y + i * ys, ys);
  });
}

}  // namespace

void ApplyRows(const DeltaMatrixView& m, int64_t o_begin, int64_t o_end, const int16_t* q,
               const float* x_scales, int64_t n_rows, float* y, int64_t y_stride) {
  auto run = [&](auto fn) { fn(m, o_begin, o_end, q, x_scales, n_rows, y, y_stride); };
  if (m.sparse24) return m.bits == 2 ? run(Apply<2, true>) : run(Apply<4, true>);
  switch (m.bits) {
    case 1:
      return run(Apply<1, false>);
    case 2:
      return run(Apply<2, false>);
    case 4:
      return run(Apply<4, false>);
    default:
      return run(Apply<8, false>);
  }
}

}  // namespace chorus::kernels::delta_internal::q16::avx512
