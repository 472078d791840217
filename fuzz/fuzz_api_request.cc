// libFuzzer target for OpenAI request bodies (completions, chat, /tokenize, /detokenize,
// /apply-template): the body lives in chorus/server/fuzz_entry.cc so that the ordinary test suite
// runs it too. See docs/fuzzing.md.
#include <cstddef>
#include <cstdint>

#include "chorus/server/fuzz_entry.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  chorus::server::FuzzApiRequestInput(data, size);
  return 0;
}
