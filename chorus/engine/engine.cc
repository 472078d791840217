#include "chorus/engine/engine.h"

#include <algorithm>
#include <chrono>

#include "chorus/adapters/lora/lora_hook.h"
#include "chorus/base/logging.h"
#include "chorus/base/mutex.h"
#include "chorus/engine/adapter_residency.h"
#include "chorus/engine/policy.h"
#include "chorus/engine/stop_checker.h"
#include "chorus/memory/host_arena.h"
#include "chorus/memory/kv_cache.h"
#include "chorus/model/forward.h"
#include "chorus/model/step_builder.h"

namespace chorus::engine {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// Under --max-adapters-per-step, how many admission rounds a waiting sequence can be passed over
// (its adapter would exceed the cap while newer sequences, whose adapters are already in the
// step, are admitted) before admission stops behind it. Bounds its wait: once nothing newer is
// admitted, the adapters in the step lose their sequences as those finish, and the first slot
// that frees is its.

// One choice of one request, as the engine thread sees it.
struct Sequence {
  uint64_t serial = 0;  // admission order; the largest is the newest (first to be preempted)
  std::shared_ptr<RequestHandle> handle;
  std::shared_ptr<const GenerationRequest> req;
  int index = 0;
  std::vector<int32_t> tokens;  // prompt + generated
  int64_t n_prompt = 0;
  int64_t n_computed = 0;      // tokens whose K/V are in the cache
  std::vector<int32_t> table;  // KV block table
  std::unique_ptr<Sampler> sampler;
  std::unique_ptr<tokenizer::StreamingDetokenizer> detok;
  std::unique_ptr<StopChecker> stop;
  int64_t n_generated = 0;
  Clock::time_point arrival, last_token;
  bool finished = false;
  // Choices 1..n-1 of a request with n > 1, held by choice 0 until its prompt is in the cache;
  // then they fork its block table (ForkChoices) instead of recomputing the prompt.
  std::vector<std::unique_ptr<Sequence>> forks;
  // Adapter (null = base). While `ticket` is set its disk load is pending and the sequence
  // waits; `pinned` while it runs (AdapterResidency pin).
  std::shared_ptr<const adapters::LoraAdapter> lora;
  std::shared_ptr<AdapterTicket> ticket;
  bool pinned = false;
  int policy_passes = 0;  // the admission policy's counter (Candidate::passes)
};

}  // namespace

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
  if (max_queue < 0 || max_queue > 1000000)
    return InvalidArgumentError("max-queue must be in [0, 1000000]");
  if (pool_bytes < (int64_t{1} << 20))
    return InvalidArgumentError("pool-size must be at least 1 MiB");
  if (block_size < 1 || block_size > 1024)
    return InvalidArgumentError("block size must be in [1, 1024]");
  if (max_adapters_per_step < 0 || max_adapters_per_step > 4096)
    return InvalidArgumentError("max-adapters-per-step must be in [0, 4096]");
  if (loader_threads < 1 || loader_threads > 64)
    return InvalidArgumentError("loader-threads must be in [1, 64]");
  return OkStatus();
}

