#include "chorus/router/router.h"

#include <httplib.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "chorus/base/logging.h"

namespace chorus::router {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// An OpenAI-shaped error body.
std::string ErrorJson(const std::string& message, const std::string& type,
                      const std::string& code) {
  return json{{"error", {{"message", message}, {"type", type}, {"param", nullptr}, {"code", code}}}}
      .dump();
}

void SendError(httplib::Response& res, int status, const std::string& message,
               const std::string& type, const std::string& code, int retry_after_s = 0) {
  res.status = status;
  if (retry_after_s > 0) res.set_header("Retry-After", std::to_string(retry_after_s));
  res.set_content(ErrorJson(message, type, code), "application/json");
}

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// What the router's forecast needs from an OpenAI request body, without tokenizing: the model,
// the SLOs, max_tokens (max_completion_tokens for chat; kAssumedOutputTokens when absent) and
// the prompt's length — exact for token-id prompts, else about 4 bytes per token of the prompt
// text or the messages (English BPE), an estimate documented in docs/router.md. A request that
// does not generate (an embedding) counts one output token.
constexpr int64_t kAssumedOutputTokens = 256;
void DescribeRequest(const json& j, bool generates, RoutedRequest* req, RequestSlo* slo) {
  auto number = [&](const char* key, double* out) {
    if (j.contains(key) && j[key].is_number()) *out = j[key].get<double>();
  };
  if (j.contains("model") && j["model"].is_string()) req->variant = j["model"].get<std::string>();
  double ms = 0;
  number("ttft_slo_ms", &ms);
  slo->ttft_s = std::max(0.0, ms / 1e3);
  ms = 0;
  number("tpot_slo_ms", &ms);
  slo->tpot_s = std::max(0.0, ms / 1e3);
  double out = 0;
  number("max_completion_tokens", &out);
  if (out <= 0) number("max_tokens", &out);
  req->output_tokens = !generates              ? 1
                       : out >= 1 && out < 1e9 ? static_cast<int64_t>(out)
                                               : kAssumedOutputTokens;
  int64_t prompt = 0;
  // Completions' prompt, or the embeddings' input.
  const char* text_key = j.contains("prompt") ? "prompt" : j.contains("input") ? "input" : nullptr;
  if (text_key != nullptr) {
    const json& p = j[text_key];
    if (p.is_string()) {
      prompt = static_cast<int64_t>(p.get_ref<const std::string&>().size()) / 4;
    } else if (p.is_array()) {
      for (const json& e : p)
        prompt += e.is_array()    ? static_cast<int64_t>(e.size())
                  : e.is_string() ? static_cast<int64_t>(e.get_ref<const std::string&>().size()) / 4
                                  : 1;
    }
  } else if (j.contains("messages")) {
    prompt = static_cast<int64_t>(j["messages"].dump().size()) / 4;
  }
  req->prompt_tokens = std::max<int64_t>(1, prompt);
}

// The headers a request carries upstream: the client's credentials and body type.
httplib::Headers UpstreamHeaders(const httplib::Request& req) {
  httplib::Headers h;
  for (const char* name : {"Authorization", "Content-Type", "Accept", "OpenAI-Organization"}) {
    if (req.has_header(name)) h.emplace(name, req.get_header_value(name));
  }
  return h;
}

// One request's exchange with one replica: the upstream thread fills it, the client's handler
// (or its chunked content provider) drains it.
struct Exchange {
  std::mutex mu;
  std::condition_variable cv;
  bool got_headers = false;  // status and headers arrived
  bool done = false;         // the upstream call returned
  bool failed = false;       // it ended in a transport error (connection, timeout, cancel)
  std::string error;         // httplib's name for that error
  int status = 0;
  std::string content_type, retry_after;
  std::deque<std::string> chunks;  // body bytes not yet taken
  std::string body;                // non-streamed: the whole body (taken at done)
  std::atomic<bool> client_gone{false};
  bool streaming = false;  // the response is SSE: chunks are handed over as they come
};

}  // namespace

Result<Policy> ParsePolicy(const std::string& name) {
  if (name == "least-loaded") return Policy::kLeastLoaded;
  if (name == "random") return Policy::kRandom;
  if (name == "pack") return Policy::kPack;
  if (name == "rank-aware") return Policy::kRankAware;
  return InvalidArgumentError("unknown routing policy '" + name.substr(0, 32) +
                              "' (least-loaded, random, pack or rank-aware)");
}

const char* PolicyName(Policy p) {
  switch (p) {
    case Policy::kLeastLoaded:
      return "least-loaded";
    case Policy::kRandom:
      return "random";
    case Policy::kPack:
      return "pack";
    case Policy::kRankAware:
      return "rank-aware";
  }
  return "?";
}

