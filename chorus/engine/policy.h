// Policy: the engine's admission rule, one object per engine, asked once per waiting sequence
// and step. The engine keeps the mechanics (rows, sequences and pool pages that fit, pinning,
// preemption); a policy only decides, in queue order, which waiting sequences may join the
// step. A new scheduling rule (adapter clustering, SLO-aware early abort, fine-tuning
// deferral) is a new Policy; nothing else in the engine changes.
//
// Thread-safety: called only from the engine thread.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "chorus/base/status.h"
#include "chorus/engine/cost_model.h"

namespace chorus::engine {

// What a policy sees of a waiting sequence. `adapter` identifies its variant's weights
// (null = the base model); equal pointers mean the same adapter. `passes` is the policy's own
// per-sequence counter, kept by the engine with the sequence (0 when it arrives).
struct Candidate {
  const void* adapter = nullptr;
  int* passes = nullptr;
  bool delta = false;  // the variant is a compressed full fine-tune (docs/deltas.md)
  // The variant is a whole fine-tune of --swap-full-models (engine/full_models.h), not resident
  // yet: it cannot run in this step whatever the policy says (it is being swapped in, or waits
  // for a resident model to fall idle).
  bool full = false;
  bool swapped_out = false;
  // What cost-aware policies (slo) need; others ignore it.
  int64_t rank = 0;       // its LoRA adapter's rank (0: base model or a delta)
  int64_t start = 0;      // the first position it would compute
  int64_t remaining = 0;  // tokens it must compute before its next token (prompt left)
  double waited_s = 0;    // seconds since it arrived
  double ttft_slo_s = 0;  // its SLOs (0 = none)
  double tpot_slo_s = 0;
  bool started = false;  // it has streamed tokens already (a preempted sequence)
};

// The window over which the scheduler measures arrival and admission rates, and how long a
// backlog must last before SloPolicy calls it an overload (docs/scheduling.md).
inline constexpr double kOverloadWindowS = 2.0;

// A running sequence's part of StepState::tpot_allowance_s: its TPOT SLO, `generated` tokens
// so far, the first `since_first_s` seconds ago.
inline double TpotAllowance(double tpot_slo_s, int64_t generated, double since_first_s) {
  return std::max(tpot_slo_s, tpot_slo_s * static_cast<double>(generated) - since_first_s);
}

// The step as planned before admission: the running sequences' rows.
struct StepState {
  StepFeatures planned;
  // How long this step may take without any running sequence's time per output token so far
  // exceeding its TPOT SLO: the least, over the running sequences that have a TPOT SLO and have
  // generated, of max(SLO, SLO × tokens generated − seconds since its first token) — a sequence
  // that ran faster than its SLO has banked the difference, and a prefill chunk may spend it;
  // one behind still allows a step of its SLO (TpotAllowance). Infinity: no such sequence.
  double tpot_allowance_s = std::numeric_limits<double>::infinity();
  int64_t sequences = 0;      // running sequences in the plan
  int64_t max_sequences = 0;  // how many may run at once (--max-running; 0 = no limit)
  // Requests per second that arrived, and that were admitted for the first time, over the last
  // kOverloadWindowS (S-LoRA App. B's R1 and R2), and for how long requests that have not
  // started have been waiting without a break: together the sign of an overload that lasts,
  // not of a burst the queue absorbs.
  double arrivals_per_s = 0;
  double admissions_per_s = 0;
  double backlog_s = 0;
};

// StepState's arrival and admission rates and backlog, kept by whoever plans steps (the
// scheduler in wall-clock seconds, `chorus simulate` in simulated ones).
class OverloadMeter {
 public:
  void Arrived(double t) { arrivals_.push_back(t); }
  void Admitted(double t) { admissions_.push_back(t); }
  // Before admission at `now`: `oldest_waiting` is the arrival time of the oldest sequence that
  // has not started, or negative when there is none.
  void Fill(double now, double oldest_waiting, StepState* state) {
    for (auto* times : {&arrivals_, &admissions_}) {
      while (!times->empty() && now - times->front() > kOverloadWindowS) times->pop_front();
    }
    state->arrivals_per_s = static_cast<double>(arrivals_.size()) / kOverloadWindowS;
    state->admissions_per_s = static_cast<double>(admissions_.size()) / kOverloadWindowS;
    if (oldest_waiting < 0) {
      backlog_since_ = -1;
    } else if (backlog_since_ < 0 || oldest_waiting < backlog_since_) {
      backlog_since_ = oldest_waiting;  // kept while the queue never empties
    }
    state->backlog_s = backlog_since_ < 0 ? 0.0 : now - backlog_since_;
  }
  // After admission: no sequence that has not started is left, so the next backlog starts anew.
  void QueueEmptied() { backlog_since_ = -1; }

