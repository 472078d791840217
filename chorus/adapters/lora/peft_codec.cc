// The PEFT codec: reading and writing Hugging Face PEFT adapter directories
// (adapter_config.json + adapter_model.safetensors), as described in lora_files.h.
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string_view>

#include "chorus/adapters/lora/lora_files.h"
#include "chorus/adapters/lora/lora_files_internal.h"
#include "chorus/base/durable_file.h"
#include "chorus/base/mapped_file.h"

namespace chorus::adapters {
namespace lora_internal {

using model::Linear;
using ojson = nlohmann::ordered_json;

namespace {

constexpr int64_t kMaxConfigBytes = 1 << 20;

bool Contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

Status CheckPatternKey(const std::string& key, const char* field) {
  for (char ch : key) {
    if (std::string_view("*+?()[]{}|^$\\").find(ch) != std::string_view::npos) {
      return UnimplementedError(std::string(field) + " key '" + key +
                                "' is a regular expression; only plain module names are supported");
    }
  }
  return OkStatus();
}

Result<std::string> ReadSmallFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFoundError(path + ": cannot open");
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  if (size < 0 || size > kMaxConfigBytes) {
    return InvalidArgumentError(path + ": larger than " + std::to_string(kMaxConfigBytes) +
                                " bytes");
  }
  in.seekg(0);
  std::string text(static_cast<size_t>(size), '\0');
  in.read(text.data(), size);
  if (!in) return DataLossError(path + ": read failed");
  return text;
}

bool IsTrue(const ojson& cfg, const char* key) {
  auto it = cfg.find(key);
  return it != cfg.end() && it->is_boolean() && it->get<bool>();
}

// A target_modules entry Chorus can apply: one of the seven names or a fused one, possibly with a
// path prefix.
Status CheckTargetModule(const std::string& t) {
  auto matches = [&](const char* hf) {
    const std::string leaf = std::string(hf).substr(std::string(hf).find('.') + 1);
    return t == leaf || EndsWith(t, "." + leaf);
  };
  for (const ModuleName& m : kModules)
    if (matches(m.hf)) return OkStatus();
  for (const FusedModuleName& m : kFusedModules)
    if (matches(m.hf)) return OkStatus();
  if (t == "lm_head" || EndsWith(t, ".lm_head") || t == "embed_tokens" ||
      EndsWith(t, ".embed_tokens")) {
    return UnimplementedError("LoRA on '" + t +
                              "' (embeddings / lm_head) is not supported; Chorus applies LoRA to " +
                              kSupportedModules);
  }
  return InvalidArgumentError("unknown target module '" + t + "' (Chorus applies LoRA to " +
                              kSupportedModules + ")");
}

Result<PeftConfig> ParsePeftConfig(const std::string& text) {
  ojson cfg = ojson::parse(text, nullptr, /*allow_exceptions=*/false);
  if (cfg.is_discarded() || !cfg.is_object()) return InvalidArgumentError("not a JSON object");
  PeftConfig pc;
  if (auto it = cfg.find("peft_type"); it != cfg.end() && !it->is_null()) {
    if (!it->is_string() || it->get<std::string>() != "LORA") {
      return UnimplementedError("peft_type " + it->dump() + " is not supported (only LORA)");
    }
  }
  if (IsTrue(cfg, "use_dora")) {
    return UnimplementedError("DoRA adapters (use_dora: true) are not supported");
  }
  if (auto it = cfg.find("modules_to_save");
      it != cfg.end() && !it->is_null() && !(it->is_array() && it->empty())) {
    return UnimplementedError("modules_to_save " + it->dump().substr(0, 200) +
                              " (full copies of base modules) is not supported");
  }
  if (auto it = cfg.find("bias");
      it != cfg.end() && !it->is_null() && !(it->is_string() && it->get<std::string>() == "none")) {
    return UnimplementedError("bias " + it->dump() +
                              " (trained biases) is not supported; only \"none\"");
  }
  if (IsTrue(cfg, "lora_bias")) return UnimplementedError("lora_bias: true is not supported");
  if (IsTrue(cfg, "fan_in_fan_out")) {
    return UnimplementedError("fan_in_fan_out: true (Conv1D-style weights) is not supported");
  }
  if (auto it = cfg.find("layer_replication"); it != cfg.end() && !it->is_null()) {
    return UnimplementedError("layer_replication is not supported");
  }
  if (auto it = cfg.find("r"); it != cfg.end() && !it->is_null()) {
    if (!it->is_number_integer() || it->get<int64_t>() < 1)
      return InvalidArgumentError("r must be a positive integer");
    pc.r = it->get<int64_t>();
  }
  if (auto it = cfg.find("lora_alpha"); it != cfg.end() && !it->is_null()) {
    if (!it->is_number()) return InvalidArgumentError("lora_alpha must be a number");
    pc.alpha = it->get<double>();
  }
  if (auto it = cfg.find("use_rslora"); it != cfg.end() && !it->is_null()) {
    if (!it->is_boolean()) return InvalidArgumentError("use_rslora must be true or false");
    pc.use_rslora = it->get<bool>();
  }
  if (auto it = cfg.find("rank_pattern"); it != cfg.end() && !it->is_null()) {
    if (!it->is_object()) return InvalidArgumentError("rank_pattern must be an object");
    for (auto& [k, v] : it->items()) {
      CHORUS_RETURN_IF_ERROR(CheckPatternKey(k, "rank_pattern"));
      if (!v.is_number_integer() || v.get<int64_t>() < 1) {
        return InvalidArgumentError("rank_pattern['" + k + "'] must be a positive integer");
      }
      pc.rank_pattern.emplace_back(k, v.get<int64_t>());
    }
  }
  if (auto it = cfg.find("alpha_pattern"); it != cfg.end() && !it->is_null()) {
    if (!it->is_object()) return InvalidArgumentError("alpha_pattern must be an object");
    for (auto& [k, v] : it->items()) {
      CHORUS_RETURN_IF_ERROR(CheckPatternKey(k, "alpha_pattern"));
      if (!v.is_number())
        return InvalidArgumentError("alpha_pattern['" + k + "'] must be a number");
      pc.alpha_pattern.emplace_back(k, v.get<double>());
    }
  }
  if (auto it = cfg.find("target_modules"); it != cfg.end() && it->is_array()) {
    for (const auto& t : *it) {
      if (!t.is_string()) return InvalidArgumentError("target_modules must hold strings");
      CHORUS_RETURN_IF_ERROR(CheckTargetModule(t.get<std::string>()));
    }
  }
  if (auto it = cfg.find("base_model_name_or_path"); it != cfg.end() && it->is_string()) {
    pc.base_model = it->get<std::string>();
  }
  return pc;
}

}  // namespace

Result<PeftTensorName> ParsePeftTensorName(const std::string& name) {
  if (Contains(name, "lora_magnitude_vector")) {
    return UnimplementedError("tensor '" + name +
                              "' is a DoRA magnitude vector; DoRA adapters are not supported");
  }
  if (Contains(name, "lora_embedding_A") || Contains(name, "lora_embedding_B") ||
      Contains(name, "embed_tokens")) {
    return UnimplementedError("tensor '" + name +
                              "': embedding LoRA / saved embeddings are not supported");
  }
  if (Contains(name, "lm_head")) {
    return UnimplementedError("tensor '" + name + "': LoRA on lm_head is not supported");
  }
  size_t ab = name.find(".lora_A.");
  bool is_a = true;
  if (ab == std::string::npos) {
    ab = name.find(".lora_B.");
    is_a = false;
  }
  if (ab == std::string::npos) {
    return InvalidArgumentError("unexpected tensor '" + name +
                                "' (a LoRA adapter holds only lora_A / lora_B weights of " +
                                kSupportedModules + ")");
  }
  const std::string tail = name.substr(ab + 8);  // after ".lora_X."
  if (tail != "weight" && !(EndsWith(tail, ".weight") && tail.find('.') == tail.size() - 7)) {
    return UnimplementedError(
        "tensor '" + name + "': only lora_A/lora_B .weight tensors are supported (no LoRA biases)");
  }
  const std::string module = name.substr(0, ab);
  // The decoder layer: the last "layers.<N>." at the start or after a '.'.
  size_t lp = std::string::npos;
  for (size_t p = module.rfind("layers."); p != std::string::npos;
       p = p == 0 ? std::string::npos : module.rfind("layers.", p - 1)) {
    if (p == 0 || module[p - 1] == '.') {
      lp = p;
      break;
    }
  }
  if (lp == std::string::npos) {
    return InvalidArgumentError(
        "tensor '" + name +
        "' names no decoder layer (expected ...layers.N.self_attn.q_proj.lora_A.weight)");
  }
  size_t pos = lp + 7;
  std::optional<int64_t> layer = ParseIndex(module, &pos);
  if (!layer) return InvalidArgumentError("tensor '" + name + "' has a malformed layer index");
  const std::string leaf = module.substr(pos);
  for (const ModuleName& m : kModules) {
    if (leaf == m.hf) return PeftTensorName{*layer, m.which, is_a, std::nullopt, leaf};
  }
  for (const FusedModuleName& m : kFusedModules) {
    if (leaf == m.hf)
      return PeftTensorName{*layer, model::LinearGroupMembers(m.group)[0], is_a, m.group, leaf};
  }
  return InvalidArgumentError("tensor '" + name + "' targets unknown module '" + leaf +
                              "' (Chorus applies LoRA to " + kSupportedModules + ")");
}

Status CheckPeftTensorDType(const std::string& st_path, const formats::SafetensorsTensorInfo& t) {
  if (t.dtype != "F32" && t.dtype != "F16" && t.dtype != "BF16") {
    return InvalidArgumentError(st_path + ": tensor '" + t.name + "' has dtype " + t.dtype +
                                " (LoRA weights must be F32, F16 or BF16)");
  }
  return OkStatus();
}

Result<PeftDir> OpenPeftDir(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const std::string st_path = (fs::path(dir) / kSafetensorsFile).string();
  const std::string cfg_path = (fs::path(dir) / kConfigFile).string();
  if (!fs::exists(st_path, ec)) {
    if (fs::exists(fs::path(dir) / kPickleFile, ec)) {
      return UnimplementedError(dir +
                                ": adapter_model.bin is a pickle file, which Chorus refuses to "
                                "load (unpickling can run code); save the adapter as safetensors "
                                "(PEFT save_pretrained(..., safe_serialization=True))");
    }
    return NotFoundError(dir + ": no " + kSafetensorsFile);
  }
  if (!fs::exists(cfg_path, ec)) return NotFoundError(dir + ": no " + kConfigFile);
  CHORUS_ASSIGN_OR_RETURN(std::string text, ReadSmallFile(cfg_path));
  auto pc_or = ParsePeftConfig(text);
  if (!pc_or.ok()) return pc_or.status().WithContext(cfg_path);
  CHORUS_ASSIGN_OR_RETURN(auto file, formats::SafetensorsFile::Open(st_path));
  return PeftDir{std::move(*pc_or), st_path, cfg_path, std::move(file)};
}

Result<std::string> PeftDirOfFile(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path p(path);
  if (p.filename() == kPickleFile || p.extension() == ".bin" || p.extension() == ".pt" ||
      p.extension() == ".pth") {
    return UnimplementedError(
        path +
        ": pickle checkpoints are refused (unpickling can run code); save the adapter as "
        "safetensors (PEFT save_pretrained(..., safe_serialization=True))");
  }
  if (p.filename() == kConfigFile || p.filename() == kSafetensorsFile) {
    return p.parent_path().empty() ? std::string(".") : p.parent_path().string();
  }
  return std::string();
}

Result<LoraWeights> ReadPeftDir(const std::string& dir, const model::ModelConfig& base,
                                const LoraLoadOptions& opts) {
  CHORUS_ASSIGN_OR_RETURN(PeftDir pd, OpenPeftDir(dir));
  const PeftConfig& pc = pd.config;
  const std::string& st_path = pd.st_path;
  const auto& file = pd.file;
  LoraWeights w = LoraWeights::Empty(base.n_layers);
  w.use_rslora = pc.use_rslora;
  w.qk_layout = kernels::RopeLayout::kHalf;
  w.base_model = pc.base_model;
  // The module path each (layer, linear) was named by in the file, for rank/alpha patterns.
  std::vector<std::string> leaf_of(static_cast<size_t>(base.n_layers * model::kNumLinears));
  for (const formats::SafetensorsTensorInfo& info : file->tensors()) {
    auto tn = ParsePeftTensorName(info.name);
    if (!tn.ok()) return tn.status().WithContext(st_path);
    CHORUS_RETURN_IF_ERROR(LayerInRange(tn->layer, base, info.name).WithContext(st_path));
    CHORUS_RETURN_IF_ERROR(CheckPeftTensorDType(st_path, info));
    CHORUS_ASSIGN_OR_RETURN(Tensor t, file->GetTensor(info.name));
    if (!tn->fused) {
      leaf_of[static_cast<size_t>(tn->layer * model::kNumLinears + static_cast<int>(tn->which))] =
          tn->leaf;
      CHORUS_RETURN_IF_ERROR(
          StoreTensor(&w, tn->layer, tn->which, tn->is_a, std::move(t), info.name)
              .WithContext(st_path));
      continue;
    }
    // A fused module: the members share lora_A; lora_B's rows split by the members' outputs.
    for (Linear m : model::LinearGroupMembers(*tn->fused))
      leaf_of[static_cast<size_t>(tn->layer * model::kNumLinears + static_cast<int>(m))] = tn->leaf;
    CHORUS_RETURN_IF_ERROR(
        StoreFusedTensor(&w, base, tn->layer, *tn->fused, tn->is_a, std::move(t), info.name)
            .WithContext(st_path));
  }
  // Ranks must agree with the config (r / rank_pattern); alphas from lora_alpha / alpha_pattern.
  for (int64_t l = 0; l < base.n_layers; ++l) {
    for (int li = 0; li < model::kNumLinears; ++li) {
      const Linear which = static_cast<Linear>(li);
      LoraModuleWeights& m = w.at(l, which);
      if (!m.present() || m.a.shape().size() != 2) continue;  // shape errors: ValidateLoraWeights
      const std::string& leaf =
          leaf_of[static_cast<size_t>(l * model::kNumLinears + static_cast<int>(which))];
      const std::string path = leaf.empty() ? "model." + LoraModuleName(l, which)
                                            : "model.layers." + std::to_string(l) + "." + leaf;
      const int64_t want_r = PatternValue(pc.rank_pattern, path, pc.r);
      m.alpha = static_cast<float>(PatternValue(pc.alpha_pattern, path, pc.alpha));
      if (m.a.shape()[0] != want_r) {
        return InvalidArgumentError(dir + ": lora_A of " + LoraModuleName(l, which) + " has rank " +
                                    std::to_string(m.a.shape()[0]) + ", adapter_config.json says " +
                                    std::to_string(want_r) + " (r / rank_pattern)");
      }
    }
  }
  CHORUS_RETURN_IF_ERROR(ValidateLoraWeights(w, base, opts.limits).WithContext(dir));
  return w;
}

}  // namespace lora_internal

