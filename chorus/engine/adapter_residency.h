// AdapterResidency: the adapter tiers below the registry, owned by the engine
// (docs/architecture.md, "Memory tiers"):
//
//   disk ──(loader thread: Load → AdapterCache)──▶ host copy (LoraAdapter, bf16 or f32;
//                                                             DeltaWeights, packed)
//        ──(engine allocates kAdapter pages; loader thread copies rows)──▶ pool copy
//                                                             (PagedLora; PagedDelta, banded)
//
// Both variant kinds — LoRA adapters and deltas (docs/deltas.md) — take the same tiers, the same
// pins, the same LRU and the same metrics: an entry holds one kind's host copy and its
// memory::PoolCopy, and each public call has an overload per kind.
// * Disk → host: requests name a variant by VariantRef (adapters/variant.h); Submit asks Load()
//   here, which hands over a host-cache hit at once or queues a disk load and returns. Loads run on
//   loader threads in arrival order (FIFO), which is S-LoRA's prefetch of the adapters of queued
//   requests (§5.2); the engine admits a request once its ticket is done (an error finishes the
//   request with that error).
// * Host → pool: the pool copy lives in pages of the unified PagePool next to KV blocks. The
//   engine thread allocates the pages (evicting unpinned copies, never KV), a loader thread
//   fills them, Poll() on the engine thread marks the copy resident. A step never waits for it:
//   until the copy lands, rows of that adapter read the host copy (CaraServe-style cold start —
//   on a CPU both copies are in the same DRAM, so the "slow path" costs nothing; the values are
//   identical, so switching mid-sequence never changes the output).
// * An adapter is pinned while any running sequence uses it; unpinned resident copies are
//   evicted LRU when KV needs pages (EvictFor), before any sequence is preempted.
//
// Identity: entries are keyed by VariantId (LoraView::id(): the registry's content hash +
// version, which the host cache stamps on every copy it loads), not by the host object.
// So when the host LRU evicts an adapter whose pool copy is resident and a later request loads
// it again, the new host object finds the resident pool copy (a pool hit, no second copy). To
// let the host tier evict it at all, a resident copy does not hold its host copy: the reference
// is dropped once the rows have landed. A replaced adapter has a new version, so it never shares
// a pool copy with its predecessor. Adapters without an id (built in memory, e.g. in tests)
// are keyed by their address and their entry holds them, so the address stays unique.
// Forget(name) drops the copies of an unloaded adapter (now, or once its last running user
// finishes).
//
// Thread-safety: Load() and Forget() may be called from any thread; everything else
// only from the engine thread. Loader threads touch only page bytes and tickets.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "chorus/adapters/adapter_cache.h"
#include "chorus/adapters/delta/paged_delta.h"
#include "chorus/adapters/paged_lora.h"
#include "chorus/base/mutex.h"
#include "chorus/engine/metrics.h"
#include "chorus/memory/page_pool.h"

namespace chorus::engine {

// A disk → host load that queued sequences wait for (shared by the choices of one request).
struct AdapterTicket {
  std::atomic<bool> done{false};
  Status status;  // valid once done
  // Valid once done and status ok: the LoRA adapter, or the delta (ref.kind "delta").
  std::shared_ptr<const adapters::LoraAdapter> adapter;
  std::shared_ptr<const delta::DeltaWeights> delta;
};

class AdapterResidency {
 public:
  struct Options {
    int loader_threads = 1;
    bool pool_copies = true;  // false: serve every adapter from its host copy
  };
  // `cache` may be null (then Load() fails); `wake` is called on a loader thread after a
  // disk load completes (the engine re-plans). The pool must outlive this object.
  AdapterResidency(memory::PagePool* pool, EngineMetrics* metrics,
                   std::shared_ptr<adapters::AdapterCache> cache, std::function<void()> wake,
                   Options opts);
  ~AdapterResidency();  // waits for in-flight loads
  AdapterResidency(const AdapterResidency&) = delete;
  AdapterResidency& operator=(const AdapterResidency&) = delete;

  // Any thread.
  // The host copy of `ref` for a request: done at once on a host-cache hit, else loaded from
  // disk on a loader thread (FIFO). Fails (in the ticket) without a host cache or an id.
  std::shared_ptr<AdapterTicket> Load(const adapters::VariantRef& ref);
  void Forget(const std::string& name);

