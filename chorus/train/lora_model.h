// A trainable LoRA adapter over a frozen base model, and the training forward / backward pass
// (docs/finetuning.md).
//
// LoraParams holds, per targeted (layer, linear), A [r, in] and Bᵀ [r, out] (lora_B transposed,
// the compute layout of kernels/lora.h) in f32 with their gradients and AdamW moments; q/k rows
// of B are in the base's pair order (config.rope_layout), converted to Hugging Face order when
// written (ToLoraWeights → adapters::WritePeftLora). Initialised as PEFT does: A uniform in
// ±1/√in (kaiming_uniform with a = √5), B = 0, s = alpha / r.
//
// TrainModel runs a micro-batch of packed rows (Batch) through the base with the adapter's terms
// y += s·(x·Aᵀ)·Bᵀ, saving every layer's activations (docs/finetuning.md, "Memory"), then the
// backward pass through the output head, RMSNorm, SiLU·mul, attention, RoPE and the base matmuls
// (grad_kernels.h's MatMulTransposed reads the stored, possibly quantized, weights), adding the
// A / Bᵀ gradients into LoraParams. Base weights are never modified or copied.
//
// Thread-safety: a TrainModel is used by one thread at a time (it owns its activation buffers);
// the Model is shared and immutable.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "chorus/adapters/lora/lora_adapter.h"
#include "chorus/base/status.h"
#include "chorus/base/thread_pool.h"
#include "chorus/model/model.h"

namespace chorus::train {

struct LoraSpec {
  int64_t rank = 8;
  float alpha = 16.0f;
  std::vector<model::Linear> targets = {model::Linear::kQ, model::Linear::kK, model::Linear::kV,
                                        model::Linear::kO};
  uint64_t seed = 1;
};

// One trainable tensor with its gradient and optimizer moments (all the same size).
struct Param {
  std::vector<float> value, grad, m, v;
  void Resize(size_t n) {
    value.assign(n, 0.0f);
    grad.assign(n, 0.0f);
    m.assign(n, 0.0f);
    v.assign(n, 0.0f);
  }
};

class LoraParams {
 public:
  struct Module {
    int64_t rank = 0, in = 0, out = 0;
    float alpha = 0, scale = 0;
    Param a;   // [rank, in]
    Param bt;  // [rank, out]
  };

  // Fresh weights for `base` (A uniform ±1/√in from `spec.seed`, B = 0).
  static Result<LoraParams> Init(const model::ModelConfig& base, const LoraSpec& spec);

  int64_t n_layers() const { return n_layers_; }
  const LoraSpec& spec() const { return spec_; }
  Module& module(int64_t layer, model::Linear l) {
    return modules_[static_cast<size_t>(layer * model::kNumLinears + static_cast<int>(l))];
  }
  const Module& module(int64_t layer, model::Linear l) const {
    return modules_[static_cast<size_t>(layer * model::kNumLinears + static_cast<int>(l))];
  }
  // Every trainable tensor, in a fixed order (layer, linear, A then Bᵀ), with a stable name
  // ("layers.3.self_attn.q_proj.lora_A") for checkpoints.
  std::vector<Param*> params();
  std::vector<const Param*> params() const;
  std::vector<std::string> param_names() const;
  int64_t n_trainable() const;
  void ZeroGrad();

  // The adapter as a file holds it: A [r, in], B [out, r] f32, q/k rows in the base's order.
  adapters::LoraWeights ToLoraWeights(const model::ModelConfig& base) const;

 private:
  int64_t n_layers_ = 0;
  LoraSpec spec_;
  std::vector<Module> modules_;  // [n_layers × kNumLinears]
};

// A micro-batch: rows of one or more packed sequences, one after the other.
struct Batch {
  std::vector<int32_t> tokens;     // [n]
  std::vector<int32_t> positions;  // [n] position inside the row's sample (RoPE)
  std::vector<int32_t> seg_start;  // [n] first row of the row's sample (attention window)
  std::vector<int32_t> targets;    // [n] next token to predict, or -1 (no loss at this row)
  int64_t size() const { return static_cast<int64_t>(tokens.size()); }
  int64_t loss_tokens() const;
};

struct LossSum {
  double sum = 0;      // Σ −log p(target) over rows with a target
  int64_t tokens = 0;  // rows with a target
};

class TrainModel {
 public:
  // Buffers for micro-batches of up to `max_rows` rows.
  TrainModel(std::shared_ptr<const model::Model> model, int64_t max_rows);
  const model::Model& model() const { return *model_; }
  int64_t max_rows() const { return max_rows_; }

  // Forward and backward: adds grad_scale · ∂(Σ losses)/∂θ into params' gradients.
  // Requires: batch rows ≤ max_rows, tokens < vocab, positions < max_seq_len, targets < vocab.
  Result<LossSum> ForwardBackward(const Batch& b, LoraParams* params, float grad_scale,
                                  ThreadPool* pool);
  // Forward only (evaluation, finite differences).
  Result<LossSum> Loss(const Batch& b, const LoraParams& params, ThreadPool* pool);

  // Bytes of activation buffers held (docs/finetuning.md, "Memory").
  int64_t activation_bytes() const;

 private:
  struct LayerActs {
    std::vector<float> x, xn1, q, k, v, probs, att, x_mid, xn2, gate, up, h;
    std::vector<float> u[model::kNumLinears];  // LoRA shrink outputs x·Aᵀ [n, r]
  };
  Status Check(const Batch& b) const;
  // Runs the forward pass, leaving the logits of rows with a target in logits_.
  LossSum Forward(const Batch& b, const LoraParams& params, ThreadPool* pool);
  void Backward(const Batch& b, LoraParams* params, ThreadPool* pool);
  // y (+)= x·Wᵀ + s·(x·Aᵀ)·Bᵀ for rows [0, n); saves x·Aᵀ into u.
  void LinearForward(int64_t layer, model::Linear l, const LoraParams& p, const float* x, int64_t n,
                     float* y, std::vector<float>* u, ThreadPool* pool);
  // dx (+)= dy·W + LoRA input term; adds dA, dBᵀ.
  void LinearBackward(int64_t layer, model::Linear l, LoraParams* p, const float* x,
                      const std::vector<float>& u, const float* dy, int64_t n, float* dx,
                      bool accumulate, bool need_dx, ThreadPool* pool);

  std::shared_ptr<const model::Model> model_;
  int64_t max_rows_;
  std::vector<float> inv_freq_;
  std::vector<LayerActs> acts_;
  std::vector<float> x_final_, xn_final_, logits_, rope_cos_, rope_sin_;
  std::vector<int32_t> loss_rows_, loss_targets_;
  // Backward scratch.
  // Row tables (kernels/lora.h) of the module in use, rebuilt per call: params may be copied.
  std::vector<const float*> a_rows_, bt_rows_;
  void SetRowTables(const LoraParams::Module& m);
  std::vector<float> dx_, dxn_, datt_, dq_, dk_, dv_, dgate_, dup_, dz_, su_, tmp_;
};

}  // namespace chorus::train
