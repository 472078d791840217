// Engine metrics: counters, gauges and fixed-bucket histograms, updated by the engine thread
// and read (as a snapshot) by the server's /metrics handler.
//
// Thread-safety: Histogram and EngineMetrics are thread-safe (atomics / a mutex per histogram).
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <vector>

namespace chorus::engine {

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void Observe(double v);
  struct Snapshot {
    std::vector<double> bounds;
    std::vector<uint64_t> cumulative;  // per bound, then +Inf last
    double sum = 0;
    uint64_t count = 0;
  };
  Snapshot Get() const;

 private:
  std::vector<double> bounds_;
  mutable std::mutex mu_;
  std::vector<uint64_t> counts_;  // guarded by mu_; [bounds + 1]
  double sum_ = 0;                // guarded by mu_
  uint64_t count_ = 0;            // guarded by mu_
};

struct EngineMetrics {
  std::atomic<int64_t> queue_length{0};
  std::atomic<int64_t> running{0};
  std::atomic<int64_t> kv_blocks_used{0};
  std::atomic<int64_t> kv_blocks_total{0};
  std::atomic<uint64_t> requests_total{0};
  std::atomic<uint64_t> requests_rejected{0};
  std::atomic<uint64_t> preemptions_total{0};
  std::atomic<uint64_t> prompt_tokens_total{0};
  std::atomic<uint64_t> generation_tokens_total{0};
  std::atomic<uint64_t> steps_total{0};
  Histogram ttft_seconds{{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}};
  Histogram time_per_output_token_seconds{{0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.2, 0.5, 1, 2.5}};
  Histogram step_seconds{{0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2.5}};

  // Unified pool and adapter residency (DESIGN §3; engine/adapter_residency.h).
  std::atomic<int64_t> pool_pages_total{0};
  std::atomic<int64_t> pool_pages_kv{0};
  std::atomic<int64_t> pool_pages_adapter{0};
  std::atomic<int64_t> adapters_resident{0};        // pool copies ready
  std::atomic<int64_t> adapters_per_step_max{0};    // most distinct adapters seen in one step
  std::atomic<uint64_t> adapter_pool_hits{0};       // admissions whose adapter was resident
  std::atomic<uint64_t> adapter_pool_misses{0};     // admissions that started from the host copy
  std::atomic<uint64_t> adapter_pool_loads{0};      // pool copies completed
  std::atomic<uint64_t> adapter_pool_evictions{0};  // pool copies dropped for KV or unload
  std::atomic<uint64_t> adapter_disk_loads{0};      // disk→host loads run by the engine's loader
  std::atomic<uint64_t> adapter_disk_load_errors{0};  // ... that failed (request finished in error)
  Histogram adapter_pool_load_seconds{
      {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1}};
  Histogram adapter_disk_load_seconds{
      {0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10}};
};

}  // namespace chorus::engine
