#include "chorus/engine/policy.h"

#include <algorithm>

namespace chorus::engine {

FcfsPolicy::FcfsPolicy(int64_t max_adapters_per_step, int64_t max_deltas_per_step)
    : cap_(max_adapters_per_step), delta_cap_(max_deltas_per_step) {}

void FcfsPolicy::BeginRound(const std::vector<const void*>& step_adapters,
                            const std::vector<const void*>& step_deltas) {
  step_adapters_.assign(step_adapters.begin(), step_adapters.end());
  step_deltas_.assign(step_deltas.begin(), step_deltas.end());
  barrier_ = false;
}

bool FcfsPolicy::InStep(const Candidate& c) const {
  const auto& in = c.delta ? step_deltas_ : step_adapters_;
  return std::find(in.begin(), in.end(), c.adapter) != in.end();
}

bool FcfsPolicy::MayAdmit(const Candidate& c) {
  if (c.adapter == nullptr) return true;  // the base model takes no adapter slot
  const int64_t cap = c.delta ? delta_cap_ : cap_;
  const size_t in_step = c.delta ? step_deltas_.size() : step_adapters_.size();
  const bool fits = cap == 0 || InStep(c) || static_cast<int64_t>(in_step) < cap;
  if (!fits) {
    if (++*c.passes >= kMaxPasses) barrier_ = true;
    return false;
  }
  // Everything after a starving sequence is newer than it: none of it may take or keep an
  // adapter slot before it does.
  return !barrier_;
}

void FcfsPolicy::Admitted(const Candidate& c) {
  if (c.adapter == nullptr || InStep(c)) return;
  (c.delta ? step_deltas_ : step_adapters_).push_back(c.adapter);
}

}  // namespace chorus::engine
