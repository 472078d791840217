// libFuzzer target for PEFT adapter directories (adapter_config.json + adapter_model.safetensors):
// the body lives in chorus/adapters/lora/lora_fuzz.cc so that the ordinary test suite runs it too.
// See docs/fuzzing.md.
#include <cstddef>
#include <cstdint>

#include "chorus/adapters/lora/lora_fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  chorus::adapters::FuzzPeftLoraInput(data, size);
  return 0;
}
