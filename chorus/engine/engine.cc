#include "chorus/engine/engine.h"

#include <algorithm>
#include <chrono>
#include <limits>

#include "chorus/adapters/delta/delta_hook.h"
#include "chorus/adapters/lora/lora_hook.h"
#include "chorus/adapters/tp_variants.h"
#include "chorus/adapters/variant_hook.h"
#include "chorus/base/logging.h"
#include "chorus/base/mutex.h"
#include "chorus/engine/adapter_residency.h"
#include "chorus/engine/output_stage.h"
#include "chorus/engine/policy.h"
#include "chorus/engine/scheduler.h"
#include "chorus/memory/host_arena.h"
#include "chorus/memory/kv_cache.h"
#include "chorus/memory/prefix_cache.h"
#include "chorus/model/forward.h"
#include "chorus/model/step_builder.h"

namespace chorus::engine {
namespace {

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }
uint64_t Micros(Clock::duration d) {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(d).count());
}

}  // namespace

// Computes the grammar masks of a step's constrained rows on its own thread while the engine
// thread runs the forward pass (a row's mask depends only on its tokens so far, not on this
// step's logits). Started only once a constrained request arrives.
class MaskWorker {
 public:
  explicit MaskWorker(EngineMetrics* metrics) : metrics_(metrics), thread_([this] { Loop(); }) {}
  ~MaskWorker() {
    {
      MutexLock lock(&mu_);
      stop_ = true;
    }
    cv_.SignalAll();
    thread_.join();
  }
  // `rows` must stay untouched by the caller until Wait() returns.
  void Start(const std::vector<Sequence*>* rows) {
    {
      MutexLock lock(&mu_);
      rows_ = rows;
      ++started_;
    }
    cv_.SignalAll();
  }
  void Wait() {
    MutexLock lock(&mu_);
    while (done_ != started_) cv_.Wait(&mu_);
  }

 private:
  void Loop() {
    for (;;) {
      const std::vector<Sequence*>* rows;
      uint64_t job;
      {
        MutexLock lock(&mu_);
        while (!stop_ && done_ == started_) cv_.Wait(&mu_);
        if (stop_) return;
        rows = rows_;
        job = started_;
      }
      const auto t0 = Clock::now();
      uint64_t truncated = 0;
      for (Sequence* s : *rows) truncated += OutputStage::PrepareMask(s) ? 1 : 0;
      metrics_->grammar_masks_total.fetch_add(rows->size());
      metrics_->grammar_masks_truncated.fetch_add(truncated);
      metrics_->grammar_mask_micros.fetch_add(Micros(Clock::now() - t0));
      {
        MutexLock lock(&mu_);
        done_ = job;
      }
      cv_.SignalAll();
    }
  }

  EngineMetrics* const metrics_;
  Mutex mu_;
  CondVar cv_;
  const std::vector<Sequence*>* rows_ GUARDED_BY(mu_) = nullptr;
  uint64_t started_ GUARDED_BY(mu_) = 0;
  uint64_t done_ GUARDED_BY(mu_) = 0;
  bool stop_ GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: starts after the fields it reads
};

Status EngineOptions::Validate() const {
  if (threads < 0 || threads > 256) return InvalidArgumentError("threads must be in [0, 256]");
  if (max_batch_tokens < 1 || max_batch_tokens > 65536)
    return InvalidArgumentError("max-batch-tokens must be in [1, 65536]");
  if (max_running < 1 || max_running > 4096)
    return InvalidArgumentError("max-running must be in [1, 4096]");
  if (max_running > max_batch_tokens)
    return InvalidArgumentError(
        "max-running must not exceed max-batch-tokens (each running sequence needs a row per "
        "step)");
  if (max_prompt_logprob_rows < 1 || max_prompt_logprob_rows > 65536)
    return InvalidArgumentError("max-prompt-logprob-rows must be in [1, 65536]");
  if (max_queue < 0 || max_queue > 1000000)
    return InvalidArgumentError("max-queue must be in [0, 1000000]");
  if (pool_bytes < (int64_t{1} << 20))
    return InvalidArgumentError("pool-size must be at least 1 MiB");
  if (block_size < 1 || block_size > 1024)
    return InvalidArgumentError("block size must be in [1, 1024]");
  if (max_adapters_per_step < 0 || max_adapters_per_step > 4096)
    return InvalidArgumentError("max-adapters-per-step must be in [0, 4096]");
  if (max_deltas_per_step < 0 || max_deltas_per_step > 4096)
    return InvalidArgumentError("max-deltas must be in [0, 4096]");
  if (loader_threads < 1 || loader_threads > 64)
    return InvalidArgumentError("loader-threads must be in [1, 64]");
  if (std::find(PolicyNames().begin(), PolicyNames().end(), policy) == PolicyNames().end()) {
    std::string known;
    for (const auto& n : PolicyNames()) known += (known.empty() ? "" : ", ") + n;
    return InvalidArgumentError("policy must be one of " + known + ", got '" +
                                policy.substr(0, 64) + "'");
  }
  if (!(ttft_slo_ms >= 0 && ttft_slo_ms <= kMaxSloMs))
    return InvalidArgumentError("ttft-slo-ms must be in [0, 86400000]");
  if (!(tpot_slo_ms >= 0 && tpot_slo_ms <= kMaxSloMs))
    return InvalidArgumentError("tpot-slo-ms must be in [0, 86400000]");
  if (finetune_policy != "deferred" && finetune_policy != "immediate") {
    return InvalidArgumentError("finetune-policy must be deferred or immediate, got '" +
                                finetune_policy.substr(0, 64) + "'");
  }
  if (!(deferral_bound_ms >= 0 && deferral_bound_ms <= kMaxSloMs))
    return InvalidArgumentError("deferral-bound must be in [0, 86400000] ms");
  return OkStatus();
}

