// Scalar specification of MatMul (see matmul.h for the formula).
//
// Quantized weights: every activation row is quantized to q8_0-style blocks with an f32 scale
// (ReferenceQuantizeRow); per block the integer dot product isum is exact, and the row's
// column accumulates acc = fma(d_w * d_x, float(isum), acc) in block order. The fast kernels
// do the very same float operations, so they agree with this bit for bit.
//
// K-quant weights: rows quantized per super-block of 256 (one scale and the sums of every 16/32
// quants), exact integer sums per super-block, two (or one) fma per super-block (matmul.h).
//
// Float weights: f32 accumulation acc += x * w in k order. bf16 weights see x rounded to bf16
// first (as llama.cpp does), so every product is exact in f32 and only the summation order
// differs between this and the SIMD kernels.
#include "chorus/kernels/matmul.h"

#include <cmath>
#include <vector>

#include "chorus/kernels/matmul_internal.h"

namespace chorus::kernels {
namespace internal {

void ReferenceQuantizeRow(const float* x, int64_t k, int32_t offset, int8_t* qs, QMeta* meta) {
  for (int64_t b = 0; b < k / kQuantBlock; ++b) {
    const float* xb = x + b * kQuantBlock;
    float amax = 0.0f;
    for (int j = 0; j < kQuantBlock; ++j) amax = std::fmax(amax, std::fabs(xb[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    int32_t sum = 0;
    for (int j = 0; j < kQuantBlock; ++j) {
      const int8_t q = static_cast<int8_t>(std::lround(xb[j] * id));
      qs[b * kQuantBlock + j] = q;
      sum += q;
    }
    meta[b] = {d, -offset * sum};
  }
}

void ReferenceQuantizeRowK(const float* x, int64_t k, int8_t* qs, QMetaK* meta) {
  for (int64_t b = 0; b < k / 256; ++b) {
    const float* xb = x + b * 256;
    float amax = 0.0f;
    for (int j = 0; j < 256; ++j) amax = std::fmax(amax, std::fabs(xb[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    QMetaK& mt = meta[b];
    mt.d = d;
    for (int g = 0; g < 16; ++g) {
      int32_t sum = 0;
      for (int j = 16 * g; j < 16 * g + 16; ++j) {
        const int8_t q = static_cast<int8_t>(std::lround(xb[j] * id));
        qs[b * 256 + j] = q;
        sum += q;
      }
      mt.s16[g] = static_cast<int16_t>(sum);
    }
    for (int g = 0; g < 8; ++g) mt.s32[g] = static_cast<int16_t>(mt.s16[2 * g] + mt.s16[2 * g + 1]);
  }
}

namespace {

// K-quant weights: the integer form of every super-block (dtype.h, KQuantInts) against the row
// quantized per 256 (ReferenceQuantizeRowK); see matmul.h for the formula.
void KCols(const PackedWeight& w, const float* x, int64_t x_stride, int64_t m, int64_t c0,
           int64_t c1, float* y, int64_t y_stride, bool accumulate) {
  const int64_t k = w.k(), nsb = k / 256;
  const DType dt = w.dtype();
  const bool mins = dt == DType::kQ2_K || dt == DType::kQ4_K || dt == DType::kQ5_K;
  std::vector<int8_t> qx(static_cast<size_t>(m * k));
  std::vector<QMetaK> meta(static_cast<size_t>(m * nsb));
  for (int64_t i = 0; i < m; ++i)
    ReferenceQuantizeRowK(x + i * x_stride, k, qx.data() + i * k, meta.data() + i * nsb);
  std::vector<KQuantInts> blocks(static_cast<size_t>(nsb));
  std::vector<float> acc(static_cast<size_t>(m));
  const int64_t block_bytes = DTypeBlockBytes(dt);
  for (int64_t j = c0; j < c1; ++j) {
    const auto* row = static_cast<const uint8_t*>(w.source().view().Row(j));
    for (int64_t s = 0; s < nsb; ++s) UnpackKQuant(dt, row + s * block_bytes, &blocks[s]);
    for (int64_t i = 0; i < m; ++i) {
      float a = 0.0f;
      for (int64_t s = 0; s < nsb; ++s) {
        const KQuantInts& b = blocks[s];
        const QMetaK& mt = meta[i * nsb + s];
        const int8_t* xq = qx.data() + i * k + s * 256;
        const int sub = 256 / b.n_sub;
        int32_t isum = 0, msum = 0;
        for (int sj = 0; sj < b.n_sub; ++sj) {
          int32_t dot = 0;
          for (int e = sj * sub; e < (sj + 1) * sub; ++e) dot += b.q[e] * xq[e];
          isum += b.S[sj] * dot;
          msum += b.N[sj] * (sub == 16 ? mt.s16[sj] : mt.s32[sj]);
        }
        if (mins) {
          a = std::fma(b.D * mt.d, static_cast<float>(isum), a);
          a = std::fma(-(b.M * mt.d), static_cast<float>(msum), a);
        } else {
          a = std::fma(b.D * mt.d, static_cast<float>(isum - msum), a);
        }
      }
      float* out = y + i * y_stride + j;
      *out = accumulate ? *out + a : a;
    }
  }
}

// Weight value q (signed) of element j of a block.
inline int WeightQ8(const BlockQ8_0& blk, int j) { return blk.qs[j]; }
inline int WeightQ4(const BlockQ4_0& blk, int j) {
  const uint8_t byte = blk.qs[j & 15];
  return (j < 16 ? (byte & 0x0f) : (byte >> 4)) - 8;
}

template <class Block, int (*Weight)(const Block&, int)>
void QuantCols(const PackedWeight& w, const float* x, int64_t x_stride, int64_t m, int64_t c0,
               int64_t c1, float* y, int64_t y_stride, bool accumulate) {
  const int64_t k = w.k(), nb = k / kQuantBlock;
  std::vector<int8_t> qx(static_cast<size_t>(k));
  std::vector<QMeta> meta(static_cast<size_t>(nb));
  const Block* rows = static_cast<const Block*>(w.source().data());
  for (int64_t i = 0; i < m; ++i) {
    ReferenceQuantizeRow(x + i * x_stride, k, /*offset=*/0, qx.data(), meta.data());
    for (int64_t j = c0; j < c1; ++j) {
      const Block* wr = rows + j * nb;
      float acc = 0.0f;
      for (int64_t b = 0; b < nb; ++b) {
        int32_t isum = 0;
        for (int e = 0; e < kQuantBlock; ++e) isum += Weight(wr[b], e) * qx[b * kQuantBlock + e];
        const float scale = F16ToF32(wr[b].d) * meta[b].d;
        acc = std::fma(scale, static_cast<float>(isum), acc);
      }
      float* out = y + i * y_stride + j;
      *out = accumulate ? *out + acc : acc;
    }
  }
}

void FloatCols(const PackedWeight& w, const float* x, int64_t x_stride, int64_t m, int64_t c0,
               int64_t c1, float* y, int64_t y_stride, bool accumulate) {
  const int64_t k = w.k();
  const DType dt = w.dtype();
  std::vector<float> xr(static_cast<size_t>(k)), wr(static_cast<size_t>(k));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t e = 0; e < k; ++e) {
      const float v = x[i * x_stride + e];
      xr[e] = dt == DType::kBF16 ? BF16ToF32(F32ToBF16(v)) : v;
    }
    for (int64_t j = c0; j < c1; ++j) {
      DequantizeRow(dt, w.source().view().Row(j), wr.data(), k);
      float acc = 0.0f;
      for (int64_t e = 0; e < k; ++e) acc += xr[e] * wr[e];
      float* out = y + i * y_stride + j;
      *out = accumulate ? *out + acc : acc;
    }
  }
}

}  // namespace

void ReferenceMatMulCols(const PackedWeight& w, const float* x, int64_t x_stride, int64_t m,
                         int64_t c0, int64_t c1, float* y, int64_t y_stride, bool accumulate) {
  switch (w.dtype()) {
    case DType::kQ8_0:
      QuantCols<BlockQ8_0, WeightQ8>(w, x, x_stride, m, c0, c1, y, y_stride, accumulate);
      return;
    case DType::kQ4_0:
      QuantCols<BlockQ4_0, WeightQ4>(w, x, x_stride, m, c0, c1, y, y_stride, accumulate);
      return;
    case DType::kQ2_K:
    case DType::kQ3_K:
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K:
      KCols(w, x, x_stride, m, c0, c1, y, y_stride, accumulate);
      return;
    default:
      FloatCols(w, x, x_stride, m, c0, c1, y, y_stride, accumulate);
      return;
  }
}

}  // namespace internal

namespace reference {

void MatMul(const PackedWeight& w, const float* x, int64_t x_stride, int64_t m, float* y,
            int64_t y_stride, bool accumulate) {
  internal::ReferenceMatMulCols(w, x, x_stride, m, 0, w.n(), y, y_stride, accumulate);
}

}  // namespace reference
}  // namespace chorus::kernels
