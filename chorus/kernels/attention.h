// Causal attention of one query token over a paged KV cache (docs/architecture.md, "Memory tiers",
// Punica §5.4).
//
// KV layout: the cache is cut into blocks of `block_size` tokens. For one layer, token t of a
// sequence lives in block block_table[t / block_size] at slot t % block_size; K of that token is
// the contiguous [n_kv_heads * head_dim] floats at
//     k_blocks[block_table[t / block_size]] + (t % block_size) * kv_stride
// and V likewise under v_blocks; KV head g is the head_dim floats at offset g · head_dim.
// (The memory module owns the pool; this kernel only reads it.)
//
// For query head h (kv head g = h / (n_heads / n_kv_heads), grouped-query attention):
//     s_t   = scale · q[h] · K_t[g]            for t in [0, n_ctx)
//     p     = softmax(s)
//     out[h] = Σ_t p_t · V_t[g]
// n_ctx includes the query's own position (causal: the caller passes pos + 1).
//
// Batch-invariant: the result depends only on q and the sequence's own KV.
// The reference is the two-pass softmax (scores in `scratch`); the AVX2 kernel (also used at the
// AVX-512 level) computes the softmax online over chunks of 32 tokens, reading each K/V row once
// per group of up to 8 query heads, and agrees with the reference to ~1e-6 (tested at 2e-5 abs).
#pragma once

#include <cstdint>

namespace chorus::kernels {

struct PagedKv {
  const float* const* k_blocks =
      nullptr;  // [n_blocks_total] base pointer of each block's K (this layer)
  const float* const* v_blocks =
      nullptr;  // [n_blocks_total] base pointer of each block's V (this layer)
  const int32_t* block_table = nullptr;  // [ceil(n_ctx / block_size)] block ids of this sequence
  int64_t block_size = 16;               // tokens per block
  int64_t kv_stride = 0;                 // floats between consecutive tokens in a block
};

// q: [n_heads, head_dim]; out: [n_heads, head_dim]; scratch: at least n_ctx floats.
void AttentionRow(const float* q, const PagedKv& kv, int64_t n_ctx, int64_t n_heads,
                  int64_t n_kv_heads, int64_t head_dim, float scale, float* scratch, float* out);

namespace reference {
void AttentionRow(const float* q, const PagedKv& kv, int64_t n_ctx, int64_t n_heads,
                  int64_t n_kv_heads, int64_t head_dim, float scale, float* scratch, float* out);
}  // namespace reference

}  // namespace chorus::kernels
