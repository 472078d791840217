// The cluster simulator (sim/simulate.h): one replica with a known cost model gives timings
// computed by hand (prefill, decode, continuous batching, chunked prefill, the adapter cap of
// the engine's admission policy); every request finishes exactly once; runs are deterministic;
// routing is the router's own decision.
#include "chorus/sim/simulate.h"

#include <gtest/gtest.h>

#include <map>

namespace chorus::sim {
namespace {

// t = 10 ms + 1 ms per prefill token + 2 ms per decode row + 0.1 ms per unit of Σrank.
std::shared_ptr<const engine::CostModel> Model() {
  auto m = engine::CostModel::FromCoefficients(engine::CostModel::Kind::kLinear,
                                               {0.010, 0.001, 0.002, 0.0001, 0, 0, 0});
  return std::make_shared<engine::CostModel>(*m);
}

TraceRequest Req(double at, int64_t prompt, int64_t output, std::string adapter = "",
                 int64_t rank = 0) {
  TraceRequest r;
  r.arrival_s = at;
  r.prompt_tokens = prompt;
  r.output_tokens = output;
  r.adapter = std::move(adapter);
  r.rank = rank;
  return r;
}

SimOptions One() {
  SimOptions o;
  o.replicas = 1;
  o.cost_model = Model();
  o.policy = router::Policy::kLeastLoaded;
  return o;
}

TEST(SimulateTest, OneRequestOnOneReplicaTakesThePredictedSteps) {
  auto r = Simulate({Req(1.0, 100, 5)}, One());
  ASSERT_TRUE(r.ok()) << r.status().message();
  const RequestResult& q = r->requests[0];
  ASSERT_TRUE(q.completed);
  // Prefill of 100 tokens: 10 + 100 ms; then 4 decode steps of 10 + 2 ms.
  EXPECT_NEAR(q.ttft_s, 0.110, 1e-12);
  EXPECT_NEAR(q.tpot_s, 0.012, 1e-12);
  EXPECT_NEAR(q.e2e_s, 0.110 + 4 * 0.012, 1e-12);
  EXPECT_EQ(r->summary.steps, 5);
  EXPECT_NEAR(r->summary.makespan_s, 1.158, 1e-12);
}

TEST(SimulateTest, ArrivalsJoinTheRunningBatchAtTheNextStep) {
  // B arrives during A's prefill; the next step holds A's decode row and B's whole prompt.
  auto r = Simulate({Req(0, 100, 3), Req(0.05, 50, 2)}, One());
  ASSERT_TRUE(r.ok());
  const double s1 = 0.110;                  // A's prefill
  const double s2 = 0.010 + 0.002 + 0.050;  // A decodes, B prefills
  const double s3 = 0.010 + 0.004;          // both decode: A's last token, B's last token
  EXPECT_NEAR(r->requests[0].ttft_s, s1, 1e-12);
  EXPECT_NEAR(r->requests[0].e2e_s, s1 + s2 + s3, 1e-12);
  EXPECT_NEAR(r->requests[0].tpot_s, (s2 + s3) / 2, 1e-12);
  EXPECT_NEAR(r->requests[1].ttft_s, s1 + s2 - 0.05, 1e-12);
  EXPECT_NEAR(r->requests[1].tpot_s, s3, 1e-12);
}

TEST(SimulateTest, LongPromptsArePrefilledInChunksOfMaxBatchTokens) {
  SimOptions o = One();
  o.max_batch_tokens = 64;
  auto r = Simulate({Req(0, 100, 2, "a", 8)}, o);
  ASSERT_TRUE(r.ok());
  // 64 then 36 prompt tokens, each step with the adapter's rank: Σrank 8 → 0.8 ms.
  const double s1 = 0.010 + 0.064 + 0.0008, s2 = 0.010 + 0.036 + 0.0008;
  EXPECT_NEAR(r->requests[0].ttft_s, s1 + s2, 1e-12);
  EXPECT_NEAR(r->requests[0].tpot_s, 0.010 + 0.002 + 0.0008, 1e-12);
}

TEST(SimulateTest, TheEngineAdmissionPolicyCapsAdaptersPerStep) {
  // fcfs with one adapter per step: b waits for a to finish although rows would allow both.
  SimOptions o = One();
  o.max_adapters_per_step = 1;
  auto r = Simulate({Req(0, 10, 2, "a", 8), Req(0, 10, 2, "b", 8)}, o);
  ASSERT_TRUE(r.ok());
  const double pre = 0.010 + 0.010 + 0.0008, dec = 0.010 + 0.002 + 0.0008;
  EXPECT_NEAR(r->requests[0].e2e_s, pre + dec, 1e-12);
  EXPECT_NEAR(r->requests[1].ttft_s, pre + dec + pre, 1e-12);
  // Without the cap b joins a's decode step (a's arrival started the first step alone): one
  // decode row, b's 10 prompt tokens, Σrank of two distinct adapters.
  o.max_adapters_per_step = 0;
  r = Simulate({Req(0, 10, 2, "a", 8), Req(0, 10, 2, "b", 8)}, o);
  EXPECT_NEAR(r->requests[1].ttft_s, pre + 0.010 + 0.002 + 0.010 + 0.0016, 1e-12);
  o.admission = "nonesuch";
  EXPECT_FALSE(Simulate({Req(0, 10, 2)}, o).ok());
}

TEST(SimulateTest, SloAttainmentCountsEachSlo) {
  SimOptions o = One();
  std::vector<TraceRequest> t = {Req(0, 100, 5)};
  t[0].ttft_slo_ms = 110;  // met exactly
  t[0].tpot_slo_ms = 11;   // 12 ms: missed
  auto r = Simulate(t, o);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->requests[0].ttft_met);
  EXPECT_FALSE(r->requests[0].tpot_met);
  EXPECT_EQ(r->summary.ttft_attainment, 1.0);
  EXPECT_EQ(r->summary.tpot_attainment, 0.0);
  EXPECT_EQ(r->summary.attainment, 0.0);
}

std::vector<TraceRequest> Workload(double rate, int64_t n, uint64_t seed) {
  TraceSpec spec;
  spec.requests = n;
  spec.rate = rate;
  spec.adapters = 20;
  spec.prompt = *LengthDist::Parse("uniform:8:200");
  spec.output = *LengthDist::Parse("uniform:1:40");
  spec.tpot_slo_ms = 40;
  spec.ttft_slo_ms = 1000;
  spec.seed = seed;
  return *GenerateTrace(spec);
}

TEST(SimulateTest, EveryRequestFinishesExactlyOnceUnderEveryPolicy) {
  const auto trace = Workload(60, 3000, 5);
  for (auto p : {router::Policy::kLeastLoaded, router::Policy::kRandom, router::Policy::kPack,
                 router::Policy::kRankAware}) {
    SimOptions o;
    o.replicas = 8;
    o.policy = p;
    o.cost_model = Model();
    o.max_batch_tokens = 128;
    o.max_running = 16;
    auto r = Simulate(trace, o);
    ASSERT_TRUE(r.ok());
    ASSERT_EQ(r->requests.size(), trace.size());
    EXPECT_EQ(r->summary.completed, 3000) << router::PolicyName(p);
    std::map<int, int> per_replica;
    int64_t steps_lower_bound = 0;
    for (size_t i = 0; i < trace.size(); ++i) {
      const RequestResult& q = r->requests[i];
      ASSERT_TRUE(q.completed);
      ASSERT_GE(q.replica, 0);
      ASSERT_LT(q.replica, 8);
      ++per_replica[q.replica];
      EXPECT_GT(q.ttft_s, 0);
      EXPECT_GE(q.e2e_s, q.ttft_s);
      EXPECT_GE(q.tpot_s, 0);
      // No request finishes before its own steps could: one prefill + output − 1 decodes.
      EXPECT_GE(q.e2e_s + 1e-12, 0.010 + 0.001 * static_cast<double>(trace[i].prompt_tokens) +
                                     static_cast<double>(trace[i].output_tokens - 1) * 0.012);
      steps_lower_bound = std::max(steps_lower_bound, trace[i].output_tokens);
    }
    EXPECT_GE(r->summary.steps, steps_lower_bound);
    EXPECT_GT(r->summary.busy_fraction, 0);
    EXPECT_LE(r->summary.busy_fraction, 1 + 1e-9);
    // Every policy but pack spreads over all replicas.
    if (p != router::Policy::kPack) {
      EXPECT_EQ(per_replica.size(), 8u) << router::PolicyName(p);
    }
  }
}

TEST(SimulateTest, RunsAreDeterministic) {
  const auto trace = Workload(80, 1500, 9);
  SimOptions o;
  o.replicas = 6;
  o.policy = router::Policy::kRandom;
  o.cost_model = Model();
  o.seed = 3;
  auto a = Simulate(trace, o), b = Simulate(trace, o);
  ASSERT_TRUE(a.ok() && b.ok());
  bool differs = false;
  o.seed = 4;
  auto c = Simulate(trace, o);
  for (size_t i = 0; i < trace.size(); ++i) {
    EXPECT_EQ(a->requests[i].replica, b->requests[i].replica);
    EXPECT_EQ(a->requests[i].e2e_s, b->requests[i].e2e_s);
    differs = differs || a->requests[i].replica != c->requests[i].replica;
  }
  EXPECT_TRUE(differs) << "the seed drives the random policy";
}

TEST(SimulateTest, RankAwareRoutesWithTheCostModel) {
  // Two replicas, one running a rank-64 request, the other a rank-8 one. A new rank-64 request
  // adds the same to either step (a row and 64 rank-units), but the rank-8 replica's step is
  // shorter: CaraServe's score in_flight × Δ + step_with is 29.6 ms there against 35.2 ms.
  SimOptions o;
  o.replicas = 2;
  o.cost_model = Model();
  o.policy = router::Policy::kRankAware;
  std::vector<TraceRequest> t = {Req(0, 10, 50, "big", 64), Req(0.001, 10, 50, "small", 8),
                                 Req(0.002, 10, 5, "other", 64)};
  auto r = Simulate(t, o);
  ASSERT_TRUE(r.ok());
  EXPECT_NE(r->requests[0].replica, r->requests[1].replica);
  EXPECT_EQ(r->requests[2].replica, r->requests[1].replica);
  // And a request for a variant already running on a replica goes there (no new Σrank term).
  t[2].adapter = "big";
  r = Simulate(t, o);
  EXPECT_EQ(r->requests[2].replica, r->requests[0].replica);
}

TEST(SimulateTest, ShedRefusesWhatThePredictedTtftWouldMiss) {
  // One replica, three prompts of 100 tokens at once, TTFT SLO 150 ms. The first is predicted
  // at 110 ms (one 100-token chunk); the second would wait for it (110 + 112 ms) and so would
  // the third: with --shed both are refused at once, without it they are served late.
  SimOptions o = One();
  std::vector<TraceRequest> t = {Req(0, 100, 4), Req(0, 100, 4), Req(0, 100, 4)};
  for (TraceRequest& r : t) r.ttft_slo_ms = 150;
  auto served = Simulate(t, o);
  ASSERT_TRUE(served.ok());
  EXPECT_EQ(served->summary.completed, 3);
  EXPECT_EQ(served->summary.shed, 0);
  o.shed = true;
  auto shed = Simulate(t, o);
  ASSERT_TRUE(shed.ok());
  EXPECT_EQ(shed->summary.shed, 2);
  EXPECT_EQ(shed->summary.completed, 1);
  EXPECT_TRUE(shed->requests[0].completed);
  EXPECT_TRUE(shed->requests[0].ttft_met);
  for (int i : {1, 2}) {
    EXPECT_TRUE(shed->requests[static_cast<size_t>(i)].shed);
    EXPECT_FALSE(shed->requests[static_cast<size_t>(i)].completed);
  }
  EXPECT_NEAR(shed->summary.attainment, 1.0 / 3, 1e-12);
  // Requests without SLOs are never shed.
  for (TraceRequest& r : t) r.ttft_slo_ms = 0;
  auto none = Simulate(t, o);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->summary.shed, 0);
  EXPECT_EQ(none->summary.completed, 3);
}

