// Element-wise and row-wise kernels of the transformer block. Each has a scalar reference in
// reference/ and ISA variants selected at run time (dispatch.h). Rows are independent, so all
// of these are batch-invariant by construction; in addition, the element-wise kernels (SiluMul,
// Add) compute every element with the same instruction sequence wherever it sits in the array
// (tails use masked vector loads, not a scalar loop), so flattening [m, n] into one call of
// m·n elements gives the same bits as m calls of n.
//
// Accuracy of the fast variants against the reference (std::exp, double-precision angles):
//   * exp (Softmax, SiluMul, attention): range reduction x = n·ln2 + r, |r| ≤ ln2/2, then the
//     degree-7 Taylor polynomial of e^r (truncation < 1.2e-9 relative): measured error < 1 ulp
//     of the exact value (0.92 ulp max over 1.7M points in [-87, 88.3]). AVX2 flushes results below
//     FLT_MIN (x < -87.33) to 0 and returns +inf for x > 88.37; AVX-512 (vscalefps) is correct
//     down to the denormals and up to FLT_MAX. exp(-inf) = 0 exactly on every level.
//   * RmsNorm and Softmax sums use vector partial sums (a different, fixed association than
//     the reference's sequential sum): relative differences of a few 1e-7.
//   * Rope: all levels use the same double-precision cos/sin table; only FMA contraction of the
//     rotation differs (≤ 1 ulp per element).
//
// Thread-safety: stateless; safe from any number of threads on disjoint outputs.
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
// For a pair (a, b) with angle θ_i: a' = a·cos θ_i − b·sin θ_i, b' = a·sin θ_i + b·cos θ_i.
// θ_i is computed in double precision (pos · inv_freq[i]) and cos/sin rounded to float, so
// large positions lose no accuracy to the float product.
// Requires: head_dim even and ≤ kMaxRopeHeadDim.
enum class RopeLayout { kInterleaved, kHalf };
inline constexpr int64_t kMaxRopeHeadDim = 1024;
void Rope(float* x, int64_t n_heads, int64_t head_dim, int64_t pos, const float* inv_freq,
          RopeLayout layout);

// The same rotation with precomputed tables cos_t[i] = cos θ_i, sin_t[i] = sin θ_i
// (i < head_dim/2): lets a caller rotate q and k of one position with one table.
void RopeTable(int64_t pos, const float* inv_freq, int64_t half_dim, float* cos_t, float* sin_t);
void RopeApply(float* x, int64_t n_heads, int64_t head_dim, const float* cos_t, const float* sin_t,
               RopeLayout layout);

// out[i] = silu(gate[i]) * up[i] = gate[i] / (1 + exp(-gate[i])) * up[i]   (n elements)
// out may alias gate or up.
void SiluMul(const float* gate, const float* up, int64_t n, float* out);

// out[i] = gelu_tanh(gate[i]) * up[i] with gelu_tanh(x) = ½x(1 + tanh(√(2/π)(x + 0.044715x³)))
// — Gemma's GeGLU. The vector levels use ½(1 + tanh u) = 1 / (1 + e^(−2u)), so the same exp as
// SiluMul: gelu_tanh(x) = x / (1 + exp(−2√(2/π)(x + 0.044715x³))). out may alias gate or up.
void GeluTanhMul(const float* gate, const float* up, int64_t n, float* out);

// In-place softmax over n values: x[i] = exp(x[i] - max) / Σ exp(x[j] - max).
// -inf entries get probability exactly 0. Requires: n ≥ 1 and at least one finite value.
void Softmax(float* x, int64_t n);

// y[i] += x[i] (n elements).
void Add(float* y, const float* x, int64_t n);

// Dot products of a matrix's rows with f32 inputs, added to y: the output-head delta of a full
// fine-tune, stored as int8 rows with one scale per row or as exact f32 rows (docs/deltas.md,
// "Serving"). For each input j < n and row r < rows:
//   AddInt8RowDots: y[j·y_stride + r] += row_scales[r] · Σ_k x[j·x_stride + k] · q[r·cols + k]
//   AddF32RowDots:  y[j·y_stride + r] += Σ_k x[j·x_stride + k] · w[r·cols + k]
// Each dot is one chain over k whose association depends only on the level — the reference
// sums k in order; a vector level keeps one partial sum per lane (k in order, the last chunk
// zero-padded) and then adds the lanes in a fixed order — never on n, on the other inputs or
// on which rows one call covers (the int8 dot is added as fma(row_scale, dot, y), explicitly). So
// an input's results are the same alone or beside others, and whatever ranges of rows threads split
// (batch invariance). Vector levels differ from the reference by that reassociation only.
void AddInt8RowDots(const int8_t* q, const float* row_scales, int64_t rows, int64_t cols,
                    const float* x, int64_t x_stride, int64_t n, float* y, int64_t y_stride);
void AddF32RowDots(const float* w, int64_t rows, int64_t cols, const float* x, int64_t x_stride,
                   int64_t n, float* y, int64_t y_stride);

namespace reference {
// Scalar specifications of the kernels above (same semantics and signatures); the dispatched
// versions are tested against these.
void RmsNorm(const float* x, const float* weight, int64_t m, int64_t n, float eps, float* out);
void Rope(float* x, int64_t n_heads, int64_t head_dim, int64_t pos, const float* inv_freq,
          RopeLayout layout);
void RopeApply(float* x, int64_t n_heads, int64_t head_dim, const float* cos_t, const float* sin_t,
               RopeLayout layout);
void SiluMul(const float* gate, const float* up, int64_t n, float* out);
void GeluTanhMul(const float* gate, const float* up, int64_t n, float* out);
void Softmax(float* x, int64_t n);
void Add(float* y, const float* x, int64_t n);
void AddInt8RowDots(const int8_t* q, const float* row_scales, int64_t rows, int64_t cols,
                    const float* x, int64_t x_stride, int64_t n, float* y, int64_t y_stride);
void AddF32RowDots(const float* w, int64_t rows, int64_t cols, const float* x, int64_t x_stride,
                   int64_t n, float* y, int64_t y_stride);
}  // namespace reference

}  // namespace chorus::kernels
