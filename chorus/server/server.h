// The OpenAI-compatible HTTP server (docs/api.md) over cpp-httplib.
//
// Routes:
//   POST /v1/completions, POST /v1/chat/completions   (JSON or SSE with "stream": true)
//   GET  /v1/models, GET /v1/models/{id}
//   GET  /health    200 when ready; 503 while loading or draining (never needs the API key)
//   GET  /metrics   Prometheus text (engine metrics + HTTP requests by route and status)
//   POST /tokenize, /detokenize, /apply-template   (template_routes.h)
//   /v1/files, /v1/fine_tuning/jobs/...   OpenAI's fine-tuning API (finetune_routes.h)
// Errors use OpenAI's body (api_error.h); the Status → HTTP mapping is ErrorFromStatus.
//
// Lifecycle: Create → Start (binds; /health says 503 "loading") → SetEngine (ready) → ... →
// Drain (SIGTERM: health 503, new generation requests 503, running ones finish within the drain
// time, the rest are aborted) → Stop. The destructor stops.
//
// Concurrency: httplib serves each connection on a worker thread of a pool of
// `max_connections` threads; a streaming response holds its thread until the stream ends, so
// the pool bounds concurrent streams. Handler threads talk to the engine only through
// Engine::Submit and RequestHandle. A streaming client that disconnects (a failed write) has its
// request cancelled; while a request waits in the queue, an SSE comment every 2 s probes the
// connection.
//
// Thread-safety: Start/SetEngine/Drain/Stop are called from one controlling thread; everything
// else is internal.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "chorus/adapters/adapter_cache.h"
#include "chorus/adapters/registry.h"
#include "chorus/base/status.h"
#include "chorus/engine/engine.h"
#include "chorus/server/tenants.h"

namespace chorus::server {

class FinetuneApi;  // finetune_routes.h

struct ServerOptions {
  std::string host = "127.0.0.1";  // address to bind
  int port = 8000;                 // 0 = any free port (see Server::port())
  std::string api_key;  // non-empty: every route but /health needs "Authorization: Bearer KEY"
  // Tenants (server/tenants.h; `--tenants FILE`): every route but /health needs one of a
  // tenant's keys; adapters loaded through the API belong to their tenant; per-tenant limits.
  // Null: none. Not together with api_key.
  std::shared_ptr<Tenants> tenants;
  // Origins a browser may call from (CORS): "*" = any (the default, as vLLM's), else exact
  // origins such as "https://app.example.com". Empty list: no CORS headers at all.
  std::vector<std::string> allowed_origins = {"*"};
  int64_t max_body_bytes = int64_t{8} << 20;  // larger request bodies get 413
  int max_connections = 512;                  // HTTP worker threads = connections served at once
  std::string served_model_name = "chorus";   // the `model` name requests must use
  int read_timeout_s = 30;                    // a client must send its request within this
  int write_timeout_s = 30;       // a client that stops reading is cut off (request cancelled)
  int keep_alive_timeout_s = 5;   // idle keep-alive connections are closed after this
  int metrics_top_adapters = 16;  // /metrics names this many adapters; the rest are "(other)"
  // Let other processes listen on the same port too (SO_REUSEPORT). Off: binding a port that
  // is in use fails, so two servers never split one port's traffic by accident.
  bool reuse_port = false;
  // Chat template source replacing the model's own (--chat-template; empty = the model's).
  // `chat_template_label` names it in messages (the file or "(inline)").
  std::string chat_template;
  std::string chat_template_label;
  // The tool-call syntax of replies (--tool-call-parser: hermes, llama3_json, mistral, generic;
  // "auto" = detected from the chat template; docs/api.md, "Tools").
  std::string tool_call_parser = "auto";
  // Directories searched when a request's `model` names no registered variant
  // (--lora-resolve-dir; vLLM's filesystem LoRA resolver, LoRAX's adapters loaded on demand):
  // DIR/NAME (a PEFT directory or a delta) or DIR/NAME.gguf is registered as NAME, shared by
  // every tenant, and the request served. Each must be an adapter root of the registry.
  std::vector<std::string> lora_resolve_dirs;
  // How /v1/embeddings pools a prompt's hidden states (--pooling: last, mean, cls; docs/api.md,
  // "Embeddings"). "auto": the model's own (ModelConfig::pooling, an embedding model's file
  // says), else last, as vLLM pools decoder models.
  std::string pooling = "auto";
  Status Validate() const;
};

class Server {
 public:
  static Result<std::unique_ptr<Server>> Create(ServerOptions opts);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds and starts serving on a background thread. Until SetEngine, generation routes and
  // /health answer 503.
  Status Start();
  // The bound port (after Start).
  int port() const { return port_; }
  std::string url() const;

  // Serves adapters as variants: a request's `model` may name a registered adapter; /v1/models
  // lists them with `parent` = the base; POST /v1/load_lora_adapter and /v1/unload_lora_adapter
  // (vLLM's names) change the registry at run time. Requires: called before SetEngine, whose
  // engine loads cold adapters through `cache` (EngineOptions::adapter_cache).
  void SetAdapters(std::shared_ptr<adapters::AdapterRegistry> registry,
                   std::shared_ptr<adapters::AdapterCache> cache);

  // Serves OpenAI's files and fine-tuning routes (server/finetune_routes.h) over `api`, whose
  // finished jobs register into the adapter registry. Requires: called before SetEngine.
  void SetFinetuning(std::shared_ptr<FinetuneApi> api);

  // Makes the server ready. Requires: Start() succeeded; called once.
  void SetEngine(std::shared_ptr<engine::Engine> engine);
  bool ready() const { return ready_.load(std::memory_order_acquire); }
  // Which chat template /v1/chat/completions renders with ("the model's own", or ChatML as a
  // named fallback). Set by SetEngine.
  const std::string& chat_template_note() const { return chat_template_note_; }
  // How tool calls are parsed, for the startup line ("hermes (detected from the template)").
  const std::string& tool_parser_note() const { return tool_parser_note_; }
  bool draining() const { return draining_.load(); }

  // Stops accepting generation requests (503), lets running ones finish for up to `drain`
  // (Engine::Shutdown), aborts the rest, and waits (bounded) for every in-flight HTTP response
  // to complete. Idempotent.
  void Drain(std::chrono::milliseconds drain);
  // Closes the listening socket and joins the HTTP threads. Idempotent.
  void Stop();

  // Generation requests whose HTTP response is still being produced.
  int64_t in_flight() const { return in_flight_.load(); }

  struct Impl;

 private:
  Server() = default;
  ServerOptions opts_;
  int port_ = 0;
  std::atomic<bool> ready_{false};
  std::atomic<bool> draining_{false};
  std::atomic<int64_t> in_flight_{0};
  std::string chat_template_note_;
  std::string tool_parser_note_;
  std::unique_ptr<Impl> impl_;
  std::thread listen_thread_;
  std::atomic<bool> listen_returned_{false};  // the listen thread's loop has ended
};

}  // namespace chorus::server