Result<ReplicaAddress> ParseReplicaUrl(const std::string& url) {
  auto bad = [&](const std::string& why) {
    return InvalidArgumentError("replica '" + url.substr(0, 64) + "': " + why +
                                " (expected http://HOST:PORT)");
  };
  const std::string scheme = "http://";
  if (url.rfind(scheme, 0) != 0) return bad("not an http:// URL");
  std::string rest = url.substr(scheme.size());
  while (!rest.empty() && rest.back() == '/') rest.pop_back();
  if (rest.find('/') != std::string::npos) return bad("has a path");
  const size_t colon = rest.rfind(':');
  if (colon == std::string::npos || colon == 0) return bad("no port");
  ReplicaAddress a;
  a.host = rest.substr(0, colon);
  if (a.host.size() > 2 && a.host.front() == '[' && a.host.back() == ']')
    a.host = a.host.substr(1, a.host.size() - 2);
  const std::string port = rest.substr(colon + 1);
  char* end = nullptr;
  const long p = std::strtol(port.c_str(), &end, 10);
  if (port.empty() || *end != '\0' || p < 1 || p > 65535) return bad("bad port '" + port + "'");
  a.port = static_cast<int>(p);
  return a;
}

bool MissesSlo(const ReplicaView& r, const RequestSlo& slo) {
  if (slo.ttft_s > 0 && r.ttft_s_with >= 0 && r.ttft_s_with > slo.ttft_s) return true;
  return slo.tpot_s > 0 && r.tpot_s_with >= 0 && r.tpot_s_with > kTpotHeadroom * slo.tpot_s;
}

bool BreaksSlo(const ReplicaView& r, const RequestSlo& slo) {
  if (slo.ttft_s > 0 && r.ttft_s_with >= 0 && r.ttft_s_with > slo.ttft_s) return true;
  return slo.tpot_s > 0 && r.step_s_with > slo.tpot_s;
}

double RankAwareScore(const ReplicaView& r, bool predicted, const RequestSlo& slo) {
  if (predicted) {
    // CaraServe §5, Alg. 1: the added latency on the requests already there, plus the new
    // request's own step, and a large penalty when it would miss its SLOs there.
    const double added = std::max(0.0, r.step_s_with - r.step_s);
    double score = static_cast<double>(r.in_flight) * added + r.step_s_with;
    if (slo.shed ? MissesSlo(r, slo) : BreaksSlo(r, slo)) score += kSloPenalty;
    return score;
  }
  // Proxy: added latency ∝ rows in flight, plus the LoRA work they bring (a step's time grows
  // with the ranks in it; 64 rank-units ≈ one more row), plus half a row for a variant the
  // replica does not run yet (its first step loads it and adds a segment).
  return static_cast<double>(r.in_flight) + static_cast<double>(r.rank_in_flight) / 64.0 +
         (r.runs_variant ? 0.0 : 0.5);
}

void InFlightStep::Add(const std::string& variant, int64_t rank, int64_t context) {
  f_ = With(variant, rank, context);
  ++variants_[variant];
}

void InFlightStep::Remove(const std::string& variant, int64_t rank, int64_t context) {
  auto it = variants_.find(variant);
  if (it == variants_.end()) return;
  const bool last = --it->second == 0;
  if (last) variants_.erase(it);
  // Subtract exactly what Add added; back to zero when nothing is left (no drift).
  if (variants_.empty()) {
    f_ = engine::StepFeatures{};
    return;
  }
  f_.decode_rows -= 1;
  f_.context_tokens -= static_cast<double>(context) + 1;
  f_.row_ranks -= static_cast<double>(rank);
  if (rank > 0 && last) {
    f_.adapters -= 1;
    f_.sum_ranks -= static_cast<double>(rank);
  }
}

engine::StepFeatures InFlightStep::With(const std::string& variant, int64_t rank,
                                        int64_t context) const {
  engine::StepFeatures f = f_;
  f.AddChunk(context, 1, /*prefill=*/false, rank);
  if (rank > 0 && !variants_.count(variant)) {
    f.adapters += 1;
    f.sum_ranks += static_cast<double>(rank);
  }
  return f;
}

