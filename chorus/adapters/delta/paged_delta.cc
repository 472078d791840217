#include "chorus/adapters/delta/paged_delta.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "chorus/base/check.h"

namespace chorus::delta {
namespace {

constexpr int64_t kLine = 64;  // each array of a band starts on a cache line

int64_t Line(int64_t bytes) { return (bytes + kLine - 1) / kLine * kLine; }

// Bytes a row of `v` takes in each of its arrays.
struct RowBytes {
  int64_t codes, mask, scales, positions;
  explicit RowBytes(const kernels::DeltaMatrixView& v)
      : codes(v.code_row_bytes()),
        mask(v.mask_row_bytes()),
        scales(v.group_size == 0 ? 0 : v.groups() * 4),
        positions(v.positions != nullptr ? v.position_row_words() * 8 : 0) {}
  int64_t Band(int64_t rows) const {
    return Line(rows * codes) + Line(rows * mask) + Line(rows * scales) + Line(rows * positions);
  }
};

// The view of every (layer, linear) slot of `w`, in slot order.
const kernels::DeltaMatrixView& ViewAt(const DeltaView& w, int64_t slot) {
  return w.at(slot / model::kNumLinears, static_cast<model::Linear>(slot % model::kNumLinears));
}

// Cuts each matrix of `w` into bands and packs them greedily into pages, in slot order; calls
// place(slot, row_begin, row_end, page_index, byte_offset) for each band. Returns the number of
// pages used.
template <typename Place>
Result<int64_t> Pack(const DeltaView& w, int64_t page_bytes, Place place) {
  int64_t page = 0, off = 0;
  bool any = false;
  for (int64_t slot = 0; slot < w.n_layers() * model::kNumLinears; ++slot) {
    const kernels::DeltaMatrixView& v = ViewAt(w, slot);
    if (v.rows == 0) continue;
    const RowBytes rb(v);
    const int64_t per_row = rb.codes + rb.mask + rb.scales + rb.positions;
    for (int64_t r0 = 0; r0 < v.rows;) {
      const int64_t left = v.rows - r0;
      const int64_t room = page_bytes - off;
      int64_t fit = std::min(left, room / std::max<int64_t>(per_row, 1));
      while (fit > 0 && rb.Band(fit) > room) --fit;
      if (fit < left) fit = fit / PagedDelta::kBandRows * PagedDelta::kBandRows;
      if (fit == 0) {
        if (off == 0) {
          const int64_t want = std::min(left, PagedDelta::kBandRows);
          return InvalidArgumentError(
              "delta '" + w.name() + "': " + std::to_string(want) + " rows of " +
              model::HfLayerTensorName(slot / model::kNumLinears,
                                       static_cast<model::Linear>(slot % model::kNumLinears)) +
              " take " + std::to_string(rb.Band(want)) + " bytes, more than a pool page (" +
              std::to_string(page_bytes) + ")");
        }
        ++page;
        off = 0;
        continue;
      }
      place(slot, r0, r0 + fit, page, off);
      any = true;
      off += rb.Band(fit);
      r0 += fit;
    }
  }
  return any ? page + 1 : 0;
}

}  // namespace

Result<int64_t> PagedDelta::PagesNeeded(const DeltaWeights& host, int64_t page_bytes) {
  return Pack(host, page_bytes, [](int64_t, int64_t, int64_t, int64_t, int64_t) {});
}

Result<std::unique_ptr<PagedDelta>> PagedDelta::Create(std::shared_ptr<const DeltaWeights> host,
                                                       memory::PagePool* pool,
                                                       std::vector<int32_t> pages) {
  CHORUS_CHECK(host != nullptr && pool != nullptr);
  CHORUS_ASSIGN_OR_RETURN(const int64_t need, PagesNeeded(*host, pool->page_bytes()));
  if (static_cast<int64_t>(pages.size()) < need) {
    return InvalidArgumentError("delta '" + host->name() + "' needs " + std::to_string(need) +
                                " pool pages, " + std::to_string(pages.size()) + " given");
  }
  for (int32_t p : pages) {
    CHORUS_CHECK(p >= 0 && p < pool->n_pages() && pool->kind(p) == memory::PageKind::kAdapter)
        << "page " << p << " is not an adapter page";
  }
  std::unique_ptr<PagedDelta> out(new PagedDelta());
  out->CopyAllButViews(*host);
  const int64_t n_slots = host->n_layers() * model::kNumLinears;
  out->views_.resize(static_cast<size_t>(n_slots));
  out->matrix_scales_.assign(static_cast<size_t>(n_slots), 0.0f);
  // Bands first, so the views' spans point into a vector that no longer grows.
  std::vector<int64_t> first_band(static_cast<size_t>(n_slots), -1);
  PagedDelta* self = out.get();
  CHORUS_RETURN_IF_ERROR(
      Pack(*host, pool->page_bytes(),
           [&](int64_t slot, int64_t r0, int64_t r1, int64_t page, int64_t off) {
             const kernels::DeltaMatrixView& v = ViewAt(*host, slot);
             const RowBytes rb(v);
             const int64_t rows = r1 - r0;
             uint8_t* at = pool->PageData(pages[static_cast<size_t>(page)]) + off;
             kernels::DeltaBand b{.row_begin = r0, .row_end = r1};
             // Each array: where it lands in the page, and the piece CopyIn() copies.
             auto put = [&](const void* src, int64_t per_row) -> uint8_t* {
               if (per_row == 0 || src == nullptr) return nullptr;
               uint8_t* to = at;
               self->pieces_.push_back(
                   {static_cast<const uint8_t*>(src) + r0 * per_row, to, rows * per_row});
               at += Line(rows * per_row);
               return to;
             };
             b.codes = put(v.codes, rb.codes);
             b.mask = put(v.mask, rb.mask);
             b.scales = reinterpret_cast<const float*>(put(v.scales, rb.scales));
             b.positions = reinterpret_cast<const uint64_t*>(put(v.positions, rb.positions));
             if (first_band[static_cast<size_t>(slot)] < 0)
               first_band[static_cast<size_t>(slot)] = static_cast<int64_t>(self->bands_.size());
             self->bands_.push_back(b);
           })
          .status());
  for (int64_t slot = 0; slot < n_slots; ++slot) {
    const kernels::DeltaMatrixView& v = ViewAt(*host, slot);
    kernels::DeltaMatrixView& mine = out->views_[static_cast<size_t>(slot)];
    mine = v;
    if (v.rows == 0) continue;
    mine.codes = nullptr;
    mine.mask = nullptr;
    mine.positions = nullptr;
    mine.scales = nullptr;
    if (v.group_size == 0) {  // one scale for the matrix: kept here, not in a page
      out->matrix_scales_[static_cast<size_t>(slot)] = v.scales[0];
      mine.scales = &out->matrix_scales_[static_cast<size_t>(slot)];
    }
    const auto first = static_cast<size_t>(first_band[static_cast<size_t>(slot)]);
    size_t last = first;
    while (last < out->bands_.size() && (last == first || out->bands_[last].row_begin > 0)) ++last;
    mine.bands = std::span<const kernels::DeltaBand>(out->bands_.data() + first, last - first);
  }
  out->host_ = std::move(host);
  out->pages_ = std::move(pages);
  return out;
}

void PagedDelta::CopyIn() const {
  CHORUS_CHECK(host_ != nullptr) << "CopyIn after ReleaseHost";
  // The destinations are pool memory this object was given exclusively (see Create).
  for (const Piece& p : pieces_) std::memcpy(p.to, p.from, static_cast<size_t>(p.bytes));
}

}  // namespace chorus::delta
