// The quantized-weight GEMM skeleton shared by the AVX2 and AVX-512 kernels: a register tile of
// R activation rows × C column vectors over the panel layout of matmul_internal.h.
//
// Only the primitives differ per ISA (a traits class T, see x86/matmul_avx2.cc and
// x86/matmul_avx512.cc). Per (row, column) the float work is exactly the reference's:
//   for each block b:  acc = fma(d_w * d_x, float(isum_b), acc)
// where isum_b is an exact integer (its partial sums may be formed in any order). So every
// tile shape gives bit-identical results and the kernels match reference::MatMul bit for bit.
//
// Included only by x86/matmul_*.cc, each compiled with its own ISA flags; everything here is a
// template instantiated with that file's own traits, so no code is shared across ISA flags.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "chorus/kernels/matmul_internal.h"

// Fully unrolls the small fixed-trip loops over tile rows/columns/k-groups so accumulators live
// in registers (GCC leaves them in memory otherwise once tiles are inlined into the driver).
#define CHORUS_UNROLL _Pragma("GCC unroll 16")
// The k-group loop is kept rolled: unrolled, GCC hoists every group's loads and spills.
#ifndef CHORUS_KGROUP_UNROLL
#define CHORUS_KGROUP_UNROLL _Pragma("GCC unroll 1")
#endif

