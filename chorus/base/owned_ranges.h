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
// A take is a locked compare-and-swap, and on x86 a locked instruction waits for every earlier
// load to complete: in a streaming kernel it drained the loads in flight at every unit (2.7 % of
// a q4_k_m batch-1 decode profile's samples sat on that one instruction, docs/kernels.md
// "Threads: units of weights").
// So the owner takes up to kMaxTake units per swap while its range is long (a quarter of what is
// left, so the last units still go one at a time and stay stealable), and hands them out from
// its own fields without atomics.
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
  // True when every unit has been taken by some thread (not necessarily finished or handed out:
  // a thread may hold a few it took together, which only it will compute).
  bool Empty() const;

  // Most units one take moves out of a range (a take is at most a quarter of the range).
  static constexpr uint32_t kMaxTake = 4;

 private:
  // One range as a packed [front, back) pair, so a take (front moves up) and a steal (back moves
  // down) are each a single compare-and-swap on one word. One cache line per range.
  struct alignas(64) Range {
    std::atomic<uint64_t> fb{0};
    // Units the owner took but has not handed out yet, [held, held_end): owner-only.
    uint32_t held = 0, held_end = 0;
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
