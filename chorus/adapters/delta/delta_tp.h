// A delta's shard for tensor parallelism (docs/scaleout.md, "Deltas under tensor parallelism"):
// each matrix split like its base matrix, so that each rank's DeltaHook over its model shard adds
// exactly its part and the forward pass's two all-reduces complete the term:
//
//   q, k, v, gate, up (base split by output rows): the delta's rows of this rank's outputs;
//   o, down (base split by input columns): the delta's columns of this rank's inputs — each
//     rank's x_r·Δ_rᵀ is a partial sum, added to its partial sum of the base product before the
//     all-reduce.
//
// The packed codes are sliced, not re-quantized: every value a shard decodes is the value the
// whole delta decodes at that place. A column split must fall on a 2:4 group (4 columns) and on a
// scale group (`group_size`); one scale per matrix (BitDelta) splits anywhere. The extras (norms,
// embeddings, output head) are replicated: each rank's forward pass applies them to its own copy
// of the replicated tensors (the head runs on rank 0 only).
//
// Thread-safety: pure functions.
#pragma once

#include <memory>
#include <string>

#include "chorus/adapters/delta/delta_file.h"
#include "chorus/adapters/delta/delta_hook.h"
#include "chorus/model/config.h"

namespace chorus::delta {

// Shard `rank` of `size` of `d`, a delta of the whole model `full`. Errors name the matrix and
// the boundary that falls inside a group. size 1 returns `d`.
Result<Delta> ShardDelta(const Delta& d, const model::ModelConfig& full, int rank, int size);

// LoadDeltaWeights for `rank` of `size`: read, checked against `base_hash` (the whole base's),
// sharded, and built against model::ShardConfig(full, size), in `arena` when given
// (DeltaWeights::Build), `identity` its identity(). Errors start with the path.
Result<std::shared_ptr<const DeltaWeights>> LoadDeltaWeightsShard(
    const std::string& path, const model::ModelConfig& full, const std::string& base_hash, int rank,
    int size, const std::string& name, std::shared_ptr<memory::HostArena> arena = nullptr,
    std::string identity = {});

}  // namespace chorus::delta
