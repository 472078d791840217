#include <cstdio>
#include <cstdlib>
#include <optional>
#include <sstream>

#include "apps/chorus/commands.h"
#include "apps/chorus/common.h"
#include "apps/chorus/tp_cli.h"
#include "chorus/base/mapped_file.h"
#include "chorus/engine/bench.h"
#include "chorus/engine/tp_bench.h"
#include "chorus/kernels/dispatch.h"
#include "chorus/memory/kv_cache.h"
#include "chorus/model/loader.h"
#include "chorus/model/synthetic.h"

namespace chorus::apps {
namespace {

template <typename T, typename F>
Status ParseList(const std::string& s, std::vector<T>* out, F parse) {
  out->clear();
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    auto v = parse(item);
    if (!v.ok()) return v.status();
    out->push_back(*v);
  }
  if (out->empty()) return InvalidArgumentError("empty list '" + s + "'");
  return OkStatus();
}

// "BITS:SPARSITY:GROUP" with SPARSITY "2:4" or "none" (so "4:2:4:64" or "1:none:0").
Status ParseDeltaLayout(const std::string& text, delta::RandomDeltaSpec* out) {
  auto bad = [&text] {
    return InvalidArgumentError("--delta-layout '" + text.substr(0, 32) +
                                "': expected BITS:SPARSITY:GROUP, e.g. 4:2:4:64 or 1:none:0");
  };
  const size_t first = text.find(':'), last = text.rfind(':');
  if (first == std::string::npos || first == last) return bad();
  const std::string bits = text.substr(0, first),
                    sparsity = text.substr(first + 1, last - first - 1),
                    group = text.substr(last + 1);
  char* end = nullptr;
  const long b = std::strtol(bits.c_str(), &end, 10);
  if (bits.empty() || *end || (b != 1 && b != 2 && b != 3 && b != 4 && b != 8)) return bad();
  const long g = std::strtol(group.c_str(), &end, 10);
  if (group.empty() || *end || g < 0 || g > 1 << 20) return bad();
  if (sparsity != "2:4" && sparsity != "none") return bad();
  if (sparsity == "2:4" && b == 1)
    return InvalidArgumentError("--delta-layout: 1-bit deltas are dense (sparsity none)");
  out->bits = static_cast<int>(b);
  out->sparse24 = sparsity == "2:4";
  out->group_size = g;
  return OkStatus();
}

// Prints a report's table and, with --out PREFIX, writes PREFIX.csv and PREFIX.json (the engine
// and the TP bench reports alike).
template <typename Report>
Status PrintAndWrite(const Flags& f, const Report& rep) {
  std::fputs(rep.ToTable().c_str(), stdout);
  if (f.GetString("out").empty()) return OkStatus();
  Status st = WriteFileAtomically(f.GetString("out") + ".csv", rep.ToCsv());
  if (!st.ok()) return st;
  return WriteFileAtomically(f.GetString("out") + ".json", rep.ToJson());
}

// `chorus bench --tp N` (docs/scaleout.md): decode tokens/s at each --batches size after
// --context tokens of KV, with the communication time per step, on --model or the synthetic
// --shape in the first of --dtypes. Every rank runs this; rank 0 measures and prints.
int TpBench(const Flags& f, const engine::EngineBenchOptions& o) {
  auto tp = StartTensorParallel(static_cast<int>(f.GetInt("tp")));
  if (!tp.ok()) return Fail("bench", tp.status());
  const model::QuantScheme& scheme = o.dtypes.front();
  Result<std::shared_ptr<const model::Model>> full = InternalError("unset");
  if (!o.model_path.empty()) {
    full = model::LoadModel(o.model_path);
  } else {
    model::SyntheticSpec spec{.shape = o.shape, .dtype = scheme.base(), .seed = 1};
    if (scheme.is_mix()) spec.mix = scheme;
    full = model::MakeSyntheticModel(spec);
  }
  if (Status s = AgreeAcrossRanks(tp->comm.get(), full.status()); !s.ok()) return Fail("bench", s);
  std::shared_ptr<const model::Model> mdl = std::move(full).value();
  const model::ModelConfig full_config = mdl->config();
  if (Status s = ShardForTensorParallel(&*tp, &mdl); !s.ok()) return Fail("bench", s);
  engine::TpBenchOptions to;
  to.threads = o.threads;
  to.batches = o.batches;
  to.context = o.depths.front();
  to.decode_steps = o.decode_steps;
  to.repeats = o.repeats;
  to.kv_dtype = o.kv_dtype;
  to.adapters = o.n_adapters;
  to.lora_ranks = o.lora_ranks;
  to.lora_storage = o.lora_storage;
  if (tp->worker()) {
    // The same adapters as rank 0 (the same seeds), this rank's part of each.
    std::unique_ptr<engine::TpBenchAdapters> loras;
    if (to.adapters > 0) {
      auto made = engine::TpBenchAdapters::Make(to, full_config, mdl->config(), tp->comm.get());
      if (!made.ok()) return Fail("bench", made.status());
      loras = std::move(made).value();
    }
    Status s = model::RunTpWorker(tp->comm.get(), mdl,
                                  loras ? model::TpHookForRows([&](std::span<const int32_t> slots) {
                                    return loras->ForRows(slots);
                                  })
                                        : model::TpHookForRows());
    return s.ok() ? 0 : Fail("bench", s);
  }
  std::fprintf(stderr, "bench: tensor parallel %d (%s), %d thread(s) per rank, shard: %s\n",
               tp->size(), tp->comm->kind(), o.threads, mdl->config().Summary().c_str());
  auto rep = engine::RunTpBench(
      to, full_config, mdl, tp->comm.get(), tp->leader.get(),
      [](const std::string& m) { std::fprintf(stderr, "bench: %s\n", m.c_str()); });
  if (!rep.ok()) return Fail("bench", rep.status());
  rep->model = o.model_path.empty() ? o.shape : o.model_path;
  rep->dtype = o.model_path.empty() ? scheme.name() : "file";
  if (Status st = PrintAndWrite(f, *rep); !st.ok()) return Fail("bench", st);
  return 0;
}

}  // namespace

