#include "chorus/adapters/lora/lora_files.h"

#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "chorus/formats/gguf.h"
#include "chorus/formats/safetensors.h"
#include "chorus/model/convert.h"

namespace chorus::adapters {
namespace {

using model::Linear;
using ojson = nlohmann::ordered_json;

constexpr const char* kConfigFile = "adapter_config.json";
constexpr const char* kSafetensorsFile = "adapter_model.safetensors";
constexpr const char* kPickleFile = "adapter_model.bin";
constexpr int64_t kMaxConfigBytes = 1 << 20;
constexpr const char* kSupportedModules =
    "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj";

// PEFT module suffix ("self_attn.q_proj") → linear.
struct ModuleName {
  const char* hf;    // path inside a decoder layer
  const char* gguf;  // llama.cpp tensor name inside blk.N
  Linear which;
};
constexpr ModuleName kModules[] = {
    {"self_attn.q_proj", "attn_q.weight", Linear::kQ},
    {"self_attn.k_proj", "attn_k.weight", Linear::kK},
    {"self_attn.v_proj", "attn_v.weight", Linear::kV},
    {"self_attn.o_proj", "attn_output.weight", Linear::kO},
    {"mlp.gate_proj", "ffn_gate.weight", Linear::kGate},
    {"mlp.up_proj", "ffn_up.weight", Linear::kUp},
    {"mlp.down_proj", "ffn_down.weight", Linear::kDown},
};

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
bool Contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

// Parses "<digits>" at s[pos..] up to '.', bounded (≤ 9 digits). Returns the index and moves pos
// past the dot.
std::optional<int64_t> ParseIndex(const std::string& s, size_t* pos) {
  size_t p = *pos;
  int64_t v = 0;
  int digits = 0;
  while (p < s.size() && s[p] >= '0' && s[p] <= '9') {
    if (++digits > 9) return std::nullopt;
    v = v * 10 + (s[p] - '0');
    ++p;
  }
  if (digits == 0 || p >= s.size() || s[p] != '.') return std::nullopt;
  *pos = p + 1;
  return v;
}

Status LayerInRange(int64_t layer, const model::ModelConfig& base, const std::string& tensor) {
  if (layer >= base.n_layers) {
    return InvalidArgumentError("tensor '" + tensor + "' is for layer " + std::to_string(layer) +
                                ", the base model has " + std::to_string(base.n_layers) +
                                " layers (hint: adapter for another base model?)");
  }
  return OkStatus();
}

Status StoreTensor(LoraWeights* w, int64_t layer, Linear which, bool is_a, Tensor t,
                   const std::string& tensor) {
  LoraModuleWeights& m = w->at(layer, which);
  Tensor& slot = is_a ? m.a : m.b;
  if (!slot.empty()) {
    return InvalidArgumentError("duplicate " + std::string(is_a ? "lora_A" : "lora_B") + " for " +
                                LoraModuleName(layer, which) + " (tensor '" + tensor + "')");
  }
  slot = std::move(t);
  return OkStatus();
}

// ---- PEFT ----

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
bool PatternMatches(const std::string& key, const std::string& module_path) {
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

// A target_modules entry Chorus can apply: one of the seven names, possibly with a path prefix.
Status CheckTargetModule(const std::string& t) {
  for (const ModuleName& m : kModules) {
    const std::string leaf = std::string(m.hf).substr(std::string(m.hf).find('.') + 1);
    if (t == leaf || EndsWith(t, "." + leaf)) return OkStatus();
  }
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

struct PeftTensorName {
  int64_t layer = 0;
  Linear which = Linear::kQ;
  bool is_a = true;
};

// "<prefix>layers.N.self_attn.q_proj.lora_A[.<adapter>].weight" → (N, q, A); anything else is
// an error naming what Chorus does not support.
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
    if (leaf == m.hf) return PeftTensorName{*layer, m.which, is_a};
  }
  return InvalidArgumentError("tensor '" + name + "' targets unknown module '" + leaf +
                              "' (Chorus applies LoRA to " + kSupportedModules + ")");
}

// A PEFT adapter directory, opened: its parsed adapter_config.json and its safetensors file.
struct PeftDir {
  PeftConfig config;
  std::string st_path;   // the safetensors file's path (for error context)
  std::string cfg_path;  // adapter_config.json's path
  std::shared_ptr<const formats::SafetensorsFile> file;
};

// Opens dir's adapter_config.json and adapter_model.safetensors (shared by the reader and the
// inspector); a pickle adapter_model.bin is refused by name.
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
  for (const formats::SafetensorsTensorInfo& info : file->tensors()) {
    auto tn = ParsePeftTensorName(info.name);
    if (!tn.ok()) return tn.status().WithContext(st_path);
    CHORUS_RETURN_IF_ERROR(LayerInRange(tn->layer, base, info.name).WithContext(st_path));
    if (info.dtype != "F32" && info.dtype != "F16" && info.dtype != "BF16") {
      return InvalidArgumentError(st_path + ": tensor '" + info.name + "' has dtype " + info.dtype +
                                  " (LoRA weights must be F32, F16 or BF16)");
    }
    CHORUS_ASSIGN_OR_RETURN(Tensor t, file->GetTensor(info.name));
    CHORUS_RETURN_IF_ERROR(StoreTensor(&w, tn->layer, tn->which, tn->is_a, std::move(t), info.name)
                               .WithContext(st_path));
  }
  // Ranks must agree with the config (r / rank_pattern); alphas from lora_alpha / alpha_pattern.
  for (int64_t l = 0; l < base.n_layers; ++l) {
    for (int li = 0; li < model::kNumLinears; ++li) {
      const Linear which = static_cast<Linear>(li);
      LoraModuleWeights& m = w.at(l, which);
      if (!m.present() || m.a.shape().size() != 2) continue;  // shape errors: ValidateLoraWeights
      const std::string path = "model." + LoraModuleName(l, which);
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

// One tensor of a llama.cpp LoRA GGUF: "blk.<layer>.<module>.weight.lora_a|lora_b".
struct GgufLoraTensor {
  bool skip = false;  // a norm tensor: ignored, as llama.cpp does
  bool is_a = false;
  int64_t layer = 0;  // not yet checked against a base model
  Linear which = Linear::kQ;
  DType dtype = DType::kF32;
};

// Decodes a tensor name and type of a GGUF LoRA file; errors name `path` and the tensor.
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
  if (mod == nullptr) {
    return InvalidArgumentError(path + ": tensor '" + name + "' targets unknown module '" + leaf +
                                "' (Chorus applies LoRA to attn_q, attn_k, attn_v, attn_output, "
                                "ffn_gate, ffn_up, ffn_down)");
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

// ---- GGUF ----

Result<LoraWeights> ReadGgufFile(const std::string& path, const model::ModelConfig& base,
                                 const LoraLoadOptions& opts) {
  CHORUS_ASSIGN_OR_RETURN(auto file, formats::GgufFile::Open(path));
  auto type = file->GetString("general.type");
  if (!type.ok() || *type != "adapter") {
    return InvalidArgumentError(
        path + ": general.type is " + (type.ok() ? "'" + *type + "'" : "missing") +
        ", expected 'adapter' (is this a base model rather than a LoRA file?)");
  }
  auto atype = file->GetString("adapter.type");
  if (!atype.ok() || *atype != "lora") {
    return UnimplementedError(path + ": adapter.type is " +
                              (atype.ok() ? "'" + *atype + "'" : "missing") +
                              ", only 'lora' is supported");
  }
  auto arch = file->GetString("general.architecture");
  if (!arch.ok() || *arch != base.arch) {
    return InvalidArgumentError(path + ": adapter architecture " +
                                (arch.ok() ? "'" + *arch + "'" : "missing") +
                                " does not match the base model's '" + base.arch + "'");
  }
  double alpha = 0;
  if (file->Has("adapter.lora.alpha")) {
    CHORUS_ASSIGN_OR_RETURN(alpha, file->GetFloat("adapter.lora.alpha"));
    if (!std::isfinite(alpha))
      return InvalidArgumentError(path + ": adapter.lora.alpha is not finite");
  }
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

// lora_B with q/k rows moved from pair order `from` to `to`.
Tensor PermutedB(const Tensor& b, const model::ModelConfig& base, Linear which,
                 kernels::RopeLayout from, kernels::RopeLayout to) {
  const int64_t heads = which == Linear::kQ   ? base.n_heads
                        : which == Linear::kK ? base.n_kv_heads
                                              : 0;
  if (heads == 0 || from == to) return b;
  return model::PermuteRopeRows(b, heads, base.head_dim, from, to);
}

Result<Tensor> Converted(const Tensor& t, DType dtype) {
  if (t.dtype() == dtype) return t;
  const std::vector<float> f = t.ToF32();
  if (DTypeIsQuantized(dtype) && t.shape().back() % kQuantBlock != 0) {
    return InvalidArgumentError("cannot store a row of " + std::to_string(t.shape().back()) +
                                " values as " + std::string(DTypeName(dtype)));
  }
  return Tensor::FromF32(f, dtype, t.shape());
}

}  // namespace

Result<LoraWeights> ReadPeftLora(const std::string& path, const model::ModelConfig& base,
                                 const LoraLoadOptions& opts) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec)) return ReadPeftDir(path, base, opts);
  const fs::path p(path);
  if (p.filename() == kPickleFile || p.extension() == ".bin" || p.extension() == ".pt" ||
      p.extension() == ".pth") {
    return UnimplementedError(
        path +
        ": pickle checkpoints are refused (unpickling can run code); save the adapter as "
        "safetensors (PEFT save_pretrained(..., safe_serialization=True))");
  }
  if (p.filename() == kConfigFile || p.filename() == kSafetensorsFile) {
    return ReadPeftDir(p.parent_path().empty() ? "." : p.parent_path().string(), base, opts);
  }
  if (!fs::exists(p, ec)) return NotFoundError(path + ": no such file or directory");
  return InvalidArgumentError(path + ": not a PEFT adapter directory");
}

Result<LoraWeights> ReadGgufLora(const std::string& path, const model::ModelConfig& base,
                                 const LoraLoadOptions& opts) {
  return ReadGgufFile(path, base, opts);
}

Result<LoraWeights> ReadLora(const std::string& path, const model::ModelConfig& base,
                             const LoraLoadOptions& opts) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec)) return ReadPeftDir(path, base, opts);
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFoundError(path + ": cannot open");
  char magic[4] = {0, 0, 0, 0};
  in.read(magic, 4);
  if (in.gcount() == 4 && std::string(magic, 4) == "GGUF") return ReadGgufFile(path, base, opts);
  return ReadPeftLora(path, base, opts);
}

