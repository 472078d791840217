// Helpers shared by the LoRA file code, which is split by concern: the PEFT codec
// (peft_codec.cc), the GGUF LoRA codec (gguf_lora_codec.cc), inspection without a base
// (lora_inspect.cc), synthetic adapter sets (lora_synthetic.cc) and the format dispatch
// (lora_files.cc); the helpers every one of them may use are in lora_files_internal.cc. Not part
// of the public API, which is chorus/adapters/lora/lora_files.h.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "chorus/adapters/lora/lora_adapter.h"
#include "chorus/adapters/lora/lora_files.h"
#include "chorus/formats/gguf.h"
#include "chorus/formats/safetensors.h"
#include "chorus/kernels/ops.h"
#include "chorus/model/config.h"
#include "chorus/tensor/tensor.h"

namespace chorus::adapters::lora_internal {

// The two files of a PEFT adapter directory, and the pickle checkpoint Chorus refuses.
inline constexpr const char* kConfigFile = "adapter_config.json";
inline constexpr const char* kSafetensorsFile = "adapter_model.safetensors";
inline constexpr const char* kPickleFile = "adapter_model.bin";
inline constexpr const char* kSupportedModules =
    "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, qkv_proj, gate_up_proj";

// The names of one linear in both formats.
struct ModuleName {
  const char* hf;    // PEFT: path inside a decoder layer ("self_attn.q_proj")
  const char* gguf;  // llama.cpp tensor name inside blk.N
  model::Linear which;
};
inline constexpr ModuleName kModules[] = {
    {"self_attn.q_proj", "attn_q.weight", model::Linear::kQ},
    {"self_attn.k_proj", "attn_k.weight", model::Linear::kK},
    {"self_attn.v_proj", "attn_v.weight", model::Linear::kV},
    {"self_attn.o_proj", "attn_output.weight", model::Linear::kO},
    {"mlp.gate_proj", "ffn_gate.weight", model::Linear::kGate},
    {"mlp.up_proj", "ffn_up.weight", model::Linear::kUp},
    {"mlp.down_proj", "ffn_down.weight", model::Linear::kDown},
};
// Fused modules (Phi-3's qkv_proj, gate_up_proj): one LoRA over a model::LinearGroup's members
// stacked by rows. Its lora_A is shared by the members and its lora_B splits by rows in
// LinearGroupMembers order (docs/models.md, "LoRA on fused modules").
struct FusedModuleName {
  const char* hf;
  model::LinearGroup group;
};
inline constexpr FusedModuleName kFusedModules[] = {
    {"self_attn.qkv_proj", model::LinearGroup::kQkv},
    {"mlp.gate_up_proj", model::LinearGroup::kGateUp},
};

// ---- Shared by every codec (lora_files_internal.cc) ----

bool EndsWith(const std::string& s, const std::string& suffix);
// Parses "<digits>" at s[pos..] up to '.', bounded (≤ 9 digits). Returns the index and moves pos
// past the dot.
std::optional<int64_t> ParseIndex(const std::string& s, size_t* pos);
// kInvalidArgument naming `tensor` when `layer` is not a layer of `base`.
Status LayerInRange(int64_t layer, const model::ModelConfig& base, const std::string& tensor);
// Puts `t` into w's lora_A (is_a) or lora_B slot of (layer, which); a second one is an error.
Status StoreTensor(LoraWeights* w, int64_t layer, model::Linear which, bool is_a, Tensor t,
                   const std::string& tensor);
// A fused module's lora_A (is_a; shared by the group's members) or lora_B (split by rows along
// LinearGroupMembers(group), each member's LinearOut(base) rows) stored for each member. A lora_B
// of the wrong height is an error naming `tensor`.
Status StoreFusedTensor(LoraWeights* w, const model::ModelConfig& base, int64_t layer,
                        model::LinearGroup group, bool is_a, Tensor t, const std::string& tensor);
// lora_B with q/k rows moved from pair order `from` to `to`.
Tensor PermutedB(const Tensor& b, const model::ModelConfig& base, model::Linear which,
                 kernels::RopeLayout from, kernels::RopeLayout to);
// `t` in `dtype` (a quantized dtype needs rows of whole blocks).
Result<Tensor> Converted(const Tensor& t, DType dtype);
// The file's size, 0 when it cannot be stat'ed.
int64_t FileBytes(const std::string& path);
// True when the file starts with the GGUF magic; kNotFound when it cannot be opened.
Result<bool> StartsWithGgufMagic(const std::string& path);

// ---- PEFT (peft_codec.cc) ----

// What Chorus uses of adapter_config.json.
struct PeftConfig {
  int64_t r = 8;
  double alpha = 8;
  bool use_rslora = false;
  std::vector<std::pair<std::string, int64_t>> rank_pattern;
  std::vector<std::pair<std::string, double>> alpha_pattern;
  std::string base_model;
};

// PEFT matches a pattern key against a module path "model.layers.3.self_attn.q_proj" when the
// path equals the key or ends with "." + key (for keys without regex syntax).
inline bool PatternMatches(const std::string& key, const std::string& module_path) {
  return module_path == key || EndsWith(module_path, "." + key);
}

// The value of the first `pattern` entry (PEFT rank_pattern / alpha_pattern) matching the module
// at `module_path`, else `fallback`.
template <typename T>
T PatternValue(const std::vector<std::pair<std::string, T>>& pattern,
               const std::string& module_path, T fallback) {
  for (const auto& [key, value] : pattern) {
    if (PatternMatches(key, module_path)) return value;
  }
  return fallback;
}

struct PeftTensorName {
  int64_t layer = 0;
  model::Linear which = model::Linear::kQ;
  bool is_a = true;
  std::optional<model::LinearGroup> fused;  // a fused module: `which` is its first member
  std::string leaf;                         // "self_attn.q_proj", as named in the file
};
// "<prefix>layers.N.self_attn.q_proj.lora_A[.<adapter>].weight" → (N, q, A); anything else is
// an error naming what Chorus does not support.
Result<PeftTensorName> ParsePeftTensorName(const std::string& name);
// kInvalidArgument (naming `st_path` and the tensor) unless the tensor is F32, F16 or BF16.
Status CheckPeftTensorDType(const std::string& st_path, const formats::SafetensorsTensorInfo& t);

// A PEFT adapter directory, opened: its parsed adapter_config.json and its safetensors file.
struct PeftDir {
  PeftConfig config;
  std::string st_path;   // the safetensors file's path (for error context)
  std::string cfg_path;  // adapter_config.json's path
  std::shared_ptr<const formats::SafetensorsFile> file;
};
// Opens dir's adapter_config.json and adapter_model.safetensors (shared by the reader and the
// inspector); a pickle adapter_model.bin is refused by name.
Result<PeftDir> OpenPeftDir(const std::string& dir);
// For a path that is not a directory: the PEFT directory it names when it is the path of
// adapter_config.json or adapter_model.safetensors, "" when it is neither. A pickle checkpoint
// (adapter_model.bin, *.bin, *.pt, *.pth) is refused by name.
Result<std::string> PeftDirOfFile(const std::string& path);
// Reads the PEFT directory `dir` and validates it against `base`.
Result<LoraWeights> ReadPeftDir(const std::string& dir, const model::ModelConfig& base,
                                const LoraLoadOptions& opts);

// ---- GGUF (gguf_lora_codec.cc) ----

// One tensor of a llama.cpp LoRA GGUF: "blk.<layer>.<module>.weight.lora_a|lora_b".
struct GgufLoraTensor {
  bool skip = false;  // a norm tensor: ignored, as llama.cpp does
  // A fused module (attn_qkv; ffn_up of a model whose gate|up is fused): `which` is its first
  // member.
  std::optional<model::LinearGroup> fused;
  bool is_a = false;
  int64_t layer = 0;  // not yet checked against a base model
  model::Linear which = model::Linear::kQ;
  DType dtype = DType::kF32;
};
// Decodes a tensor name and type of a GGUF LoRA file; errors name `path` and the tensor.
Result<GgufLoraTensor> ParseGgufLoraTensor(const std::string& path, const std::string& name,
                                           uint32_t ggml_type);
// OK when the file says it is a LoRA adapter (general.type "adapter", adapter.type "lora").
Status CheckGgufLoraHeader(const formats::GgufFile& file, const std::string& path);
// adapter.lora.alpha, 0 when absent; kInvalidArgument when not finite.
Result<double> GgufLoraAlpha(const formats::GgufFile& file, const std::string& path);

}  // namespace chorus::adapters::lora_internal
