// Scheduler without a model: a page pool, a KV cache over it and adapter residency without a
// host cache. A fake token sink stands in for the forward pass and the output stage: every
// planned row that wants logits gets token 1 + its sequence's generated count, and a sequence
// finishes at its max_tokens. What is checked is the mechanics: chunked prefill under the row
// budget, FCFS admission, preemption when pages run out (and recompute to the same tokens),
// n > 1 choices forked onto the prompt's blocks, cancellation, and every page back at the end.
#include "chorus/engine/scheduler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <optional>

namespace chorus::engine {
namespace {

struct FakeSink : TokenSink {
  std::map<const Sequence*, int> emitted;
  // EmitPromptLogprob calls: the positions scored per sequence (choice 0 only).
  std::map<const Sequence*, std::vector<int64_t>> prompt_positions;
  void EmitPromptLogprob(Sequence* s, int64_t position, const float* /*row_logits*/) override {
    EXPECT_EQ(s->index, 0);
    prompt_positions[s].push_back(position);
  }
  // PoolHidden calls: the first element of each pooled row (RunStep: the row's position), per
  // request; EmitEmbedding calls per request.
  std::map<const RequestHandle*, std::vector<float>> pooled;
  std::map<const RequestHandle*, int> embeddings;
  void PoolHidden(Sequence* s, const float* row, int64_t /*d*/) override {
    pooled[s->handle.get()].push_back(row[0]);
  }
  void EmitEmbedding(Sequence* s) override {
    ++embeddings[s->handle.get()];
    s->finished = true;
    StreamEvent ev;
    ev.finish = FinishReason::kStop;
    s->handle->Push(std::move(ev));
  }
  FinishReason Emit(Sequence* s, const float* /*row_logits*/) override {
    ++emitted[s];
    s->tokens.push_back(static_cast<int32_t>(1 + s->n_generated));
    ++s->n_generated;
    if (s->n_generated == 1) s->first_token = Clock::now();  // as the output stage does
    if (s->n_generated < s->req->max_tokens) return FinishReason::kNone;
    s->finished = true;
    StreamEvent ev;
    ev.index = s->index;
    ev.finish = FinishReason::kLength;
    s->handle->Push(std::move(ev));
    return FinishReason::kLength;
  }
};

class SchedulerTest : public ::testing::Test {
 protected:
  void Build(int64_t n_pages, int64_t max_batch_tokens, int64_t max_running,
             std::unique_ptr<Policy> policy = nullptr, int64_t max_prompt_logprob_rows = 64) {
    if (!policy) policy = std::make_unique<FcfsPolicy>(0);
    layout_ = {.n_layers = 2, .n_kv_heads = 1, .head_dim = 8, .block_size = 4};
    pages_ = std::make_unique<memory::PagePool>(n_pages, layout_.PageBytes());
    kv_ = std::make_unique<memory::KvCache>(layout_, pages_.get());
    residency_ = std::make_unique<AdapterResidency>(
        pages_.get(), &metrics_, nullptr, [] {}, AdapterResidency::Options{});
    sched_ = std::make_unique<Scheduler>(
        SchedulerOptions{.max_batch_tokens = max_batch_tokens,
                         .max_running = max_running,
                         .max_prompt_logprob_rows = max_prompt_logprob_rows},
        pages_.get(), kv_.get(), residency_.get(), std::move(policy), &metrics_);
  }

  // How long ago the next Submit's request arrived.
  Clock::duration age_{};

