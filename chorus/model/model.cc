#include "chorus/model/model.h"

#include <algorithm>
#include <map>

#include "chorus/base/mapped_file.h"

namespace chorus::model {

const char* LinearName(Linear l) {
  static const char* kNames[] = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                 "gate_proj", "up_proj", "down_proj"};
  return kNames[static_cast<int>(l)];
}

int64_t LinearIn(const ModelConfig& c, Linear l) {
  switch (l) {
    case Linear::kO:
      return c.q_dim();
    case Linear::kDown:
      return c.n_ff;
    default:
      return c.n_embd;
  }
}

int64_t LinearOut(const ModelConfig& c, Linear l) {
  switch (l) {
    case Linear::kQ:
      return c.q_dim();
    case Linear::kK:
    case Linear::kV:
      return c.kv_dim();
    case Linear::kGate:
    case Linear::kUp:
      return c.n_ff;
    default:
      return c.n_embd;
  }
}

std::span<const Linear> LinearGroupMembers(LinearGroup g) {
  static constexpr Linear kQkv[] = {Linear::kQ, Linear::kK, Linear::kV};
  static constexpr Linear kGateUp[] = {Linear::kGate, Linear::kUp};
  if (g == LinearGroup::kQkv) return kQkv;
  return kGateUp;
}

std::optional<LinearGroup> LinearGroupOf(Linear l) {
  for (int g = 0; g < kNumLinearGroups; ++g) {
    for (Linear m : LinearGroupMembers(static_cast<LinearGroup>(g)))
      if (m == l) return static_cast<LinearGroup>(g);
  }
  return std::nullopt;
}

const char* ModelFormatName(ModelFormat f) {
  switch (f) {
    case ModelFormat::kLlama2c:
      return "llama2.c";
    case ModelFormat::kHfDirectory:
      return "huggingface";
    case ModelFormat::kGguf:
      return "gguf";
    case ModelFormat::kSynthetic:
      return "synthetic";
  }
  return "?";
}

std::string HfLayerTensorName(int64_t layer, Linear l) {
  const bool attn = l == Linear::kQ || l == Linear::kK || l == Linear::kV || l == Linear::kO;
  return "model.layers." + std::to_string(layer) + (attn ? ".self_attn." : ".mlp.") +
         LinearName(l) + ".weight";
}

std::string HfBiasName(int64_t layer, Linear l) {
  return "model.layers." + std::to_string(layer) + ".self_attn." + LinearName(l) + ".bias";
}

std::string HfLayerNormName(int64_t layer, bool ffn) {
  return "model.layers." + std::to_string(layer) +
         (ffn ? ".post_attention_layernorm.weight" : ".input_layernorm.weight");
}

std::string HfNormName(const ModelConfig& c, int64_t layer, Norm n) {
  const std::string p = "model.layers." + std::to_string(layer) + ".";
  const bool gemma = c.sandwich_norms;
  switch (n) {
    case Norm::kAttn:
      return p + "input_layernorm.weight";
    case Norm::kFfn:
      return p + (gemma ? "pre_feedforward_layernorm.weight" : "post_attention_layernorm.weight");
    case Norm::kPostAttn:
      return p + "post_attention_layernorm.weight";
    case Norm::kPostFfn:
      return p + "post_feedforward_layernorm.weight";
    case Norm::kQ:
      return p + "self_attn.q_norm.weight";
    case Norm::kK:
      return p + "self_attn.k_norm.weight";
  }
  return p;
}

std::string HfFusedQkvName(int64_t layer) {
  return "model.layers." + std::to_string(layer) + ".self_attn.qkv_proj.weight";
}
std::string HfFusedGateUpName(int64_t layer) {
  return "model.layers." + std::to_string(layer) + ".mlp.gate_up_proj.weight";
}

