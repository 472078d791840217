// chorus serve: the OpenAI-compatible HTTP server (docs/api.md).
#include <malloc.h>
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

#include "apps/chorus/commands.h"
#include "apps/chorus/common.h"
#include "apps/chorus/default_model.h"
#include "apps/chorus/tp_cli.h"
#include "chorus/adapters/adapter_cache.h"
#include "chorus/adapters/delta/delta_file.h"
#include "chorus/adapters/registry.h"
#include "chorus/adapters/tp_variants.h"
#include "chorus/engine/engine.h"
#include "chorus/engine/profile.h"
#include "chorus/memory/kv_cache.h"
#include "chorus/model/forward.h"
#include "chorus/server/finetune_routes.h"
#include "chorus/server/server.h"
#include "chorus/server/template_routes.h"

namespace chorus::apps {

namespace {

// A directory flag's value must exist before anything is bound or loaded, and the message names
// the flag and the path as the user gave it.
Status CheckDirectoryFlag(const char* flag, const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec))
    return InvalidArgumentError(std::string("flag --") + flag + ": " + path +
                                ": no such directory");
  if (!std::filesystem::is_directory(path, ec))
    return InvalidArgumentError(std::string("flag --") + flag + ": " + path + ": not a directory");
  return OkStatus();
}

// The adapter flags' paths, checked before the port is bound or the model loaded, so that a typo
// fails in milliseconds whatever the model's size.
Status CheckAdapterFlags(const Flags& f) {
  for (const std::string& r : f.GetRepeated("adapter-root"))
    CHORUS_RETURN_IF_ERROR(CheckDirectoryFlag("adapter-root", r));
  for (const std::string& d : f.GetRepeated("lora-dir"))
    CHORUS_RETURN_IF_ERROR(CheckDirectoryFlag("lora-dir", d));
  for (const std::string& d : f.GetRepeated("lora-resolve-dir"))
    CHORUS_RETURN_IF_ERROR(CheckDirectoryFlag("lora-resolve-dir", d));
  for (const char* flag : {"lora", "delta"}) {
    for (const std::string& spec : f.GetRepeated(flag)) {
      const size_t eq = spec.find('=');
      if (eq == std::string::npos || eq == 0 || eq + 1 == spec.size()) {
        return InvalidArgumentError(std::string("flag --") + flag + " expects NAME=PATH, got '" +
                                    spec.substr(0, 64) + "'");
      }
      std::error_code ec;
      if (!std::filesystem::exists(spec.substr(eq + 1), ec)) {
        return InvalidArgumentError(std::string("flag --") + flag + " " + spec.substr(0, eq) +
                                    ": " + spec.substr(eq + 1) + ": no such file or directory");
      }
    }
  }
  return OkStatus();
}

// MemAvailable from /proc/meminfo (bytes), or 0 when unknown.
int64_t MemAvailableBytes() {
  std::FILE* fp = std::fopen("/proc/meminfo", "r");
  if (fp == nullptr) return 0;
  char line[256];
  long long kib = 0;
  while (std::fgets(line, sizeof(line), fp)) {
    if (std::sscanf(line, "MemAvailable: %lld kB", &kib) == 1) break;
  }
  std::fclose(fp);
  return static_cast<int64_t>(kib) << 10;
}

// Sizes chosen when --pool-size / --host-cache-size are not given (0): like vLLM's KV cache
// from a memory fraction, but no larger than what the configuration can use. Memory is only
// reserved (virtual) unless --prefault; pages become resident as KV blocks and adapter copies
// first use them.
struct MemoryPlan {
  int64_t pool_bytes = 0;
  int64_t host_cache_bytes = 0;
  std::string pool_reason;
};

MemoryPlan PlanMemory(const Flags& f, const model::ModelConfig& c, int64_t max_running,
                      int64_t max_batch_tokens, bool adapters, kernels::KvDtype kv_dtype) {
  constexpr int64_t kMiB = int64_t{1} << 20;
  MemoryPlan plan;
  const int64_t available = MemAvailableBytes();
  // Half of what is available for the pool, a quarter for decoded adapters in host memory.
  const int64_t pool_cap = available > 0 ? available / 2 : int64_t{4} << 30;
  const int64_t host_cap = available > 0 ? available / 4 : int64_t{2} << 30;
  if (int64_t mib = f.GetInt("pool-size"); mib > 0) {
    plan.pool_bytes = mib * kMiB;
    plan.pool_reason = "--pool-size";
  } else {
    // Pages of one full context: layers with a sliding window keep only theirs
    // (memory/kv_cache.h, layer groups).
    const memory::KvLayout layout = model::KvLayoutFor(c, 16, kv_dtype);
    const int64_t blocks_per_seq = layout.Groups().PagesFor(c.max_seq_len, max_batch_tokens, 16);
    int64_t want = max_running * blocks_per_seq * layout.PageBytes();
    // Adapter copies share the pool's pages (unified paging): leave them room beside a full
    // batch of KV.
    if (adapters) want += std::max<int64_t>(want / 4, int64_t{256} * kMiB);
    const int64_t floor = (blocks_per_seq + 1) * layout.PageBytes();  // one full context
    plan.pool_bytes = std::max(floor, std::min(want, pool_cap));
    plan.pool_bytes = (plan.pool_bytes + kMiB - 1) / kMiB * kMiB;
    plan.pool_reason = "auto: " + std::to_string(max_running) + " sequences x " +
                       std::to_string(c.max_seq_len) + " tokens of KV" +
                       (adapters ? " + adapter room" : "") +
                       (want > pool_cap ? ", capped at half of MemAvailable" : "");
  }
  if (int64_t mib = f.GetInt("host-cache-size"); mib > 0) {
    plan.host_cache_bytes = mib * kMiB;
  } else {
    plan.host_cache_bytes = std::min<int64_t>(int64_t{2} << 30, host_cap);
  }
  return plan;
}

