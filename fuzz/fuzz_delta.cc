// libFuzzer target for the delta-file decoder: the body lives in
// chorus/adapters/delta/delta_fuzz.cc so that delta_delta_fuzz_test runs it too. See
// docs/fuzzing.md.
#include <cstddef>
#include <cstdint>

#include "chorus/adapters/delta/delta_fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  chorus::delta::FuzzDeltaInput(data, size);
  return 0;
}
