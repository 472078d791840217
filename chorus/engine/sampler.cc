#include "chorus/engine/sampler.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>
#include <string>

#include "chorus/kernels/ops.h"

namespace chorus::engine {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

inline float Sanitize(float v) {
  if (std::isnan(v)) return kNegInf;
  if (v == std::numeric_limits<float>::infinity()) return FLT_MAX;
  return v;
}

std::string Num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

Status OutOfRange(const char* field, double value, const char* range) {
  return InvalidArgumentError(std::string(field) + " must be " + range + ", got " + Num(value));
}

// Most likely first; the lower id first among equals (a strict total order, so partial sorts
// and selections give the same result on every run).
struct MoreLikely {
  const float* v;
  bool operator()(int32_t a, int32_t b) const { return v[a] > v[b] || (v[a] == v[b] && a < b); }
};

// Sets every logit outside `allowed` to −inf (64 tokens per mask word).
void ApplyMask(float* l, int64_t v, const grammar::TokenMask& allowed) {
  const uint64_t* words = allowed.words().data();
  for (int64_t base = 0; base < v; base += 64) {
    const uint64_t w = words[base >> 6];
    if (w == ~uint64_t{0}) continue;
    const int64_t end = std::min<int64_t>(base + 64, v);
    for (int64_t i = base; i < end; ++i) {
      if (!((w >> (i - base)) & 1)) l[i] = kNegInf;
    }
  }
}

}  // namespace

Status SamplingParams::Validate() const {
  // The negated comparisons also reject NaN.
  if (!(temperature >= 0.0f && temperature <= kMaxTemperature)) {
    return OutOfRange("temperature", temperature, "in [0, 100] (0 = greedy)");
  }
  if (top_k < -1) return OutOfRange("top_k", top_k, "-1 or 0 (off) or a positive count");
  if (!(top_p > 0.0f && top_p <= 1.0f)) return OutOfRange("top_p", top_p, "in (0, 1]");
  if (!(min_p >= 0.0f && min_p <= 1.0f)) return OutOfRange("min_p", min_p, "in [0, 1]");
  if (!(repetition_penalty > 0.0f && repetition_penalty <= kMaxRepetitionPenalty)) {
    return OutOfRange("repetition_penalty", repetition_penalty, "in (0, 10] (1 = off)");
  }
  if (!(presence_penalty >= -2.0f && presence_penalty <= 2.0f)) {
    return OutOfRange("presence_penalty", presence_penalty, "in [-2, 2]");
  }
  if (!(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f)) {
    return OutOfRange("frequency_penalty", frequency_penalty, "in [-2, 2]");
  }
  if (logprobs.has_value() && (*logprobs < 0 || *logprobs > kMaxLogprobs)) {
    return OutOfRange("logprobs", *logprobs, "in [0, 20]");
  }
  if (logit_bias.size() > kMaxLogitBiasTokens) {
    return InvalidArgumentError("logit_bias has " + std::to_string(logit_bias.size()) +
                                " entries; at most " + std::to_string(kMaxLogitBiasTokens));
  }
  for (const TokenBias& b : logit_bias) {
    if (b.token < 0) return OutOfRange("logit_bias token", b.token, "a token id ≥ 0");
    if (!(b.bias >= -kMaxLogitBias && b.bias <= kMaxLogitBias))
      return OutOfRange("logit_bias value", b.bias, "in [-100, 100]");
  }
  return OkStatus();
}

void SamplerScratch::Reserve(int64_t vocab) {
  const size_t n = static_cast<size_t>(vocab);
  if (logits_.size() >= n) return;
  logits_.resize(n);
  probs_.resize(n);
  order_.resize(n);
}

Sampler::Sampler(const SamplingParams& params, int64_t vocab_size, uint64_t default_seed)
    : params_(params), vocab_size_(vocab_size), rng_(params.seed.value_or(default_seed)) {
  CHORUS_CHECK(params.Validate().ok()) << params.Validate().ToString();
  CHORUS_CHECK(vocab_size >= 1 && vocab_size <= std::numeric_limits<int32_t>::max());
}

Sampler::Seen& Sampler::Find(int32_t token) {
  auto it = std::lower_bound(history_.begin(), history_.end(), token,
                             [](const Seen& s, int32_t t) { return s.token < t; });
  if (it == history_.end() || it->token != token) it = history_.insert(it, Seen{token, 0, false});
  return *it;
}

