// /metrics per-adapter series end to end: a real server over loopback serving the
// stories260K model with random PEFT adapters registered, requests for several adapters and
// the base, then a scrape: request counters by adapter (top N + "(other)" + the base),
// TTFT histograms consistent with the counters and the global histogram, host-tier stats.
#include <httplib.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "chorus/adapters/adapter_cache.h"
#include "chorus/adapters/lora/lora_files.h"
#include "chorus/adapters/registry.h"
#include "chorus/base/logging.h"
#include "chorus/engine/engine.h"
#include "chorus/model/loader.h"
#include "chorus/server/server.h"
#include "chorus/tokenizer/tokenizer.h"
#include "tests/testutil/testutil.h"

namespace chorus {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const char* kModel = "stories260K/stories260K.bin";
const char* kTok = "stories260K/tok512.bin";

std::map<std::string, double> Samples(const std::string& text) {
  std::map<std::string, double> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t sp = line.rfind(' ');
    if (sp != std::string::npos) out[line.substr(0, sp)] = std::stod(line.substr(sp + 1));
  }
  return out;
}

// A real server over loopback serving stories260K with random PEFT adapters a0, a1, ... (one
// per rank in `ranks`, on q and v) registered under a fresh adapter root.
struct AdapterServer {
  std::string root;
  std::shared_ptr<adapters::AdapterRegistry> registry;
  std::shared_ptr<adapters::AdapterCache> cache;
  std::shared_ptr<engine::Engine> engine;
  std::unique_ptr<server::Server> server;
  ~AdapterServer() {
    if (server) {
      server->Drain(std::chrono::milliseconds(1000));
      server->Stop();
    }
  }
};

// The engine's loader threads load cold adapters through the server's host cache, as in
// `chorus serve`.
std::unique_ptr<AdapterServer> StartAdapterServer(const std::vector<int64_t>& ranks, uint64_t seed,
                                                  server::ServerOptions so,
                                                  engine::EngineOptions eo) {
  const std::string models = testing::SharedModelsDir();
  auto mdl = model::LoadModel(models + "/" + kModel);
  auto tok = tokenizer::LoadTokenizer(models + "/" + kTok);
  EXPECT_TRUE(mdl.ok() && tok.ok());
  if (!mdl.ok() || !tok.ok()) return nullptr;
  const model::ModelConfig& cfg = (*mdl)->config();
  auto out = std::make_unique<AdapterServer>();
  const std::string tmp = fs::canonical(testing::TempDir()).string();
  out->root = tmp + "/adapters-" + std::to_string(seed);
  fs::create_directories(out->root);
  for (size_t i = 0; i < ranks.size(); ++i) {
    adapters::RandomLoraSpec spec;
    spec.rank = ranks[i];
    spec.seed = seed + i;
    spec.targets = {model::Linear::kQ, model::Linear::kV};
    Status w = adapters::WritePeftLora(out->root + "/a" + std::to_string(i),
                                       adapters::MakeRandomLora(cfg, spec), cfg);
    EXPECT_TRUE(w.ok()) << w.ToString();
    if (!w.ok()) return nullptr;
  }
  adapters::RegistryOptions ro;
  ro.adapter_roots = {out->root};
  ro.base = cfg;
  ro.base_model_name = "stories";
  auto reg = adapters::AdapterRegistry::Open(out->root + ".registry.json", ro);
  EXPECT_TRUE(reg.ok()) << reg.status().ToString();
  if (!reg.ok()) return nullptr;
  out->registry = std::move(*reg);
  EXPECT_TRUE(out->registry->RegisterDirectory(out->root).ok());
  EXPECT_EQ(out->registry->size(), ranks.size());
  out->cache = std::make_shared<adapters::AdapterCache>(cfg, int64_t{64} << 20);
  so.port = 0;
  so.served_model_name = "stories";
  auto srv = server::Server::Create(so);
  EXPECT_TRUE(srv.ok() && (*srv)->Start().ok());
  if (!srv.ok()) return nullptr;
  out->server = std::move(*srv);
  out->server->SetAdapters(out->registry, out->cache);
  eo.threads = 1;
  eo.pool_bytes = int64_t{8} << 20;
  eo.adapter_cache = out->cache;
  auto eng = engine::Engine::Create(
      *mdl, std::shared_ptr<const tokenizer::Tokenizer>(std::move(*tok)), eo);
  EXPECT_TRUE(eng.ok()) << eng.status().ToString();
  if (!eng.ok()) return nullptr;
  out->engine = std::move(*eng);
  out->server->SetEngine(out->engine);
  return out;
}

