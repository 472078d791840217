#include "chorus/sim/simulate.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <map>
#include <queue>

namespace chorus::sim {
namespace {

// A variant's identity as the engine's policies see it: a pointer compared for equality. The
// simulator has no adapter objects; adapter k is the address k + 1 (never dereferenced).
const void* AdapterKey(int32_t adapter) {
  return adapter < 0 ? nullptr : reinterpret_cast<const void*>(static_cast<uintptr_t>(adapter) + 1);
}

struct Seq {
  int32_t adapter = -1;  // interned adapter id (-1 = base model)
  int64_t rank = 0;
  int64_t prompt = 0, output = 0;
  int64_t computed = 0, generated = 0;
  int passes = 0;  // the admission policy's counter
  double arrival = 0, first_token = -1;
  router::Forecast forecast;  // what the router predicted where it sent it (undone at the end)
  std::vector<int32_t> refused_by;  // replicas that answered it 429 (the router tries others)
  int64_t total() const { return prompt + generated; }  // tokens the sequence holds
};

struct Replica {
  std::deque<int64_t> waiting;   // request indices, queue order
  std::vector<int64_t> running;  // admission order
  struct Chunk {
    int64_t req, start, count;
  };
  std::vector<Chunk> plan;
  bool busy = false;
  double busy_s = 0;
  std::unique_ptr<engine::Policy> admission;
  router::ReplicaForecast router;  // what the router knows of it: the requests it has there
  engine::OverloadMeter overload;  // StepState's rates and backlog, as the scheduler keeps them
};

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t k = static_cast<size_t>(std::ceil(p * static_cast<double>(v.size())));
  return v[std::min(v.size() - 1, k == 0 ? 0 : k - 1)];
}

// The router's bookkeeping (router::ReplicaForecast, the same code as `chorus router`'s), each
// request at its prompt's and output's lengths (a simulated router knows them; the live one
// estimates them from the body).
router::RoutedRequest Routed(const Seq& s, const std::string& variant) {
  return {.variant = variant, .rank = s.rank, .prompt_tokens = s.prompt, .output_tokens = s.output};
}

void RouterBegin(router::ReplicaForecast& r, Seq& s, const std::string& variant,
                 const router::Forecast& f, double now) {
  s.forecast = f;
  r.Add(Routed(s, variant), f, now);
}

void RouterEnd(router::ReplicaForecast& r, const Seq& s, const std::string& variant) {
  r.Remove(Routed(s, variant), s.forecast);
}

class Simulator {
 public:
  Simulator(const std::vector<TraceRequest>& trace, const SimOptions& opts)
      : trace_(trace), opts_(opts), rng_(opts.seed) {}