struct Engine::Impl {
  Engine* self;
  ThreadPool pool;
  std::unique_ptr<memory::PagePool> pages;
  std::unique_ptr<memory::KvCache> kv;
  std::unique_ptr<model::Forward> forward;
  std::vector<float> logits;       // [max_running, vocab]
  SamplerScratch sampler_scratch;  // engine thread only
  SampleResult sample_result;      // engine thread only, reused
  // Seeds for requests without one: distinct per sequence, different on every run.
  std::atomic<uint64_t> seed_source{
      static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count())};

  // Incoming queue: the only state shared with client threads.
  Mutex mu;
  CondVar cv;
  std::deque<std::unique_ptr<Sequence>> incoming GUARDED_BY(mu);
  std::atomic<int64_t> queued{0};  // requests submitted but not yet running
  std::atomic<bool> stop_now{false};
  std::atomic<bool> draining{false};
  Clock::time_point drain_deadline GUARDED_BY(mu);
  std::thread thread;

  // Engine-thread state.
  std::deque<std::unique_ptr<Sequence>> waiting;
  std::vector<std::unique_ptr<Sequence>> running;  // admission order
  uint64_t next_serial = 1;
  // Step arrays, preallocated for max_batch_tokens rows.
  std::unique_ptr<model::StepBuilder> step;  // the step's arrays, reserved at Create
  struct Planned {
    Sequence* seq;
    int64_t start, count;
    bool wants_logits;
  };
  std::vector<Planned> plan;
  std::vector<const adapters::LoraView*> row_adapters;  // [rows] of the step
  std::unique_ptr<adapters::LoraHook> lora_hook;
  std::vector<const void*> step_adapters;  // distinct adapters of the step (AdmitWaiting)
  std::unique_ptr<Policy> policy;          // which waiting sequences may join a step
  // PublishAdapterActivity's scratch (reserved at Create: no allocation per step).
  std::vector<const std::string*> activity_running, activity_waiting;
  bool idle = false;                 // engine thread: the last step found nothing to run
  bool kick GUARDED_BY(mu) = false;  // a loader finished something the engine waits for
  // Declared last: destroyed first (joins its loader threads while the pool still exists).
  std::unique_ptr<AdapterResidency> residency;

  explicit Impl(Engine* e, int threads) : self(e), pool(threads) {}

  void Loop();
  // Whether the engine thread has something to do. `idle`: the last step could run nothing
  // (e.g. every waiting request waits for its adapter); sleep until something arrives or a
  // loader finishes (kick).
  bool ReadyLocked() const REQUIRES(mu) {
    const bool work = !running.empty() || !waiting.empty();
    return stop_now.load() || !incoming.empty() || kick || (draining.load() && !work) ||
           (!idle && (draining.load() || work));
  }
  void Step();
  void Preempt(Sequence* s);
  void Finish(Sequence* s, FinishReason why, const std::string& error = "",
              StatusCode code = StatusCode::kInternal);
  void OnToken(Sequence* s, const float* row_logits);
  void ForkChoices(Sequence* parent, const float* row_logits);
  bool ReleaseNewestWaitingTable();
  void CancelAll();
  void PublishGauges();
  void PublishAdapterActivity();
  // Adapter residency helpers (engine/adapter_residency.h).
  void ResolveAdapterLoads();
  void UnpinAdapter(Sequence* s);
  bool ReclaimAdapterPages(int64_t n_free);
  void AdmitWaiting(int64_t* budget);
  void PrefetchAdapters();
  void Wake();
};

int64_t Engine::context_length() const { return model_->config().max_seq_len; }

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
  memory::KvLayout layout{.n_layers = c.n_layers,
                          .n_kv_heads = c.n_kv_heads,
                          .head_dim = c.head_dim,
                          .block_size = opts.block_size};
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
  impl->forward =
      std::make_unique<model::Forward>(e->model_, opts.max_batch_tokens, opts.max_running);
  impl->logits.assign(static_cast<size_t>(opts.max_running * c.vocab_size), 0.0f);
  impl->step = std::make_unique<model::StepBuilder>(opts.max_batch_tokens, opts.max_running);
  impl->plan.reserve(static_cast<size_t>(opts.max_running));
  impl->sampler_scratch.Reserve(c.vocab_size);
  impl->row_adapters.reserve(static_cast<size_t>(opts.max_batch_tokens));
  impl->lora_hook = std::make_unique<adapters::LoraHook>(c, opts.max_batch_tokens);
  e->metrics_.kv_blocks_total = n_pages;
  impl->step_adapters.reserve(static_cast<size_t>(opts.max_running));
  impl->policy = std::make_unique<FcfsPolicy>(opts.max_adapters_per_step);
  impl->activity_running.reserve(static_cast<size_t>(opts.max_running));
  impl->activity_waiting.reserve(static_cast<size_t>(opts.max_queue + opts.max_running));
  AdapterResidency::Options ro{.loader_threads = opts.loader_threads,
                               .pool_copies = opts.adapter_pool_copies};
  Impl* raw_impl = impl.get();
  impl->residency = std::make_unique<AdapterResidency>(
      impl->pages.get(), &e->metrics_, opts.adapter_cache, [raw_impl] { raw_impl->Wake(); }, ro);
  impl->residency->PublishGauges();
  e->impl_ = std::move(impl);
  e->impl_->thread = std::thread([raw = e->impl_.get()] { raw->Loop(); });
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

