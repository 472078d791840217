#include "chorus/engine/scheduler.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "chorus/base/logging.h"

namespace chorus::engine {
namespace {
// A steady-clock time in seconds (since the clock's epoch: boot, so never negative).
double Seconds(Clock::time_point t) {
  return std::chrono::duration<double>(t.time_since_epoch()).count();
}
}  // namespace

Scheduler::Scheduler(SchedulerOptions opts, memory::PagePool* pages, memory::KvCache* kv,
                     AdapterResidency* residency, std::unique_ptr<Policy> policy,
                     EngineMetrics* metrics, memory::PrefixCache* prefix, FullModels* full_models)
    : opts_(opts),
      pages_(pages),
      kv_(kv),
      residency_(residency),
      policy_(std::move(policy)),
      metrics_(metrics),
      prefix_(prefix),
      full_models_(full_models),
      kv_windows_(kv->groups().any_window()) {
  plan_.reserve(static_cast<size_t>(opts_.max_running));
  step_adapters_.reserve(static_cast<size_t>(opts_.max_running));
  step_deltas_.reserve(static_cast<size_t>(opts_.max_running));
  plan_adapters_.reserve(static_cast<size_t>(opts_.max_running));
  plan_deltas_.reserve(static_cast<size_t>(opts_.max_running));
  if (full_models != nullptr) held_.reserve(full_models->refs().size());
}

void Scheduler::Enqueue(std::unique_ptr<Sequence> s) {
  overload_.Arrived(Seconds(s->arrival));
  waiting_.push_back(std::move(s));
}

Scheduler::Outcome Scheduler::Plan() {
  residency_->Poll();     // pool copies that landed become resident
  ResolveAdapterLoads();  // disk loads that finished: admit (or fail) their requests
  ResolveFullModels();    // swap-ins that finished

  // 1. Cancellations (a client that went away frees its blocks within this step).
  for (auto& s : running_)
    if (s->handle->cancelled()) Finish(s.get(), FinishReason::kCancelled);
  std::erase_if(running_, [](const auto& s) { return s->finished; });
  for (auto& s : waiting_) {
    if (s->handle->cancelled()) {
      Finish(s.get(), FinishReason::kCancelled);  // with its unforked choices
      queued_.fetch_sub(1);
    }
  }
  std::erase_if(waiting_, [](const auto& s) { return s->finished; });
  PreemptOrphanedLineSkippers();

  // 2. Running sequences oldest first (decode rows or their next prefill chunk), then admit
  //    waiting ones in queue order while rows, sequences and pages allow.
  plan_.clear();
  prompt_logit_allowance_ = opts_.max_prompt_logprob_rows;
  int64_t budget = opts_.max_batch_tokens;
  std::vector<std::unique_ptr<Sequence>> preempted;
  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    Sequence* s = running_[i].get();
    const int64_t count = ChunkRows(*s, budget);
    if (count == 0) continue;  // its prompt-logprob rows wait for the next step
    bool ok = false;
    while (!ok) {
      ok = kv_->PrepareWrite(&s->table, s->n_computed, s->n_computed + count).ok();
      if (ok) break;
      // KV wins over resident adapters: evict unpinned ones before preempting anyone.
      const int64_t need = kv_->PagesToWrite(s->table, s->n_computed, s->n_computed + count);
      if (ReclaimPages(need)) continue;
      if (ReleaseNewestWaitingTable()) continue;
      // Out of pages: preempt the newest running sequence not yet planned (possibly s itself).
      const size_t victim = running_.size() - 1;
      Preempt(running_[victim].get());
      preempted.push_back(std::move(running_[victim]));
      running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(victim));
      if (victim == i) break;
    }
    if (!ok) break;  // s itself was preempted; every later one too
    plan_.push_back(PlanChunk(s, count));
    budget -= count;
  }
  // Preempted sequences go back to the front of the queue, oldest first.
  for (auto it = preempted.rbegin(); it != preempted.rend(); ++it) {
    waiting_.push_front(std::move(*it));
    queued_.fetch_add(1);
  }
  if (preempted.empty() && !(hold_admission_ && !running_.empty())) AdmitWaiting(&budget);
  if (plan_.empty()) {
    auto first_ready =
        std::find_if(waiting_.begin(), waiting_.end(), [](const auto& s) { return !NotReady(*s); });
    if (first_ready == waiting_.end() || !running_.empty()) {
      return Outcome::kIdle;  // only requests whose adapters or models are still loading
    }
    if (ReleaseNewestWaitingTable()) return Outcome::kReplan;  // shared prompt blocks freed
    // Nothing fits even in an empty pool: cannot happen for validated requests, but never spin.
    Finish(first_ready->get(), FinishReason::kError, "request does not fit in the KV pool");
    waiting_.erase(first_ready);
    queued_.fetch_sub(1);
    return Outcome::kReplan;
  }

  // 3. Equal adapters contiguous (one segment each; base-model rows first); stable, so each
  //    sequence's rows stay contiguous and in position order.
  //    Whole fine-tunes' rows last, one run per model (the engine runs each run separately).
  std::stable_sort(plan_.begin(), plan_.end(), [](const Planned& a, const Planned& b) {
    const bool fa = a.seq->full != nullptr, fb = b.seq->full != nullptr;
    if (fa != fb) return fb;
    return a.seq->variant_key() < b.seq->variant_key();
  });
  return Outcome::kRun;
}

