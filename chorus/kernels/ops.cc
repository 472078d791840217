// Run-time selection of the element-wise kernels (ops.h) through ActiveIsa().
#include "chorus/kernels/ops.h"

#include <cmath>

#include "chorus/base/check.h"
#include "chorus/kernels/dispatch.h"
#include "chorus/kernels/x86/ops_x86.h"

namespace chorus::kernels {

void RmsNorm(const float* x, const float* weight, int64_t m, int64_t n, float eps, float* out) {
  switch (ActiveIsa()) {
    case IsaLevel::kAmx:  // no tile kernel for element-wise ops
    case IsaLevel::kAvx512:
      return avx512::RmsNorm(x, weight, m, n, eps, out);
    case IsaLevel::kAvx2:
      return avx2::RmsNorm(x, weight, m, n, eps, out);
    case IsaLevel::kScalar:
      break;
  }
  reference::RmsNorm(x, weight, m, n, eps, out);
}

void RopeApply(float* x, int64_t n_heads, int64_t head_dim, const float* cos_t, const float* sin_t,
               RopeLayout layout) {
  CHORUS_CHECK(head_dim % 2 == 0 && head_dim <= kMaxRopeHeadDim) << "head_dim " << head_dim;
  switch (ActiveIsa()) {
    case IsaLevel::kAmx:  // no tile kernel for element-wise ops
    case IsaLevel::kAvx512:
      return avx512::RopeApply(x, n_heads, head_dim, cos_t, sin_t, layout);
    case IsaLevel::kAvx2:
      return avx2::RopeApply(x, n_heads, head_dim, cos_t, sin_t, layout);
    case IsaLevel::kScalar:
      break;
  }
  reference::RopeApply(x, n_heads, head_dim, cos_t, sin_t, layout);
}

void Rope(float* x, int64_t n_heads, int64_t head_dim, int64_t pos, const float* inv_freq,
          RopeLayout layout) {
  CHORUS_CHECK(head_dim % 2 == 0 && head_dim <= kMaxRopeHeadDim) << "head_dim " << head_dim;
  float cos_t[kMaxRopeHeadDim / 2], sin_t[kMaxRopeHeadDim / 2];
  RopeTable(pos, inv_freq, head_dim / 2, cos_t, sin_t);
  kernels::RopeApply(x, n_heads, head_dim, cos_t, sin_t, layout);
}

void GeluTanhMul(const float* gate, const float* up, int64_t n, float* out) {
  switch (ActiveIsa()) {
    case IsaLevel::kAmx:  // no tile kernel for element-wise ops
    case IsaLevel::kAvx512:
      return avx512::GeluTanhMul(gate, up, n, out);
    case IsaLevel::kAvx2:
      return avx2::GeluTanhMul(gate, up, n, out);
    case IsaLevel::kScalar:
      break;
  }
  reference::GeluTanhMul(gate, up, n, out);
}

void SiluMul(const float* gate, const float* up, int64_t n, float* out) {
  switch (ActiveIsa()) {
    case IsaLevel::kAmx:  // no tile kernel for element-wise ops
    case IsaLevel::kAvx512:
      return avx512::SiluMul(gate, up, n, out);
    case IsaLevel::kAvx2:
      return avx2::SiluMul(gate, up, n, out);
    case IsaLevel::kScalar:
      break;
  }
  reference::SiluMul(gate, up, n, out);
}

void Softmax(float* x, int64_t n) {
  switch (ActiveIsa()) {
    case IsaLevel::kAmx:  // no tile kernel for element-wise ops
    case IsaLevel::kAvx512:
      return avx512::Softmax(x, n);
    case IsaLevel::kAvx2:
      return avx2::Softmax(x, n);
    case IsaLevel::kScalar:
      break;
  }
  reference::Softmax(x, n);
}

void Add(float* y, const float* x, int64_t n) {
  switch (ActiveIsa()) {
    case IsaLevel::kAmx:  // no tile kernel for element-wise ops
    case IsaLevel::kAvx512:
      return avx512::Add(y, x, n);
    case IsaLevel::kAvx2:
      return avx2::Add(y, x, n);
    case IsaLevel::kScalar:
      break;
  }
  reference::Add(y, x, n);
}

void AddInt8RowDots(const int8_t* q, const float* row_scales, int64_t rows, int64_t cols,
                    const float* x, int64_t x_stride, int64_t n, float* y, int64_t y_stride) {
  switch (ActiveIsa()) {
    case IsaLevel::kAmx:  // no tile kernel: a handful of inputs against many rows
    case IsaLevel::kAvx512:
      return avx512::AddInt8RowDots(q, row_scales, rows, cols, x, x_stride, n, y, y_stride);
    case IsaLevel::kAvx2:
      return avx2::AddInt8RowDots(q, row_scales, rows, cols, x, x_stride, n, y, y_stride);
    case IsaLevel::kScalar:
      break;
  }
  reference::AddInt8RowDots(q, row_scales, rows, cols, x, x_stride, n, y, y_stride);
}

void AddF32RowDots(const float* w, int64_t rows, int64_t cols, const float* x, int64_t x_stride,
                   int64_t n, float* y, int64_t y_stride) {
  switch (ActiveIsa()) {
    case IsaLevel::kAmx:
    case IsaLevel::kAvx512:
      return avx512::AddF32RowDots(w, rows, cols, x, x_stride, n, y, y_stride);
    case IsaLevel::kAvx2:
      return avx2::AddF32RowDots(w, rows, cols, x, x_stride, n, y, y_stride);
    case IsaLevel::kScalar:
      break;
  }
  reference::AddF32RowDots(w, rows, cols, x, x_stride, n, y, y_stride);
}

}  // namespace chorus::kernels
