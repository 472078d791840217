// Internal: the tiled attention kernels of attention.h, written once over a vector type and
// compiled per ISA level (x86/attention_avx512.cc: 16 lanes, x86/attention_avx2.cc: 8 lanes,
// attention.cc: 1 lane for the scalar level). Everything has internal linkage, so each file
// compiles its own copy with its own ISA flags.
//
// Rows are (token, head) pairs of a block, row r = token r / group, head r % group. Scores are
// laid out key-major with rows in vector lanes ([key][row]), so the scores of a row never meet
// another row's in a reduction: max, exp and sums run across keys, lane by lane. A lane's
// arithmetic is therefore the same whichever block, lane or vector width... of its level it sits
// in (attention.h, "batch invariance"). Per tile:
//   QK: s[c][r] = Σ_d qt[d][r] · K_c[d]   (qt = scale · q transposed once per block; K_c[d]
//       broadcast straight from the cache, so K is never transposed)
//   softmax: lane-wise max over the tile's keys, exp, key-ordered sum; running (m, l) per row
//   PV: o[r][:] = o[r][:] · alpha[r] + Σ_c p[c][r] · V_c[:] per token (its heads share the mask)
//
// A block of one token (a decode row) over K in columns (PagedKv::k_columns, KvCache's layout)
// at 16 or 8 lanes takes the column decode instead (ColumnChunk): element d of W consecutive
// keys is one vector in the cache, so keys go in lanes — for each chunk of up to 8 heads (2 at 8
// lanes), acc[h][j] += (scale·q[h][d] broadcast) · K[d][keys jW … jW + W − 1] over d from
// zero, the very FMA chain
// of the key-major tile (a product's operands commute), so each score has the same bits and no
// K is copied or packed. The online softmax runs on those vectors with Softmax()'s operations in
// its order (a head's max over its keys is exact in any order; exp lane by lane; the sum in key
// order over the probabilities transposed to [key][row], which is also what PV reads), so a
// decode row stays bit-identical to the same token inside a prefill block (the batch-invariance
// rule, attention.h).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <type_traits>

#include "chorus/kernels/attention.h"

namespace chorus::kernels::attention_internal {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// Rows of a block are padded to a multiple of this (the widest level's lanes), so that the
// scratch size does not depend on the level.
constexpr int64_t kRowPad = 16;
// Decode rows prefetch K and V ahead of use (BlockKernel::Tile): the column decode spreads the
// lines of the tile kPrefetchTiles ahead over its QK and PV loops; other decode rows ask for
// all of the next tile's lines at once.
constexpr bool kPrefetchNext = true;
constexpr int64_t kPrefetchTiles = 2;
// Lines of one planned tile (K and V); beyond it (wide token-major rows) nothing is prefetched.
constexpr int64_t kPrefetchLines = 512;

inline int64_t RoundUp(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// bf16 bits of f, rounded to nearest even (NaN stays a quiet NaN); a pair of them in one
// 32-bit word, `lo` in the low half (the element vdpbf16ps multiplies second).
inline uint32_t Bf16Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x40u;
  return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}
inline uint32_t Bf16Pair(float lo, float hi) { return Bf16Bits(lo) | Bf16Bits(hi) << 16; }

// Scratch of a block of r rows (rp = r padded), carved from the caller's buffer.
struct Scratch {
  float* qt;        // [head_dim][rp] scale·q, transposed (column decode: qc[chunk][head_dim][8])
  float* s;         // [kAttentionTile][rp] scores, then probabilities, of the current tile
  float* m;         // [rp] running max of the current segment
  float* l;         // [rp] running sum of the current segment
  float* alpha;     // [rp] rescale of the current tile
  float* rowpos;    // [rp] position of each row's token (padding rows: +inf, never masked)
  float* negfirst;  // [rp] −(the row's first key) under a window, else −0 (padding rows: +inf)
  float* o;         // [r][head_dim] unnormalized output of the current segment
  float* mo;        // [r] folded max over the finished segments
  float* lo;        // [r] folded sum over the finished segments
  float* kt;        // [kAttentionTile][hd] the tile's K rows widened to f32 (bf16 blocks only);
                    // bf16 columns: [hd][kAttentionTile]
  float* vt;        // [kAttentionTile][hd] its V rows likewise (dot: pairs of keys, [16][hd2])
  // bf16 dot products (PagedKv::bf16_dot): the tile's probabilities rounded to bf16, as pairs of
  // keys (2c, 2c + 1) per 32-bit word, low half key 2c — prefill [kAttentionTile / 2][rp],
  // column decode [head][kAttentionTile / 2]. (qt then holds scale·q as bf16 pairs of elements,
  // and kt the tile's K as pairs: [head_dim / 2][kAttentionTile].)
  uint32_t* p2;
};

inline int64_t ScratchFloats(int64_t n_tokens, int64_t group, int64_t head_dim) {
  const int64_t r = n_tokens * group, rp = RoundUp(r, kRowPad);
  const int64_t hd = RoundUp(head_dim, 16);
  return rp * (hd + kAttentionTile + 5) + r * hd + 2 * RoundUp(r, 16) + kAttentionTile * hd +
         kAttentionTile * RoundUp(head_dim, 32) + rp * kAttentionTile / 2 + 16 * 15;
}

inline Scratch CarveScratch(float* buf, int64_t n_tokens, int64_t group, int64_t head_dim) {
  auto align = [](float* p) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    return reinterpret_cast<float*>((a + 63) / 64 * 64);
  };
  const int64_t r = n_tokens * group, rp = RoundUp(r, kRowPad);
  const int64_t hd = RoundUp(head_dim, 16);
  Scratch s;
  float* p = align(buf);
  s.qt = p, p = align(p + hd * rp);
  s.s = p, p = align(p + kAttentionTile * rp);
  s.m = p, p = align(p + rp);
  s.l = p, p = align(p + rp);
  s.alpha = p, p = align(p + rp);
  s.rowpos = p, p = align(p + rp);
  s.negfirst = p, p = align(p + rp);
  s.o = p, p = align(p + r * hd);
  s.mo = p, p = align(p + RoundUp(r, 16));
  s.lo = p, p = align(p + RoundUp(r, 16));
  s.kt = p, p = align(p + kAttentionTile * hd);
  s.vt = p, p = align(p + kAttentionTile * RoundUp(head_dim, 32));
  s.p2 = reinterpret_cast<uint32_t*>(p);
  return s;
}

// One fold of a finished segment (mi, li, oi) into (mo, lo, oo): the one formula used by
// AttentionBlock and AttentionMerge alike (scalar exp; the o update vectorized by VT).
template <class VT>
inline void Fold(float* mo, float* lo, float* oo, float mi, float li, const float* oi,
                 int64_t head_dim) {
  using V = typename VT::V;
  constexpr int64_t W = VT::kLanes;
  const float mx = std::max(*mo, mi);
  const float mu = mx == kNegInf ? 0.0f : mx;
  const float a = std::exp(*mo - mu), b = std::exp(mi - mu);
  *lo = std::fma(*lo, a, li * b);
  *mo = mx;
  const V va = VT::Set1(a), vb = VT::Set1(b);
  int64_t d = 0;
  for (; d + W <= head_dim; d += W) {
    VT::Store(oo + d, VT::Fma(VT::Load(oo + d), va, VT::Mul(VT::Load(oi + d), vb)));
  }
  if (d < head_dim) {
    const int64_t n = head_dim - d;
    VT::StoreN(oo + d, n, VT::Fma(VT::LoadN(oo + d, n), va, VT::Mul(VT::LoadN(oi + d, n), vb)));
  }
}

template <class VT>
class BlockKernel {
  using V = typename VT::V;
  static constexpr int64_t W = VT::kLanes;