Result<std::shared_ptr<RequestHandle>> Engine::Submit(GenerationRequest req) {
  const auto& c = model_->config();
  if (!accepting_.load()) return UnavailableError("server is shutting down");
  if (req.prompt.empty()) return InvalidArgumentError("prompt is empty");
  for (int32_t t : req.prompt) {
    if (t < 0 || t >= c.vocab_size) {
      return InvalidArgumentError("prompt token id " + std::to_string(t) +
                                  " is outside the vocabulary [0, " + std::to_string(c.vocab_size) +
                                  ")");
    }
  }
  if (req.max_tokens < 1) return InvalidArgumentError("max_tokens must be at least 1");
  if (req.n < 1 || req.n > 16) return InvalidArgumentError("n must be in [1, 16]");
  if (req.lora && req.lora->n_layers() != c.n_layers) {
    return InvalidArgumentError("adapter '" + req.adapter + "' was built for another base model");
  }
  if (!req.lora && req.adapter_key && !opts_.adapter_cache) {
    return InvalidArgumentError("adapter '" + req.adapter_key->name +
                                "' named but the engine has no adapter cache");
  }
  CHORUS_RETURN_IF_ERROR(req.sampling.Validate());
  const int64_t total = static_cast<int64_t>(req.prompt.size()) + req.max_tokens;
  if (total > c.max_seq_len) {
    return OutOfRangeError("this model's maximum context length is " +
                           std::to_string(c.max_seq_len) + " tokens, but the request needs " +
                           std::to_string(req.prompt.size()) + " prompt + " +
                           std::to_string(req.max_tokens) + " completion tokens");
  }
  if (impl_->kv->BlocksFor(total) > impl_->pages->n_pages()) {
    return OutOfRangeError("the request needs " + std::to_string(total) +
                           " tokens of KV cache, more than the pool holds (" +
                           std::to_string(impl_->pages->n_pages() * opts_.block_size) +
                           "); raise --pool-size");
  }
  if (impl_->queued.load() + req.n > opts_.max_queue) {
    metrics_.requests_rejected.fetch_add(1);
    return ResourceExhaustedError("too many requests waiting (" + std::to_string(opts_.max_queue) +
                                  ")");
  }
  // A cold adapter: its disk load is queued now, in arrival order, on a loader thread.
  std::shared_ptr<AdapterTicket> ticket;
  if (!req.lora && req.adapter_key) ticket = impl_->residency->LoadFromDisk(*req.adapter_key);
  auto shared_req = std::make_shared<const GenerationRequest>(std::move(req));
  auto handle = std::make_shared<RequestHandle>(shared_req->n,
                                                static_cast<int64_t>(shared_req->prompt.size()));
  const auto now = Clock::now();
  {
    MutexLock lock(&impl_->mu);
    for (int i = 0; i < shared_req->n; ++i) {
      auto s = std::make_unique<Sequence>();
      s->handle = handle;
      s->req = shared_req;
      s->index = i;
      s->tokens = shared_req->prompt;
      s->tokens.reserve(static_cast<size_t>(total));
      s->n_prompt = static_cast<int64_t>(shared_req->prompt.size());
      SamplingParams sp = shared_req->sampling;
      if (sp.seed.has_value()) sp.seed = *sp.seed + static_cast<uint64_t>(i);
      s->sampler = std::make_unique<Sampler>(sp, c.vocab_size,
                                             impl_->seed_source.fetch_add(0x9E3779B97F4A7C15ull));
      s->detok = std::make_unique<tokenizer::StreamingDetokenizer>(tok_.get());
      s->detok->SetPrevious(s->tokens.back());
      s->stop = std::make_unique<StopChecker>(shared_req->stop);
      s->arrival = now;
      s->lora = shared_req->lora;
      s->ticket = ticket;
      if (i == 0) {
        impl_->incoming.push_back(std::move(s));
      } else {
        impl_->incoming.back()->forks.push_back(std::move(s));  // shares choice 0's prompt
      }
    }
    impl_->queued.fetch_add(shared_req->n);
  }
  metrics_.requests_total.fetch_add(1);
  metrics_.adapters.CountRequest(shared_req->adapter);  // per-adapter series
  metrics_.queue_length.store(impl_->queued.load());
  impl_->cv.SignalAll();
  return handle;
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
      while (!incoming.empty()) {
        waiting.push_back(std::move(incoming.front()));
        incoming.pop_front();
      }
      past_deadline = draining.load() && Clock::now() >= drain_deadline;
    }
    if (stop_now.load() || past_deadline) {
      CancelAll();
      return;
    }
    if (draining.load() && running.empty() && waiting.empty()) return;
    Step();
  }
}

