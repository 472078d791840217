// AVX-512 kernel of the int16 delta path (kernels/delta.h, kernels/delta_internal.h), per
// 64-column block of one output row:
//  * dense codes: the block is decoded into signed bytes w' = 2·code − (2^bits − 1)
//    (vpmultishiftqb pulls the codes out of their bit stream), then two vpshufb make its int16
//    operands — columns 4l, 4l + 1 and 4l + 2, 4l + 3 of int32 lane l — and two vpdpwssd dot
//    them with the quantized input row (pairs order): 64 products in 2 instructions.
//  * 2:4 codes: the block's 32 kept values go straight to the high bytes of 32 int16 words, two
//    per lane (vpmultishiftqb, then a masked vpermb table lookup code → w'), and vpermt2w
//    gathers x at their columns from the block's 64 quantized columns (column order), using the
//    kept positions; one vpdpwssd then dots the 32 kept products. No vpexpandb: on the Zen 5
//    host it costs ~5 cycles, as much as the rest of a block's work (docs/deltas.md).
// Either way int32 lane l holds exactly the products of columns 4l…4l + 3, as the reference.
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
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "chorus/kernels/delta_internal.h"
#include "chorus/kernels/x86/delta_avx512_common.h"

namespace chorus::kernels::delta_internal::q16::avx512 {
namespace {
// Software prefetch distance, in output rows: each output row in flight is its own stream of
// codes (and 2:4 positions and scales), more streams than the hardware prefetchers follow far
// enough ahead; 4, 8 and 16 rows ahead measured alike within this host's noise.
constexpr int kAheadRows = 4;

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

// The int16 operands of one output row's blocks of dense codes (see the top of the file).
template <int B>
struct DenseDecoder {
  static constexpr bool kSparse = false;
  static constexpr int kBlockBytes = 64 * B / 8;  // code bytes per block
  const uint8_t* codes = nullptr;
  int64_t row_bytes = 0;
  __m512i lo_pair, hi_pair;  // vpshufb controls

  void Init(const DeltaMatrixView& m, int64_t o) {
    row_bytes = m.code_row_bytes();
    codes = m.codes + o * row_bytes;
    lo_pair = Control(false, B <= 4);
    hi_pair = Control(true, B <= 4);
  }

  // Whole blocks: those whose code bytes all lie inside the row (the last may be partial).
  int64_t WholeBlocks() const { return row_bytes / kBlockBytes; }

  // Requests block b's code line of the row `ahead` rows below.
  void Prefetch(int64_t b, int64_t ahead) const {
    if (b * kBlockBytes % 64 < kBlockBytes)
      _mm_prefetch(reinterpret_cast<const char*>(codes + ahead * row_bytes + b * kBlockBytes),
                   _MM_HINT_T0);
  }

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
      if constexpr (B == 4) {
        const __m256i raw =
            kWhole ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))
                   : _mm256_maskz_loadu_epi8(static_cast<__mmask32>(Avail(32, avail)), p);
        q = _mm512_cvtepu32_epi64(raw);
      } else {  // B == 2
        const __m128i raw = kWhole
                                ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(p))
                                : _mm_maskz_loadu_epi8(static_cast<__mmask16>(Avail(16, avail)), p);
        q = _mm512_cvtepu16_epi64(raw);
      }
      const __m512i c = _mm512_and_si512(_mm512_multishift_epi64_epi8(shifts, q), max_code);
      return _mm512_sub_epi8(_mm512_add_epi8(c, c), max_code);
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

// Constants of SparseDecoder.
struct SparseTables {
  // w[B == 4][i] = w' of the code i mod 2^B (B = 2, 4): 2·(i mod 2^B) − (2^B − 1).
  alignas(64) int8_t w[2][64];
  // Bytes 2j and 2j + 1 (word j): 2j, the bit offset of value j's position in the block's
  // 64-bit word of positions (broadcast to every qword; vpmultishiftqb offsets).
  alignas(64) uint8_t position_shifts[64];
  // Word j: 4·(j / 2), the first column of value j's group.
  alignas(64) int16_t group_base[32];
  constexpr SparseTables() : w(), position_shifts(), group_base() {
    for (int i = 0; i < 64; ++i) {
      w[0][i] = static_cast<int8_t>(2 * (i % 4) - 3);
      w[1][i] = static_cast<int8_t>(2 * (i % 16) - 15);
    }
    for (int j = 0; j < 32; ++j) {
      position_shifts[2 * j] = position_shifts[2 * j + 1] = static_cast<uint8_t>(2 * j);
      group_base[j] = static_cast<int16_t>(4 * (j / 2));
    }
  }
};
inline constexpr SparseTables kSparseTables;

