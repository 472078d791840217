#include "chorus/base/large_alloc.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>

#include "chorus/base/check.h"

namespace chorus {

void* AllocateLarge(size_t bytes, const char* what) {
  constexpr size_t kHuge = size_t{2} << 20;
  bytes = std::max<size_t>(bytes, 1);
  const size_t align = bytes >= kHuge ? kHuge : 64;
  // aligned_alloc wants a size that is a multiple of the alignment.
  const size_t alloc = (bytes + align - 1) / align * align;
  void* p = std::aligned_alloc(align, alloc);
  CHORUS_CHECK(p != nullptr) << "out of memory allocating " << alloc << " bytes for " << what;
#ifdef MADV_HUGEPAGE
  // Before first touch, so the faults themselves allocate huge pages. Failure (THP disabled,
  // old kernel) only means 4 KiB pages.
  if (align == kHuge) (void)::madvise(p, alloc, MADV_HUGEPAGE);
#endif
  return p;
}

}  // namespace chorus