Forecast ReplicaForecast::With(const engine::CostModel& model, const RoutedRequest& req,
                               double now_s) const {
  Forecast f;
  f.step_s = model.Predict(step_.features());
  f.step_s_with = model.Predict(step_.With(req.variant, req.rank, req.prompt_tokens));
  // Its prompt runs in chunks of max_batch_tokens, each in a step with the decode rows already
  // there (as the engine plans them); what such a step takes beyond a decode step is the stall
  // every request in flight sees.
  const int64_t prompt = std::max<int64_t>(1, req.prompt_tokens);
  const int64_t chunks = (prompt + max_batch_tokens_ - 1) / max_batch_tokens_;
  engine::StepFeatures g = step_.features();
  g.AddChunk(0, std::min(prompt, max_batch_tokens_), /*prefill=*/true, req.rank);
  if (req.rank > 0 && !step_.Runs(req.variant)) {
    g.adapters += 1;
    g.sum_ranks += static_cast<double>(req.rank);
  }
  const double chunk_s = model.Predict(g);
  f.prefill_s = static_cast<double>(chunks) * chunk_s;
  f.stall_s = static_cast<double>(chunks) * std::max(0.0, chunk_s - f.step_s);
  f.ttft_s = std::max(0.0, prefill_free_s_ - now_s) + f.prefill_s;
  const double n = static_cast<double>(in_flight_ + 1);
  const double tokens = output_sum_ + static_cast<double>(std::max<int64_t>(1, req.output_tokens));
  f.tpot_s = f.step_s_with + (stall_sum_s_ + f.stall_s) * n / tokens;
  return f;
}

void ReplicaForecast::Add(const RoutedRequest& req, const Forecast& f, double now_s) {
  step_.Add(req.variant, req.rank, req.prompt_tokens);
  ++in_flight_;
  stall_sum_s_ += f.stall_s;
  output_sum_ += static_cast<double>(std::max<int64_t>(1, req.output_tokens));
  prefill_free_s_ = std::max(prefill_free_s_, now_s) + f.prefill_s;
}

void ReplicaForecast::Remove(const RoutedRequest& req, const Forecast& f) {
  step_.Remove(req.variant, req.rank, req.prompt_tokens);
  if (--in_flight_ <= 0) {  // back to exactly nothing (no drift); every prompt has been computed
    in_flight_ = 0;
    stall_sum_s_ = 0;
    output_sum_ = 0;
    prefill_free_s_ = 0;
    return;
  }
  stall_sum_s_ = std::max(0.0, stall_sum_s_ - f.stall_s);
  output_sum_ =
      std::max(0.0, output_sum_ - static_cast<double>(std::max<int64_t>(1, req.output_tokens)));
}

int ChooseReplica(Policy policy, std::span<const ReplicaView> replicas, int64_t capacity,
                  uint64_t random, const RequestSlo& slo) {
  std::vector<int> candidates;
  for (size_t i = 0; i < replicas.size(); ++i)
    if (replicas[i].healthy && replicas[i].serves_model) candidates.push_back(static_cast<int>(i));
  if (candidates.empty()) return -1;
  const size_t n = candidates.size();
  // Ties are broken by a rotation that starts at a random candidate, so equal replicas share.
  auto best_by = [&](auto score) {
    int best = -1;
    double best_score = 0;
    for (size_t k = 0; k < n; ++k) {
      const int i = candidates[(k + random) % n];
      const double s = score(replicas[static_cast<size_t>(i)]);
      if (best < 0 || s < best_score) {
        best = i;
        best_score = s;
      }
    }
    return best;
  };
  switch (policy) {
    case Policy::kRandom:
      return candidates[random % n];
    case Policy::kLeastLoaded:
      return best_by([](const ReplicaView& r) { return static_cast<double>(r.in_flight); });
    case Policy::kPack: {
      // The busiest replica with room; when all are full, the least loaded.
      int best = -1;
      for (size_t k = 0; k < n; ++k) {
        const int i = candidates[(k + random) % n];
        const ReplicaView& r = replicas[static_cast<size_t>(i)];
        if (r.in_flight < capacity &&
            (best < 0 || r.in_flight > replicas[static_cast<size_t>(best)].in_flight))
          best = i;
      }
      if (best >= 0) return best;
      return best_by([](const ReplicaView& r) { return static_cast<double>(r.in_flight); });
    }
    case Policy::kRankAware: {
      bool predicted = true;
      for (int i : candidates) {
        const ReplicaView& r = replicas[static_cast<size_t>(i)];
        predicted = predicted && r.step_s >= 0 && r.step_s_with >= 0;
      }
      return best_by([&](const ReplicaView& r) { return RankAwareScore(r, predicted, slo); });
    }
  }
  return -1;
}

struct Router::Impl {
  struct Replica {
    ReplicaAddress addr;
    std::atomic<bool> healthy{false};
    std::atomic<int64_t> in_flight{0};
    std::atomic<int64_t> requests{0}, failures{0};
    std::mutex mu;
    std::map<std::string, int64_t> models;  // GUARDED_BY(mu): id → LoRA rank (0: none)
    ReplicaForecast forecast;               // GUARDED_BY(mu)
  };

