// Decode throughput with structured outputs (docs/structured_outputs.md, "Measured cost"):
// `rows` clients keep `rows` requests running on one in-process Engine over a synthetic model
// (closed loop: a client submits its next request as soon as its previous one finishes), once
// unconstrained and once with every request constrained by a JSON schema (client i's k-th request
// uses schema (i + k·rows) mod 62 of tests/data/structured_output_schemas.json, so the rows in
// flight have different schemas). Throughput = generated tokens between a warm-up mark and the
// target count ÷ that time. The two kinds alternate inside each repeat (same run, same load) and
// the ratio constrained / unconstrained is reported per repeat and as the median. Also reported:
// the mask worker's mean time per row-mask and the engine thread's mean wait for masks per step
// after the forward pass (the part on the critical path).
//
//   ./structured_decode_bench [--shape tinyllama-1.1b] [--dtype q4_0] [--rows 32]
//       [--tokens 48] [--repeats 3] [--threads 2]
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "chorus/base/logging.h"
#include "chorus/engine/engine.h"
#include "chorus/grammar/json_schema.h"
#include "chorus/model/synthetic.h"
#include "chorus/tokenizer/tokenizer.h"

namespace {

using namespace chorus;
using Clock = std::chrono::steady_clock;

struct Args {
  std::string shape = "tinyllama-1.1b";
  std::string dtype = "q4_0";
  int rows = 32;
  int tokens = 48;  // generated tokens per row (per client) measured
  int repeats = 3;
  int threads = 2;
};

double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

struct RunResult {
  double tokens_per_s = 0;
  double step_ms = 0;      // mean engine step (plan → forward → sample), from step_seconds
  double cpu_seconds = 0;  // process CPU time of the whole run (all threads)
  uint64_t masks = 0, mask_us = 0, wait_us = 0, steps = 0;
  int finished_stop = 0, finished_length = 0;
};

// Constrained runs record each answer's length in `lengths` [client][k]; unconstrained runs
// replay them (max_tokens = the recorded length, EOS ignored), so both runs have the same
// requests, the same prefills and the same output lengths — only the constraint differs.
RunResult Run(engine::Engine* e, const Args& a, const std::vector<grammar::Grammar>& grammars,
              bool constrained, uint64_t seed, std::vector<std::vector<int>>* lengths) {
  const auto& m = e->metrics();
  const auto steps_hist0 = m.step_seconds.Get();
  const double cpu0 = CpuSeconds();
  const uint64_t masks0 = m.grammar_masks_total, mask_us0 = m.grammar_mask_micros,
                 wait_us0 = m.grammar_mask_wait_micros, steps0 = m.steps_total;
  const int64_t target = int64_t{a.rows} * a.tokens;
  const int64_t warmup = int64_t{a.rows} * 4;
  std::atomic<int64_t> generated{0};
  std::atomic<int64_t> t_warm_ns{0}, t_end_ns{0};
  std::atomic<int> stops{0}, length_ends{0};
  const auto t0 = Clock::now();
  auto ns_since = [&] { return (Clock::now() - t0).count(); };
  std::vector<std::thread> clients;
  for (int c = 0; c < a.rows; ++c) {
    clients.emplace_back([&, c] {
      for (int k = 0; generated.load() < target; ++k) {
        engine::GenerationRequest r;
        r.prompt = {1, 450, 496, 354, 170, 299, 432, 172};  // ids valid in every vocabulary
        auto& mine = (*lengths)[static_cast<size_t>(c)];
        r.max_tokens = a.tokens;
        if (!constrained && static_cast<size_t>(k) < mine.size())
          r.max_tokens = mine[static_cast<size_t>(k)];
        r.sampling.temperature = 1.0f;
        r.sampling.seed = seed + static_cast<uint64_t>(c * 1000 + k);
        r.ignore_eos = !constrained;
        if (constrained)
          r.grammar = grammars[static_cast<size_t>(c + k * a.rows) % grammars.size()];
        auto h = e->Submit(r);
        CHORUS_CHECK(h.ok()) << h.status().ToString();
        int n_tokens = 0;
        for (;;) {
          auto ev = (*h)->Next(std::chrono::milliseconds(600000));
          CHORUS_CHECK(ev.has_value());
          if (ev->token >= 0) {
            ++n_tokens;
            const int64_t n = generated.fetch_add(1) + 1;
            if (n == warmup) t_warm_ns.store(ns_since());
            if (n == target) t_end_ns.store(ns_since());
          }
          if (ev->finish != engine::FinishReason::kNone) {
            CHORUS_CHECK(ev->finish != engine::FinishReason::kError) << ev->error;
            (ev->finish == engine::FinishReason::kStop ? stops : length_ends).fetch_add(1);
            if (constrained && static_cast<size_t>(k) >= mine.size()) mine.push_back(n_tokens);
            break;
          }
        }
      }
    });
  }
  for (auto& t : clients) t.join();
  RunResult r;
  r.tokens_per_s = static_cast<double>(target - warmup) /
                   (static_cast<double>(t_end_ns.load() - t_warm_ns.load()) * 1e-9);
  r.masks = m.grammar_masks_total - masks0;
  r.mask_us = m.grammar_mask_micros - mask_us0;
  r.wait_us = m.grammar_mask_wait_micros - wait_us0;
  r.steps = m.steps_total - steps0;
  const auto steps_hist1 = m.step_seconds.Get();
  r.step_ms = 1e3 * (steps_hist1.sum - steps_hist0.sum) /
              static_cast<double>(std::max<uint64_t>(1, steps_hist1.count - steps_hist0.count));
  r.cpu_seconds = CpuSeconds() - cpu0;
  r.finished_stop = stops.load();
  r.finished_length = length_ends.load();
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--shape")
      a.shape = v;
    else if (k == "--dtype")
      a.dtype = v;
    else if (k == "--rows")
      a.rows = std::stoi(v);
    else if (k == "--tokens")
      a.tokens = std::stoi(v);
    else if (k == "--repeats")
      a.repeats = std::stoi(v);
    else if (k == "--threads")
      a.threads = std::stoi(v);
    else {
      std::fprintf(stderr, "unknown flag %s\n", k.c_str());
      return 2;
    }
  }
  const std::string src = CHORUS_SOURCE_DIR;
  auto cfg = model::SyntheticConfig(a.shape);
  CHORUS_CHECK(cfg.ok()) << cfg.status().ToString();
  // The tokenizer the shape's vocabulary belongs to (Llama-2's 32 000 tokens, else the
  // stories260K tokenizer for 512-token shapes).
  const std::string tok_path = cfg->vocab_size == 32000
                                   ? src + "/../shared/models/llama2-tokenizer/tokenizer.model"
                                   : src + "/../shared/models/stories260K/tok512.bin";
  auto tok = tokenizer::LoadTokenizer(tok_path);
  CHORUS_CHECK(tok.ok()) << tok.status().ToString();
  auto dt = ParseDType(a.dtype);
  CHORUS_CHECK(dt.ok()) << dt.status().ToString();
  std::fprintf(stderr, "building synthetic %s (%s)...\n", a.shape.c_str(), a.dtype.c_str());
  auto model = model::MakeSyntheticModel({.shape = a.shape, .dtype = *dt, .seed = 1});
  CHORUS_CHECK(model.ok()) << model.status().ToString();