TEST(AdapterMetricsE2E, PerAdapterCountersOtherBucketAndHistograms) {
  CHORUS_REQUIRE_SHARED_MODEL(kModel);
  SetMinLogLevel(LogLevel::kError);
  // Five adapters of mixed ranks.
  server::ServerOptions so;
  so.metrics_top_adapters = 2;
  engine::EngineOptions eo;
  eo.max_running = 16;
  eo.max_batch_tokens = 128;
  auto ts = StartAdapterServer({1, 2, 4, 8, 16}, 100, so, eo);
  ASSERT_NE(ts, nullptr);
  const std::vector<std::string> names = {"a0", "a1", "a2", "a3", "a4"};
  const std::string& root = ts->root;
  const auto& registry = ts->registry;
  httplib::Client cli("127.0.0.1", ts->server->port());
  cli.set_read_timeout(60, 0);

  // a0 ×4, a1 ×3, a2 ×2, a3 ×1, a4 ×0, base ×2, one unknown adapter (404, not counted).
  const std::vector<std::pair<std::string, int>> load = {
      {"a0", 4}, {"a1", 3}, {"a2", 2}, {"a3", 1}, {"stories", 2}};
  int total = 0;
  for (const auto& [name, n] : load) {
    for (int k = 0; k < n; ++k) {
      json body = {
          {"model", name}, {"prompt", "Once upon a time"}, {"max_tokens", 3}, {"temperature", 0}};
      auto r = cli.Post("/v1/completions", body.dump(), "application/json");
      ASSERT_TRUE(r);
      ASSERT_EQ(r->status, 200) << r->body;
      // The response names the variant that served it (vLLM / OpenAI echo the request's model).
      EXPECT_EQ(json::parse(r->body).value("model", ""), name);
      ++total;
    }
  }
  auto bad = cli.Post("/v1/completions", R"({"model":"nope","prompt":"x","max_tokens":1})",
                      "application/json");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 404);
  // The error lists the names a request may use: the base, then the adapters.
  EXPECT_NE(bad->body.find("Served models: `stories`, `a0`, `a1`"), std::string::npos) << bad->body;

  // A bad adapter name is blamed on lora_name, not on lora_path.
  for (const char* name : {"bad name!", "stories"}) {
    json load = {{"lora_name", name}, {"lora_path", root + "/a0"}};
    auto r = cli.Post("/v1/load_lora_adapter", load.dump(), "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << r->body;
    EXPECT_EQ(json::parse(r->body)["error"]["param"], "lora_name") << name << ": " << r->body;
  }
  ASSERT_EQ(registry->size(), names.size());

  auto m = cli.Get("/metrics");
  ASSERT_TRUE(m);
  ASSERT_EQ(m->status, 200);
  const std::string& text = m->body;
  const auto s = Samples(text);
  EXPECT_NE(text.find("# TYPE chorus_adapter_requests_total counter\n"), std::string::npos);
  EXPECT_NE(text.find("# TYPE chorus_adapter_time_to_first_token_seconds histogram\n"),
            std::string::npos);
  auto req = [&](const std::string& l) {
    return s.at("chorus_adapter_requests_total{adapter=\"" + l + "\"}");
  };
  EXPECT_EQ(req("a0"), 4);
  EXPECT_EQ(req("a1"), 3);
  EXPECT_EQ(s.count("chorus_adapter_requests_total{adapter=\"a2\"}"), 0u);  // beyond the top 2
  EXPECT_EQ(req("(other)"), 3);                                             // a2 ×2 + a3 ×1
  EXPECT_EQ(req("stories"), 2);
  EXPECT_EQ(s.at("chorus_adapter_other_adapters"), 2);
  EXPECT_EQ(s.at("chorus_adapters_registered"), 5);
  EXPECT_EQ(s.at("chorus_engine_requests_total"), total);

  // Each request produced one first token: per-adapter TTFT counts equal the request counters,
  // buckets are cumulative, and the per-adapter histograms add up to the global one.
  double count_sum = 0, sum_sum = 0;
  for (const std::string l : {"a0", "a1", "(other)", "stories"}) {
    const std::string p = "chorus_adapter_time_to_first_token_seconds";
    const std::string lab = "adapter=\"" + l + "\"";
    const double count = s.at(p + "_count{" + lab + "}");
    EXPECT_EQ(count, req(l)) << l;
    EXPECT_EQ(s.at(p + "_bucket{" + lab + ",le=\"+Inf\"}"), count) << l;
    double prev = 0;
    for (const char* le :
         {"0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1", "2.5", "5", "10", "30", "60"}) {
      const double v = s.at(p + "_bucket{" + lab + ",le=\"" + le + "\"}");
      EXPECT_GE(v, prev) << l << " le=" << le;
      prev = v;
    }
    EXPECT_LE(prev, count);
    count_sum += count;
    sum_sum += s.at(p + "_sum{" + lab + "}");
  }
  EXPECT_EQ(count_sum, s.at("chorus_time_to_first_token_seconds_count"));
  EXPECT_NEAR(sum_sum, s.at("chorus_time_to_first_token_seconds_sum"), 1e-6 + 1e-9 * sum_sum);

  // Host tier: four distinct adapters were loaded once each; every adapter request looked one up.
  EXPECT_EQ(s.at("chorus_adapter_load_seconds_count"), 4);
  EXPECT_GT(s.at("chorus_adapter_load_seconds_sum"), 0);
  EXPECT_EQ(s.at("chorus_adapter_load_seconds_bucket{le=\"+Inf\"}"), 4);  // a histogram
  EXPECT_LE(s.at("chorus_adapter_load_seconds_bucket{le=\"0.001\"}"),
            s.at("chorus_adapter_load_seconds_bucket{le=\"10\"}"));
  EXPECT_EQ(s.at("chorus_adapter_host_cache_misses_total"), 4);
  EXPECT_EQ(
      s.at("chorus_adapter_host_cache_hits_total") + s.at("chorus_adapter_host_cache_misses_total"),
      10);
  EXPECT_EQ(s.at("chorus_adapter_host_cache_entries"), 4);
}