// The 2:4 blocks of one output row (see the top of the file): the block's 32 kept values as
// int16 words w'·256, value j in word j (group j / 2's first and second kept value), and the
// vpermt2w indices of their columns in the block, 4·(j / 2) + p_j.
template <int B>
struct SparseDecoder {
  static constexpr bool kSparse = true;
  static constexpr int kBlockBytes = 32 * B / 8;  // code bytes per block
  const uint8_t* codes = nullptr;
  const uint64_t* positions = nullptr;
  int64_t row_bytes = 0, position_words = 0;

  void Init(const DeltaMatrixView& m, int64_t o) {
    row_bytes = m.code_row_bytes();
    position_words = m.position_row_words();
    codes = m.codes + o * row_bytes;
    positions = m.positions + o * position_words;
  }

  int64_t WholeBlocks() const { return row_bytes / kBlockBytes; }

  // Requests block b's code and position lines of the row `ahead` rows below.
  void Prefetch(int64_t b, int64_t ahead) const {
    if (b * kBlockBytes % 64 < kBlockBytes)
      _mm_prefetch(reinterpret_cast<const char*>(codes + ahead * row_bytes + b * kBlockBytes),
                   _MM_HINT_T0);
    if (b % 8 == 0)
      _mm_prefetch(reinterpret_cast<const char*>(positions + ahead * position_words + b),
                   _MM_HINT_T0);
  }

  template <bool kWhole>
  void Block(int64_t b, __m512i* w, __m512i* index) const {
    // Values 4L…4L + 3 (4·B bits) into qword L, then vpmultishiftqb puts value 4L + i's bits at the
    // bottom of byte 2i + 1 (the high byte of word 4L + i); the table lookup maps the low 6 bits of
    // each high byte to w' (the table repeats every 2^B entries, so the next value's bits above do
    // not matter) and zeroes the low bytes.
    const uint8_t* p = codes + b * kBlockBytes;
    const int64_t avail = kWhole ? kBlockBytes : row_bytes - b * kBlockBytes;
    __m512i q;
    if constexpr (B == 4) {
      const __m128i raw = kWhole
                              ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(p))
                              : _mm_maskz_loadu_epi8(static_cast<__mmask16>(Avail(16, avail)), p);
      q = _mm512_cvtepu16_epi64(raw);
    } else {  // B == 2
      const __m128i raw = kWhole ? _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))
                                 : _mm_maskz_loadu_epi8(static_cast<__mmask16>(Avail(8, avail)), p);
      q = _mm512_cvtepu8_epi64(raw);
    }
    const __m512i code_shifts =
        B == 4 ? _mm512_set1_epi64(0x0C00080004000000LL) : _mm512_set1_epi64(0x0600040002000000LL);
    *w = _mm512_maskz_permutexvar_epi8(0xAAAAAAAAAAAAAAAAull,
                                       _mm512_multishift_epi64_epi8(code_shifts, q),
                                       _mm512_load_si512(kSparseTables.w[B == 4]));
    // Positions: value j's 2 bits at bit 2j of the block's word; byte 2i of qword L takes bit
    // 2·(4L + i), masked to p_j and or-ed with 4·(j / 2).
    const __m512i pos = _mm512_set1_epi64(static_cast<long long>(positions[b]));
    *index = _mm512_ternarylogic_epi32(
        _mm512_multishift_epi64_epi8(_mm512_load_si512(kSparseTables.position_shifts), pos),
        _mm512_set1_epi16(3), _mm512_load_si512(kSparseTables.group_base), 0xEA);  // (a & b) | c
  }
};

