// libFuzzer target for the adapter registry's state file: the body lives in
// chorus/adapters/registry_fuzz.cc so that the ordinary test suite runs it too. See
// docs/fuzzing.md.
#include <cstddef>
#include <cstdint>

#include "chorus/adapters/registry_fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  chorus::adapters::FuzzRegistryStateInput(data, size);
  return 0;
}
