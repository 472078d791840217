#include "chorus/base/background_thread.h"

#include <sys/resource.h>

namespace chorus {

BackgroundThread::BackgroundThread(int nice) : thread_([this, nice] { Main(nice); }) {}

BackgroundThread::~BackgroundThread() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  queued_.SignalAll();
  thread_.join();
}

void BackgroundThread::RunAndWait(const std::function<void()>& fn) {
  Task task{&fn};
  MutexLock lock(&mu_);
  tasks_.push_back(&task);
  queued_.Signal();
  while (!task.done) finished_.Wait(&mu_);
}

void BackgroundThread::Main(int nice) {
  (void)::setpriority(PRIO_PROCESS, 0, nice);  // Linux: `who` = 0 is the calling thread
  for (;;) {
    Task* task;
    {
      MutexLock lock(&mu_);
      while (tasks_.empty() && !stop_) queued_.Wait(&mu_);
      if (tasks_.empty()) return;  // stopping, nothing left
      task = tasks_.front();
      tasks_.pop_front();
    }
    (*task->fn)();
    {
      MutexLock lock(&mu_);
      task->done = true;  // the caller may return (and free the task) once this is seen
    }
    finished_.SignalAll();
  }
}

}  // namespace chorus
