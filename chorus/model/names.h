// Tensor-name mappings between the formats Chorus reads and its canonical Hugging Face names.
#pragma once

#include <optional>
#include <string>

namespace chorus::model {

// HF name -> GGUF (llama.cpp) name, e.g. "model.layers.3.mlp.up_proj.weight" ->
// "blk.3.ffn_up.weight". `arch` (ModelConfig::arch) selects the family's exceptions: Gemma's
// pre_feedforward_layernorm is ffn_norm and its post_attention_layernorm post_attention_norm;
// Phi-3's fused gate_up_proj is ffn_up.
std::optional<std::string> HfToGgufName(const std::string& hf, const std::string& arch = "llama");
// GGUF name -> HF name (inverse of the above).
std::optional<std::string> GgufToHfName(const std::string& gguf, const std::string& arch = "llama");

}  // namespace chorus::model