// y[r·ys + o + u] += the int16 term for r < NR, u < NO.
template <class Decoder, int NO, int NR>
void DecodedRows(const DeltaMatrixView& m, int64_t o, const int16_t* q, int64_t padded,
                 const float* x_scales, float* y, int64_t ys) {
  Decoder dec[NO];
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
    // Dense: the two operands; 2:4: the kept values and their gather indices.
    __m512i first[NO], second[NO];
    for (int u = 0; u < NO; ++u) dec[u].template Block<kWhole>(b, &first[u], &second[u]);
    for (int u = 0; u < NO; ++u) dec[u].Prefetch(b, kAheadRows);
    if (m.group_size != 0 && in_group == 0 && g % 16 == 0)
      for (int u = 0; u < NO; ++u)
        _mm_prefetch(reinterpret_cast<const char*>(scales[u] + kAheadRows * m.groups() + g),
                     _MM_HINT_T0);
    for (int r = 0; r < NR; ++r) {
      const int16_t* qb = q + r * padded + 64 * b;
      const __m512i qa = _mm512_loadu_si512(qb), qc = _mm512_loadu_si512(qb + 32);
      for (int u = 0; u < NO; ++u) {
        __m512i sum;
        if constexpr (Decoder::kSparse) {
          sum = _mm512_dpwssd_epi32(_mm512_setzero_si512(), first[u],
                                    _mm512_permutex2var_epi16(qa, second[u], qc));
        } else {
          sum = _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(_mm512_setzero_si512(), first[u], qa),
                                    second[u], qc);
        }
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
  const float unscale = m.bits <= 4 ? 1.0f / 512.0f : 0.5f;
  for (int u = 0; u < NO; ++u) {
    for (int r = 0; r < NR; ++r) {
      const float term = (avx512_common::Reduce(acc[u][r]) * unscale) * x_scales[r];
      y[r * ys + o + u] += term;
    }
  }
}

// BitDelta's layout (SignRowSum): each 64-column block's sign bits become ±1 int16 words by two
// masked blends (columns 0–31 and 32–63 of the column-ordered x), and two vpdpwssd add the
// block's products into int32 lanes that run over the whole row; the lanes are summed as
// integers and converted once. |lane| ≤ cols / 16 · 32767, far inside int32.
template <int NO, int NR>
void SignRows(const DeltaMatrixView& m, int64_t o, const int16_t* q, int64_t padded,
              const float* x_scales, float* y, int64_t ys) {
  const int64_t row_bytes = m.code_row_bytes(), blocks = padded / 64;
  const uint8_t* codes = m.codes + o * row_bytes;
  __m512i acc[NO][NR];
  for (int u = 0; u < NO; ++u)
    for (int r = 0; r < NR; ++r) acc[u][r] = _mm512_setzero_si512();
  const __m512i minus = _mm512_set1_epi16(-1), plus = _mm512_set1_epi16(1);
  auto block = [&]<bool kWhole>(int64_t b) {
    __m512i lo[NO], hi[NO];
    for (int u = 0; u < NO; ++u) {
      const uint8_t* p = codes + u * row_bytes + 8 * b;
      uint64_t bits = 0;
      // A fixed-size copy is one load; the row's last, partial block copies what is left.
      std::memcpy(&bits, p, kWhole ? 8 : static_cast<size_t>(row_bytes - 8 * b));
      lo[u] = _mm512_mask_blend_epi16(static_cast<__mmask32>(bits), minus, plus);
      hi[u] = _mm512_mask_blend_epi16(static_cast<__mmask32>(bits >> 32), minus, plus);
      if (b % 8 == 0)
        _mm_prefetch(reinterpret_cast<const char*>(p + kAheadRows * row_bytes), _MM_HINT_T0);
    }
    for (int r = 0; r < NR; ++r) {
      const int16_t* qb = q + r * padded + 64 * b;
      const __m512i qa = _mm512_loadu_si512(qb), qc = _mm512_loadu_si512(qb + 32);
      for (int u = 0; u < NO; ++u)
        acc[u][r] = _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(acc[u][r], lo[u], qa), hi[u], qc);
    }
  };
  const int64_t whole = std::min(blocks, row_bytes / 8);
  for (int64_t b = 0; b < whole; ++b) block.template operator()<true>(b);
  for (int64_t b = whole; b < blocks; ++b) block.template operator()<false>(b);
  const float half_scale = m.scales[0] * 0.5f;
  for (int u = 0; u < NO; ++u) {
    for (int r = 0; r < NR; ++r) {
      const __m512i a = acc[u][r];
      const int64_t total = _mm512_reduce_add_epi64(
          _mm512_add_epi64(_mm512_cvtepi32_epi64(_mm512_castsi512_si256(a)),
                           _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(a, 1))));
      const float term = (static_cast<float>(total) * half_scale) * x_scales[r];
      y[r * ys + o + u] += term;
    }
  }
}

