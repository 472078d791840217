#include "chorus/engine/bench.h"

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iomanip>
#include <map>
#include <numeric>
#include <span>
#include <sstream>

#include "chorus/adapters/delta/delta_hook.h"
#include "chorus/adapters/delta/delta_synthetic.h"
#include "chorus/adapters/lora/lora_adapter.h"
#include "chorus/adapters/lora/lora_hook.h"
#include "chorus/adapters/variant_hook.h"
#include "chorus/base/large_alloc.h"
#include "chorus/base/rng.h"
#include "chorus/base/thread_pool.h"
#include "chorus/kernels/attention.h"
#include "chorus/kernels/dispatch.h"
#include "chorus/memory/kv_cache.h"
#include "chorus/model/forward.h"
#include "chorus/model/loader.h"
#include "chorus/model/step_builder.h"
#include "chorus/model/synthetic.h"

namespace chorus::engine {

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

namespace {

using Clock = std::chrono::steady_clock;

__attribute__((target("avx2"))) uint64_t SumAvx2(const uint8_t* p, int64_t n) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  for (int64_t i = 0; i + 128 <= n; i += 128) {
    a0 = _mm256_add_epi64(a0, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i)));
    a1 = _mm256_add_epi64(a1, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 32)));
    a2 = _mm256_add_epi64(a2, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 64)));
    a3 = _mm256_add_epi64(a3, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 96)));
  }
  __m256i s = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
  alignas(32) uint64_t out[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(out), s);
  return out[0] + out[1] + out[2] + out[3];
}

uint64_t SumScalar(const uint8_t* p, int64_t n) {
  uint64_t s = 0;
  const auto* q = reinterpret_cast<const uint64_t*>(p);
  for (int64_t i = 0; i < n / 8; ++i) s += q[i];
  return s;
}

// vpdpbusd on 12 zmm accumulators, `iters` times each; the sum keeps the loop alive.
__attribute__((target("avx512f,avx512vnni"))) int64_t VnniLoop(int64_t iters) {
  const __m512i a = _mm512_set1_epi32(0x01020304), b = _mm512_set1_epi32(0x01ff01ff);
  __m512i c[12];
  for (__m512i& v : c) v = _mm512_setzero_si512();
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 12
    for (__m512i& v : c) v = _mm512_dpbusd_epi32(v, a, b);
    // Keeps GCC from folding the loop: the operands look loop-variant to it.
    __asm__ volatile("" : "+v"(c[0]), "+v"(c[6]));
  }
  __m512i s = c[0];
  for (int j = 1; j < 12; ++j) s = _mm512_add_epi32(s, c[j]);
  alignas(64) int32_t lanes[16];
  _mm512_store_si512(lanes, s);
  return std::accumulate(lanes, lanes + 16, int64_t{0});
}

// A step over `n` sequences at the given positions, one row each (decode) — or one sequence's
// chunk of rows (prefill).
struct Seqs {
  std::vector<std::vector<int32_t>> tables;
  std::vector<const int32_t*> table_ptrs;
};

}  // namespace

ReadBandwidthProbe::ReadBandwidthProbe(ThreadPool* pool, int64_t bytes)
    : pool_(pool), bytes_(bytes / 4096 * 4096) {
  // Huge pages like the packed weights it is compared with (AllocateLarge), so the roofline is
  // the best this machine reads, not a 4 KiB-page figure the weights could beat.
  buf_ = static_cast<uint8_t*>(AllocateLarge(static_cast<size_t>(bytes_), "the bandwidth probe"));
  // Touch every page from the thread that will read it (first-touch placement). The data is a
  // pseudo-random sequence, so no two pages are alike: with a constant fill a host that merges
  // identical pages (KSM) could back the buffer with a few physical pages, and the probe would
  // read cache, not DRAM. A precaution: the fast probe phases of this host (50–60 GB/s) remain
  // with random data too.
  pool_->Run([&](int i, int n) {
    int64_t b, e;
    ThreadPool::Slice(bytes_, i, n, 4096, &b, &e);
    uint64_t state = 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(i + 1);
    for (int64_t off = b; off + 8 <= e; off += 8) {
      state ^= state << 13;
      state ^= state >> 7;
      state ^= state << 17;
      std::memcpy(buf_ + off, &state, 8);
    }
  });
  sink_.assign(static_cast<size_t>(pool_->size()), 0);
  (void)Once();  // the first pass warms up
}

ReadBandwidthProbe::~ReadBandwidthProbe() { std::free(buf_); }

double ReadBandwidthProbe::Once() {
  const bool avx2 = kernels::DetectCpu().avx2;
  auto t0 = Clock::now();
  pool_->Run([&](int i, int n) {
    int64_t b, e;
    ThreadPool::Slice(bytes_, i, n, 4096, &b, &e);
    sink_[static_cast<size_t>(i)] += avx2 ? SumAvx2(buf_ + b, e - b) : SumScalar(buf_ + b, e - b);
  });
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  volatile uint64_t keep = std::accumulate(sink_.begin(), sink_.end(), uint64_t{0});
  (void)keep;
  return static_cast<double>(bytes_) / s / 1e9;
}

