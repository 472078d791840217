// libFuzzer target for the --cost-model file: the body lives in chorus/engine/fuzz_entry.cc so that
// the ordinary test suite runs it too. See docs/fuzzing.md.
#include <cstddef>
#include <cstdint>

#include "chorus/engine/fuzz_entry.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  chorus::engine::FuzzCostModelInput(data, size);
  return 0;
}
