// Stand-alone experiment: the BitDelta lookup kernel (NR = 1) streaming ~475 MB of sign bits
// from memory on 2 threads, with the codes row-major (as served) or block-sequential (each
// block's 8 panels x 16 rows x 64 bytes per 512-column chunk stored in the order the kernel
// reads them). Same sums either way (checked).
#include <immintrin.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

constexpr int64_t kRows = 5632, kCols = 2048, kRowBytes = kCols / 8, kChunks = kCols / 512;
constexpr int64_t kMatBytes = kRows * kRowBytes;
constexpr int64_t kBlockRows = 128, kBlockBytes = kBlockRows * kRowBytes;
int kAhead = 2;
#ifndef SPREAD
#define SPREAD 0
#endif
constexpr bool kSpread = SPREAD;

inline void Transpose16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int j = 0; j < 4; ++j) {
    const __m512i x0 = _mm512_shuffle_i32x4(r[j], r[4 + j], 0x44);
    const __m512i x1 = _mm512_shuffle_i32x4(r[j], r[4 + j], 0xEE);
    const __m512i x2 = _mm512_shuffle_i32x4(r[8 + j], r[12 + j], 0x44);
    const __m512i x3 = _mm512_shuffle_i32x4(r[8 + j], r[12 + j], 0xEE);
    t[j] = _mm512_shuffle_i32x4(x0, x2, 0x88);
    t[4 + j] = _mm512_shuffle_i32x4(x0, x2, 0xDD);
    t[8 + j] = _mm512_shuffle_i32x4(x1, x3, 0x88);
    t[12 + j] = _mm512_shuffle_i32x4(x1, x3, 0xDD);
  }
  for (int k = 0; k < 16; ++k) r[k] = t[k];
}

// Address of (block-local row i of panel p, chunk c) for block b.
template <bool kSeq>
inline const uint8_t* At(const uint8_t* m, int64_t b, int64_t p, int64_t c, int64_t i) {
  if (kSeq) return m + b * kBlockBytes + ((c * 8 + p) * 16 + i) * 64;
  return m + (b * kBlockRows + 16 * p + i) * kRowBytes + 64 * c;
}

template <bool kSeq>
void Block(const uint8_t* m, int64_t b, const int16_t* tables, int32_t* out) {
  const __m512i nibbles = _mm512_set1_epi32(0x000F000F);
  const __m512i second = _mm512_set1_epi32(0x00100000);
  const __m512i ones = _mm512_set1_epi16(1);
  alignas(64) int32_t sums[8][16] = {};
  alignas(64) uint32_t bits[8][16][16];
  const int64_t nblocks = kRows / kBlockRows;
  const uint8_t* ahead = b + kAhead < nblocks ? m + (b + kAhead) * kBlockBytes : nullptr;
  for (int64_t c = 0; c < kChunks; ++c) {
    for (int64_t p = 0; p < 8; ++p) {
      __m512i v[16];
      for (int i = 0; i < 16; ++i) v[i] = _mm512_loadu_si512(At<kSeq>(m, b, p, c, i));
      if (!kSpread && ahead && kAhead > 0) {
        const int64_t line0 = 16 * (c * 8 + p);
        for (int i = 0; i < 16; ++i)
          _mm_prefetch(reinterpret_cast<const char*>(ahead + 64 * (line0 + i)), _MM_HINT_T1);
      }
      Transpose16(v);
      for (int k = 0; k < 16; ++k) _mm512_store_si512(bits[p][k], v[k]);
    }
    const int64_t pair0 = 64 * c;
    for (int k = 0; k < 16; ++k) {
      for (int64_t p = 0; p < 8; ++p) {
        if (kSpread && ahead && kAhead > 0)
          _mm_prefetch(reinterpret_cast<const char*>(ahead + 64 * (128 * c + 8 * k + p)),
                       _MM_HINT_T1);
        __m512i acc = _mm512_load_si512(sums[p]);
        __m512i code = _mm512_load_si512(bits[p][k]);
        for (int s = 0; s < 4; ++s) {
          const __m512i idx = _mm512_ternarylogic_epi32(code, nibbles, second, 0xEA);
          const __m512i t = _mm512_loadu_si512(tables + 32 * (pair0 + 4 * k + s));
          acc = _mm512_dpwssd_epi32(acc, _mm512_permutexvar_epi16(idx, t), ones);
          code = _mm512_srli_epi32(code, 4);
        }
        _mm512_store_si512(sums[p], acc);
      }
    }
  }
  for (int p = 0; p < 8; ++p)
    for (int i = 0; i < 16; ++i) out[16 * p + i] += sums[p][i];
}

