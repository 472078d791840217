// Adapters served under tensor parallelism (docs/scaleout.md, "Adapters through chorus serve
// --tp"): rank 0 resolves requests to adapters as without TP — registry, host cache, pool
// copies, all of its own shard — and before a sequence may use a variant (a LoRA adapter or a
// delta), binds it to a slot that every other rank has loaded its own shard into. The step plan
// then carries each row's slot (model::StepChannel).
//
//   rank 0:  TpVariantSlots::Bind(copy, ref) — first use of that loaded copy: a slot (reused
//            from a copy that no longer exists) and model::TpLeader::Define(slot, description);
//            later uses: the same slot, no message.
//   workers: TpVariantWorker::Define(slot, description) — verify the registered content, read
//            the file, keep this rank's shard in the slot (LoRA: LoraSlotHook; delta: its
//            DeltaWeights); ForRows for the steps.
//
// The description is the VariantRef as JSON (name, kind, path, id, file fingerprints): every rank
// reads the same path (the same file on every host) and checks it holds the registered content.
//
// Thread-safety: TpVariantSlots is used by the engine thread only (its Define is a collective);
// TpVariantWorker by the worker's one thread.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "chorus/adapters/delta/delta_hook.h"
#include "chorus/adapters/lora/lora_tp.h"
#include "chorus/adapters/variant.h"
#include "chorus/adapters/variant_hook.h"
#include "chorus/model/config.h"

namespace chorus::adapters {

// The wire form of a variant definition, and its inverse (errors: kInvalidArgument).
std::string DescribeTpVariant(const VariantRef& ref);
Result<VariantRef> ParseTpVariant(std::string_view description);

// Rank 0: which slot each loaded variant copy (a LoraAdapter or a delta::DeltaWeights) is bound
// to.
class TpVariantSlots {
 public:
  // `define` sends a definition and returns the workers' agreement (model::TpLeader::Define).
  using DefineFn = std::function<Status(int32_t slot, std::string_view description)>;
  explicit TpVariantSlots(DefineFn define) : define_(std::move(define)) {}

  // The slot of `copy` (the loaded copy rank 0's sequences use), defining it on the workers on
  // its first use. A slot is reused only once the copy it was bound to is gone (no sequence and
  // no cache holds it), so no planned row can name a redefined slot. An error (a worker could not
  // load its shard) leaves nothing bound.
  Result<int32_t> Bind(const std::shared_ptr<const void>& copy, const VariantRef& ref);
  // The slot `copy` was bound to. Requires: Bind succeeded for it and it is alive.
  int32_t SlotOf(const void* copy) const;
  int64_t bound() const { return static_cast<int64_t>(by_copy_.size()); }
  int64_t definitions() const { return definitions_; }

 private:
  struct Binding {
    std::weak_ptr<const void> copy;
    int32_t slot;
  };
  DefineFn define_;
  std::map<const void*, Binding> by_copy_;
  std::vector<int32_t> free_;
  int32_t next_slot_ = 0;
  int64_t definitions_ = 0;
};

// A rank's hook over a table of variants by slot — LoRA adapters and deltas, each for this rank's
// shard — for the rows of a step (slot −1 = base): what the step plan's slots name.
class VariantSlotHook {
 public:
  // `config`: this rank's model (shard) config; `comm`: the forward pass's communicator
  // (LoraSlotHook).
  VariantSlotHook(const model::ModelConfig& config, int64_t max_rows, dist::Communicator* comm);
  void SetLora(int32_t slot, std::shared_ptr<const LoraAdapter> adapter);
  void SetDelta(int32_t slot, std::shared_ptr<const delta::DeltaWeights> delta);
  void Clear(int32_t slot);  // the slot holds nothing
  // A model::TpHookForRows: the hook of the step's rows (an empty slot is an error naming it).
  Result<const model::LinearHook*> ForRows(std::span<const int32_t> slots);

 private:
  LoraSlotHook lora_;
  std::vector<std::shared_ptr<const delta::DeltaWeights>> deltas_;  // by slot; null: not a delta
  delta::DeltaHook delta_hook_;
  VariantHook hook_;
  std::vector<int32_t> lora_slots_;                     // ForRows scratch: delta rows as −1
  std::vector<const delta::DeltaWeights*> row_deltas_;  // ForRows scratch
};

// A worker rank's slots: loads its shard of each variant rank 0 defines.
class TpVariantWorker {
 public:
  // `full`: the whole model's config (files are read and checked against it); this rank is
  // comm's rank of its size (its forward pass's communicator); `opts.limits` as rank 0's
  // (--max-lora-rank, --lora-dtype); `base_weights_hash`: the whole base's
  // (delta::BaseWeightsHash), checked against deltas.
  TpVariantWorker(const model::ModelConfig& full, dist::Communicator* comm, int64_t max_rows,
                  LoraLoadOptions opts, std::string base_weights_hash);
  // A model::TpDefineSlot. Refuses files that no longer hold the registered content, and
  // malformed descriptions; a failure leaves the slot empty.
  Status Define(int32_t slot, std::string_view description);
  // A model::TpHookForRows.
  Result<const model::LinearHook*> ForRows(std::span<const int32_t> slots) {
    return slots_.ForRows(slots);
  }

 private:
  model::ModelConfig full_;
  int rank_, size_;
  LoraLoadOptions opts_;
  std::string base_weights_hash_;
  VariantSlotHook slots_;
};

}  // namespace chorus::adapters