void Sampler::UpdateHistory(std::span<const int32_t> prompt, std::span<const int32_t> generated) {
  const bool rewritten =
      counted_ &&
      (prompt.size() != prompt_counted_ || generated.size() < generated_counted_ ||
       (generated_counted_ > 0 && generated[generated_counted_ - 1] != last_generated_));
  if (!counted_ || rewritten) {
    history_.clear();
    prompt_counted_ = generated_counted_ = 0;
    // The prompt only matters to the repetition penalty.
    if (params_.repetition_penalty != 1.0f) {
      for (int32_t t : prompt) {
        if (t >= 0 && t < vocab_size_) Find(t).in_prompt = true;
      }
    }
    prompt_counted_ = prompt.size();
    counted_ = true;
  }
  for (size_t i = generated_counted_; i < generated.size(); ++i) {
    const int32_t t = generated[i];
    if (t >= 0 && t < vocab_size_) ++Find(t).generated_count;
  }
  generated_counted_ = generated.size();
  last_generated_ = generated.empty() ? -1 : generated.back();
}

void Sampler::ApplyPenalties(float* logits) const {
  const float rp = params_.repetition_penalty;
  for (const Seen& s : history_) {
    float& l = logits[s.token];
    if (rp != 1.0f) l = l > 0.0f ? l / rp : l * rp;
    if (s.generated_count > 0) {
      l -= params_.frequency_penalty * static_cast<float>(s.generated_count) +
           params_.presence_penalty;
    }
  }
}

int32_t Sampler::Draw(SamplerScratch* scratch) {
  const int64_t v = vocab_size_;
  const float* l = scratch->logits_.data();
  float* p = scratch->probs_.data();
  int32_t* order = scratch->order_.data();
  std::copy(l, l + v, p);
  kernels::Softmax(p, v);

  if (params_.min_p > 0.0f) {
    const float threshold = params_.min_p * *std::max_element(p, p + v);
    for (int64_t i = 0; i < v; ++i) {
      if (p[i] < threshold) p[i] = 0.0f;
    }
  }
  const bool use_top_k = params_.top_k > 0 && params_.top_k < v;
  const bool use_top_p = params_.top_p < 1.0f;
  const double u = rng_.NextDouble();

  if (!use_top_k && !use_top_p) {
    // Inverse CDF over the ids in ascending order: no sort needed.
    double total = 0;
    for (int64_t i = 0; i < v; ++i) total += p[i];
    const double target = u * total;
    double cum = 0;
    int32_t last = 0;
    for (int64_t i = 0; i < v; ++i) {
      if (p[i] <= 0.0f) continue;
      cum += p[i];
      last = static_cast<int32_t>(i);
      if (cum > target) return last;
    }
    return last;  // rounding left target at the very end
  }

  // Candidates: the tokens still possible.
  int64_t n = 0;
  for (int64_t i = 0; i < v; ++i) {
    if (p[i] > 0.0f) order[n++] = static_cast<int32_t>(i);
  }
  if (n == 0) return 0;
  const MoreLikely more{p};
  if (use_top_k && params_.top_k < n) {
    std::nth_element(order, order + params_.top_k, order + n, more);
    n = params_.top_k;
  }
  if (use_top_p) {
    double total = 0;
    for (int64_t i = 0; i < n; ++i) total += p[order[i]];
    const double target = params_.top_p * total;
    // Sort a growing most-likely prefix until it holds top_p of the mass: a peaked distribution
    // never pays for sorting the whole vocabulary.
    double cum = 0;
    int64_t sorted = 0, keep = n;
    for (int64_t c = std::min<int64_t>(n, 64);; c = std::min<int64_t>(n, c * 4)) {
      std::partial_sort(order + sorted, order + c, order + n, more);
      for (; sorted < c; ++sorted) {
        cum += p[order[sorted]];
        if (cum >= target) break;
      }
      if (sorted < c) {
        keep = sorted + 1;
        break;
      }
      if (c == n) break;
    }
    n = keep;
  } else {
    std::sort(order, order + n, more);
  }
  double total = 0;
  for (int64_t i = 0; i < n; ++i) total += p[order[i]];
  const double target = u * total;
  double cum = 0;
  for (int64_t i = 0; i < n; ++i) {
    cum += p[order[i]];
    if (cum > target) return order[i];
  }
  return order[n - 1];
}

namespace {
// log-softmax of `lp` [v] at `token`, its rank and the n_top most likely tokens into *result
// (`order`: v ints of scratch).
void Logprobs(const float* lp, int64_t v, int32_t token, int64_t n_top, int32_t* order,
              SampleResult* result) {
  const float max = *std::max_element(lp, lp + v);
  double log_z = kNegInf;
  if (max != kNegInf) {
    double sum = 0;
    for (int64_t i = 0; i < v; ++i) sum += std::exp(static_cast<double>(lp[i]) - max);
    log_z = max + std::log(sum);
  }
  auto logprob = [&](int32_t t) {
    return lp[t] == kNegInf ? kNegInf : static_cast<float>(lp[t] - log_z);
  };
  result->token = token;
  result->logprob = logprob(token);
  int64_t higher = 0;
  for (int64_t i = 0; i < v; ++i) higher += lp[i] > lp[token];
  result->rank = higher + 1;
  n_top = std::min<int64_t>(n_top, v);
  result->top.clear();
  if (n_top <= 0) return;
  std::iota(order, order + v, 0);
  std::partial_sort(order, order + n_top, order + v, MoreLikely{lp});
  for (int64_t i = 0; i < n_top; ++i) result->top.push_back({order[i], logprob(order[i])});
}
}  // namespace

