// Offline evaluation of a model (optionally with a variant's LinearHook) on text: perplexity in
// llama.cpp `llama-perplexity` windows, and the fidelity to a reference model — the mean
// KL(reference ‖ evaluated) per scored token and the fraction of positions whose top token
// equals the reference's (llama.cpp's --kl-divergence statistics). docs/eval.md describes the
// windows.
//
// Windows: the whole text is tokenized once (BOS first when the tokenizer adds one) and cut into
// n_chunks = floor(n_tokens / ctx) chunks of ctx tokens (the tail that does not fill a chunk is
// dropped). Each chunk is evaluated from an empty KV cache, its first token replaced by BOS when
// the tokenizer adds BOS. Only the second half is scored: the logits at chunk positions
// j ∈ [ctx/2, ctx − 1) predict the token at j + 1, so each chunk scores ctx − 1 − ctx/2 tokens and
// every scored token has at least ctx/2 tokens of context.
//
// Thread-safety: a LogitsRunner is used by one thread at a time; functions are reentrant.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "chorus/base/status.h"
#include "chorus/base/thread_pool.h"
#include "chorus/memory/kv_cache.h"
#include "chorus/model/forward.h"

namespace chorus::eval {

// Runs a model over one token sequence from an empty KV cache, in steps of at most `max_rows`
// rows, and returns the logits of a range of positions.
class LogitsRunner {
 public:
  // Sequences of up to `max_ctx` tokens (≤ the model's context), with a KV cache of kv_dtype
  // elements (as `chorus serve --kv-dtype`).
  LogitsRunner(std::shared_ptr<const model::Model> model, int64_t max_ctx, int64_t max_rows = 256,
               kernels::KvDtype kv_dtype = kernels::KvDtype::kF32);
  const model::Model& model() const { return *model_; }
  int64_t max_rows() const { return max_rows_; }

  // logits: [tokens.size() − from, vocab], the rows of positions [from, tokens.size()).
  // `hook` (may be null) adds a variant's terms; it must accept steps of max_rows() rows.
  Status Run(std::span<const int32_t> tokens, int64_t from, const model::LinearHook* hook,
             ThreadPool* pool, std::vector<float>* logits);

  // Runs only layers [first_layer, end_layer) over the sequence (model::StepInput's slice):
  // `residual_in` [tokens.size(), n_embd] is the residual stream entering first_layer (null =
  // the embeddings, first_layer 0); the stream leaving the slice is written to residual_out.
  Status RunLayers(std::span<const int32_t> tokens, int64_t first_layer, int64_t end_layer,
                   const float* residual_in, float* residual_out, const model::LinearHook* hook,
                   ThreadPool* pool);

 private:
  Status CheckTokens(std::span<const int32_t> tokens) const;
  // The sequence in steps of max_rows() rows (positions from 0, one sequence, its KV blocks
  // reserved for the run): `fill(in, start, rows)` completes each step's input and returns
  // where its logits go (null: none).
  Status RunSteps(std::span<const int32_t> tokens, const model::LinearHook* hook, ThreadPool* pool,
                  const std::function<float*(model::StepInput&, int64_t, int64_t)>& fill);

  std::shared_ptr<const model::Model> model_;
  int64_t max_ctx_, max_rows_;
  model::Forward forward_;
  memory::PagePool pages_;
  memory::KvCache kv_;
};

struct Windows {
  int64_t ctx = 0;
  int64_t n_chunks = 0;
  int64_t first = 0;  // first scored logit position in a chunk (ctx / 2)
  int64_t scored_per_chunk() const { return ctx - 1 - first; }
};
// kInvalidArgument when the text has fewer than 2·ctx tokens (llama.cpp's rule) or ctx < 4.
Result<Windows> PlanWindows(int64_t n_tokens, int64_t ctx);

// Accumulates per-position statistics.
class Scores {
 public:
  // One position: the evaluated logits, the target token, and (optionally) the reference logits.
  void Add(std::span<const float> logits, int32_t target, std::span<const float> ref_logits = {});
  int64_t tokens() const { return n_; }
  double mean_nll() const { return n_ ? nll_ / static_cast<double>(n_) : 0.0; }
  double perplexity() const;
  bool has_reference() const { return n_ref_ > 0; }
  double mean_kl() const { return n_ref_ ? kl_ / static_cast<double>(n_ref_) : 0.0; }
  double same_top() const {
    return n_ref_ ? static_cast<double>(same_) / static_cast<double>(n_ref_) : 0.0;
  }

 private:
  int64_t n_ = 0, n_ref_ = 0, same_ = 0;
  double nll_ = 0, kl_ = 0;
};

// KL(p_ref ‖ p) of the softmaxes of two logit vectors, in nats.
double KlDivergence(std::span<const float> ref_logits, std::span<const float> logits);
// −log softmax(logits)[target].
double NegLogLikelihood(std::span<const float> logits, int32_t target);

struct EvalOptions {
  int64_t ctx = 512;       // chunk length (≤ both models' context)
  int32_t bos_id = -1;     // replaces each chunk's first token when ≥ 0 (tokenizer adds BOS)
  int64_t max_rows = 256;  // rows per forward step
  // KV cache elements of the evaluated model (the reference always runs with f32), so the
  // cost of --kv-dtype bf16 is measured as llama.cpp's perplexity tool measures its KV types.
  kernels::KvDtype kv_dtype = kernels::KvDtype::kF32;
};

// Perplexity of `m` (+ `hook`) over `tokens` in the windows above; with `reference`, also the
// KL and same-top statistics against it (same windows, same tokens, no hook). The models must
// have the same vocabulary size. `progress` (may be null) is called after each chunk.
struct EvalResult {
  Windows windows;
  Scores scores;
};
Result<EvalResult> Evaluate(std::shared_ptr<const model::Model> m, const model::LinearHook* hook,
                            std::shared_ptr<const model::Model> reference,
                            std::span<const int32_t> tokens, const EvalOptions& opts,
                            ThreadPool* pool,
                            void (*progress)(int64_t done, int64_t total) = nullptr);

}  // namespace chorus::eval
