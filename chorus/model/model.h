// Model: a loaded base model — config, weights ready for the kernels, and where they came from.
// Base weights are immutable and shared (`std::shared_ptr<const Model>`); matrices point into
// the mmapped file where its layout is the compute layout (base weights are immutable and shared).
//
// Thread-safety: immutable after Load(); share freely.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "chorus/kernels/matmul.h"
#include "chorus/model/config.h"
#include "chorus/tensor/tensor.h"

namespace chorus::model {

// The seven linear layers of a block, in the order adapters name them (PEFT target modules
// q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj).
enum class Linear : int { kQ = 0, kK, kV, kO, kGate, kUp, kDown };
inline constexpr int kNumLinears = 7;
const char* LinearName(Linear l);  // "q_proj", ...
// Input / output features of a base linear: q [q_dim ← n_embd], o [n_embd ← q_dim], ...
int64_t LinearIn(const ModelConfig& c, Linear l);
int64_t LinearOut(const ModelConfig& c, Linear l);

// Linears that read the same input, declared once for every consumer: the forward pass computes
// a group in one fused dispatch, and a variant kind (model::LinearHook) receives the group's
// outputs in one ApplyGroup call so that it can share work between them (LoRA fuses the
// group's shrinks). kQkv = q|k|v read the attention norm's output; kGateUp = gate|up read the
// MLP norm's. o and down belong to no group.
enum class LinearGroup : int { kQkv = 0, kGateUp = 1 };
inline constexpr int kNumLinearGroups = 2;
inline constexpr int kMaxLinearGroupSize = 3;
// The members of `g`, in the order the forward pass computes them.
std::span<const Linear> LinearGroupMembers(LinearGroup g);
// The group `l` belongs to, or nullopt (o, down).
std::optional<LinearGroup> LinearGroupOf(Linear l);

struct LayerWeights {
  // Norm weights are f32 and already hold (1 + w) when config.norm_plus_one.
  Tensor attn_norm;                           // [n_embd] f32
  Tensor ffn_norm;                            // [n_embd] f32
  Tensor post_attn_norm, post_ffn_norm;       // [n_embd] f32; only with config.sandwich_norms
  Tensor q_norm, k_norm;                      // [head_dim] f32; only with config.qk_norm
  kernels::PackedWeight linear[kNumLinears];  // q [q_dim, n_embd], k/v [kv_dim, n_embd],
                                              // o [n_embd, q_dim], gate/up [n_ff, n_embd],
                                              // down [n_embd, n_ff]
  Tensor bq, bk, bv;  // [q_dim] / [kv_dim] f32; empty unless config.qkv_bias
  const kernels::PackedWeight& W(Linear l) const { return linear[static_cast<int>(l)]; }
};

struct Weights {
  Tensor tok_embd;               // [vocab, n_embd], any dtype (rows dequantized at lookup)
  Tensor output_norm;            // [n_embd] f32
  kernels::PackedWeight output;  // [vocab, n_embd] (the embedding itself when tied)
  std::vector<LayerWeights> layers;
};

enum class ModelFormat { kLlama2c, kHfDirectory, kGguf, kSynthetic };
const char* ModelFormatName(ModelFormat f);

// What Build() does with a mapped source matrix once the kernels hold a repacked copy of it.
enum class SourcePages {
  // Reclaim its pages (MADV_PAGEOUT): the weights are resident once, not twice. This also
  // drops them from the page cache, so loading the file again reads it from storage.
  kRelease,
  // Leave them: the next load of the same file is served from the page cache. For models
  // loaded and unloaded repeatedly (`--swap-full-models`).
  kKeep,
};

class Model {
 public:
  // Canonical tensors in Hugging Face naming ("model.layers.0.self_attn.q_proj.weight", ...),
  // exactly as stored (dtype, and q/k row order per config.rope_layout; Gemma's norms hold w,
  // not 1 + w; Phi-3's fused projections split by SplitFusedProjections into row views of the
  // same bytes). Build() validates names and shapes against the config and prepares the
  // kernels' weights.
  using NamedTensors = std::vector<std::pair<std::string, Tensor>>;
  static Result<std::shared_ptr<const Model>> Build(ModelConfig config, NamedTensors tensors,
                                                    ModelFormat format, std::string source,
                                                    SourcePages pages = SourcePages::kRelease);
  // `m` with the tensors of `replacements` (by name, same shapes or Build's errors) in place of
  // its own: a fine-tune's changed norms and embeddings over a base (`chorus compress`). The
  // matrices it keeps share m's prepared weights instead of being repacked again.
  static Result<std::shared_ptr<const Model>> WithTensors(const Model& m,
                                                          const NamedTensors& replacements,
                                                          std::string source);