  Result<SimResult> Run() {
    const engine::CostModel& model = *opts_.cost_model;
    // Requests, with adapters interned.
    std::map<std::string, int32_t> ids;
    seqs_.resize(trace_.size());
    for (size_t i = 0; i < trace_.size(); ++i) {
      const TraceRequest& t = trace_[i];
      Seq& s = seqs_[i];
      if (!t.adapter.empty()) {
        auto [it, fresh] = ids.emplace(t.adapter, static_cast<int32_t>(ids.size()));
        (void)fresh;
        s.adapter = it->second;
      }
      s.rank = t.adapter.empty() ? 0 : t.rank;
      s.prompt = t.prompt_tokens;
      s.output = t.output_tokens;
      s.arrival = t.arrival_s;
    }
    replicas_.resize(static_cast<size_t>(opts_.replicas));
    for (Replica& r : replicas_) {
      r.router = router::ReplicaForecast(opts_.max_batch_tokens);
      engine::PolicyConfig pc;
      pc.name = opts_.admission;
      pc.max_adapters_per_step = opts_.max_adapters_per_step;
      pc.max_batch_tokens = opts_.max_batch_tokens;
      pc.cost_model = opts_.cost_model;
      CHORUS_ASSIGN_OR_RETURN(r.admission, engine::MakePolicy(pc));
    }
    results_.assign(trace_.size(), RequestResult{});

    // Events: step ends (a min-heap) merged with arrivals (the trace, in order); at equal times
    // step ends go first, so a request finishing then has left the router's view.
    using Event = std::pair<double, int64_t>;  // (time, replica)
    std::priority_queue<Event, std::vector<Event>, std::greater<Event>> step_ends;
    size_t next = 0;
    std::vector<router::ReplicaView> views(replicas_.size());
    std::vector<router::Forecast> forecasts(replicas_.size());
    // Routes request q at now_ (its arrival, or when a replica refused it), past the replicas
    // that refused it already; false when none is left (the request stays refused).
    auto route = [&](int64_t q) -> Result<bool> {
      Seq& s = seqs_[static_cast<size_t>(q)];
      const TraceRequest& t = trace_[static_cast<size_t>(q)];
      const router::RoutedRequest routed = Routed(s, t.adapter);
      const router::RequestSlo slo{
          .ttft_s = t.ttft_slo_ms / 1e3, .tpot_s = t.tpot_slo_ms / 1e3, .shed = opts_.shed};
      // rank-aware sees the cost model's steps unless it runs as the proxy; the forecast of the
      // request's TTFT and TPOT is there for every policy (--shed uses it).
      const bool steps = opts_.policy == router::Policy::kRankAware && !opts_.rank_aware_proxy;
      for (size_t i = 0; i < replicas_.size(); ++i) {
        const router::ReplicaForecast& rs = replicas_[i].router;
        router::ReplicaView& v = views[i];
        v.healthy = std::find(s.refused_by.begin(), s.refused_by.end(), static_cast<int32_t>(i)) ==
                    s.refused_by.end();
        v.serves_model = true;  // every replica holds every adapter (one shared adapter root)
        v.in_flight = rs.in_flight();
        v.rank_in_flight = rs.rank_in_flight();
        v.runs_variant = rs.step().Runs(t.adapter);
        forecasts[i] = rs.With(model, routed, now_);
        v.SetForecast(forecasts[i], steps);
      }
      const int ri =
          router::ChooseReplica(opts_.policy, views, opts_.replica_capacity, rng_.Next(), slo);
      if (ri < 0) {
        if (s.refused_by.empty()) return InternalError("simulate: the router chose no replica");
        return false;  // every replica refused it: the client gets the last 429
      }
      results_[static_cast<size_t>(q)].replica = ri;
      if (slo.shed && router::MissesSlo(views[static_cast<size_t>(ri)], slo)) {
        results_[static_cast<size_t>(q)].shed = true;  // 429 at once: never reaches the replica
        return false;
      }
      Replica& r = replicas_[static_cast<size_t>(ri)];
      s.passes = 0;  // the admission policy's counter is per replica
      RouterBegin(r.router, s, t.adapter, forecasts[static_cast<size_t>(ri)], now_);
      r.waiting.push_back(q);
      r.overload.Arrived(now_);
      if (!r.busy && StartStep(r, ri, model)) step_ends.emplace(now_ + last_step_s_, ri);
      return true;
    };
    while (next < trace_.size() || !step_ends.empty() || !refused_.empty()) {
      if (!refused_.empty()) {
        // A replica answered 429 (its slo admission's early abort) at now_: the router sends the
        // request to another replica, as `chorus router` does (nothing reached the client yet).
        const int64_t q = refused_.front();
        refused_.pop_front();
        ++retries_;
        CHORUS_ASSIGN_OR_RETURN(const bool routed, route(q));
        (void)routed;
        continue;
      }
      if (!step_ends.empty() &&
          (next >= trace_.size() || step_ends.top().first <= seqs_[next].arrival)) {
        const auto [t, ri] = step_ends.top();
        step_ends.pop();
        now_ = t;
        Replica& r = replicas_[static_cast<size_t>(ri)];
        EndStep(r, static_cast<int>(ri));
        if (StartStep(r, static_cast<int>(ri), model)) step_ends.emplace(now_ + last_step_s_, ri);
        continue;
      }
      const int64_t q = static_cast<int64_t>(next++);
      now_ = seqs_[static_cast<size_t>(q)].arrival;
      CHORUS_ASSIGN_OR_RETURN(const bool routed, route(q));
      (void)routed;
    }

    SimResult out;
    out.requests = std::move(results_);
    Summarize(&out);
    return out;
  }