double MeasureVnniPeak(ThreadPool* pool) {
  if (!kernels::DetectCpu().avx512vnni) return 0;
  constexpr int64_t kIters = 16'000'000;  // 192 M instructions per thread: ~30 ms at 2 per cycle
  std::vector<int64_t> sink(static_cast<size_t>(pool->size()));
  const auto t0 = Clock::now();
  pool->Run([&](int i, int) { sink[static_cast<size_t>(i)] = VnniLoop(kIters); });
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  volatile int64_t keep = sink[0];
  (void)keep;
  return static_cast<double>(pool->size()) * kIters * 12 * 128 / s / 1e9;
}

double MeasureReadBandwidth(int threads, int64_t bytes, int repeats, std::vector<double>* runs) {
  ThreadPool pool(threads);
  ReadBandwidthProbe probe(&pool, bytes);
  std::vector<double> gbs;
  for (int r = 0; r < repeats; ++r) gbs.push_back(probe.Once());
  if (runs) *runs = gbs;
  return Median(gbs);
}

// ---- Workload "punica" ----

std::vector<int> PunicaAssignment(const std::string& kind, int64_t b) {
  std::vector<int> rows(static_cast<size_t>(b), 0);
  if (kind == "distinct") {
    for (int64_t i = 0; i < b; ++i) rows[static_cast<size_t>(i)] = static_cast<int>(i);
  } else if (kind == "uniform") {
    const int64_t groups = static_cast<int64_t>(std::ceil(std::sqrt(static_cast<double>(b))));
    // Group g holds rows [g·b/groups, (g+1)·b/groups): sizes differ by at most one.
    for (int64_t i = 0; i < b; ++i) rows[static_cast<size_t>(i)] = static_cast<int>(i * groups / b);
  } else if (kind == "skewed") {
    // Group sizes round(1.5^k), k = 0, 1, ...; the last group takes what is left.
    int64_t i = 0;
    double size = 1;
    for (int g = 0; i < b; ++g, size *= 1.5) {
      const int64_t n = std::min<int64_t>(std::max<int64_t>(1, std::llround(size)), b - i);
      for (int64_t k = 0; k < n; ++k) rows[static_cast<size_t>(i++)] = g;
    }
  }  // "identical": all zero
  return rows;
}

