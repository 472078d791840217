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
// Prefetch (S-LoRA §5.2's prefetch of queued requests' adapters, on the workers): when a request
// for a variant is queued, rank 0 sends its description as a hint (TpVariantSlots::
// ShouldPrefetch, model::TpLeader::Prefetch) while its own copy loads; each worker starts
// loading its shard on a loader thread, and the Define that follows takes the loaded shard
// instead of reading the file while every rank waits between two steps.
//
// The description is the VariantRef as JSON (name, kind, path, id, file fingerprints): every rank
// reads the same path (the same file on every host) and checks it holds the registered content.
//
// Thread-safety: TpVariantSlots is used by the engine thread only (its Define is a collective);
// TpVariantWorker by the worker's one thread (its loader thread only loads files and hands the
// result over under a mutex).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "chorus/adapters/delta/delta_hook.h"
#include "chorus/adapters/lora/lora_tp.h"
#include "chorus/adapters/variant.h"
#include "chorus/adapters/variant_hook.h"
#include "chorus/base/mutex.h"
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
  // Whether to send the workers a prefetch hint for `ref`, whose request was just queued: not
  // when a live copy of it is bound already, nor when a hint for it went out since its last
  // definition (at most kMaxHinted remembered). Records the hint.
  bool ShouldPrefetch(const VariantRef& ref);
  static constexpr size_t kMaxHinted = 64;
  int64_t bound() const { return static_cast<int64_t>(by_copy_.size()); }
  int64_t definitions() const { return definitions_; }

 private:
  struct Binding {
    std::weak_ptr<const void> copy;
    int32_t slot;
    std::string description;
  };
  DefineFn define_;
  std::map<const void*, Binding> by_copy_;
  std::set<std::string> hinted_;  // descriptions hinted and not defined since
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
  std::vector<int32_t> lora_slots_;                  // ForRows scratch: delta rows as −1
  std::vector<const delta::DeltaView*> row_deltas_;  // ForRows scratch
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
  ~TpVariantWorker();
  // A model::TpDefineSlot. Refuses files that no longer hold the registered content, and
  // malformed descriptions; a failure leaves the slot empty. Takes a prefetched shard of the same
  // description when one is loaded (waiting while it loads); one still queued is loaded here.
  Status Define(int32_t slot, std::string_view description);
  // A model::TpPrefetch: queues the load of this rank's shard of `description` on the loader
  // thread (FIFO; a description queued, loading or loaded already is not queued again; beyond
  // kMaxPrefetched the oldest is dropped). Errors are kept for the Define that takes them.
  void Prefetch(std::string_view description);
  static constexpr size_t kMaxPrefetched = 8;
  // Definitions served by a prefetched shard.
  int64_t prefetch_hits() const { return prefetch_hits_; }
  // Tests: returns once nothing is queued or loading.
  void WaitForPrefetches();
  // A model::TpHookForRows.
  Result<const model::LinearHook*> ForRows(std::span<const int32_t> slots) {
    return slots_.ForRows(slots);
  }

 private:
  struct Loaded {
    std::shared_ptr<const LoraAdapter> lora;
    std::shared_ptr<const delta::DeltaWeights> delta;
  };
  // Parses `description`, verifies the registered content and loads this rank's shard.
  Result<Loaded> Load(std::string_view description) const;
  // The prefetched result for `description`, removed (waits while it loads); nullopt when none
  // is loaded or loading (a queued one is dropped).
  std::optional<Result<Loaded>> TakePrefetched(const std::string& description);
  void LoaderMain();

  model::ModelConfig full_;
  int rank_, size_;
  LoraLoadOptions opts_;
  std::string base_weights_hash_;
  VariantSlotHook slots_;
  int64_t prefetch_hits_ = 0;

  Mutex mu_;
  CondVar cv_;  // signalled when the queue grows, a load ends, or on stop
  std::deque<std::string> queued_ GUARDED_BY(mu_);
  std::string loading_ GUARDED_BY(mu_);  // empty: none
  std::deque<std::pair<std::string, Result<Loaded>>> loaded_ GUARDED_BY(mu_);
  bool stop_ GUARDED_BY(mu_) = false;
  std::thread loader_;  // started by the first Prefetch
};

}  // namespace chorus::adapters
