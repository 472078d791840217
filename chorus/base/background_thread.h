// BackgroundThread: one thread at a lower CPU priority (a higher nice value) that runs the tasks
// handed to it, in order, while each caller waits for its own. For work that should not take CPU
// from the engine's steps on a small machine: the adapter routes' reading, validating and
// fingerprinting of adapter files and their registry writes (5–18 ms of CPU each; on 2 vCPUs
// whose two compute threads already use both, that time came out of the requests running beside
// them — docs/hardening.md "What the soak found"). When the cores are idle it runs at full speed.
//
// Thread-safety: RunAndWait may be called from any number of threads.
#pragma once

#include <deque>
#include <functional>
#include <thread>

#include "chorus/base/mutex.h"

namespace chorus {

class BackgroundThread {
 public:
  // nice: the thread's Linux nice value (0–19; it only lowers the thread's own priority, which
  // needs no privilege). A refusal leaves it at the caller's priority.
  explicit BackgroundThread(int nice);
  ~BackgroundThread();  // runs what is queued, then joins
  BackgroundThread(const BackgroundThread&) = delete;
  BackgroundThread& operator=(const BackgroundThread&) = delete;

  // Runs fn on the thread; returns when it has returned.
  void RunAndWait(const std::function<void()>& fn);

 private:
  struct Task {
    const std::function<void()>* fn;
    bool done = false;
  };
  void Main(int nice);

  Mutex mu_;
  CondVar queued_, finished_;
  std::deque<Task*> tasks_ GUARDED_BY(mu_);
  bool stop_ GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace chorus
