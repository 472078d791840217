// The delta kind's per-row term (docs/variants.md, docs/deltas.md): a model::LinearHook that adds
//   y[i, :] += x[i, :]·Δ̃_{delta(i)}ᵀ     for every row i whose delta is set
// with the SBMM segment kernel (kernels/delta.h), reading each delta's packed codes in place.
// Rows of other kinds (LoRA) and of the base model carry no term here (adapters::VariantHook
// adds every kind's hook), so a step can mix deltas, LoRA adapters and the base.
//
// A full fine-tune also changes the tensors that are not layer linears (its `extras`): the
// RMSNorm weights, the token embeddings and the output head. Those are served too, through the
// hook's non-linear seams (model::LinearHook::AdjustEmbeddings / AdjustNorm / ApplyOutput): a
// row's embedding gets its Δ row added, a norm of its variant is recomputed with the merged
// weight w + Δw, and its logits get h·Δ_outᵀ added (with tied embeddings the embedding Δ is the
// output's Δ too). Any other extra tensor (e.g. a bias) is refused by DeltaWeights::Build
// (kUnimplemented, naming it).
//
// Thread-safety: DeltaWeights is immutable after Build and shared; a DeltaHook is used by one
// thread per step (SetRows, then Forward::Run).
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "chorus/adapters/delta/delta_file.h"
#include "chorus/kernels/delta.h"
#include "chorus/memory/host_arena.h"
#include "chorus/model/forward.h"

namespace chorus::delta {

// What a step reads of one delta: its matrices as kernel views by (layer, linear), and its
// extras. Two copies implement it: the host copy (DeltaWeights, below) and the pool copy
// (PagedDelta, adapters/delta/paged_delta.h: the same values in pool pages, banded views), so
// the hook serves either, and a step may mix them.
class DeltaView {
 public:
  virtual ~DeltaView() = default;
  DeltaView(const DeltaView&) = delete;
  DeltaView& operator=(const DeltaView&) = delete;

  const kernels::DeltaMatrixView& at(int64_t layer, model::Linear which) const {
    return views_[static_cast<size_t>(layer * model::kNumLinears + static_cast<int>(which))];
  }
  int64_t n_layers() const { return n_layers_; }
  const std::string& name() const { return name_; }
  // Which registered delta these values are (the host cache's VariantId, as text): two copies
  // with the same non-empty identity hold the same values, so a pool copy made from one serves
  // the other. Empty for deltas built without a registration (tests, tools).
  const std::string& identity() const { return identity_; }
  // The delta read from its file: metadata, and the extras' values (a streamed host copy has
  // freed its matrices' vectors).
  const Delta& delta() const { return *delta_; }

  // The extras (null = unchanged): a norm's Δw [d], decoded (layer ignored for kOutput); the
  // embeddings' and the output head's Δ [vocab, d] as stored (exact f32 or int8 rows, decoded
  // row by row where used; the same tensor for both with tied embeddings).
  const std::vector<float>* norm(int64_t layer, model::LinearHook::Norm which) const;
  const ExtraDelta* embeddings() const { return embeddings_; }
  const ExtraDelta* output() const { return output_; }
  bool has_extras() const { return has_extras_; }

 protected:
  DeltaView() = default;
  // Everything of `other` but its matrix views (a pool copy sets its own); the extras are
  // shared through the Delta both hold.
  void CopyAllButViews(const DeltaView& other);

  std::shared_ptr<const Delta> delta_;
  std::vector<kernels::DeltaMatrixView> views_;  // [n_layers × kNumLinears]; rows 0 = none
  int64_t n_layers_ = 0;
  std::string name_;
  std::string identity_;
  std::vector<std::vector<float>> norms_;  // [n_layers × 2 + 1]: attn, ffn, …, output; {} = none
  const ExtraDelta* embeddings_ = nullptr;
  const ExtraDelta* output_ = nullptr;
  bool has_extras_ = false;
};

// The host copy of one delta: its matrices as kernel views over a Delta it keeps alive, or (as
// served) over one streamed buffer.
class DeltaWeights : public DeltaView {
 public:
  // Maps every matrix to its (layer, linear) of `base` and checks shapes and layouts. Errors
  // name the tensor: a matrix that is not a layer linear, a shape that does not match, extras.
  // The views point into d's own vectors (tests and tools that keep the Delta).
  static Result<std::shared_ptr<const DeltaWeights>> Build(std::shared_ptr<const Delta> d,
                                                           const model::ModelConfig& base,
                                                           const std::string& name);
  // What serving uses: the same checks and views, but every matrix's streamed bytes (codes, 2:4
  // patterns and kept positions, scales) move into one buffer and d's copies are freed, matrix
  // by matrix. The buffer comes from `arena` (the host tier's prefaulted arena, shared with
  // LoRA copies: memory/host_arena.h) when one is given and has a free run long enough, else
  // from fresh huge pages (base/large_alloc.h). A step reads each delta in its rows from DRAM;
  // with 4 KiB pages every few rows cost a TLB miss and the hardware prefetchers stop at each
  // page (docs/deltas.md "Serving").
  // `identity` becomes identity().
  static Result<std::shared_ptr<const DeltaWeights>> Build(
      Delta d, const model::ModelConfig& base, const std::string& name,
      std::shared_ptr<memory::HostArena> arena = nullptr, std::string identity = {});
  // The same from a delta whose codes and patterns are still in its mapped file
  // (ReadDeltaMapped): copied once, from the file into the buffer.
  static Result<std::shared_ptr<const DeltaWeights>> Build(
      MappedDelta m, const model::ModelConfig& base, const std::string& name,
      std::shared_ptr<memory::HostArena> arena = nullptr, std::string identity = {});
  // What registration learns of a delta: Build(MappedDelta)'s checks — every matrix mapped to a
  // layer linear of `base` with its shape and layout, the extras — without its copy into memory
  // (most of a load's time and ~120 MB for a TinyLlama-shape delta, only to be freed).
  struct Summary {
    std::string base_source;             // the base the delta was made from (its metadata)
    std::vector<model::Linear> linears;  // the linears it changes in some layer, in Linear order
  };
  static Result<Summary> Check(MappedDelta m, const model::ModelConfig& base,
                               const std::string& name);
  // Bytes of the 2:4 matrices' kept positions, derived at Build for the int16 kernel.
  int64_t positions_bytes() const;
  // Whether the matrices sit in one streamed buffer (the Build(Delta) and Build(MappedDelta)
  // overloads), and whether that buffer is in the host arena.
  bool streamed_buffer() const { return streamed_.data() != nullptr; }
  bool streamed_in_arena() const { return streamed_.in_arena(); }

