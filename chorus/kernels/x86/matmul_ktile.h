// The K-quant GEMM skeleton shared by the AVX2 and AVX-512 kernels: a register tile of R
// activation rows × C column vectors over the super-block panels of matmul_internal.h.
//
// Per (row, column) and super-block the integer work is exact and its float work is the
// reference's (reference/matmul.cc, KCols):
//   isum = Σ_j S_j · Σ_{e∈j} q_e·x_e      msum = Σ_j N_j · Σ_{e∈j} x_e
//   with mins (q2_k, q4_k, q5_k): acc = fma(D·dx, isum, acc); acc = fma(−(M·dx), msum, acc)
//   without (q3_k, q6_k):         acc = fma(D·dx, isum − msum, acc)
// so every tile shape and both ISAs give the reference's bits.
//
// The codes of two k-groups at a time are rebuilt from the planes into unsigned bytes (lanes =
// columns, 4 consecutive k per 32-bit lane) and multiplied with a broadcast of 4 activation
// bytes: AVX-512 with vpdpbusd into an int32 sum per sub-block, scaled by S_j with vpmulld;
// AVX2 with vpmaddubsw pairs summed in int16 (as long as they cannot overflow: T::MaxGroups)
// and scaled by S_j with vpmaddwd. msum is vpdpwssd / vpmaddwd of (N_2i, N_2i+1) pairs against
// broadcast pairs of activation group sums.
//
// Included only by x86/matmul_*.cc, each compiled with its own ISA flags.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "chorus/kernels/matmul_internal.h"
#include "chorus/kernels/x86/matmul_qtile.h"

