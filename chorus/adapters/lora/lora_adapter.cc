#include "chorus/adapters/lora/lora_adapter.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "chorus/base/rng.h"
#include "chorus/memory/host_arena.h"
#include "chorus/model/convert.h"
#include "chorus/model/tensor_parallel.h"

namespace chorus::adapters {
namespace {

using model::Linear;

bool UsableDType(DType t) {
  return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16 || t == DType::kQ8_0 ||
         t == DType::kQ4_0;
}

// Rope pairs are permuted within heads of q (n_heads) and k (n_kv_heads); others keep order.
int64_t RopeHeads(const model::ModelConfig& c, Linear which) {
  if (which == Linear::kQ) return c.n_heads;
  if (which == Linear::kK) return c.n_kv_heads;
  return 0;
}

// lora_B in the base's pair order.
Tensor BInBaseOrder(const LoraWeights& w, const model::ModelConfig& c, Linear which,
                    const Tensor& b) {
  const int64_t heads = RopeHeads(c, which);
  if (heads == 0 || w.qk_layout == c.rope_layout) return b;
  return model::PermuteRopeRows(b, heads, c.head_dim, w.qk_layout, c.rope_layout);
}

Status NonFiniteError(const std::string& what, float v, int64_t element) {
  std::ostringstream os;
  os << what << " holds a non-finite value (" << v << " at element " << element << ")";
  return InvalidArgumentError(os.str());
}

// One pass over a row of f32 values: copies them into `dst` in the storage type (bf16: rounded
// to nearest even, as F32ToBF16) and tells whether every value is finite. The finiteness test
// and the rounding work on the bit patterns, so the loop has no branch and vectorizes; for
// finite inputs the rounding equals F32ToBF16's.
bool EmitF32Row(const float* src, int64_t n, LoraStorage st, void* dst) {
  uint32_t bad = 0;
  if (st == LoraStorage::kF32) {
    auto* d = static_cast<float*>(dst);
    for (int64_t i = 0; i < n; ++i) {
      uint32_t u;
      std::memcpy(&u, src + i, 4);
      bad |= static_cast<uint32_t>((u & 0x7f800000u) == 0x7f800000u);
      d[i] = src[i];
    }
  } else {
    auto* d = static_cast<uint16_t*>(dst);
    for (int64_t i = 0; i < n; ++i) {
      uint32_t u;
      std::memcpy(&u, src + i, 4);
      bad |= static_cast<uint32_t>((u & 0x7f800000u) == 0x7f800000u);
      d[i] = static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
  }
  return bad == 0;
}

// The same for a row of bf16 values (exact in either storage type).
bool EmitBF16Row(const uint16_t* src, int64_t n, LoraStorage st, void* dst) {
  uint32_t bad = 0;
  if (st == LoraStorage::kBF16) {
    auto* d = static_cast<uint16_t*>(dst);
    for (int64_t i = 0; i < n; ++i) {
      bad |= static_cast<uint32_t>((src[i] & 0x7f80u) == 0x7f80u);
      d[i] = src[i];
    }
  } else {
    auto* d = static_cast<uint32_t*>(dst);
    for (int64_t i = 0; i < n; ++i) {
      bad |= static_cast<uint32_t>((src[i] & 0x7f80u) == 0x7f80u);
      d[i] = static_cast<uint32_t>(src[i]) << 16;
    }
  }
  return bad == 0;
}

// Row `row` of the 2-D tensor `t` as f32: the tensor's own bytes for f32, else decoded into
// `scratch` (at least cols() floats).
const float* RowAsF32(const Tensor& t, int64_t row, float* scratch) {
  const TensorView& v = t.view();
  if (t.dtype() == DType::kF32) return reinterpret_cast<const float*>(v.Row(row));
  DequantizeRow(t.dtype(), v.Row(row), scratch, v.cols());
  return scratch;
}

// Index of the first non-finite value of `v[0..n)` (n when none).
int64_t FirstNonFinite(const float* v, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(v[i])) return i;
  }
  return n;
}

// Source row of lora_B (file pair order `from`) that lands at row `o` in the base's order `to`
// (model::PermuteRopeRows moves whole rows the same way).
int64_t RopeSourceRow(int64_t o, int64_t head_dim, kernels::RopeLayout from,
                      kernels::RopeLayout to) {
  if (from == to) return o;
  const int64_t h = o / head_dim, i = o % head_dim, half = head_dim / 2;
  if (to == kernels::RopeLayout::kHalf) {  // interleaved → rotate-half
    return h * head_dim + (i < half ? 2 * i : 2 * (i - half) + 1);
  }
  return h * head_dim + (i % 2 == 0 ? i / 2 : i / 2 + half);  // rotate-half → interleaved
}

// Rows [row0, row0 + rows) and columns [col0, col0 + cols) of lora_A [r, in] → the compute
// copy's rows (same order), checked, converted, in one pass. Error positions are elements of the
// whole tensor.
Status EmitA(const Tensor& a, int64_t row0, int64_t rows, int64_t col0, int64_t cols,
             LoraStorage st, void* dst, std::vector<float>* scratch, const std::string& what) {
  const int64_t in = a.shape()[1];
  const int64_t eb = st == LoraStorage::kBF16 ? 2 : 4;
  scratch->resize(static_cast<size_t>(in));
  for (int64_t j = 0; j < rows; ++j) {
    void* d = static_cast<uint8_t*>(dst) + j * cols * eb;
    bool ok;
    const float* f = nullptr;
    if (a.dtype() == DType::kBF16) {
      ok = EmitBF16Row(reinterpret_cast<const uint16_t*>(a.view().Row(row0 + j)) + col0, cols, st,
                       d);
    } else {
      f = RowAsF32(a, row0 + j, scratch->data());
      ok = EmitF32Row(f + col0, cols, st, d);
    }
    if (!ok) {
      if (f == nullptr) f = RowAsF32(a, row0 + j, scratch->data());
      const int64_t k = FirstNonFinite(f + col0, cols);
      return NonFiniteError(what, f[col0 + k], (row0 + j) * in + col0 + k);
    }
  }
  return OkStatus();
}

// Rows [row0, row0 + out) of lora_B [*, r] (rows in pair order `from`) → Bᵀ [r, out] in the
// base's order `to`, checked and converted (row0 is a multiple of head_dim when rows are
// permuted: the permutation stays inside heads). Tiles of kTile rows of B are decoded into a
// small f32 buffer (L1-resident) and written out as kTile-wide runs of each Bᵀ row, so neither
// side is walked with a large stride.
Status EmitBt(const Tensor& b, int64_t row0, int64_t out, int64_t rope_heads, int64_t head_dim,
              kernels::RopeLayout from, kernels::RopeLayout to, LoraStorage st, void* dst,
              std::vector<float>* scratch, const std::string& what) {
  constexpr int64_t kTile = 32;
  const int64_t r = b.shape()[1];
  scratch->resize(static_cast<size_t>((kTile + 1) * r));
  float* tile = scratch->data();      // [kTile, r]
  float* row_buf = tile + kTile * r;  // one decoded row
  const bool permute = rope_heads > 0 && from != to;
  for (int64_t o0 = 0; o0 < out; o0 += kTile) {
    const int64_t nb = std::min(kTile, out - o0);
    for (int64_t k = 0; k < nb; ++k) {
      const int64_t o = row0 + o0 + k;
      const int64_t src = permute ? RopeSourceRow(o, head_dim, from, to) : o;
      const float* f = RowAsF32(b, src, row_buf);
      float* t = tile + k * r;
      uint32_t bad = 0;
      for (int64_t j = 0; j < r; ++j) {
        uint32_t u;
        std::memcpy(&u, f + j, 4);
        bad |= static_cast<uint32_t>((u & 0x7f800000u) == 0x7f800000u);
        t[j] = f[j];
      }
      if (bad != 0) {
        const int64_t j = FirstNonFinite(t, r);
        return NonFiniteError(what, t[j], o * r + j);  // index in the base-order [out, r]
      }
    }
    for (int64_t j = 0; j < r; ++j) {
      if (st == LoraStorage::kBF16) {
        uint16_t* d = static_cast<uint16_t*>(dst) + j * out + o0;
        for (int64_t k = 0; k < nb; ++k) {
          uint32_t u;
          std::memcpy(&u, tile + k * r + j, 4);
          d[k] = static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
        }
      } else {
        float* d = static_cast<float*>(dst) + j * out + o0;
        for (int64_t k = 0; k < nb; ++k) d[k] = tile[k * r + j];
      }
    }
  }
  return OkStatus();
}

// What one module's compute copy holds of its A and B (LoraView::Module): A rows [a_first,
// a_first + a_rows) × columns [a_col0, a_col0 + in); B rows [b_first, b_first + out), all r
// columns, written to output columns from out_first.
struct ModulePart {
  int64_t a_first = 0, a_rows = 0, a_col0 = 0, in = 0, b_first = 0, out = 0, out_first = 0;
};

// Part tp_rank of tp_size (whole for size 1) of a module of rank r (docs/scaleout.md): the
// base's own split for the dimension it splits — q/k/v/gate/up by output rows, o/down by input
// columns (`sc`: the shard config, whose widths are the base shard's) — and the rank or the
// whole output split evenly for the other.
ModulePart PartOf(const model::ModelConfig& full, const model::ModelConfig& sc, Linear which,
                  int64_t r, int tp_rank, int tp_size) {
  ModulePart p;
  if (which == Linear::kO || which == Linear::kDown) {
    p.a_rows = r;
    p.in = LinearIn(sc, which);
    p.a_col0 = tp_rank * p.in;
    const TpPart o = LoraTpPart(LinearOut(full, which), tp_rank, tp_size);
    p.b_first = p.out_first = o.first;
    p.out = o.count;
  } else {
    const TpPart a = LoraTpPart(r, tp_rank, tp_size);
    p.a_first = a.first;
    p.a_rows = a.count;
    p.in = LinearIn(sc, which);
    p.out = LinearOut(sc, which);
    p.b_first = tp_rank * p.out;
  }
  return p;
}

}  // namespace

