// LoRA adapters under tensor parallelism (docs/scaleout.md, "LoRA under tensor parallelism"):
// S-LoRA §6's split. Each rank holds 1/N of every adapter matrix (LoraAdapter::BuildShard):
//
//   q, k, v, gate, up (base split by output rows): A split along the rank r — each rank shrinks
//     with its chunk of the rank rows and an all-gather assembles the whole shrink x·Aᵀ — and B
//     split by output rows like the base, so each rank writes the adapter term of its own
//     outputs;
//   o, down (base split by input columns): A split by input columns like the base — each rank's
//     shrink is a partial sum over its inputs, which an all-reduce completes — and B split by
//     output rows: each rank adds the term of its slice of the outputs to its partial sum of the
//     base product, and the forward pass's all-reduce after o / down sums the slices with it.
//
// The LoraHook of a rank, given the forward pass's communicator, runs these collectives (two per
// group of linears with an adapter row, each a few KB for decode: bench/tp/collectives_bench.cc).
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "chorus/adapters/lora/lora_adapter.h"
#include "chorus/adapters/lora/lora_files.h"
#include "chorus/adapters/lora/lora_hook.h"
#include "chorus/model/config.h"

namespace chorus::adapters {

// ReadLora against the whole model `full` and LoraAdapter::BuildShard for `rank` of `size`: this
// rank's copy of an adapter file (size 1: LoadLoraAdapter). Errors name the path.
Result<std::shared_ptr<const LoraAdapter>> LoadLoraAdapterShard(const std::string& path,
                                                                const model::ModelConfig& full,
                                                                int rank, int size,
                                                                const LoraLoadOptions& opts,
                                                                std::string name);

// A rank's LoRA hook over a table of adapters, addressed by slot (slot i = table[i],
// −1 = base): what the step plan carries per row (model::StepChannel) and what
// model::RunTpWorker asks for (`ForRows` is a model::TpHookForRows). Every rank builds its table
// from the same adapters, each for its own shard: all at once, or slot by slot as rank 0
// defines them (Set).
class LoraSlotHook {
 public:
  // `config`: this rank's model (shard) config; `comm`: the forward pass's communicator (the
  // adapters are its rank's parts; null: one process, whole adapters).
  LoraSlotHook(const model::ModelConfig& config, int64_t max_rows, dist::Communicator* comm,
               std::vector<std::shared_ptr<const LoraAdapter>> table = {});
  // The hook with rows set from `slots` (a slot outside the table, or empty, is an error naming
  // it).
  Result<const model::LinearHook*> ForRows(std::span<const int32_t> slots);
  // Puts `adapter` in `slot` (≥ 0; the table grows as needed), replacing what was there.
  void Set(int32_t slot, std::shared_ptr<const LoraAdapter> adapter);

 private:
  std::vector<std::shared_ptr<const LoraAdapter>> table_;
  LoraHook hook_;
  std::vector<const LoraAdapter*> rows_;
};

}  // namespace chorus::adapters
