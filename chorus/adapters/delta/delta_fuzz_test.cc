// test-labels: unit
// A short mutation-fuzz run of the delta decoder (the libFuzzer target is fuzz/fuzz_delta.cc,
// docs/fuzzing.md): every seed parses, and no mutant crashes it or breaks the round trip.
#include "chorus/adapters/delta/delta_fuzz.h"

#include <gtest/gtest.h>

#include "chorus/formats/fuzz_entry.h"

namespace chorus::delta {
namespace {

TEST(DeltaFuzzTest, SeedsParseAndOneLargeSeedUsesZstd) {
  const auto seeds = DeltaFuzzSeeds();
  for (const auto& s : seeds)
    EXPECT_TRUE(FuzzDeltaInput(reinterpret_cast<const uint8_t*>(s.data()), s.size()));
  EXPECT_NE(seeds.back().find(".codes.zst"), std::string::npos);
}

TEST(DeltaFuzzTest, MutantsNeverCrash) {
  const auto seeds = DeltaFuzzSeeds();
  auto stats = formats::RunMutationFuzz(&FuzzDeltaInput, seeds, 10000, 17);
  EXPECT_EQ(stats.seeds_parsed, static_cast<int64_t>(seeds.size()));
  EXPECT_GT(stats.parsed, static_cast<int64_t>(seeds.size()));  // some mutants are still valid
}

}  // namespace
}  // namespace chorus::delta
