// Reading and writing LoRA adapter files.
//
// PEFT directory (Hugging Face): adapter_config.json + adapter_model.safetensors, tensors
//   "<prefix>layers.N.self_attn.q_proj.lora_A.weight" [r, in] / "...lora_B.weight" [out, r]
//   (prefix usually "base_model.model.model."; an adapter name between lora_A and weight is
//   accepted), f32/f16/bf16, q/k lora_B rows in Hugging Face (rotate-half) order. Config keys
//   used: peft_type (LORA), r, lora_alpha, use_rslora, rank_pattern / alpha_pattern (keys
//   matched as PEFT does for plain names: equal to the module path or a "."-separated suffix of
//   it, first match in file order), target_modules, base_model_name_or_path. Refused with a
//   message saying why: pickle adapter_model.bin, DoRA (use_dora / lora_magnitude_vector),
//   modules_to_save, embedding or lm_head LoRA, trained biases (bias != "none", lora_bias),
//   fan_in_fan_out, layer_replication, target modules Chorus cannot apply.
//
// GGUF LoRA (llama.cpp convert_lora_to_gguf.py): general.type = "adapter", adapter.type =
//   "lora", adapter.lora.alpha (float32; 0 or absent = scale 1, as llama.cpp), general.architecture
//   equal to the base's; tensors "blk.N.attn_q.weight.lora_a" [r, in] and ".lora_b" [out, r]
//   (outermost-first shapes, i.e. GGUF ne = {in, r} / {r, out}); scale = alpha / r per module.
//   q/k lora_b rows are in the GGUF order of the architecture (interleaved for llama, as the
//   converter permutes them; unchanged for qwen2). "*_norm.weight" adapter tensors are ignored
//   as llama.cpp ignores them; token_embd / output LoRA is refused.
//
// All readers validate against the base ModelConfig before converting anything (layer index,
// shapes, rank ≤ max_rank, dtype), so a hostile file cannot cause a huge allocation; NaN/Inf
// values are refused by LoraAdapter::Build. Errors start with the file's path.
//
// Implemented by concern: peft_codec.cc and gguf_lora_codec.cc (each format's reader and
// writer), lora_inspect.cc (InspectLoraFile), lora_synthetic.cc (WriteSyntheticLoraSet) and
// lora_files.cc (ReadLora / LoadLoraAdapter: the format dispatch); helpers they share are in
// lora_files_internal.h.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "chorus/adapters/lora/lora_adapter.h"
#include "chorus/base/status.h"

namespace chorus::adapters {

struct LoraLoadOptions {
  LoraLimits limits;  // max_rank (default 256)
  VariantId id = {};  // LoadLoraAdapter: the copy's LoraView::id() (default none)
};

// A PEFT adapter directory (or its adapter_config.json / adapter_model.safetensors path).
Result<LoraWeights> ReadPeftLora(const std::string& path, const model::ModelConfig& base,
                                 const LoraLoadOptions& opts = {});
// A GGUF LoRA file.
Result<LoraWeights> ReadGgufLora(const std::string& path, const model::ModelConfig& base,
                                 const LoraLoadOptions& opts = {});
// Detects the format (directory or "GGUF" magic; a pickle .bin is refused) and reads it.
Result<LoraWeights> ReadLora(const std::string& path, const model::ModelConfig& base,
                             const LoraLoadOptions& opts = {});
// ReadLora + LoraAdapter::Build; `name` defaults to the path.
Result<std::shared_ptr<const LoraAdapter>> LoadLoraAdapter(const std::string& path,
                                                           const model::ModelConfig& base,
                                                           const LoraLoadOptions& opts = {},
                                                           std::string name = "");

struct PeftWriteOptions {
  DType dtype = DType::kF32;    // f32, f16 or bf16
  std::string base_model_name;  // base_model_name_or_path (default: w.base_model)
};
// Writes `w` as a PEFT directory `dir` (created if missing): adapter_config.json (r = the most
// common rank, lora_alpha likewise, rank_pattern / alpha_pattern for modules that differ,
// target_modules = the linears present) and adapter_model.safetensors (written atomically).
// lora_B rows of q/k are written in Hugging Face order whatever w.qk_layout is.
Status WritePeftLora(const std::string& dir, const LoraWeights& w, const model::ModelConfig& base,
                     const PeftWriteOptions& opts = {});

struct GgufLoraWriteOptions {
  DType dtype = DType::kF32;  // f32, f16, bf16 (q8_0 for A when in % 32 == 0)
};
// Writes `w` as a llama.cpp-style GGUF LoRA (q/k lora_b rows in the GGUF order of base.arch).
// GGUF holds one alpha: every module must have the same alpha/r·r' relation, i.e. the same
// scale·rank (kUnimplemented otherwise, e.g. rsLoRA with mixed ranks).
Status WriteGgufLora(const std::string& path, const LoraWeights& w, const model::ModelConfig& base,
                     const GgufLoraWriteOptions& opts = {});

}  // namespace chorus::adapters

