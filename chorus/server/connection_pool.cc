#include "chorus/server/connection_pool.h"

#include <utility>

namespace chorus::server {

ConnectionPool::ConnectionPool(size_t max_threads)
    : max_threads_(max_threads > 0 ? max_threads : 1) {}

ConnectionPool::~ConnectionPool() { shutdown(); }

void ConnectionPool::enqueue(std::function<void()> fn) {
  Worker* wake = nullptr;
  {
    MutexLock lock(&mu_);
    if (shutdown_) return;
    if (!idle_.empty()) {
      wake = idle_.back();  // the most recently idle thread: its caches are warm
      idle_.pop_back();
      wake->job = std::move(fn);
    } else if (threads_.size() < max_threads_) {
      workers_.push_back(std::make_unique<Worker>());
      Worker* w = workers_.back().get();
      w->job = std::move(fn);
      threads_.emplace_back([this, w] { Run(w); });
    } else {
      waiting_.push_back(std::move(fn));
    }
  }
  if (wake) wake->cv.Signal();
}

void ConnectionPool::Run(Worker* w) {
  mu_.Lock();
  for (;;) {
    std::function<void()> job;
    if (w->job) {
      job = std::move(w->job);
      w->job = nullptr;
    } else if (!waiting_.empty()) {
      job = std::move(waiting_.front());
      waiting_.pop_front();
    } else if (shutdown_) {
      break;
    } else {
      idle_.push_back(w);
      while (!w->job && !shutdown_) w->cv.Wait(&mu_);
      if (!w->job) {  // shut down while idle: leave the idle stack, run what still waits
        for (size_t i = 0; i < idle_.size(); ++i) {
          if (idle_[i] == w) {
            idle_.erase(idle_.begin() + static_cast<std::ptrdiff_t>(i));
            break;
          }
        }
      }
      continue;
    }
    mu_.Unlock();
    job();
    job = nullptr;  // the connection's state is released before the thread waits again
    mu_.Lock();
  }
  mu_.Unlock();
}

void ConnectionPool::shutdown() {
  std::vector<std::thread> threads;
  {
    MutexLock lock(&mu_);
    if (joined_) return;
    joined_ = true;
    shutdown_ = true;
    for (auto& w : workers_) w->cv.Signal();
    threads.swap(threads_);
  }
  for (std::thread& t : threads) t.join();
}

size_t ConnectionPool::threads_started() const {
  MutexLock lock(&mu_);
  return workers_.size();
}

size_t ConnectionPool::threads_idle() const {
  MutexLock lock(&mu_);
  return idle_.size();
}

}  // namespace chorus::server
