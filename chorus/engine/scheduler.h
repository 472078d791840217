// Scheduler: which rows the next step computes (docs/architecture.md, "Scheduling"). It owns the
// waiting and running sequences, their KV blocks and their adapter pins, and decides, step by
// step: cancellations, the next decode row or prefill chunk of every running sequence (oldest
// first, preempting the newest when the pool runs out of pages, after evicting unpinned
// adapters), admission of waiting sequences in queue order as rows, sequences and pages allow
// and the Policy agrees, and the fork of n > 1 choices once their prompt is computed. It never
// computes: the engine turns the plan into a step (model::StepBuilder), runs the forward pass
// and hands the logits back through Complete(), which sends each row to a TokenSink (the
// output stage) and retires finished sequences.
//
// Testable without a model: it needs a page pool, a KV cache over it, adapter residency (with
// or without a host cache) and a policy (engine/scheduler_test.cc drives it with fake logits).
//
// Prefix caching (memory/prefix_cache.h, optional): a sequence admitted with no blocks first
// takes the longest cached prefix of its tokens (of its variant) and computes only the rest;
// every full block computed is registered for later requests; cached blocks nobody holds are
// evicted (after unpinned adapter copies) before anyone is preempted.
//
// Thread-safety: engine thread only, except `queued`, the count of waiting choices, which
// Engine::Submit reads and increments.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "chorus/engine/adapter_residency.h"
#include "chorus/engine/metrics.h"
#include "chorus/engine/output_stage.h"
#include "chorus/engine/policy.h"
#include "chorus/engine/sequence.h"
#include "chorus/memory/kv_cache.h"
#include "chorus/memory/page_pool.h"

namespace chorus::engine {

struct SchedulerOptions {
  int64_t max_batch_tokens = 512;  // rows per step, decode + prefill
  int64_t max_running = 64;        // sequences in the running batch
  // Rows per step whose logits feed prompt logprobs (EngineOptions::max_prompt_logprob_rows).
  int64_t max_prompt_logprob_rows = 64;
};

class Scheduler {
 public:
  // One planned piece of work: `count` tokens of `seq` from position `start`.
  struct Planned {
    Sequence* seq;
    int64_t start, count;
    bool wants_logits;  // the chunk ends at the sequence's last token: sample after it
    // Rows at positions [prompt_logits_begin, prompt_logits_end) also want logits: prompt
    // logprobs (Sequence::PromptLogitRows); their logits come before the sampled row's.
    int64_t prompt_logits_begin = 0, prompt_logits_end = 0;
    int64_t prompt_logit_rows() const { return prompt_logits_end - prompt_logits_begin; }
    int64_t logit_rows() const { return prompt_logit_rows() + (wants_logits ? 1 : 0); }
    // Rows at positions [hidden_begin, hidden_end) want their hidden states: an embedding
    // (Sequence::HiddenRows). An embedding's chunk never wants logits.
    int64_t hidden_begin = 0, hidden_end = 0;
    int64_t hidden_rows() const { return hidden_end - hidden_begin; }
  };
  enum class Outcome {
    kRun,     // plan() holds the step's rows
    kIdle,    // nothing can run until a loader finishes or a request arrives
    kReplan,  // pages were freed (shared prompt blocks): plan again at once
  };

  // Every pointer must outlive the scheduler; `prefix` may be null (no prefix caching),
  // `full_models` too (no --swap-full-models).
  Scheduler(SchedulerOptions opts, memory::PagePool* pages, memory::KvCache* kv,
            AdapterResidency* residency, std::unique_ptr<Policy> policy, EngineMetrics* metrics,
            memory::PrefixCache* prefix = nullptr, FullModels* full_models = nullptr);

  // Called when a waiting sequence's variant (its LoraAdapter or delta::DeltaWeights copy) has
  // loaded, before the sequence may use it (under tensor parallelism: the other ranks load their
  // shards, adapters::TpVariantSlots). An error finishes the sequence with it, as a failed load
  // does. Default: none. Set before the first Plan().
  using BindVariant =
      std::function<Status(const std::shared_ptr<const void>& copy, const adapters::VariantRef&)>;
  void set_bind_variant(BindVariant bind) { bind_variant_ = std::move(bind); }

  // A new request's first choice (its other choices in `forks`), counted in `queued`
  // already by the submitter.
  void Enqueue(std::unique_ptr<Sequence> s);

  // Plans the next step. On kRun, plan() lists its rows, grouped so that equal adapters are
  // contiguous (base-model rows first), each sequence's rows contiguous and in position order;
  // rows of whole fine-tunes (--swap-full-models) come last, one contiguous run per model (each
  // run is its own forward pass over that model's weights).
  //
  // Whole fine-tunes: a waiting sequence whose model is not resident asks FullModels for a
  // swap-in (in queue order) and waits; the policy passes over it (Candidate::swapped_out).
  Outcome Plan();
  std::span<const Planned> plan() const { return plan_; }
  // Starts pool copies of the adapters this step and the queue will need (on loader threads,
  // while the step computes). Call after Plan() returned kRun.
  void PrefetchAdapters();
  // The cost model's view of the current plan (docs/scheduling.md, "The cost model"). Call
  // after Plan() returned kRun, before Complete() advances the sequences.
  StepFeatures PlanFeatures();
  // The planned step, whose features were `f`, took `seconds` from Plan() to Complete(): the
  // policy may learn from it (SloPolicy's cost correction), and the correction's gauge is set.
  void ObserveStep(const StepFeatures& f, double seconds);
  // The step ran: advances every planned sequence, and for each row that wanted logits (in
  // plan order, each sequence's prompt-logprob rows before its sampled row; logits holds them
  // in that order, [n, vocab]) sends the prompt logprobs, forks pending choices and emits the
  // next token through `sink`; finished sequences release their blocks and pins.
  // `hidden` ([rows, d], in plan order) holds the planned hidden rows: they are pooled, and an
  // embedding whose prompt is computed is sent and retired.
  void Complete(const float* logits, int64_t vocab, TokenSink* sink, const float* hidden = nullptr,
                int64_t d = 0);

