#include "chorus/engine/policy.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace chorus::engine {

FcfsPolicy::FcfsPolicy(int64_t max_adapters_per_step, int64_t max_deltas_per_step)
    : cap_(max_adapters_per_step), delta_cap_(max_deltas_per_step) {}

void FcfsPolicy::BeginRound(const std::vector<const void*>& step_adapters,
                            const std::vector<const void*>& step_deltas) {
  step_adapters_.assign(step_adapters.begin(), step_adapters.end());
  step_deltas_.assign(step_deltas.begin(), step_deltas.end());
  barrier_ = false;
  capped_ = true;
}

bool FcfsPolicy::InStep(const Candidate& c) const {
  const auto& in = c.delta ? step_deltas_ : step_adapters_;
  return std::find(in.begin(), in.end(), c.adapter) != in.end();
}

bool FcfsPolicy::MayAdmit(const Candidate& c) {
  if (c.adapter == nullptr) return true;  // the base model takes no adapter slot
  if (c.full) {
    // A whole fine-tune takes no adapter slot; it runs once resident (engine/full_models.h).
    if (c.swapped_out) {
      if (++*c.passes >= kMaxPasses) barrier_ = true;
      return false;
    }
    return !barrier_;
  }
  const int64_t cap = c.delta ? delta_cap_ : cap_;
  const size_t in_step = c.delta ? step_deltas_.size() : step_adapters_.size();
  if (!capped_) return true;  // a relaxed pass (ClusterPolicy): under-filled steps take anyone
  const bool fits = cap == 0 || InStep(c) || static_cast<int64_t>(in_step) < cap;
  if (!fits) {
    if (++*c.passes >= kMaxPasses) barrier_ = true;
    return false;
  }
  // Everything after a starving sequence is newer than it: none of it may take or keep an
  // adapter slot before it does.
  return !barrier_;
}

void FcfsPolicy::Admitted(const Candidate& c) {
  if (c.adapter == nullptr || c.full || InStep(c)) return;
  (c.delta ? step_deltas_ : step_adapters_).push_back(c.adapter);
}

void ClusterPolicy::BeginRound(const std::vector<const void*>& step_adapters,
                               const std::vector<const void*>& step_deltas) {
  FcfsPolicy::BeginRound(step_adapters, step_deltas);
  relaxed_ = false;
}

bool ClusterPolicy::Relax() {
  if (relaxed_) return false;
  relaxed_ = true;
  capped_ = false;
  return true;
}

SloPolicy::SloPolicy(std::shared_ptr<const CostModel> model, int64_t max_batch_tokens,
                     bool best_effort, int64_t max_adapters_per_step, int64_t max_deltas_per_step,
                     bool correct_cost_model)
    : FcfsPolicy(max_adapters_per_step, max_deltas_per_step),
      model_(std::move(model)),
      max_batch_tokens_(max_batch_tokens),
      best_effort_(best_effort),
      correct_(correct_cost_model) {}

void SloPolicy::ObserveStep(const StepFeatures& f, double seconds) {
  if (correct_) correction_.Observe(model_->Predict(f), seconds);
}

double SloPolicy::Predict(const StepFeatures& f) const {
  return model_->Predict(f) * cost_correction();
}

double SloPolicy::PredictPrefill(const StepFeatures& step, int64_t tokens, int64_t rank) const {
  double total = 0;
  for (int64_t start = 0; start < tokens; start += max_batch_tokens_) {
    StepFeatures f = step;
    const int64_t count = std::min(max_batch_tokens_, tokens - start);
    f.AddChunk(start, count, /*prefill=*/true, rank);
    if (rank > 0) {
      f.adapters += 1;
      f.sum_ranks += static_cast<double>(rank);
    }
    total += Predict(f);
  }
  return total;
}