int main(int argc, char** argv) {
  const int64_t n_mats = argc > 1 ? atoi(argv[1]) : 330;
  const int reps = argc > 2 ? atoi(argv[2]) : 5;
  if (argc > 3) kAhead = atoi(argv[3]);
  const int passes = argc > 4 ? atoi(argv[4]) : 1;
  const size_t total = static_cast<size_t>(n_mats * kMatBytes);
  auto alloc = [&] {
    void* p = aligned_alloc(2 << 20, (total + (2 << 20) - 1) / (2 << 20) * (2 << 20));
    madvise(p, total, MADV_HUGEPAGE);
    return static_cast<uint8_t*>(p);
  };
  uint8_t* rm = alloc();
  uint8_t* sq = alloc();
  std::mt19937_64 rng(1);
  for (size_t i = 0; i < total; i += 8) {
    uint64_t v = rng();
    std::memcpy(rm + i, &v, 8);
  }
  // Block-sequential copy.
  for (int64_t m = 0; m < n_mats; ++m)
    for (int64_t b = 0; b < kRows / kBlockRows; ++b)
      for (int64_t c = 0; c < kChunks; ++c)
        for (int64_t p = 0; p < 8; ++p)
          for (int64_t i = 0; i < 16; ++i)
            std::memcpy(const_cast<uint8_t*>(At<true>(sq + m * kMatBytes, b, p, c, i)),
                        At<false>(rm + m * kMatBytes, b, p, c, i), 64);
  // Tables of one input row (random, |T| small): 64 pairs per chunk, 32 int16 each.
  std::vector<int16_t> tables(kChunks * 64 * 32);
  for (auto& t : tables) t = static_cast<int16_t>(rng() % 2001) - 1000;
  std::vector<int32_t> out_rm(n_mats * kRows), out_sq(n_mats * kRows);
  auto run = [&](bool seq, std::vector<int32_t>& out) {
    std::fill(out.begin(), out.end(), 0);
    const int64_t nblocks = kRows / kBlockRows;  // 44
    auto worker = [&](int t) {
      for (int pass = 0; pass < passes; ++pass)
        for (int64_t m = 0; m < n_mats; ++m) {
          const uint8_t* base = (seq ? sq : rm) + m * kMatBytes;
          for (int64_t b = t * nblocks / 2; b < (t + 1) * nblocks / 2; ++b) {
            if (seq)
              Block<true>(base, b, tables.data(), out.data() + m * kRows + b * kBlockRows);
            else
              Block<false>(base, b, tables.data(), out.data() + m * kRows + b * kBlockRows);
          }
        }
    };
    const auto t0 = std::chrono::steady_clock::now();
    std::thread a(worker, 0), b(worker, 1);
    a.join();
    b.join();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  for (int r = 0; r < reps; ++r) {
    const double a = run(false, out_rm), b = run(true, out_sq);
    std::printf("row-major %.1f ms %.1f GB/s | block-seq %.1f ms %.1f GB/s | ratio %.3f\n", a * 1e3,
                passes * total / a / 1e9, b * 1e3, passes * total / b / 1e9, a / b);
  }
  std::printf("same sums: %s\n", out_rm == out_sq ? "yes" : "NO");
  // In cache: one matrix over and over (L2/L3 resident: 1.4 MB).
  std::printf("bytes %.1f MB\n", total / 1e6);
}
