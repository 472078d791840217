#include "chorus/model/forward.h"

#include <algorithm>
#include <cmath>

#include "chorus/kernels/attention.h"
#include "chorus/kernels/matmul.h"
#include "chorus/kernels/ops.h"

namespace chorus::model {
namespace {

// Rows (token × query head) of one attention block: K/V tiles are loaded once per block, and the
// block's scratch (q transposed, a tile's scores, the running outputs) stays in L1/L2.
constexpr int64_t kAttnBlockRows = 64;
// Split-K is used while the step has few (row, KV head) units (decode of one or a few long
// sequences), so that every thread streams a contiguous part of the KV cache; a row is cut into
// at most this many ranges per thread.
constexpr int64_t kSplitUnitsPerThread = 4;
constexpr int64_t kMaxSplitTasks = 256;  // reserved up front (≤ 2·threads rows × 4·threads)

}  // namespace

memory::KvLayout KvLayoutFor(const ModelConfig& config, int64_t block_size,
                             kernels::KvDtype dtype) {
  memory::KvLayout layout{.n_layers = config.n_layers,
                          .n_kv_heads = config.n_kv_heads,
                          .head_dim = config.head_dim,
                          .block_size = block_size,
                          .dtype = dtype};
  if (config.sliding_window > 0) {
    for (int64_t l = 0; l < config.n_layers; ++l)
      layout.layer_windows.push_back(config.LayerWindow(l));
  }
  return layout;
}

Forward::Forward(std::shared_ptr<const Model> model, int64_t max_rows, int64_t max_logit_rows,
                 dist::Communicator* comm)
    : model_(std::move(model)),
      max_rows_(max_rows),
      max_logit_rows_(max_logit_rows),
      comm_(comm != nullptr && comm->size() > 1 ? comm : nullptr) {
  const ModelConfig& c = model_->config();
  inv_freq_ = c.RopeInvFreq();
  if (c.rope_local_theta > 0) inv_freq_local_ = c.RopeInvFreqLocal();
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
  rope_cos_.assign(static_cast<size_t>(max_rows * c.RotaryDim() / 2), 0.0f);
  rope_sin_.assign(rope_cos_.size(), 0.0f);
  if (!inv_freq_local_.empty()) {
    rope_cos_local_.assign(rope_cos_.size(), 0.0f);
    rope_sin_local_.assign(rope_cos_.size(), 0.0f);
  }
  logit_in_.assign(static_cast<size_t>(max_logit_rows * c.n_embd), 0.0f);
  step_rows_.resize(static_cast<size_t>(max_rows));
  for (int64_t i = 0; i < max_rows; ++i)
    step_rows_[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  const int64_t group = c.n_heads / c.n_kv_heads;
  attn_block_tokens_ = std::max<int64_t>(1, kAttnBlockRows / group);
  attn_scratch_floats_ =
      std::max(kernels::AttentionScratchFloats(attn_block_tokens_, group, c.head_dim),
               kernels::AttentionPartialsHeadsScratchFloats(c.n_kv_heads, group, c.head_dim));
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const int64_t w = c.LayerWindow(l);
    auto it = std::find_if(plans_.begin(), plans_.end(),
                           [&](const AttnPlan& p) { return p.window == w; });
    if (it == plans_.end()) {
      plans_.emplace_back().window = w;
      it = plans_.end() - 1;
    }
    layer_plan_.push_back(static_cast<int32_t>(it - plans_.begin()));
  }
  for (AttnPlan& p : plans_) {
    p.tasks.reserve(static_cast<size_t>(max_rows * c.n_kv_heads + kMaxSplitTasks));
    p.merges.reserve(static_cast<size_t>(max_rows * c.n_kv_heads));
  }
}

void Forward::Linear(int64_t layer, model::Linear which, const float* x, int64_t x_stride, float* y,
                     int64_t y_stride, int64_t n, const StepInput& in, ThreadPool* pool) {
  const kernels::PackedWeight& w = model_->weights().layers[static_cast<size_t>(layer)].W(which);
  kernels::MatMul(w, x, x_stride, n, y, y_stride, /*accumulate=*/false, pool);
  if (in.hook != nullptr) in.hook->Apply(layer, which, x, x_stride, y, y_stride, n, pool);
}

Forward::LinearOut Forward::OutputOf(model::Linear which) {
  float* y = nullptr;
  switch (which) {
    case model::Linear::kQ:
      y = q_.data();
      break;
    case model::Linear::kK:
      y = k_.data();
      break;
    case model::Linear::kV:
      y = v_.data();
      break;
    case model::Linear::kGate:
      y = gate_.data();
      break;
    case model::Linear::kUp:
      y = up_.data();
      break;
    default:
      CHORUS_CHECK(false) << "linear " << LinearName(which) << " belongs to no group";
  }
  return {which, y, model::LinearOut(model_->config(), which)};
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

int64_t Forward::PlanAttention(const StepInput& in, int n_threads, AttnPlan* plan) {
  const ModelConfig& c = model_->config();
  const int64_t n = static_cast<int64_t>(in.tokens.size());
  const int64_t group = c.n_heads / c.n_kv_heads;
  const int64_t pf = kernels::AttentionPartialFloats(group, c.head_dim);
  const int64_t window = plan->window;
  std::vector<AttnTask>& tasks = plan->tasks;
  std::vector<AttnTask>& merges = plan->merges;
  tasks.clear();
  merges.clear();
  auto pos = [&](int64_t i) { return static_cast<int64_t>(in.positions[static_cast<size_t>(i)]); };
  // Segments a row at position p runs under the window: [first, AttentionSegments(p + 1)).
  auto seg_first = [&](int64_t p) { return kernels::AttentionFirstSegment(p, window); };
  auto n_segs = [&](int64_t p) { return kernels::AttentionSegments(p + 1) - seg_first(p); };
  auto run_end = [&](int64_t i) {  // rows [i, j): one sequence, consecutive positions
    int64_t j = i + 1;
    while (j < n && in.seq[static_cast<size_t>(j)] == in.seq[static_cast<size_t>(i)] &&
           pos(j) == pos(j - 1) + 1) {
      ++j;
    }
    return j;
  };
  // Split-K only while the step has few units (e.g. decode of one long sequence): then threads
  // share each row's keys instead of its KV heads and stream the cache contiguously. Whether a
  // row is split never changes its result (attention.h), only who computes which segments.
  int64_t n_long_single = 0, n_units = 0;
  for (int64_t i = 0; i < n;) {
    const int64_t j = run_end(i);
    if (j - i == 1 && n_segs(pos(i)) >= 2) ++n_long_single;
    n_units += (j - i + attn_block_tokens_ - 1) / attn_block_tokens_ * c.n_kv_heads;
    i = j;
  }
  const bool split = n_long_single > 0 && n_units < 2 * n_threads * c.n_kv_heads;
  int64_t partial_floats = 0;
  for (int64_t i = 0; i < n;) {
    const int64_t j = run_end(i);
    const int64_t n_seg = n_segs(pos(i)), s0 = seg_first(pos(i));
    if (split && j - i == 1 && n_seg >= 2) {
      const int64_t parts = std::min<int64_t>(n_seg, kSplitUnitsPerThread * n_threads);
      for (int64_t p = 0; p < parts; ++p) {
        AttnTask t;
        t.row = static_cast<int32_t>(i);
        t.seg_begin = static_cast<int32_t>(s0 + p * n_seg / parts);
        t.seg_end = static_cast<int32_t>(s0 + (p + 1) * n_seg / parts);
        t.partials = partial_floats;
        tasks.push_back(t);
      }
      for (int64_t g = 0; g < c.n_kv_heads; ++g) {
        AttnTask m;
        m.row = static_cast<int32_t>(i);
        m.kv_head = static_cast<int32_t>(g);
        m.seg_end = static_cast<int32_t>(n_seg);
        m.partials = partial_floats + g * n_seg * pf;
        merges.push_back(m);
      }
      partial_floats += c.n_kv_heads * n_seg * pf;
    }
    i = j;
  }
  // Blocks, the latest (costliest) of each run first, so the last tasks taken are cheap ones.
  for (int64_t i = 0; i < n;) {
    const int64_t j = run_end(i);
    if (!(split && j - i == 1 && n_segs(pos(i)) >= 2)) {
      const int64_t n_blocks = (j - i + attn_block_tokens_ - 1) / attn_block_tokens_;
      for (int64_t b = n_blocks - 1; b >= 0; --b) {
        const int64_t first = i + b * attn_block_tokens_;
        for (int64_t g = 0; g < c.n_kv_heads; ++g) {
          AttnTask t;
          t.row = static_cast<int32_t>(first);
          t.n_tokens = static_cast<int32_t>(std::min(attn_block_tokens_, j - first));
          t.kv_head = static_cast<int32_t>(g);
          tasks.push_back(t);
        }
      }
    }
    i = j;
  }
  return partial_floats;
}

void Forward::Attention(const StepInput& in, memory::KvCache* kv, int64_t layer, ThreadPool* pool) {
  const ModelConfig& c = model_->config();
  const int64_t group = c.n_heads / c.n_kv_heads, hd = c.head_dim, qd = c.q_dim();
  const float scale = c.AttnScale();
  const int64_t pf = kernels::AttentionPartialFloats(group, hd);
  const AttnPlan& plan = plans_[static_cast<size_t>(layer_plan_[static_cast<size_t>(layer)])];
  // Sliding windows and soft caps (Gemma 2, 3, Phi-3) inside the tiled kernels (attention.h).
  const kernels::AttentionScores scores{.window = plan.window, .softcap = c.attn_softcap};
  const std::vector<AttnTask>& tasks = plan.tasks;
  const std::vector<AttnTask>& merges = plan.merges;
  const int64_t n_tasks = static_cast<int64_t>(tasks.size());
  auto table_of = [&](int64_t row) {
    return in.block_tables[static_cast<size_t>(in.seq[static_cast<size_t>(row)])];
  };
  // Phase 1: tasks are taken from a shared counter by whichever thread is free; each writes only
  // its own rows' outputs (or its own segments' partials), so the result does not depend on
  // which thread ran what.
  next_task_.store(0, std::memory_order_relaxed);
  pool->Run([&](int ti, int /*nt*/) {
    float* scratch = scratch_.data() + static_cast<size_t>(ti) * attn_scratch_floats_;
    for (int64_t k; (k = next_task_.fetch_add(1, std::memory_order_relaxed)) < n_tasks;) {
      const AttnTask& t = tasks[static_cast<size_t>(k)];
      const int32_t* table = table_of(t.row);
      const int64_t pos = in.positions[static_cast<size_t>(t.row)];
      if (t.n_tokens > 0) {
        const int64_t off = t.row * qd + t.kv_head * group * hd;
        kernels::AttentionBlock(
            q_.data() + off, qd, t.n_tokens, pos, kv->View(layer, t.kv_head, table),
            /*kv_head=*/0, group, hd, scale, scratch, att_.data() + off, qd, scores);
        continue;
      }
      // A split range: every KV head at once, tile by tile, so each block's K and V of all
      // heads (side by side in the page) are read once, as one run.
      // The row's partials hold its segments from the window's first on, per KV head.
      const int64_t s0 = kernels::AttentionFirstSegment(pos, plan.window);
      const int64_t n_seg = kernels::AttentionSegments(pos + 1) - s0;
      kernels::PagedKv* views = head_views_.data() + static_cast<size_t>(ti) * c.n_kv_heads;
      for (int64_t g = 0; g < c.n_kv_heads; ++g) views[g] = kv->View(layer, g, table);
      kernels::AttentionPartialsHeads(q_.data() + t.row * qd, pos, views, c.n_kv_heads, group, hd,
                                      scale, t.seg_begin, t.seg_end, scratch,
                                      partials_.data() + t.partials + (t.seg_begin - s0) * pf,
                                      n_seg * pf, scores);
    }
  });
  if (merges.empty()) return;
  // Phase 2: fold each split row's segments in order, one (row, KV head) per task.
  const int64_t n_merges = static_cast<int64_t>(merges.size());
  pool->Run([&](int ti, int nt) {
    for (int64_t k = ti; k < n_merges; k += nt) {
      const AttnTask& m = merges[static_cast<size_t>(k)];
      kernels::AttentionMerge(partials_.data() + m.partials, m.seg_end, group, hd,
                              att_.data() + m.row * qd + m.kv_head * group * hd);
    }
  });
}

void Forward::Run(const StepInput& in, memory::KvCache* kv, ThreadPool* pool, float* logits,
                  float* hidden) {
  const ModelConfig& c = model_->config();
  const Weights& w = model_->weights();
  const int64_t n = static_cast<int64_t>(in.tokens.size());
  CHORUS_CHECK(n > 0 && n <= max_rows_) << "step of " << n << " rows, max " << max_rows_;
  CHORUS_CHECK_LE(static_cast<int64_t>(in.logit_rows.size()), max_logit_rows_);
  if (scratch_threads_ < pool->size()) {  // grows once per pool size, never per step
    scratch_threads_ = pool->size();
    scratch_.assign(static_cast<size_t>(scratch_threads_ * attn_scratch_floats_), 0.0f);
    head_views_.resize(static_cast<size_t>(scratch_threads_ * c.n_kv_heads));
  }
  int64_t partial_floats = 0;
  for (AttnPlan& plan : plans_)
    partial_floats = std::max(partial_floats, PlanAttention(in, pool->size(), &plan));
  if (static_cast<int64_t>(partials_.size()) < partial_floats) {
    partials_.resize(static_cast<size_t>(partial_floats));  // grows to the longest context seen
  }
  const int64_t d = c.n_embd, qd = c.q_dim(), kvd = c.kv_dim(), ff = c.n_ff;
  const int64_t block = kv->layout().block_size;

  const int64_t first_layer = in.first_layer;
  const int64_t end_layer = in.end_layer < 0 ? c.n_layers : in.end_layer;
  CHORUS_CHECK(0 <= first_layer && first_layer <= end_layer && end_layer <= c.n_layers)
      << "layers [" << first_layer << ", " << end_layer << ") of " << c.n_layers;
  CHORUS_CHECK(in.residual_in != nullptr || first_layer == 0)
      << "a slice from layer " << first_layer << " needs its input";
  CHORUS_CHECK(in.residual_out == nullptr || (in.logit_rows.empty() && in.hidden_rows.empty()));
  if (in.residual_in != nullptr) {
    std::copy(in.residual_in, in.residual_in + n * d, x_.begin());
  } else {
    // Embedding lookup (rows of any dtype are decoded to f32).
    const TensorView& emb = w.tok_embd.view();
    for (int64_t i = 0; i < n; ++i) {
      DequantizeRow(emb.dtype, emb.Row(in.tokens[static_cast<size_t>(i)]), x_.data() + i * d, d);
    }
    if (in.hook != nullptr) in.hook->AdjustEmbeddings(in.tokens, x_.data(), d);
    if (c.embed_scale) {  // Gemma: the embedding times √n_embd, rounded to f32 as HF does
      const float s = static_cast<float>(std::sqrt(static_cast<double>(d)));
      for (int64_t j = 0; j < n * d; ++j) x_[static_cast<size_t>(j)] *= s;
    }
  }
  const std::span<const int32_t> all_rows(step_rows_.data(), static_cast<size_t>(n));
  // The RMSNorm of every row, then the rows whose variant has its own weight for it.
  auto norm = [&](int64_t layer, LinearHook::Norm which, const Tensor& weight) {
    const auto* w_base = static_cast<const float*>(weight.data());
    kernels::RmsNorm(x_.data(), w_base, n, d, c.norm_eps, xb_.data());
    if (in.hook != nullptr)
      in.hook->AdjustNorm(layer, which, all_rows, x_.data(), xb_.data(), w_base, d, c.norm_eps);
  };

  // Rotation tables once per step, shared by q and k of every layer (LongRoPE's attention
  // factor multiplies cos and sin).
  const int64_t rot = c.RotaryDim(), half = rot / 2;
  const float rope_factor = c.RopeAttnFactor();
  auto tables = [&](const std::vector<float>& inv, std::vector<float>& cs, std::vector<float>& sn) {
    for (int64_t i = 0; i < n; ++i) {
      kernels::RopeTable(in.positions[static_cast<size_t>(i)], inv.data(), half,
                         cs.data() + i * half, sn.data() + i * half);
    }
    if (rope_factor != 1.0f) {
      for (int64_t j = 0; j < n * half; ++j) {
        cs[static_cast<size_t>(j)] *= rope_factor;
        sn[static_cast<size_t>(j)] *= rope_factor;
      }
    }
  };
  tables(inv_freq_, rope_cos_, rope_sin_);
  if (!inv_freq_local_.empty()) tables(inv_freq_local_, rope_cos_local_, rope_sin_local_);
  // q or k of one row: per-head norm (Qwen3, Gemma 3), then the rotation of its first `rot`
  // dimensions of each head.
  auto rotate = [&](float* x, int64_t heads, const Tensor& head_norm, const float* cs,
                    const float* sn) {
    if (c.qk_norm) {
      kernels::RmsNorm(x, static_cast<const float*>(head_norm.data()), heads, c.head_dim,
                       c.norm_eps, x);
    }
    if (rot == c.head_dim) {
      kernels::RopeApply(x, heads, c.head_dim, cs, sn, c.rope_layout);
    } else {
      for (int64_t h = 0; h < heads; ++h)
        kernels::RopeApply(x + h * c.head_dim, 1, rot, cs, sn, c.rope_layout);
    }
  };

  for (int64_t l = first_layer; l < end_layer; ++l) {
    const LayerWeights& lw = w.layers[static_cast<size_t>(l)];
    // Attention block.
    norm(l, LinearHook::Norm::kAttn, lw.attn_norm);
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
      const bool local = !inv_freq_local_.empty() && c.LayerSliding(l);
      const float* cs = (local ? rope_cos_local_ : rope_cos_).data() + i * half;
      const float* sn = (local ? rope_sin_local_ : rope_sin_).data() + i * half;
      rotate(q, c.n_heads, lw.q_norm, cs, sn);
      rotate(k, c.n_kv_heads, lw.k_norm, cs, sn);
      const int32_t* table = in.block_tables[static_cast<size_t>(in.seq[static_cast<size_t>(i)])];
      kv->WriteToken(l, kv->BlockAt(table, l, pos), pos % block, k, v);
    }
    // All K/V of the step are in the cache before any row attends, so rows of one prefill chunk
    // see each other causally through n_ctx = pos + 1.
    Attention(in, kv, l, pool);
    Linear(l, model::Linear::kO, att_.data(), qd, xb_.data(), d, n, in, pool);
    // Tensor parallel: each rank's o saw its heads only; the sum over ranks is the full o.
    if (comm_ != nullptr) comm_->AllReduceSum(xb_.data(), n * d);
    if (c.sandwich_norms) {
      kernels::RmsNorm(xb_.data(), static_cast<const float*>(lw.post_attn_norm.data()), n, d,
                       c.norm_eps, xb_.data());
    }
    kernels::Add(x_.data(), xb_.data(), n * d);

    // MLP block.
    norm(l, LinearHook::Norm::kFfn, lw.ffn_norm);
    Linears(l, LinearGroup::kGateUp, xb_.data(), d, n, in, pool);
    if (c.activation == Activation::kGeluTanh) {
      kernels::GeluTanhMul(gate_.data(), up_.data(), n * ff, gate_.data());
    } else {
      kernels::SiluMul(gate_.data(), up_.data(), n * ff, gate_.data());
    }
    Linear(l, model::Linear::kDown, gate_.data(), ff, xb_.data(), d, n, in, pool);
    if (comm_ != nullptr) comm_->AllReduceSum(xb_.data(), n * d);  // likewise its n_ff slice
    if (c.sandwich_norms) {
      kernels::RmsNorm(xb_.data(), static_cast<const float*>(lw.post_ffn_norm.data()), n, d,
                       c.norm_eps, xb_.data());
    }
    kernels::Add(x_.data(), xb_.data(), n * d);
  }
  if (in.residual_out != nullptr) {
    std::copy(x_.begin(), x_.begin() + n * d, in.residual_out);
    return;
  }

  // The final norm of `rows` into out [rows.size(), d], with the variant's adjustment: the
  // output head's input, and what an embedding pools.
  auto final_norm = [&](std::span<const int32_t> rows, float* out) {
    const auto* norm_w = static_cast<const float*>(w.output_norm.data());
    for (size_t j = 0; j < rows.size(); ++j) {
      kernels::RmsNorm(x_.data() + static_cast<int64_t>(rows[j]) * d, norm_w, 1, d, c.norm_eps,
                       out + static_cast<int64_t>(j) * d);
    }
    if (in.hook != nullptr)
      in.hook->AdjustNorm(-1, LinearHook::Norm::kOutput, rows, x_.data(), out, norm_w, d,
                          c.norm_eps);
  };
  if (!in.hidden_rows.empty()) {
    CHORUS_CHECK(hidden != nullptr);
    final_norm(in.hidden_rows, hidden);
  }
  const int64_t n_logits = static_cast<int64_t>(in.logit_rows.size());
  if (n_logits == 0) return;
  final_norm(in.logit_rows, logit_in_.data());
  kernels::MatMul(w.output, logit_in_.data(), d, n_logits, logits, c.vocab_size, false, pool);
  if (in.hook != nullptr)
    in.hook->ApplyOutput(in.logit_rows, logit_in_.data(), d, logits, c.vocab_size, pool);
  if (c.final_softcap > 0) {  // Gemma 2: logits = cap·tanh(logits / cap)
    const float cap = c.final_softcap;
    for (int64_t j = 0; j < n_logits * c.vocab_size; ++j)
      logits[j] = cap * std::tanh(logits[j] / cap);
  }
}

}  // namespace chorus::model
