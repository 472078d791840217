// Internal: the x86 variants of the attention kernels (attention.h). Only the dispatcher
// (attention.cc) and the tests call these, after checking ActiveIsa(); calling a variant the CPU
// does not support faults. Semantics are those of the public kernels.
#pragma once

#include <cstdint>

#include "chorus/kernels/attention.h"

#define CHORUS_X86_ATTENTION_DECLS                                                                \
  void AttentionBlock(const float* q, int64_t q_stride, int64_t n_tokens, int64_t pos0,           \
                      const PagedKv& kv, int64_t kv_head, int64_t group, int64_t head_dim,        \
                      float scale, float* scratch, float* out, int64_t out_stride,                \
                      AttentionScores scores);                                                    \
  void AttentionPartials(const float* q, int64_t pos, const PagedKv& kv, int64_t kv_head,         \
                         int64_t group, int64_t head_dim, float scale, int64_t seg_begin,         \
                         int64_t seg_end, float* scratch, float* partials,                        \
                         AttentionScores scores);                                                 \
  void AttentionPartialsHeads(const float* q, int64_t pos, const PagedKv* kv, int64_t n_heads,    \
                              int64_t group, int64_t head_dim, float scale, int64_t seg_begin,    \
                              int64_t seg_end, float* scratch, float* partials,                   \
                              int64_t head_partials, AttentionScores scores);                     \
  void AttentionMerge(const float* partials, int64_t n_segments, int64_t group, int64_t head_dim, \
                      float* out);

namespace chorus::kernels::avx2 {
CHORUS_X86_ATTENTION_DECLS
}  // namespace chorus::kernels::avx2

namespace chorus::kernels::avx512 {
CHORUS_X86_ATTENTION_DECLS
// dst[j] = attention_internal::Bf16Pair(scale · src[2j], scale · src[2j + 1]) for j < 16, bit for
// bit (the bf16 dot products' q packing, attention_tiles.h). Needs AVX-512 F and BW.
void ScaledBf16Pairs16(const float* src, float scale, uint32_t* dst);
}  // namespace chorus::kernels::avx512

#undef CHORUS_X86_ATTENTION_DECLS