// The engine thread's loop and the one step it runs: Scheduler::Plan → StepBuilder → Forward →
// Scheduler::Complete (through the OutputStage). Everything else lives in those parts.
struct Engine::Impl {
  Engine* self;
  ThreadPool pool;
  std::unique_ptr<memory::PagePool> pages;
  std::unique_ptr<memory::KvCache> kv;
  std::unique_ptr<model::Forward> forward;
  std::vector<float> logits;  // [max_running, vocab]
  std::vector<float> hidden;  // [a step's hidden rows, n_embd]: embeddings; grown on demand
  std::unique_ptr<model::StepBuilder> step;             // the step's arrays, reserved at Create
  std::vector<const adapters::LoraView*> row_adapters;  // [rows] of the step
  std::unique_ptr<adapters::LoraHook> lora_hook;        // the LoRA kind's term (docs/variants.md)
  std::unique_ptr<adapters::TpVariantSlots> tp_slots;   // under TP: adapters' slots on all ranks
  // Loop scratch: the requests just queued whose variants the TP workers may prefetch.
  std::vector<std::shared_ptr<const GenerationRequest>> prefetch_reqs;
  std::vector<int32_t> row_slots;                   // under TP: [rows] of the step, -1 = base
  std::vector<const delta::DeltaView*> row_deltas;  // [rows] of the step (pool or host copies)
  std::unique_ptr<delta::DeltaHook> delta_hook;     // the delta kind's term
  adapters::VariantHook variant_hook;               // every kind with rows in the step
  std::unique_ptr<OutputStage> output;
  std::unique_ptr<MaskWorker> mask_worker;  // created with the first constrained row
  std::vector<Sequence*> mask_rows;         // the step's constrained rows (mask worker input)
  // PublishAdapterActivity's scratch (reserved at Create: no allocation per step).
  std::vector<const std::string*> activity_running, activity_waiting;

  // Incoming queue: the only state shared with client threads.
  Mutex mu;
  CondVar cv;
  std::deque<std::unique_ptr<Sequence>> incoming GUARDED_BY(mu);
  std::atomic<bool> stop_now{false};
  std::atomic<bool> draining{false};
  Clock::time_point drain_deadline GUARDED_BY(mu);
  std::thread thread;
  bool idle = false;                 // engine thread: the last step found nothing to run
  bool kick GUARDED_BY(mu) = false;  // a loader finished something the engine waits for

  // Declared last: destroyed first. The scheduler before the residency it pins adapters in;
  // the residency joins its loader threads while the pool still exists.
  std::unique_ptr<AdapterResidency> residency;
  std::unique_ptr<FullModels> full_models;      // null without --swap-full-models
  std::unique_ptr<memory::PrefixCache> prefix;  // null when disabled
  std::unique_ptr<Scheduler> scheduler;
  TrainingGate* training_gate = nullptr;  // EngineOptions::training_gate
  // With a gate: the cost model of the step that admits deferred requests (it prefills all of
  // them at once), fed by every step that ran; and the prompt rows of the last step.
  AdmitCost admit_cost;
  uint64_t last_step_prompt_rows = 0;

  explicit Impl(Engine* e, int threads) : self(e), pool(threads) {}

  void Loop();
  // Whether the engine thread has something to do. `idle`: the last step could run nothing
  // (e.g. every waiting request waits for its adapter); sleep until something arrives or a
  // loader finishes (kick).
  bool ReadyLocked() const REQUIRES(mu) {
    const bool work = scheduler->has_work();
    // A trainer waiting for its iteration is work when no inference runs (TrainingTurn decides).
    const bool trainer = training_gate != nullptr && training_gate->waiting() && !draining.load() &&
                         scheduler->running().empty() && (!work || !idle);
    return stop_now.load() || !incoming.empty() || kick || (draining.load() && !work) ||
           (!idle && (draining.load() || work)) || trainer;
  }
  void Step();
  // Where a run of the plan writes its logits and hidden rows (both in plan order).
  struct RunOutputs {
    float* logits;
    float* hidden;
  };
  // Run the forward pass over a run of the plan and write its logits and hidden rows from
  // `out`; return the end of what they wrote.
  RunOutputs RunBase(std::span<const Scheduler::Planned> run, RunOutputs out);
  RunOutputs RunFull(std::span<const Scheduler::Planned> run, RunOutputs out);
  void AddPlanned(const Scheduler::Planned& pl);
  // Runs one training iteration (or waits briefly for the trainer's next one) when the finetune
  // policy lets it (EngineOptions::finetune_policy); returns whether it did either, i.e.
  // whether the loop should decide again before stepping.
  bool TrainingTurn();
  // Deferred policy: the least slack over the waiting requests, in seconds — how much longer
  // the most urgent one could wait beyond a training iteration and the step that admits all
  // waiting prompts (d_rb − d_r − t_f of FineInfer's Algorithm 1). +inf with none waiting;
  // −inf before any iteration was measured (the cost is unknown: no deferral).
  double DeferralSlack(Clock::time_point now) const;
  void CancelAll();
  void PublishGauges();
  void PublishAdapterActivity();
  void Wake();
};

