// Request traces for the cluster simulator (docs/router.md, "Simulating a cluster"): the JSONL
// format `chorus simulate --trace FILE` reads, and a generator of synthetic traces in the shape
// of CaraServe's and S-LoRA's workloads (Poisson or gamma arrivals with a coefficient of
// variation, zipf or uniform adapter popularity, a mix of LoRA ranks, prompt and output lengths
// from a distribution).
//
// One request per line, a JSON object:
//   {"arrival_s": 0.125, "prompt_tokens": 180, "output_tokens": 64, "adapter": "a17",
//    "rank": 16, "ttft_slo_ms": 2000, "tpot_slo_ms": 150}
// `arrival_s` (seconds from the trace's start, non-decreasing), `prompt_tokens` (≥ 1) and
// `output_tokens` (≥ 1) are required; `adapter` (absent or "" = the base model), `rank` (the
// adapter's LoRA rank, required with an adapter, ≥ 1) and the SLOs (0 or absent = none) are
// optional. Blank lines and lines starting with '#' are skipped. Errors name the line and field.
//
// Thread-safety: plain functions over values.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "chorus/base/status.h"

namespace chorus::sim {

struct TraceRequest {
  double arrival_s = 0;
  int64_t prompt_tokens = 0;
  int64_t output_tokens = 0;
  std::string adapter;                      // "" = the base model
  int64_t rank = 0;                         // LoRA rank of `adapter` (0 for the base model)
  double ttft_slo_ms = 0, tpot_slo_ms = 0;  // 0 = none
};

Result<std::vector<TraceRequest>> ParseTrace(std::string_view jsonl);
Result<std::vector<TraceRequest>> LoadTrace(const std::string& path);
std::string TraceToJsonl(const std::vector<TraceRequest>& trace);

// The trace with its arrival times scaled so that its mean rate, requests over the span from
// its start (0) to its last arrival, is `rate` per second (the arrival pattern — bursts, gaps —
// is kept). A trace whose last arrival is 0 is returned unchanged.
std::vector<TraceRequest> ScaleToRate(const std::vector<TraceRequest>& trace, double rate);

// A length distribution: "N" (fixed) or "uniform:LO:HI" (inclusive) or
// "lognormal:MEDIAN:SIGMA:MAX" (rounded, clamped to [1, MAX]).
struct LengthDist {
  enum class Kind { kFixed, kUniform, kLognormal };
  Kind kind = Kind::kFixed;
  double a = 1, b = 1, c = 1;
  static Result<LengthDist> Parse(const std::string& spec);
};

struct TraceSpec {
  int64_t requests = 2000;
  double rate = 1;  // mean arrivals per second
  double cv = 1;    // coefficient of variation of inter-arrival times: 1 = Poisson, else gamma
  int64_t adapters = 100;  // distinct adapters (0 = every request on the base)
  double zipf = 1.0;       // popularity exponent: adapter i ∝ 1/(i+1)^zipf; 0 = uniform
  std::vector<int64_t> ranks = {8, 16, 32, 64};  // each adapter's rank: uniform over this list
  LengthDist prompt{LengthDist::Kind::kUniform, 32, 512, 0};
  LengthDist output{LengthDist::Kind::kUniform, 16, 256, 0};
  double ttft_slo_ms = 0, tpot_slo_ms = 0;
  uint64_t seed = 1;
};

// Deterministic for a spec (its own generator, not std::'s distributions, so that a seed gives
// the same trace with every standard library). The content of the requests (adapters, lengths)
// comes from a stream independent of the arrivals', so traces that differ only in `rate` hold
// the same requests at scaled times. Errors: a non-positive count, rate or cv, an empty rank list,
// a non-positive rank.
Result<std::vector<TraceRequest>> GenerateTrace(const TraceSpec& spec);

// A small deterministic generator (splitmix64), shared by the trace generator and the simulator.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next();
  double Uniform();  // [0, 1)
  double Exponential();
  double Normal();
  double Gamma(double shape);  // scale 1 (Marsaglia–Tsang)

 private:
  uint64_t state_;
};

}  // namespace chorus::sim