  RouterOptions opts;
  std::weak_ptr<Impl> weak_self;  // what upstream threads hold on to
  std::vector<std::unique_ptr<Replica>> replicas;
  httplib::Server http;
  std::thread listen_thread, health_thread;
  std::mutex stop_mu;
  std::condition_variable stop_cv;
  bool stopping = false;  // GUARDED_BY(stop_mu)
  int port = 0;
  std::atomic<uint64_t> rng_state{0x9E3779B97F4A7C15ull};
  std::atomic<int64_t> retries{0}, stream_errors{0}, no_replica{0}, shed_count{0};

  uint64_t Random() {
    uint64_t s = rng_state.fetch_add(0x9E3779B97F4A7C15ull);
    s ^= s >> 31;
    s *= 0xBF58476D1CE4E5B9ull;
    return s ^ (s >> 29);
  }

  std::unique_ptr<httplib::Client> ClientFor(const Replica& r, int read_timeout_s) const {
    auto c = std::make_unique<httplib::Client>(r.addr.host, r.addr.port);
    c->set_connection_timeout(0, opts.connect_timeout_ms * 1000);
    c->set_read_timeout(read_timeout_s, 0);
    c->set_write_timeout(30, 0);
    return c;
  }

  void Eject(Replica& r, const std::string& why) {
    if (r.healthy.exchange(false)) {
      CHORUS_LOG(WARNING) << "router: replica " << r.addr.url() << " ejected: " << why;
    }
  }

  // One health poll of one replica: /health, then its model list.
  void Poll(Replica& r) {
    auto c = ClientFor(r, 2);
    httplib::Headers h;
    if (!opts.replica_api_key.empty()) h.emplace("Authorization", "Bearer " + opts.replica_api_key);
    auto health = c->Get("/health", h);
    if (!health || health->status != 200) {
      Eject(r, health ? "health " + std::to_string(health->status)
                      : "health: " + httplib::to_string(health.error()));
      return;
    }
    auto models = c->Get("/v1/models", h);
    if (models && models->status == 200) {
      std::map<std::string, int64_t> list;
      try {
        const json j = json::parse(models->body);
        for (const json& m : j.at("data")) {
          const int64_t rank = m.contains("lora_rank") && m["lora_rank"].is_number_integer()
                                   ? m["lora_rank"].get<int64_t>()
                                   : 0;
          list[m.at("id").get<std::string>()] = rank;
        }
      } catch (const std::exception&) {
        Eject(r, "/v1/models is not a model list");
        return;
      }
      std::lock_guard<std::mutex> l(r.mu);
      r.models = std::move(list);
    }
    if (!r.healthy.exchange(true)) {
      CHORUS_LOG(INFO) << "router: replica " << r.addr.url() << " admitted";
    }
  }

  void PollAll() {
    std::vector<std::thread> t;
    for (auto& r : replicas) t.emplace_back([this, &r] { Poll(*r); });
    for (auto& th : t) th.join();
  }

  // The replica for `req` (its model empty: none named), excluding `tried`, with its forecast
  // there when the router has a cost model; -1 when none can serve it. `*shed` is set when
  // --shed is on and the chosen replica is predicted to miss the request's SLOs.
  int Choose(const RoutedRequest& req, const std::set<int>& tried, const RequestSlo& slo,
             Forecast* forecast, bool* shed) {
    std::vector<ReplicaView> views(replicas.size());
    std::vector<Forecast> forecasts(replicas.size());
    const double now = NowSeconds();
    bool anyone_lists = false;
    for (size_t i = 0; i < replicas.size(); ++i) {
      Replica& r = *replicas[i];
      std::lock_guard<std::mutex> l(r.mu);
      views[i].healthy = r.healthy.load() && !tried.count(static_cast<int>(i));
      views[i].serves_model = req.variant.empty() || r.models.count(req.variant) > 0;
      anyone_lists = anyone_lists || views[i].serves_model;
      views[i].in_flight = r.in_flight.load();
      views[i].rank_in_flight = r.forecast.rank_in_flight();
      views[i].runs_variant = r.forecast.step().Runs(req.variant);
      if (opts.cost_model != nullptr) {
        RoutedRequest here = req;
        const auto it = r.models.find(req.variant);
        here.rank = it == r.models.end() ? 0 : it->second;
        forecasts[i] = r.forecast.With(*opts.cost_model, here, now);
        views[i].SetForecast(forecasts[i]);
      }
    }
    // No replica lists the model (e.g. a tenant's own adapter, invisible to the router's polls):
    // any replica may take it; the one chosen answers for it.
    if (!anyone_lists)
      for (auto& v : views) v.serves_model = true;
    const int i = ChooseReplica(opts.policy, views, opts.replica_capacity, Random(), slo);
    if (i >= 0) {
      *forecast = forecasts[static_cast<size_t>(i)];
      *shed = slo.shed && MissesSlo(views[static_cast<size_t>(i)], slo);
    }
    return i;
  }

