// Entry points of the format fuzzers, callable from libFuzzer targets (fuzz/fuzz_*.cc, clang
// `fuzz` preset) and from ordinary tests (formats_fuzz_test, any compiler), so the robustness
// checks run in every build.
//
// Each entry parses `data` as its format and, when that succeeds, exercises every accessor and
// re-serializes the result with the matching writer and parses it back. It returns normally on
// any input; it aborts (CHORUS_CHECK) only on an internal inconsistency — an accessor failing
// on a file that validated, or a write/read round trip that changes the content — which is a
// Chorus bug for the fuzzer to report.
//
// Thread-safety: the functions are reentrant.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace chorus::formats {

// Return true when `data` parsed as the format (for statistics in tests).
bool FuzzGgufInput(const uint8_t* data, size_t size);
bool FuzzSafetensorsInput(const uint8_t* data, size_t size);
bool FuzzLlama2cInput(const uint8_t* data, size_t size);

// Small valid files covering every metadata type, tensor type and layout variant of each
// format: the seed corpus of the fuzzers (see docs/fuzzing.md) and of formats_fuzz_test.
std::vector<std::string> GgufFuzzSeeds();
std::vector<std::string> SafetensorsFuzzSeeds();
std::vector<std::string> Llama2cFuzzSeeds();

// A structure-agnostic mutation of `input` for fuzzing without libFuzzer (tests): 1–4 stacked
// edits among bit flips, interesting byte / u32 / u64 values (0, ±1, powers of two, the sizes
// of the input), truncation, insertion, deletion, duplication of a range, splicing with one of
// `seeds`, and digit / JSON-punctuation edits. Deterministic for a given `rng` state.
std::string MutateForFuzz(const std::string& input, const std::vector<std::string>& seeds,
                          std::mt19937_64& rng);

using FuzzTarget = bool (*)(const uint8_t* data, size_t size);
struct FuzzRunStats {
  int64_t runs = 0;          // inputs tried (seeds included)
  int64_t parsed = 0;        // inputs the target accepted
  int64_t seeds_parsed = 0;  // unmutated seeds accepted (should be all of them)
};
// Runs `target` on every seed, then on `iterations` mutants of the seeds and of earlier accepted
// mutants (a pool of up to 64, so edits stack up past the first validation layers).
FuzzRunStats RunMutationFuzz(FuzzTarget target, const std::vector<std::string>& seeds,
                             int64_t iterations, uint64_t rng_seed);

}  // namespace chorus::formats
