// AdapterCache: the host tier of adapter residency (docs/architecture.md, "Memory tiers"): decoded
// adapters in compute layout, LRU-bounded by bytes (`--host-cache-size`). A miss loads the adapter
// from disk on the CALLING thread (an HTTP handler, the CLI) — never on the engine thread, so a
// load never stalls a step; concurrent callers for the same adapter wait for one load. An entry
// handed out stays alive while anyone holds it (running sequences pin it); eviction only drops the
// cache's own reference, and only of entries nobody else holds.
//
// The cache key includes the registry's content hash and version, so a replaced adapter never
// shares cached weights with its predecessor. Loaded copies carry AdapterKey::ContentId() as
// their identity().
//
// Thread-safety: thread-safe.
#pragma once

#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "chorus/adapters/fingerprint.h"
#include "chorus/adapters/lora/lora_adapter.h"
#include "chorus/adapters/lora/lora_files.h"
#include "chorus/base/mutex.h"

namespace chorus::adapters {

struct AdapterKey {
  std::string name;
  std::string path;
  uint64_t content_hash = 0;
  uint64_t version = 0;
  // The files' fingerprints recorded at registration: checked before a load from disk, so a
  // file changed since is refused rather than served under this identity (empty: unchecked).
  std::vector<AdapterFile> files = {};
  std::string Id() const;  // "name@hash.version"
  // Content identity: "<hash as 16 hex digits>-v<version>" (AdapterInfo::cache_key()'s form).
  // Loaded copies carry it as LoraView::identity(), so tiers below the host cache (pool copies)
  // recognise a reload of the same registration.
  std::string ContentId() const;
};

class AdapterCache {
 public:
  AdapterCache(model::ModelConfig base, int64_t max_bytes, LoraLimits limits = {});

  Result<std::shared_ptr<const LoraAdapter>> Get(const AdapterKey& key);
  // The cached copy when present and loaded (counts a hit), else null; never loads.
  std::shared_ptr<const LoraAdapter> GetIfCached(const AdapterKey& key);
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
    std::list<std::string>::iterator lru;  // position in lru_ (front = most recent)
    std::string name;
  };
  void EvictLocked() REQUIRES(mu_);

  const model::ModelConfig base_;
  const int64_t max_bytes_;
  const LoraLimits limits_;
  mutable Mutex mu_;
  CondVar loaded_;                                        // signalled when a load ends
  std::map<std::string, Entry> entries_ GUARDED_BY(mu_);  // by AdapterKey::Id()
  std::list<std::string> lru_ GUARDED_BY(mu_);
  Stats stats_ GUARDED_BY(mu_);
};

}  // namespace chorus::adapters
