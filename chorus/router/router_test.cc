// test-labels: unit concurrency
// The router's choices (router.h) without sockets: which replica each policy picks from the
// same views, that unhealthy replicas and replicas without the model are never picked, ties
// spread, and replica URLs are validated.
#include "chorus/router/router.h"

#include <gtest/gtest.h>

#include <set>
#include <vector>

namespace chorus::router {
namespace {

ReplicaView V(int64_t in_flight, bool healthy = true, bool serves = true, int64_t ranks = 0,
              bool runs = false) {
  return ReplicaView{.healthy = healthy,
                     .serves_model = serves,
                     .in_flight = in_flight,
                     .rank_in_flight = ranks,
                     .runs_variant = runs};
}

TEST(RouterChoiceTest, NeverPicksAnUnhealthyReplicaOrOneWithoutTheModel) {
  const std::vector<ReplicaView> v = {V(0, false), V(5), V(0, true, false)};
  for (Policy p : {Policy::kLeastLoaded, Policy::kRandom, Policy::kPack, Policy::kRankAware})
    for (uint64_t r = 0; r < 20; ++r) EXPECT_EQ(ChooseReplica(p, v, 32, r), 1) << PolicyName(p);
  const std::vector<ReplicaView> none = {V(0, false), V(0, true, false)};
  EXPECT_EQ(ChooseReplica(Policy::kLeastLoaded, none, 32, 0), -1);
  EXPECT_EQ(ChooseReplica(Policy::kLeastLoaded, {}, 32, 0), -1);
}

TEST(RouterChoiceTest, LeastLoadedPicksTheFewestInFlightAndSpreadsTies) {
  EXPECT_EQ(ChooseReplica(Policy::kLeastLoaded, std::vector{V(3), V(1), V(2)}, 32, 7), 1);
  std::set<int> picked;
  for (uint64_t r = 0; r < 16; ++r)
    picked.insert(ChooseReplica(Policy::kLeastLoaded, std::vector{V(2), V(2), V(2)}, 32, r));
  EXPECT_EQ(picked.size(), 3u);
}

TEST(RouterChoiceTest, PackFillsTheBusiestReplicaWithRoomFirst) {
  // Punica's consolidation: 5 in flight, capacity 8 → stay on it rather than wake an idle one.
  EXPECT_EQ(ChooseReplica(Policy::kPack, std::vector{V(0), V(5), V(2)}, 8, 0), 1);
  // Full (8 of 8): the next busiest with room.
  EXPECT_EQ(ChooseReplica(Policy::kPack, std::vector{V(0), V(8), V(2)}, 8, 0), 2);
  // All full: the least loaded.
  EXPECT_EQ(ChooseReplica(Policy::kPack, std::vector{V(9), V(8), V(10)}, 8, 0), 1);
}

TEST(RouterChoiceTest, RankAwareWeighsTheRanksInFlightAndTheVariantAlreadyRunning) {
  // Equal rows, but replica 0 runs rank-64 adapters on all of them: replica 1 is cheaper.
  EXPECT_EQ(ChooseReplica(Policy::kRankAware, std::vector{V(4, true, true, 256), V(4)}, 32, 0), 1);
  // Equal load: the replica already running the variant (no new segment, no load).
  EXPECT_EQ(ChooseReplica(Policy::kRankAware, std::vector{V(2), V(2, true, true, 0, /*runs=*/true)},
                          32, 0),
            1);
}

TEST(RouterChoiceTest, RankAwareWithPredictedStepsUsesCaraServesCost) {
  // CaraServe's score: in_flight × (step_with − step) + step_with, + a penalty over the TPOT SLO.
  auto P = [](int64_t in_flight, double step, double with) {
    ReplicaView v = V(in_flight);
    v.step_s = step;
    v.step_s_with = with;
    return v;
  };
  // Fewer requests but a step the new request slows a lot (a new high-rank adapter): 2 × 4 + 14
  // = 22 ms against 6 × 1 + 11 = 17 ms — the busier replica is cheaper.
  EXPECT_EQ(
      ChooseReplica(Policy::kRankAware, std::vector{P(2, 0.010, 0.014), P(6, 0.010, 0.011)}, 32, 0),
      1);
  EXPECT_NEAR(RankAwareScore(P(2, 0.010, 0.014), true, {}), 0.022, 1e-12);
  // The cheaper one would break a 10.5 ms TPOT SLO: the penalty sends the request elsewhere.
  EXPECT_EQ(ChooseReplica(Policy::kRankAware, std::vector{P(2, 0.010, 0.0104), P(1, 0.010, 0.012)},
                          32, 0, RequestSlo{.tpot_s = 0.011}),
            0);
  EXPECT_EQ(ChooseReplica(Policy::kRankAware, std::vector{P(1, 0.009, 0.0104), P(1, 0.010, 0.012)},
                          32, 0, RequestSlo{.tpot_s = 0.010}),
            0);  // both over: the smaller cost still wins
  // A candidate without a prediction: every candidate is scored by the proxy.
  ReplicaView unknown = V(0);
  EXPECT_EQ(ChooseReplica(Policy::kRankAware, std::vector{P(5, 0.001, 0.002), unknown}, 32, 0), 1);
}

TEST(RouterChoiceTest, ForecastMissesDecideThePenalty) {
  // MissesSlo (what --shed refuses): TTFT over its SLO, or predicted TPOT over kTpotHeadroom ×
  // its SLO. BreaksSlo (the penalty without shedding): TTFT over its SLO, or the bare decode
  // step with the request over the TPOT SLO.
  auto F = [](int64_t in_flight, double with, double tpot, double ttft) {
    ReplicaView v = V(in_flight);
    v.step_s = 0.010;
    v.step_s_with = with;
    v.tpot_s_with = tpot;
    v.ttft_s_with = ttft;
    return v;
  };
  const RequestSlo slo{.ttft_s = 1.0, .tpot_s = 0.100};
  EXPECT_FALSE(MissesSlo(F(0, 0.02, 0.079, 0.9), slo));
  EXPECT_TRUE(MissesSlo(F(0, 0.02, 0.081, 0.9), slo));   // over 0.8 × 100 ms
  EXPECT_TRUE(MissesSlo(F(0, 0.02, 0.05, 1.1), slo));    // TTFT
  EXPECT_FALSE(MissesSlo(F(0, 0.02, 0.5, 5.0), {}));     // no SLOs
  EXPECT_FALSE(MissesSlo(V(3), slo));                    // no forecast
  EXPECT_FALSE(BreaksSlo(F(0, 0.02, 0.081, 0.9), slo));  // the forecast's TPOT is not looked at
  EXPECT_TRUE(BreaksSlo(F(0, 0.101, 0.05, 0.9), slo));   // the decode step alone is over
  EXPECT_TRUE(BreaksSlo(F(0, 0.02, 0.05, 1.1), slo));    // TTFT
  // The cheaper replica would make the request wait past its TTFT SLO: the other one is chosen,
  // by either rule.
  for (bool shed : {false, true}) {
    RequestSlo s = slo;
    s.shed = shed;
    EXPECT_EQ(ChooseReplica(Policy::kRankAware,
                            std::vector{F(0, 0.011, 0.02, 1.5), F(3, 0.015, 0.03, 0.5)}, 32, 0, s),
              1);
    // Both miss: the smaller cost still wins (shedding is the caller's decision).
    EXPECT_EQ(ChooseReplica(Policy::kRankAware,
                            std::vector{F(0, 0.011, 0.02, 1.5), F(3, 0.101, 0.09, 0.5)}, 32, 0, s),
              0);
  }
  // A predicted TPOT of 90 ms against a 100 ms SLO: penalised only when shedding (headroom).
  const std::vector<ReplicaView> near_edge{F(0, 0.011, 0.09, 0.5), F(4, 0.015, 0.05, 0.5)};
  EXPECT_EQ(ChooseReplica(Policy::kRankAware, near_edge, 32, 0, slo), 0);
  RequestSlo shed = slo;
  shed.shed = true;
  EXPECT_EQ(ChooseReplica(Policy::kRankAware, near_edge, 32, 0, shed), 1);
}

TEST(ReplicaForecastTest, PredictsTtftFromThePromptQueueAndTpotWithPrefillStalls) {
  // t = 10 ms + 1 ms per prefill token + 2 ms per decode row.
  auto m = engine::CostModel::FromCoefficients(engine::CostModel::Kind::kLinear,
                                               {0.010, 0.001, 0.002, 0, 0, 0, 0});
  ASSERT_TRUE(m.ok());
  ReplicaForecast r(512);
  const RoutedRequest a{.variant = "base", .prompt_tokens = 100, .output_tokens = 10};
  const Forecast fa = r.With(*m, a, 0);
  EXPECT_NEAR(fa.step_s, 0.010, 1e-12);
  EXPECT_NEAR(fa.step_s_with, 0.012, 1e-12);
  EXPECT_NEAR(fa.prefill_s, 0.110, 1e-12);  // one chunk beside no decode rows
  EXPECT_NEAR(fa.stall_s, 0.100, 1e-12);    // what that step takes beyond a decode step
  EXPECT_NEAR(fa.ttft_s, 0.110, 1e-12);
  EXPECT_NEAR(fa.tpot_s, 0.012 + 0.100 * 1 / 10, 1e-12);
  r.Add(a, fa, 0);
  // 50 ms later, the first prompt is predicted to need 60 ms more; then this one's 112 ms (its
  // chunk beside the first request's decode row). Two requests, two prefill stalls of 100 ms,
  // over 20 output tokens between them.
  const Forecast fb = r.With(*m, a, 0.050);
  EXPECT_NEAR(fb.step_s, 0.012, 1e-12);
  EXPECT_NEAR(fb.step_s_with, 0.014, 1e-12);
  EXPECT_NEAR(fb.prefill_s, 0.112, 1e-12);
  EXPECT_NEAR(fb.ttft_s, 0.060 + 0.112, 1e-12);
  EXPECT_NEAR(fb.tpot_s, 0.014 + (0.100 + 0.100) * 2 / 20, 1e-12);
  r.Add(a, fb, 0.050);
  EXPECT_EQ(r.in_flight(), 2);
  // A long prompt runs in chunks of max_batch_tokens.
  const Forecast fl = r.With(*m, {.variant = "base", .prompt_tokens = 1000, .output_tokens = 5}, 1);
  EXPECT_NEAR(fl.prefill_s, 2 * (0.010 + 0.004 + 0.512), 1e-12);
  // Both end: the forecast is back to an idle replica's.
  r.Remove(a, fa);
  r.Remove(a, fb);
  EXPECT_EQ(r.in_flight(), 0);
  const Forecast again = r.With(*m, a, 10);
  EXPECT_NEAR(again.ttft_s, fa.ttft_s, 1e-12);
  EXPECT_NEAR(again.tpot_s, fa.tpot_s, 1e-12);
}

TEST(InFlightStepTest, CountsRowsRanksAndEachAdapterOnceAndUndoesExactly) {
  InFlightStep s;
  s.Add("a", 16, 100);
  s.Add("a", 16, 50);
  s.Add("base", 0, 10);
  const engine::StepFeatures& f = s.features();
  EXPECT_EQ(f.decode_rows, 3);
  EXPECT_EQ(f.prefill_tokens, 0);
  EXPECT_EQ(f.row_ranks, 32);
  EXPECT_EQ(f.adapters, 1);  // "a" once; the base model is no adapter
  EXPECT_EQ(f.sum_ranks, 16);
  EXPECT_EQ(f.context_tokens, 101 + 51 + 11);
  EXPECT_TRUE(s.Runs("a"));
  EXPECT_FALSE(s.Runs("b"));
  const engine::StepFeatures w = s.With("b", 64, 0);
  EXPECT_EQ(w.adapters, 2);
  EXPECT_EQ(w.sum_ranks, 80);
  EXPECT_EQ(w.decode_rows, 4);
  EXPECT_EQ(s.With("a", 16, 0).adapters, 1);  // already there: no new adapter term
  s.Remove("a", 16, 100);
  EXPECT_EQ(s.features().adapters, 1);
  EXPECT_EQ(s.features().context_tokens, 51 + 11);
  s.Remove("a", 16, 50);
  EXPECT_EQ(s.features().adapters, 0);
  EXPECT_EQ(s.features().sum_ranks, 0);
  EXPECT_FALSE(s.Runs("a"));
  s.Remove("base", 0, 10);
  EXPECT_EQ(s.features().decode_rows, 0);
  EXPECT_EQ(s.features().context_tokens, 0);
  s.Remove("never", 8, 1);  // not there: nothing changes
  EXPECT_EQ(s.features().decode_rows, 0);
}

TEST(RouterChoiceTest, RandomSpreadsOverAllCandidates) {
  std::set<int> picked;
  for (uint64_t r = 0; r < 64; ++r)
    picked.insert(ChooseReplica(Policy::kRandom, std::vector{V(9), V(0), V(4)}, 32, r));
  EXPECT_EQ(picked.size(), 3u);
}

TEST(RouterOptionsTest, ReplicaUrlsAndPoliciesAreValidated) {
  auto a = ParseReplicaUrl("http://127.0.0.1:8001/");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->host, "127.0.0.1");
  EXPECT_EQ(a->port, 8001);
  EXPECT_EQ(ParseReplicaUrl("http://[::1]:9000")->host, "::1");
  for (const char* bad : {"127.0.0.1:8001", "https://h:1", "http://h", "http://h:0",
                          "http://h:70000", "http://h:80/v1", "http://:80"}) {
    auto r = ParseReplicaUrl(bad);
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) {
      EXPECT_NE(r.status().message().find("replica"), std::string::npos);
    }
  }
  EXPECT_FALSE(ParsePolicy("fastest").ok());
  EXPECT_EQ(*ParsePolicy("pack"), Policy::kPack);
  EXPECT_FALSE(Router::Create(RouterOptions{}).ok());  // no replica
  RouterOptions twice;
  twice.replicas = {"http://a:1", "http://a:1/"};
  auto r = Router::Create(twice);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("twice"), std::string::npos);
}

}  // namespace
}  // namespace chorus::router
