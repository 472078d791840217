// chorus router: one OpenAI endpoint in front of several `chorus serve` replicas
// (docs/router.md).
#include <pthread.h>
#include <signal.h>

#include <cstdio>

#include "apps/chorus/commands.h"
#include "apps/chorus/common.h"
#include "chorus/router/router.h"

namespace chorus::apps {

int RouterCommand(int argc, char** argv) {
  Flags f("router",
          "One OpenAI-compatible endpoint over several `chorus serve` replicas: requests and\n"
          "streams pass through unchanged to a replica chosen by --policy among the healthy ones\n"
          "that serve the request's model; failed replicas are ejected and readmitted by health\n"
          "checks; /v1/models is the union; adapter load/unload fan out (docs/router.md).\n"
          "SIGTERM/SIGINT: stop.");
  f.Repeated("replica", "a replica's base URL, http://HOST:PORT (repeat for each)");
  f.String("host", "127.0.0.1", "address to bind");
  f.Int("port", 8100, "port to listen on (0: any free port, printed at start)");
  f.String("policy", "least-loaded", "least-loaded, random, pack or rank-aware");
  f.Int("health-interval-ms", 1000, "how often each replica's /health and /v1/models are polled");
  f.Int("replica-capacity", 32, "pack: requests a replica takes before the next one is used");
  f.String("replica-api-key", "",
           "key for the router's own polls of /v1/models (when replicas need one)");
  f.Int("max-connections", 512, "HTTP worker threads = client connections served at once");
  f.String("cost-model", "",
           "rank-aware: the replicas' cost model (`chorus profile` JSON); its predicted steps "
           "over the requests in flight replace the proxy (docs/router.md)");
  f.Bool("shed",
         "with --cost-model: answer 429 (Retry-After) instead of forwarding a request the chosen "
         "replica is predicted to serve outside its ttft_slo_ms / tpot_slo_ms (rank-aware: "
         "when every replica is)");
  f.Int("replica-max-batch-tokens", 512,
        "the replicas' --max-batch-tokens (prompt chunks), for the predicted TTFT");
  if (int rc = ParseOrExit(f, argc, argv); rc >= 0) return rc;
  router::RouterOptions o;
  o.replicas = f.GetRepeated("replica");
  o.host = f.GetString("host");
  o.port = static_cast<int>(f.GetInt("port"));
  if (o.port < 0 || o.port > 65535)
    return Fail("router", InvalidArgumentError("flag --port must be in [0, 65535]"));
  auto policy = router::ParsePolicy(f.GetString("policy"));
  if (!policy.ok()) return Fail("router", policy.status().WithContext("flag --policy"));
  o.policy = *policy;
  o.health_interval_ms = static_cast<int>(f.GetInt("health-interval-ms"));
  o.replica_capacity = f.GetInt("replica-capacity");
  o.replica_api_key = f.GetString("replica-api-key");
  o.max_connections = static_cast<int>(f.GetInt("max-connections"));
  if (o.max_connections < 1 || o.max_connections > 65536)
    return Fail("router", InvalidArgumentError("flag --max-connections must be in [1, 65536]"));
  // Signals are taken synchronously by this thread; every thread created later inherits the mask.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);
  if (const std::string path = f.GetString("cost-model"); !path.empty()) {
    auto cm = engine::CostModelFile::Load(path);
    if (!cm.ok()) return Fail("router", cm.status().WithContext("flag --cost-model"));
    o.cost_model = std::make_shared<engine::CostModel>(cm->best());
  }
  o.shed = f.GetBool("shed");
  o.replica_max_batch_tokens = f.GetInt("replica-max-batch-tokens");
  auto r = router::Router::Create(o);
  if (!r.ok()) return Fail("router", r.status());
  if (Status s = (*r)->Start(); !s.ok()) return Fail("router", s);
  std::fprintf(stderr, "chorus router: listening on http://%s:%d, %zu replicas, policy %s\n",
               o.host.c_str(), (*r)->port(), o.replicas.size(), router::PolicyName(o.policy));
  int sig = 0;
  sigwait(&stop_signals, &sig);
  std::fprintf(stderr, "chorus router: %s: stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
  (*r)->Stop();
  return 0;
}

}  // namespace chorus::apps