// Runs the Prometheus reference parser (Debian's python3-prometheus-client, installed by
// scripts/setup.sh) over `text`; returns its samples, one JSON object each.
std::vector<json> ParseWithPrometheusClient(const std::string& text) {
  const std::string dir = testing::TempDir();
  const std::string in = dir + "/metrics.txt", out = dir + "/samples.jsonl";
  {
    std::ofstream f(in);
    f << text;
  }
  const std::string cmd = "/usr/bin/python3 " CHORUS_SOURCE_DIR "/tests/e2e/parse_prometheus.py <" +
                          in + " >" + out + " 2>" + dir + "/parse.err";
  const int rc = std::system(cmd.c_str());
  std::ifstream err(dir + "/parse.err");
  std::stringstream err_text;
  err_text << err.rdbuf();
  EXPECT_EQ(rc, 0) << "the Prometheus parser rejected /metrics (or is missing): " << err_text.str();
  std::vector<json> samples;
  std::ifstream f(out);
  std::string line;
  while (std::getline(f, line)) samples.push_back(json::parse(line));
  return samples;
}

// The gauges an inference gateway (Kubernetes Gateway API Inference Extension) scrapes, under
// vLLM's names: while a request for adapter a0 runs and one for a1 waits (one running slot),
// vllm:lora_requests_info names them in running_lora_adapters / waiting_lora_adapters, and the
// whole /metrics text parses with the reference Prometheus parser.
TEST(AdapterMetricsE2E, GatewayMetricsNameRunningAndWaitingAdapters) {
  CHORUS_REQUIRE_SHARED_MODEL(kModel);
  SetMinLogLevel(LogLevel::kError);
  engine::EngineOptions eo;
  eo.max_running = 1;  // a0's request runs; a1's waits behind it
  eo.max_batch_tokens = 64;
  auto ts = StartAdapterServer({4, 4}, 7, {}, eo);
  ASSERT_NE(ts, nullptr);
  const int port = ts->server->port();

  // Streams until the test has seen what it needs, then hangs up (cancelling the request).
  std::atomic<bool> done{false};
  auto stream = [&](const std::string& adapter) {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(60, 0);
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.body = json{
        {"model", adapter},
        {"prompt", json::array({1})},
        {"max_tokens", 500},
        {"ignore_eos", true},
        {"stream",
         true}}.dump();
    req.set_header("Content-Type", "application/json");
    req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return !done.load(); };
    c.send(req);
  };
  std::thread a0(stream, "a0");
  httplib::Client cli("127.0.0.1", port);
  std::string text;
  auto has = [&](const std::string& needle) { return text.find(needle) != std::string::npos; };
  std::thread a1;
  for (int i = 0; i < 3000; ++i) {
    auto m = cli.Get("/metrics");
    ASSERT_TRUE(m);
    text = m->body;
    if (!a1.joinable() && has("running_lora_adapters=\"a0\"")) a1 = std::thread(stream, "a1");
    if (has("running_lora_adapters=\"a0\",waiting_lora_adapters=\"a1\"")) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  done.store(true);
  a0.join();
  if (a1.joinable()) a1.join();
  ASSERT_TRUE(has("running_lora_adapters=\"a0\",waiting_lora_adapters=\"a1\"")) << text;

  const std::vector<json> samples = ParseWithPrometheusClient(text);
  ASSERT_FALSE(samples.empty());
  auto find = [&](const std::string& name) -> const json* {
    for (const json& s : samples)
      if (s["name"] == name) return &s;
    return nullptr;
  };
  const json* lora = find("vllm:lora_requests_info");
  ASSERT_NE(lora, nullptr) << text;
  EXPECT_EQ((*lora)["type"], "gauge");
  EXPECT_EQ((*lora)["labels"]["running_lora_adapters"], "a0");
  EXPECT_EQ((*lora)["labels"]["waiting_lora_adapters"], "a1");
  EXPECT_EQ((*lora)["labels"]["max_lora"], "1");     // unlimited per step: the running-batch size
  EXPECT_GT((*lora)["value"].get<double>(), 1.7e9);  // a Unix time
  const json* running = find("vllm:num_requests_running");
  const json* waiting = find("vllm:num_requests_waiting");
  const json* usage = find("vllm:kv_cache_usage_perc");
  const json* config = find("vllm:cache_config_info");
  ASSERT_TRUE(running && waiting && usage && config) << text;
  EXPECT_EQ((*running)["labels"]["model_name"], "stories");
  EXPECT_GE((*running)["value"].get<double>(), 1);
  EXPECT_GE((*waiting)["value"].get<double>(), 1);
  EXPECT_GT((*usage)["value"].get<double>(), 0);
  EXPECT_LE((*usage)["value"].get<double>(), 1);
  EXPECT_EQ((*config)["labels"]["block_size"], "16");
  EXPECT_EQ((*config)["labels"]["num_gpu_blocks"], std::to_string(ts->engine->kv_blocks_total()));
  EXPECT_NE(find("chorus_queue_length"), nullptr);  // Chorus's own series parse too
}

