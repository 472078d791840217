// Helpers every LoRA file codec may use (declared in lora_files_internal.h): tensor-name index
// parsing, storing a tensor into LoraWeights, q/k row order and dtype conversion for writers,
// file sizes and the GGUF magic.
#include "chorus/adapters/lora/lora_files_internal.h"

#include <filesystem>
#include <fstream>

#include "chorus/model/convert.h"

namespace chorus::adapters::lora_internal {

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

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

Status StoreTensor(LoraWeights* w, int64_t layer, model::Linear which, bool is_a, Tensor t,
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

Status StoreFusedTensor(LoraWeights* w, const model::ModelConfig& base, int64_t layer,
                        model::LinearGroup group, bool is_a, Tensor t, const std::string& tensor) {
  const auto members = model::LinearGroupMembers(group);
  int64_t total = 0;
  for (model::Linear m : members) total += model::LinearOut(base, m);
  if (!is_a && (t.shape().size() != 2 || t.shape()[0] != total)) {
    return InvalidArgumentError("lora_B '" + tensor + "' has shape " + t.view().ShapeString() +
                                ", expected " + std::to_string(total) +
                                " rows (the fused module's outputs)");
  }
  int64_t row = 0;
  for (model::Linear m : members) {
    Tensor part = t;
    if (!is_a) {
      part = t.Rows(row, row + model::LinearOut(base, m));
      row += model::LinearOut(base, m);
    }
    CHORUS_RETURN_IF_ERROR(StoreTensor(w, layer, m, is_a, std::move(part), tensor));
  }
  return OkStatus();
}

Tensor PermutedB(const Tensor& b, const model::ModelConfig& base, model::Linear which,
                 kernels::RopeLayout from, kernels::RopeLayout to) {
  const int64_t heads = which == model::Linear::kQ   ? base.n_heads
                        : which == model::Linear::kK ? base.n_kv_heads
                                                     : 0;
  if (heads == 0 || from == to) return b;
  return model::PermuteRopeRows(b, heads, base.head_dim, from, to);
}

Result<Tensor> Converted(const Tensor& t, DType dtype) {
  if (t.dtype() == dtype) return t;
  const std::vector<float> f = t.ToF32();
  if (DTypeIsQuantized(dtype) && t.shape().back() % DTypeBlockElems(dtype) != 0) {
    return InvalidArgumentError("cannot store a row of " + std::to_string(t.shape().back()) +
                                " values as " + std::string(DTypeName(dtype)));
  }
  return Tensor::FromF32(f, dtype, t.shape());
}

int64_t FileBytes(const std::string& path) {
  std::error_code ec;
  const auto n = std::filesystem::file_size(path, ec);
  return ec ? 0 : static_cast<int64_t>(n);
}

Result<bool> StartsWithGgufMagic(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFoundError(path + ": cannot open");
  char magic[4] = {0, 0, 0, 0};
  in.read(magic, 4);
  return in.gcount() == 4 && std::string(magic, 4) == "GGUF";
}

}  // namespace chorus::adapters::lora_internal
