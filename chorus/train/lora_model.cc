#include "chorus/train/lora_model.h"

#include <algorithm>
#include <cmath>

#include "chorus/base/rng.h"
#include "chorus/kernels/lora.h"
#include "chorus/kernels/matmul.h"
#include "chorus/kernels/ops.h"
#include "chorus/tensor/dtype.h"
#include "chorus/train/grad_kernels.h"
#include "chorus/train/layer_ops.h"

namespace chorus::train {

using model::Linear;

Result<LoraParams> LoraParams::Init(const model::ModelConfig& base, const LoraSpec& spec) {
  if (spec.rank < 1 || spec.rank > 256) {
    return InvalidArgumentError("LoRA rank must be in [1, 256], got " + std::to_string(spec.rank));
  }
  if (!(spec.alpha > 0.0f) || !std::isfinite(spec.alpha)) {
    return InvalidArgumentError("LoRA alpha must be positive and finite");
  }
  if (spec.targets.empty()) return InvalidArgumentError("no LoRA target modules");
  LoraParams p;
  p.n_layers_ = base.n_layers;
  p.spec_ = spec;
  p.modules_.resize(static_cast<size_t>(base.n_layers * model::kNumLinears));
  Rng rng(spec.seed);
  for (int64_t l = 0; l < base.n_layers; ++l) {
    for (int li = 0; li < model::kNumLinears; ++li) {
      const Linear lin = static_cast<Linear>(li);
      if (std::find(spec.targets.begin(), spec.targets.end(), lin) == spec.targets.end()) continue;
      Module& m = p.module(l, lin);
      m.rank = spec.rank;
      m.in = model::LinearIn(base, lin);
      m.out = model::LinearOut(base, lin);
      m.alpha = spec.alpha;
      m.scale = spec.alpha / static_cast<float>(spec.rank);
      m.a.Resize(static_cast<size_t>(m.rank * m.in));
      m.bt.Resize(static_cast<size_t>(m.rank * m.out));
      // PEFT: kaiming_uniform_(A, a=√5) = U(±√(6/((1+5)·in))) = U(±1/√in); B = 0.
      const float bound = 1.0f / std::sqrt(static_cast<float>(m.in));
      for (float& x : m.a.value) x = (2.0f * rng.NextFloat() - 1.0f) * bound;
    }
  }
  return p;
}

std::vector<Param*> LoraParams::params() {
  std::vector<Param*> out;
  for (Module& m : modules_) {
    if (m.rank == 0) continue;
    out.push_back(&m.a);
    out.push_back(&m.bt);
  }
  return out;
}

std::vector<const Param*> LoraParams::params() const {
  std::vector<const Param*> out;
  for (const Module& m : modules_) {
    if (m.rank == 0) continue;
    out.push_back(&m.a);
    out.push_back(&m.bt);
  }
  return out;
}

std::vector<std::string> LoraParams::param_names() const {
  std::vector<std::string> out;
  for (int64_t l = 0; l < n_layers_; ++l) {
    for (int li = 0; li < model::kNumLinears; ++li) {
      if (module(l, static_cast<Linear>(li)).rank == 0) continue;
      const std::string base = adapters::LoraModuleName(l, static_cast<Linear>(li));
      out.push_back(base + ".lora_A");
      out.push_back(base + ".lora_BT");
    }
  }
  return out;
}

int64_t LoraParams::n_trainable() const {
  int64_t n = 0;
  for (const Param* p : params()) n += static_cast<int64_t>(p->value.size());
  return n;
}

void LoraParams::ZeroGrad() {
  for (Param* p : params()) std::fill(p->grad.begin(), p->grad.end(), 0.0f);
}

adapters::LoraWeights LoraParams::ToLoraWeights(const model::ModelConfig& base) const {
  adapters::LoraWeights w = adapters::LoraWeights::Empty(n_layers_);
  w.qk_layout = base.rope_layout;
  for (int64_t l = 0; l < n_layers_; ++l) {
    for (int li = 0; li < model::kNumLinears; ++li) {
      const Module& m = module(l, static_cast<Linear>(li));
      if (m.rank == 0) continue;
      adapters::LoraModuleWeights& mw = w.at(l, static_cast<Linear>(li));
      mw.alpha = m.alpha;
      mw.a = Tensor::Zeros(DType::kF32, {m.rank, m.in});
      std::copy(m.a.value.begin(), m.a.value.end(), static_cast<float*>(mw.a.mutable_data()));
      mw.b = Tensor::Zeros(DType::kF32, {m.out, m.rank});
      float* b = static_cast<float*>(mw.b.mutable_data());
      for (int64_t o = 0; o < m.out; ++o) {
        for (int64_t j = 0; j < m.rank; ++j) {
          b[o * m.rank + j] = m.bt.value[static_cast<size_t>(j * m.out + o)];
        }
      }
    }
  }
  return w;
}

int64_t Batch::loss_tokens() const {
  int64_t n = 0;
  for (int32_t t : targets) n += t >= 0;
  return n;
}

TrainModel::TrainModel(std::shared_ptr<const model::Model> model, int64_t max_rows)
    : model_(std::move(model)), max_rows_(max_rows) {
  inv_freq_ = model_->config().RopeInvFreq();
  acts_.resize(static_cast<size_t>(model_->config().n_layers));
}

int64_t TrainModel::activation_bytes() const {
  int64_t floats = 0;
  auto add = [&](const std::vector<float>& v) { floats += static_cast<int64_t>(v.capacity()); };
  for (const LayerActs& a : acts_) {
    for (const auto* v : {&a.x, &a.xn1, &a.q, &a.k, &a.v, &a.probs, &a.att, &a.x_mid, &a.xn2,
                          &a.gate, &a.up, &a.h}) {
      add(*v);
    }
    for (const auto& u : a.u) add(u);
  }
  for (const auto* v : {&x_final_, &xn_final_, &logits_, &dx_, &dxn_, &datt_, &dq_, &dk_, &dv_,
                        &dgate_, &dup_, &dz_, &su_, &tmp_}) {
    add(*v);
  }
  return floats * 4;
}

Status TrainModel::Check(const Batch& b) const {
  const model::ModelConfig& c = model_->config();
  const int64_t n = b.size();
  if (n == 0) return InvalidArgumentError("empty batch");
  if (n > max_rows_) {
    return InvalidArgumentError("batch of " + std::to_string(n) + " rows, max " +
                                std::to_string(max_rows_));
  }
  if (static_cast<int64_t>(b.positions.size()) != n ||
      static_cast<int64_t>(b.seg_start.size()) != n ||
      static_cast<int64_t>(b.targets.size()) != n) {
    return InvalidArgumentError("batch arrays differ in length");
  }
  for (int64_t t = 0; t < n; ++t) {
    const size_t i = static_cast<size_t>(t);
    if (b.tokens[i] < 0 || b.tokens[i] >= c.vocab_size || b.targets[i] >= c.vocab_size) {
      return InvalidArgumentError("token id outside the vocabulary at row " + std::to_string(t));
    }
    if (b.positions[i] < 0 || b.positions[i] >= c.max_seq_len) {
      return InvalidArgumentError("position " + std::to_string(b.positions[i]) +
                                  " outside the model's context of " +
                                  std::to_string(c.max_seq_len));
    }
    if (b.seg_start[i] < 0 || b.seg_start[i] > t ||
        (t > 0 && b.seg_start[i] != t && b.seg_start[i] != b.seg_start[i - 1])) {
      return InvalidArgumentError("bad sample start at row " + std::to_string(t));
    }
  }
  return OkStatus();
}

void TrainModel::SetRowTables(const LoraParams::Module& m) {
  a_rows_.clear();
  bt_rows_.clear();
  for (int64_t j = 0; j < m.rank; ++j) {
    a_rows_.push_back(m.a.value.data() + j * m.in);
    bt_rows_.push_back(m.bt.value.data() + j * m.out);
  }
}

void TrainModel::LinearForward(int64_t layer, Linear l, const LoraParams& p, const float* x,
                               int64_t n, float* y, std::vector<float>* u, ThreadPool* pool) {
  const kernels::PackedWeight& w = model_->weights().layers[static_cast<size_t>(layer)].W(l);
  const int64_t in = w.k(), out = w.n();
  kernels::MatMul(w, x, in, n, y, out, /*accumulate=*/false, pool);
  const LoraParams::Module& m = p.module(layer, l);
  if (m.rank == 0) return;
  SetRowTables(m);
  u->resize(static_cast<size_t>(n * m.rank));
  const kernels::LoraSegment seg{0, n, 0};
  const kernels::LoraShrinkWeight sw{a_rows_.data(), m.rank, nullptr};
  kernels::LoraShrink({&seg, 1}, {&sw, 1}, x, in, in, u->data(), m.rank, pool);
  const kernels::LoraExpandWeight ew{bt_rows_.data(), m.rank, 0, m.scale, nullptr};
  kernels::LoraExpand({&seg, 1}, {&ew, 1}, u->data(), m.rank, out, y, out, pool);
}

void TrainModel::LinearBackward(int64_t layer, Linear l, LoraParams* p, const float* x,
                                const std::vector<float>& u, const float* dy, int64_t n, float* dx,
                                bool accumulate, bool need_dx, ThreadPool* pool) {
  const kernels::PackedWeight& w = model_->weights().layers[static_cast<size_t>(layer)].W(l);
  const int64_t in = w.k(), out = w.n();
  if (need_dx) MatMulTransposed(w, dy, out, n, dx, in, accumulate, pool);
  LoraParams::Module& m = p->module(layer, l);
  if (m.rank == 0) return;
  SetRowTables(m);
  const int64_t r = m.rank;
  const kernels::LoraSegment seg{0, n, 0};
  // dz = s·dy·B: a shrink of dy by the rows of Bᵀ.
  dz_.resize(static_cast<size_t>(n * r));
  const kernels::LoraShrinkWeight sw{bt_rows_.data(), r, nullptr};
  kernels::LoraShrink({&seg, 1}, {&sw, 1}, dy, out, out, dz_.data(), r, pool);
  for (float& z : dz_) z *= m.scale;
  // dBᵀ += (s·u)ᵀ·dy, dA += dzᵀ·x.
  su_.resize(static_cast<size_t>(n * r));
  for (size_t i = 0; i < su_.size(); ++i) su_[i] = m.scale * u[i];
  AccumulateOuter(su_.data(), r, r, dy, out, out, n, m.bt.grad.data(), out, pool);
  AccumulateOuter(dz_.data(), r, r, x, in, in, n, m.a.grad.data(), in, pool);
  if (need_dx) {
    // dx += dz·A: an expand of dz by the rows of A.
    const kernels::LoraExpandWeight ew{a_rows_.data(), r, 0, 1.0f, nullptr};
    kernels::LoraExpand({&seg, 1}, {&ew, 1}, dz_.data(), r, in, dx, in, pool);
  }
}

LossSum TrainModel::Forward(const Batch& b, const LoraParams& p, ThreadPool* pool) {
  const model::ModelConfig& c = model_->config();
  const model::Weights& w = model_->weights();
  const int64_t n = b.size(), d = c.n_embd, qd = c.q_dim(), kvd = c.kv_dim(), ff = c.n_ff;
  const int64_t half = c.head_dim / 2;
  const AttentionShape shape{c.n_heads, c.n_kv_heads, c.head_dim,
                             1.0f / std::sqrt(static_cast<float>(c.head_dim))};
  auto size = [](std::vector<float>& v, int64_t k) { v.resize(static_cast<size_t>(k)); };
  rope_cos_.resize(static_cast<size_t>(n * half));
  rope_sin_.resize(static_cast<size_t>(n * half));
  for (int64_t i = 0; i < n; ++i) {
    kernels::RopeTable(b.positions[static_cast<size_t>(i)], inv_freq_.data(), half,
                       rope_cos_.data() + i * half, rope_sin_.data() + i * half);
  }
  size(acts_[0].x, n * d);
  const TensorView& emb = w.tok_embd.view();
  for (int64_t i = 0; i < n; ++i) {
    DequantizeRow(emb.dtype, emb.Row(b.tokens[static_cast<size_t>(i)]), acts_[0].x.data() + i * d,
                  d);
  }
  size(tmp_, n * d);
  const int64_t prob_floats = AttentionProbFloats(b.seg_start.data(), n, shape);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    LayerActs& A = acts_[static_cast<size_t>(l)];
    const model::LayerWeights& lw = w.layers[static_cast<size_t>(l)];
    size(A.xn1, n * d);
    size(A.q, n * qd);
    size(A.k, n * kvd);
    size(A.v, n * kvd);
    size(A.probs, prob_floats);
    size(A.att, n * qd);
    size(A.x_mid, n * d);
    size(A.xn2, n * d);
    size(A.gate, n * ff);
    size(A.up, n * ff);
    size(A.h, n * ff);
    kernels::RmsNorm(A.x.data(), static_cast<const float*>(lw.attn_norm.data()), n, d, c.norm_eps,
                     A.xn1.data());
    LinearForward(l, Linear::kQ, p, A.xn1.data(), n, A.q.data(), &A.u[0], pool);
    LinearForward(l, Linear::kK, p, A.xn1.data(), n, A.k.data(), &A.u[1], pool);
    LinearForward(l, Linear::kV, p, A.xn1.data(), n, A.v.data(), &A.u[2], pool);
    for (int64_t i = 0; i < n; ++i) {
      float* q = A.q.data() + i * qd;
      float* k = A.k.data() + i * kvd;
      if (c.qkv_bias) {
        kernels::Add(q, static_cast<const float*>(lw.bq.data()), qd);
        kernels::Add(k, static_cast<const float*>(lw.bk.data()), kvd);
        kernels::Add(A.v.data() + i * kvd, static_cast<const float*>(lw.bv.data()), kvd);
      }
      kernels::RopeApply(q, c.n_heads, c.head_dim, rope_cos_.data() + i * half,
                         rope_sin_.data() + i * half, c.rope_layout);
      kernels::RopeApply(k, c.n_kv_heads, c.head_dim, rope_cos_.data() + i * half,
                         rope_sin_.data() + i * half, c.rope_layout);
    }
    AttentionForward(A.q.data(), A.k.data(), A.v.data(), b.seg_start.data(), n, shape,
                     A.probs.data(), A.att.data(), pool);
    LinearForward(l, Linear::kO, p, A.att.data(), n, tmp_.data(), &A.u[3], pool);
    for (int64_t i = 0; i < n * d; ++i) A.x_mid[static_cast<size_t>(i)] = A.x[i] + tmp_[i];
    kernels::RmsNorm(A.x_mid.data(), static_cast<const float*>(lw.ffn_norm.data()), n, d,
                     c.norm_eps, A.xn2.data());
    LinearForward(l, Linear::kGate, p, A.xn2.data(), n, A.gate.data(), &A.u[4], pool);
    LinearForward(l, Linear::kUp, p, A.xn2.data(), n, A.up.data(), &A.u[5], pool);
    kernels::SiluMul(A.gate.data(), A.up.data(), n * ff, A.h.data());
    LinearForward(l, Linear::kDown, p, A.h.data(), n, tmp_.data(), &A.u[6], pool);
    std::vector<float>& next = l + 1 < c.n_layers ? acts_[static_cast<size_t>(l + 1)].x : x_final_;
    size(next, n * d);
    for (int64_t i = 0; i < n * d; ++i) next[static_cast<size_t>(i)] = A.x_mid[i] + tmp_[i];
  }
  // The head only for rows with a target.
  loss_rows_.clear();
  loss_targets_.clear();
  for (int64_t i = 0; i < n; ++i) {
    if (b.targets[static_cast<size_t>(i)] >= 0) {
      loss_rows_.push_back(static_cast<int32_t>(i));
      loss_targets_.push_back(b.targets[static_cast<size_t>(i)]);
    }
  }
  const int64_t nl = static_cast<int64_t>(loss_rows_.size());
  LossSum ls;
  ls.tokens = nl;
  if (nl == 0) return ls;
  size(xn_final_, nl * d);
  for (int64_t j = 0; j < nl; ++j) {
    kernels::RmsNorm(x_final_.data() + loss_rows_[static_cast<size_t>(j)] * d,
                     static_cast<const float*>(w.output_norm.data()), 1, d, c.norm_eps,
                     xn_final_.data() + j * d);
  }
  size(logits_, nl * c.vocab_size);
  kernels::MatMul(w.output, xn_final_.data(), d, nl, logits_.data(), c.vocab_size, false, pool);
  return ls;
}

