// `chorus router` (docs/router.md): one OpenAI-compatible endpoint in front of several `chorus
// serve` replicas (a tensor-parallel group counts as one). Requests pass through unchanged —
// bodies, the client's Authorization header, streams — to a replica chosen per request:
//
//   least-loaded  fewest requests in flight (the default)
//   random        uniformly among the replicas that can serve the request
//   pack          Punica's consolidation: the busiest replica still under --replica-capacity
//                 requests, so lightly loaded periods keep few replicas busy
//   rank-aware    CaraServe-style: the replica whose predicted added latency is smallest, from
//                 its requests in flight and the LoRA ranks they run (a documented proxy for
//                 each replica's measured cost model), preferring one already running the
//                 request's variant
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

// What the choice sees of one replica.
struct ReplicaView {
  bool healthy = false;
  bool serves_model = false;   // lists the request's model (or no replica lists it)
  int64_t in_flight = 0;       // requests the router has outstanding there
  int64_t rank_in_flight = 0;  // Σ LoRA ranks of those requests
  bool runs_variant = false;   // one of them is for the request's variant
  // rank-aware with a cost model (CaraServe §5): the replica's predicted decode step over its
  // requests in flight, without and with the request being routed (RankAwareStepSeconds). When
  // any candidate's is negative (unknown), rank-aware scores every candidate by the proxy.
  double step_s = -1;
  double step_s_with = -1;
};

// The index of the chosen replica among `replicas`, or -1 when none is healthy and serves the
// model. `random` is a uniformly random number (used by kRandom and to break ties);
// `tpot_slo_s` is the request's time-per-output-token SLO (0 = none), which rank-aware with
// predicted steps uses to penalise a replica whose step would exceed it. The one decision of
// both `chorus router` and `chorus simulate` (docs/router.md).
int ChooseReplica(Policy policy, std::span<const ReplicaView> replicas, int64_t capacity,
                  uint64_t random, double tpot_slo_s = 0);

// rank-aware's score of one replica (smaller is better), exposed for tests and the simulator's
// report: with predicted steps, CaraServe's cost — the latency the request adds to the requests
// in flight (in_flight × (step_s_with − step_s)) plus its own step time, plus kSloPenalty when
// the step with it would exceed `tpot_slo_s`; without, the proxy in_flight + rank_in_flight / 64
// + ½ when the replica does not run the variant yet.
double RankAwareScore(const ReplicaView& r, bool predicted, double tpot_slo_s);
inline constexpr double kSloPenalty = 1e6;

// The decode step a replica would run over the requests a router has in flight there, as
// rank-aware's cost model sees it: one row per request at its context (positions attended), its
// variant's LoRA rank on the rows, each distinct adapter (rank > 0) once in Σrank and the adapter
// count. `chorus router` and `chorus simulate` keep one per replica.
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
