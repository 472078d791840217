// Entry points of the LoRA adapter file fuzzers (fuzz/fuzz_peft_lora.cc, fuzz/fuzz_gguf_lora.cc;
// docs/fuzzing.md), callable from ordinary tests too (adapters_lora_lora_fuzz_test).
//
// FuzzPeftLoraInput: `data` is adapter_config.json, a NUL byte, then adapter_model.safetensors
// (no NUL: all of it is the config, with a safetensors file holding no tensor). The two files are
// written into a private temporary directory and read as a real adapter directory is:
// ReadLora (format dispatch), InspectLoraFile, and LoraAdapter::Build when the read succeeds. The
// base model is chosen by the config's base_model_name_or_path ("phi3" → a fused-projection
// base, "qwen3" → a rotate-half base, else a llama base).
//
// FuzzGgufLoraInput: `data` is a GGUF LoRA file, read the same way against the base its
// general.architecture names (llama, qwen3 or phi3; others are refused by the reader).
//
// Both return normally on any input (true when the adapter was read); they abort only when
// Chorus contradicts itself: a file the reader accepted that inspection refuses or that Build
// cannot turn into an adapter for a reason other than its values.
//
// Thread-safety: not reentrant (one temporary directory per process).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace chorus::adapters {

bool FuzzPeftLoraInput(const uint8_t* data, size_t size);
bool FuzzGgufLoraInput(const uint8_t* data, size_t size);

// Small valid inputs of each format covering dtypes, ranks, rank/alpha patterns, rsLoRA, target
// subsets, fused modules and the three base layouts: the fuzzers' seed corpora.
std::vector<std::string> PeftLoraFuzzSeeds();
std::vector<std::string> GgufLoraFuzzSeeds();

}  // namespace chorus::adapters
