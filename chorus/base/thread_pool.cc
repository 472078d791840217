#include "chorus/base/thread_pool.h"

#include <immintrin.h>

#include <algorithm>
#include <chrono>

namespace chorus {
namespace {
inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#endif
}
// How long a worker spins for the next job before sleeping on the condition variable.
constexpr auto kSpinBudget = std::chrono::microseconds(2000);
}  // namespace

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads <= 0)
    n_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  n_threads_ = n_threads;
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
}

ThreadPool::~ThreadPool() {
  {
    MutexLock lock(&mu_);
    stop_.store(true);
    generation_.fetch_add(1);
  }
  cv_.SignalAll();
  for (auto& t : workers_) t.join();
}

void ThreadPool::Run(const std::function<void(int, int)>& fn) {
  if (n_threads_ == 1) {
    fn(0, 1);
    return;
  }
  job_ = &fn;
  pending_.store(n_threads_ - 1, std::memory_order_relaxed);
  {
    // The lock orders the generation bump against a worker that is about to sleep.
    MutexLock lock(&mu_);
    generation_.fetch_add(1, std::memory_order_release);
  }
  if (sleepers_.load(std::memory_order_acquire) > 0) cv_.SignalAll();
  fn(0, n_threads_);
  // Spin briefly, then yield: on an oversubscribed machine a descheduled worker must get the
  // core back instead of waiting out our time slice.
  for (int spins = 0; pending_.load(std::memory_order_acquire) != 0; ++spins) {
    if (spins < 4096) {
      CpuRelax();
    } else {
      std::this_thread::yield();
    }
  }
  job_ = nullptr;
}

void ThreadPool::WorkerLoop(int index) {
  uint64_t seen = 0;
  for (;;) {
    auto spin_start = std::chrono::steady_clock::now();
    uint64_t gen;
    int spins = 0;
    while ((gen = generation_.load(std::memory_order_acquire)) == seen) {
      if (++spins < 4096) {
        CpuRelax();
      } else {
        std::this_thread::yield();
      }
      if (spins % 1024 == 0 && std::chrono::steady_clock::now() - spin_start > kSpinBudget) {
        MutexLock lock(&mu_);
        sleepers_.fetch_add(1);
        while (generation_.load(std::memory_order_acquire) == seen) cv_.Wait(&mu_);
        sleepers_.fetch_sub(1);
        spin_start = std::chrono::steady_clock::now();
      }
    }
    seen = gen;
    if (stop_.load()) return;
    (*job_)(index, n_threads_);
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::Slice(int64_t n, int i, int n_threads, int64_t align, int64_t* begin,
                       int64_t* end) {
  int64_t units = (n + align - 1) / align;
  int64_t per = units / n_threads, rem = units % n_threads;
  int64_t b = i * per + std::min<int64_t>(i, rem);
  int64_t e = b + per + (i < rem ? 1 : 0);
  *begin = std::min(n, b * align);
  *end = std::min(n, e * align);
}

}  // namespace chorus
