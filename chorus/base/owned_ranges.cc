#include "chorus/base/owned_ranges.h"

#include <algorithm>

#include "chorus/base/check.h"

namespace chorus {

OwnedRanges::OwnedRanges(int64_t total, int n_threads) : n_(n_threads) {
  CHORUS_CHECK(n_threads >= 1) << "OwnedRanges: " << n_threads << " threads";
  CHORUS_CHECK(total >= 0 && total < (int64_t{1} << 31)) << "OwnedRanges: " << total << " units";
  if (n_ > kInline) heap_ = std::make_unique<Range[]>(static_cast<size_t>(n_));
  ranges_ = heap_ ? heap_.get() : inline_;
  for (int i = 0; i < n_; ++i) {
    const auto b = static_cast<uint32_t>(total * i / n_);
    const auto e = static_cast<uint32_t>(total * (i + 1) / n_);
    ranges_[i].fb.store(Pack(b, e), std::memory_order_relaxed);
  }
}

int64_t OwnedRanges::Next(int i) {
  Range& r = ranges_[i];
  if (r.held < r.held_end) return r.held++;
  std::atomic<uint64_t>& own = r.fb;
  for (;;) {
    uint64_t v = own.load(std::memory_order_relaxed);
    for (;;) {
      const auto f = static_cast<uint32_t>(v), b = static_cast<uint32_t>(v >> 32);
      if (f >= b) break;
      const uint32_t take = std::clamp<uint32_t>((b - f) / 4, 1, kMaxTake);
      if (own.compare_exchange_weak(v, Pack(f + take, b), std::memory_order_relaxed)) {
        r.held = f + 1;
        r.held_end = f + take;
        return f;
      }
    }
    if (!Steal(i)) return -1;
  }
}

// Moves the back half (at least one unit) of the largest other range into range i, which is
// empty. Only thread i stores to an empty range i (others only shrink non-empty ranges), so the
// plain store cannot lose a concurrent update.
bool OwnedRanges::Steal(int i) {
  for (;;) {
    int victim = -1;
    uint64_t best = 0, vv = 0;
    for (int d = 1; d < n_; ++d) {
      const int j = (i + d) % n_;
      const uint64_t v = ranges_[j].fb.load(std::memory_order_relaxed);
      const auto f = static_cast<uint32_t>(v), b = static_cast<uint32_t>(v >> 32);
      if (f < b && b - f > best) {
        best = b - f;
        victim = j;
        vv = v;
      }
    }
    if (victim < 0) return false;
    const auto f = static_cast<uint32_t>(vv), b = static_cast<uint32_t>(vv >> 32);
    const uint32_t mid = b - (b - f + 1) / 2;  // steal [mid, b): half, rounded up
    if (ranges_[victim].fb.compare_exchange_strong(vv, Pack(f, mid), std::memory_order_relaxed)) {
      ranges_[i].fb.store(Pack(mid, b), std::memory_order_relaxed);
      return true;
    }
    // The victim moved on (took or lost units): look again.
  }
}

bool OwnedRanges::Empty() const {
  for (int i = 0; i < n_; ++i) {
    const uint64_t v = ranges_[i].fb.load(std::memory_order_relaxed);
    if (static_cast<uint32_t>(v) < static_cast<uint32_t>(v >> 32)) return false;
  }
  return true;
}

}  // namespace chorus