 public:
  BlockKernel(const float* q, int64_t q_stride, int64_t n_tokens, int64_t pos0, const PagedKv& kv,
              int64_t kv_head, int64_t group, int64_t head_dim, float scale, float* scratch,
              AttentionScores scores)
      : kv_(kv),
        n_tokens_(n_tokens),
        pos0_(pos0),
        first_key_(AttentionFirstKey(pos0, scores.window)),
        last_first_(AttentionFirstKey(pos0 + n_tokens - 1, scores.window)),
        softcap_(scores.softcap),
        group_(group),
        hd_(head_dim),
        hd_pad_(RoundUp(head_dim, 16)),
        kv_off_(kv_head * (kv.head_stride > 0 ? kv.head_stride : head_dim)),
        r_(n_tokens * group),
        rp_(RoundUp(r_, kRowPad)),
        n_rv_((r_ + W - 1) / W),
        sc_(CarveScratch(scratch, n_tokens, group, head_dim)),
        column_decode_(ColumnDecode(kv, n_tokens)),
        fuse_v_(n_tokens == 1 && kv.dtype == KvDtype::kBf16 && head_dim % (2 * W) == 0),
        dot_(VT::kBf16Dot && kv.dtype == KvDtype::kBf16 && kv.bf16_dot && head_dim % 2 == 0) {
    for (int64_t i = 0, r = 0; i < n_tokens_; ++i) {
      for (int64_t h = 0; h < group_; ++h, ++r) {
        sc_.rowpos[r] = static_cast<float>(pos0_ + i);
        sc_.negfirst[r] = -static_cast<float>(AttentionFirstKey(pos0_ + i, scores.window));
      }
    }
    for (int64_t r = r_; r < rp_; ++r) {
      sc_.rowpos[r] = std::numeric_limits<float>::infinity();
      sc_.negfirst[r] = std::numeric_limits<float>::infinity();
    }
    if (dot_) {
      // scale·q as bf16 pairs (2j, 2j + 1): column decode q2[h / 8][j][h % 8], else q2[j][r]
      // (padding rows 0).
      uint32_t* q2 = reinterpret_cast<uint32_t*>(sc_.qt);
      const int64_t hd2 = hd_ / 2;
      // 16 pairs of a row at a time, in order — by the level's vector form of Bf16Pair where it
      // has one (a kernel is built per split task and KV head, and the scalar rounding alone took
      // ~1.3 % of a decode step at depth 4000) — then each to its place in the layout.
      for (int64_t i = 0, r = 0; i < n_tokens_; ++i) {
        for (int64_t h = 0; h < group_; ++h, ++r) {
          const float* src = q + i * q_stride + h * hd_;
          for (int64_t j0 = 0; j0 < hd2; j0 += 16) {
            const int64_t n = std::min<int64_t>(16, hd2 - j0);
            uint32_t pairs[16];
            int64_t j = 0;
            if constexpr (VT::kBf16Dot) {
              if (n == 16) VT::ScaledBf16Pairs16(src + 2 * j0, scale, pairs), j = 16;
            }
            for (; j < n; ++j)
              pairs[j] = Bf16Pair(scale * src[2 * (j0 + j)], scale * src[2 * (j0 + j) + 1]);
            for (j = 0; j < n; ++j) {
              if (column_decode_) {
                q2[(h / 8 * hd2 + j0 + j) * 8 + h % 8] = pairs[j];
              } else {
                q2[(j0 + j) * rp_ + r] = pairs[j];
              }
            }
          }
        }
      }
      if (!column_decode_) {
        for (int64_t j = 0; j < hd2; ++j) std::fill(q2 + j * rp_ + r_, q2 + j * rp_ + rp_, 0u);
      }
    } else if (column_decode_) {
      // qc[h / 8][d][h % 8] = scale · q[h][d] (the value qt[d][h] would hold): per chunk of 8
      // heads, the 8 values a QK step broadcasts are adjacent.
      for (int64_t h = 0; h < group_; ++h) {
        for (int64_t d = 0; d < hd_; ++d) {
          sc_.qt[(h / 8 * hd_ + d) * 8 + h % 8] = scale * q[h * hd_ + d];
        }
      }
    } else {
      // qt[d][r] = scale · q[token][head][d]; padding rows are 0 (and never masked).
      for (int64_t i = 0, r = 0; i < n_tokens_; ++i) {
        for (int64_t h = 0; h < group_; ++h, ++r) {
          const float* src = q + i * q_stride + h * hd_;
          for (int64_t d = 0; d < hd_; ++d) sc_.qt[d * rp_ + r] = scale * src[d];
        }
      }
      for (int64_t r = r_; r < rp_; ++r) {
        for (int64_t d = 0; d < hd_; ++d) sc_.qt[d * rp_ + r] = 0.0f;
      }
    }
    ResetSegment();
  }

  // Column decode (the header): a one-token block over K in columns at 16 or 8 lanes, when each
  // 16-key half of a tile lies in one block.
  static bool ColumnDecode(const PagedKv& kv, int64_t n_tokens) {
    return (W == 16 || W == 8) && n_tokens == 1 && kv.k_columns && kv.block_size % 16 == 0;
  }
  // Heads per column-decode chunk: 8 × two 16-key vectors, or 2 × four 8-key vectors (AVX2's 16
  // registers).
  static constexpr int kColumnHeads = W == 16 ? 8 : 2;

  int64_t rows() const { return r_; }
  const Scratch& scratch() const { return sc_; }

  // The segment's running state back to empty (m = -inf, l = 0, o = 0).
  void ResetSegment() {
    for (int64_t r = 0; r < rp_; ++r) sc_.m[r] = kNegInf, sc_.l[r] = 0.0f;
    std::fill(sc_.o, sc_.o + r_ * hd_, 0.0f);
  }

  // The current segment's state of a one-token kernel as one partial (AttentionPartialFloats'
  // layout: m[group], l[group], o[group][head_dim]).
  void WritePartial(float* part) const {
    std::copy_n(sc_.m, group_, part);
    std::copy_n(sc_.l, group_, part + group_);
    std::copy_n(sc_.o, group_ * hd_, part + 2 * group_);
  }

  // The tile that holds the block's first key (its first token's): no tile before it is run, nor
  // its KV read — a windowed cache may have dropped those blocks (KvCache::DropBehindWindows).
  int64_t FirstTile() const { return first_key_ / kAttentionTile * kAttentionTile; }
  int64_t FirstSegment() const { return first_key_ / kAttentionSegment; }

  // One tile of keys [t0, t0 + kAttentionTile) (t0 a multiple of the tile inside the current
  // segment, ≥ FirstTile()), for callers that interleave several kernels tile by tile
  // (PartialsHeads); the tiles of a segment must come in order, as RunSegment runs them.
  void RunTile(int64_t t0) { Tile(t0, std::min<int64_t>(kAttentionTile, pos0_ + n_tokens_ - t0)); }

  // Runs the tiles of segment `seg` (keys [seg·S, min((seg+1)·S, pos0 + n_tokens)), from
  // FirstTile() on) for every token whose position reaches into it.
  void RunSegment(int64_t seg) {
    const int64_t end = pos0_ + n_tokens_;  // keys of the last token
    const int64_t seg_end = std::min(end, (seg + 1) * kAttentionSegment);
    for (int64_t t0 = std::max(seg * kAttentionSegment, FirstTile()); t0 < seg_end;
         t0 += kAttentionTile) {
      Tile(t0, std::min<int64_t>(kAttentionTile, end - t0));
    }
  }

  // First token whose position is ≥ key t (it and every later one attend to key t).
  int64_t FirstToken(int64_t t) const { return std::max<int64_t>(0, t - pos0_); }