void Engine::Impl::CancelAll() {
  for (auto& s : running) Finish(s.get(), FinishReason::kCancelled);
  running.clear();
  for (auto& s : waiting) Finish(s.get(), FinishReason::kCancelled);
  waiting.clear();
  {
    MutexLock lock(&mu);
    for (auto& s : incoming) Finish(s.get(), FinishReason::kCancelled);
    incoming.clear();
    queued.store(0);
  }
  PublishGauges();  // the gauges show the freed blocks after a shutdown, too
}

void Engine::Impl::Finish(Sequence* s, FinishReason why, const std::string& error,
                          StatusCode code) {
  if (s->finished) return;
  s->finished = true;
  if (!s->table.empty()) kv->Release(&s->table);
  for (auto& f : s->forks) {  // choices that never started end with it
    Finish(f.get(), why, error, code);
    queued.fetch_sub(1);
  }
  s->forks.clear();
  UnpinAdapter(s);
  StreamEvent ev;
  ev.index = s->index;
  ev.finish = why;
  ev.error = error;
  ev.error_code = code;
  s->handle->Push(std::move(ev));
}

void Engine::Impl::Preempt(Sequence* s) {
  // Recompute later from prompt + generated tokens; the sampler keeps its state, so the
  // continuation is the same as without preemption.
  kv->Release(&s->table);
  UnpinAdapter(s);
  s->n_computed = 0;
  self->metrics_.preemptions_total.fetch_add(1);
  CHORUS_LOG(DEBUG) << "preempt req=" << s->req->id << " choice=" << s->index
                    << " tokens=" << s->tokens.size();
}

// Choice 0 of `parent`'s request has just computed its prompt: every other choice takes a
// reference on the prompt's blocks (the partly filled last block is copied when a choice first
// writes into it, KvCache::PrepareWrite) and samples its first token from the same logits row,
// which is what it would have computed alone (batch invariance). Choices that find no room in
// the running batch wait with the shared blocks and recompute only the last prompt token.
void Engine::Impl::ForkChoices(Sequence* parent, const float* row_logits) {
  const auto max_running = static_cast<size_t>(self->opts_.max_running);
  std::vector<std::unique_ptr<Sequence>> later;
  for (auto& f : parent->forks) {
    f->table = kv->Fork(parent->table);
    f->serial = next_serial++;
    f->lora = parent->lora;  // the parent's adapter load resolved for every choice
    f->ticket.reset();
    if (running.size() < max_running) {
      f->n_computed = f->n_prompt;
      queued.fetch_sub(1);
      if (f->lora) {
        residency->Pin(f->lora);
        f->pinned = true;
      }
      OnToken(f.get(), row_logits);
      running.push_back(std::move(f));
    } else {
      f->n_computed = f->n_prompt - 1;
      later.push_back(std::move(f));
    }
  }
  parent->forks.clear();
  for (auto it = later.rbegin(); it != later.rend(); ++it) waiting.push_front(std::move(*it));
}