 private:
  // Plans the replica's next step at now_ (engine/scheduler.cc's Plan and AdmitWaiting, less KV
  // pages); false when it has nothing to run.
  bool StartStep(Replica& r, int ri, const engine::CostModel& model) {
    r.plan.clear();
    int64_t budget = opts_.max_batch_tokens;
    for (int64_t q : r.running) {
      if (budget <= 0) break;
      const Seq& s = seqs_[static_cast<size_t>(q)];
      const int64_t count = std::min(budget, s.total() - s.computed);
      r.plan.push_back({q, s.computed, count});
      budget -= count;
    }
    // The step as planned before admission, for the admission policy.
    engine::StepState state;
    std::vector<const void*> step_adapters;
    for (const Replica::Chunk& c : r.plan) AddToStep(c, &state.planned, &step_adapters);
    state.sequences = static_cast<int64_t>(r.plan.size());
    state.max_sequences = opts_.max_running;
    for (const Replica::Chunk& c : r.plan) {
      const double tpot = trace_[static_cast<size_t>(c.req)].tpot_slo_ms / 1e3;
      const Seq& s = seqs_[static_cast<size_t>(c.req)];
      if (tpot > 0 && s.generated > 0)
        state.tpot_allowance_s = std::min(
            state.tpot_allowance_s, engine::TpotAllowance(tpot, s.generated, now_ - s.first_token));
    }
    r.overload.Fill(
        now_, r.waiting.empty() ? -1.0 : seqs_[static_cast<size_t>(r.waiting.front())].arrival,
        &state);
    r.admission->BeginRound(step_adapters, {});
    auto candidate_of = [&](int64_t q) {
      Seq& s = seqs_[static_cast<size_t>(q)];
      const TraceRequest& t = trace_[static_cast<size_t>(q)];
      return engine::Candidate{.adapter = AdapterKey(s.adapter),
                               .passes = &s.passes,
                               .delta = false,
                               .rank = s.rank,
                               .start = s.computed,
                               .remaining = s.total() - s.computed,
                               .waited_s = now_ - s.arrival,
                               .ttft_slo_s = t.ttft_slo_ms / 1e3,
                               .tpot_slo_s = t.tpot_slo_ms / 1e3,
                               .started = s.generated > 0};
    };
    std::vector<engine::Candidate> ready;
    for (int64_t q : r.waiting) ready.push_back(candidate_of(q));
    std::vector<char> abort(ready.size(), 0);
    const int64_t hold_back = r.admission->Sweep(state, ready, &abort);
    if (std::find(abort.begin(), abort.end(), 1) != abort.end()) {
      std::deque<int64_t> kept;
      for (size_t k = 0; k < r.waiting.size(); ++k) {
        const int64_t q = r.waiting[k];
        if (!abort[k]) {
          kept.push_back(q);
          continue;
        }
        // Refused at once (429): the router takes it back and tries another replica.
        RequestResult& res = results_[static_cast<size_t>(q)];
        res.completed = false;
        RouterEnd(r.router, seqs_[static_cast<size_t>(q)], trace_[static_cast<size_t>(q)].adapter);
        seqs_[static_cast<size_t>(q)].refused_by.push_back(ri);
        refused_.push_back(q);
      }
      r.waiting = std::move(kept);
    }
    // Admission order: queue order, the `hold_back` oldest last (no sequence here has started:
    // there is no preemption in the simulator).
    std::vector<size_t> order(r.waiting.size());
    const size_t held = std::min(static_cast<size_t>(hold_back), order.size());
    for (size_t k = 0; k < order.size(); ++k) order[k] = (k + held) % order.size();
    std::vector<char> admitted(r.waiting.size(), 0);
    bool passed = false;
    for (int pass = 0; pass < 2; ++pass) {
      if (pass == 1 &&
          !(passed && budget > 0 && static_cast<int64_t>(r.running.size()) < opts_.max_running &&
            r.admission->Relax()))
        break;
      for (size_t k : order) {
        if (budget <= 0 || static_cast<int64_t>(r.running.size()) >= opts_.max_running) break;
        if (admitted[k]) continue;
        const int64_t q = r.waiting[k];
        const engine::Candidate c = candidate_of(q);
        if (!r.admission->MayAdmit(c)) {
          passed = true;
          continue;
        }
        const Seq& s = seqs_[static_cast<size_t>(q)];
        const int64_t count = std::min(budget, s.total() - s.computed);
        r.admission->Admitted(c, count);
        r.overload.Admitted(now_);
        admitted[k] = 1;
        r.running.push_back(q);
        r.plan.push_back({q, s.computed, count});
        budget -= count;
      }
    }
    if (std::find(admitted.begin(), admitted.end(), 1) != admitted.end()) {
      std::deque<int64_t> kept;
      for (size_t k = 0; k < r.waiting.size(); ++k)
        if (!admitted[k]) kept.push_back(r.waiting[k]);
      r.waiting = std::move(kept);
    }
    if (r.waiting.empty()) r.overload.QueueEmptied();
    if (r.plan.empty()) {
      r.busy = false;
      return false;
    }
    engine::StepFeatures f;
    std::vector<const void*> adapters;
    for (const Replica::Chunk& c : r.plan) AddToStep(c, &f, &adapters);
    last_step_s_ = model.Predict(f);
    r.busy = true;
    r.busy_s += last_step_s_;
    ++steps_;
    return true;
  }