 private:
  // The checks and views of the Build overloads; `matrix_of_view` gets, per view, the index of
  // its matrix in d->matrices (−1: none). With `in_file`, a matrix's codes and patterns are
  // read where in_file holds them (MappedDelta) rather than from d's vectors. Without
  // `kept_positions` the 2:4 views get none (Check: nothing will run them).
  static Result<std::shared_ptr<DeltaWeights>> BuildViews(
      std::shared_ptr<const Delta> d, const model::ModelConfig& base, const std::string& name,
      std::vector<int64_t>* matrix_of_view,
      const std::vector<MappedDelta::Bytes>* in_file = nullptr, bool kept_positions = true);
  // Copies the views' bytes into streamed_ (from `arena` when it has room), repoints them, and
  // frees the copies in `owned` (the Delta delta_ points to) and positions_.
  void MoveToStreamedBuffer(Delta& owned, const std::vector<int64_t>& matrix_of_view,
                            std::shared_ptr<memory::HostArena> arena);

  DeltaWeights() = default;

  std::vector<std::vector<uint64_t>> positions_;  // the 2:4 views' kept positions (until moved)
  memory::HostBuffer streamed_;
};

// Reads a delta file or directory (ReadDelta), checks it was made against the base whose
// BaseWeightsHash() is `base_hash` (unless empty: kFailedPrecondition naming both hashes), and
// builds its kernel views (in `arena` when given: Build). Errors start with the path.
// `identity` becomes identity().
Result<std::shared_ptr<const DeltaWeights>> LoadDeltaWeights(
    const std::string& path, const model::ModelConfig& base, const std::string& base_hash,
    const std::string& name, std::shared_ptr<memory::HostArena> arena = nullptr,
    std::string identity = {});
// The same checks, every byte of the file included, without building the views' copy: what
// registering a delta needs (adapters/registry.h), which then loads it only when it is used.
Result<DeltaWeights::Summary> CheckDeltaFile(const std::string& path,
                                             const model::ModelConfig& base,
                                             const std::string& base_hash, const std::string& name);
// Bytes a loaded delta holds (its packed matrices and their kept positions).
int64_t DeltaWeightsBytes(const DeltaWeights& w);

class DeltaHook : public model::LinearHook {
 public:
  // activations: how the delta term multiplies (kernels/delta.h); the default is the fastest
  // path this CPU has.
  explicit DeltaHook(int64_t max_rows,
                     kernels::DeltaActivations activations = kernels::DefaultDeltaActivations());
  // The delta of every row of the next step (null = none), as LoraHook::SetRows. Errors
  // (nothing changed): more rows than max_rows.
  Status SetRows(std::span<const DeltaView* const> row_deltas);
  bool empty() const { return segments_.empty(); }

  void Apply(int64_t layer, model::Linear which, const float* x, int64_t x_stride, float* y,
             int64_t y_stride, int64_t n_rows, ThreadPool* pool) const override;
  void AdjustEmbeddings(std::span<const int32_t> tokens, float* x, int64_t d) const override;
  void AdjustNorm(int64_t layer, Norm which, std::span<const int32_t> rows, const float* x,
                  float* y, const float* base_weight, int64_t d, float eps) const override;
  void ApplyOutput(std::span<const int32_t> logit_rows, const float* h, int64_t d, float* logits,
                   int64_t vocab, ThreadPool* pool) const override;

 private:
  // The delta of step row i (null: none).
  const DeltaView* RowDelta(int64_t i) const { return row_delta_[static_cast<size_t>(i)]; }

  int64_t max_rows_;
  kernels::DeltaActivations activations_;
  std::vector<const DeltaView*> row_delta_;  // [rows of the step]
  bool any_extras_ = false;
  mutable std::vector<float> merged_;  // a norm's w + Δw
  std::vector<kernels::LoraSegment> segments_;
  std::vector<const DeltaView*> slots_;
  mutable std::vector<kernels::DeltaMatrixView> table_;  // [slots] of the current linear
};

}  // namespace chorus::delta
