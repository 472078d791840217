// `chorus bench --tp N` (docs/scaleout.md): aggregate decode tokens/s of a tensor-parallel job at
// each batch size, with the communication time of each step. The same code runs at --tp 1 (the
// local communicator, no MPI), so `chorus bench --tp 1 --threads 2` and `mpirun -np 2 chorus
// bench --tp 2 --threads 1` are the two sides of one comparison on the same workload.
//
// With `adapters` > 0 each batch size also runs with every row on a LoRA adapter (round-robin
// over that many, q/k/v/o, ranks round-robin over lora_ranks), each rank holding its part of
// them (S-LoRA §6's split, adapters/lora/lora_tp.h): the collectives the split adds show in the
// row's comm figures beside the base row's.
//
// Rank 0 runs this; the other ranks run model::RunTpWorker over their shards, with
// TpBenchAdapters' hook when `adapters` > 0.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "chorus/adapters/lora/lora_tp.h"
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
  int64_t adapters = 0;  // 0: base rows only
  std::vector<int64_t> lora_ranks = {8, 16, 32, 64};
  adapters::LoraStorage lora_storage = adapters::LoraStorage::kBF16;
  // Rows of a step (the forward pass's and the hook's buffers): the context prefill's or the
  // largest batch.
  int64_t max_rows() const;
};

// Rank `comm`'s hook over its parts of the bench's adapters (the same random adapters on every
// rank, from `full`: the whole model's config; `shard`: this rank's).
class TpBenchAdapters {
 public:
  static Result<std::unique_ptr<TpBenchAdapters>> Make(const TpBenchOptions& opts,
                                                       const model::ModelConfig& full,
                                                       const model::ModelConfig& shard,
                                                       dist::Communicator* comm);
  // A model::TpHookForRows.
  Result<const model::LinearHook*> ForRows(std::span<const int32_t> slots) {
    return hook_->ForRows(slots);
  }
  int64_t memory_bytes() const { return memory_bytes_; }  // this rank's parts, all adapters

 private:
  std::unique_ptr<adapters::LoraSlotHook> hook_;
  int64_t memory_bytes_ = 0;
};

struct TpBenchRow {
  int64_t batch = 0;
  std::string rows = "base";  // "base", or "lora": every row on an adapter
  double tokens_per_s = 0;    // median over runs
  std::vector<double> runs;   // tokens/s of each run
  double step_ms = 0;         // median wall time of one decode step
  // Rank 0's wall time inside collectives per decode step (median over runs): the step-plan
  // broadcast and the two all-reduces per layer, including waiting for the slowest rank.
  double comm_ms = 0;
  std::vector<double> comm_ms_runs;
  double all_reduces_per_step = 0;
  double all_gathers_per_step = 0;
  double bytes_per_step = 0;  // all-reduced + all-gathered + broadcast bytes per step (per rank)
};

struct TpBenchReport {
  std::string model;  // shape or path
  std::string dtype;
  int tp = 1;
  int threads = 1;
  int64_t adapters = 0;
  int64_t adapter_bytes = 0;  // rank 0's parts of the adapters (memory per rank)
  std::vector<TpBenchRow> rows;
  std::string ToTable() const;
  std::string ToCsv() const;
  std::string ToJson() const;
};

// Rank 0: `shard` is its shard (the whole model at tp 1) of the model whose config is `full`;
// `leader` null at tp 1. The KV cache, steps and sampling (greedy) are rank 0's; the leader
// broadcasts each step's plan.
Result<TpBenchReport> RunTpBench(const TpBenchOptions& opts, const model::ModelConfig& full,
                                 std::shared_ptr<const model::Model> shard,
                                 dist::Communicator* comm, model::TpLeader* leader,
                                 const std::function<void(const std::string&)>& progress);

}  // namespace chorus::engine
