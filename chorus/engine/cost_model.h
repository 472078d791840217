// CostModel: a step's latency predicted from what the step holds (docs/scheduling.md, "The cost
// model"). CaraServe's rank-aware model is linear in the step's features; `chorus profile`
// measures steps on this machine through the real forward pass (engine/profile.h), fits the
// coefficients by least squares and saves them as JSON, and `chorus serve --cost-model FILE`
// loads them for the `slo` policy.
//
// Two model kinds share one representation (a list of named terms and their coefficients):
//   * "linear": t = c0 + c1·prefill + c2·decode + c3·Σrank + c4·adapters + c5·deltas
//               + c6·context — CaraServe's linear model over the step's features;
//   * "extended": the linear terms plus rank-weighted rows (Σ over rows of the row's adapter
//               rank: the LoRA shrink/expand work grows with rows × rank, not with distinct
//               ranks alone), min(rows, 32) (small steps read every weight once whatever
//               their row count: a knee the linear model cannot bend to) and the context of the
//               prefill rows apart (a prefill chunk's attention is batched over its rows and
//               costs far less per attended position than a decode row's — ~10× on the tiny
//               model — so one coefficient for both fits neither: its term corrects
//               context_tokens for the prefill share).
//
// Thread-safety: a CostModel is immutable once built; Predict() is const.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "chorus/base/status.h"

namespace chorus::engine {

// What a step holds, as the cost model sees it.
struct StepFeatures {
  double prefill_tokens = 0;   // rows of prefill chunks
  double decode_rows = 0;      // rows of sequences generating
  double sum_ranks = 0;        // Σ over the distinct LoRA adapters of the step of their rank
  double adapters = 0;         // distinct LoRA adapters
  double deltas = 0;           // distinct deltas
  double context_tokens = 0;   // Σ over rows of the positions each row attends to
  double row_ranks = 0;        // Σ over rows of the row's adapter rank (0 for base rows)
  double prefill_context = 0;  // the part of context_tokens that prefill rows attend to
  double rows() const { return prefill_tokens + decode_rows; }
  // Adds one sequence's chunk: `count` rows from position `start`, with an adapter of `rank`
  // (0 = none). Does not count distinct adapters (the caller knows which are new).
  void AddChunk(int64_t start, int64_t count, bool prefill, int64_t rank);
};

// A step sample: its features and the measured seconds.
struct StepSample {
  StepFeatures f;
  double seconds = 0;
};

// How well a model predicts a set of samples.
struct FitQuality {
  double r2 = 0;          // coefficient of determination (on seconds)
  double median_ape = 0;  // median of |predicted − measured| / measured
  double p90_ape = 0;     // 90th percentile of the same
  int64_t n = 0;
};

class CostModel {
 public:
  enum class Kind { kLinear, kExtended };
  static const char* KindName(Kind k);  // "linear", "extended"
  // The names of a kind's terms, in coefficient order ("1" is the intercept).
  static const std::vector<std::string>& TermNames(Kind k);

  // Least squares on relative error: every sample weighted by 1 / seconds², so that short
  // decode steps count as much as long prefill steps (the bar is a relative error). Terms that
  // are zero in every sample get coefficient 0. Errors: fewer samples than terms, a
  // non-positive or non-finite time.
  static Result<CostModel> Fit(Kind kind, const std::vector<StepSample>& samples);
  // A model with the given coefficients (TermNames(kind).size() of them).
  static Result<CostModel> FromCoefficients(Kind kind, std::vector<double> coef);

  // Predicted seconds (never below 0).
  double Predict(const StepFeatures& f) const;
  FitQuality Evaluate(const std::vector<StepSample>& samples) const;

  Kind kind() const { return kind_; }
  const std::vector<double>& coefficients() const { return coef_; }

 private:
  static void Terms(Kind k, const StepFeatures& f, std::vector<double>* out);
  Kind kind_ = Kind::kLinear;
  std::vector<double> coef_;
};

// How far the steps this server runs take from what a CostModel predicts for them, learned
// while serving (docs/scheduling.md, "Correction while serving"): the model is fitted once, on
// the machine as it was when profiled, and a host whose speed moves (memory phases, other
// work, thermal limits) or a server whose steps carry work the profile did not time (sampling,
// streaming, grammar masks) would otherwise admit and abort by a stale clock. factor() is the
// exponentially weighted mean of log(measured / predicted) over the steps observed — each new
// step weighs kWeight, so it follows a change within ~20 steps — each step's ratio clamped to
// [1/8, 8] (one descheduled step must not swing it), the factor to [1/kMaxFactor, kMaxFactor].
// It starts at 1 (the profile's clock). Thread-safety: not thread-safe (the engine thread owns it).
class CostCorrection {
 public:
  static constexpr double kWeight = 0.1;
  static constexpr double kMaxFactor = 4.0;
  // A step the model predicted at `predicted_s` took `measured_s`. Ignored unless both are
  // finite and positive.
  void Observe(double predicted_s, double measured_s);
  double factor() const;
  int64_t steps() const { return steps_; }

 private:
  double mean_log_ratio_ = 0;
  int64_t steps_ = 0;
};

// The file `chorus profile` writes and `chorus serve --cost-model` reads: every fitted model
// with its held-out quality, and which one to use (the better on held-out points).
struct CostModelFile {
  struct Entry {
    CostModel model;
    FitQuality heldout;
  };
  std::vector<Entry> models;
  size_t use = 0;              // index into models
  std::string model_name;      // what was profiled (informational)
  int threads = 0;             // compute threads of the profile
  std::string loadavg;         // /proc/loadavg when profiled
  std::string clock = "wall";  // how steps were timed: "wall" or "thread-cpu" (ProfileOptions)
  std::string timing;          // a shape's time from its repeats: "median of 3", "min of 7"
  std::string ToJson() const;
  // Errors name the problem (not JSON, missing or mistyped field, wrong number of
  // coefficients, non-finite coefficient, unknown kind).
  static Result<CostModelFile> Parse(std::string_view json);
  static Result<CostModelFile> Load(const std::string& path);
  const CostModel& best() const { return models[use].model; }
};

}  // namespace chorus::engine