  // A request starts on `r`: returns what it was counted with, for End.
  RoutedRequest Begin(Replica& r, RoutedRequest req, const Forecast& f) {
    r.in_flight.fetch_add(1);
    r.requests.fetch_add(1);
    std::lock_guard<std::mutex> l(r.mu);
    const auto it = r.models.find(req.variant);
    req.rank = it == r.models.end() ? 0 : it->second;
    r.forecast.Add(req, f, NowSeconds());
    return req;
  }
  void End(Replica& r, const RoutedRequest& req, const Forecast& f) {
    r.in_flight.fetch_sub(1);
    std::lock_guard<std::mutex> l(r.mu);
    r.forecast.Remove(req, f);
  }

  // Starts the upstream call of `req` on replica `i` in its own thread; returns its exchange.
  std::shared_ptr<Exchange> StartUpstream(int i, const httplib::Request& req,
                                          const RoutedRequest& routed, const Forecast& forecast) {
    auto ex = std::make_shared<Exchange>();
    Replica& r = *replicas[static_cast<size_t>(i)];
    const RoutedRequest counted = Begin(r, routed, forecast);
    httplib::Request up;
    up.method = req.method;
    up.path = req.path;
    up.headers = UpstreamHeaders(req);
    up.body = req.body;
    std::thread([keep = weak_self.lock(), ex, up = std::move(up), &r, counted, forecast]() mutable {
      Impl* self = keep.get();
      up.response_handler = [ex](const httplib::Response& res) {
        std::lock_guard<std::mutex> l(ex->mu);
        ex->got_headers = true;
        ex->status = res.status;
        ex->content_type = res.get_header_value("Content-Type");
        ex->retry_after = res.get_header_value("Retry-After");
        ex->streaming = ex->content_type.rfind("text/event-stream", 0) == 0;
        ex->cv.notify_all();
        return true;
      };
      up.content_receiver = [ex](const char* data, size_t n, uint64_t, uint64_t) {
        if (ex->client_gone.load()) return false;  // the client left: stop the upstream
        std::lock_guard<std::mutex> l(ex->mu);
        if (ex->streaming) {
          ex->chunks.emplace_back(data, n);
          ex->cv.notify_all();
        } else {
          ex->body.append(data, n);
        }
        return true;
      };
      auto c = self->ClientFor(r, self->opts.read_timeout_s);
      auto res = c->send(up);
      self->End(r, counted, forecast);
      std::lock_guard<std::mutex> l(ex->mu);
      ex->done = true;
      if (!res && !ex->client_gone.load()) {
        ex->failed = true;
        ex->error = httplib::to_string(res.error());
      }
      ex->cv.notify_all();
    }).detach();
    return ex;
  }

