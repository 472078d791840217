// `chorus bench --tp N` (docs/scaleout.md): aggregate decode tokens/s of a tensor-parallel job at
// each batch size, with the communication time of each step. The same code runs at --tp 1 (the
// local communicator, no MPI), so `chorus bench --tp 1 --threads 2` and `mpirun -np 2 chorus
// bench --tp 2 --threads 1` are the two sides of one comparison on the same workload.
//
// Rank 0 runs this; the other ranks run model::RunTpWorker over their shards.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "chorus/base/status.h"
#include "chorus/dist/communicator.h"
#include "chorus/kernels/attention.h"
#include "chorus/model/model.h"
#include "chorus/model/tensor_parallel.h"

namespace chorus::engine {

struct TpBenchOptions {
  int threads = 1;  // compute threads of every rank
  std::vector<int64_t> batches = {1, 8, 32};
  int64_t context = 32;       // KV tokens of each sequence before the timed steps
  int64_t decode_steps = 16;  // timed decode steps per run
  int repeats = 3;            // runs per batch size (median reported)
  kernels::KvDtype kv_dtype = kernels::KvDtype::kF32;
};

struct TpBenchRow {
  int64_t batch = 0;
  double tokens_per_s = 0;   // median over runs
  std::vector<double> runs;  // tokens/s of each run
  double step_ms = 0;        // median wall time of one decode step
  // Rank 0's wall time inside collectives per decode step (median over runs): the step-plan
  // broadcast and the two all-reduces per layer, including waiting for the slowest rank.
  double comm_ms = 0;
  std::vector<double> comm_ms_runs;
  double all_reduces_per_step = 0;
  double bytes_per_step = 0;  // all-reduced + broadcast bytes per decode step (per rank)
};

struct TpBenchReport {
  std::string model;  // shape or path
  std::string dtype;
  int tp = 1;
  int threads = 1;
  std::vector<TpBenchRow> rows;
  std::string ToTable() const;
  std::string ToCsv() const;
  std::string ToJson() const;
};

// Rank 0: `shard` is its shard (the whole model at tp 1); `leader` null at tp 1. The KV cache,
// steps and sampling (greedy) are rank 0's; the leader broadcasts each step's plan.
Result<TpBenchReport> RunTpBench(const TpBenchOptions& opts,
                                 std::shared_ptr<const model::Model> shard,
                                 dist::Communicator* comm, model::TpLeader* leader,
                                 const std::function<void(const std::string&)>& progress);

}  // namespace chorus::engine
