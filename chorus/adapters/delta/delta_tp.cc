#include "chorus/adapters/delta/delta_tp.h"

#include <algorithm>
#include <map>
#include <utility>

#include "chorus/adapters/delta/delta_codec.h"
#include "chorus/model/model.h"
#include "chorus/model/tensor_parallel.h"

namespace chorus::delta {
namespace {

// Rows [r0, r1) of `m`, every value as it was.
UnpackedMatrix SliceRows(const UnpackedMatrix& m, int64_t r0, int64_t r1) {
  const MatrixLayout& l = m.layout;
  UnpackedMatrix out;
  out.layout = l;
  out.layout.rows = r1 - r0;
  const int64_t kept = l.kept_per_row(), groups4 = l.sparse24 ? l.cols / 4 : 0;
  out.codes.assign(m.codes.begin() + r0 * kept, m.codes.begin() + r1 * kept);
  if (l.sparse24)
    out.patterns.assign(m.patterns.begin() + r0 * groups4, m.patterns.begin() + r1 * groups4);
  if (l.group_size == 0) {
    out.scales = m.scales;
  } else {
    const int64_t g = l.groups_per_row();
    out.scales.assign(m.scales.begin() + r0 * g, m.scales.begin() + r1 * g);
  }
  return out;
}

// Columns [c0, c1) of `m`; c0 and c1 on 2:4 and scale group boundaries (checked by the caller).
UnpackedMatrix SliceColumns(const UnpackedMatrix& m, int64_t c0, int64_t c1) {
  const MatrixLayout& l = m.layout;
  UnpackedMatrix out;
  out.layout = l;
  out.layout.cols = c1 - c0;
  const int64_t kept = l.kept_per_row();
  // Kept values of a 2:4 row are 2 per group of 4 columns, in column order.
  const int64_t k0 = l.sparse24 ? c0 / 2 : c0, k1 = l.sparse24 ? c1 / 2 : c1;
  for (int64_t r = 0; r < l.rows; ++r) {
    out.codes.insert(out.codes.end(), m.codes.begin() + r * kept + k0,
                     m.codes.begin() + r * kept + k1);
    if (l.sparse24) {
      const int64_t g4 = l.cols / 4;
      out.patterns.insert(out.patterns.end(), m.patterns.begin() + r * g4 + c0 / 4,
                          m.patterns.begin() + r * g4 + c1 / 4);
    }
    if (l.group_size != 0) {
      const int64_t g = l.groups_per_row();
      out.scales.insert(out.scales.end(), m.scales.begin() + r * g + c0 / l.group_size,
                        m.scales.begin() + r * g + (c1 + l.group_size - 1) / l.group_size);
    }
  }
  if (l.group_size == 0) out.scales = m.scales;
  return out;
}

}  // namespace

Result<Delta> ShardDelta(const Delta& d, const model::ModelConfig& full, int rank, int size) {
  if (size == 1) return d;
  CHORUS_ASSIGN_OR_RETURN(model::ModelConfig sc, model::ShardConfig(full, size));
  std::map<std::string, model::Linear> which_of;
  for (int64_t l = 0; l < full.n_layers; ++l) {
    for (int li = 0; li < model::kNumLinears; ++li)
      which_of[model::HfLayerTensorName(l, static_cast<model::Linear>(li))] =
          static_cast<model::Linear>(li);
  }
  Delta out = d;
  for (MatrixDelta& m : out.matrices) {
    auto it = which_of.find(m.name);
    if (it == which_of.end()) {
      return UnimplementedError(m.name + " is not a linear of a layer; serving applies only those");
    }
    const model::Linear which = it->second;
    CHORUS_ASSIGN_OR_RETURN(UnpackedMatrix u, Unpack(m.packed, m.name));
    if (u.layout.rows != model::LinearOut(full, which) ||
        u.layout.cols != model::LinearIn(full, which)) {
      return InvalidArgumentError(m.name + " is " + std::to_string(u.layout.rows) + "x" +
                                  std::to_string(u.layout.cols) + ", the base's " +
                                  std::to_string(model::LinearOut(full, which)) + "x" +
                                  std::to_string(model::LinearIn(full, which)));
    }
    if (which == model::Linear::kO || which == model::Linear::kDown) {
      const int64_t part = model::LinearIn(sc, which), c0 = rank * part, c1 = c0 + part;
      const int64_t align = std::max<int64_t>(u.layout.sparse24 ? 4 : 1, u.layout.group_size);
      if (c0 % align != 0 || (u.layout.sparse24 && part % 4 != 0) ||
          (u.layout.group_size != 0 && part % u.layout.group_size != 0)) {
        return InvalidArgumentError(
            m.name + " cannot be split for tensor parallelism into " + std::to_string(part) +
            " columns per rank: not whole groups of " + std::to_string(align) + " columns (" +
            (u.layout.sparse24 ? "2:4 sparsity, " : "") + "scale groups of " +
            std::to_string(u.layout.group_size) + "); compress with --group-size dividing " +
            std::to_string(part) + (u.layout.sparse24 ? " and no 2:4" : ""));
      }
      u = SliceColumns(u, c0, c1);
    } else {
      const int64_t part = model::LinearOut(sc, which);
      u = SliceRows(u, rank * part, (rank + 1) * part);
    }
    m.packed = Pack(u);
  }
  return out;
}

Result<std::shared_ptr<const DeltaWeights>> LoadDeltaWeightsShard(
    const std::string& path, const model::ModelConfig& full, const std::string& base_hash, int rank,
    int size, const std::string& name, std::shared_ptr<memory::HostArena> arena,
    std::string identity) {
  if (size == 1)
    return LoadDeltaWeights(path, full, base_hash, name, std::move(arena), std::move(identity));
  CHORUS_ASSIGN_OR_RETURN(Delta d, ReadDelta(path));
  if (!base_hash.empty() && d.base_hash != base_hash) {
    return FailedPreconditionError(path + ": made against base weights " + d.base_hash +
                                   ", but the served base is " + base_hash);
  }
  auto shard = ShardDelta(d, full, rank, size);
  if (!shard.ok()) return shard.status().WithContext(path);
  CHORUS_ASSIGN_OR_RETURN(model::ModelConfig sc, model::ShardConfig(full, size));
  auto w = DeltaWeights::Build(std::move(*shard), sc, name, std::move(arena), std::move(identity));
  if (!w.ok()) return w.status().WithContext(path);
  return w;
}

}  // namespace chorus::delta