// BitDelta's layout by table lookup (SignRowSum, panels of 16 output rows): each group of 4
// columns has 16 possible sign patterns, so per input row a table holds, for every group g and
// pattern n, T_g[n] = Σ_j (2·bit_j(n) − 1)·q[4g + j] — the group's exact integer sum for that
// pattern, an int16 because SignRowSum rows are quantized to |q| ≤ 8191 (MaxCode). Tables go in
// pairs (g, g + 4): one vpermw looks up 32 words — word 2i at output row o + i's 4 bits of group
// g, word 2i + 1 at its bits of group g + 4 (index + 16: the pair's second half) — and one
// vpdpwssd with ones adds each word pair into int32 lane i: 16 rows × 8 columns per two
// instructions, against 16 rows × 4 columns for a vpermd and a vpaddd with int32 tables (the
// kernel before: vpermd-bound, 1.5–1.9× slower; docs/deltas.md "BitDelta by table lookup"). The
// sums are the same exact integers in another order, so the term equals SignRows' and the
// reference's bit for bit.
//
// The index lanes must hold each row's bits: each 512-column chunk loads 64 code bytes of each
// of the 16 rows and transposes them as 16 × 16 dwords (dword k of lane i = row o + i's columns
// 512c + 32k …, groups 8k … 8k + 7 of the chunk, 4 bits each); the dword's low word then holds
// groups 8k + s and its high word groups 8k + 4 + s in their low nibbles after a shift by 4s, and
// one vpternlogd keeps those nibbles and sets the high word's bit 4.
constexpr int64_t kLutRows = 16;    // output rows per panel (int32 lanes)
constexpr int64_t kLutChunk = 512;  // columns per transposed chunk (64 code bytes per row)
constexpr int64_t kLutPairsPerChunk = kLutChunk / 8;  // table pairs (32 int16 each)
// Panels per block: per chunk, the block's panels are transposed first, then looked up 4 table
// pairs at a time across all of them, so the tables in use (NR · 256 bytes) stay in L1 while 128
// rows use them (with 4 input rows a panel at a time was 1.25× slower, the tables of a chunk
// being more than L1).
constexpr int64_t kLutPanels = 8;
constexpr int64_t kLutBlockRows = kLutRows * kLutPanels;
// Software prefetch distance in blocks: 0 (none) streamed at half the speed of 2; 8 no better.
constexpr int64_t kLutAheadBlocks = 2;
// A lane sums a whole row, |Σ| ≤ cols · 8191: within int32 up to 262 144 columns (wider rows run
// SignRows, whose lanes take a sixteenth of the row each). Any number of input rows takes the
// lookup kernel: from L2 it is 2.6× SignRows for one input row and 2.2× for two (and 1.6–1.8×
// the int32 lookup that ran 3–4); streamed from memory, delta_bench's step of 4 deltas × 1 row
// takes 24 ms against SignRows' 30 (docs/benchmarks.md "Delta kernels").
constexpr int64_t kLutMaxCols = 262144;

// The table pairs of one input row q (column order, PaddedCols(cols) int16, |q| ≤ 8191) for
// `groups` groups of 4 columns (a multiple of 128; groups past q's columns are 0): pair
// 4·(g / 8) + g mod 4 holds T_g in words 0–15 if g mod 8 < 4, else in words 16–31. T = s01·(q0,
// q1) + s23·(q2, q3) by two vpdpwssd, where word pair n of s01 is (2·bit_0(n) − 1, 2·bit_1(n) −
// 1); |T| ≤ 4 · 8191, so the int32 → int16 narrowing is exact.
void BuildSignTables(const int16_t* q, int64_t padded, int64_t groups, int16_t* tables) {
  alignas(64) int16_t s01[32], s23[32];
  for (int n = 0; n < 16; ++n) {
    for (int j = 0; j < 2; ++j) {
      s01[2 * n + j] = static_cast<int16_t>((n >> j & 1) != 0 ? 1 : -1);
      s23[2 * n + j] = static_cast<int16_t>((n >> (j + 2) & 1) != 0 ? 1 : -1);
    }
  }
  const __m512i a = _mm512_load_si512(s01), b = _mm512_load_si512(s23);
  const int64_t q_groups = padded / 4;
  for (int64_t g = 0; g < q_groups; ++g) {
    int32_t q01, q23;
    std::memcpy(&q01, q + 4 * g, 4);
    std::memcpy(&q23, q + 4 * g + 2, 4);
    const __m512i t =
        _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(_mm512_setzero_si512(), a, _mm512_set1_epi32(q01)),
                            b, _mm512_set1_epi32(q23));
    int16_t* at = tables + 32 * (4 * (g / 8) + g % 4) + (g % 8 < 4 ? 0 : 16);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(at), _mm512_cvtepi32_epi16(t));
  }
  // Groups past q come in whole dwords (q_groups is a multiple of 16): whole pairs of zeros.
  std::memset(tables + 16 * q_groups, 0, static_cast<size_t>(groups - q_groups) * 32);
}