 private:
  void Tile(int64_t t0, int64_t nk) {
    t0_ = t0;
    // A decode row streams its keys once from DRAM. All of a tile's lines requested at once
    // (128 for bf16 K and V at head_dim 64, 256 for f32) are more than the core keeps in
    // flight, so the first loads of the tile stall behind them; the column decode therefore
    // requests the lines of the tile kPrefetchTiles ahead a few at a time over its QK and PV
    // loops, after one burst for the tile after the row's first; other decode rows ask for the
    // next tile at once. (docs/kernels.md, "Decode prefetch")
    if (n_tokens_ == 1 && kPrefetchNext) {
      const int64_t last = pos0_ + 1;
      pf_n_ = pf_i_ = 0;
      if (column_decode_) {
        if (!pf_started_) {
          pf_started_ = true;
          PlanColumnPrefetch(t0 + kAttentionTile, last);
          for (int64_t d = 0; d < hd_; ++d) IssueColumnPrefetch(d);
          int64_t v_lines = 0;
          for (int64_t i = 1; i < n_cpf_; i += 2) v_lines = std::max(v_lines, cpf_[i].n);
          for (pv_pf_ = 0; pv_pf_ < v_lines;) IssuePvPrefetch();
        }
        PlanColumnPrefetch(t0 + kPrefetchTiles * kAttentionTile, last);
        pv_pf_ = 0;
      } else {
        PlanPrefetch(t0 + kAttentionTile, std::min(t0 + 2 * kAttentionTile, last));
        IssuePrefetch(pf_n_);
      }
    }
    const int64_t ft = FirstToken(t0);
    const int64_t rv0 = ft * group_ / W;  // row vectors before it hold only masked rows
    const float* kp[kAttentionTile];
    const float* vp[kAttentionTile];
    const uint16_t* kh[kAttentionTile];  // bf16 K (rows widened into kt, or columns)
    const uint16_t* vh[kAttentionTile];  // bf16 V rows, widened inside PV (fuse_v_)
    // One division per tile, one table lookup per block the tile touches; the key pointers
    // then step through the block. (The view's fields are copied to locals: read through kv_
    // inside the loop, every store to kp/kh/the scratch would make the compiler load them again,
    // and the table → block-pointer chain of loads per key cost ~9 % of a decode row.)
    const int64_t bs = kv_.block_size, kvs = kv_.kv_stride, ts = kv_.table_stride;
    const int32_t* const table = kv_.block_table;
    const float* const* const kb = kv_.k_blocks;
    const float* const* const vb = kv_.v_blocks;
    // K in columns: kp[c] / kh[c] point at key c's element 0, its element d is d · ks further.
    const bool kcol = kv_.k_columns, f32 = kv_.dtype == KvDtype::kF32;
    int64_t ks = kcol ? bs : 1;
    const int64_t kstep = kcol ? 1 : kvs;
    // Under a window, keys in blocks before the one holding the first key may be gone from the
    // table (KvCache::DropBehindWindows). Their K points into that block instead, at the same
    // slot (each lies in [0, bs), and the slots of a 16-key half stay contiguous for the column
    // decode): readable memory, perhaps not yet written, whose scores are replaced by -inf
    // (a select, so even NaN there is harmless). Their V, which PV multiplies by their exact-zero
    // probabilities, is the first key's row: written, so finite, and 0 · V adds exact zeros.
    const int64_t first_block = first_key_ / bs;
    const int64_t v_first = (first_key_ % bs) * kvs + kv_off_;
    int64_t bi = t0 / bs, slot = t0 % bs;
    for (int64_t c = 0; c < nk; slot = 0, ++bi) {
      const bool dropped = bi < first_block;
      const int32_t block = table[(dropped ? first_block : bi) * ts];
      const int64_t end = std::min(nk, c + bs - slot);
      int64_t off = slot * kvs + kv_off_, koff = kcol ? kv_off_ + slot : off;
      int64_t voff = dropped ? v_first : off;
      const int64_t vstep = dropped ? 0 : kvs;
      if (f32) {
        for (; c < end; ++c, koff += kstep, voff += vstep) {
          kp[c] = kb[block] + koff;
          vp[c] = vb[block] + voff;
        }
        continue;
      }
      // bf16: widen the rows once per tile (exact), then the same f32 arithmetic — unless the
      // dot products (or the fused V of a decode row) read the bf16 elements directly.
      const uint16_t* const kb16 = reinterpret_cast<const uint16_t*>(kb[block]);
      const uint16_t* const vb16 = reinterpret_cast<const uint16_t*>(vb[block]);
      for (; c < end; ++c, koff += kstep, voff += vstep) {
        kh[c] = kb16 + koff;
        if (!kcol && !dot_) kp[c] = Widen(kh[c], sc_.kt + c * hd_pad_);
        vh[c] = vb16 + voff;
        if (!fuse_v_ && !dot_) vp[c] = Widen(vh[c], sc_.vt + c * hd_pad_);
      }
    }
    const bool bf16 = kv_.dtype == KvDtype::kBf16;
    if constexpr (VT::kBf16Dot) {
      if (dot_) return TileDot(t0, nk, kh, vh, ft, rv0);
    }
    if (column_decode_) {
      ColumnScoresSoftmax(kp, kh, nk);
    } else {
      if (kcol && bf16) {  // bf16 columns widened into kt[d][c] (exact), a block's run at once
        for (int64_t c = 0; c < nk;) {
          int64_t n = 1;
          while (c + n < nk && kh[c + n] == kh[c] + n) ++n;
          for (int64_t d = 0; d < hd_; ++d) {
            const uint16_t* src = kh[c] + d * ks;
            float* dst = sc_.kt + d * kAttentionTile + c;
            int64_t i = 0;
            for (; i + W <= n; i += W) VT::Store(dst + i, VT::LoadBf16(src + i));
            for (; i < n; ++i) {
              const uint32_t u = static_cast<uint32_t>(src[i]) << 16;
              std::memcpy(dst + i, &u, sizeof(u));
            }
          }
          for (int64_t i = 0; i < n; ++i) kp[c + i] = sc_.kt + c + i;
          c += n;
        }
        ks = kAttentionTile;
      }
      // Past the last key the group of keys repeats it; those scores are never used.
      for (int64_t c = nk; c < kAttentionTile; ++c) kp[c] = kp[nk - 1];
      Scores(kp, ks, nk, rv0);
      // Keys past some processed row's position: the tile reaches beyond the first row's token.
      const bool diag = t0 + nk - 1 > pos0_ + rv0 * W / group_;
      Softmax(t0, nk, rv0, diag);
    }
    for (int64_t i = ft; i < n_tokens_; ++i) {
      const int64_t nv = std::min<int64_t>(nk, pos0_ + i + 1 - t0);
      if (fuse_v_) {
        AccumulateBf16(vh, nv);
      } else {
        Accumulate(i, vp, nv);
      }
    }
  }

  // Tile() with bf16 dot products (PagedKv::bf16_dot; VT::kBf16Dot levels): scores over pairs
  // of K elements, the probabilities rounded to bf16 pairs of keys, PV over pairs of V rows.
  void TileDot(int64_t t0, int64_t nk, const uint16_t* const* kh, const uint16_t* const* vh,
               int64_t ft, int64_t rv0) {
    if constexpr (VT::kBf16Dot) {
      if (column_decode_) {
        ColumnScoresSoftmaxDot(kh, nk);
      } else {
        KeyPairs(kh, nk);
        ScoresDot(nk, rv0);
        const bool diag = t0 + nk - 1 > pos0_ + rv0 * W / group_;
        Softmax(t0, nk, rv0, diag);
      }
      if (column_decode_) return PvColumnsDot(vh, nk);
      ValuePairs(vh, nk);
      for (int64_t i = ft; i < n_tokens_; ++i) {
        AccumulateDot(i * group_, std::min<int64_t>(nk, pos0_ + i + 1 - t0));
      }
    }
  }

  // AccumulateDot of a decode row (nv = nk keys, every one at or before the row's position),
  // with the V pairs made in registers from the bf16 rows as they are used instead of through
  // vt2 (ValuePairs' stores and PvTileDot's loads were a sixth of a decode row's time; p2 is
  // [row][pair] here, ColumnChunkDot's layout): chunks of up to kColumnHeads heads × 2W
  // elements of d, so the pairs of a chunk of d are made once for all of its heads. The
  // operands and each accumulator's chain are PvTileDot's: same bits.
  void PvColumnsDot(const uint16_t* const* vh, int64_t nv) {
    if constexpr (VT::kBf16Dot) {
      for (int64_t h0 = 0; h0 < group_; h0 += kColumnHeads) {
        DispatchHeads(std::min<int64_t>(kColumnHeads, group_ - h0), [&](auto nh_c) {
          constexpr int NH = decltype(nh_c)::value;
          if constexpr (NH <= kColumnHeads) {
            for (int64_t d = 0; d < hd_; d += 2 * W) PvColumnDot<NH>(h0, vh, nv, d);
          }
        });
      }
    }
  }
  template <int NH>
  void PvColumnDot(int64_t r, const uint16_t* const* vh, int64_t nv, int64_t d) {
    using P = typename VT::P;
    const int64_t n = std::min<int64_t>(2 * W, hd_ - d);  // elements of this chunk
    V acc[NH][2];
    LoadScaledO(r, d, n, acc);
    const uint32_t* pc = sc_.p2 + r * (kAttentionTile / 2);
    for (int64_t c = 0; c < nv; c += 2, ++pc) {
      IssuePvPrefetch(), IssuePvPrefetch();
      const bool pair = c + 1 < nv;
      P v[2];
      VT::InterleaveRows(vh[c] + d, (pair ? vh[c + 1] : vh[c]) + d, n, &v[0], &v[1]);
      if (!pair) v[0] = VT::EvenOnly(v[0]), v[1] = VT::EvenOnly(v[1]);
#pragma GCC unroll 8
      for (int h = 0; h < NH; ++h) {
        const P pb = VT::BroadcastPair(pc[h * (kAttentionTile / 2)]);
#pragma GCC unroll 2
        for (int j = 0; j < 2; ++j) acc[h][j] = VT::Dot(acc[h][j], v[j], pb);
      }
    }
    StoreO(r, d, n, acc);
  }

