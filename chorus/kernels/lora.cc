// Threading and run-time selection of the LoRA segment kernels (lora.h).
#include "chorus/kernels/lora.h"

#include <algorithm>
#include <array>
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

// The segment kernels' tiles at each ISA level: one table, indexed by IsaLevel.
struct LoraTiles {
  ShrinkTileFn shrink;
  ShrinkTileBf16Fn shrink_bf16;
  ExpandTileFn expand;
  ExpandTileBf16Fn expand_bf16;
};
constexpr LoraTiles kLoraTiles[] = {
    {lora_internal::reference::ShrinkTile, lora_internal::reference::ShrinkTileBf16,
     lora_internal::reference::ExpandTile, lora_internal::reference::ExpandTileBf16},
    {lora_internal::avx2::ShrinkTile, lora_internal::avx2::ShrinkTileBf16,
     lora_internal::avx2::ExpandTile, lora_internal::avx2::ExpandTileBf16},
    {lora_internal::avx512::ShrinkTile, lora_internal::avx512::ShrinkTileBf16,
     lora_internal::avx512::ExpandTile, lora_internal::avx512::ExpandTileBf16},
    // kAmx: the LoRA terms have no tile kernel yet; the AVX-512 ones run (docs/kernels.md).
    {lora_internal::avx512::ShrinkTile, lora_internal::avx512::ShrinkTileBf16,
     lora_internal::avx512::ExpandTile, lora_internal::avx512::ExpandTileBf16},
};
static_assert(static_cast<int>(IsaLevel::kScalar) == 0 && static_cast<int>(IsaLevel::kAvx2) == 1 &&
              static_cast<int>(IsaLevel::kAvx512) == 2 && static_cast<int>(IsaLevel::kAmx) == 3);

const LoraTiles& TilesForIsa() { return kLoraTiles[static_cast<int>(ActiveIsa())]; }

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

// The shrink's arguments with the active level's tiles.
ShrinkArgs MakeShrinkArgs(std::span<const LoraSegment> segments,
                          std::span<const LoraShrinkWeight> weights, const float* x,
                          int64_t x_stride, int64_t in, float* v, int64_t v_stride,
                          int64_t total_cols) {
  const LoraTiles& tiles = TilesForIsa();
  return {segments, weights,  x,          x_stride,     in,
          v,        v_stride, total_cols, tiles.shrink, tiles.shrink_bf16};
}

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

