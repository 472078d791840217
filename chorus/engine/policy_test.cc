// FcfsPolicy without a model: admission decisions for adapter identities in queue order.
#include "chorus/engine/policy.h"

#include <gtest/gtest.h>

#include <memory>
#include <utility>
#include <vector>

namespace chorus::engine {
namespace {

// Distinct adapter identities (only their addresses matter).
const int kA = 0, kB = 0, kC = 0;

struct Waiting {
  const void* adapter;
  int passes = 0;
  bool delta = false;
  Candidate candidate() { return {.adapter = adapter, .passes = &passes, .delta = delta}; }
};

TEST(FcfsPolicyTest, WithoutACapEveryoneMayJoin) {
  FcfsPolicy p(0);
  p.BeginRound({}, {});
  for (const void* a : {static_cast<const void*>(&kA), static_cast<const void*>(&kB),
                        static_cast<const void*>(&kC), static_cast<const void*>(nullptr)}) {
    Waiting w{a};
    EXPECT_TRUE(p.MayAdmit(w.candidate()));
    p.Admitted(w.candidate());
    EXPECT_EQ(w.passes, 0);
  }
}

TEST(FcfsPolicyTest, CapPassesOverNewAdaptersButNotTheStepsOrTheBase) {
  FcfsPolicy p(2);
  p.BeginRound({&kA}, {});  // A runs already
  Waiting b{&kB}, c{&kC}, a{&kA}, base{nullptr};
  EXPECT_TRUE(p.MayAdmit(b.candidate()));  // a second adapter fits
  p.Admitted(b.candidate());
  EXPECT_FALSE(p.MayAdmit(c.candidate()));  // a third does not
  EXPECT_EQ(c.passes, 1);
  EXPECT_TRUE(p.MayAdmit(a.candidate()));  // A and B are in the step
  EXPECT_TRUE(p.MayAdmit(base.candidate()));
}

TEST(FcfsPolicyTest, ASequencePassedOverEightTimesBlocksNewerAdapterSequences) {
  FcfsPolicy p(1);
  Waiting starving{&kB};
  for (int round = 1; round <= FcfsPolicy::kMaxPasses; ++round) {
    p.BeginRound({&kA}, {});
    EXPECT_FALSE(p.MayAdmit(starving.candidate()));
    EXPECT_EQ(starving.passes, round);
    Waiting newer_a{&kA}, newer_base{nullptr};
    // Until the bound, newer requests for the adapter in the step overtake it; at the bound
    // they stop, while base-model requests (no adapter slot) still go.
    EXPECT_EQ(p.MayAdmit(newer_a.candidate()), round < FcfsPolicy::kMaxPasses) << round;
    EXPECT_TRUE(p.MayAdmit(newer_base.candidate()));
  }
  // Once A has left the step, the starving sequence is admitted first.
  p.BeginRound({}, {});
  EXPECT_TRUE(p.MayAdmit(starving.candidate()));
  p.Admitted(starving.candidate());
  Waiting later_a{&kA};
  EXPECT_FALSE(p.MayAdmit(later_a.candidate()));  // the cap of 1 is now B's
}

// DeltaZip's N-delta rule: at most N distinct deltas in a step; requests for deltas already in
// the step skip the line; LoRA adapters and the base are counted apart.
TEST(FcfsPolicyTest, DeltaCapSkipsTheLineForDeltasInTheStep) {
  FcfsPolicy p(/*max_adapters_per_step=*/0, /*max_deltas_per_step=*/1);
  const int kD1 = 0, kD2 = 0;
  p.BeginRound({&kA}, {&kD1});
  Waiting d2{&kD2}, d1{&kD1}, lora{&kB}, base{nullptr};
  d2.delta = true;
  d1.delta = true;
  EXPECT_FALSE(p.MayAdmit(d2.candidate()));   // a second delta waits...
  EXPECT_TRUE(p.MayAdmit(d1.candidate()));    // ...while a request for D1 skips the line
  EXPECT_TRUE(p.MayAdmit(lora.candidate()));  // LoRA adapters are not capped here
  EXPECT_TRUE(p.MayAdmit(base.candidate()));
  p.BeginRound({}, {});  // D1 left the step
  EXPECT_TRUE(p.MayAdmit(d2.candidate()));
  p.Admitted(d2.candidate());
  EXPECT_FALSE(p.MayAdmit(d1.candidate()));
}

// --swap-full-models: a request whose whole fine-tune is not resident never runs; requests for
// resident models overtake it, but only kMaxPasses times, then only the base's may (they take no
// model slot). Whole fine-tunes take no adapter slot, whatever the adapter cap.
TEST(FcfsPolicyTest, SwappedOutModelsWaitAndBlockNewerModelsAfterEightPasses) {
  for (const auto& policy : {std::make_unique<FcfsPolicy>(1), std::make_unique<FcfsPolicy>(0)}) {
    int out_passes = 0, in_passes = 0, base_passes = 0;
    const Candidate out{.adapter = &kB, .passes = &out_passes, .full = true, .swapped_out = true};
    const Candidate in{.adapter = &kA, .passes = &in_passes, .full = true};
    const Candidate base{.adapter = nullptr, .passes = &base_passes};
    for (int round = 0; round < FcfsPolicy::kMaxPasses; ++round) {
      policy->BeginRound({&kC}, {});  // a LoRA adapter fills the cap of 1
      EXPECT_FALSE(policy->MayAdmit(out)) << round;
      EXPECT_EQ(policy->MayAdmit(in), round + 1 < FcfsPolicy::kMaxPasses) << round;
      EXPECT_TRUE(policy->MayAdmit(base));
    }
    EXPECT_EQ(out_passes, FcfsPolicy::kMaxPasses);
    EXPECT_EQ(in_passes, 0);
    // Relaxed passes (ClusterPolicy) still never admit a swapped-out model.
    ClusterPolicy cl(1);
    cl.BeginRound({}, {});
    ASSERT_TRUE(cl.Relax());
    int p2 = 0;
    EXPECT_FALSE(cl.MayAdmit({.adapter = &kB, .passes = &p2, .full = true, .swapped_out = true}));
  }
}

TEST(ClusterPolicyTest, CapsAdaptersUnlessTheStepWouldBeUnderFilled) {
  ClusterPolicy p(1);
  p.BeginRound({&kA}, {});
  Waiting b{&kB}, a{&kA};
  EXPECT_FALSE(p.MayAdmit(b.candidate()));  // a second adapter: over d = 1
  EXPECT_TRUE(p.MayAdmit(a.candidate()));   // A's requests cluster into the step
  p.Admitted(a.candidate());
  // Rows to spare: one more pass without the cap, once per round.
  EXPECT_TRUE(p.Relax());
  EXPECT_TRUE(p.MayAdmit(b.candidate()));
  EXPECT_FALSE(p.Relax());
  p.BeginRound({&kA}, {});  // a new round caps again
  EXPECT_FALSE(p.MayAdmit(b.candidate()));
}

TEST(PolicyRegistryTest, NamesAndErrors) {
  EXPECT_EQ(PolicyNames(), (std::vector<std::string>{"fcfs", "cluster", "slo"}));
  for (const char* name : {"fcfs", "cluster"}) {
    PolicyConfig c;
    c.name = name;
    auto p = MakePolicy(c);
    EXPECT_TRUE(p.ok()) << name;
  }
  PolicyConfig c;
  c.name = "lifo";
  auto bad = MakePolicy(c);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("unknown policy 'lifo'"), std::string::npos);
  c.name = "slo";
  auto slo = MakePolicy(c);  // no cost model
  ASSERT_FALSE(slo.ok());
  EXPECT_NE(slo.status().message().find("cost model"), std::string::npos);
  auto m = CostModel::FromCoefficients(CostModel::Kind::kLinear, {1e-3, 0, 0, 0, 0, 0, 0});
  c.cost_model = std::make_shared<CostModel>(*m);
  EXPECT_TRUE(MakePolicy(c).ok());
}

// SloPolicy's overload test (which holds the oldest back) predicts the queue's prompts as the
// engine computes them: each from its own position, so a prompt's attention covers its own
// context only. Eight queued prompts of 256 tokens take 8 × (25.6 ms of rows + 32.9 ms of
// context) ≈ 0.47 s here, two per step of 512 rows (117 ms); summed into one prompt of 2048
// tokens, their context alone would be 2.1 s — overload against a 1 s SLO that in-order
// service meets. Against 0.3 s, in order the fifth finishes at 351 ms; holding back the 3
// oldest, the other 5 finish by 117, 117, 234, 234 and 292 ms (two back would leave 6: 351 ms).
TEST(SloPolicyTest, OverloadCountsEachPromptsOwnContext) {
  auto model = CostModel::FromCoefficients(CostModel::Kind::kLinear,
                                           {0, 1e-4, 1e-4, 0, 0, 0, /*context_tokens=*/1e-6});
  ASSERT_TRUE(model.ok());
  auto m = std::make_shared<const CostModel>(*model);
  int passes[8] = {};
  auto queue = [&](double slo_s) {
    std::vector<Candidate> q;
    for (int i = 0; i < 8; ++i)
      q.push_back({.passes = &passes[i], .start = 0, .remaining = 256, .ttft_slo_s = slo_s});
    return q;
  };
  // A backlog of 3 s with arrivals outpacing admissions: the overload lasts.
  StepState lasting;
  lasting.arrivals_per_s = 4;
  lasting.admissions_per_s = 2;
  lasting.backlog_s = 3;
  for (const auto& [slo_s, hold_back] : {std::pair{1.0, 0}, std::pair{0.3, 3}}) {
    SloPolicy p(m, /*max_batch_tokens=*/512, /*best_effort=*/false);
    const auto q = queue(slo_s);
    std::vector<char> abort(q.size(), 0);
    p.BeginRound({}, {});
    EXPECT_EQ(p.Sweep(lasting, q, &abort), hold_back) << "SLO " << slo_s << " s";
    for (char a : abort) EXPECT_EQ(a, 0);  // each prompt alone (59 ms) meets either SLO
  }
}

// Holding the oldest back needs the in-order miss *and* a lasting overload (S-LoRA App. B): a
// fresh backlog, or one the server admits as fast as requests arrive, is served in arrival
// order. Then the fewest oldest go back: here 2 of 4 (the other two finish at 0.1 and 0.2 s).
TEST(SloPolicyTest, OldestHeldBackOnlyWhenTheOverloadLasts) {
  auto model = CostModel::FromCoefficients(CostModel::Kind::kLinear, {0, 1e-3, 1e-3, 0, 0, 0, 0});
  ASSERT_TRUE(model.ok());
  auto m = std::make_shared<const CostModel>(*model);
  int passes[4] = {};
  std::vector<Candidate> q;  // 4 × 100 prompt tokens = 0.1 s each, 0.25 s SLO: the third misses
  for (int i = 0; i < 4; ++i)
    q.push_back({.passes = &passes[i], .remaining = 100, .ttft_slo_s = 0.25});
  auto state = [](double arrivals_per_s, double admissions_per_s, double backlog_s) {
    StepState s;
    s.arrivals_per_s = arrivals_per_s;
    s.admissions_per_s = admissions_per_s;
    s.backlog_s = backlog_s;
    return s;
  };
  const struct {
    StepState state;
    int64_t hold_back;
  } cases[] = {
      {state(4, 2, 3), 2},
      {state(4, 2, 0.5), 0},  // a burst: the backlog is younger than the window
      {state(2, 2, 3), 0},    // the server keeps up with the arrivals
      {state(0, 0, 0), 0},
  };
  for (const auto& c : cases) {
    SloPolicy p(m, /*max_batch_tokens=*/100, /*best_effort=*/false);
    std::vector<char> abort(q.size(), 0);
    p.BeginRound({}, {});
    EXPECT_EQ(p.Sweep(c.state, q, &abort), c.hold_back)
        << "arrivals " << c.state.arrivals_per_s << "/s, admissions " << c.state.admissions_per_s
        << "/s, backlog " << c.state.backlog_s << " s";
  }
}

// With every running slot taken, a queued request also waits for running sequences to finish:
// the k-th past the free slots starts after k / (admissions per second). Four short prompts
// (10 ms each) behind a full batch of 2 with an SLO of 1.5 s: at 1 admission/s the second
// would start after 2 s, so only the newest can make it (3 held back); at 4/s the fourth starts
// after 1 s and all four make it (queue order).
TEST(SloPolicyTest, QueuedRequestsWaitForRunningSlots) {
  auto model = CostModel::FromCoefficients(CostModel::Kind::kLinear, {0, 1e-3, 0, 0, 0, 0, 0});
  ASSERT_TRUE(model.ok());
  auto m = std::make_shared<const CostModel>(*model);
  int passes[4] = {};
  std::vector<Candidate> q;
  for (int i = 0; i < 4; ++i)
    q.push_back({.passes = &passes[i], .remaining = 10, .ttft_slo_s = 1.5});
  for (const auto& [admissions_per_s, hold_back] : {std::pair{1.0, 3}, std::pair{4.0, 0}}) {
    StepState s;
    s.sequences = 2;
    s.max_sequences = 2;
    s.arrivals_per_s = 8;
    s.admissions_per_s = admissions_per_s;
    s.backlog_s = 3;
    SloPolicy p(m, /*max_batch_tokens=*/512, /*best_effort=*/false);
    std::vector<char> abort(q.size(), 0);
    p.BeginRound({}, {});
    EXPECT_EQ(p.Sweep(s, q, &abort), hold_back) << admissions_per_s << " admissions/s";
    for (char a : abort) EXPECT_EQ(a, 0);
  }
}

// Early abort predicts with the steps the server actually runs: a 100-token prompt the profile
// puts at 0.1 s meets a 0.25 s TTFT SLO, but once the steps have been running 3× slower than
// the profile said (a slower host phase, other work on the machine) the same prompt is
// predicted at ~0.3 s and answered at once — unless the correction is off.
TEST(SloPolicyTest, EarlyAbortPredictsWithTheMeasuredStepTimes) {
  auto model = CostModel::FromCoefficients(CostModel::Kind::kLinear, {0, 1e-3, 1e-3, 0, 0, 0, 0});
  ASSERT_TRUE(model.ok());
  auto m = std::make_shared<const CostModel>(*model);
  int passes[1] = {};
  const std::vector<Candidate> q = {{.passes = &passes[0], .remaining = 100, .ttft_slo_s = 0.25}};
  StepFeatures step;  // the steps observed: 32 decode rows, predicted 32 ms, measured 96 ms
  step.decode_rows = 32;
  for (const bool correct : {true, false}) {
    SloPolicy p(m, /*max_batch_tokens=*/512, /*best_effort=*/false, 0, 0, correct);
    std::vector<char> abort(q.size(), 0);
    p.BeginRound({}, {});
    p.Sweep(StepState{}, q, &abort);
    EXPECT_EQ(abort[0], 0) << "before any step, correct " << correct;
    EXPECT_EQ(p.cost_correction(), 1.0);
    for (int i = 0; i < 50; ++i) p.ObserveStep(step, 0.096);
    abort.assign(q.size(), 0);
    p.BeginRound({}, {});
    p.Sweep(StepState{}, q, &abort);
    EXPECT_EQ(abort[0], correct ? 1 : 0) << "after 50 slow steps, correct " << correct;
    if (correct) {
      EXPECT_NEAR(p.cost_correction(), 3.0, 0.1);
      EXPECT_NEAR(p.PredictPrefill({}, 100, 0), 0.3, 0.01);
    } else {
      EXPECT_EQ(p.cost_correction(), 1.0);
    }
  }
}

}  // namespace
}  // namespace chorus::engine
