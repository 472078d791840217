// Step-latency profile (`chorus profile`, docs/scheduling.md): times engine steps of random
// shapes — prefill chunks at several start positions, decode rows at several depths, LoRA
// adapters of ranks 8–64 — through the same Forward and LoRA hook the engine runs, and fits the
// cost models (engine/cost_model.h) on three quarters of them, judging each on the rest.
//
// KV contents are not computed first: a step's cost does not depend on the values in the cache
// (the pages are zeroed once), only on how many positions each row attends to, so a decode row
// "at depth 1000" costs one step, not 1000 tokens of prefill first.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "chorus/base/status.h"
#include "chorus/engine/cost_model.h"
#include "chorus/kernels/attention.h"
#include "chorus/model/model.h"

namespace chorus::engine {

struct ProfileOptions {
  int threads = 0;        // compute threads (0 = all cores), as the server will run
  int64_t samples = 160;  // distinct step shapes
  int repeats = 3;        // each shape timed this many times; its time is the median (or min)
  int64_t max_prefill = 256;
  int64_t max_decode = 32;
  int64_t max_context = 1024;  // deepest decode row / latest prefill start
  int64_t max_adapters = 8;    // distinct adapters in a step (ranks cycle 8, 16, 32, 64)
  uint64_t seed = 1;
  // Time each step by the calling thread's CPU time instead of the wall clock (needs threads ==
  // 1: the step then runs on the calling thread). On a host shared with other work the wall
  // clock measures the time the kernel gave to others; the thread's CPU time measures the
  // step's own work (not the cache and memory-bandwidth contention, which remain).
  bool cpu_clock = false;
  // Element type of the KV cache, as the server will run it (attention reads half the bytes in
  // bf16).
  kernels::KvDtype kv_dtype = kernels::KvDtype::kF32;
  // A shape's time: the median of its repeats, or the fastest. Other work on the machine only
  // ever adds to a step's time (a compute thread descheduled for a slice of another process
  // holds the whole step: ~3-5 ms against steps of 0.2 ms on the tiny model), so the fastest
  // of several repeats is the step's own cost; the median still carries every interruption
  // that hit most repeats.
  bool min_time = false;
  // Deltas are not profiled (building one needs a fine-tune of the same base): their term is
  // zero in every sample, so the fitted models give it coefficient 0.
};

struct ProfileReport {
  std::vector<StepSample> train, heldout;  // every fourth shape (in random order) is held out
  // Each shape's repeats, fastest and median (same order as train then heldout): their spread
  // is the measurement's own noise, a floor under any model's error.
  struct Repeats {
    double min = 0, median = 0;
  };
  std::vector<Repeats> train_repeats, heldout_repeats;
  // The median over shapes of (median − min) / min of its repeats.
  double RepeatSpread() const;
  CostModelFile file;  // the fitted models, the better one chosen
  std::string ToTable() const;
  std::string ToCsv() const;  // every step: its features, seconds, its repeats' min and median
};

Result<ProfileReport> RunProfile(std::shared_ptr<const model::Model> model,
                                 const ProfileOptions& opts,
                                 const std::function<void(const std::string&)>& progress);

}  // namespace chorus::engine