namespace {

// Whether two tensors are views of the same bytes as the same dtype and shape.
bool SameBytes(const Tensor& a, const Tensor& b) {
  return a.data() == b.data() && a.dtype() == b.dtype() && a.shape() == b.shape();
}

// Small vectors (norms, biases) are converted to f32 heap copies: they are read many times per
// step and cost nothing to copy.
Result<Tensor> ToF32Vector(const Tensor& t, int64_t n, const std::string& name) {
  if (t.view().NumElements() != n || t.view().n_dims() != 1) {
    return InvalidArgumentError("tensor '" + name + "' has shape " + t.view().ShapeString() +
                                ", expected [" + std::to_string(n) + "]");
  }
  if (DTypeIsQuantized(t.dtype()))
    return InvalidArgumentError("tensor '" + name + "' must not be quantized");
  if (t.dtype() == DType::kF32) return t;
  return Tensor::FromF32(t.ToF32(), DType::kF32, {n});
}

Status CheckMatrix(const Tensor& t, int64_t rows, int64_t cols, const std::string& name) {
  const auto& s = t.shape();
  if (s.size() != 2 || s[0] != rows || s[1] != cols) {
    return InvalidArgumentError("tensor '" + name + "' has shape " + t.view().ShapeString() +
                                ", expected [" + std::to_string(rows) + ", " +
                                std::to_string(cols) + "]");
  }
  return OkStatus();
}

}  // namespace

Status SplitFusedProjections(const ModelConfig& c, Model::NamedTensors* tensors,
                             const std::string& source) {
  if (!FusedProjections(c)) return OkStatus();
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < tensors->size(); ++i) index.emplace((*tensors)[i].first, i);
  std::vector<bool> drop(tensors->size(), false);
  Model::NamedTensors added;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    struct Fused {
      std::string name;
      LinearGroup group;
    };
    for (const Fused& f : {Fused{HfFusedQkvName(l), LinearGroup::kQkv},
                           Fused{HfFusedGateUpName(l), LinearGroup::kGateUp}}) {
      const auto members = LinearGroupMembers(f.group);
      auto it = index.find(f.name);
      if (it == index.end()) {
        // A checkpoint already split (some exporters do) is fine; one with neither is not.
        bool split = true;
        for (Linear m : members) split = split && index.count(HfLayerTensorName(l, m)) > 0;
        if (split) continue;
        return NotFoundError(source + ": missing tensor '" + f.name + "' (" + c.arch +
                             " stores it fused)");
      }
      const Tensor& t = (*tensors)[it->second].second;
      int64_t rows = 0;
      for (Linear m : members) rows += LinearOut(c, m);
      CHORUS_RETURN_IF_ERROR(CheckMatrix(t, rows, c.n_embd, f.name).WithContext(source));
      int64_t r0 = 0;
      for (Linear m : members) {
        added.emplace_back(HfLayerTensorName(l, m), t.Rows(r0, r0 + LinearOut(c, m)));
        r0 += LinearOut(c, m);
      }
      drop[it->second] = true;
    }
  }
  Model::NamedTensors out;
  out.reserve(tensors->size() + added.size());
  for (size_t i = 0; i < tensors->size(); ++i)
    if (!drop[i]) out.push_back(std::move((*tensors)[i]));
  for (auto& a : added) out.push_back(std::move(a));
  *tensors = std::move(out);
  return OkStatus();
}

Result<std::shared_ptr<const Model>> Model::Build(ModelConfig config, NamedTensors tensors,
                                                  ModelFormat format, std::string source,
                                                  SourcePages pages) {
  return BuildReusing(std::move(config), std::move(tensors), format, std::move(source), pages,
                      nullptr);
}

Result<std::shared_ptr<const Model>> Model::WithTensors(const Model& m,
                                                        const NamedTensors& replacements,
                                                        std::string source) {
  NamedTensors tensors = m.tensors_;
  for (const auto& r : replacements) {
    auto it = std::find_if(tensors.begin(), tensors.end(),
                           [&](const auto& p) { return p.first == r.first; });
    if (it == tensors.end())
      return InvalidArgumentError(source + ": no tensor '" + r.first + "' to replace");
    it->second = r.second;
  }
  return BuildReusing(m.config_, std::move(tensors), m.format_, std::move(source), m.pages_, &m);
}

