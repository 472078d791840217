// ModelConfig: the hyper-parameters of a decoder-only transformer of the families Chorus runs
// (Llama 1/2/3, Mistral, Qwen2, Qwen3, Phi-3/3.5, Gemma 2/3; docs/models.md), filled from HF
// config.json, GGUF metadata or a llama2.c header, validated once. The families differ only in
// the switches below (norms, activation, soft-capping, sliding windows, rope variants); one
// forward pass reads them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "chorus/base/status.h"
#include "chorus/kernels/ops.h"

namespace chorus::model {

struct RopeScaling {
  enum class Type { kNone, kLinear, kLlama3, kLongRope };
  Type type = Type::kNone;
  float factor = 1.0f;
  float low_freq_factor = 1.0f;          // llama3
  float high_freq_factor = 4.0f;         // llama3
  int64_t original_max_position = 8192;  // llama3, longrope
  // LongRoPE (Phi-3 "longrope"/"su"): per-frequency divisors [rotary_dim / 2] — the long ones
  // when the served context exceeds original_max_position, else the short ones (chosen once,
  // as llama.cpp does, so cached keys never change rotation) — and the factor cos/sin are
  // multiplied by.
  std::vector<float> long_factors, short_factors;
  float attn_factor = 1.0f;
};

enum class Activation { kSilu, kGeluTanh };  // of the gated MLP: silu (SwiGLU), gelu-tanh (GeGLU)

struct ModelConfig {
  // "llama" (also Mistral), "qwen2", "qwen3", "phi3", "gemma2", "gemma3".
  std::string arch = "llama";
  int64_t n_embd = 0;  // hidden size
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
  // Dimensions of each head that rotate (partial rotary); 0 = all of head_dim.
  int64_t rotary_dim = 0;

  // Per-head RMSNorm of q and k over head_dim before RoPE (Qwen3, Gemma 3).
  bool qk_norm = false;
  // RMSNorm scales by (1 + w) (Gemma). Tensors keep the checkpoint's w; the +1 is applied once
  // at load.
  bool norm_plus_one = false;
  // Post-attention and post-MLP norms on the branch outputs before the residual add (Gemma 2/3).
  bool sandwich_norms = false;
  bool embed_scale = false;  // embeddings × √n_embd (Gemma)
  Activation activation = Activation::kSilu;
  // Attention scores scale; 0 = 1/√head_dim (Gemma: query_pre_attn_scalar^-½).
  float attn_scale = 0.0f;
  float attn_softcap = 0.0f;   // scores = cap·tanh(scores/cap) when > 0 (Gemma 2)
  float final_softcap = 0.0f;  // logits likewise (Gemma 2)
  // Sliding-window attention: a row at position p attends keys (p − sliding_window, p] on the
  // layers marked in layer_sliding (empty = every layer); 0 = no window.
  int64_t sliding_window = 0;
  std::vector<uint8_t> layer_sliding;
  float rope_local_theta = 0.0f;  // RoPE base of sliding layers, no scaling (Gemma 3); 0 = same
  // How the model's embeddings pool its hidden states, when the file says (an embedding model
  // such as Qwen3-Embedding): "last", "mean" or "cls", from GGUF `{arch}.pooling_type` or a
  // sentence-transformers `1_Pooling/config.json`; empty = not declared.
  std::string pooling;

  int64_t RotaryDim() const { return rotary_dim > 0 ? rotary_dim : head_dim; }
  bool LayerSliding(int64_t layer) const {
    return sliding_window > 0 &&
           (layer_sliding.empty() || layer_sliding[static_cast<size_t>(layer)] != 0);
  }
  // The sliding window of `layer` (its attention's keys [p − window + 1, p]), 0 for none.
  int64_t LayerWindow(int64_t layer) const { return LayerSliding(layer) ? sliding_window : 0; }
  float AttnScale() const;
  // The window when every layer slides (KV blocks behind it are never read again), else 0.
  int64_t KvWindow() const {
    if (sliding_window <= 0) return 0;
    for (uint8_t s : layer_sliding)
      if (s == 0) return 0;
    return sliding_window;
  }

  int64_t q_dim() const { return n_heads * head_dim; }
  int64_t kv_dim() const { return n_kv_heads * head_dim; }

  // Checks positivity, divisibility (n_heads % n_kv_heads, even head_dim) and plausible bounds.
  Status Validate() const;
  // inv_freq[RotaryDim() / 2] including rope scaling (of global layers).
  std::vector<float> RopeInvFreq() const;
  // Of sliding layers when rope_local_theta is set (Gemma 3): that base, no scaling.
  std::vector<float> RopeInvFreqLocal() const;
  // The factor RoPE's cos/sin are multiplied by (LongRoPE's attention factor, else 1).
  float RopeAttnFactor() const;
  // Parameters (weights) count.
  int64_t NumParams() const;
  std::string Summary() const;  // one line for logs and `chorus inspect`
};

// Parses a Hugging Face config.json (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM,
// Qwen3ForCausalLM, Phi3ForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM).
Result<ModelConfig> ConfigFromHfJson(const std::string& json_text,
                                     const std::string& file_for_errors);

}  // namespace chorus::model