namespace chorus::adapters {

// ---- Inspection without a base model (`chorus inspect` on adapter files) ----

// What an adapter file says about itself, read from its config and tensor headers (no weights
// are decoded). One entry per targeted linear kind.
struct LoraModuleSummary {
  std::string name;                  // Hugging Face name: "q_proj", ..., "down_proj"
  int64_t layers = 0;                // layers where this linear is targeted
  std::map<int64_t, int64_t> ranks;  // rank → number of layers with that rank
  std::map<float, int64_t> alphas;   // lora_alpha → number of layers
  int64_t in = 0, out = 0;           // A [r, in], B [out, r] (of the first layer seen)
  std::string dtype;                 // "bf16", "f32", ... ("mixed" when the layers differ)
};
struct LoraFileInfo {
  std::string path;
  std::string format;  // "peft" or "gguf"
  // Recorded base model (PEFT base_model_name_or_path; GGUF general.basename or general.name).
  std::string base_model;
  std::string architecture;  // GGUF general.architecture (empty for PEFT)
  int64_t n_layers = 0;      // highest targeted layer index + 1
  bool use_rslora = false;
  int64_t config_r = 0;     // PEFT "r" (0 for GGUF)
  double config_alpha = 0;  // PEFT "lora_alpha" / GGUF adapter.lora.alpha (0 = absent)
  int64_t n_tensors = 0;
  int64_t tensor_bytes = 0;                // bytes of the lora_A / lora_B tensors
  int64_t file_bytes = 0;                  // bytes of the adapter's files
  std::vector<LoraModuleSummary> modules;  // in model order (q, k, v, o, gate, up, down)
};
// Reads `path` (a PEFT directory or one of its two files, or a GGUF LoRA) and checks what can be
// checked without a base: supported config, tensor names, A/B pairs present with equal ranks,
// ranks matching r / rank_pattern, dtypes. Errors as the readers' (path first).
Result<LoraFileInfo> InspectLoraFile(const std::string& path);

// ---- Synthetic adapters for benchmarks (`chorus convert --lora-count`) ----

// Writes `count` PEFT adapters for `base` as `<dir>/<prefix><i>` (i = 0..count-1, zero-padded to
// the width of count-1): adapter i has rank ranks[i % ranks.size()], lora_alpha = 2·rank,
// random weights (RandomLoraSpec, seed + i) on `targets`, in `dtype` (f32/f16/bf16).
// When 0 < distinct < count, only adapters 0..distinct-1 get their own weight files; adapter i
// ≥ distinct hard-links the files of adapter i % distinct (same rank, so identical bytes would
// be written anyway) — every directory is still a complete adapter for the registry.
struct SyntheticLoraSetOptions {
  int64_t count = 1;
  int64_t distinct = 0;  // 0 = every adapter distinct
  std::vector<int64_t> ranks = {8, 16, 32, 64};
  std::vector<model::Linear> targets = {model::Linear::kQ, model::Linear::kK, model::Linear::kV,
                                        model::Linear::kO};
  DType dtype = DType::kBF16;
  std::string prefix = "lora-";
  uint64_t seed = 1000;
  std::string base_model_name;
};
// Calls `progress(i)` after each adapter. Returns the bytes written (hard links not counted).
Result<int64_t> WriteSyntheticLoraSet(const std::string& dir, const model::ModelConfig& base,
                                      const SyntheticLoraSetOptions& opts,
                                      const std::function<void(int64_t)>& progress = {});

}  // namespace chorus::adapters
