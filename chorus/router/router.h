// `chorus router` (docs/router.md): one OpenAI-compatible endpoint in front of several `chorus
// serve` replicas (a tensor-parallel group counts as one). Requests pass through unchanged —
// bodies, the client's Authorization header, streams — to a replica chosen per request:
//
//   least-loaded  fewest requests in flight (the default)
//   random        uniformly among the replicas that can serve the request
//   pack          Punica's consolidation: the busiest replica still under --replica-capacity
//                 requests, so lightly loaded periods keep few replicas busy
//   rank-aware    CaraServe-style: the replica whose predicted added latency is smallest — with
//                 --cost-model, the cost model's steps over the requests in flight and a penalty
//                 where the request's forecast TTFT/TPOT misses its SLOs; without, a documented
//                 proxy from the requests and LoRA ranks in flight, preferring a replica that
//                 already runs the request's variant
//
// With --shed (and a cost model), a request the chosen replica is predicted to serve outside its
// SLOs is answered 429 with Retry-After instead of being forwarded.
//
// Only replicas that are healthy and (when any replica lists it) serve the request's `model`
// are candidates. A health thread polls each replica's /health and /v1/models every interval:
// a failing replica is ejected and readmitted when it answers again; a connection that fails
// during a request ejects it at once. A request whose replica fails before answering, or
// answers 503 / 429 (draining, overloaded, out of KV), is sent to another replica — migration
// by recomputation, since nothing reached the client yet. A replica that dies mid-stream ends
// only that stream, with an OpenAI-shaped error event; new requests go elsewhere.
// GET /v1/models is the union over healthy replicas (asked with the client's key, so tenants see
// their own); adapter load/unload fan out to every healthy replica.
//
// Thread-safety: Start/Stop from one controlling thread; handlers run on httplib's worker
// threads, one upstream thread per streamed request, and the health thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "chorus/base/status.h"
#include "chorus/engine/cost_model.h"

