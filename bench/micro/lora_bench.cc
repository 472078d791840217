// LoRA segment kernels (shrink + expand of one linear) at a TinyLlama projection (2048 × 2048),
// against the base MatMul of the same rows in the same binary (BM_BaseMatMul, bf16 weights) so
// the adapter overhead can be quoted as a ratio. Workloads (Punica §6 names):
//   distinct  — every row its own adapter (decode, segments of 1 row)
//   identical — all rows one adapter
//   mixed     — ranks 8/16/32/64 round robin over 8 adapters, rows grouped by adapter
// Arguments: rows, rank (0 = mixed), distinct adapters, threads, bf16 weights (0/1, optional).
// Counter: adapter weight bytes/s.
//
//   ./lora_bench --benchmark_filter='distinct' --benchmark_min_time=0.2
//
// The machine is shared: quote medians and ratios to the base run in the same invocation.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "chorus/kernels/lora.h"
#include "chorus/kernels/matmul.h"
#include "chorus/tensor/dtype.h"

namespace chorus::kernels {
namespace {

constexpr int64_t kIn = 2048, kOut = 2048;

std::vector<float> Random(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 0.02f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

void BM_Lora(benchmark::State& state) {
  const int64_t rows = state.range(0), rank_arg = state.range(1), n_adapters = state.range(2);
  ThreadPool pool(static_cast<int>(state.range(3)));
  const int64_t mixed[4] = {8, 16, 32, 64};
  std::vector<std::vector<float>> a(static_cast<size_t>(n_adapters)), bt(a.size());
  std::vector<std::vector<const float*>> a_rows(a.size()), bt_rows(a.size());  // row tables
  const bool bf16 = state.range(4) != 0;
  std::vector<std::vector<uint16_t>> a16(a.size()), bt16(a.size());
  std::vector<std::vector<const uint16_t*>> a16_rows(a.size()), bt16_rows(a.size());
  std::vector<LoraShrinkWeight> sw;
  std::vector<LoraExpandWeight> ew;
  int64_t bytes = 0, max_rank = 0;
  for (int64_t i = 0; i < n_adapters; ++i) {
    const int64_t r = rank_arg > 0 ? rank_arg : mixed[i % 4];
    a[static_cast<size_t>(i)] = Random(static_cast<size_t>(r * kIn), static_cast<uint32_t>(i));
    bt[static_cast<size_t>(i)] = Random(static_cast<size_t>(r * kOut), static_cast<uint32_t>(i + 99));
    for (int64_t j = 0; j < r; ++j) {
      a_rows[static_cast<size_t>(i)].push_back(a[static_cast<size_t>(i)].data() + j * kIn);
      bt_rows[static_cast<size_t>(i)].push_back(bt[static_cast<size_t>(i)].data() + j * kOut);
    }
    const size_t u = static_cast<size_t>(i);
    for (float f : a[u]) a16[u].push_back(F32ToBF16(f));
    for (float f : bt[u]) bt16[u].push_back(F32ToBF16(f));
    for (int64_t j = 0; j < r; ++j) {
      a16_rows[u].push_back(a16[u].data() + j * kIn);
      bt16_rows[u].push_back(bt16[u].data() + j * kOut);
    }
    if (bf16) {
      sw.push_back({nullptr, r, a16_rows[u].data()});
      ew.push_back({nullptr, r, 0, 2.0f, bt16_rows[u].data()});
    } else {
      sw.push_back({a_rows[u].data(), r});
      ew.push_back({bt_rows[u].data(), r, 0, 2.0f});
    }
    bytes += r * (kIn + kOut) * (bf16 ? 2 : 4);
    max_rank = std::max(max_rank, r);
  }
  // Rows grouped by adapter: contiguous equal shares.
  std::vector<LoraSegment> segs;
  for (int64_t i = 0; i < n_adapters; ++i) {
    segs.push_back({rows * i / n_adapters, rows * (i + 1) / n_adapters, static_cast<int32_t>(i)});
  }
  auto x = Random(static_cast<size_t>(rows * kIn), 7);
  std::vector<float> v(static_cast<size_t>(rows * max_rank)), y(static_cast<size_t>(rows * kOut));
  for (auto _ : state) {
    LoraShrink(segs, sw, x.data(), kIn, kIn, v.data(), max_rank, &pool);
    LoraExpand(segs, ew, v.data(), max_rank, kOut, y.data(), kOut, &pool);
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["adapter_bytes/s"] = benchmark::Counter(static_cast<double>(bytes), benchmark::Counter::kIsIterationInvariantRate);
}

void BM_BaseMatMul(benchmark::State& state) {
  const int64_t rows = state.range(0);
  ThreadPool pool(static_cast<int>(state.range(1)));
  auto w = PackedWeight::Pack(Tensor::FromF32(Random(static_cast<size_t>(kIn * kOut), 1), DType::kBF16, {kOut, kIn}));
  auto x = Random(static_cast<size_t>(rows * kIn), 7);
  std::vector<float> y(static_cast<size_t>(rows * kOut));
  for (auto _ : state) {
    MatMul(*w, x.data(), kIn, rows, y.data(), kOut, false, &pool);
    benchmark::DoNotOptimize(y.data());
  }
}

// {rows, rank (0 = mixed), adapters, threads}
BENCHMARK(BM_Lora)->Name("distinct")->ArgNames({"rows", "rank", "adapters", "threads", "bf16"})
    ->Args({1, 16, 1, 1, 0})->Args({8, 16, 8, 1, 0})->Args({32, 16, 32, 1, 0})->Args({32, 16, 32, 2, 0})
    ->Args({32, 64, 32, 2, 0})->Args({32, 0, 32, 1, 0})->Args({32, 0, 32, 1, 1})->Args({32, 0, 32, 2, 0})
    ->Args({32, 0, 32, 2, 1});
BENCHMARK(BM_Lora)->Name("identical")->ArgNames({"rows", "rank", "adapters", "threads", "bf16"})
    ->Args({32, 16, 1, 2, 0})->Args({512, 16, 1, 2, 0})->Args({512, 64, 1, 2, 0});
BENCHMARK(BM_Lora)->Name("mixed")->ArgNames({"rows", "rank", "adapters", "threads", "bf16"})
    ->Args({32, 0, 8, 2, 0})->Args({512, 0, 8, 2, 0});
BENCHMARK(BM_BaseMatMul)->Name("base_bf16")->ArgNames({"rows", "threads"})
    ->Args({1, 1})->Args({8, 1})->Args({32, 1})->Args({32, 2})->Args({512, 2});

}  // namespace
}  // namespace chorus::kernels

BENCHMARK_MAIN();
