// AMX int8 tile GEMM for q8_0 / q4_0 and the K-quant weights (the amx level, docs/kernels.md);
// everything else at this level is the AVX-512 kernels. Runs only when ActiveIsa() == kAmx, i.e.
// after Linux granted the process the tile data permission (dispatch.cc).
//
// Per (row, column) the result is the MatMul spec's, bit for bit (matmul.h): every 32-element
// block's integer dot product isum is exact whichever instruction forms it, and the float
// epilogue is the VNNI kernels' (x86/matmul_qtile.h): acc = fma(d_w · d_x, float(isum), acc) in
// block order, then y = acc or y + acc. So the tile kernel equals the AVX-512 kernel and the
// reference, and a row's result never depends on the other rows of the step.
//
// Why one tile multiply per block: tdpbssd sums over its whole K (up to 64 bytes), and the
// spec scales each block's sum separately, so K is one block (32 bytes). On Sapphire Rapids a
// tdpbssd costs the same 16 cycles at K = 32 as at K = 64, so the tile unit runs at half its
// int8 peak; the bound is elsewhere anyway: one 1 KiB tile store per 16×16 outputs per block,
// and the float epilogue (convert, multiply the scales, fma: 3 vector operations per 16 outputs
// per block), which on this CPU do not overlap (docs/kernels.md, measured).
//
// Weight layout: the 64-column panels of matmul_internal.h are kept as they are (no second
// copy at load). Before a panel is multiplied, the thread converts it into tile form in a
// thread-local buffer: block b, column vector h (16 columns) is one B tile of 8 rows (k-groups)
// × 64 bytes (16 columns × 4 consecutive k), signed int8 (q8_0: the stored q + 128 back to q;
// q4_0: nibble − 8), at tb + (4 b + h) · 512. That costs one pass over the panel's bytes per
// step, shared by every 16-row tile of the step, and k/32 · 2 KiB of thread-local memory
// (128 KiB at k = 2048, 352 KiB for TinyLlama's down projection, k = 5632).
//
// Tiles (palette 1, loaded by every thread before its first tile instruction, released after):
//   tmm0..tmm3: C, 16 rows × 16 int32      (four: blocks go in groups of four)
//   tmm4, tmm5: A, 16 activation rows × 32 int8 (one block)
//   tmm6, tmm7: B, 8 k-groups × 64 bytes (16 columns × 4 k)
#pragma GCC diagnostic ignored "-Wuninitialized"
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "chorus/base/check.h"
#include "chorus/kernels/matmul_internal.h"
#include "chorus/kernels/x86/matmul_ktile.h"