int64_t Scheduler::ChunkRows(const Sequence& s, int64_t budget) const {
  const int64_t remaining = static_cast<int64_t>(s.tokens.size()) - s.n_computed;
  int64_t count = std::min(budget, remaining);
  const auto [begin, end] = s.PromptLogitRows(s.n_computed, count);
  if (end - begin > prompt_logit_allowance_) count = begin - s.n_computed + prompt_logit_allowance_;
  return count;
}

Scheduler::Planned Scheduler::PlanChunk(Sequence* s, int64_t count) {
  const auto [begin, end] = s->PromptLogitRows(s->n_computed, count);
  prompt_logit_allowance_ -= end - begin;
  const auto [hidden_begin, hidden_end] = s->HiddenRows(s->n_computed, count);
  const bool last = s->n_computed + count == static_cast<int64_t>(s->tokens.size());
  return {s,     s->n_computed, count,        last && !s->is_embedding(),
          begin, end,           hidden_begin, hidden_end};
}

void Scheduler::Complete(const float* logits, int64_t vocab, TokenSink* sink, const float* hidden,
                         int64_t d) {
  size_t li = 0, hi = 0;
  for (const Planned& pl : plan_) {
    Sequence* s = pl.seq;
    s->n_computed += pl.count;
    if (prefix_ != nullptr)
      prefix_->Insert(s->prefix_variant, s->tokens, s->n_computed, s->table, &s->prefix);
    // Rows from now on are at positions ≥ n_computed: windowed layers' blocks behind their
    // window are never read again.
    if (kv_windows_) kv_->DropBehindWindows(&s->table, s->n_computed);
    for (int64_t p = pl.prompt_logits_begin; p < pl.prompt_logits_end; ++p, ++li) {
      sink->EmitPromptLogprob(s, p + 1, logits + li * static_cast<size_t>(vocab));
      s->prompt_logprobs_next = p + 2;
    }
    for (int64_t p = pl.hidden_begin; p < pl.hidden_end; ++p, ++hi) {
      CHORUS_CHECK(hidden != nullptr && p >= s->embed_next);
      sink->PoolHidden(s, hidden + hi * static_cast<size_t>(d), d);
      s->embed_next = p + 1;
    }
    if (s->is_embedding()) {
      if (s->n_computed < s->n_prompt) continue;
      sink->EmitEmbedding(s);
      Retire(s);
      continue;
    }
    if (!pl.wants_logits) continue;
    const float* row = logits + li * static_cast<size_t>(vocab);
    if (!pl.seq->forks.empty()) ForkChoices(pl.seq, row, sink);  // before the prompt may be freed
    if (sink->Emit(pl.seq, row) != FinishReason::kNone) Retire(pl.seq);
    ++li;
  }
  std::erase_if(running_, [](const auto& s) { return s->finished; });
}

void Scheduler::CancelAll() {
  for (auto& s : running_) Finish(s.get(), FinishReason::kCancelled);
  running_.clear();
  for (auto& s : waiting_) Finish(s.get(), FinishReason::kCancelled);
  waiting_.clear();
  queued_.store(0);
}

