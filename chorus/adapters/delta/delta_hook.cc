#include "chorus/adapters/delta/delta_hook.h"

#include <map>

namespace chorus::delta {

Result<std::shared_ptr<const DeltaWeights>> DeltaWeights::Build(std::shared_ptr<const Delta> d,
                                                                const model::ModelConfig& base,
                                                                const std::string& name) {
  if (!d) return InvalidArgumentError("delta '" + name + "': no delta");
  if (!d->extras.empty()) {
    return UnimplementedError("delta '" + name + "' changes " + d->extras[0].name +
                              " (a non-matrix tensor); serving applies only the linear matrices");
  }
  auto w = std::shared_ptr<DeltaWeights>(new DeltaWeights());
  w->name_ = name;
  w->n_layers_ = base.n_layers;
  w->views_.resize(static_cast<size_t>(base.n_layers * model::kNumLinears));
  std::map<std::string, std::pair<int64_t, model::Linear>> where;
  for (int64_t l = 0; l < base.n_layers; ++l) {
    for (int li = 0; li < model::kNumLinears; ++li) {
      const auto which = static_cast<model::Linear>(li);
      where[model::HfLayerTensorName(l, which)] = {l, which};
    }
  }
  for (const MatrixDelta& m : d->matrices) {
    auto it = where.find(m.name);
    if (it == where.end()) {
      return UnimplementedError("delta '" + name + "': " + m.name +
                                " is not a linear of a layer; serving applies only those");
    }
    const auto [layer, which] = it->second;
    const MatrixLayout& l = m.packed.layout;
    const int64_t want_in = model::LinearIn(base, which);
    const int64_t want_out = model::LinearOut(base, which);
    if (l.rows != want_out || l.cols != want_in) {
      return InvalidArgumentError("delta '" + name + "': " + m.name + " is " +
                                  std::to_string(l.rows) + "x" + std::to_string(l.cols) +
                                  ", the base's " + std::to_string(want_out) + "x" +
                                  std::to_string(want_in));
    }
    CHORUS_RETURN_IF_ERROR(ValidateLayout(l, "delta '" + name + "': " + m.name));
    kernels::DeltaMatrixView& v =
        w->views_[static_cast<size_t>(layer * model::kNumLinears + static_cast<int>(which))];
    v.rows = l.rows;
    v.cols = l.cols;
    v.bits = l.bits;
    v.sparse24 = l.sparse24;
    v.group_size = l.group_size;
    v.codes = m.packed.codes.data();
    v.mask = l.sparse24 ? m.packed.mask.data() : nullptr;
    v.scales = m.packed.scales.data();
    if (v.code_row_bytes() * v.rows != static_cast<int64_t>(m.packed.codes.size()) ||
        v.mask_row_bytes() * v.rows != static_cast<int64_t>(m.packed.mask.size()) ||
        static_cast<int64_t>(m.packed.scales.size()) !=
            (l.group_size == 0 ? 1 : l.rows * v.groups())) {
      return InvalidArgumentError("delta '" + name + "': " + m.name + ": packed sizes disagree");
    }
  }
  w->delta_ = std::move(d);
  return std::shared_ptr<const DeltaWeights>(std::move(w));
}

Result<std::shared_ptr<const DeltaWeights>> LoadDeltaWeights(const std::string& path,
                                                             const model::ModelConfig& base,
                                                             const std::string& base_hash,
                                                             const std::string& name) {
  CHORUS_ASSIGN_OR_RETURN(Delta d, ReadDelta(path));
  if (!base_hash.empty() && d.base_hash != base_hash) {
    return FailedPreconditionError(path + ": made against base weights " + d.base_hash +
                                   ", but the served base is " + base_hash);
  }
  return DeltaWeights::Build(std::make_shared<const Delta>(std::move(d)), base, name);
}

int64_t DeltaWeightsBytes(const DeltaWeights& w) { return w.delta().MatrixBytes(); }

DeltaHook::DeltaHook(int64_t max_rows) : max_rows_(max_rows) {
  segments_.reserve(static_cast<size_t>(max_rows));
  slots_.reserve(static_cast<size_t>(max_rows));
  table_.reserve(static_cast<size_t>(max_rows));
}

Status DeltaHook::SetRows(std::span<const DeltaWeights* const> row_deltas) {
  const int64_t n = static_cast<int64_t>(row_deltas.size());
  if (n > max_rows_) {
    return InvalidArgumentError("delta step of " + std::to_string(n) + " rows, max " +
                                std::to_string(max_rows_));
  }
  segments_.clear();
  slots_.clear();
  for (int64_t i = 0; i < n;) {
    const DeltaWeights* d = row_deltas[static_cast<size_t>(i)];
    int64_t j = i + 1;
    while (j < n && row_deltas[static_cast<size_t>(j)] == d) ++j;
    if (d != nullptr) {
      int32_t slot = -1;
      for (size_t s = 0; s < slots_.size(); ++s)
        if (slots_[s] == d) slot = static_cast<int32_t>(s);
      if (slot < 0) {
        slot = static_cast<int32_t>(slots_.size());
        slots_.push_back(d);
      }
      segments_.push_back({i, j, slot});
    }
    i = j;
  }
  table_.resize(slots_.size());
  return OkStatus();
}

void DeltaHook::Apply(int64_t layer, model::Linear which, const float* x, int64_t x_stride,
                      float* y, int64_t y_stride, int64_t /*n_rows*/, ThreadPool* pool) const {
  if (segments_.empty()) return;
  for (size_t s = 0; s < slots_.size(); ++s) table_[s] = slots_[s]->at(layer, which);
  kernels::DeltaApply(segments_, table_, x, x_stride, y, y_stride, pool);
}

}  // namespace chorus::delta