int64_t Engine::context_length() const { return model_->config().max_seq_len; }

const std::vector<adapters::VariantRef>& Engine::full_models() const {
  static const std::vector<adapters::VariantRef> kNone;
  return impl_->full_models ? impl_->full_models->refs() : kNone;
}

int64_t Engine::max_kv_tokens() const {
  // PagesFor grows with the tokens (or stays bounded when every layer slides): the largest
  // n ≤ the context length with PagesFor(n) ≤ pages, by bisection.
  const int64_t pages = impl_->pages->n_pages();
  int64_t lo = 0, hi = context_length();
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (impl_->kv->PagesFor(mid, opts_.max_batch_tokens) <= pages) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

Result<std::unique_ptr<Engine>> Engine::Create(std::shared_ptr<const model::Model> model,
                                               std::shared_ptr<const tokenizer::Tokenizer> tok,
                                               const EngineOptions& opts) {
  CHORUS_RETURN_IF_ERROR(opts.Validate());
  if (!model || !tok) return InvalidArgumentError("engine needs a model and a tokenizer");
  const auto& c = model->config();
  if (tok->vocab_size() > c.vocab_size) {
    return InvalidArgumentError("tokenizer has " + std::to_string(tok->vocab_size()) +
                                " tokens but the model only " + std::to_string(c.vocab_size) +
                                " (hint: tokenizer of another model?)");
  }
  std::unique_ptr<Engine> e(new Engine());
  e->model_ = std::move(model);
  e->tok_ = std::move(tok);
  e->opts_ = opts;
  auto impl = std::make_unique<Impl>(e.get(), opts.threads);
  const memory::KvLayout layout = model::KvLayoutFor(c, opts.block_size, opts.kv_dtype);
  const int64_t n_pages = opts.pool_bytes / layout.PageBytes();
  if (n_pages < 2) {
    return InvalidArgumentError("pool-size " + std::to_string(opts.pool_bytes >> 20) +
                                " MiB holds fewer than 2 KV blocks of " +
                                std::to_string(layout.PageBytes() >> 10) + " KiB for this model");
  }
  impl->pages = std::make_unique<memory::PagePool>(n_pages, layout.PageBytes());
  if (opts.prefault_pool) {
    impl->pages->Prefault();
    if (opts.adapter_cache && opts.adapter_cache->arena())
      opts.adapter_cache->arena()->StartPrefault();
  }
  impl->kv = std::make_unique<memory::KvCache>(layout, impl->pages.get());
  // Logits rows of a step: one per running sequence, plus the prompt-logprob rows.
  const int64_t max_logit_rows =
      opts.max_running + std::min(opts.max_prompt_logprob_rows, opts.max_batch_tokens);
  dist::Communicator* tp_comm = opts.tp_leader ? opts.tp_leader->comm() : nullptr;
  if (tp_comm != nullptr && tp_comm->size() > 1) {
    // The other ranks mirror the pool's pages: copy-on-write copies (n > 1 choices, cached
    // prefixes) travel with the next step's plan.
    impl->kv->RecordCopies(true);
    if (opts.training_gate) {
      return InvalidArgumentError(
          "fine-tuning is not supported with tensor parallelism (docs/scaleout.md)");
    }
    if (!opts.full_models.empty()) {
      return InvalidArgumentError(
          "--swap-full-models is not supported with tensor parallelism (docs/scaleout.md)");
    }
    opts.tp_leader->Start({.max_rows = opts.max_batch_tokens,
                           .max_seqs = opts.max_running,
                           .max_logit_rows = max_logit_rows,
                           .n_pages = n_pages,
                           .block_size = opts.block_size,
                           .kv_dtype = static_cast<int32_t>(opts.kv_dtype),
                           .threads = impl->pool.size()});
  }
  impl->forward =
      std::make_unique<model::Forward>(e->model_, opts.max_batch_tokens, max_logit_rows, tp_comm);
  impl->logits.assign(static_cast<size_t>(max_logit_rows * c.vocab_size), 0.0f);
  impl->step = std::make_unique<model::StepBuilder>(opts.max_batch_tokens, opts.max_running);
  impl->row_adapters.reserve(static_cast<size_t>(opts.max_batch_tokens));
  impl->lora_hook = std::make_unique<adapters::LoraHook>(c, opts.max_batch_tokens, tp_comm);
  impl->delta_hook = std::make_unique<delta::DeltaHook>(opts.max_batch_tokens);
  impl->row_deltas.reserve(static_cast<size_t>(opts.max_batch_tokens));
  e->metrics_.kv_blocks_total = n_pages;
  impl->output = std::make_unique<OutputStage>(c, e->tok_.get(), &e->metrics_);
  impl->activity_running.reserve(static_cast<size_t>(opts.max_running));
  impl->activity_waiting.reserve(static_cast<size_t>(opts.max_queue + opts.max_running));
  AdapterResidency::Options ro{.loader_threads = opts.loader_threads,
                               .pool_copies = opts.adapter_pool_copies};
  Impl* raw_impl = impl.get();
  impl->residency = std::make_unique<AdapterResidency>(
      impl->pages.get(), &e->metrics_, opts.adapter_cache, [raw_impl] { raw_impl->Wake(); }, ro);
  impl->residency->PublishGauges();
  if (!opts.full_models.empty()) {
    CHORUS_ASSIGN_OR_RETURN(impl->full_models,
                            FullModels::Create(opts.full_models, c, opts.served_model_name,
                                               {.max_resident = opts.max_resident_models,
                                                .max_rows = opts.max_batch_tokens,
                                                .max_logit_rows = max_logit_rows},
                                               &e->metrics_, [raw_impl] { raw_impl->Wake(); }));
  }
  if (opts.prefix_cache) impl->prefix = std::make_unique<memory::PrefixCache>(impl->kv.get());
  CHORUS_ASSIGN_OR_RETURN(std::unique_ptr<Policy> policy,
                          MakePolicy({.name = opts.policy,
                                      .max_adapters_per_step = opts.max_adapters_per_step,
                                      .max_deltas_per_step = opts.max_deltas_per_step,
                                      .max_batch_tokens = opts.max_batch_tokens,
                                      .cost_model = opts.cost_model,
                                      .correct_cost_model = opts.correct_cost_model,
                                      .best_effort = opts.slo_best_effort}));
  impl->scheduler = std::make_unique<Scheduler>(
      SchedulerOptions{.max_batch_tokens = opts.max_batch_tokens,
                       .max_running = opts.max_running,
                       .max_prompt_logprob_rows = opts.max_prompt_logprob_rows},
      impl->pages.get(), impl->kv.get(), impl->residency.get(), std::move(policy), &e->metrics_,
      impl->prefix.get(), impl->full_models.get());
  if (tp_comm != nullptr && tp_comm->size() > 1) {
    // Variants under TP: every rank loads its shard of an adapter or delta into a slot before a
    // sequence uses it; the step plan names each row's slot (adapters/tp_variants.h).
    model::TpLeader* leader = opts.tp_leader;
    impl->tp_slots = std::make_unique<adapters::TpVariantSlots>(
        [leader](int32_t slot, std::string_view description) {
          return leader->Define(slot, description);
        });
    impl->scheduler->set_bind_variant(
        [slots = impl->tp_slots.get()](const std::shared_ptr<const void>& copy,
                                       const adapters::VariantRef& ref) {
          return slots->Bind(copy, ref).status();
        });
    impl->row_slots.reserve(static_cast<size_t>(opts.max_batch_tokens));
  }
  if (opts.training_gate) {
    impl->training_gate = opts.training_gate.get();
    impl->training_gate->set_wake([raw_impl] { raw_impl->Wake(); });
  }
  e->impl_ = std::move(impl);
  e->impl_->thread = std::thread([raw = e->impl_.get()] {
    raw->Loop();
    // No iteration is granted after the loop: a trainer waiting for one gives up.
    if (raw->training_gate != nullptr) raw->training_gate->Close();
  });
  return e;
}

Engine::~Engine() {
  if (impl_) {
    {
      // Under the lock: otherwise the store and notify can fall between the engine thread's
      // predicate check and its sleep, and the wake-up is lost (the join then never returns).
      MutexLock lock(&impl_->mu);
      impl_->stop_now.store(true);
    }
    impl_->cv.SignalAll();
    if (impl_->thread.joinable()) impl_->thread.join();
  }
}

Status Engine::Check(GenerationRequest* req, FullModels::Entry** full) const {
  const auto& c = model_->config();
  if (req->prompt.empty()) return InvalidArgumentError("prompt is empty");
  for (int32_t t : req->prompt) {
    if (t < 0 || t >= c.vocab_size) {
      return InvalidArgumentError("prompt token id " + std::to_string(t) +
                                  " is outside the vocabulary [0, " + std::to_string(c.vocab_size) +
                                  ")");
    }
  }
  if (req->embedding) {
    // No token is generated: nothing of the generation fields applies.
    if (req->n != 1) return InvalidArgumentError("an embedding request has one choice (n = 1)");
    if (req->prompt_logprobs >= 0 || req->grammar.valid())
      return InvalidArgumentError("an embedding request takes no prompt logprobs or grammar");
    req->max_tokens = 0;
    req->min_tokens = 0;
  } else if (req->max_tokens < 1) {
    return InvalidArgumentError("max_tokens must be at least 1");
  }
  if (req->n < 1 || req->n > 16) return InvalidArgumentError("n must be in [1, 16]");
  if (req->min_tokens < 0 || req->min_tokens > req->max_tokens) {
    return InvalidArgumentError(
        "min_tokens must be in [0, max_tokens = " + std::to_string(req->max_tokens) + "], got " +
        std::to_string(req->min_tokens));
  }
  if (req->variant && req->variant->kind == "full") {
    *full = impl_->full_models ? impl_->full_models->Find(req->variant->name) : nullptr;
    if (*full == nullptr || (*full)->ref.id != req->variant->id)
      return InvalidArgumentError("model '" + req->variant->name +
                                  "' is not a whole fine-tune this engine serves");
  } else if (req->variant && (!opts_.adapter_cache || req->variant->id.empty())) {
    return InvalidArgumentError("variant '" + req->variant->name + "' named but " +
                                (opts_.adapter_cache ? "it has no registered identity"
                                                     : "the engine has no adapter cache"));
  }
  CHORUS_RETURN_IF_ERROR(req->sampling.Validate());
  if (req->prompt_logprobs < -1 || req->prompt_logprobs > kMaxLogprobs) {
    return InvalidArgumentError("prompt_logprobs must be in [0, " + std::to_string(kMaxLogprobs) +
                                "], got " + std::to_string(req->prompt_logprobs));
  }
  // SLOs: the engine's defaults where the request gives none (negative).
  if (req->ttft_slo_ms < 0) req->ttft_slo_ms = opts_.ttft_slo_ms;
  if (req->tpot_slo_ms < 0) req->tpot_slo_ms = opts_.tpot_slo_ms;
  for (double v : {req->ttft_slo_ms, req->tpot_slo_ms}) {
    if (!(v >= 0 && v <= kMaxSloMs))
      return InvalidArgumentError("SLOs must be finite milliseconds in [0, 86400000]");
  }
  const int64_t total = static_cast<int64_t>(req->prompt.size()) + req->max_tokens;
  if (total > c.max_seq_len) {
    return OutOfRangeError("this model's maximum context length is " +
                           std::to_string(c.max_seq_len) + " tokens, but the request needs " +
                           std::to_string(req->prompt.size()) + " prompt + " +
                           std::to_string(req->max_tokens) + " completion tokens");
  }
  if (const int64_t pages = impl_->kv->PagesFor(total, opts_.max_batch_tokens);
      pages > impl_->pages->n_pages()) {
    return OutOfRangeError("the request needs " + std::to_string(total) + " tokens of KV cache (" +
                           std::to_string(pages) + " blocks), more than the pool holds (" +
                           std::to_string(impl_->pages->n_pages()) + " blocks); raise --pool-size");
  }
  return OkStatus();
}

Result<std::shared_ptr<RequestHandle>> Engine::Submit(GenerationRequest req) {
  std::vector<GenerationRequest> one;
  one.push_back(std::move(req));
  CHORUS_ASSIGN_OR_RETURN(auto handles, SubmitAll(std::move(one)));
  return std::move(handles[0]);
}

Result<std::vector<std::shared_ptr<RequestHandle>>> Engine::SubmitAll(
    std::vector<GenerationRequest> reqs) {
  if (!accepting_.load()) return UnavailableError("server is shutting down");
  std::vector<FullModels::Entry*> full(reqs.size(), nullptr);
  int64_t sequences = 0;
  for (size_t r = 0; r < reqs.size(); ++r) {
    CHORUS_RETURN_IF_ERROR(Check(&reqs[r], &full[r]));
    sequences += reqs[r].n;
  }
  if (impl_->scheduler->queued().load() + sequences > opts_.max_queue) {
    metrics_.requests_rejected.fetch_add(static_cast<uint64_t>(reqs.size()));
    return ResourceExhaustedError("too many requests waiting (" + std::to_string(opts_.max_queue) +
                                  ")");
  }
  // Each request's sequences, built outside the lock: choice 0 carries the others as forks.
  std::vector<std::shared_ptr<RequestHandle>> handles;
  std::vector<std::unique_ptr<Sequence>> heads;
  std::vector<std::string> names;
  const auto now = Clock::now();
  for (size_t r = 0; r < reqs.size(); ++r) {
    // The variant's host copy: a cache hit at once, else a disk load queued now, in arrival
    // order, on a loader thread (the scheduler admits the request once it is done).
    std::shared_ptr<AdapterTicket> ticket;
    if (reqs[r].variant && full[r] == nullptr) ticket = impl_->residency->Load(*reqs[r].variant);
    const int64_t total = static_cast<int64_t>(reqs[r].prompt.size()) + reqs[r].max_tokens;
    auto shared_req = std::make_shared<const GenerationRequest>(std::move(reqs[r]));
    auto handle = std::make_shared<RequestHandle>(shared_req->n,
                                                  static_cast<int64_t>(shared_req->prompt.size()));
    for (int i = 0; i < shared_req->n; ++i) {
      auto s = std::make_unique<Sequence>();
      s->handle = handle;
      s->req = shared_req;
      s->index = i;
      s->tokens = shared_req->prompt;
      s->tokens.reserve(static_cast<size_t>(total));
      s->n_prompt = static_cast<int64_t>(shared_req->prompt.size());
      // Choice 0 reports the prompt's logprobs; the others share its prompt.
      s->prompt_logprobs_next = shared_req->prompt_logprobs >= 0 && i == 0 ? 1 : s->n_prompt;
      impl_->output->Attach(s.get());
      if (shared_req->variant) {
        const adapters::VariantId& id = shared_req->variant->id;
        s->prefix_variant = memory::PrefixVariantKey(id.content_hash, id.version);
      }
      s->arrival = now;
      s->ticket = ticket;
      s->full = full[r];  // swapped in when the scheduler gets to it (engine/full_models.h)
      if (i == 0) {
        heads.push_back(std::move(s));
      } else {
        heads.back()->forks.push_back(std::move(s));  // shares choice 0's prompt
      }
    }
    names.push_back(shared_req->variant_name());
    handles.push_back(std::move(handle));
  }
  {
    MutexLock lock(&impl_->mu);
    for (auto& head : heads) impl_->incoming.push_back(std::move(head));
    impl_->scheduler->queued().fetch_add(sequences);
  }
  for (const std::string& name : names) {
    metrics_.requests_total.fetch_add(1);
    metrics_.adapters.CountRequest(name);  // per-adapter series
  }
  metrics_.queue_length.store(impl_->scheduler->queued().load());
  impl_->cv.SignalAll();
  return handles;
}

void Engine::Shutdown(std::chrono::milliseconds drain) {
  accepting_.store(false);
  {
    MutexLock lock(&impl_->mu);
    if (!impl_->draining.load()) {
      impl_->drain_deadline = Clock::now() + drain;
      impl_->draining.store(true);
    }
  }
  impl_->cv.SignalAll();
  if (impl_->thread.joinable()) impl_->thread.join();
}

void Engine::Impl::Loop() {
  for (;;) {
    bool past_deadline = false;
    {
      MutexLock lock(&mu);
      if (draining.load()) {
        while (!ReadyLocked()) {
          if (!cv.WaitUntil(&mu, drain_deadline)) break;
        }
      } else {
        while (!ReadyLocked()) cv.Wait(&mu);
      }
      kick = false;
      prefetch_reqs.clear();
      while (!incoming.empty()) {
        const Sequence& s = *incoming.front();
        if (tp_slots && s.req->variant && s.full == nullptr) prefetch_reqs.push_back(s.req);
        scheduler->Enqueue(std::move(incoming.front()));
        incoming.pop_front();
      }
      past_deadline = draining.load() && Clock::now() >= drain_deadline;
    }
    // Under TP the workers start loading the queued requests' variants now, while rank 0's
    // loader threads load its own copies (adapters/tp_variants.h, "Prefetch").
    for (const auto& req : prefetch_reqs) {
      if (tp_slots->ShouldPrefetch(*req->variant))
        self->opts_.tp_leader->Prefetch(adapters::DescribeTpVariant(*req->variant));
    }
    prefetch_reqs.clear();
    if (stop_now.load() || past_deadline) {
      CancelAll();
      return;
    }
    if (draining.load() && !scheduler->has_work()) return;
    if (training_gate == nullptr) {
      Step();
      continue;
    }
    if (TrainingTurn()) continue;
    // Deferred continuous batching (Algorithm 1's inference mode): while a batch runs, a waiting
    // request joins it only once it could not wait for a training iteration after it
    // (d_r + t_f ≥ d_rb); until then it is deferred, so the batch drains, training resumes, and
    // the deferred requests are admitted together — one batch whose decode steps cost about
    // what one request's do (memory-bound), instead of a chain of late joiners that keeps the
    // engine in inference mode. `immediate` admits at once (plain continuous batching).
    scheduler->set_hold_admission(self->opts_.finetune_policy == "deferred" &&
                                  training_gate->attached() && !scheduler->running().empty() &&
                                  DeferralSlack(Clock::now()) > 0);
    // The cost of the step that admits deferred requests counts against their bound too
    // (AdmitCost: a decode step plus a cost per prompt row, from the steps that ran).
    const uint64_t steps_before = self->metrics_.steps_total.load(std::memory_order_relaxed);
    const auto s0 = Clock::now();
    last_step_prompt_rows = 0;
    Step();
    if (self->metrics_.steps_total.load(std::memory_order_relaxed) != steps_before) {
      admit_cost.Add(std::chrono::duration<double>(Clock::now() - s0).count(),
                     static_cast<int64_t>(last_step_prompt_rows));
    }
  }
}

double Engine::Impl::DeferralSlack(Clock::time_point now) const {
  const TrainingGate* g = training_gate;
  if (scheduler->waiting().empty()) return std::numeric_limits<double>::infinity();
  // Every waiting request must still be able to wait for one more iteration (d_r + t_f < d_rb)
  // and for the step that admits them all (their first tokens come after every deferred prompt
  // was prefilled: AdmitCost). The iteration's cost is its mean plus twice its deviation
  // (IterationCost), not the mean: a request is deferred to the edge of its bound, and an
  // iteration longer than assumed would push it over.
  if (g->iterations() == 0) return -std::numeric_limits<double>::infinity();
  int64_t prompt_rows = 0;
  for (const auto& s : scheduler->waiting()) prompt_rows += s->n_prompt;
  const double t_f = g->iteration_cost_seconds() + admit_cost.Estimate(prompt_rows);
  double slack_s = std::numeric_limits<double>::infinity();
  for (const auto& s : scheduler->waiting()) {
    const double bound_ms =
        s->req->ttft_slo_ms > 0 ? s->req->ttft_slo_ms : self->opts_.deferral_bound_ms;
    const double waited = std::chrono::duration<double>(now - s->arrival).count();
    slack_s = std::min(slack_s, bound_ms / 1e3 - waited - t_f);
  }
  return slack_s;
}

bool Engine::Impl::TrainingTurn() {
  TrainingGate* g = training_gate;
  if (draining.load() || !(g->attached() || g->waiting())) return false;
  // Inference mode lasts until the running batch is empty (FineInfer, Algorithm 1): running
  // requests keep continuous batching (waiting ones join them once they cannot wait longer).
  if (!scheduler->running().empty()) return false;
  const bool deferred = self->opts_.finetune_policy == "deferred";
  const auto now = Clock::now();
  double slack_s = std::numeric_limits<double>::infinity();
  if (!scheduler->waiting().empty()) {
    if (!deferred) return false;  // immediate: any waiting request comes first
    slack_s = DeferralSlack(now);
    if (!(slack_s > 0)) return false;
  }
  if (!g->waiting()) {
    // Attached but between two iterations (it packs its batch, writes its progress). With
    // requests deferred, wait for it (within their slack) instead of admitting them now; with
    // nothing waiting, the loop sleeps until Acquire wakes it.
    if (scheduler->waiting().empty()) return false;
    constexpr double kMaxTrainerWaitS = 0.010;
    g->WaitForTrainer(now +
                      std::chrono::duration_cast<Clock::duration>(
                          std::chrono::duration<double>(std::min(slack_s, kMaxTrainerWaitS))));
    return true;
  }
  PublishGauges();
  return g->Grant(&pool);
}

void Engine::Impl::CancelAll() {
  scheduler->CancelAll();
  {
    MutexLock lock(&mu);
    for (auto& s : incoming) scheduler->Finish(s.get(), FinishReason::kCancelled);
    incoming.clear();
    scheduler->queued().store(0);
  }
  PublishGauges();  // the gauges show the freed blocks after a shutdown, too
}

void Engine::Impl::Step() {
  const auto& c = self->model_->config();
  const auto t0 = Clock::now();
  idle = false;
  const Scheduler::Outcome outcome = scheduler->Plan();
  if (outcome != Scheduler::Outcome::kRun) {
    idle = outcome == Scheduler::Outcome::kIdle;
    PublishGauges();
    return;
  }
  scheduler->PrefetchAdapters();  // pool copies load on a loader thread while this step computes
  const StepFeatures features = scheduler->PlanFeatures();  // before Complete() advances them

  // The plan's runs by model: the base's rows (with every adapter and delta) first, then one
  // run per whole fine-tune (--swap-full-models), each its own forward pass over that model's
  // weights; the runs' logits follow each other in plan order.
  const std::span<const Scheduler::Planned> plan = scheduler->plan();
  size_t base_end = 0;
  while (base_end < plan.size() && plan[base_end].seq->full == nullptr) ++base_end;
  uint64_t prompt_rows = 0;
  for (const Scheduler::Planned& pl : plan) {
    prompt_rows +=
        static_cast<uint64_t>(std::clamp<int64_t>(pl.seq->n_prompt - pl.start, 0, pl.count));
  }
  last_step_prompt_rows = prompt_rows;

  // Constrained rows: their masks for this step's token are computed during the forward pass.
  mask_rows.clear();
  for (const Scheduler::Planned& pl : plan) {
    if (!self->opts_.overlap_grammar_masks) break;
    if (pl.wants_logits && pl.seq->matcher != nullptr && !pl.seq->mask_ready)
      mask_rows.push_back(pl.seq);
  }
  if (!mask_rows.empty()) {
    if (!mask_worker) mask_worker = std::make_unique<MaskWorker>(&self->metrics_);
    mask_worker->Start(&mask_rows);
  }
  int64_t hidden_rows = 0;
  for (const Scheduler::Planned& pl : plan) hidden_rows += pl.hidden_rows();
  if (static_cast<int64_t>(hidden.size()) < hidden_rows * c.n_embd)
    hidden.resize(static_cast<size_t>(hidden_rows * c.n_embd));
  RunOutputs out{logits.data(), hidden.data()};
  if (base_end > 0) out = RunBase(plan.first(base_end), out);
  for (size_t i = base_end; i < plan.size();) {
    size_t j = i;
    while (j < plan.size() && plan[j].seq->full == plan[i].seq->full) ++j;
    out = RunFull(plan.subspan(i, j - i), out);
    i = j;
  }
  if (!mask_rows.empty()) {
    const auto w0 = Clock::now();
    mask_worker->Wait();
    self->metrics_.grammar_mask_wait_micros.fetch_add(Micros(Clock::now() - w0));
  }
  self->metrics_.prompt_tokens_total.fetch_add(prompt_rows);
  self->metrics_.steps_total.fetch_add(1);

  scheduler->Complete(logits.data(), c.vocab_size, output.get(), hidden.data(),
                      c.n_embd);  // sample, stream, finish
  const double step_s = Seconds(Clock::now() - t0);
  self->metrics_.step_seconds.Observe(step_s);
  scheduler->ObserveStep(features, step_s);
  PublishGauges();
}

// One whole fine-tune's rows (a run of the plan): its own forward pass, no adapter hooks.
Engine::Impl::RunOutputs Engine::Impl::RunFull(std::span<const Scheduler::Planned> run,
                                               RunOutputs out) {
  FullModels::Entry* e = run.front().seq->full;
  CHORUS_CHECK(e->state == FullModels::State::kResident && e->users > 0);
  step->Clear();
  for (const Scheduler::Planned& pl : run) AddPlanned(pl);
  e->forward->Run(step->Input(), kv.get(), &pool, out.logits, out.hidden);
  const auto& c = e->model->config();
  return {out.logits + step->logit_rows() * c.vocab_size,
          out.hidden + step->hidden_rows() * c.n_embd};
}

// One planned chunk as the step's rows: its logit rows and hidden rows as the plan says.
void Engine::Impl::AddPlanned(const Scheduler::Planned& pl) {
  step->AddSequence(std::span<const int32_t>(pl.seq->tokens)
                        .subspan(static_cast<size_t>(pl.start), static_cast<size_t>(pl.count)),
                    pl.start, pl.seq->table.data(), pl.wants_logits,
                    {pl.prompt_logits_begin - pl.start, pl.prompt_logits_end - pl.start},
                    {pl.hidden_begin - pl.start, pl.hidden_end - pl.start});
}

// The base's rows, with the terms of their adapters and deltas through the hooks.
Engine::Impl::RunOutputs Engine::Impl::RunBase(std::span<const Scheduler::Planned> run,
                                               RunOutputs out) {
  const auto& c = self->model_->config();
  // The planned rows become the step's arrays, and each row's adapter the hook's segments.
  row_adapters.clear();
  row_slots.clear();
  row_deltas.clear();
  bool any_adapter = false, any_delta = false;
  step->Clear();
  for (const Scheduler::Planned& pl : run) {
    AddPlanned(pl);
    const adapters::LoraView* view = pl.seq->lora ? residency->View(pl.seq->lora.get()) : nullptr;
    row_adapters.insert(row_adapters.end(), static_cast<size_t>(pl.count), view);
    if (tp_slots) {
      const void* copy = pl.seq->lora ? static_cast<const void*>(pl.seq->lora.get())
                                      : static_cast<const void*>(pl.seq->delta.get());
      row_slots.insert(row_slots.end(), static_cast<size_t>(pl.count),
                       copy != nullptr ? tp_slots->SlotOf(copy) : -1);
    }
    const delta::DeltaView* dview = pl.seq->delta ? residency->View(pl.seq->delta.get()) : nullptr;
    row_deltas.insert(row_deltas.end(), static_cast<size_t>(pl.count), dview);
    any_delta |= pl.seq->delta != nullptr;
    any_adapter |= pl.seq->lora != nullptr;
  }

  model::StepInput in = step->Input();
  variant_hook.Clear();
  if (any_adapter) {
    Status hs = lora_hook->SetRows(row_adapters);
    CHORUS_CHECK(hs.ok()) << hs.ToString();  // adapters were validated against the base at load
    variant_hook.Add(lora_hook.get());
    in.hook = &variant_hook;
    const auto distinct = static_cast<int64_t>(lora_hook->slots().size());
    if (distinct > self->metrics_.adapters_per_step_max.load())
      self->metrics_.adapters_per_step_max.store(distinct);
  }
  if (any_delta) {
    Status ds = delta_hook->SetRows(row_deltas);
    CHORUS_CHECK(ds.ok()) << ds.ToString();  // rows ≤ max_batch_tokens
    variant_hook.Add(delta_hook.get());
    in.hook = &variant_hook;
  }
  if (tp_slots) {
    self->opts_.tp_leader->Step(
        in, *kv,
        any_adapter || any_delta ? std::span<const int32_t>(row_slots) : std::span<const int32_t>(),
        kv->copies());
    kv->ClearCopies();
  }
  forward->Run(in, kv.get(), &pool, out.logits, out.hidden);
  return {out.logits + step->logit_rows() * c.vocab_size,
          out.hidden + step->hidden_rows() * c.n_embd};
}

void Engine::Impl::PublishGauges() {
  auto& m = self->metrics_;
  m.queue_length.store(scheduler->queued().load());
  m.running.store(static_cast<int64_t>(scheduler->running().size()));
  // Cached prefix blocks that no request holds are free for the taking: not "used".
  const int64_t evictable = prefix ? prefix->n_evictable() : 0;
  m.kv_blocks_used.store(pages->n_used(memory::PageKind::kKv) - evictable);
  if (prefix) {
    m.prefix_cache_blocks.store(prefix->n_cached());
    m.prefix_cache_evictions.store(prefix->evictions());
  }
  residency->PublishGauges();
  PublishAdapterActivity();
}

// The distinct adapter names of running and waiting sequences, sorted; the metrics copy them
// only when they differ from what was published (a few hundred pointer compares per step).
void Engine::Impl::PublishAdapterActivity() {
  auto collect = [](const auto& seqs, std::vector<const std::string*>* out) {
    out->clear();
    for (const auto& s : seqs) {
      if (s->req->variant) out->push_back(&s->req->variant->name);
    }
    std::sort(out->begin(), out->end(),
              [](const std::string* a, const std::string* b) { return *a < *b; });
    out->erase(std::unique(out->begin(), out->end(),
                           [](const std::string* a, const std::string* b) { return *a == *b; }),
               out->end());
  };
  collect(scheduler->running(), &activity_running);
  collect(scheduler->waiting(), &activity_waiting);
  self->metrics_.adapter_activity.Publish(activity_running, activity_waiting);
}

void Engine::ForgetAdapter(const std::string& name) {
  impl_->residency->Forget(name);
  impl_->Wake();
}

void Engine::Impl::Wake() {
  {
    MutexLock lock(&mu);
    kick = true;
  }
  cv.SignalAll();
}

}  // namespace chorus::engine
