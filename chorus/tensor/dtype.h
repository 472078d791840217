// Element types and block formats of weights and activations.
//
// Quantized formats are bit-compatible with GGML/GGUF so llama.cpp files are used in place:
//   Q8_0: blocks of 32 values: f16 scale d, int8 qs[32];          x = d * q
//   Q4_0: blocks of 32 values: f16 scale d, uint8 qs[16] nibbles; x = d * (q - 8),
//         low nibbles of qs[j] are element j, high nibbles element j + 16.
// K-quants (super-blocks of 256 values, layouts of GGML's block_q*_K; docs/kernels.md, "K-quant
// layouts", says where every element's bits live):
//   Q2_K: 16 sub-blocks of 16, 4-bit scale and min each; x = d*sc*q - dmin*m, q in 0..3
//   Q3_K: 16 sub-blocks of 16, 6-bit scales;           x = d*(sc-32)*q, q in -4..3
//   Q4_K: 8 sub-blocks of 32, 6-bit scale and min;     x = d*sc*q - dmin*m, q in 0..15
//   Q5_K: 8 sub-blocks of 32, 6-bit scale and min;     x = d*sc*q - dmin*m, q in 0..31
//   Q6_K: 16 sub-blocks of 16, int8 scales;            x = d*sc*q, q in -32..31
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "chorus/base/status.h"

namespace chorus {

// New values go at the end: the numbers are not stored anywhere, but tests iterate in order.
enum class DType : uint8_t {
  kF32 = 0,
  kF16,
  kBF16,
  kQ8_0,
  kQ4_0,
  kI32,
  kI8,
  kU8,
  kQ2_K,
  kQ3_K,
  kQ4_K,
  kQ5_K,
  kQ6_K,
};

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

inline constexpr int kSuperBlock = 256;  // elements per K-quant super-block

struct BlockQ2_K {
  uint8_t scales[16];  // sub-block j: scale = low nibble, min = high nibble
  uint8_t qs[64];      // 2-bit quants
  uint16_t d;          // f16 scale of the scales
  uint16_t dmin;       // f16 scale of the mins
};
static_assert(sizeof(BlockQ2_K) == 84);

struct BlockQ3_K {
  uint8_t hmask[32];   // high bit of each quant (set = q, clear = q - 4)
  uint8_t qs[64];      // low 2 bits
  uint8_t scales[12];  // 16 six-bit scales (biased by 32)
  uint16_t d;
};
static_assert(sizeof(BlockQ3_K) == 110);

struct BlockQ4_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];  // 8 six-bit scales and 8 six-bit mins
  uint8_t qs[128];     // nibbles
};
static_assert(sizeof(BlockQ4_K) == 144);

struct BlockQ5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qh[32];   // fifth bit
  uint8_t qs[128];  // low nibbles
};
static_assert(sizeof(BlockQ5_K) == 176);

struct BlockQ6_K {
  uint8_t ql[128];    // low nibbles
  uint8_t qh[64];     // high 2 bits
  int8_t scales[16];  // sub-block scales
  uint16_t d;
};
static_assert(sizeof(BlockQ6_K) == 210);

// The integer form every K-quant super-block reduces to (what the matmul kernels and their
// reference use, docs/kernels.md): per element e of sub-block j (16 or 32 elements),
//   x_e = D·S_j·q_e − M·N_j       with q_e ≥ 0 (unsigned code), S_j, N_j small integers,
// D, M the block's f16 scales as f32 (M = D for the symmetric types Q3_K/Q6_K, whose offset
// N_j = 4·S_j resp. 32·S_j comes from the code's bias).
struct KQuantInts {
  int n_sub;  // 8 (Q4_K, Q5_K) or 16
  int16_t S[16];
  int16_t N[16];
  uint8_t q[256];  // unsigned codes in element order
  float D, M;
};
// Decodes one super-block of `t` (a K type) into its integer form.
void UnpackKQuant(DType t, const void* block, KQuantInts* out);

std::string_view DTypeName(DType t);  // "f32", "f16", "bf16", "q8_0", "q4_0", "q4_k", ...
Result<DType> ParseDType(std::string_view name);  // accepts the names above, case-insensitive

// Elements per storage block (32 for Q8_0/Q4_0, 256 for the K types, else 1) and bytes per block.
int64_t DTypeBlockElems(DType t);
int64_t DTypeBlockBytes(DType t);
bool DTypeIsQuantized(DType t);  // a block format: Q8_0, Q4_0 or a K type
bool DTypeIsKQuant(DType t);     // Q2_K .. Q6_K

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

// Row conversions. The Q8_0/Q4_0 quantizers follow GGML's reference rounding so a file written by
// Chorus matches one written by llama.cpp from the same f32 data. The K quantizers are Chorus's
// own search (docs/kernels.md, "Quantizing to K types"): same layouts, not the same bits.
// Dequantization of every type equals GGML's bit for bit (tested against a llama.cpp fixture).
// Requires for Q formats: n % DTypeBlockElems(t) == 0.
void QuantizeRowQ8_0(const float* x, BlockQ8_0* y, int64_t n);
void QuantizeRowQ4_0(const float* x, BlockQ4_0* y, int64_t n);
// The K-type halves of DequantizeRow / QuantizeRow (dtype_kquant.cc).
void DequantizeRowK(DType t, const void* src, float* dst, int64_t n);
void QuantizeRowK(DType t, const float* src, void* dst, int64_t n);
// Decodes `n` elements of type `t` at `src` into f32.
void DequantizeRow(DType t, const void* src, float* dst, int64_t n);
// Encodes `n` f32 values into type `t` (F32, F16, BF16, Q8_0, Q4_0, the K types).
void QuantizeRow(DType t, const float* src, void* dst, int64_t n);

}  // namespace chorus