void Scheduler::Retire(Sequence* s) {
  s->finished = true;
  if (!s->table.empty()) kv_->Release(&s->table);
  UnpinAdapter(s);
}

void Scheduler::Finish(Sequence* s, FinishReason why, const std::string& error, StatusCode code) {
  if (s->finished) return;
  Retire(s);
  for (auto& f : s->forks) {  // choices that never started end with it
    Finish(f.get(), why, error, code);
    queued_.fetch_sub(1);
  }
  s->forks.clear();
  OutputStage::PushFinal(s, why, error, code);
}

void Scheduler::Preempt(Sequence* s) {
  // Recompute later from prompt + generated tokens; the sampler keeps its state, so the
  // continuation is the same as without preemption.
  kv_->Release(&s->table);
  UnpinAdapter(s);
  s->n_computed = 0;
  s->prefix = {};
  metrics_->preemptions_total.fetch_add(1);
  CHORUS_LOG(DEBUG) << "preempt req=" << s->req->id << " choice=" << s->index
                    << " tokens=" << s->tokens.size();
}

void Scheduler::PreemptOrphanedLineSkippers() {
  // Every step: the common case (no line-skipper runs) costs one pass over the running ones.
  if (std::none_of(running_.begin(), running_.end(), [](const auto& r) { return r->line_skipper; }))
    return;
  // (Entries already moved out below are null.)
  auto running_delta = [&](const void* d, bool parents_only) {
    return std::any_of(running_.begin(), running_.end(), [&](const auto& r) {
      return r != nullptr && !r->finished && r->delta.get() == d &&
             !(parents_only && r->line_skipper);
    });
  };
  const bool another_delta_waits =
      std::any_of(waiting_.begin(), waiting_.end(), [&](const auto& w) {
        return !w->finished && !NotReady(*w) && w->delta != nullptr &&
               !running_delta(w->delta.get(), false);
      });
  if (!another_delta_waits) return;
  std::vector<std::unique_ptr<Sequence>> yielded;
  for (auto& r : running_) {
    if (!r->line_skipper || r->finished || running_delta(r->delta.get(), true)) continue;
    Preempt(r.get());
    metrics_->line_skippers_preempted.fetch_add(1);
    r->line_skipper = false;
    r->yielded = true;
    yielded.push_back(std::move(r));
  }
  if (yielded.empty()) return;
  std::erase_if(running_, [](const auto& r) { return r == nullptr; });
  for (auto& y : yielded) {
    auto at = std::find_if(waiting_.begin(), waiting_.end(),
                           [&](const auto& w) { return w->arrival > y->arrival; });
    waiting_.insert(at, std::move(y));
    queued_.fetch_add(1);
  }
}

// Choice 0 of `parent`'s request has just computed its prompt: every other choice takes a
// reference on the prompt's blocks (the partly filled last block is copied when a choice first
// writes into it, KvCache::PrepareWrite) and samples its first token from the same logits row,
// which is what it would have computed alone (batch invariance). Choices that find no room in
// the running batch wait with the shared blocks and recompute only the last prompt token.
void Scheduler::ForkChoices(Sequence* parent, const float* row_logits, TokenSink* sink) {
  const auto max_running = static_cast<size_t>(opts_.max_running);
  std::vector<std::unique_ptr<Sequence>> later;
  for (auto& f : parent->forks) {
    f->table = kv_->Fork(parent->table);
    f->prefix = parent->prefix;
    f->serial = next_serial_++;
    f->lora = parent->lora;  // the parent's adapter load resolved for every choice
    f->delta = parent->delta;
    f->full = parent->full;
    f->ticket.reset();
    if (running_.size() < max_running) {
      f->n_computed = f->n_prompt;
      queued_.fetch_sub(1);
      PinVariant(f.get());
      if (f->full) {
        full_models_->Pin(f->full);  // resident: the parent runs on it
        f->full_pinned = true;
      }
      if (sink->Emit(f.get(), row_logits) != FinishReason::kNone) Retire(f.get());
      running_.push_back(std::move(f));
    } else {
      f->n_computed = f->n_prompt - 1;
      later.push_back(std::move(f));
    }
  }
  parent->forks.clear();
  for (auto it = later.rbegin(); it != later.rend(); ++it) waiting_.push_front(std::move(*it));
}

