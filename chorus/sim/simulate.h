// A discrete-event simulator of a cluster of `chorus serve` replicas behind `chorus router`
// (docs/router.md, "Simulating a cluster"), for scales the machines here cannot reach: it
// compares routing policies by SLO attainment the way CaraServe §7.5 does (60 simulated
// servers, step latencies from a profiled cost model).
//
// What is modelled, and from which code:
//   * routing: every arrival is routed by router::ChooseReplica — the router's own decision —
//     over views built from what the router knows of each replica (the requests it has in
//     flight there, their LoRA ranks and variants, kept by the router's own ReplicaForecast). For
//     rank-aware the views also carry the cost model's predicted decode step over those requests
//     without and with the new one (CaraServe §5) and the new one's predicted TTFT and TPOT
//     there; with `rank_aware_proxy` the steps are absent and rank-aware falls back to the
//     router's proxy (`chorus router` without --cost-model). The simulated router knows each
//     request's prompt and output lengths; `chorus router` estimates them from the body.
//   * each replica: the engine's continuous batching (engine/scheduler.cc): every step takes the
//     running sequences oldest first (a decode row, or the next chunk of a prompt) under
//     max_batch_tokens rows, then admits waiting requests in queue order while rows and
//     max_running allow and the engine's admission Policy (engine/policy.h: fcfs, cluster or
//     slo, with max_adapters_per_step) agrees — the same Policy objects the engine builds;
//   * a step's duration: the cost model's Predict() of the step's features (prefill tokens,
//     decode rows, distinct adapters and Σ of their ranks, context, rank-weighted rows).
//   * a replica's 429 (the slo admission's early abort): the router sends the request to a
//     replica that has not refused it yet, at once, as `chorus router` does; when every replica
//     has, it stays refused (counted as missed).
// Not modelled: KV-cache capacity and preemption (max_running bounds a replica's batch),
// adapter loading time, network time, replica failures, n > 1 choices, prefix caching.
//
// A request's TTFT is from its arrival to the end of the step that computes its last prompt
// token; its TPOT is (finish − first token) / (output_tokens − 1) (0 for one token).
//
// Thread-safety: Simulate() is a pure function of its arguments.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "chorus/base/status.h"
#include "chorus/engine/cost_model.h"
#include "chorus/engine/policy.h"
#include "chorus/router/router.h"
#include "chorus/sim/trace.h"

namespace chorus::sim {

struct SimOptions {
  int64_t replicas = 60;
  router::Policy policy = router::Policy::kRankAware;
  int64_t replica_capacity = 32;  // pack's --replica-capacity
  bool rank_aware_proxy = false;  // rank-aware without the cost model's predictions
  // Each replica's engine: rows per step, running sequences, admission policy.
  int64_t max_batch_tokens = 512;
  int64_t max_running = 64;
  std::string admission = "fcfs";  // fcfs, cluster, slo (engine/policy.h)
  int64_t max_adapters_per_step = 0;
  std::shared_ptr<const engine::CostModel> cost_model;  // required
  uint64_t seed = 1;  // the router's random numbers (random policy, ties)
  // The router's --shed: a request the chosen replica is predicted to serve outside its SLOs
  // (router::MissesSlo) is refused at once (429) and counts as missed.
  bool shed = false;
};

struct RequestResult {
  int replica = -1;
  bool completed = false;  // false: refused by every replica's slo admission, or shed by the router
  bool shed = false;       // refused by the router's --shed
  double ttft_s = 0, tpot_s = 0, e2e_s = 0;
  bool ttft_met = false, tpot_met = false;  // against its SLOs (met when it has none)
};

struct Summary {
  int64_t requests = 0, completed = 0, shed = 0;  // shed: refused by the router (--shed)
  // Fractions of all requests (refused ones miss both): TTFT SLO met, TPOT SLO met, both met.
  double ttft_attainment = 0, tpot_attainment = 0, attainment = 0;
  // Over completed requests, seconds.
  double ttft_p50 = 0, ttft_p90 = 0, tpot_p50 = 0, tpot_p90 = 0, tpot_mean = 0, e2e_p50 = 0,
         e2e_p90 = 0;
  double makespan_s = 0;      // last completion (from time 0)
  double throughput_rps = 0;  // completed requests / makespan
  double tokens_per_s = 0;    // output tokens of completed requests / makespan
  int64_t steps = 0;          // engine steps over all replicas
  int64_t retries = 0;        // requests the router sent to another replica after a 429
  double busy_fraction = 0;   // Σ step time / (replicas × makespan)
};

struct SimResult {
  std::vector<RequestResult> requests;  // in trace order
  Summary summary;
};

// Errors: no cost model, fewer than one replica, a bad engine setting or admission policy name.
Result<SimResult> Simulate(const std::vector<TraceRequest>& trace, const SimOptions& opts);

// The cost model's predicted decode step of `rows` rows, each of an adapter of `rank` (0 = base),
// `adapters` distinct ones, at context `context` — for choosing SLOs relative to a model.
double PredictDecodeStep(const engine::CostModel& model, int64_t rows, int64_t rank,
                         int64_t adapters, int64_t context);

}  // namespace chorus::sim