namespace chorus::kernels::internal {
namespace {

// Below this many rows a step runs the AVX-512 VNNI kernel (same bits): a 16-row tile costs
// the same at any row count, and the VNNI kernel's cost grows with the rows. Measured on one
// core (bench/micro/matmul_bench, TinyLlama projections): at 8 rows the tiles are 2–11 % slower,
// at 16 rows 30–45 % faster; 12 is about even.
constexpr int64_t kAmxMinRows = 12;

constexpr int kTileRows = 16;
constexpr int kVecCols = 16;                                   // columns per B/C tile
constexpr int kVecsPerPanel = kPanelCols / kVecCols;           // 4
constexpr int64_t kBTileBytes = 8 * 64;                        // one block × one column vector
constexpr int64_t kBBlockBytes = kVecsPerPanel * kBTileBytes;  // one block × a panel

struct alignas(64) TileConfig {
  uint8_t palette_id;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

TileConfig MakeConfig() {
  TileConfig c;
  std::memset(&c, 0, sizeof(c));
  c.palette_id = 1;
  for (int t : {0, 1, 2, 3}) {  // C
    c.rows[t] = kTileRows;
    c.colsb[t] = kVecCols * 4;
  }
  for (int t : {4, 5}) {  // A: one block of 32 int8 per row
    c.rows[t] = kTileRows;
    c.colsb[t] = 32;
  }
  for (int t : {6, 7}) {  // B: 8 k-groups of 16 columns × 4 bytes
    c.rows[t] = 8;
    c.colsb[t] = kVecCols * 4;
  }
  return c;
}

// The thread's tile-form buffer (see the file comment). Grows on demand, then is reused.
struct TileBuffer {
  int8_t* p = nullptr;
  int64_t cap = 0;
  ~TileBuffer() { std::free(p); }
  int8_t* Get(int64_t bytes) {
    if (bytes > cap) {
      std::free(p);
      p = static_cast<int8_t*>(std::aligned_alloc(64, static_cast<size_t>((bytes + 63) / 64 * 64)));
      CHORUS_CHECK(p != nullptr) << "out of memory for the AMX tile buffer (" << bytes << " bytes)";
      cap = bytes;
    }
    return p;
  }
};
thread_local TileBuffer t_tiles;

// Panel (nb blocks of layout kQ4 ? q4 : q8) → signed B tiles at tb.
template <bool kQ4>
void ConvertPanel(const uint8_t* panel, int64_t nb, int8_t* tb) {
  constexpr int kLayout = kQ4 ? kLayoutQ4Panel : kLayoutQ8Panel;
  constexpr int64_t kBlkB = BlockBytes(kLayout);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = panel + b * kBlkB;
    int8_t* out = tb + b * kBBlockBytes;
    if constexpr (kQ4) {
      const __m512i mask = _mm512_set1_epi8(0x0f);
      const __m512i eight = _mm512_set1_epi8(8);
      CHORUS_UNROLL
      for (int j = 0; j < 4; ++j) {
        CHORUS_UNROLL
        for (int h = 0; h < kVecsPerPanel; ++h) {
          const __m512i v = _mm512_loadu_si512(blk + j * kChunkBytes + h * 64);
          const __m512i lo = _mm512_sub_epi8(_mm512_and_si512(v, mask), eight);
          const __m512i hi =
              _mm512_sub_epi8(_mm512_and_si512(_mm512_srli_epi16(v, 4), mask), eight);
          _mm512_store_si512(out + h * kBTileBytes + (2 * j) * 64, lo);
          _mm512_store_si512(out + h * kBTileBytes + (2 * j + 1) * 64, hi);
        }
      }
    } else {
      const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80));
      CHORUS_UNROLL
      for (int g = 0; g < 8; ++g) {
        CHORUS_UNROLL
        for (int h = 0; h < kVecsPerPanel; ++h) {
          const __m512i v = _mm512_loadu_si512(blk + g * kChunkBytes + h * 64);
          _mm512_store_si512(out + h * kBTileBytes + g * 64, _mm512_xor_si512(v, bias));
        }
      }
    }
  }
}

// The float epilogue of one block for the rows of a 16-row tile: c holds the block's exact
// isums [16 rows][16 columns]; acc[r] = fma(d_w · d_x[r], float(isum), acc[r]).
template <bool kFull>
inline void Epilogue(const int32_t* c, __m512 dw, const QMeta* meta, int64_t meta_stride, int rows,
                     __m512* acc) {
  CHORUS_UNROLL
  for (int r = 0; r < kTileRows; ++r) {
    if (!kFull && r >= rows) break;
    const __m512 isum = _mm512_cvtepi32_ps(_mm512_load_si512(c + r * kVecCols));
    const __m512 dx = _mm512_set1_ps(meta[r * meta_stride].d);
    acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(dw, dx), isum, acc[r]);
  }
}

inline __m512 BlockScales(const uint8_t* d) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(d)));
}

// One block's tile multiply into C tile kC (A tile kA, B tile kB), stored to c. A macro: the
// _tile_* intrinsics paste their tile numbers into the instruction text, so they must be
// literals.
#define CHORUS_BLOCK_PRODUCT(kC, kA, kB, xa, xs, bt, c) \
  do {                                                  \
    _tile_loadd(kA, xa, xs);                            \
    _tile_loadd(kB, bt, 64);                            \
    _tile_zero(kC);                                     \
    _tile_dpbssd(kC, kA, kB);                           \
    _tile_stored(kC, c, kVecCols * 4);                  \
  } while (0)

