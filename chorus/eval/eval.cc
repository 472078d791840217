#include "chorus/eval/eval.h"

#include <algorithm>
#include <cmath>
#include <functional>

namespace chorus::eval {
namespace {

memory::KvLayout LayoutOf(const model::Model& m, kernels::KvDtype dtype) {
  const auto& c = m.config();
  return memory::KvLayout{.n_layers = c.n_layers,
                          .n_kv_heads = c.n_kv_heads,
                          .head_dim = c.head_dim,
                          .block_size = 16,
                          .dtype = dtype};
}

// log Σ exp(x) in double.
double LogSumExp(std::span<const float> x) {
  float mx = x[0];
  for (float v : x) mx = std::max(mx, v);
  double s = 0;
  for (float v : x) s += std::exp(static_cast<double>(v) - mx);
  return mx + std::log(s);
}

int64_t ArgMax(std::span<const float> x) {
  return std::max_element(x.begin(), x.end()) - x.begin();
}

}  // namespace

LogitsRunner::LogitsRunner(std::shared_ptr<const model::Model> model, int64_t max_ctx,
                           int64_t max_rows, kernels::KvDtype kv_dtype)
    : model_(model),
      max_ctx_(max_ctx),
      max_rows_(std::min(max_rows, max_ctx)),
      forward_(model, std::min(max_rows, max_ctx), max_ctx),
      pages_((max_ctx + 15) / 16 + 1, LayoutOf(*model, kv_dtype).PageBytes()),
      kv_(LayoutOf(*model, kv_dtype), &pages_) {}

Status LogitsRunner::CheckTokens(std::span<const int32_t> tokens) const {
  const int64_t n = static_cast<int64_t>(tokens.size());
  const auto& c = model_->config();
  if (n < 1 || n > max_ctx_ || n > c.max_seq_len) {
    return InvalidArgumentError("eval: a sequence of " + std::to_string(n) +
                                " tokens does not fit (context " +
                                std::to_string(std::min(max_ctx_, c.max_seq_len)) + ")");
  }
  for (int32_t t : tokens) {
    if (t < 0 || t >= c.vocab_size)
      return InvalidArgumentError("eval: token id " + std::to_string(t) +
                                  " is outside the vocabulary");
  }
  return OkStatus();
}

Status LogitsRunner::RunLayers(std::span<const int32_t> tokens, int64_t first_layer,
                               int64_t end_layer, const float* residual_in, float* residual_out,
                               const model::LinearHook* hook, ThreadPool* pool) {
  CHORUS_RETURN_IF_ERROR(CheckTokens(tokens));
  const auto& c = model_->config();
  if (first_layer < 0 || first_layer > end_layer || end_layer > c.n_layers ||
      (residual_in == nullptr && first_layer != 0)) {
    return InvalidArgumentError("eval: layers [" + std::to_string(first_layer) + ", " +
                                std::to_string(end_layer) + ") of " + std::to_string(c.n_layers) +
                                " (a slice after layer 0 needs its input)");
  }
  const int64_t d = c.n_embd;
  return RunSteps(tokens, hook, pool, [&](model::StepInput& in, int64_t start, int64_t) {
    in.first_layer = first_layer;
    in.end_layer = end_layer;
    in.residual_in = residual_in != nullptr ? residual_in + start * d : nullptr;
    in.residual_out = residual_out + start * d;
    return static_cast<float*>(nullptr);
  });
}

Status LogitsRunner::RunSteps(
    std::span<const int32_t> tokens, const model::LinearHook* hook, ThreadPool* pool,
    const std::function<float*(model::StepInput&, int64_t, int64_t)>& fill) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  std::vector<int32_t> table;
  CHORUS_RETURN_IF_ERROR(kv_.Reserve(&table, n));
  std::vector<int32_t> pos, seq;
  const int32_t* tables[1] = {table.data()};
  for (int64_t start = 0; start < n; start += max_rows_) {
    const int64_t rows = std::min(max_rows_, n - start);
    pos.resize(static_cast<size_t>(rows));
    seq.assign(static_cast<size_t>(rows), 0);
    for (int64_t i = 0; i < rows; ++i)
      pos[static_cast<size_t>(i)] = static_cast<int32_t>(start + i);
    model::StepInput in;
    in.tokens = tokens.subspan(static_cast<size_t>(start), static_cast<size_t>(rows));
    in.positions = pos;
    in.seq = seq;
    in.block_tables = std::span<const int32_t* const>(tables, 1);
    in.hook = hook;
    float* logits = fill(in, start, rows);
    forward_.Run(in, &kv_, pool, logits);
  }
  kv_.Release(&table);
  return OkStatus();
}