 private:
  std::deque<double> arrivals_, admissions_;
  double backlog_since_ = -1;  // negative: no backlog
};

class Policy {
 public:
  virtual ~Policy() = default;
  // A new admission round; `step_adapters` are the distinct LoRA adapters and `step_deltas` the
  // distinct deltas already in the step (its running sequences').
  virtual void BeginRound(const std::vector<const void*>& step_adapters,
                          const std::vector<const void*>& step_deltas) = 0;
  // May `c`, the next waiting sequence in queue order, be admitted now? false passes over it
  // (it keeps its place in the queue).
  virtual bool MayAdmit(const Candidate& c) = 0;
  // `c` was admitted (it fit) with `count` rows in this step.
  virtual void Admitted(const Candidate& c) = 0;
  virtual void Admitted(const Candidate& c, int64_t /*count*/) { Admitted(c); }

  // Optional hooks (the defaults keep plain queue order):
  // Called after BeginRound with the planned step and every waiting sequence ready to run, in
  // queue order. A policy may set (*abort)[i] to answer waiting[i] at once with an error
  // (early abort). Returns how many of the oldest sequences that have not started (aborted ones
  // not counted) go to the back of this round's admission order, behind the newer ones (which
  // keep queue order); 0 keeps queue order. Started sequences are always admitted first.
  virtual int64_t Sweep(const StepState& /*step*/, std::span<const Candidate> /*waiting*/,
                        std::vector<char>* /*abort*/) {
    return 0;
  }
  // Admission ended with rows to spare because MayAdmit passed over sequences: true = go over
  // the queue once more (MayAdmit may then be laxer). Called at most once per round.
  virtual bool Relax() { return false; }
  // The step the plan of this round became ran, with features `f`, in `seconds` (engine thread,
  // after every step). A policy that predicts steps may learn from it.
  virtual void ObserveStep(const StepFeatures& /*f*/, double /*seconds*/) {}
  // How the policy scales its cost model's predictions now (1: not at all, or no model).
  virtual double cost_correction() const { return 1.0; }
};

// Policy names and how to build one (the one place to add a policy).
struct PolicyConfig {
  std::string name = "fcfs";          // fcfs, cluster, slo
  int64_t max_adapters_per_step = 0;  // fcfs / slo: cap (0 = none); cluster: d (0 = 4)
  int64_t max_deltas_per_step = 0;
  int64_t max_batch_tokens = 512;               // rows per step (slo: chunks of a long prompt)
  std::shared_ptr<const CostModel> cost_model;  // slo: required
  bool correct_cost_model = true;  // slo: scale predictions by the steps measured (CostCorrection)
  bool best_effort = false;        // slo: serve late instead of aborting (--slo-mode best-effort)
};
const std::vector<std::string>& PolicyNames();
// kInvalidArgument naming the value for an unknown policy, or slo without a cost model.
Result<std::unique_ptr<Policy>> MakePolicy(const PolicyConfig& config);

// First come, first served, with optional caps on distinct LoRA adapters and on distinct deltas
// per step (0 = none; the delta cap is DeltaZip's N-delta rule: requests for deltas already in
// the step skip the line, others wait until a delta leaves the step; the scheduler preempts a
// line-skipper once the requests of its delta it joined have finished,
// Scheduler::PreemptOrphanedLineSkippers).
// A sequence whose adapter would exceed the cap is passed over, and later ones may overtake it,
// but only kMaxPasses times: then it becomes a barrier and no newer sequence with an adapter is
// admitted before it (newer base-model sequences still are: they take no adapter slot), so the
// adapters in the step cannot keep it out forever. A whole fine-tune that is swapped out
// (--swap-full-models) is passed over the same way: requests for the resident models may
// overtake it kMaxPasses times, then the resident models drain and one of them is swapped out
// for it (vLLM-SCB's "batch the available requests of the same model", without starvation).
class FcfsPolicy : public Policy {
 public:
  static constexpr int kMaxPasses = 8;
  explicit FcfsPolicy(int64_t max_adapters_per_step, int64_t max_deltas_per_step = 0);
  void BeginRound(const std::vector<const void*>& step_adapters,
                  const std::vector<const void*>& step_deltas) override;
  bool MayAdmit(const Candidate& c) override;
  using Policy::Admitted;
  void Admitted(const Candidate& c) override;