// Under pool pressure, a waiting choice that holds forked prompt blocks gives them up (it will
// recompute its prompt) before any running sequence is preempted. False when none holds any.
bool Engine::Impl::ReleaseNewestWaitingTable() {
  for (auto it = waiting.rbegin(); it != waiting.rend(); ++it) {
    Sequence* w = it->get();
    if (w->table.empty()) continue;
    kv->Release(&w->table);
    w->n_computed = 0;
    return true;
  }
  return false;
}

void Engine::Impl::OnToken(Sequence* s, const float* row_logits) {
  const auto& c = self->model_->config();
  SampleResult& r = sample_result;
  const std::span<const int32_t> all(s->tokens);
  const int32_t tok =
      s->sampler->Sample(std::span<const float>(row_logits, static_cast<size_t>(c.vocab_size)),
                         all.subspan(0, static_cast<size_t>(s->n_prompt)),
                         all.subspan(static_cast<size_t>(s->n_prompt)), &sampler_scratch,
                         s->req->sampling.logprobs.has_value() ? &r : nullptr);
  s->tokens.push_back(tok);
  ++s->n_generated;
  const auto now = Clock::now();
  if (s->n_generated == 1) {
    double ttft = Seconds(now - s->arrival);
    s->handle->SetTtft(ttft);
    self->metrics_.ttft_seconds.Observe(ttft);
    self->metrics_.adapters.ObserveTtft(s->req->adapter, ttft);
  } else {
    self->metrics_.time_per_output_token_seconds.Observe(Seconds(now - s->last_token));
  }
  s->last_token = now;
  self->metrics_.generation_tokens_total.fetch_add(1);

  const GenerationRequest& req = *s->req;
  bool is_eos = !req.ignore_eos && self->tok_->IsEos(tok);
  bool is_stop_id = std::find(req.stop_token_ids.begin(), req.stop_token_ids.end(), tok) !=
                    req.stop_token_ids.end();
  StreamEvent ev;
  ev.index = s->index;
  ev.token = tok;
  if (s->req->sampling.logprobs.has_value()) {
    ev.logprob = r.logprob;
    ev.top_logprobs = r.top;
  }
  FinishReason finish = FinishReason::kNone;
  if (is_eos || is_stop_id) {
    finish = FinishReason::kStop;  // the end token itself contributes no text
  } else {
    auto o = s->stop->Push(s->detok->Push(tok));
    ev.text = std::move(o.text);
    if (o.stopped) finish = FinishReason::kStop;
  }
  if (finish == FinishReason::kNone && (s->n_generated >= req.max_tokens ||
                                        static_cast<int64_t>(s->tokens.size()) >= c.max_seq_len)) {
    finish = FinishReason::kLength;
  }
  if (finish != FinishReason::kNone) {
    if (!s->stop->stopped()) {
      // Release what the detokenizer and the stop checker still hold back.
      auto o = s->stop->Push(s->detok->Flush());
      ev.text += o.text;
      if (!o.stopped) ev.text += s->stop->Flush();
    }
    ev.finish = finish;
    s->finished = true;
    if (!s->table.empty()) kv->Release(&s->table);
    UnpinAdapter(s);
  }
  s->handle->Push(std::move(ev));
}

