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
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "chorus/kernels/attention.h"

namespace chorus::kernels::attention_internal {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// Rows of a block are padded to a multiple of this (the widest level's lanes), so that the
// scratch size does not depend on the level.
constexpr int64_t kRowPad = 16;

inline int64_t RoundUp(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// Scratch of a block of r rows (rp = r padded), carved from the caller's buffer.
struct Scratch {
  float* qt;      // [head_dim][rp] scale·q, transposed
  float* s;       // [kAttentionTile][rp] scores, then probabilities, of the current tile
  float* m;       // [rp] running max of the current segment
  float* l;       // [rp] running sum of the current segment
  float* alpha;   // [rp] rescale of the current tile
  float* rowpos;  // [rp] position of each row's token (padding rows: +inf, never masked)
  float* o;       // [r][head_dim] unnormalized output of the current segment
  float* mo;      // [r] folded max over the finished segments
  float* lo;      // [r] folded sum over the finished segments
  float* kt;      // [kAttentionTile][hd] the tile's K rows widened to f32 (bf16 blocks only)
  float* vt;      // [kAttentionTile][hd] its V rows likewise
};

inline int64_t ScratchFloats(int64_t n_tokens, int64_t group, int64_t head_dim) {
  const int64_t r = n_tokens * group, rp = RoundUp(r, kRowPad);
  const int64_t hd = RoundUp(head_dim, 16);
  return rp * (hd + kAttentionTile + 4) + r * hd + 2 * RoundUp(r, 16) + 2 * kAttentionTile * hd +
         16 * 14;
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
  s.o = p, p = align(p + r * hd);
  s.mo = p, p = align(p + RoundUp(r, 16));
  s.lo = p, p = align(p + RoundUp(r, 16));
  s.kt = p, p = align(p + kAttentionTile * hd);
  s.vt = p;
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
              int64_t kv_head, int64_t group, int64_t head_dim, float scale, float* scratch)
      : kv_(kv),
        n_tokens_(n_tokens),
        pos0_(pos0),
        group_(group),
        hd_(head_dim),
        hd_pad_(RoundUp(head_dim, 16)),
        kv_off_(kv_head * (kv.head_stride > 0 ? kv.head_stride : head_dim)),
        r_(n_tokens * group),
        rp_(RoundUp(r_, kRowPad)),
        n_rv_((r_ + W - 1) / W),
        sc_(CarveScratch(scratch, n_tokens, group, head_dim)) {
    // qt[d][r] = scale · q[token][head][d]; padding rows are 0 (and never masked).
    for (int64_t i = 0, r = 0; i < n_tokens_; ++i) {
      for (int64_t h = 0; h < group_; ++h, ++r) {
        const float* src = q + i * q_stride + h * hd_;
        for (int64_t d = 0; d < hd_; ++d) sc_.qt[d * rp_ + r] = scale * src[d];
        sc_.rowpos[r] = static_cast<float>(pos0_ + i);
      }
    }
    for (int64_t r = r_; r < rp_; ++r) {
      for (int64_t d = 0; d < hd_; ++d) sc_.qt[d * rp_ + r] = 0.0f;
      sc_.rowpos[r] = std::numeric_limits<float>::infinity();
    }
    ResetSegment();
  }

  int64_t rows() const { return r_; }
  const Scratch& scratch() const { return sc_; }

  // The segment's running state back to empty (m = -inf, l = 0, o = 0).
  void ResetSegment() {
    for (int64_t r = 0; r < rp_; ++r) sc_.m[r] = kNegInf, sc_.l[r] = 0.0f;
    std::fill(sc_.o, sc_.o + r_ * hd_, 0.0f);
  }

  // Runs the tiles of segment `seg` (keys [seg·S, min((seg+1)·S, pos0 + n_tokens))) for every
  // token whose position reaches into it.
  void RunSegment(int64_t seg) {
    const int64_t end = pos0_ + n_tokens_;  // keys of the last token
    const int64_t seg_end = std::min(end, (seg + 1) * kAttentionSegment);
    for (int64_t t0 = seg * kAttentionSegment; t0 < seg_end; t0 += kAttentionTile) {
      Tile(t0, std::min<int64_t>(kAttentionTile, end - t0));
    }
  }

  // First token whose position is ≥ key t (it and every later one attend to key t).
  int64_t FirstToken(int64_t t) const { return std::max<int64_t>(0, t - pos0_); }

 private:
  void Tile(int64_t t0, int64_t nk) {
    const int64_t ft = FirstToken(t0);
    const int64_t rv0 = ft * group_ / W;  // row vectors before it hold only masked rows
    const float* kp[kAttentionTile];
    const float* vp[kAttentionTile];
    // One division per tile; the slot then walks the blocks.
    int64_t bi = t0 / kv_.block_size, slot = t0 % kv_.block_size;
    for (int64_t c = 0; c < nk; ++c) {
      const int64_t off = slot * kv_.kv_stride + kv_off_;
      const int32_t block = kv_.block_table[bi * kv_.table_stride];
      if (kv_.dtype == KvDtype::kF32) {
        kp[c] = kv_.k_blocks[block] + off;
        vp[c] = kv_.v_blocks[block] + off;
      } else {  // bf16: widen the rows once per tile (exact), then the same f32 arithmetic
        kp[c] = Widen(reinterpret_cast<const uint16_t*>(kv_.k_blocks[block]) + off,
                      sc_.kt + c * hd_pad_);
        vp[c] = Widen(reinterpret_cast<const uint16_t*>(kv_.v_blocks[block]) + off,
                      sc_.vt + c * hd_pad_);
      }
      if (++slot == kv_.block_size) slot = 0, ++bi;
    }
    // Past the last key the group of keys repeats it; those scores are never used.
    for (int64_t c = nk; c < kAttentionTile; ++c) kp[c] = kp[nk - 1];
    Scores(kp, nk, rv0);
    // Keys past some processed row's position: the tile reaches beyond the first row's token.
    const bool diag = t0 + nk - 1 > pos0_ + rv0 * W / group_;
    Softmax(t0, nk, rv0, diag);
    for (int64_t i = ft; i < n_tokens_; ++i) {
      const int64_t nv = std::min<int64_t>(nk, pos0_ + i + 1 - t0);
      Accumulate(i, vp, nv);
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
  void Scores(const float* const* kp, int64_t nk, int64_t rv0) {
    for (int64_t c0 = 0; c0 < nk; c0 += VT::kKeyGroup) {
      int64_t rv = rv0;
      for (; rv + 2 <= n_rv_; rv += 2) ScoreTile<2>(kp + c0, c0, rv);
      if (rv < n_rv_) ScoreTile<1>(kp + c0, c0, rv);
    }
  }

  template <int NV>
  void ScoreTile(const float* const* kp, int64_t c0, int64_t rv) {
    constexpr int NK = VT::kKeyGroup;
    V acc[NV][NK];
#pragma GCC unroll 16
    for (int i = 0; i < NV; ++i) {
#pragma GCC unroll 16
      for (int j = 0; j < NK; ++j) acc[i][j] = VT::Zero();
    }
    const float* qt = sc_.qt + rv * W;
    for (int64_t d = 0; d < hd_; ++d) {
      V qv[NV];
#pragma GCC unroll 16
      for (int i = 0; i < NV; ++i) qv[i] = VT::Load(qt + d * rp_ + i * W);
#pragma GCC unroll 16
      for (int j = 0; j < NK; ++j) {
        const V kb = VT::Set1(kp[j][d]);
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

  void Softmax(int64_t t0, int64_t nk, int64_t rv0, bool diag) {
    const V neg_inf = VT::Set1(kNegInf);
    for (int64_t rv = rv0; rv < n_rv_; ++rv) {
      const int64_t off = rv * W;
      const V pos = VT::Load(sc_.rowpos + off);
      V mt = neg_inf;
      for (int64_t c = 0; c < nk; ++c) {
        float* sp = sc_.s + c * rp_ + off;
        V s = VT::Load(sp);
        if (diag) {
          s = VT::MaskBelow(pos, static_cast<float>(t0 + c), s, neg_inf);
          VT::Store(sp, s);
        }
        mt = VT::Max(mt, s);
      }
      const V m_old = VT::Load(sc_.m + off);
      const V m_new = VT::Max(m_old, mt);
      const V mu = VT::ZeroIfNegInf(m_new);
      const V alpha = VT::Exp(VT::Sub(m_old, mu));
      V sum = VT::Zero();
      for (int64_t c = 0; c < nk; ++c) {
        float* sp = sc_.s + c * rp_ + off;
        const V p = VT::Exp(VT::Sub(VT::Load(sp), mu));
        VT::Store(sp, p);
        sum = VT::Add(sum, p);
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
  int64_t n_tokens_, pos0_, group_, hd_, hd_pad_, kv_off_;
  int64_t r_, rp_, n_rv_;
  Scratch sc_;
};

template <class VT>
void Block(const float* q, int64_t q_stride, int64_t n_tokens, int64_t pos0, const PagedKv& kv,
           int64_t kv_head, int64_t group, int64_t head_dim, float scale, float* scratch,
           float* out, int64_t out_stride) {
  BlockKernel<VT> k(q, q_stride, n_tokens, pos0, kv, kv_head, group, head_dim, scale, scratch);
  const Scratch& sc = k.scratch();
  const int64_t r = k.rows();
  // The folded output lives in `out` until it is normalized.
  for (int64_t i = 0; i < r; ++i) {
    sc.mo[i] = kNegInf;
    sc.lo[i] = 0.0f;
    std::fill_n(out + (i / group) * out_stride + (i % group) * head_dim, head_dim, 0.0f);
  }
  const int64_t n_seg = AttentionSegments(pos0 + n_tokens);
  for (int64_t seg = 0; seg < n_seg; ++seg) {
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
              float* partials) {
  BlockKernel<VT> k(q, group * head_dim, 1, pos, kv, kv_head, group, head_dim, scale, scratch);
  const Scratch& sc = k.scratch();
  const int64_t pf = AttentionPartialFloats(group, head_dim);
  for (int64_t seg = seg_begin; seg < seg_end; ++seg) {
    if (seg > seg_begin) k.ResetSegment();
    k.RunSegment(seg);
    float* part = partials + (seg - seg_begin) * pf;
    std::copy_n(sc.m, group, part);
    std::copy_n(sc.l, group, part + group);
    std::copy_n(sc.o, group * head_dim, part + 2 * group);
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
  static V ZeroIfNegInf(V m) { return m == kNegInf ? 0.0f : m; }
  // s where pos ≥ key, else fill.
  static V MaskBelow(V pos, float key, V s, V fill) { return pos < key ? fill : s; }
};

}  // namespace
}  // namespace chorus::kernels::attention_internal