namespace {

Result<EngineBenchReport> RunPunicaWorkload(const EngineBenchOptions& opts,
                                            const std::function<void(const std::string&)>& progress,
                                            EngineBenchReport rep) {
  const model::QuantScheme& scheme = opts.dtypes.front();
  const std::string dname = scheme.name();
  ThreadPool pool(opts.threads);
  const int64_t max_b = *std::max_element(opts.batches.begin(), opts.batches.end());
  const int64_t context = opts.depths.front();
  const int64_t max_rows = std::max(context, max_b);
  progress("building synthetic " + opts.shape + " " + dname);
  model::SyntheticSpec spec{.shape = opts.shape, .dtype = scheme.base(), .seed = 1};
  if (scheme.is_mix()) spec.mix = scheme;
  CHORUS_ASSIGN_OR_RETURN(auto mdl, model::MakeSyntheticModel(spec));
  const model::ModelConfig& c = mdl->config();
  model::Forward fwd(mdl, max_rows, max_rows);
  model::StepBuilder builder(max_rows, max_b);
  memory::KvLayout layout{.n_layers = c.n_layers,
                          .n_kv_heads = c.n_kv_heads,
                          .head_dim = c.head_dim,
                          .block_size = 16,
                          .dtype = opts.kv_dtype};
  const int64_t blocks_per_seq = (context + opts.decode_steps + 16 + 15) / 16;
  memory::PagePool pages(blocks_per_seq * (max_b + 1), layout.PageBytes());
  memory::KvCache kv(layout, &pages);
  std::vector<float> logits(static_cast<size_t>(max_rows * c.vocab_size));
  Rng rng(7);
  auto random_token = [&] {
    return static_cast<int32_t>(rng.NextU64() % static_cast<uint64_t>(c.vocab_size));
  };

  // max_b adapters (Distinct needs one per row), ranks round-robin.
  progress("building " + std::to_string(max_b) + " LoRA adapters (q,k,v,o)");
  std::vector<std::shared_ptr<const adapters::LoraAdapter>> loras;
  for (int64_t a = 0; a < max_b; ++a) {
    adapters::RandomLoraSpec ls;
    ls.rank = opts.lora_ranks[static_cast<size_t>(a) % opts.lora_ranks.size()];
    ls.alpha = 2.0f * static_cast<float>(ls.rank);
    ls.seed = 900 + static_cast<uint64_t>(a);
    ls.targets = {model::Linear::kQ, model::Linear::kK, model::Linear::kV, model::Linear::kO};
    CHORUS_ASSIGN_OR_RETURN(auto lora,
                            adapters::LoraAdapter::Build(adapters::MakeRandomLora(c, ls), c,
                                                         "punica" + std::to_string(a)));
    loras.push_back(std::move(lora));
  }
  adapters::LoraHook hook(c, max_rows);

  const std::vector<std::string> kinds = {"base", "identical", "skewed", "uniform", "distinct"};
  for (int64_t b : opts.batches) {
    std::map<std::string, std::vector<double>> runs;
    for (int r = 0; r < opts.repeats; ++r) {
      for (const std::string& kind : kinds) {
        std::vector<std::vector<int32_t>> tables(static_cast<size_t>(b));
        std::vector<const int32_t*> tps(static_cast<size_t>(b));
        for (int64_t s = 0; s < b; ++s) {
          CHORUS_RETURN_IF_ERROR(
              kv.Reserve(&tables[static_cast<size_t>(s)], context + opts.decode_steps));
          tps[static_cast<size_t>(s)] = tables[static_cast<size_t>(s)].data();
        }
        const bool with_lora = kind != "base";
        std::vector<const adapters::LoraAdapter*> row_adapters;
        if (with_lora) {
          for (int a : PunicaAssignment(kind, b))
            row_adapters.push_back(loras[static_cast<size_t>(a)].get());
        }
        // Context of every sequence, one prefill step each (untimed), with its adapter.
        for (int64_t s = 0; s < b; ++s) {
          std::vector<int32_t> toks(static_cast<size_t>(context));
          for (int32_t& t : toks) t = random_token();
          builder.Clear();
          builder.AddSequence(toks, 0, tps[static_cast<size_t>(s)], /*want_logits=*/false);
          if (with_lora) {
            std::vector<const adapters::LoraAdapter*> prow(toks.size(),
                                                           row_adapters[static_cast<size_t>(s)]);
            CHORUS_RETURN_IF_ERROR(hook.SetRows(prow));
          }
          fwd.Run(builder.Input(with_lora ? &hook : nullptr), &kv, &pool, logits.data());
        }
        std::vector<int32_t> toks(static_cast<size_t>(b));
        for (int32_t& t : toks) t = random_token();
        if (with_lora) CHORUS_RETURN_IF_ERROR(hook.SetRows(row_adapters));
        auto t0 = Clock::now();
        for (int64_t step = 0; step < opts.decode_steps; ++step) {
          builder.Clear();
          for (size_t s = 0; s < toks.size(); ++s) {
            builder.AddSequence(std::span<const int32_t>(&toks[s], 1), context + step, tps[s],
                                /*want_logits=*/true);
          }
          fwd.Run(builder.Input(with_lora ? &hook : nullptr), &kv, &pool, logits.data());
          for (int64_t s = 0; s < b; ++s) {
            const float* lg = logits.data() + s * c.vocab_size;
            toks[static_cast<size_t>(s)] =
                static_cast<int32_t>(std::max_element(lg, lg + c.vocab_size) - lg);
          }
        }
        const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
        runs[kind].push_back(static_cast<double>(b * opts.decode_steps) / secs);
        for (auto& t : tables) kv.Release(&t);
      }
      progress("punica batch " + std::to_string(b) + ": repeat " + std::to_string(r + 1) + "/" +
               std::to_string(opts.repeats) + " done");
    }
    for (const std::string& kind : kinds) {
      EngineBenchRow row;
      row.dtype = dname;
      row.metric = kind;
      row.batch = b;
      row.depth = opts.depths.front();
      row.tokens_per_s = Median(runs[kind]);
      row.runs = runs[kind];
      row.weight_bytes_per_token = static_cast<double>(mdl->StreamedBytesPerToken());
      if (kind != "base") {
        const auto a = PunicaAssignment(kind, b);
        row.adapters = *std::max_element(a.begin(), a.end()) + 1;
      }
      progress(dname + " punica " + kind + " batch " + std::to_string(b) + ": " +
               std::to_string(row.tokens_per_s) + " tok/s");
      rep.rows.push_back(row);
    }
  }
  return rep;
}

}  // namespace