// r[k] ← the dwords k of r[0…15] (a 16 × 16 dword transpose: lane i of the result = row i).
inline void Transpose16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {  // per 128-bit lane: a0 b0 a1 b1 | a2 b2 a3 b3
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {  // u[i + j], lane L: dword 4L + j of rows i…i + 3
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int j = 0; j < 4; ++j) {  // 4 × 4 transpose of 128-bit lanes: result 4L + j = lanes L
    const __m512i x0 = _mm512_shuffle_i32x4(r[j], r[4 + j], 0x44);
    const __m512i x1 = _mm512_shuffle_i32x4(r[j], r[4 + j], 0xEE);
    const __m512i x2 = _mm512_shuffle_i32x4(r[8 + j], r[12 + j], 0x44);
    const __m512i x3 = _mm512_shuffle_i32x4(r[8 + j], r[12 + j], 0xEE);
    t[j] = _mm512_shuffle_i32x4(x0, x2, 0x88);
    t[4 + j] = _mm512_shuffle_i32x4(x0, x2, 0xDD);
    t[8 + j] = _mm512_shuffle_i32x4(x1, x3, 0x88);
    t[12 + j] = _mm512_shuffle_i32x4(x1, x3, 0xDD);
  }
  for (int k = 0; k < 16; ++k) r[k] = t[k];
}