// Under pool pressure, a waiting choice that holds forked prompt blocks gives them up (it will
// recompute its prompt) before any running sequence is preempted. False when none holds any.
bool Scheduler::ReleaseNewestWaitingTable() {
  for (auto it = waiting_.rbegin(); it != waiting_.rend(); ++it) {
    Sequence* w = it->get();
    if (w->table.empty()) continue;
    kv_->Release(&w->table);
    w->n_computed = 0;
    w->prefix = {};
    return true;
  }
  return false;
}

void Scheduler::ResolveAdapterLoads() {
  for (auto& s : waiting_) {
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
      const std::string& name = s->req->variant_name();
      Finish(s.get(), FinishReason::kError,
             "adapter '" + name +
                 "' could not be loaded (it changed or became unreadable after registration): " +
                 t->status.message(),
             code);
      queued_.fetch_sub(1);
    } else if (!t->delta && t->adapter->n_layers() != kv_->layout().n_layers) {
      Finish(s.get(), FinishReason::kError,
             "adapter '" + t->adapter->name() + "' was built for another base model",
             StatusCode::kInvalidArgument);
      queued_.fetch_sub(1);
    } else if (Status b = bind_variant_
                              ? bind_variant_(t->delta ? std::shared_ptr<const void>(t->delta)
                                                       : std::shared_ptr<const void>(t->adapter),
                                              *s->req->variant)
                              : OkStatus();
               !b.ok()) {
      // Another rank could not load its shard (tensor parallelism): as a failed load.
      Finish(
          s.get(), FinishReason::kError, b.message(),
          b.code() == StatusCode::kUnavailable ? StatusCode::kUnavailable : StatusCode::kInternal);
      queued_.fetch_sub(1);
    } else if (t->delta) {
      s->delta = t->delta;  // validated against the base when loaded
    } else {
      s->lora = t->adapter;
    }
  }
  std::erase_if(waiting_, [](const auto& s) { return s->finished; });
}

void Scheduler::UnpinAdapter(Sequence* s) {
  if (s->full_pinned) {
    full_models_->Unpin(s->full);
    s->full_pinned = false;
  }
  if (!s->pinned) return;
  if (s->lora) {
    residency_->Unpin(s->lora.get());
  } else {
    residency_->Unpin(s->delta.get());
  }
  s->pinned = false;
}

void Scheduler::PinVariant(Sequence* s) {
  if (s->lora) {
    residency_->Pin(s->lora);
  } else if (s->delta) {
    residency_->Pin(s->delta);
  } else {
    return;
  }
  s->pinned = true;
}

void Scheduler::ResolveFullModels() {
  if (full_models_ == nullptr) return;
  full_models_->Poll();
  bool failed = false;
  for (auto& s : waiting_) {
    if (s->full == nullptr || s->full->state != FullModels::State::kFailed) continue;
    // The file was valid at start-up; a failure now is the server's problem (5xx).
    Finish(s.get(), FinishReason::kError,
           "model '" + s->full->ref.name +
               "' could not be swapped in (it changed or became unreadable after start-up): " +
               s->full->error.message(),
           StatusCode::kInternal);
    queued_.fetch_sub(1);
    failed = true;
  }
  if (!failed) return;
  std::erase_if(waiting_, [](const auto& s) { return s->finished; });
  // Later requests try again (the file may have been put back).
  for (const adapters::VariantRef& r : full_models_->refs()) {
    FullModels::Entry* e = full_models_->Find(r.name);
    if (e->state == FullModels::State::kFailed) e->state = FullModels::State::kAbsent;
  }
}

void Scheduler::AddFeatures(const Planned& p, std::vector<const void*>* adapters,
                            std::vector<const void*>* deltas, StepFeatures* f) {
  // A whole fine-tune takes neither an adapter nor a delta slot.
  const void* a = p.seq->full ? nullptr : p.seq->variant_key();
  auto& in = p.seq->delta ? *deltas : *adapters;
  const bool is_new = a && std::find(in.begin(), in.end(), a) == in.end();
  if (is_new) in.push_back(a);
  const int64_t rank = p.seq->lora ? p.seq->lora->max_rank() : 0;
  f->AddChunk(p.start, p.count,
              p.start + p.count < static_cast<int64_t>(p.seq->tokens.size()) || p.count > 1, rank);
  if (is_new && p.seq->lora) {
    f->adapters += 1;
    f->sum_ranks += static_cast<double>(rank);
  }
  if (is_new && p.seq->delta) f->deltas += 1;
}