  // The tile's K as bf16 pairs kt2[j][c] = (K_c[2j], K_c[2j + 1]) (keys past nk: 0). K in
  // columns, 16 adjacent slots of a block at once: rows 2j and 2j + 1 of the block interleaved.
  void KeyPairs(const uint16_t* const* kh, int64_t nk) {
    uint32_t* kt2 = reinterpret_cast<uint32_t*>(sc_.kt);
    const int64_t hd2 = hd_ / 2, bs = kv_.block_size;
    const bool kcol = kv_.k_columns;
    for (int64_t c = 0; c < kAttentionTile;) {
      if (kcol && c + 16 <= nk && kh[c + 15] == kh[c] + 15) {
        for (int64_t j = 0; j < hd2; ++j) {
          VT::StorePairs(kt2 + j * kAttentionTile + c,
                         VT::InterleaveBf16(kh[c] + 2 * j * bs, kh[c] + (2 * j + 1) * bs));
        }
        c += 16;
        continue;
      }
      const int64_t es = kcol ? bs : 1;  // elements between d and d + 1 of a key
      for (int64_t j = 0; j < hd2; ++j) {
        kt2[j * kAttentionTile + c] =
            c < nk ? kh[c][2 * j * es] | static_cast<uint32_t>(kh[c][(2 * j + 1) * es]) << 16 : 0u;
      }
      ++c;
    }
  }

  // The tile's V as pairs of keys vt2[c / 2][d] = (V_c[d], V_{c+1}[d]) (the tokens of a block
  // share them), the second row of an odd tile's last pair 0, elements past head_dim 0.
  void ValuePairs(const uint16_t* const* vh, int64_t nk) {
    uint32_t* vt2 = reinterpret_cast<uint32_t*>(sc_.vt);
    for (int64_t c = 0; c < nk; c += 2) {
      const bool pair = c + 1 < nk;
      for (int64_t d = 0; d < hd_; d += 2 * W) {
        typename VT::P v0, v1;
        VT::InterleaveRows(vh[c] + d, (pair ? vh[c + 1] : vh[c]) + d,
                           std::min<int64_t>(2 * W, hd_ - d), &v0, &v1);
        if (!pair) v0 = VT::EvenOnly(v0), v1 = VT::EvenOnly(v1);
        VT::StorePairs(vt2 + c / 2 * hd_pad2() + d, v0);
        VT::StorePairs(vt2 + c / 2 * hd_pad2() + d + W, v1);
      }
    }
  }
  // Words per pair of keys in vt2: head_dim rounded up to the PV chunk.
  int64_t hd_pad2() const { return RoundUp(hd_, 4 * W); }

  // 4 keys × 4 row vectors per score tile (16 accumulators): a broadcast K pair feeds 4
  // vdpbf16ps (with V pairs built once per tile, 1.05× the speed of 8 keys × 2 row vectors on
  // attention_bench's prefill; docs/kernels.md "bf16 dot products").
  void ScoresDot(int64_t nk, int64_t rv0) {
    for (int64_t c0 = 0; c0 < nk; c0 += 4) {
      int64_t rv = rv0;
      for (; rv + 4 <= n_rv_; rv += 4) ScoreTileDot<4, 4>(c0, rv);
      for (; rv + 2 <= n_rv_; rv += 2) ScoreTileDot<2, 4>(c0, rv);
      if (rv < n_rv_) ScoreTileDot<1, 4>(c0, rv);
    }
  }

  // ScoreTile over bf16 pairs: s[c][r] = the vdpbf16ps chain over j of q2[j][r] · kt2[j][c].
  template <int NV, int NK>
  void ScoreTileDot(int64_t c0, int64_t rv) {
    using P = typename VT::P;
    V acc[NV][NK];
#pragma GCC unroll 16
    for (int i = 0; i < NV; ++i) {
#pragma GCC unroll 16
      for (int j = 0; j < NK; ++j) acc[i][j] = VT::Zero();
    }
    const uint32_t* q2 = reinterpret_cast<const uint32_t*>(sc_.qt) + rv * W;
    const uint32_t* k2 = reinterpret_cast<const uint32_t*>(sc_.kt) + c0;
    for (int64_t j2 = 0; j2 < hd_ / 2; ++j2) {
      P qv[NV];
#pragma GCC unroll 16
      for (int i = 0; i < NV; ++i) qv[i] = VT::LoadPairs(q2 + j2 * rp_ + i * W);
#pragma GCC unroll 16
      for (int j = 0; j < NK; ++j) {
        const P kb = VT::BroadcastPair(k2[j2 * kAttentionTile + j]);
#pragma GCC unroll 16
        for (int i = 0; i < NV; ++i) acc[i][j] = VT::Dot(acc[i][j], qv[i], kb);
      }
    }
#pragma GCC unroll 16
    for (int j = 0; j < NK; ++j) {
#pragma GCC unroll 16
      for (int i = 0; i < NV; ++i) VT::Store(sc_.s + (c0 + j) * rp_ + (rv + i) * W, acc[i][j]);
    }
  }

  // o[r] = o[r] · alpha[r] + Σ over pairs of keys (2c, 2c + 1) < nv of the vdpbf16ps of the
  // rounded probabilities and the pair's V (ValuePairs), for the heads of rows [r0, r0 + group).
  // A pair past the row's last key has its second V row (and probability) zeroed, so a row reads
  // the same operands whatever follows it (decode or prefill, any chunking).
  void AccumulateDot(int64_t r0, int64_t nv) {
    constexpr int64_t HB = 4;  // heads × 4 vectors of d: a broadcast feeds 4 vdpbf16ps
    for (int64_t h = 0; h < group_; h += HB) {
      const int64_t nh = std::min(HB, group_ - h);
      DispatchHeads(nh, [&](auto nh_c) {
        constexpr int NH = decltype(nh_c)::value;
        if constexpr (NH <= HB) {
          for (int64_t d = 0; d < hd_; d += 4 * W) PvTileDot<NH>(r0 + h, nv, d);
        }
      });
    }
  }

