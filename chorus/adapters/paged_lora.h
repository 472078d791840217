// PagedLora: the pool tier of an adapter (docs/architecture.md, "Memory tiers", S-LoRA §4 unified
// paging). The rows of an adapter's A and Bᵀ (LoraView's flat row order) are packed into pages of
// the same PagePool that holds KV blocks (PageKind::kAdapter), so adapters and KV trade space
// dynamically. Each row is 64-byte aligned and never straddles a page; many rows share a page. The
// segment kernels read the rows through the row tables, so a PagedLora and its host copy are
// interchangeable (same f32 values, same op order: bitwise the same step output).
//
// Life cycle (engine/adapter_residency.h): the engine thread allocates the pages and calls
// Create(); a loader thread runs CopyIn(); the engine marks the copy resident when told (and
// releases the host copy), and frees the pages (PagePool::Free(pages())) after dropping the
// PagedLora.
//
// Thread-safety: immutable after Create() except for the page bytes CopyIn() writes; CopyIn()
// touches no PagePool bookkeeping, so it may run while the engine thread uses the pool.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "chorus/adapters/lora/lora_adapter.h"
#include "chorus/base/status.h"
#include "chorus/memory/page_pool.h"
#include "chorus/memory/pool_copy.h"

namespace chorus::adapters {

class PagedLora : public LoraView, public memory::PoolCopy {
 public:
  // Pages of `page_bytes` that hold `host`'s rows. kInvalidArgument when one row is larger than
  // a page (the adapter is then served from the host tier only).
  static Result<int64_t> PagesNeeded(const LoraView& host, int64_t page_bytes);

  // The view over `pages` (ids in `pool`, at least PagesNeeded() of them, allocated by the
  // caller): row tables point into the pages; nothing is copied yet. Holds `host`.
  static Result<std::unique_ptr<PagedLora>> Create(std::shared_ptr<const LoraAdapter> host,
                                                   memory::PagePool* pool,
                                                   std::vector<int32_t> pages);

  // Copies every row from the host copy into the pages. Not after ReleaseHost().
  void CopyIn() const override;
  // The rows hold the host copy's values, identified by id().
  void ReleaseHost() override { host_.reset(); }

  const std::vector<int32_t>& pages() const override { return pages_; }
  const std::shared_ptr<const LoraAdapter>& host() const { return host_; }  // null once released

 private:
  PagedLora() = default;
  std::shared_ptr<const LoraAdapter> host_;
  std::vector<int32_t> pages_;
};

}  // namespace chorus::adapters