struct ServedAdapters {
  std::shared_ptr<adapters::AdapterRegistry> registry;
  std::shared_ptr<adapters::AdapterCache> cache;
  std::string finetune_dir;  // empty: no fine-tuning API
};

// Fine-tuning (docs/finetuning.md, "Training while serving") is on with --finetune-dir or an
// explicit --registry state file, unless --no-finetune: its state lives in --finetune-dir, by
// default in `<registry file without .json>.finetune/` beside the registry's state file — named
// after that file, so that two servers keeping registries in one directory never share (and lock
// each other out of) a fine-tuning state directory.
// Under --tp the API is off (training under tensor parallelism is not built; an explicit
// --finetune-dir is refused at start).
bool WantsFinetune(const Flags& f) {
  return !f.GetBool("no-finetune") && f.GetInt("tp") <= 1 &&
         (!f.GetString("finetune-dir").empty() || !f.GetString("registry").empty());
}

// Adapters or deltas may be served (named on the command line, or a registry to load them into).
bool ServesAdapters(const Flags& f) {
  return !f.GetRepeated("lora").empty() || !f.GetRepeated("delta").empty() ||
         !f.GetRepeated("lora-dir").empty() || !f.GetRepeated("adapter-root").empty() ||
         !f.GetRepeated("lora-resolve-dir").empty() || !f.GetString("registry").empty() ||
         WantsFinetune(f);
}

// --max-lora-rank and --lora-dtype: how every rank builds its adapter copies.
Result<adapters::LoraLimits> LoraLimitsFromFlags(const Flags& f) {
  adapters::LoraLimits limits;
  limits.max_rank = f.GetInt("max-lora-rank");
  const std::string dtype = f.GetString("lora-dtype");
  if (dtype != "bf16" && dtype != "f32")
    return InvalidArgumentError("flag --lora-dtype must be bf16 or f32");
  limits.storage = dtype == "f32" ? adapters::LoraStorage::kF32 : adapters::LoraStorage::kBF16;
  return limits;
}