  const ModelConfig& config() const { return config_; }
  const Weights& weights() const { return weights_; }
  const NamedTensors& tensors() const { return tensors_; }
  ModelFormat format() const { return format_; }
  const std::string& source() const { return source_; }
  // Bytes of weights as stored, and extra bytes of repacked copies.
  int64_t WeightBytes() const;
  int64_t PackedBytes() const;
  // Bytes of matrix weights streamed per decode step (all linears + output).
  int64_t StreamedBytesPerToken() const;
  // Pages out t's mapped bytes again if t (one of tensors()) is the source of a matrix the
  // kernels hold a repacked copy of, as Build did: for readers of tensors() that page them back
  // in (hashing the weights, compress). Nothing for other tensors, or for a model built with
  // SourcePages::kKeep.
  void ReleaseSourcePages(const Tensor& t) const;

 private:
  Model() = default;
  // Build, reusing `reuse`'s prepared matrices wherever a matrix is the same bytes (null: none).
  static Result<std::shared_ptr<const Model>> BuildReusing(ModelConfig config, NamedTensors tensors,
                                                           ModelFormat format, std::string source,
                                                           SourcePages pages, const Model* reuse);
  ModelConfig config_;
  Weights weights_;
  NamedTensors tensors_;
  ModelFormat format_ = ModelFormat::kSynthetic;
  std::string source_;
  SourcePages pages_ = SourcePages::kRelease;
};

// A model's file as read: its config and canonical tensors (Model::Build's inputs), mapped and
// validated by the format's reader (model::ReadModelFile) but not prepared for the kernels. For
// tools that only read the tensors (`chorus compress` reads a fine-tune's matrices once, one at
// a time): a Model's repacked weights would double the resident bytes of a file it never runs.
struct ModelFile {
  ModelConfig config;
  Model::NamedTensors tensors;
  ModelFormat format = ModelFormat::kSynthetic;
  std::string source;
  // The file of a loaded model: the same config, tensors (views of the same bytes) and source.
  static ModelFile Of(const Model& m) { return {m.config(), m.tensors(), m.format(), m.source()}; }
};

// The per-layer norms of a block, by role.
enum class Norm { kAttn, kFfn, kPostAttn, kPostFfn, kQ, kK };
// Its HF name for the config's family: kFfn is post_attention_layernorm in Llama-style blocks
// but pre_feedforward_layernorm in Gemma's, whose post_attention_layernorm is kPostAttn.
std::string HfNormName(const ModelConfig& c, int64_t layer, Norm n);
// Phi-3's fused projections: qkv_proj = [q; k; v] rows, gate_up_proj = [gate; up] rows.
std::string HfFusedQkvName(int64_t layer);     // ...self_attn.qkv_proj.weight
std::string HfFusedGateUpName(int64_t layer);  // ...mlp.gate_up_proj.weight
// Families whose checkpoints store the fused projections.
inline bool FusedProjections(const ModelConfig& c) { return c.arch == "phi3"; }
// For such a family, replaces each layer's fused qkv_proj / gate_up_proj in `tensors` by the
// members' row views (LinearGroupMembers order: q, k, v / gate, up), so every consumer — Build,
// LoRA merging, delta compression — sees the seven linears of every family; `chorus convert`
// fuses them again on write. A missing or mis-shaped fused tensor is an error naming it.
// No-op for other families.
Status SplitFusedProjections(const ModelConfig& c, Model::NamedTensors* tensors,
                             const std::string& source);

// HF tensor names used by Model::Build.
std::string HfLayerTensorName(int64_t layer, Linear l);  // ...self_attn.q_proj.weight
std::string HfLayerNormName(int64_t layer,
                            bool ffn);            // ...input_layernorm / post_attention_layernorm
std::string HfBiasName(int64_t layer, Linear l);  // ...self_attn.q_proj.bias

}  // namespace chorus::model
