// /metrics in the Prometheus text exposition format (version 0.0.4): engine gauges, counters
// and histograms (chorus::engine::EngineMetrics) plus HTTP request counters by route and status.
//
// Thread-safety: HttpCounters is thread-safe; RenderPrometheus reads snapshots.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>

#include "chorus/engine/metrics.h"

namespace chorus::server {

class HttpCounters {
 public:
  // `route` must come from a fixed set (the server maps unknown paths to "other"), so the
  // number of series stays bounded.
  void Add(std::string_view route, int status);
  std::map<std::pair<std::string, int>, uint64_t> Snapshot() const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> counts_;  // guarded by mu_
};

// Renders every metric; `engine` may be null (still loading): engine series are then omitted.
// `kv_block_bytes` is the size of one KV block (for the pool bytes gauges; 0 = omit).
std::string RenderPrometheus(const engine::EngineMetrics* engine, const HttpCounters& http,
                             int64_t kv_block_bytes);

}  // namespace chorus::server