// y[r·ys + o + i] += the term for i < 16 · panels, r < NR (panels ≤ kLutPanels); tables[r] is
// input row r's (BuildSignTables, chunks · 64 pairs). Chunk by chunk: the panels' codes are
// loaded and transposed into `bits`, then each dword k of all panels takes its 4 pair lookups;
// the panels' sums wait in `sums`.
template <int NR>
void SignLutBlock(const DeltaMatrixView& m, int64_t o, int64_t panels, int64_t chunks,
                  const int16_t* const* tables, const float* x_scales, float* y, int64_t ys) {
  const int64_t row_bytes = m.code_row_bytes();
  const uint8_t* codes = m.codes + o * row_bytes;
  // The block to request while this one runs: its bytes that exist (0 past the matrix's end).
  const int64_t ahead_row = o + kLutAheadBlocks * kLutBlockRows;
  const int64_t ahead_bytes =
      std::max<int64_t>(0, std::min(kLutBlockRows, m.rows - ahead_row)) * row_bytes;
  const uint8_t* ahead = ahead_bytes > 0 ? m.codes + ahead_row * row_bytes : m.codes;
  // Index words: the low nibble of each word, plus 16 (the pair's second table) in the high one.
  const __m512i nibbles = _mm512_set1_epi32(0x000F000F);
  const __m512i second = _mm512_set1_epi32(0x00100000);
  const __m512i ones = _mm512_set1_epi16(1);
  alignas(64) int32_t sums[kLutPanels][NR][16] = {};
  alignas(64) uint32_t bits[kLutPanels][16][16];  // a chunk's transposed codes, per panel
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t at = kLutChunk / 8 * c;
    const bool whole = row_bytes - at >= 64;
    const __mmask64 tail = whole ? ~__mmask64{0} : Avail(64, row_bytes - at);
    for (int64_t p = 0; p < panels; ++p) {
      const uint8_t* pc = codes + kLutRows * p * row_bytes + at;
      __m512i v[16];
      if (whole) {
        for (int i = 0; i < 16; ++i) v[i] = _mm512_loadu_si512(pc + i * row_bytes);
      } else {  // the row's last, partial chunk: bytes past the row are not read
        for (int i = 0; i < 16; ++i) v[i] = _mm512_maskz_loadu_epi8(tail, pc + i * row_bytes);
      }
      // Requests the block kLutAheadBlocks below in address order (into L2), 16 lines per
      // panel step, so that all its lines are asked for by the time this block ends.
      const int64_t line0 = 16 * (c * panels + p);
      for (int i = 0; i < 16; ++i) {
        if (64 * (line0 + i) < ahead_bytes)
          _mm_prefetch(reinterpret_cast<const char*>(ahead + 64 * (line0 + i)), _MM_HINT_T1);
      }
      Transpose16(v);
      for (int k = 0; k < 16; ++k) _mm512_store_si512(bits[p][k], v[k]);
    }
    // Dword k of every panel, then the next: the 4 pairs' tables of the NR input rows (NR · 256
    // bytes) serve the whole block from L1.
    const int64_t pair0 = kLutPairsPerChunk * c;
    for (int k = 0; k < 16; ++k) {
      for (int64_t p = 0; p < panels; ++p) {
        __m512i acc[NR];
        for (int r = 0; r < NR; ++r) acc[r] = _mm512_load_si512(sums[p][r]);
        __m512i code = _mm512_load_si512(bits[p][k]);
        for (int s = 0; s < 4; ++s) {
          const __m512i idx = _mm512_ternarylogic_epi32(code, nibbles, second, 0xEA);  // a&b | c
          for (int r = 0; r < NR; ++r) {
            const __m512i t = _mm512_loadu_si512(tables[r] + 32 * (pair0 + 4 * k + s));
            acc[r] = _mm512_dpwssd_epi32(acc[r], _mm512_permutexvar_epi16(idx, t), ones);
          }
          code = _mm512_srli_epi32(code, 4);
        }
        for (int r = 0; r < NR; ++r) _mm512_store_si512(sums[p][r], acc[r]);
      }
    }
  }
  // As SignRows: term = (float(Σ) · (scale / 2)) · sx, two separate roundings.
  const __m512 half_scale = _mm512_set1_ps(m.scales[0] * 0.5f);
  for (int64_t p = 0; p < panels; ++p) {
    for (int r = 0; r < NR; ++r) {
      const __m512 term = _mm512_mul_ps(
          _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_load_si512(sums[p][r])), half_scale),
          _mm512_set1_ps(x_scales[r]));
      float* yr = y + r * ys + o + kLutRows * p;
      _mm512_storeu_ps(yr, _mm512_add_ps(_mm512_loadu_ps(yr), term));
    }
  }
}

// The two row kernels, each with how many output rows it keeps in flight for NR input rows.
template <class Decoder>
struct Decoded {
  // More output rows in flight for one input row: more independent streams and chains (for
  // more input rows, 2 × NR float accumulators).
  static constexpr int OutputRows(int nr) { return nr == 1 ? 4 : 2; }
  template <int NO, int NR>
  static void Rows(const DeltaMatrixView& m, int64_t o, const int16_t* q, int64_t padded,
                   const float* x_scales, float* y, int64_t ys) {
    DecodedRows<Decoder, NO, NR>(m, o, q, padded, x_scales, y, ys);
  }
};
struct Signs {
  // Four output rows for any number of input rows: 16 int32 accumulators at most, no float
  // chains (a mixed step with ~4 rows per delta: +2 points of base-only against 2 rows).
  static constexpr int OutputRows(int) { return 4; }
  template <int NO, int NR>
  static void Rows(const DeltaMatrixView& m, int64_t o, const int16_t* q, int64_t padded,
                   const float* x_scales, float* y, int64_t ys) {
    SignRows<NO, NR>(m, o, q, padded, x_scales, y, ys);
  }
};

// SignRowSum matrices: the lookup kernel over whole panels of 16 output rows, SignRows over the
// rest (the same integers, so the same bits). Each thread builds the tables of all n input rows
// (n · cols · 8 bytes; 4 rows of 5632 columns: 180 KB, in L2) — a few percent of the kernel's
// work, cheaper than a second hand-off to the pool.
void ApplySigns(const DeltaMatrixView& m, int64_t o_begin, int64_t o_end, const int16_t* q,
                const float* x_scales, int64_t n, float* y, int64_t ys);

