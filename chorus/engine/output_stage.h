// OutputStage: what happens to a sequence's logits row after a step (docs/architecture.md, "One
// request"): sample the next token with the request's own parameters and seeded RNG, count
// TTFT / time per output token, detokenize incrementally (never broken UTF-8), apply end
// tokens, stop strings and the length limit, and push the event to the request's stream.
// It frees nothing: when a sequence finishes, the scheduler releases its KV blocks and pins.
//
// Thread-safety: Attach() may be called from any thread (Engine::Submit) for a sequence nobody
// else holds yet; Emit() only on the engine thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>

#include "chorus/engine/metrics.h"
#include "chorus/engine/sequence.h"
#include "chorus/model/config.h"
#include "chorus/tokenizer/tokenizer.h"

namespace chorus::engine {

// Where the scheduler sends a logits row (OutputStage; fakes in scheduler tests).
class TokenSink {
 public:
  virtual ~TokenSink() = default;
  // Appends the next token of `s` from `row_logits` ([vocab]) and streams it; returns how the
  // sequence finished with it (kNone: it continues). Sets s->finished when it did.
  virtual FinishReason Emit(Sequence* s, const float* row_logits) = 0;
  // Streams the logprob of prompt token `position` of `s` (prompt logprobs), scored by
  // `row_logits`, the logits of the row before it.
  virtual void EmitPromptLogprob(Sequence* s, int64_t position, const float* row_logits) = 0;
  // Pools the hidden state `row` ([d]) of the next pooled position of embedding `s` into
  // s->embed_sum (positions arrive in order, each once).
  virtual void PoolHidden(Sequence* s, const float* row, int64_t d) = 0;
  // Sends embedding `s`'s vector as its final event (finish kStop) and sets s->finished.
  virtual void EmitEmbedding(Sequence* s) = 0;
};

// Counts `s`'s SLO attainment (metrics.h, SloCount) once it has finished with tokens.
void CountSlo(const Sequence& s, EngineMetrics* m);

class OutputStage : public TokenSink {
 public:
  // `tok` and `metrics` must outlive the stage.
  OutputStage(const model::ModelConfig& config, const tokenizer::Tokenizer* tok,
              EngineMetrics* metrics);

  // Gives a new sequence (choice `s->index` of `s->req`, its tokens set) its sampler (seeded
  // with the request's seed + choice index, or a fresh seed), detokenizer and stop checker.
  void Attach(Sequence* s);

  FinishReason Emit(Sequence* s, const float* row_logits) override;
  void EmitPromptLogprob(Sequence* s, int64_t position, const float* row_logits) override;
  void PoolHidden(Sequence* s, const float* row, int64_t d) override;
  void EmitEmbedding(Sequence* s) override;

  // Computes `s`'s allowed-token mask for its next token when it has a matcher and the mask is
  // not ready yet. Thread-safe across different sequences (the engine's mask worker calls it
  // for the step's rows while the forward pass runs). True when the matcher's work bounds cut
  // this mask short (counted in EngineMetrics::grammar_masks_truncated).
  static bool PrepareMask(Sequence* s);
  // The vocabulary the matchers use (built from the tokenizer on first use).
  std::shared_ptr<const grammar::Vocabulary> vocabulary();

  // Pushes a final event without a token (cancelled, error).
  static void PushFinal(Sequence* s, FinishReason why, const std::string& error = "",
                        StatusCode code = StatusCode::kInternal);

 private:
  const model::ModelConfig config_;
  const tokenizer::Tokenizer* const tok_;
  EngineMetrics* const metrics_;
  SamplerScratch scratch_;           // engine thread only
  SampleResult result_;              // engine thread only, reused
  std::vector<int32_t> suppressed_;  // engine thread only: a row's tokens held back (min_tokens)
  // Seeds for requests without one: distinct per sequence, different on every run.
  std::atomic<uint64_t> seed_source_;
  std::once_flag vocab_once_;
  std::shared_ptr<const grammar::Vocabulary> vocab_;
};

}  // namespace chorus::engine
