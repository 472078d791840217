// chorus_bench_serve — open-loop load generator for `chorus serve` (docs/benchmarks.md).
//
// Sends streaming /v1/completions requests over real HTTP at gamma-distributed arrival times
// (shape 1/cv², scale cv²/R; cv = 1 is Poisson) with the `slora` workload's shapes (input and
// output lengths uniform in [min, max)). With --adapters N the `model` field names one of the
// first N adapters the server lists in /v1/models (sorted by name): adapter id = floor(u·N),
// u ~ power(alpha) (S-LoRA; alpha = 1 is uniform), zipf (P(k) ∝ 1/(k+1)^s, DeltaZip's
// popularity; whole fine-tunes of `chorus serve --swap-full-models` count as adapters here), or
// round-robin; the summary then splits TTFT
// into cold requests (the first of this run to use its adapter) and warm ones. --compare-base
// sends the same plan again without adapters and reports adapter / base-only throughput. Prompts
// are random token ids so their lengths are exact; `ignore_eos` makes output lengths exact. Reports
// throughput (req/s, tokens/s), TTFT and time per output token (p50/p90/p99), end-to-end latency
// and errors, as PREFIX.csv (one row per request) and PREFIX.json (summary); tools/plot.py
// requests PREFIX.csv plots them.
//
// Open loop: each request is sent at its arrival time on its own thread whatever the server is
// doing, so overload shows up as growing TTFT rather than as a slower client.
//
// Saturation ("steady_state" in the summary): whole-run throughput mixes the ramp-up and the
// drain, when the server runs fewer sequences than it could. The steady-state window is the first
// stretch during which at least K requests are in flight (K = --saturation, e.g. the server's
// --max-running; default the peak in flight); the generated tokens whose SSE chunks arrived in
// it (per-token timestamps) over its length are the saturation rate. A poller samples the
// server's /metrics meanwhile, which gives the server's own view of the same window: tokens/s,
// mean running sequences, tokens per engine step and the share of wall time spent in steps.
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "apps/chorus/flags.h"

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

struct Planned {
  double arrival_s = 0;
  int input_tokens = 0;
  int output_tokens = 0;
  std::vector<int> prompt;
  int adapter = -1;   // index into the adapter names; -1 = base model
  bool cold = false;  // first request of this run to use its adapter
};

struct Outcome {
  int status = 0;  // HTTP status; 0 = connection failure
  std::string error;
  double ttft_s = -1;     // send → first text chunk
  double latency_s = -1;  // send → [DONE]
  double tpot_s = -1;     // (last token − first token) / (tokens − 1)
  int64_t completion_tokens = 0;
  int64_t prompt_tokens = 0;
  // Seconds since the run's start: when the request was sent and ended, and when each chunk
  // carrying a token arrived (for the steady-state window).
  double send_s = -1, end_s = -1;
  std::vector<double> token_times_s;
};

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  const double idx = p / 100.0 * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(idx)), hi = static_cast<size_t>(std::ceil(idx));
  return v[lo] + (v[hi] - v[lo]) * (idx - static_cast<double>(lo));
}

json Stats(const std::vector<double>& v) {
  if (v.empty()) return nullptr;
  double sum = 0;
  for (double x : v) sum += x;
  return {{"mean", sum / static_cast<double>(v.size())},
          {"p50", Percentile(v, 50)},
          {"p90", Percentile(v, 90)},
          {"p99", Percentile(v, 99)},
          {"max", *std::max_element(v.begin(), v.end())}};
}

struct Url {
  std::string scheme_host_port;
  std::string base_path;  // e.g. "" or "/prefix"
};

Url ParseUrl(std::string url) {
  while (!url.empty() && url.back() == '/') url.pop_back();
  if (url.size() >= 3 && url.substr(url.size() - 3) == "/v1") url.resize(url.size() - 3);
  Url u;
  const size_t scheme = url.find("://");
  const size_t path = url.find('/', scheme == std::string::npos ? 0 : scheme + 3);
  u.scheme_host_port = path == std::string::npos ? url : url.substr(0, path);
  u.base_path = path == std::string::npos ? "" : url.substr(path);
  return u;
}

