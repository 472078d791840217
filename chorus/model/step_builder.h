// StepBuilder: the one place that turns "these rows of these sequences" into the arrays of a
// forward step (model::StepInput): token ids, positions, each row's sequence index, the
// sequences' KV block tables and the rows whose logits are wanted. The engine, `chorus bench`
// and tests build their steps with it.
//
// Storage is reserved at construction for `max_rows` rows and `max_seqs` sequences, so building
// a step allocates nothing (the engine builds one per step on its hot path).
//
// Thread-safety: none; one builder per step loop. Input() returns views into the builder, valid
// until the next Clear() or AddSequence().
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "chorus/model/forward.h"

namespace chorus::model {

class StepBuilder {
 public:
  StepBuilder(int64_t max_rows, int64_t max_seqs);

  // Starts a new step (keeps the storage).
  void Clear();

  // Appends the rows of one sequence: `tokens` at positions first_pos, first_pos + 1, ...;
  // `table` is its KV block table and must cover first_pos + tokens.size() tokens. With
  // `want_logits`, the logits of its last row are computed (in the order sequences are added),
  // and before them those of its rows [logit_range.first, logit_range.second) (indices into
  // `tokens`; prompt logprobs). The final-normed hidden states of its rows [hidden_range.first,
  // hidden_range.second) are wanted too (embeddings; StepInput::hidden_rows, in the order added).
  // Returns the sequence's index in the step.
  // Requires: tokens non-empty, rows() + tokens.size() <= max_rows, seqs() < max_seqs;
  // 0 <= logit_range.first <= logit_range.second <= tokens.size() (− 1 with want_logits);
  // 0 <= hidden_range.first <= hidden_range.second <= tokens.size().
  int32_t AddSequence(std::span<const int32_t> tokens, int64_t first_pos, const int32_t* table,
                      bool want_logits, std::pair<int64_t, int64_t> logit_range = {0, 0},
                      std::pair<int64_t, int64_t> hidden_range = {0, 0});

  // The step's arrays, with `hook` (null = base model only).
  StepInput Input(const LinearHook* hook = nullptr) const;

  int64_t rows() const { return static_cast<int64_t>(tokens_.size()); }
  int64_t seqs() const { return static_cast<int64_t>(tables_.size()); }
  int64_t logit_rows() const { return static_cast<int64_t>(logit_rows_.size()); }
  int64_t hidden_rows() const { return static_cast<int64_t>(hidden_rows_.size()); }

 private:
  int64_t max_rows_, max_seqs_;
  std::vector<int32_t> tokens_;         // [rows]
  std::vector<int32_t> positions_;      // [rows]
  std::vector<int32_t> seq_;            // [rows] index into tables_
  std::vector<const int32_t*> tables_;  // [seqs] not owned
  std::vector<int32_t> logit_rows_;     // [rows whose logits are wanted]
  std::vector<int32_t> hidden_rows_;    // [rows whose hidden states are wanted]
};

}  // namespace chorus::model
