#include "chorus/model/step_builder.h"

#include "chorus/base/check.h"

namespace chorus::model {

StepBuilder::StepBuilder(int64_t max_rows, int64_t max_seqs)
    : max_rows_(max_rows), max_seqs_(max_seqs) {
  tokens_.reserve(static_cast<size_t>(max_rows));
  positions_.reserve(static_cast<size_t>(max_rows));
  seq_.reserve(static_cast<size_t>(max_rows));
  tables_.reserve(static_cast<size_t>(max_seqs));
  logit_rows_.reserve(static_cast<size_t>(max_rows + max_seqs));
  hidden_rows_.reserve(static_cast<size_t>(max_rows));
}

void StepBuilder::Clear() {
  tokens_.clear();
  positions_.clear();
  seq_.clear();
  tables_.clear();
  logit_rows_.clear();
  hidden_rows_.clear();
}

int32_t StepBuilder::AddSequence(std::span<const int32_t> tokens, int64_t first_pos,
                                 const int32_t* table, bool want_logits,
                                 std::pair<int64_t, int64_t> logit_range,
                                 std::pair<int64_t, int64_t> hidden_range) {
  CHORUS_CHECK(!tokens.empty());
  const auto n = static_cast<int64_t>(tokens.size());
  CHORUS_CHECK(0 <= logit_range.first && logit_range.first <= logit_range.second &&
               logit_range.second <= n - (want_logits ? 1 : 0));
  CHORUS_CHECK(0 <= hidden_range.first && hidden_range.first <= hidden_range.second &&
               hidden_range.second <= n);
  CHORUS_CHECK(rows() + static_cast<int64_t>(tokens.size()) <= max_rows_);
  CHORUS_CHECK(seqs() < max_seqs_);
  const auto index = static_cast<int32_t>(tables_.size());
  tables_.push_back(table);
  for (size_t j = 0; j < tokens.size(); ++j) {
    tokens_.push_back(tokens[j]);
    positions_.push_back(static_cast<int32_t>(first_pos + static_cast<int64_t>(j)));
    seq_.push_back(index);
  }
  const int64_t row0 = rows() - n;
  for (int64_t j = logit_range.first; j < logit_range.second; ++j)
    logit_rows_.push_back(static_cast<int32_t>(row0 + j));
  if (want_logits) logit_rows_.push_back(static_cast<int32_t>(tokens_.size() - 1));
  for (int64_t j = hidden_range.first; j < hidden_range.second; ++j)
    hidden_rows_.push_back(static_cast<int32_t>(row0 + j));
  return index;
}

StepInput StepBuilder::Input(const LinearHook* hook) const {
  StepInput in{tokens_, positions_, seq_, tables_, logit_rows_};
  in.hook = hook;
  in.hidden_rows = hidden_rows_;
  return in;
}

}  // namespace chorus::model