// y[r0 + r][0 .. valid) (+)= rows r0 .. r0 + rows of q times one column vector: tb points at
// its block-0 B tile (blocks kBBlockBytes apart), wd at its block-0 f16 scales (blocks
// block_bytes apart). Blocks go in groups of four (four C tiles): four multiplies and stores,
// then the group's epilogue. (On Sapphire Rapids the loads after a tile store wait for it, so
// the tile side and the epilogue add up; docs/kernels.md.)
template <bool kFull>
__attribute__((noinline)) void TileColumn(const int8_t* tb, const uint8_t* wd, int64_t block_bytes,
                                          int64_t nb, const QRows& q, int64_t r0, int rows,
                                          float* y, int64_t y_stride, int valid, bool accumulate) {
  constexpr int kC = kTileRows * kVecCols;
  alignas(64) int32_t cbuf[4 * kC];
  __m512 acc[kTileRows];
  CHORUS_UNROLL
  for (int r = 0; r < kTileRows; ++r) acc[r] = _mm512_setzero_ps();
  const int8_t* xa = q.qs + r0 * q.qs_stride;
  const QMeta* meta = q.meta + r0 * q.meta_stride;
  const int64_t xs = q.qs_stride;
  int64_t b = 0;
  for (; b + 4 <= nb; b += 4) {
    CHORUS_BLOCK_PRODUCT(0, 4, 6, xa + 32 * b, xs, tb + b * kBBlockBytes, cbuf);
    CHORUS_BLOCK_PRODUCT(1, 5, 7, xa + 32 * (b + 1), xs, tb + (b + 1) * kBBlockBytes, cbuf + kC);
    CHORUS_BLOCK_PRODUCT(2, 4, 6, xa + 32 * (b + 2), xs, tb + (b + 2) * kBBlockBytes,
                         cbuf + 2 * kC);
    CHORUS_BLOCK_PRODUCT(3, 5, 7, xa + 32 * (b + 3), xs, tb + (b + 3) * kBBlockBytes,
                         cbuf + 3 * kC);
    CHORUS_UNROLL
    for (int i = 0; i < 4; ++i) {
      Epilogue<kFull>(cbuf + i * kC, BlockScales(wd + (b + i) * block_bytes), meta + b + i,
                      q.meta_stride, rows, acc);
    }
  }
  for (; b < nb; ++b) {
    CHORUS_BLOCK_PRODUCT(0, 4, 6, xa + 32 * b, xs, tb + b * kBBlockBytes, cbuf);
    Epilogue<kFull>(cbuf, BlockScales(wd + b * block_bytes), meta + b, q.meta_stride, rows, acc);
  }
  const __mmask16 mask = static_cast<__mmask16>((1u << valid) - 1u);
  CHORUS_UNROLL
  for (int r = 0; r < kTileRows; ++r) {
    if (!kFull && r >= rows) break;
    float* out = y + r * y_stride;
    __m512 v = acc[r];
    if (accumulate) v = _mm512_add_ps(_mm512_maskz_loadu_ps(mask, out), v);
    _mm512_mask_storeu_ps(out, mask, v);
  }
}

