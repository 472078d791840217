// The GGUF LoRA codec: reading and writing llama.cpp-style LoRA GGUF files
// (convert_lora_to_gguf.py), as described in lora_files.h.
#include <cmath>
#include <optional>

#include "chorus/adapters/lora/lora_files.h"
#include "chorus/adapters/lora/lora_files_internal.h"

namespace chorus::adapters {
namespace lora_internal {

Result<GgufLoraTensor> ParseGgufLoraTensor(const std::string& path, const std::string& name,
                                           uint32_t ggml_type) {
  GgufLoraTensor g;
  if (EndsWith(name, ".lora_a")) {
    g.is_a = true;
  } else if (EndsWith(name, ".lora_b")) {
    g.is_a = false;
  } else if (EndsWith(name, "_norm.weight")) {
    g.skip = true;  // llama.cpp ignores norm tensors of adapters too
    return g;
  } else {
    return InvalidArgumentError(path + ": LoRA tensor '" + name +
                                "' has an unexpected suffix (expected .lora_a / .lora_b)");
  }
  const std::string target = name.substr(0, name.size() - 7);
  if (target == "token_embd.weight" || target == "output.weight") {
    return UnimplementedError(path + ": tensor '" + name +
                              "': LoRA on embeddings / output is not supported");
  }
  if (target.rfind("blk.", 0) != 0) {
    return InvalidArgumentError(path + ": tensor '" + name + "' does not target a decoder layer");
  }
  size_t pos = 4;
  std::optional<int64_t> layer = ParseIndex(target, &pos);
  if (!layer)
    return InvalidArgumentError(path + ": tensor '" + name + "' has a malformed layer index");
  g.layer = *layer;
  const std::string leaf = target.substr(pos);
  const ModuleName* mod = nullptr;
  for (const ModuleName& m : kModules) {
    if (leaf == m.gguf) mod = &m;
  }
  if (mod == nullptr && leaf == "attn_qkv.weight") {  // llama.cpp's fused q|k|v (Phi-3)
    static constexpr ModuleName kQkv = {"self_attn.qkv_proj", "attn_qkv.weight", model::Linear::kQ};
    mod = &kQkv;
    g.fused = model::LinearGroup::kQkv;
  }
  if (mod == nullptr) {
    return InvalidArgumentError(path + ": tensor '" + name + "' targets unknown module '" + leaf +
                                "' (Chorus applies LoRA to attn_q, attn_k, attn_v, attn_qkv, "
                                "attn_output, ffn_gate, ffn_up, ffn_down)");
  }
  g.which = mod->which;
  auto dt = formats::GgmlTypeToDType(ggml_type);
  if (!dt.ok() || !(*dt == DType::kF32 || *dt == DType::kF16 || *dt == DType::kBF16 ||
                    *dt == DType::kQ8_0 || *dt == DType::kQ4_0)) {
    return InvalidArgumentError(path + ": tensor '" + name + "' has type " +
                                formats::GgmlTypeName(ggml_type) +
                                " (LoRA weights must be F32, F16, BF16, Q8_0 or Q4_0)");
  }
  g.dtype = *dt;
  return g;
}

Status CheckGgufLoraHeader(const formats::GgufFile& file, const std::string& path) {
  auto type = file.GetString("general.type");
  if (!type.ok() || *type != "adapter") {
    return InvalidArgumentError(
        path + ": general.type is " + (type.ok() ? "'" + *type + "'" : "missing") +
        ", expected 'adapter' (is this a base model rather than a LoRA file?)");
  }
  auto atype = file.GetString("adapter.type");
  if (!atype.ok() || *atype != "lora") {
    return UnimplementedError(path + ": adapter.type is " +
                              (atype.ok() ? "'" + *atype + "'" : "missing") +
                              ", only 'lora' is supported");
  }
  return OkStatus();
}

Result<double> GgufLoraAlpha(const formats::GgufFile& file, const std::string& path) {
  if (!file.Has("adapter.lora.alpha")) return 0.0;
  CHORUS_ASSIGN_OR_RETURN(const double alpha, file.GetFloat("adapter.lora.alpha"));
  if (!std::isfinite(alpha))
    return InvalidArgumentError(path + ": adapter.lora.alpha is not finite");
  return alpha;
}

}  // namespace lora_internal

using lora_internal::CheckGgufLoraHeader;
using lora_internal::Converted;
using lora_internal::GgufLoraAlpha;
using lora_internal::GgufLoraTensor;
using lora_internal::kModules;
using lora_internal::LayerInRange;
using lora_internal::ModuleName;
using lora_internal::ParseGgufLoraTensor;
using lora_internal::PermutedB;
using lora_internal::StoreFusedTensor;
using lora_internal::StoreTensor;
using model::Linear;

Result<LoraWeights> ReadGgufLora(const std::string& path, const model::ModelConfig& base,
                                 const LoraLoadOptions& opts) {
  CHORUS_ASSIGN_OR_RETURN(auto file, formats::GgufFile::Open(path));
  CHORUS_RETURN_IF_ERROR(CheckGgufLoraHeader(*file, path));
  auto arch = file->GetString("general.architecture");
  if (!arch.ok() || *arch != base.arch) {
    return InvalidArgumentError(path + ": adapter architecture " +
                                (arch.ok() ? "'" + *arch + "'" : "missing") +
                                " does not match the base model's '" + base.arch + "'");
  }
  CHORUS_ASSIGN_OR_RETURN(const double alpha, GgufLoraAlpha(*file, path));
  LoraWeights w = LoraWeights::Empty(base.n_layers);
  w.use_rslora = false;
  w.qk_layout =
      base.arch == "llama" ? kernels::RopeLayout::kInterleaved : kernels::RopeLayout::kHalf;
  for (const formats::GgufTensorInfo& info : file->tensors()) {
    const std::string& name = info.name;
    CHORUS_ASSIGN_OR_RETURN(GgufLoraTensor g, ParseGgufLoraTensor(path, name, info.ggml_type));
    if (g.skip) continue;
    CHORUS_RETURN_IF_ERROR(LayerInRange(g.layer, base, name).WithContext(path));
    CHORUS_ASSIGN_OR_RETURN(Tensor t, file->GetTensor(name));
    if (g.fused && !model::FusedProjections(base)) {
      return InvalidArgumentError(path + ": tensor '" + name +
                                  "' targets unknown module 'attn_qkv.weight' for a " + base.arch +
                                  " model (only models that store q|k|v fused have it)");
    }
    // A model that stores gate|up fused (model::FusedProjections) names it ffn_up in GGUF.
    if (!g.fused && g.which == Linear::kUp && model::FusedProjections(base))
      g.fused = model::LinearGroup::kGateUp;
    if (g.fused) {
      CHORUS_RETURN_IF_ERROR(
          StoreFusedTensor(&w, base, g.layer, *g.fused, g.is_a, std::move(t), name)
              .WithContext(path));
      continue;
    }
    CHORUS_RETURN_IF_ERROR(
        StoreTensor(&w, g.layer, g.which, g.is_a, std::move(t), name).WithContext(path));
  }
  for (auto& m : w.modules) {
    if (m.present() && m.a.shape().size() == 2) {
      // llama.cpp: scale = alpha / rank, or 1 when the file has no alpha.
      m.alpha = alpha == 0 ? static_cast<float>(m.a.shape()[0]) : static_cast<float>(alpha);
    }
  }
  CHORUS_RETURN_IF_ERROR(ValidateLoraWeights(w, base, opts.limits).WithContext(path));
  return w;
}

Status WriteGgufLora(const std::string& path, const LoraWeights& w, const model::ModelConfig& base,
                     const GgufLoraWriteOptions& opts) {
  if (model::FusedProjections(base)) {
    // llama.cpp names such a model's LoRA by its fused modules (attn_qkv, ffn_up = gate|up),
    // which need one shared lora_A per group; the reader takes those, this writer does not.
    return UnimplementedError("writing a GGUF LoRA for a model with fused projections (" +
                              base.arch + ") is not supported; write the PEFT format");
  }
  CHORUS_RETURN_IF_ERROR(ValidateLoraWeights(w, base, LoraLimits{.max_rank = 1 << 20}));
  // llama.cpp computes s = alpha / r per module from one alpha.
  std::optional<double> alpha;
  for (int64_t l = 0; l < w.n_layers; ++l)
    for (int li = 0; li < model::kNumLinears; ++li) {
      const Linear which = static_cast<Linear>(li);
      if (!w.at(l, which).present()) continue;
      const double a =
          static_cast<double>(w.Scale(l, which)) * static_cast<double>(w.at(l, which).rank());
      if (!alpha) {
        alpha = a;
      } else if (std::fabs(a - *alpha) > 1e-6 * std::fabs(*alpha)) {
        return UnimplementedError(
            "GGUF LoRA holds one alpha for all modules; modules of this adapter need different "
            "ones (mixed alpha or rsLoRA with mixed ranks)");
      }
    }
  const kernels::RopeLayout to =
      base.arch == "llama" ? kernels::RopeLayout::kInterleaved : kernels::RopeLayout::kHalf;
  formats::GgufWriter g;
  g.SetString("general.architecture", base.arch);
  g.SetString("general.type", "adapter");
  g.SetString("adapter.type", "lora");
  g.SetFloat32("adapter.lora.alpha", static_cast<float>(*alpha));
  for (int64_t l = 0; l < w.n_layers; ++l) {
    for (const ModuleName& mn : kModules) {
      const auto& m = w.at(l, mn.which);
      if (!m.present()) continue;
      const std::string tname = "blk." + std::to_string(l) + "." + mn.gguf;
      CHORUS_ASSIGN_OR_RETURN(Tensor a, Converted(m.a, opts.dtype));
      const DType b_dtype = DTypeIsQuantized(opts.dtype) ? DType::kF32 : opts.dtype;
      CHORUS_ASSIGN_OR_RETURN(Tensor b,
                              Converted(PermutedB(m.b, base, mn.which, w.qk_layout, to), b_dtype));
      g.AddTensor(tname + ".lora_a", std::move(a));
      g.AddTensor(tname + ".lora_b", std::move(b));
    }
  }
  return g.Write(path);
}

}  // namespace chorus::adapters