  // Submits a request of `prompt_len` tokens for `max_tokens` tokens per choice.
  std::shared_ptr<RequestHandle> Submit(int64_t prompt_len, int64_t max_tokens, int n = 1,
                                        double ttft_slo_ms = 0, double tpot_slo_ms = 0,
                                        int32_t prompt_logprobs = -1) {
    auto req = std::make_shared<GenerationRequest>();
    req->prompt_logprobs = prompt_logprobs;
    req->ttft_slo_ms = ttft_slo_ms;
    req->tpot_slo_ms = tpot_slo_ms;
    req->prompt.assign(static_cast<size_t>(prompt_len), 5);
    req->max_tokens = max_tokens;
    req->n = n;
    auto handle = std::make_shared<RequestHandle>(n, prompt_len);
    std::unique_ptr<Sequence> first;
    for (int i = 0; i < n; ++i) {
      auto s = std::make_unique<Sequence>();
      s->handle = handle;
      s->req = req;
      s->index = i;
      s->tokens = req->prompt;
      s->n_prompt = prompt_len;
      s->prompt_logprobs_next = prompt_logprobs >= 0 && i == 0 ? 1 : prompt_len;  // as Submit
      s->arrival = Clock::now() - age_;
      if (i == 0) {
        first = std::move(s);
      } else {
        first->forks.push_back(std::move(s));
      }
    }
    sched_->queued().fetch_add(n);
    sched_->Enqueue(std::move(first));
    return handle;
  }

  // Submits an embedding of a `prompt_len`-token prompt (as Engine::Submit builds it).
  std::shared_ptr<RequestHandle> SubmitEmbedding(int64_t prompt_len, Pooling pooling) {
    auto req = std::make_shared<GenerationRequest>();
    req->prompt.assign(static_cast<size_t>(prompt_len), 5);
    req->max_tokens = 0;
    req->embedding = EmbeddingOptions{.pooling = pooling};
    auto handle = std::make_shared<RequestHandle>(1, prompt_len);
    auto s = std::make_unique<Sequence>();
    s->handle = handle;
    s->req = req;
    s->tokens = req->prompt;
    s->n_prompt = prompt_len;
    s->prompt_logprobs_next = prompt_len;
    s->arrival = Clock::now() - age_;
    sched_->queued().fetch_add(1);
    sched_->Enqueue(std::move(s));
    return handle;
  }

  // Plans and completes one step; returns its rows (0 when nothing ran).
  int64_t RunStep() {
    const auto outcome = sched_->Plan();
    if (outcome != Scheduler::Outcome::kRun) return 0;
    int64_t rows = 0, logit_rows = 0;
    for (const auto& p : sched_->plan()) {
      rows += p.count;
      logit_rows += p.logit_rows();
    }
    logits_.assign(static_cast<size_t>(logit_rows * 4), 0.0f);
    hidden_.clear();  // one float per hidden row: its position
    for (const auto& p : sched_->plan()) {
      EXPECT_TRUE(p.start <= p.hidden_begin && p.hidden_begin <= p.hidden_end &&
                  p.hidden_end <= p.start + p.count)
          << p.start << "+" << p.count << ": " << p.hidden_begin << "…" << p.hidden_end;
      for (int64_t pos = p.hidden_begin; pos < p.hidden_end; ++pos)
        hidden_.push_back(static_cast<float>(pos));
    }
    sched_->Complete(logits_.data(), 4, &sink_, hidden_.data(), 1);
    return rows;
  }

  int64_t RunToIdle(int max_steps = 1000) {
    int steps = 0;
    while (sched_->has_work() && steps < max_steps) {
      RunStep();
      ++steps;
    }
    return steps;
  }