Status LogitsRunner::Run(std::span<const int32_t> tokens, int64_t from,
                         const model::LinearHook* hook, ThreadPool* pool,
                         std::vector<float>* logits) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  const auto& c = model_->config();
  CHORUS_RETURN_IF_ERROR(CheckTokens(tokens));
  if (from < 0 || from >= n) {
    return InvalidArgumentError("eval: logits from position " + std::to_string(from) +
                                " of a sequence of " + std::to_string(n) + " tokens");
  }
  logits->assign(static_cast<size_t>((n - from) * c.vocab_size), 0.0f);
  std::vector<int32_t> lrows;
  return RunSteps(tokens, hook, pool, [&](model::StepInput& in, int64_t start, int64_t rows) {
    lrows.clear();
    for (int64_t i = std::max<int64_t>(0, from - start); i < rows; ++i)
      lrows.push_back(static_cast<int32_t>(i));
    in.logit_rows = lrows;
    const int64_t out_row = std::max<int64_t>(start, from) - from;
    return logits->data() + out_row * c.vocab_size;
  });
}

Result<Windows> PlanWindows(int64_t n_tokens, int64_t ctx) {
  if (ctx < 4) return InvalidArgumentError("eval: --ctx must be at least 4");
  if (n_tokens < 2 * ctx) {
    return InvalidArgumentError("eval: the text has " + std::to_string(n_tokens) +
                                " tokens; at least 2 × ctx = " + std::to_string(2 * ctx) +
                                " are needed (lower --ctx or give more text)");
  }
  Windows w;
  w.ctx = ctx;
  w.n_chunks = n_tokens / ctx;
  w.first = ctx / 2;
  return w;
}

double NegLogLikelihood(std::span<const float> logits, int32_t target) {
  return LogSumExp(logits) - logits[static_cast<size_t>(target)];
}

double KlDivergence(std::span<const float> ref, std::span<const float> x) {
  const double lr = LogSumExp(ref), lx = LogSumExp(x);
  double kl = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double lp = ref[i] - lr;
    const double p = std::exp(lp);
    if (p > 0) kl += p * (lp - (x[i] - lx));
  }
  return std::max(0.0, kl);
}

void Scores::Add(std::span<const float> logits, int32_t target, std::span<const float> ref) {
  ++n_;
  nll_ += NegLogLikelihood(logits, target);
  if (!ref.empty()) {
    ++n_ref_;
    kl_ += KlDivergence(ref, logits);
    same_ += ArgMax(ref) == ArgMax(logits);
  }
}

double Scores::perplexity() const { return std::exp(mean_nll()); }

Result<EvalResult> Evaluate(std::shared_ptr<const model::Model> m, const model::LinearHook* hook,
                            std::shared_ptr<const model::Model> reference,
                            std::span<const int32_t> tokens, const EvalOptions& opts,
                            ThreadPool* pool, void (*progress)(int64_t, int64_t)) {
  EvalResult r;
  CHORUS_ASSIGN_OR_RETURN(r.windows, PlanWindows(static_cast<int64_t>(tokens.size()), opts.ctx));
  const Windows& w = r.windows;
  const int64_t vocab = m->config().vocab_size;
  if (w.ctx > m->config().max_seq_len) {
    return InvalidArgumentError("eval: --ctx " + std::to_string(w.ctx) +
                                " exceeds the model's context " +
                                std::to_string(m->config().max_seq_len));
  }
  if (reference) {
    if (reference->config().vocab_size != vocab) {
      return InvalidArgumentError("eval: the KL reference has a vocabulary of " +
                                  std::to_string(reference->config().vocab_size) +
                                  " tokens, the model " + std::to_string(vocab));
    }
    if (w.ctx > reference->config().max_seq_len) {
      return InvalidArgumentError("eval: --ctx " + std::to_string(w.ctx) +
                                  " exceeds the KL reference's context " +
                                  std::to_string(reference->config().max_seq_len));
    }
  }
  LogitsRunner runner(m, w.ctx, opts.max_rows, opts.kv_dtype);
  std::unique_ptr<LogitsRunner> ref_runner;
  if (reference) ref_runner = std::make_unique<LogitsRunner>(reference, w.ctx, opts.max_rows);
  std::vector<int32_t> chunk(static_cast<size_t>(w.ctx));
  std::vector<float> logits, ref_logits;
  for (int64_t i = 0; i < w.n_chunks; ++i) {
    std::copy_n(tokens.begin() + i * w.ctx, w.ctx, chunk.begin());
    if (opts.bos_id >= 0) chunk[0] = opts.bos_id;
    CHORUS_RETURN_IF_ERROR(runner.Run(chunk, w.first, hook, pool, &logits));
    if (ref_runner)
      CHORUS_RETURN_IF_ERROR(ref_runner->Run(chunk, w.first, nullptr, pool, &ref_logits));
    for (int64_t j = 0; j < w.scored_per_chunk(); ++j) {
      std::span<const float> lg(logits.data() + j * vocab, static_cast<size_t>(vocab));
      std::span<const float> rl;
      if (ref_runner)
        rl = std::span<const float>(ref_logits.data() + j * vocab, static_cast<size_t>(vocab));
      r.scores.Add(lg, chunk[static_cast<size_t>(w.first + j + 1)], rl);
    }
    if (progress) progress(i + 1, w.n_chunks);
  }
  return r;
}

}  // namespace chorus::eval
