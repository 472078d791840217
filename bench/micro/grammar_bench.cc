// Constrained decoding cost (docs/structured_outputs.md, "Measured cost"):
//   * BM_MaskPerStep/<vocab>/<cache>: the allowed-token mask of one row for one step, over
//     decoding walks through every schema of tests/data/structured_output_schemas.json (each
//     walk draws random allowed tokens, EOS only once nothing else is allowed or after 150
//     steps); counters median_us and p99_us are per row per step. cache=1 is the matcher as
//     served (per-state mask cache on), cache=0 walks the vocabulary's prefix tree every step.
//     cpu_median_us / cpu_p99_us: the same from this thread's CPU clock (robust to a shared host;
//     the clock read itself costs ~0.3 µs). max_work: the most work units one mask took, against
//     Matcher::kMaxMaskWork.
//     Vocabularies: llama2 — the Llama-2 tokenizer (32 000 tokens, ../shared/models);
//     synth152k — a synthetic byte-level vocabulary of 151 936 tokens (no Qwen2 tokenizer is
//     available offline): the Llama-2 and GPT-2 vocabularies' bytes plus concatenations of
//     random pairs of their tokens (BPE-merge-shaped) up to that size.
//   * BM_CompileSchema/<cached>: compiling every schema of the set (per schema), cold and
//     through the grammar cache.
//   * BM_VocabularyBuild/<vocab>: the prefix tree (once per server).
//
//   ./grammar_bench --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <unordered_set>

#include "chorus/base/logging.h"
#include "chorus/formats/gguf.h"
#include "chorus/grammar/json_schema.h"
#include "chorus/grammar/matcher.h"
#include "chorus/tokenizer/tokenizer.h"

namespace chorus::grammar {
namespace {

using json = nlohmann::json;

std::string Models() { return std::string(CHORUS_SOURCE_DIR) + "/../shared/models"; }

json Schemas() {
  std::ifstream in(std::string(CHORUS_SOURCE_DIR) + "/tests/data/structured_output_schemas.json");
  CHORUS_CHECK(in.good()) << "missing tests/data/structured_output_schemas.json";
  return json::parse(in);
}

std::shared_ptr<const Vocabulary> Llama2() {
  static auto v = [] {
    auto t = tokenizer::LoadTokenizer(Models() + "/llama2-tokenizer/tokenizer.model");
    CHORUS_CHECK(t.ok()) << t.status().ToString();
    return Vocabulary::FromTokenizer(**t, (*t)->vocab_size());
  }();
  return v;
}

std::shared_ptr<const Vocabulary> Synth152k() {
  static auto v = [] {
    const auto& llama = *Llama2();
    auto g = formats::GgufFile::Open(Models() + "/ggml-vocab/ggml-vocab-gpt-2.gguf");
    CHORUS_CHECK(g.ok()) << g.status().ToString();
    auto gpt2 = tokenizer::TokenizerFromGguf(**g);
    CHORUS_CHECK(gpt2.ok()) << gpt2.status().ToString();
    std::vector<std::string> base;
    std::unordered_set<std::string> seen;
    auto add = [&](std::string s) {
      if (!s.empty() && seen.insert(s).second) base.push_back(std::move(s));
    };
    for (int i = 0; i < 256; ++i) add(std::string(1, static_cast<char>(i)));
    for (int32_t i = 0; i < llama.size(); ++i) add(llama.bytes(i));
    for (int32_t i = 0; i < (*gpt2)->vocab_size(); ++i) add((*gpt2)->TokenBytes(0, i, false));
    std::vector<std::string> all = base;
    std::mt19937_64 rng(152);
    std::uniform_int_distribution<size_t> pick(0, base.size() - 1);
    while (all.size() < 151936 - 1) {
      std::string s = base[pick(rng)] + base[pick(rng)];
      if (s.size() <= 24 && seen.insert(s).second) all.push_back(std::move(s));
    }
    all.push_back("");  // EOS
    const int32_t eos = static_cast<int32_t>(all.size() - 1);
    return Vocabulary::Create(std::move(all), {eos});
  }();
  return v;
}

std::shared_ptr<const Vocabulary> VocabArg(int64_t which) {
  return which == 0 ? Llama2() : Synth152k();
}

// This thread's CPU time (the figures on a shared host: wall time includes waiting for a core).
double ThreadCpuMicros() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e6 + static_cast<double>(ts.tv_nsec) * 1e-3;
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(p * static_cast<double>(v.size() - 1))];
}