template <class Kernel>
void Apply(const DeltaMatrixView& m, int64_t o_begin, int64_t o_end, const int16_t* q,
           const float* x_scales, int64_t n, float* y, int64_t ys) {
  const int64_t padded = PaddedCols(m.cols);
  // Input rows four at a time: a block is decoded once per output row and group of four. The
  // groups take turns over chunks of output rows small enough to stay in L1, so a segment of
  // more than four rows streams the codes from memory once, not once per group.
  constexpr int64_t kChunk = 8;
  for (int64_t o0 = o_begin; o0 < o_end; o0 += kChunk) {
    const int64_t chunk_end = std::min(o_end, o0 + kChunk);
    avx512_common::ForRowsInFours(n, [&](int64_t i, auto nr) {
      constexpr int kNR = decltype(nr)::value;
      constexpr int kNO = Kernel::OutputRows(kNR);
      const int16_t* qi = q + i * padded;
      int64_t o = o0;
      for (; o + kNO <= chunk_end; o += kNO)
        Kernel::template Rows<kNO, kNR>(m, o, qi, padded, x_scales + i, y + i * ys, ys);
      for (; o < chunk_end; ++o)
        Kernel::template Rows<1, kNR>(m, o, qi, padded, x_scales + i, y + i * ys, ys);
    });
  }
}

void ApplySigns(const DeltaMatrixView& m, int64_t o_begin, int64_t o_end, const int16_t* q,
                const float* x_scales, int64_t n, float* y, int64_t ys) {
  const int64_t padded = PaddedCols(m.cols);
  const int64_t chunks = (m.cols + kLutChunk - 1) / kLutChunk;
  const int64_t groups = chunks * (kLutChunk / 4);
  // Grown, never shrunk: a vector resized down and up again zero-fills the regrown part, and
  // steps alternate between a few decode rows and prefill chunks of hundreds (perf showed that
  // memset at 3 % of a saturated delta server's time).
  thread_local std::vector<int16_t> tables;
  bool built = false;  // the tables serve every band of the call (a pool copy's: PagedDelta)
  delta_internal::ForEachBand(
      m, o_begin, o_end, [&](const DeltaMatrixView& v, int64_t lo, int64_t hi, int64_t first) {
        float* yb = y + first;
        const int64_t panel_end = lo + (hi - lo) / kLutRows * kLutRows;
        if (panel_end > lo) {
          if (!built) {
            if (tables.size() < static_cast<size_t>(n * groups * 16))
              tables.resize(static_cast<size_t>(n * groups * 16));
            for (int64_t r = 0; r < n; ++r)
              BuildSignTables(q + r * padded, padded, groups, tables.data() + r * groups * 16);
            built = true;
          }
          for (int64_t o = lo; o < panel_end; o += kLutBlockRows) {
            const int64_t panels = std::min(kLutBlockRows, panel_end - o) / kLutRows;
            avx512_common::ForRowsInFours(n, [&](int64_t i, auto nr) {
              constexpr int kNR = decltype(nr)::value;
              const int16_t* t[kNR];
              for (int r = 0; r < kNR; ++r) t[r] = tables.data() + (i + r) * groups * 16;
              SignLutBlock<kNR>(v, o, panels, chunks, t, x_scales + i, yb + i * ys, ys);
            });
          }
        }
        if (panel_end < hi) Apply<Signs>(v, panel_end, hi, q, x_scales, n, yb, ys);
      });
}

}  // namespace

void ApplyRows(const DeltaMatrixView& m, int64_t o_begin, int64_t o_end, const int16_t* q,
               const float* x_scales, int64_t n_rows, float* y, int64_t y_stride) {
  if (SignRowSum(m) && m.cols <= kLutMaxCols)
    return ApplySigns(m, o_begin, o_end, q, x_scales, n_rows, y, y_stride);  // bands inside
  if (!m.bands.empty()) {
    delta_internal::ForEachBand(
        m, o_begin, o_end, [&](const DeltaMatrixView& v, int64_t lo, int64_t hi, int64_t first) {
          ApplyRows(v, lo, hi, q, x_scales, n_rows, y + first, y_stride);
        });
    return;
  }
  auto run = [&](auto fn) { fn(m, o_begin, o_end, q, x_scales, n_rows, y, y_stride); };
  if (SignRowSum(m)) return run(Apply<Signs>);
  if (m.sparse24) {
    return m.bits == 2 ? run(Apply<Decoded<SparseDecoder<2>>>)
                       : run(Apply<Decoded<SparseDecoder<4>>>);
  }
  switch (m.bits) {
    case 1:
      return run(Apply<Decoded<DenseDecoder<1>>>);
    case 2:
      return run(Apply<Decoded<DenseDecoder<2>>>);
    case 4:
      return run(Apply<Decoded<DenseDecoder<4>>>);
    default:
      return run(Apply<Decoded<DenseDecoder<8>>>);
  }
}

