// Threading and run-time selection of the LoRA segment kernels (lora.h).
#include "chorus/kernels/lora.h"

#include <atomic>

#include "chorus/base/check.h"
#include "chorus/kernels/dispatch.h"
#include "chorus/kernels/lora_internal.h"

namespace chorus::kernels {
namespace {

using lora_internal::ExpandTileBf16Fn;
using lora_internal::ExpandTileFn;
using lora_internal::ShrinkTileBf16Fn;
using lora_internal::ShrinkTileFn;

// Below this many multiply-adds a call runs on the calling thread: waking the pool would cost
// more than the work. (Which thread computes an element never changes its value.)
constexpr int64_t kMinParallelMacs = 1 << 15;
// Expand splits `out` in multiples of this many columns (one AVX-512 vector).
constexpr int64_t kExpandColAlign = 16;

ShrinkTileFn ShrinkTileForIsa() {
  switch (ActiveIsa()) {
    case IsaLevel::kAvx512: return lora_internal::avx512::ShrinkTile;
    case IsaLevel::kAvx2: return lora_internal::avx2::ShrinkTile;
    case IsaLevel::kScalar: break;
  }
  return lora_internal::reference::ShrinkTile;
}

ShrinkTileBf16Fn ShrinkTileBf16ForIsa() {
  switch (ActiveIsa()) {
    case IsaLevel::kAvx512:
      return lora_internal::avx512::ShrinkTileBf16;
    case IsaLevel::kAvx2:
      return lora_internal::avx2::ShrinkTileBf16;
    case IsaLevel::kScalar:
      break;
  }
  return lora_internal::reference::ShrinkTileBf16;
}

ExpandTileBf16Fn ExpandTileBf16ForIsa() {
  switch (ActiveIsa()) {
    case IsaLevel::kAvx512:
      return lora_internal::avx512::ExpandTileBf16;
    case IsaLevel::kAvx2:
      return lora_internal::avx2::ExpandTileBf16;
    case IsaLevel::kScalar:
      break;
  }
  return lora_internal::reference::ExpandTileBf16;
}

ExpandTileFn ExpandTileForIsa() {
  switch (ActiveIsa()) {
    case IsaLevel::kAvx512: return lora_internal::avx512::ExpandTile;
    case IsaLevel::kAvx2: return lora_internal::avx2::ExpandTile;
    case IsaLevel::kScalar: break;
  }
  return lora_internal::reference::ExpandTile;
}

bool Active(const LoraSegment& s, int64_t rank) { return rank > 0 && s.row_end > s.row_begin; }

struct ShrinkArgs {
  std::span<const LoraSegment> segments;
  std::span<const LoraShrinkWeight> weights;
  const float* x;
  int64_t x_stride, in;
  float* v;
  int64_t v_stride;
  int64_t total_cols;  // Σ rank over active segments
  ShrinkTileFn tile;
  ShrinkTileBf16Fn tile_bf16;
};

// Thread `ti` of `nt` computes its static slice of the flattened (segment, j) columns.
void ShrinkSlice(const ShrinkArgs& a, int ti, int nt) {
  int64_t begin, end;
  ThreadPool::Slice(a.total_cols, ti, nt, 1, &begin, &end);
  int64_t offset = 0;  // flattened index of the current segment's column 0
  for (const LoraSegment& s : a.segments) {
    if (offset >= end) break;
    const LoraShrinkWeight& w = a.weights[static_cast<size_t>(s.slot)];
    if (!Active(s, w.rank)) continue;
    const int64_t jb = std::max<int64_t>(begin - offset, 0);
    const int64_t je = std::min<int64_t>(end - offset, w.rank);
    if (jb < je && w.a_rows_bf16 != nullptr) {
      a.tile_bf16(a.x + s.row_begin * a.x_stride, a.x_stride, s.row_end - s.row_begin,
                  w.a_rows_bf16, a.in, jb, je, a.v + s.row_begin * a.v_stride, a.v_stride);
    } else if (jb < je) {
      a.tile(a.x + s.row_begin * a.x_stride, a.x_stride, s.row_end - s.row_begin, w.a_rows, a.in,
             jb, je, a.v + s.row_begin * a.v_stride, a.v_stride);
    }
    offset += w.rank;
  }
}

struct ExpandArgs {
  std::span<const LoraSegment> segments;
  std::span<const LoraExpandWeight> weights;
  const float* v;
  int64_t v_stride, out;
  float* y;
  int64_t y_stride;
  ExpandTileFn tile;
  ExpandTileBf16Fn tile_bf16;
};

// One segment's term over output columns [begin, end).
void ExpandSegment(const ExpandArgs& a, const LoraSegment& s, int64_t begin, int64_t end) {
  const LoraExpandWeight& w = a.weights[static_cast<size_t>(s.slot)];
  if (!Active(s, w.rank)) return;
  if (w.bt_rows_bf16 != nullptr) {
    a.tile_bf16(a.v + s.row_begin * a.v_stride + w.v_col, a.v_stride, s.row_end - s.row_begin,
                w.bt_rows_bf16, w.rank, w.scale, begin, end, a.y + s.row_begin * a.y_stride,
                a.y_stride);
  } else {
    a.tile(a.v + s.row_begin * a.v_stride + w.v_col, a.v_stride, s.row_end - s.row_begin,
           w.bt_rows, w.rank, w.scale, begin, end, a.y + s.row_begin * a.y_stride, a.y_stride);
  }
}

// Thread `ti` of `nt` adds every segment's term to its static slice of the output columns.
void ExpandSlice(const ExpandArgs& a, int ti, int nt) {
  int64_t begin, end;
  ThreadPool::Slice(a.out, ti, nt, kExpandColAlign, &begin, &end);
  if (begin >= end) return;
  for (const LoraSegment& s : a.segments) ExpandSegment(a, s, begin, end);
}

// Threads take whole segments from a shared counter, each over all `out` columns. Segments own
// disjoint rows of y, so nothing is shared; the order of the fma chain per element is the same
// as in ExpandSlice, so the values are too.
void ExpandSegments(const ExpandArgs& a, std::atomic<size_t>* next) {
  for (size_t i = next->fetch_add(1, std::memory_order_relaxed); i < a.segments.size();
       i = next->fetch_add(1, std::memory_order_relaxed)) {
    ExpandSegment(a, a.segments[i], 0, a.out);
  }
}

}  // namespace

void LoraShrink(std::span<const LoraSegment> segments, std::span<const LoraShrinkWeight> weights,
                const float* x, int64_t x_stride, int64_t in, float* v, int64_t v_stride,
                ThreadPool* pool) {
  int64_t total_cols = 0, macs = 0;
  for (const LoraSegment& s : segments) {
    CHORUS_CHECK(s.slot >= 0 && static_cast<size_t>(s.slot) < weights.size())
        << "LoRA segment slot " << s.slot << " of " << weights.size();
    const LoraShrinkWeight& w = weights[static_cast<size_t>(s.slot)];
    if (!Active(s, w.rank)) continue;
    CHORUS_CHECK((w.a_rows != nullptr || w.a_rows_bf16 != nullptr) && w.rank <= v_stride)
        << "rank " << w.rank;
    total_cols += w.rank;
    macs += (s.row_end - s.row_begin) * w.rank * in;
  }
  if (total_cols == 0) return;
  const ShrinkArgs args{segments, weights,  x,          x_stride,           in,
                        v,        v_stride, total_cols, ShrinkTileForIsa(), ShrinkTileBf16ForIsa()};
  if (pool == nullptr || pool->size() == 1 || macs < kMinParallelMacs) {
    ShrinkSlice(args, 0, 1);
    return;
  }
  const ShrinkArgs* p = &args;
  pool->Run([p](int ti, int nt) { ShrinkSlice(*p, ti, nt); });
}

void LoraExpand(std::span<const LoraSegment> segments, std::span<const LoraExpandWeight> weights,
                const float* v, int64_t v_stride, int64_t out, float* y, int64_t y_stride,
                ThreadPool* pool) {
  int64_t macs = 0, active = 0;
  for (const LoraSegment& s : segments) {
    CHORUS_CHECK(s.slot >= 0 && static_cast<size_t>(s.slot) < weights.size())
        << "LoRA segment slot " << s.slot << " of " << weights.size();
    const LoraExpandWeight& w = weights[static_cast<size_t>(s.slot)];
    if (!Active(s, w.rank)) continue;
    ++active;
    CHORUS_CHECK((w.bt_rows != nullptr || w.bt_rows_bf16 != nullptr) && w.v_col >= 0 &&
                 w.v_col + w.rank <= v_stride)
        << "rank " << w.rank << " at column " << w.v_col << " of " << v_stride;
    macs += (s.row_end - s.row_begin) * w.rank * out;
  }
  if (macs == 0) return;
  const ExpandArgs args{
      segments, weights, v, v_stride, out, y, y_stride, ExpandTileForIsa(), ExpandTileBf16ForIsa()};
  if (pool == nullptr || pool->size() == 1 || macs < kMinParallelMacs) {
    ExpandSlice(args, 0, 1);
    return;
  }
  const ExpandArgs* p = &args;
  // Many segments (decode rows on distinct adapters): split by segment, so each thread streams
  // whole Bᵀ rows. Splitting columns instead cuts every row in pieces: a k/v row of 256 columns
  // gave each thread 256 bytes per row (lora_bench, LORA_OUT=256 LORA_PHASE=2, 32 one-row
  // segments: 54 → 32 µs). With wide rows (q/o: 1024 columns per thread) the column split is
  // as good until there are many segments (8: 48 vs 53 µs, balance; 32: 187 vs 179 µs).
  // Few segments (prefill, one adapter): always columns, so every thread has work.
  const int64_t nt = static_cast<int64_t>(pool->size());
  if (active >= 4 * nt && (out / nt < 1024 || active >= 16 * nt)) {
    std::atomic<size_t> next{0};
    std::atomic<size_t>* n = &next;
    pool->Run([p, n](int, int) { ExpandSegments(*p, n); });
    return;
  }
  pool->Run([p](int ti, int n_threads) { ExpandSlice(*p, ti, n_threads); });
}

}  // namespace chorus::kernels
