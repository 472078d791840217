// test-labels: kernel
// The AVX-512 matmul kernels' logic, checked on any AVX2 machine: x86/matmul_avx512.cc is compiled
// into this test against scalar emulations of exactly the AVX-512 intrinsics it uses (vpdpbusd,
// vpdpwssd, vpmulld, vdpbf16ps, masked loads/stores, conversions, reductions), then driven through
// the same MatMul orchestration and compared with the scalar reference. This catches layout,
// masking, offset and rounding mistakes on hosts without AVX-512 (CI machines vary); the real
// instructions are covered by matmul_test.cc wherever the CPU has them. The emulations follow the
// Intel SDM definitions (vdpbf16ps without its denormal flushing, which these inputs never reach).
#include <gtest/gtest.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <vector>

#include "chorus/kernels/dispatch.h"
#include "chorus/kernels/matmul.h"
#include "chorus/kernels/matmul_internal.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

// clang-format off
namespace emu {
struct m512 { float f[16]; };
struct m512i { union { int8_t b[64]; uint8_t ub[64]; int16_t w[32]; uint16_t uw[32]; int32_t d[16]; uint32_t ud[16]; }; };
struct m512bh { uint16_t h[32]; };
using mask16 = uint16_t;
using mask32 = uint32_t;
inline m512 setzero_ps() { m512 r; for (auto& v : r.f) v = 0; return r; }
inline m512 set1_ps(float x) { m512 r; for (auto& v : r.f) v = x; return r; }
inline m512i set1_epi32(int32_t x) { m512i r; for (auto& v : r.d) v = x; return r; }
inline m512i set1_epi8(char x) { m512i r; for (auto& v : r.b) v = x; return r; }
inline m512i loadu_si512(const void* p) { m512i r; std::memcpy(&r, p, 64); return r; }
inline m512 loadu_ps(const float* p) { m512 r; std::memcpy(&r, p, 64); return r; }
inline m512 maskz_loadu_ps(mask16 k, const void* p) { m512 r = setzero_ps(); for (int i = 0; i < 16; ++i) if (k >> i & 1) std::memcpy(&r.f[i], (const char*)p + 4 * i, 4); return r; }
inline m512i maskz_loadu_epi16(mask32 k, const void* p) { m512i r; std::memset(&r, 0, 64); for (int i = 0; i < 32; ++i) if (k >> i & 1) std::memcpy(&r.uw[i], (const char*)p + 2 * i, 2); return r; }
inline __m256i maskz_loadu_epi16_256(mask16 k, const void* p) { uint16_t t[16] = {}; for (int i = 0; i < 16; ++i) if (k >> i & 1) std::memcpy(&t[i], (const char*)p + 2 * i, 2); return _mm256_loadu_si256((const __m256i*)t); }
inline void mask_storeu_ps(float* p, mask16 k, m512 v) { for (int i = 0; i < 16; ++i) if (k >> i & 1) p[i] = v.f[i]; }
inline m512i dpbusd_epi32(m512i s, m512i a, m512i b) { for (int i = 0; i < 16; ++i) { int64_t acc = 0; for (int j = 0; j < 4; ++j) acc += int32_t(a.ub[4 * i + j]) * int32_t(b.b[4 * i + j]); s.d[i] = int32_t(uint32_t(s.d[i]) + uint32_t(acc)); } return s; }
inline m512i and_si512(m512i a, m512i b) { for (int i = 0; i < 16; ++i) a.ud[i] &= b.ud[i]; return a; }
inline m512i or_si512(m512i a, m512i b) { for (int i = 0; i < 16; ++i) a.ud[i] |= b.ud[i]; return a; }
inline m512i srli_epi16(m512i a, int n) { for (auto& v : a.uw) v = uint16_t(v >> n); return a; }
inline m512i srli_epi32(m512i a, int n) { for (auto& v : a.ud) v >>= n; return a; }
inline m512i add_epi32(m512i a, m512i b) { for (int i = 0; i < 16; ++i) a.ud[i] += b.ud[i]; return a; }
inline m512 cvtph_ps(__m256i h) { m512 r; _mm256_storeu_ps(r.f, _mm256_cvtph_ps(_mm256_castsi256_si128(h))); _mm256_storeu_ps(r.f + 8, _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1))); return r; }
inline m512 cvtepi32_ps(m512i a) { m512 r; for (int i = 0; i < 16; ++i) r.f[i] = float(a.d[i]); return r; }
inline m512 mul_ps(m512 a, m512 b) { for (int i = 0; i < 16; ++i) a.f[i] *= b.f[i]; return a; }
inline m512 add_ps(m512 a, m512 b) { for (int i = 0; i < 16; ++i) a.f[i] += b.f[i]; return a; }
inline m512 sub_ps(m512 a, m512 b) { for (int i = 0; i < 16; ++i) a.f[i] -= b.f[i]; return a; }
inline m512 max_ps(m512 a, m512 b) { for (int i = 0; i < 16; ++i) a.f[i] = a.f[i] > b.f[i] ? a.f[i] : b.f[i]; return a; }
inline m512 abs_ps(m512 a) { for (auto& v : a.f) v = std::fabs(v); return a; }
inline m512 fmadd_ps(m512 a, m512 b, m512 c) { for (int i = 0; i < 16; ++i) c.f[i] = std::fma(a.f[i], b.f[i], c.f[i]); return c; }
inline m512 roundscale_ps(m512 a, int imm) { if ((imm & 3) != 3) std::abort(); for (auto& v : a.f) v = std::trunc(v); return a; }
inline mask16 cmp_ps_mask(m512 a, m512 b, int imm) { mask16 k = 0; for (int i = 0; i < 16; ++i) { bool r; if (imm == _CMP_GE_OQ) r = a.f[i] >= b.f[i]; else if (imm == _CMP_UNORD_Q) r = std::isnan(a.f[i]) || std::isnan(b.f[i]); else std::abort(); if (r) k |= mask16(1u << i); } return k; }
inline m512i castps_si512(m512 a) { m512i r; std::memcpy(&r, &a, 64); return r; }
inline m512 castsi512_ps(m512i a) { m512 r; std::memcpy(&r, &a, 64); return r; }
inline m512i cvttps_epi32(m512 a) { m512i r; for (int i = 0; i < 16; ++i) { float v = a.f[i]; r.d[i] = (std::isnan(v) || std::fabs(v) >= 2147483648.0f) ? INT32_MIN : int32_t(v); } return r; }
inline m512 mask_add_ps(m512 src, mask16 k, m512 a, m512 b) { for (int i = 0; i < 16; ++i) if (k >> i & 1) src.f[i] = a.f[i] + b.f[i]; return src; }
inline float reduce_max_ps(m512 a) { float m = a.f[0]; for (int i = 1; i < 16; ++i) m = std::max(m, a.f[i]); return m; }
inline float reduce_add_ps(m512 a) { float s[8]; for (int i = 0; i < 8; ++i) s[i] = a.f[i] + a.f[i + 8]; for (int i = 0; i < 4; ++i) s[i] += s[i + 4]; s[0] += s[2]; s[1] += s[3]; return s[0] + s[1]; }
inline int32_t reduce_add_epi32(m512i a) { uint32_t s = 0; for (auto v : a.ud) s += v; return int32_t(s); }
inline __m128i cvtepi32_epi8(m512i a) { int8_t t[16]; for (int i = 0; i < 16; ++i) t[i] = int8_t(a.ud[i] & 0xff); return _mm_loadu_si128((const __m128i*)t); }
inline __m256i cvtepi32_epi16(m512i a) { int16_t t[16]; for (int i = 0; i < 16; ++i) t[i] = int16_t(a.ud[i] & 0xffff); return _mm256_loadu_si256((const __m256i*)t); }
inline m512i mask_mov_epi32(m512i src, mask16 k, m512i a) { for (int i = 0; i < 16; ++i) if (k >> i & 1) src.d[i] = a.d[i]; return src; }
inline float bf(uint16_t h) { uint32_t u = uint32_t(h) << 16; float f; std::memcpy(&f, &u, 4); return f; }
inline m512i setzero_si512() { m512i r; std::memset(&r, 0, 64); return r; }
inline m512i sub_epi32(m512i a, m512i b) { for (int i = 0; i < 16; ++i) a.ud[i] -= b.ud[i]; return a; }
inline m512i slli_epi16(m512i a, int n) { for (auto& v : a.uw) v = uint16_t(v << n); return a; }
inline m512i slli_epi32(m512i a, int n) { for (auto& v : a.ud) v <<= n; return a; }
inline m512i srai_epi32(m512i a, int n) { for (auto& v : a.d) v >>= n; return a; }
inline m512i cvtepi8_epi16(__m256i a) { int8_t t[32]; _mm256_storeu_si256((__m256i*)t, a); m512i r; for (int i = 0; i < 32; ++i) r.w[i] = t[i]; return r; }
inline m512i mullo_epi32(m512i a, m512i b) { for (int i = 0; i < 16; ++i) a.ud[i] *= b.ud[i]; return a; }
inline m512i dpwssd_epi32(m512i s, m512i a, m512i b) { for (int i = 0; i < 16; ++i) s.d[i] = int32_t(uint32_t(s.d[i]) + uint32_t(int32_t(a.w[2 * i]) * b.w[2 * i] + int32_t(a.w[2 * i + 1]) * b.w[2 * i + 1])); return s; }
inline m512 fnmadd_ps(m512 a, m512 b, m512 c) { for (int i = 0; i < 16; ++i) c.f[i] = std::fma(-a.f[i], b.f[i], c.f[i]); return c; }
inline m512 dpbf16_ps(m512 s, m512bh a, m512bh b) { for (int i = 0; i < 16; ++i) { s.f[i] += bf(a.h[2 * i + 1]) * bf(b.h[2 * i + 1]); s.f[i] += bf(a.h[2 * i]) * bf(b.h[2 * i]); } return s; }
}  // namespace emu
#define __m512 emu::m512
#define __m512i emu::m512i
#define __m512bh emu::m512bh
#define __mmask16 emu::mask16
#define __mmask32 emu::mask32
#define _mm512_setzero_ps emu::setzero_ps
#define _mm512_set1_ps emu::set1_ps
#define _mm512_set1_epi32 emu::set1_epi32
#define _mm512_set1_epi8 emu::set1_epi8
#define _mm512_loadu_si512 emu::loadu_si512
#define _mm512_loadu_ps emu::loadu_ps
#define _mm512_maskz_loadu_ps emu::maskz_loadu_ps
#define _mm512_maskz_loadu_epi16 emu::maskz_loadu_epi16
#define _mm256_maskz_loadu_epi16 emu::maskz_loadu_epi16_256
#define _mm512_mask_storeu_ps emu::mask_storeu_ps
#define _mm512_dpbusd_epi32 emu::dpbusd_epi32
#define _mm512_and_si512 emu::and_si512
#define _mm512_or_si512 emu::or_si512
#define _mm512_srli_epi16 emu::srli_epi16
#define _mm512_srli_epi32 emu::srli_epi32
#define _mm512_add_epi32 emu::add_epi32
#define _mm512_cvtph_ps emu::cvtph_ps
#define _mm512_cvtepi32_ps emu::cvtepi32_ps
#define _mm512_mul_ps emu::mul_ps
#define _mm512_add_ps emu::add_ps
#define _mm512_sub_ps emu::sub_ps
#define _mm512_max_ps emu::max_ps
#define _mm512_abs_ps emu::abs_ps
#define _mm512_fmadd_ps emu::fmadd_ps
#define _mm512_roundscale_ps emu::roundscale_ps
#define _mm512_cmp_ps_mask emu::cmp_ps_mask
#define _mm512_castps_si512 emu::castps_si512
#define _mm512_castsi512_ps emu::castsi512_ps
#define _mm512_cvttps_epi32 emu::cvttps_epi32
#define _mm512_mask_add_ps emu::mask_add_ps
#define _mm512_reduce_max_ps emu::reduce_max_ps
#define _mm512_reduce_add_ps emu::reduce_add_ps
#define _mm512_reduce_add_epi32 emu::reduce_add_epi32
#define _mm512_cvtepi32_epi8 emu::cvtepi32_epi8
#define _mm512_cvtepi32_epi16 emu::cvtepi32_epi16
#define _mm512_mask_mov_epi32 emu::mask_mov_epi32
#define _mm512_dpbf16_ps emu::dpbf16_ps
#define _mm512_setzero_si512 emu::setzero_si512
#define _mm512_sub_epi32 emu::sub_epi32
#define _mm512_slli_epi16 emu::slli_epi16
#define _mm512_slli_epi32 emu::slli_epi32
#define _mm512_srai_epi32 emu::srai_epi32
#define _mm512_cvtepi8_epi16 emu::cvtepi8_epi16
#define _mm512_mullo_epi32 emu::mullo_epi32
#define _mm512_dpwssd_epi32 emu::dpwssd_epi32
#define _mm512_fnmadd_ps emu::fnmadd_ps
// clang-format on