// Quantize's arithmetic, 16 columns at a time: the max of |x|'s bits (an unsigned max, so an
// infinity or NaN is ≥ 0x7F800000 as there), the same float product x · inv, vrndscaleps to
// nearest-even where the portable loop adds and subtracts 1.5·2^23 (the same integer for |v| <
// 2^22), the same clamp, and a narrowing that the clamp makes exact. Pairs order: each 64-column
// block's two column-order halves are interleaved by vpermt2w (Q16Position).
void Quantize(const float* x, int64_t xs, int64_t n, int64_t cols, bool column_order, int max_code,
              int16_t* q, float* scales) {
  const int64_t padded = PaddedCols(cols);
  const auto top = static_cast<float>(max_code);
  alignas(64) int16_t first[32], second[32];  // pairs order: position p ← column (p < 32 ? …)
  for (int p = 0; p < 32; ++p) {
    first[p] = static_cast<int16_t>(4 * (p / 2) + p % 2);
    second[p] = static_cast<int16_t>(4 * (p / 2) + 2 + p % 2);
  }
  const __m512i to_first = _mm512_load_si512(first), to_second = _mm512_load_si512(second);
  const __m512i magnitude = _mm512_set1_epi32(0x7FFFFFFF);
  auto tail = [&](int64_t c) {
    return static_cast<__mmask16>(cols - c >= 16 ? 0xFFFF : (1u << (cols - c)) - 1);
  };
  for (int64_t i = 0; i < n; ++i) {
    const float* row = x + i * xs;
    int16_t* out = q + i * padded;
    __m512i max_bits = _mm512_setzero_si512();
    for (int64_t c = 0; c < cols; c += 16) {
      const __m512i b =
          _mm512_and_si512(_mm512_castps_si512(_mm512_maskz_loadu_ps(tail(c), row + c)), magnitude);
      max_bits = _mm512_max_epu32(max_bits, b);
    }
    const uint32_t top_bits = _mm512_reduce_max_epu32(max_bits);
    float max_abs;
    std::memcpy(&max_abs, &top_bits, 4);
    const float inv = top / max_abs;
    if (top_bits >= 0x7F800000u || !(inv <= std::numeric_limits<float>::max())) {
      std::fill(out, out + padded, int16_t{0});
      scales[i] = top_bits >= 0x7F800000u ? std::nanf("") : 0.0f;
      continue;
    }
    const __m512 vinv = _mm512_set1_ps(inv), lo = _mm512_set1_ps(-top), hi = _mm512_set1_ps(top);
    // 16 columns from c as int16 (0 past the row).
    auto words = [&](int64_t c) {
      if (c >= cols) return _mm256_setzero_si256();
      const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(tail(c), row + c), vinv);
      const __m512 r = _mm512_min_ps(
          _mm512_max_ps(_mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), lo),
          hi);
      return _mm512_cvtsepi32_epi16(_mm512_cvtps_epi32(r));
    };
    for (int64_t b = 0; b < padded; b += 64) {
      const __m512i a = _mm512_inserti64x4(_mm512_castsi256_si512(words(b)), words(b + 16), 1);
      const __m512i c = _mm512_inserti64x4(_mm512_castsi256_si512(words(b + 32)), words(b + 48), 1);
      if (column_order) {
        _mm512_storeu_si512(out + b, a);
        _mm512_storeu_si512(out + b + 32, c);
      } else {
        _mm512_storeu_si512(out + b, _mm512_permutex2var_epi16(a, to_first, c));
        _mm512_storeu_si512(out + b + 32, _mm512_permutex2var_epi16(a, to_second, c));
      }
    }
    scales[i] = max_abs / top;
  }
}

}  // namespace chorus::kernels::delta_internal::q16::avx512
