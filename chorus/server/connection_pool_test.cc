#include "chorus/server/connection_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <set>
#include <thread>

#include "chorus/base/mutex.h"

namespace chorus::server {
namespace {

// Sequential jobs all run on the one thread that went idle last: the pool does not spread them
// over threads (httplib's ThreadPool woke an arbitrary one of its 512, so every thread ended up
// holding its own malloc caches; docs/hardening.md).
TEST(ConnectionPool, SequentialJobsReuseOneThread) {
  ConnectionPool pool(64);
  Mutex mu;
  std::set<std::thread::id> ids;
  std::atomic<int> done{0};
  for (int i = 0; i < 200; ++i) {
    pool.enqueue([&] {
      MutexLock lock(&mu);
      ids.insert(std::this_thread::get_id());
      done.fetch_add(1);
    });
    while (done.load() <= i || pool.threads_idle() < pool.threads_started())
      std::this_thread::yield();
  }
  pool.shutdown();
  EXPECT_EQ(done.load(), 200);
  EXPECT_EQ(pool.threads_started(), 1u);
  EXPECT_EQ(ids.size(), 1u);
}

// k jobs at once start k threads, never more than max_threads; jobs beyond it wait and run.
TEST(ConnectionPool, ThreadsFollowConcurrencyUpToTheCap) {
  ConnectionPool pool(4);
  Mutex mu;
  CondVar cv;
  bool release = false;
  std::atomic<int> running{0}, peak{0}, done{0};
  for (int i = 0; i < 10; ++i) {
    pool.enqueue([&] {
      const int now = running.fetch_add(1) + 1;
      int p = peak.load();
      while (now > p && !peak.compare_exchange_weak(p, now)) {
      }
      {
        MutexLock lock(&mu);
        while (!release) cv.Wait(&mu);
      }
      running.fetch_sub(1);
      done.fetch_add(1);
    });
  }
  while (running.load() < 4) std::this_thread::yield();
  EXPECT_EQ(pool.threads_started(), 4u);
  {
    MutexLock lock(&mu);
    release = true;
  }
  cv.SignalAll();
  while (done.load() < 10) std::this_thread::yield();
  EXPECT_EQ(peak.load(), 4);
  EXPECT_EQ(pool.threads_started(), 4u);
  pool.shutdown();
}

// shutdown() runs the jobs already waiting, joins, and drops later ones.
TEST(ConnectionPool, ShutdownRunsWaitingJobsThenDropsNewOnes) {
  std::atomic<int> done{0};
  ConnectionPool pool(1);
  for (int i = 0; i < 5; ++i)
    pool.enqueue([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      done.fetch_add(1);
    });
  pool.shutdown();
  EXPECT_EQ(done.load(), 5);
  pool.enqueue([&] { done.fetch_add(1); });
  pool.shutdown();  // idempotent
  EXPECT_EQ(done.load(), 5);
}

}  // namespace
}  // namespace chorus::server
