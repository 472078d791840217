// libFuzzer target for GGUF LoRA adapters: the body lives in chorus/adapters/lora/lora_fuzz.cc so
// that the ordinary test suite runs it too. See docs/fuzzing.md.
#include <cstddef>
#include <cstdint>

#include "chorus/adapters/lora/lora_fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  chorus::adapters::FuzzGgufLoraInput(data, size);
  return 0;
}