// The registry (persisted across restarts) plus the adapters named on the command line. The
// directories of --lora and --lora-dir paths are adapter roots too: the operator named them.
// `base` is the whole model's config; under --tp the cache holds this rank's shards (`shard`).
Result<ServedAdapters> OpenAdapters(const Flags& f, const model::ModelConfig& base,
                                    const std::string& base_name, int64_t host_cache_bytes,
                                    const std::string& base_weights_hash,
                                    adapters::TensorParallelShard shard) {
  ServedAdapters out;
  std::vector<std::string> roots = f.GetRepeated("adapter-root");
  std::vector<std::pair<std::string, std::string>> loras;
  std::vector<std::string> specs = f.GetRepeated("lora");
  for (const std::string& d : f.GetRepeated("delta")) specs.push_back(d);  // same form, kind read
  for (const std::string& spec : specs) {
    size_t eq = spec.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == spec.size()) {
      return InvalidArgumentError("flag --lora expects NAME=PATH, got '" + spec.substr(0, 64) +
                                  "'");
    }
    std::error_code ec;
    // The registry resolves relative paths against its roots; a command-line path is relative
    // to the working directory.
    std::string abs = std::filesystem::absolute(spec.substr(eq + 1), ec).string();
    loras.emplace_back(spec.substr(0, eq), ec ? spec.substr(eq + 1) : abs);
    std::filesystem::path p(loras.back().second);
    roots.push_back(p.has_parent_path() ? p.parent_path().string() : ".");
  }
  for (const std::string& d : f.GetRepeated("lora-dir")) roots.push_back(d);
  for (const std::string& d : f.GetRepeated("lora-resolve-dir")) roots.push_back(d);
  if (roots.empty() && f.GetString("registry").empty() && !WantsFinetune(f))
    return out;  // base model only
  std::string state = f.GetString("registry");
  if (state.empty()) {
    CHORUS_ASSIGN_OR_RETURN(std::string dir, CacheDirectory());
    state = dir + "/adapters-registry.json";
  }
  if (WantsFinetune(f)) {
    out.finetune_dir = f.GetString("finetune-dir");
    if (out.finetune_dir.empty()) {
      const std::filesystem::path sp = std::filesystem::absolute(state);
      out.finetune_dir = (sp.parent_path() / (sp.stem().string() + ".finetune")).string();
    }
    // Finished jobs register their adapters from here.
    const std::string jobs_root = server::FinetuneApi::AdapterRoot(out.finetune_dir);
    std::error_code ec;
    std::filesystem::create_directories(jobs_root, ec);
    if (ec) {
      return InternalError("cannot create " + jobs_root + ": " + ec.message())
          .WithContext("flag --finetune-dir");
    }
    roots.push_back(jobs_root);
  }
  adapters::RegistryOptions ro;
  ro.adapter_roots = roots;
  ro.max_lora_rank = f.GetInt("max-lora-rank");
  ro.base = base;
  ro.base_model_name = base_name;
  ro.base_weights_hash = base_weights_hash;
  ro.recover_corrupt_state = f.GetBool("recover-corrupt-state");
  auto reg = adapters::AdapterRegistry::Open(state, ro);
  if (!reg.ok() && reg.status().code() == StatusCode::kDataLoss) {
    return Status(reg.status().code(),
                  reg.status().message() +
                      "; the file is left as it is: restore it from a backup, or start with "
                      "--recover-corrupt-state to move it aside and start with an empty registry")
        .WithContext("flag --registry " + state);
  }
  if (!reg.ok()) return reg.status().WithContext("flag --registry " + state);
  out.registry = std::move(*reg);
  for (const auto& [name, path] : loras) {
    auto info = out.registry->Register(name, path, /*replace=*/true);
    if (!info.ok()) return info.status().WithContext("flag --lora/--delta " + name);
  }
  for (const std::string& d : f.GetRepeated("lora-dir")) {
    auto results = out.registry->RegisterDirectory(d, /*replace=*/true);
    if (!results.ok()) return results.status().WithContext("flag --lora-dir " + d);
    for (const auto& r : *results) {
      if (!r.status.ok())
        std::fprintf(stderr, "chorus serve: skipping %s: %s\n", r.path.c_str(),
                     r.status.message().c_str());
    }
  }
  {
    CHORUS_ASSIGN_OR_RETURN(adapters::LoraLimits limits, LoraLimitsFromFlags(f));
    out.cache = std::make_shared<adapters::AdapterCache>(base, host_cache_bytes, limits,
                                                         base_weights_hash, shard);
  }
  std::fprintf(stderr,
               "chorus serve: %zu adapters registered (%s); host adapter cache %lld MiB%s\n",
               out.registry->size(), state.c_str(), static_cast<long long>(host_cache_bytes >> 20),
               f.GetInt("host-cache-size") > 0 ? "" : " (auto)");
  return out;
}

// SIGHUP: the tenants file again. A bad file keeps the tenants in force and says why.
void ReloadTenants(const server::ServerOptions& so) {
  if (!so.tenants) {
    std::fprintf(stderr, "chorus serve: SIGHUP: no --tenants to reload\n");
    return;
  }
  if (Status s = so.tenants->Reload(); !s.ok()) {
    std::fprintf(stderr, "chorus serve: SIGHUP: kept the tenants in force: %s\n",
                 s.ToString().c_str());
  } else {
    std::fprintf(stderr, "chorus serve: SIGHUP: reloaded %s\n", so.tenants->path().c_str());
  }
}

// A long-running server's resident memory must stay flat (docs/hardening.md, "What the soak
// found"). glibc gives each thread that allocates while the others hold their arenas a new arena,
// up to 8 per core; a connection thread started at a rare concurrency peak then grows a heap of
// its own, mostly free afterwards in pieces smaller than a page that are never returned. Two
// arenas bound that growth. The connection threads' allocations are small and brief (parsing,
// formatting), so sharing two arena locks among them rarely makes one wait; the engine's large
// buffers are allocated once. MALLOC_ARENA_MAX, when set, wins.
void LimitMallocArenas() {
  if (std::getenv("MALLOC_ARENA_MAX") == nullptr) mallopt(M_ARENA_MAX, 2);
}

}  // namespace