Result<std::shared_ptr<const Model>> Model::BuildReusing(ModelConfig config, NamedTensors tensors,
                                                         ModelFormat format, std::string source,
                                                         SourcePages pages, const Model* reuse) {
  CHORUS_RETURN_IF_ERROR(config.Validate().WithContext(source));
  std::map<std::string, const Tensor*> by_name;
  for (const auto& [name, t] : tensors) {
    if (!by_name.emplace(name, &t).second)
      return InvalidArgumentError(source + ": duplicate tensor '" + name + "'");
  }
  auto find = [&](const std::string& name) -> Result<Tensor> {
    auto it = by_name.find(name);
    if (it == by_name.end()) return NotFoundError(source + ": missing tensor '" + name + "'");
    return *it->second;
  };
  auto model = std::shared_ptr<Model>(new Model());
  const ModelConfig& c = config;
  Weights& w = model->weights_;
  {
    CHORUS_ASSIGN_OR_RETURN(w.tok_embd, find("model.embed_tokens.weight"));
    CHORUS_RETURN_IF_ERROR(
        CheckMatrix(w.tok_embd, c.vocab_size, c.n_embd, "model.embed_tokens.weight")
            .WithContext(source));
    Tensor out = w.tok_embd;
    if (!c.tie_embeddings) {
      CHORUS_ASSIGN_OR_RETURN(out, find("lm_head.weight"));
      CHORUS_RETURN_IF_ERROR(
          CheckMatrix(out, c.vocab_size, c.n_embd, "lm_head.weight").WithContext(source));
    }
    if (reuse != nullptr && SameBytes(reuse->weights_.output.source(), out)) {
      w.output = reuse->weights_.output;
    } else {
      auto packed = kernels::PackedWeight::Pack(out);
      if (!packed.ok()) return packed.status().WithContext(source + ": output weight");
      w.output = std::move(packed).value();
    }
    // Not when tied: the embedding rows are still read from the source at every step.
    if (w.output.packed_bytes() > 0 && !c.tie_embeddings && pages == SourcePages::kRelease)
      ReleaseResidentPages(out.data(), static_cast<size_t>(out.view().NumBytes()));
  }
  const int64_t shapes[kNumLinears][2] = {
      {c.q_dim(), c.n_embd}, {c.kv_dim(), c.n_embd}, {c.kv_dim(), c.n_embd}, {c.n_embd, c.q_dim()},
      {c.n_ff, c.n_embd},    {c.n_ff, c.n_embd},     {c.n_embd, c.n_ff}};
  // A norm's f32 weights as the kernels use them: (1 + w) for Gemma.
  auto norm = [&](const std::string& name, int64_t n) -> Result<Tensor> {
    CHORUS_ASSIGN_OR_RETURN(Tensor t, find(name));
    auto f = ToF32Vector(t, n, name);
    if (!f.ok()) return f.status().WithContext(source);
    if (!c.norm_plus_one) return f;
    std::vector<float> v = f->ToF32();
    for (float& x : v) x += 1.0f;
    return Tensor::FromF32(v, DType::kF32, {n});
  };
  CHORUS_ASSIGN_OR_RETURN(w.output_norm, norm("model.norm.weight", c.n_embd));
  w.layers.resize(static_cast<size_t>(c.n_layers));
  for (int64_t l = 0; l < c.n_layers; ++l) {
    LayerWeights& lw = w.layers[static_cast<size_t>(l)];
    CHORUS_ASSIGN_OR_RETURN(lw.attn_norm, norm(HfNormName(c, l, Norm::kAttn), c.n_embd));
    CHORUS_ASSIGN_OR_RETURN(lw.ffn_norm, norm(HfNormName(c, l, Norm::kFfn), c.n_embd));
    if (c.sandwich_norms) {
      CHORUS_ASSIGN_OR_RETURN(lw.post_attn_norm, norm(HfNormName(c, l, Norm::kPostAttn), c.n_embd));
      CHORUS_ASSIGN_OR_RETURN(lw.post_ffn_norm, norm(HfNormName(c, l, Norm::kPostFfn), c.n_embd));
    }
    if (c.qk_norm) {
      CHORUS_ASSIGN_OR_RETURN(lw.q_norm, norm(HfNormName(c, l, Norm::kQ), c.head_dim));
      CHORUS_ASSIGN_OR_RETURN(lw.k_norm, norm(HfNormName(c, l, Norm::kK), c.head_dim));
    }
    for (int li = 0; li < kNumLinears; ++li) {
      std::string name = HfLayerTensorName(l, static_cast<Linear>(li));
      CHORUS_ASSIGN_OR_RETURN(Tensor t, find(name));
      CHORUS_RETURN_IF_ERROR(
          CheckMatrix(t, shapes[li][0], shapes[li][1], name).WithContext(source));
      const kernels::PackedWeight* same =
          reuse != nullptr && l < static_cast<int64_t>(reuse->weights_.layers.size())
              ? &reuse->weights_.layers[static_cast<size_t>(l)].linear[li]
              : nullptr;
      if (same != nullptr && SameBytes(same->source(), t)) {
        lw.linear[li] = *same;  // the same bytes: share the prepared copy
      } else {
        auto packed = kernels::PackedWeight::Pack(t);
        if (!packed.ok()) return packed.status().WithContext(source + ": " + name);
        lw.linear[li] = std::move(packed).value();
      }
      // A repacked copy replaces the source for compute: let the mmapped pages go so the
      // weights are resident once, not twice.
      if (lw.linear[li].packed_bytes() > 0 && pages == SourcePages::kRelease)
        ReleaseResidentPages(t.data(), static_cast<size_t>(t.view().NumBytes()));
    }
    if (c.qkv_bias) {
      for (Linear b : {Linear::kQ, Linear::kK, Linear::kV}) {
        std::string name = HfBiasName(l, b);
        CHORUS_ASSIGN_OR_RETURN(Tensor t, find(name));
        CHORUS_ASSIGN_OR_RETURN(Tensor f,
                                ToF32Vector(t, b == Linear::kQ ? c.q_dim() : c.kv_dim(), name));
        (b == Linear::kQ ? lw.bq : b == Linear::kK ? lw.bk : lw.bv) = f;
      }
    }
  }
  model->config_ = std::move(config);
  model->tensors_ = std::move(tensors);
  model->format_ = format;
  model->source_ = std::move(source);
  model->pages_ = pages;
  return std::shared_ptr<const Model>(std::move(model));
}