  // Ends every sequence (shutdown) with kCancelled, freeing everything.
  void CancelAll();
  // Ends `s` with an event without a token (and its unforked choices).
  void Finish(Sequence* s, FinishReason why, const std::string& error = "",
              StatusCode code = StatusCode::kInternal);

  // Deferred continuous batching (FineInfer Algorithm 1; docs/finetuning.md, "Training while
  // serving"): while set, Plan admits no waiting request as long as some sequence runs — the
  // waiting ones are deferred to form the next batch after a training iteration instead of
  // extending this batch's inference mode one by one. With nothing running it has no effect
  // (the engine decides then whether to train or to admit). The engine sets it before each step.
  void set_hold_admission(bool hold) { hold_admission_ = hold; }

  bool has_work() const { return !running_.empty() || !waiting_.empty(); }
  const std::vector<std::unique_ptr<Sequence>>& running() const { return running_; }
  const std::deque<std::unique_ptr<Sequence>>& waiting() const { return waiting_; }
  // Choices submitted and not yet running (Engine::Submit adds, the scheduler subtracts).
  std::atomic<int64_t>& queued() { return queued_; }

 private:
  void Preempt(Sequence* s);
  // DeltaZip §5.4: while a ready request waits for a delta that is not in the step, preempts the
  // running line-skippers (Sequence::line_skipper) whose delta has no other sequence running,
  // and queues them in arrival order.
  void PreemptOrphanedLineSkippers();
  void Retire(Sequence* s);  // a finished sequence gives back its blocks and pin
  void ForkChoices(Sequence* parent, const float* row_logits, TokenSink* sink);
  bool ReleaseNewestWaitingTable();
  void ResolveAdapterLoads();
  // Pins s's adapter or delta in the residency while it runs (Sequence::pinned).
  void PinVariant(Sequence* s);
  void UnpinAdapter(Sequence* s);  // and its whole fine-tune's pin
  // Applies finished swap-ins; finishes the waiting sequences of a model whose swap-in failed.
  void ResolveFullModels();
  // A waiting sequence that cannot run yet: its adapter is loading, or its whole fine-tune is
  // not resident.
  static bool NotReady(const Sequence& s) {
    return s.ticket != nullptr ||
           (s.full != nullptr && s.full->state != FullModels::State::kResident);
  }
  // Frees pages until `n_free` are free: unpinned adapter copies first, then cached prefix
  // blocks no sequence holds. Returns whether it freed anything it could.
  bool ReclaimPages(int64_t n_free);
  // Adds `p`'s rows to `f`, and its adapter or delta to `f`'s distinct ones when not among
  // `adapters` / `deltas` yet (which it joins).
  static void AddFeatures(const Planned& p, std::vector<const void*>* adapters,
                          std::vector<const void*>* deltas, StepFeatures* f);
  void AdmitWaiting(int64_t* budget);
  // How many of `s`'s rows from n_computed this step takes, at most `budget`: fewer when its
  // prompt-logprob rows would pass what is left of max_prompt_logprob_rows (possibly 0).
  int64_t ChunkRows(const Sequence& s, int64_t budget) const;
  // The plan entry of that chunk; counts its prompt-logprob rows against the step's allowance.
  Planned PlanChunk(Sequence* s, int64_t count);

  const SchedulerOptions opts_;
  BindVariant bind_variant_;
  memory::PagePool* const pages_;
  memory::KvCache* const kv_;
  AdapterResidency* const residency_;
  const std::unique_ptr<Policy> policy_;
  EngineMetrics* const metrics_;
  memory::PrefixCache* const prefix_;
  FullModels* const full_models_;
  // The KV cache has windowed layer groups: after each step, blocks behind the window go
  // (KvCache::DropBehindWindows; docs/models.md, "KV blocks behind the window").
  const bool kv_windows_;

  OverloadMeter overload_;       // StepState's rates and backlog
  bool hold_admission_ = false;  // set_hold_admission

  std::deque<std::unique_ptr<Sequence>> waiting_;
  std::vector<std::unique_ptr<Sequence>> running_;  // admission order
  std::atomic<int64_t> queued_{0};
  uint64_t next_serial_ = 1;
  std::vector<Planned> plan_;               // reserved for max_running
  int64_t prompt_logit_allowance_ = 0;      // prompt-logprob rows this step may still take
  std::vector<const void*> step_adapters_;  // distinct LoRA adapters of the step (AdmitWaiting)
  std::vector<const void*> step_deltas_;    // distinct deltas of the step
  // PlanFeatures' distinct adapters and deltas of the final plan (kept: no allocation per step).
  std::vector<const void*> plan_adapters_, plan_deltas_;
  // AdmitWaiting's scratch: the ready waiting sequences as candidates, their queue indices,
  // the policy's abort marks, the admission order.
  std::vector<Candidate> ready_;
  std::vector<size_t> ready_index_, order_, held_back_order_;
  std::vector<char> abort_;
  std::vector<FullModels::Entry*> held_;  // AdmitWaiting: resident models older requests need
};

}  // namespace chorus::engine