namespace chorus::kernels::internal::ktile {

using qtile::Load32;

inline int32_t Load32(const int16_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Largest code of a layout (its bound for the int16 sums of AVX2).
constexpr int KMaxCode(int layout) {
  return layout == kLayoutQ2K   ? 3
         : layout == kLayoutQ3K ? 7
         : layout == kLayoutQ4K ? 15
         : layout == kLayoutQ5K ? 31
                                : 63;
}

// Codes of k-groups 2·gp and 2·gp + 1 (gp = 4u + kG4) of column vector at `blk` + h·kL·4 (the
// super-block's base for this vector's bytes).
template <class T, int kLayout, int kG4>
inline void Codes(const uint8_t* vb, int64_t u, typename T::I* lo, typename T::I* hi) {
  using I = typename T::I;
  if constexpr (KHasNibbles(kLayout)) {
    const I v = T::Load(vb + KNibOff(kLayout) + (4 * u + kG4) * kChunkBytes);
    *lo = T::And(v, T::Set8(0x0f));
    *hi = T::And(T::template Shift<-4>(v), T::Set8(0x0f));
    if constexpr (kLayout == kLayoutQ6K) {  // bits 4-5 from the crumbs
      const I cv = T::Load(vb + KCrumbOff(kLayout) + (2 * u + kG4 / 2) * kChunkBytes);
      constexpr int s = 2 * (kG4 % 2);  // crumb field of group 2·gp
      *lo = T::Or(*lo, T::And(T::template Shift<4 - 2 * s>(cv), T::Set8(0x30)));
      *hi = T::Or(*hi, T::And(T::template Shift<2 - 2 * s>(cv), T::Set8(0x30)));
    } else if constexpr (kLayout == kLayoutQ5K) {  // bit 4 from the bit plane
      const I bv = T::Load(vb + KBitOff(kLayout) + u * kChunkBytes);
      constexpr int s = 2 * kG4;
      *lo = T::Or(*lo, T::And(T::template Shift<4 - s>(bv), T::Set8(0x10)));
      *hi = T::Or(*hi, T::And(T::template Shift<3 - s>(bv), T::Set8(0x10)));
    }
  } else {  // q2_k, q3_k: bits 0-1 from the crumbs
    const I cv = T::Load(vb + KCrumbOff(kLayout) + (2 * u + kG4 / 2) * kChunkBytes);
    constexpr int s = 2 * (kG4 % 2);
    *lo = T::And(T::template Shift<-2 * s>(cv), T::Set8(0x03));
    *hi = T::And(T::template Shift<-2 * s - 2>(cv), T::Set8(0x03));
    if constexpr (kLayout == kLayoutQ3K) {  // bit 2 from the bit plane
      const I bv = T::Load(vb + KBitOff(kLayout) + u * kChunkBytes);
      constexpr int b = 2 * kG4;
      *lo = T::Or(*lo, T::And(T::template Shift<2 - b>(bv), T::Set8(0x04)));
      *hi = T::Or(*hi, T::And(T::template Shift<1 - b>(bv), T::Set8(0x04)));
    }
  }
}

template <class T, int kLayout, int R, int C>
__attribute__((noinline)) void Tile(const uint8_t* packed, int64_t panel_bytes, int64_t nsb,
                                    int64_t v0, const QRows& q, int64_t r0, float* y,
                                    int64_t y_stride, int64_t n, bool accumulate) {
  using I = typename T::I;
  using F = typename T::F;
  constexpr int kL = T::kLanes;
  constexpr int kVpp = kPanelCols / kL;
  constexpr int64_t kBlk = KBlockBytes(kLayout);
  constexpr int kSub = KSubBlocks(kLayout);
  constexpr int kSubGroups = 256 / kSub / 4;  // k-groups per sub-block: 4 or 8
  // k-groups whose partial sums may be added before scaling (AVX2: int16 bound).
  constexpr int kFlush = std::min(kSubGroups, T::MaxGroups(KMaxCode(kLayout)));
  static_assert(kFlush % 2 == 0 && kSubGroups % kFlush == 0);

  const uint8_t* vb[C];  // column vector c's bytes in super-block 0
  int64_t hoff[C];       // its offset in the S/N pair rows (int8 pairs) and D/M (f16)
  CHORUS_UNROLL
  for (int c = 0; c < C; ++c) {
    const int64_t v = v0 + c, p = v / kVpp, h = v % kVpp;
    vb[c] = packed + p * panel_bytes + h * kL * 4;
    hoff[c] = p * panel_bytes + h * kL * 2;
  }
  const int8_t* xr[R];
  const QMetaK* mr[R];
  CHORUS_UNROLL
  for (int r = 0; r < R; ++r) {
    xr[r] = q.qs + (r0 + r) * q.qs_stride;
    mr[r] = KMetaRow(q, r0 + r);
  }
  F acc[R][C];
  CHORUS_UNROLL
  for (int r = 0; r < R; ++r) {
    CHORUS_UNROLL
    for (int c = 0; c < C; ++c) acc[r][c] = T::FZero();
  }

  for (int64_t s = 0; s < nsb; ++s) {
    I isum[R][C], ij[R][C];
    CHORUS_UNROLL
    for (int r = 0; r < R; ++r) {
      CHORUS_UNROLL
      for (int c = 0; c < C; ++c) isum[r][c] = ij[r][c] = T::Zero();
    }
    const int64_t sb = s * kBlk;
    // Scales ij by S of sub-block j into isum and clears ij.
    auto flush = [&](int64_t j) {
      CHORUS_UNROLL
      for (int c = 0; c < C; ++c) {
        const I sv = T::SVec(reinterpret_cast<const int8_t*>(
                                 packed + hoff[c] + sb + KSOff(kLayout) + (j / 2) * 2 * kPanelCols),
                             static_cast<int>(j & 1));
        CHORUS_UNROLL
        for (int r = 0; r < R; ++r) {
          isum[r][c] = T::Flush(isum[r][c], ij[r][c], sv);
          ij[r][c] = T::Zero();
        }
      }
    };
    auto groups = [&](auto g4, int64_t u) {
      constexpr int kG4 = decltype(g4)::value;
      CHORUS_UNROLL
      for (int c = 0; c < C; ++c) {
        I lo, hi;
        Codes<T, kLayout, kG4>(vb[c] + sb, u, &lo, &hi);
        CHORUS_UNROLL
        for (int r = 0; r < R; ++r) {
          const int8_t* xp = xr[r] + s * 256 + 32 * u + 8 * kG4;
          ij[r][c] = T::Dot(ij[r][c], lo, T::Bcast(Load32(xp)));
          ij[r][c] = T::Dot(ij[r][c], hi, T::Bcast(Load32(xp + 4)));
        }
      }
      // After this pair, 8u + kEnd k-groups of the super-block are done; flush every kFlush
      // groups with the S of the sub-block they belong to.
      constexpr int kEnd = 2 * kG4 + 2;
      if constexpr (kEnd % kFlush == 0) flush((8 * u + kEnd - 1) / kSubGroups);
    };
    CHORUS_KGROUP_UNROLL
    for (int64_t u = 0; u < 8; ++u) {  // 32 k per unit
      groups(std::integral_constant<int, 0>{}, u);
      groups(std::integral_constant<int, 1>{}, u);
      groups(std::integral_constant<int, 2>{}, u);
      groups(std::integral_constant<int, 3>{}, u);
    }
    // msum and the float epilogue, per column vector.
    CHORUS_UNROLL
    for (int c = 0; c < C; ++c) {
      const uint8_t* base = packed + hoff[c] + sb;
      I npair[kSub / 2];
      CHORUS_UNROLL
      for (int i = 0; i < kSub / 2; ++i) {
        if constexpr (KHasMins(kLayout)) {
          npair[i] = T::PairVec(
              reinterpret_cast<const int8_t*>(base + KNOff(kLayout) + i * 2 * kPanelCols));
        } else {
          const I sp = T::PairVec(
              reinterpret_cast<const int8_t*>(base + KSOff(kLayout) + i * 2 * kPanelCols));
          npair[i] = T::template Shl16 < kLayout == kLayoutQ6K ? 5 : 2 > (sp);
        }
      }
      const F dw = T::Scales(reinterpret_cast<const uint16_t*>(base + KDOff(kLayout)));
      F mw = T::FZero();
      if constexpr (KHasMins(kLayout))
        mw = T::Scales(reinterpret_cast<const uint16_t*>(base + KMOff(kLayout)));
      CHORUS_UNROLL
      for (int r = 0; r < R; ++r) {
        const QMetaK& mt = mr[r][s];
        I msum = T::Zero();
        CHORUS_UNROLL
        for (int i = 0; i < kSub / 2; ++i) {
          const int32_t xp = kSub == 8 ? Load32(mt.s32 + 2 * i) : Load32(mt.s16 + 2 * i);
          msum = T::DotPairs(msum, npair[i], T::Bcast(xp));
        }
        const F dx = T::FBcast(mt.d);
        if constexpr (KHasMins(kLayout)) {
          acc[r][c] = T::Fma(T::Mul(dw, dx), T::Cvt(isum[r][c]), acc[r][c]);
          acc[r][c] = T::Fnma(T::Mul(mw, dx), T::Cvt(msum), acc[r][c]);
        } else {
          acc[r][c] = T::Fma(T::Mul(dw, dx), T::Cvt(T::Sub(isum[r][c], msum)), acc[r][c]);
        }
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

template <class T, int kLayout, int R, int C = T::kKMaxC>
inline void DispatchC(int cc, const uint8_t* packed, int64_t panel_bytes, int64_t nsb, int64_t v0,
                      const QRows& q, int64_t r0, float* y, int64_t y_stride, int64_t n,
                      bool accumulate) {
  if (cc == C) {
    Tile<T, kLayout, R, C>(packed, panel_bytes, nsb, v0, q, r0, y, y_stride, n, accumulate);
  } else if constexpr (C > 1) {
    DispatchC<T, kLayout, R, C - 1>(cc, packed, panel_bytes, nsb, v0, q, r0, y, y_stride, n,
                                    accumulate);
  }
}

template <class T, int kLayout, int R = T::kKMaxR>
inline void Dispatch(int rr, int cc, const uint8_t* packed, int64_t panel_bytes, int64_t nsb,
                     int64_t v0, const QRows& q, int64_t r0, float* y, int64_t y_stride, int64_t n,
                     bool accumulate) {
  if (rr == R) {
    DispatchC<T, kLayout, R>(cc, packed, panel_bytes, nsb, v0, q, r0, y, y_stride, n, accumulate);
  } else if constexpr (R > 1) {
    Dispatch<T, kLayout, R - 1>(rr, cc, packed, panel_bytes, nsb, v0, q, r0, y, y_stride, n,
                                accumulate);
  }
}

// Software prefetch of the super-block this many ahead, a share of its lines in each of the 32
// k-group steps of the current one (0 = none), into L2 (prefetcht1). Unlike a q4_0 panel (one
// stream of identical blocks, which the hardware prefetcher follows at memory speed), a K
// super-block is several regions (codes, high-bit planes, sub-block scales) read at different
// paces, and a streamed one-row matmul ran as if every miss were waited for. Not into L1
// (prefetcht0): two super-blocks ahead are 19–27 KB, most of this host's 32 KB L1D, and there
// they measured slower (likely evicting what is being read). One thread from DRAM
// (`matmul_bench stream/<type>/threads:1`, docs/kernels.md "Row-path prefetch"): no prefetch →
// into L1 → into L2, q4_k 16.6 → 17.6–18.3 → 21.3–23.9 GB/s, q6_k 11.7 → 15.8 → 21.9–23.4;
// other distances (1–8 blocks) gave no more than 2.
#ifndef CHORUS_KROW_PREFETCH
#define CHORUS_KROW_PREFETCH 2
#endif
inline constexpr int64_t kRowPrefetchBlocks = CHORUS_KROW_PREFETCH;
inline constexpr int kRowPrefetchLocality = 2;

// One activation row against whole panels [p0, p1): the batch-1 (decode) path, the K-quant
// counterpart of qtile::RowPanels. Each super-block of a panel is read once, in address order:
// chunk by chunk over all the panel's column vectors (the codes), then the S, N, D, M rows of
// the same super-block in the epilogue. Tile covers only kKMaxC of a panel's vectors (AVX2: 2
// of 8), so on one row it passed over every panel kVpp / kKMaxC times, reading a quarter of each
// 256-byte chunk per pass (docs/kernels.md, "The K-quant matmul").
// With T::kKRowSplit the low and high k-group of every chunk accumulate into separate sums
// (two independent vpdpbusd chains per vector instead of one: a single row has no other rows
// to hide the instruction's latency behind), added before the sub-block's scale multiply.
// The integer sums are exact whatever their order, and the float work per (column,
// super-block) is Tile's: same bits as Tile and the reference.
template <class T, int kLayout>
__attribute__((noinline)) void RowPanels(const uint8_t* packed, int64_t panel_bytes, int64_t nsb,
                                         int64_t p0, int64_t p1, const QRows& q, float* y_row,
                                         int64_t n, bool accumulate) {
  using I = typename T::I;
  using F = typename T::F;
  constexpr int kL = T::kLanes;
  constexpr int kVpp = kPanelCols / kL;
  constexpr int64_t kBlk = KBlockBytes(kLayout);
  constexpr int kSub = KSubBlocks(kLayout);
  constexpr int kSubGroups = 256 / kSub / 4;
  constexpr int kFlush = std::min(kSubGroups, T::MaxGroups(KMaxCode(kLayout)));
  static_assert(kFlush % 2 == 0 && kSubGroups % kFlush == 0);
  constexpr bool kSplit = T::kKRowSplit;
  const int8_t* xr = q.qs;
  const QMetaK* mr = KMetaRow(q, 0);
  for (int64_t p = p0; p < p1; ++p) {
    const uint8_t* panel = packed + p * panel_bytes;
    F acc[kVpp];
    CHORUS_UNROLL
    for (int h = 0; h < kVpp; ++h) acc[h] = T::FZero();
    for (int64_t s = 0; s < nsb; ++s) {
      const uint8_t* blk = panel + s * kBlk;
      const int8_t* xs = xr + s * 256;
      I isum[kVpp], ilo[kVpp], ihi[kVpp];
      CHORUS_UNROLL
      for (int h = 0; h < kVpp; ++h) isum[h] = ilo[h] = ihi[h] = T::Zero();
      auto flush = [&](int64_t j) {
        CHORUS_UNROLL
        for (int h = 0; h < kVpp; ++h) {
          const I sv = T::SVec(reinterpret_cast<const int8_t*>(
                                   blk + KSOff(kLayout) + (j / 2) * 2 * kPanelCols + h * kL * 2),
                               static_cast<int>(j & 1));
          const I part = kSplit ? T::AddSums(ilo[h], ihi[h]) : ilo[h];
          isum[h] = T::Flush(isum[h], part, sv);
          ilo[h] = ihi[h] = T::Zero();
        }
      };
      auto groups = [&](auto g4, int64_t u) {
        constexpr int kG4 = decltype(g4)::value;
        if constexpr (kRowPrefetchBlocks > 0) {
          // This call's share of the super-block kRowPrefetchBlocks ahead (32 calls a block).
          constexpr int64_t kLines = (kBlk + 63) / 64, kPer = (kLines + 31) / 32;
          const int64_t i = 4 * u + kG4;
          const uint8_t* ahead = blk + kRowPrefetchBlocks * kBlk + i * kPer * 64;
          CHORUS_UNROLL
          for (int64_t l = 0; l < kPer; ++l) {
            if (i * kPer + l < kLines) __builtin_prefetch(ahead + l * 64, 0, kRowPrefetchLocality);
          }
        }
        const int8_t* xp = xs + 32 * u + 8 * kG4;
        const I x0 = T::Bcast(Load32(xp));
        const I x1 = T::Bcast(Load32(xp + 4));
        CHORUS_UNROLL
        for (int h = 0; h < kVpp; ++h) {
          I lo, hi;
          Codes<T, kLayout, kG4>(blk + h * kL * 4, u, &lo, &hi);
          ilo[h] = T::Dot(ilo[h], lo, x0);
          if constexpr (kSplit) {
            ihi[h] = T::Dot(ihi[h], hi, x1);
          } else {
            ilo[h] = T::Dot(ilo[h], hi, x1);
          }
        }
        constexpr int kEnd = 2 * kG4 + 2;
        if constexpr (kEnd % kFlush == 0) flush((8 * u + kEnd - 1) / kSubGroups);
      };
      CHORUS_KGROUP_UNROLL
      for (int64_t u = 0; u < 8; ++u) {
        groups(std::integral_constant<int, 0>{}, u);
        groups(std::integral_constant<int, 1>{}, u);
        groups(std::integral_constant<int, 2>{}, u);
        groups(std::integral_constant<int, 3>{}, u);
      }
      const QMetaK& mt = mr[s];
      I xpair[kSub / 2];
      CHORUS_UNROLL
      for (int i = 0; i < kSub / 2; ++i)
        xpair[i] = T::Bcast(kSub == 8 ? Load32(mt.s32 + 2 * i) : Load32(mt.s16 + 2 * i));
      const F dx = T::FBcast(mt.d);
      CHORUS_UNROLL
      for (int h = 0; h < kVpp; ++h) {
        const uint8_t* base = blk + h * kL * 2;
        I msum = T::Zero();
        CHORUS_UNROLL
        for (int i = 0; i < kSub / 2; ++i) {
          I npair;
          if constexpr (KHasMins(kLayout)) {
            npair = T::PairVec(
                reinterpret_cast<const int8_t*>(base + KNOff(kLayout) + i * 2 * kPanelCols));
          } else {
            const I sp = T::PairVec(
                reinterpret_cast<const int8_t*>(base + KSOff(kLayout) + i * 2 * kPanelCols));
            npair = T::template Shl16 < kLayout == kLayoutQ6K ? 5 : 2 > (sp);
          }
          msum = T::DotPairs(msum, npair, xpair[i]);
        }
        const F dw = T::Scales(reinterpret_cast<const uint16_t*>(base + KDOff(kLayout)));
        if constexpr (KHasMins(kLayout)) {
          const F mw = T::Scales(reinterpret_cast<const uint16_t*>(base + KMOff(kLayout)));
          acc[h] = T::Fma(T::Mul(dw, dx), T::Cvt(isum[h]), acc[h]);
          acc[h] = T::Fnma(T::Mul(mw, dx), T::Cvt(msum), acc[h]);
        } else {
          acc[h] = T::Fma(T::Mul(dw, dx), T::Cvt(T::Sub(isum[h], msum)), acc[h]);
        }
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

// y[0..m, 64*p0 .. min(n, 64*p1)): column blocks sized for L2, rows in register tiles inside
// (the structure of qtile::Panels).
template <class T, int kLayout>
void Panels(const uint8_t* packed, int64_t n, int64_t k, const QRows& q, int64_t m, int64_t p0,
            int64_t p1, float* y, int64_t y_stride, bool accumulate) {
  constexpr int kL = T::kLanes;
  constexpr int kVpp = kPanelCols / kL;
  const int64_t nsb = k / 256;
  const int64_t panel_bytes = KPanelBytes(kLayout, k);
  if (m == 1) {
    RowPanels<T, kLayout>(packed, panel_bytes, nsb, p0, p1, q, y, n, accumulate);
    return;
  }
  const int64_t v0 = p0 * kVpp;
  const int64_t v1 = std::min<int64_t>(p1 * kVpp, (n + kL - 1) / kL);
  const int64_t vec_bytes = panel_bytes / kVpp;
  const int64_t nc =
      std::max<int64_t>(T::kKMaxC, (T::kL2Budget / vec_bytes) / T::kKMaxC * T::kKMaxC);
  for (int64_t vb = v0; vb < v1; vb += nc) {
    const int64_t ve = std::min(v1, vb + nc);
    for (int64_t r0 = 0; r0 < m; r0 += T::kKMaxR) {
      const int rr = static_cast<int>(std::min<int64_t>(T::kKMaxR, m - r0));
      for (int64_t v = vb; v < ve; v += T::kKMaxC) {
        const int cc = static_cast<int>(std::min<int64_t>(T::kKMaxC, ve - v));
        Dispatch<T, kLayout>(rr, cc, packed, panel_bytes, nsb, v, q, r0, y, y_stride, n,
                             accumulate);
      }
    }
  }
}

template <class T>
void AnyPanels(int layout, const uint8_t* packed, int64_t n, int64_t k, const QRows& q, int64_t m,
               int64_t p0, int64_t p1, float* y, int64_t y_stride, bool accumulate) {
  switch (layout) {
    case kLayoutQ2K:
      return Panels<T, kLayoutQ2K>(packed, n, k, q, m, p0, p1, y, y_stride, accumulate);
    case kLayoutQ3K:
      return Panels<T, kLayoutQ3K>(packed, n, k, q, m, p0, p1, y, y_stride, accumulate);
    case kLayoutQ4K:
      return Panels<T, kLayoutQ4K>(packed, n, k, q, m, p0, p1, y, y_stride, accumulate);
    case kLayoutQ5K:
      return Panels<T, kLayoutQ5K>(packed, n, k, q, m, p0, p1, y, y_stride, accumulate);
    default:
      return Panels<T, kLayoutQ6K>(packed, n, k, q, m, p0, p1, y, y_stride, accumulate);
  }
}

}  // namespace chorus::kernels::internal::ktile