std::string LoraModuleName(int64_t layer, Linear which) {
  const bool attn =
      which == Linear::kQ || which == Linear::kK || which == Linear::kV || which == Linear::kO;
  return "layers." + std::to_string(layer) + (attn ? ".self_attn." : ".mlp.") +
         model::LinearName(which);
}

LoraWeights LoraWeights::Empty(int64_t n_layers) {
  LoraWeights w;
  w.n_layers = n_layers;
  w.modules.resize(static_cast<size_t>(n_layers * model::kNumLinears));
  return w;
}

float LoraWeights::Scale(int64_t layer, Linear which) const {
  const LoraModuleWeights& m = at(layer, which);
  if (!m.present()) return 0.0f;
  const double r = static_cast<double>(m.rank());
  return static_cast<float>(m.alpha / (use_rslora ? std::sqrt(r) : r));
}

int64_t LoraWeights::MaxRank() const {
  int64_t r = 0;
  for (const auto& m : modules) r = std::max(r, m.rank());
  return r;
}

Status ValidateLoraWeights(const LoraWeights& w, const model::ModelConfig& c,
                           const LoraLimits& limits) {
  if (w.n_layers != c.n_layers ||
      w.modules.size() != static_cast<size_t>(w.n_layers * model::kNumLinears)) {
    return InvalidArgumentError("adapter has " + std::to_string(w.n_layers) +
                                " layers, the base model has " + std::to_string(c.n_layers) +
                                " (hint: adapter for another base model?)");
  }
  bool any = false;
  for (int64_t l = 0; l < w.n_layers; ++l) {
    for (int li = 0; li < model::kNumLinears; ++li) {
      const Linear which = static_cast<Linear>(li);
      const LoraModuleWeights& m = w.at(l, which);
      const std::string name = LoraModuleName(l, which);
      if (m.a.empty() != m.b.empty()) {
        return InvalidArgumentError(
            name + " has " + (m.a.empty() ? "lora_B but no lora_A" : "lora_A but no lora_B"));
      }
      if (!m.present()) continue;
      any = true;
      const int64_t in = LinearIn(c, which), out = LinearOut(c, which);
      const std::string base = model::LinearName(which);
      for (const Tensor* t : {&m.a, &m.b}) {
        const char* ab = t == &m.a ? "lora_A" : "lora_B";
        if (!UsableDType(t->dtype())) {
          return InvalidArgumentError(std::string(ab) + " of " + name + " has dtype " +
                                      std::string(DTypeName(t->dtype())) +
                                      " (LoRA weights must be f32, f16, bf16, q8_0 or q4_0)");
        }
        if (t->shape().size() != 2) {
          return InvalidArgumentError(std::string(ab) + " of " + name + " has shape " +
                                      t->view().ShapeString() + ", expected a matrix");
        }
      }
      const int64_t r = m.a.shape()[0];
      if (m.a.shape()[1] != in) {
        return InvalidArgumentError("lora_A of " + name + " has " + std::to_string(m.a.shape()[1]) +
                                    " columns, base " + base + " has " + std::to_string(in) +
                                    " inputs (hint: adapter for another base model?)");
      }
      if (m.b.shape()[0] != out) {
        return InvalidArgumentError("lora_B of " + name + " has " + std::to_string(m.b.shape()[0]) +
                                    " rows, base " + base + " has " + std::to_string(out) +
                                    " outputs (hint: adapter for another base model?)");
      }
      if (m.b.shape()[1] != r) {
        return InvalidArgumentError("rank mismatch in " + name + ": lora_A has " +
                                    std::to_string(r) + " rows, lora_B has " +
                                    std::to_string(m.b.shape()[1]) +
                                    " columns (hint: lora_A/lora_B transposed?)");
      }
      if (r < 1 || r > limits.max_rank) {
        return InvalidArgumentError(name + " has rank " + std::to_string(r) +
                                    ", outside the supported 1.." +
                                    std::to_string(limits.max_rank));
      }
      if (!std::isfinite(m.alpha)) {
        return InvalidArgumentError(name + " has a non-finite lora_alpha");
      }
    }
  }
  if (!any) return InvalidArgumentError("adapter targets no linear layer");
  return OkStatus();
}