namespace chorus::router {

enum class Policy { kLeastLoaded, kRandom, kPack, kRankAware };
Result<Policy> ParsePolicy(const std::string& name);
const char* PolicyName(Policy p);

// A replica's base URL, http://HOST:PORT (no path, no TLS).
struct ReplicaAddress {
  std::string host;
  int port = 0;
  std::string url() const { return "http://" + host + ":" + std::to_string(port); }
};
Result<ReplicaAddress> ParseReplicaUrl(const std::string& url);

// One replica's predictions for a request routed there, from the cost model.
struct Forecast {
  double step_s = 0;       // decode step over the requests in flight
  double step_s_with = 0;  // ... and this one
  double prefill_s = 0;    // its prompt's steps (chunks of max_batch_tokens beside the decode rows)
  double stall_s = 0;      // what those steps add to the decode steps of the requests in flight
  double ttft_s = 0;       // predicted TTFT: the prompts routed there before it, then its own
  double tpot_s = 0;       // predicted TPOT: step_s_with plus prompts' stalls spread over tokens
};

// What the choice sees of one replica.
struct ReplicaView {
  bool healthy = false;
  bool serves_model = false;   // lists the request's model (or no replica lists it)
  int64_t in_flight = 0;       // requests the router has outstanding there
  int64_t rank_in_flight = 0;  // Σ LoRA ranks of those requests
  bool runs_variant = false;   // one of them is for the request's variant
  // rank-aware with a cost model (CaraServe §5): the replica's predicted decode step over its
  // requests in flight, without and with the request being routed (ReplicaForecast). When any
  // candidate's is negative (unknown), rank-aware scores every candidate by the proxy.
  double step_s = -1;
  double step_s_with = -1;
  // The request's own predicted TPOT and TTFT there (ReplicaForecast; negative: unknown). They
  // decide the SLO penalty and shedding; the score's latency terms stay CaraServe's decode steps.
  double tpot_s_with = -1;
  double ttft_s_with = -1;
  // Takes the forecast's fields; without `steps` (rank-aware's proxy) the decode steps stay
  // unknown and only the TTFT/TPOT forecast is set.
  void SetForecast(const Forecast& f, bool steps = true) {
    step_s = steps ? f.step_s : -1;
    step_s_with = steps ? f.step_s_with : -1;
    tpot_s_with = f.tpot_s;
    ttft_s_with = f.ttft_s;
  }
};

// A request's SLOs, seconds (0 = none), and whether the router sheds what would miss them.
struct RequestSlo {
  double ttft_s = 0;
  double tpot_s = 0;
  // --shed: rank-aware's penalty is MissesSlo, the test that sheds, so a request is shed only
  // when every replica is penalised. Without shedding every request is served somewhere, and
  // the penalty is BreaksSlo: the TPOT headroom and the prefill stalls, steering requests away
  // from replicas a pessimistic forecast calls full, cost attainment near capacity (up to 0.1
  // at 20 req/s in the TinyLlama-shape sweeps).
  bool shed = false;
};

// The predicted TPOT is held to this fraction of the SLO: a replica's step time moves around the
// average the forecast sees (prompts arriving, requests ending), and a replica filled to exactly
// its SLO misses it half the time. Chosen among 0.7, 0.8 and 0.9 on the simulation sweeps of
// docs/benchmarks.md "Cluster simulation" (all three meet the bar; 0.8 gave the most).
inline constexpr double kTpotHeadroom = 0.8;

// Whether the forecast in `r` says the request would miss one of its SLOs there: predicted TTFT
// over the TTFT SLO, or predicted TPOT over kTpotHeadroom × the TPOT SLO. False without a
// forecast (negative fields) or without SLOs.
bool MissesSlo(const ReplicaView& r, const RequestSlo& slo);
// What surely breaks them: predicted TTFT over the TTFT SLO, or the decode step with the request
// (step_s_with) over the TPOT SLO (CaraServe's test).
bool BreaksSlo(const ReplicaView& r, const RequestSlo& slo);

// The index of the chosen replica among `replicas`, or -1 when none is healthy and serves the
// model. `random` is a uniformly random number (used by kRandom and to break ties); `slo` is the
// request's SLOs, which rank-aware with predicted steps uses to penalise a replica where the
// request would miss them. The one decision of both `chorus router` and `chorus simulate`
// (docs/router.md).
int ChooseReplica(Policy policy, std::span<const ReplicaView> replicas, int64_t capacity,
                  uint64_t random, const RequestSlo& slo = {});

// rank-aware's score of one replica (smaller is better), exposed for tests and the simulator's
// report: with predicted steps, CaraServe's cost — the latency the request adds to the requests
// in flight (in_flight × (step_s_with − step_s)) plus its own step time, plus kSloPenalty when
// the request would miss its SLOs there (MissesSlo with slo.shed, else BreaksSlo); without, the
// proxy in_flight + rank_in_flight / 64 + ½ when the replica does not run the variant yet.
double RankAwareScore(const ReplicaView& r, bool predicted, const RequestSlo& slo);
inline constexpr double kSloPenalty = 1e6;

// The decode step a replica would run over the requests a router has in flight there, as
// rank-aware's cost model sees it: one row per request at its context (positions attended), its
// variant's LoRA rank on the rows, each distinct adapter (rank > 0) once in Σrank and the adapter
// count. `chorus router` and `chorus simulate` keep one per replica (inside ReplicaForecast).
class InFlightStep {
 public:
  void Add(const std::string& variant, int64_t rank, int64_t context);
  // Undoes an Add with the same arguments.
  void Remove(const std::string& variant, int64_t rank, int64_t context);
  // The features with one more such request (this one unchanged).
  engine::StepFeatures With(const std::string& variant, int64_t rank, int64_t context) const;
  const engine::StepFeatures& features() const { return f_; }
  bool Runs(const std::string& variant) const { return variants_.count(variant) > 0; }

