// libFuzzer target for tokenizer.json: the body lives in chorus/tokenizer/fuzz_entry.cc so that
// ordinary tests (tokenizer_fuzz_slow_test) run it too.
#include <cstddef>
#include <cstdint>

#include "chorus/tokenizer/fuzz_entry.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  chorus::tokenizer::FuzzTokenizerJsonInput(data, size);
  return 0;
}
