// libFuzzer target for the safetensors reader: the body lives in chorus/formats/fuzz_entry.cc so
// that ordinary tests (formats_fuzz_test, formats_fuzz_slow_test) run it too. See docs/fuzzing.md.
#include <cstddef>
#include <cstdint>

#include "chorus/formats/fuzz_entry.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  chorus::formats::FuzzSafetensorsInput(data, size);
  return 0;
}
