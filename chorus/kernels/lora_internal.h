// Internal contract between lora.cc (threading, dispatch) and the per-ISA LoRA tile kernels
// (reference/lora.cc, x86/lora_avx2.cc, x86/lora_avx512.cc). Not part of the public API.
// Each tile function is single-threaded over the range it is given; the dispatcher calls a
// variant only after checking ActiveIsa().
#pragma once

#include <cstdint>

namespace chorus::kernels::lora_internal {

// Shrink tile: v[i, j] = Σ_k x[i, k] · a[j, k] for i < n_rows, j ∈ [j_begin, j_end).
// x: [n_rows, in] (stride x_stride); a_rows[j]: row j of A ([in] weights, f32 or bf16);
// v: [n_rows, *] (stride v_stride).
// Each (i, j) value must come out identical whatever n_rows, j_begin and j_end are.
template <typename W>
using ShrinkTileFnT = void (*)(const float* x, int64_t x_stride, int64_t n_rows,
                               const W* const* a_rows, int64_t in, int64_t j_begin, int64_t j_end,
                               float* v, int64_t v_stride);
// Expand tile: y[i, c] = fma(scale, Σ_j v[i, j]·bt[j, c] (fma chain, j in order), y[i, c])
// for i < n_rows, c ∈ [c_begin, c_end). v: [n_rows, rank] (stride v_stride); bt_rows[j]: row j of
// Bᵀ ([out] weights, c_end ≤ out).
template <typename W>
using ExpandTileFnT = void (*)(const float* v, int64_t v_stride, int64_t n_rows,
                               const W* const* bt_rows, int64_t rank, float scale, int64_t c_begin,
                               int64_t c_end, float* y, int64_t y_stride);
using ShrinkTileFn = ShrinkTileFnT<float>;
using ExpandTileFn = ExpandTileFnT<float>;
// bf16 weights (uint16_t bit patterns): widened exactly to f32 in the kernel, f32 arithmetic.
using ShrinkTileBf16Fn = ShrinkTileFnT<uint16_t>;
using ExpandTileBf16Fn = ExpandTileFnT<uint16_t>;

#define CHORUS_LORA_TILE_DECLS                                                                    \
  void ShrinkTile(const float* x, int64_t x_stride, int64_t n_rows, const float* const* a_rows,   \
                  int64_t in, int64_t j_begin, int64_t j_end, float* v, int64_t v_stride);        \
  void ExpandTile(const float* v, int64_t v_stride, int64_t n_rows, const float* const* bt_rows,  \
                  int64_t rank, float scale, int64_t c_begin, int64_t c_end, float* y,            \
                  int64_t y_stride);                                                              \
  void ShrinkTileBf16(const float* x, int64_t x_stride, int64_t n_rows,                           \
                      const uint16_t* const* a_rows, int64_t in, int64_t j_begin, int64_t j_end,  \
                      float* v, int64_t v_stride);                                                \
  void ExpandTileBf16(const float* v, int64_t v_stride, int64_t n_rows,                           \
                      const uint16_t* const* bt_rows, int64_t rank, float scale, int64_t c_begin, \
                      int64_t c_end, float* y, int64_t y_stride);

// Defines the four tile functions of a variant from its templates Shrink<W> / Expand<W>.
#define CHORUS_LORA_TILE_DEFS(Shrink, Expand)                                                     \
  void ShrinkTile(const float* x, int64_t x_stride, int64_t n_rows, const float* const* a_rows,   \
                  int64_t in, int64_t j_begin, int64_t j_end, float* v, int64_t v_stride) {       \
    Shrink<float>(x, x_stride, n_rows, a_rows, in, j_begin, j_end, v, v_stride);                  \
  }                                                                                               \
  void ExpandTile(const float* v, int64_t v_stride, int64_t n_rows, const float* const* bt_rows,  \
                  int64_t rank, float scale, int64_t c_begin, int64_t c_end, float* y,            \
                  int64_t y_stride) {                                                             \
    Expand<float>(v, v_stride, n_rows, bt_rows, rank, scale, c_begin, c_end, y, y_stride);        \
  }                                                                                               \
  void ShrinkTileBf16(const float* x, int64_t x_stride, int64_t n_rows,                           \
                      const uint16_t* const* a_rows, int64_t in, int64_t j_begin, int64_t j_end,  \
                      float* v, int64_t v_stride) {                                               \
    Shrink<uint16_t>(x, x_stride, n_rows, a_rows, in, j_begin, j_end, v, v_stride);               \
  }                                                                                               \
  void ExpandTileBf16(const float* v, int64_t v_stride, int64_t n_rows,                           \
                      const uint16_t* const* bt_rows, int64_t rank, float scale, int64_t c_begin, \
                      int64_t c_end, float* y, int64_t y_stride) {                                \
    Expand<uint16_t>(v, v_stride, n_rows, bt_rows, rank, scale, c_begin, c_end, y, y_stride);     \
  }

namespace reference {
CHORUS_LORA_TILE_DECLS
}  // namespace reference
namespace avx2 {
CHORUS_LORA_TILE_DECLS
}  // namespace avx2
namespace avx512 {
CHORUS_LORA_TILE_DECLS
}  // namespace avx512

#undef CHORUS_LORA_TILE_DECLS

}  // namespace chorus::kernels::lora_internal
