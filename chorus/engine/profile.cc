#include "chorus/engine/profile.h"

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <numeric>

#include "chorus/adapters/lora/lora_adapter.h"
#include "chorus/adapters/lora/lora_hook.h"
#include "chorus/base/rng.h"
#include "chorus/base/thread_pool.h"
#include "chorus/memory/kv_cache.h"
#include "chorus/model/forward.h"
#include "chorus/model/step_builder.h"

namespace chorus::engine {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int64_t kRanks[] = {8, 16, 32, 64};

double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

int64_t Pick(Rng* rng, std::initializer_list<int64_t> v) {
  return v.begin()[rng->NextU64() % v.size()];
}

}  // namespace

Result<ProfileReport> RunProfile(std::shared_ptr<const model::Model> mdl,
                                 const ProfileOptions& opts,
                                 const std::function<void(const std::string&)>& progress) {
  if (opts.samples < 16 || opts.samples > 100000)
    return InvalidArgumentError("profile samples must be in [16, 100000]");
  if (opts.repeats < 1 || opts.max_prefill < 1 || opts.max_decode < 1 || opts.max_context < 16 ||
      opts.max_adapters < 0 || opts.max_adapters > 64)
    return InvalidArgumentError("profile grid limits out of range");
  const model::ModelConfig& c = mdl->config();
  // A model with a short context is profiled up to its context.
  ProfileOptions o = opts;
  o.max_prefill = std::min(o.max_prefill, c.max_seq_len / 4);
  o.max_context = std::min(o.max_context, c.max_seq_len - o.max_prefill - 1);
  if (o.max_context < 16)
    return InvalidArgumentError("the model's context is too short to profile");
  ThreadPool pool(o.threads);
  if (o.cpu_clock && pool.size() != 1)
    return InvalidArgumentError("profile: the CPU clock needs one compute thread (--threads 1)");
  const int64_t max_rows = o.max_prefill + o.max_decode;
  const int64_t slots = o.max_decode + 1;  // slot 0: the prefill sequence
  model::Forward fwd(mdl, max_rows, slots);
  model::StepBuilder builder(max_rows, slots);
  memory::KvLayout layout{.n_layers = c.n_layers,
                          .n_kv_heads = c.n_kv_heads,
                          .head_dim = c.head_dim,
                          .block_size = 16,
                          .dtype = o.kv_dtype};
  const int64_t per_slot = o.max_context + o.max_prefill + 1;
  memory::PagePool pages(slots * ((per_slot + 15) / 16), layout.PageBytes());
  memory::KvCache kv(layout, &pages);
  std::vector<std::vector<int32_t>> tables(static_cast<size_t>(slots));
  for (auto& t : tables) {
    CHORUS_RETURN_IF_ERROR(kv.Reserve(&t, per_slot));
    for (int32_t p : t) std::memset(pages.PageData(p), 0, static_cast<size_t>(pages.page_bytes()));
  }
  std::vector<float> logits(static_cast<size_t>(slots * c.vocab_size));

  std::vector<std::shared_ptr<const adapters::LoraAdapter>> loras;
  if (o.max_adapters > 0)
    progress("building " + std::to_string(o.max_adapters) + " LoRA adapters (ranks 8-64)");
  for (int64_t a = 0; a < o.max_adapters; ++a) {
    adapters::RandomLoraSpec ls;
    ls.rank = kRanks[a % 4];
    ls.alpha = 2.0f * static_cast<float>(ls.rank);
    ls.seed = 500 + static_cast<uint64_t>(a);
    adapters::LoraLimits limits;
    limits.storage = adapters::LoraStorage::kBF16;  // as `chorus serve` stores them
    CHORUS_ASSIGN_OR_RETURN(auto lora,
                            adapters::LoraAdapter::Build(adapters::MakeRandomLora(c, ls), c,
                                                         "profile" + std::to_string(a), limits));
    loras.push_back(std::move(lora));
  }
  adapters::LoraHook hook(c, max_rows);
  Rng rng(o.seed);
  auto random_token = [&] {
    return static_cast<int32_t>(rng.NextU64() % static_cast<uint64_t>(c.vocab_size));
  };

  ProfileReport rep;
  std::vector<int32_t> toks;
  std::vector<const adapters::LoraAdapter*> rows;
  for (int64_t i = 0; i < o.samples; ++i) {
    // A random shape: a prefill chunk (half of the steps), decode rows, adapters.
    int64_t prefill = 0, prefill_start = 0;
    if (rng.NextU64() % 2 == 0) {
      prefill = std::min(o.max_prefill, Pick(&rng, {1, 8, 32, 64, 128, 256, 512}));
      prefill = std::max<int64_t>(1, prefill - static_cast<int64_t>(rng.NextU64() % 8));
      prefill_start = std::min(o.max_context, Pick(&rng, {0, 0, 64, 256, 1024}));
    }
    int64_t decode = std::min(o.max_decode, Pick(&rng, {0, 1, 2, 4, 8, 16, 32, 64}));
    if (prefill == 0 && decode == 0) decode = 1;
    const int64_t k = std::min(o.max_adapters, Pick(&rng, {0, 0, 1, 2, 4, 8, 16}));
    // The k adapters of the step, a random choice of the pool.
    std::vector<int> order(loras.size());
    std::iota(order.begin(), order.end(), 0);
    for (size_t a = order.size(); a > 1; --a) std::swap(order[a - 1], order[rng.NextU64() % a]);
    struct Seq {
      int64_t slot, start, count;
      int adapter;  // -1 = base
    };
    std::vector<Seq> seqs;
    const int64_t n_seqs = (prefill > 0 ? 1 : 0) + decode;
    for (int64_t s = 0; s < n_seqs; ++s) {
      const bool is_prefill = prefill > 0 && s == 0;
      const int adapter = k > 0 ? order[static_cast<size_t>(s % k)] : -1;
      const int64_t depth =
          16 + static_cast<int64_t>(rng.NextU64() % static_cast<uint64_t>(o.max_context - 15));
      seqs.push_back({.slot = is_prefill ? 0 : s + (prefill > 0 ? 0 : 1),
                      .start = is_prefill ? prefill_start : depth,
                      .count = is_prefill ? prefill : 1,
                      .adapter = adapter});
    }
    // Equal adapters contiguous, base rows first, as the scheduler orders a step.
    std::stable_sort(seqs.begin(), seqs.end(),
                     [](const Seq& a, const Seq& b) { return a.adapter < b.adapter; });
    StepSample sample;
    std::vector<int> distinct;
    builder.Clear();
    rows.clear();
    for (const Seq& s : seqs) {
      toks.resize(static_cast<size_t>(s.count));
      for (int32_t& t : toks) t = random_token();
      builder.AddSequence(toks, s.start, tables[static_cast<size_t>(s.slot)].data(),
                          /*want_logits=*/true);
      const adapters::LoraAdapter* a = s.adapter >= 0 ? loras[s.adapter].get() : nullptr;
      rows.insert(rows.end(), static_cast<size_t>(s.count), a);
      sample.f.AddChunk(s.start, s.count, s.slot == 0, a ? a->max_rank() : 0);
      if (a && std::find(distinct.begin(), distinct.end(), s.adapter) == distinct.end()) {
        distinct.push_back(s.adapter);
        sample.f.adapters += 1;
        sample.f.sum_ranks += static_cast<double>(a->max_rank());
      }
    }
    const bool with_lora = !distinct.empty();
    if (with_lora) CHORUS_RETURN_IF_ERROR(hook.SetRows(rows));
    std::vector<double> runs;
    fwd.Run(builder.Input(with_lora ? &hook : nullptr), &kv, &pool, logits.data());  // warm-up
    for (int r = 0; r < o.repeats; ++r) {
      const auto t0 = Clock::now();
      const double c0 = o.cpu_clock ? ThreadCpuSeconds() : 0;
      fwd.Run(builder.Input(with_lora ? &hook : nullptr), &kv, &pool, logits.data());
      runs.push_back(o.cpu_clock ? ThreadCpuSeconds() - c0
                                 : std::chrono::duration<double>(Clock::now() - t0).count());
    }
    std::sort(runs.begin(), runs.end());
    const ProfileReport::Repeats r{.min = runs.front(), .median = runs[runs.size() / 2]};
    sample.seconds = o.min_time ? r.min : r.median;
    (i % 4 == 3 ? rep.heldout : rep.train).push_back(sample);
    (i % 4 == 3 ? rep.heldout_repeats : rep.train_repeats).push_back(r);
    if ((i + 1) % 20 == 0)
      progress("profiled " + std::to_string(i + 1) + "/" + std::to_string(o.samples) +
               " step shapes");
  }

  for (CostModel::Kind kind : {CostModel::Kind::kLinear, CostModel::Kind::kExtended}) {
    CHORUS_ASSIGN_OR_RETURN(CostModel m, CostModel::Fit(kind, rep.train));
    const FitQuality q = m.Evaluate(rep.heldout);
    rep.file.models.push_back({.model = std::move(m), .heldout = q});
  }
  for (size_t i = 1; i < rep.file.models.size(); ++i) {
    if (rep.file.models[i].heldout.median_ape < rep.file.models[rep.file.use].heldout.median_ape)
      rep.file.use = i;
  }
  rep.file.threads = pool.size();
  rep.file.clock = o.cpu_clock ? "thread-cpu" : "wall";
  rep.file.timing = std::string(o.min_time ? "min" : "median") + " of " + std::to_string(o.repeats);
  std::ifstream la("/proc/loadavg");  // procfs reports size 0: read as a stream
  std::getline(la, rep.file.loadavg);
  return rep;
}

