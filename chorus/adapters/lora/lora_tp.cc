#include "chorus/adapters/lora/lora_tp.h"

#include <string>

namespace chorus::adapters {

Result<std::shared_ptr<const LoraAdapter>> LoadLoraAdapterShard(const std::string& path,
                                                                const model::ModelConfig& full,
                                                                int rank, int size,
                                                                const LoraLoadOptions& opts,
                                                                std::string name) {
  if (size == 1) return LoadLoraAdapter(path, full, opts, std::move(name));
  CHORUS_ASSIGN_OR_RETURN(LoraWeights w, ReadLora(path, full, opts));
  auto ad = LoraAdapter::BuildShard(w, full, rank, size, name.empty() ? path : std::move(name),
                                    opts.limits, opts.id);
  if (!ad.ok()) return ad.status().WithContext(path);
  return ad;
}

LoraSlotHook::LoraSlotHook(const model::ModelConfig& config, int64_t max_rows,
                           dist::Communicator* comm,
                           std::vector<std::shared_ptr<const LoraAdapter>> table)
    : table_(std::move(table)), hook_(config, max_rows, comm) {
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
