// AVX-512 tiles of the LoRA segment kernels (lora.h, lora_internal.h).
//
// Shrink: register tiles of NR ≤ 4 rows × NJ ≤ 4 rank columns; each (row, j) owns one 16-lane
// accumulator fed by fma over k in steps of 16 (masked tail), then _mm512_reduce_add_ps. The op
// sequence of an element is the same in every tile shape, so the value does not depend on which
// other rows or columns share its tile.
// Expand: blocks of Bᵀ packed into an f32 panel (see PackBlock), then tiles of NR ≤ 4 rows × 64
// columns; acc = fma chain over j in order, y = fma(s, acc, y); column tails use masked
// loads/stores so every column goes through the same instructions.
// bf16 weights (the *Bf16 tiles) are widened to f32 in registers (exact: a 16-bit shift) and go
// through the same fma sequence: a bf16 row gives bitwise what the f32 tiles give for the
// widened values, while the bytes streamed per row halve.
#if !defined(__clang__)  // clang has no such group (and no such false positive)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "chorus/kernels/lora_internal.h"
#include "chorus/kernels/x86/lora_tiles.h"

namespace chorus::kernels::lora_internal::avx512 {
namespace {

inline __mmask16 TailMask(int64_t remaining) {
  return remaining >= 16 ? static_cast<__mmask16>(0xFFFF)
                         : static_cast<__mmask16>((1u << remaining) - 1u);
}

// 16 weights as f32 (masked-out lanes zero, never read).
inline __m512 LoadW(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
inline __m512 LoadW(const uint16_t* p, __mmask16 m) {
  const __m512i w = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}

// `next` (NJ rows, or null): the rows of the following tile, prefetched one line per 64 bytes
// as this tile streams its own. Each A row of a 2048-wide bf16 linear is exactly one 4 KiB page
// and the hardware prefetchers stop at page boundaries, so without this every new row starts
// with a run of demand misses (measured: a single thread read adapters at ~10 GB/s of its ~20).
template <int NR, int NJ, typename T>
inline void ShrinkMicro(const float* x, int64_t x_stride, const T* const* a, int64_t in, int64_t j0,
                        const T* const* next, float* v, int64_t v_stride) {
  __m512 acc[NR][NJ];
#pragma GCC unroll 4
  for (int r = 0; r < NR; ++r)
#pragma GCC unroll 8
    for (int q = 0; q < NJ; ++q) acc[r][q] = _mm512_setzero_ps();
  for (int64_t k = 0; k < in; k += 16) {
    if (next != nullptr && (sizeof(T) == 4 || (k & 31) == 0)) {
#pragma GCC unroll 8
      for (int q = 0; q < NJ; ++q)
        _mm_prefetch(reinterpret_cast<const char*>(next[q] + k), _MM_HINT_T0);
    }
    const __mmask16 m = TailMask(in - k);
    __m512 xv[NR];
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) xv[r] = _mm512_maskz_loadu_ps(m, x + r * x_stride + k);
#pragma GCC unroll 8
    for (int q = 0; q < NJ; ++q) {
      const __m512 av = LoadW(a[j0 + q] + k, m);
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) acc[r][q] = _mm512_fmadd_ps(xv[r], av, acc[r][q]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < NR; ++r)
#pragma GCC unroll 8
    for (int q = 0; q < NJ; ++q) v[r * v_stride + j0 + q] = _mm512_reduce_add_ps(acc[r][q]);
}

template <int NR, typename T>
inline void ShrinkRows(const float* x, int64_t x_stride, const T* const* a, int64_t in,
                       int64_t j_begin, int64_t j_end, float* v, int64_t v_stride) {
  int64_t j = j_begin;
  if constexpr (NR <= 2) {  // few rows: 8 A rows at once, 8 streams in flight instead of 4
    for (; j + 8 <= j_end; j += 8) {
      const T* const* next = j + 16 <= j_end ? a + j + 8 : nullptr;
      ShrinkMicro<NR, 8>(x, x_stride, a, in, j, next, v, v_stride);
    }
  }
  for (; j + 4 <= j_end; j += 4) {
    // The next full tile's rows; a partial last tile is not prefetched (its rows are few).
    const T* const* next = j + 8 <= j_end ? a + j + 4 : nullptr;
    ShrinkMicro<NR, 4>(x, x_stride, a, in, j, next, v, v_stride);
  }
  ForTailOf4(j_end - j, j, [&](auto nj, int64_t j0) {
    ShrinkMicro<NR, decltype(nj)::value>(x, x_stride, a, in, j0,
                                         static_cast<const T* const*>(nullptr), v, v_stride);
  });
}

template <typename T>
void ShrinkTileT(const float* x, int64_t x_stride, int64_t n_rows, const T* const* a, int64_t in,
                 int64_t j_begin, int64_t j_end, float* v, int64_t v_stride) {
  ForRowTiles(n_rows, [&](auto nr, int64_t i) {
    ShrinkRows<decltype(nr)::value>(x + i * x_stride, x_stride, a, in, j_begin, j_end,
                                    v + i * v_stride, v_stride);
  });
}

// Expand, packed. The obvious register tile (for each 32-column chunk: for j < rank: load
// Bᵀ[j][chunk]) reads `rank` rows at the same column offset; when the row length is a multiple
// of 4 KiB (out = 2048 in f32 or bf16, and rows packed back to back in pool pages) all those
// lines map to ONE L1 set, so beyond 8 rows every load missed L1 (measured: ~2.5 multiply-adds
// per cycle, half the samples on one load). Instead each block of columns is first packed: every
// rank row is read once as one contiguous run and widened into an f32 panel on the stack,
// [sub-panel of kSub columns][rank][kSub]; then every tile of ≤ 4 rows accumulates from the
// panel, which it reads in address order. The arithmetic of an element is unchanged.
constexpr int64_t kSub = 64;                 // columns per sub-panel: 4 vectors
constexpr int64_t kMaxBlock = 2048;          // columns per packed block
constexpr int64_t kPanelFloats = 64 * 1024;  // 256 KiB (L2 is 1 MiB): 1024 columns at rank 64

// panel[(s · rank + j) · kSub + c] = Bᵀ[j][cb + s · kSub + c], zero past `width`.
template <typename T>
void PackBlock(const T* const* bt, int64_t rank, int64_t cb, int64_t width, float* panel) {
  const int64_t n_sub = (width + kSub - 1) / kSub;
  for (int64_t j = 0; j < rank; ++j) {
    const T* b = bt[j] + cb;
    // The next row's run, one line per sub-panel of this row: each row starts a new stream
    // (often a new page) that the hardware prefetchers do not see coming.
    const char* ahead = j + 1 < rank ? reinterpret_cast<const char*>(bt[j + 1] + cb) : nullptr;
    for (int64_t sp = 0; sp < n_sub; ++sp) {
      if (ahead != nullptr) {
        _mm_prefetch(ahead + sp * kSub * static_cast<int64_t>(sizeof(T)), _MM_HINT_T0);
        if (sizeof(T) == 4) _mm_prefetch(ahead + sp * kSub * 4 + 128, _MM_HINT_T0);
      }
      float* dst = panel + (sp * rank + j) * kSub;
#pragma GCC unroll 4
      for (int q = 0; q < 4; ++q) {
        const int64_t col = sp * kSub + q * 16;
        const __mmask16 m = col < width ? TailMask(width - col) : static_cast<__mmask16>(0);
        _mm512_store_ps(dst + q * 16, LoadW(b + col, m));
      }
    }
  }
}

// y[r, c] = fma(s, Σ_j v[r, j] · panel[j][c], y[r, c]) for r < NR, c < width (≤ kSub).
template <int NR>
inline void ExpandSubPanel(const float* v, int64_t v_stride, const float* panel, int64_t rank,
                           __m512 s, int64_t width, float* y, int64_t y_stride) {
  __m512 acc[NR][4];
#pragma GCC unroll 4
  for (int r = 0; r < NR; ++r)
#pragma GCC unroll 4
    for (int q = 0; q < 4; ++q) acc[r][q] = _mm512_setzero_ps();
  for (int64_t j = 0; j < rank; ++j) {
    const float* p = panel + j * kSub;
    const __m512 w0 = _mm512_load_ps(p), w1 = _mm512_load_ps(p + 16);
    const __m512 w2 = _mm512_load_ps(p + 32), w3 = _mm512_load_ps(p + 48);
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      const __m512 vv = _mm512_set1_ps(v[r * v_stride + j]);
      acc[r][0] = _mm512_fmadd_ps(vv, w0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(vv, w1, acc[r][1]);
      acc[r][2] = _mm512_fmadd_ps(vv, w2, acc[r][2]);
      acc[r][3] = _mm512_fmadd_ps(vv, w3, acc[r][3]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < NR; ++r) {
#pragma GCC unroll 4
    for (int q = 0; q < 4; ++q) {
      const int64_t col = q * 16;
      if (col >= width) break;
      const __mmask16 m = TailMask(width - col);
      float* yr = y + r * y_stride + col;
      _mm512_mask_storeu_ps(yr, m, _mm512_fmadd_ps(s, acc[r][q], _mm512_maskz_loadu_ps(m, yr)));
    }
  }
}

template <int NR>
void ExpandRowsFromPanel(const float* v, int64_t v_stride, const float* panel, int64_t rank,
                         __m512 s, int64_t width, float* y, int64_t y_stride) {
  for (int64_t sp = 0; sp * kSub < width; ++sp) {
    ExpandSubPanel<NR>(v, v_stride, panel + sp * rank * kSub, rank, s,
                       std::min(kSub, width - sp * kSub), y + sp * kSub, y_stride);
  }
}

// Expand of fewer than 4 rows (decode: one row per adapter), streamed: nothing is reused, so
// the Bᵀ rows are read straight through, NJ rows at a time (NJ streams in flight, as the shrink
// reads A), into accumulators kept in L1; per element the fma chain still runs over j in order.
constexpr int64_t kStreamBlock = 1024;  // columns per pass: acc of ≤ 3 rows = 12 KiB

template <int NR, int NJ, typename T>
inline void StreamRowsJ(const float* v, int64_t v_stride, const T* const* bt, int64_t j0,
                        int64_t cb, int64_t width, const T* const* next, float* acc) {
  __m512 vv[NR][NJ];
#pragma GCC unroll 4
  for (int r = 0; r < NR; ++r)
#pragma GCC unroll 8
    for (int q = 0; q < NJ; ++q) vv[r][q] = _mm512_set1_ps(v[r * v_stride + j0 + q]);
  const T* b[NJ];
#pragma GCC unroll 8
  for (int q = 0; q < NJ; ++q) b[q] = bt[j0 + q] + cb;
  for (int64_t c = 0; c < width; c += 16) {
    if (next != nullptr && (sizeof(T) == 4 || (c & 31) == 0)) {  // the next NJ rows (see shrink)
#pragma GCC unroll 16
      for (int q = 0; q < NJ; ++q)
        _mm_prefetch(reinterpret_cast<const char*>(next[q] + cb + c), _MM_HINT_T0);
    }
    const __mmask16 m = TailMask(width - c);
    __m512 w[NJ];
#pragma GCC unroll 8
    for (int q = 0; q < NJ; ++q) w[q] = LoadW(b[q] + c, m);
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      __m512 a = _mm512_load_ps(acc + r * kStreamBlock + c);
#pragma GCC unroll 8
      for (int q = 0; q < NJ; ++q) a = _mm512_fmadd_ps(vv[r][q], w[q], a);
      _mm512_store_ps(acc + r * kStreamBlock + c, a);
    }
  }
}

template <int NR, typename T>
void ExpandStream(const float* v, int64_t v_stride, const T* const* bt, int64_t rank, float scale,
                  int64_t c_begin, int64_t c_end, float* y, int64_t y_stride) {
  alignas(64) float acc[NR * kStreamBlock];
  const __m512 s = _mm512_set1_ps(scale);
  constexpr int kJ = NR == 1 ? 8 : 4;
  for (int64_t cb = c_begin; cb < c_end; cb += kStreamBlock) {
    const int64_t width = std::min(kStreamBlock, c_end - cb);
    for (int r = 0; r < NR; ++r)
      for (int64_t c = 0; c < width; c += 16)
        _mm512_store_ps(acc + r * kStreamBlock + c, _mm512_setzero_ps());
    int64_t j = 0;
    for (; j + kJ <= rank; j += kJ) {
      const T* const* next = j + 2 * kJ <= rank ? bt + j + kJ : nullptr;
      StreamRowsJ<NR, kJ>(v, v_stride, bt, j, cb, width, next, acc);
    }
    for (; j < rank; ++j)
      StreamRowsJ<NR, 1>(v, v_stride, bt, j, cb, width, static_cast<const T* const*>(nullptr), acc);
    for (int r = 0; r < NR; ++r) {
      float* yr = y + r * y_stride + cb;
      for (int64_t c = 0; c < width; c += 16) {
        const __mmask16 m = TailMask(width - c);
        _mm512_mask_storeu_ps(yr + c, m,
                              _mm512_fmadd_ps(s, _mm512_load_ps(acc + r * kStreamBlock + c),
                                              _mm512_maskz_loadu_ps(m, yr + c)));
      }
    }
  }
}

template <typename T>
void ExpandTileT(const float* v, int64_t v_stride, int64_t n_rows, const T* const* bt, int64_t rank,
                 float scale, int64_t c_begin, int64_t c_end, float* y, int64_t y_stride) {
  if (n_rows < 4) {
    return ForRowTiles(n_rows, [&](auto nr, int64_t) {
      ExpandStream<decltype(nr)::value>(v, v_stride, bt, rank, scale, c_begin, c_end, y, y_stride);
    });
  }
  // The panel lives in L2 and the compute streams it in address order; large blocks keep each
  // Bᵀ row's run long.
  const __m512 s = _mm512_set1_ps(scale);
  ExpandByPanels(
      n_rows, rank, c_begin, c_end, kSub, kMaxBlock, kPanelFloats,
      [&](int64_t cb, int64_t width, float* panel) { PackBlock(bt, rank, cb, width, panel); },
      [&](auto nr, int64_t i, const float* panel, int64_t cb, int64_t width) {
        ExpandRowsFromPanel<decltype(nr)::value>(v + i * v_stride, v_stride, panel, rank, s, width,
                                                 y + i * y_stride + cb, y_stride);
      });
}

}  // namespace

CHORUS_LORA_TILE_DEFS(ShrinkTileT, ExpandTileT)

}  // namespace chorus::kernels::lora_internal::avx512