double ProfileReport::RepeatSpread() const {
  std::vector<double> spread;
  for (const auto* set : {&train_repeats, &heldout_repeats})
    for (const Repeats& r : *set)
      if (r.min > 0) spread.push_back((r.median - r.min) / r.min);
  if (spread.empty()) return 0;
  std::nth_element(spread.begin(), spread.begin() + spread.size() / 2, spread.end());
  return spread[spread.size() / 2];
}

std::string ProfileReport::ToCsv() const {
  std::string out =
      "set,prefill_tokens,decode_rows,sum_ranks,adapters,deltas,context_tokens,row_ranks,"
      "prefill_context_tokens,seconds,min_s,median_s\n";
  char buf[320];
  for (const auto* set : {&train, &heldout}) {
    const auto& reps = set == &train ? train_repeats : heldout_repeats;
    for (size_t i = 0; i < set->size(); ++i) {
      const StepSample& s = (*set)[i];
      const Repeats r = i < reps.size() ? reps[i] : Repeats{s.seconds, s.seconds};
      std::snprintf(buf, sizeof(buf), "%s,%g,%g,%g,%g,%g,%g,%g,%g,%.6g,%.6g,%.6g\n",
                    set == &train ? "fit" : "heldout", s.f.prefill_tokens, s.f.decode_rows,
                    s.f.sum_ranks, s.f.adapters, s.f.deltas, s.f.context_tokens, s.f.row_ranks,
                    s.f.prefill_context, s.seconds, r.min, r.median);
      out += buf;
    }
  }
  return out;
}

std::string ProfileReport::ToTable() const {
  std::string out;
  char buf[256];
  std::snprintf(buf, sizeof(buf), "%-10s %9s %9s %12s %12s  (%zu fitted, %zu held-out steps)\n",
                "model", "terms", "R2", "median |e|%", "p90 |e|%", train.size(), heldout.size());
  out += buf;
  for (size_t i = 0; i < file.models.size(); ++i) {
    const auto& e = file.models[i];
    std::snprintf(buf, sizeof(buf), "%-10s %9zu %9.4f %12.1f %12.1f%s\n",
                  CostModel::KindName(e.model.kind()), e.model.coefficients().size(), e.heldout.r2,
                  100 * e.heldout.median_ape, 100 * e.heldout.p90_ape,
                  i == file.use ? "  <- used" : "");
    out += buf;
  }
  std::snprintf(buf, sizeof(buf),
                "repeat spread (median over shapes of (median - min) / min of its %s): %.1f%%\n",
                file.timing.c_str(), 100 * RepeatSpread());
  out += buf;
  return out;
}

}  // namespace chorus::engine