namespace chorus::kernels::internal::qtile {

static inline int32_t Load32(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Software prefetch distance along a tile's weight stream (0 = none). A batch-1 tile reads a
// whole panel as one contiguous stream, which the hardware prefetcher follows on its own;
// measured on Zen 4, software prefetches on top of it only cost load slots.
#ifndef CHORUS_QTILE_PREFETCH
#define CHORUS_QTILE_PREFETCH 0
#endif
inline constexpr int64_t kPrefetchBytes = CHORUS_QTILE_PREFETCH;

template <class T, bool kQ4, int R, int C>
__attribute__((noinline)) void Tile(const uint8_t* packed, int64_t panel_bytes, int64_t nb,
                                    int64_t v0, const QRows& q, int64_t r0, float* y,
                                    int64_t y_stride, int64_t n, bool accumulate) {
  constexpr int kL = T::kLanes;
  constexpr int kVpp = kPanelCols / kL;  // column vectors per panel
  constexpr int kLayout = kQ4 ? kLayoutQ4Panel : kLayoutQ8Panel;
  constexpr int64_t kBlkB = BlockBytes(kLayout);
  // Column vector c of the tile: its bytes of block 0's chunk 0, and its block-0 scales.
  const uint8_t* wq[C];
  const uint8_t* wd[C];
  CHORUS_UNROLL
  for (int c = 0; c < C; ++c) {
    const int64_t v = v0 + c, p = v / kVpp, h = v % kVpp;
    const uint8_t* base = packed + p * panel_bytes;
    wq[c] = base + h * kL * 4;
    wd[c] = base + QsBlockBytes(kLayout) + h * kL * 2;
  }
  const int8_t* xr[R];
  const QMeta* mr[R];
  CHORUS_UNROLL
  for (int r = 0; r < R; ++r) {
    xr[r] = q.qs + (r0 + r) * q.qs_stride;
    mr[r] = q.meta + (r0 + r) * q.meta_stride;
  }
  typename T::F acc[R][C];
  CHORUS_UNROLL
  for (int r = 0; r < R; ++r) {
    CHORUS_UNROLL
    for (int c = 0; c < C; ++c) acc[r][c] = T::FZero();
  }

  for (int64_t b = 0; b < nb; ++b) {
    typename T::I ia[R][C];
    CHORUS_UNROLL
    for (int r = 0; r < R; ++r) {
      const typename T::I init = T::template Init<kQ4>(&mr[r][b].corr);
      CHORUS_UNROLL
      for (int c = 0; c < C; ++c) ia[r][c] = init;
    }
    if constexpr (kPrefetchBytes > 0) {  // the tile's vectors share one panel's stream
      for (int64_t off = 0; off < kBlkB; off += 64)
        __builtin_prefetch(wq[0] + b * kBlkB + off + kPrefetchBytes);
    }
    if constexpr (kQ4) {
      CHORUS_KGROUP_UNROLL
      for (int j = 0; j < 4; ++j) {
        typename T::W lo[C], hi[C];
        CHORUS_UNROLL
        for (int c = 0; c < C; ++c) T::PrepQ4(wq[c] + b * kBlkB + j * kChunkBytes, &lo[c], &hi[c]);
        CHORUS_UNROLL
        for (int r = 0; r < R; ++r) {
          const typename T::I x0 = T::Bcast(Load32(xr[r] + b * 32 + 8 * j));
          const typename T::I x1 = T::Bcast(Load32(xr[r] + b * 32 + 8 * j + 4));
          CHORUS_UNROLL
          for (int c = 0; c < C; ++c) {
            ia[r][c] = T::DotQ4(ia[r][c], lo[c], x0);
            ia[r][c] = T::DotQ4(ia[r][c], hi[c], x1);
          }
        }
      }
    } else {
      CHORUS_KGROUP_UNROLL
      for (int g = 0; g < 8; ++g) {
        typename T::W wv[C];
        CHORUS_UNROLL
        for (int c = 0; c < C; ++c) wv[c] = T::PrepQ8(wq[c] + b * kBlkB + g * kChunkBytes);
        CHORUS_UNROLL
        for (int r = 0; r < R; ++r) {
          const typename T::I xg = T::Bcast(Load32(xr[r] + b * 32 + 4 * g));
          CHORUS_UNROLL
          for (int c = 0; c < C; ++c) ia[r][c] = T::DotQ8(ia[r][c], wv[c], xg);
        }
      }
    }
    typename T::F dw[C];
    CHORUS_UNROLL
    for (int c = 0; c < C; ++c)
      dw[c] = T::Scales(reinterpret_cast<const uint16_t*>(wd[c] + b * kBlkB));
    CHORUS_UNROLL
    for (int r = 0; r < R; ++r) {
      const QMeta* mt = &mr[r][b];
      const typename T::F dx = T::FBcast(mt->d);
      CHORUS_UNROLL
      for (int c = 0; c < C; ++c) {
        const typename T::F isum = T::Cvt(T::template Finish<kQ4>(ia[r][c], &mt->corr));
        acc[r][c] = T::Fma(T::Mul(dw[c], dx), isum, acc[r][c]);
      }
    }
  }
  CHORUS_UNROLL
  for (int r = 0; r < R; ++r) {
    CHORUS_UNROLL
    for (int c = 0; c < C; ++c) {
      const int64_t col0 = (v0 + c) * kL;
      const int64_t valid = std::min<int64_t>(kL, n - col0);
      if (valid <= 0) continue;
      T::Store(y + (r0 + r) * y_stride + col0, acc[r][c], static_cast<int>(valid), accumulate);
    }
  }
}

template <class T, bool kQ4, int R, int C = T::kMaxC>
inline void DispatchC(int cc, const uint8_t* packed, int64_t panel_bytes, int64_t nb, int64_t v0,
                      const QRows& q, int64_t r0, float* y, int64_t y_stride, int64_t n,
                      bool accumulate) {
  if (cc == C) {
    Tile<T, kQ4, R, C>(packed, panel_bytes, nb, v0, q, r0, y, y_stride, n, accumulate);
  } else if constexpr (C > 1) {
    DispatchC<T, kQ4, R, C - 1>(cc, packed, panel_bytes, nb, v0, q, r0, y, y_stride, n, accumulate);
  }
}

template <class T, bool kQ4, int R = T::kMaxR>
inline void Dispatch(int rr, int cc, const uint8_t* packed, int64_t panel_bytes, int64_t nb,
                     int64_t v0, const QRows& q, int64_t r0, float* y, int64_t y_stride, int64_t n,
                     bool accumulate) {
  if (rr == R) {
    DispatchC<T, kQ4, R>(cc, packed, panel_bytes, nb, v0, q, r0, y, y_stride, n, accumulate);
  } else if constexpr (R > 1) {
    Dispatch<T, kQ4, R - 1>(rr, cc, packed, panel_bytes, nb, v0, q, r0, y, y_stride, n, accumulate);
  }
}

// One activation row against whole panels [p0, p1), block by block and, inside a block, chunk
// by chunk over all the panel's column vectors: every byte of a panel is read once, in address
// order. For ISAs whose
// register tile covers only part of a panel (AVX2: 2 of its 8 vectors), Tile would pass over
// each panel several times reading one cache line in four, which the hardware prefetcher
// serves badly (batch-1 decode ~1.5x slower).
// Per (row, column) the float work is Tile's (fma per block, in block order): same bits.
template <class T, bool kQ4>
__attribute__((noinline)) void RowPanels(const uint8_t* packed, int64_t panel_bytes, int64_t nb,
                                         int64_t p0, int64_t p1, const QRows& q, int64_t r,
                                         float* y_row, int64_t n, bool accumulate) {
  constexpr int kL = T::kLanes;
  constexpr int kVpp = kPanelCols / kL;
  constexpr int kLayout = kQ4 ? kLayoutQ4Panel : kLayoutQ8Panel;
  constexpr int64_t kBlkB = BlockBytes(kLayout);
  const int8_t* xr = q.qs + r * q.qs_stride;
  const QMeta* mr = q.meta + r * q.meta_stride;
  for (int64_t p = p0; p < p1; ++p) {
    const uint8_t* panel = packed + p * panel_bytes;
    typename T::F acc[kVpp];
    CHORUS_UNROLL
    for (int h = 0; h < kVpp; ++h) acc[h] = T::FZero();
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = panel + b * kBlkB;
      const int8_t* xb = xr + b * 32;
      // Chunk by chunk (256 contiguous bytes = all kVpp vectors of one k-group), so the block is
      // read in address order; the kVpp integer sums stay in registers.
      typename T::I ia[kVpp];
      CHORUS_UNROLL
      for (int h = 0; h < kVpp; ++h) ia[h] = T::template Init<kQ4>(&mr[b].corr);
      if constexpr (kQ4) {
        CHORUS_KGROUP_UNROLL
        for (int j = 0; j < 4; ++j) {
          const typename T::I x0 = T::Bcast(Load32(xb + 8 * j));
          const typename T::I x1 = T::Bcast(Load32(xb + 8 * j + 4));
          CHORUS_UNROLL
          for (int h = 0; h < kVpp; ++h) {
            typename T::W lo, hi;
            T::PrepQ4(blk + j * kChunkBytes + h * kL * 4, &lo, &hi);
            ia[h] = T::DotQ4(ia[h], lo, x0);
            ia[h] = T::DotQ4(ia[h], hi, x1);
          }
        }
      } else {
        CHORUS_KGROUP_UNROLL
        for (int g = 0; g < 8; ++g) {
          const typename T::I xg = T::Bcast(Load32(xb + 4 * g));
          CHORUS_UNROLL
          for (int h = 0; h < kVpp; ++h) {
            const typename T::W w = T::PrepQ8(blk + g * kChunkBytes + h * kL * 4);
            ia[h] = T::DotQ8(ia[h], w, xg);
          }
        }
      }
      const typename T::F dx = T::FBcast(mr[b].d);
      CHORUS_UNROLL
      for (int h = 0; h < kVpp; ++h) {
        const typename T::F dw =
            T::Scales(reinterpret_cast<const uint16_t*>(blk + QsBlockBytes(kLayout) + h * kL * 2));
        const typename T::F isum = T::Cvt(T::template Finish<kQ4>(ia[h], &mr[b].corr));
        acc[h] = T::Fma(T::Mul(dw, dx), isum, acc[h]);
      }
    }
    CHORUS_UNROLL
    for (int h = 0; h < kVpp; ++h) {
      const int64_t col0 = p * kPanelCols + h * kL;
      const int64_t valid = std::min<int64_t>(kL, n - col0);
      if (valid > 0) T::Store(y_row + col0, acc[h], static_cast<int>(valid), accumulate);
    }
  }
}

// y[0..m, 64*p0 .. min(n, 64*p1)): column blocks sized for L2, rows in register tiles inside.
template <class T, bool kQ4>
void Panels(const uint8_t* packed, int64_t n, int64_t k, const QRows& q, int64_t m, int64_t p0,
            int64_t p1, float* y, int64_t y_stride, bool accumulate) {
  if (T::kRowPanels && m == 1) {
    const int layout1 = kQ4 ? kLayoutQ4Panel : kLayoutQ8Panel;
    RowPanels<T, kQ4>(packed, PanelBytes(layout1, k / 32), k / 32, p0, p1, q, 0, y, n, accumulate);
    return;
  }
  constexpr int kL = T::kLanes;
  constexpr int kVpp = kPanelCols / kL;
  const int layout = kQ4 ? kLayoutQ4Panel : kLayoutQ8Panel;
  const int64_t nb = k / 32;
  const int64_t panel_bytes = PanelBytes(layout, nb);
  const int64_t v0 = p0 * kVpp;
  const int64_t v1 = std::min<int64_t>(p1 * kVpp, (n + kL - 1) / kL);  // skip padding vectors
  // Column block: the weights of one block stay in L2 while all row tiles pass over them.
  const int64_t vec_bytes = panel_bytes / kVpp;
  const int64_t nc = std::max<int64_t>(T::kMaxC, (T::kL2Budget / vec_bytes) / T::kMaxC * T::kMaxC);
  for (int64_t vb = v0; vb < v1; vb += nc) {
    const int64_t ve = std::min(v1, vb + nc);
    for (int64_t r0 = 0; r0 < m; r0 += T::kMaxR) {
      const int rr = static_cast<int>(std::min<int64_t>(T::kMaxR, m - r0));
      const int cmax = T::CFor(rr);
      for (int64_t v = vb; v < ve; v += cmax) {
        const int cc = static_cast<int>(std::min<int64_t>(cmax, ve - v));
        Dispatch<T, kQ4>(rr, cc, packed, panel_bytes, nb, v, q, r0, y, y_stride, n, accumulate);
      }
    }
  }
}

}  // namespace chorus::kernels::internal::qtile
