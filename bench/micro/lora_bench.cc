// LoRA segment kernels (shrink + expand of one linear) at a TinyLlama projection (2048 × 2048),
// against the base MatMul of the same rows in the same binary (BM_BaseMatMul, bf16 weights) so
// the adapter overhead can be quoted as a ratio. Workloads (Punica §6 names):
//   distinct  — every row its own adapter (decode, segments of 1 row)
//   identical — all rows one adapter
//   mixed     — ranks 8/16/32/64 round robin over 8 adapters, rows grouped by adapter
// Arguments: rows, rank (0 = mixed), distinct adapters, threads, bf16 weights (0/1), cold (0/1:
// weights read from DRAM each iteration, as in a real step; see BM_Lora).
// Counter: adapter weight bytes/s.
//
//   ./lora_bench --benchmark_filter='distinct' --benchmark_min_time=0.2
//
// The machine is shared: quote medians and ratios to the base run in the same invocation.
// Environment: LORA_PHASE=1|2 times the shrink or the expand alone; LORA_OUT=N sets the
// projection's output width (default 2048); LORA_ISA=avx2|scalar caps
// the kernels' ISA level.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "chorus/base/large_alloc.h"
#include "chorus/kernels/dispatch.h"
#include "chorus/kernels/lora.h"
#include "chorus/kernels/matmul.h"
#include "chorus/tensor/dtype.h"

