// A LoRA adapter's shard for tensor parallelism (docs/scaleout.md, "LoRA under tensor
// parallelism"), so that each rank's ordinary LoraHook, over its model shard, adds exactly its
// part of the adapter term and the forward pass's existing all-reduces complete it:
//
//   q, k, v, gate, up (base split by output rows): A whole (every rank has all of x, so the
//     shrink x·Aᵀ is computed in full on each rank, no communication), B split by output rows
//     like the base — each rank writes the adapter term of its own outputs;
//   o, down (base split by input columns): A split by input columns like the base — each rank's
//     shrink is a partial sum over its inputs — and B whole: each rank adds s·(x_r·A_rᵀ)·Bᵀ to
//     its partial sum of the base product, and the all-reduce after o / down sums the partial
//     shrinks through B along with the base (linear in the shrink).
//
// S-LoRA §6 instead splits A of the first group along the rank dimension and all-gathers the
// shrink, and all-reduces the shrink of o / down before a split B: the memory of every adapter
// matrix divided by N, at the cost of extra collectives per layer. This split replicates half of
// each adapter instead and adds no collective or synchronisation point. (Measured here, those
// collectives would move their data in under 1 ms of a ~120 ms step — bench/tp/
// collectives_bench.cc, docs/scaleout.md — so the memory-optimal split is the better trade and is
// not implemented yet.)
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

// Shard `rank` of `size` of `w` (an adapter of the whole model `base`), to be built against
// model::ShardConfig(base, size). Quantized A of o/down split inside a block is refused; size 1
// returns `w`.
Result<LoraWeights> ShardLoraWeights(const LoraWeights& w, const model::ModelConfig& base, int rank,
                                     int size);

// ReadLora against the whole model `full`, ShardLoraWeights for `rank` of `size`, and
// LoraAdapter::Build against model::ShardConfig(full, size): this rank's copy of an adapter
// file (size 1: LoadLoraAdapter). Errors name the path.
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
  LoraSlotHook(const model::ModelConfig& config, int64_t max_rows,
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