template <bool kQ4>
void AmxPanels(const uint8_t* packed, int64_t n, int64_t k, const QRows& q, int64_t m, int64_t p0,
               int64_t p1, float* y, int64_t y_stride, bool accumulate) {
  constexpr int kLayout = kQ4 ? kLayoutQ4Panel : kLayoutQ8Panel;
  const int64_t nb = k / kQuantBlock;
  const int64_t panel_bytes = PanelBytes(kLayout, nb);
  const int64_t block_bytes = BlockBytes(kLayout);
  int8_t* tb = t_tiles.Get(nb * kBBlockBytes);
  static const TileConfig config = MakeConfig();
  _tile_loadconfig(&config);
  for (int64_t p = p0; p < p1; ++p) {
    const uint8_t* panel = packed + p * panel_bytes;
    ConvertPanel<kQ4>(panel, nb, tb);
    const int cols = static_cast<int>(std::min<int64_t>(kPanelCols, n - p * kPanelCols));
    for (int64_t r0 = 0; r0 < m; r0 += kTileRows) {
      const int rows = static_cast<int>(std::min<int64_t>(kTileRows, m - r0));
      for (int h = 0; h * kVecCols < cols; ++h) {
        const int valid = std::min(kVecCols, cols - h * kVecCols);
        const uint8_t* wd = panel + QsBlockBytes(kLayout) + h * kVecCols * 2;
        float* yt = y + r0 * y_stride + p * kPanelCols + h * kVecCols;
        if (rows == kTileRows) {
          TileColumn<true>(tb + h * kBTileBytes, wd, block_bytes, nb, q, r0, rows, yt, y_stride,
                           valid, accumulate);
        } else {
          TileColumn<false>(tb + h * kBTileBytes, wd, block_bytes, nb, q, r0, rows, yt, y_stride,
                            valid, accumulate);
        }
      }
    }
  }
  // Back to the init state: the thread's 8 KiB of tile data need not be saved at context
  // switches while it runs other kernels.
  _tile_release();
}

// ---- K-quant weights ------------------------------------------------------------------------
//
// The same scheme for the K layouts (matmul_internal.h, "K-quant weights"), with the integer
// form of x86/matmul_ktile.h: each sub-block's exact sum is one tile product (K = 32 for q4_k /
// q5_k, 16 for q2_k / q3_k / q6_k: A tiles of 16 rows × K bytes, B tiles of K/4 k-groups), the
// codes (≤ 63) multiplied as signed bytes; per row the sum is scaled by S_j (vpmulld) into an
// int32 isum kept in a 16 × 16 buffer; after the super-block, msum (vpdpwssd) and the float
// epilogue of the VNNI kernel. So the tiles give the VNNI kernel's and the reference's bits.
//
// Tile form: super-block s, 32-k unit u, column vector h is one 512-byte B tile (8 k-groups ×
// 64 bytes) at tb + ((8 s + u) · 4 + h) · 512; a 16-element sub-block is its first or last 4
// k-groups.

struct KPrims {  // the primitives ktile::Codes needs, on AVX-512
  using I = __m512i;
  static I Load(const uint8_t* p) { return _mm512_loadu_si512(p); }
  static I And(I a, I b) { return _mm512_and_si512(a, b); }
  static I Or(I a, I b) { return _mm512_or_si512(a, b); }
  static I Set8(int v) { return _mm512_set1_epi8(static_cast<char>(v)); }
  template <int kN>
  static I Shift(I v) {
    if constexpr (kN > 0) return _mm512_slli_epi16(v, kN);
    if constexpr (kN < 0) return _mm512_srli_epi16(v, -kN);
    return v;
  }
};

TileConfig MakeKConfig(int k_bytes) {
  TileConfig c = MakeConfig();
  for (int t : {4, 5}) c.colsb[t] = static_cast<uint16_t>(k_bytes);
  for (int t : {6, 7}) c.rows[t] = static_cast<uint8_t>(k_bytes / 4);
  return c;
}

