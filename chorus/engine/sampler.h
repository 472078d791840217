// Per-request token sampling (docs/architecture.md, "One request"): penalties, temperature, min-p /
// top-k / top-p truncation, a seeded draw, and optional logprobs — the parameters of vLLM and the
// OpenAI API.
//
// Pipeline for one step, on a scratch copy of the logits row [vocab]:
//   1. sanitize: NaN → −inf, +inf → FLT_MAX (a broken row never crashes or hangs the sampler);
//      then `logit_bias` (OpenAI): l[token] += bias; then the tokens Sample() is told to
//      suppress (a request's min_tokens keeps its end tokens out) → −inf, unless that would
//      leave no finite logit;
//   2. repetition penalty (Hugging Face / CTRL): for every token in prompt ∪ generated,
//      l > 0 ? l / rp : l · rp;
//   3. frequency and presence penalties (OpenAI), on generated tokens only:
//      l −= frequency_penalty · count + presence_penalty · [count > 0];
//   4. temperature < kGreedyTemperature → greedy: argmax, the lowest id wins ties; no draw;
//      otherwise l /= temperature;
//   5. p = softmax(l); min-p keeps p ≥ min_p · max p; top-k keeps the k most likely (ties broken
//      by the lower id, so exactly k survive); top-p keeps the smallest most-likely-first prefix
//      whose mass reaches top_p of what is left (the token that crosses is kept, so at least one
//      survives). Order as in vLLM: min-p, then top-k, then top-p;
//   6. one uniform draw u ∈ [0, 1) from the request's Rng picks the token by inverse CDF over the
//      survivors (ids ascending when no top-k/top-p sort was needed, else most likely first).
// Exactly one Rng draw (NextDouble) per non-greedy step, none per greedy step: the sequence of
// tokens of a seeded request is a function of its logits rows alone (whatever else shares the
// batch). A row whose every logit is −inf/NaN yields token 0.
//
// Constrained decoding (docs/structured_outputs.md): when Sample() gets an `allowed` mask (the
// row's grammar matcher computed it), every token outside it is set to −inf right after step 1,
// before penalties — so the grammar is enforced whatever the other parameters, and both
// logprobs modes report the masked distribution (as vLLM, which applies the grammar bitmask to
// the logits its sampler receives): the sampled token's logprob is that of the renormalised
// distribution over the allowed tokens.
//
// Logprobs (when `logprobs` is set) follow vLLM's default "raw" mode: log-softmax of the model's
// logits before any penalty, temperature or truncation — what the model itself assigns.
// LogprobsMode::kProcessed reports log-softmax after penalties and temperature (steps 2–4) but
// before truncation (so every token keeps a finite logprob); in greedy mode that is after
// penalties only. Note: softmax uses the dispatched vector kernel, so a draw that falls within
// a few ulp of a CDF boundary may resolve differently on CPUs of different ISA levels.
//
// Thread-safety: a Sampler belongs to one request and is used by one thread at a time (the engine
// thread). SamplerScratch is per thread.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "chorus/base/rng.h"
#include "chorus/base/status.h"
#include "chorus/grammar/matcher.h"

namespace chorus::engine {

enum class LogprobsMode {
  kRaw,        // log-softmax of the model's logits (vLLM default "raw_logprobs")
  kProcessed,  // log-softmax after penalties and temperature, before truncation
};

// Limits checked by SamplingParams::Validate().
inline constexpr float kMaxTemperature = 100.0f;    // higher is uniform noise for any model
inline constexpr float kGreedyTemperature = 1e-5f;  // below this, temperature means greedy (vLLM)
inline constexpr float kMaxRepetitionPenalty = 10.0f;
inline constexpr int32_t kMaxLogprobs = 20;          // OpenAI top_logprobs / vLLM max_logprobs
inline constexpr float kMaxLogitBias = 100.0f;       // OpenAI: a bias in [-100, 100]
inline constexpr size_t kMaxLogitBiasTokens = 4096;  // entries of one request's logit_bias

struct TokenBias {
  int32_t token = 0;
  float bias = 0.0f;
};

// Per-request sampling parameters. Defaults are vLLM's / OpenAI's: plain sampling at T = 1.
struct SamplingParams {
  // 0 (or anything below kGreedyTemperature) = greedy. Range [0, kMaxTemperature].
  float temperature = 1.0f;
  // Keep the k most likely tokens; 0 or -1 = off. Range: -1, 0 or ≥ 1 (k ≥ vocab = off).
  int32_t top_k = 0;
  // Nucleus sampling: keep the most likely tokens up to this much probability mass. Range (0, 1];
  // 1 = off.
  float top_p = 1.0f;
  // Drop tokens whose probability is below min_p × the top probability. Range [0, 1]; 0 = off.
  float min_p = 0.0f;
  // Hugging Face repetition penalty on prompt + generated tokens. Range (0, kMaxRepetitionPenalty];
  // 1 = off; > 1 discourages repetition.
  float repetition_penalty = 1.0f;
  // OpenAI presence penalty on generated tokens. Range [-2, 2]; 0 = off.
  float presence_penalty = 0.0f;
  // OpenAI frequency penalty on generated tokens (× occurrence count). Range [-2, 2]; 0 = off.
  float frequency_penalty = 0.0f;
  // Same seed (and same logits) ⇒ same tokens. Unset: the engine supplies a fresh seed.
  std::optional<uint64_t> seed;
  // Unset = no logprobs. N ≥ 0: return the sampled token's logprob and rank plus the N most
  // likely tokens' logprobs. Range [0, kMaxLogprobs].
  std::optional<int32_t> logprobs;
  LogprobsMode logprobs_mode = LogprobsMode::kRaw;
  // OpenAI's logit_bias: added to these tokens' logits before penalties, temperature and
  // truncation (so −100 all but bans a token and +100 all but forces it). Raw logprobs do not
  // see it (the model's own distribution, as vLLM's); processed logprobs do. Ids outside the
  // vocabulary are ignored (the server refuses them). At most kMaxLogitBiasTokens entries,
  // each bias in [-kMaxLogitBias, kMaxLogitBias].
  std::vector<TokenBias> logit_bias;

