#include "chorus/engine/policy.h"

#include <algorithm>

namespace chorus::engine {

FcfsPolicy::FcfsPolicy(int64_t max_adapters_per_step) : cap_(max_adapters_per_step) {}

void FcfsPolicy::BeginRound(const std::vector<const void*>& step_adapters) {
  step_adapters_.assign(step_adapters.begin(), step_adapters.end());
  barrier_ = false;
}

bool FcfsPolicy::InStep(const void* adapter) const {
  return std::find(step_adapters_.begin(), step_adapters_.end(), adapter) != step_adapters_.end();
}

bool FcfsPolicy::MayAdmit(const Candidate& c) {
  if (c.adapter == nullptr) return true;  // the base model takes no adapter slot
  const bool fits =
      cap_ == 0 || InStep(c.adapter) || static_cast<int64_t>(step_adapters_.size()) < cap_;
  if (!fits) {
    if (++*c.passes >= kMaxPasses) barrier_ = true;
    return false;
  }
  // Everything after a starving sequence is newer than it: none of it may take or keep an
  // adapter slot before it does.
  return !barrier_;
}

void FcfsPolicy::Admitted(const Candidate& c) {
  if (c.adapter != nullptr && !InStep(c.adapter)) step_adapters_.push_back(c.adapter);
}

}  // namespace chorus::engine