using lora_internal::Converted;
using lora_internal::kConfigFile;
using lora_internal::kSafetensorsFile;
using lora_internal::PermutedB;
using model::Linear;
using ojson = nlohmann::ordered_json;

Result<LoraWeights> ReadPeftLora(const std::string& path, const model::ModelConfig& base,
                                 const LoraLoadOptions& opts) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec)) return lora_internal::ReadPeftDir(path, base, opts);
  CHORUS_ASSIGN_OR_RETURN(const std::string dir, lora_internal::PeftDirOfFile(path));
  if (!dir.empty()) return lora_internal::ReadPeftDir(dir, base, opts);
  if (!fs::exists(path, ec)) return NotFoundError(path + ": no such file or directory");
  return InvalidArgumentError(path + ": not a PEFT adapter directory");
}

Status WritePeftLora(const std::string& dir, const LoraWeights& w, const model::ModelConfig& base,
                     const PeftWriteOptions& opts) {
  namespace fs = std::filesystem;
  if (opts.dtype != DType::kF32 && opts.dtype != DType::kF16 && opts.dtype != DType::kBF16) {
    return InvalidArgumentError("PEFT adapters are written as f32, f16 or bf16");
  }
  CHORUS_RETURN_IF_ERROR(ValidateLoraWeights(w, base, LoraLimits{.max_rank = 1 << 20}));
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return InvalidArgumentError(dir + ": cannot create directory: " + ec.message());
  // r and lora_alpha: the most common values; modules that differ go into the patterns.
  std::map<int64_t, int> rank_count;
  std::map<float, int> alpha_count;
  bool present[model::kNumLinears] = {};
  for (int64_t l = 0; l < w.n_layers; ++l)
    for (int li = 0; li < model::kNumLinears; ++li) {
      const auto& m = w.at(l, static_cast<Linear>(li));
      if (!m.present()) continue;
      present[li] = true;
      ++rank_count[m.rank()];
      ++alpha_count[m.alpha];
    }
  auto most = [](const auto& counts) {
    auto best = counts.begin();
    for (auto it = counts.begin(); it != counts.end(); ++it)
      if (it->second > best->second) best = it;
    return best->first;
  };
  const int64_t r = most(rank_count);
  const float alpha = most(alpha_count);
  ojson rank_pattern = ojson::object(), alpha_pattern = ojson::object();
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (int li = 0; li < model::kNumLinears; ++li) {  // PEFT writes module by module
    for (int64_t l = 0; l < w.n_layers; ++l) {
      const Linear which = static_cast<Linear>(li);
      const auto& m = w.at(l, which);
      if (!m.present()) continue;
      const std::string path = "model." + LoraModuleName(l, which);
      if (m.rank() != r) rank_pattern[path] = m.rank();
      if (m.alpha != alpha) alpha_pattern[path] = m.alpha;
      const std::string prefix = "base_model.model." + path;
      CHORUS_ASSIGN_OR_RETURN(Tensor a, Converted(m.a, opts.dtype));
      CHORUS_ASSIGN_OR_RETURN(
          Tensor b, Converted(PermutedB(m.b, base, which, w.qk_layout, kernels::RopeLayout::kHalf),
                              opts.dtype));
      tensors.emplace_back(prefix + ".lora_A.weight", std::move(a));
      tensors.emplace_back(prefix + ".lora_B.weight", std::move(b));
    }
  }
  ojson targets = ojson::array();
  for (int li = 0; li < model::kNumLinears; ++li)
    if (present[li]) targets.push_back(model::LinearName(static_cast<Linear>(li)));
  ojson cfg = ojson::object();
  cfg["peft_type"] = "LORA";
  cfg["task_type"] = "CAUSAL_LM";
  cfg["base_model_name_or_path"] =
      opts.base_model_name.empty() ? w.base_model : opts.base_model_name;
  cfg["r"] = r;
  cfg["lora_alpha"] = alpha;
  cfg["lora_dropout"] = 0.0;
  cfg["bias"] = "none";
  cfg["use_rslora"] = w.use_rslora;
  cfg["use_dora"] = false;
  cfg["fan_in_fan_out"] = false;
  cfg["modules_to_save"] = nullptr;
  cfg["target_modules"] = targets;
  cfg["rank_pattern"] = rank_pattern;
  cfg["alpha_pattern"] = alpha_pattern;
  // Each file atomically (temp file, fsync, rename); the weights last, so that a directory with
  // adapter_model.safetensors was written to the end (docs/finetuning.md, "Durability"). Temp
  // files of a killed earlier writer of this directory go first, once that writer is gone.
  RemoveDeadWritersTempFilesIn(dir);
  CHORUS_RETURN_IF_ERROR(
      WriteFileAtomically((fs::path(dir) / kConfigFile).string(), cfg.dump(2) + "\n"));
  CHORUS_RETURN_IF_ERROR(formats::WriteSafetensors((fs::path(dir) / kSafetensorsFile).string(),
                                                   tensors, {{"format", "pt"}}));
  return OkStatus();
}

}  // namespace chorus::adapters
