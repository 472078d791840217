#include "chorus/server/prometheus.h"

#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace chorus::server {
namespace {

// Shortest decimal that reads back as `v` (so bucket bounds print as "0.025", not 0.0250...01).
std::string Num(double v) {
  char buf[64];
  // Integers print plainly ("10", not "1e+01", which %.1g would give).
  if (std::isfinite(v) && v == std::trunc(v) && std::fabs(v) < 1e15) {
    std::snprintf(buf, sizeof(buf), "%.0f", v);
    return buf;
  }
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof(buf), "%.*g", precision, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

void Header(std::string* out, const char* name, const char* type, const char* help) {
  *out += "# HELP ";
  *out += name;
  *out += ' ';
  *out += help;
  *out += "\n# TYPE ";
  *out += name;
  *out += ' ';
  *out += type;
  *out += '\n';
}

void Scalar(std::string* out, const char* name, const char* type, const char* help, double v) {
  Header(out, name, type, help);
  *out += name;
  *out += ' ';
  *out += Num(v);
  *out += '\n';
}

void Hist(std::string* out, const char* name, const char* help, const engine::Histogram& h) {
  Header(out, name, "histogram", help);
  const auto s = h.Get();
  for (size_t i = 0; i < s.bounds.size() && i < s.cumulative.size(); ++i) {
    *out += std::string(name) + "_bucket{le=\"" + Num(s.bounds[i]) + "\"} " +
            std::to_string(s.cumulative[i]) + "\n";
  }
  *out += std::string(name) + "_bucket{le=\"+Inf\"} " + std::to_string(s.count) + "\n";
  *out += std::string(name) + "_sum " + Num(s.sum) + "\n";
  *out += std::string(name) + "_count " + std::to_string(s.count) + "\n";
}

}  // namespace

void HttpCounters::Add(std::string_view route, int status) {
  MutexLock lock(&mu_);
  ++counts_[{std::string(route), status}];
}

std::map<std::pair<std::string, int>, uint64_t> HttpCounters::Snapshot() const {
  MutexLock lock(&mu_);
  return counts_;
}

namespace {
// Unified pool pages by kind and adapter residency (engine/adapter_residency.h).
void RenderPoolAndResidency(std::string* out, const engine::EngineMetrics& m) {
  Header(out, "chorus_pool_pages", "gauge",
         "Pages of the unified pool by kind (kv, adapter: adapters and deltas, free).");
  const int64_t kv = m.pool_pages_kv.load(), ad = m.pool_pages_adapter.load();
  *out += "chorus_pool_pages{kind=\"kv\"} " + std::to_string(kv) + "\n";
  *out += "chorus_pool_pages{kind=\"adapter\"} " + std::to_string(ad) + "\n";
  *out += "chorus_pool_pages{kind=\"free\"} " +
          std::to_string(m.pool_pages_total.load() - kv - ad) + "\n";
  Scalar(out, "chorus_adapters_resident", "gauge",
         "Adapters and deltas with a ready copy in pool pages.",
         static_cast<double>(m.adapters_resident.load()));
  Scalar(out, "chorus_adapter_pool_hits_total", "counter",
         "Admissions whose adapter or delta was resident in the pool.",
         static_cast<double>(m.adapter_pool_hits.load()));
  Scalar(out, "chorus_adapter_pool_misses_total", "counter",
         "Admissions whose adapter or delta was not resident (host copy used).",
         static_cast<double>(m.adapter_pool_misses.load()));
  Scalar(out, "chorus_adapter_pool_loads_total", "counter",
         "Adapter and delta copies into pool pages completed.",
         static_cast<double>(m.adapter_pool_loads.load()));
  Scalar(out, "chorus_adapter_pool_evictions_total", "counter",
         "Adapter and delta copies evicted from the pool (KV or unload).",
         static_cast<double>(m.adapter_pool_evictions.load()));
  Scalar(out, "chorus_adapter_disk_loads_total", "counter",
         "Adapter disk loads run by the engine's loader threads.",
         static_cast<double>(m.adapter_disk_loads.load()));
  Scalar(out, "chorus_adapter_disk_load_errors_total", "counter", "Adapter disk loads that failed.",
         static_cast<double>(m.adapter_disk_load_errors.load()));
  Hist(out, "chorus_adapter_pool_load_seconds",
       "Time to copy an adapter or a delta into pool pages.", m.adapter_pool_load_seconds);
  Hist(out, "chorus_adapter_disk_load_seconds", "Time to load an adapter from disk.",
       m.adapter_disk_load_seconds);
  // --swap-full-models (docs/deltas.md, "Swapping full models").
  Scalar(out, "chorus_full_model_swaps_total", "counter",
         "Whole fine-tunes swapped in from disk (--swap-full-models).",
         static_cast<double>(m.full_model_swaps.load()));
  Scalar(out, "chorus_full_model_swap_errors_total", "counter", "Swap-ins that failed.",
         static_cast<double>(m.full_model_swap_errors.load()));
  Scalar(out, "chorus_full_model_evictions_total", "counter",
         "Resident whole fine-tunes dropped to make room for another.",
         static_cast<double>(m.full_model_evictions.load()));
  Scalar(out, "chorus_full_model_swap_file_bytes_total", "counter",
         "Bytes of the model files swapped in.",
         static_cast<double>(m.full_model_swap_file_bytes.load()));
  Scalar(out, "chorus_full_model_swap_read_bytes_total", "counter",
         "Bytes the process read from storage during swap-ins (page-cache hits excluded).",
         static_cast<double>(m.full_model_swap_read_bytes.load()));
  Scalar(out, "chorus_full_models_resident", "gauge", "Whole fine-tunes resident now.",
         static_cast<double>(m.full_models_resident.load()));
  Hist(out, "chorus_full_model_swap_seconds",
       "Time to swap a whole fine-tune in (read, convert, repack).", m.full_model_swap_seconds);
}
}  // namespace

std::string RenderPrometheus(const engine::EngineMetrics* m, const HttpCounters& http,
                             int64_t kv_block_bytes) {
  std::string out;
  out.reserve(8192);
  if (m) {
    const double used = static_cast<double>(m->kv_blocks_used.load());
    const double total = static_cast<double>(m->kv_blocks_total.load());
    Scalar(&out, "chorus_queue_length", "gauge", "Requests (choices) waiting to run.",
           static_cast<double>(m->queue_length.load()));
    Scalar(&out, "chorus_running_sequences", "gauge", "Sequences in the running batch.",
           static_cast<double>(m->running.load()));
    Scalar(&out, "chorus_kv_blocks_used", "gauge", "KV cache blocks in use.", used);
    // Free pool pages: resident adapters share the pool (unified paging) and hold the rest.
    Scalar(&out, "chorus_kv_blocks_free", "gauge",
           "Pool pages free for KV blocks (resident adapter pages excluded).",
           total - used - static_cast<double>(m->pool_pages_adapter.load()));
    Scalar(&out, "chorus_kv_blocks_total", "gauge", "KV cache blocks in the pool.", total);
    if (kv_block_bytes > 0) {
      Scalar(&out, "chorus_pool_bytes_used", "gauge", "Pool bytes used by KV blocks.",
             used * static_cast<double>(kv_block_bytes));
    }
    Scalar(&out, "chorus_engine_requests_total", "counter", "Requests accepted by the engine.",
           static_cast<double>(m->requests_total.load()));
    Scalar(&out, "chorus_engine_requests_rejected_total", "counter",
           "Requests rejected because the queue was full.",
           static_cast<double>(m->requests_rejected.load()));
    Scalar(&out, "chorus_prefix_cache_query_tokens_total", "counter",
           "Prompt tokens looked up in the prefix cache at admission.",
           static_cast<double>(m->prefix_cache_query_tokens.load()));
    Scalar(&out, "chorus_prefix_cache_hit_tokens_total", "counter",
           "Prompt tokens found in the prefix cache (prefill skipped).",
           static_cast<double>(m->prefix_cache_hit_tokens.load()));
    Scalar(&out, "chorus_grammar_masks_total", "counter",
           "Allowed-token masks computed for grammar-constrained rows.",
           static_cast<double>(m->grammar_masks_total.load()));
    Scalar(&out, "chorus_grammar_mask_seconds_total", "counter",
           "Mask worker time spent computing them (overlaps the forward pass).",
           1e-6 * static_cast<double>(m->grammar_mask_micros.load()));
    Scalar(&out, "chorus_grammar_masks_truncated_total", "counter",
           "Masks cut short by the matcher's work bounds (a hugely ambiguous grammar; narrowed).",
           static_cast<double>(m->grammar_masks_truncated.load()));
    Scalar(&out, "chorus_prefix_cache_blocks", "gauge",
           "Full KV blocks held by the prefix cache (those no request uses are free to evict).",
           static_cast<double>(m->prefix_cache_blocks.load()));
    Scalar(&out, "chorus_prefix_cache_evictions_total", "counter",
           "Cached KV blocks evicted to make room.",
           static_cast<double>(m->prefix_cache_evictions.load()));
    {
      static constexpr const char* kSloNames[engine::kSloCounts][2] = {
          {"chorus_slo_ttft_met_total", "Finished choices whose first token met their TTFT SLO."},
          {"chorus_slo_ttft_missed_total",
           "Finished choices that missed their TTFT SLO (early-aborted requests included)."},
          {"chorus_slo_tpot_met_total",
           "Finished choices whose mean time per output token met their TPOT SLO."},
          {"chorus_slo_tpot_missed_total",
           "Finished choices whose mean time per output token missed their TPOT SLO."}};
      for (size_t i = 0; i < engine::kSloCounts; ++i)
        Scalar(&out, kSloNames[i][0], "counter", kSloNames[i][1],
               static_cast<double>(m->slo[i].load()));
      Scalar(&out, "chorus_slo_aborted_total", "counter",
             "Requests answered 429 at once because they would miss their TTFT SLO (policy slo).",
             static_cast<double>(m->slo_aborted.load()));
      Scalar(&out, "chorus_slo_held_back_total", "counter",
             "Requests held back behind newer ones at least once under a lasting overload "
             "(policy slo).",
             static_cast<double>(m->slo_held_back.load()));
      Scalar(&out, "chorus_slo_cost_correction", "gauge",
             "Measured step time over the cost model's prediction, as policy slo applies it "
             "(1: as profiled; learned while serving).",
             static_cast<double>(m->slo_cost_correction_milli.load()) / 1000.0);
    }
    Scalar(&out, "chorus_preemptions_total", "counter",
           "Sequences preempted (KV freed, recomputed later).",
           static_cast<double>(m->preemptions_total.load()));
    Scalar(&out, "chorus_delta_line_skippers_preempted_total", "counter",
           "Requests for a delta that skipped the line (--max-deltas) preempted when the requests "
           "of their delta they joined had finished, so that another delta's request could run.",
           static_cast<double>(m->line_skippers_preempted.load()));
    Scalar(&out, "chorus_prompt_tokens_total", "counter", "Prompt tokens computed (prefill rows).",
           static_cast<double>(m->prompt_tokens_total.load()));
    Scalar(&out, "chorus_generation_tokens_total", "counter", "Tokens generated.",
           static_cast<double>(m->generation_tokens_total.load()));
    Scalar(&out, "chorus_engine_steps_total", "counter", "Engine steps run.",
           static_cast<double>(m->steps_total.load()));
    Hist(&out, "chorus_time_to_first_token_seconds",
         "Time from submission to the first generated token.", m->ttft_seconds);
    Hist(&out, "chorus_time_per_output_token_seconds",
         "Time between consecutive generated tokens of a sequence.",
         m->time_per_output_token_seconds);
    Hist(&out, "chorus_step_seconds", "Duration of one engine step.", m->step_seconds);
    RenderPoolAndResidency(&out, *m);
  }
  Header(&out, "chorus_http_requests_total", "counter", "HTTP requests by route and status code.");
  for (const auto& [key, n] : http.Snapshot()) {
    out += "chorus_http_requests_total{route=\"" + key.first + "\",status=\"" +
           std::to_string(key.second) + "\"} " + std::to_string(n) + "\n";
  }
  return out;
}

// ---- Adapter series ----

std::string RenderTenantPrometheus(const std::vector<std::shared_ptr<Tenant>>& tenants) {
  std::string out;
  std::vector<std::pair<std::string, Tenant::Stats>> rows;
  for (const auto& t : tenants) rows.emplace_back(EscapeLabelValue(t->name()), t->stats());
  Header(&out, "chorus_tenant_requests_total", "counter", "Requests admitted, by tenant.");
  for (const auto& [n, s] : rows)
    out += "chorus_tenant_requests_total{tenant=\"" + n + "\"} " + Num(s.requests) + "\n";
  Header(&out, "chorus_tenant_rejected_total", "counter",
         "Requests refused with 429 by a tenant limit, by tenant and limit.");
  for (const auto& [n, s] : rows) {
    out += "chorus_tenant_rejected_total{tenant=\"" + n + "\",reason=\"max_concurrent\"} " +
           Num(s.rejected_concurrency) + "\n";
    out += "chorus_tenant_rejected_total{tenant=\"" + n + "\",reason=\"tokens_per_second\"} " +
           Num(s.rejected_rate) + "\n";
  }
  Header(&out, "chorus_tenant_tokens_total", "counter",
         "Prompt and completion tokens of finished requests, by tenant.");
  for (const auto& [n, s] : rows)
    out += "chorus_tenant_tokens_total{tenant=\"" + n + "\"} " + Num(s.tokens) + "\n";
  Header(&out, "chorus_tenant_requests_in_flight", "gauge", "Requests running, by tenant.");
  for (const auto& [n, s] : rows)
    out += "chorus_tenant_requests_in_flight{tenant=\"" + n + "\"} " + Num(s.in_flight) + "\n";
  return out;
}

std::string EscapeLabelValue(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

namespace {

void AdapterHist(std::string* out, const char* name, const std::string& label,
                 const engine::Histogram::Snapshot& s) {
  const std::string l = "adapter=\"" + EscapeLabelValue(label) + "\"";
  for (size_t i = 0; i < s.bounds.size() && i < s.cumulative.size(); ++i) {
    *out += std::string(name) + "_bucket{" + l + ",le=\"" + Num(s.bounds[i]) + "\"} " +
            std::to_string(s.cumulative[i]) + "\n";
  }
  *out += std::string(name) + "_bucket{" + l + ",le=\"+Inf\"} " + std::to_string(s.count) + "\n";
  *out += std::string(name) + "_sum{" + l + "} " + Num(s.sum) + "\n";
  *out += std::string(name) + "_count{" + l + "} " + std::to_string(s.count) + "\n";
}

}  // namespace

std::string RenderAdapterPrometheus(const engine::AdapterMetrics& m,
                                    const adapters::AdapterCache::Stats* cache, int64_t registered,
                                    const AdapterExportOptions& opts) {
  std::string out;
  const auto ex = m.Top(opts.top_n);
  // Series in a fixed order: the base, the top adapters, then (other).
  std::vector<const engine::AdapterMetrics::Series*> series;
  std::vector<std::string> labels;
  series.push_back(&ex.base);
  labels.push_back(opts.base_label);
  for (const auto& s : ex.top) {
    series.push_back(&s);
    labels.push_back(s.adapter);
  }
  series.push_back(&ex.other);
  labels.push_back(std::string(kOtherAdaptersLabel));

  Header(&out, "chorus_adapter_requests_total", "counter",
         "Requests accepted by the engine, by adapter (top N adapters by requests, the base model, "
         "and (other)).");
  for (size_t i = 0; i < series.size(); ++i) {
    out += "chorus_adapter_requests_total{adapter=\"" + EscapeLabelValue(labels[i]) + "\"} " +
           std::to_string(series[i]->requests) + "\n";
  }
  Header(&out, "chorus_adapter_time_to_first_token_seconds", "histogram",
         "Time from submission to the first generated token, by adapter (same labels as "
         "chorus_adapter_requests_total).");
  for (size_t i = 0; i < series.size(); ++i)
    AdapterHist(&out, "chorus_adapter_time_to_first_token_seconds", labels[i], series[i]->ttft);
  static constexpr const char* kAdapterSloNames[engine::kSloCounts] = {
      "chorus_adapter_slo_ttft_met_total", "chorus_adapter_slo_ttft_missed_total",
      "chorus_adapter_slo_tpot_met_total", "chorus_adapter_slo_tpot_missed_total"};
  for (size_t k = 0; k < engine::kSloCounts; ++k) {
    Header(&out, kAdapterSloNames[k], "counter",
           "chorus_slo_* by adapter (same labels as chorus_adapter_requests_total).");
    for (size_t i = 0; i < series.size(); ++i) {
      out += std::string(kAdapterSloNames[k]) + "{adapter=\"" + EscapeLabelValue(labels[i]) +
             "\"} " + std::to_string(series[i]->slo[k]) + "\n";
    }
  }
  Scalar(&out, "chorus_adapter_other_adapters", "gauge", "Adapters folded into the (other) series.",
         static_cast<double>(ex.other_adapters));
  if (registered >= 0) {
    Scalar(&out, "chorus_adapters_registered", "gauge", "Adapters in the registry.",
           static_cast<double>(registered));
  }
  if (cache) {
    Scalar(&out, "chorus_adapter_host_cache_hits_total", "counter",
           "Adapter lookups served from the host tier.", static_cast<double>(cache->hits));
    Scalar(&out, "chorus_adapter_host_cache_misses_total", "counter",
           "Adapter lookups that missed the host tier.", static_cast<double>(cache->misses));
    Scalar(&out, "chorus_adapter_host_cache_evictions_total", "counter",
           "Adapters evicted from the host tier (LRU).", static_cast<double>(cache->evictions));
    Scalar(&out, "chorus_adapter_load_errors_total", "counter",
           "Adapter loads from disk that failed.", static_cast<double>(cache->load_errors));
    Header(&out, "chorus_adapter_load_seconds", "histogram",
           "Duration of adapter loads from disk into the host tier.");
    {
      const auto& bounds = adapters::AdapterCache::LoadSecondsBounds();
      uint64_t cumulative = 0;
      for (size_t i = 0; i < bounds.size(); ++i) {
        if (i < cache->load_seconds_buckets.size()) cumulative += cache->load_seconds_buckets[i];
        out += "chorus_adapter_load_seconds_bucket{le=\"" + Num(bounds[i]) + "\"} " +
               std::to_string(cumulative) + "\n";
      }
      out +=
          "chorus_adapter_load_seconds_bucket{le=\"+Inf\"} " + std::to_string(cache->loads) + "\n";
    }
    out += "chorus_adapter_load_seconds_sum " + Num(cache->load_seconds_total) + "\n";
    out += "chorus_adapter_load_seconds_count " + std::to_string(cache->loads) + "\n";
    Scalar(&out, "chorus_adapter_last_load_seconds", "gauge",
           "Duration of the most recent adapter load.", cache->last_load_seconds);
    Scalar(&out, "chorus_adapter_host_cache_bytes", "gauge",
           "Bytes of decoded adapters in the host tier.", static_cast<double>(cache->bytes));
    Scalar(&out, "chorus_adapter_host_cache_entries", "gauge", "Adapters in the host tier.",
           static_cast<double>(cache->entries));
    Scalar(&out, "chorus_adapter_host_arena_bytes", "gauge",
           "Size of the host tier's arena (decoded adapters and deltas are built there).",
           static_cast<double>(cache->arena_bytes));
    Scalar(&out, "chorus_adapter_host_arena_prefaulted_bytes", "gauge",
           "Bytes of the host arena made resident by the start-up prefault so far.",
           static_cast<double>(cache->arena_prefaulted_bytes));
    Scalar(&out, "chorus_adapter_host_arena_used_bytes", "gauge",
           "Bytes of the host arena held by decoded adapters and deltas.",
           static_cast<double>(cache->arena_used_bytes));
  }
  return out;
}

std::string RenderGatewayPrometheus(const engine::EngineMetrics& m,
                                    const GatewayExportOptions& opts) {
  std::string out;
  const std::string model = "{model_name=\"" + EscapeLabelValue(opts.model_name) + "\"} ";
  auto gauge = [&](const char* name, const char* help, double v) {
    Header(&out, name, "gauge", help);
    out += name + model + Num(v) + "\n";
  };
  gauge("vllm:num_requests_running", "Requests (choices) in the running batch.",
        static_cast<double>(m.running.load()));
  gauge("vllm:num_requests_waiting", "Requests (choices) waiting to run.",
        static_cast<double>(m.queue_length.load()));
  const int64_t total = m.kv_blocks_total.load();
  gauge("vllm:kv_cache_usage_perc", "KV-cache usage: blocks in use over pool pages (1 = full).",
        total > 0 ? static_cast<double>(m.kv_blocks_used.load()) / static_cast<double>(total) : 0);
  Header(&out, "vllm:cache_config_info", "gauge", "KV-cache configuration (value 1).");
  out += "vllm:cache_config_info{block_size=\"" + std::to_string(opts.block_size) +
         "\",num_gpu_blocks=\"" + std::to_string(total) + "\"} 1\n";
  const engine::AdapterActivity::Snapshot a = m.adapter_activity.Get();
  auto join = [](const std::vector<std::string>& names) {
    std::string s;
    for (const std::string& n : names) s += (s.empty() ? "" : ",") + n;
    return EscapeLabelValue(s);
  };
  Header(
      &out, "vllm:lora_requests_info", "gauge",
      "Adapters of running and waiting requests; the value is the Unix time of the last change.");
  out += "vllm:lora_requests_info{max_lora=\"" + std::to_string(opts.max_lora) +
         "\",running_lora_adapters=\"" + join(a.running) + "\",waiting_lora_adapters=\"" +
         join(a.waiting) + "\"} " + Num(a.updated_unix_seconds) + "\n";
  return out;
}

}  // namespace chorus::server
