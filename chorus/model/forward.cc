#include "chorus/model/forward.h"

#include <cmath>

#include "chorus/kernels/attention.h"
#include "chorus/kernels/matmul.h"
#include "chorus/kernels/ops.h"

namespace chorus::model {

Forward::Forward(std::shared_ptr<const Model> model, int64_t max_rows, int64_t max_logit_rows)
    : model_(std::move(model)), max_rows_(max_rows), max_logit_rows_(max_logit_rows) {
  const ModelConfig& c = model_->config();
  inv_freq_ = c.RopeInvFreq();
  auto alloc = [&](std::vector<float>& v, int64_t width) {
    v.assign(static_cast<size_t>(max_rows * width), 0.0f);
  };
  alloc(x_, c.n_embd);
  alloc(xb_, std::max(c.n_embd, c.q_dim()));
  alloc(q_, c.q_dim());
  alloc(k_, c.kv_dim());
  alloc(v_, c.kv_dim());
  alloc(att_, c.q_dim());
  alloc(gate_, c.n_ff);
  alloc(up_, c.n_ff);
  rope_cos_.assign(static_cast<size_t>(max_rows * c.head_dim / 2), 0.0f);
  rope_sin_.assign(rope_cos_.size(), 0.0f);
  logit_in_.assign(static_cast<size_t>(max_logit_rows * c.n_embd), 0.0f);
}

void Forward::Linear(int64_t layer, model::Linear which, const float* x, int64_t x_stride, float* y,
                     int64_t y_stride, int64_t n, const StepInput& in, ThreadPool* pool) {
  const kernels::PackedWeight& w = model_->weights().layers[static_cast<size_t>(layer)].W(which);
  kernels::MatMul(w, x, x_stride, n, y, y_stride, /*accumulate=*/false, pool);
  if (in.hook != nullptr) in.hook->Apply(layer, which, x, x_stride, y, y_stride, n, pool);
}

Forward::LinearOut Forward::OutputOf(model::Linear which) {
  const ModelConfig& c = model_->config();
  switch (which) {
    case model::Linear::kQ:
      return {which, q_.data(), c.q_dim()};
    case model::Linear::kK:
      return {which, k_.data(), c.kv_dim()};
    case model::Linear::kV:
      return {which, v_.data(), c.kv_dim()};
    case model::Linear::kGate:
      return {which, gate_.data(), c.n_ff};
    case model::Linear::kUp:
      return {which, up_.data(), c.n_ff};
    default:
      CHORUS_CHECK(false) << "linear " << LinearName(which) << " belongs to no group";
      return {};
  }
}

void Forward::Linears(int64_t layer, LinearGroup group, const float* x, int64_t x_stride, int64_t n,
                      const StepInput& in, ThreadPool* pool) {
  const LayerWeights& lw = model_->weights().layers[static_cast<size_t>(layer)];
  const std::span<const model::Linear> members = LinearGroupMembers(group);
  LinearOut out_storage[kMaxLinearGroupSize];
  for (size_t j = 0; j < members.size(); ++j) out_storage[j] = OutputOf(members[j]);
  const std::span<const LinearOut> outs(out_storage, members.size());
  kernels::MatMulOut mm[kernels::kMaxMatMulOuts];
  static_assert(kMaxLinearGroupSize <= kernels::kMaxMatMulOuts);
  bool same = true;
  for (size_t j = 0; j < outs.size(); ++j) {
    const kernels::PackedWeight& w = lw.W(outs[j].which);
    mm[j] = {&w, outs[j].y, outs[j].y_stride};
    same = same && w.k() == mm[0].w->k() && w.dtype() == mm[0].w->dtype();
  }
  if (same) {
    kernels::MatMulMulti({mm, outs.size()}, x, x_stride, n, /*accumulate=*/false, pool);
  } else {  // e.g. a file that quantizes v differently from q and k
    for (size_t j = 0; j < outs.size(); ++j)
      kernels::MatMul(*mm[j].w, x, x_stride, n, mm[j].y, mm[j].y_stride, false, pool);
  }
  if (in.hook != nullptr) in.hook->ApplyGroup(layer, group, outs, x, x_stride, n, pool);
}

void Forward::Attention(const StepInput& in, memory::KvCache* kv, int64_t layer, ThreadPool* pool) {
  const ModelConfig& c = model_->config();
  const int64_t n = static_cast<int64_t>(in.tokens.size());
  const int64_t group = c.n_heads / c.n_kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  // Tasks are (row, kv head) pairs dealt out round-robin across threads: at batch 1 the heads
  // are shared out, and in a prefill chunk (cost grows with the row's position) every thread
  // gets early and late rows alike — contiguous slices gave the last thread ~3x the work of the
  // first. Each task's result depends only on its own row (batch invariance).
  const int64_t n_tasks = n * c.n_kv_heads;
  pool->Run([&](int ti, int nt) {
    float* scratch = scratch_.data() + static_cast<size_t>(ti) * c.max_seq_len;
    for (int64_t t = ti; t < n_tasks; t += nt) {
      const int64_t row = t / c.n_kv_heads, g = t % c.n_kv_heads;
      const int32_t* table = in.block_tables[static_cast<size_t>(in.seq[static_cast<size_t>(row)])];
      kernels::PagedKv view = kv->View(layer, g, table);
      const int64_t q_off = row * c.q_dim() + g * group * c.head_dim;
      kernels::AttentionRow(q_.data() + q_off, view, in.positions[static_cast<size_t>(row)] + 1,
                            group, 1, c.head_dim, scale, scratch, att_.data() + q_off);
    }
  });
}

void Forward::Run(const StepInput& in, memory::KvCache* kv, ThreadPool* pool, float* logits) {
  const ModelConfig& c = model_->config();
  const Weights& w = model_->weights();
  const int64_t n = static_cast<int64_t>(in.tokens.size());
  CHORUS_CHECK(n > 0 && n <= max_rows_) << "step of " << n << " rows, max " << max_rows_;
  CHORUS_CHECK_LE(static_cast<int64_t>(in.logit_rows.size()), max_logit_rows_);
  if (scratch_threads_ < pool->size()) {  // grows once per pool size, never per step
    scratch_threads_ = pool->size();
    scratch_.assign(static_cast<size_t>(scratch_threads_ * c.max_seq_len), 0.0f);
  }
  const int64_t d = c.n_embd, qd = c.q_dim(), kvd = c.kv_dim(), ff = c.n_ff;
  const int64_t block = kv->layout().block_size;

  // Embedding lookup (rows of any dtype are decoded to f32).
  const TensorView& emb = w.tok_embd.view();
  for (int64_t i = 0; i < n; ++i) {
    DequantizeRow(emb.dtype, emb.Row(in.tokens[static_cast<size_t>(i)]), x_.data() + i * d, d);
  }

  // Rotation tables once per step, shared by q and k of every layer.
  const int64_t half = c.head_dim / 2;
  for (int64_t i = 0; i < n; ++i) {
    kernels::RopeTable(in.positions[static_cast<size_t>(i)], inv_freq_.data(), half,
                       rope_cos_.data() + i * half, rope_sin_.data() + i * half);
  }

  for (int64_t l = 0; l < c.n_layers; ++l) {
    const LayerWeights& lw = w.layers[static_cast<size_t>(l)];
    // Attention block.
    kernels::RmsNorm(x_.data(), static_cast<const float*>(lw.attn_norm.data()), n, d, c.norm_eps,
                     xb_.data());
    // q, k and v read the same input: one fused dispatch (then the adapter terms of each).
    Linears(l, LinearGroup::kQkv, xb_.data(), d, n, in, pool);
    for (int64_t i = 0; i < n; ++i) {
      float* q = q_.data() + i * qd;
      float* k = k_.data() + i * kvd;
      float* v = v_.data() + i * kvd;
      if (c.qkv_bias) {
        kernels::Add(q, static_cast<const float*>(lw.bq.data()), qd);
        kernels::Add(k, static_cast<const float*>(lw.bk.data()), kvd);
        kernels::Add(v, static_cast<const float*>(lw.bv.data()), kvd);
      }
      const int64_t pos = in.positions[static_cast<size_t>(i)];
      const float* cs = rope_cos_.data() + i * half;
      const float* sn = rope_sin_.data() + i * half;
      kernels::RopeApply(q, c.n_heads, c.head_dim, cs, sn, c.rope_layout);
      kernels::RopeApply(k, c.n_kv_heads, c.head_dim, cs, sn, c.rope_layout);
      const int32_t* table = in.block_tables[static_cast<size_t>(in.seq[static_cast<size_t>(i)])];
      const int32_t blk = table[pos / block];
      std::copy(k, k + kvd, kv->K(l, blk, pos % block));
      std::copy(v, v + kvd, kv->V(l, blk, pos % block));
    }
    // All K/V of the step are in the cache before any row attends, so rows of one prefill chunk
    // see each other causally through n_ctx = pos + 1.
    Attention(in, kv, l, pool);
    Linear(l, model::Linear::kO, att_.data(), qd, xb_.data(), d, n, in, pool);
    kernels::Add(x_.data(), xb_.data(), n * d);

    // MLP block.
    kernels::RmsNorm(x_.data(), static_cast<const float*>(lw.ffn_norm.data()), n, d, c.norm_eps,
                     xb_.data());
    Linears(l, LinearGroup::kGateUp, xb_.data(), d, n, in, pool);
    kernels::SiluMul(gate_.data(), up_.data(), n * ff, gate_.data());
    Linear(l, model::Linear::kDown, gate_.data(), ff, xb_.data(), d, n, in, pool);
    kernels::Add(x_.data(), xb_.data(), n * d);
  }

  const int64_t n_logits = static_cast<int64_t>(in.logit_rows.size());
  if (n_logits == 0) return;
  for (int64_t j = 0; j < n_logits; ++j) {
    kernels::RmsNorm(x_.data() + in.logit_rows[static_cast<size_t>(j)] * d,
                     static_cast<const float*>(w.output_norm.data()), 1, d, c.norm_eps,
                     logit_in_.data() + j * d);
  }
  kernels::MatMul(w.output, logit_in_.data(), d, n_logits, logits, c.vocab_size, false, pool);
}

}  // namespace chorus::model