const char* LoraStorageName(LoraStorage s) { return s == LoraStorage::kBF16 ? "bf16" : "f32"; }

TpPart LoraTpPart(int64_t n, int p, int size) {
  const int64_t first = n * p / size;
  return {first, n * (p + 1) / size - first};
}

void LoraView::CopyShapeFrom(const LoraView& other) {
  name_ = other.name_;
  id_ = other.id_;
  tp_rank_ = other.tp_rank_;
  tp_size_ = other.tp_size_;
  storage_type_ = other.storage_type_;
  n_layers_ = other.n_layers_;
  max_rank_ = other.max_rank_;
  max_fused_rank_ = other.max_fused_rank_;
  modules_ = other.modules_;
  fused_ = other.fused_;
  for (Module& m : modules_) m.a = m.bt = nullptr;
  for (Fused& f : fused_) f.a = nullptr;
  LayoutRowTables();
}

void LoraView::LayoutRowTables() {
  size_t total = 0;
  for (const Module& m : modules_) total += static_cast<size_t>(m.a_rank + m.rank);
  const bool bf16 = storage_type_ == LoraStorage::kBF16;
  rows_.assign(bf16 ? 0 : total, nullptr);
  rows16_.assign(bf16 ? total : 0, nullptr);
  row_elems_.assign(total, 0);
  size_t off = 0;
  // Points (a_rows, a_rows_bf16) at the next n rows of the table in use (the other stays null).
  auto take = [&](int64_t n, int64_t width, const float* const** f32, const uint16_t* const** b16) {
    for (int64_t i = 0; i < n; ++i) row_elems_[off + static_cast<size_t>(i)] = width;
    *f32 = bf16 ? nullptr : rows_.data() + off;
    *b16 = bf16 ? rows16_.data() + off : nullptr;
    off += static_cast<size_t>(n);
  };
  auto mod = [&](int64_t l, Linear which) -> Module& {
    return modules_[static_cast<size_t>(l * model::kNumLinears + static_cast<int>(which))];
  };
  for (int64_t l = 0; l < n_layers_; ++l) {
    for (int g = 0; g < model::kNumLinearGroups; ++g) {
      Fused& f = fused_[static_cast<size_t>(l * model::kNumLinearGroups + g)];
      take(0, 0, &f.a_rows, &f.a_rows_bf16);  // the group's rows start here
      for (Linear member : model::LinearGroupMembers(static_cast<model::LinearGroup>(g))) {
        Module& m = mod(l, member);
        take(m.a_rank, m.in, &m.a_rows, &m.a_rows_bf16);
      }
    }
    for (Linear which : {Linear::kO, Linear::kDown}) {
      Module& m = mod(l, which);
      take(m.a_rank, m.in, &m.a_rows, &m.a_rows_bf16);
    }
    for (int li = 0; li < model::kNumLinears; ++li) {
      Module& m = mod(l, static_cast<Linear>(li));
      take(m.rank, m.out, &m.bt_rows, &m.bt_rows_bf16);
    }
  }
  CHORUS_CHECK(off == total);
}