namespace chorus::kernels {
namespace {

constexpr int64_t kIn = 2048;
// LORA_OUT=256 gives the k/v projections' shape (TinyLlama: 4 KV heads × 64); default q/o.
const int64_t kOut = [] {
  const char* e = std::getenv("LORA_OUT");
  return e != nullptr && std::atoll(e) > 0 ? static_cast<int64_t>(std::atoll(e)) : int64_t{2048};
}();

std::vector<float> Random(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 0.02f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// The weights of one benchmark case: every adapter's A and Bᵀ, in f32 and bf16, with row tables.
struct AdapterSet {
  std::vector<std::vector<float>> a, bt;
  // bf16: every adapter's A then Bᵀ, back to back in one buffer from AllocateLarge, as a host
  // copy in the engine is (huge pages where the kernel allows).
  std::unique_ptr<uint16_t, void (*)(void*)> buf16{nullptr, std::free};
  std::vector<std::vector<const float*>> a_rows, bt_rows;
  std::vector<std::vector<const uint16_t*>> a16_rows, bt16_rows;
  std::vector<LoraShrinkWeight> sw;
  std::vector<LoraExpandWeight> ew;
};

// Rank of adapter i: rank_arg, or 8/16/32/64 round robin when rank_arg is 0 ("mixed").
int64_t RankOf(int64_t i, int64_t rank_arg) {
  constexpr int64_t kMixed[4] = {8, 16, 32, 64};
  return rank_arg > 0 ? rank_arg : kMixed[i % 4];
}

// Copies are built in place (the row tables point into the set's own vectors).
void BuildSet(int64_t n_adapters, int64_t rank_arg, bool bf16, AdapterSet* s) {
  const size_t na = static_cast<size_t>(n_adapters);
  s->a.resize(na), s->bt.resize(na);
  s->a_rows.resize(na), s->bt_rows.resize(na), s->a16_rows.resize(na), s->bt16_rows.resize(na);
  size_t elems16 = 0;
  for (size_t u = 0; u < na; ++u) {
    elems16 += static_cast<size_t>(RankOf(static_cast<int64_t>(u), rank_arg) * (kIn + kOut));
  }
  if (bf16) {
    s->buf16.reset(static_cast<uint16_t*>(AllocateLarge(elems16 * 2, "lora_bench adapters")));
  }
  uint16_t* next16 = s->buf16.get();
  for (size_t u = 0; u < na; ++u) {
    const int64_t r = RankOf(static_cast<int64_t>(u), rank_arg);
    s->a[u] = Random(static_cast<size_t>(r * kIn), static_cast<uint32_t>(u));
    s->bt[u] = Random(static_cast<size_t>(r * kOut), static_cast<uint32_t>(u + 99));
    uint16_t* a16 = next16;
    uint16_t* bt16 = a16 + r * kIn;
    if (bf16) {
      for (size_t k = 0; k < s->a[u].size(); ++k) a16[k] = F32ToBF16(s->a[u][k]);
      for (size_t k = 0; k < s->bt[u].size(); ++k) bt16[k] = F32ToBF16(s->bt[u][k]);
      next16 = bt16 + r * kOut;
      s->a[u].clear(), s->bt[u].clear();
    }
    for (int64_t j = 0; j < r; ++j) {
      if (bf16) {
        s->a16_rows[u].push_back(a16 + j * kIn);
        s->bt16_rows[u].push_back(bt16 + j * kOut);
      } else {
        s->a_rows[u].push_back(s->a[u].data() + j * kIn);
        s->bt_rows[u].push_back(s->bt[u].data() + j * kOut);
      }
    }
    if (bf16) {
      s->sw.push_back({nullptr, r, s->a16_rows[u].data()});
      s->ew.push_back({nullptr, r, 0, 2.0f, s->bt16_rows[u].data()});
    } else {
      s->sw.push_back({s->a_rows[u].data(), r});
      s->ew.push_back({s->bt_rows[u].data(), r, 0, 2.0f});
    }
  }
}

// Arguments: rows, rank (0 = mixed), adapters, threads, bf16, cold. cold = 1 cycles through
// enough copies of the adapter set (≥ 256 MiB in all) that every iteration reads its weights from
// DRAM, as a decode step does (a step's adapters are far larger than the 32 MiB L3); cold = 0
// re-reads one set, which stays in cache when it is small.
void BM_Lora(benchmark::State& state) {
  const int64_t rows = state.range(0), rank_arg = state.range(1), n_adapters = state.range(2);
  ThreadPool pool(static_cast<int>(state.range(3)));
  const bool bf16 = state.range(4) != 0, cold = state.range(5) != 0;
  int64_t bytes = 0, max_rank = 0;
  for (int64_t i = 0; i < n_adapters; ++i) {
    const int64_t r = RankOf(i, rank_arg);
    bytes += r * (kIn + kOut) * (bf16 ? 2 : 4);
    max_rank = std::max(max_rank, r);
  }
  const int64_t n_sets = cold ? std::max<int64_t>(2, (int64_t{256} << 20) / bytes + 1) : 1;
  std::vector<AdapterSet> sets(static_cast<size_t>(n_sets));
  for (auto& s : sets) BuildSet(n_adapters, rank_arg, bf16, &s);
  // Rows grouped by adapter: contiguous equal shares.
  std::vector<LoraSegment> segs;
  for (int64_t i = 0; i < n_adapters; ++i) {
    segs.push_back({rows * i / n_adapters, rows * (i + 1) / n_adapters, static_cast<int32_t>(i)});
  }
  auto x = Random(static_cast<size_t>(rows * kIn), 7);
  std::vector<float> v(static_cast<size_t>(rows * max_rank)), y(static_cast<size_t>(rows * kOut));
  size_t next = 0;
  // LORA_PHASE=1: shrink only, 2: expand only (which half costs what).
  const char* phase_env = std::getenv("LORA_PHASE");
  const int phase = phase_env ? std::atoi(phase_env) : 0;
  for (auto _ : state) {
    const AdapterSet& s = sets[next];
    next = (next + 1) % sets.size();
    if (phase != 2) LoraShrink(segs, s.sw, x.data(), kIn, kIn, v.data(), max_rank, &pool);
    if (phase != 1) LoraExpand(segs, s.ew, v.data(), max_rank, kOut, y.data(), kOut, &pool);
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["adapter_bytes/s"] =
      benchmark::Counter(static_cast<double>(bytes), benchmark::Counter::kIsIterationInvariantRate);
}

void BM_BaseMatMul(benchmark::State& state) {
  const int64_t rows = state.range(0);
  ThreadPool pool(static_cast<int>(state.range(1)));
  auto w = PackedWeight::Pack(
      Tensor::FromF32(Random(static_cast<size_t>(kIn * kOut), 1), DType::kBF16, {kOut, kIn}));
  auto x = Random(static_cast<size_t>(rows * kIn), 7);
  std::vector<float> y(static_cast<size_t>(rows * kOut));
  for (auto _ : state) {
    MatMul(*w, x.data(), kIn, rows, y.data(), kOut, false, &pool);
    benchmark::DoNotOptimize(y.data());
  }
}

// {rows, rank (0 = mixed), adapters, threads}
BENCHMARK(BM_Lora)
    ->Name("distinct")
    ->ArgNames({"rows", "rank", "adapters", "threads", "bf16", "cold"})
    ->Args({1, 16, 1, 1, 0, 0})
    ->Args({8, 16, 8, 1, 0, 0})
    ->Args({32, 16, 32, 1, 0, 0})
    ->Args({32, 16, 32, 2, 0, 0})
    ->Args({32, 64, 32, 2, 0, 0})
    ->Args({32, 0, 32, 1, 0, 0})
    ->Args({32, 0, 32, 1, 1, 0})
    ->Args({32, 0, 32, 2, 0, 0})
    ->Args({32, 0, 32, 2, 1, 0})
    // DRAM-bound, as in a decode step: compare adapter_bytes/s with the machine's read bandwidth.
    ->Args({8, 0, 8, 2, 1, 1})
    ->Args({32, 0, 32, 2, 1, 1})
    ->Args({8, 64, 8, 2, 1, 1})
    ->Args({8, 0, 8, 1, 1, 1});
BENCHMARK(BM_Lora)
    ->Name("identical")
    ->ArgNames({"rows", "rank", "adapters", "threads", "bf16", "cold"})
    ->Args({32, 16, 1, 2, 0, 0})
    ->Args({512, 16, 1, 2, 0, 0})
    ->Args({512, 64, 1, 2, 0, 0})
    ->Args({32, 64, 1, 2, 1, 1})
    ->Args({512, 16, 1, 1, 1, 0})
    ->Args({32, 64, 1, 1, 1, 1});
BENCHMARK(BM_Lora)
    ->Name("mixed")
    ->ArgNames({"rows", "rank", "adapters", "threads", "bf16", "cold"})
    ->Args({32, 0, 8, 2, 0, 0})
    ->Args({512, 0, 8, 2, 0, 0})
    ->Args({32, 0, 8, 2, 1, 1})
    ->Args({32, 0, 8, 1, 1, 1});
BENCHMARK(BM_BaseMatMul)
    ->Name("base_bf16")
    ->ArgNames({"rows", "threads"})
    ->Args({1, 1})
    ->Args({8, 1})
    ->Args({32, 1})
    ->Args({32, 2})
    ->Args({512, 2});

}  // namespace
}  // namespace chorus::kernels

int main(int argc, char** argv) {
  // LORA_ISA=avx2 (or scalar) caps the dispatch level, to measure the AVX2 tiles on an AVX-512
  // machine.
  if (const char* isa = std::getenv("LORA_ISA")) {
    if (const auto level = chorus::kernels::ParseIsaLevel(isa)) chorus::kernels::SetMaxIsa(*level);
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
