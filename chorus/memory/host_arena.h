// HostArena: the memory of the host tier (docs/architecture.md, "Memory tiers"): one region, carved
// into 256 KiB chunks, that decoded adapters are built into, prefaulted once instead of at every
// load.
//
// Why: on the VMs Chorus runs on, the first touch of a page costs far more than a copy — the
// guest zeroes it and the hypervisor backs it (measured ~0.3–0.5 GB/s, against ~10 GB/s for a
// memcpy into resident memory). A disk load that converts an adapter into freshly allocated memory
// spent 50–300 ms per TinyLlama adapter under serving load, most of it in that first touch; into
// prefaulted chunks the same loads take 6–37 ms. Huge pages (base/large_alloc.h) where allowed.
//
// Allocation is first-fit over contiguous runs of chunks. When no run is long enough (the arena
// is full or fragmented), Allocate returns null and the caller falls back to ordinary memory:
// the arena makes loads fast, it never makes them fail.
//
// Thread-safety: thread-safe (loader threads allocate, any thread frees).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "chorus/base/mutex.h"

namespace chorus::memory {

class HostArena {
 public:
  static constexpr size_t kChunkBytes = size_t{256} << 10;

  // Reserves `bytes` (rounded up to whole chunks; at least one); nothing is touched yet.
  explicit HostArena(size_t bytes);
  ~HostArena();  // joins the prefault thread; every allocation must have been freed
  HostArena(const HostArena&) = delete;
  HostArena& operator=(const HostArena&) = delete;

  // Starts a background thread (lowest CPU priority) that makes the whole arena resident, chunk
  // by chunk, without changing the contents of chunks already in use (MADV_POPULATE_WRITE;
  // on kernels without it, only chunks free at that moment are touched). Idempotent.
  void StartPrefault();
  // Waits for the prefault thread to finish (tests, benchmarks).
  void WaitPrefault();

  // `bytes` (≥ 1) of uninitialized, 64-byte aligned memory, or null when no free run of
  // chunks is long enough.
  void* Allocate(size_t bytes);
  // Returns memory from Allocate.
  void Free(void* p);
  bool Contains(const void* p) const;

  size_t bytes() const { return n_chunks_ * kChunkBytes; }
  size_t bytes_in_use() const;
  // Bytes the prefault thread has made resident so far (bytes() once it has finished).
  size_t prefaulted_bytes() const {
    return prefaulted_chunks_.load(std::memory_order_relaxed) * kChunkBytes;
  }

 private:
  void PrefaultMain();

  size_t n_chunks_;
  uint8_t* base_;
  mutable Mutex mu_;
  // Guarded by mu_: [chunk] length of the run allocated starting there (0 = none starts there).
  std::vector<uint32_t> run_of_;
  std::vector<bool> used_ GUARDED_BY(mu_);  // [chunk]
  size_t chunks_in_use_ GUARDED_BY(mu_) = 0;
  std::atomic<bool> stop_{false};
  std::atomic<size_t> prefaulted_chunks_{0};
  std::thread prefault_;
};

// A host copy's memory (a decoded LoRA adapter, a delta's streamed matrices): uninitialized,
// 64-byte aligned, taken from `arena` when one is given and has a free run long enough, else from
// AllocateLarge (fresh huge pages: slower to fill on first touch, never an error). Given back
// where it came from when destroyed; holds the arena until then.
class HostBuffer {
 public:
  HostBuffer() = default;
  // `bytes` ≥ 1; `what` names the buffer in AllocateLarge's out-of-memory message.
  HostBuffer(size_t bytes, std::shared_ptr<HostArena> arena, const char* what);
  void* data() const { return p_.get(); }
  size_t size() const { return bytes_; }
  bool in_arena() const { return p_ != nullptr && p_.get_deleter().arena != nullptr; }

 private:
  struct Free {
    void operator()(void* p) const;
    std::shared_ptr<HostArena> arena;  // null: p came from AllocateLarge
  };
  std::unique_ptr<void, Free> p_;
  size_t bytes_ = 0;
};

}  // namespace chorus::memory