  // Rows [r, r + NH) × elements [d, d + 4W) of o (fewer at the end of a row); p2 [pair][row].
  template <int NH>
  void PvTileDot(int64_t r, int64_t nv, int64_t d) {
    using P = typename VT::P;
    const int64_t n = std::min<int64_t>(4 * W, hd_ - d);  // elements of this chunk
    const int nd = static_cast<int>((n + W - 1) / W);
    V acc[NH][4];
    LoadScaledO(r, d, n, acc);
    const uint32_t* pc = sc_.p2 + r;
    const uint32_t* vt2 = reinterpret_cast<const uint32_t*>(sc_.vt) + d;
    const int64_t vs = hd_pad2();
    for (int64_t c = 0; c < nv; c += 2, pc += rp_, vt2 += vs) {
      const bool pair = c + 1 < nv;
      P v[4];
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) {
        v[j] = j < nd ? VT::LoadPairs(vt2 + j * W) : VT::ZeroPairs();
        if (!pair) v[j] = VT::EvenOnly(v[j]);
      }
#pragma GCC unroll 4
      for (int h = 0; h < NH; ++h) {
        const P pb = VT::BroadcastPair(pc[h]);
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) acc[h][j] = VT::Dot(acc[h][j], v[j], pb);
      }
    }
    StoreO(r, d, n, acc);
  }

  // acc[h][j] = o[r + h][d + jW …] · alpha[r + h] over the n elements of a PV chunk (lanes past
  // n: 0), and back: the start and end of PvTileDot and PvColumnDot.
  template <int NH, int NJ>
  void LoadScaledO(int64_t r, int64_t d, int64_t n, V (&acc)[NH][NJ]) const {
#pragma GCC unroll 8
    for (int h = 0; h < NH; ++h) {
      const V a = VT::Set1(sc_.alpha[r + h]);
      const float* o = sc_.o + (r + h) * hd_ + d;
#pragma GCC unroll 4
      for (int j = 0; j < NJ; ++j) {
        acc[h][j] = VT::Mul(VT::LoadN(o + j * W, std::clamp<int64_t>(n - j * W, 0, W)), a);
      }
    }
  }
  template <int NH, int NJ>
  void StoreO(int64_t r, int64_t d, int64_t n, const V (&acc)[NH][NJ]) {
#pragma GCC unroll 8
    for (int h = 0; h < NH; ++h) {
      float* o = sc_.o + (r + h) * hd_ + d;
#pragma GCC unroll 4
      for (int j = 0; j < NJ; ++j) {
        const int64_t m = std::clamp<int64_t>(n - j * W, 0, W);
        if (m > 0) VT::StoreN(o + j * W, m, acc[h][j]);
      }
    }
  }

  // Plans the software prefetch of the K and V rows of keys [from, to) (each block's run of
  // rows of this head, line by line, K and V alternating) into pf_lines_; IssuePrefetch sends
  // the next n planned lines.
  void PlanPrefetch(int64_t from, int64_t to) {
    const int64_t elem = kv_.dtype == KvDtype::kBf16 ? 2 : 4;
    for (int64_t t = from; t < to;) {
      const int64_t bi = t / kv_.block_size, slot = t % kv_.block_size;
      const int64_t n = std::min(kv_.block_size - slot, to - t);
      const int32_t block = kv_.block_table[bi * kv_.table_stride];
      const int64_t off = (slot * kv_.kv_stride + kv_off_) * elem;
      const int64_t bytes = ((n - 1) * kv_.kv_stride + hd_) * elem;
      const char* k = reinterpret_cast<const char*>(kv_.k_blocks[block]) + off;
      const char* v = reinterpret_cast<const char*>(kv_.v_blocks[block]) + off;
      if (kv_.k_columns) {  // head_dim runs of n elements, block_size elements apart
        k = reinterpret_cast<const char*>(kv_.k_blocks[block]) + (kv_off_ + slot) * elem;
        for (int64_t d = 0; d < hd_; ++d) {
          for (int64_t b = 0; b < n * elem && pf_n_ + 1 <= kPrefetchLines; b += 64) {
            pf_lines_[pf_n_++] = k + d * kv_.block_size * elem + b;
          }
        }
        for (int64_t b = 0; b < bytes && pf_n_ + 1 <= kPrefetchLines; b += 64) {
          pf_lines_[pf_n_++] = v + b;
        }
      } else {
        for (int64_t b = 0; b < bytes && pf_n_ + 2 <= kPrefetchLines; b += 64) {
          pf_lines_[pf_n_++] = k + b;
          pf_lines_[pf_n_++] = v + b;
        }
      }
      t += n;
    }
  }
  // Column decode: the tile at `from` (keys [from, min(from + 32, last))) as up to 4 streams —
  // per 16-key half, its K columns (one run of 16 slots per d, block_size elements apart) and
  // its V rows — with no list: QK step d asks for line d of each K stream
  // (IssueColumnPrefetch), and each key step of PV for the next line of each V stream
  // (IssuePvPrefetch), so the requests are spread over the whole tile.
  void PlanColumnPrefetch(int64_t from, int64_t last) {
    n_cpf_ = 0;
    const int64_t elem = kv_.dtype == KvDtype::kBf16 ? 2 : 4;
    for (int64_t t = from; t < std::min(from + kAttentionTile, last); t += 16) {
      const int64_t slot = t % kv_.block_size;
      const int32_t block = kv_.block_table[t / kv_.block_size * kv_.table_stride];
      const char* k = reinterpret_cast<const char*>(kv_.k_blocks[block]) + (kv_off_ + slot) * elem;
      const char* v = reinterpret_cast<const char*>(kv_.v_blocks[block]) +
                      (slot * kv_.kv_stride + kv_off_) * elem;
      const int64_t n = std::min<int64_t>(16, last - t);
      cpf_[n_cpf_++] = {k, kv_.block_size * elem, hd_};
      cpf_[n_cpf_++] = {v, 64, (((n - 1) * kv_.kv_stride + hd_) * elem + 63) / 64};
    }
  }
  void IssueColumnPrefetch(int64_t d) {
    for (int64_t i = 0; i < n_cpf_; i += 2) {
      if (d < cpf_[i].n) __builtin_prefetch(cpf_[i].base + d * cpf_[i].stride, 0, 3);
    }
  }

  void IssuePrefetch(int64_t n) {
    for (const int64_t end = std::min(pf_n_, pf_i_ + n); pf_i_ < end; ++pf_i_) {
      __builtin_prefetch(pf_lines_[pf_i_], 0, 3);
    }
  }

  // bf16 bits → f32 (the bits shifted into the high half: exact), hd_ floats at dst.
  const float* Widen(const uint16_t* src, float* dst) const {
    int64_t d = 0;
    for (; d + W <= hd_; d += W) VT::Store(dst + d, VT::LoadBf16(src + d));
    for (; d < hd_; ++d) {
      const uint32_t u = static_cast<uint32_t>(src[d]) << 16;
      std::memcpy(dst + d, &u, sizeof(u));
    }
    return dst;
  }

  // s[c][rv·W + lane] for c < nk (and the repeated keys up to the group's end).
  // K in columns: a key group whose keys are adjacent slots of one block (the common case)
  // broadcasts every key's element d from one pointer (kRun), freeing the per-key registers.
  // ks: elements between d and d + 1 of a key behind kp.
  void Scores(const float* const* kp, int64_t ks, int64_t nk, int64_t rv0) {
    constexpr int NK = VT::kKeyGroup;
    for (int64_t c0 = 0; c0 < nk; c0 += NK) {
      const bool run = ks != 1 && kp[c0 + NK - 1] == kp[c0] + (NK - 1);
      int64_t rv = rv0;
      if (run) {
        for (; rv + 2 <= n_rv_; rv += 2) ScoreTile<2, true>(kp + c0, ks, c0, rv);
        if (rv < n_rv_) ScoreTile<1, true>(kp + c0, ks, c0, rv);
      } else {
        for (; rv + 2 <= n_rv_; rv += 2) ScoreTile<2, false>(kp + c0, ks, c0, rv);
        if (rv < n_rv_) ScoreTile<1, false>(kp + c0, ks, c0, rv);
      }
    }
  }

  template <int NV, bool kRun>
  void ScoreTile(const float* const* kp, int64_t ks, int64_t c0, int64_t rv) {
    constexpr int NK = VT::kKeyGroup;
    V acc[NV][NK];
#pragma GCC unroll 16
    for (int i = 0; i < NV; ++i) {
#pragma GCC unroll 16
      for (int j = 0; j < NK; ++j) acc[i][j] = VT::Zero();
    }
    const float* qt = sc_.qt + rv * W;
    const float* k0 = kp[0];
    for (int64_t d = 0, off = 0; d < hd_; ++d, off += ks) {
      V qv[NV];
#pragma GCC unroll 16
      for (int i = 0; i < NV; ++i) qv[i] = VT::Load(qt + d * rp_ + i * W);
#pragma GCC unroll 16
      for (int j = 0; j < NK; ++j) {
        const V kb = VT::Set1(kRun ? k0[off + j] : kp[j][off]);
#pragma GCC unroll 16
        for (int i = 0; i < NV; ++i) acc[i][j] = VT::Fma(qv[i], kb, acc[i][j]);
      }
    }
#pragma GCC unroll 16
    for (int j = 0; j < NK; ++j) {
#pragma GCC unroll 16
      for (int i = 0; i < NV; ++i) VT::Store(sc_.s + (c0 + j) * rp_ + (rv + i) * W, acc[i][j]);
    }
  }

  // Column decode (the header): per chunk of kColumnHeads heads, the tile's scores with keys in
  // lanes, Softmax()'s online update on them, and the probabilities stored key-major (s[c][row])
  // for PV.
  void ColumnScoresSoftmax(const float* const* kp, const uint16_t* const* kh, int64_t nk) {
    if constexpr (W == 16 || W == 8) {
      for (int64_t h0 = 0; h0 < group_; h0 += kColumnHeads) {
        DispatchHeads(std::min<int64_t>(kColumnHeads, group_ - h0), [&](auto nh_c) {
          constexpr int NH = decltype(nh_c)::value;
          if constexpr (NH <= kColumnHeads) {
            switch ((nk + W - 1) / W) {  // key vectors the tile fills
              case 1:
                return ColumnChunk<NH, 1>(h0, kp, kh, nk);
              case 2:
                return ColumnChunk<NH, 2>(h0, kp, kh, nk);
              case 3:
                if constexpr (W == 8) return ColumnChunk<NH, 3>(h0, kp, kh, nk);
                break;
              case 4:
                if constexpr (W == 8) return ColumnChunk<NH, 4>(h0, kp, kh, nk);
                break;
              default:
                break;
            }
          }
        });
      }
    }
  }

  // Heads [h0, h0 + NH) over the tile's first NV · W keys. Score c of head h is the FMA chain
  // of ScoreTile (scale·q[h][d] · K_c[d] over d from zero; a product's operands commute), max
  // and sum run in Softmax()'s order, exp on the same values: the same bits.
  template <int NH, int NV>
  void ColumnChunk(int64_t h0, const float* const* kp, const uint16_t* const* kh, int64_t nk) {
    if constexpr (W == 16 || W == 8) {
      V acc[NH][NV];
#pragma GCC unroll 8
      for (int h = 0; h < NH; ++h) {
#pragma GCC unroll 4
        for (int j = 0; j < NV; ++j) acc[h][j] = VT::Zero();
      }
      const float* q = sc_.qt + h0 / 8 * hd_ * 8 + h0 % 8;  // qc of these heads: [d][8]
      const int64_t bs = kv_.block_size;
      auto step = [&](int64_t d, const V* x) {
#pragma GCC unroll 8
        for (int h = 0; h < NH; ++h) {
          const V qb = VT::Set1(q[d * 8 + h]);
#pragma GCC unroll 4
          for (int j = 0; j < NV; ++j) acc[h][j] = VT::Fma(qb, x[j], acc[h][j]);
        }
      };
      // Walks d over the NV key vectors (element type T: f32, or bf16 widened by `load`).
      auto walk = [&](auto keys, auto load) {
        std::remove_cv_t<std::remove_reference_t<decltype(keys[0])>> k[NV];
#pragma GCC unroll 4
        for (int j = 0; j < NV; ++j) k[j] = keys[j * W];
        for (int64_t d = 0; d < hd_; ++d) {
          if (h0 == 0) IssueColumnPrefetch(d);
          V x[NV];
#pragma GCC unroll 4
          for (int j = 0; j < NV; ++j) x[j] = load(k[j] + d * bs);
          step(d, x);
        }
      };
      if (kv_.dtype == KvDtype::kF32) {
        walk(kp, [](const float* p) { return VT::Load(p); });
      } else {
        walk(kh, [](const uint16_t* p) { return VT::LoadBf16(p); });
      }
      ColumnSoftmax<NH, NV>(h0, acc, nk, [](int, int, V p) { return p; });
    }
  }

  // The online-softmax update of a column chunk over its scores acc[h][j] (head h, keys jW …
  // jW + W − 1 in lanes), in Softmax()'s operations and order: the tile's lanes past nk masked
  // to -inf, a head's max over its keys, exp, then `keep(h, j, p)` — the probabilities as kept
  // (the identity, or rounded to bf16 by the dot products) — stored key-major (s[c][row], what PV
  // reads) and summed in key order into l.
  template <int NH, int NV, class Keep>
  void ColumnSoftmax(int64_t h0, V (&acc)[NH][NV], int64_t nk, Keep keep) {
    if constexpr (W == 16 || W == 8) {
      // Lanes past the tile's last key may hold anything: -inf, so exp gives 0 (never used).
      // Lanes before the row's first key under a window (`lead` of them): -inf, probability 0.
      const V neg_inf = VT::Set1(kNegInf);
      const int64_t lead = first_key_ - t0_;
      const bool capped = softcap_ > 0;
      const V cap = VT::Set1(softcap_), inv_cap = VT::Set1(capped ? 1.0f / softcap_ : 0.0f);
      alignas(64) float red[16];
      std::fill_n(red, 16, kNegInf);
#pragma GCC unroll 8
      for (int h = 0; h < NH; ++h) {
#pragma GCC unroll 4
        for (int j = 0; j < NV; ++j) {
          if (capped) acc[h][j] = SoftCap(acc[h][j], cap, inv_cap);
          acc[h][j] =
              VT::MaskHead(VT::MaskTail(acc[h][j], nk - W * j, neg_inf), lead - W * j, neg_inf);
        }
        V m = acc[h][0];
#pragma GCC unroll 4
        for (int j = 1; j < NV; ++j) m = VT::Max(m, acc[h][j]);
        red[h] = VT::ReduceMax(m);
      }
      const V m_old = VT::LoadN(sc_.m + h0, NH);
      const V m_new = VT::Max(m_old, VT::Load(red));
      const V mu = VT::ZeroIfNegInf(m_new);
      const V alpha = VT::Exp(VT::Sub(m_old, mu));
      VT::Store(red, mu);
#pragma GCC unroll 8
      for (int h = 0; h < NH; ++h) {
#pragma GCC unroll 4
        for (int j = 0; j < NV; ++j) {
          acc[h][j] = keep(h, j, VT::Exp(VT::Sub(acc[h][j], VT::Set1(red[h]))));
        }
      }
      // The probabilities to s[c][row] (PV's layout), then their sum in key order.
      V sum;
      if constexpr (W == 16) {
#pragma GCC unroll 2
        for (int j = 0; j < NV; ++j) {
          V pj[8];
#pragma GCC unroll 8
          for (int h = 0; h < 8; ++h) pj[h] = h < NH ? acc[h][j] : VT::Zero();
          VT::StoreTransposed8(pj, sc_.s + 16 * j * rp_ + h0, rp_);
        }
        sum = VT::Zero();
        for (int64_t c = 0; c < nk; ++c) sum = VT::Add(sum, VT::LoadHalf(sc_.s + c * rp_ + h0));
      } else {
        alignas(32) float lanes[W];
        alignas(32) float sums[W] = {};
#pragma GCC unroll 8
        for (int h = 0; h < NH; ++h) {
#pragma GCC unroll 4
          for (int j = 0; j < NV; ++j) {
            VT::Store(lanes, acc[h][j]);
            for (int64_t l = 0; l < W; ++l) sc_.s[(j * W + l) * rp_ + h0 + h] = lanes[l];
          }
          for (int64_t c = 0; c < nk; ++c) sums[h] += sc_.s[c * rp_ + h0 + h];
        }
        sum = VT::Load(sums);
      }
      VT::StoreN(sc_.l + h0, NH, VT::Fma(VT::LoadN(sc_.l + h0, NH), alpha, sum));
      VT::StoreN(sc_.m + h0, NH, m_new);
      VT::StoreN(sc_.alpha + h0, NH, alpha);
    }
  }

  // ColumnScoresSoftmax with bf16 dot products: the same chunks of heads over key vectors, K
  // pairs (rows 2j and 2j + 1 of 16 slots interleaved) against broadcast q pairs.
  void ColumnScoresSoftmaxDot(const uint16_t* const* kh, int64_t nk) {
    if constexpr (VT::kBf16Dot) {
      for (int64_t h0 = 0; h0 < group_; h0 += kColumnHeads) {
        DispatchHeads(std::min<int64_t>(kColumnHeads, group_ - h0), [&](auto nh_c) {
          constexpr int NH = decltype(nh_c)::value;
          if constexpr (NH <= kColumnHeads) {
            if (nk > W) return ColumnChunkDot<NH, 2>(h0, kh, nk);
            return ColumnChunkDot<NH, 1>(h0, kh, nk);
          }
        });
      }
    }
  }

  // ColumnChunk over bf16 pairs: score c of head h is ScoreTileDot's chain (vdpbf16ps with its
  // operands swapped: each product is exact, so the same bits); the probabilities are rounded to
  // bf16, kept as pairs of keys in p2[head][c / 2] and, widened, in s[c][head] for the sum.
  template <int NH, int NV>
  void ColumnChunkDot(int64_t h0, const uint16_t* const* kh, int64_t nk) {
    if constexpr (VT::kBf16Dot) {
      using P = typename VT::P;
      V acc[NH][NV];
#pragma GCC unroll 8
      for (int h = 0; h < NH; ++h) {
#pragma GCC unroll 2
        for (int j = 0; j < NV; ++j) acc[h][j] = VT::Zero();
      }
      const int64_t hd2 = hd_ / 2, bs = kv_.block_size;
      const uint32_t* q2 = reinterpret_cast<const uint32_t*>(sc_.qt) + h0 / 8 * hd2 * 8;
      const uint16_t* k[NV];
#pragma GCC unroll 2
      for (int j = 0; j < NV; ++j) k[j] = kh[j * W];
      for (int64_t j2 = 0; j2 < hd2; ++j2) {
        if (h0 == 0) IssueColumnPrefetch(2 * j2), IssueColumnPrefetch(2 * j2 + 1);
        P x[NV];
#pragma GCC unroll 2
        for (int j = 0; j < NV; ++j) {
          x[j] = VT::InterleaveBf16(k[j] + 2 * j2 * bs, k[j] + (2 * j2 + 1) * bs);
        }
#pragma GCC unroll 8
        for (int h = 0; h < NH; ++h) {
          const P qb = VT::BroadcastPair(q2[j2 * 8 + h]);
#pragma GCC unroll 2
          for (int j = 0; j < NV; ++j) acc[h][j] = VT::Dot(acc[h][j], x[j], qb);
        }
      }
      // A single-vector tile leaves the second half of each head's pairs unwritten; PV reads the
      // pairs below (nk + 1) / 2 ≤ 8 only.
      ColumnSoftmax<NH, NV>(h0, acc, nk, [&](int h, int j, V p) {
        const auto rounded = VT::RoundBf16(p);
        VT::StoreHalfPairs(sc_.p2 + (h0 + h) * (kAttentionTile / 2) + j * (W / 2), rounded);
        return VT::WidenBf16(rounded);
      });
    }
  }

  // cap · tanh(s / cap) (AttentionScores), the level's tanh: one formula for every path.
  static V SoftCap(V s, V cap, V inv_cap) { return VT::Mul(cap, VT::Tanh(VT::Mul(s, inv_cap))); }

  void Softmax(int64_t t0, int64_t nk, int64_t rv0, bool diag) {
    const V neg_inf = VT::Set1(kNegInf);
    // Keys before some row's window: the tile starts before the last row's first key.
    const bool lead = t0 < last_first_;
    // Soft-capped scores, capped before the masks (a masked key stays -inf).
    const bool capped = softcap_ > 0;
    const V cap = VT::Set1(softcap_), inv_cap = VT::Set1(capped ? 1.0f / softcap_ : 0.0f);
    for (int64_t rv = rv0; rv < n_rv_; ++rv) {
      const int64_t off = rv * W;
      const V pos = VT::Load(sc_.rowpos + off);
      const V negfirst = VT::Load(sc_.negfirst + off);
      V mt = neg_inf;
      for (int64_t c = 0; c < nk; ++c) {
        float* sp = sc_.s + c * rp_ + off;
        V s = VT::Load(sp);
        if (capped || diag || lead) {
          if (capped) s = SoftCap(s, cap, inv_cap);
          if (diag) s = VT::MaskBelow(pos, static_cast<float>(t0 + c), s, neg_inf);
          // key < first ⇔ −first > −key: masked as a key past −first would be.
          if (lead) s = VT::MaskBelow(negfirst, -static_cast<float>(t0 + c), s, neg_inf);
          VT::Store(sp, s);
        }
        mt = VT::Max(mt, s);
      }
      const V m_old = VT::Load(sc_.m + off);
      const V m_new = VT::Max(m_old, mt);
      const V mu = VT::ZeroIfNegInf(m_new);
      const V alpha = VT::Exp(VT::Sub(m_old, mu));
      V sum = VT::Zero();
      if constexpr (VT::kBf16Dot) {
        if (dot_) {
          // Rounded to bf16, summed as rounded, stored as pairs of keys for AccumulateDot (the
          // second of an odd tile's last pair 0).
          for (int64_t c = 0; c < nk; c += 2) {
            const auto p0 = VT::RoundBf16(VT::Exp(VT::Sub(VT::Load(sc_.s + c * rp_ + off), mu)));
            sum = VT::Add(sum, VT::WidenBf16(p0));
            auto p1 = VT::ZeroBf16();
            if (c + 1 < nk) {
              p1 = VT::RoundBf16(VT::Exp(VT::Sub(VT::Load(sc_.s + (c + 1) * rp_ + off), mu)));
              sum = VT::Add(sum, VT::WidenBf16(p1));
            }
            VT::StorePairs(sc_.p2 + c / 2 * rp_ + off, VT::Interleave(p0, p1));
          }
        }
      }
      if (!dot_) {  // the f32 probabilities, in place
        for (int64_t c = 0; c < nk; ++c) {
          float* sp = sc_.s + c * rp_ + off;
          const V p = VT::Exp(VT::Sub(VT::Load(sp), mu));
          VT::Store(sp, p);
          sum = VT::Add(sum, p);
        }
      }
      VT::Store(sc_.l + off, VT::Fma(VT::Load(sc_.l + off), alpha, sum));
      VT::Store(sc_.m + off, m_new);
      VT::Store(sc_.alpha + off, alpha);
    }
  }

  // o[r] = o[r] · alpha[r] + Σ_{c < nv} p[c][r] · V_c for the heads of token i.
  void Accumulate(int64_t i, const float* const* vp, int64_t nv) {
    constexpr int64_t HB = VT::kHeadBlock;
    const int64_t r0 = i * group_;
    for (int64_t h = 0; h < group_; h += HB) {
      const int64_t nh = std::min(HB, group_ - h);
      DispatchHeads(nh, [&](auto nh_c) {
        constexpr int NH = decltype(nh_c)::value;
        int64_t d = 0;
        for (; d + 2 * W <= hd_; d += 2 * W) PvTile<NH, true>(r0 + h, vp, nv, d, 0);
        if (d < hd_) PvTile<NH, false>(r0 + h, vp, nv, d, hd_ - d);
      });
    }
  }

  // Accumulate of a one-token block over bf16 V rows, each widened in registers as PV loads it
  // (the same values, so the same bits; no f32 copy of the tile's V is written). Requires:
  // head_dim a multiple of 2W.
  void AccumulateBf16(const uint16_t* const* vh, int64_t nv) {
    constexpr int64_t HB = VT::kHeadBlock;
    for (int64_t h = 0; h < group_; h += HB) {
      const int64_t nh = std::min(HB, group_ - h);
      DispatchHeads(nh, [&](auto nh_c) {
        constexpr int NH = decltype(nh_c)::value;
        for (int64_t d = 0; d < hd_; d += 2 * W) PvTileBf16<NH>(h, vh, nv, d);
      });
    }
  }

  template <int NH>
  void PvTileBf16(int64_t r, const uint16_t* const* vh, int64_t nv, int64_t d) {
    V acc[NH][2];
#pragma GCC unroll 8
    for (int h = 0; h < NH; ++h) {
      const V a = VT::Set1(sc_.alpha[r + h]);
      const float* o = sc_.o + (r + h) * hd_ + d;
      acc[h][0] = VT::Mul(VT::Load(o), a);
      acc[h][1] = VT::Mul(VT::Load(o + W), a);
    }
    const float* p = sc_.s + r;
    for (int64_t c = 0; c < nv; ++c) {
      if (column_decode_) IssuePvPrefetch();
      const uint16_t* v = vh[c] + d;
      const V v0 = VT::LoadBf16(v), v1 = VT::LoadBf16(v + W);
#pragma GCC unroll 8
      for (int h = 0; h < NH; ++h) {
        const V pb = VT::Set1(p[c * rp_ + h]);
        acc[h][0] = VT::Fma(pb, v0, acc[h][0]);
        acc[h][1] = VT::Fma(pb, v1, acc[h][1]);
      }
    }
#pragma GCC unroll 8
    for (int h = 0; h < NH; ++h) {
      float* o = sc_.o + (r + h) * hd_ + d;
      VT::Store(o, acc[h][0]);
      VT::Store(o + W, acc[h][1]);
    }
  }

  template <class Fn>
  static void DispatchHeads(int64_t nh, Fn&& fn) {
    static_assert(VT::kHeadBlock <= 8);
    switch (nh) {
      case 1:
        return fn(std::integral_constant<int, 1>{});
      case 2:
        return fn(std::integral_constant<int, 2>{});
      case 3:
        return fn(std::integral_constant<int, 3>{});
      case 4:
        return fn(std::integral_constant<int, 4>{});
      case 5:
        return fn(std::integral_constant<int, 5>{});
      case 6:
        return fn(std::integral_constant<int, 6>{});
      case 7:
        if constexpr (VT::kHeadBlock >= 7) return fn(std::integral_constant<int, 7>{});
        break;
      case 8:
        if constexpr (VT::kHeadBlock >= 8) return fn(std::integral_constant<int, 8>{});
        break;
      default:
        break;
    }
  }

  // Rows [r, r + NH) × floats [d, d + 2W) of o (kFull), or [d, d + rem) (rem < 2W).
  template <int NH, bool kFull>
  void PvTile(int64_t r, const float* const* vp, int64_t nv, int64_t d, int64_t rem) {
    auto load = [&](const float* p, int j) {
      if constexpr (kFull) {
        return VT::Load(p + j * W);
      } else {
        return VT::LoadN(p + j * W, std::clamp<int64_t>(rem - j * W, 0, W));
      }
    };
    V acc[NH][2];
#pragma GCC unroll 8
    for (int h = 0; h < NH; ++h) {
      const V a = VT::Set1(sc_.alpha[r + h]);
      const float* o = sc_.o + (r + h) * hd_ + d;
#pragma GCC unroll 2
      for (int j = 0; j < 2; ++j) acc[h][j] = VT::Mul(load(o, j), a);
    }
    const float* p = sc_.s + r;
    for (int64_t c = 0; c < nv; ++c) {
      if (column_decode_) IssuePvPrefetch();
      const float* v = vp[c] + d;
      const V v0 = load(v, 0), v1 = load(v, 1);
#pragma GCC unroll 8
      for (int h = 0; h < NH; ++h) {
        const V pb = VT::Set1(p[c * rp_ + h]);
        acc[h][0] = VT::Fma(pb, v0, acc[h][0]);
        acc[h][1] = VT::Fma(pb, v1, acc[h][1]);
      }
    }
#pragma GCC unroll 8
    for (int h = 0; h < NH; ++h) {
      float* o = sc_.o + (r + h) * hd_ + d;
#pragma GCC unroll 2
      for (int j = 0; j < 2; ++j) {
        if constexpr (kFull) {
          VT::Store(o + j * W, acc[h][j]);
        } else {
          const int64_t n = std::clamp<int64_t>(rem - j * W, 0, W);
          if (n > 0) VT::StoreN(o + j * W, n, acc[h][j]);
        }
      }
    }
  }

  const PagedKv& kv_;
  int64_t n_tokens_, pos0_;
  // Under a window: the first key of the block's first and last tokens (0 without one).
  int64_t first_key_, last_first_;
  float softcap_;   // > 0: scores soft-capped (AttentionScores)
  int64_t t0_ = 0;  // the tile being run (its first key)
  int64_t group_, hd_, hd_pad_, kv_off_;
  int64_t r_, rp_, n_rv_;
  Scratch sc_;
  // Decode prefetch (Tile): planned lines, the next to issue, lines per QK step; whether the
  // row's first tile has been run.
  const char* pf_lines_[kPrefetchLines];
  int64_t pf_n_ = 0, pf_i_ = 0;
  bool pf_started_ = false;
  // Column decode prefetch streams (PlanColumnPrefetch): line d at base + d · stride, d < n.
  struct PrefetchStream {
    const char* base;
    int64_t stride, n;
  };
  PrefetchStream cpf_[4];
  int64_t n_cpf_ = 0;
  int64_t pv_pf_ = 0;  // PV's next line of the planned V streams
  void IssuePvPrefetch() {
    for (int64_t i = 1; i < n_cpf_; i += 2) {
      if (pv_pf_ < cpf_[i].n) __builtin_prefetch(cpf_[i].base + pv_pf_ * cpf_[i].stride, 0, 3);
    }
    ++pv_pf_;
  }

  bool column_decode_;  // ColumnDecode: keys in lanes over K in columns
  bool fuse_v_;         // a one-token block over bf16 V: widen V inside PV (AccumulateBf16)
  bool dot_;            // bf16 dot products (PagedKv::bf16_dot at a VT::kBf16Dot level)
};

