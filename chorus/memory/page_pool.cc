#include "chorus/memory/page_pool.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>

#include "chorus/base/large_alloc.h"

namespace chorus::memory {

void PagePool::FreeDeleter::operator()(uint8_t* p) const { std::free(p); }

PagePool::PagePool(int64_t n_pages, int64_t page_bytes)
    : n_pages_(n_pages),
      page_bytes_(page_bytes),
      kinds_(static_cast<size_t>(n_pages), PageKind::kFree) {
  CHORUS_CHECK(n_pages >= 1 && page_bytes > 0 && page_bytes % 64 == 0);
  size_t bytes = static_cast<size_t>(n_pages) * static_cast<size_t>(page_bytes);
  // Huge pages: a step streams the adapter rows held here from DRAM (base/large_alloc.h).
  arena_.reset(static_cast<uint8_t*>(AllocateLarge(bytes, "the page pool")));
  free_.reserve(static_cast<size_t>(n_pages));
  for (int64_t i = n_pages - 1; i >= 0; --i) free_.push_back(static_cast<int32_t>(i));
  used_by_kind_[0] = n_pages;
}

void PagePool::Prefault() {
  const size_t bytes = static_cast<size_t>(n_pages_) * static_cast<size_t>(page_bytes_);
#ifdef MADV_POPULATE_WRITE
  // One call: the kernel populates the page tables without a fault per page (Linux ≥ 5.14).
  // madvise needs a page-aligned start; the first partial page is touched below anyway.
  const uintptr_t begin = reinterpret_cast<uintptr_t>(arena_.get());
  const uintptr_t page = 4096, aligned = (begin + page - 1) / page * page;
  if (aligned < begin + bytes && ::madvise(reinterpret_cast<void*>(aligned),
                                           begin + bytes - aligned, MADV_POPULATE_WRITE) == 0) {
    arena_.get()[0] = 0;
    return;
  }
#endif
  // Older kernels: write one byte per 4 KiB page (the arena's contents are undefined anyway).
  for (size_t off = 0; off < bytes; off += 4096) arena_.get()[off] = 0;
}

Result<std::vector<int32_t>> PagePool::Allocate(int64_t n, PageKind kind) {
  if (n > n_free()) {
    return ResourceExhaustedError("pool has " + std::to_string(n_free()) + " free pages, " +
                                  std::to_string(n) + " needed");
  }
  std::vector<int32_t> out;
  out.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out.push_back(AllocateOne(kind));
  return out;
}

int32_t PagePool::AllocateOne(PageKind kind) {
  CHORUS_CHECK(kind != PageKind::kFree);
  if (free_.empty()) return -1;
  int32_t p = free_.back();
  free_.pop_back();
  kinds_[p] = kind;
  --used_by_kind_[0];
  ++used_by_kind_[static_cast<int>(kind)];
  return p;
}

void PagePool::FreeOne(int32_t page) {
  CHORUS_CHECK(page >= 0 && page < n_pages_ && kinds_[page] != PageKind::kFree)
      << "double free of page " << page;
  --used_by_kind_[static_cast<int>(kinds_[page])];
  ++used_by_kind_[0];
  kinds_[page] = PageKind::kFree;
  free_.push_back(page);
}

void PagePool::Free(const std::vector<int32_t>& pages) {
  for (int32_t p : pages) FreeOne(p);
}

}  // namespace chorus::memory