 protected:
  bool InStep(const Candidate& c) const;
  bool capped_ = true;  // false: the caps are ignored this round (ClusterPolicy::Relax)

 private:
  const int64_t cap_, delta_cap_;
  // The step's distinct LoRA adapters and deltas (reserved; no allocation per round once warm).
  std::vector<const void*> step_adapters_, step_deltas_;
  bool barrier_ = false;
};

// S-LoRA's adapter clustering: at most d distinct LoRA adapters per step (requests for adapters
// already in the step go first, as in FcfsPolicy), unless the step would be under-filled: when
// admission ends with rows to spare because of the cap, the queue is gone over again without
// it. Fewer distinct adapters per step means less adapter work per step (docs/scheduling.md).
class ClusterPolicy : public FcfsPolicy {
 public:
  explicit ClusterPolicy(int64_t d, int64_t max_deltas_per_step = 0)
      : FcfsPolicy(d, max_deltas_per_step) {}
  void BeginRound(const std::vector<const void*>& step_adapters,
                  const std::vector<const void*>& step_deltas) override;
  bool Relax() override;

 private:
  bool relaxed_ = false;
};

// SLO-aware admission (docs/scheduling.md): FcfsPolicy's caps, plus, with the cost model,
//   * early abort: a waiting sequence that has not started and whose TTFT SLO it would miss
//     even if scheduled now (seconds waited + predicted prefill time > SLO) is aborted (429),
//     or with best_effort served anyway (counted as missed);
//   * TPOT guard: a sequence is not admitted when the predicted step time with its chunk would
//     exceed what the running sequences' TPOT SLOs allow this step (StepState's
//     tpot_allowance_s: a time per output token averaged from each one's first token, as the
//     SLO is measured, so a prompt chunk longer than the SLO waits until the sequences it stalls
//     have banked the time);
//   * overload: when the overload lasts — requests have been waiting for a whole
//     kOverloadWindow and arrive faster than they are admitted (S-LoRA App. B's R1 > R2) — and
//     serving the ready queue in order would make some sequence miss its TTFT SLO, the oldest
//     are held back: the fewest oldest such that the rest, served in queue order, all meet
//     their SLOs (S-LoRA App. B, Theorem B.1: serve the most recent l requests that can meet
//     their SLO, in order). The held-back ones are admitted after the others, when room is
//     left, and early abort answers them once they cannot make it. A burst that the queue
//     absorbs is served in arrival order, as fcfs would.
class SloPolicy : public FcfsPolicy {
 public:
  SloPolicy(std::shared_ptr<const CostModel> model, int64_t max_batch_tokens, bool best_effort,
            int64_t max_adapters_per_step = 0, int64_t max_deltas_per_step = 0,
            bool correct_cost_model = true);
  int64_t Sweep(const StepState& step, std::span<const Candidate> waiting,
                std::vector<char>* abort) override;
  bool MayAdmit(const Candidate& c) override;
  using FcfsPolicy::Admitted;
  void Admitted(const Candidate& c, int64_t count) override;
  // Predicted seconds to compute `tokens` of prefill (in chunks of max_batch_tokens) in steps
  // that also hold `step`'s rows.
  double PredictPrefill(const StepFeatures& step, int64_t tokens, int64_t rank) const;
  // Learns how far the steps run from the model (unless built with correct_cost_model false).
  void ObserveStep(const StepFeatures& f, double seconds) override;
  double cost_correction() const override { return correct_ ? correction_.factor() : 1.0; }

 private:
  // The model's prediction for a step, scaled by cost_correction().
  double Predict(const StepFeatures& f) const;
  // Would every sequence of `fresh` (indices into `waiting`, not started, in queue order) from
  // its `first` on meet its TTFT SLO if those were admitted in queue order from now?
  bool SuffixMeetsSlos(const StepState& step, std::span<const Candidate> waiting,
                       std::span<const size_t> fresh, size_t first, int64_t started) const;

  std::shared_ptr<const CostModel> model_;
  const int64_t max_batch_tokens_;
  const bool best_effort_;
  const bool correct_;
  CostCorrection correction_;
  StepFeatures step_;                       // the planned step plus what was admitted this round
  double tpot_limit_ = 0;                   // the TPOT guard's limit on the step (0: none)
  bool empty_ = true;                       // nothing runs or was admitted yet this round
  std::vector<const void*> seen_adapters_;  // distinct adapters counted in step_
};

}  // namespace chorus::engine
