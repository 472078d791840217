// Run-time selection of the paged attention kernel (attention.h) through ActiveIsa().
#include "chorus/kernels/attention.h"

#include "chorus/base/check.h"
#include "chorus/kernels/dispatch.h"
#include "chorus/kernels/x86/ops_x86.h"

namespace chorus::kernels {

void AttentionRow(const float* q, const PagedKv& kv, int64_t n_ctx, int64_t n_heads,
                  int64_t n_kv_heads, int64_t head_dim, float scale, float* scratch, float* out) {
  CHORUS_CHECK(n_ctx >= 1 && n_kv_heads >= 1 && n_heads % n_kv_heads == 0 && head_dim >= 1)
      << "n_ctx " << n_ctx << " n_heads " << n_heads << " n_kv_heads " << n_kv_heads;
  switch (ActiveIsa()) {
    // The AVX-512 level runs the AVX2 kernel: it is bound by fetching K/V rows scattered over
    // blocks, and on Zen 4 a 512-bit FMA has the throughput of two 256-bit ones, so a 512-bit
    // copy would add code without adding speed.
    case IsaLevel::kAmx:
    case IsaLevel::kAvx512:
    case IsaLevel::kAvx2:
      return avx2::AttentionRow(q, kv, n_ctx, n_heads, n_kv_heads, head_dim, scale, scratch, out);
    case IsaLevel::kScalar:
      break;
  }
  reference::AttentionRow(q, kv, n_ctx, n_heads, n_kv_heads, head_dim, scale, scratch, out);
}

}  // namespace chorus::kernels
