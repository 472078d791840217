// chorus simulate: routing policies compared on a simulated cluster (docs/router.md,
// "Simulating a cluster").
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "apps/chorus/commands.h"
#include "apps/chorus/common.h"
#include "chorus/base/mapped_file.h"
#include "chorus/sim/simulate.h"

namespace chorus::apps {
namespace {

std::vector<std::string> SplitComma(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

Result<std::vector<double>> ParseRates(const std::string& s) {
  std::vector<double> out;
  for (const std::string& item : SplitComma(s)) {
    char* end = nullptr;
    const double v = std::strtod(item.c_str(), &end);
    if (*end != '\0' || !(v > 0) || !std::isfinite(v))
      return InvalidArgumentError("flag --rates: '" + item.substr(0, 32) +
                                  "' is not a positive number of requests per second");
    out.push_back(v);
  }
  return out;
}

Result<std::vector<int64_t>> ParseRanks(const std::string& s) {
  std::vector<int64_t> out;
  for (const std::string& item : SplitComma(s)) {
    char* end = nullptr;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (*end != '\0' || v < 1 || v > 65536)
      return InvalidArgumentError("flag --ranks: '" + item.substr(0, 32) +
                                  "' is not a rank in [1, 65536]");
    out.push_back(v);
  }
  if (out.empty()) return InvalidArgumentError("flag --ranks is empty");
  return out;
}

}  // namespace

int SimulateCommand(int argc, char** argv) {
  Flags f(
      "simulate",
      "Discrete-event simulation of --replicas `chorus serve` replicas behind `chorus router`:\n"
      "each arrival is routed by the router's own policy code, each replica runs the engine's\n"
      "continuous batching with step times from a cost model measured by `chorus profile`.\n"
      "Prints, per policy and load point, SLO attainment (TTFT, TPOT, both), p50/p90\n"
      "latencies and throughput (docs/router.md, \"Simulating a cluster\").");
  f.String("cost-model", "", "cost model JSON written by `chorus profile` (required)");
  f.Int("replicas", 60, "simulated replicas");
  f.String("policy", "rank-aware,random,least-loaded",
           "routing policies to compare, comma-separated (least-loaded, random, pack, rank-aware)");
  f.String("rates", "",
           "load points, requests/s, comma-separated: the trace's arrivals are scaled to each "
           "(required with a generated trace; a --trace file alone runs at its own rate)");
  f.String("trace", "", "JSONL request trace (docs/router.md); default: generate one");
  f.String("write-trace", "", "write the generated trace (at the first rate) to this JSONL file");
  f.Int("requests", 4000, "generated trace: requests per load point");
  f.Float("cv", 1.0, "generated trace: coefficient of variation of inter-arrivals (1 = Poisson)");
  f.Int("adapters", 100, "generated trace: distinct LoRA adapters (0 = base model only)");
  f.Float("zipf", 1.0, "generated trace: adapter popularity exponent (0 = uniform)");
  f.String("ranks", "8,16,32,64", "generated trace: adapter ranks (each adapter: one, uniformly)");
  f.String("prompt-tokens", "uniform:32:512",
           "generated trace: prompt lengths (N, uniform:LO:HI or lognormal:MEDIAN:SIGMA:MAX)");
  f.String("output-tokens", "uniform:16:256", "generated trace: output lengths (same forms)");
  f.Float("ttft-slo-ms", 0,
          "TTFT SLO of every generated request and of trace requests without one");
  f.Float("tpot-slo-ms", 0, "TPOT SLO, likewise");
  f.Int("max-batch-tokens", 512, "each replica: rows per step (chunked prefill)");
  f.Int("max-running", 64, "each replica: sequences in the running batch");
  f.String("admission", "fcfs", "each replica's admission policy: fcfs, cluster or slo");
  f.Int("max-adapters-per-step", 0, "each replica: distinct adapters per step (0 = no cap)");
  f.Int("replica-capacity", 32, "pack: requests a replica takes before the next one is used");
  f.Bool("rank-aware-proxy",
         "rank-aware without the cost model's predictions (the router's proxy, as `chorus router` "
         "runs it)");
  f.Bool("shed",
         "the router's --shed: refuse (429) a request the chosen replica is predicted to serve "
         "outside its SLOs, for every policy (counted as missed; column `shed`)");
  f.Int("seed", 1, "seed of the generated trace and of the router's random choices");
  f.Bool("json", "print one JSON object per policy and load point instead of the table");
  f.String("csv", "", "also write the results as CSV (tools/plot.py simulate FILE draws them)");
  if (int rc = ParseOrExit(f, argc, argv); rc >= 0) return rc;
  auto fail = [](const Status& s) { return Fail("simulate", s); };

  if (f.GetString("cost-model").empty())
    return fail(
        InvalidArgumentError("flag --cost-model is required (write one with `chorus "
                             "profile`)"));
  auto cm = engine::CostModelFile::Load(f.GetString("cost-model"));
  if (!cm.ok()) return fail(cm.status().WithContext("flag --cost-model"));
  std::vector<router::Policy> policies;
  for (const std::string& name : SplitComma(f.GetString("policy"))) {
    auto p = router::ParsePolicy(name);
    if (!p.ok()) return fail(p.status().WithContext("flag --policy"));
    policies.push_back(*p);
  }
  if (policies.empty()) return fail(InvalidArgumentError("flag --policy is empty"));
  auto rates = ParseRates(f.GetString("rates"));
  if (!rates.ok()) return fail(rates.status());
  const double ttft_slo = f.GetFloat("ttft-slo-ms"), tpot_slo = f.GetFloat("tpot-slo-ms");
  if (ttft_slo < 0 || tpot_slo < 0) return fail(InvalidArgumentError("an SLO flag is negative"));

  // The base trace: a file, or generated at rate 1 (scaled to each load point below).
  std::vector<sim::TraceRequest> base;
  if (!f.GetString("trace").empty()) {
    auto t = sim::LoadTrace(f.GetString("trace"));
    if (!t.ok()) return fail(t.status().WithContext("flag --trace"));
    base = std::move(*t);
    for (auto& r : base) {
      if (r.ttft_slo_ms <= 0) r.ttft_slo_ms = ttft_slo;
      if (r.tpot_slo_ms <= 0) r.tpot_slo_ms = tpot_slo;
    }
  } else {
    if (rates->empty())
      return fail(InvalidArgumentError("flag --rates is required with a generated trace"));
    sim::TraceSpec spec;
    spec.requests = f.GetInt("requests");
    spec.rate = 1;
    spec.cv = f.GetFloat("cv");
    spec.adapters = f.GetInt("adapters");
    spec.zipf = f.GetFloat("zipf");
    auto ranks = ParseRanks(f.GetString("ranks"));
    if (!ranks.ok()) return fail(ranks.status());
    spec.ranks = *ranks;
    auto prompt = sim::LengthDist::Parse(f.GetString("prompt-tokens"));
    if (!prompt.ok()) return fail(prompt.status().WithContext("flag --prompt-tokens"));
    auto output = sim::LengthDist::Parse(f.GetString("output-tokens"));
    if (!output.ok()) return fail(output.status().WithContext("flag --output-tokens"));
    spec.prompt = *prompt;
    spec.output = *output;
    spec.ttft_slo_ms = ttft_slo;
    spec.tpot_slo_ms = tpot_slo;
    spec.seed = static_cast<uint64_t>(f.GetInt("seed"));
    auto t = sim::GenerateTrace(spec);
    if (!t.ok()) return fail(t.status());
    base = std::move(*t);
    if (!f.GetString("write-trace").empty()) {
      const std::string text = sim::TraceToJsonl(sim::ScaleToRate(base, (*rates)[0]));
      if (Status s = WriteFileAtomically(f.GetString("write-trace"), text); !s.ok())
        return fail(s.WithContext("flag --write-trace"));
    }
  }
  // Load points: each rate, or the trace as it is.
  std::vector<double> points = *rates;
  const bool as_is = points.empty();
  if (as_is) {
    const double span = base.back().arrival_s;
    points.push_back(span > 0 ? static_cast<double>(base.size()) / span : 0);
  }

  sim::SimOptions o;
  o.replicas = f.GetInt("replicas");
  o.replica_capacity = f.GetInt("replica-capacity");
  o.rank_aware_proxy = f.GetBool("rank-aware-proxy");
  o.max_batch_tokens = f.GetInt("max-batch-tokens");
  o.max_running = f.GetInt("max-running");
  o.admission = f.GetString("admission");
  o.max_adapters_per_step = f.GetInt("max-adapters-per-step");
  o.cost_model = std::make_shared<engine::CostModel>(cm->best());
  o.seed = static_cast<uint64_t>(f.GetInt("seed"));
  o.shed = f.GetBool("shed");

  const bool json_out = f.GetBool("json");
  if (!json_out) {
    std::printf(
        "chorus simulate: %lld replicas, cost model %s (%s, profiled with %d threads, "
        "load %s), %zu requests per point, TTFT SLO %g ms, TPOT SLO %g ms\n",
        static_cast<long long>(o.replicas), f.GetString("cost-model").c_str(),
        engine::CostModel::KindName(o.cost_model->kind()), cm->threads, cm->loadavg.c_str(),
        base.size(), ttft_slo, tpot_slo);
    std::printf("%-13s %8s %7s %7s %7s %9s %9s %8s %8s %8s %8s %8s %9s %5s %6s\n", "policy",
                "rate/s", "slo", "ttft", "tpot", "ttft p50", "ttft p90", "tpot p50", "tpot p90",
                "e2e p50", "e2e p90", "req/s", "tok/s", "busy", "shed");
    std::printf("%-13s %8s %7s %7s %7s %9s %9s %8s %8s %8s %8s %8s %9s %5s %6s\n", "", "", "att.",
                "att.", "att.", "ms", "ms", "ms", "ms", "s", "s", "", "", "", "");
  }
  std::string csv =
      "policy,rate,attainment,ttft_attainment,tpot_attainment,ttft_p50_ms,ttft_p90_ms,"
      "tpot_p50_ms,tpot_p90_ms,tpot_mean_ms,e2e_p50_s,e2e_p90_s,throughput_rps,tokens_per_s,"
      "busy_fraction,requests,completed,shed,retries\n";
  for (double rate : points) {
    const std::vector<sim::TraceRequest> trace = as_is ? base : sim::ScaleToRate(base, rate);
    for (router::Policy p : policies) {
      o.policy = p;
      auto r = sim::Simulate(trace, o);
      if (!r.ok()) return fail(r.status());
      const sim::Summary& m = r->summary;
      const char* name = router::PolicyName(p);
      char line[512];
      std::snprintf(line, sizeof(line),
                    "%s,%g,%.4f,%.4f,%.4f,%.2f,%.2f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.1f,%.3f,%lld,"
                    "%lld,%lld,%lld\n",
                    name, rate, m.attainment, m.ttft_attainment, m.tpot_attainment,
                    m.ttft_p50 * 1e3, m.ttft_p90 * 1e3, m.tpot_p50 * 1e3, m.tpot_p90 * 1e3,
                    m.tpot_mean * 1e3, m.e2e_p50, m.e2e_p90, m.throughput_rps, m.tokens_per_s,
                    m.busy_fraction, static_cast<long long>(m.requests),
                    static_cast<long long>(m.completed), static_cast<long long>(m.shed),
                    static_cast<long long>(m.retries));
      csv += line;
      if (json_out) {
        const nlohmann::json j = {{"policy", name},
                                  {"rate", rate},
                                  {"replicas", o.replicas},
                                  {"requests", m.requests},
                                  {"completed", m.completed},
                                  {"shed", m.shed},
                                  {"retries", m.retries},
                                  {"attainment", m.attainment},
                                  {"ttft_attainment", m.ttft_attainment},
                                  {"tpot_attainment", m.tpot_attainment},
                                  {"ttft_p50_s", m.ttft_p50},
                                  {"ttft_p90_s", m.ttft_p90},
                                  {"tpot_p50_s", m.tpot_p50},
                                  {"tpot_p90_s", m.tpot_p90},
                                  {"tpot_mean_s", m.tpot_mean},
                                  {"e2e_p50_s", m.e2e_p50},
                                  {"e2e_p90_s", m.e2e_p90},
                                  {"throughput_rps", m.throughput_rps},
                                  {"tokens_per_s", m.tokens_per_s},
                                  {"busy_fraction", m.busy_fraction},
                                  {"steps", m.steps}};
        std::printf("%s\n", j.dump().c_str());
      } else {
        std::printf(
            "%-13s %8g %7.3f %7.3f %7.3f %9.1f %9.1f %8.2f %8.2f %8.2f %8.2f %8.1f %9.0f "
            "%5.2f %6lld\n",
            name, rate, m.attainment, m.ttft_attainment, m.tpot_attainment, m.ttft_p50 * 1e3,
            m.ttft_p90 * 1e3, m.tpot_p50 * 1e3, m.tpot_p90 * 1e3, m.e2e_p50, m.e2e_p90,
            m.throughput_rps, m.tokens_per_s, m.busy_fraction, static_cast<long long>(m.shed));
      }
      std::fflush(stdout);
    }
  }
  if (!f.GetString("csv").empty()) {
    if (Status s = WriteFileAtomically(f.GetString("csv"), csv); !s.ok())
      return fail(s.WithContext("flag --csv"));
  }
  return 0;
}

}  // namespace chorus::apps