// The kernel file under test, with its entry point renamed so it does not clash with the real
// AVX-512 kernels linked from the library.
#define Avx512Kernels EmulatedAvx512Kernels
#include "chorus/kernels/x86/matmul_avx512.cc"  // NOLINT(bugprone-suspicious-include)
#undef Avx512Kernels

#pragma GCC pop_options

namespace chorus::kernels {
namespace {

bool HostCanRunEmulation() {
  const CpuFeatures& f = DetectCpu();
  return f.avx2 && f.fma && f.f16c;
}

std::vector<float> RandomVec(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

PackedWeight MakeWeight(DType dt, int64_t n, int64_t k, uint32_t seed) {
  // The AVX-512 layouts (bf16 k-pair panels too) whatever this host runs.
  auto pw = internal::PackForIsa(
      Tensor::FromF32(RandomVec(static_cast<size_t>(n * k), seed, 0.5f), dt, {n, k}),
      IsaLevel::kAvx512);
  CHORUS_CHECK(pw.ok()) << pw.status().ToString();
  return std::move(pw).value();
}

void Emulated(const PackedWeight& w, const float* x, int64_t x_stride, int64_t m, float* y,
              int64_t y_stride, bool accumulate, ThreadPool* pool) {
  const MatMulOut out{&w, y, y_stride};
  internal::MatMulWithKernels(internal::EmulatedAvx512Kernels(), {&out, 1}, x, x_stride, m,
                              accumulate, pool);
}

struct Shape {
  int64_t m, k, n;
};

TEST(MatMulAvx512Emulated, MatchesReference) {
  if (!HostCanRunEmulation()) GTEST_SKIP() << "emulation itself needs AVX2/FMA/F16C";
  ThreadPool pool(2);
  const Shape q_shapes[] = {{1, 32, 1},   {3, 96, 5},    {8, 96, 17},  {64, 32, 33},
                            {5, 256, 70}, {1, 1024, 64}, {33, 64, 20}, {2, 64, 130}};
  // K types need k % 256 == 0.
  const Shape k_shapes[] = {{1, 256, 1},   {3, 512, 17},  {5, 256, 70}, {33, 768, 20},
                            {2, 256, 130}, {1, 768, 130}, {1, 512, 64}};
  const Shape f_shapes[] = {{1, 1, 1},   {3, 7, 5},   {8, 33, 17}, {64, 32, 17},
                            {5, 47, 19}, {2, 300, 9}, {33, 16, 6}, {7, 33, 130}};
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_0, DType::kQ2_K,
                   DType::kQ3_K, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K}) {
    const bool quant = DTypeIsQuantized(dt);
    for (const Shape& s : DTypeIsKQuant(dt) ? std::span<const Shape>(k_shapes)
                          : quant           ? std::span<const Shape>(q_shapes)
                                            : std::span<const Shape>(f_shapes)) {
      const int64_t x_stride = s.k + 3, y_stride = s.n + 2;
      const PackedWeight w = MakeWeight(dt, s.n, s.k, static_cast<uint32_t>(s.k * 31 + s.n));
      const std::vector<float> x = RandomVec(static_cast<size_t>(s.m * x_stride), 11);
      std::vector<float> xr(x);
      if (dt == DType::kBF16)
        for (auto& v : xr) v = BF16ToF32(F32ToBF16(v));
      const std::vector<float> wf = w.source().ToF32();
      for (bool accumulate : {false, true}) {
        const std::vector<float> y0 = RandomVec(static_cast<size_t>(s.m * y_stride), 4);
        std::vector<float> ref(y0), got(y0);
        reference::MatMul(w, x.data(), x_stride, s.m, ref.data(), y_stride, accumulate);
        Emulated(w, x.data(), x_stride, s.m, got.data(), y_stride, accumulate, &pool);
        for (int64_t i = 0; i < s.m; ++i) {
          for (int64_t j = 0; j < y_stride; ++j) {
            const float g = got[i * y_stride + j], r = ref[i * y_stride + j];
            if (j >= s.n || quant) {  // padding untouched; q formats bit-exact
              ASSERT_EQ(0, std::memcmp(&g, &r, 4))
                  << DTypeName(dt) << " m=" << s.m << " k=" << s.k << " n=" << s.n << " y[" << i
                  << "," << j << "] " << g << " vs " << r;
              continue;
            }
            double scale = 0;
            for (int64_t e = 0; e < s.k; ++e)
              scale += std::fabs(double(xr[i * x_stride + e]) * wf[j * s.k + e]);
            const double tol = 1e-5 * scale + (accumulate ? 1.2e-7 * std::fabs(r) : 0.0) + 1e-30;
            ASSERT_LE(std::fabs(double(g) - r), tol)
                << DTypeName(dt) << " m=" << s.m << " k=" << s.k << " n=" << s.n << " y[" << i
                << "," << j << "]";
          }
        }
      }
    }
  }
}

TEST(MatMulAvx512Emulated, BatchInvariant) {
  if (!HostCanRunEmulation()) GTEST_SKIP() << "emulation itself needs AVX2/FMA/F16C";
  ThreadPool pool1(1), pool2(2);
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_0, DType::kQ4_K,
                   DType::kQ6_K}) {
    const int64_t k = DTypeIsKQuant(dt) ? 256 : DTypeIsQuantized(dt) ? 64 : 45, n = 37, rows = 33;
    const PackedWeight w = MakeWeight(dt, n, k, 5);
    const std::vector<float> x = RandomVec(static_cast<size_t>(rows * k), 6);
    std::vector<float> all(rows * n), all2(rows * n);
    Emulated(w, x.data(), k, rows, all.data(), n, false, &pool1);
    Emulated(w, x.data(), k, rows, all2.data(), n, false, &pool2);
    EXPECT_EQ(0, std::memcmp(all.data(), all2.data(), all.size() * 4)) << DTypeName(dt);
    for (int64_t i : {0, 6, 32}) {
      std::vector<float> alone(n);
      Emulated(w, x.data() + i * k, k, 1, alone.data(), n, false, &pool2);
      EXPECT_EQ(0, std::memcmp(alone.data(), all.data() + i * n, n * 4))
          << DTypeName(dt) << " row " << i;
    }
  }
}

}  // namespace
}  // namespace chorus::kernels
