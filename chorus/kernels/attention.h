// Causal attention over a paged KV cache (docs/architecture.md, "Memory tiers" and "Attention").
//
// KV layout: the cache is cut into blocks of `block_size` tokens. For one layer, token t of a
// sequence lives in block block_table[t / block_size · table_stride] at slot t % block_size; the
// head_dim floats of K of that token for KV head g start at
//     k_blocks[block_table[t / block_size · table_stride]] + (t % block_size) * kv_stride
//         + g * head_stride
// and V likewise under v_blocks. Two layouts are expressed this way: token-major blocks
// ([slot][kv_head][head_dim]: kv_stride = n_kv_heads·head_dim, head_stride = head_dim) and the
// head-major blocks KvCache uses ([kv_head][slot][head_dim]: kv_stride = head_dim, head_stride
// = block_size·head_dim), in which one head's keys of a block are contiguous.
// KvCache stores K of a block in columns instead (k_columns): for each KV head, head_dim rows of
// block_size slots, element (t, d) of head g at
//     k_blocks[block] + g * head_stride + d * block_size + (t % block_size)
// so the d-th element of 16 consecutive keys is one 64-byte line, which a decode row loads as a
// vector with one key per lane (docs/kernels.md, "K in columns"). V keeps the row layout.
// (The memory module owns the pool; these kernels only read it.)
//
// For query head h (kv head g = h / (n_heads / n_kv_heads), grouped-query attention) of a token
// at position p (n_ctx = p + 1 keys, causal):
//     s_t   = scale · q[h] · K_t[g]            for t in [0, n_ctx)
//     p     = softmax(s)
//     out[h] = Σ_t p_t · V_t[g]
// reference::AttentionRow is this formula as written (scores, two-pass softmax, weighted sum):
// the specification every fast kernel is tested against.
//
// The fast kernels (FlashAttention's scheme on a CPU) never materialize a score row. How they
// order the arithmetic is fixed per query row so that a row's bits never depend on the other rows
// of the step, on how its prompt was chunked, or on how threads split the work (batch
// invariance, docs/architecture.md "Kernels and batch invariance"):
//  * Keys are cut into tiles of kAttentionTile at absolute positions [32j, 32j + 32), and tiles
//    into segments of kAttentionSegment keys at absolute positions [512i, 512i + 512).
//  * Within a segment a row keeps a running max m, sum l and unnormalized output o, updated tile
//    by tile in key order (online softmax); a key past the row's own position is masked (score
//    -inf, probability exactly 0, its V never read for that row).
//  * Score t of a row is one FMA chain over d = 0 … head_dim−1 of (scale·q)[d]·K_t[d]; a tile's
//    probabilities are summed in key order; o accumulates p_t·V_t in key order.
//  * The row's segments are folded left to right into (M, L, O) (AttentionMerge's formula), and
//    the result is O / L.
// A block of query tokens shares each K/V tile it loads among all its (token, head) rows, but
// every row goes through exactly the instructions it would alone; split-K (AttentionPartials on
// disjoint segment ranges, then AttentionMerge) computes the very same per-segment partials and
// folds them in the same order. So AttentionBlock over any chunking, AttentionBlock of one token
// and AttentionPartials + AttentionMerge over any split of the segments agree bit for bit (at one
// ISA level), and agree with the reference to ~1e-6 (tested at 2e-5 absolute).
#pragma once

#include <cstdint>

namespace chorus::kernels {

// Element type of the KV blocks. kBf16: the block pointers hold bfloat16 bits (uint16_t), and
// kv_stride / head_stride count elements; the kernels widen each tile's rows to f32 (exact), so
// they compute on exactly the values the cache holds, with the f32 arithmetic below.
enum class KvDtype : uint8_t { kF32, kBf16 };

struct PagedKv {
  const float* const* k_blocks =
      nullptr;  // [n_blocks_total] base pointer of each block's K (this layer)
  const float* const* v_blocks =
      nullptr;  // [n_blocks_total] base pointer of each block's V (this layer)
  // Block id of this sequence's tokens [i·block_size, (i+1)·block_size) at
  // block_table[i·table_stride] (the KV cache interleaves the tables of its layer groups).
  const int32_t* block_table = nullptr;
  int64_t table_stride = 1;
  int64_t block_size = 16;  // tokens per block
  int64_t kv_stride = 0;    // floats between consecutive tokens in a block
  int64_t head_stride = 0;  // floats between consecutive KV heads of a token; 0: head_dim
  KvDtype dtype = KvDtype::kF32;
  // K in columns (above): kv_stride applies to V only, and head_stride (≥ block_size ·
  // head_dim) to both.
  bool k_columns = false;
  // bf16 blocks only: compute with bf16 products (docs/kernels.md, "bf16 dot products") where
  // the level has them (AVX-512: vdpbf16ps): scale·q and each tile's probabilities are rounded
  // to bf16 (nearest even), and a score is a chain over pairs of elements d = (2j, 2j + 1) —
  // acc += q[2j+1]·K[2j+1], then acc += q[2j]·K[2j], each one rounding (vdpbf16ps, denormals
  // flushed) — and o a chain over pairs of keys likewise; l sums the rounded probabilities. Half
  // the instructions of the f32 arithmetic for the same work. The batch-invariance rule holds
  // unchanged (pairs at absolute positions). Ignored (the f32 arithmetic on widened values) at
  // other levels, for an odd head_dim and for f32 blocks. KvCache sets it for bf16 caches.
  bool bf16_dot = false;