template <class VT>
void Block(const float* q, int64_t q_stride, int64_t n_tokens, int64_t pos0, const PagedKv& kv,
           int64_t kv_head, int64_t group, int64_t head_dim, float scale, float* scratch,
           float* out, int64_t out_stride, AttentionScores scores) {
  BlockKernel<VT> k(q, q_stride, n_tokens, pos0, kv, kv_head, group, head_dim, scale, scratch,
                    scores);
  const Scratch& sc = k.scratch();
  const int64_t r = k.rows();
  // The folded output lives in `out` until it is normalized.
  for (int64_t i = 0; i < r; ++i) {
    sc.mo[i] = kNegInf;
    sc.lo[i] = 0.0f;
    std::fill_n(out + (i / group) * out_stride + (i % group) * head_dim, head_dim, 0.0f);
  }
  // Segments before the first token's window are skipped; a later token's segments (and tiles)
  // before its own window fold as exact no-ops (m = -inf, l = 0, o = 0), so its result is
  // the same as alone.
  const int64_t n_seg = AttentionSegments(pos0 + n_tokens);
  for (int64_t seg = k.FirstSegment(); seg < n_seg; ++seg) {
    k.RunSegment(seg);
    // Tokens whose keys reach into this segment fold it.
    for (int64_t i = k.FirstToken(seg * kAttentionSegment) * group; i < r; ++i) {
      Fold<VT>(&sc.mo[i], &sc.lo[i], out + (i / group) * out_stride + (i % group) * head_dim,
               sc.m[i], sc.l[i], sc.o + i * head_dim, head_dim);
    }
    if (seg + 1 < n_seg) k.ResetSegment();
  }
  for (int64_t i = 0; i < r; ++i) {
    float* o = out + (i / group) * out_stride + (i % group) * head_dim;
    const float inv = 1.0f / sc.lo[i];
    for (int64_t d = 0; d < head_dim; ++d) o[d] *= inv;
  }
}

