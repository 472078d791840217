// The delta segment kernel (kernels/delta.h) at a real shape: one TinyLlama-1.1B MLP up_proj delta
// (5632 × 2048) in chorus compress's default packing (4-bit codes, 2:4, groups of 64), applied to
// 1, 8 and 32 rows of one delta, 2 threads. Reports the packed bytes streamed per second
// (counter `packed_GBps`): decode (1 row) is bound by decoding the codes, not by memory, which
// is what an ISA-specific decode would change.
//   ./build/release/bench/delta_bench --benchmark_repetitions=5
//   --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "chorus/kernels/delta.h"

namespace {

using chorus::kernels::DeltaMatrixView;

struct Fixture {
  std::vector<uint8_t> codes, mask;
  std::vector<float> scales, x, y;
  DeltaMatrixView view;
  int64_t packed_bytes = 0;
};

Fixture Make(int64_t rows, int64_t cols, int64_t n) {
  Fixture f;
  DeltaMatrixView& v = f.view;
  v.rows = rows;
  v.cols = cols;
  v.bits = 4;
  v.sparse24 = true;
  v.group_size = 64;
  std::mt19937 rng(1);
  f.codes.resize(static_cast<size_t>(rows * v.code_row_bytes()));
  f.mask.resize(static_cast<size_t>(rows * v.mask_row_bytes()));
  for (auto& b : f.codes) b = static_cast<uint8_t>(rng());
  for (auto& b : f.mask) b = static_cast<uint8_t>(rng() % 216);
  f.scales.assign(static_cast<size_t>(rows * v.groups()), 0.01f);
  f.x.assign(static_cast<size_t>(n * cols), 0.5f);
  f.y.assign(static_cast<size_t>(n * rows), 0.0f);
  v.codes = f.codes.data();
  v.mask = f.mask.data();
  v.scales = f.scales.data();
  f.packed_bytes = static_cast<int64_t>(f.codes.size() + f.mask.size() + f.scales.size() * 2);
  return f;
}

void BM_DeltaApply(benchmark::State& state) {
  const int64_t n = state.range(0);
  Fixture f = Make(5632, 2048, n);
  chorus::ThreadPool pool(2);
  const std::vector<DeltaMatrixView> views = {f.view};
  const std::vector<chorus::kernels::LoraSegment> seg = {{0, n, 0}};
  for (auto _ : state) {
    chorus::kernels::DeltaApply(seg, views, f.x.data(), 2048, f.y.data(), 5632, &pool);
    benchmark::DoNotOptimize(f.y.data());
  }
  state.counters["packed_GBps"] = benchmark::Counter(static_cast<double>(f.packed_bytes),
                                                     benchmark::Counter::kIsIterationInvariantRate,
                                                     benchmark::Counter::kIs1000);
  state.counters["rows"] = static_cast<double>(n);
}
BENCHMARK(BM_DeltaApply)->Arg(1)->Arg(8)->Arg(32)->UseRealTime()->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
