// Inspection without a base model (`chorus inspect` on adapter files): what a PEFT directory or
// a GGUF LoRA says about itself, from its config and tensor headers (no weights decoded).
#include <algorithm>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <map>
#include <utility>
#include <vector>

#include "chorus/adapters/lora/lora_files.h"
#include "chorus/adapters/lora/lora_files_internal.h"

namespace chorus::adapters {
namespace {

using lora_internal::FileBytes;
using lora_internal::GgufLoraTensor;
using lora_internal::kModules;
using lora_internal::ModuleName;
using lora_internal::ParseGgufLoraTensor;
using lora_internal::ParsePeftTensorName;
using lora_internal::PatternValue;
using model::Linear;

// Per (layer, linear) what the tensor headers say, before summarizing.
struct ModuleProbe {
  int64_t a_rows = -1, a_cols = 0, b_rows = 0, b_cols = -1;
  std::string a_dtype, b_dtype;
  float alpha = 0;
  std::string leaf;  // the file's module name when it is a fused one ("qkv_proj"), else empty

  // Records the header of the lora_A (is_a) or lora_B matrix `shape` ([rows, cols]).
  void Record(bool is_a, const std::vector<int64_t>& shape, std::string dtype) {
    if (is_a) {
      a_rows = shape[0];
      a_cols = shape[1];
      a_dtype = std::move(dtype);
    } else {
      b_rows = shape[0];
      b_cols = shape[1];
      b_dtype = std::move(dtype);
    }
  }
};

const char* HfLeaf(Linear which) {
  for (const ModuleName& m : kModules) {
    if (m.which == which) return std::strchr(m.hf, '.') + 1;
  }
  return "?";
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
      s.name = p.leaf.empty() ? HfLeaf(which) : p.leaf;
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
  CHORUS_ASSIGN_OR_RETURN(lora_internal::PeftDir pd, lora_internal::OpenPeftDir(dir));
  const lora_internal::PeftConfig& pc = pd.config;
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
    CHORUS_RETURN_IF_ERROR(lora_internal::CheckPeftTensorDType(st_path, t));
    if (t.shape.size() != 2) {
      return InvalidArgumentError(st_path + ": tensor '" + t.name + "' is not a matrix");
    }
    ModuleProbe& p = probes[{tn->layer, static_cast<int>(tn->which)}];
    if ((tn->is_a && p.a_rows >= 0) || (!tn->is_a && p.b_cols >= 0)) {
      return InvalidArgumentError(st_path + ": duplicate tensor for " +
                                  LoraModuleName(tn->layer, tn->which));
    }
    p.Record(tn->is_a, t.shape, LowerDType(t.dtype));
    // A fused module (Phi-3's qkv_proj / gate_up_proj) is shown under its own name: it is
    // recorded at its group's first member, with the fused height as its output.
    if (tn->fused) p.leaf = tn->leaf.substr(tn->leaf.find('.') + 1);
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
  CHORUS_RETURN_IF_ERROR(lora_internal::CheckGgufLoraHeader(*file, path));
  LoraFileInfo info;
  info.path = path;
  info.format = "gguf";
  if (auto a = file->GetString("general.architecture"); a.ok()) info.architecture = *a;
  for (const char* key : {"general.basename", "general.name"}) {
    if (auto b = file->GetString(key); b.ok() && info.base_model.empty()) info.base_model = *b;
  }
  CHORUS_ASSIGN_OR_RETURN(info.config_alpha, lora_internal::GgufLoraAlpha(*file, path));
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
    p.Record(g.is_a, t.shape, std::string(DTypeName(g.dtype)));
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
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return InspectPeftDir(path);
  CHORUS_ASSIGN_OR_RETURN(const std::string dir, lora_internal::PeftDirOfFile(path));
  if (!dir.empty()) return InspectPeftDir(dir);
  CHORUS_ASSIGN_OR_RETURN(const bool gguf, lora_internal::StartsWithGgufMagic(path));
  if (gguf) return InspectGguf(path);
  return InvalidArgumentError(path + ": neither a PEFT adapter directory nor a GGUF file");
}

}  // namespace chorus::adapters
