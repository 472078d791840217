// The delta term of a decode step at TinyLlama-1.1B shape (kernels/delta.h): 4 fine-tunes, each
// with a delta on all 7 linears of all 22 layers, one row each (a step of 4 requests on 4
// different fine-tunes), 2 threads. The packed deltas (1.6 GB at 4-bit 2:4) are larger than this
// host's last-level cache, so each step streams them from memory, as serving does.
//
// The fourth argument picks the activations (kernels/delta.h): 0 = f32 (the kernel reads codes,
// 2:4 pattern bytes and scales), 1 = int16 (codes, the 2:4 kept positions built at load,
// scales). The fifth, 1: the matrices are read as banded views (kernels::DeltaBand), cut where
// a pool copy cuts them (adapters/delta/paged_delta.h) for TinyLlama's 360 KB KV pages — the
// kernel's cost of reading a delta's pool copy rather than its host copy (the bands here stay
// in one buffer; in a pool copy each is in a page of its own).
//
// Counters: packed_GBps = bytes the kernel reads per step (codes, 2:4 patterns or kept positions,
// f32 scales as they sit in host memory) ÷ step time; of_bandwidth = that ÷ the read bandwidth
// measured by the same probe `chorus bench` uses (engine/bench.h, 1 GiB, 2 threads), measured at
// start. Layouts: chorus compress's defaults — 4-bit 2:4 and 2-bit 2:4 in groups of 64 (deltazip,
// rtn) and bitdelta's 1-bit signs with one scale per matrix; levels avx512 / avx2 / scalar.
//   ./build/release/bench/delta_bench --benchmark_repetitions=3
//   --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "chorus/base/large_alloc.h"
#include "chorus/engine/bench.h"
#include "chorus/kernels/delta.h"
#include "chorus/kernels/dispatch.h"
#include "chorus/kernels/ops.h"

namespace {

using chorus::kernels::DeltaMatrixView;
using chorus::kernels::IsaLevel;
using chorus::kernels::LoraSegment;

constexpr int kLayers = 22, kDeltas = 4;
// TinyLlama-1.1B's linears, [out, in]: q, k, v, o, gate, up, down.
constexpr int64_t kShapes[7][2] = {{2048, 2048}, {256, 2048},  {256, 2048}, {2048, 2048},
                                   {5632, 2048}, {5632, 2048}, {2048, 5632}};

struct Layout {
  const char* name;
  int bits;
  bool sparse24;
  int64_t group_size;
};
constexpr Layout kLayouts[] = {
    {"4bit_2:4_g64", 4, true, 64}, {"2bit_2:4_g64", 2, true, 64}, {"1bit_bitdelta", 1, false, 0}};

// Deterministic bytes, fast enough to fill gigabytes.
void Fill(uint8_t* p, size_t n, uint64_t seed, int mod) {
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < n; ++i) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    p[i] = static_cast<uint8_t>(mod == 256 ? s : (s >> 8) % static_cast<uint64_t>(mod));
  }
}

// Every delta matrix of one layout, in one arena.
struct Model {
  // Huge pages where the kernel allows them, as serving holds deltas (DeltaWeights::Build).
  std::unique_ptr<uint8_t, decltype(&std::free)> arena{nullptr, &std::free};
  std::vector<DeltaMatrixView> views;            // [delta][layer][linear]
  std::vector<std::vector<uint64_t>> positions;  // 2:4: each view's kept positions
  int64_t bytes = 0;                             // what a step of the f32 path reads
  int64_t int16_bytes = 0;  // … of the int16 path (kept positions instead of patterns)
};