Result<EngineBenchReport> RunEngineBench(const EngineBenchOptions& opts,
                                         const std::function<void(const std::string&)>& progress) {
  EngineBenchReport rep;
  rep.shape = opts.model_path.empty() ? opts.shape : opts.model_path;
  rep.threads = opts.threads;
  rep.kv_dtype = memory::KvDtypeName(opts.kv_dtype);
  rep.prefill_chunk = opts.prefill_chunk;
  if (!opts.model_path.empty() && opts.workload != "default")
    return InvalidArgumentError("a model file is measured by the default workload only");
  const kernels::IsaLevel entry_isa = kernels::ActiveIsa();
  const std::vector<kernels::IsaLevel> isas =
      opts.isas.empty() ? std::vector<kernels::IsaLevel>{entry_isa} : opts.isas;
  for (kernels::IsaLevel l : isas) {
    kernels::SetMaxIsa(l);
    const bool ok = kernels::ActiveIsa() == l;
    kernels::SetMaxIsa(entry_isa);
    if (!ok) {
      return InvalidArgumentError(
          "kernel level " + kernels::IsaName(l) + " is not supported on this CPU" +
          (l == kernels::IsaLevel::kAmx ? " (" + kernels::AmxUnavailableReason() + ")" : ""));
    }
  }
  // The levels are switched inside the runs; the one active on entry is restored on return.
  struct RestoreIsa {
    kernels::IsaLevel level;
    ~RestoreIsa() { kernels::SetMaxIsa(level); }
  } restore{entry_isa};
  for (size_t i = 0; i < isas.size(); ++i) {
    if (i > 0) rep.isa += ',';
    rep.isa += kernels::IsaName(isas[i]);
  }
  progress("measuring memory read bandwidth (" + std::to_string(opts.bandwidth_bytes >> 20) +
           " MiB, " + std::to_string(opts.threads) + " threads)");
  rep.bandwidth_gbs =
      MeasureReadBandwidth(opts.threads, opts.bandwidth_bytes, opts.repeats, &rep.bandwidth_runs);
  if (opts.workload == "punica") return RunPunicaWorkload(opts, progress, std::move(rep));
  if (opts.workload != "default")
    return InvalidArgumentError("unknown workload '" + opts.workload + "' (default, punica)");
  ThreadPool pool(opts.threads);
  if (kernels::DetectCpu().avx512vnni) {
    progress("measuring the int8 VNNI limit (vpdpbusd, " + std::to_string(opts.threads) +
             " threads)");
    MeasureVnniPeak(&pool);  // warm-up (clock ramp)
    for (int r = 0; r < std::max(opts.repeats, 3); ++r)
      rep.vnni_runs.push_back(MeasureVnniPeak(&pool));
    rep.vnni_gops = Median(rep.vnni_runs);
  }
  // Batch-1 decode runs are each bracketed by bandwidth probe passes (their roofline).
  std::unique_ptr<ReadBandwidthProbe> probe;
  if (std::find(opts.batches.begin(), opts.batches.end(), 1) != opts.batches.end() &&
      opts.bandwidth_bytes > 0) {
    probe = std::make_unique<ReadBandwidthProbe>(&pool, opts.bandwidth_bytes);
  }
  const int64_t max_prefill =
      *std::max_element(opts.prefill_lengths.begin(), opts.prefill_lengths.end());
  const int64_t max_depth = *std::max_element(opts.depths.begin(), opts.depths.end());
  const int64_t max_b = *std::max_element(opts.batches.begin(), opts.batches.end());
  // Rows of the largest step: a prefill prompt, a sequence's context fill, or a decode batch.
  const int64_t max_rows = std::max({max_prefill, max_depth, max_b, int64_t{1}});

  // A model file is measured as it is (one pass, its rows named after the file); else one
  // synthetic model per dtype.
  const size_t n_models = opts.model_path.empty() ? opts.dtypes.size() : 1;
  for (size_t mi = 0; mi < n_models; ++mi) {
    std::shared_ptr<const model::Model> mdl;
    std::string dname;
    if (!opts.model_path.empty()) {
      dname = opts.model_path.substr(opts.model_path.find_last_of('/') + 1);
      progress("loading " + opts.model_path);
      CHORUS_ASSIGN_OR_RETURN(mdl, model::LoadModel(opts.model_path));
    } else {
      const model::QuantScheme& scheme = opts.dtypes[mi];
      dname = scheme.name();
      progress("building synthetic " + opts.shape + " " + dname);
      model::SyntheticSpec spec{.shape = opts.shape, .dtype = scheme.base(), .seed = 1};
      if (scheme.is_mix()) spec.mix = scheme;
      CHORUS_ASSIGN_OR_RETURN(mdl, model::MakeSyntheticModel(spec));
    }
    const model::ModelConfig& c = mdl->config();
    model::Forward fwd(mdl, max_rows, max_rows);
    model::StepBuilder builder(max_rows, max_rows);
    memory::KvLayout layout{.n_layers = c.n_layers,
                            .n_kv_heads = c.n_kv_heads,
                            .head_dim = c.head_dim,
                            .block_size = 16,
                            .dtype = opts.kv_dtype};
    // Each phase releases its blocks before the next, so the pool holds the largest phase: the
    // prompts of every length, one deep sequence, or the decode batches at the first depth.
    auto blocks = [](int64_t tokens) { return (tokens + 16 + 15) / 16; };
    int64_t prefill_blocks = 0;
    for (int64_t len : opts.prefill_lengths) prefill_blocks += blocks(len);
    const int64_t pages = std::max({prefill_blocks, blocks(max_depth + opts.decode_steps),
                                    max_b * blocks(opts.depths.front() + opts.decode_steps)}) +
                          2;
    memory::PagePool pool_pages(pages, layout.PageBytes());
    memory::KvCache kv(layout, &pool_pages);
    std::vector<float> logits(static_cast<size_t>(max_rows * c.vocab_size));
    Rng rng(7);
    auto random_token = [&] {
      return static_cast<int32_t>(rng.NextU64() % static_cast<uint64_t>(c.vocab_size));
    };

    // Prefill: one sequence per length, in steps of opts.prefill_chunk rows (each chunk over
    // the KV its predecessors wrote; logits for the last row only), or the whole prompt in one
    // step when that is 0. The lengths and the kernel levels take turns within each repeat (after
    // one warm-up run each), so a slow spell of the shared host weighs on every length and level
    // alike and their ratios stay comparable.
    {
      const size_t n_len = opts.prefill_lengths.size();
      std::vector<std::vector<int32_t>> tables(n_len), prompts(n_len);
      // [length][level]: tok/s of each run, and the VNNI limit probed around it (GOP/s).
      std::vector<std::vector<std::vector<double>>> runs(
          n_len, std::vector<std::vector<double>>(isas.size()));
      auto limits = runs;
      const bool vnni = rep.vnni_gops > 0;
      for (size_t li = 0; li < n_len; ++li) {
        CHORUS_RETURN_IF_ERROR(kv.Reserve(&tables[li], opts.prefill_lengths[li]));
        prompts[li].resize(static_cast<size_t>(opts.prefill_lengths[li]));
        for (int32_t& t : prompts[li]) t = random_token();
      }
      for (int r = 0; r < opts.repeats + 1; ++r) {
        for (size_t li = 0; li < n_len; ++li) {
          for (size_t ii = 0; ii < isas.size(); ++ii) {
            kernels::SetMaxIsa(isas[ii]);
            const int64_t len = opts.prefill_lengths[li];
            const int64_t chunk = opts.prefill_chunk > 0 ? opts.prefill_chunk : len;
            const std::span<const int32_t> prompt(prompts[li]);
            const double before = vnni && r > 0 ? MeasureVnniPeak(&pool) : 0;
            auto t0 = Clock::now();
            for (int64_t p = 0; p < len; p += chunk) {
              const int64_t n = std::min(chunk, len - p);
              builder.Clear();
              builder.AddSequence(prompt.subspan(static_cast<size_t>(p), static_cast<size_t>(n)), p,
                                  tables[li].data(), /*want_logits=*/p + n == len);
              fwd.Run(builder.Input(), &kv, &pool, logits.data());
            }
            double s = std::chrono::duration<double>(Clock::now() - t0).count();
            if (r > 0) {
              runs[li][ii].push_back(static_cast<double>(opts.prefill_lengths[li]) / s);
              if (vnni) limits[li][ii].push_back((before + MeasureVnniPeak(&pool)) / 2);
            }
          }
        }
      }
      for (size_t li = 0; li < n_len; ++li) {
        kv.Release(&tables[li]);
        for (size_t ii = 0; ii < isas.size(); ++ii) {
          EngineBenchRow row;
          row.dtype = dname;
          row.metric = "prefill";
          row.batch = opts.prefill_lengths[li];
          row.tokens_per_s = Median(runs[li][ii]);
          row.runs = runs[li][ii];
          row.isa = kernels::IsaName(isas[ii]);
          for (const auto& l : mdl->weights().layers)
            for (const auto& m : l.linear) row.ops_per_token += 2.0 * m.n() * m.k();
          if (vnni) {
            std::vector<double> fractions;
            for (size_t i = 0; i < row.runs.size(); ++i)
              fractions.push_back(row.runs[i] * row.ops_per_token / (limits[li][ii][i] * 1e9));
            row.vnni_fraction = Median(fractions);
            row.vnni_gops = Median(limits[li][ii]);
          }
          progress(dname + " prefill " + std::to_string(row.batch) + " (" + row.isa +
                   "): " + std::to_string(row.tokens_per_s) + " tok/s");
          rep.rows.push_back(row);
        }
      }
    }

    // Adapters for the mixed runs (compute layout, in memory: the kernels' cost, not loading).
    std::vector<std::shared_ptr<const adapters::LoraAdapter>> loras;
    for (int64_t a = 0; a < opts.n_adapters; ++a) {
      adapters::RandomLoraSpec spec;
      spec.rank = opts.lora_ranks[static_cast<size_t>(a) % opts.lora_ranks.size()];
      spec.seed = 500 + static_cast<uint64_t>(a);
      spec.targets = {model::Linear::kQ, model::Linear::kK, model::Linear::kV, model::Linear::kO};
      adapters::LoraLimits limits;
      limits.storage = opts.lora_storage;
      CHORUS_ASSIGN_OR_RETURN(auto lora,
                              adapters::LoraAdapter::Build(adapters::MakeRandomLora(c, spec), c,
                                                           "bench" + std::to_string(a), limits));
      loras.push_back(std::move(lora));
    }
    adapters::LoraHook hook(c, max_rows);
    std::vector<std::shared_ptr<const delta::DeltaWeights>> deltas;
    for (int64_t dn = 0; dn < opts.n_deltas; ++dn) {
      delta::RandomDeltaSpec spec = opts.delta_layout;
      spec.seed = 900 + static_cast<uint64_t>(dn);
      progress("building random delta " + std::to_string(dn + 1) + " of " +
               std::to_string(opts.n_deltas));
      CHORUS_ASSIGN_OR_RETURN(auto w,
                              delta::DeltaWeights::Build(delta::MakeRandomDelta(c, spec), c,
                                                         "bench-delta" + std::to_string(dn)));
      deltas.push_back(std::move(w));
    }
    delta::DeltaHook delta_hook(max_rows);
    adapters::VariantHook variant_hook;
    const bool mixed = !deltas.empty();
    // K and V bytes one decode token at position `pos` reads: every layer's K and V rows of the
    // keys it attends — its whole context, or its window on sliding-window layers — in the
    // cache's dtype.
    const double kv_bytes_per_layer_key = static_cast<double>(layout.TokenBytes()) / c.n_layers;
    auto kv_bytes_at = [&](int64_t pos) {
      double keys = 0;
      for (int64_t l = 0; l < c.n_layers; ++l) {
        keys += static_cast<double>(pos + 1 - kernels::AttentionFirstKey(pos, c.LayerWindow(l)));
      }
      return keys * kv_bytes_per_layer_key;
    };

    // Decode: the batches at depths[0], then batch 1 at each further depth. B sequences with
    // `depth` tokens of KV (filled once, untimed; every repeat rewrites the same later
    // positions), then timed steps of B rows each. With adapters, the base-only and the LoRA run
    // of each repeat follow each other (base, lora, base, lora, ...), so a slow spell of the
    // shared host weighs on both medians alike.
    std::vector<std::pair<int64_t, int64_t>> cases;  // (batch, depth)
    for (int64_t b : opts.batches) cases.emplace_back(b, opts.depths.front());
    for (size_t i = 1; i < opts.depths.size(); ++i) cases.emplace_back(1, opts.depths[i]);
    for (const auto& [b, depth] : cases) {
      const bool deep = depth != opts.depths.front();
      const int n_passes = (loras.empty() && deltas.empty()) || deep ? 1 : 2;
      std::vector<std::vector<int32_t>> tables(static_cast<size_t>(b));
      std::vector<const int32_t*> tps(static_cast<size_t>(b));
      for (int64_t s = 0; s < b; ++s) {
        CHORUS_RETURN_IF_ERROR(
            kv.Reserve(&tables[static_cast<size_t>(s)], depth + opts.decode_steps));
        tps[static_cast<size_t>(s)] = tables[static_cast<size_t>(s)].data();
      }
      for (int64_t s = 0; s < b; ++s) {
        std::vector<int32_t> toks(static_cast<size_t>(depth));
        for (int32_t& t : toks) t = random_token();
        builder.Clear();
        builder.AddSequence(toks, 0, tps[static_cast<size_t>(s)], /*want_logits=*/false);
        fwd.Run(builder.Input(), &kv, &pool, logits.data());
      }
      // [level][pass]; probe_runs_by_isa[level]: batch 1, the read bandwidth around each base run.
      std::vector<std::array<std::vector<double>, 2>> pass_runs(isas.size());
      std::vector<std::vector<double>> probe_runs_by_isa(isas.size());
      for (int r = 0; r < opts.repeats; ++r)
        for (int pass_li = 0; pass_li < n_passes * static_cast<int>(isas.size()); ++pass_li) {
          const size_t li = static_cast<size_t>(pass_li / n_passes);
          const int pass = pass_li % n_passes;
          kernels::SetMaxIsa(isas[li]);
          std::vector<double>& probe_runs = probe_runs_by_isa[li];
          const bool with_lora = pass == 1;
          std::vector<int32_t> toks(static_cast<size_t>(b));
          for (int32_t& t : toks) t = random_token();
          const model::LinearHook* step_hook = nullptr;
          if (with_lora && !mixed) {
            std::vector<const adapters::LoraAdapter*> rows(static_cast<size_t>(b));
            for (int64_t s = 0; s < b; ++s)
              rows[static_cast<size_t>(s)] = loras[static_cast<size_t>(s) % loras.size()].get();
            CHORUS_RETURN_IF_ERROR(hook.SetRows(rows));
            step_hook = &hook;
          } else if (with_lora) {
            // Contiguous equal groups: the base, then each delta, then each LoRA adapter.
            const int64_t n_variants = 1 + static_cast<int64_t>(deltas.size() + loras.size());
            std::vector<const adapters::LoraAdapter*> lora_rows(static_cast<size_t>(b), nullptr);
            std::vector<const delta::DeltaView*> delta_rows(static_cast<size_t>(b), nullptr);
            for (int64_t s = 0; s < b; ++s) {
              const int64_t v = s * n_variants / b - 1;  // -1: the base
              if (v < 0) continue;
              if (v < static_cast<int64_t>(deltas.size())) {
                delta_rows[static_cast<size_t>(s)] = deltas[static_cast<size_t>(v)].get();
              } else {
                lora_rows[static_cast<size_t>(s)] =
                    loras[static_cast<size_t>(v) - deltas.size()].get();
              }
            }
            CHORUS_RETURN_IF_ERROR(hook.SetRows(lora_rows));
            CHORUS_RETURN_IF_ERROR(delta_hook.SetRows(delta_rows));
            variant_hook.Clear();
            variant_hook.Add(&hook);
            variant_hook.Add(&delta_hook);
            step_hook = &variant_hook;
          }
          // The roofline of batch 1 is taken against the bandwidth measured right before and right
          // after each of its runs: on a shared host the bandwidth drifts by tens of percent within
          // one invocation (it switches between ~30 and ~55 GB/s within seconds here), and a probe
          // from minutes earlier, or from one side of a switch only, would score that drift, not
          // the kernels.
          const bool probed = b == 1 && !with_lora && probe != nullptr;
          const double probe_before = probed ? probe->Once() : 0;
          auto t0 = Clock::now();
          for (int64_t step = 0; step < opts.decode_steps; ++step) {
            builder.Clear();
            for (size_t s = 0; s < toks.size(); ++s) {
              builder.AddSequence(std::span<const int32_t>(&toks[s], 1), depth + step, tps[s],
                                  /*want_logits=*/true);
            }
            fwd.Run(builder.Input(step_hook), &kv, &pool, logits.data());
            // Greedy next tokens so the work is that of real decoding (argmax over the vocab).
            for (int64_t s = 0; s < b; ++s) {
              const float* lg = logits.data() + s * c.vocab_size;
              toks[static_cast<size_t>(s)] =
                  static_cast<int32_t>(std::max_element(lg, lg + c.vocab_size) - lg);
            }
          }
          double secs = std::chrono::duration<double>(Clock::now() - t0).count();
          pass_runs[li][static_cast<size_t>(pass)].push_back(
              static_cast<double>(b * opts.decode_steps) / secs);
          if (probed) probe_runs.push_back((probe_before + probe->Once()) / 2);
        }
      for (auto& t : tables) kv.Release(&t);
      for (int pass_li = 0; pass_li < n_passes * static_cast<int>(isas.size()); ++pass_li) {
        const size_t li = static_cast<size_t>(pass_li / n_passes);
        const int pass = pass_li % n_passes;
        const std::vector<double>& probe_runs = probe_runs_by_isa[li];
        const bool with_lora = pass == 1;
        const std::vector<double>& runs = pass_runs[li][static_cast<size_t>(pass)];
        EngineBenchRow row;
        row.dtype = dname;
        row.metric = !with_lora ? "decode" : mixed ? "decode-mixed" : "decode-lora";
        if (with_lora) row.adapters = static_cast<int64_t>(loras.size() + deltas.size());
        row.batch = b;
        row.depth = depth;
        row.tokens_per_s = Median(runs);
        row.runs = runs;
        row.isa = kernels::IsaName(isas[li]);
        row.weight_bytes_per_token = static_cast<double>(mdl->StreamedBytesPerToken());
        // The timed steps' tokens sit at positions depth … depth + steps − 1.
        double kv_bytes = 0;
        for (int64_t s = 0; s < opts.decode_steps; ++s) kv_bytes += kv_bytes_at(depth + s);
        row.kv_bytes_per_token = kv_bytes / static_cast<double>(opts.decode_steps);
        if (b == 1 && !with_lora && !probe_runs.empty()) {
          row.roofline_bandwidth_gbs = Median(probe_runs);
          row.roofline_bandwidth_runs = probe_runs;
          std::vector<double> fractions;
          for (size_t i = 0; i < runs.size(); ++i)
            fractions.push_back(runs[i] * (row.weight_bytes_per_token + row.kv_bytes_per_token) /
                                (probe_runs[i] * 1e9));
          row.roofline_fraction = Median(fractions);
        }
        progress(dname + " " + row.metric + " batch " + std::to_string(b) + " depth " +
                 std::to_string(depth) + " (" + row.isa + "): " + std::to_string(row.tokens_per_s) +
                 " tok/s");
        rep.rows.push_back(row);
      }
    }
  }
  return rep;
}

