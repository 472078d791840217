#include "chorus/memory/host_arena.h"

#include <sys/mman.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstdlib>

#include "chorus/base/check.h"
#include "chorus/base/large_alloc.h"

namespace chorus::memory {

HostArena::HostArena(size_t bytes)
    : n_chunks_(std::max<size_t>(1, (bytes + kChunkBytes - 1) / kChunkBytes)),
      base_(static_cast<uint8_t*>(AllocateLarge(n_chunks_ * kChunkBytes, "the host-tier arena"))),
      run_of_(n_chunks_, 0),
      used_(n_chunks_, false) {}

HostArena::~HostArena() {
  stop_.store(true, std::memory_order_relaxed);
  if (prefault_.joinable()) prefault_.join();
  CHORUS_CHECK(chunks_in_use_ == 0)
      << "host arena destroyed with " << chunks_in_use_ << " chunks still in use";
  std::free(base_);
}

void HostArena::StartPrefault() {
  MutexLock lock(&mu_);
  if (prefault_.joinable()) return;
  prefault_ = std::thread([this] { PrefaultMain(); });
}

void HostArena::WaitPrefault() {
  std::thread t;
  {
    MutexLock lock(&mu_);
    t.swap(prefault_);
  }
  if (t.joinable()) t.join();
}

void HostArena::PrefaultMain() {
  // Lowest priority: the arena only has to be ready before it fills up, and loads that touch a
  // chunk first are still correct, so serving never waits for this thread.
  (void)::setpriority(PRIO_PROCESS, 0, 19);  // Linux: `who` = 0 is the calling thread
  for (size_t c = 0; c < n_chunks_ && !stop_.load(std::memory_order_relaxed); ++c) {
    uint8_t* chunk = base_ + c * kChunkBytes;
#ifdef MADV_POPULATE_WRITE
    // Populates page tables as a write fault would; pages already present keep their contents,
    // so this is safe on chunks a loader is filling right now.
    if (::madvise(chunk, kChunkBytes, MADV_POPULATE_WRITE) == 0) {
      prefaulted_chunks_.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
#endif
    // Older kernels: touch the chunk only while it is free (held as in use meanwhile).
    prefaulted_chunks_.fetch_add(1, std::memory_order_relaxed);  // in use: touched by its user
    {
      MutexLock lock(&mu_);
      if (used_[c]) continue;
      used_[c] = true;
    }
    for (size_t off = 0; off < kChunkBytes; off += 4096) chunk[off] = 0;
    MutexLock lock(&mu_);
    used_[c] = false;
  }
}

void* HostArena::Allocate(size_t bytes) {
  const size_t need = std::max<size_t>(1, (bytes + kChunkBytes - 1) / kChunkBytes);
  MutexLock lock(&mu_);
  size_t run = 0;
  for (size_t c = 0; c < n_chunks_; ++c) {
    run = used_[c] ? 0 : run + 1;
    if (run == need) {
      const size_t first = c + 1 - need;
      for (size_t i = first; i <= c; ++i) used_[i] = true;
      run_of_[first] = static_cast<uint32_t>(need);
      chunks_in_use_ += need;
      return base_ + first * kChunkBytes;
    }
  }
  return nullptr;
}

bool HostArena::Contains(const void* p) const {
  const auto* b = static_cast<const uint8_t*>(p);
  return b >= base_ && b < base_ + n_chunks_ * kChunkBytes;
}

void HostArena::Free(void* p) {
  CHORUS_CHECK(Contains(p)) << "free of memory that is not in the host arena";
  const size_t off = static_cast<size_t>(static_cast<uint8_t*>(p) - base_);
  CHORUS_CHECK(off % kChunkBytes == 0) << "free of a pointer the host arena did not return";
  const size_t first = off / kChunkBytes;
  MutexLock lock(&mu_);
  const size_t n = run_of_[first];
  CHORUS_CHECK(n > 0) << "double free in the host arena";
  run_of_[first] = 0;
  for (size_t i = first; i < first + n; ++i) used_[i] = false;
  chunks_in_use_ -= n;
}

size_t HostArena::bytes_in_use() const {
  MutexLock lock(&mu_);
  return chunks_in_use_ * kChunkBytes;
}

HostBuffer::HostBuffer(size_t bytes, std::shared_ptr<HostArena> arena, const char* what)
    : bytes_(bytes) {
  if (void* p = arena ? arena->Allocate(bytes) : nullptr) {
    p_ = std::unique_ptr<void, Free>(p, Free{std::move(arena)});
  } else {
    p_ = std::unique_ptr<void, Free>(AllocateLarge(bytes, what), Free{});
  }
}

void HostBuffer::Free::operator()(void* p) const {
  if (arena) {
    arena->Free(p);
  } else {
    std::free(p);
  }
}

}  // namespace chorus::memory