template <class VT>
void Partials(const float* q, int64_t pos, const PagedKv& kv, int64_t kv_head, int64_t group,
              int64_t head_dim, float scale, int64_t seg_begin, int64_t seg_end, float* scratch,
              float* partials, AttentionScores scores) {
  BlockKernel<VT> k(q, group * head_dim, 1, pos, kv, kv_head, group, head_dim, scale, scratch,
                    scores);
  const int64_t pf = AttentionPartialFloats(group, head_dim);
  for (int64_t seg = seg_begin; seg < seg_end; ++seg) {
    if (seg > seg_begin) k.ResetSegment();
    k.RunSegment(seg);
    k.WritePartial(partials + (seg - seg_begin) * pf);
  }
}

// Partials for several KV heads of one decode row: head g's kernel over kv[g] (its head at
// kv_head 0, as KvCache::View gives it), q + g·group·head_dim, partials + g·head_partials. The
// heads run tile by tile in turn, so a block's K and V of every head — adjacent in KvCache's
// pages — are read within one tile's time instead of once per head and segment. Each head's
// kernel runs the very tiles Partials would, in the same order: same bits.
template <class VT>
void PartialsHeads(const float* q, int64_t pos, const PagedKv* kv, int64_t n_heads, int64_t group,
                   int64_t head_dim, float scale, int64_t seg_begin, int64_t seg_end,
                   float* scratch, float* partials, int64_t head_partials, AttentionScores scores) {
  const int64_t per = ScratchFloats(1, group, head_dim),
                pf = AttentionPartialFloats(group, head_dim);
  for (int64_t g0 = 0; g0 < n_heads; g0 += kAttentionHeadsTogether) {
    const int64_t ng = std::min(kAttentionHeadsTogether, n_heads - g0);
    std::optional<BlockKernel<VT>> k[kAttentionHeadsTogether];
    for (int64_t g = 0; g < ng; ++g) {
      k[g].emplace(q + (g0 + g) * group * head_dim, group * head_dim, 1, pos, kv[g0 + g], 0, group,
                   head_dim, scale, scratch + g * per, scores);
    }
    for (int64_t seg = seg_begin; seg < seg_end; ++seg) {
      if (seg > seg_begin) {
        for (int64_t g = 0; g < ng; ++g) k[g]->ResetSegment();
      }
      const int64_t end = std::min(pos + 1, (seg + 1) * kAttentionSegment);
      for (int64_t t0 = std::max(seg * kAttentionSegment, k[0]->FirstTile()); t0 < end;
           t0 += kAttentionTile) {
        for (int64_t g = 0; g < ng; ++g) k[g]->RunTile(t0);
      }
      for (int64_t g = 0; g < ng; ++g) {
        k[g]->WritePartial(partials + (g0 + g) * head_partials + (seg - seg_begin) * pf);
      }
    }
  }
}

