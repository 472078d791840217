#include "chorus/model/model.h"

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

namespace {

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

Result<std::shared_ptr<const Model>> Model::Build(ModelConfig config, NamedTensors tensors,
                                                  ModelFormat format, std::string source) {
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
    CHORUS_ASSIGN_OR_RETURN(Tensor norm, find("model.norm.weight"));
    CHORUS_ASSIGN_OR_RETURN(w.output_norm, ToF32Vector(norm, c.n_embd, "model.norm.weight"));
    Tensor out = w.tok_embd;
    if (!c.tie_embeddings) {
      CHORUS_ASSIGN_OR_RETURN(out, find("lm_head.weight"));
      CHORUS_RETURN_IF_ERROR(
          CheckMatrix(out, c.vocab_size, c.n_embd, "lm_head.weight").WithContext(source));
    }
    auto packed = kernels::PackedWeight::Pack(out);
    if (!packed.ok()) return packed.status().WithContext(source + ": output weight");
    w.output = std::move(packed).value();
    // Not when tied: the embedding rows are still read from the source at every step.
    if (w.output.packed_bytes() > 0 && !c.tie_embeddings)
      ReleaseResidentPages(out.data(), static_cast<size_t>(out.view().NumBytes()));
  }
  const int64_t shapes[kNumLinears][2] = {
      {c.q_dim(), c.n_embd}, {c.kv_dim(), c.n_embd}, {c.kv_dim(), c.n_embd}, {c.n_embd, c.q_dim()},
      {c.n_ff, c.n_embd},    {c.n_ff, c.n_embd},     {c.n_embd, c.n_ff}};
  w.layers.resize(static_cast<size_t>(c.n_layers));
  for (int64_t l = 0; l < c.n_layers; ++l) {
    LayerWeights& lw = w.layers[static_cast<size_t>(l)];
    for (int bi = 0; bi < 2; ++bi) {
      std::string name = HfLayerNormName(l, bi == 1);
      CHORUS_ASSIGN_OR_RETURN(Tensor t, find(name));
      CHORUS_ASSIGN_OR_RETURN(Tensor f, ToF32Vector(t, c.n_embd, name));
      (bi == 0 ? lw.attn_norm : lw.ffn_norm) = f;
    }
    for (int li = 0; li < kNumLinears; ++li) {
      std::string name = HfLayerTensorName(l, static_cast<Linear>(li));
      CHORUS_ASSIGN_OR_RETURN(Tensor t, find(name));
      CHORUS_RETURN_IF_ERROR(
          CheckMatrix(t, shapes[li][0], shapes[li][1], name).WithContext(source));
      auto packed = kernels::PackedWeight::Pack(t);
      if (!packed.ok()) return packed.status().WithContext(source + ": " + name);
      lw.linear[li] = std::move(packed).value();
      // A repacked copy replaces the source for compute: let the mmapped pages go so the
      // weights are resident once, not twice.
      if (lw.linear[li].packed_bytes() > 0)
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

int64_t Model::StreamedBytesPerToken() const {
  int64_t b = weights_.output.source().view().NumBytes();
  for (const auto& l : weights_.layers)
    for (const auto& m : l.linear) b += m.source().view().NumBytes();
  return b;
}

}  // namespace chorus::model
