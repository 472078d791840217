// Large buffers that are streamed from DRAM (the page pool, host copies of adapters): backed by
// transparent huge pages where the kernel allows it.
//
// Why: a decode step with many distinct adapters reads every adapter row once from DRAM. With
// 4 KiB pages each 2048-wide bf16 row is its own page, so every row costs a TLB miss and the
// hardware prefetchers stop at its end. 2 MiB pages remove the TLB misses. THP is a hint
// (`madvise` mode is the Debian default; `never` just leaves 4 KiB pages), never a requirement.
#pragma once

#include <cstddef>

namespace chorus {

// `bytes` (≥ 1) of uninitialized memory, 64-byte aligned; buffers of at least 2 MiB are aligned
// to 2 MiB and advised MADV_HUGEPAGE. Free with std::free. Aborts when out of memory, naming
// `what` and the size.
void* AllocateLarge(size_t bytes, const char* what);

}  // namespace chorus