void Engine::Impl::Step() {
  const auto& c = self->model_->config();
  const auto& opts = self->opts_;
  const auto t0 = Clock::now();
  idle = false;
  residency->Poll();      // pool copies that landed become resident
  ResolveAdapterLoads();  // disk loads that finished: admit (or fail) their requests

  // 1. Cancellations (a client that went away frees its blocks within this step).
  for (auto& s : running)
    if (s->handle->cancelled()) Finish(s.get(), FinishReason::kCancelled);
  std::erase_if(running, [](const auto& s) { return s->finished; });
  for (auto& s : waiting) {
    if (s->handle->cancelled()) {
      Finish(s.get(), FinishReason::kCancelled);  // with its unforked choices
      queued.fetch_sub(1);
    }
  }
  std::erase_if(waiting, [](const auto& s) { return s->finished; });

  // 2. Plan: running sequences oldest first (decode rows or their next prefill chunk), then
  //    admit waiting ones FCFS while rows, sequences and pages allow.
  plan.clear();
  int64_t budget = opts.max_batch_tokens;
  std::vector<std::unique_ptr<Sequence>> preempted;
  for (size_t i = 0; i < running.size() && budget > 0; ++i) {
    Sequence* s = running[i].get();
    const int64_t remaining = static_cast<int64_t>(s->tokens.size()) - s->n_computed;
    const int64_t count = std::min(budget, remaining);
    bool ok = false;
    while (!ok) {
      ok = kv->PrepareWrite(&s->table, s->n_computed, s->n_computed + count).ok();
      if (ok) break;
      // KV wins over resident adapters: evict unpinned ones before preempting anyone.
      const int64_t need =
          kv->BlocksFor(s->n_computed + count) - static_cast<int64_t>(s->table.size());
      if (ReclaimAdapterPages(need)) continue;
      if (ReleaseNewestWaitingTable()) continue;
      // Out of pages: preempt the newest running sequence not yet planned (possibly s itself).
      size_t victim = running.size() - 1;
      Preempt(running[victim].get());
      preempted.push_back(std::move(running[victim]));
      running.erase(running.begin() + static_cast<std::ptrdiff_t>(victim));
      if (victim == i) break;
    }
    if (!ok) break;  // s itself was preempted; every later one too
    plan.push_back(
        {s, s->n_computed, count, s->n_computed + count == static_cast<int64_t>(s->tokens.size())});
    budget -= count;
  }
  // Preempted sequences go back to the front of the queue, oldest first.
  for (auto it = preempted.rbegin(); it != preempted.rend(); ++it) {
    waiting.push_front(std::move(*it));
    queued.fetch_add(1);
  }
  if (preempted.empty()) AdmitWaiting(&budget);
  if (plan.empty()) {
    PublishGauges();
    auto first_ready =
        std::find_if(waiting.begin(), waiting.end(), [](const auto& s) { return !s->ticket; });
    if (first_ready != waiting.end() && running.empty()) {
      if (ReleaseNewestWaitingTable()) return;  // shared prompt blocks freed: plan again
      // Nothing fits even in an empty pool: cannot happen for validated requests, but never spin.
      Finish(first_ready->get(), FinishReason::kError, "request does not fit in the KV pool");
      waiting.erase(first_ready);
      queued.fetch_sub(1);
    } else {
      idle = true;  // only requests whose adapters are still loading: wait for a loader
    }
    return;
  }
  PrefetchAdapters();  // pool copies load on a loader thread while this step computes

  // 3. Rows of the step, grouped so equal adapters are contiguous (one segment each; rows of
  //    the base model first). Each sequence's rows stay contiguous and in position order.
  std::stable_sort(plan.begin(), plan.end(), [](const Planned& a, const Planned& b) {
    return a.seq->lora.get() < b.seq->lora.get();
  });
  row_adapters.clear();
  bool any_adapter = false;
  step->Clear();
  uint64_t prompt_rows = 0;
  for (const Planned& pl : plan) {
    step->AddSequence(std::span<const int32_t>(pl.seq->tokens)
                          .subspan(static_cast<size_t>(pl.start), static_cast<size_t>(pl.count)),
                      pl.start, pl.seq->table.data(), pl.wants_logits);
    const adapters::LoraView* view = pl.seq->lora ? residency->View(pl.seq->lora.get()) : nullptr;
    row_adapters.insert(row_adapters.end(), static_cast<size_t>(pl.count), view);
    prompt_rows +=
        static_cast<uint64_t>(std::clamp<int64_t>(pl.seq->n_prompt - pl.start, 0, pl.count));
    any_adapter |= pl.seq->lora != nullptr;
  }
  model::StepInput in = step->Input();
  if (any_adapter) {
    Status hs = lora_hook->SetRows(row_adapters);
    CHORUS_CHECK(hs.ok()) << hs.ToString();  // adapters were validated against the base at Submit
    in.hook = lora_hook.get();
    const auto distinct = static_cast<int64_t>(lora_hook->slots().size());
    if (distinct > self->metrics_.adapters_per_step_max.load())
      self->metrics_.adapters_per_step_max.store(distinct);
  }
  forward->Run(in, kv.get(), &pool, logits.data());
  self->metrics_.prompt_tokens_total.fetch_add(prompt_rows);
  self->metrics_.steps_total.fetch_add(1);

  // 4. Sample, stream, finish.
  size_t li = 0;
  for (const Planned& pl : plan) {
    pl.seq->n_computed += pl.count;
    if (!pl.wants_logits) continue;
    const float* row = logits.data() + li * static_cast<size_t>(c.vocab_size);
    if (!pl.seq->forks.empty()) ForkChoices(pl.seq, row);  // before OnToken may free the prompt
    OnToken(pl.seq, row);
    ++li;
  }
  std::erase_if(running, [](const auto& s) { return s->finished; });
  self->metrics_.step_seconds.Observe(Seconds(Clock::now() - t0));
  PublishGauges();
}

