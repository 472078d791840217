#include "chorus/adapters/lora/lora_adapter.h"

#include <cmath>
#include <sstream>

#include "chorus/base/rng.h"
#include "chorus/model/convert.h"

namespace chorus::adapters {
namespace {

using model::Linear;

constexpr Linear kGroupMembers[2][3] = {{Linear::kQ, Linear::kK, Linear::kV},
                                        {Linear::kGate, Linear::kUp, Linear::kGate}};
constexpr int kGroupSize[2] = {3, 2};

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

Status CheckFinite(const std::vector<float>& v, const std::string& what) {
  for (size_t i = 0; i < v.size(); ++i) {
    if (!std::isfinite(v[i])) {
      std::ostringstream os;
      os << what << " holds a non-finite value (" << v[i] << " at element " << i << ")";
      return InvalidArgumentError(os.str());
    }
  }
  return OkStatus();
}

}  // namespace

std::string LoraModuleName(int64_t layer, Linear which) {
  const bool attn = which == Linear::kQ || which == Linear::kK || which == Linear::kV ||
                    which == Linear::kO;
  return "layers." + std::to_string(layer) + (attn ? ".self_attn." : ".mlp.") +
         model::LinearName(which);
}

int64_t LinearIn(const model::ModelConfig& c, Linear which) {
  switch (which) {
    case Linear::kO: return c.q_dim();
    case Linear::kDown: return c.n_ff;
    default: return c.n_embd;
  }
}

int64_t LinearOut(const model::ModelConfig& c, Linear which) {
  switch (which) {
    case Linear::kQ: return c.q_dim();
    case Linear::kK:
    case Linear::kV: return c.kv_dim();
    case Linear::kGate:
    case Linear::kUp: return c.n_ff;
    default: return c.n_embd;
  }
}

bool LinearGroup(Linear which, LoraAdapter::Group* group) {
  switch (which) {
    case Linear::kQ:
    case Linear::kK:
    case Linear::kV: *group = LoraAdapter::Group::kQkv; return true;
    case Linear::kGate:
    case Linear::kUp: *group = LoraAdapter::Group::kGateUp; return true;
    default: return false;
  }
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
        return InvalidArgumentError(name + " has " + (m.a.empty() ? "lora_B but no lora_A" : "lora_A but no lora_B"));
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
        return InvalidArgumentError("rank mismatch in " + name + ": lora_A has " + std::to_string(r) +
                                    " rows, lora_B has " + std::to_string(m.b.shape()[1]) +
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

void LoraView::CopyShapeFrom(const LoraView& other) {
  name_ = other.name_;
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
  for (const Module& m : modules_) total += static_cast<size_t>(2 * m.rank);
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
    for (int g = 0; g < 2; ++g) {
      Fused& f = fused_[static_cast<size_t>(l * 2 + g)];
      take(0, 0, &f.a_rows, &f.a_rows_bf16);  // the group's rows start here
      for (int q = 0; q < kGroupSize[g]; ++q) {
        Module& m = mod(l, kGroupMembers[g][q]);
        take(m.rank, m.in, &m.a_rows, &m.a_rows_bf16);
      }
    }
    for (Linear which : {Linear::kO, Linear::kDown}) {
      Module& m = mod(l, which);
      take(m.rank, m.in, &m.a_rows, &m.a_rows_bf16);
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
                                                              const LoraLimits& limits) {
  CHORUS_RETURN_IF_ERROR(ValidateLoraWeights(w, c, limits).WithContext("adapter '" + name + "'"));
  std::shared_ptr<LoraAdapter> ad(new LoraAdapter());
  ad->name_ = std::move(name);
  ad->n_layers_ = w.n_layers;
  ad->modules_.resize(w.modules.size());
  ad->fused_.resize(static_cast<size_t>(w.n_layers * 2));

  // Storage layout per layer: for each group its fused A (members in order), then o's and
  // down's A, then every module's Bᵀ. Offsets first, so pointers are set after one allocation.
  struct Slot {
    size_t a_off = 0, bt_off = 0;
  };
  std::vector<Slot> slots(w.modules.size());
  std::vector<size_t> fused_off(ad->fused_.size());
  size_t total = 0;
  for (int64_t l = 0; l < w.n_layers; ++l) {
    for (int g = 0; g < 2; ++g) {
      fused_off[static_cast<size_t>(l * 2 + g)] = total;
      int64_t col = 0;
      for (int q = 0; q < kGroupSize[g]; ++q) {
        const Linear which = kGroupMembers[g][q];
        const LoraModuleWeights& m = w.at(l, which);
        const size_t idx = static_cast<size_t>(l * model::kNumLinears + static_cast<int>(which));
        slots[idx].a_off = total;
        ad->modules_[idx].fused_col = col;
        ad->modules_[idx].in = LinearIn(c, which);
        ad->modules_[idx].out = LinearOut(c, which);
        col += m.rank();
        total += static_cast<size_t>(m.rank() * LinearIn(c, which));
      }
      ad->fused_[static_cast<size_t>(l * 2 + g)].rank = col;
      ad->max_fused_rank_ = std::max(ad->max_fused_rank_, col);
    }
    for (Linear which : {Linear::kO, Linear::kDown}) {
      const size_t idx = static_cast<size_t>(l * model::kNumLinears + static_cast<int>(which));
      slots[idx].a_off = total;
      ad->modules_[idx].in = LinearIn(c, which);
      ad->modules_[idx].out = LinearOut(c, which);
      total += static_cast<size_t>(w.at(l, which).rank() * LinearIn(c, which));
    }
    for (int li = 0; li < model::kNumLinears; ++li) {
      const Linear which = static_cast<Linear>(li);
      const size_t idx = static_cast<size_t>(l * model::kNumLinears + li);
      slots[idx].bt_off = total;
      total += static_cast<size_t>(w.at(l, which).rank() * LinearOut(c, which));
    }
  }
  ad->storage_.assign(total, 0.0f);
  float* base = ad->storage_.data();

  for (int64_t l = 0; l < w.n_layers; ++l) {
    for (int g = 0; g < 2; ++g) {
      Fused& f = ad->fused_[static_cast<size_t>(l * 2 + g)];
      f.a = f.rank > 0 ? base + fused_off[static_cast<size_t>(l * 2 + g)] : nullptr;
    }
    for (int li = 0; li < model::kNumLinears; ++li) {
      const Linear which = static_cast<Linear>(li);
      const LoraModuleWeights& m = w.at(l, which);
      if (!m.present()) continue;
      const size_t idx = static_cast<size_t>(l * model::kNumLinears + li);
      Module& mod = ad->modules_[idx];
      const int64_t r = m.rank(), out = LinearOut(c, which);
      const std::string mname = LoraModuleName(l, which);
      std::vector<float> a = m.a.ToF32();  // [r, in]
      CHORUS_RETURN_IF_ERROR(CheckFinite(a, "lora_A of " + mname).WithContext("adapter '" + ad->name_ + "'"));
      std::vector<float> b = BInBaseOrder(w, c, which, m.b).ToF32();  // [out, r]
      CHORUS_RETURN_IF_ERROR(CheckFinite(b, "lora_B of " + mname).WithContext("adapter '" + ad->name_ + "'"));
      float* a_dst = base + slots[idx].a_off;
      std::copy(a.begin(), a.end(), a_dst);
      float* bt_dst = base + slots[idx].bt_off;
      for (int64_t o = 0; o < out; ++o)
        for (int64_t j = 0; j < r; ++j) bt_dst[j * out + o] = b[static_cast<size_t>(o * r + j)];
      mod.rank = r;
      mod.scale = w.Scale(l, which);
      mod.a = a_dst;
      mod.bt = bt_dst;
      ad->max_rank_ = std::max(ad->max_rank_, r);
    }
  }
  // The storage holds the rows in the flat row order of LoraView, so the row tables walk it.
  ad->storage_type_ = limits.storage;
  ad->LayoutRowTables();
  if (limits.storage == LoraStorage::kBF16) {
    // Rounded once, here; the f32 staging copy is dropped (contiguous f32 views with it).
    ad->storage16_.resize(total);
    for (size_t i = 0; i < total; ++i) ad->storage16_[i] = F32ToBF16(ad->storage_[i]);
    std::vector<float>().swap(ad->storage_);
    for (Module& m : ad->modules_) m.a = m.bt = nullptr;
    for (Fused& f : ad->fused_) f.a = nullptr;
  }
  size_t off = 0;
  for (int64_t i = 0; i < ad->n_rows(); ++i) {
    ad->SetRow(i, limits.storage == LoraStorage::kBF16
                      ? static_cast<const void*>(ad->storage16_.data() + off)
                      : static_cast<const void*>(ad->storage_.data() + off));
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
              acc += static_cast<double>(b[static_cast<size_t>(o * r + j)]) * a[static_cast<size_t>(j * in + k)];
            merged[static_cast<size_t>(o * in + k)] += static_cast<float>(s * acc);
          }
        }
        t = Tensor::FromF32(merged, DType::kF32, {out, in});
      }
    }
  }
  return model::Model::Build(c, std::move(tensors), base.format(), base.source() + " (merged LoRA)");
}

}  // namespace chorus::adapters