Outcome RunOneUnstamped(const Url& url, const std::string& api_key, const std::string& model,
                        const Planned& p, int timeout_s, Clock::time_point origin) {
  Outcome o;
  auto since_origin = [origin](Clock::time_point t) {
    return std::chrono::duration<double>(t - origin).count();
  };
  o.token_times_s.reserve(static_cast<size_t>(p.output_tokens) + 1);
  httplib::Client cli(url.scheme_host_port);
  cli.set_connection_timeout(30, 0);
  cli.set_read_timeout(timeout_s, 0);
  cli.set_write_timeout(timeout_s, 0);
  json body = {{"prompt", p.prompt}, {"max_tokens", p.output_tokens},
               {"ignore_eos", true}, {"temperature", 0},
               {"stream", true},     {"stream_options", {{"include_usage", true}}}};
  if (!model.empty()) body["model"] = model;
  httplib::Request req;
  req.method = "POST";
  req.path = url.base_path + "/v1/completions";
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  if (!api_key.empty()) req.set_header("Authorization", "Bearer " + api_key);
  std::string buf, error_body;
  const auto t0 = Clock::now();
  o.send_s = since_origin(t0);
  Clock::time_point t_first, t_last;
  bool got_first = false;
  int64_t text_chunks = 0;
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    buf.append(data, n);
    size_t pos;
    while ((pos = buf.find("\n\n")) != std::string::npos) {
      std::string ev = buf.substr(0, pos);
      buf.erase(0, pos + 2);
      if (ev.rfind("data: ", 0) != 0) continue;
      std::string payload = ev.substr(6);
      if (payload == "[DONE]") {
        o.latency_s = std::chrono::duration<double>(Clock::now() - t0).count();
        continue;
      }
      json j = json::parse(payload, nullptr, false);
      if (j.is_discarded()) continue;
      if (j.contains("error")) {
        o.error = j["error"].value("message", "error event");
        continue;
      }
      if (j.contains("usage") && j["usage"].is_object()) {
        o.completion_tokens = j["usage"].value("completion_tokens", int64_t{0});
        o.prompt_tokens = j["usage"].value("prompt_tokens", int64_t{0});
      }
      if (j.contains("choices") && !j["choices"].empty()) {
        const auto now = Clock::now();
        if (!got_first) {
          got_first = true;
          t_first = now;
        }
        t_last = now;
        ++text_chunks;
        o.token_times_s.push_back(since_origin(now));
      }
    }
    return true;
  };
  auto res = cli.send(req);
  if (!res) {
    o.error = "connection: " + httplib::to_string(res.error());
    return o;
  }
  o.status = res->status;
  if (o.status != 200) {
    json j = json::parse(res->body, nullptr, false);
    o.error = !j.is_discarded() && j.contains("error") ? j["error"].value("message", "")
                                                       : res->body.substr(0, 200);
    return o;
  }
  if (got_first) o.ttft_s = std::chrono::duration<double>(t_first - t0).count();
  if (o.completion_tokens > 1 && got_first) {
    o.tpot_s = std::chrono::duration<double>(t_last - t_first).count() /
               static_cast<double>(o.completion_tokens - 1);
  }
  if (o.latency_s < 0 && o.error.empty()) o.error = "stream ended without [DONE]";
  return o;
}

// --- Steady-state measurement -------------------------------------------------------------

// One scrape of the server's /metrics.
struct MetricsSample {
  double t_s = 0;  // since the run's start
  double running = 0, generated = 0, steps = 0, step_seconds = 0;
};

double PromValue(const std::string& text, const std::string& name) {
  size_t pos = 0;
  while ((pos = text.find(name, pos)) != std::string::npos) {
    const bool line_start = pos == 0 || text[pos - 1] == '\n';
    pos += name.size();
    if (line_start && pos < text.size() && text[pos] == ' ')
      return std::atof(text.c_str() + pos + 1);
  }
  return std::nan("");
}