void Engine::Impl::PublishGauges() {
  auto& m = self->metrics_;
  m.queue_length.store(queued.load());
  m.running.store(static_cast<int64_t>(running.size()));
  m.kv_blocks_used.store(pages->n_used(memory::PageKind::kKv));
  residency->PublishGauges();
  PublishAdapterActivity();
}

// The distinct adapter names of running and waiting sequences, sorted; the metrics copy them
// only when they differ from what was published (a few hundred pointer compares per step).
void Engine::Impl::PublishAdapterActivity() {
  auto collect = [](const auto& seqs, std::vector<const std::string*>* out) {
    out->clear();
    for (const auto& s : seqs) {
      if (!s->req->adapter.empty()) out->push_back(&s->req->adapter);
    }
    std::sort(out->begin(), out->end(),
              [](const std::string* a, const std::string* b) { return *a < *b; });
    out->erase(std::unique(out->begin(), out->end(),
                           [](const std::string* a, const std::string* b) { return *a == *b; }),
               out->end());
  };
  collect(running, &activity_running);
  collect(waiting, &activity_waiting);
  self->metrics_.adapter_activity.Publish(activity_running, activity_waiting);
}

// ---- Adapter residency (docs/adapters.md; engine/adapter_residency.h) ----

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

void Engine::Impl::ResolveAdapterLoads() {
  for (auto& s : waiting) {
    if (!s->ticket || !s->ticket->done.load(std::memory_order_acquire)) continue;
    std::shared_ptr<AdapterTicket> t = std::move(s->ticket);
    s->ticket.reset();
    if (!t->status.ok()) {
      // The adapter was valid when registered; a failure now (file vanished, truncated,
      // unreadable) is the server's problem, not the client's: 5xx with the reason.
      const StatusCode code = t->status.code() == StatusCode::kResourceExhausted ||
                                      t->status.code() == StatusCode::kUnavailable
                                  ? t->status.code()
                                  : StatusCode::kInternal;
      const std::string name = s->req->adapter_key ? s->req->adapter_key->name : s->req->adapter;
      Finish(s.get(), FinishReason::kError,
             "adapter '" + name +
                 "' could not be loaded (it changed or became unreadable after registration): " +
                 t->status.message(),
             code);
      queued.fetch_sub(1);
    } else if (t->adapter->n_layers() != self->model_->config().n_layers) {
      Finish(s.get(), FinishReason::kError,
             "adapter '" + t->adapter->name() + "' was built for another base model",
             StatusCode::kInvalidArgument);
      queued.fetch_sub(1);
    } else {
      s->lora = t->adapter;
    }
  }
  std::erase_if(waiting, [](const auto& s) { return s->finished; });
}

