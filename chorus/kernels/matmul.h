// Dense matrix multiply against a weight matrix: the base term x·Wᵀ of docs/architecture.md, "The
// one equation".
//
//   y[m, n] = x[m, k] · W[n, k]ᵀ          (accumulate=false)
//   y[m, n] += x[m, k] · W[n, k]ᵀ         (accumulate=true)
//
// W is f32, f16, bf16, q8_0 or q4_0 (k a multiple of 32 for the q formats); x and y are f32,
// row-major with strides x_stride / y_stride (in floats). For q8_0/q4_0 weights each row of x is
// quantized to q8_0-style blocks with an f32 scale (per 32: d = amax/127, q = lround(x/d)), each
// block's integer dot product isum is exact, and y accumulates fma(d_w·d_x, isum, acc) in block
// order — the fast paths do exactly this, so they equal reference::MatMul bit for bit.
// For bf16 weights x is rounded to bf16 first (like llama.cpp; it lets AVX-512 use vdpbf16ps),
// so products are exact and fast paths differ from the reference only in summation order.
// f32/f16 weights: f32 products and sums (summation order differs per ISA level).
//
// Batch invariance (docs/architecture.md, "Kernels and batch invariance"): the value of y[i, :]
// depends only on x[i, :] and W — never on m, on the other rows, or on the thread count. Work is
// split across threads by output columns only (never k): each thread streams its own run of column
// blocks and idle threads steal blocks from the others (base/owned_ranges.h), and every column and
// row uses the same reduction order whichever thread computes it and whatever the block of rows it
// is computed in.
//
// Thread-safety: stateless; PackedWeight is immutable after Pack() and shared freely.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "chorus/base/thread_pool.h"
#include "chorus/tensor/tensor.h"

namespace chorus::kernels {

// A weight matrix [n, k] prepared for MatMul: either the original tensor used in place (mmap)
// or a repacked kernel-friendly copy (then memory_bytes() says how much it costs).
class PackedWeight {
 public:
  PackedWeight() = default;
  // Requires: w is 2-D, dtype in {f32, f16, bf16, q8_0, q4_0}, q formats have k % 32 == 0.
  static Result<PackedWeight> Pack(const Tensor& w);

  int64_t n() const { return n_; }  // output features (rows of W)
  int64_t k() const { return k_; }  // input features
  DType dtype() const { return source_.dtype(); }
  const Tensor& source() const { return source_; }
  // Extra bytes held by a repacked copy (0 when used in place).
  int64_t packed_bytes() const { return packed_bytes_; }

  // Implementation detail for the kernels: repacked layout (may be null = use source()).
  const void* packed() const { return packed_.get(); }
  int packed_layout() const { return packed_layout_; }

 private:
  Tensor source_;
  int64_t n_ = 0, k_ = 0;
  std::shared_ptr<const void> packed_;
  int packed_layout_ = 0;
  int64_t packed_bytes_ = 0;
  friend class PackedWeightBuilder;
};

// Requires: x has m rows of w.k() finite floats; y has m rows of at least w.n() floats and does
// not overlap x; w was built by Pack(). Threads split the output columns (pool may be null = the
// calling thread only). Converted activations live in a per-thread scratch that grows to the
// largest m·k seen and is then reused.
void MatMul(const PackedWeight& w, const float* x, int64_t x_stride, int64_t m, float* y,
            int64_t y_stride, bool accumulate, ThreadPool* pool);

// One output of MatMulMulti: y [m, w->n()] with row stride y_stride (in floats).
struct MatMulOut {
  const PackedWeight* w;
  float* y;
  int64_t y_stride;
};
inline constexpr int64_t kMaxMatMulOuts = 8;

// Several weights applied to the same input in one call (q/k/v, gate/up): the activations are
// converted once and the threads share out the columns of all outputs in one pool dispatch,
// which saves a pool synchronization per weight at batch 1. Every output equals what MatMul
// would give for it alone, bit for bit (columns are independent).
// Requires: 1..kMaxMatMulOuts outputs whose weights have the same k() and dtype(); outputs do
// not overlap each other or x. Same threading and scratch rules as MatMul.
void MatMulMulti(std::span<const MatMulOut> outs, const float* x, int64_t x_stride, int64_t m,
                 bool accumulate, ThreadPool* pool);

namespace reference {
// The scalar specification of MatMul (single thread). Same semantics and signature.
void MatMul(const PackedWeight& w, const float* x, int64_t x_stride, int64_t m, float* y,
            int64_t y_stride, bool accumulate);
}  // namespace reference

}  // namespace chorus::kernels