// Samples /metrics every `interval_s` on its own thread until Stop().
class MetricsPoller {
 public:
  MetricsPoller(const Url& url, const std::string& api_key, double interval_s,
                Clock::time_point origin)
      : url_(url), api_key_(api_key), interval_s_(interval_s), origin_(origin) {
    if (interval_s_ > 0) thread_ = std::thread([this] { Run(); });
  }
  ~MetricsPoller() { Stop(); }
  void Stop() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }
  const std::vector<MetricsSample>& samples() const { return samples_; }  // after Stop()

 private:
  void Run() {
    httplib::Client cli(url_.scheme_host_port);
    cli.set_connection_timeout(5, 0);
    cli.set_read_timeout(5, 0);
    httplib::Headers h;
    if (!api_key_.empty()) h.emplace("Authorization", "Bearer " + api_key_);
    auto next = Clock::now();
    while (!stop_.load()) {
      if (auto r = cli.Get(url_.base_path + "/metrics", h); r && r->status == 200) {
        MetricsSample m;
        m.t_s = std::chrono::duration<double>(Clock::now() - origin_).count();
        m.running = PromValue(r->body, "chorus_running_sequences");
        m.generated = PromValue(r->body, "chorus_generation_tokens_total");
        m.steps = PromValue(r->body, "chorus_engine_steps_total");
        m.step_seconds = PromValue(r->body, "chorus_step_seconds_sum");
        samples_.push_back(m);
      }
      next +=
          std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(interval_s_));
      while (!stop_.load() && Clock::now() < next)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  Url url_;
  std::string api_key_;
  double interval_s_;
  Clock::time_point origin_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::vector<MetricsSample> samples_;
};

// The steady-state window and the throughput in it (see the file comment). `k` <= 0: the peak
// number of requests in flight.
json SteadyState(const std::vector<Outcome>& outcomes, const std::vector<char>& sent,
                 const std::vector<MetricsSample>& samples, int64_t k) {
  std::vector<std::pair<double, int>> edges;  // (time, +1 send / -1 end); ends sort first
  for (size_t i = 0; i < outcomes.size(); ++i) {
    if (!sent[i] || outcomes[i].send_s < 0) continue;
    edges.emplace_back(outcomes[i].send_s, +1);
    edges.emplace_back(outcomes[i].end_s, -1);
  }
  std::sort(edges.begin(), edges.end());
  int64_t peak = 0, cur = 0;
  for (const auto& e : edges) peak = std::max(peak, cur += e.second);
  if (k <= 0) k = peak;
  double start = -1, end = -1;
  cur = 0;
  for (const auto& e : edges) {
    cur += e.second;
    if (start < 0 && cur >= k) start = e.first;
    if (start >= 0 && cur < k) {
      end = e.first;
      break;
    }
  }
  json out = {{"saturation_requests", k}, {"peak_in_flight", peak}};
  if (start < 0 || end <= start) {
    out["note"] =
        "never " + std::to_string(k) + " requests in flight: raise --rate or lower --saturation";
    return out;
  }
  int64_t tokens = 0;
  double context_sum = 0;  // KV positions of those tokens: the context the engine decoded at
  for (size_t i = 0; i < outcomes.size(); ++i) {
    if (!sent[i]) continue;
    const auto& tt = outcomes[i].token_times_s;
    for (size_t k = 0; k < tt.size(); ++k) {
      if (tt[k] < start || tt[k] >= end) continue;
      ++tokens;
      context_sum += static_cast<double>(outcomes[i].prompt_tokens) + static_cast<double>(k);
    }
  }
  const double len = end - start;
  out["window_start_s"] = start;
  out["window_end_s"] = end;
  out["window_s"] = len;
  out["generated_tokens"] = tokens;
  out["output_tokens_s"] = static_cast<double>(tokens) / len;
  if (tokens > 0) out["mean_context"] = context_sum / static_cast<double>(tokens);
  // The server's view of the same window, from the scrapes inside it.
  const MetricsSample* first = nullptr;
  const MetricsSample* last = nullptr;
  double running_sum = 0;
  int n_in = 0;
  for (const auto& m : samples) {
    if (m.t_s < start || m.t_s > end || std::isnan(m.generated)) continue;
    if (!first) first = &m;
    last = &m;
    running_sum += m.running;
    ++n_in;
  }
  if (first && last != first) {
    const double dt = last->t_s - first->t_s, dgen = last->generated - first->generated;
    const double dsteps = last->steps - first->steps,
                 dstep_s = last->step_seconds - first->step_seconds;
    out["server"] = {
        {"scrapes", n_in},
        {"span_s", dt},
        {"output_tokens_s", dgen / dt},
        {"mean_running", running_sum / n_in},
        {"tokens_per_step", dsteps > 0 ? dgen / dsteps : std::nan("")},
        {"step_time_share", dstep_s / dt},
        {"output_tokens_per_step_second", dstep_s > 0 ? dgen / dstep_s : std::nan("")}};
  }
  return out;
}

