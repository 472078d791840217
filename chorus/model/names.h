// Tensor-name mappings between the formats Chorus reads and its canonical Hugging Face names.
#pragma once

#include <optional>
#include <string>

namespace chorus::model {

// HF name -> GGUF (llama.cpp) name, e.g. "model.layers.3.mlp.up_proj.weight" ->
// "blk.3.ffn_up.weight".
std::optional<std::string> HfToGgufName(const std::string& hf);
// GGUF name -> HF name (inverse of the above).
std::optional<std::string> GgufToHfName(const std::string& gguf);

}  // namespace chorus::model