// A registered adapter's file overwritten with another adapter's after registration: the
// request for it gets a clear error naming the change instead of the other adapter's weights
// under the old identity; registering it again (replace) serves the new content.
TEST(AdapterMetricsE2E, AdapterChangedOnDiskIsRefusedNotServedUnderItsOldIdentity) {
  CHORUS_REQUIRE_SHARED_MODEL(kModel);
  SetMinLogLevel(LogLevel::kError);
  engine::EngineOptions eo;
  eo.max_running = 4;
  eo.max_batch_tokens = 64;
  auto ts = StartAdapterServer({4, 8}, 300, {}, eo);
  ASSERT_NE(ts, nullptr);
  for (const char* f : {"adapter_config.json", "adapter_model.safetensors"}) {
    fs::copy_file(ts->root + "/a1/" + f, ts->root + "/a0/" + f,
                  fs::copy_options::overwrite_existing);
  }
  httplib::Client cli("127.0.0.1", ts->server->port());
  cli.set_read_timeout(60, 0);
  auto complete = [&](const std::string& model) {
    json body = {
        {"model", model}, {"prompt", "Once upon a time"}, {"max_tokens", 4}, {"temperature", 0}};
    return cli.Post("/v1/completions", body.dump(), "application/json");
  };
  auto changed = complete("a0");
  ASSERT_TRUE(changed);
  EXPECT_EQ(changed->status, 500) << changed->body;  // the server's files, not the request
  EXPECT_NE(changed->body.find("changed since it was registered"), std::string::npos)
      << changed->body;
  EXPECT_NE(changed->body.find("register it again with replace"), std::string::npos);
  auto other = complete("a1");  // the untouched adapter still serves
  ASSERT_TRUE(other);
  EXPECT_EQ(other->status, 200) << other->body;

  json reload = {{"lora_name", "a0"}, {"lora_path", ts->root + "/a0"}, {"replace", true}};
  auto replaced = cli.Post("/v1/load_lora_adapter", reload.dump(), "application/json");
  ASSERT_TRUE(replaced);
  EXPECT_EQ(replaced->status, 200) << replaced->body;
  auto again = complete("a0");
  ASSERT_TRUE(again);
  EXPECT_EQ(again->status, 200) << again->body;
  // a0 now holds a1's weights: the same greedy text as a1.
  EXPECT_EQ(json::parse(again->body)["choices"][0]["text"],
            json::parse(other->body)["choices"][0]["text"]);
}