  // Adds a planned chunk to a step's features as the engine counts it (scheduler.cc).
  void AddToStep(const Replica::Chunk& c, engine::StepFeatures* f,
                 std::vector<const void*>* adapters) const {
    const Seq& s = seqs_[static_cast<size_t>(c.req)];
    f->AddChunk(c.start, c.count, c.start + c.count < s.total() || c.count > 1, s.rank);
    const void* key = AdapterKey(s.adapter);
    if (key != nullptr && std::find(adapters->begin(), adapters->end(), key) == adapters->end()) {
      adapters->push_back(key);
      f->adapters += 1;
      f->sum_ranks += static_cast<double>(s.rank);
    }
  }

  // The step ends at now_: every planned chunk advances; a chunk that reaches the sequence's end
  // yields a token; finished sequences leave the replica and the router's view.
  void EndStep(Replica& r, int ri) {
    (void)ri;
    for (const Replica::Chunk& c : r.plan) {
      Seq& s = seqs_[static_cast<size_t>(c.req)];
      s.computed += c.count;
      if (s.computed < s.total()) continue;  // a prompt chunk that is not the last
      ++s.generated;
      if (s.generated == 1) s.first_token = now_;
      if (s.generated < s.output) continue;
      RequestResult& res = results_[static_cast<size_t>(c.req)];
      res.completed = true;
      res.ttft_s = s.first_token - s.arrival;
      res.e2e_s = now_ - s.arrival;
      res.tpot_s = s.output > 1 ? (now_ - s.first_token) / static_cast<double>(s.output - 1) : 0.0;
      const TraceRequest& t = trace_[static_cast<size_t>(c.req)];
      // A small tolerance: a TPOT exactly at its SLO (steps of exactly the SLO) meets it.
      res.ttft_met = t.ttft_slo_ms <= 0 || res.ttft_s * 1e3 <= t.ttft_slo_ms * (1 + 1e-9);
      res.tpot_met = t.tpot_slo_ms <= 0 || res.tpot_s * 1e3 <= t.tpot_slo_ms * (1 + 1e-9);
      RouterEnd(r.router, s, t.adapter);
      std::erase(r.running, c.req);
      last_finish_ = std::max(last_finish_, now_);
    }
    r.plan.clear();
    r.busy = false;
  }

