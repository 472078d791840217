// /metrics in the Prometheus text exposition format (version 0.0.4): engine gauges, counters
// and histograms (chorus::engine::EngineMetrics) plus HTTP request counters by route and status.
//
// Thread-safety: HttpCounters is thread-safe; RenderPrometheus reads snapshots.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>

#include "chorus/adapters/adapter_cache.h"
#include "chorus/base/mutex.h"
#include "chorus/engine/metrics.h"
#include "chorus/server/tenants.h"

namespace chorus::server {

class HttpCounters {
 public:
  // `route` must come from a fixed set (the server maps unknown paths to "other"), so the
  // number of series stays bounded.
  void Add(std::string_view route, int status);
  std::map<std::pair<std::string, int>, uint64_t> Snapshot() const;

 private:
  mutable Mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> counts_ GUARDED_BY(mu_);
};

// Renders every metric; `engine` may be null (still loading): engine series are then omitted.
// `kv_block_bytes` is the size of one KV block (for the pool bytes gauges; 0 = omit).
std::string RenderPrometheus(const engine::EngineMetrics* engine, const HttpCounters& http,
                             int64_t kv_block_bytes);

// ---- Adapter series ----

// Label value of the series that sums every adapter outside the top N. Parentheses are not
// allowed in adapter names, so it never collides with a real adapter.
inline constexpr std::string_view kOtherAdaptersLabel = "(other)";

struct AdapterExportOptions {
  size_t top_n = 16;       // adapters exported by name (most requests first); the rest are summed
  std::string base_label;  // the base model's label value (the served model name)
};

// Per-adapter request counters and TTFT histograms — label `adapter` = the top N adapter names,
// the base model (`base_label`) and kOtherAdaptersLabel — then, when `cache` is set, the host
// tier's hits / misses / loads / load latency / evictions / bytes, and when `registered` ≥ 0
// the number of registered adapters. Series count is bounded by top_n + 2 whatever the number
// of adapters.
std::string RenderAdapterPrometheus(const engine::AdapterMetrics& m,
                                    const adapters::AdapterCache::Stats* cache, int64_t registered,
                                    const AdapterExportOptions& opts);

// ---- What an inference gateway reads ----

struct GatewayExportOptions {
  std::string model_name;   // the served model name (label `model_name`)
  int64_t block_size = 16;  // tokens per KV block
  // Distinct adapters a step may run (--max-adapters-per-step; unlimited is reported as the
  // running-batch size, the most distinct adapters a step can hold).
  int64_t max_lora = 0;
};

// The model-server metrics of Kubernetes' Gateway API Inference Extension, under the vLLM
// names its reference endpoint picker scrapes by default: vllm:num_requests_waiting and
// vllm:num_requests_running (gauges, label model_name), vllm:kv_cache_usage_perc (KV blocks in
// use over pool pages, a 0..1 fraction), vllm:cache_config_info (value 1; labels block_size and
// num_gpu_blocks = the pool's pages) and vllm:lora_requests_info (labels max_lora,
// running_lora_adapters and waiting_lora_adapters, comma-separated names; value = Unix time of
// the last change). docs/deploy/kubernetes.md.
std::string RenderGatewayPrometheus(const engine::EngineMetrics& m,
                                    const GatewayExportOptions& opts);

// Per-tenant series (server/tenants.h), label `tenant`: chorus_tenant_requests_total (admitted),
// chorus_tenant_rejected_total{reason="max_concurrent"|"tokens_per_second"},
// chorus_tenant_tokens_total (prompt + completion tokens of finished requests),
// chorus_tenant_requests_in_flight (gauge).
std::string RenderTenantPrometheus(const std::vector<std::shared_ptr<Tenant>>& tenants);

// Escapes a label value for the text format: backslash, double quote and newline.
std::string EscapeLabelValue(std::string_view v);

}  // namespace chorus::server
