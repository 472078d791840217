#include "chorus/adapters/lora/lora_hook.h"

#include <algorithm>

namespace chorus::adapters {

LoraHook::LoraHook(const model::ModelConfig& base, int64_t max_rows, dist::Communicator* comm)
    : config_(base), comm_(comm), max_rows_(max_rows) {
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
    const int want_rank = split() ? comm_->rank() : 0, want_size = split() ? comm_->size() : 1;
    if (a->tp_size() != want_size || a->tp_rank() != want_rank) {
      return InvalidArgumentError(
          "adapter '" + a->name() + "' is part " + std::to_string(a->tp_rank()) + " of " +
          std::to_string(a->tp_size()) + " of a tensor-parallel split; this rank needs part " +
          std::to_string(want_rank) + " of " + std::to_string(want_size));
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
  if (split()) return ApplySplit(layer, which, x, x_stride, y, y_stride, n_rows, pool);
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
  if (split()) return ApplyGroupSplit(layer, group, targets, x, x_stride, n_rows, pool);
  const std::span<const model::Linear> members = model::LinearGroupMembers(group);
  CHORUS_CHECK_EQ(targets.size(), members.size()) << "ApplyGroup needs the whole group";
  static_assert(model::kMaxLinearGroupSize <= kernels::kMaxLoraExpandOuts);
  const size_t n_slots = slots_.size();
  for (size_t s = 0; s < n_slots; ++s) {
    const LoraView::Fused& f = slots_[s]->fused(layer, group);
    shrink_w_[s] = {f.a_rows, f.rank, f.a_rows_bf16};
  }
  const GroupOuts outs = ExpandOuts(layer, members, targets);
  kernels::LoraShrinkExpand(segments_, shrink_w_, x, x_stride, LinearIn(config_, members[0]),
                            v_.data(), v_stride_, {outs.data(), targets.size()}, pool);
}

LoraHook::GroupOuts LoraHook::ExpandOuts(int64_t layer, std::span<const model::Linear> members,
                                         std::span<const Target> targets) const {
  GroupOuts outs;
  for (size_t t = 0; t < targets.size(); ++t) {
    CHORUS_CHECK(targets[t].which == members[t]) << "ApplyGroup targets out of group order";
    std::vector<kernels::LoraExpandWeight>& ew = group_expand_w_[t];
    for (size_t s = 0; s < slots_.size(); ++s) {
      const LoraView::Module& m = slots_[s]->module(layer, targets[t].which);
      ew[s] = {m.bt_rows, m.rank, m.fused_col, m.scale, m.bt_rows_bf16};
    }
    outs[t] = {ew, LinearOut(config_, targets[t].which), targets[t].y, targets[t].y_stride};
  }
  return outs;
}

// o or down under TP: A split by input columns like the base, so each rank's shrink is a
// partial sum; the all-reduce completes it on every rank, and each rank expands into its slice
// [out_first, out_first + out) of the output columns. The forward pass's all-reduce after o /
// down then adds the slices of the other ranks (their partial base products hold nothing
// there from the adapter).
void LoraHook::ApplySplit(int64_t layer, model::Linear which, const float* x, int64_t x_stride,
                          float* y, int64_t y_stride, int64_t n_rows, ThreadPool* pool) const {
  CHORUS_CHECK(which == model::Linear::kO || which == model::Linear::kDown)
      << "under tensor parallelism q/k/v/gate/up go through ApplyGroup";
  const size_t n_slots = slots_.size();
  int64_t width = 0;  // the step's largest rank of this module: the same on every rank
  for (size_t s = 0; s < n_slots; ++s) {
    const LoraView::Module& m = slots_[s]->module(layer, which);
    shrink_w_[s] = {m.a_rows, m.a_rank, m.a_rows_bf16};
    expand_w_[s] = {m.bt_rows, m.rank, 0, m.scale, m.bt_rows_bf16};
    width = std::max(width, m.rank);
  }
  if (width == 0) return;  // no row's adapter targets this linear (every rank sees the same)
  // Rows outside every segment are summed too: zero them, so the buffer never accumulates.
  std::fill_n(v_.data(), static_cast<size_t>(n_rows * width), 0.0f);
  kernels::LoraShrink(segments_, shrink_w_, x, x_stride, LinearIn(config_, which), v_.data(), width,
                      pool);
  comm_->AllReduceSum(v_.data(), n_rows * width);
  const TpPart out = LoraTpPart(LinearOut(config_, which), comm_->rank(), comm_->size());
  kernels::LoraExpand(segments_, expand_w_, v_.data(), width, out.count, y + out.first, y_stride,
                      pool);
}

// q|k|v or gate|up under TP: each rank shrinks with its chunk of every member's rank rows (the
// local fused A); the all-gather brings every rank's chunks, which are put back in the whole
// fused order (member m's rank value j at fused_col_m + j), and each rank expands into its own
// output rows with Bᵀ of all r rows.
void LoraHook::ApplyGroupSplit(int64_t layer, model::LinearGroup group,
                               std::span<const Target> targets, const float* x, int64_t x_stride,
                               int64_t n_rows, ThreadPool* pool) const {
  const std::span<const model::Linear> members = model::LinearGroupMembers(group);
  CHORUS_CHECK_EQ(targets.size(), members.size()) << "ApplyGroup needs the whole group";
  const int size = comm_->size();
  const size_t n_slots = slots_.size();
  // A row of the local shrink holds at most Σ ceil(r_m / N) values: the width every rank sends.
  int64_t width = 0;
  for (size_t s = 0; s < n_slots; ++s) {
    const LoraView::Fused& f = slots_[s]->fused(layer, group);
    shrink_w_[s] = {f.a_rows, f.rank, f.a_rows_bf16};
    int64_t most = 0;
    for (model::Linear m : members) most += (slots_[s]->module(layer, m).rank + size - 1) / size;
    width = std::max(width, most);
  }
  if (width == 0) return;
  const auto per_rank = static_cast<size_t>(n_rows * width);
  if (local_.size() < per_rank) local_.assign(per_rank, 0.0f);
  if (gathered_.size() < per_rank * static_cast<size_t>(size))
    gathered_.assign(per_rank * static_cast<size_t>(size), 0.0f);
  kernels::LoraShrink(segments_, shrink_w_, x, x_stride, LinearIn(config_, members[0]),
                      local_.data(), width, pool);
  comm_->AllGather(local_.data(), n_rows * width, gathered_.data());
  // Each rank's chunk of member m sits after its chunks of the members before m.
  for (const kernels::LoraSegment& seg : segments_) {
    const LoraView& a = *slots_[static_cast<size_t>(seg.slot)];
    for (int p = 0; p < size; ++p) {
      int64_t src_col = 0;
      for (model::Linear m : members) {
        const LoraView::Module& mod = a.module(layer, m);
        const TpPart chunk = LoraTpPart(mod.rank, p, size);
        for (int64_t i = seg.row_begin; i < seg.row_end; ++i) {
          const float* src = gathered_.data() + static_cast<size_t>(p) * per_rank +
                             static_cast<size_t>(i * width + src_col);
          std::copy_n(src, chunk.count, v_.data() + i * v_stride_ + mod.fused_col + chunk.first);
        }
        src_col += chunk.count;
      }
    }
  }
  const GroupOuts outs = ExpandOuts(layer, members, targets);
  for (size_t t = 0; t < targets.size(); ++t) {
    kernels::LoraExpand(segments_, outs[t].weights, v_.data(), v_stride_, outs[t].out, outs[t].y,
                        outs[t].y_stride, pool);
  }
}

}  // namespace chorus::adapters
