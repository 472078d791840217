// MatMul over TinyLlama-1.1B projection shapes (n × k), every weight dtype, decode (m = 1, 8, 16,
// 32) and prefill (m = 512). Counters: weight bytes/s (what bounds decode) and FLOP/s (2·m·n·k,
// what bounds prefill), for 1 and 2 threads (the `threads` argument).
//
//   ./matmul_bench --benchmark_filter='q4_0/2048x2048/m:1/' --benchmark_min_time=0.2
//
// CHORUS_ISA=avx512 (or avx2, scalar) caps the kernel level, e.g. to compare the AMX tile
// kernels with the AVX-512 ones on an AMX machine.
// The machine is shared: quote medians and ratios to a baseline run in the same invocation.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "chorus/kernels/dispatch.h"
#include "chorus/kernels/matmul.h"

namespace chorus::kernels {
namespace {

const DType kTypes[] = {DType::kF32,  DType::kF16,  DType::kBF16, DType::kQ8_0, DType::kQ4_0,
                        DType::kQ4_K, DType::kQ5_K, DType::kQ6_K, DType::kQ3_K, DType::kQ2_K};
const int64_t kShapes[][2] = {{2048, 2048}, {256, 2048}, {5632, 2048}, {2048, 5632}, {32000, 2048}};
const int64_t kRows[] = {1, 8, 16, 32, 512};

// Packed weights are cached across benchmarks (building a 32000×2048 one takes a while).
const PackedWeight& Weight(DType dt, int64_t n, int64_t k) {
  static std::map<std::string, PackedWeight> cache;
  const std::string key = std::string(DTypeName(dt)) + std::to_string(n) + "x" + std::to_string(k);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  std::mt19937 rng(42);
  std::normal_distribution<float> dist(0.0f, 0.02f);
  std::vector<float> v(static_cast<size_t>(n * k));
  for (auto& x : v) x = dist(rng);
  auto pw = PackedWeight::Pack(Tensor::FromF32(v, dt, {n, k}));
  CHORUS_CHECK(pw.ok()) << pw.status().ToString();
  return cache.emplace(key, std::move(pw).value()).first->second;
}

ThreadPool* Pool(int threads) {
  static std::map<int, std::unique_ptr<ThreadPool>> pools;
  auto& p = pools[threads];
  if (!p) p = std::make_unique<ThreadPool>(threads);
  return p.get();
}

void BM_MatMul(benchmark::State& state, DType dt, int64_t n, int64_t k) {
  const int64_t m = state.range(0);
  const int threads = static_cast<int>(state.range(1));
  const PackedWeight& w = Weight(dt, n, k);
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(m * k)), y(static_cast<size_t>(m * n));
  for (auto& v : x) v = dist(rng);
  ThreadPool* pool = Pool(threads);
  for (auto _ : state) {
    MatMul(w, x.data(), k, m, y.data(), n, false, pool);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  const double weight_bytes = static_cast<double>(w.source().view().NumBytes());
  state.counters["weight_B/s"] =
      benchmark::Counter(weight_bytes, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["FLOP/s"] =
      benchmark::Counter(2.0 * m * n * k, benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(IsaName(ActiveIsa()));
}

// Baseline for the decode figures: streams `bytes` (a buffer larger than L3) once per
// iteration on each pool thread's share, the best a memory-bound MatMul can do.
void BM_ReadBandwidth(benchmark::State& state) {
  const int64_t bytes = state.range(0);
  const int threads = static_cast<int>(state.range(1));
  static std::vector<uint64_t> buf;
  if (static_cast<int64_t>(buf.size()) * 8 < bytes) buf.assign(static_cast<size_t>(bytes / 8), 1);
  ThreadPool* pool = Pool(threads);
  uint64_t sinks[8] = {};
  for (auto _ : state) {
    pool->Run([&](int i, int nt) {
      int64_t b, e;
      ThreadPool::Slice(bytes / 8, i, nt, 64, &b, &e);
      uint64_t acc[4] = {};
      for (int64_t j = b; j + 4 <= e; j += 4)
        for (int u = 0; u < 4; ++u) acc[u] ^= buf[j + u];
      sinks[i] = acc[0] ^ acc[1] ^ acc[2] ^ acc[3];
    });
    benchmark::DoNotOptimize(sinks);
  }
  state.counters["read_B/s"] =
      benchmark::Counter(static_cast<double>(bytes), benchmark::Counter::kIsIterationInvariantRate);
}

// One batch-1 decode step's weight stream without the rest of the step: kLayers TinyLlama-1.1B
// layers (q|k|v and gate|up as one MatMulMulti each, o, down, as Forward runs them) of distinct
// random weights, ~210 MB in q4_0, far more than L3, so every call streams from memory. Compare
// weight_B/s with read/bytes:268435456/threads:2 in the same invocation: the gap is what the
// kernels and the dispatches between them lose against a bare read loop.
//   ./matmul_bench --benchmark_filter='stream|read/.*threads:2' --benchmark_repetitions=5
struct StreamLayer {
  PackedWeight q, k, v, o, gate, up, down;
};
PackedWeight RandomWeight(DType dt, int64_t n, int64_t k, uint64_t seed) {
  std::vector<float> v(static_cast<size_t>(n * k));
  uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
  for (auto& x : v) {  // xorshift: a normal generator would take minutes for 210 MB of weights
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    x = static_cast<float>(static_cast<int64_t>(s >> 40) - (int64_t{1} << 23)) * 2.4e-9f;
  }
  auto pw = PackedWeight::Pack(Tensor::FromF32(v, dt, {n, k}));
  CHORUS_CHECK(pw.ok()) << pw.status().ToString();
  return std::move(pw).value();
}

void BM_DecodeStream(benchmark::State& state, DType dt) {
  constexpr int kLayers = 8;
  constexpr int64_t d = 2048, kv = 256, ff = 5632;
  static std::map<DType, std::vector<StreamLayer>> cache;
  auto& layers = cache[dt];
  if (layers.empty()) {
    for (int l = 0; l < kLayers; ++l) {
      const uint64_t s = static_cast<uint64_t>(l) * 8;
      layers.push_back({RandomWeight(dt, d, d, s), RandomWeight(dt, kv, d, s + 1),
                        RandomWeight(dt, kv, d, s + 2), RandomWeight(dt, d, d, s + 3),
                        RandomWeight(dt, ff, d, s + 4), RandomWeight(dt, ff, d, s + 5),
                        RandomWeight(dt, d, ff, s + 6)});
    }
  }
  ThreadPool* pool = Pool(static_cast<int>(state.range(0)));
  std::vector<float> x(ff, 0.5f), qkv(d + 2 * kv), o(d), gu(2 * ff), down(d);
  double bytes = 0;
  for (const StreamLayer& L : layers) {
    for (const PackedWeight* w : {&L.q, &L.k, &L.v, &L.o, &L.gate, &L.up, &L.down})
      bytes += static_cast<double>(w->source().view().NumBytes());
  }
  for (auto _ : state) {
    for (const StreamLayer& L : layers) {
      const MatMulOut qkv_outs[] = {
          {&L.q, qkv.data(), d}, {&L.k, qkv.data() + d, kv}, {&L.v, qkv.data() + d + kv, kv}};
      MatMulMulti(qkv_outs, x.data(), d, 1, false, pool);
      MatMul(L.o, x.data(), d, 1, o.data(), d, false, pool);
      const MatMulOut gu_outs[] = {{&L.gate, gu.data(), ff}, {&L.up, gu.data() + ff, ff}};
      MatMulMulti(gu_outs, x.data(), d, 1, false, pool);
      MatMul(L.down, x.data(), ff, 1, down.data(), d, false, pool);
    }
    benchmark::DoNotOptimize(down.data());
    benchmark::ClobberMemory();
  }
  state.counters["weight_B/s"] =
      benchmark::Counter(bytes, benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(IsaName(ActiveIsa()));
}

// Pack() cost (runs once per weight at model load): bytes of source weight per second.
void BM_Pack(benchmark::State& state, DType dt) {
  const int64_t n = 5632, k = 2048;
  std::vector<float> v(static_cast<size_t>(n * k), 0.01f);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % 97) * 0.001f - 0.05f;
  const Tensor t = Tensor::FromF32(v, dt, {n, k});
  for (auto _ : state) {
    auto pw = PackedWeight::Pack(t);
    benchmark::DoNotOptimize(pw);
  }
  state.counters["source_B/s"] = benchmark::Counter(static_cast<double>(t.view().NumBytes()),
                                                    benchmark::Counter::kIsIterationInvariantRate);
}

int Register() {
  benchmark::RegisterBenchmark("pack/q8_0/5632x2048", BM_Pack, DType::kQ8_0)
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("pack/q4_0/5632x2048", BM_Pack, DType::kQ4_0)
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("pack/q4_k/5632x2048", BM_Pack, DType::kQ4_K)
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("read", BM_ReadBandwidth)
      ->ArgNames({"bytes", "threads"})
      ->Args({256 << 20, 1})
      ->Args({256 << 20, 2})
      ->Unit(benchmark::kMicrosecond)
      ->UseRealTime();
  for (DType dt : {DType::kQ4_0, DType::kQ8_0, DType::kQ4_K, DType::kQ6_K}) {
    const std::string name = "stream/" + std::string(DTypeName(dt));
    benchmark::RegisterBenchmark(name.c_str(), BM_DecodeStream, dt)
        ->ArgNames({"threads"})
        ->Arg(1)
        ->Arg(2)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
  }
  for (DType dt : kTypes) {
    for (const auto& s : kShapes) {
      const std::string name =
          std::string(DTypeName(dt)) + "/" + std::to_string(s[0]) + "x" + std::to_string(s[1]);
      auto* b = benchmark::RegisterBenchmark(name.c_str(), BM_MatMul, dt, s[0], s[1]);
      b->ArgNames({"m", "threads"})->Unit(benchmark::kMicrosecond)->UseRealTime();
      for (int64_t m : kRows)
        for (int threads : {1, 2}) b->Args({m, threads});
    }
  }
  return 0;
}
const int kRegistered = Register();

}  // namespace
}  // namespace chorus::kernels

int main(int argc, char** argv) {
  if (const char* isa = std::getenv("CHORUS_ISA")) {
    if (const auto level = chorus::kernels::ParseIsaLevel(isa)) chorus::kernels::SetMaxIsa(*level);
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
