#include "chorus/train/optimizer.h"

#include <cmath>
#include <numbers>

namespace chorus::train {

Result<Schedule> ParseSchedule(const std::string& name) {
  if (name == "cosine") return Schedule::kCosine;
  if (name == "linear") return Schedule::kLinear;
  if (name == "constant") return Schedule::kConstant;
  return InvalidArgumentError("unknown schedule '" + name + "' (cosine, linear, constant)");
}

const char* ScheduleName(Schedule s) {
  switch (s) {
    case Schedule::kCosine:
      return "cosine";
    case Schedule::kLinear:
      return "linear";
    default:
      return "constant";
  }
}

double LearningRate(int64_t step, int64_t total, int64_t warmup, double lr, Schedule s) {
  if (step < warmup) return lr * static_cast<double>(step + 1) / static_cast<double>(warmup);
  if (s == Schedule::kConstant) return lr;
  const double span = static_cast<double>(std::max<int64_t>(1, total - warmup));
  const double progress = std::min(1.0, static_cast<double>(step - warmup) / span);
  if (s == Schedule::kLinear) return lr * (1.0 - progress);
  return lr * 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
}

double ClipGradNorm(const std::vector<Param*>& params, double max_norm) {
  double ss = 0.0;
  for (const Param* p : params) {
    for (float g : p->grad) ss += static_cast<double>(g) * g;
  }
  const double norm = std::sqrt(ss);
  if (max_norm > 0.0 && norm > max_norm) {
    const float f = static_cast<float>(max_norm / (norm + 1e-6));
    for (Param* p : params) {
      for (float& g : p->grad) g *= f;
    }
  }
  return norm;
}

void AdamWStep(const std::vector<Param*>& params, const AdamWOptions& o, double lr, int64_t t) {
  const double bc1 = 1.0 - std::pow(o.beta1, static_cast<double>(t));
  const double bc2 = 1.0 - std::pow(o.beta2, static_cast<double>(t));
  const float b1 = static_cast<float>(o.beta1), b2 = static_cast<float>(o.beta2);
  const float step = static_cast<float>(lr / bc1);
  const float inv_bc2 = static_cast<float>(1.0 / bc2);
  const float decay = static_cast<float>(1.0 - lr * o.weight_decay);
  const float eps = static_cast<float>(o.eps);
  for (Param* p : params) {
    for (size_t i = 0; i < p->value.size(); ++i) {
      const float g = p->grad[i];
      p->m[i] = b1 * p->m[i] + (1.0f - b1) * g;
      p->v[i] = b2 * p->v[i] + (1.0f - b2) * g * g;
      p->value[i] = p->value[i] * decay - step * p->m[i] / (std::sqrt(p->v[i] * inv_bc2) + eps);
    }
  }
}

}  // namespace chorus::train
