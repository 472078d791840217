#include "chorus/adapters/lora/lora_tp.h"

#include <cstring>
#include <string>

#include "chorus/model/tensor_parallel.h"

namespace chorus::adapters {
namespace {

// Columns [c0, c1) of a 2-D tensor, copied.
Result<Tensor> Columns(const Tensor& t, int64_t c0, int64_t c1, const std::string& name) {
  const int64_t block = DTypeBlockElems(t.dtype());
  if (c0 % block != 0 || c1 % block != 0) {
    return InvalidArgumentError(name + " (" + std::string(DTypeName(t.dtype())) + ") cannot be " +
                                "split for tensor parallelism at column " + std::to_string(c0) +
                                ": not on a block of " + std::to_string(block));
  }
  const TensorView& v = t.view();
  Tensor out = Tensor::Zeros(t.dtype(), {v.shape[0], c1 - c0});
  const int64_t off = DTypeBytes(t.dtype(), c0), bytes = DTypeBytes(t.dtype(), c1 - c0);
  auto* dst = static_cast<uint8_t*>(out.mutable_data());
  for (int64_t r = 0; r < v.shape[0]; ++r)
    std::memcpy(dst + r * bytes, v.Row(r) + off, static_cast<size_t>(bytes));
  return out;
}

}  // namespace

Result<LoraWeights> ShardLoraWeights(const LoraWeights& w, const model::ModelConfig& base, int rank,
                                     int size) {
  if (size == 1) return w;
  CHORUS_RETURN_IF_ERROR(ValidateLoraWeights(w, base));
  CHORUS_ASSIGN_OR_RETURN(model::ModelConfig sc, model::ShardConfig(base, size));
  LoraWeights out = w;
  for (int64_t l = 0; l < w.n_layers; ++l) {
    for (int li = 0; li < model::kNumLinears; ++li) {
      const auto which = static_cast<model::Linear>(li);
      LoraModuleWeights& m = out.at(l, which);
      if (!m.present()) continue;
      if (which == model::Linear::kO || which == model::Linear::kDown) {
        const int64_t part = model::LinearIn(sc, which);
        CHORUS_ASSIGN_OR_RETURN(m.a, Columns(m.a, rank * part, (rank + 1) * part,
                                             "lora_A of " + LoraModuleName(l, which)));
      } else {
        const int64_t part = model::LinearOut(sc, which);
        m.b = m.b.Rows(rank * part, (rank + 1) * part);
      }
    }
  }
  return out;
}

Result<std::shared_ptr<const LoraAdapter>> LoadLoraAdapterShard(const std::string& path,
                                                                const model::ModelConfig& full,
                                                                int rank, int size,
                                                                const LoraLoadOptions& opts,
                                                                std::string name) {
  if (size == 1) return LoadLoraAdapter(path, full, opts, std::move(name));
  CHORUS_ASSIGN_OR_RETURN(LoraWeights w, ReadLora(path, full, opts));
  auto shard = ShardLoraWeights(w, full, rank, size);
  if (!shard.ok()) return shard.status().WithContext(path);
  CHORUS_ASSIGN_OR_RETURN(model::ModelConfig sc, model::ShardConfig(full, size));
  auto ad =
      LoraAdapter::Build(*shard, sc, name.empty() ? path : std::move(name), opts.limits, opts.id);
  if (!ad.ok()) return ad.status().WithContext(path);
  return ad;
}

LoraSlotHook::LoraSlotHook(const model::ModelConfig& config, int64_t max_rows,
                           std::vector<std::shared_ptr<const LoraAdapter>> table)
    : table_(std::move(table)), hook_(config, max_rows) {
  rows_.reserve(static_cast<size_t>(max_rows));
}

Result<const model::LinearHook*> LoraSlotHook::ForRows(std::span<const int32_t> slots) {
  rows_.clear();
  for (int32_t s : slots) {
    if (s < -1 || s >= static_cast<int32_t>(table_.size())) {
      return InvalidArgumentError("variant slot " + std::to_string(s) + " outside the " +
                                  std::to_string(table_.size()) + " adapters of this rank");
    }
    const LoraAdapter* a = s < 0 ? nullptr : table_[static_cast<size_t>(s)].get();
    if (s >= 0 && a == nullptr)
      return InvalidArgumentError("variant slot " + std::to_string(s) + " is not defined");
    rows_.push_back(a);
  }
  CHORUS_RETURN_IF_ERROR(hook_.SetRows(rows_));
  return static_cast<const model::LinearHook*>(&hook_);
}

void LoraSlotHook::Set(int32_t slot, std::shared_ptr<const LoraAdapter> adapter) {
  CHORUS_CHECK(slot >= 0);
  if (static_cast<size_t>(slot) >= table_.size()) table_.resize(static_cast<size_t>(slot) + 1);
  table_[static_cast<size_t>(slot)] = std::move(adapter);
}

}  // namespace chorus::adapters