// POST /v1/unload_lora_adapter: the adapter stops being served; unknown names and malformed
// bodies are clean errors naming lora_name; the others keep serving.
TEST(AdapterMetricsE2E, UnloadAdapter) {
  CHORUS_REQUIRE_SHARED_MODEL(kModel);
  SetMinLogLevel(LogLevel::kError);
  engine::EngineOptions eo;
  eo.max_running = 4;
  eo.max_batch_tokens = 64;
  auto ts = StartAdapterServer({4, 4}, 400, {}, eo);
  ASSERT_NE(ts, nullptr);
  httplib::Client cli("127.0.0.1", ts->server->port());
  cli.set_read_timeout(60, 0);
  auto post = [&](const std::string& path, const std::string& body) {
    return cli.Post(path, body, "application/json");
  };
  auto complete = [&](const std::string& model) {
    return post("/v1/completions",
                json{{"model", model}, {"prompt", "Once"}, {"max_tokens", 2}}.dump());
  };
  ASSERT_EQ(complete("a0")->status, 200);
  auto unloaded = post("/v1/unload_lora_adapter", R"({"lora_name":"a0"})");
  ASSERT_TRUE(unloaded);
  EXPECT_EQ(unloaded->status, 200) << unloaded->body;
  EXPECT_EQ(complete("a0")->status, 404);
  EXPECT_EQ(complete("a1")->status, 200);
  EXPECT_EQ(ts->registry->size(), 1u);
  for (const char* body : {R"({"lora_name":"a0"})", R"({"name":"a1"})", R"([1,2])"}) {
    auto r = post("/v1/unload_lora_adapter", body);
    ASSERT_TRUE(r);
    EXPECT_GE(r->status, 400) << body;
    EXPECT_LT(r->status, 500) << body;
    const json e = json::parse(r->body)["error"];
    if (std::string(body) != "[1,2]") {
      EXPECT_EQ(e["param"], "lora_name") << body << r->body;
    }
  }
  EXPECT_EQ(ts->registry->size(), 1u);
}

}  // namespace
}  // namespace chorus