  // InvalidArgument naming the field, its value and the accepted range.
  Status Validate() const;
  bool greedy() const { return temperature < kGreedyTemperature; }
  bool has_penalties() const {
    return repetition_penalty != 1.0f || presence_penalty != 0.0f || frequency_penalty != 0.0f;
  }
};

struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0.0f;
};

// What one Sample() call produced. Reused across calls without reallocating.
struct SampleResult {
  int32_t token = -1;
  // Filled when SamplingParams::logprobs is set:
  float logprob = 0.0f;           // of `token` under the logprobs distribution (may be −inf)
  int64_t rank = 0;               // 1 + number of tokens with a strictly higher logprob
  std::vector<TokenLogprob> top;  // the `logprobs` most likely, descending, lower id first on ties
};

// Buffers of vocab size used during one Sample() call; one per engine thread, shared by all the
// requests it samples for, so a request costs no vocab-sized memory while it waits.
class SamplerScratch {
 public:
  SamplerScratch() = default;
  // Grows the buffers to `vocab` (no-op when already large enough).
  void Reserve(int64_t vocab);

 private:
  friend class Sampler;
  friend void ScoreToken(std::span<const float>, int32_t, int32_t, SamplerScratch*, SampleResult*);
  std::vector<float> logits_;   // [vocab] processed logits
  std::vector<float> probs_;    // [vocab] probabilities, zeroed where truncated
  std::vector<int32_t> order_;  // [vocab] token ids, partially sorted
};

// A given token's entry under `logits` (prompt logprobs, GenerationRequest::prompt_logprobs):
// the raw logprob of `token` — log-softmax of the logits, NaN read as −inf, as Sample() reports
// in LogprobsMode::kRaw without a grammar mask — its rank, and the `n_top` most likely tokens
// (descending, lower id first on ties). The same arithmetic as a sampled token's logprobs, so a
// prompt token and a generated one are scored alike. Requires: token in [0, logits.size()).
void ScoreToken(std::span<const float> logits, int32_t token, int32_t n_top,
                SamplerScratch* scratch, SampleResult* result);

class Sampler {
 public:
  // Requires: params.Validate().ok(), vocab_size ≥ 1. `default_seed` seeds the Rng when
  // params.seed is unset (the engine draws it from its own entropy source).
  Sampler(const SamplingParams& params, int64_t vocab_size, uint64_t default_seed = 0);

  const SamplingParams& params() const { return params_; }
  int64_t vocab_size() const { return vocab_size_; }

  // Picks the next token from `logits` [vocab_size] given the request's history. `prompt` and
  // `generated` are the request's full token lists; the Sampler counts them incrementally (the
  // prompt once, then only the generated tokens it has not seen yet), so passing the growing
  // lists every step costs O(new tokens). The lists are expected only to grow at the end; a
  // prompt of a different length, a shorter generated list or a different last counted token
  // triggers a full recount. Ids outside [0, vocab_size) are ignored.
  // `allowed` (null = every token): the tokens the row's grammar admits; tokens outside it get
  // −inf. Requires: logits.size() == vocab_size; allowed->size() >= vocab_size; at least one
  // allowed token (else token 0 is returned, as for an all −inf row).
  // `suppressed`: tokens that may not be drawn this step (step 1; ids outside the vocabulary
  // are ignored); ignored when every other token is −inf.
  int32_t Sample(std::span<const float> logits, std::span<const int32_t> prompt,
                 std::span<const int32_t> generated, SamplerScratch* scratch,
                 SampleResult* result = nullptr, const grammar::TokenMask* allowed = nullptr,
                 std::span<const int32_t> suppressed = {});

  // Number of distinct tokens tracked for penalties (0 when no penalty is active).
  int64_t tracked_tokens() const { return static_cast<int64_t>(history_.size()); }

 private:
  struct Seen {
    int32_t token;
    int32_t generated_count;  // occurrences in the generated tokens
    bool in_prompt;
  };
  void UpdateHistory(std::span<const int32_t> prompt, std::span<const int32_t> generated);
  Seen& Find(int32_t token);  // inserts when absent, keeps history_ sorted by token
  void ApplyPenalties(float* logits) const;
  void FillLogprobs(const float* lp_logits, int32_t token, SamplerScratch* scratch,
                    SampleResult* result) const;
  int32_t Draw(SamplerScratch* scratch);

  SamplingParams params_;
  int64_t vocab_size_;
  Rng rng_;
  // Distinct tokens of prompt ∪ generated, sorted by id; only kept when penalties are active.
  std::vector<Seen> history_;
  bool counted_ = false;          // history_ reflects prompt_counted_ / generated_counted_
  size_t prompt_counted_ = 0;     // prompt tokens in history_
  size_t generated_counted_ = 0;  // generated tokens in history_
  int32_t last_generated_ = -1;   // generated[generated_counted_ - 1], to notice a rewrite
};

}  // namespace chorus::engine
