// Causal attention of one query token over a paged KV cache (DESIGN §3, Punica §5.4).
//
// KV layout: the cache is cut into blocks of `block_size` tokens. For one layer, token t of a
// sequence lives in block block_table[t / block_size] at slot t % block_size; K of that token is
// the contiguous [n_kv_heads * head_dim] floats at
//     k_base[block_table[t / block_size]] + (t % block_size) * kv_stride
// and V likewise under v_base. (The memory module owns the pool; this kernel only reads it.)
//
// For query head h (kv head g = h / (n_heads / n_kv_heads), grouped-query attention):
//     s_t   = scale · q[h] · K_t[g]            for t in [0, n_ctx)
//     p     = softmax(s)
//     out[h] = Σ_t p_t · V_t[g]
// n_ctx includes the query's own position (causal: the caller passes pos + 1).
//
// Batch-invariant: the result depends only on q and the sequence's own KV.
#pragma once

#include <cstdint>

namespace chorus::kernels {

struct PagedKv {
  const float* const* k_blocks = nullptr;  // [n_blocks_total] base pointer of each block's K (this layer)
  const float* const* v_blocks = nullptr;  // [n_blocks_total] base pointer of each block's V (this layer)
  const int32_t* block_table = nullptr;    // [ceil(n_ctx / block_size)] block ids of this sequence
  int64_t block_size = 16;                 // tokens per block
  int64_t kv_stride = 0;                   // floats between consecutive tokens in a block
};

// q: [n_heads, head_dim]; out: [n_heads, head_dim]; scratch: at least n_ctx floats.
void AttentionRow(const float* q, const PagedKv& kv, int64_t n_ctx, int64_t n_heads,
                  int64_t n_kv_heads, int64_t head_dim, float scale, float* scratch, float* out);

namespace reference {
void AttentionRow(const float* q, const PagedKv& kv, int64_t n_ctx, int64_t n_heads,
                  int64_t n_kv_heads, int64_t head_dim, float scale, float* scratch, float* out);
}  // namespace reference

}  // namespace chorus::kernels
