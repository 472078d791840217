// TrainingGate: how a fine-tuning job runs as a scheduler client of the engine
// (docs/finetuning.md, "Training while serving"). The job's thread asks for each training
// iteration (Acquire) and the engine thread grants it between two inference steps (Grant): it
// hands over its compute pool and waits until the iteration ends (Release), so an iteration is
// atomic — no inference step runs during it — and training and inference never compete for the
// cores. When to grant is the engine's finetune policy (`deferred`: FineInfer's deferred
// continuous batching; `immediate`: only when no inference request is waiting or running).
//
// The gate also measures the iterations (IterationCost: a moving average of their wall time and
// of its deviation): the cost the deferred policy compares with each waiting request's remaining
// deferral bound.
//
// Thread-safety: all methods are thread-safe. One trainer at a time (the job queue runs one
// job); Grant is called by the engine thread only.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>

#include "chorus/base/thread_pool.h"

namespace chorus::engine {

// The cost of the next training iteration as the deferred policy must assume it
// (docs/finetuning.md, "Training while serving"): iterations vary (a packed micro-batch holds
// more or fewer tokens; a checkpoint step is longer), and a request deferred to the edge of its
// bound misses it whenever the iteration it waits for runs longer than assumed. So, as TCP
// estimates a retransmission timeout (Jacobson/Karels, RFC 6298), it keeps moving averages of
// the wall time and of its absolute deviation (weight 1/4 for the newest) and assumes
// mean + 2 · deviation — for times spread evenly over [lo, hi] that is about hi.
// Not thread-safe (TrainingGate guards it).
class IterationCost {
 public:
  void Add(double seconds);
  int64_t count() const { return n_; }
  double mean() const { return mean_; }            // 0 before the first
  double deviation() const { return deviation_; }  // the first sample counts as ± half itself
  double upper() const { return mean_ + 2 * deviation_; }

 private:
  int64_t n_ = 0;
  double mean_ = 0, deviation_ = 0;
};

// The cost of the step that admits deferred requests, as the deferred policy must assume it
// (docs/finetuning.md, "Training while serving"): the requests it defers are admitted together
// and the first token of each comes only after every deferred prompt was prefilled. On a real
// model a prompt row costs milliseconds (prefill is compute-bound, unlike a decode step, which
// costs about the same for 1 row as for 8), so a batch of deferred prompts can take many times
// one prefill step; an average over past prefill steps would undercount exactly the batches
// deferral builds. So the cost is modelled as a decode step plus a per-prompt-row cost, each a
// moving average (weight 1/4 for the newest) of the steps that ran: steps without prompt rows
// give the decode step, steps with p prompt rows give (time − decode step) / p per row.
// Not thread-safe (the engine thread owns it).
class AdmitCost {
 public:
  void Add(double seconds, int64_t prompt_rows);
  // The assumed time until the first token of every one of `prompt_rows` waiting prompt rows
  // (0 before any step ran).
  double Estimate(int64_t prompt_rows) const;
  double decode_step() const { return decode_s_; }
  double per_prompt_row() const { return row_s_; }

 private:
  double decode_s_ = 0, row_s_ = 0;
  double first_s_ = 0;  // the first step of either kind until a decode step was seen
};

class TrainingGate {
 public:
  // Trainer side. Attach/Detach bracket a job: while attached, the deferred policy keeps
  // deferring requests for the trainer's next iteration even in the short gaps between two.
  void Attach();
  void Detach();
  // Blocks until the engine grants an iteration and returns the pool to compute it on; null when
  // `cancel` becomes true or the gate is closed (the iteration must not run).
  ThreadPool* Acquire(const std::atomic<bool>* cancel);
  void Release();  // the granted iteration is over

  // Engine side.
  bool waiting() const { return waiting_.load(std::memory_order_acquire); }
  bool attached() const { return attached_.load(std::memory_order_acquire); }
  // Hands `pool` to the waiting trainer and blocks until it releases (or returns at once when
  // no trainer waits). Returns whether an iteration ran.
  bool Grant(ThreadPool* pool);
  // Waits until a trainer waits in Acquire, it detaches, or `until`.
  void WaitForTrainer(std::chrono::steady_clock::time_point until);
  // Refuses every later Acquire (engine shutdown). Idempotent.
  void Close();
  // Called (outside the gate's lock) when a trainer starts waiting: wakes the engine thread.
  void set_wake(std::function<void()> wake);

  // Moving average of granted iterations' wall time in seconds (0 before the first); the cost
  // the deferred policy assumes for the next one (IterationCost::upper); the count of
  // iterations and their total time.
  double iteration_seconds() const { return ema_s_.load(std::memory_order_relaxed); }
  double iteration_cost_seconds() const { return cost_s_.load(std::memory_order_relaxed); }
  int64_t iterations() const { return iterations_.load(std::memory_order_relaxed); }
  double busy_seconds() const { return busy_s_.load(std::memory_order_relaxed); }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::function<void()> wake_;
  std::atomic<bool> waiting_{false}, attached_{false};
  bool closed_ = false;
  ThreadPool* granted_ = nullptr;  // set by Grant for the waiting trainer
  bool running_ = false;           // between a grant and its Release
  IterationCost estimate_;         // guarded by mu_
  std::atomic<double> ema_s_{0}, cost_s_{0};
  std::atomic<int64_t> iterations_{0};
  std::atomic<double> busy_s_{0};
};

}  // namespace chorus::engine