StepFeatures Scheduler::PlanFeatures() {
  StepFeatures f;
  plan_adapters_.clear();
  plan_deltas_.clear();
  for (const Planned& p : plan_) AddFeatures(p, &plan_adapters_, &plan_deltas_, &f);
  return f;
}

void Scheduler::ObserveStep(const StepFeatures& f, double seconds) {
  policy_->ObserveStep(f, seconds);
  metrics_->slo_cost_correction_milli.store(
      static_cast<int64_t>(std::lround(policy_->cost_correction() * 1000.0)));
}

bool Scheduler::ReclaimPages(int64_t n_free) {
  if (pages_->n_free() >= n_free) return false;  // nothing to reclaim for
  const int64_t before = pages_->n_free();
  if (!residency_->EvictFor(n_free) && prefix_ != nullptr) prefix_->EvictFor(n_free);
  return pages_->n_free() > before;
}

// Admits waiting sequences in queue order (the oldest not started last when the policy holds
// them back, sequences that already streamed tokens first) while rows, sequences and pages allow
// and the policy (engine/policy.h) agrees. A sequence whose adapter is still loading, or that the
// policy passes over, keeps its place; a sequence that does not fit in the pool stops admission.
// Before that, the policy may abort waiting sequences (early abort: they are answered with 429 at
// once).
void Scheduler::AdmitWaiting(int64_t* budget) {
  step_adapters_.clear();
  step_deltas_.clear();
  StepState state;
  const auto now = Clock::now();
  for (const Planned& p : plan_) {
    AddFeatures(p, &step_adapters_, &step_deltas_, &state.planned);
    const double tpot = p.seq->req->tpot_slo_ms / 1e3;
    if (tpot > 0 && p.seq->n_generated > 0)
      state.tpot_allowance_s =
          std::min(state.tpot_allowance_s,
                   TpotAllowance(tpot, p.seq->n_generated,
                                 std::chrono::duration<double>(now - p.seq->first_token).count()));
  }
  state.sequences = static_cast<int64_t>(plan_.size());
  state.max_sequences = opts_.max_running;
  const Sequence* oldest = nullptr;  // the oldest sequence that has not started
  for (const auto& s : waiting_)
    if (!s->finished && s->n_generated == 0) {
      oldest = s.get();
      break;
    }
  overload_.Fill(Seconds(now), oldest ? Seconds(oldest->arrival) : -1.0, &state);
  policy_->BeginRound(step_adapters_, step_deltas_);

  // Whole fine-tunes not resident: swap-ins in queue order, each evicting the least recently
  // used resident model that no running sequence uses (or waiting until one is idle). A resident
  // model that an older waiting sequence needs is held for it meanwhile (first come, first
  // served: a newer request's swap-in does not take its model away).
  if (full_models_ != nullptr) {
    held_.clear();
    for (const auto& s : waiting_) {
      if (s->full == nullptr || s->full->state == FullModels::State::kLoading) continue;
      if (s->full->state == FullModels::State::kResident) {
        if (std::find(held_.begin(), held_.end(), s->full) == held_.end()) {
          full_models_->Pin(s->full);
          held_.push_back(s->full);
        }
      } else {
        full_models_->Want(s->full);
      }
    }
    for (FullModels::Entry* e : held_) full_models_->Unpin(e);
  }

  // Every ready waiting sequence as the policy sees it, in queue order.
  auto candidate_of = [&](Sequence* s) {
    return Candidate{
        .adapter = s->variant_key(),
        .passes = &s->policy_passes,
        .delta = s->delta != nullptr,
        .full = s->full != nullptr,
        .swapped_out = s->full != nullptr && s->full->state != FullModels::State::kResident,
        .rank = s->lora ? s->lora->max_rank() : 0,
        .start = s->n_computed,
        .remaining = static_cast<int64_t>(s->tokens.size()) - s->n_computed,
        .waited_s = std::chrono::duration<double>(now - s->arrival).count(),
        .ttft_slo_s = s->req->ttft_slo_ms / 1e3,
        .tpot_slo_s = s->req->tpot_slo_ms / 1e3,
        .started = s->n_generated > 0,
    };
  };
  ready_.clear();
  ready_index_.clear();
  for (size_t i = 0; i < waiting_.size(); ++i) {
    if (waiting_[i]->ticket) continue;
    ready_.push_back(candidate_of(waiting_[i].get()));
    ready_index_.push_back(i);
  }
  abort_.assign(ready_.size(), 0);
  const int64_t hold_back = policy_->Sweep(state, ready_, &abort_);
  bool aborted = false;
  for (size_t k = 0; k < ready_.size(); ++k) {
    if (!abort_[k]) continue;
    Sequence* s = waiting_[ready_index_[k]].get();
    const int64_t choices = 1 + static_cast<int64_t>(s->forks.size());
    char msg[256];
    std::snprintf(msg, sizeof(msg),
                  "the request would miss its TTFT SLO of %.0f ms (it has waited %.0f ms and its "
                  "prompt of %lld tokens still needs computing); retry later or with a larger "
                  "ttft_slo_ms",
                  s->req->ttft_slo_ms, ready_[k].waited_s * 1e3,
                  static_cast<long long>(ready_[k].remaining));
    for (int64_t c = 0; c < choices; ++c) {
      metrics_->slo[static_cast<size_t>(SloCount::kTtftMissed)].fetch_add(1);
      metrics_->adapters.CountSlo(s->req->variant_name(), SloCount::kTtftMissed);
    }
    metrics_->slo_aborted.fetch_add(1);
    Finish(s, FinishReason::kError, msg, StatusCode::kResourceExhausted);
    queued_.fetch_sub(1);
    aborted = true;
  }

  // Admission order over the waiting queue: started sequences in queue order, then the others
  // in queue order, the `hold_back` oldest of those the policy saw (ready, not started) last.
  order_.clear();
  held_back_order_.clear();
  for (size_t i = 0; i < waiting_.size(); ++i) {
    // A yielded line-skipper waits its turn in arrival order instead.
    if (waiting_[i]->finished || waiting_[i]->n_generated == 0 || waiting_[i]->yielded) continue;
    waiting_[i]->held_back = false;  // a preempted sequence goes first, and so does its prefetch
    order_.push_back(i);
  }
  int64_t to_hold = hold_back;
  for (size_t i = 0; i < waiting_.size(); ++i) {
    Sequence* s = waiting_[i].get();
    if (s->finished || (s->n_generated > 0 && !s->yielded)) continue;
    s->held_back = to_hold > 0 && !s->ticket;
    if (s->held_back) {
      held_back_order_.push_back(i);
      --to_hold;
      if (!s->ever_held_back) {
        s->ever_held_back = true;
        metrics_->slo_held_back.fetch_add(1);
      }
    } else {
      order_.push_back(i);
    }
  }
  order_.insert(order_.end(), held_back_order_.begin(), held_back_order_.end());
  bool admitted = false, passed = false, stopped = false;
  bool delta_passed = false;  // the policy passed over a delta's request in the first pass
  for (int pass = 0; pass < 2 && !stopped; ++pass) {
    if (pass == 1 &&
        !(passed && *budget > 0 && static_cast<int64_t>(running_.size()) < opts_.max_running &&
          policy_->Relax()))
      break;
    for (size_t k = 0; k < order_.size(); ++k) {
      if (*budget <= 0 || static_cast<int64_t>(running_.size()) >= opts_.max_running) break;
      auto& slot = waiting_[order_[k]];
      if (!slot) continue;  // admitted in the first pass
      Sequence* s = slot.get();
      const Candidate candidate = candidate_of(s);
      if (s->ticket) continue;
      if (!policy_->MayAdmit(candidate)) {
        passed = true;
        delta_passed = delta_passed || (pass == 0 && candidate.delta);
        continue;
      }
      if (prefix_ != nullptr && s->table.empty() && s->n_computed == 0 && !s->needs_prompt_rows()) {
        // The longest cached prefix (whole blocks; the last token is always computed, for its
        // logits or its embedding). A sequence that then does not fit keeps the blocks while it
        // waits. Prompt logprobs need the logits of every prompt row, and mean or cls pooling
        // the hidden states of every or the first row, so such a prompt is computed whole.
        const int64_t n = static_cast<int64_t>(s->tokens.size());
        s->n_computed = prefix_->Match(s->prefix_variant, s->tokens, n - 1, &s->table, &s->prefix);
        metrics_->prefix_cache_query_tokens.fetch_add(static_cast<uint64_t>(n));
        metrics_->prefix_cache_hit_tokens.fetch_add(static_cast<uint64_t>(s->n_computed));
      }
      const int64_t count = ChunkRows(*s, *budget);
      if (count == 0) continue;  // its prompt-logprob rows wait for the next step
      // Admit only if this chunk fits and one block per running sequence stays free for
      // their next decode step (avoids admitting work that immediately causes preemption).
      // Its unforked choices will need a block each, too.
      const int64_t need = kv_->PagesToWrite(s->table, s->n_computed, s->n_computed + count);
      const int64_t want_free =
          need + static_cast<int64_t>(running_.size() + (running_.empty() ? 0 : s->forks.size()));
      if (want_free > pages_->n_free()) ReclaimPages(want_free);
      if (want_free > pages_->n_free() ||
          !kv_->PrepareWrite(&s->table, s->n_computed, s->n_computed + count).ok()) {
        stopped = true;
        break;
      }
      if (s->serial == 0) {
        s->serial = next_serial_++;
        overload_.Admitted(Seconds(now));
      }
      plan_.push_back(PlanChunk(s, count));
      *budget -= count;
      policy_->Admitted(candidate, count);
      // Past a delta's request the policy held back, a delta's request can only be admitted
      // because its delta is in the step: it skipped the line.
      s->line_skipper = pass == 0 && candidate.delta && delta_passed;
      s->yielded = false;
      PinVariant(s);
      if (s->full) {
        full_models_->Pin(s->full);
        s->full_pinned = true;
      }
      running_.push_back(std::move(slot));
      queued_.fetch_sub(1);
      admitted = true;
    }
  }
  if (admitted || aborted) std::erase_if(waiting_, [](const auto& s) { return !s || s->finished; });
  if (std::none_of(waiting_.begin(), waiting_.end(),
                   [](const auto& s) { return !s->finished && s->n_generated == 0; }))
    overload_.QueueEmptied();
}