std::string EngineBenchReport::ToCsv() const {
  std::ostringstream s;
  s << "shape,threads,isa,dtype,metric,batch,tokens_per_s,roofline_fraction,bandwidth_gbs,runs,"
       "adapters,depth,weight_bytes_per_token,kv_bytes_per_token,kv_dtype,prefill_chunk\n";
  for (const auto& r : rows) {
    s << shape << "," << threads << "," << (r.isa.empty() ? isa : r.isa) << "," << r.dtype << ","
      << r.metric << "," << r.batch << "," << std::fixed << std::setprecision(2) << r.tokens_per_s
      << "," << std::setprecision(3) << r.roofline_fraction << "," << std::setprecision(2)
      << (r.roofline_bandwidth_gbs > 0 ? r.roofline_bandwidth_gbs : bandwidth_gbs) << ",";
    for (size_t i = 0; i < r.runs.size(); ++i)
      s << (i ? ";" : "") << std::setprecision(2) << r.runs[i];
    s << "," << r.adapters << "," << r.depth << "," << std::setprecision(0)
      << r.weight_bytes_per_token << "," << r.kv_bytes_per_token << "," << kv_dtype << ","
      << prefill_chunk << "\n";
  }
  return s.str();
}

std::string EngineBenchReport::ToJson() const {
  std::ostringstream s;
  s << std::fixed << std::setprecision(3);
  s << "{\"shape\":\"" << shape << "\",\"threads\":" << threads << ",\"isa\":\"" << isa
    << "\",\"kv_dtype\":\"" << kv_dtype << "\",\"prefill_chunk\":" << prefill_chunk
    << ",\"bandwidth_gbs\":" << bandwidth_gbs << ",\"vnni_gops\":" << vnni_gops << ",\"rows\":[";
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    s << (i ? "," : "") << "{\"isa\":\"" << (r.isa.empty() ? isa : r.isa) << "\",\"dtype\":\""
      << r.dtype << "\",\"metric\":\"" << r.metric << "\",\"batch\":" << r.batch
      << ",\"tokens_per_s\":" << r.tokens_per_s << ",\"roofline_fraction\":" << r.roofline_fraction
      << ",\"roofline_bandwidth_gbs\":" << r.roofline_bandwidth_gbs << ",\"depth\":" << r.depth
      << ",\"weight_bytes_per_token\":" << r.weight_bytes_per_token
      << ",\"kv_bytes_per_token\":" << r.kv_bytes_per_token << ",\"adapters\":" << r.adapters
      << ",\"ops_per_token\":" << r.ops_per_token << ",\"vnni_fraction\":" << r.vnni_fraction
      << ",\"vnni_gops\":" << r.vnni_gops << ",\"runs\":[";
    for (size_t j = 0; j < r.runs.size(); ++j) s << (j ? "," : "") << r.runs[j];
    s << "],\"roofline_bandwidth_runs\":[";  // per run, the probes around it (decode b=1)
    for (size_t j = 0; j < r.roofline_bandwidth_runs.size(); ++j)
      s << (j ? "," : "") << r.roofline_bandwidth_runs[j];
    s << "]}";
  }
  s << "]}\n";
  return s.str();
}

