// VariantHook: the model::LinearHook of a step whose rows use variants of different kinds
// (docs/variants.md). Each kind supplies its own LinearHook over the step's rows — LoraHook for
// LoRA adapters; compressed deltas are the next kind — in which the rows of other kinds (and of
// the base model) carry no term. This hook adds every active kind's term. A row belongs to one
// variant and so to one kind: its term is added exactly once, whatever the order of the kinds,
// and a row's result does not depend on which other kinds share the step (batch invariance).
//
// Thread-safety: as its parts (one thread per step).
#pragma once

#include <span>
#include <vector>

#include "chorus/model/forward.h"

namespace chorus::adapters {

class VariantHook : public model::LinearHook {
 public:
  explicit VariantHook(int max_kinds = 4) { kinds_.reserve(static_cast<size_t>(max_kinds)); }

  // The kinds with rows in the next step (no allocation once reserved).
  void Clear() { kinds_.clear(); }
  void Add(const model::LinearHook* kind) { kinds_.push_back(kind); }
  bool empty() const { return kinds_.empty(); }

  void Apply(int64_t layer, model::Linear which, const float* x, int64_t x_stride, float* y,
             int64_t y_stride, int64_t n_rows, ThreadPool* pool) const override {
    for (const model::LinearHook* k : kinds_)
      k->Apply(layer, which, x, x_stride, y, y_stride, n_rows, pool);
  }
  void ApplyGroup(int64_t layer, model::LinearGroup group, std::span<const Target> targets,
                  const float* x, int64_t x_stride, int64_t n_rows,
                  ThreadPool* pool) const override {
    for (const model::LinearHook* k : kinds_)
      k->ApplyGroup(layer, group, targets, x, x_stride, n_rows, pool);
  }
  void AdjustEmbeddings(std::span<const int32_t> tokens, float* x, int64_t d) const override {
    for (const model::LinearHook* k : kinds_) k->AdjustEmbeddings(tokens, x, d);
  }
  void AdjustNorm(int64_t layer, Norm which, std::span<const int32_t> rows, const float* x,
                  float* y, const float* base_weight, int64_t d, float eps) const override {
    for (const model::LinearHook* k : kinds_)
      k->AdjustNorm(layer, which, rows, x, y, base_weight, d, eps);
  }
  void ApplyOutput(std::span<const int32_t> logit_rows, const float* h, int64_t d, float* logits,
                   int64_t vocab, ThreadPool* pool) const override {
    for (const model::LinearHook* k : kinds_) k->ApplyOutput(logit_rows, h, d, logits, vocab, pool);
  }

 private:
  std::vector<const model::LinearHook*> kinds_;
};

}  // namespace chorus::adapters
