// Tenants end to end (server/tenants.h, docs/api.md "Tenants"): a real server over loopback
// serving stories260K with a shared adapter and three tenants. The matrix of answers: keys
// (401), adapter ownership across /v1/models, generation, load and unload (200 / 404 / 409),
// and each limit (429 with Retry-After), with the per-tenant series in /metrics.
#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "chorus/adapters/adapter_cache.h"
#include "chorus/adapters/lora/lora_files.h"
#include "chorus/adapters/registry.h"
#include "chorus/base/logging.h"
#include "chorus/engine/engine.h"
#include "chorus/model/loader.h"
#include "chorus/server/server.h"
#include "chorus/server/tenants.h"
#include "tests/testutil/testutil.h"

namespace chorus {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const char* kModel = "stories260K/stories260K.bin";
const char* kTok = "stories260K/tok512.bin";

constexpr const char* kTenants = R"({"tenants": {
  "acme": {"keys": ["sk-acme-0001"]},
  "blue": {"keys": ["sk-blue-0001", "sk-blue-0002"], "max_concurrent": 1},
  "slow": {"keys": ["sk-slow-0001"], "tokens_per_second": 20}
}})";

struct TenantServer {
  std::string root;
  std::shared_ptr<adapters::AdapterRegistry> registry;
  std::shared_ptr<adapters::AdapterCache> cache;
  std::shared_ptr<engine::Engine> engine;
  std::unique_ptr<server::Server> server;
  ~TenantServer() {
    if (server) {
      server->Drain(std::chrono::milliseconds(1000));
      server->Stop();
    }
  }
};

