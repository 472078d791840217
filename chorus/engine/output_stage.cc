#include "chorus/engine/output_stage.h"

#include <algorithm>
#include <cmath>
#include <span>

namespace chorus::engine {
namespace {

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

OutputStage::OutputStage(const model::ModelConfig& config, const tokenizer::Tokenizer* tok,
                         EngineMetrics* metrics)
    : config_(config),
      tok_(tok),
      metrics_(metrics),
      seed_source_(static_cast<uint64_t>(Clock::now().time_since_epoch().count())) {
  scratch_.Reserve(config_.vocab_size);
}

void OutputStage::Attach(Sequence* s) {
  SamplingParams sp = s->req->sampling;
  if (sp.seed.has_value()) sp.seed = *sp.seed + static_cast<uint64_t>(s->index);
  s->sampler = std::make_unique<Sampler>(sp, config_.vocab_size,
                                         seed_source_.fetch_add(0x9E3779B97F4A7C15ull));
  s->detok = std::make_unique<tokenizer::StreamingDetokenizer>(
      tok_, /*include_special=*/!s->req->skip_special_tokens);
  s->detok->SetPrevious(s->tokens.back());
  s->stop = std::make_unique<StopChecker>(s->req->stop);
  if (s->req->grammar.valid()) {
    s->matcher = std::make_unique<grammar::Matcher>(s->req->grammar, vocabulary());
    s->mask_ready = false;
  }
}

std::shared_ptr<const grammar::Vocabulary> OutputStage::vocabulary() {
  std::call_once(vocab_once_,
                 [&] { vocab_ = grammar::Vocabulary::FromTokenizer(*tok_, config_.vocab_size); });
  return vocab_;
}

bool OutputStage::PrepareMask(Sequence* s) {
  if (s->matcher == nullptr || s->mask_ready) return false;
  const int64_t truncated = s->matcher->truncated();
  s->matcher->FillMask(&s->mask);
  s->mask_ready = true;
  return s->matcher->truncated() != truncated;
}

void CountSlo(const Sequence& s, EngineMetrics* m) {
  const GenerationRequest& req = *s.req;
  auto count = [&](SloCount which) {
    m->slo[static_cast<size_t>(which)].fetch_add(1);
    m->adapters.CountSlo(req.variant_name(), which);
  };
  if (req.ttft_slo_ms > 0 && s.n_generated >= 1) {
    const double ttft_ms = 1e3 * Seconds(s.first_token - s.arrival);
    count(ttft_ms <= req.ttft_slo_ms ? SloCount::kTtftMet : SloCount::kTtftMissed);
  }
  if (req.tpot_slo_ms > 0 && s.n_generated >= 2) {
    const double tpot_ms =
        1e3 * Seconds(s.last_token - s.first_token) / static_cast<double>(s.n_generated - 1);
    count(tpot_ms <= req.tpot_slo_ms ? SloCount::kTpotMet : SloCount::kTpotMissed);
  }
}

void OutputStage::EmitPromptLogprob(Sequence* s, int64_t position, const float* row_logits) {
  CHORUS_CHECK(position > 0 && position < s->n_prompt);
  ScoreToken(std::span<const float>(row_logits, static_cast<size_t>(config_.vocab_size)),
             s->tokens[static_cast<size_t>(position)], s->req->prompt_logprobs, &scratch_,
             &result_);
  StreamEvent ev;
  ev.index = s->index;
  ev.token = result_.token;
  ev.prompt = true;
  ev.position = position;
  ev.rank = result_.rank;
  ev.logprob = result_.logprob;
  ev.top_logprobs = result_.top;
  s->handle->Push(std::move(ev));
}

void OutputStage::PoolHidden(Sequence* s, const float* row, int64_t d) {
  CHORUS_CHECK(s->is_embedding());
  s->embed_sum.resize(static_cast<size_t>(d), 0.0);
  const bool mean = s->req->embedding->pooling == Pooling::kMean;
  for (int64_t i = 0; i < d; ++i) {
    const double v = row[i];
    s->embed_sum[static_cast<size_t>(i)] = mean ? s->embed_sum[static_cast<size_t>(i)] + v : v;
  }
}

void OutputStage::EmitEmbedding(Sequence* s) {
  const EmbeddingOptions& opts = *s->req->embedding;
  CHORUS_CHECK(!s->embed_sum.empty());
  // The mean's sum and the norm in double, in index order: the vector depends only on the
  // pooled rows, which are bitwise the same in any batch (docs/architecture.md, "Attention").
  const double scale =
      opts.pooling == Pooling::kMean ? 1.0 / static_cast<double>(s->n_prompt) : 1.0;
  double norm2 = 0;
  for (double v : s->embed_sum) norm2 += (v * scale) * (v * scale);
  const double out_scale = opts.normalize && norm2 > 0 ? scale / std::sqrt(norm2) : scale;
  StreamEvent ev;
  ev.index = s->index;
  ev.embedding.reserve(s->embed_sum.size());
  for (double v : s->embed_sum) ev.embedding.push_back(static_cast<float>(v * out_scale));
  ev.finish = FinishReason::kStop;
  s->finished = true;
  s->handle->Push(std::move(ev));
}

FinishReason OutputStage::Emit(Sequence* s, const float* row_logits) {
  SampleResult& r = result_;
  const GenerationRequest& req = *s->req;
  const std::span<const int32_t> all(s->tokens);
  const grammar::TokenMask* allowed = nullptr;
  if (s->matcher != nullptr) {
    if (PrepareMask(s)) metrics_->grammar_masks_truncated.fetch_add(1);
    if (s->mask.Count() == 0) {
      // The grammar needs bytes no token of this vocabulary supplies.
      s->finished = true;
      PushFinal(s, FinishReason::kError,
                "the response format's grammar cannot be continued with this model's vocabulary",
                StatusCode::kInvalidArgument);
      return FinishReason::kError;
    }
    allowed = &s->mask;
  }
  // min_tokens: the end tokens wait until the choice has that many.
  suppressed_.clear();
  if (s->n_generated < req.min_tokens) {
    if (!req.ignore_eos || s->matcher != nullptr)
      suppressed_.assign(tok_->eos_ids().begin(), tok_->eos_ids().end());
    suppressed_.insert(suppressed_.end(), req.stop_token_ids.begin(), req.stop_token_ids.end());
  }
  const int32_t tok = s->sampler->Sample(
      std::span<const float>(row_logits, static_cast<size_t>(config_.vocab_size)),
      all.subspan(0, static_cast<size_t>(s->n_prompt)),
      all.subspan(static_cast<size_t>(s->n_prompt)), &scratch_,
      req.sampling.logprobs.has_value() ? &r : nullptr, allowed, suppressed_);
  bool grammar_done = false;
  if (s->matcher != nullptr) {
    const bool accepted = s->matcher->Accept(tok);
    CHORUS_CHECK(accepted) << "sampled token " << tok << " outside the grammar's mask";
    s->mask_ready = false;
    grammar_done = s->matcher->Done();
  }
  s->tokens.push_back(tok);
  ++s->n_generated;
  const auto now = Clock::now();
  if (s->n_generated == 1) {
    const double ttft = Seconds(now - s->arrival);
    s->first_token = now;
    s->handle->SetTtft(ttft);
    metrics_->ttft_seconds.Observe(ttft);
    metrics_->adapters.ObserveTtft(req.variant_name(), ttft);
  } else {
    metrics_->time_per_output_token_seconds.Observe(Seconds(now - s->last_token));
  }
  s->last_token = now;
  metrics_->generation_tokens_total.fetch_add(1);

  const bool is_eos = (!req.ignore_eos || s->matcher != nullptr) && tok_->IsEos(tok);
  const bool is_stop_id = std::find(req.stop_token_ids.begin(), req.stop_token_ids.end(), tok) !=
                          req.stop_token_ids.end();
  StreamEvent ev;
  ev.index = s->index;
  ev.token = tok;
  if (req.sampling.logprobs.has_value()) {
    ev.logprob = r.logprob;
    ev.top_logprobs = r.top;
  }
  FinishReason finish = FinishReason::kNone;
  if (is_eos || is_stop_id) {
    finish = FinishReason::kStop;  // the end token itself contributes no text
  } else {
    auto o = s->stop->Push(s->detok->Push(tok));
    ev.text = std::move(o.text);
    if (o.stopped || grammar_done) finish = FinishReason::kStop;  // grammar complete: stop
  }
  if (finish == FinishReason::kNone &&
      (s->n_generated >= req.max_tokens ||
       static_cast<int64_t>(s->tokens.size()) >= config_.max_seq_len)) {
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
    CountSlo(*s, metrics_);
  }
  s->handle->Push(std::move(ev));
  return finish;
}

void OutputStage::PushFinal(Sequence* s, FinishReason why, const std::string& error,
                            StatusCode code) {
  StreamEvent ev;
  ev.index = s->index;
  ev.finish = why;
  ev.error = error;
  ev.error_code = code;
  s->handle->Push(std::move(ev));
}

}  // namespace chorus::engine