 private:
  engine::StepFeatures f_;
  std::map<std::string, int64_t> variants_;  // variant → requests in flight
};

// What the router knows of a request it routes.
struct RoutedRequest {
  std::string variant;        // the model it names
  int64_t rank = 0;           // its LoRA rank (0: base or unknown)
  int64_t prompt_tokens = 0;  // its prompt (exact in the simulator; an estimate in the router)
  int64_t output_tokens = 1;  // tokens it will generate (max_tokens in the router)
};

// The router's model of one replica's load, from the requests it routed there (the router sees
// no replica internals): the decode step over them (InFlightStep), a FIFO of their prompts'
// prefill time (TTFT), and the stalls prompts add to everyone's decode steps. In steady state a
// request lives through about as many other requests' prefills as there are requests in flight
// (Little's law), so its TPOT ≈ step_s_with + Σ stalls × n / Σ output tokens, n counting it.
// Not thread-safe (the router holds its replica's mutex).
class ReplicaForecast {
 public:
  explicit ReplicaForecast(int64_t max_batch_tokens = 512) : max_batch_tokens_(max_batch_tokens) {}
  Forecast With(const engine::CostModel& model, const RoutedRequest& req, double now_s) const;
  // The request starts here with the forecast With() gave at `now_s`.
  void Add(const RoutedRequest& req, const Forecast& f, double now_s);
  // It ended (the same arguments as its Add).
  void Remove(const RoutedRequest& req, const Forecast& f);
  const InFlightStep& step() const { return step_; }
  int64_t in_flight() const { return in_flight_; }
  // Σ LoRA ranks of the requests in flight (each request's row carries its rank).
  int64_t rank_in_flight() const { return static_cast<int64_t>(step_.features().row_ranks); }

 private:
  int64_t max_batch_tokens_;
  InFlightStep step_;
  int64_t in_flight_ = 0;
  double stall_sum_s_ = 0, output_sum_ = 0;
  double prefill_free_s_ = 0;  // when the prompts routed so far are predicted to be done
};

struct RouterOptions {
  std::string host = "127.0.0.1";
  int port = 8100;  // 0 = any free port (Router::port())
  std::vector<std::string> replicas;
  Policy policy = Policy::kLeastLoaded;
  int health_interval_ms = 1000;
  int64_t replica_capacity = 32;  // pack: requests a replica takes before the next is used
  std::string replica_api_key;    // for the router's own /v1/models polls (tenants/API key)
  int max_connections = 512;
  int64_t max_body_bytes = int64_t{8} << 20;
  int connect_timeout_ms = 1000;
  int read_timeout_s = 600;  // an upstream that sends nothing for this long is a failure
  // rank-aware: the replicas' cost model (one for all: replicas of one build on one kind of
  // machine); its predicted steps over the requests in flight replace the proxy. Null: the proxy.
  std::shared_ptr<const engine::CostModel> cost_model;
  // With a cost model: answer 429 (Retry-After) instead of forwarding a request that the chosen
  // replica is predicted to serve outside its SLOs (MissesSlo) — for rank-aware, only when every
  // replica is. A request without SLOs is never shed.
  bool shed = false;
  int64_t replica_max_batch_tokens = 512;  // the replicas' --max-batch-tokens, for the forecast
};

class Router {
 public:
  // Validates the options (replica URLs, numbers); binds nothing.
  static Result<std::unique_ptr<Router>> Create(RouterOptions opts);
  ~Router();
  // Binds, polls every replica once, then serves and polls in the background.
  Status Start();
  void Stop();
  int port() const;
  // Prometheus text of the router's own metrics (also GET /metrics).
  std::string MetricsText() const;

 private:
  struct Impl;
  explicit Router(std::shared_ptr<Impl> impl);
  // Shared with the upstream threads of requests in flight, which may outlive Stop() by the time
  // their replica takes to answer.
  std::shared_ptr<Impl> impl_;
};

}  // namespace chorus::router