std::unique_ptr<TenantServer> Start() {
  const std::string models = testing::SharedModelsDir();
  auto mdl = model::LoadModel(models + "/" + kModel);
  auto tok = tokenizer::LoadTokenizer(models + "/" + kTok);
  EXPECT_TRUE(mdl.ok() && tok.ok());
  if (!mdl.ok() || !tok.ok()) return nullptr;
  const model::ModelConfig& cfg = (*mdl)->config();
  auto out = std::make_unique<TenantServer>();
  out->root = fs::canonical(testing::TempDir()).string() + "/tenants";
  fs::remove_all(out->root);
  for (const char* dir : {"shared/shared0", "uploads/mine", "uploads/theirs"}) {
    adapters::RandomLoraSpec spec;
    spec.rank = 4;
    spec.seed = std::hash<std::string>()(dir);
    EXPECT_TRUE(
        adapters::WritePeftLora(out->root + "/" + dir, adapters::MakeRandomLora(cfg, spec), cfg)
            .ok());
  }
  const std::string tenants_file = out->root + "/tenants.json";
  {
    std::ofstream f(tenants_file);
    f << kTenants;
  }
  auto tenants = server::Tenants::Load(tenants_file);
  EXPECT_TRUE(tenants.ok()) << tenants.status().ToString();
  if (!tenants.ok()) return nullptr;
  adapters::RegistryOptions ro;
  ro.adapter_roots = {out->root};
  ro.base = cfg;
  ro.base_model_name = "stories";
  auto reg = adapters::AdapterRegistry::Open(out->root + "/registry.json", ro);
  EXPECT_TRUE(reg.ok()) << reg.status().ToString();
  if (!reg.ok()) return nullptr;
  out->registry = std::move(*reg);
  EXPECT_TRUE(out->registry->RegisterDirectory(out->root + "/shared").ok());  // shared
  out->cache = std::make_shared<adapters::AdapterCache>(cfg, int64_t{64} << 20);
  server::ServerOptions so;
  so.port = 0;
  so.served_model_name = "stories";
  so.tenants = *tenants;
  auto srv = server::Server::Create(so);
  EXPECT_TRUE(srv.ok() && (*srv)->Start().ok());
  if (!srv.ok()) return nullptr;
  out->server = std::move(*srv);
  out->server->SetAdapters(out->registry, out->cache);
  engine::EngineOptions eo;
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

httplib::Headers Key(const std::string& key) {
  return key.empty() ? httplib::Headers{} : httplib::Headers{{"Authorization", "Bearer " + key}};
}

int Post(httplib::Client& cli, const std::string& key, const std::string& path, const json& body,
         std::string* retry_after = nullptr) {
  auto r = cli.Post(path, Key(key), body.dump(), "application/json");
  if (!r) return -1;
  if (retry_after) *retry_after = r->get_header_value("Retry-After");
  if (r->status >= 400) {  // every refusal is an OpenAI-shaped error
    auto j = json::parse(r->body, nullptr, false);
    EXPECT_TRUE(j.is_object() && j.contains("error")) << r->body;
  }
  return r->status;
}

int Generate(httplib::Client& cli, const std::string& key, const std::string& model,
             int max_tokens = 2, std::string* retry_after = nullptr) {
  return Post(cli, key, "/v1/completions",
              {{"model", model},
               {"prompt", "Once upon a time"},
               {"max_tokens", max_tokens},
               {"temperature", 0}},
              retry_after);
}

std::vector<std::string> Models(httplib::Client& cli, const std::string& key) {
  std::vector<std::string> ids;
  auto r = cli.Get("/v1/models", Key(key));
  EXPECT_TRUE(r && r->status == 200) << (r ? r->status : -1) << " " << (r ? r->body : "");
  if (!r || r->status != 200) return ids;
  const json list = json::parse(r->body);
  for (const auto& m : list["data"]) ids.push_back(m["id"].get<std::string>());
  return ids;
}

TEST(TenantsE2E, KeysOwnershipAndLimits) {
  CHORUS_REQUIRE_SHARED_MODEL(kModel);
  SetMinLogLevel(LogLevel::kError);
  auto ts = Start();
  ASSERT_NE(ts, nullptr);
  httplib::Client cli("127.0.0.1", ts->server->port());
  cli.set_read_timeout(60, 0);
  const std::string acme = "sk-acme-0001", blue = "sk-blue-0002", slow = "sk-slow-0001";

  // Keys: /health needs none; every other route needs a tenant's key.
  EXPECT_EQ(cli.Get("/health")->status, 200);
  for (const std::string& key : {std::string(), std::string("sk-nobody-01")}) {
    EXPECT_EQ(cli.Get("/v1/models", Key(key))->status, 401);
    EXPECT_EQ(cli.Get("/metrics", Key(key))->status, 401);
    EXPECT_EQ(Generate(cli, key, "stories"), 401);
  }
  // Shared: the base and the command-line adapter, for everyone.
  for (const std::string& key : {acme, blue, slow}) {
    EXPECT_EQ(Models(cli, key), (std::vector<std::string>{"stories", "shared0"}));
    EXPECT_EQ(Generate(cli, key, "shared0"), 200);
  }
  // acme loads "mine": its own; blue neither sees, uses, unloads nor replaces it.
  const json load_mine = {{"lora_name", "mine"}, {"lora_path", ts->root + "/uploads/mine"}};
  EXPECT_EQ(Post(cli, acme, "/v1/load_lora_adapter", load_mine), 200);
  EXPECT_EQ(Models(cli, acme), (std::vector<std::string>{"stories", "mine", "shared0"}));
  EXPECT_EQ(Models(cli, blue), (std::vector<std::string>{"stories", "shared0"}));
  EXPECT_EQ(Generate(cli, acme, "mine"), 200);
  EXPECT_EQ(Generate(cli, blue, "mine"), 404);
  // The 404 lists the models the caller may use: never another tenant's.
  for (const auto& [key, listed] : {std::pair{acme, true}, std::pair{blue, false}}) {
    auto r = cli.Post("/v1/completions", Key(key),
                      json{{"model", "nope"}, {"prompt", "x"}, {"max_tokens", 1}}.dump(),
                      "application/json");
    ASSERT_TRUE(r && r->status == 404);
    EXPECT_NE(r->body.find("`shared0`"), std::string::npos) << r->body;
    EXPECT_EQ(r->body.find("`mine`") != std::string::npos, listed) << r->body;
  }
  EXPECT_EQ(cli.Get("/v1/models/mine", Key(acme))->status, 200);
  EXPECT_EQ(cli.Get("/v1/models/mine", Key(blue))->status, 404);
  EXPECT_EQ(Post(cli, blue, "/v1/unload_lora_adapter", {{"lora_name", "mine"}}), 404);
  json replace = {
      {"lora_name", "mine"}, {"lora_path", ts->root + "/uploads/theirs"}, {"replace", true}};
  EXPECT_EQ(Post(cli, blue, "/v1/load_lora_adapter", replace), 409);  // the name is taken
  EXPECT_EQ(Generate(cli, acme, "mine"), 200);                        // still acme's
  EXPECT_EQ(Post(cli, acme, "/v1/load_lora_adapter", replace), 200);  // its owner may
  // A tenant cannot unload a shared adapter.
  EXPECT_EQ(Post(cli, blue, "/v1/unload_lora_adapter", {{"lora_name", "shared0"}}), 404);
  EXPECT_EQ(Generate(cli, blue, "shared0"), 200);
  // The owner persists with the registry.
  ASSERT_TRUE(ts->registry->Lookup("mine").has_value());
  EXPECT_EQ(ts->registry->Lookup("mine")->owner, "acme");
  EXPECT_EQ(Post(cli, acme, "/v1/unload_lora_adapter", {{"lora_name", "mine"}}), 200);
  EXPECT_EQ(Generate(cli, acme, "mine"), 404);

  // blue: max_concurrent 1. A streamed request whose client does not read holds its slot (its
  // stream stalls once the socket buffers fill); a second request is 429 until it goes away.
  const int sock = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(sock, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(ts->server->port()));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(sock, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  const std::string body =
      json{{"model", "stories"}, {"prompt", "Once"}, {"max_tokens", 400}, {"n", 16},
           {"ignore_eos", true}, {"stream", true}}
          .dump();
  const std::string http =
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " +
      std::string("sk-blue-0001") +
      "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
      "\r\n\r\n" + body;
  ASSERT_EQ(::send(sock, http.data(), http.size(), 0), static_cast<ssize_t>(http.size()));
  auto blue_in_flight = [&](int n) {
    auto m = cli.Get("/metrics", Key(acme));
    return m && m->body.find("chorus_tenant_requests_in_flight{tenant=\"blue\"} " +
                             std::to_string(n) + "\n") != std::string::npos;
  };
  bool in_flight = false;
  for (int i = 0; i < 2000 && !(in_flight = blue_in_flight(1)); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_TRUE(in_flight);
  std::string retry;
  EXPECT_EQ(Generate(cli, blue, "stories", 2, &retry), 429);
  EXPECT_FALSE(retry.empty());
  EXPECT_EQ(Generate(cli, acme, "stories"), 200);  // other tenants are not held back
  ::close(sock);                                   // the client goes away: its request ends
  bool released = false;
  for (int i = 0; i < 2000 && !(released = blue_in_flight(0)); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_TRUE(released);
  EXPECT_EQ(Generate(cli, blue, "stories"), 200);  // the slot is free again

  // slow: 20 tokens/s. One request of ~40 tokens puts it in debt: the next is 429 for ~1-2 s.
  EXPECT_EQ(Generate(cli, slow, "stories", 36), 200);
  EXPECT_EQ(Generate(cli, slow, "stories", 2, &retry), 429);
  ASSERT_FALSE(retry.empty());
  EXPECT_GE(std::stoi(retry), 1);
  EXPECT_LE(std::stoi(retry), 3);
  EXPECT_EQ(Generate(cli, acme, "stories"), 200);

  // Per-tenant series.
  auto m = cli.Get("/metrics", Key(acme));
  ASSERT_EQ(m->status, 200);
  EXPECT_NE(
      m->body.find("chorus_tenant_rejected_total{tenant=\"blue\",reason=\"max_concurrent\"} 1"),
      std::string::npos)
      << m->body;
  EXPECT_NE(
      m->body.find("chorus_tenant_rejected_total{tenant=\"slow\",reason=\"tokens_per_second\"} 1"),
      std::string::npos);
  EXPECT_NE(m->body.find("chorus_tenant_requests_in_flight{tenant=\"acme\"} 0"), std::string::npos);
}

TEST(TenantsFile, ErrorsNameTheLineOrTheField) {
  auto bad = server::ParseTenants("{\"tenants\": {\n  \"a\": {\"keys\": [\"sk-aaaa-0001\"],}\n}}",
                                  "t.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("t.json: line 2"), std::string::npos)
      << bad.status().message();
  struct Case {
    const char* text;
    const char* want;
  } cases[] = {
      {R"({"tenants": {}})", "no tenants"},
      {R"({"tenant": {}})", "expected"},
      {R"({"tenants": {"a b": {"keys": ["sk-aaaa-0001"]}}})", "tenant name"},
      {R"({"tenants": {"a": {"keys": []}}})", "'keys'"},
      {R"({"tenants": {"a": {"keys": ["short"]}}})", "every key"},
      {R"({"tenants": {"a": {"keys": ["sk-aaaa-0001"]}, "b": {"keys": ["sk-aaaa-0001"]}}})",
       "another tenant"},
      {R"({"tenants": {"a": {"keys": ["sk-aaaa-0001"], "max_concurrent": -1}}})", "max_concurrent"},
      {R"({"tenants": {"a": {"keys": ["sk-aaaa-0001"], "tokens_per_second": "x"}}})",
       "tokens_per_second"},
      {R"({"tenants": {"a": {"keys": ["sk-aaaa-0001"], "color": 1}}})", "unknown field 'color'"},
  };
  for (const Case& c : cases) {
    auto r = server::ParseTenants(c.text, "t.json");
    ASSERT_FALSE(r.ok()) << c.text;
    EXPECT_NE(r.status().message().find(c.want), std::string::npos) << r.status().message();
  }
  auto good = server::ParseTenants(kTenants, "t.json");
  ASSERT_TRUE(good.ok()) << good.status().ToString();
  EXPECT_EQ(good->size(), 3u);
}

}  // namespace
}  // namespace chorus
