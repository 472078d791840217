// Entry point of the delta-file fuzzer (fuzz/fuzz_delta.cc, clang `fuzz` preset) and of
// delta_fuzz_test (any compiler): see docs/fuzzing.md.
//
// FuzzDeltaInput parses `data` as a delta file; when that succeeds it decodes every matrix and
// extra, re-serializes the delta and parses it back, and checks the content is unchanged. It
// returns normally on any input and aborts (CHORUS_CHECK) only on an internal inconsistency.
//
// Thread-safety: reentrant.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace chorus::delta {

bool FuzzDeltaInput(const uint8_t* data, size_t size);
// Small valid delta files: 2:4 and dense, 1/2/3/4/8 bits, grouped and per-matrix scales, zstd
// and raw codes, exact and int8 extras.
std::vector<std::string> DeltaFuzzSeeds();

}  // namespace chorus::delta