Result<LossSum> TrainModel::Loss(const Batch& b, const LoraParams& params, ThreadPool* pool) {
  CHORUS_RETURN_IF_ERROR(Check(b));
  LossSum ls = Forward(b, params, pool);
  if (ls.tokens > 0) {
    ls.sum = SoftmaxCrossEntropy(logits_.data(), loss_targets_.data(), ls.tokens,
                                 model_->config().vocab_size, 0.0f, pool);
  }
  return ls;
}

Result<LossSum> TrainModel::ForwardBackward(const Batch& b, LoraParams* params, float grad_scale,
                                            ThreadPool* pool) {
  CHORUS_RETURN_IF_ERROR(Check(b));
  LossSum ls = Forward(b, *params, pool);
  if (ls.tokens == 0) return ls;
  ls.sum = SoftmaxCrossEntropy(logits_.data(), loss_targets_.data(), ls.tokens,
                               model_->config().vocab_size, grad_scale, pool);
  Backward(b, params, pool);
  return ls;
}

void TrainModel::Backward(const Batch& b, LoraParams* p, ThreadPool* pool) {
  const model::ModelConfig& c = model_->config();
  const model::Weights& w = model_->weights();
  const int64_t n = b.size(), d = c.n_embd, qd = c.q_dim(), kvd = c.kv_dim(), ff = c.n_ff;
  const int64_t half = c.head_dim / 2;
  const AttentionShape shape{c.n_heads, c.n_kv_heads, c.head_dim,
                             1.0f / std::sqrt(static_cast<float>(c.head_dim))};
  auto size = [](std::vector<float>& v, int64_t k) { v.resize(static_cast<size_t>(k)); };
  const int64_t nl = static_cast<int64_t>(loss_rows_.size());
  // Head: logits_ holds dlogits; dxn = dlogits·W_out, then the final norm's backward.
  size(dxn_, std::max(n, nl) * d);
  MatMulTransposed(w.output, logits_.data(), c.vocab_size, nl, dxn_.data(), d, false, pool);
  size(dx_, n * d);
  std::fill(dx_.begin(), dx_.end(), 0.0f);
  for (int64_t j = 0; j < nl; ++j) {
    const int64_t row = loss_rows_[static_cast<size_t>(j)];
    RmsNormBackward(x_final_.data() + row * d, static_cast<const float*>(w.output_norm.data()), 1,
                    d, c.norm_eps, dxn_.data() + j * d, dx_.data() + row * d, false);
  }
  size(datt_, n * qd);
  size(dq_, n * qd);
  size(dk_, n * kvd);
  size(dv_, n * kvd);
  size(dgate_, n * ff);
  size(dup_, n * ff);
  for (int64_t l = c.n_layers - 1; l >= 0; --l) {
    LayerActs& A = acts_[static_cast<size_t>(l)];
    const model::LayerWeights& lw = w.layers[static_cast<size_t>(l)];
    // MLP: x_out = x_mid + down(silu(gate)·up); dx_ holds ∂/∂x_out.
    LinearBackward(l, Linear::kDown, p, A.h.data(), A.u[6], dx_.data(), n, dgate_.data(), false,
                   true, pool);
    SiluMulBackward(A.gate.data(), A.up.data(), dgate_.data(), n * ff, dgate_.data(), dup_.data());
    LinearBackward(l, Linear::kGate, p, A.xn2.data(), A.u[4], dgate_.data(), n, dxn_.data(), false,
                   true, pool);
    LinearBackward(l, Linear::kUp, p, A.xn2.data(), A.u[5], dup_.data(), n, dxn_.data(), true, true,
                   pool);
    RmsNormBackward(A.x_mid.data(), static_cast<const float*>(lw.ffn_norm.data()), n, d, c.norm_eps,
                    dxn_.data(), dx_.data(), true);  // dx_ = ∂/∂x_mid
    // Attention: x_mid = x + o(attention(rope(q), rope(k), v)).
    LinearBackward(l, Linear::kO, p, A.att.data(), A.u[3], dx_.data(), n, datt_.data(), false, true,
                   pool);
    AttentionBackward(A.q.data(), A.k.data(), A.v.data(), A.probs.data(), b.seg_start.data(), n,
                      shape, datt_.data(), dq_.data(), dk_.data(), dv_.data(), pool);
    for (int64_t i = 0; i < n; ++i) {
      RopeBackward(dq_.data() + i * qd, c.n_heads, c.head_dim, rope_cos_.data() + i * half,
                   rope_sin_.data() + i * half, c.rope_layout);
      RopeBackward(dk_.data() + i * kvd, c.n_kv_heads, c.head_dim, rope_cos_.data() + i * half,
                   rope_sin_.data() + i * half, c.rope_layout);
    }
    // The embedding is frozen: layer 0 needs no input gradient.
    const bool need = l > 0;
    LinearBackward(l, Linear::kQ, p, A.xn1.data(), A.u[0], dq_.data(), n, dxn_.data(), false, need,
                   pool);
    LinearBackward(l, Linear::kK, p, A.xn1.data(), A.u[1], dk_.data(), n, dxn_.data(), true, need,
                   pool);
    LinearBackward(l, Linear::kV, p, A.xn1.data(), A.u[2], dv_.data(), n, dxn_.data(), true, need,
                   pool);
    if (need) {
      RmsNormBackward(A.x.data(), static_cast<const float*>(lw.attn_norm.data()), n, d, c.norm_eps,
                      dxn_.data(), dx_.data(), true);  // dx_ = ∂/∂x
    }
  }
}

}  // namespace chorus::train
