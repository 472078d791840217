// Element types and block formats of weights and activations.
//
// Quantized formats are bit-compatible with GGML/GGUF so llama.cpp files are used in place:
//   Q8_0: blocks of 32 values: f16 scale d, int8 qs[32];          x = d * q
//   Q4_0: blocks of 32 values: f16 scale d, uint8 qs[16] nibbles; x = d * (q - 8),
//         low nibbles of qs[j] are element j, high nibbles element j + 16.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "chorus/base/status.h"

namespace chorus {

enum class DType : uint8_t { kF32 = 0, kF16, kBF16, kQ8_0, kQ4_0, kI32, kI8, kU8 };

inline constexpr int kQuantBlock = 32;  // elements per Q8_0 / Q4_0 block

struct BlockQ8_0 {
  uint16_t d;     // f16 scale
  int8_t qs[32];  // quants
};
static_assert(sizeof(BlockQ8_0) == 34);

struct BlockQ4_0 {
  uint16_t d;      // f16 scale
  uint8_t qs[16];  // nibbles: low = element j, high = element j + 16
};
static_assert(sizeof(BlockQ4_0) == 18);

std::string_view DTypeName(DType t);              // "f32", "f16", "bf16", "q8_0", "q4_0", ...
Result<DType> ParseDType(std::string_view name);  // accepts the names above, case-insensitive

// Elements per storage block (32 for Q8_0/Q4_0, else 1) and bytes per block.
int64_t DTypeBlockElems(DType t);
int64_t DTypeBlockBytes(DType t);
bool DTypeIsQuantized(DType t);

// Bytes of `n_elems` elements; Requires: n_elems is a multiple of DTypeBlockElems(t).
inline int64_t DTypeBytes(DType t, int64_t n_elems) {
  return n_elems / DTypeBlockElems(t) * DTypeBlockBytes(t);
}

// IEEE half and bfloat16 conversions (round to nearest even; NaN preserved).
float F16ToF32(uint16_t h);
uint16_t F32ToF16(float f);
inline float BF16ToF32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint16_t F32ToBF16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// Row conversions. Quantizers follow GGML's reference rounding so a file written by Chorus
// matches one written by llama.cpp from the same f32 data.
// Requires for Q formats: n % 32 == 0.
void QuantizeRowQ8_0(const float* x, BlockQ8_0* y, int64_t n);
void QuantizeRowQ4_0(const float* x, BlockQ4_0* y, int64_t n);
// Decodes `n` elements of type `t` at `src` into f32.
void DequantizeRow(DType t, const void* src, float* dst, int64_t n);
// Encodes `n` f32 values into type `t` (F32, F16, BF16, Q8_0, Q4_0).
void QuantizeRow(DType t, const float* src, void* dst, int64_t n);

}  // namespace chorus