  std::ifstream in(src + "/tests/data/structured_output_schemas.json");
  const auto schemas = nlohmann::json::parse(in);
  std::vector<grammar::Grammar> grammars;
  for (const auto& s : schemas) grammars.push_back(*grammar::CompileJsonSchema(s["schema"]));

  engine::EngineOptions o;
  o.threads = a.threads;
  o.max_running = a.rows;
  o.max_batch_tokens = std::max(256, a.rows * 8);
  o.max_queue = a.rows * 4;
  o.pool_bytes = int64_t{1} << 30;
  o.prefix_cache = false;
  std::shared_ptr<const tokenizer::Tokenizer> shared_tok(std::move(*tok));
  auto e = engine::Engine::Create(*model, shared_tok, o);
  CHORUS_CHECK(e.ok()) << e.status().ToString();
  // The same engine configuration with the masks computed on the engine thread when sampling
  // (no overlap with the forward pass): what the mask worker buys.
  o.overlap_grammar_masks = false;
  auto e_inline = engine::Engine::Create(*model, shared_tok, o);
  CHORUS_CHECK(e_inline.ok()) << e_inline.status().ToString();

  std::printf("shape %s dtype %s rows %d tokens/row %d threads %d\n", a.shape.c_str(),
              a.dtype.c_str(), a.rows, a.tokens, a.threads);
  std::vector<double> ratios, step_ratios, cpu_ratios, inline_ratios;
  std::vector<std::vector<int>> lengths(static_cast<size_t>(a.rows));
  for (int rep = 0; rep < a.repeats; ++rep) {
    // Same seeds every repeat: a seeded row's tokens depend only on its logits (batch
    // invariance), so the constrained answers — and the lengths the unconstrained run replays —
    // are the same each time; the order of the two runs alternates between repeats.
    RunResult c, u, in;
    if (rep % 2 == 0) {
      c = Run(e->get(), a, grammars, true, 1, &lengths);
      u = Run(e->get(), a, grammars, false, 1, &lengths);
      in = Run(e_inline->get(), a, grammars, true, 1, &lengths);
    } else {
      in = Run(e_inline->get(), a, grammars, true, 1, &lengths);
      u = Run(e->get(), a, grammars, false, 1, &lengths);
      c = Run(e->get(), a, grammars, true, 1, &lengths);
    }
    inline_ratios.push_back(in.tokens_per_s / u.tokens_per_s);
    std::printf(
        "repeat %d: masks inline on the engine thread: %.2f tok/s (ratio %.3f), mean "
        "engine step %.3f ms\n",
        rep, in.tokens_per_s, inline_ratios.back(), in.step_ms);
    ratios.push_back(c.tokens_per_s / u.tokens_per_s);
    step_ratios.push_back(u.step_ms / c.step_ms);
    cpu_ratios.push_back(u.cpu_seconds / c.cpu_seconds);
    std::printf(
        "repeat %d: mean engine step %.3f ms unconstrained, %.3f ms constrained (ratio %.3f); "
        "process CPU %.2f s vs %.2f s (ratio %.3f)\n",
        rep, u.step_ms, c.step_ms, step_ratios.back(), u.cpu_seconds, c.cpu_seconds,
        cpu_ratios.back());
    std::printf(
        "repeat %d (%s first): unconstrained %.2f tok/s, constrained %.2f tok/s, ratio %.3f | "
        "masks %llu, "
        "mean %.1f us per row-mask on the worker, mean wait after forward %.1f us per step "
        "(%llu steps; unconstrained %llu), answers stop %d / length %d\n",
        rep, rep % 2 == 0 ? "constrained" : "unconstrained", u.tokens_per_s, c.tokens_per_s,
        ratios.back(), static_cast<unsigned long long>(c.masks),
        c.masks ? static_cast<double>(c.mask_us) / static_cast<double>(c.masks) : 0.0,
        c.steps ? static_cast<double>(c.wait_us) / static_cast<double>(c.steps) : 0.0,
        static_cast<unsigned long long>(c.steps), static_cast<unsigned long long>(u.steps),
        c.finished_stop, c.finished_length);
    std::fflush(stdout);
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  std::printf(
      "median ratio constrained / unconstrained: throughput %.3f (masks inline: %.3f), "
      "engine step time %.3f, CPU time %.3f (ratios > 1: constrained cheaper)\n",
      median(ratios), median(inline_ratios), median(step_ratios), median(cpu_ratios));
  return 0;
}