  // Generation and other per-request routes: choose, forward, retry on another replica when
  // nothing has reached the client yet.
  void Proxy(const httplib::Request& req, httplib::Response& res) {
    RoutedRequest routed;  // model, and estimates of its prompt and output for the forecast
    RequestSlo slo;        // the request's own SLOs (rank-aware and --shed with a cost model)
    if (!req.body.empty()) {
      try {
        const json j = json::parse(req.body);
        // An embedding generates nothing: its forecast counts no output.
        if (j.is_object()) DescribeRequest(j, req.path != "/v1/embeddings", &routed, &slo);
      } catch (const std::exception&) {
        // Not JSON: the replica answers with its own 400.
      }
    }
    slo.shed = opts.shed;  // Create refused --shed without a cost model
    std::set<int> tried;
    std::string last_failure;
    while (true) {
      Forecast forecast;
      bool shed = false;
      const int i = Choose(routed, tried, slo, &forecast, &shed);
      if (i < 0) {
        no_replica.fetch_add(1);
        SendError(res, 503,
                  last_failure.empty()
                      ? "no healthy replica can serve this request"
                      : "no replica could serve this request (last: " + last_failure + ")",
                  "service_unavailable", "no_replica", 1);
        return;
      }
      if (shed) {
        shed_count.fetch_add(1);
        char detail[160];
        std::snprintf(
            detail, sizeof(detail), "predicted TTFT %.4g ms, TPOT %.4g ms; SLOs %.4g ms, %.4g ms",
            forecast.ttft_s * 1e3, forecast.tpot_s * 1e3, slo.ttft_s * 1e3, slo.tpot_s * 1e3);
        SendError(
            res, 429,
            std::string("every replica is predicted to miss this request's SLOs (") + detail + ")",
            "rate_limit_exceeded", "slo_unattainable", 1);
        return;
      }
      tried.insert(i);
      Replica& r = *replicas[static_cast<size_t>(i)];
      auto ex = StartUpstream(i, req, routed, forecast);
      std::unique_lock<std::mutex> l(ex->mu);
      ex->cv.wait(l, [&] { return ex->got_headers || ex->done; });
      if (!ex->got_headers) {  // connection failed: nothing was said, try another replica
        r.failures.fetch_add(1);
        last_failure = r.addr.url() + ": " + ex->error;
        l.unlock();
        Eject(r, ex->error);
        retries.fetch_add(1);
        continue;
      }
      if (!ex->streaming) {
        ex->cv.wait(l, [&] { return ex->done; });
        // Draining, overloaded or out of KV, or cut off mid-body: the client has seen nothing,
        // so another replica recomputes it.
        if (ex->failed || ex->status == 503 || ex->status == 429) {
          last_failure =
              r.addr.url() + ": " + (ex->failed ? ex->error : std::to_string(ex->status));
          if (ex->failed) {
            r.failures.fetch_add(1);
            l.unlock();
            Eject(r, ex->error);
          }
          bool another = false;
          for (size_t k = 0; k < replicas.size(); ++k)
            if (!tried.count(static_cast<int>(k)) && replicas[k]->healthy.load()) another = true;
          if (another) {
            retries.fetch_add(1);
            continue;
          }
          if (ex->failed) {
            SendError(res, 502, "replica failed: " + last_failure, "server_error",
                      "replica_failed");
            return;
          }
        }
        res.status = ex->status;
        if (!ex->retry_after.empty()) res.set_header("Retry-After", ex->retry_after);
        res.set_content(std::move(ex->body),
                        ex->content_type.empty() ? "application/json" : ex->content_type);
        return;
      }
      // A stream: hand chunks over as they come; a replica failing now ends this stream with
      // an error event (the client has its first tokens already, so no retry).
      res.status = ex->status;
      l.unlock();
      res.set_chunked_content_provider(
          ex->content_type,
          [this, ex, url = r.addr.url(), &r](size_t, httplib::DataSink& sink) {
            std::unique_lock<std::mutex> lk(ex->mu);
            ex->cv.wait_for(lk, std::chrono::seconds(1),
                            [&] { return !ex->chunks.empty() || ex->done; });
            while (!ex->chunks.empty()) {
              std::string c = std::move(ex->chunks.front());
              ex->chunks.pop_front();
              lk.unlock();
              if (!sink.write(c.data(), c.size())) {
                ex->client_gone.store(true);
                return false;
              }
              lk.lock();
            }
            if (ex->done) {
              if (ex->failed) {
                stream_errors.fetch_add(1);
                r.failures.fetch_add(1);
                const std::string ev =
                    "data: " +
                    ErrorJson("replica " + url + " failed mid-stream: " + ex->error, "server_error",
                              "replica_failed") +
                    "\n\n";
                lk.unlock();
                Eject(r, ex->error);
                sink.write(ev.data(), ev.size());
              }
              sink.done();
            }
            return true;
          },
          [ex](bool success) {
            if (!success) ex->client_gone.store(true);
          });
      return;
    }
  }

  // GET /v1/models: the union over healthy replicas, asked with the client's credentials.
  void Models(const httplib::Request& req, httplib::Response& res) {
    json data = json::array();
    std::set<std::string> seen;
    int answered = 0;
    int last_status = 503;
    std::string last_body;
    for (auto& rp : replicas) {
      Replica& r = *rp;
      if (!r.healthy.load()) continue;
      auto c = ClientFor(r, 10);
      auto up = c->Get("/v1/models", UpstreamHeaders(req));
      if (!up) {
        Eject(r, httplib::to_string(up.error()));
        continue;
      }
      if (up->status != 200) {  // e.g. 401: the client's key is refused
        last_status = up->status;
        last_body = up->body;
        continue;
      }
      try {
        const json j = json::parse(up->body);
        for (const json& m : j.at("data")) {
          const std::string id = m.at("id").get<std::string>();
          if (seen.insert(id).second) data.push_back(m);
        }
        ++answered;
      } catch (const std::exception&) {
        Eject(r, "/v1/models is not a model list");
      }
    }
    if (answered == 0) {
      if (!last_body.empty()) {
        res.status = last_status;
        res.set_content(last_body, "application/json");
      } else {
        SendError(res, 503, "no healthy replica", "service_unavailable", "no_replica", 1);
      }
      return;
    }
    res.set_content(json{{"object", "list"}, {"data", data}}.dump(), "application/json");
  }