// One segment's whole shrink (all its rank columns).
void ShrinkSegment(const ShrinkArgs& a, const LoraSegment& s) {
  const LoraShrinkWeight& w = a.weights[static_cast<size_t>(s.slot)];
  if (!Active(s, w.rank)) return;
  if (w.a_rows_bf16 != nullptr) {
    a.tile_bf16(a.x + s.row_begin * a.x_stride, a.x_stride, s.row_end - s.row_begin, w.a_rows_bf16,
                a.in, 0, w.rank, a.v + s.row_begin * a.v_stride, a.v_stride);
  } else {
    a.tile(a.x + s.row_begin * a.x_stride, a.x_stride, s.row_end - s.row_begin, w.a_rows, a.in, 0,
           w.rank, a.v + s.row_begin * a.v_stride, a.v_stride);
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
    a.tile(a.v + s.row_begin * a.v_stride + w.v_col, a.v_stride, s.row_end - s.row_begin, w.bt_rows,
           w.rank, w.scale, begin, end, a.y + s.row_begin * a.y_stride, a.y_stride);
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

namespace {

// Checks the segments against the shrink weights; returns Σ rank, the multiply-adds and the
// number of segments with a term.
void CheckShrink(std::span<const LoraSegment> segments, std::span<const LoraShrinkWeight> weights,
                 int64_t in, int64_t v_stride, int64_t* total_cols, int64_t* macs,
                 int64_t* active) {
  *total_cols = 0;
  *macs = 0;
  *active = 0;
  for (const LoraSegment& s : segments) {
    CHORUS_CHECK(s.slot >= 0 && static_cast<size_t>(s.slot) < weights.size())
        << "LoRA segment slot " << s.slot << " of " << weights.size();
    const LoraShrinkWeight& w = weights[static_cast<size_t>(s.slot)];
    if (!Active(s, w.rank)) continue;
    CHORUS_CHECK((w.a_rows != nullptr || w.a_rows_bf16 != nullptr) && w.rank <= v_stride)
        << "rank " << w.rank;
    ++*active;
    *total_cols += w.rank;
    *macs += (s.row_end - s.row_begin) * w.rank * in;
  }
}

// Checks the segments against the expand weights; returns the multiply-adds and the number of
// segments with a term.
void CheckExpand(std::span<const LoraSegment> segments, std::span<const LoraExpandWeight> weights,
                 int64_t out, int64_t v_stride, int64_t* macs, int64_t* active) {
  *macs = 0;
  *active = 0;
  for (const LoraSegment& s : segments) {
    CHORUS_CHECK(s.slot >= 0 && static_cast<size_t>(s.slot) < weights.size())
        << "LoRA segment slot " << s.slot << " of " << weights.size();
    const LoraExpandWeight& w = weights[static_cast<size_t>(s.slot)];
    if (!Active(s, w.rank)) continue;
    CHORUS_CHECK((w.bt_rows != nullptr || w.bt_rows_bf16 != nullptr) && w.v_col >= 0 &&
                 w.v_col + w.rank <= v_stride)
        << "rank " << w.rank << " at column " << w.v_col << " of " << v_stride;
    ++*active;
    *macs += (s.row_end - s.row_begin) * w.rank * out;
  }
}

// Whether threads should take whole segments rather than split columns. Splitting columns cuts
// every Bᵀ row in pieces: a k/v row of 256 columns gave each thread 256 bytes per row
// (lora_bench, LORA_OUT=256 LORA_PHASE=2, 32 one-row segments: 54 → 32 µs). With wide rows
// (q/o: 1024 columns per thread) the column split is as good until there are many segments
// (8: 48 vs 53 µs, balance; 32: 187 vs 179 µs). Few segments (prefill, one adapter): columns,
// so every thread has work.
bool SplitBySegment(int64_t active, int64_t out, int64_t nt) {
  return active >= 4 * nt && (out / nt < 1024 || active >= 16 * nt);
}

// Segment indices with a shrink term, largest rank first (so the last segments taken from the
// shared counter are the small ones and the threads finish together). Fixed capacity, so a step
// allocates nothing (a call with more active segments takes the separate-calls path).
struct SegmentOrder {
  static constexpr size_t kCap = 512;
  std::array<int32_t, kCap> idx;
  size_t n = 0;
};
// Requires: at most SegmentOrder::kCap active segments.
void OrderByRank(std::span<const LoraSegment> segments, std::span<const LoraShrinkWeight> weights,
                 SegmentOrder* order) {
  order->n = 0;
  for (size_t i = 0; i < segments.size(); ++i)
    if (Active(segments[i], weights[static_cast<size_t>(segments[i].slot)].rank))
      order->idx[order->n++] = static_cast<int32_t>(i);
  std::stable_sort(
      order->idx.begin(), order->idx.begin() + static_cast<ptrdiff_t>(order->n),
      [&](int32_t a, int32_t b) {
        return weights[static_cast<size_t>(segments[static_cast<size_t>(a)].slot)].rank >
               weights[static_cast<size_t>(segments[static_cast<size_t>(b)].slot)].rank;
      });
}

}  // namespace

void LoraShrink(std::span<const LoraSegment> segments, std::span<const LoraShrinkWeight> weights,
                const float* x, int64_t x_stride, int64_t in, float* v, int64_t v_stride,
                ThreadPool* pool) {
  int64_t total_cols, macs, active;
  CheckShrink(segments, weights, in, v_stride, &total_cols, &macs, &active);
  if (total_cols == 0) return;
  const ShrinkArgs args =
      MakeShrinkArgs(segments, weights, x, x_stride, in, v, v_stride, total_cols);
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
  int64_t macs, active;
  CheckExpand(segments, weights, out, v_stride, &macs, &active);
  if (macs == 0) return;
  const ExpandArgs args{segments,
                        weights,
                        v,
                        v_stride,
                        out,
                        y,
                        y_stride,
                        TilesForIsa().expand,
                        TilesForIsa().expand_bf16};
  if (pool == nullptr || pool->size() == 1 || macs < kMinParallelMacs) {
    ExpandSlice(args, 0, 1);
    return;
  }
  const ExpandArgs* p = &args;
  if (SplitBySegment(active, out, static_cast<int64_t>(pool->size()))) {
    std::atomic<size_t> next{0};
    std::atomic<size_t>* n = &next;
    pool->Run([p, n](int, int) { ExpandSegments(*p, n); });
    return;
  }
  pool->Run([p](int ti, int n_threads) { ExpandSlice(*p, ti, n_threads); });
}

void LoraShrinkExpand(std::span<const LoraSegment> segments,
                      std::span<const LoraShrinkWeight> weights, const float* x, int64_t x_stride,
                      int64_t in, float* v, int64_t v_stride, std::span<const LoraExpandOut> outs,
                      ThreadPool* pool) {
  CHORUS_CHECK(!outs.empty() && outs.size() <= kMaxLoraExpandOuts)
      << "LoraShrinkExpand: " << outs.size() << " outputs";
  int64_t total_cols, macs, active;
  CheckShrink(segments, weights, in, v_stride, &total_cols, &macs, &active);
  for (const LoraExpandOut& o : outs) {
    int64_t expand_macs, expand_active;
    CheckExpand(segments, o.weights, o.out, v_stride, &expand_macs, &expand_active);
    macs += expand_macs;
  }
  const int64_t nt = pool == nullptr ? 1 : static_cast<int64_t>(pool->size());
  // One dispatch only where the expands would split by segment anyway (narrowest output).
  int64_t narrowest = outs[0].out;
  for (const LoraExpandOut& o : outs) narrowest = std::min(narrowest, o.out);
  if (total_cols == 0 || nt == 1 || macs < kMinParallelMacs ||
      !SplitBySegment(active, narrowest, nt) || active > static_cast<int64_t>(SegmentOrder::kCap)) {
    LoraShrink(segments, weights, x, x_stride, in, v, v_stride, pool);
    for (const LoraExpandOut& o : outs)
      LoraExpand(segments, o.weights, v, v_stride, o.out, o.y, o.y_stride, pool);
    return;
  }
  const ShrinkArgs shrink =
      MakeShrinkArgs(segments, weights, x, x_stride, in, v, v_stride, total_cols);
  std::array<ExpandArgs, kMaxLoraExpandOuts> expand;
  for (size_t o = 0; o < outs.size(); ++o) {
    expand[o] = ExpandArgs{segments,         outs[o].weights,      v,
                           v_stride,         outs[o].out,          outs[o].y,
                           outs[o].y_stride, TilesForIsa().expand, TilesForIsa().expand_bf16};
  }
  SegmentOrder order;
  OrderByRank(segments, weights, &order);
  std::atomic<size_t> next{0};
  pool->Run([&](int, int) {
    for (size_t i = next.fetch_add(1, std::memory_order_relaxed); i < order.n;
         i = next.fetch_add(1, std::memory_order_relaxed)) {
      const LoraSegment& s = segments[static_cast<size_t>(order.idx[i])];
      ShrinkSegment(shrink, s);
      for (size_t o = 0; o < outs.size(); ++o) ExpandSegment(expand[o], s, 0, outs[o].out);
    }
  });
}

}  // namespace chorus::kernels
