// A generation request and the stream through which the engine answers it.
//
// RequestHandle is the only object shared between the engine thread and a client thread (an
// HTTP handler or the CLI): the engine pushes StreamEvents, the client pops them or cancels.
// Thread-safety: RequestHandle is thread-safe; GenerationRequest is a value.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "chorus/adapters/variant.h"
#include "chorus/base/mutex.h"
#include "chorus/engine/sampler.h"
#include "chorus/grammar/grammar.h"

namespace chorus::engine {

enum class FinishReason { kNone, kStop, kLength, kCancelled, kError };
const char* FinishReasonName(FinishReason r);  // "stop", "length", "cancelled", "error"

// How an embedding pools the final-normed hidden states of a prompt's positions
// (docs/api.md, "Embeddings"): the last position's (vLLM's default for decoder models), the
// mean of all, or the first's (llama.cpp's `cls`).
enum class Pooling : uint8_t { kLast, kMean, kFirst };
const char* PoolingName(Pooling p);  // "last", "mean", "cls"
std::optional<Pooling> ParsePooling(std::string_view name);
struct EmbeddingOptions {
  Pooling pooling = Pooling::kLast;
  bool normalize = true;  // scaled to unit L2 norm (as OpenAI's and vLLM's embeddings are)
};

struct GenerationRequest {
  std::vector<int32_t> prompt;  // token ids, BOS included when wanted
  SamplingParams sampling;
  int64_t max_tokens = 16;              // generated tokens per choice
  std::vector<std::string> stop;        // stop strings (not included in the output)
  std::vector<int32_t> stop_token_ids;  // extra end ids
  bool ignore_eos = false;
  // vLLM's min_tokens: until a choice has this many tokens, its end tokens (EOS and
  // stop_token_ids) are not drawn (SamplingParams pipeline, step 1). Stop strings still apply.
  // Range [0, max_tokens].
  int64_t min_tokens = 0;
  // Whether special tokens (other than the end ids) are left out of the streamed text. Tool
  // calls of some model families start with one (Mistral's [TOOL_CALLS], Llama's
  // <|python_tag|>), so the server keeps them when it parses those (docs/api.md, "Tools").
  bool skip_special_tokens = true;
  int n = 1;  // choices; choice i samples with seed + i
  // The variant (none = the base model), as the server resolved the request's `model`. The
  // engine's residency brings its weights disk → host → pool (engine/adapter_residency.h): a
  // host-cache hit at once, else on a loader thread while the request waits in the queue
  // (nothing else does); a load failure finishes the request with an error event.
  std::optional<adapters::VariantRef> variant;
  std::string id;  // for logs
  // Constrained decoding (docs/structured_outputs.md): when valid, every choice gets its own
  // matcher over this grammar; tokens the grammar rejects are never sampled, EOS only where it
  // accepts, and a choice whose grammar is complete finishes with kStop. With a grammar an EOS
  // ends the choice even when ignore_eos is set (the grammar decided it may end there).
  grammar::Grammar grammar;
  // Service-level objectives in milliseconds (docs/scheduling.md): time to the first token and
  // mean time per output token after it. Negative = the engine's default (EngineOptions), 0 =
  // none. Attainment is counted in the metrics when each choice finishes; the `slo` policy
  // also schedules by them.
  double ttft_slo_ms = -1;
  double tpot_slo_ms = -1;
  // Prompt logprobs (the completions API's `echo` with `logprobs`, vLLM's `prompt_logprobs`):
  // -1 = none; N in [0, kMaxLogprobs]: before its first token, choice 0 streams one event per
  // prompt token after the first (StreamEvent::prompt), in position order, with the token's raw
  // logprob given the tokens before it and the N most likely tokens there (ScoreToken). Their
  // rows are computed, never taken from the prefix cache, at most
  // EngineOptions::max_prompt_logprob_rows per step.
  int32_t prompt_logprobs = -1;
  // Embeddings (/v1/embeddings): when set, the prompt is computed and no token is generated
  // (max_tokens is ignored, n must be 1, no prompt logprobs or grammar): the final event carries
  // StreamEvent::embedding, pooled over the prompt's final-normed hidden states, with finish
  // kStop. The rows it pools are always computed (a cached prefix serves only rows before them).
  std::optional<EmbeddingOptions> embedding;

  // The variant's name, "" for the base model (logs, metrics).
  const std::string& variant_name() const {
    static const std::string kBase;
    return variant ? variant->name : kBase;
  }
};

struct StreamEvent {
  int index = 0;  // choice
  // The new token (-1 on a final event without one); on a prompt event, the prompt token.
  int32_t token = -1;
  // A prompt logprob (GenerationRequest::prompt_logprobs): `token` is prompt token `position`,
  // with `logprob` and `top_logprobs`; no text, never final.
  bool prompt = false;
  int64_t position = 0;
  int64_t rank = 0;   // on a prompt event: 1 + the tokens with a strictly higher logprob there
  std::string text;   // text completed by this event (may be empty)
  float logprob = 0;  // when sampling.logprobs is set
  std::vector<TokenLogprob> top_logprobs;
  std::vector<float> embedding;                   // an embedding request's final event: [n_embd]
  FinishReason finish = FinishReason::kNone;      // set on the choice's last event
  std::string error;                              // when finish == kError
  StatusCode error_code = StatusCode::kInternal;  // when finish == kError: what kind of failure
};

class RequestHandle {
 public:
  explicit RequestHandle(int n_choices, int64_t prompt_tokens)
      : n_choices_(n_choices), prompt_tokens_(prompt_tokens) {}

  // Client side. Waits up to `timeout` for the next event; nullopt on timeout.
  std::optional<StreamEvent> Next(std::chrono::milliseconds timeout);
  // Asks the engine to abort every choice; their blocks are freed within one step.
  void Cancel() { cancelled_.store(true, std::memory_order_release); }
  bool cancelled() const { return cancelled_.load(std::memory_order_acquire); }
  // True once every choice has delivered its final event and the client popped it.
  bool Done() const;
  int n_choices() const { return n_choices_; }
  int64_t prompt_tokens() const { return prompt_tokens_; }
  int64_t completion_tokens() const { return completion_tokens_.load(); }
  // Seconds from submission to the first generated token (0 until then).
  double ttft_seconds() const { return ttft_.load(); }

  // Engine side.
  void Push(StreamEvent ev);
  void SetTtft(double s) {
    double zero = 0;
    ttft_.compare_exchange_strong(zero, s);
  }

 private:
  const int n_choices_;
  const int64_t prompt_tokens_;
  mutable Mutex mu_;
  CondVar cv_;  // signalled when events_ grows
  std::deque<StreamEvent> events_ GUARDED_BY(mu_);
  int finished_popped_ GUARDED_BY(mu_) = 0;
  std::atomic<bool> cancelled_{false};
  std::atomic<int64_t> completion_tokens_{0};
  std::atomic<double> ttft_{0};
};

}  // namespace chorus::engine
