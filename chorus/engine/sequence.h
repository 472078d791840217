// Sequence: one choice of one request, as the engine thread sees it. The scheduler
// (engine/scheduler.h) owns sequences and their KV blocks and adapter pins; the output stage
// (engine/output_stage.h) owns their sampler, detokenizer and stop checker.
//
// Thread-safety: created on a client thread (Engine::Submit) and handed over through the
// engine's incoming queue; from then on only the engine thread touches it.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "chorus/adapters/delta/delta_hook.h"
#include "chorus/adapters/lora/lora_adapter.h"
#include "chorus/engine/full_models.h"
#include "chorus/engine/request.h"
#include "chorus/engine/sampler.h"
#include "chorus/engine/stop_checker.h"
#include "chorus/grammar/matcher.h"
#include "chorus/memory/prefix_cache.h"
#include "chorus/tokenizer/tokenizer.h"

namespace chorus::engine {

struct AdapterTicket;

using Clock = std::chrono::steady_clock;

struct Sequence {
  uint64_t serial = 0;  // admission order; the largest is the newest (first to be preempted)
  std::shared_ptr<RequestHandle> handle;
  std::shared_ptr<const GenerationRequest> req;
  int index = 0;                // choice
  std::vector<int32_t> tokens;  // prompt + generated
  int64_t n_prompt = 0;
  int64_t n_computed = 0;      // tokens whose K/V are in the cache
  std::vector<int32_t> table;  // KV block table
  int64_t n_generated = 0;
  // Prompt logprobs (GenerationRequest::prompt_logprobs): the next prompt position whose
  // token's logprob is due; n_prompt when none is (or none was asked for). Kept across
  // preemption, so a recomputed prompt row is never reported twice. Engine::Submit sets it.
  int64_t prompt_logprobs_next = 0;
  Clock::time_point arrival, first_token, last_token;
  bool finished = false;
  // Choices 1..n-1 of a request with n > 1, held by choice 0 until its prompt is in the cache;
  // then they fork its block table (Scheduler::ForkChoices) instead of recomputing the prompt.
  std::vector<std::unique_ptr<Sequence>> forks;
  // The variant's adapter (null = base model). While `ticket` is set its load is pending and
  // the sequence waits; `pinned` while it runs (AdapterResidency pin).
  std::shared_ptr<const adapters::LoraAdapter> lora;
  std::shared_ptr<const delta::DeltaWeights> delta;  // or a delta variant's weights (host copy)
  // Or a whole fine-tune of --swap-full-models (engine/full_models.h): set at Submit; the
  // sequence waits until it is resident; `full_pinned` while it runs.
  FullModels::Entry* full = nullptr;
  bool full_pinned = false;
  std::shared_ptr<AdapterTicket> ticket;
  bool pinned = false;
  int policy_passes = 0;  // the admission policy's counter (Candidate::passes)
  // DeltaZip's line skipping (--max-deltas, docs/deltas.md): admitted past an older request for
  // another delta, which the cap held back, because its own delta was in the step. Once no
  // sequence of its delta that was not itself a line-skipper runs (its "parents"), it is
  // preempted while another delta's request waits (`yielded`: it then waits in arrival order,
  // not first as sequences preempted for memory do).
  bool line_skipper = false;
  bool yielded = false;
  // The policy moved it behind newer requests in the last admission round (Policy::Sweep); its
  // adapter is prefetched after theirs.
  bool held_back = false;
  bool ever_held_back = false;  // counted once in chorus_slo_held_back_total
  // Prefix caching (memory/prefix_cache.h): the variant's cache key (0 = base model) and how far
  // this sequence's full blocks are matched or registered.
  uint64_t prefix_variant = 0;
  memory::PrefixChain prefix;

  // Absolute positions [begin, end) of the rows of a chunk [start, start + count) whose logits
  // the prompt logprobs want: row p scores prompt token p + 1.
  std::pair<int64_t, int64_t> PromptLogitRows(int64_t start, int64_t count) const {
    if (!wants_prompt_logprobs()) return {start, start};
    const int64_t begin = std::max(start, prompt_logprobs_next - 1);
    return {begin, std::max(begin, std::min(start + count, n_prompt - 1))};
  }
  bool wants_prompt_logprobs() const {
    return req != nullptr && req->prompt_logprobs >= 0 && prompt_logprobs_next < n_prompt;
  }

  // Embeddings (GenerationRequest::embedding): the positions [0, embed_next) whose hidden
  // states are already pooled into embed_sum (their sum in position order; the chosen row for
  // last / cls pooling). Kept across preemption, so a recomputed row is never pooled twice.
  std::vector<double> embed_sum;
  int64_t embed_next = 0;
  bool is_embedding() const { return req != nullptr && req->embedding.has_value(); }
  // Absolute positions [begin, end) of the rows of a chunk [start, start + count) whose hidden
  // states the embedding pools.
  std::pair<int64_t, int64_t> HiddenRows(int64_t start, int64_t count) const {
    if (!is_embedding()) return {start, start};
    int64_t lo = 0, hi = n_prompt;  // mean: every prompt position
    if (req->embedding->pooling == Pooling::kLast) lo = n_prompt - 1;
    if (req->embedding->pooling == Pooling::kFirst) hi = 1;
    const int64_t end = std::min(start + count, hi);
    const int64_t begin = std::min(std::max({start, lo, embed_next}), start + count);
    return {begin, std::max(begin, end)};
  }
  // Whether rows before the prompt's last must be computed rather than taken from the prefix
  // cache: their logits (prompt logprobs) or hidden states (mean or cls pooling) are wanted.
  bool needs_prompt_rows() const {
    return wants_prompt_logprobs() || (is_embedding() && req->embedding->pooling != Pooling::kLast);
  }

  // The variant's weights as one identity for grouping rows and counting distinct variants
  // (null = the base model).
  const void* variant_key() const {
    if (full != nullptr) return full;
    return lora ? static_cast<const void*>(lora.get()) : static_cast<const void*>(delta.get());
  }
  // Output stage state (engine/output_stage.h).
  std::unique_ptr<Sampler> sampler;
  std::unique_ptr<tokenizer::StreamingDetokenizer> detok;
  std::unique_ptr<StopChecker> stop;
  // Constrained decoding: the choice's matcher (null = unconstrained) and the mask of the tokens
  // allowed next, valid while mask_ready (computed ahead by the engine's mask worker during the
  // forward pass, or by Emit when it was not).
  std::unique_ptr<grammar::Matcher> matcher;
  grammar::TokenMask mask;
  bool mask_ready = false;
};

}  // namespace chorus::engine