  // POST /v1/load_lora_adapter, /v1/unload_lora_adapter: every healthy replica, so any of them
  // can serve the variant afterwards. All succeed: the first answer; else the first failure's,
  // with X-Chorus-Failed-Replicas naming who failed.
  void FanOut(const httplib::Request& req, httplib::Response& res) {
    int first_ok = -1;
    std::string ok_body, fail_body, fail_type;
    int fail_status = 0;
    std::vector<std::string> failed;
    for (auto& rp : replicas) {
      Replica& r = *rp;
      if (!r.healthy.load()) continue;
      auto c = ClientFor(r, 120);
      auto up =
          c->Post(req.path, UpstreamHeaders(req), req.body,
                  req.has_header("Content-Type") ? req.get_header_value("Content-Type").c_str()
                                                 : "application/json");
      if (!up) {
        failed.push_back(r.addr.url());
        Eject(r, httplib::to_string(up.error()));
        continue;
      }
      if (up->status / 100 == 2) {
        if (first_ok < 0) {
          first_ok = up->status;
          ok_body = up->body;
        }
      } else {
        failed.push_back(r.addr.url());
        if (fail_status == 0) {
          fail_status = up->status;
          fail_body = up->body;
          fail_type = up->get_header_value("Content-Type");
        }
      }
    }
    PollAll();  // the model lists changed
    if (failed.empty() && first_ok > 0) {
      res.status = first_ok;
      res.set_content(ok_body, "application/json");
      return;
    }
    std::string names;
    for (const std::string& f : failed) names += (names.empty() ? "" : ",") + f;
    if (!names.empty()) res.set_header("X-Chorus-Failed-Replicas", names);
    if (fail_status != 0) {
      res.status = fail_status;
      res.set_content(fail_body, fail_type.empty() ? "application/json" : fail_type);
    } else {
      SendError(res, 503, "no healthy replica took the adapter request", "service_unavailable",
                "no_replica", 1);
    }
  }
};

Router::Router(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

Router::~Router() { Stop(); }

Result<std::unique_ptr<Router>> Router::Create(RouterOptions opts) {
  if (opts.replicas.empty())
    return InvalidArgumentError("flag --replica: give at least one replica");
  if (opts.health_interval_ms < 50 || opts.health_interval_ms > 600000)
    return InvalidArgumentError("flag --health-interval-ms must be in [50, 600000]");
  if (opts.replica_capacity < 1) return InvalidArgumentError("flag --replica-capacity must be ≥ 1");
  if (opts.replica_max_batch_tokens < 1)
    return InvalidArgumentError("the replicas' max batch tokens must be ≥ 1");
  if (opts.shed && opts.cost_model == nullptr)
    return InvalidArgumentError("flag --shed needs --cost-model (it sheds by predicted TTFT/TPOT)");
  auto impl = std::make_shared<Impl>();
  impl->weak_self = impl;
  std::set<std::string> seen;
  for (const std::string& url : opts.replicas) {
    CHORUS_ASSIGN_OR_RETURN(ReplicaAddress a, ParseReplicaUrl(url));
    if (!seen.insert(a.url()).second)
      return InvalidArgumentError("flag --replica: " + a.url() + " is given twice");
    auto r = std::make_unique<Impl::Replica>();
    r->addr = a;
    r->forecast = ReplicaForecast(opts.replica_max_batch_tokens);
    impl->replicas.push_back(std::move(r));
  }
  impl->opts = std::move(opts);
  return std::unique_ptr<Router>(new Router(std::move(impl)));
}

Status Router::Start() {
  Impl& m = *impl_;
  httplib::Server& http = m.http;
  http.new_task_queue = [n = m.opts.max_connections] { return new httplib::ThreadPool(n); };
  http.set_payload_max_length(static_cast<size_t>(m.opts.max_body_bytes));
  http.set_read_timeout(30, 0);
  http.set_write_timeout(30, 0);
  Impl* self = &m;
  for (const char* route : {"/v1/completions", "/v1/chat/completions", "/v1/embeddings",
                            "/tokenize", "/detokenize", "/apply-template"}) {
    http.Post(route, [self](const httplib::Request& req, httplib::Response& res) {
      self->Proxy(req, res);
    });
  }
  http.Get("/v1/models",
           [self](const httplib::Request& req, httplib::Response& res) { self->Models(req, res); });
  http.Get(R"(/v1/models/(.+))",
           [self](const httplib::Request& req, httplib::Response& res) { self->Proxy(req, res); });
  for (const char* route : {"/v1/load_lora_adapter", "/v1/unload_lora_adapter"}) {
    http.Post(route, [self](const httplib::Request& req, httplib::Response& res) {
      self->FanOut(req, res);
    });
  }
  http.Get("/health", [self](const httplib::Request&, httplib::Response& res) {
    int healthy = 0;
    for (auto& r : self->replicas) healthy += r->healthy.load() ? 1 : 0;
    if (healthy == 0) {
      SendError(res, 503, "no healthy replica", "service_unavailable", "no_replica", 1);
      return;
    }
    res.set_content(
        json{{"status", "ok"}, {"healthy_replicas", healthy}, {"replicas", self->replicas.size()}}
            .dump(),
        "application/json");
  });
  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(MetricsText(), "text/plain; version=0.0.4");
  });
  http.set_error_handler([](const httplib::Request&, httplib::Response& res) {
    if (!res.body.empty()) return;
    if (res.status == 404) {
      SendError(res, 404, "no such route on the router", "invalid_request_error", "not_found");
    } else if (res.status == 413) {
      SendError(res, 413, "request body too large", "invalid_request_error", "body_too_large");
    }
  });
  if (m.opts.port == 0) {
    m.port = http.bind_to_any_port(m.opts.host);
    if (m.port <= 0) return UnavailableError("cannot bind " + m.opts.host + " on any port");
  } else {
    if (!http.bind_to_port(m.opts.host, m.opts.port))
      return UnavailableError("flag --port: cannot bind " + m.opts.host + ":" +
                              std::to_string(m.opts.port) + " (in use?)");
    m.port = m.opts.port;
  }
  m.PollAll();
  m.listen_thread = std::thread([self] { self->http.listen_after_bind(); });
  m.health_thread = std::thread([self] {
    std::unique_lock<std::mutex> l(self->stop_mu);
    while (!self->stop_cv.wait_for(l, std::chrono::milliseconds(self->opts.health_interval_ms),
                                   [self] { return self->stopping; })) {
      l.unlock();
      self->PollAll();
      l.lock();
    }
  });
  return OkStatus();
}

