// ConnectionPool: the HTTP server's worker threads (one per connection being served), as an
// httplib::TaskQueue (docs/hardening.md, "Soak").
//
// httplib's own ThreadPool starts all --max-connections (512) threads at once and wakes an
// arbitrary idle one per connection, so over hours every thread serves requests, and each keeps
// its own malloc thread cache and arena binding: the server's resident memory crept up by
// ~30 MiB over an hour of soak at 6 clients, freed only at exit (tools/soak.py; heaptrack showed
// no allocation outliving its use). This pool starts a thread only when no started one is idle
// and hands each connection to the most recently idle thread, so the threads that serve
// requests (and the memory they cache) follow the peak number of concurrent connections.
// Connections beyond `max_threads` wait in arrival order until a thread is free, as before.
//
// Thread-safety: enqueue() and shutdown() may be called from any thread; after shutdown()
// (which runs the jobs already queued and joins every thread) enqueue() drops the job.
#pragma once

#include <httplib.h>

#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "chorus/base/mutex.h"
#include "chorus/base/thread_annotations.h"

namespace chorus::server {

class ConnectionPool : public httplib::TaskQueue {
 public:
  explicit ConnectionPool(size_t max_threads);
  ~ConnectionPool() override;
  ConnectionPool(const ConnectionPool&) = delete;
  ConnectionPool& operator=(const ConnectionPool&) = delete;

  void enqueue(std::function<void()> fn) override;
  void shutdown() override;

  // Threads started so far (never more than max_threads).
  size_t threads_started() const;
  // Started threads waiting for a connection.
  size_t threads_idle() const;

 private:
  struct Worker {
    CondVar cv;
    std::function<void()> job;  // set by enqueue() while the worker is idle
  };
  void Run(Worker* w) EXCLUDES(mu_);

  const size_t max_threads_;
  mutable Mutex mu_;
  std::vector<std::unique_ptr<Worker>> workers_ GUARDED_BY(mu_);
  std::vector<std::thread> threads_ GUARDED_BY(mu_);
  std::vector<Worker*> idle_ GUARDED_BY(mu_);                  // a stack: back() went idle last
  std::deque<std::function<void()>> waiting_ GUARDED_BY(mu_);  // every thread busy
  bool shutdown_ GUARDED_BY(mu_) = false;
  bool joined_ GUARDED_BY(mu_) = false;
};

}  // namespace chorus::server