int64_t SloPolicy::Sweep(const StepState& step, std::span<const Candidate> waiting,
                         std::vector<char>* abort) {
  step_ = step.planned;
  tpot_limit_ = std::isfinite(step.tpot_allowance_s) ? step.tpot_allowance_s : 0;
  empty_ = step.sequences == 0;
  seen_adapters_.clear();
  // Early abort: its own prefill alone, in a step with the running rows, comes too late.
  for (size_t i = 0; i < waiting.size(); ++i) {
    const Candidate& c = waiting[i];
    if (best_effort_ || c.started || c.ttft_slo_s <= 0) continue;
    if (c.waited_s + PredictPrefill(step_, c.remaining, c.rank) > c.ttft_slo_s) (*abort)[i] = 1;
  }
  // Only a lasting overload reorders: requests have waited a whole window without the queue
  // emptying while more arrive than are admitted (S-LoRA App. B's R1 > R2). A burst the server
  // absorbs is served in arrival order.
  if (step.backlog_s < kOverloadWindowS || step.arrivals_per_s <= step.admissions_per_s) return 0;
  std::vector<size_t> fresh;  // not started, not aborted, in queue order
  int64_t started = 0;        // started sequences go first and take running slots
  for (size_t i = 0; i < waiting.size(); ++i) {
    if ((*abort)[i]) continue;
    if (waiting[i].started) {
      ++started;
    } else {
      fresh.push_back(i);
    }
  }
  if (fresh.size() < 2 || SuffixMeetsSlos(step, waiting, fresh, 0, started)) return 0;
  // The fewest oldest to hold back so that the rest meet their SLOs in order (holding back more
  // only brings the rest forward, so the test is monotone: binary search). When even the newest
  // alone would miss, nothing is gained by reordering: queue order, and early abort as above.
  size_t lo = 1, hi = fresh.size() - 1;
  if (!SuffixMeetsSlos(step, waiting, fresh, hi, started)) return 0;
  while (lo < hi) {
    const size_t mid = lo + (hi - lo) / 2;
    if (SuffixMeetsSlos(step, waiting, fresh, mid, started)) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return static_cast<int64_t>(lo);
}

bool SloPolicy::SuffixMeetsSlos(const StepState& step, std::span<const Candidate> waiting,
                                std::span<const size_t> fresh, size_t first,
                                int64_t started) const {
  // Two things keep a queued request from its first token, and each is predicted as the engine
  // would meet it:
  //   * compute: the prompts ahead of it (its own included) laid into steps that hold the
  //     running rows and fill the rest of max_batch_tokens with prompt chunks, each prompt from
  //     its own position. (Summing the queue into one long prompt, as this once did, charged
  //     every prompt's attention over all the prompts before it: quadratic in the queue.)
  //   * a running slot: with --max-running reached, the k-th request past the free slots
  //     starts when k running sequences have finished, which at the measured admission rate
  //     (S-LoRA App. B's R2: a slot is reused as soon as it frees) takes k / R2 seconds.
  const int64_t budget =
      std::max<int64_t>(1, max_batch_tokens_ - static_cast<int64_t>(step_.rows()));
  const int64_t free_slots = step.max_sequences > 0 ? step.max_sequences - step.sequences - started
                                                    : std::numeric_limits<int64_t>::max();
  double filled_s = 0;  // predicted seconds of the steps filled so far
  StepFeatures cur = step_;
  int64_t room = budget;
  std::vector<const void*> cur_adapters;  // distinct adapters added to cur
  for (size_t j = first; j < fresh.size(); ++j) {
    const Candidate& c = waiting[fresh[j]];
    for (int64_t pos = c.start, left = c.remaining; left > 0;) {
      if (room == 0) {
        filled_s += Predict(cur);
        cur = step_;
        room = budget;
        cur_adapters.clear();
      }
      const int64_t n = std::min(left, room);
      cur.AddChunk(pos, n, /*prefill=*/true, c.rank);
      if (c.rank > 0 &&
          std::find(cur_adapters.begin(), cur_adapters.end(), c.adapter) == cur_adapters.end()) {
        cur_adapters.push_back(c.adapter);
        cur.adapters += 1;
        cur.sum_ranks += static_cast<double>(c.rank);
      }
      pos += n;
      left -= n;
      room -= n;
    }
    if (c.ttft_slo_s <= 0) continue;
    double ready_s = filled_s + Predict(cur);
    const int64_t past = static_cast<int64_t>(j - first) - free_slots + 1;  // slots to wait for
    if (past > 0) {
      if (step.admissions_per_s <= 0) return false;
      ready_s = std::max(ready_s, static_cast<double>(past) / step.admissions_per_s +
                                      PredictPrefill(step_, c.remaining, c.rank));
    }
    if (c.waited_s + ready_s > c.ttft_slo_s) return false;
  }
  return true;
}

bool SloPolicy::MayAdmit(const Candidate& c) {
  if (!FcfsPolicy::MayAdmit(c)) return false;
  if (empty_ || tpot_limit_ <= 0) return true;  // nothing running (or no TPOT SLO) to protect
  StepFeatures f = step_;
  f.AddChunk(c.start, std::min(c.remaining, max_batch_tokens_), !c.started || c.remaining > 1,
             c.rank);
  if (c.rank > 0 &&
      std::find(seen_adapters_.begin(), seen_adapters_.end(), c.adapter) == seen_adapters_.end()) {
    f.adapters += 1;
    f.sum_ranks += static_cast<double>(c.rank);
  }
  return Predict(f) <= tpot_limit_;
}

void SloPolicy::Admitted(const Candidate& c, int64_t count) {
  FcfsPolicy::Admitted(c);
  step_.AddChunk(c.start, count, !c.started || count > 1, c.rank);
  if (c.rank > 0 &&
      std::find(seen_adapters_.begin(), seen_adapters_.end(), c.adapter) == seen_adapters_.end()) {
    seen_adapters_.push_back(c.adapter);
    step_.adapters += 1;
    step_.sum_ranks += static_cast<double>(c.rank);
  }
  // A sequence admitted now yields its first token at the end of this step: its TPOT clock has
  // not started, so only a preempted one (it streamed tokens already) limits the step.
  if (c.started && c.tpot_slo_s > 0 && (tpot_limit_ <= 0 || c.tpot_slo_s < tpot_limit_))
    tpot_limit_ = c.tpot_slo_s;
  empty_ = false;
}

// ---- The registry: every policy by name. ----
namespace {

struct PolicyEntry {
  const char* name;
  Result<std::unique_ptr<Policy>> (*make)(const PolicyConfig&);
};

const PolicyEntry kPolicies[] = {
    {"fcfs",
     [](const PolicyConfig& c) -> Result<std::unique_ptr<Policy>> {
       return std::unique_ptr<Policy>(
           new FcfsPolicy(c.max_adapters_per_step, c.max_deltas_per_step));
     }},
    {"cluster",
     [](const PolicyConfig& c) -> Result<std::unique_ptr<Policy>> {
       const int64_t d = c.max_adapters_per_step > 0 ? c.max_adapters_per_step : 4;
       return std::unique_ptr<Policy>(new ClusterPolicy(d, c.max_deltas_per_step));
     }},
    {"slo",
     [](const PolicyConfig& c) -> Result<std::unique_ptr<Policy>> {
       if (!c.cost_model)
         return InvalidArgumentError("policy slo needs a cost model (chorus profile)");
       return std::unique_ptr<Policy>(new SloPolicy(c.cost_model, c.max_batch_tokens, c.best_effort,
                                                    c.max_adapters_per_step, c.max_deltas_per_step,
                                                    c.correct_cost_model));
     }},
};

}  // namespace

const std::vector<std::string>& PolicyNames() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const PolicyEntry& e : kPolicies) v.emplace_back(e.name);
    return v;
  }();
  return names;
}

Result<std::unique_ptr<Policy>> MakePolicy(const PolicyConfig& config) {
  for (const PolicyEntry& e : kPolicies)
    if (config.name == e.name) return e.make(config);
  std::string known;
  for (const PolicyEntry& e : kPolicies) known += std::string(known.empty() ? "" : ", ") + e.name;
  return InvalidArgumentError("unknown policy '" + config.name.substr(0, 64) +
                              "' (known: " + known + ")");
}

}  // namespace chorus::engine
