// Entry point of the cost-model file fuzzer (fuzz/fuzz_cost_model.cc; docs/fuzzing.md), callable
// from ordinary tests too (engine_fuzz_entry_test).
//
// FuzzCostModelInput: `data` is the file `chorus profile` writes and `chorus serve --cost-model`
// reads (CostModelFile::Parse). Checks: an error is kInvalidArgument; an accepted file has a
// valid `use` index and finite coefficients of the right count, predicts a finite time ≥ 0 for
// a few steps, and survives ToJson → Parse unchanged.
//
// Returns normally on any input (true when accepted); aborts only when Chorus contradicts
// itself. Thread-safety: reentrant.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace chorus::engine {

bool FuzzCostModelInput(const uint8_t* data, size_t size);

// Seed corpus: files with every model kind, and broken ones.
std::vector<std::string> CostModelFuzzSeeds();

}  // namespace chorus::engine
