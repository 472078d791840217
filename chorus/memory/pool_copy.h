// PoolCopy: the pool tier's copy of one variant's weights — a LoRA adapter's rows
// (adapters/paged_lora.h) or a delta's banded matrices (adapters/delta/paged_delta.h) — in pages
// of the PagePool that holds KV blocks (docs/architecture.md, "Memory tiers", S-LoRA §4 unified
// paging). What the residency (engine/adapter_residency.h) needs of either kind: the pages it
// holds, the copy a loader thread runs, and letting go of the host copy once that has run.
//
// Thread-safety: CopyIn() may run on a loader thread while the engine thread uses the pool (it
// writes only the page bytes it was given); the rest is the engine thread's.
#pragma once

#include <cstdint>
#include <vector>

namespace chorus::memory {

class PoolCopy {
 public:
  virtual ~PoolCopy() = default;
  // Copies the weights from the host copy into the pages. Not after ReleaseHost().
  virtual void CopyIn() const = 0;
  // Drops the reference to the host copy once CopyIn() has finished (the caller makes sure it
  // has), so the host tier may evict that copy while this one stays resident.
  virtual void ReleaseHost() = 0;
  // The pool pages the copy occupies (PageKind::kAdapter), freed by the owner after dropping it.
  virtual const std::vector<int32_t>& pages() const = 0;
};

}  // namespace chorus::memory
