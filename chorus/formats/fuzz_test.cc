// test-labels: unit
// A short run of each format fuzzer's entry point over mutated seed files (the long run is
// formats_fuzz_slow_test; real libFuzzer runs are in docs/fuzzing.md).
#include <gtest/gtest.h>

#include "chorus/formats/fuzz_entry.h"

namespace chorus::formats {
namespace {

constexpr int64_t kIterations = 1500;

TEST(FuzzTest, SeedsAreValid) {
  for (const auto& s : GgufFuzzSeeds()) {
    EXPECT_TRUE(FuzzGgufInput(reinterpret_cast<const uint8_t*>(s.data()), s.size()));
  }
  for (const auto& s : SafetensorsFuzzSeeds()) {
    EXPECT_TRUE(FuzzSafetensorsInput(reinterpret_cast<const uint8_t*>(s.data()), s.size()));
  }
  for (const auto& s : Llama2cFuzzSeeds()) {
    EXPECT_TRUE(FuzzLlama2cInput(reinterpret_cast<const uint8_t*>(s.data()), s.size()));
  }
}

TEST(FuzzTest, EmptyAndTinyInputs) {
  const uint8_t zeros[64] = {};
  for (size_t n = 0; n <= sizeof(zeros); ++n) {
    EXPECT_FALSE(FuzzGgufInput(zeros, n));
    EXPECT_FALSE(FuzzLlama2cInput(zeros, n));
    EXPECT_FALSE(FuzzSafetensorsInput(zeros, n));
  }
}

TEST(FuzzTest, MutatorIsDeterministicAndChangesInput) {
  const auto seeds = GgufFuzzSeeds();
  std::mt19937_64 a(5), b(5);
  int changed = 0;
  for (int i = 0; i < 100; ++i) {
    const std::string x = MutateForFuzz(seeds[0], seeds, a);
    EXPECT_EQ(x, MutateForFuzz(seeds[0], seeds, b));
    changed += x != seeds[0];
  }
  EXPECT_GT(changed, 90);
}

TEST(FuzzTest, ShortMutationRuns) {
  struct Target {
    const char* name;
    FuzzTarget fn;
    std::vector<std::string> seeds;
  };
  const Target targets[] = {{"gguf", FuzzGgufInput, GgufFuzzSeeds()},
                            {"safetensors", FuzzSafetensorsInput, SafetensorsFuzzSeeds()},
                            {"llama2c", FuzzLlama2cInput, Llama2cFuzzSeeds()}};
  for (const Target& t : targets) {
    SCOPED_TRACE(t.name);
    FuzzRunStats st = RunMutationFuzz(t.fn, t.seeds, kIterations, /*rng_seed=*/1);
    EXPECT_EQ(st.seeds_parsed, static_cast<int64_t>(t.seeds.size()));
    EXPECT_EQ(st.runs, kIterations + static_cast<int64_t>(t.seeds.size()));
    // Some mutants must get through validation, or the deep paths are never exercised.
    EXPECT_GT(st.parsed, st.seeds_parsed) << t.name;
  }
}

}  // namespace
}  // namespace chorus::formats