// Starts pool copies: first of adapters and deltas this step uses (they may evict unpinned
// copies), then of those named by queued requests, in arrival order (S-LoRA's prefetch; free pages
// only) — those the policy held back behind newer ones (Policy::Sweep) after the others, as they
// will be admitted. A copy is started only if pages stay free for KV: one per running sequence plus
// 1/8 of the pool (1/4 for prefetch), so adapters never crowd out the KV of work already running.
void Scheduler::PrefetchAdapters() {
  const int64_t base_reserve = static_cast<int64_t>(running_.size());
  for (const Planned& p : plan_) {
    if (p.seq->lora)
      residency_->Prefetch(p.seq->lora, base_reserve + pages_->n_pages() / 8, /*may_evict=*/true);
    if (p.seq->delta)
      residency_->Prefetch(p.seq->delta, base_reserve + pages_->n_pages() / 8, /*may_evict=*/true);
  }
  int prefetched = 0;
  for (const bool held_back : {false, true}) {
    for (const auto& s : waiting_) {
      if (prefetched >= 8) return;  // bound the work per step
      if (s->held_back != held_back) continue;
      const int64_t keep_free = base_reserve + pages_->n_pages() / 4;
      if (s->lora && !residency_->Resident(s->lora.get()) && !residency_->Loading(s->lora.get())) {
        residency_->Prefetch(s->lora, keep_free, /*may_evict=*/false);
      } else if (s->delta && !residency_->Resident(s->delta.get()) &&
                 !residency_->Loading(s->delta.get())) {
        residency_->Prefetch(s->delta, keep_free, /*may_evict=*/false);
      } else {
        continue;
      }
      ++prefetched;
    }
  }
}

}  // namespace chorus::engine
