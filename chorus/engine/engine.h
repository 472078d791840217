// Engine: iteration-level continuous batching over the paged KV cache (docs/architecture.md).
//
// One engine thread owns all scheduling state and runs steps back to back. Each step mixes
// decode rows of running sequences and prefill chunks of new or preempted ones, under
// `max_batch_tokens` rows and `max_running` sequences (chunked prefill: a long prompt delays
// running decodes by at most one chunk per step). When the pool cannot hold a step's KV, the
// newest running sequence is preempted — its blocks freed — and later recomputed from its
// prompt and the tokens it had generated; batch-invariant kernels make that invisible in the
// output. Clients submit through a bounded queue and read a RequestHandle.
//
// The engine keeps the thread, the incoming queue and the step; the Scheduler (scheduler.h)
// decides the rows and the OutputStage (output_stage.h) turns logits into streamed tokens.
//
// Variants (engine/adapter_residency.h, docs/variants.md): a request names its variant by one
// VariantRef; its host copy is handed over at Submit on a host-cache hit, else loaded by a
// loader thread, and the request is admitted once its adapter is usable. Pool copies of adapters
// share the KV pages (unified paging); they are pinned while used and evicted LRU, before any
// preemption, when KV needs pages.
//
// Thread-safety: Submit(), Metrics(), Shutdown() are thread-safe; everything else is internal
// to the engine thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include "chorus/adapters/adapter_cache.h"
#include "chorus/base/status.h"
#include "chorus/base/thread_pool.h"
#include "chorus/engine/cost_model.h"
#include "chorus/engine/full_models.h"
#include "chorus/engine/metrics.h"
#include "chorus/engine/request.h"
#include "chorus/engine/training_gate.h"
#include "chorus/kernels/attention.h"
#include "chorus/model/model.h"
#include "chorus/model/tensor_parallel.h"
#include "chorus/tokenizer/tokenizer.h"