template <int kLayout>
void ConvertKPanel(const uint8_t* panel, int64_t nsb, int8_t* tb) {
  for (int64_t s = 0; s < nsb; ++s) {
    const uint8_t* sb = panel + s * KBlockBytes(kLayout);
    for (int64_t u = 0; u < 8; ++u) {
      CHORUS_UNROLL
      for (int h = 0; h < kVecsPerPanel; ++h) {
        int8_t* out = tb + ((8 * s + u) * kVecsPerPanel + h) * kBTileBytes;
        const uint8_t* vb = sb + h * 64;
        __m512i lo, hi;
        ktile::Codes<KPrims, kLayout, 0>(vb, u, &lo, &hi);
        _mm512_store_si512(out + 0 * 64, lo);
        _mm512_store_si512(out + 1 * 64, hi);
        ktile::Codes<KPrims, kLayout, 1>(vb, u, &lo, &hi);
        _mm512_store_si512(out + 2 * 64, lo);
        _mm512_store_si512(out + 3 * 64, hi);
        ktile::Codes<KPrims, kLayout, 2>(vb, u, &lo, &hi);
        _mm512_store_si512(out + 4 * 64, lo);
        _mm512_store_si512(out + 5 * 64, hi);
        ktile::Codes<KPrims, kLayout, 3>(vb, u, &lo, &hi);
        _mm512_store_si512(out + 6 * 64, lo);
        _mm512_store_si512(out + 7 * 64, hi);
      }
    }
  }
}

// S_j of the 16 columns of a vector as int32, from its pair row (byte 2c + odd).
inline __m512i KScale(const uint8_t* pairs, int odd) {
  const __m512i v =
      _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(pairs)));
  return odd ? _mm512_srai_epi32(v, 16) : _mm512_srai_epi32(_mm512_slli_epi32(v, 16), 16);
}

// isum[r] += S · c[r] for the rows of the tile.
template <bool kFull>
inline void KIntEpilogue(const int32_t* c, __m512i sv, int rows, int32_t* isum) {
  CHORUS_UNROLL
  for (int r = 0; r < kTileRows; ++r) {
    if (!kFull && r >= rows) break;
    const __m512i v = _mm512_mullo_epi32(_mm512_load_si512(c + r * kVecCols), sv);
    _mm512_store_si512(isum + r * kVecCols,
                       _mm512_add_epi32(_mm512_load_si512(isum + r * kVecCols), v));
  }
}

#define CHORUS_K_PRODUCT(kC, kA, kB, xa, xs, bt, c) \
  do {                                              \
    _tile_loadd(kA, xa, xs);                        \
    _tile_loadd(kB, bt, 64);                        \
    _tile_zero(kC);                                 \
    _tile_dpbssd(kC, kA, kB);                       \
    _tile_stored(kC, c, kVecCols * 4);              \
  } while (0)

