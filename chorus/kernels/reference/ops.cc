// Scalar specifications of the element-wise kernels (ops.h), written for clarity.
#include "chorus/kernels/ops.h"

#include <cmath>

#include "chorus/base/check.h"

namespace chorus::kernels {

// The angle table is part of Rope's specification, shared by every level so that they differ
// only in how the rotation is evaluated.
void RopeTable(int64_t pos, const float* inv_freq, int64_t half_dim, float* cos_t, float* sin_t) {
  for (int64_t i = 0; i < half_dim; ++i) {
    const double theta = static_cast<double>(pos) * static_cast<double>(inv_freq[i]);
    cos_t[i] = static_cast<float>(std::cos(theta));
    sin_t[i] = static_cast<float>(std::sin(theta));
  }
}

namespace reference {

void RmsNorm(const float* x, const float* weight, int64_t m, int64_t n, float eps, float* out) {
  for (int64_t r = 0; r < m; ++r) {
    const float* xr = x + r * n;
    float* yr = out + r * n;
    float ss = 0.0f;
    for (int64_t j = 0; j < n; ++j) ss += xr[j] * xr[j];
    ss = ss / static_cast<float>(n) + eps;
    const float scale = 1.0f / std::sqrt(ss);
    for (int64_t j = 0; j < n; ++j) yr[j] = xr[j] * scale * weight[j];
  }
}

void RopeApply(float* x, int64_t n_heads, int64_t head_dim, const float* cos_t, const float* sin_t,
               RopeLayout layout) {
  const int64_t half = head_dim / 2;
  for (int64_t h = 0; h < n_heads; ++h) {
    float* xh = x + h * head_dim;
    for (int64_t i = 0; i < half; ++i) {
      // Positions of the pair (a, b) rotated by θ_i.
      const int64_t ia = layout == RopeLayout::kInterleaved ? 2 * i : i;
      const int64_t ib = layout == RopeLayout::kInterleaved ? 2 * i + 1 : i + half;
      const float a = xh[ia], b = xh[ib];
      xh[ia] = a * cos_t[i] - b * sin_t[i];
      xh[ib] = a * sin_t[i] + b * cos_t[i];
    }
  }
}

void Rope(float* x, int64_t n_heads, int64_t head_dim, int64_t pos, const float* inv_freq,
          RopeLayout layout) {
  CHORUS_CHECK(head_dim % 2 == 0 && head_dim <= kMaxRopeHeadDim) << "head_dim " << head_dim;
  float cos_t[kMaxRopeHeadDim / 2], sin_t[kMaxRopeHeadDim / 2];
  RopeTable(pos, inv_freq, head_dim / 2, cos_t, sin_t);
  reference::RopeApply(x, n_heads, head_dim, cos_t, sin_t, layout);
}

void SiluMul(const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void GeluTanhMul(const float* gate, const float* up, int64_t n, float* out) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  for (int64_t i = 0; i < n; ++i) {
    const float x = gate[i];
    out[i] = 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * (x + 0.044715f * x * x * x))) * up[i];
  }
}

void Softmax(float* x, int64_t n) {
  float max = x[0];
  for (int64_t i = 1; i < n; ++i) max = x[i] > max ? x[i] : max;
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - max);
    sum += x[i];
  }
  for (int64_t i = 0; i < n; ++i) x[i] /= sum;
}

void Add(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

void AddInt8RowDots(const int8_t* q, const float* row_scales, int64_t rows, int64_t cols,
                    const float* x, int64_t x_stride, int64_t n, float* y, int64_t y_stride) {
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t r = 0; r < rows; ++r) {
      float sum = 0.0f;
      for (int64_t k = 0; k < cols; ++k) {
        sum = std::fma(x[j * x_stride + k], static_cast<float>(q[r * cols + k]), sum);
      }
      y[j * y_stride + r] = std::fma(row_scales[r], sum, y[j * y_stride + r]);
    }
  }
}

void AddF32RowDots(const float* w, int64_t rows, int64_t cols, const float* x, int64_t x_stride,
                   int64_t n, float* y, int64_t y_stride) {
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t r = 0; r < rows; ++r) {
      float sum = 0.0f;
      for (int64_t k = 0; k < cols; ++k) sum = std::fma(x[j * x_stride + k], w[r * cols + k], sum);
      y[j * y_stride + r] += sum;
    }
  }
}

}  // namespace reference
}  // namespace chorus::kernels
