#include "chorus/adapters/lora/lora_hook.h"

namespace chorus::adapters {

LoraHook::LoraHook(const model::ModelConfig& base, int64_t max_rows)
    : config_(base), max_rows_(max_rows) {
  segments_.reserve(static_cast<size_t>(max_rows));
  slots_.reserve(static_cast<size_t>(max_rows));
  shrink_w_.reserve(static_cast<size_t>(max_rows));
  expand_w_.reserve(static_cast<size_t>(max_rows));
  for (auto& w : group_expand_w_) w.reserve(static_cast<size_t>(max_rows));
}

void LoraHook::Clear() {
  segments_.clear();
  slots_.clear();
  n_rows_ = 0;
}

Status LoraHook::SetRows(std::span<const LoraAdapter* const> row_adapters) {
  convert_.assign(row_adapters.begin(), row_adapters.end());
  return SetRows(std::span<const LoraView* const>(convert_));
}

Status LoraHook::SetRows(std::span<const LoraView* const> row_adapters) {
  const int64_t n = static_cast<int64_t>(row_adapters.size());
  if (n > max_rows_) {
    return InvalidArgumentError("LoRA step of " + std::to_string(n) + " rows, max " +
                                std::to_string(max_rows_));
  }
  int64_t need_stride = 0;
  for (const LoraView* a : row_adapters) {
    if (a == nullptr) continue;
    if (a->n_layers() != config_.n_layers) {
      return InvalidArgumentError("adapter '" + a->name() + "' has " +
                                  std::to_string(a->n_layers()) + " layers, the base model " +
                                  std::to_string(config_.n_layers));
    }
    need_stride = std::max({need_stride, a->max_fused_rank(), a->max_rank()});
  }
  Clear();
  n_rows_ = n;
  if (need_stride > v_stride_) {  // grows when a larger rank first appears, never shrinks
    v_stride_ = need_stride;
    v_.assign(static_cast<size_t>(max_rows_ * v_stride_), 0.0f);
  }
  for (int64_t i = 0; i < n;) {
    const LoraView* a = row_adapters[static_cast<size_t>(i)];
    int64_t j = i + 1;
    while (j < n && row_adapters[static_cast<size_t>(j)] == a) ++j;
    if (a != nullptr) {
      int32_t slot = -1;
      for (size_t s = 0; s < slots_.size(); ++s)
        if (slots_[s] == a) slot = static_cast<int32_t>(s);
      if (slot < 0) {
        slot = static_cast<int32_t>(slots_.size());
        slots_.push_back(a);
      }
      segments_.push_back({i, j, slot});
    }
    i = j;
  }
  shrink_w_.resize(slots_.size());
  expand_w_.resize(slots_.size());
  for (auto& w : group_expand_w_) w.resize(slots_.size());
  return OkStatus();
}

void LoraHook::Apply(int64_t layer, model::Linear which, const float* x, int64_t x_stride, float* y,
                     int64_t y_stride, int64_t n_rows, ThreadPool* pool) const {
  if (segments_.empty()) return;
  CHORUS_CHECK_EQ(n_rows, n_rows_) << "LoraHook::SetRows was given another step's rows";
  const size_t n_slots = slots_.size();
  for (size_t s = 0; s < n_slots; ++s) {
    const LoraView::Module& m = slots_[s]->module(layer, which);
    shrink_w_[s] = {m.a_rows, m.rank, m.a_rows_bf16};
    expand_w_[s] = {m.bt_rows, m.rank, 0, m.scale, m.bt_rows_bf16};
  }
  const kernels::LoraExpandOut target{expand_w_, LinearOut(config_, which), y, y_stride};
  kernels::LoraShrinkExpand(segments_, shrink_w_, x, x_stride, LinearIn(config_, which), v_.data(),
                            v_stride_, {&target, 1}, pool);
}

void LoraHook::ApplyGroup(int64_t layer, model::LinearGroup group, std::span<const Target> targets,
                          const float* x, int64_t x_stride, int64_t n_rows,
                          ThreadPool* pool) const {
  if (segments_.empty()) return;
  CHORUS_CHECK_EQ(n_rows, n_rows_) << "LoraHook::SetRows was given another step's rows";
  const std::span<const model::Linear> members = model::LinearGroupMembers(group);
  CHORUS_CHECK_EQ(targets.size(), members.size()) << "ApplyGroup needs the whole group";
  static_assert(model::kMaxLinearGroupSize <= kernels::kMaxLoraExpandOuts);
  const size_t n_slots = slots_.size();
  for (size_t s = 0; s < n_slots; ++s) {
    const LoraView::Fused& f = slots_[s]->fused(layer, group);
    shrink_w_[s] = {f.a_rows, f.rank, f.a_rows_bf16};
  }
  std::array<kernels::LoraExpandOut, kernels::kMaxLoraExpandOuts> outs;
  for (size_t t = 0; t < targets.size(); ++t) {
    CHORUS_CHECK(targets[t].which == members[t]) << "ApplyGroup targets out of group order";
    std::vector<kernels::LoraExpandWeight>& ew = group_expand_w_[t];
    for (size_t s = 0; s < n_slots; ++s) {
      const LoraView::Module& m = slots_[s]->module(layer, targets[t].which);
      ew[s] = {m.bt_rows, m.rank, m.fused_col, m.scale, m.bt_rows_bf16};
    }
    outs[t] = {ew, LinearOut(config_, targets[t].which), targets[t].y, targets[t].y_stride};
  }
  kernels::LoraShrinkExpand(segments_, shrink_w_, x, x_stride, LinearIn(config_, members[0]),
                            v_.data(), v_stride_, {outs.data(), targets.size()}, pool);
}

}  // namespace chorus::adapters