Result<std::shared_ptr<const LoraAdapter>> LoraAdapter::Build(const LoraWeights& w,
                                                              const model::ModelConfig& c,
                                                              std::string name,
                                                              const LoraLimits& limits,
                                                              VariantId id) {
  return BuildShard(w, c, 0, 1, std::move(name), limits, id);
}

Result<std::shared_ptr<const LoraAdapter>> LoraAdapter::BuildShard(
    const LoraWeights& w, const model::ModelConfig& c, int tp_rank, int tp_size, std::string name,
    const LoraLimits& limits, VariantId id) {
  CHORUS_CHECK(tp_size >= 1 && tp_rank >= 0 && tp_rank < tp_size)
      << "LoRA shard " << tp_rank << " of " << tp_size;
  CHORUS_RETURN_IF_ERROR(ValidateLoraWeights(w, c, limits).WithContext("adapter '" + name + "'"));
  model::ModelConfig sc = c;
  if (tp_size > 1) {
    CHORUS_ASSIGN_OR_RETURN(sc, model::ShardConfig(c, tp_size));
  }
  std::shared_ptr<LoraAdapter> ad(new LoraAdapter());
  ad->name_ = std::move(name);
  ad->id_ = id;
  ad->tp_rank_ = tp_rank;
  ad->tp_size_ = tp_size;
  ad->n_layers_ = w.n_layers;
  ad->modules_.resize(w.modules.size());
  ad->fused_.resize(static_cast<size_t>(w.n_layers * model::kNumLinearGroups));

  // Storage layout per layer: for each group its fused A (members in order), then o's and
  // down's A, then every module's Bᵀ. Offsets first, so pointers are set after one allocation.
  struct Slot {
    size_t a_off = 0, bt_off = 0;
    ModulePart part;
  };
  std::vector<Slot> slots(w.modules.size());
  std::vector<size_t> fused_off(ad->fused_.size());
  auto index = [](int64_t l, Linear which) {
    return static_cast<size_t>(l * model::kNumLinears + static_cast<int>(which));
  };
  size_t total = 0;
  for (int64_t l = 0; l < w.n_layers; ++l) {
    for (int li = 0; li < model::kNumLinears; ++li) {
      const auto which = static_cast<Linear>(li);
      Slot& sl = slots[index(l, which)];
      sl.part = PartOf(c, sc, which, w.at(l, which).rank(), tp_rank, tp_size);
      Module& m = ad->modules_[index(l, which)];
      m.in = sl.part.in;
      m.out = sl.part.out;
    }
    for (int g = 0; g < model::kNumLinearGroups; ++g) {
      fused_off[static_cast<size_t>(l * model::kNumLinearGroups + g)] = total;
      int64_t col = 0, held = 0;
      for (Linear which : model::LinearGroupMembers(static_cast<model::LinearGroup>(g))) {
        Slot& sl = slots[index(l, which)];
        sl.a_off = total;
        ad->modules_[index(l, which)].fused_col = col;
        col += w.at(l, which).rank();
        held += sl.part.a_rows;
        total += static_cast<size_t>(sl.part.a_rows * sl.part.in);
      }
      ad->fused_[static_cast<size_t>(l * model::kNumLinearGroups + g)].rank = held;
      ad->max_fused_rank_ = std::max(ad->max_fused_rank_, col);
    }
    for (Linear which : {Linear::kO, Linear::kDown}) {
      Slot& sl = slots[index(l, which)];
      sl.a_off = total;
      total += static_cast<size_t>(sl.part.a_rows * sl.part.in);
    }
    for (int li = 0; li < model::kNumLinears; ++li) {
      const Linear which = static_cast<Linear>(li);
      Slot& sl = slots[index(l, which)];
      sl.bt_off = total;
      total += static_cast<size_t>(w.at(l, which).rank() * sl.part.out);
    }
  }
  // One uninitialized allocation in the storage type; every element is written exactly once
  // below (decoded, checked, permuted / transposed and rounded in a single pass per tensor), so
  // a load touches the file bytes once and the storage once.
  ad->storage_type_ = limits.storage;
  const int64_t eb = limits.storage == LoraStorage::kBF16 ? 2 : 4;
  // Huge pages outside the arena: a step with many distinct adapters streams these rows from DRAM.
  ad->storage_ = memory::HostBuffer(static_cast<size_t>(total) * static_cast<size_t>(eb),
                                    limits.arena, "a LoRA adapter");
  uint8_t* base = static_cast<uint8_t*>(ad->storage_.data());
  const bool f32 = limits.storage == LoraStorage::kF32;

  std::vector<float> scratch;
  for (int64_t l = 0; l < w.n_layers; ++l) {
    for (int g = 0; g < model::kNumLinearGroups; ++g) {
      Fused& f = ad->fused_[static_cast<size_t>(l * model::kNumLinearGroups + g)];
      f.a = f32 && f.rank > 0
                ? reinterpret_cast<const float*>(
                      base + fused_off[static_cast<size_t>(l * model::kNumLinearGroups + g)] * 4)
                : nullptr;
    }
    for (int li = 0; li < model::kNumLinears; ++li) {
      const Linear which = static_cast<Linear>(li);
      const LoraModuleWeights& m = w.at(l, which);
      if (!m.present()) continue;
      const Slot& sl = slots[index(l, which)];
      const ModulePart& part = sl.part;
      Module& mod = ad->modules_[index(l, which)];
      const int64_t r = m.rank();
      const std::string mname = LoraModuleName(l, which);
      uint8_t* a_dst = base + sl.a_off * static_cast<size_t>(eb);
      uint8_t* bt_dst = base + sl.bt_off * static_cast<size_t>(eb);
      CHORUS_RETURN_IF_ERROR(EmitA(m.a, part.a_first, part.a_rows, part.a_col0, part.in,
                                   limits.storage, a_dst, &scratch, "lora_A of " + mname)
                                 .WithContext("adapter '" + ad->name_ + "'"));
      CHORUS_RETURN_IF_ERROR(EmitBt(m.b, part.b_first, part.out, RopeHeads(c, which), c.head_dim,
                                    w.qk_layout, c.rope_layout, limits.storage, bt_dst, &scratch,
                                    "lora_B of " + mname)
                                 .WithContext("adapter '" + ad->name_ + "'"));
      mod.rank = r;
      mod.a_rank = part.a_rows;
      mod.a_first = part.a_first;
      mod.out_first = part.out_first;
      mod.scale = w.Scale(l, which);
      mod.a = f32 && part.a_rows > 0 ? reinterpret_cast<const float*>(a_dst) : nullptr;
      mod.bt = f32 ? reinterpret_cast<const float*>(bt_dst) : nullptr;
      ad->max_rank_ = std::max(ad->max_rank_, r);
    }
  }
  // The storage holds the rows in the flat row order of LoraView, so the row tables walk it.
  ad->LayoutRowTables();
  size_t off = 0;
  for (int64_t i = 0; i < ad->n_rows(); ++i) {
    ad->SetRow(i, base + off * static_cast<size_t>(eb));
    off += static_cast<size_t>(ad->row_elems(i));
  }
  CHORUS_CHECK(off == total) << "LoRA row tables do not cover the storage";
  return std::shared_ptr<const LoraAdapter>(std::move(ad));
}

