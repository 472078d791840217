// The training kernels at TinyLlama-1.1B shapes against the machine's measured FLOP/s
// (docs/finetuning.md, "Speed"): the forward MatMul and the backward MatMulTransposed
// (dx = dy·W, reading the stored weights) for m = 256 rows (one sequence of 256 tokens), f32
// and q4_0 weights, 1 and 2 threads; and BM_PeakFma, independent AVX-512 (else AVX2) FMA
// chains on every pool thread — the FLOP/s ceiling the others are a fraction of.
//
//   ./train_bench --benchmark_min_time=0.5 --benchmark_repetitions=3
//
// The machine is shared: quote medians and ratios to BM_PeakFma measured in the same run.
#include <benchmark/benchmark.h>
#if !defined(__clang__)  // GCC 12 bug 105593: spurious -Wmaybe-uninitialized in AVX-512 headers
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>

#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "chorus/kernels/dispatch.h"
#include "chorus/kernels/matmul.h"
#include "chorus/train/grad_kernels.h"

namespace chorus::train {
namespace {

ThreadPool* Pool(int threads) {
  static std::map<int, std::unique_ptr<ThreadPool>> pools;
  auto& p = pools[threads];
  if (!p) p = std::make_unique<ThreadPool>(threads);
  return p.get();
}

const kernels::PackedWeight& Weight(DType dt, int64_t n, int64_t k) {
  static std::map<std::string, kernels::PackedWeight> cache;
  const std::string key = std::string(DTypeName(dt)) + std::to_string(n) + "x" + std::to_string(k);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  std::mt19937 rng(42);
  std::normal_distribution<float> dist(0.0f, 0.02f);
  std::vector<float> v(static_cast<size_t>(n * k));
  for (auto& x : v) x = dist(rng);
  auto pw = kernels::PackedWeight::Pack(Tensor::FromF32(v, dt, {n, k}));
  CHORUS_CHECK(pw.ok()) << pw.status().ToString();
  return cache.emplace(key, std::move(pw).value()).first->second;
}

__attribute__((target("avx512f"))) double FmaAvx512(int64_t iters) {
  __m512 a[12];
  for (int i = 0; i < 12; ++i) a[i] = _mm512_set1_ps(1.0f + static_cast<float>(i) * 1e-3f);
  const __m512 x = _mm512_set1_ps(0.999999f), y = _mm512_set1_ps(1e-7f);
  for (int64_t it = 0; it < iters; ++it) {
    for (int i = 0; i < 12; ++i) a[i] = _mm512_fmadd_ps(a[i], x, y);
  }
  alignas(64) float o[16];
  for (int i = 1; i < 12; ++i) a[0] = _mm512_add_ps(a[0], a[i]);
  _mm512_store_ps(o, a[0]);
  return o[0];
}

__attribute__((target("avx2,fma"))) double FmaAvx2(int64_t iters) {
  __m256 a[12];
  for (int i = 0; i < 12; ++i) a[i] = _mm256_set1_ps(1.0f + static_cast<float>(i) * 1e-3f);
  const __m256 x = _mm256_set1_ps(0.999999f), y = _mm256_set1_ps(1e-7f);
  for (int64_t it = 0; it < iters; ++it) {
    for (int i = 0; i < 12; ++i) a[i] = _mm256_fmadd_ps(a[i], x, y);
  }
  alignas(32) float o[8];
  _mm256_store_ps(o, a[0]);
  return o[0];
}

void BM_PeakFma(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  const bool avx512 = kernels::ActiveIsa() >= kernels::IsaLevel::kAvx512;
  constexpr int64_t kIters = 1 << 20;
  ThreadPool* pool = Pool(threads);
  for (auto _ : state) {
    pool->Run(
        [&](int, int) { benchmark::DoNotOptimize(avx512 ? FmaAvx512(kIters) : FmaAvx2(kIters)); });
  }
  const double flops = 2.0 * 12 * (avx512 ? 16 : 8) * kIters * threads;
  state.counters["FLOP/s"] =
      benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(avx512 ? "avx512" : "avx2");
}

void BM_Forward(benchmark::State& state, DType dt, int64_t n, int64_t k) {
  const int64_t m = 256;
  const int threads = static_cast<int>(state.range(0));
  const kernels::PackedWeight& w = Weight(dt, n, k);
  std::vector<float> x(static_cast<size_t>(m * k), 0.5f), y(static_cast<size_t>(m * n));
  for (auto _ : state) {
    kernels::MatMul(w, x.data(), k, m, y.data(), n, false, Pool(threads));
    benchmark::ClobberMemory();
  }
  state.counters["FLOP/s"] =
      benchmark::Counter(2.0 * m * n * k, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_Transposed(benchmark::State& state, DType dt, int64_t n, int64_t k) {
  const int64_t m = 256;
  const int threads = static_cast<int>(state.range(0));
  const kernels::PackedWeight& w = Weight(dt, n, k);
  std::vector<float> dy(static_cast<size_t>(m * n), 0.5f), dx(static_cast<size_t>(m * k));
  for (auto _ : state) {
    MatMulTransposed(w, dy.data(), n, m, dx.data(), k, false, Pool(threads));
    benchmark::ClobberMemory();
  }
  state.counters["FLOP/s"] =
      benchmark::Counter(2.0 * m * n * k, benchmark::Counter::kIsIterationInvariantRate);
}

int Register() {
  benchmark::RegisterBenchmark("PeakFma", BM_PeakFma)->Arg(1)->Arg(2)->UseRealTime();
  for (DType dt : {DType::kF32, DType::kQ4_0}) {
    for (auto [n, k] : {std::pair<int64_t, int64_t>{2048, 2048}, {5632, 2048}, {2048, 5632}}) {
      const std::string s =
          std::string(DTypeName(dt)) + "/" + std::to_string(n) + "x" + std::to_string(k) + "/m:256";
      benchmark::RegisterBenchmark(("Forward/" + s).c_str(), BM_Forward, dt, n, k)
          ->Arg(1)
          ->Arg(2)
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
      benchmark::RegisterBenchmark(("Transposed/" + s).c_str(), BM_Transposed, dt, n, k)
          ->Arg(1)
          ->Arg(2)
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
    }
  }
  return 0;
}
const int kRegistered = Register();

}  // namespace
}  // namespace chorus::train

BENCHMARK_MAIN();