  void Summarize(SimResult* out) const {
    Summary& m = out->summary;
    m.requests = static_cast<int64_t>(out->requests.size());
    std::vector<double> ttft, tpot, e2e;
    int64_t ttft_met = 0, tpot_met = 0, both = 0;
    double tokens = 0, tpot_sum = 0;
    for (size_t i = 0; i < out->requests.size(); ++i) {
      const RequestResult& r = out->requests[i];
      m.shed += r.shed;
      if (!r.completed) continue;
      ++m.completed;
      ttft.push_back(r.ttft_s);
      tpot.push_back(r.tpot_s);
      e2e.push_back(r.e2e_s);
      tpot_sum += r.tpot_s;
      tokens += static_cast<double>(trace_[i].output_tokens);
      ttft_met += r.ttft_met;
      tpot_met += r.tpot_met;
      both += r.ttft_met && r.tpot_met;
    }
    const double n = static_cast<double>(std::max<int64_t>(1, m.requests));
    m.ttft_attainment = static_cast<double>(ttft_met) / n;
    m.tpot_attainment = static_cast<double>(tpot_met) / n;
    m.attainment = static_cast<double>(both) / n;
    m.ttft_p50 = Percentile(ttft, 0.5);
    m.ttft_p90 = Percentile(ttft, 0.9);
    m.tpot_p50 = Percentile(tpot, 0.5);
    m.tpot_p90 = Percentile(tpot, 0.9);
    m.tpot_mean = tpot.empty() ? 0 : tpot_sum / static_cast<double>(tpot.size());
    m.e2e_p50 = Percentile(e2e, 0.5);
    m.e2e_p90 = Percentile(e2e, 0.9);
    m.makespan_s = last_finish_;
    m.throughput_rps = last_finish_ > 0 ? static_cast<double>(m.completed) / last_finish_ : 0;
    m.tokens_per_s = last_finish_ > 0 ? tokens / last_finish_ : 0;
    m.steps = steps_;
    m.retries = retries_;
    double busy = 0;
    for (const Replica& r : replicas_) busy += r.busy_s;
    m.busy_fraction =
        last_finish_ > 0 ? busy / (static_cast<double>(replicas_.size()) * last_finish_) : 0;
  }

  const std::vector<TraceRequest>& trace_;
  const SimOptions& opts_;
  Rng rng_;
  std::vector<Seq> seqs_;
  std::vector<Replica> replicas_;
  std::vector<RequestResult> results_;
  double now_ = 0, last_step_s_ = 0, last_finish_ = 0;
  int64_t steps_ = 0;
  int64_t retries_ = 0;          // requests sent to another replica after a 429
  std::deque<int64_t> refused_;  // refused by a replica at now_, to be routed again
};

}  // namespace

Result<SimResult> Simulate(const std::vector<TraceRequest>& trace, const SimOptions& opts) {
  if (opts.cost_model == nullptr) return InvalidArgumentError("simulate: a cost model is required");
  if (opts.replicas < 1 || opts.replicas > 100000)
    return InvalidArgumentError("simulate: --replicas must be in [1, 100000]");
  if (opts.max_batch_tokens < 1)
    return InvalidArgumentError("simulate: --max-batch-tokens must be ≥ 1");
  if (opts.max_running < 1) return InvalidArgumentError("simulate: --max-running must be ≥ 1");
  if (opts.max_adapters_per_step < 0)
    return InvalidArgumentError("simulate: --max-adapters-per-step must be ≥ 0");
  for (size_t i = 1; i < trace.size(); ++i)
    if (trace[i].arrival_s < trace[i - 1].arrival_s)
      return InvalidArgumentError("simulate: trace arrivals must be non-decreasing");
  Simulator sim(trace, opts);
  return sim.Run();
}

double PredictDecodeStep(const engine::CostModel& model, int64_t rows, int64_t rank,
                         int64_t adapters, int64_t context) {
  engine::StepFeatures f;
  for (int64_t i = 0; i < rows; ++i) f.AddChunk(context, 1, false, rank);
  if (rank > 0) {
    f.adapters = static_cast<double>(adapters);
    f.sum_ranks = static_cast<double>(adapters * rank);
  }
  return model.Predict(f);
}

}  // namespace chorus::sim