int64_t Model::WeightBytes() const {
  int64_t b = 0;
  for (const auto& [name, t] : tensors_) b += t.view().NumBytes();
  return b;
}

int64_t Model::PackedBytes() const {
  int64_t b = weights_.output.packed_bytes();
  for (const auto& l : weights_.layers)
    for (const auto& m : l.linear) b += m.packed_bytes();
  return b;
}

void Model::ReleaseSourcePages(const Tensor& t) const {
  if (pages_ == SourcePages::kKeep || t.data() == nullptr) return;
  auto repacked_from = [&](const kernels::PackedWeight& w) {
    return w.packed_bytes() > 0 && SameBytes(w.source(), t);
  };
  // Build's conditions: tied embeddings' rows are read from the source at every step.
  bool release = !config_.tie_embeddings && repacked_from(weights_.output);
  for (const auto& l : weights_.layers)
    for (const auto& m : l.linear) release = release || repacked_from(m);
  if (release) ReleaseResidentPages(t.data(), static_cast<size_t>(t.view().NumBytes()));
}

int64_t Model::StreamedBytesPerToken() const {
  int64_t b = weights_.output.source().view().NumBytes();
  for (const auto& l : weights_.layers)
    for (const auto& m : l.linear) b += m.source().view().NumBytes();
  return b;
}

}  // namespace chorus::model