Model& ModelFor(int layout_index) {
  static std::unique_ptr<Model> cache[std::size(kLayouts)];
  std::unique_ptr<Model>& m = cache[layout_index];
  if (m != nullptr) return *m;
  m = std::make_unique<Model>();
  const Layout& l = kLayouts[layout_index];
  std::vector<DeltaMatrixView> shapes;
  for (int d = 0; d < kDeltas; ++d)
    for (int layer = 0; layer < kLayers; ++layer)
      for (const auto& s : kShapes) {
        DeltaMatrixView v;
        v.rows = s[0];
        v.cols = s[1];
        v.bits = l.bits;
        v.sparse24 = l.sparse24;
        v.group_size = l.group_size;
        shapes.push_back(v);
      }
  size_t total = 0;
  for (const DeltaMatrixView& v : shapes)
    total += static_cast<size_t>(v.rows * (v.code_row_bytes() + v.mask_row_bytes()) +
                                 v.n_scales() * 4 + 64);
  m->arena.reset(static_cast<uint8_t*>(chorus::AllocateLarge(total, "delta_bench arena")));
  size_t at = 0;
  uint64_t seed = 1;
  for (DeltaMatrixView v : shapes) {
    uint8_t* codes = m->arena.get() + at;
    const auto code_bytes = static_cast<size_t>(v.rows * v.code_row_bytes());
    const auto mask_bytes = static_cast<size_t>(v.rows * v.mask_row_bytes());
    Fill(codes, code_bytes, seed++, 256);
    Fill(codes + code_bytes, mask_bytes, seed++, 216);
    at += code_bytes + mask_bytes;
    at = (at + 3) / 4 * 4;
    auto* scales = reinterpret_cast<float*>(m->arena.get() + at);
    for (int64_t i = 0; i < v.n_scales(); ++i) scales[i] = 0.001f * static_cast<float>(1 + i % 7);
    at += static_cast<size_t>(v.n_scales()) * 4;
    v.codes = codes;
    v.mask = v.sparse24 ? codes + code_bytes : nullptr;
    v.scales = scales;
    int64_t positions_bytes = 0;
    if (v.sparse24) {
      m->positions.push_back(chorus::kernels::DeltaKeptPositions(v));
      v.positions = m->positions.back().data();
      positions_bytes = static_cast<int64_t>(m->positions.back().size() * sizeof(uint64_t));
    }
    m->views.push_back(v);
    m->bytes += static_cast<int64_t>(code_bytes + mask_bytes) + v.n_scales() * 4;
    m->int16_bytes += static_cast<int64_t>(code_bytes) + positions_bytes + v.n_scales() * 4;
  }
  return *m;
}

// The views of `m` as a pool copy bands them: bands of a multiple of 16 rows that fit a page of
// TinyLlama's bf16 KV block (16 tokens × 22 layers × K and V × 256 × 2 bytes), one array after
// another as PagedDelta lays them out. The bands point into m's buffer.
const std::vector<DeltaMatrixView>& BandedViews(int layout_index, Model& m) {
  static std::vector<DeltaMatrixView> cache[std::size(kLayouts)];
  static std::vector<std::vector<chorus::kernels::DeltaBand>> bands[std::size(kLayouts)];
  std::vector<DeltaMatrixView>& out = cache[layout_index];
  if (!out.empty()) return out;
  constexpr int64_t kPageBytes = 16 * 22 * 2 * 256 * 2;
  bands[layout_index].reserve(m.views.size());
  for (DeltaMatrixView v : m.views) {
    const int64_t per_row = v.code_row_bytes() + (v.positions ? v.position_row_words() * 8 : 0) +
                            (v.group_size == 0 ? 0 : v.groups() * 4);
    const int64_t rows = std::max<int64_t>(16, (kPageBytes - 256) / per_row / 16 * 16);
    std::vector<chorus::kernels::DeltaBand>& b = bands[layout_index].emplace_back();
    for (int64_t r0 = 0; r0 < v.rows; r0 += rows) {
      const int64_t r1 = std::min(v.rows, r0 + rows);
      b.push_back({.row_begin = r0,
                   .row_end = r1,
                   .codes = v.codes + r0 * v.code_row_bytes(),
                   .mask = v.mask ? v.mask + r0 * v.mask_row_bytes() : nullptr,
                   .scales = v.group_size == 0 ? nullptr : v.scales + r0 * v.groups(),
                   .positions = v.positions ? v.positions + r0 * v.position_row_words() : nullptr});
    }
    if (v.group_size != 0) v.scales = nullptr;
    v.codes = nullptr;
    v.mask = nullptr;
    v.positions = nullptr;
    v.bands = b;
    out.push_back(v);
  }
  return out;
}

