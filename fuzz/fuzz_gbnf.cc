// libFuzzer target for the grammar module (gbnf): the body lives in chorus/grammar/fuzz_entry.cc
// so that ordinary tests (grammar_fuzz_slow_test) run it too.
#include <cstddef>
#include <cstdint>

#include "chorus/grammar/fuzz_entry.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  chorus::grammar::FuzzGbnfInput(data, size);
  return 0;
}
