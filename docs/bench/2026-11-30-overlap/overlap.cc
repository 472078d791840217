// Can a memory-bound term be hidden behind a compute-bound matmul by prefetching it during the
// matmul and consuming it right after, from L2? (docs/adapters.md, "Segment kernels": the
// "structural" route for issue 13 item 8.) Stand-alone, not part of the build:
//   g++ -O2 -march=native -std=c++20 -pthread overlap.cc -o overlap && ./overlap 2200 256
// Each of 2 threads walks its own 512 MiB of "term" bytes (bf16) in units of CHUNK KiB. Per unit:
//   compute: ITERS × 64 independent vpdpbusd on registers (a compute-bound tile, no memory);
//   consume: the unit's bf16 widened to f32 and multiply-added with an L1-resident x (8 chains),
//            as the LoRA segment kernels do with adapter rows.
// Modes (each run times the slower thread; rounds alternate the modes):
//   0 compute only            3 consume only (streamed from DRAM)
//   1 compute, then consume   2 compute while prefetching (prefetcht0) the NEXT unit, then consume
//   4 compute, then consume the same unit every time (the term's cost when its bytes are in L2)
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

static double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Eight independent accumulators, written out so that they stay in registers.
__attribute__((noinline)) __m512i Compute(int iters, const char* pf, long pf_bytes) {
  __m512i a0 = _mm512_set1_epi32(1), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  const __m512i b = _mm512_set1_epi8(3), c = _mm512_set1_epi8(5);
  const long lines = pf_bytes / 64, per = lines / iters + 1;
  long li = 0;
  for (int i = 0; i < iters; ++i) {
    if (pf != nullptr)
      for (long j = 0; j < per && li < lines; ++j, ++li) _mm_prefetch(pf + li * 64, _MM_HINT_T0);
    for (int r = 0; r < 8; ++r) {
      a0 = _mm512_dpbusd_epi32(a0, b, c);
      a1 = _mm512_dpbusd_epi32(a1, b, c);
      a2 = _mm512_dpbusd_epi32(a2, b, c);
      a3 = _mm512_dpbusd_epi32(a3, b, c);
      a4 = _mm512_dpbusd_epi32(a4, b, c);
      a5 = _mm512_dpbusd_epi32(a5, b, c);
      a6 = _mm512_dpbusd_epi32(a6, b, c);
      a7 = _mm512_dpbusd_epi32(a7, b, c);
    }
  }
  return _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(a0, a1), _mm512_add_epi32(a2, a3)),
                          _mm512_add_epi32(_mm512_add_epi32(a4, a5), _mm512_add_epi32(a6, a7)));
}

__attribute__((noinline)) float Consume(const uint16_t* p, long n, const float* x) {
  __m512 acc[8];
  for (auto& v : acc) v = _mm512_setzero_ps();
  for (long i = 0; i < n; i += 128) {
    for (int q = 0; q < 4; ++q) {
      const __m512i w = _mm512_loadu_si512(p + i + 32 * q);
      const __m512 lo = _mm512_castsi512_ps(
          _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(w)), 16));
      const __m512 hi = _mm512_castsi512_ps(
          _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(w, 1)), 16));
      acc[2 * q] = _mm512_fmadd_ps(lo, _mm512_loadu_ps(x + ((i + 32 * q) & 2047)), acc[2 * q]);
      acc[2 * q + 1] =
          _mm512_fmadd_ps(hi, _mm512_loadu_ps(x + ((i + 32 * q + 16) & 2047)), acc[2 * q + 1]);
    }
  }
  __m512 s = acc[0];
  for (int q = 1; q < 8; ++q) s = _mm512_add_ps(s, acc[q]);
  return _mm512_reduce_add_ps(s);
}

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s ITERS CHUNK_KIB [ROUNDS]\n", argv[0]);
    return 2;
  }
  const int iters = std::atoi(argv[1]);
  const long chunk = std::atol(argv[2]) * 1024;
  const int rounds = argc > 3 ? std::atoi(argv[3]) : 3;
  constexpr int kThreads = 2;
  constexpr long kTotal = 512L << 20;
  std::vector<char*> bufs(kThreads);
  for (auto& b : bufs) {
    b = static_cast<char*>(std::aligned_alloc(2 << 20, kTotal));
    std::memset(b, 1, kTotal);  // touched before timing
  }
  std::vector<float> x(2048 + 64, 0.5f);
  volatile float sink = 0;
  for (int round = 0; round < rounds; ++round) {
    for (int mode : {0, 3, 1, 2, 4}) {
      std::vector<double> times(kThreads);
      std::vector<std::thread> ts;
      for (int t = 0; t < kThreads; ++t) {
        ts.emplace_back([&, t] {
          const char* buf = bufs[t];
          const long units = kTotal / chunk;
          const double t0 = Now();
          __m512i s = _mm512_setzero_si512();
          float f = 0;
          for (long u = 0; u < units; ++u) {
            const char* cur = mode == 4 ? buf : buf + u * chunk;
            const char* next = u + 1 < units ? buf + (u + 1) * chunk : nullptr;
            if (mode != 3)
              s = _mm512_add_epi32(s, Compute(iters, mode == 2 ? next : nullptr, chunk));
            if (mode != 0)
              f += Consume(reinterpret_cast<const uint16_t*>(cur), chunk / 2, x.data());
          }
          times[t] = Now() - t0;
          sink = f + static_cast<float>(_mm512_reduce_add_epi32(s));
        });
      }
      for (auto& th : ts) th.join();
      std::printf("round %d mode %d: %.1f ms\n", round, mode,
                  1e3 * *std::max_element(times.begin(), times.end()));
    }
  }
  return 0;
}