// RunOneUnstamped, plus when the request ended (however it ended).
Outcome RunOne(const Url& url, const std::string& api_key, const std::string& model,
               const Planned& p, int timeout_s, Clock::time_point origin) {
  Outcome o = RunOneUnstamped(url, api_key, model, p, timeout_s, origin);
  o.end_s = std::chrono::duration<double>(Clock::now() - origin).count();
  return o;
}

// ---- Adapter workload ----

// Adapters the server serves: /v1/models entries with a non-empty `parent`, sorted by id.
std::vector<std::string> ListAdapters(const Url& url, const std::string& api_key,
                                      std::string* error) {
  httplib::Client cli(url.scheme_host_port);
  cli.set_read_timeout(60, 0);
  httplib::Headers h;
  if (!api_key.empty()) h.emplace("Authorization", "Bearer " + api_key);
  auto r = cli.Get(url.base_path + "/v1/models", h);
  std::vector<std::string> out;
  if (!r || r->status != 200) {
    *error = r ? "GET /v1/models: HTTP " + std::to_string(r->status)
               : "GET /v1/models: connection failed";
    return out;
  }
  json j = json::parse(r->body, nullptr, false);
  if (j.is_discarded() || !j.contains("data") || !j["data"].is_array()) {
    *error = "GET /v1/models: not a model list";
    return out;
  }
  for (const auto& m : j["data"]) {
    // Whole fine-tunes of `chorus serve --swap-full-models` have no parent but kind "full".
    const bool full = m.contains("kind") && m["kind"].is_string() && m["kind"] == "full";
    if (((m.contains("parent") && m["parent"].is_string() &&
          !m["parent"].get<std::string>().empty()) ||
         full) &&
        m.contains("id") && m["id"].is_string()) {
      out.push_back(m["id"].get<std::string>());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Assigns adapters to the plan: power(alpha) popularity — u = U^(1/alpha) has density
// alpha·u^(alpha−1) on [0, 1] (numpy.random.power, as S-LoRA's generator) — or round-robin; then
// marks the first use of each adapter (in arrival order) as cold.
// zipf_s > 0 instead: P(id = k) ∝ 1 / (k + 1)^zipf_s (DeltaZip's zipf-1.5 popularity, §6).
void AssignAdapters(std::vector<Planned>* plan, int n_adapters, double alpha, bool round_robin,
                    std::mt19937_64* rng, double zipf_s = 0) {
  std::uniform_real_distribution<double> uni(0.0, 1.0);
  std::vector<double> zipf_weights;
  for (int k = 0; zipf_s > 0 && k < n_adapters; ++k)
    zipf_weights.push_back(1.0 / std::pow(static_cast<double>(k + 1), zipf_s));
  std::discrete_distribution<int> zipf(zipf_weights.begin(), zipf_weights.end());
  for (size_t i = 0; i < plan->size(); ++i) {
    int id;
    if (round_robin) {
      id = static_cast<int>(i % static_cast<size_t>(n_adapters));
    } else if (zipf_s > 0) {
      id = zipf(*rng);
    } else {
      const double u = std::pow(uni(*rng), 1.0 / alpha);
      id = std::min(n_adapters - 1, static_cast<int>(std::floor(u * n_adapters)));
    }
    (*plan)[i].adapter = id;
  }
  std::vector<char> seen(static_cast<size_t>(n_adapters), 0);
  for (auto& p : *plan) {
    p.cold = !seen[static_cast<size_t>(p.adapter)];
    seen[static_cast<size_t>(p.adapter)] = 1;
  }
}

// Sends `plan` open-loop (each request at its arrival time on its own thread) and waits for all.
// `model_of(i)` is the model name of request i ("" = the server's default). Returns seconds.
double SendPlan(const Url& url, const std::string& api_key, const std::vector<Planned>& plan,
                double max_duration, int timeout_s,
                const std::function<std::string(size_t)>& model_of, Clock::time_point start,
                std::vector<Outcome>* outcomes, std::vector<char>* sent) {
  outcomes->assign(plan.size(), Outcome{});
  sent->assign(plan.size(), 0);
  std::vector<std::thread> threads;
  threads.reserve(plan.size());
  for (size_t i = 0; i < plan.size(); ++i) {
    if (plan[i].arrival_s > max_duration) break;
    std::this_thread::sleep_until(start + std::chrono::duration_cast<Clock::duration>(
                                              std::chrono::duration<double>(plan[i].arrival_s)));
    (*sent)[i] = 1;
    threads.emplace_back(
        [&, i] { (*outcomes)[i] = RunOne(url, api_key, model_of(i), plan[i], timeout_s, start); });
  }
  for (auto& th : threads) th.join();
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Cold / warm TTFT and the number of adapters used, added to the summary.
void AddAdapterSummary(json* summary, const std::vector<Planned>& plan,
                       const std::vector<Outcome>& outcomes, const std::vector<char>& sent,
                       int n_adapters, double alpha, bool round_robin, double zipf_s) {
  std::vector<double> cold, warm;
  std::vector<char> used(static_cast<size_t>(n_adapters), 0);
  for (size_t i = 0; i < plan.size(); ++i) {
    if (!sent[i] || plan[i].adapter < 0) continue;
    used[static_cast<size_t>(plan[i].adapter)] = 1;
    const Outcome& o = outcomes[i];
    if (o.status != 200 || !o.error.empty() || o.ttft_s < 0) continue;
    (plan[i].cold ? cold : warm).push_back(o.ttft_s);
  }
  json a = {{"registered_used", n_adapters},
            {"distinct_used", std::count(used.begin(), used.end(), 1)},
            {"assignment", round_robin  ? "round-robin"
                           : zipf_s > 0 ? "zipf"
                                        : "power"},
            {"alpha", alpha},
            {"zipf_s", zipf_s},
            {"cold_requests", cold.size()},
            {"warm_requests", warm.size()},
            {"ttft_cold_s", Stats(cold)},
            {"ttft_warm_s", Stats(warm)}};
  if (!cold.empty() && !warm.empty()) {
    a["ttft_cold_over_warm_p50"] = Percentile(cold, 50) / Percentile(warm, 50);
    double sc = 0, sw = 0;
    for (double x : cold) sc += x;
    for (double x : warm) sw += x;
    a["ttft_cold_over_warm_mean"] =
        (sc / static_cast<double>(cold.size())) / (sw / static_cast<double>(warm.size()));
  }
  (*summary)["adapters"] = a;
}

std::string CsvEscape(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"') out += '"';
    if (c == '\n' || c == '\r') c = ' ';
    out += c;
  }
  return out + "\"";
}

}  // namespace

int main(int argc, char** argv) {
  chorus::apps::Flags f(
      "chorus_bench_serve",
      "Open-loop load generator for `chorus serve` (streaming /v1/completions). Writes\n"
      "PREFIX.csv and PREFIX.json (tools/plot.py requests PREFIX.csv plots them). Keep runs short "
      "on shared machines.");
  f.String("url", "http://127.0.0.1:8000", "server base URL (with or without /v1)");
  f.String("model", "", "model name to send (default: none, the server's model)");
  f.String("api-key", "", "bearer token");
  f.String("workload", "slora",
           "workload shape (slora: uniform lengths, gamma arrivals; adapters not used yet)");
  f.Float("rate", 2.0, "mean arrival rate R (requests/s)");
  f.Float("cv", 1.0, "coefficient of variation of inter-arrival times (1 = Poisson)");
  f.Int("num-requests", 50, "requests to send");
  f.Float("duration", 300, "stop sending new requests after this many seconds");
  f.Int("input-min", 8, "prompt length lower bound (inclusive)");
  f.Int("input-max", 512, "prompt length upper bound (exclusive)");
  f.Int("output-min", 8, "output length lower bound (inclusive)");
  f.Int("output-max", 512, "output length upper bound (exclusive)");
  f.Int("token-id-min", 10, "prompts are random token ids in [token-id-min, token-id-max)");
  f.Int("token-id-max", 200, "see token-id-min (must be within the model's vocabulary)");
  f.Int("seed", 1, "seed of the arrival times, lengths and prompts");
  f.Int("shared-prefix", 0,
        "chat workload: this many tokens (a system prompt, the same for every such request) "
        "start --shared-fraction of the prompts, before their own input-min..input-max tokens");
  f.Float("shared-fraction", 0.8, "fraction of requests that start with the shared prefix");
  f.Int("timeout", 600, "per-request timeout in seconds");
  f.String("out", "serve_bench", "output prefix: PREFIX.csv, PREFIX.json");
  f.Int("saturation", 0,
        "steady-state window: while at least this many requests are in flight (e.g. the server's "
        "--max-running; 0 = the peak in flight)");
  f.Float("metrics-interval", 1.0, "seconds between scrapes of the server's /metrics (0 = none)");
  f.Int("adapters", 0, "requests use the first N adapters the server lists (0 = base model only)");
  f.Float("alpha", 1.0, "adapter popularity: id = floor(u·N), u ~ power(alpha) (1 = uniform)");
  f.String("adapter-assign", "power",
           "power (see --alpha; alpha 1 = uniform), zipf (P(k) ∝ 1/(k+1)^s, see --zipf-s) or "
           "round-robin");
  f.Float("zipf-s", 1.5, "exponent s of --adapter-assign zipf");
  f.Bool("compare-base",
         "afterwards send the same plan without adapters and report the throughput ratio");
  chorus::Status st = f.Parse(argc - 1, argv + 1);
  if (st.code() == chorus::StatusCode::kCancelled) return 0;
  if (!st.ok()) {
    std::fprintf(stderr, "%s\n", st.message().c_str());
    return 2;
  }
  if (f.GetString("workload") != "slora") {
    std::fprintf(stderr, "chorus_bench_serve: unknown --workload (only slora)\n");
    return 2;
  }
  const int64_t n_adapters = f.GetInt("adapters");
  const double alpha = f.GetFloat("alpha");
  const bool round_robin = f.GetString("adapter-assign") == "round-robin";
  const bool zipf = f.GetString("adapter-assign") == "zipf";
  const double zipf_s = zipf ? f.GetFloat("zipf-s") : 0.0;
  if (n_adapters < 0 || n_adapters > 1000000 || !(alpha > 0) || (zipf && !(zipf_s > 0)) ||
      (!round_robin && !zipf && f.GetString("adapter-assign") != "power")) {
    std::fprintf(stderr,
                 "chorus_bench_serve: need 0 <= adapters <= 1000000, alpha > 0, zipf-s > 0, "
                 "adapter-assign power|zipf|round-robin\n");
    return 2;
  }
  const double rate = f.GetFloat("rate"), cv = f.GetFloat("cv");
  const int64_t n = f.GetInt("num-requests");
  const int64_t in_lo = f.GetInt("input-min"), in_hi = f.GetInt("input-max");
  const int64_t out_lo = f.GetInt("output-min"), out_hi = f.GetInt("output-max");
  const int64_t id_lo = f.GetInt("token-id-min"), id_hi = f.GetInt("token-id-max");
  const int64_t shared_prefix = f.GetInt("shared-prefix");
  const double shared_fraction = f.GetFloat("shared-fraction");
  if (shared_prefix < 0 || shared_prefix > 1000000 || !(shared_fraction >= 0) ||
      shared_fraction > 1) {
    std::fprintf(stderr,
                 "chorus_bench_serve: need 0 <= shared-prefix <= 1000000, 0 <= shared-fraction <= "
                 "1\n");
    return 2;
  }
  if (!(rate > 0) || !(cv > 0) || n < 1 || n > 100000 || in_lo < 1 || in_hi <= in_lo ||
      out_lo < 1 || out_hi <= out_lo || id_lo < 0 || id_hi <= id_lo) {
    std::fprintf(
        stderr,
        "chorus_bench_serve: need rate > 0, cv > 0, 1 <= num-requests <= 100000, 1 <= min < max\n");
    return 2;
  }

  // The plan: gamma inter-arrival times with mean 1/R and CV cv.
  std::mt19937_64 rng(static_cast<uint64_t>(f.GetInt("seed")));
  std::gamma_distribution<double> gap(1.0 / (cv * cv), cv * cv / rate);
  std::uniform_int_distribution<int64_t> in_len(in_lo, in_hi - 1), out_len(out_lo, out_hi - 1),
      tok(id_lo, id_hi - 1);
  std::vector<Planned> plan(static_cast<size_t>(n));
  std::vector<int> system_prompt(static_cast<size_t>(shared_prefix));
  for (int& id : system_prompt) id = static_cast<int>(tok(rng));
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  double t = 0;
  for (auto& p : plan) {
    t += gap(rng);
    p.arrival_s = t;
    p.input_tokens = static_cast<int>(in_len(rng));
    p.output_tokens = static_cast<int>(out_len(rng));
    p.prompt.resize(static_cast<size_t>(p.input_tokens));
    for (int& id : p.prompt) id = static_cast<int>(tok(rng));
    if (shared_prefix > 0 && unit(rng) < shared_fraction) {
      p.prompt.insert(p.prompt.begin(), system_prompt.begin(), system_prompt.end());
      p.input_tokens = static_cast<int>(p.prompt.size());
    }
  }

  const Url url = ParseUrl(f.GetString("url"));
  const std::string api_key = f.GetString("api-key"), model = f.GetString("model");
  std::vector<std::string> adapter_names;
  if (n_adapters > 0) {
    std::string error;
    adapter_names = ListAdapters(url, api_key, &error);
    if (static_cast<int64_t>(adapter_names.size()) < n_adapters) {
      std::fprintf(stderr,
                   "chorus_bench_serve: the server lists %zu adapters, --adapters wants %lld%s%s\n",
                   adapter_names.size(), static_cast<long long>(n_adapters),
                   error.empty() ? "" : ": ", error.c_str());
      return 2;
    }
    adapter_names.resize(static_cast<size_t>(n_adapters));
    AssignAdapters(&plan, static_cast<int>(n_adapters), alpha, round_robin, &rng, zipf_s);
  }
  auto model_of = [&](size_t i) {
    return plan[i].adapter >= 0 ? adapter_names[static_cast<size_t>(plan[i].adapter)] : model;
  };
  const int timeout_s = static_cast<int>(f.GetInt("timeout"));
  const double max_duration = f.GetFloat("duration");
  std::vector<Outcome> outcomes;
  std::vector<char> sent;
  std::fprintf(stderr, "chorus_bench_serve: %lld requests at %.2f req/s (cv %.2f) to %s%s\n",
               static_cast<long long>(n), rate, cv, url.scheme_host_port.c_str(),
               n_adapters > 0 ? (", " + std::to_string(n_adapters) + " adapters").c_str() : "");
  const auto start = Clock::now();
  MetricsPoller poller(url, api_key, f.GetFloat("metrics-interval"), start);
  const double elapsed =
      SendPlan(url, api_key, plan, max_duration, timeout_s, model_of, start, &outcomes, &sent);
  poller.Stop();

  // Per-request CSV.
  const std::string prefix = f.GetString("out");
  std::ofstream csv(prefix + ".csv");
  csv << "request,arrival_s,input_tokens,output_tokens,status,ttft_s,tpot_s,latency_s,completion_"
         "tokens,error,adapter,cold\n";
  std::vector<double> ttft, tpot, latency;
  int64_t ok = 0, errors = 0, gen_tokens = 0, prompt_tokens = 0;
  for (size_t i = 0; i < plan.size(); ++i) {
    if (!sent[i]) continue;
    const Outcome& o = outcomes[i];
    const bool good = o.status == 200 && o.error.empty();
    if (good) {
      ++ok;
      gen_tokens += o.completion_tokens;
      prompt_tokens += o.prompt_tokens;
      if (o.ttft_s >= 0) ttft.push_back(o.ttft_s);
      if (o.tpot_s >= 0) tpot.push_back(o.tpot_s);
      if (o.latency_s >= 0) latency.push_back(o.latency_s);
    } else {
      ++errors;
    }
    csv << i << ',' << plan[i].arrival_s << ',' << plan[i].input_tokens << ','
        << plan[i].output_tokens << ',' << o.status << ',' << o.ttft_s << ',' << o.tpot_s << ','
        << o.latency_s << ',' << o.completion_tokens << ',' << CsvEscape(o.error) << ','
        << plan[i].adapter << ',' << (plan[i].cold ? 1 : 0) << '\n';
  }
  csv.close();
  json summary = {
      {"workload", "slora"},
      {"url", url.scheme_host_port},
      {"rate", rate},
      {"cv", cv},
      {"requests_sent", ok + errors},
      {"requests_ok", ok},
      {"errors", errors},
      {"duration_s", elapsed},
      {"throughput_req_s", static_cast<double>(ok) / elapsed},
      {"output_tokens_s", static_cast<double>(gen_tokens) / elapsed},
      {"total_tokens_s", static_cast<double>(gen_tokens + prompt_tokens) / elapsed},
      {"ttft_s", Stats(ttft)},
      {"tpot_s", Stats(tpot)},
      {"latency_s", Stats(latency)},
      {"steady_state", SteadyState(outcomes, sent, poller.samples(), f.GetInt("saturation"))},
      {"input_len", {in_lo, in_hi}},
      {"shared_prefix", shared_prefix},
      {"shared_fraction", shared_prefix > 0 ? shared_fraction : 0.0},
      {"output_len", {out_lo, out_hi}}};
  if (n_adapters > 0)
    AddAdapterSummary(&summary, plan, outcomes, sent, static_cast<int>(n_adapters), alpha,
                      round_robin, zipf_s);
  if (f.GetBool("compare-base")) {
    // The same plan (arrivals, lengths, prompts) once more, every request on the base model.
    std::fprintf(stderr, "chorus_bench_serve: the same %lld requests on the base model\n",
                 static_cast<long long>(n));
    std::vector<Outcome> base_out;
    std::vector<char> base_sent;
    const double base_elapsed = SendPlan(
        url, api_key, plan, max_duration, timeout_s, [&](size_t) { return model; }, Clock::now(),
        &base_out, &base_sent);
    int64_t base_ok = 0, base_tokens = 0;
    std::vector<double> base_ttft;
    for (size_t i = 0; i < plan.size(); ++i) {
      if (!base_sent[i] || base_out[i].status != 200 || !base_out[i].error.empty()) continue;
      ++base_ok;
      base_tokens += base_out[i].completion_tokens;
      if (base_out[i].ttft_s >= 0) base_ttft.push_back(base_out[i].ttft_s);
    }
    const double base_tok_s = static_cast<double>(base_tokens) / base_elapsed;
    summary["base_only"] = {{"requests_ok", base_ok},
                            {"duration_s", base_elapsed},
                            {"output_tokens_s", base_tok_s},
                            {"ttft_s", Stats(base_ttft)}};
    summary["output_tokens_s_vs_base"] =
        base_tok_s > 0 ? summary["output_tokens_s"].get<double>() / base_tok_s : 0.0;
    errors += static_cast<int64_t>(std::count(base_sent.begin(), base_sent.end(), 1)) - base_ok;
  }
  std::ofstream(prefix + ".json") << summary.dump(2) << "\n";
  std::printf("%s\n", summary.dump(2).c_str());

  std::fprintf(stderr, "chorus_bench_serve: plot it with tools/plot.py requests %s.csv\n",
               prefix.c_str());
  return errors == 0 ? 0 : 1;
}
