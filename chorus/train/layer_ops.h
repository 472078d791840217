// The non-matrix operations of the training forward and backward pass (docs/finetuning.md,
// "Backward"): RMSNorm, SiLU·mul, RoPE, causal attention over packed sequences, and softmax
// cross-entropy. Scalar code: together they cost a few percent of a step (the linears dominate,
// grad_kernels.h). Every backward is checked against finite differences (layer_ops_test.cc).
//
// Determinism: rows (and, for attention, KV heads) are split between threads; each output is
// computed by one thread in a fixed order, so the thread count never changes a result.
//
// Thread-safety: stateless.
#pragma once

#include <cstdint>

#include "chorus/base/thread_pool.h"
#include "chorus/kernels/ops.h"

namespace chorus::train {

// y = x / sqrt(mean(x²) + eps) ∘ w (the forward is kernels::RmsNorm). Given dy, writes
// (accumulate: adds) dx = r·(dy∘w) − x·r³/n·Σ(dy∘w∘x), r = 1/sqrt(mean(x²) + eps), row by row.
void RmsNormBackward(const float* x, const float* w, int64_t m, int64_t n, float eps,
                     const float* dy, float* dx, bool accumulate);

// h = silu(g)·u (the forward is kernels::SiluMul). dg = dh·u·σ(g)·(1 + g·(1 − σ(g))),
// du = dh·silu(g). dg / du may alias dh.
void SiluMulBackward(const float* g, const float* u, const float* dh, int64_t n, float* dg,
                     float* du);

// The gradient through kernels::RopeApply with tables (cos_t, sin_t): the inverse rotation,
// applied in place to dx [n_heads, head_dim] of one row.
void RopeBackward(float* dx, int64_t n_heads, int64_t head_dim, const float* cos_t,
                  const float* sin_t, kernels::RopeLayout layout);

// Causal self-attention over rows [0, n) where row t attends to rows [seg_start[t], t] (its own
// sample inside a packed sequence; seg_start[t] ≤ t, and rows of one sample are consecutive).
// q [n, n_heads·hd] (after RoPE), k / v [n, n_kv_heads·hd]; query head h reads KV head
// h / (n_heads / n_kv_heads).
struct AttentionShape {
  int64_t n_heads = 0, n_kv_heads = 0, head_dim = 0;
  float scale = 0;  // 1/√head_dim
};
// Floats of the saved probabilities: Σ_t (t − seg_start[t] + 1) per query head.
int64_t AttentionProbFloats(const int32_t* seg_start, int64_t n, const AttentionShape& s);
// out [n, n_heads·hd]; probs [AttentionProbFloats] (saved for the backward).
void AttentionForward(const float* q, const float* k, const float* v, const int32_t* seg_start,
                      int64_t n, const AttentionShape& s, float* probs, float* out,
                      ThreadPool* pool);
// dq, dk, dv (written, not accumulated) from dout and the forward's q, k, v, probs.
void AttentionBackward(const float* q, const float* k, const float* v, const float* probs,
                       const int32_t* seg_start, int64_t n, const AttentionShape& s,
                       const float* dout, float* dq, float* dk, float* dv, ThreadPool* pool);

// Softmax cross-entropy of `m` rows of `vocab` logits against targets: returns Σ_i −log
// softmax(logits_i)[target_i] (in double, rows in order) and overwrites the logits with their
// gradient times `grad_scale`: (softmax − onehot(target))·grad_scale.
// Requires: 0 ≤ targets[i] < vocab.
double SoftmaxCrossEntropy(float* logits, const int32_t* targets, int64_t m, int64_t vocab,
                           float grad_scale, ThreadPool* pool);

}  // namespace chorus::train