void ScoreToken(std::span<const float> logits, int32_t token, int32_t n_top,
                SamplerScratch* scratch, SampleResult* result) {
  const auto v = static_cast<int64_t>(logits.size());
  CHORUS_CHECK(token >= 0 && token < v) << "token " << token << " outside a vocabulary of " << v;
  scratch->Reserve(v);
  float* raw = scratch->probs_.data();
  for (int64_t i = 0; i < v; ++i) raw[i] = Sanitize(logits[i]);
  Logprobs(raw, v, token, n_top, scratch->order_.data(), result);
}

void Sampler::FillLogprobs(const float* lp, int32_t token, SamplerScratch* scratch,
                           SampleResult* result) const {
  Logprobs(lp, vocab_size_, token, *params_.logprobs, scratch->order_.data(), result);
}

int32_t Sampler::Sample(std::span<const float> logits, std::span<const int32_t> prompt,
                        std::span<const int32_t> generated, SamplerScratch* scratch,
                        SampleResult* result, const grammar::TokenMask* allowed,
                        std::span<const int32_t> suppressed) {
  CHORUS_CHECK_EQ(static_cast<int64_t>(logits.size()), vocab_size_);
  const int64_t v = vocab_size_;
  if (allowed != nullptr) CHORUS_CHECK_GE(allowed->size(), v);
  scratch->Reserve(v);
  float* l = scratch->logits_.data();
  for (int64_t i = 0; i < v; ++i) l[i] = Sanitize(logits[i]);
  if (allowed != nullptr) ApplyMask(l, v, *allowed);
  for (const TokenBias& b : params_.logit_bias) {
    // Sanitized logits stay finite (or −inf, which a bias keeps) after adding ±100.
    if (b.token < v) l[b.token] += b.bias;
  }
  if (!suppressed.empty()) {
    // Only if some other token stays possible: a row cannot end up with nothing to draw.
    bool other = false;
    for (int64_t i = 0; i < v && !other; ++i) {
      if (l[i] == kNegInf) continue;
      other = std::find(suppressed.begin(), suppressed.end(), static_cast<int32_t>(i)) ==
              suppressed.end();
    }
    if (other) {
      for (int32_t t : suppressed) {
        if (t >= 0 && t < v) l[t] = kNegInf;
      }
    }
  }
  if (params_.has_penalties()) {
    UpdateHistory(prompt, generated);
    ApplyPenalties(l);
  }

  int32_t token = 0;
  if (params_.greedy()) {
    for (int64_t i = 1; i < v; ++i) {
      if (l[i] > l[token]) token = static_cast<int32_t>(i);
    }
  } else if (*std::max_element(l, l + v) == kNegInf) {
    token = 0;  // every token masked: nothing to draw from (still one draw, for determinism)
    rng_.NextDouble();
  } else {
    // Clamped so that FLT_MAX (a sanitized +inf) stays finite at temperatures below 1.
    for (int64_t i = 0; i < v; ++i) l[i] = std::min(l[i] / params_.temperature, FLT_MAX);
    token = Draw(scratch);
  }

  if (allowed != nullptr && !allowed->Test(token)) {
    // Only when every allowed logit is −inf (NaN rows): the lowest allowed id keeps the grammar.
    for (int64_t i = 0; i < v; ++i) {
      if (allowed->Test(i)) {
        token = static_cast<int32_t>(i);
        break;
      }
    }
  }
  if (result != nullptr) {
    result->token = token;
    if (params_.logprobs.has_value()) {
      if (params_.logprobs_mode == LogprobsMode::kProcessed) {
        FillLogprobs(l, token, scratch, result);
      } else {
        float* raw = scratch->probs_.data();  // free again after Draw
        for (int64_t i = 0; i < v; ++i) raw[i] = Sanitize(logits[i]);
        if (allowed != nullptr) ApplyMask(raw, v, *allowed);
        FillLogprobs(raw, token, scratch, result);
      }
    } else {
      result->logprob = 0.0f;
      result->rank = 0;
      result->top.clear();
    }
  }
  return token;
}

}  // namespace chorus::engine