LoraWeights MakeRandomLora(const model::ModelConfig& c, const RandomLoraSpec& spec) {
  LoraWeights w = LoraWeights::Empty(c.n_layers);
  w.use_rslora = spec.use_rslora;
  w.qk_layout = kernels::RopeLayout::kHalf;
  Rng rng(spec.seed);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    for (Linear which : spec.targets) {
      const int64_t in = LinearIn(c, which), out = LinearOut(c, which), r = spec.rank;
      std::vector<float> a(static_cast<size_t>(r * in)), b(static_cast<size_t>(out * r));
      const float a_std = 1.0f / std::sqrt(static_cast<float>(in));
      for (float& x : a) x = rng.NextGaussian() * a_std;
      for (float& x : b) x = rng.NextGaussian() * spec.b_std;
      LoraModuleWeights& m = w.at(l, which);
      m.a = Tensor::FromF32(a, DType::kF32, {r, in});
      m.b = Tensor::FromF32(b, DType::kF32, {out, r});
      m.alpha = spec.alpha;
    }
  }
  return w;
}

LoraWeights RoundedAsStored(const LoraWeights& w, LoraStorage storage) {
  LoraWeights out = w;
  if (storage == LoraStorage::kF32) return out;
  for (LoraModuleWeights& m : out.modules) {
    if (!m.present()) continue;
    for (Tensor* t : {&m.a, &m.b}) {
      std::vector<float> v = t->ToF32();
      for (float& f : v) f = BF16ToF32(F32ToBF16(f));
      *t = Tensor::FromF32(v, DType::kF32, t->shape());
    }
  }
  return out;
}