namespace chorus::engine {

// The largest SLO accepted (a day), in milliseconds.
inline constexpr double kMaxSloMs = 86400000.0;

struct EngineOptions {
  int threads = 0;                 // compute threads; 0 = number of cores
  int64_t max_batch_tokens = 512;  // rows (tokens) per step, decode + prefill
  int64_t max_running = 64;        // sequences in the running batch
  // Rows per step whose logits are kept for prompt logprobs (GenerationRequest::prompt_logprobs):
  // a prompt that wants them is prefilled in chunks of at most this many rows, and the logits
  // buffer holds this many rows beyond max_running (64 × a 32k vocabulary: 8 MB).
  int64_t max_prompt_logprob_rows = 64;
  int64_t max_queue = 256;  // waiting requests before Submit() says kResourceExhausted
  int64_t pool_bytes = int64_t{1} << 30;  // the paged pool (KV blocks and resident adapters)
  int64_t block_size = 16;                // tokens per KV block
  // Element type of the KV cache (`--kv-dtype`): bf16 halves the pages and the bytes a decode
  // step reads per context token; values are rounded to nearest even when written, and every
  // bitwise invariance (batch, chunking, preemption, forks, prefix cache) holds within the dtype.
  kernels::KvDtype kv_dtype = kernels::KvDtype::kF32;
  // Adapter residency (docs/adapters.md, engine/adapter_residency.h).
  // Distinct adapters in one step; 0 = unlimited. Requests whose adapter is already in the step
  // may overtake one whose adapter would exceed the cap, but only for a bounded number of
  // admissions (FcfsPolicy::kMaxPasses, engine/policy.h): then nothing newer is admitted before it,
  // so it gets a slot as soon as one adapter's running sequences have finished.
  int64_t max_adapters_per_step = 0;
  // Distinct deltas in one step (DeltaZip's N-delta rule; 0 = unlimited): requests for deltas
  // already in the step skip the line, the others wait (same fairness bound as above).
  int64_t max_deltas_per_step = 0;
  int loader_threads = 1;           // disk → host loads and host → pool copies
  bool adapter_pool_copies = true;  // keep resident adapters in pool pages (unified paging)
  // Make the whole pool resident at Create (PagePool::Prefault): no page faults when KV blocks
  // or adapter copies first use a page. Also starts prefaulting adapter_cache's host arena in
  // the background (first loads from disk then write into resident memory).
  // `chorus serve` turns it on; tests leave it off.
  bool prefault_pool = false;
  // Automatic prefix caching (memory/prefix_cache.h): full KV blocks are kept, keyed by variant
  // and tokens, and reused by later requests with the same prefix; evicted LRU (after unpinned
  // adapters) before anyone is preempted. Outputs are bitwise the same with it or without it.
  // `chorus serve --no-prefix-cache` turns it off.
  bool prefix_cache = true;
  // Constrained decoding (docs/structured_outputs.md): compute the step's grammar masks on a
  // mask worker thread during the forward pass (true), or on the engine thread when sampling
  // (false; for benchmarks comparing the two).
  bool overlap_grammar_masks = true;
  // The admission policy (engine/policy.h, docs/scheduling.md): fcfs, cluster or slo; slo needs
  // `cost_model` (chorus profile) and, with slo_best_effort, serves late instead of aborting.
  std::string policy = "fcfs";
  std::shared_ptr<const CostModel> cost_model;
  // slo: scale the model's predictions by how long steps actually take (CostCorrection).
  bool correct_cost_model = true;
  bool slo_best_effort = false;
  // Default SLOs in milliseconds of requests that give none (0 = none; docs/scheduling.md).
  double ttft_slo_ms = 0;
  double tpot_slo_ms = 0;
  // The host tier that GenerationRequest::variant is loaded through (on the loader threads);
  // null: requests for a variant are refused (base model only).
  std::shared_ptr<adapters::AdapterCache> adapter_cache;
  // Fine-tuning while serving (docs/finetuning.md, "Training while serving"): the gate through
  // which a job's training iterations run on this engine's thread pool between inference steps
  // (null: no training), and when they may: "deferred" (FineInfer's deferred continuous
  // batching: an iteration starts only when the running batch is empty and no waiting request
  // would pass its deferral bound during it, at the measured iteration time) or "immediate"
  // (only when no request waits or runs). A request's deferral bound is its TTFT SLO when it
  // has one, else deferral_bound_ms.
  std::shared_ptr<TrainingGate> training_gate;
  std::string finetune_policy = "deferred";
  double deferral_bound_ms = 500;
  // Tensor parallelism (docs/scaleout.md): rank 0's side of the step protocol. The engine then
  // runs on this rank's shard (model/tensor_parallel.h), broadcasts each step's plan before
  // computing it, and the forward pass all-reduces over the leader's communicator; the other
  // ranks run model::RunTpWorker. Null: one process. Not owned; must outlive the engine.
  // Under TP the engine serves the base model only and without the prefix cache or n > 1
  // (their KV block copies happen on rank 0 alone): Create and Submit refuse them.
  model::TpLeader* tp_leader = nullptr;
  // --swap-full-models (engine/full_models.h, docs/deltas.md "Swapping full models"): whole
  // fine-tunes requests may name (variant kind "full"), each validated at Create by loading it;
  // at most max_resident_models of them in memory at a time. `served_model_name` is the base's
  // name, which none of them may take.
  std::vector<FullModelSpec> full_models;
  int64_t max_resident_models = 1;
  std::string served_model_name;
  Status Validate() const;
};

class Engine {
 public:
  static Result<std::unique_ptr<Engine>> Create(std::shared_ptr<const model::Model> model,
                                                std::shared_ptr<const tokenizer::Tokenizer> tok,
                                                const EngineOptions& opts);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Validates and enqueues. kInvalidArgument (empty prompt, token out of vocabulary, prompt +
  // max_tokens beyond the context, bad sampling), kResourceExhausted (queue full), kUnavailable
  // (shutting down).
  Result<std::shared_ptr<RequestHandle>> Submit(GenerationRequest req);

  // Submit for several requests at once (a completion's array of prompts): every request is
  // checked first, and either none is queued (the first refusal is returned) or all are, in
  // order, in one critical section — so the scheduler never sees a part of them, and a bad
  // last prompt leaves no earlier one running.
  Result<std::vector<std::shared_ptr<RequestHandle>>> SubmitAll(
      std::vector<GenerationRequest> reqs);

  // Stops admitting; running and queued requests continue for up to `drain`, the rest are
  // cancelled; then the engine thread exits. Idempotent.
  void Shutdown(std::chrono::milliseconds drain);
  bool accepting() const { return accepting_.load(); }

  const EngineMetrics& metrics() const { return metrics_; }
  // Drops the pool copies of adapter `name` (unloaded or replaced): at once when no running
  // sequence uses them, else when the last one finishes. Thread-safe.
  void ForgetAdapter(const std::string& name);
  const model::Model& model() const { return *model_; }
  // The whole fine-tunes requests may name (--swap-full-models; empty without). Thread-safe.
  const std::vector<adapters::VariantRef>& full_models() const;
  const tokenizer::Tokenizer& tokenizer() const { return *tok_; }
  const EngineOptions& options() const { return opts_; }
  int64_t context_length() const;
  // Blocks of the pool in use / total (exact only when read on the engine thread or idle).
  int64_t kv_blocks_used() const { return metrics_.kv_blocks_used.load(); }
  int64_t kv_blocks_total() const { return metrics_.kv_blocks_total.load(); }
  // The longest sequence (prompt + completion tokens) whose KV fits in the pool alone; windowed
  // layers hold only their window (memory/kv_cache.h, layer groups).
  int64_t max_kv_tokens() const;

  struct Impl;

 private:
  Engine() = default;
  // Submit's checks: every refusal but a full queue. Fills the SLO defaults and, for a whole
  // fine-tune, the model it names.
  Status Check(GenerationRequest* req, FullModels::Entry** full) const;
  std::shared_ptr<const model::Model> model_;
  std::shared_ptr<const tokenizer::Tokenizer> tok_;
  EngineOptions opts_;
  EngineMetrics metrics_;
  std::atomic<bool> accepting_{true};
  std::unique_ptr<Impl> impl_;
};

}  // namespace chorus::engine
