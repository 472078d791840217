// chorus serve: the OpenAI-compatible HTTP server (docs/api.md).
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "apps/chorus/commands.h"
#include "apps/chorus/common.h"
#include "apps/chorus/default_model.h"
#include "chorus/adapters/adapter_cache.h"
#include "chorus/adapters/registry.h"
#include "chorus/engine/engine.h"
#include "chorus/server/server.h"

namespace chorus::apps {

namespace {

struct ServedAdapters {
  std::shared_ptr<adapters::AdapterRegistry> registry;
  std::shared_ptr<adapters::AdapterCache> cache;
};

// The registry (persisted across restarts) plus the adapters named on the command line. The
// directories of --lora and --lora-dir paths are adapter roots too: the operator named them.
Result<ServedAdapters> OpenAdapters(const Flags& f, const model::ModelConfig& base,
                                    const std::string& base_name) {
  ServedAdapters out;
  std::vector<std::string> roots = f.GetRepeated("adapter-root");
  std::vector<std::pair<std::string, std::string>> loras;
  for (const std::string& spec : f.GetRepeated("lora")) {
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
  if (roots.empty() && f.GetString("registry").empty()) return out;  // base model only
  adapters::RegistryOptions ro;
  ro.adapter_roots = roots;
  ro.max_lora_rank = f.GetInt("max-lora-rank");
  ro.base = base;
  ro.base_model_name = base_name;
  std::string state = f.GetString("registry");
  if (state.empty()) {
    CHORUS_ASSIGN_OR_RETURN(std::string dir, CacheDirectory());
    state = dir + "/adapters-registry.json";
  }
  CHORUS_ASSIGN_OR_RETURN(auto reg, adapters::AdapterRegistry::Open(state, ro));
  out.registry = std::move(reg);
  for (const auto& [name, path] : loras) {
    auto info = out.registry->Register(name, path, /*replace=*/true);
    if (!info.ok()) return info.status().WithContext("--lora " + name);
  }
  for (const std::string& d : f.GetRepeated("lora-dir")) {
    CHORUS_ASSIGN_OR_RETURN(auto results, out.registry->RegisterDirectory(d, /*replace=*/true));
    for (const auto& r : results) {
      if (!r.status.ok())
        std::fprintf(stderr, "chorus serve: skipping %s: %s\n", r.path.c_str(),
                     r.status.message().c_str());
    }
  }
  {
    adapters::LoraLimits limits;
    limits.max_rank = ro.max_lora_rank;
    const std::string dtype = f.GetString("lora-dtype");
    if (dtype != "bf16" && dtype != "f32")
      return InvalidArgumentError("flag --lora-dtype must be bf16 or f32");
    limits.storage = dtype == "f32" ? adapters::LoraStorage::kF32 : adapters::LoraStorage::kBF16;
    out.cache =
        std::make_shared<adapters::AdapterCache>(base, f.GetInt("host-cache-size") << 20, limits);
  }
  std::fprintf(stderr, "chorus serve: %zu adapters registered (%s)\n", out.registry->size(),
               state.c_str());
  return out;
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
  f.Int("pool-size", 1024, "paged KV pool size in MiB");
  f.Int("threads", 0, "compute threads (0 = all cores)");
  f.Int("max-running", 64, "sequences in the running batch");
  f.Int("max-batch-tokens", 512, "tokens (rows) per engine step: decode rows + prefill chunks");
  f.Int("max-queue", 256, "waiting requests before answering 429");
  f.Int("max-body-bytes", 8 << 20, "largest request body accepted (larger: 413)");
  f.Int("metrics-top-adapters", 16,
        "adapters named in /metrics (most requests); the rest are summed as (other)");
  f.Int("max-connections", 512, "HTTP connections served at once (one thread each)");
  f.Repeated("lora", "serve an adapter as a variant: NAME=PATH (PEFT directory or GGUF LoRA)");
  f.Repeated("lora-dir", "register every adapter directly under DIR (named after its folder/file)");
  f.Repeated("adapter-root", "directory POST /v1/load_lora_adapter may load adapters from");
  f.String("registry", "",
           "adapter registry state file (default: <cache dir>/adapters-registry.json)");
  f.Int("host-cache-size", 2048, "MiB of decoded adapters kept in host memory (LRU)");
  f.Int("max-lora-rank", 256, "largest LoRA rank accepted");
  f.String(
      "lora-dtype", "bf16",
      "adapter compute weights in memory: bf16 (rounded once at load, half the traffic) or f32");
  f.Int("max-adapters-per-step", 0, "distinct adapters in one engine step (0 = unlimited)");
  f.Int("loader-threads", 2, "threads loading adapters (disk -> host, host -> pool pages)");
  f.Bool("no-adapter-pool", "serve adapters from host memory only (no copies in pool pages)");
  f.Bool("no-prefault-pool",
         "leave the pool's and the host adapter cache's memory untouched until used (faster "
         "start; page faults on first use)");
  f.Float("drain-timeout", 30.0,
          "seconds running requests get to finish on SIGTERM before they are aborted");
  if (int rc = ParseOrExit(f, argc, argv); rc >= 0) return rc;

  // Signals are taken synchronously by this thread (sigwait); every thread created from here
  // on inherits the mask. A peer that closes its socket must not kill the process.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);

  const std::string model_path = f.GetString("model");
  server::ServerOptions so;
  so.host = f.GetString("host");
  so.port = static_cast<int>(f.GetInt("port"));
  so.api_key = f.GetString("api-key");
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
  eo.max_running = f.GetInt("max-running");
  eo.max_batch_tokens = f.GetInt("max-batch-tokens");
  eo.max_queue = f.GetInt("max-queue");
  const int64_t pool_mib = f.GetInt("pool-size");
  if (pool_mib < 1 || pool_mib > (int64_t{1} << 20)) {
    return Fail("serve", InvalidArgumentError("flag --pool-size must be in [1, 1048576] MiB"));
  }
  eo.pool_bytes = pool_mib << 20;
  eo.max_adapters_per_step = f.GetInt("max-adapters-per-step");
  const int64_t loader_threads = f.GetInt("loader-threads");
  if (loader_threads < 1 || loader_threads > 64) {
    return Fail("serve", InvalidArgumentError("flag --loader-threads must be in [1, 64]"));
  }
  eo.loader_threads = static_cast<int>(loader_threads);
  eo.adapter_pool_copies = !f.GetBool("no-adapter-pool");
  eo.prefault_pool = !f.GetBool("no-prefault-pool");
  if (Status s = eo.Validate(); !s.ok())
    return Fail("serve", InvalidArgumentError("flag " + s.message()));

  auto srv = server::Server::Create(so);
  if (!srv.ok()) return Fail("serve", InvalidArgumentError("flag " + srv.status().message()));
  if (Status s = (*srv)->Start(); !s.ok()) return Fail("serve", s);
  std::fprintf(stderr, "chorus serve: loading %s (listening on %s, /health is 503 until ready)\n",
               model_path.empty() ? "the embedded default model" : model_path.c_str(),
               (*srv)->url().c_str());

  auto loaded = LoadModelAndTokenizer(model_path, f.GetString("tokenizer"));
  if (!loaded.ok()) return Fail("serve", loaded.status());
  auto adapters_or = OpenAdapters(f, loaded->model->config(), so.served_model_name);
  if (!adapters_or.ok()) return Fail("serve", adapters_or.status());
  eo.adapter_cache = adapters_or->cache;  // the engine's loader threads read adapters through it
  auto eng = engine::Engine::Create(loaded->model, loaded->tokenizer, eo);
  if (!eng.ok()) return Fail("serve", eng.status());
  std::shared_ptr<engine::Engine> engine = std::move(*eng);
  if (adapters_or->registry) (*srv)->SetAdapters(adapters_or->registry, adapters_or->cache);
  (*srv)->SetEngine(engine);
  std::printf("chorus serve: serving \"%s\" at %s/v1 (context %lld tokens, %lld KV blocks)\n",
              so.served_model_name.c_str(), (*srv)->url().c_str(),
              static_cast<long long>(engine->context_length()),
              static_cast<long long>(engine->kv_blocks_total()));
  std::fflush(stdout);

  int sig = 0;
  sigwait(&stop_signals, &sig);
  std::fprintf(stderr, "chorus serve: %s: draining (up to %.1f s)\n",
               sig == SIGINT ? "SIGINT" : "SIGTERM", drain_s);
  (*srv)->Drain(std::chrono::milliseconds(static_cast<int64_t>(drain_s * 1000)));
  (*srv)->Stop();
  std::fprintf(stderr, "chorus serve: stopped\n");
  return 0;
}

}  // namespace chorus::apps
