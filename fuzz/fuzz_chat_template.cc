// libFuzzer target for chat templates: the body lives in chorus/tokenizer/fuzz_entry.cc so that
// ordinary tests (tokenizer_chat_template_test) run it too. Seeds: tests/chat_templates/corpus.
#include <cstddef>
#include <cstdint>

#include "chorus/tokenizer/fuzz_entry.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  chorus::tokenizer::FuzzChatTemplateInput(data, size);
  return 0;
}