int BenchCommand(int argc, char** argv) {
  Flags f("bench",
          "Engine benchmark on a synthetic model at a real shape, in one invocation: memory read\n"
          "bandwidth, prefill tokens/s per prompt length, decode tokens/s at batch 1 (and its\n"
          "fraction of the bandwidth roofline, weights + KV bytes) and aggregate decode tokens/s\n"
          "at larger batches, then batch-1 decode at each further --context depth, per dtype.\n"
          "Each figure is the median of --repeats runs. Writes <out>.csv and <out>.json.");
  f.String("shape", "tinyllama-1.1b", "synthetic model shape");
  f.String("model", "",
           "measure this model file (GGUF or HF directory) instead of synthetic weights; "
           "--shape and --dtypes are then ignored");
  f.String("dtypes", "q4_0,q8_0,bf16",
           "comma-separated weight dtypes or K-quant mixes (q4_k_m, q6_k, ...)");
  f.Int("threads", 2, "compute threads");
  f.String("prefill", "512,2048,4096", "comma-separated prompt lengths for the prefill figures");
  f.Int("prefill-chunk", 512,
        "rows per prefill step: a longer prompt runs in chunks of this many tokens, as chorus "
        "serve does with its default --max-batch-tokens and llama.cpp with its default "
        "n_ubatch (both 512); 0 = each prompt in one step");
  f.String("batches", "1,8,32", "comma-separated decode batch sizes");
  f.Int("decode-steps", 32, "timed decode steps per batch size");
  f.String("context", "128,4000",
           "comma-separated KV depths when decode is timed: --batches run at the first, batch 1 "
           "at each further one");
  f.Int("repeats", 3, "runs per figure (median reported)");
  f.Int("adapters", 0,
        "also run each decode batch with every row on a different LoRA (q,k,v,o) of this many "
        "(with --tp: round-robin, each rank holding its part of every adapter)");
  f.String("lora-ranks", "8,16,32,64", "ranks of those adapters, round-robin");
  f.Int("deltas", 0,
        "also run each decode batch with its rows split evenly over the base, this many "
        "compressed deltas (random codes in --delta-layout on every linear) and the --adapters "
        "LoRA adapters (metric decode-mixed)");
  f.String("delta-layout", "4:2:4:64",
           "BITS:SPARSITY:GROUP of those deltas: bits 1/2/3/4/8, sparsity 2:4 or none, group "
           "size (0 = one scale per matrix); e.g. 4:2:4:64 (deltazip's default), 1:none:0 "
           "(bitdelta)");
  f.String("workload", "default",
           "default: the figures above; punica: decode tokens/s at each --batches size (dtype = "
           "the first of\n"
           "--dtypes) for base-only and LoRA rows by popularity Identical / Skewed / Uniform / "
           "Distinct\n"
           "(docs/benchmarks.md), ranks round-robin over --lora-ranks; plot: tools/plot.py punica "
           "<out>.csv");
  f.String("lora-dtype", "bf16", "storage of those adapters' compute weights: bf16 or f32");
  f.String("kv-dtype", "bf16",
           "KV cache elements for every figure: bf16 or f32 (as chorus serve --kv-dtype); the "
           "decode roofline counts the KV bytes of this dtype");
  f.String("isa", "best",
           "highest kernel level to use: best, amx, avx512, avx2 or scalar (to measure the "
           "AVX-512 kernels on an AMX machine, or the AVX2 ones on an AVX-512 machine); "
           "best defers to CHORUS_ISA when set. A comma-separated list (amx,avx512) measures "
           "every figure at each level, alternating inside each repeat on the same model");
  f.String("delta-activations", "auto", kDeltaActivationsHelp);
  f.String("out", "", "write <out>.csv and <out>.json");
  f.Int("tp", 0,
        "tensor-parallel decode benchmark over N ranks instead (`mpirun -np N chorus bench --tp "
        "N`; --tp 1 is its one-process baseline): decode tok/s per --batches size after the "
        "first --context depth, first of --dtypes, with communication ms per step "
        "(docs/scaleout.md)");
  if (int rc = ParseOrExit(f, argc, argv); rc >= 0) return rc;
  engine::EngineBenchOptions o;
  o.shape = f.GetString("shape");
  o.model_path = f.GetString("model");
  o.threads = static_cast<int>(f.GetInt("threads"));
  o.decode_steps = f.GetInt("decode-steps");
  o.repeats = static_cast<int>(f.GetInt("repeats"));
  if (o.threads < 1 || o.decode_steps < 1 || o.repeats < 1) {
    return Fail("bench",
                InvalidArgumentError("--threads, --decode-steps and --repeats must be positive"));
  }
  auto tokens = [](const char* flag) {
    return [flag](const std::string& x) -> Result<int64_t> {
      char* end = nullptr;
      long long v = std::strtoll(x.c_str(), &end, 10);
      if (x.empty() || *end || v < 1 || v > (1 << 20))
        return InvalidArgumentError(std::string("bad ") + flag + " length '" + x.substr(0, 32) +
                                    "' (1 to 1048576 tokens)");
      return static_cast<int64_t>(v);
    };
  };
  Status s = ParseList(f.GetString("prefill"), &o.prefill_lengths, tokens("--prefill"));
  if (!s.ok()) return Fail("bench", s);
  o.prefill_chunk = f.GetInt("prefill-chunk");
  if (o.prefill_chunk < 0 || o.prefill_chunk > (1 << 20)) {
    return Fail("bench", InvalidArgumentError("--prefill-chunk must be in [0, 1048576] (0 = "
                                              "each prompt in one step)"));
  }
  s = ParseList(f.GetString("context"), &o.depths, tokens("--context"));
  if (!s.ok()) return Fail("bench", s);
  s = ParseList(f.GetString("dtypes"), &o.dtypes,
                [](const std::string& x) { return model::QuantScheme::Parse(x); });
  if (!s.ok()) return Fail("bench", s);
  s = ParseList(f.GetString("batches"), &o.batches, [](const std::string& x) -> Result<int64_t> {
    char* end = nullptr;
    long long v = std::strtoll(x.c_str(), &end, 10);
    if (x.empty() || *end || v < 1 || v > 512)
      return InvalidArgumentError("bad batch size '" + x + "'");
    return static_cast<int64_t>(v);
  });
  if (!s.ok()) return Fail("bench", s);
  o.n_adapters = f.GetInt("adapters");
  if (o.n_adapters < 0 || o.n_adapters > 4096)
    return Fail("bench", InvalidArgumentError("--adapters must be in [0, 4096]"));
  s = ParseList(f.GetString("lora-ranks"), &o.lora_ranks,
                [](const std::string& x) -> Result<int64_t> {
                  char* end = nullptr;
                  long long v = std::strtoll(x.c_str(), &end, 10);
                  if (x.empty() || *end || v < 1 || v > 256)
                    return InvalidArgumentError("bad LoRA rank '" + x + "'");
                  return static_cast<int64_t>(v);
                });
  if (!s.ok()) return Fail("bench", s);
  o.n_deltas = f.GetInt("deltas");
  if (o.n_deltas < 0 || o.n_deltas > 64)
    return Fail("bench", InvalidArgumentError("--deltas must be in [0, 64]"));
  if (Status sl = ParseDeltaLayout(f.GetString("delta-layout"), &o.delta_layout); !sl.ok())
    return Fail("bench", sl);
  o.workload = f.GetString("workload");
  if (o.workload != "default" && o.workload != "punica") {
    return Fail("bench", InvalidArgumentError("--workload must be default or punica"));
  }
  if (auto kv_dtype = memory::ParseKvDtype(f.GetString("kv-dtype")); kv_dtype.ok()) {
    o.kv_dtype = *kv_dtype;
  } else {
    return Fail("bench", kv_dtype.status().WithContext("flag --kv-dtype"));
  }
  if (f.GetString("lora-dtype") == "f32") {
    o.lora_storage = adapters::LoraStorage::kF32;
  } else if (f.GetString("lora-dtype") != "bf16") {
    return Fail("bench", InvalidArgumentError("--lora-dtype must be bf16 or f32"));
  }
  if (const std::string isa = f.GetString("isa"); isa.find(',') != std::string::npos) {
    s = ParseList(isa, &o.isas, [](const std::string& x) -> Result<kernels::IsaLevel> {
      const std::optional<kernels::IsaLevel> l = kernels::ParseIsaLevel(x);
      if (!l) return InvalidArgumentError("--isa: unknown kernel level '" + x.substr(0, 32) + "'");
      return *l;
    });
    if (!s.ok()) return Fail("bench", s);
    if (o.workload != "default")
      return Fail("bench",
                  InvalidArgumentError("--isa with several levels needs --workload default"));
  } else if (Status si = ApplyIsaFlag(f); !si.ok()) {
    return Fail("bench", si);
  }
  if (Status sd = ApplyDeltaActivationsFlag(f); !sd.ok()) return Fail("bench", sd);
  if (o.isas.empty()) {
    std::fprintf(stderr, "bench: %s\n", IsaLine().c_str());
  } else {
    std::fprintf(stderr, "bench: kernels: isa %s alternating (cpu: %s)\n",
                 f.GetString("isa").c_str(), kernels::CpuFeaturesString().c_str());
  }
  if (f.GetInt("tp") > 0) {
    if (o.n_deltas > 0 || o.workload != "default" || !o.isas.empty()) {
      return Fail("bench", InvalidArgumentError(
                               "--tp measures decode of the base and of --adapters only: no "
                               "--deltas, --workload or several --isa levels (docs/scaleout.md)"));
    }
    return TpBench(f, o);
  }
  auto rep = engine::RunEngineBench(
      o, [](const std::string& msg) { std::fprintf(stderr, "bench: %s\n", msg.c_str()); });
  if (!rep.ok()) return Fail("bench", rep.status());
  if (Status st = PrintAndWrite(f, *rep); !st.ok()) return Fail("bench", st);
  if (!f.GetString("out").empty()) {
    if (o.workload == "punica") {
      std::fprintf(stderr, "bench: plot it with tools/plot.py punica %s.csv\n",
                   f.GetString("out").c_str());
    }
  }
  return 0;
}

}  // namespace chorus::apps