// y[r0 + r][0 .. valid) (+)= rows r0 .. r0 + rows of q times one column vector: tb at its tile
// of super-block 0 / unit 0, vw at its bytes of the panel's super-block 0 (+ h · 32 for the
// S/N pair rows, + h · 32 for D/M: both are 2 bytes per column).
template <int kLayout, bool kFull>
__attribute__((noinline)) void KTileColumn(const int8_t* tb, const uint8_t* vw, int64_t nsb,
                                           const QRows& q, int64_t r0, int rows, float* y,
                                           int64_t y_stride, int valid, bool accumulate) {
  constexpr int kSub = KSubBlocks(kLayout);  // products per super-block
  constexpr int kK = 256 / kSub;             // bytes of K per product: 32 or 16
  constexpr int kC = kTileRows * kVecCols;
  constexpr int64_t kBlk = KBlockBytes(kLayout);
  alignas(64) int32_t cbuf[4 * kC];
  alignas(64) int32_t isum[kC];
  __m512 acc[kTileRows];
  CHORUS_UNROLL
  for (int r = 0; r < kTileRows; ++r) acc[r] = _mm512_setzero_ps();
  const int8_t* xa = q.qs + r0 * q.qs_stride;
  const int64_t xs = q.qs_stride;
  // Product i of super-block s: its A bytes and its B tile.
  auto a_at = [&](int64_t s, int i) { return xa + s * 256 + i * kK; };
  auto b_at = [&](int64_t s, int i) {
    return tb + (8 * s + i * kK / 32) * kVecsPerPanel * kBTileBytes + (i * kK % 32) / 4 * 64;
  };
  for (int64_t s = 0; s < nsb; ++s) {
    std::memset(isum, 0, sizeof(isum));
    const uint8_t* sw = vw + s * kBlk;
    for (int i = 0; i < kSub; i += 4) {  // groups of four products (four C tiles)
      CHORUS_K_PRODUCT(0, 4, 6, a_at(s, i), xs, b_at(s, i), cbuf);
      CHORUS_K_PRODUCT(1, 5, 7, a_at(s, i + 1), xs, b_at(s, i + 1), cbuf + kC);
      CHORUS_K_PRODUCT(2, 4, 6, a_at(s, i + 2), xs, b_at(s, i + 2), cbuf + 2 * kC);
      CHORUS_K_PRODUCT(3, 5, 7, a_at(s, i + 3), xs, b_at(s, i + 3), cbuf + 3 * kC);
      CHORUS_UNROLL
      for (int t = 0; t < 4; ++t) {
        const int j = i + t;
        KIntEpilogue<kFull>(cbuf + t * kC,
                            KScale(sw + KSOff(kLayout) + (j / 2) * 2 * kPanelCols, j & 1), rows,
                            isum);
      }
    }
    __m512i npair[kSub / 2];
    CHORUS_UNROLL
    for (int i = 0; i < kSub / 2; ++i) {
      const uint8_t* row =
          sw + (KHasMins(kLayout) ? KNOff(kLayout) : KSOff(kLayout)) + i * 2 * kPanelCols;
      npair[i] = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row)));
      if constexpr (!KHasMins(kLayout))
        npair[i] = _mm512_slli_epi16(npair[i], kLayout == kLayoutQ6K ? 5 : 2);
    }
    const __m512 dw =
        _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sw + KDOff(kLayout))));
    __m512 mw = _mm512_setzero_ps();
    if constexpr (KHasMins(kLayout))
      mw = _mm512_cvtph_ps(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sw + KMOff(kLayout))));
    CHORUS_UNROLL
    for (int r = 0; r < kTileRows; ++r) {
      if (!kFull && r >= rows) break;
      const QMetaK& mt = KMetaRow(q, r0 + r)[s];
      __m512i msum = _mm512_setzero_si512();
      CHORUS_UNROLL
      for (int i = 0; i < kSub / 2; ++i) {
        int32_t xp;
        std::memcpy(&xp, kSub == 8 ? mt.s32 + 2 * i : mt.s16 + 2 * i, 4);
        msum = _mm512_dpwssd_epi32(msum, npair[i], _mm512_set1_epi32(xp));
      }
      const __m512i is = _mm512_load_si512(isum + r * kVecCols);
      const __m512 dx = _mm512_set1_ps(mt.d);
      if constexpr (KHasMins(kLayout)) {
        acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(dw, dx), _mm512_cvtepi32_ps(is), acc[r]);
        acc[r] = _mm512_fnmadd_ps(_mm512_mul_ps(mw, dx), _mm512_cvtepi32_ps(msum), acc[r]);
      } else {
        acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(dw, dx),
                                 _mm512_cvtepi32_ps(_mm512_sub_epi32(is, msum)), acc[r]);
      }
    }
  }
  const __mmask16 mask = static_cast<__mmask16>((1u << valid) - 1u);
  CHORUS_UNROLL
  for (int r = 0; r < kTileRows; ++r) {
    if (!kFull && r >= rows) break;
    float* out = y + r * y_stride;
    __m512 v = acc[r];
    if (accumulate) v = _mm512_add_ps(_mm512_maskz_loadu_ps(mask, out), v);
    _mm512_mask_storeu_ps(out, mask, v);
  }
}

