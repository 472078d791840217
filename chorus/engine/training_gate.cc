#include "chorus/engine/training_gate.h"

#include <algorithm>
#include <cmath>

namespace chorus::engine {

namespace {
// Weight of the newest iteration in the moving averages: the cost follows a change of batch
// shape within a few iterations, while one slow iteration (a checkpoint) moves it by a quarter.
constexpr double kEmaWeight = 0.25;
// Acquire re-checks the cancel flag this often while it waits (a cancel never waits for the
// engine to become free).
constexpr auto kCancelPoll = std::chrono::milliseconds(20);
}  // namespace

void IterationCost::Add(double seconds) {
  if (n_++ == 0) {
    mean_ = seconds;
    deviation_ = seconds / 2;  // RFC 6298's start: unsure until a second sample
    return;
  }
  deviation_ = (1 - kEmaWeight) * deviation_ + kEmaWeight * std::abs(seconds - mean_);
  mean_ = (1 - kEmaWeight) * mean_ + kEmaWeight * seconds;
}

void AdmitCost::Add(double seconds, int64_t prompt_rows) {
  if (prompt_rows <= 0) {
    decode_s_ = decode_s_ == 0 ? seconds : (1 - kEmaWeight) * decode_s_ + kEmaWeight * seconds;
    return;
  }
  if (first_s_ == 0) first_s_ = seconds;
  // Until a decode step was measured the whole step counts per row (an overestimate).
  const double row = std::max(0.0, seconds - decode_s_) / static_cast<double>(prompt_rows);
  row_s_ = row_s_ == 0 ? row : (1 - kEmaWeight) * row_s_ + kEmaWeight * row;
}

double AdmitCost::Estimate(int64_t prompt_rows) const {
  const double step = decode_s_ > 0 ? decode_s_ : first_s_;
  return step + row_s_ * static_cast<double>(std::max<int64_t>(prompt_rows, 0));
}

void TrainingGate::Attach() { attached_.store(true, std::memory_order_release); }

void TrainingGate::Detach() {
  {
    std::lock_guard<std::mutex> l(mu_);
    attached_.store(false, std::memory_order_release);
  }
  cv_.notify_all();
  std::function<void()> wake;
  {
    std::lock_guard<std::mutex> l(mu_);
    wake = wake_;
  }
  if (wake) wake();
}

void TrainingGate::set_wake(std::function<void()> wake) {
  std::lock_guard<std::mutex> l(mu_);
  wake_ = std::move(wake);
}

ThreadPool* TrainingGate::Acquire(const std::atomic<bool>* cancel) {
  std::function<void()> wake;
  {
    std::unique_lock<std::mutex> l(mu_);
    if (closed_) return nullptr;
    waiting_.store(true, std::memory_order_release);
    wake = wake_;
  }
  cv_.notify_all();  // an engine in WaitForTrainer
  if (wake) wake();
  std::unique_lock<std::mutex> l(mu_);
  for (;;) {
    if (granted_ != nullptr) {
      ThreadPool* pool = granted_;
      granted_ = nullptr;
      waiting_.store(false, std::memory_order_release);
      running_ = true;
      return pool;
    }
    if (closed_ || (cancel != nullptr && cancel->load())) {
      waiting_.store(false, std::memory_order_release);
      return nullptr;
    }
    cv_.wait_for(l, kCancelPoll);
  }
}

void TrainingGate::Release() {
  {
    std::lock_guard<std::mutex> l(mu_);
    running_ = false;
  }
  cv_.notify_all();
}

bool TrainingGate::Grant(ThreadPool* pool) {
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> l(mu_);
  if (!waiting_.load() || closed_) return false;
  granted_ = pool;
  cv_.notify_all();
  // Until the trainer took the grant and released it (or gave up waiting before taking it).
  cv_.wait(l, [&] { return (granted_ == nullptr && !running_) || closed_; });
  if (granted_ != nullptr) {  // closed before the trainer took it
    granted_ = nullptr;
    return false;
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  iterations_.fetch_add(1, std::memory_order_relaxed);
  busy_s_.store(busy_s_.load(std::memory_order_relaxed) + s, std::memory_order_relaxed);
  estimate_.Add(s);
  ema_s_.store(estimate_.mean(), std::memory_order_relaxed);
  cost_s_.store(estimate_.upper(), std::memory_order_relaxed);
  return true;
}

void TrainingGate::WaitForTrainer(std::chrono::steady_clock::time_point until) {
  std::unique_lock<std::mutex> l(mu_);
  cv_.wait_until(l, until, [&] { return waiting_.load() || !attached_.load() || closed_; });
}

void TrainingGate::Close() {
  {
    std::lock_guard<std::mutex> l(mu_);
    closed_ = true;
  }
  cv_.notify_all();
}

}  // namespace chorus::engine
