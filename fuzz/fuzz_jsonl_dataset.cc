// libFuzzer target for fine-tuning datasets (JSON Lines and plain text): the body lives in
// chorus/train/data_fuzz.cc so that the ordinary test suite runs it too. See docs/fuzzing.md.
#include <cstddef>
#include <cstdint>

#include "chorus/train/data_fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  chorus::train::FuzzTrainingDataInput(data, size);
  return 0;
}