  std::vector<float> hidden_;
  memory::KvLayout layout_;
  EngineMetrics metrics_;
  std::unique_ptr<memory::PagePool> pages_;
  std::unique_ptr<memory::KvCache> kv_;
  std::unique_ptr<AdapterResidency> residency_;
  std::unique_ptr<Scheduler> sched_;
  FakeSink sink_;
  std::vector<float> logits_;
};

TEST_F(SchedulerTest, ChunkedPrefillUnderTheRowBudgetThenDecode) {
  Build(/*n_pages=*/64, /*max_batch_tokens=*/8, /*max_running=*/4);
  Submit(6, 3);
  Submit(6, 3);
  ASSERT_EQ(sched_->Plan(), Scheduler::Outcome::kRun);
  // The first prompt whole, then a 2-token chunk of the second (which wants no logits yet).
  ASSERT_EQ(sched_->plan().size(), 2u);
  EXPECT_EQ(sched_->plan()[0].count, 6);
  EXPECT_TRUE(sched_->plan()[0].wants_logits);
  EXPECT_EQ(sched_->plan()[1].count, 2);
  EXPECT_EQ(sched_->plan()[1].start, 0);
  EXPECT_FALSE(sched_->plan()[1].wants_logits);
  sched_->Complete(std::vector<float>(4).data(), 4, &sink_);
  EXPECT_EQ(sched_->queued().load(), 0);
  // Next step: one decode row of the first, the last 4 prompt tokens of the second.
  EXPECT_EQ(RunStep(), 5);
  RunToIdle();
  EXPECT_FALSE(sched_->has_work());
  EXPECT_EQ(pages_->n_used(memory::PageKind::kKv), 0);
  for (const auto& [seq, n] : sink_.emitted) EXPECT_EQ(n, 3);
}

// Prompt logprobs: every prompt row but the last wants logits, at most
// max_prompt_logprob_rows of them per step, so such a prompt is prefilled in chunks of that
// many rows while other sequences use the rest of the row budget; each prompt position is
// scored exactly once, in order, by choice 0 only.
TEST_F(SchedulerTest, PromptLogprobRowsAreCappedPerStepAndEachPositionIsScoredOnce) {
  Build(/*n_pages=*/64, /*max_batch_tokens=*/16, /*max_running=*/8, nullptr,
        /*max_prompt_logprob_rows=*/5);
  auto scored = Submit(12, 2, /*n=*/2, 0, 0, /*prompt_logprobs=*/1);
  auto plain = Submit(6, 2);
  ASSERT_EQ(sched_->Plan(), Scheduler::Outcome::kRun);
  ASSERT_EQ(sched_->plan().size(), 2u);
  const Scheduler::Planned first = sched_->plan()[0];
  EXPECT_EQ(first.count, 5);  // capped by the 5 logit rows, not by the 16-row budget
  EXPECT_EQ(first.prompt_logits_begin, 0);
  EXPECT_EQ(first.prompt_logits_end, 5);
  EXPECT_FALSE(first.wants_logits);
  EXPECT_EQ(sched_->plan()[1].count, 6);  // the other request takes the rest of the budget
  EXPECT_EQ(sched_->plan()[1].prompt_logit_rows(), 0);
  sched_->Complete(std::vector<float>(4 * 6).data(), 4, &sink_);
  // Then rows 5–9, then rows 10 and 11: 11 (scoring positions 11) plus the sampled row.
  ASSERT_EQ(sched_->Plan(), Scheduler::Outcome::kRun);
  EXPECT_EQ(sched_->plan()[0].count, 5);
  sched_->Complete(std::vector<float>(4 * 6).data(), 4, &sink_);
  ASSERT_EQ(sched_->Plan(), Scheduler::Outcome::kRun);
  EXPECT_EQ(sched_->plan()[0].count, 2);
  EXPECT_EQ(sched_->plan()[0].prompt_logit_rows(), 1);
  EXPECT_TRUE(sched_->plan()[0].wants_logits);
  EXPECT_EQ(sched_->plan()[0].logit_rows(), 2);
  sched_->Complete(std::vector<float>(4 * 3).data(), 4, &sink_);
  RunToIdle();
  EXPECT_FALSE(sched_->has_work());
  std::vector<int64_t> want(11);
  std::iota(want.begin(), want.end(), 1);
  ASSERT_EQ(sink_.prompt_positions.size(), 1u);  // choice 0 of the scored request only
  EXPECT_EQ(sink_.prompt_positions.begin()->second, want);
  EXPECT_EQ(pages_->n_used(memory::PageKind::kKv), 0);
}

TEST_F(SchedulerTest, PromptLogprobsAreNotReportedAgainWhenAPreemptedPromptIsRecomputed) {
  // 6 pages of 4 tokens: both sequences grow to 16 tokens (4 pages each), so the scored one
  // (the newest) is preempted and recomputed from its start.
  Build(/*n_pages=*/6, 64, 4, nullptr, /*max_prompt_logprob_rows=*/2);
  Submit(4, 12);
  Submit(8, 8, 1, 0, 0, /*prompt_logprobs=*/0);
  RunToIdle();
  EXPECT_FALSE(sched_->has_work());
  EXPECT_GE(metrics_.preemptions_total.load(), 1u);
  ASSERT_EQ(sink_.prompt_positions.size(), 1u);
  EXPECT_EQ(sink_.prompt_positions.begin()->second, (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7}));
  std::vector<int> emitted;  // tokens per sequence (the sequences themselves are gone)
  for (const auto& [seq, n] : sink_.emitted) emitted.push_back(n);
  std::sort(emitted.begin(), emitted.end());
  EXPECT_EQ(emitted, (std::vector<int>{8, 12}));
  EXPECT_EQ(pages_->n_used(memory::PageKind::kKv), 0);
}

TEST_F(SchedulerTest, EmbeddingsPoolTheirRowsInOrderAcrossChunksAndNeverSample) {
  Build(/*n_pages=*/64, /*max_batch_tokens=*/5, /*max_running=*/8);
  auto mean = SubmitEmbedding(12, Pooling::kMean);
  auto last = SubmitEmbedding(9, Pooling::kLast);
  auto cls = SubmitEmbedding(7, Pooling::kFirst);
  auto gen = Submit(3, 4);
  RunToIdle();
  EXPECT_FALSE(sched_->has_work());
  std::vector<float> all(12);
  std::iota(all.begin(), all.end(), 0.0f);
  EXPECT_EQ(sink_.pooled[mean.get()], all);
  EXPECT_EQ(sink_.pooled[last.get()], std::vector<float>{8});
  EXPECT_EQ(sink_.pooled[cls.get()], std::vector<float>{0});
  for (const auto* h : {mean.get(), last.get(), cls.get()}) EXPECT_EQ(sink_.embeddings[h], 1);
  ASSERT_EQ(sink_.emitted.size(), 1u);  // only the generation sampled
  EXPECT_EQ(sink_.emitted.begin()->second, 4);
  EXPECT_EQ(pages_->n_used(memory::PageKind::kKv), 0);
}

TEST_F(SchedulerTest, AnEmbeddingsRowsArePooledOnceWhenAPreemptedPromptIsRecomputed) {
  // 6 pages of 4 tokens, 2 rows a step: the generation grows to 24 tokens (6 pages) while the
  // embedding's 12-token prompt (3 pages) is computed a row a step, so the embedding (the
  // newest) is preempted part-way and recomputed from its start once the generation is done.
  Build(/*n_pages=*/6, /*max_batch_tokens=*/2, 2);
  Submit(4, 20);
  auto mean = SubmitEmbedding(12, Pooling::kMean);
  RunToIdle();
  EXPECT_FALSE(sched_->has_work());
  EXPECT_GE(metrics_.preemptions_total.load(), 1u);
  std::vector<float> all(12);
  std::iota(all.begin(), all.end(), 0.0f);
  EXPECT_EQ(sink_.pooled[mean.get()], all);
  EXPECT_EQ(sink_.embeddings[mean.get()], 1);
  EXPECT_EQ(pages_->n_used(memory::PageKind::kKv), 0);
}

TEST_F(SchedulerTest, AdmitsInArrivalOrderUpToMaxRunning) {
  Build(64, 64, /*max_running=*/2);
  std::vector<std::shared_ptr<RequestHandle>> h;
  for (int i = 0; i < 4; ++i) h.push_back(Submit(3, 4));
  ASSERT_EQ(sched_->Plan(), Scheduler::Outcome::kRun);
  ASSERT_EQ(sched_->plan().size(), 2u);
  EXPECT_EQ(sched_->plan()[0].seq->handle, h[0]);
  EXPECT_EQ(sched_->plan()[1].seq->handle, h[1]);
  EXPECT_EQ(sched_->queued().load(), 2);
  sched_->Complete(std::vector<float>(8).data(), 4, &sink_);
  RunToIdle();
  EXPECT_EQ(sink_.emitted.size(), 4u);
  EXPECT_EQ(pages_->n_used(memory::PageKind::kKv), 0);
}

TEST_F(SchedulerTest, HeldAdmissionDefersWaitingRequestsUntilTheBatchDrains) {
  // Deferred continuous batching: while the engine holds admission, requests arriving during a
  // running batch wait (they form the next batch) instead of joining it one by one.
  Build(/*n_pages=*/64, /*max_batch_tokens=*/32, /*max_running=*/8);
  Submit(4, 3);
  EXPECT_EQ(RunStep(), 4);  // admitted: nothing was running
  sched_->set_hold_admission(true);
  Submit(4, 3);
  Submit(4, 3);
  EXPECT_EQ(RunStep(), 1);  // the running one's decode row only
  EXPECT_EQ(sched_->waiting().size(), 2u);
  EXPECT_EQ(RunStep(), 1);  // its last token: the batch drains
  EXPECT_TRUE(sched_->running().empty());
  // With nothing running the hold has no effect: both deferred requests are admitted together.
  EXPECT_EQ(RunStep(), 8);
  EXPECT_EQ(sched_->running().size(), 2u);
  EXPECT_TRUE(sched_->waiting().empty());
  // Released, a newcomer joins the running batch at once (plain continuous batching).
  sched_->set_hold_admission(false);
  Submit(4, 3);
  EXPECT_EQ(RunStep(), 2 + 4);
  RunToIdle();
  EXPECT_EQ(pages_->n_used(memory::PageKind::kKv), 0);
}

TEST_F(SchedulerTest, PreemptsTheNewestWhenPagesRunOutAndRecomputesToTheSameLength) {
  // 6 pages of 4 tokens; two sequences that each grow to 4 + 12 = 16 tokens (4 pages) cannot
  // both stay: the newer one is preempted, recomputed later, and still generates all its tokens.
  Build(/*n_pages=*/6, 64, 4);
  Submit(4, 12);
  Submit(4, 12);
  RunToIdle();
  EXPECT_FALSE(sched_->has_work());
  EXPECT_GE(metrics_.preemptions_total.load(), 1u);
  ASSERT_EQ(sink_.emitted.size(), 2u);
  for (const auto& [seq, n] : sink_.emitted) EXPECT_EQ(n, 12);
  EXPECT_EQ(pages_->n_used(memory::PageKind::kKv), 0);
}

TEST_F(SchedulerTest, ChoicesForkThePromptBlocksInsteadOfRecomputingThem) {
  Build(64, 64, 8);
  Submit(/*prompt_len=*/10, /*max_tokens=*/2, /*n=*/3);
  EXPECT_EQ(RunStep(), 10);  // the prompt once; the three choices sample from its logits row
  EXPECT_EQ(sched_->running().size(), 3u);
  // 3 prompt blocks (10 tokens of 4) shared by the three choices: no copies yet.
  EXPECT_EQ(pages_->n_used(memory::PageKind::kKv), 3);
  EXPECT_EQ(RunStep(), 3);  // one decode row each; the partly filled last block is copied
  EXPECT_FALSE(sched_->has_work());
  EXPECT_EQ(sink_.emitted.size(), 3u);
  EXPECT_EQ(pages_->n_used(memory::PageKind::kKv), 0);
}

TEST_F(SchedulerTest, CancelledRequestsFreeTheirBlocksWithinOneStep) {
  Build(64, 64, 4);
  auto running = Submit(8, 100);
  auto waiting = Submit(8, 100);
  EXPECT_EQ(RunStep(), 16);
  EXPECT_GT(pages_->n_used(memory::PageKind::kKv), 0);
  running->Cancel();
  waiting->Cancel();
  EXPECT_EQ(RunStep(), 0);
  EXPECT_FALSE(sched_->has_work());
  EXPECT_EQ(pages_->n_used(memory::PageKind::kKv), 0);
  auto ev = running->Next(std::chrono::milliseconds(0));
  while (ev && ev->finish == FinishReason::kNone) ev = running->Next(std::chrono::milliseconds(0));
  ASSERT_TRUE(ev.has_value());
  EXPECT_EQ(ev->finish, FinishReason::kCancelled);
}

TEST_F(SchedulerTest, ARequestThatCanNeverFitFailsInsteadOfSpinning) {
  Build(/*n_pages=*/2, 64, 4);  // 8 tokens of KV in the whole pool
  auto h = Submit(12, 1);
  EXPECT_EQ(sched_->Plan(), Scheduler::Outcome::kReplan);
  EXPECT_FALSE(sched_->has_work());
  auto ev = h->Next(std::chrono::milliseconds(0));
  ASSERT_TRUE(ev.has_value());
  EXPECT_EQ(ev->finish, FinishReason::kError);
  EXPECT_EQ(sched_->queued().load(), 0);
}

// ---- Policy slo (engine/policy.h) with a known cost model: 10 ms per prefill token and per
// decode row, nothing else.
std::unique_ptr<Policy> Slo(bool best_effort = false) {
  auto m = CostModel::FromCoefficients(CostModel::Kind::kLinear, {0, 0.01, 0.01, 0, 0, 0, 0});
  return std::make_unique<SloPolicy>(std::make_shared<CostModel>(*m), /*max_batch_tokens=*/64,
                                     best_effort);
}

std::optional<StreamEvent> LastEvent(RequestHandle* h) {
  std::optional<StreamEvent> last;
  while (auto ev = h->Next(std::chrono::milliseconds(0))) last = std::move(ev);
  return last;
}

TEST_F(SchedulerTest, SloAbortsARequestThatWouldMissItsTtftAtOnce) {
  Build(64, 64, 4, Slo());
  auto late = Submit(/*prompt_len=*/20, 3, 1, /*ttft_slo_ms=*/100);  // 200 ms of prefill
  auto fine = Submit(6, 3, 1, /*ttft_slo_ms=*/100);                  // 60 ms
  auto none = Submit(20, 3);                                         // no SLO: never aborted
  RunToIdle();
  auto ev = LastEvent(late.get());
  ASSERT_TRUE(ev.has_value());
  EXPECT_EQ(ev->finish, FinishReason::kError);
  EXPECT_EQ(ev->error_code, StatusCode::kResourceExhausted);
  EXPECT_NE(ev->error.find("would miss its TTFT SLO of 100 ms"), std::string::npos) << ev->error;
  EXPECT_EQ(late->completion_tokens(), 0);
  EXPECT_EQ(LastEvent(fine.get())->finish, FinishReason::kLength);
  EXPECT_EQ(LastEvent(none.get())->finish, FinishReason::kLength);
  EXPECT_EQ(metrics_.slo_aborted.load(), 1u);
  EXPECT_EQ(metrics_.slo[static_cast<size_t>(SloCount::kTtftMissed)].load(), 1u);
  EXPECT_EQ(sched_->queued().load(), 0);
  EXPECT_EQ(pages_->n_used(memory::PageKind::kKv), 0);
}

TEST_F(SchedulerTest, SloBestEffortServesItLate) {
  Build(64, 64, 4, Slo(/*best_effort=*/true));
  auto late = Submit(20, 3, 1, 100);
  RunToIdle();
  EXPECT_EQ(LastEvent(late.get())->finish, FinishReason::kLength);
  EXPECT_EQ(metrics_.slo_aborted.load(), 0u);
}

TEST_F(SchedulerTest, SloHoldsTheOldestBackUnderALastingOverload) {
  // One sequence at a time; each prompt alone (60 ms) meets the 100 ms SLO, but the second
  // would wait for the first (120 ms). The queue has not emptied for 2.5 s (a request that
  // old is waiting — and is aborted: it can no longer meet its SLO) and two arrived since with
  // none admitted: a lasting overload, so the older of the two is held back and the newer goes
  // first.
  Build(64, 64, 1, Slo());
  age_ = std::chrono::milliseconds(2500);
  auto old = Submit(6, 2, 1, 100);
  age_ = {};
  auto a = Submit(6, 2, 1, 100);
  auto b = Submit(6, 2, 1, 100);
  ASSERT_EQ(sched_->Plan(), Scheduler::Outcome::kRun);
  ASSERT_EQ(sched_->plan().size(), 1u);
  EXPECT_EQ(sched_->plan()[0].seq->handle, b);
  EXPECT_EQ(LastEvent(old.get())->error_code, StatusCode::kResourceExhausted);
  EXPECT_EQ(metrics_.slo_held_back.load(), 1u);  // a, once
  sched_->Complete(std::vector<float>(4).data(), 4, &sink_);
  RunToIdle();
  // The same two as a burst into an empty queue: served in arrival order, as fcfs would (the
  // second may miss its SLO; holding the first back would only trade one miss for the other
  // and make the first wait longer).
  Build(64, 64, 1, Slo());
  auto e = Submit(6, 2, 1, 100);
  auto f = Submit(6, 2, 1, 100);
  ASSERT_EQ(sched_->Plan(), Scheduler::Outcome::kRun);
  EXPECT_EQ(sched_->plan()[0].seq->handle, e);
  sched_->Complete(std::vector<float>(4).data(), 4, &sink_);
  RunToIdle();
  // Without SLOs the same queue is served in order.
  Build(64, 64, 1, Slo());
  auto c = Submit(6, 2);
  auto d = Submit(6, 2);
  ASSERT_EQ(sched_->Plan(), Scheduler::Outcome::kRun);
  EXPECT_EQ(sched_->plan()[0].seq->handle, c);
  sched_->Complete(std::vector<float>(4).data(), 4, &sink_);
  RunToIdle();
}

TEST_F(SchedulerTest, SloKeepsRunningRequestsWithinTheirTpot) {
  // The cost model: 10 ms per row. The guard holds each running sequence's time per output token
  // since its first token within its SLO: a step may take max(SLO, SLO × tokens − elapsed).
  Build(64, 64, 4, Slo());
  auto runner = Submit(2, 6, 1, 0, /*tpot_slo_ms=*/50);
  ASSERT_EQ(RunStep(), 2);  // its prompt; now it decodes one row per step (10 ms)
  // One token so far: a step may take 50 ms. Its decode row + 6 prompt rows = 70 ms: waits; a
  // 3-row prompt (40 ms) is admitted past it.
  auto waiter = Submit(6, 2);
  auto small = Submit(3, 4, 1, 0, /*tpot_slo_ms=*/50);
  EXPECT_EQ(RunStep(), 4);
  EXPECT_EQ(sched_->waiting().size(), 1u);
  // The runner has banked a token's SLO (2 × 50 ms − the ~0 ms these steps took) but `small`
  // just started: still 50 ms, and 2 decode rows + 6 = 80 ms waits.
  EXPECT_EQ(RunStep(), 2);
  EXPECT_EQ(sched_->waiting().size(), 1u);
  // Now each has banked one: 100 ms allowed, and the 80 ms step with the prompt runs — the
  // stall is paid from time the sequences saved, not refused while anything runs.
  EXPECT_EQ(RunStep(), 8);
  EXPECT_TRUE(sched_->waiting().empty());
  RunToIdle();
  EXPECT_EQ(LastEvent(waiter.get())->finish, FinishReason::kLength);
  EXPECT_EQ(LastEvent(small.get())->finish, FinishReason::kLength);
  EXPECT_EQ(LastEvent(runner.get())->finish, FinishReason::kLength);
}

}  // namespace
}  // namespace chorus::engine
