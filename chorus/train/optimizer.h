// AdamW, learning-rate schedules and gradient clipping for LoRA training (docs/finetuning.md).
// Plain sequential loops over the parameters in LoraParams order: a few million values at most,
// and a fixed order keeps runs reproducible.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "chorus/base/status.h"
#include "chorus/train/lora_model.h"

namespace chorus::train {

enum class Schedule { kCosine, kLinear, kConstant };
Result<Schedule> ParseSchedule(const std::string& name);  // "cosine", "linear", "constant"
const char* ScheduleName(Schedule s);

// The rate of optimizer step `step` (0-based) of `total`: linear warm-up from lr/warmup to lr
// over the first `warmup` steps, then cosine or linear decay to 0 at step `total`.
double LearningRate(int64_t step, int64_t total, int64_t warmup, double lr, Schedule s);

// Scales every gradient so their global L2 norm is at most max_norm (≤ 0: no clipping).
// Returns the norm before clipping.
double ClipGradNorm(const std::vector<Param*>& params, double max_norm);

struct AdamWOptions {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
};
// One AdamW step (t: 1-based step count, for the bias corrections): decoupled weight decay
// θ -= lr·wd·θ, then θ -= lr·m̂/(√v̂ + eps).
void AdamWStep(const std::vector<Param*>& params, const AdamWOptions& o, double lr, int64_t t);

}  // namespace chorus::train