TEST(SimulateTest, ARequestAReplicaRefusesIsRoutedToAnother) {
  // Two replicas with the slo admission; `pack` (capacity 100) puts 60 one-token prompts that
  // decode 20 tokens each on one replica: steps of 10 + 60 × 2 = 130 ms. A 100-token prompt with
  // a 260 ms TTFT SLO arriving at 1 s goes there too; at the next step boundary its prefill
  // beside the 60 rows is predicted at 230 ms, too late: that replica answers 429, and the router
  // — as `chorus router` does — sends it to the idle replica, where 110 ms of prefill still
  // meets the SLO.
  SimOptions o;
  o.replicas = 2;
  o.cost_model = Model();
  o.policy = router::Policy::kPack;
  o.replica_capacity = 100;
  o.admission = "slo";
  std::vector<TraceRequest> t;
  for (int i = 0; i < 60; ++i) t.push_back(Req(0, 1, 20));
  t.push_back(Req(1.0, 100, 4));
  t.back().ttft_slo_ms = 260;
  auto r = Simulate(t, o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const RequestResult& late = r->requests.back();
  EXPECT_TRUE(late.completed);
  EXPECT_NE(late.replica, r->requests[0].replica);
  EXPECT_TRUE(late.ttft_met) << late.ttft_s;
  EXPECT_GT(late.ttft_s, 0.110);  // the wait for the busy replica's step, then its own prefill
  EXPECT_LT(late.ttft_s, 0.260);
  EXPECT_EQ(r->summary.retries, 1);
  EXPECT_EQ(r->summary.completed, 61);
  // With one replica there is nowhere else: it stays refused.
  o.replicas = 1;
  r = Simulate(t, o);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->requests.back().completed);
  EXPECT_EQ(r->summary.retries, 1);
  EXPECT_EQ(r->summary.completed, 60);
}

TEST(SimulateTest, BadOptionsAreRefused) {
  SimOptions o = One();
  o.cost_model = nullptr;
  EXPECT_FALSE(Simulate({Req(0, 1, 1)}, o).ok());
  o = One();
  o.replicas = 0;
  EXPECT_FALSE(Simulate({Req(0, 1, 1)}, o).ok());
  o = One();
  EXPECT_FALSE(Simulate({Req(1, 1, 1), Req(0, 1, 1)}, o).ok());
}

}  // namespace
}  // namespace chorus::sim
