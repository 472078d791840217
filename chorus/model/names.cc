#include "chorus/model/names.h"

#include <cstdlib>
#include <span>
#include <utility>

namespace chorus::model {
namespace {

// {HF suffix after "model.layers.N.", GGUF suffix after "blk.N."}
constexpr std::pair<const char*, const char*> kLayerNames[] = {
    {"input_layernorm.weight", "attn_norm.weight"},
    {"post_attention_layernorm.weight", "ffn_norm.weight"},
    {"self_attn.q_proj.weight", "attn_q.weight"},
    {"self_attn.k_proj.weight", "attn_k.weight"},
    {"self_attn.v_proj.weight", "attn_v.weight"},
    {"self_attn.o_proj.weight", "attn_output.weight"},
    {"self_attn.q_proj.bias", "attn_q.bias"},
    {"self_attn.k_proj.bias", "attn_k.bias"},
    {"self_attn.v_proj.bias", "attn_v.bias"},
    {"mlp.gate_proj.weight", "ffn_gate.weight"},
    {"mlp.up_proj.weight", "ffn_up.weight"},
    {"mlp.down_proj.weight", "ffn_down.weight"},
    {"self_attn.q_norm.weight", "attn_q_norm.weight"},
    {"self_attn.k_norm.weight", "attn_k_norm.weight"},
    {"self_attn.qkv_proj.weight", "attn_qkv.weight"},
};
// Checked before kLayerNames for Gemma 2/3 and Phi-3 (llama.cpp's tensor names for them).
constexpr std::pair<const char*, const char*> kGemmaLayerNames[] = {
    {"post_attention_layernorm.weight", "post_attention_norm.weight"},
    {"pre_feedforward_layernorm.weight", "ffn_norm.weight"},
    {"post_feedforward_layernorm.weight", "post_ffw_norm.weight"},
};
constexpr std::pair<const char*, const char*> kPhi3LayerNames[] = {
    {"mlp.gate_up_proj.weight", "ffn_up.weight"},
};

std::span<const std::pair<const char*, const char*>> ArchLayerNames(const std::string& arch) {
  if (arch == "gemma2" || arch == "gemma3") return kGemmaLayerNames;
  if (arch == "phi3") return kPhi3LayerNames;
  return {};
}
constexpr std::pair<const char*, const char*> kGlobalNames[] = {
    {"model.embed_tokens.weight", "token_embd.weight"},
    {"model.norm.weight", "output_norm.weight"},
    {"lm_head.weight", "output.weight"},
};

// Splits "<prefix><digits>.<rest>" into layer and rest.
bool SplitLayer(const std::string& name, const std::string& prefix, std::string* layer,
                std::string* rest) {
  if (name.compare(0, prefix.size(), prefix) != 0) return false;
  size_t i = prefix.size(), j = i;
  while (j < name.size() && name[j] >= '0' && name[j] <= '9') ++j;
  if (j == i || j - i > 6 || j >= name.size() || name[j] != '.') return false;
  *layer = name.substr(i, j - i);
  *rest = name.substr(j + 1);
  return true;
}

}  // namespace

std::optional<std::string> HfToGgufName(const std::string& hf, const std::string& arch) {
  for (const auto& [h, g] : kGlobalNames)
    if (hf == h) return std::string(g);
  std::string layer, rest;
  if (!SplitLayer(hf, "model.layers.", &layer, &rest)) return std::nullopt;
  for (const auto& [h, g] : ArchLayerNames(arch))
    if (rest == h) return "blk." + layer + "." + g;
  for (const auto& [h, g] : kLayerNames)
    if (rest == h) return "blk." + layer + "." + g;
  return std::nullopt;
}

std::optional<std::string> GgufToHfName(const std::string& gguf, const std::string& arch) {
  for (const auto& [h, g] : kGlobalNames)
    if (gguf == g) return std::string(h);
  std::string layer, rest;
  if (!SplitLayer(gguf, "blk.", &layer, &rest)) return std::nullopt;
  for (const auto& [h, g] : ArchLayerNames(arch))
    if (rest == g) return "model.layers." + layer + "." + h;
  for (const auto& [h, g] : kLayerNames)
    if (rest == g) return "model.layers." + layer + "." + h;
  return std::nullopt;
}

}  // namespace chorus::model
