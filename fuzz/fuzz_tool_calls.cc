// libFuzzer target for the tool-call parser of model replies: the body lives in
// chorus/server/fuzz_entry.cc so that the ordinary test suite runs it too. See docs/fuzzing.md.
#include <cstddef>
#include <cstdint>

#include "chorus/server/fuzz_entry.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  chorus::server::FuzzToolCallsInput(data, size);
  return 0;
}
