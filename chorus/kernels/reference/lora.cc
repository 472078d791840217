// Scalar specification of the LoRA segment kernels (lora.h): plain loops, fma in order. bf16
// weights are widened exactly to f32 and take the same path.
#include "chorus/kernels/lora.h"

#include <cmath>

#include "chorus/kernels/lora_internal.h"
#include "chorus/tensor/dtype.h"

namespace chorus::kernels {
namespace lora_internal::reference {
namespace {

inline float Widen(float w) { return w; }
inline float Widen(uint16_t w) { return BF16ToF32(w); }

template <typename W>
void ShrinkT(const float* x, int64_t x_stride, int64_t n_rows, const W* const* a_rows, int64_t in,
             int64_t j_begin, int64_t j_end, float* v, int64_t v_stride) {
  for (int64_t i = 0; i < n_rows; ++i) {
    const float* xr = x + i * x_stride;
    for (int64_t j = j_begin; j < j_end; ++j) {
      const W* ar = a_rows[j];
      float acc = 0.0f;
      for (int64_t k = 0; k < in; ++k) acc = std::fma(xr[k], Widen(ar[k]), acc);
      v[i * v_stride + j] = acc;
    }
  }
}

template <typename W>
void ExpandT(const float* v, int64_t v_stride, int64_t n_rows, const W* const* bt_rows,
             int64_t rank, float scale, int64_t c_begin, int64_t c_end, float* y,
             int64_t y_stride) {
  for (int64_t i = 0; i < n_rows; ++i) {
    const float* vr = v + i * v_stride;
    float* yr = y + i * y_stride;
    for (int64_t c = c_begin; c < c_end; ++c) {
      float acc = 0.0f;
      for (int64_t j = 0; j < rank; ++j) acc = std::fma(vr[j], Widen(bt_rows[j][c]), acc);
      yr[c] = std::fma(scale, acc, yr[c]);
    }
  }
}

}  // namespace

CHORUS_LORA_TILE_DEFS(ShrinkT, ExpandT)

}  // namespace lora_internal::reference

namespace reference {

void LoraShrink(std::span<const LoraSegment> segments, std::span<const LoraShrinkWeight> weights,
                const float* x, int64_t x_stride, int64_t in, float* v, int64_t v_stride) {
  for (const LoraSegment& s : segments) {
    const LoraShrinkWeight& w = weights[static_cast<size_t>(s.slot)];
    if (w.rank == 0 || s.row_end <= s.row_begin) continue;
    if (w.a_rows_bf16 != nullptr) {
      lora_internal::reference::ShrinkTileBf16(x + s.row_begin * x_stride, x_stride,
                                               s.row_end - s.row_begin, w.a_rows_bf16, in, 0,
                                               w.rank, v + s.row_begin * v_stride, v_stride);
    } else {
      lora_internal::reference::ShrinkTile(x + s.row_begin * x_stride, x_stride,
                                           s.row_end - s.row_begin, w.a_rows, in, 0, w.rank,
                                           v + s.row_begin * v_stride, v_stride);
    }
  }
}

void LoraExpand(std::span<const LoraSegment> segments, std::span<const LoraExpandWeight> weights,
                const float* v, int64_t v_stride, int64_t out, float* y, int64_t y_stride) {
  for (const LoraSegment& s : segments) {
    const LoraExpandWeight& w = weights[static_cast<size_t>(s.slot)];
    if (w.rank == 0 || s.row_end <= s.row_begin) continue;
    if (w.bt_rows_bf16 != nullptr) {
      lora_internal::reference::ExpandTileBf16(
          v + s.row_begin * v_stride + w.v_col, v_stride, s.row_end - s.row_begin, w.bt_rows_bf16,
          w.rank, w.scale, 0, out, y + s.row_begin * y_stride, y_stride);
    } else {
      lora_internal::reference::ExpandTile(v + s.row_begin * v_stride + w.v_col, v_stride,
                                           s.row_end - s.row_begin, w.bt_rows, w.rank, w.scale, 0,
                                           out, y + s.row_begin * y_stride, y_stride);
    }
  }
}

}  // namespace reference
}  // namespace chorus::kernels