void Router::Stop() {
  Impl& m = *impl_;
  {
    std::lock_guard<std::mutex> l(m.stop_mu);
    if (m.stopping) return;
    m.stopping = true;
  }
  m.stop_cv.notify_all();
  m.http.stop();
  if (m.listen_thread.joinable()) m.listen_thread.join();
  if (m.health_thread.joinable()) m.health_thread.join();
}

int Router::port() const { return impl_->port; }

std::string Router::MetricsText() const {
  const Impl& m = *impl_;
  std::ostringstream s;
  s << "# HELP chorus_router_replica_healthy 1 when the replica is admitted.\n"
    << "# TYPE chorus_router_replica_healthy gauge\n";
  for (const auto& r : m.replicas)
    s << "chorus_router_replica_healthy{replica=\"" << r->addr.url() << "\"} "
      << (r->healthy.load() ? 1 : 0) << "\n";
  s << "# HELP chorus_router_in_flight Requests outstanding at the replica.\n"
    << "# TYPE chorus_router_in_flight gauge\n";
  for (const auto& r : m.replicas)
    s << "chorus_router_in_flight{replica=\"" << r->addr.url() << "\"} " << r->in_flight.load()
      << "\n";
  s << "# HELP chorus_router_requests_total Requests sent to the replica.\n"
    << "# TYPE chorus_router_requests_total counter\n";
  for (const auto& r : m.replicas)
    s << "chorus_router_requests_total{replica=\"" << r->addr.url() << "\"} " << r->requests.load()
      << "\n";
  s << "# HELP chorus_router_failures_total Transport failures at the replica.\n"
    << "# TYPE chorus_router_failures_total counter\n";
  for (const auto& r : m.replicas)
    s << "chorus_router_failures_total{replica=\"" << r->addr.url() << "\"} " << r->failures.load()
      << "\n";
  s << "# TYPE chorus_router_retries_total counter\nchorus_router_retries_total "
    << m.retries.load() << "\n";
  s << "# TYPE chorus_router_shed_total counter\nchorus_router_shed_total " << m.shed_count.load()
    << "\n";
  s << "# TYPE chorus_router_stream_errors_total counter\nchorus_router_stream_errors_total "
    << m.stream_errors.load() << "\n";
  s << "# TYPE chorus_router_no_replica_total counter\nchorus_router_no_replica_total "
    << m.no_replica.load() << "\n";
  return s.str();
}

}  // namespace chorus::router