template <class VT>
void Merge(const float* partials, int64_t n_segments, int64_t group, int64_t head_dim, float* out) {
  const int64_t pf = AttentionPartialFloats(group, head_dim);
  for (int64_t h = 0; h < group; ++h) {
    float mo = kNegInf, lo = 0.0f;
    float* o = out + h * head_dim;
    std::fill_n(o, head_dim, 0.0f);
    for (int64_t seg = 0; seg < n_segments; ++seg) {
      const float* part = partials + seg * pf;
      Fold<VT>(&mo, &lo, o, part[h], part[group + h], part + 2 * group + h * head_dim, head_dim);
    }
    const float inv = 1.0f / lo;
    for (int64_t d = 0; d < head_dim; ++d) o[d] *= inv;
  }
}

// The scalar level's vector: one lane.
struct ScalarVec {
  using V = float;
  static constexpr bool kBf16Dot = false;  // the f32 arithmetic on widened bf16 values
  static constexpr int64_t kLanes = 1;
  static constexpr int kKeyGroup = 8;
  static constexpr int64_t kHeadBlock = 8;
  static V Zero() { return 0.0f; }
  static V LoadBf16(const uint16_t* p) {
    const uint32_t u = static_cast<uint32_t>(*p) << 16;
    float f;
    std::memcpy(&f, &u, sizeof(f));
    return f;
  }
  static V Set1(float x) { return x; }
  static V Load(const float* p) { return *p; }
  static V LoadN(const float* p, int64_t n) { return n > 0 ? *p : 0.0f; }
  static void Store(float* p, V v) { *p = v; }
  static void StoreN(float* p, int64_t n, V v) {
    if (n > 0) *p = v;
  }
  static V Fma(V a, V b, V c) { return std::fma(a, b, c); }
  static V Mul(V a, V b) { return a * b; }
  static V Add(V a, V b) { return a + b; }
  static V Sub(V a, V b) { return a - b; }
  static V Max(V a, V b) { return a > b ? a : b; }
  static V Exp(V x) { return std::exp(x); }
  static V Tanh(V x) { return std::tanh(x); }
  static V ZeroIfNegInf(V m) { return m == kNegInf ? 0.0f : m; }
  // s where pos ≥ key, else fill.
  static V MaskBelow(V pos, float key, V s, V fill) { return pos < key ? fill : s; }
};

}  // namespace
}  // namespace chorus::kernels::attention_internal