Result<std::shared_ptr<const model::Model>> MergeLora(const model::Model& base,
                                                      const LoraWeights& w) {
  const model::ModelConfig& c = base.config();
  CHORUS_RETURN_IF_ERROR(ValidateLoraWeights(w, c, LoraLimits{.max_rank = 1 << 20}));
  model::Model::NamedTensors tensors = base.tensors();
  for (auto& [tname, t] : tensors) {
    for (int64_t l = 0; l < c.n_layers; ++l) {
      for (int li = 0; li < model::kNumLinears; ++li) {
        const Linear which = static_cast<Linear>(li);
        if (tname != model::HfLayerTensorName(l, which)) continue;
        const LoraModuleWeights& m = w.at(l, which);
        if (!m.present()) continue;
        const int64_t r = m.rank(), in = LinearIn(c, which), out = LinearOut(c, which);
        std::vector<float> merged = t.ToF32();  // [out, in]
        const std::vector<float> a = m.a.ToF32();
        const std::vector<float> b = BInBaseOrder(w, c, which, m.b).ToF32();
        const double s = w.Scale(l, which);
        for (int64_t o = 0; o < out; ++o) {
          for (int64_t k = 0; k < in; ++k) {
            double acc = 0;
            for (int64_t j = 0; j < r; ++j)
              acc += static_cast<double>(b[static_cast<size_t>(o * r + j)]) *
                     a[static_cast<size_t>(j * in + k)];
            merged[static_cast<size_t>(o * in + k)] += static_cast<float>(s * acc);
          }
        }
        t = Tensor::FromF32(merged, DType::kF32, {out, in});
      }
    }
  }
  return model::Model::Build(c, std::move(tensors), base.format(),
                             base.source() + " (merged LoRA)");
}

}  // namespace chorus::adapters
