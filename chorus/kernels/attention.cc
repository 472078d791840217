// Run-time selection of the tiled attention kernels (attention.h): one table indexed by the
// active ISA level. The scalar level runs the same tiled code with one-lane vectors
// (attention_tiles.h).
#include "chorus/kernels/attention.h"

#include <algorithm>
#include <cmath>

#include "chorus/base/check.h"
#include "chorus/kernels/attention_tiles.h"
#include "chorus/kernels/dispatch.h"
#include "chorus/kernels/x86/attention_x86.h"

namespace chorus::kernels {

using attention_internal::ScalarVec;

int64_t AttentionScratchFloats(int64_t n_tokens, int64_t group, int64_t head_dim) {
  return attention_internal::ScratchFloats(n_tokens, group, head_dim);
}

namespace {

// The tiled kernels at each ISA level: one table, indexed by IsaLevel. The scalar level runs
// the same tiled code with one-lane vectors; the amx level the AVX-512 kernels.
struct AttentionKernels {
  decltype(&avx2::AttentionBlock) block;
  decltype(&avx2::AttentionPartials) partials;
  decltype(&avx2::AttentionPartialsHeads) partials_heads;
  decltype(&avx2::AttentionMerge) merge;
};

void ScalarBlock(const float* q, int64_t q_stride, int64_t n_tokens, int64_t pos0,
                 const PagedKv& kv, int64_t kv_head, int64_t group, int64_t head_dim, float scale,
                 float* scratch, float* out, int64_t out_stride, AttentionScores scores) {
  attention_internal::Block<ScalarVec>(q, q_stride, n_tokens, pos0, kv, kv_head, group, head_dim,
                                       scale, scratch, out, out_stride, scores);
}
void ScalarPartials(const float* q, int64_t pos, const PagedKv& kv, int64_t kv_head, int64_t group,
                    int64_t head_dim, float scale, int64_t seg_begin, int64_t seg_end,
                    float* scratch, float* partials, AttentionScores scores) {
  attention_internal::Partials<ScalarVec>(q, pos, kv, kv_head, group, head_dim, scale, seg_begin,
                                          seg_end, scratch, partials, scores);
}
void ScalarPartialsHeads(const float* q, int64_t pos, const PagedKv* kv, int64_t n_heads,
                         int64_t group, int64_t head_dim, float scale, int64_t seg_begin,
                         int64_t seg_end, float* scratch, float* partials, int64_t head_partials,
                         AttentionScores scores) {
  attention_internal::PartialsHeads<ScalarVec>(q, pos, kv, n_heads, group, head_dim, scale,
                                               seg_begin, seg_end, scratch, partials, head_partials,
                                               scores);
}
void ScalarMerge(const float* partials, int64_t n_segments, int64_t group, int64_t head_dim,
                 float* out) {
  attention_internal::Merge<ScalarVec>(partials, n_segments, group, head_dim, out);
}

constexpr AttentionKernels kAttentionKernels[] = {
    {ScalarBlock, ScalarPartials, ScalarPartialsHeads, ScalarMerge},
    {avx2::AttentionBlock, avx2::AttentionPartials, avx2::AttentionPartialsHeads,
     avx2::AttentionMerge},
    {avx512::AttentionBlock, avx512::AttentionPartials, avx512::AttentionPartialsHeads,
     avx512::AttentionMerge},
    {avx512::AttentionBlock, avx512::AttentionPartials, avx512::AttentionPartialsHeads,
     avx512::AttentionMerge},  // kAmx
};
static_assert(static_cast<int>(IsaLevel::kScalar) == 0 && static_cast<int>(IsaLevel::kAvx2) == 1 &&
              static_cast<int>(IsaLevel::kAvx512) == 2 && static_cast<int>(IsaLevel::kAmx) == 3);

const AttentionKernels& KernelsForIsa() { return kAttentionKernels[static_cast<int>(ActiveIsa())]; }

}  // namespace

void AttentionBlock(const float* q, int64_t q_stride, int64_t n_tokens, int64_t pos0,
                    const PagedKv& kv, int64_t kv_head, int64_t group, int64_t head_dim,
                    float scale, float* scratch, float* out, int64_t out_stride,
                    AttentionScores scores) {
  CHORUS_CHECK(n_tokens >= 1 && pos0 >= 0 && group >= 1 && head_dim >= 1 && scores.window >= 0)
      << "n_tokens " << n_tokens << " pos0 " << pos0 << " group " << group << " window "
      << scores.window;
  KernelsForIsa().block(q, q_stride, n_tokens, pos0, kv, kv_head, group, head_dim, scale, scratch,
                        out, out_stride, scores);
}

void AttentionPartials(const float* q, int64_t pos, const PagedKv& kv, int64_t kv_head,
                       int64_t group, int64_t head_dim, float scale, int64_t seg_begin,
                       int64_t seg_end, float* scratch, float* partials, AttentionScores scores) {
  CHORUS_CHECK(pos >= 0 && 0 <= seg_begin && seg_begin < seg_end &&
               seg_end <= AttentionSegments(pos + 1) && scores.window >= 0)
      << "pos " << pos << " segments [" << seg_begin << ", " << seg_end << ") window "
      << scores.window;
  KernelsForIsa().partials(q, pos, kv, kv_head, group, head_dim, scale, seg_begin, seg_end, scratch,
                           partials, scores);
}

void AttentionPartialsHeads(const float* q, int64_t pos, const PagedKv* kv, int64_t n_heads,
                            int64_t group, int64_t head_dim, float scale, int64_t seg_begin,
                            int64_t seg_end, float* scratch, float* partials, int64_t head_partials,
                            AttentionScores scores) {
  CHORUS_CHECK(pos >= 0 && n_heads >= 1 && 0 <= seg_begin && seg_begin < seg_end &&
               seg_end <= AttentionSegments(pos + 1) && scores.window >= 0)
      << "pos " << pos << " heads " << n_heads << " segments [" << seg_begin << ", " << seg_end
      << ") window " << scores.window;
  KernelsForIsa().partials_heads(q, pos, kv, n_heads, group, head_dim, scale, seg_begin, seg_end,
                                 scratch, partials, head_partials, scores);
}

int64_t AttentionPartialsHeadsScratchFloats(int64_t n_heads, int64_t group, int64_t head_dim) {
  return std::min(n_heads, kAttentionHeadsTogether) *
         attention_internal::ScratchFloats(1, group, head_dim);
}

void AttentionMerge(const float* partials, int64_t n_segments, int64_t group, int64_t head_dim,
                    float* out) {
  KernelsForIsa().merge(partials, n_segments, group, head_dim, out);
}

void AttentionRow(const float* q, const PagedKv& kv, int64_t n_ctx, int64_t n_heads,
                  int64_t n_kv_heads, int64_t head_dim, float scale, float* scratch, float* out) {
  CHORUS_CHECK(n_ctx >= 1 && n_kv_heads >= 1 && n_heads % n_kv_heads == 0 && head_dim >= 1)
      << "n_ctx " << n_ctx << " n_heads " << n_heads << " n_kv_heads " << n_kv_heads;
  const int64_t group = n_heads / n_kv_heads;
  for (int64_t g = 0; g < n_kv_heads; ++g) {
    AttentionBlock(q + g * group * head_dim, n_heads * head_dim, 1, n_ctx - 1, kv, g, group,
                   head_dim, scale, scratch, out + g * group * head_dim, n_heads * head_dim);
  }
}

}  // namespace chorus::kernels