int ServeCommand(int argc, char** argv) {
  Flags f(
      "serve",
      "Serves the model over an OpenAI-compatible HTTP API: /v1/completions, /v1/chat/completions\n"
      "(streaming with \"stream\": true), /v1/models, /health, /metrics. See docs/api.md.\n"
      "SIGTERM/SIGINT: stop accepting, let running requests finish for --drain-timeout, exit 0.");
  f.String(
      "model", "",
      "model: GGUF file, Hugging Face directory or llama2.c .bin (default: embedded tiny model)");
  f.String("tokenizer", "", "tokenizer file or directory; overrides the model's own");
  f.String("host", "127.0.0.1", "address to listen on");
  f.Int("port", 8000, "port to listen on (0 = any free port; the URL is printed)");
  f.String("served-model-name", "",
           "the model name clients use (default: the --model argument, or chorus-default)");
  f.String("api-key", "", "require \"Authorization: Bearer KEY\" on every route but /health");
  f.String("tenants", "",
           "tenants file (JSON: {\"tenants\": {\"NAME\": {\"keys\": [...], \"max_concurrent\": N, "
           "\"tokens_per_second\": X}}}): every route but /health needs a tenant's key; adapters "
           "loaded through the API belong to their tenant; reloaded on SIGHUP");
  f.String("allowed-origins", "*",
           "origins browsers may call from (CORS), comma-separated: * = any, \"\" = no CORS "
           "headers");
  f.Int("pool-size", 0,
        "paged pool (KV blocks + resident adapters) in MiB; 0 = sized from the model: KV for "
        "--max-running full contexts (+ adapter room), at most half of MemAvailable");
  f.Int("threads", 0, "compute threads (0 = all cores)");
  f.String("kv-dtype", "bf16",
           "KV cache elements: bf16 (values rounded to nearest even when written: half the pool "
           "per token and half the KV bytes a long-context decode step reads of f32), or f32");
  f.String("isa", "best",
           "highest kernel level: best, amx, avx512, avx2 or scalar (best defers to CHORUS_ISA "
           "when set)");
  f.String("delta-activations", "auto", kDeltaActivationsHelp);
  f.Int("max-running", 64, "sequences in the running batch");
  f.Int("max-prompt-logprob-rows", 64,
        "prompt rows per step whose logits are kept for prompt logprobs (echo with logprobs, "
        "prompt_logprobs): such a prompt is prefilled in chunks of this many rows; the logits "
        "buffer holds this many rows × the vocabulary beyond --max-running");
  f.Int("max-batch-tokens", 512, "tokens (rows) per engine step: decode rows + prefill chunks");
  f.Int("max-queue", 256, "waiting requests before answering 429");
  f.Int("max-body-bytes", 8 << 20, "largest request body accepted (larger: 413)");
  f.Int("metrics-top-adapters", 16,
        "adapters named in /metrics (most requests); the rest are summed as (other)");
  f.Int("max-connections", 512, "HTTP connections served at once (one thread each)");
  f.Repeated("lora", "serve an adapter as a variant: NAME=PATH (PEFT directory or GGUF LoRA)");
  f.Repeated(
      "delta",
      "serve a full fine-tune compressed by chorus compress as a variant: NAME=PATH (a delta "
      "file or directory, docs/deltas.md); it shares steps with LoRA adapters and the base");
  f.Bool("swap-full-models",
         "baseline for deltas (docs/deltas.md, \"Swapping full models\"): serve each --full-model "
         "as a whole model of its own, swapped in from disk when a request needs it (vLLM-SCB)");
  f.Repeated("full-model",
             "with --swap-full-models: a fine-tune served as a whole model, NAME=PATH (GGUF, "
             "Hugging Face directory or llama2.c; the base's architecture and shapes)");
  f.Int("max-resident-models", 1,
        "with --swap-full-models: whole fine-tunes in memory at a time (besides the base); the "
        "least recently used one without running requests is swapped out for another");
  f.Repeated("lora-dir", "register every adapter directly under DIR (named after its folder/file)");
  f.Repeated("lora-resolve-dir",
             "serve adapters added to DIR after start: a request whose model names no "
             "registered variant NAME registers DIR/NAME (a PEFT directory or a delta) or "
             "DIR/NAME.gguf on first use, as vLLM's filesystem LoRA resolver (repeatable)");
  f.Repeated("adapter-root", "directory POST /v1/load_lora_adapter may load adapters from");
  f.String("registry", "",
           "adapter registry state file (default: <cache dir>/adapters-registry.json)");
  f.Bool(
      "recover-corrupt-state",
      "if the --registry state file (or the fine-tuning API's files.json / jobs.json) is corrupt, "
      "move it aside to <file>.corrupt-<time> and start with it empty (default: refuse to start, "
      "leaving the file as it is)");

  f.String("finetune-dir", "",
           "state directory of the fine-tuning API (/v1/files, /v1/fine_tuning/jobs: uploaded "
           "files, jobs, their adapters); default: <registry>.finetune/ beside the --registry "
           "file (registry.json -> registry.finetune/)");
  f.Bool("no-finetune", "no fine-tuning API even when an adapter registry is kept");
  f.String("finetune-policy", "deferred",
           "when fine-tuning iterations run between inference steps: deferred (a waiting "
           "request is deferred while it can still wait for an iteration within its deferral "
           "bound, and the deferred requests are then served together; FineInfer) or "
           "immediate (only when no request waits or runs)");
  f.Float("deferral-bound", 500,
          "default deferral bound of inference requests under --finetune-policy deferred (ms; a "
          "request with a TTFT SLO uses its SLO)");
  f.Int("host-cache-size", 0,
        "MiB of decoded adapters and deltas kept in host memory (LRU); 0 = min(2048, "
        "MemAvailable / 4)");
  f.Int("max-lora-rank", 256, "largest LoRA rank accepted");
  f.String(
      "lora-dtype", "bf16",
      "adapter compute weights in memory: bf16 (rounded once at load, half the traffic) or f32");
  f.Int("max-adapters-per-step", 0, "distinct adapters in one engine step (0 = unlimited)");
  f.Int("max-deltas", 0,
        "distinct deltas in one engine step (DeltaZip's N-delta rule; requests for deltas in the "
        "step skip the line; 0 = unlimited)");
  f.String("policy", "fcfs",
           "admission policy: fcfs, cluster (at most --max-adapters-per-step adapters per step "
           "unless under-filled) or slo (cost-model admission, early abort; docs/scheduling.md)");
  f.String("cost-model", "",
           "step cost model for --policy slo, written by chorus profile (default: profile "
           "briefly at start)");
  f.Bool("no-cost-correction",
         "--policy slo: predict steps with the cost model as profiled, instead of scaling it by "
         "how long the server's steps actually take (chorus_slo_cost_correction)");
  f.String("slo-mode", "strict",
           "--policy slo: strict (a request that would miss its TTFT SLO gets 429 at once) or "
           "best-effort (served late, counted as missed)");
  f.Float("ttft-slo-ms", 0,
          "default SLO on time to first token of requests without ttft_slo_ms (ms; 0 = none)");
  f.Float("tpot-slo-ms", 0,
          "default SLO on mean time per output token of requests without tpot_slo_ms (ms; 0 = "
          "none)");
  f.Int("loader-threads", 2, "threads loading adapters (disk -> host, host -> pool pages)");
  f.Bool("no-adapter-pool",
         "serve adapters and deltas from host memory only (no copies in pool pages)");
  f.Bool("prefault",
         "make the pool and the host adapter cache resident at start (no page faults on first "
         "use; costs their full size in resident memory from the start)");
  f.Bool("no-prefix-cache",
         "do not keep computed KV blocks for reuse by later requests with the same prefix "
         "(prompt caching; keyed by variant, outputs are the same either way)");
  f.Bool("reuse-port",
         "let several servers listen on --port (SO_REUSEPORT; off: a bound port "
         "is an error)");
  f.String("chat-template", "",
           "chat template for /v1/chat/completions, a Jinja FILE or the template STRING itself; "
           "replaces the model's own (which must otherwise compile)");
  f.String("tool-call-parser", "auto",
           "how tool calls are read from replies: hermes, llama3_json, mistral, generic, or auto "
           "(detected from the chat template; docs/api.md, Tools)");
  f.String("pooling", "auto",
           "how /v1/embeddings pools a prompt's final hidden states: last (the last token's, as "
           "vLLM for decoder models), mean, cls (the first token's), or auto (the model's own, "
           "as an embedding model's GGUF or sentence-transformers files declare it, else last); "
           "docs/api.md, Embeddings");
  f.Float("drain-timeout", 30.0,
          "seconds running requests get to finish on SIGTERM before they are aborted");
  f.Int("tp", 1,
        "tensor-parallel ranks: `mpirun -np N chorus serve --tp N ...`; rank 0 serves HTTP and "
        "schedules, the others compute their shards (the base model, LoRA adapters and deltas; "
        "no fine-tuning yet; docs/scaleout.md)");
  if (int rc = ParseOrExit(f, argc, argv); rc >= 0) return rc;
  LimitMallocArenas();

  // Signals are taken synchronously by this thread (sigwait); every thread created from here
  // on inherits the mask. A peer that closes its socket must not kill the process.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGHUP);  // reloads --tenants (ignored without it)
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);

  const std::string model_path = f.GetString("model");
  // Tensor parallelism: started after the signal mask so MPI's own threads inherit it. Ranks > 0
  // load and shard the model, then compute every step rank 0 plans until it stops.
  auto tp = StartTensorParallel(static_cast<int>(f.GetInt("tp")));
  if (!tp.ok()) return Fail("serve", tp.status());
  if (tp->size() > 1) {
    if (!f.GetString("finetune-dir").empty()) {
      return Fail("serve",
                  InvalidArgumentError("--tp > 1 serves the base model, LoRA adapters and deltas: "
                                       "fine-tuning (--finetune-dir) is not supported under tensor "
                                       "parallelism yet (docs/scaleout.md)"));
    }
    if (tp->worker()) {
      // Every rank parses the same flags; rank 0 reports a bad one and stops every rank. The
      // kernel choices must match rank 0's: a worker computes its shard of every step.
      (void)ApplyIsaFlag(f);
      (void)ApplyDeltaActivationsFlag(f);
      adapters::LoraLimits limits;
      if (auto l = LoraLimitsFromFlags(f); l.ok()) limits = *l;
      auto loaded = LoadModelAndTokenizer(model_path, f.GetString("tokenizer"));
      if (Status s = AgreeAcrossRanks(tp->comm.get(), loaded.status()); !s.ok())
        return Fail("serve", s);
      const model::ModelConfig full = loaded->model->config();
      // Deltas are checked against the whole base's weights, as on rank 0.
      const std::string base_hash =
          ServesAdapters(f) ? delta::BaseWeightsHash(*loaded->model) : std::string();
      if (Status s = ShardForTensorParallel(&*tp, &loaded->model); !s.ok()) return Fail("serve", s);
      // Variants: rank 0 defines each one's slot before its first use; this rank loads its
      // shard of the same file (adapters/tp_variants.h).
      adapters::TpVariantWorker variants(full, tp->comm.get(), f.GetInt("max-batch-tokens"),
                                         {.limits = limits}, base_hash);
      Status s = model::RunTpWorker(
          tp->comm.get(), loaded->model,
          [&](std::span<const int32_t> slots) { return variants.ForRows(slots); },
          [&](int32_t slot, std::string_view d) { return variants.Define(slot, d); },
          [&](std::string_view d) { variants.Prefetch(d); });
      return s.ok() ? 0 : Fail("serve", s);
    }
  }
  server::ServerOptions so;
  so.host = f.GetString("host");
  so.port = static_cast<int>(f.GetInt("port"));
  so.api_key = f.GetString("api-key");
  if (const std::string tenants = f.GetString("tenants"); !tenants.empty()) {
    if (!so.api_key.empty()) {
      return Fail("serve",
                  InvalidArgumentError("flags --api-key and --tenants exclude each other "
                                       "(with --tenants, the tenants' keys are the keys)"));
    }
    auto t = server::Tenants::Load(tenants);
    if (!t.ok()) return Fail("serve", t.status().WithContext("flag --tenants"));
    so.tenants = std::move(*t);
  }
  so.allowed_origins.clear();
  const std::string origins = f.GetString("allowed-origins");
  for (std::string_view rest = origins; !rest.empty();) {
    const size_t comma = rest.find(',');
    std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    if (!item.empty()) so.allowed_origins.emplace_back(item);
  }
  so.max_body_bytes = f.GetInt("max-body-bytes");
  so.max_connections = static_cast<int>(f.GetInt("max-connections"));
  so.served_model_name = f.GetString("served-model-name");
  so.metrics_top_adapters =
      static_cast<int>(std::clamp<int64_t>(f.GetInt("metrics-top-adapters"), -1, 10001));
  if (so.served_model_name.empty())
    so.served_model_name = model_path.empty() ? "chorus-default" : model_path;
  const double drain_s = f.GetFloat("drain-timeout");
  if (!(drain_s >= 0 && drain_s <= 86400)) {
    return Fail("serve",
                InvalidArgumentError("flag --drain-timeout must be in [0, 86400] seconds"));
  }

  engine::EngineOptions eo;
  eo.threads = ThreadsFlag(f);
  if (Status si = ApplyIsaFlag(f); !si.ok()) return Fail("serve", si);
  if (Status sd = ApplyDeltaActivationsFlag(f); !sd.ok()) return Fail("serve", sd);
  eo.max_running = f.GetInt("max-running");
  eo.max_prompt_logprob_rows = f.GetInt("max-prompt-logprob-rows");
  eo.max_batch_tokens = f.GetInt("max-batch-tokens");
  eo.max_queue = f.GetInt("max-queue");
  if (auto kv_dtype = memory::ParseKvDtype(f.GetString("kv-dtype")); kv_dtype.ok()) {
    eo.kv_dtype = *kv_dtype;
  } else {
    return Fail("serve", kv_dtype.status().WithContext("flag --kv-dtype"));
  }
  for (const char* flag : {"pool-size", "host-cache-size"}) {
    const int64_t mib = f.GetInt(flag);
    if (mib < 0 || mib > (int64_t{1} << 20)) {
      return Fail("serve", InvalidArgumentError(std::string("flag --") + flag +
                                                " must be in [0, 1048576] MiB (0 = auto)"));
    }
  }
  if (f.GetBool("swap-full-models")) {
    if (f.GetRepeated("full-model").empty()) {
      return Fail("serve",
                  InvalidArgumentError(
                      "flag --swap-full-models needs at least one --full-model NAME=PATH"));
    }
    for (const std::string& spec : f.GetRepeated("full-model")) {
      const size_t eq = spec.find('=');
      if (eq == std::string::npos || eq == 0 || eq + 1 == spec.size()) {
        return Fail("serve", InvalidArgumentError("flag --full-model expects NAME=PATH, got '" +
                                                  spec.substr(0, 64) + "'"));
      }
      std::error_code ec;
      if (!std::filesystem::exists(spec.substr(eq + 1), ec)) {
        return Fail("serve",
                    InvalidArgumentError("flag --full-model " + spec.substr(0, eq) + ": " +
                                         spec.substr(eq + 1) + ": no such file or directory"));
      }
      eo.full_models.push_back({spec.substr(0, eq), spec.substr(eq + 1)});
    }
    eo.max_resident_models = f.GetInt("max-resident-models");
    if (eo.max_resident_models < 1 || eo.max_resident_models > 4096) {
      return Fail("serve", InvalidArgumentError("flag --max-resident-models must be in [1, 4096]"));
    }
  } else if (!f.GetRepeated("full-model").empty()) {
    return Fail("serve", InvalidArgumentError(
                             "flag --full-model needs --swap-full-models (whole fine-tunes are "
                             "served only by swapping; see docs/deltas.md)"));
  }
  eo.served_model_name = so.served_model_name;
  eo.max_adapters_per_step = f.GetInt("max-adapters-per-step");
  eo.max_deltas_per_step = f.GetInt("max-deltas");
  const int64_t loader_threads = f.GetInt("loader-threads");
  if (loader_threads < 1 || loader_threads > 64) {
    return Fail("serve", InvalidArgumentError("flag --loader-threads must be in [1, 64]"));
  }
  eo.loader_threads = static_cast<int>(loader_threads);
  eo.adapter_pool_copies = !f.GetBool("no-adapter-pool");
  eo.prefault_pool = f.GetBool("prefault");
  eo.prefix_cache = !f.GetBool("no-prefix-cache");
  eo.policy = f.GetString("policy");
  if (const std::string mode = f.GetString("slo-mode"); mode == "best-effort") {
    eo.slo_best_effort = true;
  } else if (mode != "strict") {
    return Fail("serve",
                InvalidArgumentError("flag --slo-mode must be strict or best-effort, got '" +
                                     mode.substr(0, 64) + "'"));
  }
  if (const std::string cm = f.GetString("cost-model"); !cm.empty()) {
    auto file = engine::CostModelFile::Load(cm);
    if (!file.ok()) return Fail("serve", file.status().WithContext("flag --cost-model"));
    eo.cost_model = std::make_shared<engine::CostModel>(file->best());
  }
  eo.correct_cost_model = !f.GetBool("no-cost-correction");
  eo.ttft_slo_ms = f.GetFloat("ttft-slo-ms");
  eo.tpot_slo_ms = f.GetFloat("tpot-slo-ms");
  eo.finetune_policy = f.GetString("finetune-policy");
  eo.deferral_bound_ms = f.GetFloat("deferral-bound");
  if (WantsFinetune(f)) eo.training_gate = std::make_shared<engine::TrainingGate>();
  so.reuse_port = f.GetBool("reuse-port");
  if (Status s = eo.Validate(); !s.ok())
    return Fail("serve", InvalidArgumentError("flag " + s.message()));

  if (Status s = CheckAdapterFlags(f); !s.ok()) return Fail("serve", s);
  auto chat_template = ReadChatTemplateFlag(f.GetString("chat-template"));
  if (!chat_template.ok()) return Fail("serve", chat_template.status());
  so.chat_template = chat_template->source;
  so.chat_template_label = chat_template->label;
  so.tool_call_parser = f.GetString("tool-call-parser");
  so.lora_resolve_dirs = f.GetRepeated("lora-resolve-dir");
  so.pooling = f.GetString("pooling");
  auto srv = server::Server::Create(so);
  if (!srv.ok()) return Fail("serve", InvalidArgumentError("flag " + srv.status().message()));
  if (Status s = (*srv)->Start(); !s.ok()) return Fail("serve", s);
  std::fprintf(stderr, "chorus serve: %s\n", IsaLine().c_str());
  std::fprintf(stderr, "chorus serve: loading %s (listening on %s, /health is 503 until ready)\n",
               model_path.empty() ? "the embedded default model" : model_path.c_str(),
               (*srv)->url().c_str());

  // Loading runs on its own thread so that this one keeps taking SIGINT/SIGTERM: a server that
  // is still loading (a large model, thousands of adapters) ends at once when told to. A load
  // error ends the process with a non-zero status and the flag and path in the message.
  std::shared_ptr<engine::Engine> engine;
  Status load_status;
  std::atomic<bool> load_done{false};
  std::thread loader([&] {
    load_status = [&]() -> Status {
      auto loaded_or = LoadModelAndTokenizer(model_path, f.GetString("tokenizer"));
      CHORUS_RETURN_IF_ERROR(AgreeAcrossRanks(tp->comm.get(), loaded_or.status()));
      LoadedModel loaded = std::move(loaded_or).value();
      // Adapters are read and checked against the whole model, also under --tp; deltas against
      // the whole base's weights.
      const model::ModelConfig full_config = loaded.model->config();
      const bool with_adapters = ServesAdapters(f);
      const std::string base_hash =
          with_adapters ? delta::BaseWeightsHash(*loaded.model) : std::string();
      // Under --tp: this rank's shard; the engine then broadcasts each step's plan.
      CHORUS_RETURN_IF_ERROR(ShardForTensorParallel(&*tp, &loaded.model));
      if (tp->leader) eo.tp_leader = tp->leader.get();
      // No silent fallback: a model template that does not compile stops the server here.
      CHORUS_RETURN_IF_ERROR(
          server::ChooseChatTemplate(*loaded.tokenizer, so.chat_template, so.chat_template_label)
              .status());
      const MemoryPlan plan = PlanMemory(f, loaded.model->config(), eo.max_running,
                                         eo.max_batch_tokens, with_adapters, eo.kv_dtype);
      eo.pool_bytes = plan.pool_bytes;
      CHORUS_ASSIGN_OR_RETURN(
          ServedAdapters served,
          OpenAdapters(f, full_config, so.served_model_name, plan.host_cache_bytes, base_hash,
                       {.rank = tp->rank(), .size = tp->size()}));
      eo.adapter_cache = served.cache;  // the engine's loader threads read adapters through it
      if (eo.policy == "slo" && !eo.cost_model) {
        // No --cost-model: a quick profile of this model on this machine (docs/scheduling.md).
        std::fprintf(stderr,
                     "chorus serve: --policy slo without --cost-model: profiling step latency "
                     "(chorus profile --quick; save one with chorus profile to skip this)\n");
        engine::ProfileOptions po;
        po.threads = eo.threads;
        po.kv_dtype = eo.kv_dtype;
        po.samples = 40;
        po.max_prefill = std::min<int64_t>(128, eo.max_batch_tokens);
        po.max_decode = std::min<int64_t>(16, eo.max_running);
        po.max_context = 512;
        CHORUS_ASSIGN_OR_RETURN(engine::ProfileReport rep,
                                engine::RunProfile(loaded.model, po, [](const std::string&) {}));
        std::fprintf(stderr, "%s", rep.ToTable().c_str());
        eo.cost_model = std::make_shared<engine::CostModel>(rep.file.best());
      }
      if (!eo.full_models.empty()) {
        std::fprintf(stderr,
                     "chorus serve: --swap-full-models: checking %zu whole fine-tunes (each is "
                     "loaded once), at most %lld resident\n",
                     eo.full_models.size(), static_cast<long long>(eo.max_resident_models));
      }
      auto eng = engine::Engine::Create(loaded.model, loaded.tokenizer, eo);
      if (!eng.ok()) {
        return f.GetInt("pool-size") > 0 ? eng.status().WithContext("flag --pool-size")
                                         : eng.status();
      }
      engine = std::move(*eng);
      std::fprintf(
          stderr, "chorus serve: pool %lld MiB (%s), KV cache %s, %s\n",
          static_cast<long long>(plan.pool_bytes >> 20), plan.pool_reason.c_str(),
          memory::KvDtypeName(eo.kv_dtype),
          eo.prefault_pool ? "prefaulted" : "made resident as it is used (--prefault: at start)");
      if (served.registry) (*srv)->SetAdapters(served.registry, served.cache);
      if (!served.finetune_dir.empty()) {
        server::FinetuneApiOptions fo;
        fo.dir = served.finetune_dir;
        fo.base_model_name = so.served_model_name;
        fo.max_file_bytes = so.max_body_bytes;
        fo.max_seq_len = loaded.model->config().max_seq_len;
        fo.recover_corrupt_state = f.GetBool("recover-corrupt-state");
        // Each training iteration runs on the engine's pool between inference steps, when
        // --finetune-policy lets it (engine/training_gate.h).
        std::shared_ptr<engine::TrainingGate> gate = eo.training_gate;
        train::JobQueue::StepHooks hooks;
        // Attached from its first iteration on (not while it reads and packs its data), so
        // requests are deferred only for a trainer that is about to ask again.
        hooks.on_job_end = [gate] { gate->Detach(); };
        hooks.before_step = [gate](const std::atomic<bool>* cancel) {
          gate->Attach();
          return gate->Acquire(cancel);
        };
        hooks.after_step = [gate] { gate->Release(); };
        auto api = server::FinetuneApi::Open(fo, loaded.model, loaded.tokenizer, served.registry,
                                             std::move(hooks));
        if (!api.ok()) return api.status().WithContext("flag --finetune-dir " + fo.dir);
        (*srv)->SetFinetuning(std::move(*api));
        std::fprintf(stderr, "chorus serve: fine-tuning API on (%s; --finetune-policy %s)\n",
                     fo.dir.c_str(), eo.finetune_policy.c_str());
      }
      return OkStatus();
    }();
    load_done.store(true, std::memory_order_release);
  });
  while (!load_done.load(std::memory_order_acquire)) {
    const timespec slice{0, 50'000'000};
    const int sig = sigtimedwait(&stop_signals, nullptr, &slice);
    if (sig == SIGHUP) ReloadTenants(so);
    if (sig == SIGINT || sig == SIGTERM) {
      std::fprintf(stderr, "chorus serve: %s while loading: exiting\n",
                   sig == SIGINT ? "SIGINT" : "SIGTERM");
      std::fflush(stderr);
      // The loader cannot be interrupted mid-read; nothing it holds needs an orderly end.
      std::_Exit(128 + sig);
    }
  }
  loader.join();
  if (!load_status.ok()) return Fail("serve", load_status);
  (*srv)->SetEngine(engine);
  std::printf("chorus serve: serving \"%s\" at %s/v1 (context %lld tokens, %lld KV blocks)\n",
              so.served_model_name.c_str(), (*srv)->url().c_str(),
              static_cast<long long>(engine->context_length()),
              static_cast<long long>(engine->kv_blocks_total()));
  std::printf("chorus serve: chat template: %s\n", (*srv)->chat_template_note().c_str());
  std::printf("chorus serve: tool calls: %s\n", (*srv)->tool_parser_note().c_str());
  std::fflush(stdout);

  int sig = 0;
  for (;;) {
    sigwait(&stop_signals, &sig);
    if (sig != SIGHUP) break;
    ReloadTenants(so);
  }
  std::fprintf(stderr, "chorus serve: %s: draining (up to %.1f s)\n",
               sig == SIGINT ? "SIGINT" : "SIGTERM", drain_s);
  (*srv)->Drain(std::chrono::milliseconds(static_cast<int64_t>(drain_s * 1000)));
  (*srv)->Stop();
  std::fprintf(stderr, "chorus serve: stopped\n");
  return 0;
}

}  // namespace chorus::apps
