// PagedDelta: the pool tier of a delta (docs/deltas.md "Tiers", docs/architecture.md "Memory
// tiers"), as PagedLora is a LoRA adapter's: the delta's packed matrices move into pages of the
// PagePool that holds KV blocks (PageKind::kAdapter), so deltas, adapters and KV trade space in
// one pool (S-LoRA §4's unified paging, with DeltaZip's deltas as a second kind).
//
// A matrix is far larger than a page (a TinyLlama-shape BitDelta MLP matrix is 1.4 MB, a pool
// page ~360 KB), so it is cut into bands of consecutive output rows (kernels::DeltaBand): each
// band's codes, 2:4 patterns, kept positions and scale groups sit together in one page, each
// array on a cache line, and bands of many matrices share a page. Bands are a multiple of 16 rows
// (the BitDelta lookup's panel) but for a matrix's last. The kernels read a banded view exactly
// as the whole matrix (kernels/delta.h), so a step's output is bitwise the same whether a row
// reads the pool copy or the host copy. The extras (norms, embeddings, output head: small, or
// read a row at a time) stay where the host copy's Delta keeps them, shared by this copy.
//
// Life cycle (engine/adapter_residency.h): the engine thread allocates the pages and calls
// Create(); a loader thread runs CopyIn(); the engine marks the copy resident when told (and
// releases the host copy), and frees the pages after dropping the PagedDelta.
//
// Thread-safety: immutable after Create() except for the page bytes CopyIn() writes; CopyIn()
// touches no PagePool bookkeeping, so it may run while the engine thread uses the pool.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "chorus/adapters/delta/delta_hook.h"
#include "chorus/base/status.h"
#include "chorus/memory/page_pool.h"
#include "chorus/memory/pool_copy.h"

namespace chorus::delta {

class PagedDelta : public DeltaView, public memory::PoolCopy {
 public:
  // Rows per band, but for a matrix's last band: a multiple of this.
  static constexpr int64_t kBandRows = 16;

  // Pages of `page_bytes` that hold `host`'s matrices. kInvalidArgument (naming the matrix) when
  // kBandRows rows of one matrix do not fit a page (the delta is then served from the host tier).
  static Result<int64_t> PagesNeeded(const DeltaWeights& host, int64_t page_bytes);

  // The banded views over `pages` (ids in `pool`, at least PagesNeeded() of them, allocated by
  // the caller); nothing is copied yet. Holds `host` until ReleaseHost().
  static Result<std::unique_ptr<PagedDelta>> Create(std::shared_ptr<const DeltaWeights> host,
                                                    memory::PagePool* pool,
                                                    std::vector<int32_t> pages);

  void CopyIn() const override;
  void ReleaseHost() override { host_.reset(); }
  const std::vector<int32_t>& pages() const override { return pages_; }
  const std::shared_ptr<const DeltaWeights>& host() const { return host_; }  // null once released

 private:
  PagedDelta() = default;
  // One array of one band: where CopyIn() reads it and writes it.
  struct Piece {
    const void* from;
    void* to;
    int64_t bytes;
  };

  std::shared_ptr<const DeltaWeights> host_;
  std::vector<int32_t> pages_;
  std::vector<kernels::DeltaBand> bands_;  // every banded view's bands, in view order
  std::vector<float> matrix_scales_;       // [views]: a per-matrix scale (group_size 0) each
  std::vector<Piece> pieces_;
};

}  // namespace chorus::delta
