// Internal: the x86 variants of the kernels in ops.h and attention.h. Only the dispatchers
// (ops.cc) and the tests call these, after checking ActiveIsa(); calling a variant the CPU does
// not support faults. Semantics are those of the public kernels (attention: x86/attention_x86.h).
#pragma once

#include <cstdint>

#include "chorus/kernels/ops.h"

#define CHORUS_X86_KERNEL_DECLS                                                                    \
  void RmsNorm(const float* x, const float* weight, int64_t m, int64_t n, float eps, float* out);  \
  void RopeApply(float* x, int64_t n_heads, int64_t head_dim, const float* cos_t,                  \
                 const float* sin_t, RopeLayout layout);                                           \
  void SiluMul(const float* gate, const float* up, int64_t n, float* out);                         \
  void GeluTanhMul(const float* gate, const float* up, int64_t n, float* out);                     \
  void Softmax(float* x, int64_t n);                                                               \
  void Add(float* y, const float* x, int64_t n);                                                   \
  void AddInt8RowDots(const int8_t* q, const float* row_scales, int64_t rows, int64_t cols,        \
                      const float* x, int64_t x_stride, int64_t n, float* y, int64_t y_stride);    \
  void AddF32RowDots(const float* w, int64_t rows, int64_t cols, const float* x, int64_t x_stride, \
                     int64_t n, float* y, int64_t y_stride);                                       \
  /* max_i x[i] (n ≥ 1). */                                                                      \
  float Max(const float* x, int64_t n);                                                            \
  /* x[i] = exp(x[i] - shift) in place; returns Σ x[i] (after). */                                \
  float ExpShiftSum(float* x, int64_t n, float shift);

namespace chorus::kernels::avx2 {
CHORUS_X86_KERNEL_DECLS
}  // namespace chorus::kernels::avx2

namespace chorus::kernels::avx512 {
CHORUS_X86_KERNEL_DECLS
}  // namespace chorus::kernels::avx512

#undef CHORUS_X86_KERNEL_DECLS
