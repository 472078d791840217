// ModelConfig: the hyper-parameters of a Llama-family decoder (Llama 1/2/3, Mistral, Qwen2),
// filled from HF config.json, GGUF metadata or a llama2.c header, validated once.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "chorus/base/status.h"
#include "chorus/kernels/ops.h"

namespace chorus::model {

struct RopeScaling {
  enum class Type { kNone, kLinear, kLlama3 };
  Type type = Type::kNone;
  float factor = 1.0f;
  float low_freq_factor = 1.0f;          // llama3
  float high_freq_factor = 4.0f;         // llama3
  int64_t original_max_position = 8192;  // llama3
};

struct ModelConfig {
  std::string arch = "llama";  // "llama" (also Mistral), "qwen2"
  int64_t n_embd = 0;          // hidden size
  int64_t n_layers = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;  // default n_embd / n_heads
  int64_t n_ff = 0;      // MLP intermediate size
  int64_t vocab_size = 0;
  int64_t max_seq_len = 2048;  // context length
  float norm_eps = 1e-5f;
  float rope_theta = 10000.0f;
  RopeScaling rope_scaling;
  bool tie_embeddings = false;  // output projection = token embedding
  bool qkv_bias = false;        // Qwen2
  // Pair order of q/k rows: interleaved for llama2.c and GGUF llama, half for HF and GGUF qwen2.
  kernels::RopeLayout rope_layout = kernels::RopeLayout::kHalf;
  // Per-frequency divisors [head_dim / 2] (GGUF `rope_freqs.weight`, how llama.cpp stores
  // Llama-3 rope scaling); empty = none.
  std::vector<float> rope_freq_factors;

  int64_t q_dim() const { return n_heads * head_dim; }
  int64_t kv_dim() const { return n_kv_heads * head_dim; }

  // Checks positivity, divisibility (n_heads % n_kv_heads, even head_dim) and plausible bounds.
  Status Validate() const;
  // inv_freq[head_dim / 2] including rope scaling.
  std::vector<float> RopeInvFreq() const;
  // Parameters (weights) count.
  int64_t NumParams() const;
  std::string Summary() const;  // one line for logs and `chorus inspect`
};

// Parses a Hugging Face config.json (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM).
Result<ModelConfig> ConfigFromHfJson(const std::string& json_text,
                                     const std::string& file_for_errors);

}  // namespace chorus::model