void BM_MaskPerStep(benchmark::State& state) {
  auto vocab = VocabArg(state.range(0));
  const bool cache = state.range(1) != 0;
  const json schemas = Schemas();
  std::vector<Grammar> grammars;
  for (const auto& s : schemas) grammars.push_back(*CompileJsonSchema(s["schema"]));
  std::vector<double> micros, cpu_micros;  // wall clock; this thread's CPU time
  int64_t max_work = 0;                    // the most work units one mask took
  TokenMask mask;
  uint64_t seed = 1;
  for (auto _ : state) {
    for (const Grammar& g : grammars) {
      Matcher m(g, vocab);
      m.set_mask_cache(cache);
      std::mt19937_64 rng(seed++);
      for (int step = 0; step < 200 && !m.Done(); ++step) {
        const double c0 = ThreadCpuMicros();
        const auto t0 = std::chrono::steady_clock::now();
        m.FillMask(&mask);
        micros.push_back(
            std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
                .count());
        cpu_micros.push_back(ThreadCpuMicros() - c0);
        max_work = std::max(max_work, m.last_mask_work());
        std::vector<int32_t> allowed;
        for (int32_t i = 0; i < mask.size(); ++i) {
          if (mask.Test(i) && (!vocab->IsEos(i) || step >= 150)) allowed.push_back(i);
        }
        if (allowed.empty()) {
          for (int32_t e : vocab->eos_ids()) {
            if (mask.Test(e)) allowed.push_back(e);
          }
        }
        if (allowed.empty()) break;
        CHORUS_CHECK(m.Accept(allowed[rng() % allowed.size()]));
      }
    }
  }
  state.counters["median_us"] = Percentile(micros, 0.5);
  state.counters["p99_us"] = Percentile(micros, 0.99);
  state.counters["cpu_median_us"] = Percentile(cpu_micros, 0.5);
  state.counters["cpu_p99_us"] = Percentile(cpu_micros, 0.99);
  state.counters["steps"] = static_cast<double>(micros.size());
  state.counters["vocab"] = static_cast<double>(vocab->size());
  state.counters["max_work"] = static_cast<double>(max_work);  // vs Matcher::kMaxMaskWork
}
BENCHMARK(BM_MaskPerStep)
    ->ArgsProduct({{0, 1}, {1, 0}})
    ->ArgNames({"vocab152k", "cache"})
    ->Unit(benchmark::kMillisecond)
    ->Iterations(1);

// Hostile grammars (the work bounds of docs/structured_outputs.md, "Matcher"): a nullable
// item repeated 100 000 times, so a set holds a stack per copy and every transition passes
// every copy (fuzz_gbnf found its 4 115-copy form: 19 s for 24 tokens before the bounds);
// hostile=1 gives every printable character a class of its own, so the byte classes cannot
// share transitions. Counters as BM_MaskPerStep's, plus max_us and truncated (transitions cut).
void BM_HostileGrammarMask(benchmark::State& state) {
  auto vocab = VocabArg(state.range(0));
  std::string item;
  if (state.range(1) == 0) {
    item = "(\"ab\" | [^\\n\"ab{zN]? | [^&\"Vn])";
  } else {
    item = "(";
    for (int c = 0x21; c < 0x7F; ++c) {
      if (c == '\\' || c == ']' || c == '^' || c == '-') continue;
      item += std::string(c == 0x21 ? "[" : " | [") + static_cast<char>(c) + "]";
    }
    item += ")?";
  }
  auto g = CompileGbnf("root ::= " + item + "{100000} \"!\"");
  CHORUS_CHECK(g.ok()) << g.status().ToString();
  std::vector<double> micros;
  int64_t truncated = 0;
  TokenMask mask;
  uint64_t seed = 1;
  for (auto _ : state) {
    Matcher m(*g, vocab);
    std::mt19937_64 rng(seed++);
    for (int step = 0; step < 32 && !m.Done(); ++step) {
      const auto t0 = std::chrono::steady_clock::now();
      m.FillMask(&mask);
      micros.push_back(
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
      std::vector<int32_t> allowed;
      for (int32_t i = 0; i < mask.size(); ++i) {
        if (mask.Test(i) && !vocab->IsEos(i)) allowed.push_back(i);
      }
      if (allowed.empty()) break;
      CHORUS_CHECK(m.Accept(allowed[rng() % allowed.size()]));
    }
    truncated += m.truncated();
  }
  state.counters["median_us"] = Percentile(micros, 0.5);
  state.counters["p99_us"] = Percentile(micros, 0.99);
  state.counters["max_us"] = Percentile(micros, 1.0);
  state.counters["steps"] = static_cast<double>(micros.size());
  state.counters["truncated"] = static_cast<double>(truncated);
}
BENCHMARK(BM_HostileGrammarMask)
    ->ArgsProduct({{0, 1}, {0, 1}})
    ->ArgNames({"vocab152k", "hostile"})
    ->Unit(benchmark::kMillisecond)
    ->Iterations(2);

void BM_CompileSchema(benchmark::State& state) {
  const bool cached = state.range(0) != 0;
  const json schemas = Schemas();
  if (cached) {
    for (const auto& s : schemas) CHORUS_CHECK(CachedJsonSchema(s["schema"]).ok());
  }
  double total_us = 0;
  int64_t n = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    for (const auto& s : schemas) {
      auto g = cached ? CachedJsonSchema(s["schema"]) : CompileJsonSchema(s["schema"]);
      benchmark::DoNotOptimize(g);
    }
    total_us +=
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    n += static_cast<int64_t>(schemas.size());
  }
  state.counters["per_schema_us"] = total_us / static_cast<double>(n);
}
BENCHMARK(BM_CompileSchema)->Arg(0)->Arg(1)->ArgNames({"cached"})->Unit(benchmark::kMicrosecond);

void BM_VocabularyBuild(benchmark::State& state) {
  auto src = VocabArg(state.range(0));
  std::vector<std::string> bytes;
  for (int32_t i = 0; i < src->size(); ++i) bytes.push_back(src->bytes(i));
  for (auto _ : state) {
    auto v = Vocabulary::Create(bytes, src->eos_ids());
    benchmark::DoNotOptimize(v);
  }
  state.counters["trie_nodes"] = static_cast<double>(src->trie_nodes());
}
BENCHMARK(BM_VocabularyBuild)
    ->Arg(0)
    ->Arg(1)
    ->ArgNames({"vocab152k"})
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace chorus::grammar

BENCHMARK_MAIN();
