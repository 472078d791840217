// The punica workload's row → adapter assignment (docs/benchmarks.md): group counts and sizes.
#include "chorus/engine/bench.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

namespace chorus::engine {
namespace {

std::vector<int64_t> GroupSizes(const std::vector<int>& rows) {
  std::map<int, int64_t> n;
  for (size_t i = 0; i < rows.size(); ++i) {
    ++n[rows[i]];
    if (i > 0) {
      EXPECT_GE(rows[i], rows[i - 1]) << "groups must be contiguous";
    }
  }
  std::vector<int64_t> out;
  int expect = 0;
  for (const auto& [g, c] : n) {
    EXPECT_EQ(g, expect++) << "adapter indices are 0..groups-1";
    out.push_back(c);
  }
  return out;
}

TEST(PunicaAssignmentTest, Batch32) {
  EXPECT_EQ(GroupSizes(PunicaAssignment("identical", 32)), (std::vector<int64_t>{32}));
  EXPECT_EQ(GroupSizes(PunicaAssignment("distinct", 32)), std::vector<int64_t>(32, 1));
  // ⌈√32⌉ = 6 groups of 5 or 6 rows.
  const auto u = GroupSizes(PunicaAssignment("uniform", 32));
  ASSERT_EQ(u.size(), 6u);
  for (int64_t s : u) EXPECT_TRUE(s == 5 || s == 6) << s;
  // Sizes ×1.5: 1, 1.5, 2.25, 3.4, 5.1, 7.6 → 1, 2, 2, 3, 5, 8, then the remaining 11.
  EXPECT_EQ(GroupSizes(PunicaAssignment("skewed", 32)),
            (std::vector<int64_t>{1, 2, 2, 3, 5, 8, 11}));
}

TEST(PunicaAssignmentTest, SmallBatches) {
  EXPECT_EQ(GroupSizes(PunicaAssignment("skewed", 8)), (std::vector<int64_t>{1, 2, 2, 3}));
  EXPECT_EQ(GroupSizes(PunicaAssignment("uniform", 8)).size(), 3u);
  EXPECT_EQ(GroupSizes(PunicaAssignment("skewed", 1)), (std::vector<int64_t>{1}));
  EXPECT_EQ(GroupSizes(PunicaAssignment("uniform", 1)), (std::vector<int64_t>{1}));
}

// The default workload on the tiny shape: every figure is reported, and decode at batch 1
// carries one roofline bandwidth per run (probes around that run) and a fraction equal to the
// median of the runs' own fractions.
TEST(EngineBenchTest, TinyShapeBatchOneRooflinePerRun) {
  EngineBenchOptions o;
  o.shape = "tiny";
  o.dtypes = {DType::kQ8_0};
  o.prefill_lengths = {16, 24};
  o.batches = {1, 2};
  o.decode_steps = 4;
  o.depths = {8, 12};
  o.repeats = 3;
  o.bandwidth_bytes = 8 << 20;
  auto rep = RunEngineBench(o, [](const std::string&) {});
  ASSERT_TRUE(rep.ok()) << rep.status().ToString();
  ASSERT_EQ(rep->rows.size(), 5u);  // prefill 16 and 24, decode b=1, b=2, b=1 at depth 12
  EXPECT_EQ(rep->rows[1].metric, "prefill");
  EXPECT_EQ(rep->rows[1].batch, 24);
  const EngineBenchRow& d1 = rep->rows[2];
  EXPECT_EQ(d1.metric, "decode");
  EXPECT_EQ(d1.batch, 1);
  ASSERT_EQ(d1.runs.size(), 3u);
  ASSERT_EQ(d1.roofline_bandwidth_runs.size(), 3u);
  std::vector<double> fractions;
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_GT(d1.roofline_bandwidth_runs[i], 0.0);
    fractions.push_back(d1.runs[i] * (d1.weight_bytes_per_token + d1.kv_bytes_per_token) /
                        (d1.roofline_bandwidth_runs[i] * 1e9));
  }
  std::sort(fractions.begin(), fractions.end());
  EXPECT_DOUBLE_EQ(d1.roofline_fraction, fractions[1]);
  EXPECT_EQ(rep->rows[3].roofline_bandwidth_runs.size(), 0u);  // batch > 1 has no roofline
  EXPECT_GT(rep->rows[3].tokens_per_s, 0.0);
  // The deeper decode: batch 1, its own roofline, more KV bytes per token (tiny: 4 layers × K and
  // V × 2 KV heads × 32 floats at a mean context of 12 + 2.5).
  const EngineBenchRow& deep = rep->rows[4];
  EXPECT_EQ(deep.metric, "decode");
  EXPECT_EQ(deep.batch, 1);
  EXPECT_EQ(deep.depth, 12);
  EXPECT_EQ(deep.roofline_bandwidth_runs.size(), 3u);
  EXPECT_DOUBLE_EQ(d1.kv_bytes_per_token, 4 * 2 * 64 * 4 * (8 + 2.5));
  EXPECT_DOUBLE_EQ(deep.kv_bytes_per_token, 4 * 2 * 64 * 4 * (12 + 2.5));
  // The JSON carries each run's roofline bandwidth next to its tokens/s.
  const std::string json = rep->ToJson();
  const size_t row = json.find("\"metric\":\"decode\",\"batch\":1,");
  ASSERT_NE(row, std::string::npos);
  const size_t at = json.find("\"roofline_bandwidth_runs\":[", row);
  ASSERT_NE(at, std::string::npos);
  const size_t close = json.find(']', at);
  EXPECT_EQ(std::count(json.begin() + static_cast<std::ptrdiff_t>(at),
                       json.begin() + static_cast<std::ptrdiff_t>(close), ','),
            2);  // three values
}

// --kv-dtype bf16: the figures run over a bf16 cache and the roofline counts 2-byte K and V.
TEST(EngineBenchTest, Bf16KvCountsHalfTheKvBytes) {
  EngineBenchOptions o;
  o.shape = "tiny";
  o.dtypes = {DType::kQ8_0};
  o.prefill_lengths = {16};
  o.batches = {1};
  o.decode_steps = 4;
  o.depths = {8};
  o.repeats = 1;
  o.bandwidth_bytes = 8 << 20;
  o.kv_dtype = kernels::KvDtype::kBf16;
  auto rep = RunEngineBench(o, [](const std::string&) {});
  ASSERT_TRUE(rep.ok()) << rep.status().ToString();
  EXPECT_EQ(rep->kv_dtype, "bf16");
  ASSERT_EQ(rep->rows.size(), 2u);
  EXPECT_DOUBLE_EQ(rep->rows[1].kv_bytes_per_token, 4 * 2 * 64 * 2 * (8 + 2.5));
  EXPECT_GT(rep->rows[1].tokens_per_s, 0.0);
  const std::string csv = rep->ToCsv();
  EXPECT_NE(csv.find(",kv_dtype,prefill_chunk\n"), std::string::npos);
  EXPECT_NE(csv.find(",bf16,512\n"), std::string::npos);
  EXPECT_NE(rep->ToJson().find("\"kv_dtype\":\"bf16\""), std::string::npos);
  EXPECT_NE(rep->ToTable().find("KV cache bf16"), std::string::npos);
}

// A sliding-window layer's decode token reads only its window's K and V, so the roofline counts
// those: gemma3-tiny has 6 layers with a window of 8 and 1 global layer; at depth 20 the 4 timed
// tokens sit at positions 20–23 (21–24 keys on the global layer, mean 22.5), each bf16 K + V row
// of a layer 2 · 64 · 2 bytes.
TEST(EngineBenchTest, WindowedLayersCountOnlyTheirWindowsKvBytes) {
  EngineBenchOptions o;
  o.shape = "gemma3-tiny";
  o.dtypes = {DType::kQ8_0};
  o.prefill_lengths = {16};
  o.batches = {1};
  o.decode_steps = 4;
  o.depths = {20};
  o.repeats = 1;
  o.bandwidth_bytes = 8 << 20;
  o.kv_dtype = kernels::KvDtype::kBf16;
  auto rep = RunEngineBench(o, [](const std::string&) {});
  ASSERT_TRUE(rep.ok()) << rep.status().ToString();
  ASSERT_EQ(rep->rows.size(), 2u);
  EXPECT_DOUBLE_EQ(rep->rows[1].kv_bytes_per_token, (22.5 + 6 * 8) * 2 * 64 * 2);
  EXPECT_GT(rep->rows[1].tokens_per_s, 0.0);
}

// --prefill-chunk: a prompt longer than the chunk runs in steps of that many rows (as `chorus
// serve` prefills it), and every output names the chunk; 0 runs each prompt in one step.
TEST(EngineBenchTest, PrefillChunkIsReported) {
  for (int64_t chunk : {int64_t{10}, int64_t{0}}) {
    EngineBenchOptions o;
    o.shape = "tiny";
    o.dtypes = {DType::kQ8_0};
    o.prefill_lengths = {8, 24};
    o.prefill_chunk = chunk;
    o.batches = {1};
    o.decode_steps = 2;
    o.depths = {8};
    o.repeats = 1;
    o.bandwidth_bytes = 8 << 20;
    auto rep = RunEngineBench(o, [](const std::string&) {});
    ASSERT_TRUE(rep.ok()) << rep.status().ToString();
    ASSERT_EQ(rep->rows.size(), 3u);
    EXPECT_EQ(rep->rows[1].metric, "prefill");
    EXPECT_EQ(rep->rows[1].batch, 24);
    EXPECT_GT(rep->rows[1].tokens_per_s, 0.0);
    EXPECT_EQ(rep->prefill_chunk, chunk);
    const std::string n = std::to_string(chunk);
    EXPECT_NE(rep->ToCsv().find(",f32," + n + "\n"), std::string::npos);
    EXPECT_NE(rep->ToJson().find("\"prefill_chunk\":" + n + ","), std::string::npos);
    EXPECT_NE(rep->ToTable().find(chunk > 0 ? "prefill in steps of 10 rows"
                                            : "prefill in one step per prompt"),
              std::string::npos);
  }
}

}  // namespace
}  // namespace chorus::engine
