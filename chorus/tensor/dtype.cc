#include "chorus/tensor/dtype.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <string>

namespace chorus {

std::string_view DTypeName(DType t) {
  switch (t) {
    case DType::kF32:
      return "f32";
    case DType::kF16:
      return "f16";
    case DType::kBF16:
      return "bf16";
    case DType::kQ8_0:
      return "q8_0";
    case DType::kQ4_0:
      return "q4_0";
    case DType::kI32:
      return "i32";
    case DType::kI8:
      return "i8";
    case DType::kU8:
      return "u8";
    case DType::kQ2_K:
      return "q2_k";
    case DType::kQ3_K:
      return "q3_k";
    case DType::kQ4_K:
      return "q4_k";
    case DType::kQ5_K:
      return "q5_k";
    case DType::kQ6_K:
      return "q6_k";
  }
  return "?";
}

Result<DType> ParseDType(std::string_view name) {
  std::string s(name);
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (DType t :
       {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_0, DType::kI32, DType::kI8,
        DType::kU8, DType::kQ2_K, DType::kQ3_K, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K}) {
    if (s == DTypeName(t)) return t;
  }
  return InvalidArgumentError(
      "unknown dtype '" + std::string(name.substr(0, 32)) +
      "' (expected f32, f16, bf16, q8_0, q4_0, q2_k, q3_k, q4_k, q5_k or q6_k)");
}

int64_t DTypeBlockElems(DType t) {
  return DTypeIsKQuant(t) ? kSuperBlock : DTypeIsQuantized(t) ? kQuantBlock : 1;
}

int64_t DTypeBlockBytes(DType t) {
  switch (t) {
    case DType::kF32:
      return 4;
    case DType::kF16:
      return 2;
    case DType::kBF16:
      return 2;
    case DType::kQ8_0:
      return sizeof(BlockQ8_0);
    case DType::kQ4_0:
      return sizeof(BlockQ4_0);
    case DType::kI32:
      return 4;
    case DType::kI8:
      return 1;
    case DType::kU8:
      return 1;
    case DType::kQ2_K:
      return sizeof(BlockQ2_K);
    case DType::kQ3_K:
      return sizeof(BlockQ3_K);
    case DType::kQ4_K:
      return sizeof(BlockQ4_K);
    case DType::kQ5_K:
      return sizeof(BlockQ5_K);
    case DType::kQ6_K:
      return sizeof(BlockQ6_K);
  }
  return 1;
}

bool DTypeIsKQuant(DType t) {
  return t == DType::kQ2_K || t == DType::kQ3_K || t == DType::kQ4_K || t == DType::kQ5_K ||
         t == DType::kQ6_K;
}

bool DTypeIsQuantized(DType t) {
  return t == DType::kQ8_0 || t == DType::kQ4_0 || DTypeIsKQuant(t);
}

float F16ToF32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {  // subnormal: normalize
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      mant &= 0x3ffu;
      u = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | (mant << 13);
    }
  } else if (exp == 0x1f) {
    u = sign | 0x7f800000u | (mant << 13);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t F32ToF16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (abs < 0x38800000u) {                                               // subnormal or zero in f16
    if (abs < 0x33000000u) return static_cast<uint16_t>(sign);
    uint32_t exp = abs >> 23;
    uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    // value = mant * 2^(exp-150); f16 subnormal unit is 2^-24, so shift right by 126 - exp
    // (14..24 here) and round to nearest even on the bits shifted out.
    uint32_t total_shift = 126 - exp;
    uint32_t half = mant >> total_shift;
    uint32_t rem = mant & ((1u << total_shift) - 1);
    uint32_t halfway = 1u << (total_shift - 1);
    if (rem > halfway || (rem == halfway && (half & 1u))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t h = ((abs - 0x38000000u) >> 13);
  uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

void QuantizeRowQ8_0(const float* x, BlockQ8_0* y, int64_t n) {
  const int64_t nb = n / kQuantBlock;
  for (int64_t i = 0; i < nb; ++i) {
    float amax = 0.0f;
    for (int j = 0; j < kQuantBlock; ++j) amax = std::max(amax, std::fabs(x[i * 32 + j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = F32ToF16(d);
    for (int j = 0; j < kQuantBlock; ++j) {
      y[i].qs[j] = static_cast<int8_t>(std::lround(x[i * 32 + j] * id));
    }
  }
}

void QuantizeRowQ4_0(const float* x, BlockQ4_0* y, int64_t n) {
  const int64_t nb = n / kQuantBlock;
  for (int64_t i = 0; i < nb; ++i) {
    // Scale from the signed value of largest magnitude so that it maps to -8 exactly.
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < kQuantBlock; ++j) {
      float v = x[i * 32 + j];
      if (std::fabs(v) > amax) {
        amax = std::fabs(v);
        max = v;
      }
    }
    const float d = max / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = F32ToF16(d);
    for (int j = 0; j < 16; ++j) {
      float x0 = x[i * 32 + j] * id;
      float x1 = x[i * 32 + 16 + j] * id;
      uint8_t q0 = static_cast<uint8_t>(std::min(15, static_cast<int>(x0 + 8.5f)));
      uint8_t q1 = static_cast<uint8_t>(std::min(15, static_cast<int>(x1 + 8.5f)));
      y[i].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

void DequantizeRow(DType t, const void* src, float* dst, int64_t n) {
  if (n <= 0) return;  // an empty row may come with null pointers (memcpy must not see them)
  if (DTypeIsKQuant(t)) {
    DequantizeRowK(t, src, dst, n);
    return;
  }
  switch (t) {
    case DType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return;
    case DType::kF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = F16ToF32(s[i]);
      return;
    }
    case DType::kBF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = BF16ToF32(s[i]);
      return;
    }
    case DType::kQ8_0: {
      const auto* b = static_cast<const BlockQ8_0*>(src);
      for (int64_t i = 0; i < n / 32; ++i) {
        float d = F16ToF32(b[i].d);
        for (int j = 0; j < 32; ++j) dst[i * 32 + j] = d * b[i].qs[j];
      }
      return;
    }
    case DType::kQ4_0: {
      const auto* b = static_cast<const BlockQ4_0*>(src);
      for (int64_t i = 0; i < n / 32; ++i) {
        float d = F16ToF32(b[i].d);
        for (int j = 0; j < 16; ++j) {
          dst[i * 32 + j] = d * (static_cast<int>(b[i].qs[j] & 0x0f) - 8);
          dst[i * 32 + 16 + j] = d * (static_cast<int>(b[i].qs[j] >> 4) - 8);
        }
      }
      return;
    }
    case DType::kI32: {
      const auto* s = static_cast<const int32_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(s[i]);
      return;
    }
    case DType::kI8: {
      const auto* s = static_cast<const int8_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = s[i];
      return;
    }
    case DType::kU8: {
      const auto* s = static_cast<const uint8_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = s[i];
      return;
    }
    default:
      return;  // K types are handled above
  }
}

void QuantizeRow(DType t, const float* src, void* dst, int64_t n) {
  if (n <= 0) return;  // an empty row may come with null pointers (memcpy must not see them)
  switch (t) {
    case DType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return;
    case DType::kF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = F32ToF16(src[i]);
      return;
    }
    case DType::kBF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = F32ToBF16(src[i]);
      return;
    }
    case DType::kQ8_0:
      QuantizeRowQ8_0(src, static_cast<BlockQ8_0*>(dst), n);
      return;
    case DType::kQ4_0:
      QuantizeRowQ4_0(src, static_cast<BlockQ4_0*>(dst), n);
      return;
    case DType::kQ2_K:
    case DType::kQ3_K:
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K:
      QuantizeRowK(t, src, dst, n);
      return;
    default:
      CHORUS_CHECK(false) << "QuantizeRow: unsupported dtype " << DTypeName(t);
  }
}

}  // namespace chorus