  // Key t's row of K (V) for KV head `kv_head`, widened to f32 into `buf` (head_dim floats)
  // when the blocks are bf16 or K is stored in columns; the row itself otherwise.
  const float* KeyRow(int64_t t, int64_t kv_head, int64_t head_dim, float* buf) const {
    if (!k_columns) return Row(k_blocks, t, kv_head, head_dim, buf);
    const int64_t off = kv_head * head_stride + t % block_size;
    const float* base = k_blocks[block_table[t / block_size * table_stride]];
    for (int64_t d = 0; d < head_dim; ++d) {
      buf[d] = dtype == KvDtype::kF32
                   ? base[off + d * block_size]
                   : Bf16(reinterpret_cast<const uint16_t*>(base)[off + d * block_size]);
    }
    return buf;
  }

  const float* ValueRow(int64_t t, int64_t kv_head, int64_t head_dim, float* buf) const {
    return Row(v_blocks, t, kv_head, head_dim, buf);
  }
  const float* Row(const float* const* blocks, int64_t t, int64_t kv_head, int64_t head_dim,
                   float* buf) const {
    const int64_t off =
        (t % block_size) * kv_stride + kv_head * (head_stride > 0 ? head_stride : head_dim);
    const float* base = blocks[block_table[t / block_size * table_stride]];
    if (dtype == KvDtype::kF32) return base + off;
    const auto* h = reinterpret_cast<const uint16_t*>(base) + off;
    for (int64_t d = 0; d < head_dim; ++d) buf[d] = Bf16(h[d]);
    return buf;
  }
  // bf16 bits widened to f32 (into the high half: exact).
  static float Bf16(uint16_t h) {
    const uint32_t u = static_cast<uint32_t>(h) << 16;
    float f;
    __builtin_memcpy(&f, &u, 4);
    return f;
  }
};

inline constexpr int64_t kAttentionTile = 32;      // keys per tile (absolute positions)
inline constexpr int64_t kAttentionSegment = 512;  // keys per segment, a multiple of the tile

// Segments of a row with n_ctx keys.
inline int64_t AttentionSegments(int64_t n_ctx) {
  return (n_ctx + kAttentionSegment - 1) / kAttentionSegment;
}
// Floats of scratch AttentionBlock / AttentionPartials need for a block of `n_tokens` tokens
// (64-byte alignment slack included).
int64_t AttentionScratchFloats(int64_t n_tokens, int64_t group, int64_t head_dim);
// Floats of one segment's partial for one KV head: m[group], l[group], o[group][head_dim].
inline int64_t AttentionPartialFloats(int64_t group, int64_t head_dim) {
  return group * (head_dim + 2);
}

// Sliding windows (`window` > 0, Phi-3, Gemma's local layers): a token at position p
// attends keys [AttentionFirstKey(p, window), p] only. Keys before that first key are masked as
// keys past p are (probability exactly 0), tiles and segments wholly before the first token's
// first key are never run — nor their KV blocks looked up, so blocks a windowed cache dropped
// behind the window (KvCache::DropBehindWindows) may be gone from the table — and a later token's
// tiles and segments before its own first key fold as exact no-ops. So the batch-invariance rule
// above holds unchanged with windows. window = 0: no window.
inline int64_t AttentionFirstKey(int64_t pos, int64_t window) {
  return window > 0 && pos >= window ? pos - window + 1 : 0;
}

// How a layer shapes its scores (the default: plain causal attention).
// Soft-capping (`softcap` > 0, Gemma 2): each score s = scale·q·k becomes softcap·tanh(s /
// softcap) before the softmax, with the level's own tanh (from its Exp: ±(1 − e)/(1 + e),
// e = exp(−2|x|)), in Softmax's pass and the column decode alike, so a score's bits are again a
// function of its row and key only.
struct AttentionScores {
  int64_t window = 0;    // > 0: a sliding window (above)
  float softcap = 0.0f;  // > 0: soft-capped scores
};

// Tokens i ∈ [0, n_tokens) of one sequence at positions pos0 + i, each attending keys
// [AttentionFirstKey(pos0 + i, scores.window), pos0 + i], with scores shaped by `scores`, for the
// `group` query heads of KV head `kv_head`.
// q: token i's heads at q + i·q_stride, [group, head_dim]; out likewise with out_stride.
// Requires: K/V of positions [AttentionFirstKey(pos0, scores.window), pos0 + n_tokens) written;
// scratch ≥ AttentionScratchFloats.
void AttentionBlock(const float* q, int64_t q_stride, int64_t n_tokens, int64_t pos0,
                    const PagedKv& kv, int64_t kv_head, int64_t group, int64_t head_dim,
                    float scale, float* scratch, float* out, int64_t out_stride,
                    AttentionScores scores = {});

// Split-K: the unnormalized partials of segments [seg_begin, seg_end) of one token at position
// `pos` (its group heads of `kv_head`); partials: (seg_end − seg_begin) × AttentionPartialFloats.
// Under a window, a segment before AttentionFirstSegment is an empty partial (m = -inf, l = 0,
// o = 0), which AttentionMerge folds as a no-op; callers start at the first segment.
// Requires: seg_end ≤ AttentionSegments(pos + 1); scratch ≥ AttentionScratchFloats(1, …).
void AttentionPartials(const float* q, int64_t pos, const PagedKv& kv, int64_t kv_head,
                       int64_t group, int64_t head_dim, float scale, int64_t seg_begin,
                       int64_t seg_end, float* scratch, float* partials,
                       AttentionScores scores = {});
// The segment that holds a token's first key under `window`.
inline int64_t AttentionFirstSegment(int64_t pos, int64_t window) {
  return AttentionFirstKey(pos, window) / kAttentionSegment;
}
// AttentionPartials for KV heads 0 … n_heads−1 of one token at once, bit for bit the same:
// head g reads kv[g] (its KV head at kv_head 0, as KvCache::View gives one head), its query
// heads at q + g·group·head_dim, and writes its partials at partials + g·head_partials. The
// heads advance tile by tile together (up to kAttentionHeadsTogether at a time), so a block's
// K and V of all heads, which KvCache stores side by side, stream from memory as one run.
// Requires: scratch ≥ AttentionPartialsHeadsScratchFloats(n_heads, group, head_dim).
inline constexpr int64_t kAttentionHeadsTogether = 8;
void AttentionPartialsHeads(const float* q, int64_t pos, const PagedKv* kv, int64_t n_heads,
                            int64_t group, int64_t head_dim, float scale, int64_t seg_begin,
                            int64_t seg_end, float* scratch, float* partials, int64_t head_partials,
                            AttentionScores scores = {});
int64_t AttentionPartialsHeadsScratchFloats(int64_t n_heads, int64_t group, int64_t head_dim);
// Folds n_segments partials left to right and normalizes: out [group, head_dim].
void AttentionMerge(const float* partials, int64_t n_segments, int64_t group, int64_t head_dim,
                    float* out);

// All heads of one token: AttentionBlock of one token per KV head.
// q: [n_heads, head_dim]; out: [n_heads, head_dim]; scratch ≥ AttentionScratchFloats(1, group,
// head_dim).
void AttentionRow(const float* q, const PagedKv& kv, int64_t n_ctx, int64_t n_heads,
                  int64_t n_kv_heads, int64_t head_dim, float scale, float* scratch, float* out);

namespace reference {
// The specification; scratch: at least n_ctx floats.
void AttentionRow(const float* q, const PagedKv& kv, int64_t n_ctx, int64_t n_heads,
                  int64_t n_kv_heads, int64_t head_dim, float scale, float* scratch, float* out);
// The specification of windows and soft-capping (AttentionScores): the `group` query heads of
// one token at position `pos` over keys [first, pos] of one KV head (kv already restricted to it,
// as KvCache::View gives), with scores s = scale·q·k, then s = softcap·tanh(s / softcap) when
// softcap > 0, softmax, Σ p·V, in key order.
// q, out: [group, head_dim]; scratch ≥ pos + 1 − first + head_dim floats.
void AttentionRowWindow(const float* q, int64_t first, int64_t pos, const PagedKv& kv,
                        int64_t group, int64_t head_dim, float scale, float softcap, float* scratch,
                        float* out);
}  // namespace reference

}  // namespace chorus::kernels