void Engine::Impl::UnpinAdapter(Sequence* s) {
  if (!s->pinned) return;
  residency->Unpin(s->lora.get());
  s->pinned = false;
}

bool Engine::Impl::ReclaimAdapterPages(int64_t n_free) {
  if (pages->n_free() >= n_free) return false;  // not an adapter problem
  return residency->EvictFor(n_free);
}

// Admits waiting sequences in queue order while rows, sequences and pages allow and the policy
// (engine/policy.h) agrees. A sequence whose adapter is still loading, or that the policy passes
// over, keeps its place; a sequence that does not fit in the pool stops admission.
void Engine::Impl::AdmitWaiting(int64_t* budget) {
  const auto& opts = self->opts_;
  step_adapters.clear();
  for (const Planned& p : plan) {
    const void* a = p.seq->lora.get();
    if (a && std::find(step_adapters.begin(), step_adapters.end(), a) == step_adapters.end())
      step_adapters.push_back(a);
  }
  policy->BeginRound(step_adapters);
  size_t i = 0;
  while (*budget > 0 && i < waiting.size() &&
         static_cast<int64_t>(running.size()) < opts.max_running) {
    Sequence* s = waiting[i].get();
    const Candidate candidate{.adapter = s->lora.get(), .passes = &s->policy_passes};
    if (s->ticket || !policy->MayAdmit(candidate)) {
      ++i;
      continue;
    }
    const int64_t remaining = static_cast<int64_t>(s->tokens.size()) - s->n_computed;
    const int64_t count = std::min(*budget, remaining);
    // Admit only if this chunk fits and one block per running sequence stays free for
    // their next decode step (avoids admitting work that immediately causes preemption).
    // Its unforked choices will need a block each, too.
    const int64_t need = kv->PagesToWrite(s->table, s->n_computed, s->n_computed + count);
    const int64_t want_free =
        need + static_cast<int64_t>(running.size() + (running.empty() ? 0 : s->forks.size()));
    if (want_free > pages->n_free()) ReclaimAdapterPages(want_free);
    if (want_free > pages->n_free()) break;
    if (!kv->PrepareWrite(&s->table, s->n_computed, s->n_computed + count).ok()) break;
    s->serial = s->serial ? s->serial : next_serial++;
    plan.push_back(
        {s, s->n_computed, count, s->n_computed + count == static_cast<int64_t>(s->tokens.size())});
    *budget -= count;
    policy->Admitted(candidate);
    if (s->lora) {
      residency->Pin(s->lora);
      s->pinned = true;
    }
    running.push_back(std::move(waiting[i]));
    waiting.erase(waiting.begin() + static_cast<std::ptrdiff_t>(i));
    queued.fetch_sub(1);
  }
}

// Starts pool copies: first of adapters this step uses (they may evict unpinned copies), then
// of adapters named by queued requests, in arrival order (S-LoRA §5.2 prefetch; free pages
// only). A copy is started only if pages stay free for KV: one per running sequence plus 1/8
// of the pool (1/4 for prefetch), so adapters never crowd out the KV of work already running.
void Engine::Impl::PrefetchAdapters() {
  const int64_t base_reserve = static_cast<int64_t>(running.size());
  for (const Planned& p : plan) {
    if (p.seq->lora)
      residency->Prefetch(p.seq->lora, base_reserve + pages->n_pages() / 8, /*may_evict=*/true);
  }
  int prefetched = 0;
  for (const auto& s : waiting) {
    if (prefetched >= 8) break;  // bound the work per step
    if (!s->lora || residency->Resident(s->lora.get()) || residency->Loading(s->lora.get()))
      continue;
    residency->Prefetch(s->lora, base_reserve + pages->n_pages() / 4, /*may_evict=*/false);
    ++prefetched;
  }
}

}  // namespace chorus::engine
