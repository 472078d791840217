#include "chorus/adapters/delta/delta_hook.h"

#include <cstring>
#include <map>

#include "chorus/kernels/ops.h"

namespace chorus::delta {

Result<std::shared_ptr<const DeltaWeights>> DeltaWeights::Build(std::shared_ptr<const Delta> d,
                                                                const model::ModelConfig& base,
                                                                const std::string& name) {
  std::vector<int64_t> matrix_of_view;
  CHORUS_ASSIGN_OR_RETURN(auto w, BuildViews(std::move(d), base, name, &matrix_of_view));
  return std::shared_ptr<const DeltaWeights>(std::move(w));
}

Result<std::shared_ptr<const DeltaWeights>> DeltaWeights::Build(
    Delta d, const model::ModelConfig& base, const std::string& name,
    std::shared_ptr<memory::HostArena> arena, std::string identity) {
  auto owned = std::make_shared<Delta>(std::move(d));
  std::vector<int64_t> matrix_of_view;
  CHORUS_ASSIGN_OR_RETURN(auto w, BuildViews(owned, base, name, &matrix_of_view));
  w->identity_ = std::move(identity);
  w->MoveToStreamedBuffer(*owned, matrix_of_view, std::move(arena));
  return std::shared_ptr<const DeltaWeights>(std::move(w));
}

Result<std::shared_ptr<const DeltaWeights>> DeltaWeights::Build(
    MappedDelta m, const model::ModelConfig& base, const std::string& name,
    std::shared_ptr<memory::HostArena> arena, std::string identity) {
  if (m.in_file.size() != m.delta.matrices.size())
    return InvalidArgumentError("delta '" + name + "': not read by ReadDeltaMapped");
  auto owned = std::make_shared<Delta>(std::move(m.delta));
  std::vector<int64_t> matrix_of_view;
  CHORUS_ASSIGN_OR_RETURN(auto w, BuildViews(owned, base, name, &matrix_of_view, &m.in_file));
  w->identity_ = std::move(identity);
  // Every view now points into the buffer; the file's mapping goes with `m`.
  w->MoveToStreamedBuffer(*owned, matrix_of_view, std::move(arena));
  return std::shared_ptr<const DeltaWeights>(std::move(w));
}

Result<DeltaWeights::Summary> DeltaWeights::Check(MappedDelta m, const model::ModelConfig& base,
                                                  const std::string& name) {
  if (m.in_file.size() != m.delta.matrices.size())
    return InvalidArgumentError("delta '" + name + "': not read by ReadDeltaMapped");
  auto d = std::make_shared<const Delta>(std::move(m.delta));
  std::vector<int64_t> matrix_of_view;
  CHORUS_ASSIGN_OR_RETURN(auto w, BuildViews(d, base, name, &matrix_of_view, &m.in_file,
                                             /*kept_positions=*/false));
  Summary s;
  s.base_source = d->base_source;
  for (int li = 0; li < model::kNumLinears; ++li) {
    for (int64_t l = 0; l < w->n_layers(); ++l) {
      if (w->at(l, static_cast<model::Linear>(li)).rows > 0) {
        s.linears.push_back(static_cast<model::Linear>(li));
        break;
      }
    }
  }
  return s;  // the views pointed into m's mapping; they go with w
}

void DeltaWeights::MoveToStreamedBuffer(Delta& owned, const std::vector<int64_t>& matrix_of_view,
                                        std::shared_ptr<memory::HostArena> arena) {
  // Each array starts on a cache line.
  auto line = [](int64_t bytes) { return (bytes + 63) / 64 * 64; };
  auto sizes = [](const kernels::DeltaMatrixView& v) {
    struct {
      int64_t codes, mask, positions, scales;
    } s{v.rows * v.code_row_bytes(), v.rows * v.mask_row_bytes(),
        v.positions != nullptr ? v.rows * v.position_row_words() * 8 : 0, v.n_scales() * 4};
    return s;
  };
  int64_t total = 0;
  for (const kernels::DeltaMatrixView& v : views_) {
    if (v.rows == 0) continue;
    const auto s = sizes(v);
    total += line(s.codes) + line(s.mask) + line(s.positions) + line(s.scales);
  }
  if (total == 0) return;
  // The arena's chunks are already resident (prefaulted, or touched by an earlier copy); on the
  // VMs Chorus runs on a first touch costs more than the copy itself (memory/host_arena.h).
  streamed_ = memory::HostBuffer(static_cast<size_t>(total), std::move(arena), "delta matrices");
  uint8_t* at = static_cast<uint8_t*>(streamed_.data());
  auto move = [&](const void* from, int64_t bytes) {
    std::memcpy(at, from, static_cast<size_t>(bytes));
    uint8_t* to = at;
    at += line(bytes);
    return to;
  };
  for (size_t k = 0; k < views_.size(); ++k) {
    kernels::DeltaMatrixView& v = views_[k];
    if (v.rows == 0) continue;
    const auto s = sizes(v);
    v.codes = move(v.codes, s.codes);
    if (v.mask != nullptr) v.mask = move(v.mask, s.mask);
    if (v.positions != nullptr)
      v.positions = reinterpret_cast<const uint64_t*>(move(v.positions, s.positions));
    v.scales = reinterpret_cast<const float*>(move(v.scales, s.scales));
    // Free this matrix's copies now, so the peak is one matrix above the buffer.
    PackedMatrix& p = owned.matrices[static_cast<size_t>(matrix_of_view[k])].packed;
    std::vector<uint8_t>().swap(p.codes);
    std::vector<uint8_t>().swap(p.mask);
    std::vector<float>().swap(p.scales);
  }
  std::vector<std::vector<uint64_t>>().swap(positions_);
}

Result<std::shared_ptr<DeltaWeights>> DeltaWeights::BuildViews(
    std::shared_ptr<const Delta> d, const model::ModelConfig& base, const std::string& name,
    std::vector<int64_t>* matrix_of_view, const std::vector<MappedDelta::Bytes>* in_file,
    bool kept_positions) {
  if (!d) return InvalidArgumentError("delta '" + name + "': no delta");
  auto w = std::shared_ptr<DeltaWeights>(new DeltaWeights());
  w->name_ = name;
  w->n_layers_ = base.n_layers;
  // Extras: the norms, the embeddings and the output head (docs/deltas.md "Serving").
  w->norms_.resize(static_cast<size_t>(base.n_layers * 2 + 1));
  std::map<std::string, size_t> norm_slot = {{"model.norm.weight", w->norms_.size() - 1}};
  for (int64_t l = 0; l < base.n_layers; ++l) {
    norm_slot[model::HfLayerNormName(l, false)] = static_cast<size_t>(2 * l);
    norm_slot[model::HfLayerNormName(l, true)] = static_cast<size_t>(2 * l + 1);
  }
  for (const ExtraDelta& e : d->extras) {
    const int64_t elements = e.shape.empty() ? 0 : [&] {
      int64_t p = 1;
      for (int64_t x : e.shape) p *= x;
      return p;
    }();
    auto shape_error = [&](const std::string& want) {
      return InvalidArgumentError("delta '" + name + "': " + e.name + " has " +
                                  std::to_string(elements) + " values, the base's has " + want);
    };
    if (auto it = norm_slot.find(e.name); it != norm_slot.end()) {
      if (e.shape.size() != 1 || elements != base.n_embd)
        return shape_error(std::to_string(base.n_embd));
      w->norms_[it->second] = e.Decode();
    } else if (e.name == "model.embed_tokens.weight" || e.name == "lm_head.weight") {
      if (e.shape.size() != 2 || e.shape[0] != base.vocab_size || e.shape[1] != base.n_embd)
        return shape_error(std::to_string(base.vocab_size) + " x " + std::to_string(base.n_embd));
      if (e.name == "lm_head.weight" && base.tie_embeddings) {
        return InvalidArgumentError("delta '" + name +
                                    "' changes lm_head.weight, but the base ties its output head "
                                    "to its embeddings");
      }
      (e.name == "lm_head.weight" ? w->output_ : w->embeddings_) = &e;
      if (base.tie_embeddings) w->output_ = &e;
    } else {
      return UnimplementedError("delta '" + name + "' changes " + e.name +
                                ", which serving cannot apply (it serves the layer linears, the "
                                "norms, the embeddings and the output head)");
    }
    w->has_extras_ = true;
  }
  w->views_.resize(static_cast<size_t>(base.n_layers * model::kNumLinears));
  matrix_of_view->assign(w->views_.size(), -1);
  std::map<std::string, std::pair<int64_t, model::Linear>> where;
  for (int64_t l = 0; l < base.n_layers; ++l) {
    for (int li = 0; li < model::kNumLinears; ++li) {
      const auto which = static_cast<model::Linear>(li);
      where[model::HfLayerTensorName(l, which)] = {l, which};
    }
  }
  for (size_t mi = 0; mi < d->matrices.size(); ++mi) {
    const MatrixDelta& m = d->matrices[mi];
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
    const auto slot = static_cast<size_t>(layer * model::kNumLinears + static_cast<int>(which));
    if ((*matrix_of_view)[slot] >= 0)
      return InvalidArgumentError("delta '" + name + "': " + m.name + " appears twice");
    (*matrix_of_view)[slot] = static_cast<int64_t>(mi);
    kernels::DeltaMatrixView& v = w->views_[slot];
    v.rows = l.rows;
    v.cols = l.cols;
    v.bits = l.bits;
    v.sparse24 = l.sparse24;
    v.group_size = l.group_size;
    // Where the codes and patterns are: d's vectors, or the mapped file.
    static const MappedDelta::Bytes kInVectors;
    const MappedDelta::Bytes& held = in_file != nullptr ? (*in_file)[mi] : kInVectors;
    const auto codes = HeldBytes(held.codes, m.packed.codes);
    const auto mask = HeldBytes(held.mask, m.packed.mask);
    v.codes = codes.data();
    v.mask = l.sparse24 ? mask.data() : nullptr;
    v.scales = m.packed.scales.data();
    if (v.code_row_bytes() * v.rows != static_cast<int64_t>(codes.size()) ||
        v.mask_row_bytes() * v.rows != static_cast<int64_t>(mask.size()) ||
        static_cast<int64_t>(m.packed.scales.size()) != v.n_scales()) {
      return InvalidArgumentError("delta '" + name + "': " + m.name + ": packed sizes disagree");
    }
    if (v.sparse24 && kept_positions) {  // the int16 kernel's kept positions (kernels/delta.h)
      w->positions_.push_back(kernels::DeltaKeptPositions(v));
      v.positions = w->positions_.back().data();
    }
  }
  w->delta_ = std::move(d);
  return w;
}

namespace {

// ReadDeltaMapped, refusing a delta made against other base weights (unless base_hash is empty).
Result<MappedDelta> ReadDeltaMappedFor(const std::string& path, const std::string& base_hash) {
  CHORUS_ASSIGN_OR_RETURN(MappedDelta m, ReadDeltaMapped(path));
  if (!base_hash.empty() && m.delta.base_hash != base_hash) {
    return FailedPreconditionError(path + ": made against base weights " + m.delta.base_hash +
                                   ", but the served base is " + base_hash);
  }
  return m;
}

}  // namespace

Result<std::shared_ptr<const DeltaWeights>> LoadDeltaWeights(
    const std::string& path, const model::ModelConfig& base, const std::string& base_hash,
    const std::string& name, std::shared_ptr<memory::HostArena> arena, std::string identity) {
  CHORUS_ASSIGN_OR_RETURN(MappedDelta m, ReadDeltaMappedFor(path, base_hash));
  return DeltaWeights::Build(std::move(m), base, name, std::move(arena), std::move(identity));
}

Result<DeltaWeights::Summary> CheckDeltaFile(const std::string& path,
                                             const model::ModelConfig& base,
                                             const std::string& base_hash,
                                             const std::string& name) {
  CHORUS_ASSIGN_OR_RETURN(MappedDelta m, ReadDeltaMappedFor(path, base_hash));
  return DeltaWeights::Check(std::move(m), base, name);
}

void DeltaView::CopyAllButViews(const DeltaView& other) {
  delta_ = other.delta_;
  n_layers_ = other.n_layers_;
  name_ = other.name_;
  identity_ = other.identity_;
  norms_ = other.norms_;
  embeddings_ = other.embeddings_;
  output_ = other.output_;
  has_extras_ = other.has_extras_;
}

const std::vector<float>* DeltaView::norm(int64_t layer, model::LinearHook::Norm which) const {
  const size_t slot =
      which == model::LinearHook::Norm::kOutput
          ? norms_.size() - 1
          : static_cast<size_t>(2 * layer + (which == model::LinearHook::Norm::kFfn));
  return norms_[slot].empty() ? nullptr : &norms_[slot];
}

int64_t DeltaWeights::positions_bytes() const {
  int64_t bytes = 0;
  for (const kernels::DeltaMatrixView& v : views_)
    if (v.rows > 0 && v.positions != nullptr) bytes += v.rows * v.position_row_words() * 8;
  return bytes;
}

int64_t DeltaWeightsBytes(const DeltaWeights& w) {
  return w.delta().MatrixBytes() + w.delta().ExtraBytes() + w.positions_bytes();
}

namespace {

// Value (row, col) of an extra matrix as ExtraDelta::Decode gives it.
inline float ExtraAt(const ExtraDelta& e, int64_t cols, int64_t row, int64_t col) {
  const auto i = static_cast<size_t>(row * cols + col);
  return e.kind == ExtraDelta::Kind::kExactF32
             ? e.values[i]
             : static_cast<float>(e.q[i]) * e.row_scales[static_cast<size_t>(row)];
}

}  // namespace

DeltaHook::DeltaHook(int64_t max_rows, kernels::DeltaActivations activations)
    : max_rows_(max_rows), activations_(activations) {
  segments_.reserve(static_cast<size_t>(max_rows));
  slots_.reserve(static_cast<size_t>(max_rows));
  row_delta_.reserve(static_cast<size_t>(max_rows));
  table_.reserve(static_cast<size_t>(max_rows));
}

Status DeltaHook::SetRows(std::span<const DeltaView* const> row_deltas) {
  const int64_t n = static_cast<int64_t>(row_deltas.size());
  if (n > max_rows_) {
    return InvalidArgumentError("delta step of " + std::to_string(n) + " rows, max " +
                                std::to_string(max_rows_));
  }
  segments_.clear();
  slots_.clear();
  row_delta_.assign(row_deltas.begin(), row_deltas.end());
  any_extras_ = false;
  for (const DeltaView* d : row_deltas)
    any_extras_ = any_extras_ || (d != nullptr && d->has_extras());
  for (int64_t i = 0; i < n;) {
    const DeltaView* d = row_deltas[static_cast<size_t>(i)];
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
  kernels::DeltaApply(segments_, table_, x, x_stride, y, y_stride, pool, activations_);
}

void DeltaHook::AdjustEmbeddings(std::span<const int32_t> tokens, float* x, int64_t d) const {
  if (!any_extras_) return;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const DeltaView* w = RowDelta(static_cast<int64_t>(i));
    if (w == nullptr || w->embeddings() == nullptr) continue;
    // x = base row + Δ row: the same single rounding as the merged embedding W_b + Δ̃.
    float* row = x + static_cast<int64_t>(i) * d;
    for (int64_t k = 0; k < d; ++k) row[k] += ExtraAt(*w->embeddings(), d, tokens[i], k);
  }
}

void DeltaHook::AdjustNorm(int64_t layer, Norm which, std::span<const int32_t> rows, const float* x,
                           float* y, const float* base_weight, int64_t d, float eps) const {
  if (!any_extras_) return;
  for (size_t j = 0; j < rows.size(); ++j) {
    const DeltaView* w = RowDelta(rows[j]);
    const std::vector<float>* dw = w == nullptr ? nullptr : w->norm(layer, which);
    if (dw == nullptr) continue;
    // The norm with the merged weight, exactly as the dense reconstruction computes it.
    merged_.resize(static_cast<size_t>(d));
    for (int64_t k = 0; k < d; ++k)
      merged_[static_cast<size_t>(k)] = base_weight[k] + (*dw)[static_cast<size_t>(k)];
    kernels::RmsNorm(x + static_cast<int64_t>(rows[j]) * d, merged_.data(), 1, d, eps,
                     y + static_cast<int64_t>(j) * d);
  }
}

void DeltaHook::ApplyOutput(std::span<const int32_t> logit_rows, const float* h, int64_t d,
                            float* logits, int64_t vocab, ThreadPool* pool) const {
  if (!any_extras_) return;
  // Consecutive logit rows of one delta (the engine keeps a variant's rows together) share each
  // pass over its output-head rows: 32000 × 2048 int8 at the TinyLlama shape, read once per
  // group, not once per row.
  for (size_t j0 = 0; j0 < logit_rows.size();) {
    const DeltaView* w = RowDelta(logit_rows[j0]);
    size_t j1 = j0 + 1;
    while (j1 < logit_rows.size() && RowDelta(logit_rows[j1]) == w) ++j1;
    if (w != nullptr && w->output() != nullptr) {
      const ExtraDelta& e = *w->output();
      const float* x = h + static_cast<int64_t>(j0) * d;
      float* y = logits + static_cast<int64_t>(j0) * vocab;
      const auto n = static_cast<int64_t>(j1 - j0);
      // logits[v] += h · Δ_out[v]: threads split the vocabulary; each value is one dot whose
      // association does not depend on the split or on the other rows (kernels/ops.h).
      auto work = [&](int t, int nt) {
        int64_t begin, end;
        ThreadPool::Slice(vocab, t, nt, 16, &begin, &end);
        if (begin >= end) return;
        if (e.kind == ExtraDelta::Kind::kInt8Rows) {
          kernels::AddInt8RowDots(e.q.data() + begin * d, e.row_scales.data() + begin, end - begin,
                                  d, x, d, n, y + begin, vocab);
        } else {
          kernels::AddF32RowDots(e.values.data() + begin * d, end - begin, d, x, d, n, y + begin,
                                 vocab);
        }
      };
      if (pool == nullptr || pool->size() == 1) {
        work(0, 1);
      } else {
        pool->Run(work);
      }
    }
    j0 = j1;
  }
}

}  // namespace chorus::delta
