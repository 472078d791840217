// LoraHook: the model::LinearHook that adds the LoRA terms of a step (docs/architecture.md, "The
// one equation"):
//   y[i, :] += s_a · (x[i, :]·A_aᵀ)·B_aᵀ     for every row i whose adapter a is set
// using the segment kernels (kernels/lora.h). Rows with equal adapters that are contiguous form
// one segment (the step planner sorts rows by adapter; unsorted rows still work, as more
// segments). Rows without an adapter cost nothing.
//
// Fused shrinks: the linears of one model::LinearGroup (q|k|v, gate|up) read the same input, so
// ApplyGroup() runs one shrink of rank Σ r over the group's concatenated A and every member's
// expand in one kernels::LoraShrinkExpand call. Apply() (a single linear) shrinks with that
// linear's own A.
//
// A row's adapter is any LoraView: the host-tier copy (LoraAdapter) or its copy in pool pages
// (PagedLora). Both hold the same values, so which one a step uses never changes its output.
//
// Under tensor parallelism (a communicator of size N > 1) every row's adapter is this rank's
// part of it (LoraAdapter::BuildShard: S-LoRA §6's split, docs/scaleout.md) and the hook adds the
// collectives that complete the term: for q|k|v and gate|up, each rank shrinks with its chunk of
// the rank rows and an all-gather assembles the whole shrink before each rank expands into its
// own output rows; for o and down, each rank's shrink is a partial sum over its input columns,
// an all-reduce completes it, and each rank expands into its own slice of the output columns,
// which the forward pass's all-reduce after o / down then sums with the base. Two collectives per
// group step with any adapter row, called identically on every rank (the rows' adapters come
// from the step plan, and a module's rank is known to every rank).
//
// Thread-safety: one thread (the engine thread) calls SetRows() and Forward::Run() with this
// hook; Apply() uses internal scratch and must not run concurrently with itself. Adapters set
// for a step must stay alive until the step ends.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "chorus/adapters/lora/lora_adapter.h"
#include "chorus/dist/communicator.h"
#include "chorus/kernels/lora.h"
#include "chorus/model/forward.h"

namespace chorus::adapters {

class LoraHook : public model::LinearHook {
 public:
  // `base` is the config the adapters were built for (under TP: this rank's shard config);
  // buffers hold steps of up to `max_rows`. `comm` (may be null: one process) is the forward
  // pass's communicator; of size N > 1, the adapters must be parts of that split.
  LoraHook(const model::ModelConfig& base, int64_t max_rows, dist::Communicator* comm = nullptr);

  // Sets the adapter of every row of the next step(s): row_adapters[i] for row i, nullptr = base
  // model only. Errors (nothing changed): more rows than max_rows, an adapter built for a model
  // with another layer count, or for another part of the tensor-parallel split than this rank's.
  // Grows the shrink buffer when a larger rank first appears (not per step).
  Status SetRows(std::span<const LoraView* const> row_adapters);
  Status SetRows(std::span<const LoraAdapter* const> row_adapters);
  // No adapter rows (the hook then does nothing).
  void Clear();

  // The segments of the current step (for tests and metrics).
  std::span<const kernels::LoraSegment> segments() const { return segments_; }
  // Distinct adapters of the current step, indexed by segment slot.
  std::span<const LoraView* const> slots() const { return slots_; }

  void Apply(int64_t layer, model::Linear which, const float* x, int64_t x_stride, float* y,
             int64_t y_stride, int64_t n_rows, ThreadPool* pool) const override;
  // The group's shrink and every member's expand in one kernels::LoraShrinkExpand call.
  // Requires: `targets` are the members of `group` in LinearGroupMembers() order.
  void ApplyGroup(int64_t layer, model::LinearGroup group, std::span<const Target> targets,
                  const float* x, int64_t x_stride, int64_t n_rows,
                  ThreadPool* pool) const override;

 private:
  using GroupOuts = std::array<kernels::LoraExpandOut, kernels::kMaxLoraExpandOuts>;
  // Each target's expand table over the step's slots (in group_expand_w_) and output.
  GroupOuts ExpandOuts(int64_t layer, std::span<const model::Linear> members,
                       std::span<const Target> targets) const;
  bool split() const { return comm_ != nullptr && comm_->size() > 1; }
  void ApplySplit(int64_t layer, model::Linear which, const float* x, int64_t x_stride, float* y,
                  int64_t y_stride, int64_t n_rows, ThreadPool* pool) const;
  void ApplyGroupSplit(int64_t layer, model::LinearGroup group, std::span<const Target> targets,
                       const float* x, int64_t x_stride, int64_t n_rows, ThreadPool* pool) const;

  model::ModelConfig config_;
  dist::Communicator* comm_ = nullptr;
  int64_t max_rows_ = 0;
  int64_t n_rows_ = 0;  // rows of the current step
  std::vector<kernels::LoraSegment> segments_;
  std::vector<const LoraView*> slots_;
  std::vector<const LoraView*> convert_;  // SetRows(LoraAdapter) scratch
  int64_t v_stride_ = 0;
  // Scratch (Apply is const for the LinearHook interface; the hook is single-threaded).
  mutable std::vector<float> v_;                             // [max_rows, v_stride_] shrink output
  mutable std::vector<kernels::LoraShrinkWeight> shrink_w_;  // [slots]
  mutable std::vector<kernels::LoraExpandWeight> expand_w_;  // [slots]
  // ApplyGroup: one expand table per output of the group.
  mutable std::array<std::vector<kernels::LoraExpandWeight>, kernels::kMaxLoraExpandOuts>
      group_expand_w_;
  // Under TP: this rank's chunks of a fused shrink [rows, w] and every rank's, gathered.
  mutable std::vector<float> local_, gathered_;
};

}  // namespace chorus::adapters
