// Element-wise and row-wise kernels of the transformer block. Each has a scalar reference in
// reference/ and ISA variants selected at run time (dispatch.h). Rows are independent, so all
// of these are batch-invariant by construction.
#pragma once

#include <cstdint>

namespace chorus::kernels {

// out[i, :] = x[i, :] / sqrt(mean(x[i, :]²) + eps) * weight[:]      x, out: [m, n]; weight: [n]
// out may alias x.
void RmsNorm(const float* x, const float* weight, int64_t m, int64_t n, float eps, float* out);

// Rotary embedding applied in place to `x` [n_heads, head_dim] of one token at `pos`, with the
// per-pair inverse frequencies inv_freq[head_dim/2] (θ_i = pos · inv_freq[i]).
// RopeLayout::kInterleaved rotates pairs (2i, 2i+1) — llama2.c and GGUF/llama.cpp order.
// RopeLayout::kHalf rotates pairs (i, i + head_dim/2) — Hugging Face "rotate_half" order.
enum class RopeLayout { kInterleaved, kHalf };
void Rope(float* x, int64_t n_heads, int64_t head_dim, int64_t pos, const float* inv_freq,
          RopeLayout layout);

// out[i] = silu(gate[i]) * up[i] = gate[i] / (1 + exp(-gate[i])) * up[i]   (n elements)
void SiluMul(const float* gate, const float* up, int64_t n, float* out);

// In-place softmax over n values: x[i] = exp(x[i] - max) / Σ exp(x[j] - max).
void Softmax(float* x, int64_t n);

// y[i] += x[i] (n elements).
void Add(float* y, const float* x, int64_t n);

}  // namespace chorus::kernels
