// Engine metrics: counters, gauges and fixed-bucket histograms, updated by the engine thread
// and read (as a snapshot) by the server's /metrics handler.
//
// Thread-safety: Histogram and EngineMetrics are thread-safe (atomics / a mutex per histogram).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "chorus/base/mutex.h"

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
  mutable Mutex mu_;
  std::vector<uint64_t> counts_ GUARDED_BY(mu_);  // [bounds + 1]
  double sum_ GUARDED_BY(mu_) = 0;
  uint64_t count_ GUARDED_BY(mu_) = 0;
};

// SLO attainment counters (docs/scheduling.md), counted per choice when it finishes: TTFT met or
// missed (a request aborted early because it would miss its TTFT SLO counts as missed), mean
// time per output token met or missed (choices with at least two tokens).
enum class SloCount { kTtftMet, kTtftMissed, kTpotMet, kTpotMissed };
inline constexpr size_t kSloCounts = 4;

// ---- Per-adapter series ----
// Request counters and TTFT histograms by adapter name ("" = the base model). Every name is
// tracked in memory (up to kMaxTracked names; later new names are folded into an overflow
// entry, so a stream of one-off names cannot grow memory without bound), but /metrics exports
// only the top N by requests plus one "other" series (see Top()), so the number of Prometheus
// series stays bounded whatever the number of adapters.
class AdapterMetrics {
 public:
  static constexpr size_t kMaxTracked = 65536;
  static const std::vector<double>& TtftBounds();  // the histogram's upper bounds (seconds)

  void CountRequest(const std::string& adapter);
  void ObserveTtft(const std::string& adapter, double seconds);
  void CountSlo(const std::string& adapter, SloCount which);

  struct Series {
    std::string adapter;  // "" = base model
    uint64_t requests = 0;
    Histogram::Snapshot ttft;
    std::array<uint64_t, kSloCounts> slo{};  // indexed by SloCount
  };
  struct Export {
    std::vector<Series> top;    // adapters (not the base), most requests first, ties by name
    Series base;                // the base model ("" name); zero when it had no request
    Series other;               // every other adapter, summed (bucket counts add up)
    size_t other_adapters = 0;  // names folded into `other`
  };
  // The `top_n` adapters with most requests, the base model, and the rest summed as `other`.
  Export Top(size_t top_n) const;

 private:
  struct Entry {
    uint64_t requests = 0;
    std::vector<uint64_t> counts;  // per bound, then +Inf (not cumulative)
    double sum = 0;
    uint64_t count = 0;
    std::array<uint64_t, kSloCounts> slo{};
  };
  Entry& EntryLocked(const std::string& adapter) REQUIRES(mu_);

  mutable Mutex mu_;
  std::unordered_map<std::string, Entry> entries_ GUARDED_BY(mu_);
  Entry overflow_ GUARDED_BY(mu_);  // names beyond kMaxTracked
};

// The adapters of the requests running and waiting now (distinct names, sorted; the base model
// is not listed), and when that last changed — what an inference gateway's LoRA-affinity
// routing reads (vllm:lora_requests_info, docs/deploy/kubernetes.md). The engine thread
// publishes it only when it changes.
class AdapterActivity {
 public:
  struct Snapshot {
    std::vector<std::string> running;
    std::vector<std::string> waiting;
    double updated_unix_seconds = 0;  // wall-clock time of the last change (0 = never)
  };
  // Returns false (and copies nothing) when `running` and `waiting` equal the published lists.
  bool Publish(const std::vector<const std::string*>& running,
               const std::vector<const std::string*>& waiting);
  Snapshot Get() const;

 private:
  mutable Mutex mu_;
  Snapshot snapshot_ GUARDED_BY(mu_);
};

struct EngineMetrics {
  std::atomic<int64_t> queue_length{0};
  std::atomic<int64_t> running{0};
  std::atomic<int64_t> kv_blocks_used{0};
  std::atomic<int64_t> kv_blocks_total{0};
  std::atomic<uint64_t> requests_total{0};
  std::atomic<uint64_t> requests_rejected{0};
  std::atomic<uint64_t> preemptions_total{0};
  std::atomic<uint64_t> line_skippers_preempted{0};  // of preemptions_total (--max-deltas)
  std::atomic<uint64_t> prompt_tokens_total{0};
  std::atomic<uint64_t> generation_tokens_total{0};
  std::atomic<uint64_t> steps_total{0};
  // Prefix caching (memory/prefix_cache.h): prompt tokens looked up at admission, how many were
  // found cached (their prefill skipped), full blocks cached (evictable ones count as free in
  // kv_blocks_used), blocks evicted.
  std::atomic<uint64_t> prefix_cache_query_tokens{0};
  std::atomic<uint64_t> prefix_cache_hit_tokens{0};
  std::atomic<int64_t> prefix_cache_blocks{0};
  std::atomic<uint64_t> prefix_cache_evictions{0};
  // SLO attainment (SloCount order), and requests answered 429 at once because they would miss
  // their TTFT SLO (policy slo, early abort).
  std::array<std::atomic<uint64_t>, kSloCounts> slo{};
  std::atomic<uint64_t> slo_aborted{0};
  // Requests the policy held back behind newer ones at least once (policy slo under a lasting
  // overload, engine/policy.h).
  std::atomic<uint64_t> slo_held_back{0};
  // The slo policy's cost correction (CostCorrection::factor) × 1000: how much slower (> 1000)
  // or faster the steps run than the cost model predicts.
  std::atomic<int64_t> slo_cost_correction_milli{1000};
  Histogram ttft_seconds{{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}};
  Histogram time_per_output_token_seconds{
      {0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.2, 0.5, 1, 2.5}};
  Histogram step_seconds{{0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2.5}};
  // Constrained decoding (docs/structured_outputs.md): masks computed by the mask worker while
  // the forward pass ran, the time it spent on them, and the time the engine thread still
  // waited for them after the forward pass (the part on the critical path); masks the matcher's
  // work bounds cut short (a hugely ambiguous grammar: the mask is narrowed, never widened).
  std::atomic<uint64_t> grammar_masks_total{0};
  std::atomic<uint64_t> grammar_masks_truncated{0};
  std::atomic<uint64_t> grammar_mask_micros{0};
  std::atomic<uint64_t> grammar_mask_wait_micros{0};
  AdapterMetrics adapters;           // per-adapter requests and TTFT
  AdapterActivity adapter_activity;  // adapters of running / waiting requests

  // Unified pool and adapter residency (docs/adapters.md; engine/adapter_residency.h).
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

  // --swap-full-models (engine/full_models.h): whole fine-tunes swapped in from disk.
  std::atomic<uint64_t> full_model_swaps{0};            // swap-ins completed
  std::atomic<uint64_t> full_model_swap_errors{0};      // swap-ins that failed
  std::atomic<uint64_t> full_model_evictions{0};        // resident models dropped for another
  std::atomic<uint64_t> full_model_swap_file_bytes{0};  // bytes of the files swapped in
  // Bytes the process read from storage during swap-ins (/proc/self/io read_bytes): below the
  // file bytes when the files came from the page cache.
  std::atomic<uint64_t> full_model_swap_read_bytes{0};
  std::atomic<int64_t> full_models_resident{0};
  Histogram full_model_swap_seconds{{0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32}};
};

}  // namespace chorus::engine