  // Engine thread.
  // Applies completed pool copies (they become resident) and pending Forget()s.
  void Poll();
  // A sequence using `a` starts / stops running. Pin counts a pool hit or miss.
  void Pin(const std::shared_ptr<const adapters::LoraAdapter>& a);
  void Pin(const std::shared_ptr<const delta::DeltaWeights>& d);
  void Unpin(const adapters::LoraAdapter* a);
  void Unpin(const delta::DeltaWeights* d);
  // What a step reads for `a`: its pool copy when resident, else the host copy itself.
  const adapters::LoraView* View(const adapters::LoraAdapter* a);
  const delta::DeltaView* View(const delta::DeltaWeights* d);
  bool Resident(const adapters::LoraAdapter* a) const;
  bool Resident(const delta::DeltaWeights* d) const;
  bool Loading(const adapters::LoraAdapter* a) const;
  bool Loading(const delta::DeltaWeights* d) const;
  // Starts the pool copy of `a` unless it has one, if `keep_free` pool pages stay free after it.
  // `may_evict`: unpinned resident copies may be evicted (LRU) to make room.
  void Prefetch(const std::shared_ptr<const adapters::LoraAdapter>& a, int64_t keep_free,
                bool may_evict);
  void Prefetch(const std::shared_ptr<const delta::DeltaWeights>& d, int64_t keep_free,
                bool may_evict);
  // Evicts unpinned resident copies, least recently used first, until the pool has at least
  // `n_free` free pages. Returns whether it has. Pinned or loading copies are never evicted.
  bool EvictFor(int64_t n_free);
  // Pool pages held by adapter copies (resident or loading).
  int64_t pages_used() const;
  void PublishGauges();

 private:
  enum class State { kHostOnly, kLoading, kResident };
  struct Entry {
    // The host copy this entry was made from (a LoraAdapter or a DeltaWeights): held while
    // kHostOnly / kLoading, and always for copies without an id (see the file comment); null
    // for a resident copy otherwise.
    std::shared_ptr<const void> host;
    bool host_has_id = false;
    std::string name;
    // Set while kLoading / kResident: the pool copy, and the same object as the view a step
    // reads of its kind (the other null).
    std::unique_ptr<memory::PoolCopy> paged;
    const adapters::LoraView* lora_view = nullptr;
    const delta::DeltaView* delta_view = nullptr;
    State state = State::kHostOnly;
    int pins = 0;
    bool forgotten = false;
    uint64_t last_use = 0;
    std::chrono::steady_clock::time_point load_start;
  };
  struct Job {
    const memory::PoolCopy* paged = nullptr;  // pool copy (of entry `entry`); else a disk load:
    std::string entry;
    adapters::VariantRef key;
    std::shared_ptr<AdapterTicket> ticket;
  };
  // The entry key of `a`: its VariantId (a delta's identity), or its address when it has none.
  static std::string KeyOf(const adapters::LoraAdapter* a);
  static std::string KeyOf(const delta::DeltaWeights* d);
  // The kind-independent halves of Pin, Unpin, Resident, Loading and Prefetch, by entry key.
  void PinKey(const std::string& key, const std::string& name, std::shared_ptr<const void> host,
              bool has_id);
  void UnpinKey(const std::string& key);
  bool StateIs(const std::string& key, State state) const;
  // No pool copy yet (and not forgotten).
  bool WantsPoolCopy(const std::string& key) const;
  // A pool copy just made over its pages, and the view a step reads of it (one kind's).
  struct NewCopy {
    std::unique_ptr<memory::PoolCopy> copy;
    const adapters::LoraView* lora_view = nullptr;
    const delta::DeltaView* delta_view = nullptr;
  };
  // Allocates `need` pages (if `keep_free` stay free after them; evicting first when
  // `may_evict`), has make(pages) build the copy over them and queues its CopyIn. An error from
  // make() gives the pages back and leaves the host copy serving.
  void StartPoolCopy(const std::string& key, const std::string& name,
                     std::shared_ptr<const void> host, bool has_id, int64_t need, int64_t keep_free,
                     bool may_evict,
                     const std::function<Result<NewCopy>(std::vector<int32_t>)>& make);
  void LoaderMain();
  void Drop(const std::string& key);  // frees the pool copy and the entry
  void FreePoolCopy(Entry* e);
  void MaybeErase(const std::string& key);

  memory::PagePool* const pool_;
  EngineMetrics* const metrics_;
  const std::shared_ptr<adapters::AdapterCache> cache_;
  const std::function<void()> wake_;
  const Options opts_;

  // Engine thread.
  std::unordered_map<std::string, Entry> entries_;  // by KeyOf()
  uint64_t tick_ = 0;

  // Shared with loader threads.
  Mutex mu_;
  CondVar cv_;
  std::deque<Job> jobs_ GUARDED_BY(mu_);
  // Keys of finished pool copies and when each finished (its load latency ends there, not at
  // the engine's next step).
  std::vector<std::pair<std::string, std::chrono::steady_clock::time_point>> copied_
      GUARDED_BY(mu_);
  std::vector<std::string> forget_ GUARDED_BY(mu_);
  bool stop_ GUARDED_BY(mu_) = false;
  std::vector<std::thread> loaders_;
};

}  // namespace chorus::engine
