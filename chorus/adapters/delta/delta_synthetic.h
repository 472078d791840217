// Random compressed deltas for benchmarks (docs/deltas.md "Serving"): every linear of every layer
// in a chosen packed layout, with uniformly random codes and 2:4 patterns and one small scale.
// The cost of serving a delta depends on its layout and shapes, not on its values, so the
// engine benchmark uses these instead of compressing synthetic fine-tunes (minutes per delta at
// TinyLlama shape on two cores).
//
// Thread-safety: a pure function.
#pragma once

#include <cstdint>

#include "chorus/adapters/delta/delta_file.h"
#include "chorus/model/model.h"

namespace chorus::delta {

struct RandomDeltaSpec {
  int bits = 4;
  bool sparse24 = true;
  int64_t group_size = 64;  // 0: one scale per matrix (BitDelta)
  float scale = 1e-3f;
  uint64_t seed = 1;
};

// Requires: the layout is valid for every linear (ValidateLayout). The result has no extras and
// an empty base_hash (benchmarks attach it to the model they build).
Delta MakeRandomDelta(const model::ModelConfig& c, const RandomDeltaSpec& spec);

}  // namespace chorus::delta
