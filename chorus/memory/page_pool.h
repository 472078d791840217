// PagePool: one arena of `n_pages` fixed-size pages (docs/architecture.md, "Memory tiers", S-LoRA
// unified paging). KV blocks are one page each; resident adapter weights (a later issue) take pages
// from the same free list, so KV and adapters trade space dynamically. Pages are tagged by kind for
// metrics.
//
// Thread-safety: owned by the engine thread; not thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "chorus/base/status.h"

namespace chorus::memory {

enum class PageKind : uint8_t { kFree = 0, kKv = 1, kAdapter = 2 };

class PagePool {
 public:
  // Requires: page_bytes % 64 == 0, n_pages >= 1.
  PagePool(int64_t n_pages, int64_t page_bytes);
  PagePool(const PagePool&) = delete;
  PagePool& operator=(const PagePool&) = delete;

  int64_t n_pages() const { return n_pages_; }
  int64_t page_bytes() const { return page_bytes_; }
  int64_t n_free() const { return static_cast<int64_t>(free_.size()); }
  int64_t n_used(PageKind kind) const { return used_by_kind_[static_cast<int>(kind)]; }

  // Takes `n` pages of `kind` (all or none). kResourceExhausted when fewer are free.
  Result<std::vector<int32_t>> Allocate(int64_t n, PageKind kind);
  // Takes one page; -1 when none is free.
  int32_t AllocateOne(PageKind kind);
  // Returns pages to the free list. Requires: each page is allocated.
  void Free(const std::vector<int32_t>& pages);
  void FreeOne(int32_t page);

  uint8_t* PageData(int32_t page) { return arena_.get() + static_cast<size_t>(page) * page_bytes_; }
  const uint8_t* PageData(int32_t page) const {
    return arena_.get() + static_cast<size_t>(page) * page_bytes_;
  }
  PageKind kind(int32_t page) const { return kinds_[page]; }

  // Makes every page of the arena resident now (the kernel zero-fills them once), so first use
  // of a page costs no page fault: an adapter's pool copy into never-used pages spends ~80 % of
  // its time in page faults otherwise (36 MB: ~24 ms instead of ~5 ms on the Zen 4 VM), time a
  // loader thread takes from the steps running next to it. Costs the whole arena in RSS.
  void Prefault();

 private:
  struct FreeDeleter {
    void operator()(uint8_t* p) const;
  };
  int64_t n_pages_;
  int64_t page_bytes_;
  std::unique_ptr<uint8_t, FreeDeleter> arena_;
  std::vector<int32_t> free_;  // LIFO free list (recently freed pages are warm in cache)
  std::vector<PageKind> kinds_;
  int64_t used_by_kind_[3] = {0, 0, 0};
};

}  // namespace chorus::memory
