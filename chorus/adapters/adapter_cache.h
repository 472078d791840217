// AdapterCache: the host tier of adapter residency (docs/architecture.md, "Memory tiers"): decoded
// adapters in compute layout, LRU-bounded by bytes (`--host-cache-size`). A miss loads the adapter
// from disk on the calling thread — in serving, one of engine residency's loader threads, never
// the engine thread or an HTTP thread, so a load never stalls a step or a handler; concurrent
// callers for the same adapter wait for one load. An entry
// handed out stays alive while anyone holds it (running sequences pin it); eviction only drops the
// cache's own reference, and only of entries nobody else holds.
//
// Entries are keyed by VariantId (adapters/variant.h): content hash and registration version,
// so a replaced adapter never shares cached weights with its predecessor. Loaded copies carry
// the id (LoraView::id()).
//
// Thread-safety: thread-safe.
#pragma once

#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "chorus/adapters/delta/delta_hook.h"
#include "chorus/adapters/fingerprint.h"
#include "chorus/adapters/lora/lora_adapter.h"
#include "chorus/adapters/lora/lora_files.h"
#include "chorus/adapters/variant.h"
#include "chorus/base/mutex.h"

namespace chorus::adapters {

// Under tensor parallelism (docs/scaleout.md) each rank's cache holds its own shard of every
// adapter: files are read and checked against the whole model and split for `rank` of `size`.
struct TensorParallelShard {
  int rank = 0;
  int size = 1;
};

class AdapterCache {
 public:
  // `base` is the whole model's config. `base_weights_hash` (delta::BaseWeightsHash of the
  // served base) is checked against every delta loaded (empty: not checked). With `shard.size`
  // > 1 the copies are this rank's shards (of LoRA adapters and deltas alike).
  AdapterCache(model::ModelConfig base, int64_t max_bytes, LoraLimits limits = {},
               std::string base_weights_hash = {}, TensorParallelShard shard = {});

  // The decoded copy of `ref` (loading it on a miss). Requires: !ref.id.empty().
  Result<std::shared_ptr<const LoraAdapter>> Get(const VariantRef& ref);
  // Deltas (docs/deltas.md), the second variant kind, in the same tier and byte budget:
  // `ref.kind` is "delta". As for adapters, concurrent callers for one delta wait for one load.
  Result<std::shared_ptr<const delta::DeltaWeights>> GetDelta(const VariantRef& ref);
  std::shared_ptr<const delta::DeltaWeights> GetDeltaIfCached(const VariantId& id);

  // The cached copy when present and loaded (counts a hit), else null; never loads.
  std::shared_ptr<const LoraAdapter> GetIfCached(const VariantId& id);
  // Drops the cached copy of every version of `name` (users keep theirs until they finish).
  void Erase(const std::string& name);

  // The arena decoded copies are built into (null when max_bytes is 0); StartPrefault() it to
  // make first loads fast.
  const std::shared_ptr<memory::HostArena>& arena() const { return limits_.arena; }

  // Upper bounds (seconds) of the load-latency histogram: 1 ms .. 10 s, roughly 1-2.5-5 steps.
  static const std::vector<double>& LoadSecondsBounds();

  struct Stats {
    uint64_t hits = 0, misses = 0, loads = 0, load_errors = 0, evictions = 0;
    double load_seconds_total = 0, last_load_seconds = 0;
    // Successful loads by duration: load_seconds_buckets[i] counts loads with
    // LoadSecondsBounds()[i-1] < seconds <= LoadSecondsBounds()[i] (not cumulative); the last
    // element counts loads above the largest bound. Sums to `loads`.
    std::vector<uint64_t> load_seconds_buckets =
        std::vector<uint64_t>(LoadSecondsBounds().size() + 1);
    int64_t bytes = 0, entries = 0;
    // The host arena (0 without one): its size, the part made resident by the prefault so
    // far, and the part held by decoded copies.
    int64_t arena_bytes = 0, arena_prefaulted_bytes = 0, arena_used_bytes = 0;
  };
  Stats stats() const;

 private:
  struct Entry {
    std::shared_ptr<const LoraAdapter> adapter;  // null while loading
    bool loading = false;
    std::list<VariantId>::iterator lru;  // position in lru_ (front = most recent)
    std::string name;
  };
  void EvictLocked() REQUIRES(mu_);
  // A successful load of `secs` seconds in the stats and the latency histogram.
  void CountLoadLocked(double secs) REQUIRES(mu_);
  struct DeltaEntry {
    std::shared_ptr<const delta::DeltaWeights> weights;  // null while loading
    bool loading = false;
    int64_t bytes = 0;
    uint64_t last_use = 0;
    std::string name;
  };

  const model::ModelConfig base_;
  const TensorParallelShard shard_;
  const int64_t max_bytes_;
  const LoraLimits limits_;
  mutable Mutex mu_;
  CondVar loaded_;  // signalled when a load ends
  std::map<VariantId, Entry> entries_ GUARDED_BY(mu_);
  std::list<VariantId> lru_ GUARDED_BY(mu_);
  std::map<VariantId, DeltaEntry> deltas_ GUARDED_BY(mu_);
  uint64_t tick_ GUARDED_BY(mu_) = 0;
  const std::string base_weights_hash_;
  Stats stats_ GUARDED_BY(mu_);
};

}  // namespace chorus::adapters