Result<std::shared_ptr<const LoraAdapter>> LoadLoraAdapter(const std::string& path,
                                                           const model::ModelConfig& base,
                                                           const LoraLoadOptions& opts,
                                                           std::string name) {
  CHORUS_ASSIGN_OR_RETURN(LoraWeights w, ReadLora(path, base, opts));
  auto ad =
      LoraAdapter::Build(w, base, name.empty() ? path : std::move(name), opts.limits, opts.id);
  if (!ad.ok()) return ad.status().WithContext(path);
  return ad;
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
  CHORUS_RETURN_IF_ERROR(formats::WriteSafetensors((fs::path(dir) / kSafetensorsFile).string(),
                                                   tensors, {{"format", "pt"}}));
  const std::string cfg_path = (fs::path(dir) / kConfigFile).string();
  const std::string tmp = cfg_path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << cfg.dump(2) << "\n";
    if (!out) return InternalError(tmp + ": write failed");
  }
  fs::rename(tmp, cfg_path, ec);
  if (ec) return InternalError(cfg_path + ": rename failed: " + ec.message());
  return OkStatus();
}

Status WriteGgufLora(const std::string& path, const LoraWeights& w, const model::ModelConfig& base,
                     const GgufLoraWriteOptions& opts) {
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

// ---- Inspection and synthetic sets ----

namespace chorus::adapters {
namespace {

// Per (layer, linear) what the tensor headers say, before summarizing.
struct ModuleProbe {
  int64_t a_rows = -1, a_cols = 0, b_rows = 0, b_cols = -1;
  std::string a_dtype, b_dtype;
  float alpha = 0;
};

const char* HfLeaf(Linear which) {
  for (const ModuleName& m : kModules) {
    if (m.which == which) return std::strchr(m.hf, '.') + 1;
  }
  return "?";
}

int64_t FileBytes(const std::string& path) {
  std::error_code ec;
  const auto n = std::filesystem::file_size(path, ec);
  return ec ? 0 : static_cast<int64_t>(n);
}

Status Summarize(const std::string& where, std::map<std::pair<int64_t, int>, ModuleProbe>& probes,
                 LoraFileInfo* info) {
  std::map<int, LoraModuleSummary> by_linear;
  for (auto& [key, p] : probes) {
    const auto [layer, li] = key;
    const Linear which = static_cast<Linear>(li);
    const std::string mname = LoraModuleName(layer, which);
    if (p.a_rows < 0)
      return InvalidArgumentError(where + ": " + mname + " has lora_B but no lora_A");
    if (p.b_cols < 0)
      return InvalidArgumentError(where + ": " + mname + " has lora_A but no lora_B");
    if (p.a_rows != p.b_cols) {
      return InvalidArgumentError(where + ": " + mname + ": lora_A has rank " +
                                  std::to_string(p.a_rows) + ", lora_B has rank " +
                                  std::to_string(p.b_cols));
    }
    if (p.a_rows < 1) return InvalidArgumentError(where + ": " + mname + " has rank 0");
    LoraModuleSummary& s = by_linear[li];
    if (s.layers == 0) {
      s.name = HfLeaf(which);
      s.in = p.a_cols;
      s.out = p.b_rows;
      s.dtype = p.a_dtype == p.b_dtype ? p.a_dtype : p.a_dtype + "/" + p.b_dtype;
    } else {
      if (s.in != p.a_cols || s.out != p.b_rows) {
        return InvalidArgumentError(where + ": " + mname + " has shape [" +
                                    std::to_string(p.b_rows) + " ← " + std::to_string(p.a_cols) +
                                    "], other layers' " + s.name + " [" + std::to_string(s.out) +
                                    " ← " + std::to_string(s.in) + "]");
      }
      const std::string d = p.a_dtype == p.b_dtype ? p.a_dtype : p.a_dtype + "/" + p.b_dtype;
      if (d != s.dtype) s.dtype = "mixed";
    }
    ++s.layers;
    ++s.ranks[p.a_rows];
    ++s.alphas[p.alpha];
    info->n_layers = std::max(info->n_layers, layer + 1);
  }
  for (auto& [li, s] : by_linear) info->modules.push_back(std::move(s));
  if (info->modules.empty()) return InvalidArgumentError(where + ": no LoRA tensors");
  return OkStatus();
}

std::string LowerDType(std::string d) {
  for (char& c : d) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return d;
}

Result<LoraFileInfo> InspectPeftDir(const std::string& dir) {
  CHORUS_ASSIGN_OR_RETURN(PeftDir pd, OpenPeftDir(dir));
  const PeftConfig& pc = pd.config;
  const std::string& st_path = pd.st_path;
  const auto& file = pd.file;
  LoraFileInfo info;
  info.path = dir;
  info.format = "peft";
  info.base_model = pc.base_model;
  info.use_rslora = pc.use_rslora;
  info.config_r = pc.r;
  info.config_alpha = pc.alpha;
  info.file_bytes = FileBytes(st_path) + FileBytes(pd.cfg_path);
  std::map<std::pair<int64_t, int>, ModuleProbe> probes;
  for (const formats::SafetensorsTensorInfo& t : file->tensors()) {
    auto tn = ParsePeftTensorName(t.name);
    if (!tn.ok()) return tn.status().WithContext(st_path);
    if (t.dtype != "F32" && t.dtype != "F16" && t.dtype != "BF16") {
      return InvalidArgumentError(st_path + ": tensor '" + t.name + "' has dtype " + t.dtype +
                                  " (LoRA weights must be F32, F16 or BF16)");
    }
    if (t.shape.size() != 2) {
      return InvalidArgumentError(st_path + ": tensor '" + t.name + "' is not a matrix");
    }
    ModuleProbe& p = probes[{tn->layer, static_cast<int>(tn->which)}];
    if ((tn->is_a && p.a_rows >= 0) || (!tn->is_a && p.b_cols >= 0)) {
      return InvalidArgumentError(st_path + ": duplicate tensor for " +
                                  LoraModuleName(tn->layer, tn->which));
    }
    if (tn->is_a) {
      p.a_rows = t.shape[0];
      p.a_cols = t.shape[1];
      p.a_dtype = LowerDType(t.dtype);
    } else {
      p.b_rows = t.shape[0];
      p.b_cols = t.shape[1];
      p.b_dtype = LowerDType(t.dtype);
    }
    ++info.n_tensors;
    info.tensor_bytes += static_cast<int64_t>(t.end - t.begin);
  }
  for (auto& [key, p] : probes) {
    const Linear which = static_cast<Linear>(key.second);
    const std::string path = "model." + LoraModuleName(key.first, which);
    const int64_t want_r = PatternValue(pc.rank_pattern, path, pc.r);
    p.alpha = static_cast<float>(PatternValue(pc.alpha_pattern, path, pc.alpha));
    if (p.a_rows >= 0 && p.a_rows != want_r) {
      return InvalidArgumentError(dir + ": lora_A of " + LoraModuleName(key.first, which) +
                                  " has rank " + std::to_string(p.a_rows) +
                                  ", adapter_config.json says " + std::to_string(want_r) +
                                  " (r / rank_pattern)");
    }
  }
  CHORUS_RETURN_IF_ERROR(Summarize(dir, probes, &info));
  return info;
}

Result<LoraFileInfo> InspectGguf(const std::string& path) {
  CHORUS_ASSIGN_OR_RETURN(auto file, formats::GgufFile::Open(path));
  auto type = file->GetString("general.type");
  if (!type.ok() || *type != "adapter") {
    return InvalidArgumentError(
        path + ": general.type is " + (type.ok() ? "'" + *type + "'" : "missing") +
        ", expected 'adapter' (is this a base model rather than a LoRA file?)");
  }
  auto atype = file->GetString("adapter.type");
  if (!atype.ok() || *atype != "lora") {
    return UnimplementedError(path + ": adapter.type is " +
                              (atype.ok() ? "'" + *atype + "'" : "missing") +
                              ", only 'lora' is supported");
  }
  LoraFileInfo info;
  info.path = path;
  info.format = "gguf";
  if (auto a = file->GetString("general.architecture"); a.ok()) info.architecture = *a;
  for (const char* key : {"general.basename", "general.name"}) {
    if (auto b = file->GetString(key); b.ok() && info.base_model.empty()) info.base_model = *b;
  }
  if (file->Has("adapter.lora.alpha")) {
    CHORUS_ASSIGN_OR_RETURN(info.config_alpha, file->GetFloat("adapter.lora.alpha"));
    if (!std::isfinite(info.config_alpha))
      return InvalidArgumentError(path + ": adapter.lora.alpha is not finite");
  }
  info.file_bytes = FileBytes(path);
  std::map<std::pair<int64_t, int>, ModuleProbe> probes;
  for (const formats::GgufTensorInfo& t : file->tensors()) {
    const std::string& name = t.name;
    CHORUS_ASSIGN_OR_RETURN(GgufLoraTensor g, ParseGgufLoraTensor(path, name, t.ggml_type));
    if (g.skip) continue;
    if (t.shape.size() != 2)
      return InvalidArgumentError(path + ": tensor '" + name + "' is not a matrix");
    ModuleProbe& p = probes[{g.layer, static_cast<int>(g.which)}];
    if ((g.is_a && p.a_rows >= 0) || (!g.is_a && p.b_cols >= 0)) {
      return InvalidArgumentError(path + ": duplicate tensor '" + name + "'");
    }
    const std::string d(DTypeName(g.dtype));
    if (g.is_a) {
      p.a_rows = t.shape[0];
      p.a_cols = t.shape[1];
      p.a_dtype = d;
    } else {
      p.b_rows = t.shape[0];
      p.b_cols = t.shape[1];
      p.b_dtype = d;
    }
    ++info.n_tensors;
    info.tensor_bytes += static_cast<int64_t>(t.n_bytes);
  }
  for (auto& [key, p] : probes) {
    p.alpha = info.config_alpha == 0 ? static_cast<float>(std::max<int64_t>(p.a_rows, 0))
                                     : static_cast<float>(info.config_alpha);
  }
  CHORUS_RETURN_IF_ERROR(Summarize(path, probes, &info));
  return info;
}

}  // namespace

Result<LoraFileInfo> InspectLoraFile(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec)) return InspectPeftDir(path);
  const fs::path p(path);
  if (p.filename() == kPickleFile || p.extension() == ".bin" || p.extension() == ".pt" ||
      p.extension() == ".pth") {
    return UnimplementedError(
        path +
        ": pickle checkpoints are refused (unpickling can run code); save the adapter as "
        "safetensors (PEFT save_pretrained(..., safe_serialization=True))");
  }
  if (p.filename() == kConfigFile || p.filename() == kSafetensorsFile) {
    return InspectPeftDir(p.parent_path().empty() ? "." : p.parent_path().string());
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFoundError(path + ": cannot open");
  char magic[4] = {0, 0, 0, 0};
  in.read(magic, 4);
  if (in.gcount() == 4 && std::string(magic, 4) == "GGUF") return InspectGguf(path);
  return InvalidArgumentError(path + ": neither a PEFT adapter directory nor a GGUF file");
}

Result<int64_t> WriteSyntheticLoraSet(const std::string& dir, const model::ModelConfig& base,
                                      const SyntheticLoraSetOptions& opts,
                                      const std::function<void(int64_t)>& progress) {
  namespace fs = std::filesystem;
  if (opts.count < 1) return InvalidArgumentError("adapter count must be at least 1");
  if (opts.distinct < 0) return InvalidArgumentError("distinct adapter count must not be negative");
  if (opts.ranks.empty()) return InvalidArgumentError("no LoRA ranks given");
  for (int64_t r : opts.ranks) {
    if (r < 1 || r > 256)
      return InvalidArgumentError("LoRA rank " + std::to_string(r) + " is outside [1, 256]");
  }
  if (opts.targets.empty()) return InvalidArgumentError("no target modules given");
  if (opts.dtype != DType::kF32 && opts.dtype != DType::kF16 && opts.dtype != DType::kBF16) {
    return InvalidArgumentError("PEFT adapters are written as f32, f16 or bf16");
  }
  const int64_t distinct = opts.distinct == 0 ? opts.count : std::min(opts.distinct, opts.count);
  if (distinct % static_cast<int64_t>(opts.ranks.size()) != 0 && distinct < opts.count) {
    return InvalidArgumentError(
        "the distinct adapter count must be a multiple of the number of ranks, so each linked "
        "adapter keeps its rank");
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return InternalError(dir + ": cannot create: " + ec.message());
  const int width = static_cast<int>(std::to_string(opts.count - 1).size());
  auto name_of = [&](int64_t i) {
    std::string n = std::to_string(i);
    return (fs::path(dir) /
            (opts.prefix + std::string(static_cast<size_t>(width) - n.size(), '0') + n))
        .string();
  };
  int64_t bytes = 0;
  for (int64_t i = 0; i < opts.count; ++i) {
    const std::string out = name_of(i);
    if (i < distinct) {
      RandomLoraSpec spec;
      spec.rank = opts.ranks[static_cast<size_t>(i) % opts.ranks.size()];
      spec.alpha = 2.0f * static_cast<float>(spec.rank);
      spec.targets = opts.targets;
      spec.seed = opts.seed + static_cast<uint64_t>(i);
      PeftWriteOptions wo;
      wo.dtype = opts.dtype;
      wo.base_model_name = opts.base_model_name;
      CHORUS_RETURN_IF_ERROR(WritePeftLora(out, MakeRandomLora(base, spec), base, wo));
      bytes += FileBytes((fs::path(out) / kSafetensorsFile).string()) +
               FileBytes((fs::path(out) / kConfigFile).string());
    } else {
      const std::string src = name_of(i % distinct);
      fs::create_directories(out, ec);
      if (ec) return InternalError(out + ": cannot create: " + ec.message());
      for (const char* f : {kConfigFile, kSafetensorsFile}) {
        const fs::path to = fs::path(out) / f;
        fs::remove(to, ec);
        fs::create_hard_link(fs::path(src) / f, to, ec);
        if (ec) return InternalError(to.string() + ": cannot hard-link: " + ec.message());
      }
    }
    if (progress) progress(i);
  }
  return bytes;
}

}  // namespace chorus::adapters