double Bandwidth() {
  static const double gbs = [] {
    const double b = chorus::engine::MeasureReadBandwidth(2, int64_t{1} << 30, 5, nullptr);
    std::fprintf(stderr, "read bandwidth (1 GiB, 2 threads, median of 5): %.1f GB/s\n", b);
    return b;
  }();
  return gbs;
}

void BM_DeltaStep(benchmark::State& state) {
  const int layout = static_cast<int>(state.range(0));
  const auto level = static_cast<IsaLevel>(state.range(1));
  chorus::kernels::SetMaxIsa(level);
  if (chorus::kernels::ActiveIsa() != level) {
    state.SkipWithError("ISA level not available on this CPU");
    chorus::kernels::SetMaxIsa(chorus::kernels::kMaxIsaLevel);
    return;
  }
  const double bandwidth = Bandwidth();
  Model& model = ModelFor(layout);
  const int threads = static_cast<int>(state.range(2));
  const bool int16 = state.range(3) == 1;
  const auto activations =
      int16 ? chorus::kernels::DeltaActivations::kInt16 : chorus::kernels::DeltaActivations::kF32;
  if (int16 && !chorus::kernels::DeltaInt16Fast()) {
    state.SkipWithError("no int16 delta kernel at this level (AVX-512 VNNI/VBMI/VBMI2)");
    chorus::kernels::SetMaxIsa(chorus::kernels::kMaxIsaLevel);
    return;
  }
  const int64_t step_bytes = int16 ? model.int16_bytes : model.bytes;
  const bool banded = state.range(4) == 1;
  const std::vector<DeltaMatrixView>& views = banded ? BandedViews(layout, model) : model.views;
  // CHORUS_DELTA_BENCH_LAYERS=1: one layer's deltas (~70 MB at 4-bit 2:4), which stay in a large
  // last-level cache — the kernel's decode speed without the memory system.
  const char* env = std::getenv("CHORUS_DELTA_BENCH_LAYERS");
  const int layers = env != nullptr ? std::max(1, std::min(kLayers, std::atoi(env))) : kLayers;
  chorus::ThreadPool pool(threads);
  std::vector<float> x(kDeltas * 5632, 0.5f), y(kDeltas * 5632, 0.0f);
  const std::vector<LoraSegment> one_row_each = {{0, 1, 0}, {1, 2, 1}, {2, 3, 2}, {3, 4, 3}};
  std::vector<DeltaMatrixView> per_linear(kDeltas);
  for (auto _ : state) {
    for (int layer = 0; layer < layers; ++layer) {
      for (int lin = 0; lin < 7; ++lin) {
        for (int d = 0; d < kDeltas; ++d)
          per_linear[d] = views[static_cast<size_t>((d * kLayers + layer) * 7 + lin)];
        chorus::kernels::DeltaApply(one_row_each, per_linear, x.data(), 5632, y.data(), 5632, &pool,
                                    activations);
      }
    }
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["packed_GBps"] = benchmark::Counter(
      static_cast<double>(step_bytes) * layers / kLayers,
      benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
  state.counters["of_bandwidth"] =
      benchmark::Counter(static_cast<double>(step_bytes) * layers / kLayers / (bandwidth * 1e9),
                         benchmark::Counter::kIsIterationInvariantRate);
  state.counters["step_MB"] = static_cast<double>(step_bytes) * layers / kLayers / 1e6;
  state.SetLabel(std::string(kLayouts[layout].name) + " " + chorus::kernels::IsaName(level) + " " +
                 std::to_string(threads) + "t" + (int16 ? " int16" : " f32") +
                 (banded ? " banded" : ""));
  chorus::kernels::SetMaxIsa(chorus::kernels::kMaxIsaLevel);
}
BENCHMARK(BM_DeltaStep)
    ->ArgsProduct({{0, 1, 2},
                   {static_cast<int>(IsaLevel::kAvx512), static_cast<int>(IsaLevel::kAvx2),
                    static_cast<int>(IsaLevel::kScalar)},
                   {2, 1},
                   {0},
                   {0}})
    ->ArgsProduct({{0, 1, 2}, {static_cast<int>(IsaLevel::kAvx512)}, {2, 1}, {1}, {0, 1}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// The BitDelta term's compute speed without the memory system: one 2048 × 2048 matrix of signs
// (512 KB, in L2) applied to n input rows of one segment, one thread, int16 activations — what
// serving runs for that segment (the lookup kernel for any number of rows;
// docs/deltas.md "BitDelta by table lookup"). Counter per_block_row: CPU time per 64 columns of
// one output row and one input row.
void BM_SignTermInL2(benchmark::State& state) {
  if (!chorus::kernels::DeltaInt16Fast()) {
    state.SkipWithError("no int16 delta kernel at this level (AVX-512 VNNI/VBMI/VBMI2)");
    return;
  }
  const int64_t n = state.range(0);
  constexpr int64_t kRows = 2048, kCols = 2048;
  DeltaMatrixView v;
  v.rows = kRows;
  v.cols = kCols;
  v.bits = 1;
  v.sparse24 = false;
  v.group_size = 0;
  std::vector<uint8_t> codes(static_cast<size_t>(kRows * v.code_row_bytes()));
  Fill(codes.data(), codes.size(), 7, 256);
  const float scale = 1e-3f;
  v.codes = codes.data();
  v.scales = &scale;
  std::vector<float> x(static_cast<size_t>(n * kCols)), y(static_cast<size_t>(n * kRows), 0.0f);
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = static_cast<float>(static_cast<int>(i * 37 % 201) - 100);
  const std::vector<LoraSegment> segment = {{0, n, 0}};
  const std::vector<DeltaMatrixView> views = {v};
  for (auto _ : state) {
    chorus::kernels::DeltaApply(segment, views, x.data(), kCols, y.data(), kRows, nullptr,
                                chorus::kernels::DeltaActivations::kInt16);
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["per_block_row"] = benchmark::Counter(
      static_cast<double>(kRows * (kCols / 64) * n),
      benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
  state.SetLabel(std::to_string(n) + " input rows");
}
BENCHMARK(BM_SignTermInL2)->DenseRange(1, 4)->Unit(benchmark::kMicrosecond);

// The output-head delta of a full fine-tune (int8 rows with one scale per row, as `chorus
// compress` keeps lm_head; kernels/ops.h AddInt8RowDots) at TinyLlama's head, 32000 × 2048
// (65.5 MB): n logit rows of one delta, one thread, at each level. The scalar level is the
// reference, a sequential loop like the one the hook ran before the kernel existed.
void BM_OutputHeadDelta(benchmark::State& state) {
  const auto level = static_cast<IsaLevel>(state.range(0));
  const int64_t n = state.range(1);
  constexpr int64_t kVocab = 32000, kD = 2048;
  chorus::kernels::SetMaxIsa(level);
  if (chorus::kernels::ActiveIsa() != level) {
    state.SkipWithError("level not supported here");
    chorus::kernels::SetMaxIsa(chorus::kernels::kMaxIsaLevel);
    return;
  }
  std::vector<int8_t> q(static_cast<size_t>(kVocab * kD));
  for (size_t i = 0; i < q.size(); ++i)
    q[i] = static_cast<int8_t>(static_cast<int>(i * 31 % 255) - 127);
  std::vector<float> scales(kVocab, 1e-3f), x(static_cast<size_t>(n * kD), 0.25f),
      y(static_cast<size_t>(n * kVocab), 0.0f);
  for (auto _ : state) {
    chorus::kernels::AddInt8RowDots(q.data(), scales.data(), kVocab, kD, x.data(), kD, n, y.data(),
                                    kVocab);
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["GBps"] = benchmark::Counter(static_cast<double>(kVocab * kD),
                                              benchmark::Counter::kIsIterationInvariantRate,
                                              benchmark::Counter::kIs1000);
  state.SetLabel(std::string(chorus::kernels::IsaName(level)) + " " + std::to_string(n) + " rows");
  chorus::kernels::SetMaxIsa(chorus::kernels::kMaxIsaLevel);
}
BENCHMARK(BM_OutputHeadDelta)
    ->ArgsProduct({{static_cast<int>(IsaLevel::kAvx512), static_cast<int>(IsaLevel::kAvx2),
                    static_cast<int>(IsaLevel::kScalar)},
                   {1, 4}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