template <int kLayout>
void AmxKPanels(const uint8_t* packed, int64_t n, int64_t k, const QRows& q, int64_t m, int64_t p0,
                int64_t p1, float* y, int64_t y_stride, bool accumulate) {
  const int64_t nsb = k / 256;
  const int64_t panel_bytes = KPanelBytes(kLayout, k);
  int8_t* tb = t_tiles.Get(nsb * 8 * kVecsPerPanel * kBTileBytes);
  static const TileConfig config = MakeKConfig(256 / KSubBlocks(kLayout));
  _tile_loadconfig(&config);
  for (int64_t p = p0; p < p1; ++p) {
    const uint8_t* panel = packed + p * panel_bytes;
    ConvertKPanel<kLayout>(panel, nsb, tb);
    const int cols = static_cast<int>(std::min<int64_t>(kPanelCols, n - p * kPanelCols));
    for (int64_t r0 = 0; r0 < m; r0 += kTileRows) {
      const int rows = static_cast<int>(std::min<int64_t>(kTileRows, m - r0));
      for (int h = 0; h * kVecCols < cols; ++h) {
        const int valid = std::min(kVecCols, cols - h * kVecCols);
        float* yt = y + r0 * y_stride + p * kPanelCols + h * kVecCols;
        const int8_t* tbh = tb + h * kBTileBytes;
        const uint8_t* vw = panel + h * kVecCols * 2;
        if (rows == kTileRows) {
          KTileColumn<kLayout, true>(tbh, vw, nsb, q, r0, rows, yt, y_stride, valid, accumulate);
        } else {
          KTileColumn<kLayout, false>(tbh, vw, nsb, q, r0, rows, yt, y_stride, valid, accumulate);
        }
      }
    }
  }
  _tile_release();
}

void AmxKAnyPanels(int layout, const uint8_t* packed, int64_t n, int64_t k, const QRows& q,
                   int64_t m, int64_t p0, int64_t p1, float* y, int64_t y_stride, bool accumulate) {
  switch (layout) {
    case kLayoutQ2K:
      return AmxKPanels<kLayoutQ2K>(packed, n, k, q, m, p0, p1, y, y_stride, accumulate);
    case kLayoutQ3K:
      return AmxKPanels<kLayoutQ3K>(packed, n, k, q, m, p0, p1, y, y_stride, accumulate);
    case kLayoutQ4K:
      return AmxKPanels<kLayoutQ4K>(packed, n, k, q, m, p0, p1, y, y_stride, accumulate);
    case kLayoutQ5K:
      return AmxKPanels<kLayoutQ5K>(packed, n, k, q, m, p0, p1, y, y_stride, accumulate);
    default:
      return AmxKPanels<kLayoutQ6K>(packed, n, k, q, m, p0, p1, y, y_stride, accumulate);
  }
}

void QPanels(int layout, const uint8_t* packed, int64_t n, int64_t k, const QRows& q, int64_t m,
             int64_t p0, int64_t p1, float* y, int64_t y_stride, bool accumulate) {
  if (m < kAmxMinRows) {
    return Avx512Kernels().q_panels(layout, packed, n, k, q, m, p0, p1, y, y_stride, accumulate);
  }
  AmxTileQPanels(layout, packed, n, k, q, m, p0, p1, y, y_stride, accumulate);
}

}  // namespace

void AmxTileQPanels(int layout, const uint8_t* packed, int64_t n, int64_t k, const QRows& q,
                    int64_t m, int64_t p0, int64_t p1, float* y, int64_t y_stride,
                    bool accumulate) {
  if (IsKLayout(layout)) {
    AmxKAnyPanels(layout, packed, n, k, q, m, p0, p1, y, y_stride, accumulate);
  } else if (layout == kLayoutQ4Panel) {
    AmxPanels<true>(packed, n, k, q, m, p0, p1, y, y_stride, accumulate);
  } else {
    AmxPanels<false>(packed, n, k, q, m, p0, p1, y, y_stride, accumulate);
  }
}

const IsaKernels& AmxKernels() {
  static const IsaKernels k = [] {
    IsaKernels a = Avx512Kernels();
    a.q_panels = QPanels;
    return a;
  }();
  return k;
}

}  // namespace chorus::kernels::internal