std::string EngineBenchReport::ToTable() const {
  std::ostringstream s;
  s << std::fixed << std::setprecision(1);
  s << "shape " << shape << ", " << threads << " threads, isa " << isa << ", KV cache " << kv_dtype
    << ", read bandwidth " << bandwidth_gbs << " GB/s (median)";
  if (vnni_gops > 0) s << ", int8 VNNI limit " << vnni_gops << " GOP/s (median)";
  s << ", prefill ";
  if (prefill_chunk > 0) {
    s << "in steps of " << prefill_chunk << " rows";
  } else {
    s << "in one step per prompt";
  }
  s << "\n";
  const bool by_isa = isa.find(',') != std::string::npos;
  if (by_isa) s << "isa     ";
  s << "dtype  metric       batch   depth   tok/s    roofline (weights + KV)\n";
  for (const auto& r : rows) {
    if (by_isa) s << std::left << std::setw(8) << r.isa;
    s << std::left << std::setw(7) << r.dtype << std::setw(13) << r.metric << std::setw(8)
      << r.batch << std::setw(8) << (r.metric == "prefill" ? 0 : r.depth) << std::setw(9)
      << r.tokens_per_s;
    if (r.metric == "prefill" && r.vnni_fraction > 0) {
      s << std::setprecision(1) << 100.0 * r.vnni_fraction << " % of the int8 VNNI limit (of "
        << r.vnni_gops << " GOP/s probed around each run, " << std::setprecision(2)
        << r.ops_per_token / 1e9 << " GOP/token) " << std::setprecision(1);
    }
    if (r.metric == "decode" && r.batch == 1 && r.roofline_bandwidth_gbs > 0) {
      s << std::setprecision(1) << 100.0 * r.roofline_fraction << " % (of "
        << r.roofline_bandwidth_gbs << " GB/s, probed around each run; "
        << (r.weight_bytes_per_token + r.kv_bytes_per_token) / 1e6 << " MB/token of which KV "
        << r.kv_bytes_per_token / 1e6 << ")";
    }
    if (r.metric == "prefill") {  // long prompts against the first (shortest) length
      for (const auto& first : rows) {
        if (first.dtype != r.dtype || first.metric != "prefill" || first.isa != r.isa) continue;
        if (&first != &r && first.tokens_per_s > 0) {
          s << std::setprecision(2) << r.tokens_per_s / first.tokens_per_s << " × prefill "
            << first.batch << std::setprecision(1);
        }
        break;
      }
    }
    if (r.metric == "identical" || r.metric == "skewed" || r.metric == "uniform" ||
        r.metric == "distinct") {
      for (const auto& ref : rows) {
        if (ref.isa == r.isa && ref.dtype == r.dtype && ref.batch == r.batch &&
            ref.tokens_per_s > 0 && (ref.metric == "base" || ref.metric == "identical")) {
          s << std::setprecision(1) << 100.0 * r.tokens_per_s / ref.tokens_per_s << " % of "
            << ref.metric << "  ";
        }
      }
      s << "(" << r.adapters << " adapters)";
    }
    if (r.metric == "decode-lora" || r.metric == "decode-mixed") {
      for (const auto& base : rows) {
        if (base.isa == r.isa && base.dtype == r.dtype && base.metric == "decode" &&
            base.batch == r.batch && base.tokens_per_s > 0) {
          s << std::setprecision(1) << 100.0 * r.tokens_per_s / base.tokens_per_s
            << " % of base-only";
          if (r.metric == "decode-mixed") s << " (" << r.adapters << ")";
        }
      }
    }
    s << "\n";
  }
  return s.str();
}

}  // namespace chorus::engine
