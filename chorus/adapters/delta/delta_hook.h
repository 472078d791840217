// The delta kind's per-row term (docs/variants.md, docs/deltas.md): a model::LinearHook that adds
//   y[i, :] += x[i, :]·Δ̃_{delta(i)}ᵀ     for every row i whose delta is set
// with the SBMM segment kernel (kernels/delta.h), reading each delta's packed codes in place.
// Rows of other kinds (LoRA) and of the base model carry no term here (adapters::VariantHook
// adds every kind's hook), so a step can mix deltas, LoRA adapters and the base.
//
// Only the linear matrices of a delta are served this way; a delta whose non-matrix tensors
// (norms, embeddings, output head) differ from the base's (its `extras`) changes more than the
// one equation and is refused by DeltaWeights::Build (kUnimplemented, naming the tensor).
//
// Thread-safety: DeltaWeights is immutable after Build and shared; a DeltaHook is used by one
// thread per step (SetRows, then Forward::Run).
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "chorus/adapters/delta/delta_file.h"
#include "chorus/kernels/delta.h"
#include "chorus/model/forward.h"

namespace chorus::delta {

// One delta's matrices as kernel views, by (layer, linear), over a Delta it keeps alive.
class DeltaWeights {
 public:
  // Maps every matrix to its (layer, linear) of `base` and checks shapes and layouts. Errors
  // name the tensor: a matrix that is not a layer linear, a shape that does not match, extras.
  static Result<std::shared_ptr<const DeltaWeights>> Build(std::shared_ptr<const Delta> d,
                                                           const model::ModelConfig& base,
                                                           const std::string& name);
  const kernels::DeltaMatrixView& at(int64_t layer, model::Linear which) const {
    return views_[static_cast<size_t>(layer * model::kNumLinears + static_cast<int>(which))];
  }
  int64_t n_layers() const { return n_layers_; }
  const std::string& name() const { return name_; }
  const Delta& delta() const { return *delta_; }

 private:
  std::shared_ptr<const Delta> delta_;
  std::vector<kernels::DeltaMatrixView> views_;  // [n_layers × kNumLinears]; rows 0 = none
  int64_t n_layers_ = 0;
  std::string name_;
};

// Reads a delta file or directory (ReadDelta), checks it was made against the base whose
// BaseWeightsHash() is `base_hash` (unless empty: kFailedPrecondition naming both hashes), and
// builds its kernel views. Errors start with the path.
Result<std::shared_ptr<const DeltaWeights>> LoadDeltaWeights(const std::string& path,
                                                             const model::ModelConfig& base,
                                                             const std::string& base_hash,
                                                             const std::string& name);
// Bytes a loaded delta holds (its packed matrices).
int64_t DeltaWeightsBytes(const DeltaWeights& w);

class DeltaHook : public model::LinearHook {
 public:
  explicit DeltaHook(int64_t max_rows);
  // The delta of every row of the next step (null = none), as LoraHook::SetRows. Errors
  // (nothing changed): more rows than max_rows.
  Status SetRows(std::span<const DeltaWeights* const> row_deltas);
  bool empty() const { return segments_.empty(); }

  void Apply(int64_t layer, model::Linear which, const float* x, int64_t x_stride, float* y,
             int64_t y_stride, int64_t n_rows, ThreadPool* pool) const override;

 private:
  int64_t max_rows_;
  std::vector<kernels::LoraSegment> segments_;
  std::vector<const DeltaWeights*> slots_;
  mutable std::vector<kernels::DeltaMatrixView> table_;  // [slots] of the current linear
};

}  // namespace chorus::delta
