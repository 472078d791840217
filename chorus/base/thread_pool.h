// ThreadPool: the one compute pool. Kernels split their output columns across threads —
// statically, or as owned runs of blocks that idle threads steal from (MatMul, OwnedRanges) — and
// never the reduction dimension, so a value never depends on which thread computed it or on thread
// timing (batch invariance, docs/architecture.md, "Kernels and batch invariance").
//
// Run(fn) calls fn(thread_index, n_threads) on every thread — the caller participates as
// thread 0 — and returns when all are done. Workers spin on an atomic generation counter
// between jobs for a bounded time (a condition variable costs tens of microseconds per
// wake-up, visible at ~30 tok/s × 22 layers × several ops), then sleep.
//
// Thread-safety: Run() must be called by one thread at a time (the engine thread).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "chorus/base/mutex.h"

namespace chorus {

class ThreadPool {
 public:
  // n_threads >= 1 (1 = the caller only). 0 means the number of online cores.
  explicit ThreadPool(int n_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Calls fn(i, size()) for i in [0, size()) concurrently; blocks until all return.
  void Run(const std::function<void(int, int)>& fn);

  // Static partition helper: the [begin, end) slice of `n` items that thread `i` of `n_threads`
  // owns, rounded to multiples of `align` (except the last slice).
  static void Slice(int64_t n, int i, int n_threads, int64_t align, int64_t* begin, int64_t* end);

 private:
  void WorkerLoop(int index);

  int n_threads_;
  std::vector<std::thread> workers_;
  const std::function<void(int, int)>* job_ = nullptr;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
  // The shared state above is atomic; mu_ only orders a generation_ bump (Run, the destructor)
  // against a worker that checks it and goes to sleep on cv_, so that wake-up is never lost.
  Mutex mu_;
  CondVar cv_;  // signalled after generation_ grows, when a worker sleeps
  std::atomic<int> sleepers_{0};
};

}  // namespace chorus
