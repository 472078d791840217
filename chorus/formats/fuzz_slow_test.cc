// test-labels: slow
// Long runs of each format fuzzer's entry point (the bodies of fuzz/fuzz_*.cc) over random
// mutations of valid seed files and of the real model files, with any compiler. Bounded by
// iteration count, not time. Under the asan/ubsan presets this doubles as a sanitizer run.
#include <gtest/gtest.h>

#include "chorus/base/mapped_file.h"
#include "chorus/formats/fuzz_entry.h"
#include "tests/testutil/testutil.h"

namespace chorus::formats {
namespace {

constexpr int64_t kIterations = 20000;

void RunTarget(const char* name, FuzzTarget fn, const std::vector<std::string>& seeds,
               int64_t iterations) {
  for (uint64_t rng_seed : {11u, 12u}) {
    FuzzRunStats st = RunMutationFuzz(fn, seeds, iterations / 2, rng_seed);
    EXPECT_EQ(st.seeds_parsed, static_cast<int64_t>(seeds.size())) << name;
    EXPECT_GT(st.parsed, st.seeds_parsed) << name;
    std::printf("%s (rng %llu): %lld runs, %lld accepted\n", name,
                static_cast<unsigned long long>(rng_seed), static_cast<long long>(st.runs),
                static_cast<long long>(st.parsed));
  }
}

TEST(FuzzSlowTest, Gguf) { RunTarget("gguf", FuzzGgufInput, GgufFuzzSeeds(), kIterations); }

TEST(FuzzSlowTest, Safetensors) {
  RunTarget("safetensors", FuzzSafetensorsInput, SafetensorsFuzzSeeds(), kIterations);
}

TEST(FuzzSlowTest, Llama2c) {
  RunTarget("llama2c", FuzzLlama2cInput, Llama2cFuzzSeeds(), kIterations);
}

// Real files are large, so fewer mutations; most edits land in the data and still parse, the
// rest probe the real headers.
void RunReal(const char* rel, FuzzTarget fn, int64_t iterations) {
  auto raw = ReadFileToString(testing::SharedModelsDir() + "/" + rel);
  ASSERT_TRUE(raw.ok()) << raw.status().ToString();
  RunTarget(rel, fn, {*raw}, iterations);
}

TEST(FuzzSlowTest, RealGgufVocab) {
  CHORUS_REQUIRE_SHARED_MODEL("ggml-vocab/ggml-vocab-llama-spm.gguf");
  RunReal("ggml-vocab/ggml-vocab-llama-spm.gguf", FuzzGgufInput, 600);
}

TEST(FuzzSlowTest, RealLoraSafetensors) {
  CHORUS_REQUIRE_SHARED_MODEL("stories260K-finetunes/things/lora/adapter_model.safetensors");
  RunReal("stories260K-finetunes/things/lora/adapter_model.safetensors", FuzzSafetensorsInput,
          1000);
}

TEST(FuzzSlowTest, RealStories260K) {
  CHORUS_REQUIRE_SHARED_MODEL("stories260K/stories260K.bin");
  RunReal("stories260K/stories260K.bin", FuzzLlama2cInput, 200);
}

}  // namespace
}  // namespace chorus::formats
