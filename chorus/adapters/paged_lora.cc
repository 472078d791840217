#include "chorus/adapters/paged_lora.h"

#include <cstring>

namespace chorus::adapters {
namespace {

constexpr int64_t kRowAlign = 64;  // one cache line: rows start on a line, vector loads stay in it

int64_t PaddedBytes(int64_t bytes) { return (bytes + kRowAlign - 1) / kRowAlign * kRowAlign; }

// Walks the rows of `v` in flat order, packing them greedily into pages; calls
// place(row, page_index, byte_offset) for each. Returns the number of pages used.
template <typename Place>
Result<int64_t> Pack(const LoraView& v, int64_t page_bytes, Place place) {
  int64_t page = 0, off = 0;
  for (int64_t i = 0; i < v.n_rows(); ++i) {
    const int64_t bytes = PaddedBytes(v.row_bytes(i));
    if (bytes > page_bytes) {
      return InvalidArgumentError("adapter '" + v.name() + "' has a row of " +
                                  std::to_string(bytes) + " bytes, larger than a pool page (" +
                                  std::to_string(page_bytes) + ")");
    }
    if (off + bytes > page_bytes) {
      ++page;
      off = 0;
    }
    place(i, page, off);
    off += bytes;
  }
  return v.n_rows() == 0 ? 0 : page + 1;
}

}  // namespace

Result<int64_t> PagedLora::PagesNeeded(const LoraView& host, int64_t page_bytes) {
  return Pack(host, page_bytes, [](int64_t, int64_t, int64_t) {});
}

Result<std::unique_ptr<PagedLora>> PagedLora::Create(std::shared_ptr<const LoraAdapter> host,
                                                     memory::PagePool* pool,
                                                     std::vector<int32_t> pages) {
  CHORUS_CHECK(host != nullptr && pool != nullptr);
  CHORUS_ASSIGN_OR_RETURN(const int64_t need, PagesNeeded(*host, pool->page_bytes()));
  if (static_cast<int64_t>(pages.size()) < need) {
    return InvalidArgumentError("adapter '" + host->name() + "' needs " + std::to_string(need) +
                                " pool pages, " + std::to_string(pages.size()) + " given");
  }
  for (int32_t p : pages) {
    CHORUS_CHECK(p >= 0 && p < pool->n_pages() && pool->kind(p) == memory::PageKind::kAdapter)
        << "page " << p << " is not an adapter page";
  }
  std::unique_ptr<PagedLora> out(new PagedLora());
  out->CopyShapeFrom(*host);
  PagedLora* self = out.get();
  CHORUS_RETURN_IF_ERROR(
      Pack(*host, pool->page_bytes(), [&](int64_t row, int64_t page, int64_t off) {
        self->SetRow(row, pool->PageData(pages[static_cast<size_t>(page)]) + off);
      }).status());
  out->host_ = std::move(host);
  out->pages_ = std::move(pages);
  return out;
}

void PagedLora::CopyIn() const {
  CHORUS_CHECK(host_ != nullptr) << "CopyIn after ReleaseHost";
  for (int64_t i = 0; i < n_rows(); ++i) {
    // The destination is pool memory this object was given exclusively (see Create).
    std::memcpy(const_cast<void*>(row_data(i)), host_->row_data(i),
                static_cast<size_t>(row_bytes(i)));
  }
}

}  // namespace chorus::adapters
