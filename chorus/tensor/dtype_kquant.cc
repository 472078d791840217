// K-quant super-blocks (Q2_K..Q6_K): decoding, the integer form used by the matmul kernels, and
// Chorus's own quantizer. Layouts are GGML's block_q*_K (docs/kernels.md, "K-quant layouts").
//
// DequantizeRowK evaluates exactly GGML's float expressions, in the same order and without FMA
// contraction (this file is compiled without -mfma), so a row decodes to the same bits as
// llama.cpp's dequantize_row_q*_K; tests/kquant_fixture checks it against values written by
// llama.cpp itself.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "chorus/tensor/dtype.h"

namespace chorus {
namespace {

// Element e (0..255) of a super-block: where its bits live. See docs/kernels.md for the picture.
// Q2_K / Q3_K: 2-bit field at qs[32*(e/128) + e%32] >> 2*((e%128)/32); Q3_K's high bit is bit
// 4*(e/128) + (e%128)/32 of hmask[e%32].
inline int Q23Index(int e) { return 32 * (e / 128) + e % 32; }
inline int Q23Shift(int e) { return 2 * ((e % 128) / 32); }
inline int Q3HBit(int e) { return 4 * (e / 128) + (e % 128) / 32; }
// Q4_K / Q5_K: nibble qs[32*(e/64) + e%32], low for (e%64) < 32; Q5_K's fifth bit is bit e/32
// of qh[e%32].
inline int Q45Index(int e) { return 32 * (e / 64) + e % 32; }
inline bool Q45High(int e) { return (e % 64) >= 32; }
// Q6_K: nibble ql[64*(e/128) + e%32 + 32*(quarter&1)], high for quarter ≥ 2 (quarter =
// (e%128)/32); the top 2 bits are qh[32*(e/128) + e%32] >> 2*quarter.
inline int Q6Quarter(int e) { return (e % 128) / 32; }
inline int Q6LIndex(int e) { return 64 * (e / 128) + e % 32 + 32 * (Q6Quarter(e) & 1); }
inline int Q6HIndex(int e) { return 32 * (e / 128) + e % 32; }

// The 6-bit scale and min of sub-block j of a Q4_K/Q5_K block's 12 scale bytes.
inline void ScaleMinK4(int j, const uint8_t* s, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
  }
}
inline void PackScaleMinK4(const uint8_t* sc, const uint8_t* m, uint8_t* s) {
  for (int j = 0; j < 4; ++j) {
    s[j] = static_cast<uint8_t>((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
    s[j + 4] = static_cast<uint8_t>((m[j] & 63) | ((m[j + 4] >> 4) << 6));
    s[j + 8] = static_cast<uint8_t>((sc[j + 4] & 0x0f) | ((m[j + 4] & 0x0f) << 4));
  }
}
// Q3_K: the 16 six-bit scale codes (0..63, value = code − 32).
inline int Q3ScaleCode(const uint8_t* s, int j) {
  const int lo = j < 8 ? (s[j] & 0x0f) : (s[j - 8] >> 4);
  const int hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
  return lo | (hi << 4);
}
inline void PackQ3Scales(const int* codes, uint8_t* s) {
  std::memset(s, 0, 12);
  for (int j = 0; j < 16; ++j) {
    const int c = codes[j];
    if (j < 8) {
      s[j] = static_cast<uint8_t>(s[j] | (c & 0x0f));
    } else {
      s[j - 8] = static_cast<uint8_t>(s[j - 8] | ((c & 0x0f) << 4));
    }
    s[8 + j % 4] = static_cast<uint8_t>(s[8 + j % 4] | (((c >> 4) & 3) << (2 * (j / 4))));
  }
}

// Unsigned code of element e (the value before any bias: Q3_K 0..7 with −4 applied later, Q6_K
// 0..63 with −32 applied later).
inline int CodeQ2(const BlockQ2_K& b, int e) { return (b.qs[Q23Index(e)] >> Q23Shift(e)) & 3; }
inline int CodeQ3(const BlockQ3_K& b, int e) {
  const int lo = (b.qs[Q23Index(e)] >> Q23Shift(e)) & 3;
  return lo | (((b.hmask[e % 32] >> Q3HBit(e)) & 1) << 2);
}
inline int CodeQ4(const BlockQ4_K& b, int e) {
  const uint8_t v = b.qs[Q45Index(e)];
  return Q45High(e) ? v >> 4 : v & 0x0f;
}
inline int CodeQ5(const BlockQ5_K& b, int e) {
  const uint8_t v = b.qs[Q45Index(e)];
  const int lo = Q45High(e) ? v >> 4 : v & 0x0f;
  return lo | (((b.qh[e % 32] >> (e / 32)) & 1) << 4);
}
inline int CodeQ6(const BlockQ6_K& b, int e) {
  const uint8_t l = b.ql[Q6LIndex(e)];
  const int lo = Q6Quarter(e) >= 2 ? l >> 4 : l & 0x0f;
  return lo | (((b.qh[Q6HIndex(e)] >> (2 * Q6Quarter(e))) & 3) << 4);
}

// ---- dequantization (GGML's expressions) ---------------------------------------------------

void DequantQ2(const BlockQ2_K& b, float* y) {
  const float d = F16ToF32(b.d), mn = F16ToF32(b.dmin);
  for (int e = 0; e < 256; ++e) {
    const uint8_t sc = b.scales[e / 16];
    const float dl = d * (sc & 0x0f);
    const float ml = mn * (sc >> 4);
    y[e] = dl * static_cast<int8_t>(CodeQ2(b, e)) - ml;
  }
}
void DequantQ3(const BlockQ3_K& b, float* y) {
  const float d = F16ToF32(b.d);
  for (int e = 0; e < 256; ++e) {
    const float dl = d * static_cast<int8_t>(Q3ScaleCode(b.scales, e / 16) - 32);
    y[e] = dl * (CodeQ3(b, e) - 4);
  }
}
void DequantQ4(const BlockQ4_K& b, float* y) {
  const float d = F16ToF32(b.d), mn = F16ToF32(b.dmin);
  for (int e = 0; e < 256; ++e) {
    uint8_t sc, m;
    ScaleMinK4(e / 32, b.scales, &sc, &m);
    const float d1 = d * sc;
    const float m1 = mn * m;
    y[e] = d1 * CodeQ4(b, e) - m1;
  }
}
void DequantQ5(const BlockQ5_K& b, float* y) {
  const float d = F16ToF32(b.d), mn = F16ToF32(b.dmin);
  for (int e = 0; e < 256; ++e) {
    uint8_t sc, m;
    ScaleMinK4(e / 32, b.scales, &sc, &m);
    const float d1 = d * sc;
    const float m1 = mn * m;
    y[e] = d1 * CodeQ5(b, e) - m1;
  }
}
void DequantQ6(const BlockQ6_K& b, float* y) {
  const float d = F16ToF32(b.d);
  for (int e = 0; e < 256; ++e) {
    const int8_t q = static_cast<int8_t>(CodeQ6(b, e) - 32);
    y[e] = d * b.scales[e / 16] * q;
  }
}

template <class Block, void (*Fn)(const Block&, float*)>
void DequantBlocks(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const Block*>(src);
  for (int64_t i = 0; i < n / kSuperBlock; ++i) Fn(b[i], dst + i * kSuperBlock);
}

// ---- quantization ---------------------------------------------------------------------------

inline int Nearest(float v) { return static_cast<int>(std::lround(v)); }

// Fits x ≈ a·q − mn (q in 0..qmax, a ≥ 0, mn ≥ 0) over n values: a grid of candidate steps
// around (max − min)/qmax, each refined by least squares on its codes, the lowest squared error
// kept. The minimum is clamped to ≤ 0 (mn ≥ 0), as the K formats store it unsigned.
void FitAsym(const float* x, int n, int qmax, float* a_out, float* mn_out) {
  float lo = 0.0f, hi = x[0];
  for (int i = 0; i < n; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
  }
  if (hi <= lo) {
    *a_out = 0.0f;
    *mn_out = -lo;
    return;
  }
  float best_a = (hi - lo) / qmax, best_c = lo;
  double best_err = 0.0;
  for (int i = 0; i < n; ++i) {
    const int q = std::clamp(Nearest((x[i] - lo) / best_a), 0, qmax);
    const double r = best_a * q + lo - x[i];
    best_err += r * r;
  }
  for (int step = -6; step <= 12; ++step) {
    const float is = (qmax + 0.1f * step) / (hi - lo);
    if (is <= 0.0f) continue;
    int q[32];
    double sq = 0, sqq = 0, sx = 0, sxq = 0;
    for (int i = 0; i < n; ++i) {
      q[i] = std::clamp(Nearest((x[i] - lo) * is), 0, qmax);
      sq += q[i];
      sqq += static_cast<double>(q[i]) * q[i];
      sx += x[i];
      sxq += static_cast<double>(x[i]) * q[i];
    }
    // Least squares for x ≈ a·q + c, then c ≤ 0 enforced.
    const double det = n * sqq - sq * sq;
    if (det <= 0) continue;
    double a = (n * sxq - sq * sx) / det;
    double c = (sx - a * sq) / n;
    if (c > 0) {
      c = 0;
      a = sqq > 0 ? sxq / sqq : 0;
    }
    if (a <= 0) continue;
    double err = 0;
    for (int i = 0; i < n; ++i) {
      const double r = a * q[i] + c - x[i];
      err += r * r;
    }
    if (err < best_err) {
      best_err = err;
      best_a = static_cast<float>(a);
      best_c = static_cast<float>(c);
    }
  }
  *a_out = best_a;
  *mn_out = -best_c;
}

// Fits x ≈ s·q (q in qneg..qpos, s signed) over n values: the value of largest magnitude maps to
// qneg (the wider side), then a grid of steps refined by least squares, as in FitAsym.
float FitSym(const float* x, int n, int qneg, int qpos) {
  float amax = 0.0f, vmax = 0.0f;
  for (int i = 0; i < n; ++i) {
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      vmax = x[i];
    }
  }
  if (amax == 0.0f) return 0.0f;
  float best_s = vmax / qneg;
  double best_err = 1e300;
  for (int step = -8; step <= 8; ++step) {
    const float is = (qneg + 0.1f * step) / vmax;
    int q[32];
    double sqq = 0, sxq = 0;
    for (int i = 0; i < n; ++i) {
      q[i] = std::clamp(Nearest(x[i] * is), qneg, qpos);
      sqq += static_cast<double>(q[i]) * q[i];
      sxq += static_cast<double>(x[i]) * q[i];
    }
    if (sqq <= 0) continue;
    const double s = sxq / sqq;
    double err = 0;
    for (int i = 0; i < n; ++i) {
      const double r = s * q[i] - x[i];
      err += r * r;
    }
    if (err < best_err) {
      best_err = err;
      best_s = static_cast<float>(s);
    }
  }
  return best_s;
}

// Sub-block fits → integer scales against an f16 super-block scale. Returns the f16 bits; `codes`
// get round(v/d) clamped to [lo, hi].
uint16_t QuantizeScales(const float* v, int n, int lo, int hi, int* codes) {
  float amax = 0.0f;
  for (int j = 0; j < n; ++j) amax = std::max(amax, std::fabs(v[j]));
  const int top = std::max(std::abs(lo), hi);
  const uint16_t dh = F32ToF16(amax / top);
  const float d = F16ToF32(dh);
  for (int j = 0; j < n; ++j) codes[j] = d > 0.0f ? std::clamp(Nearest(v[j] / d), lo, hi) : 0;
  return dh;
}

// Codes of the elements of a sub-block for the stored scales: q = round((x + mm)/dd) clamped.
inline int CodeFor(float x, float dd, float mm, int qlo, int qhi) {
  if (dd == 0.0f) return std::clamp(0, qlo, qhi);
  return std::clamp(Nearest((x + mm) / dd), qlo, qhi);
}

// Q4_K / Q5_K: 8 sub-blocks of 32 (asymmetric).
template <int kBits>
void QuantAsym32(const float* x, uint16_t* d_out, uint16_t* dmin_out, uint8_t* scales,
                 uint8_t* codes) {
  constexpr int kMax = (1 << kBits) - 1;
  float a[8], mn[8];
  for (int j = 0; j < 8; ++j) FitAsym(x + 32 * j, 32, kMax, &a[j], &mn[j]);
  int sc[8], m[8];
  *d_out = QuantizeScales(a, 8, 0, 63, sc);
  *dmin_out = QuantizeScales(mn, 8, 0, 63, m);
  const float d = F16ToF32(*d_out), dmin = F16ToF32(*dmin_out);
  uint8_t sc8[8], m8[8];
  for (int j = 0; j < 8; ++j) {
    sc8[j] = static_cast<uint8_t>(sc[j]);
    m8[j] = static_cast<uint8_t>(m[j]);
    const float dd = d * sc[j], mm = dmin * m[j];
    for (int i = 0; i < 32; ++i)
      codes[32 * j + i] = static_cast<uint8_t>(CodeFor(x[32 * j + i], dd, mm, 0, kMax));
  }
  PackScaleMinK4(sc8, m8, scales);
}

void QuantQ2(const float* x, BlockQ2_K* b) {
  float a[16], mn[16];
  for (int j = 0; j < 16; ++j) FitAsym(x + 16 * j, 16, 3, &a[j], &mn[j]);
  int sc[16], m[16];
  b->d = QuantizeScales(a, 16, 0, 15, sc);
  b->dmin = QuantizeScales(mn, 16, 0, 15, m);
  const float d = F16ToF32(b->d), dmin = F16ToF32(b->dmin);
  std::memset(b->qs, 0, sizeof(b->qs));
  for (int j = 0; j < 16; ++j) {
    b->scales[j] = static_cast<uint8_t>(sc[j] | (m[j] << 4));
    const float dd = d * sc[j], mm = dmin * m[j];
    for (int i = 0; i < 16; ++i) {
      const int e = 16 * j + i;
      const int q = CodeFor(x[e], dd, mm, 0, 3);
      b->qs[Q23Index(e)] = static_cast<uint8_t>(b->qs[Q23Index(e)] | (q << Q23Shift(e)));
    }
  }
}

void QuantQ3(const float* x, BlockQ3_K* b) {
  float s[16];
  for (int j = 0; j < 16; ++j) s[j] = FitSym(x + 16 * j, 16, -4, 3);
  int sc[16];
  b->d = QuantizeScales(s, 16, -32, 31, sc);
  const float d = F16ToF32(b->d);
  int codes[16];
  for (int j = 0; j < 16; ++j) codes[j] = sc[j] + 32;
  PackQ3Scales(codes, b->scales);
  std::memset(b->qs, 0, sizeof(b->qs));
  std::memset(b->hmask, 0, sizeof(b->hmask));
  for (int j = 0; j < 16; ++j) {
    const float dd = d * sc[j];
    for (int i = 0; i < 16; ++i) {
      const int e = 16 * j + i;
      int q = 0;
      if (dd != 0.0f) q = std::clamp(Nearest(x[e] / dd), -4, 3);
      const int u = q + 4;  // 0..7: low 2 bits in qs, bit 2 in hmask
      b->qs[Q23Index(e)] = static_cast<uint8_t>(b->qs[Q23Index(e)] | ((u & 3) << Q23Shift(e)));
      if (u & 4) b->hmask[e % 32] = static_cast<uint8_t>(b->hmask[e % 32] | (1 << Q3HBit(e)));
    }
  }
}

void QuantQ4(const float* x, BlockQ4_K* b) {
  uint8_t codes[256];
  QuantAsym32<4>(x, &b->d, &b->dmin, b->scales, codes);
  std::memset(b->qs, 0, sizeof(b->qs));
  for (int e = 0; e < 256; ++e) {
    b->qs[Q45Index(e)] =
        static_cast<uint8_t>(b->qs[Q45Index(e)] | (codes[e] << (Q45High(e) ? 4 : 0)));
  }
}

void QuantQ5(const float* x, BlockQ5_K* b) {
  uint8_t codes[256];
  QuantAsym32<5>(x, &b->d, &b->dmin, b->scales, codes);
  std::memset(b->qs, 0, sizeof(b->qs));
  std::memset(b->qh, 0, sizeof(b->qh));
  for (int e = 0; e < 256; ++e) {
    b->qs[Q45Index(e)] =
        static_cast<uint8_t>(b->qs[Q45Index(e)] | ((codes[e] & 0x0f) << (Q45High(e) ? 4 : 0)));
    if (codes[e] & 16) b->qh[e % 32] = static_cast<uint8_t>(b->qh[e % 32] | (1 << (e / 32)));
  }
}

void QuantQ6(const float* x, BlockQ6_K* b) {
  float s[16];
  for (int j = 0; j < 16; ++j) s[j] = FitSym(x + 16 * j, 16, -32, 31);
  int sc[16];
  b->d = QuantizeScales(s, 16, -128, 127, sc);
  const float d = F16ToF32(b->d);
  std::memset(b->ql, 0, sizeof(b->ql));
  std::memset(b->qh, 0, sizeof(b->qh));
  for (int j = 0; j < 16; ++j) {
    b->scales[j] = static_cast<int8_t>(sc[j]);
    const float dd = d * sc[j];
    for (int i = 0; i < 16; ++i) {
      const int e = 16 * j + i;
      int q = 0;
      if (dd != 0.0f) q = std::clamp(Nearest(x[e] / dd), -32, 31);
      const int u = q + 32;
      const int qr = Q6Quarter(e);
      b->ql[Q6LIndex(e)] =
          static_cast<uint8_t>(b->ql[Q6LIndex(e)] | ((u & 0x0f) << (qr >= 2 ? 4 : 0)));
      b->qh[Q6HIndex(e)] = static_cast<uint8_t>(b->qh[Q6HIndex(e)] | ((u >> 4) << (2 * qr)));
    }
  }
}

template <class Block, void (*Fn)(const float*, Block*)>
void QuantBlocks(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<Block*>(dst);
  for (int64_t i = 0; i < n / kSuperBlock; ++i) Fn(src + i * kSuperBlock, &b[i]);
}

}  // namespace

void DequantizeRowK(DType t, const void* src, float* dst, int64_t n) {
  switch (t) {
    case DType::kQ2_K:
      return DequantBlocks<BlockQ2_K, DequantQ2>(src, dst, n);
    case DType::kQ3_K:
      return DequantBlocks<BlockQ3_K, DequantQ3>(src, dst, n);
    case DType::kQ4_K:
      return DequantBlocks<BlockQ4_K, DequantQ4>(src, dst, n);
    case DType::kQ5_K:
      return DequantBlocks<BlockQ5_K, DequantQ5>(src, dst, n);
    case DType::kQ6_K:
      return DequantBlocks<BlockQ6_K, DequantQ6>(src, dst, n);
    default:
      CHORUS_CHECK(false) << "DequantizeRowK: not a K type: " << DTypeName(t);
  }
}

void QuantizeRowK(DType t, const float* src, void* dst, int64_t n) {
  switch (t) {
    case DType::kQ2_K:
      return QuantBlocks<BlockQ2_K, QuantQ2>(src, dst, n);
    case DType::kQ3_K:
      return QuantBlocks<BlockQ3_K, QuantQ3>(src, dst, n);
    case DType::kQ4_K:
      return QuantBlocks<BlockQ4_K, QuantQ4>(src, dst, n);
    case DType::kQ5_K:
      return QuantBlocks<BlockQ5_K, QuantQ5>(src, dst, n);
    case DType::kQ6_K:
      return QuantBlocks<BlockQ6_K, QuantQ6>(src, dst, n);
    default:
      CHORUS_CHECK(false) << "QuantizeRowK: not a K type: " << DTypeName(t);
  }
}

void UnpackKQuant(DType t, const void* block, KQuantInts* o) {
  switch (t) {
    case DType::kQ2_K: {
      const auto& b = *static_cast<const BlockQ2_K*>(block);
      o->n_sub = 16;
      o->D = F16ToF32(b.d);
      o->M = F16ToF32(b.dmin);
      for (int j = 0; j < 16; ++j) {
        o->S[j] = static_cast<int16_t>(b.scales[j] & 0x0f);
        o->N[j] = static_cast<int16_t>(b.scales[j] >> 4);
      }
      for (int e = 0; e < 256; ++e) o->q[e] = static_cast<uint8_t>(CodeQ2(b, e));
      return;
    }
    case DType::kQ3_K: {
      const auto& b = *static_cast<const BlockQ3_K*>(block);
      o->n_sub = 16;
      o->D = o->M = F16ToF32(b.d);
      for (int j = 0; j < 16; ++j) {
        o->S[j] = static_cast<int16_t>(Q3ScaleCode(b.scales, j) - 32);
        o->N[j] = static_cast<int16_t>(4 * o->S[j]);
      }
      for (int e = 0; e < 256; ++e) o->q[e] = static_cast<uint8_t>(CodeQ3(b, e));
      return;
    }
    case DType::kQ4_K:
    case DType::kQ5_K: {
      const bool q5 = t == DType::kQ5_K;
      const uint16_t d =
          q5 ? static_cast<const BlockQ5_K*>(block)->d : static_cast<const BlockQ4_K*>(block)->d;
      const uint16_t dmin = q5 ? static_cast<const BlockQ5_K*>(block)->dmin
                               : static_cast<const BlockQ4_K*>(block)->dmin;
      const uint8_t* scales = q5 ? static_cast<const BlockQ5_K*>(block)->scales
                                 : static_cast<const BlockQ4_K*>(block)->scales;
      o->n_sub = 8;
      o->D = F16ToF32(d);
      o->M = F16ToF32(dmin);
      for (int j = 0; j < 8; ++j) {
        uint8_t sc, m;
        ScaleMinK4(j, scales, &sc, &m);
        o->S[j] = sc;
        o->N[j] = m;
      }
      for (int e = 0; e < 256; ++e) {
        o->q[e] = static_cast<uint8_t>(q5 ? CodeQ5(*static_cast<const BlockQ5_K*>(block), e)
                                          : CodeQ4(*static_cast<const BlockQ4_K*>(block), e));
      }
      return;
    }
    case DType::kQ6_K: {
      const auto& b = *static_cast<const BlockQ6_K*>(block);
      o->n_sub = 16;
      o->D = o->M = F16ToF32(b.d);
      for (int j = 0; j < 16; ++j) {
        o->S[j] = b.scales[j];
        o->N[j] = static_cast<int16_t>(32 * b.scales[j]);
      }
      for (int e = 0; e < 256; ++e) o->q[e] = static_cast<uint8_t>(CodeQ6(b, e));
      return;
    }
    default:
      CHORUS_CHECK(false) << "UnpackKQuant: not a K type: " << DTypeName(t);
  }
}

}  // namespace chorus
