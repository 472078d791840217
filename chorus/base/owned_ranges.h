// OwnedRanges: units [0, total) of one parallel job, split into one contiguous range per thread.
//
// Each thread takes the units of its own range front to back, so the memory it reads stays one
// address-ordered stream — what the hardware prefetcher follows best. A thread whose range is
// empty steals the back half of the largest remaining range and makes it its own, so a thread
// slowed down by a busy host does less of the work instead of holding the others at the end of
// the job.
//
// Why not one shared counter: with units dealt out in turn, each thread reads every other unit,
// and its stream restarts at every unit. Measured on a Zen 4 host whose read bandwidth is ~55
// GB/s (q4_0 decode at batch 1, TinyLlama shape, 2 threads): ~36 GB/s of weights with a shared
// counter, ~45 GB/s with contiguous ranges.
//
// Which thread computes a unit must not change its value (batch invariance, docs/architecture.md,
// "Kernels and batch invariance"): callers compute each unit independently of the others.
//
// Thread-safety: Next(i) may be called concurrently for distinct i; each thread index must be
// used by one thread at a time.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

namespace chorus {

class OwnedRanges {
 public:
  // total < 2^31 units; n_threads >= 1.
  OwnedRanges(int64_t total, int n_threads);

  // The next unit for thread i, or -1 once every unit has been handed out.
  int64_t Next(int i);
  // True when every unit has been handed out (not necessarily finished).
  bool Empty() const;

 private:
  // One range as a packed [front, back) pair, so a take (front + 1) and a steal (back moves
  // down) are each a single compare-and-swap on one word. One cache line per range.
  struct alignas(64) Range {
    std::atomic<uint64_t> fb{0};
  };
  static uint64_t Pack(uint32_t front, uint32_t back) {
    return static_cast<uint64_t>(back) << 32 | front;
  }
  bool Steal(int i);

  static constexpr int kInline = 8;  // ranges held inline; larger pools allocate
  int n_;
  Range inline_[kInline];
  std::unique_ptr<Range[]> heap_;
  Range* ranges_;
};

}  // namespace chorus
