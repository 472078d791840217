#include "chorus/server/server.h"

#include <dirent.h>
#include <httplib.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <optional>
#include <string_view>

#include "chorus/base/background_thread.h"
#include "chorus/base/logging.h"
#include "chorus/memory/kv_cache.h"
#include "chorus/model/forward.h"
#include "chorus/server/api_error.h"
#include "chorus/server/connection_pool.h"
#include "chorus/server/embeddings.h"
#include "chorus/server/finetune_routes.h"
#include "chorus/server/openai.h"
#include "chorus/server/prometheus.h"
#include "chorus/server/template_routes.h"

namespace chorus::server {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

// Exposes the listening socket so the accept backlog can be raised: the packaged library
// listens with a backlog of 5, which drops SYNs (1 s client retries) when hundreds of clients
// connect at once.
class HttpServer : public httplib::Server {
 public:
  int listen_fd() const { return static_cast<int>(svr_sock_.load()); }
};

constexpr int kListenBacklog = 1024;
// Bytes of served names an unknown-model error lists before "and N more".
constexpr size_t kUnknownModelListBytes = 160;
// While a streamed request produces nothing (queued), an SSE comment this often probes the
// connection, so a client that went away is noticed and its request cancelled.
constexpr auto kStreamProbeInterval = std::chrono::seconds(2);

// How often a handler waiting for a non-streamed response checks whether its client is still
// connected: well under one engine step at full batch, so a client that hangs up has its
// sequences cancelled (and KV blocks freed) within about one step.
constexpr auto kDisconnectPollInterval = std::chrono::milliseconds(20);
// Inputs of one /v1/embeddings request queued in the engine at a time.
constexpr size_t kEmbeddingWindow = 64;

// The socket of the connection a request arrived on, or -1. cpp-httplib 0.11 (Debian 12) gives
// handlers no access to it, so it is found among this process's sockets by the request's
// address pair; the handler's thread keeps it open until the handler returns.
int FindConnectionSocket(const httplib::Request& req) {
  if (req.local_port <= 0 || req.remote_port <= 0) return -1;
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  auto port_and_host = [](const sockaddr_storage& a, socklen_t len, std::string* host) {
    char buf[NI_MAXHOST];
    if (getnameinfo(reinterpret_cast<const sockaddr*>(&a), len, buf, sizeof(buf), nullptr, 0,
                    NI_NUMERICHOST) != 0) {
      return -1;
    }
    *host = buf;
    if (a.ss_family == AF_INET)
      return static_cast<int>(ntohs(reinterpret_cast<const sockaddr_in*>(&a)->sin_port));
    if (a.ss_family == AF_INET6)
      return static_cast<int>(ntohs(reinterpret_cast<const sockaddr_in6*>(&a)->sin6_port));
    return -1;
  };
  int found = -1;
  while (dirent* ent = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(ent->d_name, &end, 10);
    if (end == ent->d_name || *end != '\0' || fd == dirfd(dir)) continue;
    sockaddr_storage local{}, peer{};
    socklen_t local_len = sizeof(local), peer_len = sizeof(peer);
    if (getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&local), &local_len) != 0)
      continue;
    if (local.ss_family != AF_INET && local.ss_family != AF_INET6) continue;
    if (getpeername(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0)
      continue;
    std::string local_host, peer_host;
    if (port_and_host(local, local_len, &local_host) != req.local_port) continue;
    if (port_and_host(peer, peer_len, &peer_host) != req.remote_port ||
        peer_host != req.remote_addr)
      continue;
    found = static_cast<int>(fd);
    break;
  }
  closedir(dir);
  return found;
}

// True when the peer of `fd` has closed (or reset) the connection. Bytes of a pipelined next
// request do not count as a close.
bool PeerClosed(int fd) {
  pollfd p{.fd = fd, .events = POLLIN | POLLRDHUP, .revents = 0};
  if (poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) return true;
  if (p.revents & POLLIN) {
    char c;
    return recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
  }
  return false;
}

// Whether a waiting handler's client hung up, with the connection's socket looked up only at the
// first question: FindConnectionSocket scans the process's descriptors, which costs a
// millisecond or so under load, and most requests are answered before a handler first asks.
class ClientConnection {
 public:
  explicit ClientConnection(const httplib::Request& req) : req_(req) {}
  bool Gone() {
    if (fd_ == kNotLooked) fd_ = FindConnectionSocket(req_);
    return fd_ >= 0 && PeerClosed(fd_);
  }
  // Gone(), asked at most once per kDisconnectPollInterval (false in between): for a loop that
  // wakes on every event of its request.
  bool GoneByNow() {
    const auto now = Clock::now();
    if (now < next_check_) return false;
    next_check_ = now + kDisconnectPollInterval;
    return Gone();
  }

 private:
  static constexpr int kNotLooked = -2;
  const httplib::Request& req_;
  int fd_ = kNotLooked;
  Clock::time_point next_check_ = Clock::now() + kDisconnectPollInterval;
};

const char* RouteLabel(const std::string& path) {
  if (path == "/v1/completions") return "/v1/completions";
  if (path == "/v1/chat/completions") return "/v1/chat/completions";
  if (path == "/v1/embeddings") return "/v1/embeddings";
  if (path == "/v1/models" || path.starts_with("/v1/models/")) return "/v1/models";
  if (path == "/health") return "/health";
  if (path == "/metrics") return "/metrics";
  if (const char* p = TemplateRoutePath(path)) return p;
  if (path == "/v1/files" || path.starts_with("/v1/files/")) return "/v1/files";
  if (path.starts_with("/v1/fine_tuning/jobs")) return "/v1/fine_tuning/jobs";
  return "other";
}

// Methods each known route accepts (for 405 and Allow).
const char* AllowedMethods(const std::string& path) {
  if (path == "/v1/completions" || path == "/v1/chat/completions" || path == "/v1/embeddings")
    return "POST";
  if (TemplateRoutePath(path) != nullptr) return "POST";
  if (path == "/v1/models" || path.starts_with("/v1/models/") || path == "/health" ||
      path == "/metrics")
    return "GET";
  if (path == "/v1/files" || path == "/v1/fine_tuning/jobs") return "GET, POST";
  if (path.starts_with("/v1/files/")) return path.ends_with("/content") ? "GET" : "GET, DELETE";
  if (path.starts_with("/v1/fine_tuning/jobs/")) return path.ends_with("/cancel") ? "POST" : "GET";
  return nullptr;
}

// The answer to a request whose client hung up: nobody reads it; 499 (nginx's "client closed
// request") labels it in the counters.
void AnswerClientGone(httplib::Response& res) {
  res.status = 499;
  res.set_content(
      R"({"error":{"message":"client closed the connection","type":"invalid_request_error","param":null,"code":"client_closed_request"}})",
      "application/json");
}

void SendError(httplib::Response& res, const ApiError& e) {
  res.status = e.http_status;
  if (e.retry_after_s > 0) res.set_header("Retry-After", std::to_string(e.retry_after_s));
  res.set_content(e.ToJson(), "application/json");
}

// Why binding host:port failed (httplib only says that it did): "port P is already in use", or
// the system's reason.
Status BindError(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  if (int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &res); rc != 0) {
    return InvalidArgumentError("flag --host: cannot resolve " + host + ": " + gai_strerror(rc));
  }
  int err = 0;
  const int fd = socket(res->ai_family, res->ai_socktype, res->ai_protocol);
  if (fd >= 0) {
    int yes = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    if (bind(fd, res->ai_addr, res->ai_addrlen) != 0) err = errno;
    close(fd);
  } else {
    err = errno;
  }
  freeaddrinfo(res);
  if (err == EADDRINUSE) {
    return UnavailableError("flag --port: port " + service + " is already in use (on " + host +
                            "); stop the other server or choose another --port");
  }
  return UnavailableError("flag --host/--port: cannot listen on " + host + ":" + service + ": " +
                          (err != 0 ? std::strerror(err) : "unknown error"));
}

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

// True when an Authorization header value carries `key` as a bearer token. The scheme name is
// case-insensitive (RFC 9110 §11.1: "bearer KEY" is as good as "Bearer KEY"); the token is not.
// The token of an "Authorization: Bearer TOKEN" header value ("" when it is not one).
std::string_view BearerToken(std::string_view header) {
  constexpr std::string_view kScheme = "bearer";
  if (header.size() <= kScheme.size() || header[kScheme.size()] != ' ') return {};
  for (size_t i = 0; i < kScheme.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(header[i])) != kScheme[i]) return {};
  }
  std::string_view token = header.substr(kScheme.size());
  while (!token.empty() && token.front() == ' ') token.remove_prefix(1);
  while (!token.empty() && token.back() == ' ') token.remove_suffix(1);
  return token;
}

bool BearerMatches(std::string_view header, const std::string& key) {
  const std::string_view token = BearerToken(header);
  return !token.empty() && ConstantTimeEquals(token, key);
}

// The Access-Control-Allow-Origin value for a request from `origin` (empty: no CORS headers):
// "*" when every origin is allowed, else the origin itself when it is listed.
std::string AllowedOrigin(const std::vector<std::string>& allowed, const std::string& origin) {
  for (const std::string& a : allowed) {
    if (a == "*") return "*";
    if (!origin.empty() && a == origin) return origin;
  }
  return "";
}

// One generation request, shared by the handler and (when streamed) the content provider.
struct Generation {
  ~Generation() {
    if (tenant) {
      const Usage u = GetUsage();
      tenant->Finish(u.prompt_tokens + u.completion_tokens, reserved_tokens);
    }
  }
  // The tenant that was admitted for this request (null: no tenants), the tokens it reserved
  // at admission; charged what the request used when it ends.
  std::shared_ptr<Tenant> tenant;
  int64_t reserved_tokens = 0;
  ApiRequest req;
  std::unique_ptr<ResponseBuilder> builder;
  std::vector<std::shared_ptr<engine::RequestHandle>> handles;  // one per prompt
  std::vector<int> finished;                                    // per handle: choices ended
  std::optional<ApiError> error;  // a choice ended cancelled (shutdown) or in an engine error
  size_t rr = 0;                  // round-robin cursor over handles
  bool opened = false;
  // Events read before the stream opened (a streamed request waits for its first event when
  // it may be answered 429 at once); the stream sends them first.
  std::vector<std::pair<size_t, engine::StreamEvent>> early;
  bool closed = false;
  Clock::time_point last_write = Clock::now();

  bool AllFinished() const {
    for (size_t i = 0; i < handles.size(); ++i)
      if (finished[i] < handles[i]->n_choices()) return false;
    return true;
  }
  void CancelAll() {
    for (auto& h : handles) h->Cancel();
  }
  Usage GetUsage() const {
    Usage u;
    for (const auto& h : handles) {
      u.prompt_tokens += h->prompt_tokens();
      u.completion_tokens += h->completion_tokens();
    }
    if (req.echo_only) u.completion_tokens = 0;  // its one sampled token is not returned
    return u;
  }
  void OnEvent(size_t which, const engine::StreamEvent& ev) {
    if (ev.finish == engine::FinishReason::kNone) return;
    ++finished[which];
    if (ev.finish == engine::FinishReason::kCancelled && !error) {
      error =
          ErrorFromStatus(UnavailableError("the request was aborted: the server is shutting down"));
    } else if (ev.finish == engine::FinishReason::kError) {
      // An adapter that failed to load keeps its own code (e.g. a file that became unreadable
      // on the server's side is not the client's fault: 5xx with the reason).
      error =
          ErrorFromStatus(Status(ev.error_code, "generation failed: " + ev.error.substr(0, 300)));
    }
  }
  // The next event of any unfinished handle within `timeout`.
  bool Next(std::chrono::milliseconds timeout, size_t* which, engine::StreamEvent* out) {
    size_t active = 0, first = handles.size();
    for (size_t i = 0; i < handles.size(); ++i) {
      if (finished[i] < handles[i]->n_choices()) {
        ++active;
        if (first == handles.size()) first = i;
      }
    }
    if (active == 0) return false;
    if (active == 1) {
      auto ev = handles[first]->Next(timeout);
      if (!ev) return false;
      *which = first;
      *out = std::move(*ev);
      return true;
    }
    // Several prompts: poll them in turn, then wait briefly on one.
    for (size_t k = 0; k < handles.size(); ++k) {
      const size_t i = (rr + k) % handles.size();
      if (finished[i] >= handles[i]->n_choices()) continue;
      if (auto ev = handles[i]->Next(std::chrono::milliseconds(0))) {
        rr = i + 1;
        *which = i;
        *out = std::move(*ev);
        return true;
      }
    }
    auto ev = handles[first]->Next(std::min(timeout, std::chrono::milliseconds(5)));
    if (!ev) return false;
    *which = first;
    *out = std::move(*ev);
    return true;
  }
};

}  // namespace

struct Server::Impl {
  Server* self;
  HttpServer http;
  HttpCounters counters;
  std::shared_ptr<engine::Engine> engine;               // set once, before ready_
  std::shared_ptr<adapters::AdapterRegistry> registry;  // null = base model only
  std::shared_ptr<adapters::AdapterCache> adapter_cache;
  // The adapter routes' registry work, at nice 10: on a small machine it would otherwise take CPU
  // from the steps of the requests running beside it (base/background_thread.h).
  BackgroundThread admin_thread{10};
  std::shared_ptr<FinetuneApi> finetune;  // null: fine-tuning routes answer 404
  tokenizer::ChatTemplate chat_template = tokenizer::DefaultChatTemplate();
  ApiContext ctx;
  int64_t kv_block_bytes = 0;
  int64_t created = std::time(nullptr);
  bool stopped = false;

  explicit Impl(Server* s) : self(s) {}

  void Routes();
  void FinetuneRoutes();
  void HandleEmbeddings(const httplib::Request& req, const std::string& body,
                        httplib::Response& res);
  // Charges `reserve` tokens to `tenant` for `gen` (charged what it used when it ends), or answers
  // 429 with Retry-After when the tenant is over a limit and returns false.
  static bool AdmitForTenant(std::shared_ptr<Tenant> tenant, int64_t reserve, Generation* gen,
                             httplib::Response& res) {
    if (auto refusal = tenant->Admit(reserve)) {
      ApiError e = ErrorFromStatus(ResourceExhaustedError(
          "tenant '" + tenant->name() + "' is over its " + refusal->reason +
          " limit; retry after " + std::to_string(refusal->retry_after_s) + " s"));
      SendError(res, e);
      res.set_header("Retry-After", std::to_string(refusal->retry_after_s));
      return false;
    }
    gen->tenant = std::move(tenant);
    gen->reserved_tokens = reserve;
    return true;
  }
  void HandleGenerate(ApiKind kind, const httplib::Request& req, const std::string& body,
                      httplib::Response& res);
  json ModelJson() const;
  json AdapterJson(const adapters::AdapterInfo& a) const;
  // A whole fine-tune of --swap-full-models named `name`, or null.
  const adapters::VariantRef* FullModel(const std::string& name) const {
    if (!engine) return nullptr;
    for (const adapters::VariantRef& r : engine->full_models())
      if (r.name == name) return &r;
    return nullptr;
  }
  json FullModelJson(const adapters::VariantRef& r) const {
    return {{"id", r.name},   {"object", "model"},      {"owned_by", "chorus"},
            {"root", r.path}, {"parent", nullptr},      {"max_model_len", ctx.max_context},
            {"kind", r.kind}, {"version", r.id.version}};
  }
  // The one step from a request's `model` to what the engine loads: the registered variant's
  // reference into gen->variant, or 404 (unknown) / 400 (unavailable). Reads no file, except
  // when a name unknown to the registry is looked up in the --lora-resolve-dir directories.
  std::optional<ApiError> ResolveVariant(const std::string& name, const Tenant* tenant,
                                         engine::GenerationRequest* gen) const;
  // --lora-resolve-dir: registers DIR/NAME (or DIR/NAME.gguf) of the first directory that has
  // it; nullopt when none does; the registry's error when it is not a servable adapter.
  Result<std::optional<adapters::AdapterInfo>> RegisterFromResolveDirs(
      const std::string& name) const;
  // The body of an adapter endpoint, once the server is ready, serves adapters, and the body is
  // a JSON object with a string lora_name; otherwise the error is sent and nullopt returned.
  std::optional<json> AdapterRequest(const std::string& body, httplib::Response& res) const;
  void HandleLoadAdapter(const httplib::Request& req, const std::string& body,
                         httplib::Response& res);
  void HandleUnloadAdapter(const httplib::Request& req, const std::string& body,
                           httplib::Response& res);
  // The tenant of a request (null without tenants; the pre-routing check already refused a
  // request without a tenant's key).
  std::shared_ptr<Tenant> TenantOf(const httplib::Request& req) const {
    if (!self->opts_.tenants) return nullptr;
    return self->opts_.tenants->ForKey(BearerToken(req.get_header_value("Authorization")));
  }
  // Whether `tenant` may see and use adapter `a`: shared ones, and its own.
  static bool Visible(const adapters::AdapterInfo& a, const Tenant* tenant) {
    return a.owner.empty() || (tenant != nullptr && a.owner == tenant->name());
  }
  // "The model `x` does not exist" plus the names a request may use (base, then adapters).
  // Only the adapters `tenant` may see are named (another tenant's would leak).
  ApiError UnknownModel(const std::string& name, const Tenant* tenant) const;
  std::optional<ApiError> Unavailable() const {
    if (self->draining()) return ErrorFromStatus(UnavailableError("the server is shutting down"));
    if (!self->ready()) return ErrorFromStatus(UnavailableError("the model is loading"));
    return std::nullopt;
  }
};

Status ServerOptions::Validate() const {
  if (port < 0 || port > 65535) return InvalidArgumentError("port must be in [0, 65535]");
  if (max_body_bytes < 1024 || max_body_bytes > (int64_t{1} << 34)) {
    return InvalidArgumentError("max-body-bytes must be in [1024, 16 GiB]");
  }
  if (max_connections < 1 || max_connections > 65536)
    return InvalidArgumentError("max-connections must be in [1, 65536]");
  if (served_model_name.empty()) return InvalidArgumentError("served-model-name must not be empty");
  if (tenants && !api_key.empty()) {
    return InvalidArgumentError(
        "api-key and tenants exclude each other (with --tenants, the tenants' keys are the keys)");
  }
  if (tool_call_parser != "auto" && !ToolSyntaxFromName(tool_call_parser)) {
    return InvalidArgumentError(
        "tool-call-parser must be auto, hermes, llama3_json, mistral or "
        "generic, got '" +
        tool_call_parser + "'");
  }
  if (pooling != "auto" && !engine::ParsePooling(pooling))
    return InvalidArgumentError("pooling must be auto, last, mean or cls, got '" + pooling + "'");
  if (metrics_top_adapters < 0 || metrics_top_adapters > 10000) {
    return InvalidArgumentError("metrics-top-adapters must be in [0, 10000]");
  }
  if (read_timeout_s < 1 || write_timeout_s < 1 || keep_alive_timeout_s < 1) {
    return InvalidArgumentError("timeouts must be at least 1 s");
  }
  return OkStatus();
}

Result<std::unique_ptr<Server>> Server::Create(ServerOptions opts) {
  CHORUS_RETURN_IF_ERROR(opts.Validate());
  std::unique_ptr<Server> s(new Server());
  s->opts_ = std::move(opts);
  s->impl_ = std::make_unique<Impl>(s.get());
  s->impl_->Routes();
  return s;
}

Server::~Server() {
  if (impl_ && impl_->engine && !draining_.load()) Drain(std::chrono::milliseconds(0));
  Stop();
}

std::string Server::url() const {
  const std::string host =
      opts_.host.find(':') != std::string::npos ? "[" + opts_.host + "]" : opts_.host;
  return "http://" + host + ":" + std::to_string(port_);
}

Status Server::Start() {
  auto& http = impl_->http;
  const int n_threads = opts_.max_connections;
  // Threads started as connections need them, the most recently idle one reused first
  // (connection_pool.h: httplib's pool of --max-connections threads crept up in memory).
  http.new_task_queue = [n_threads] { return new ConnectionPool(static_cast<size_t>(n_threads)); };
  http.set_payload_max_length(static_cast<size_t>(opts_.max_body_bytes));
  http.set_read_timeout(opts_.read_timeout_s);
  http.set_write_timeout(opts_.write_timeout_s);
  http.set_keep_alive_timeout(opts_.keep_alive_timeout_s);
  http.set_keep_alive_max_count(1000);
  http.set_tcp_nodelay(true);
  // httplib's default socket options include SO_REUSEPORT, with which a second server binds a
  // port that is in use and the kernel splits connections between the two.
  const bool reuse_port = opts_.reuse_port;
  http.set_socket_options([reuse_port](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));  // restart over TIME_WAIT
    if (reuse_port) setsockopt(sock, SOL_SOCKET, SO_REUSEPORT, &yes, sizeof(yes));
  });
  if (opts_.port == 0) {
    port_ = http.bind_to_any_port(opts_.host);
    if (port_ <= 0) return UnavailableError("cannot bind " + opts_.host + " on any port");
  } else {
    if (!http.bind_to_port(opts_.host, opts_.port)) return BindError(opts_.host, opts_.port);
    port_ = opts_.port;
  }
  if (int fd = http.listen_fd(); fd >= 0)
    ::listen(fd, kListenBacklog);  // raise the backlog (see HttpServer)
  listen_thread_ = std::thread([this] {
    impl_->http.listen_after_bind();
    listen_returned_.store(true);
  });
  return OkStatus();
}

void Server::SetEngine(std::shared_ptr<engine::Engine> eng) {
  CHORUS_CHECK(eng != nullptr);
  // Cold adapters are loaded by the engine's loader threads, through the same host cache.
  CHORUS_CHECK(!impl_->registry || eng->options().adapter_cache == impl_->adapter_cache)
      << "an engine serving adapters must load them through the server's adapter cache";
  auto& ctx = impl_->ctx;
  const auto& tok = eng->tokenizer();
  const auto& cfg = eng->model().config();
  // Which template chat requests are rendered with is said once, at startup; one that does not
  // compile leaves chat requests failing (the app refuses to start before this happens).
  auto choice = ChooseChatTemplate(tok, opts_.chat_template, opts_.chat_template_label);
  if (choice.ok()) {
    impl_->chat_template = std::move(choice->tmpl);
    chat_template_note_ = choice->note;
  } else {
    chat_template_note_ = "none (" + choice.status().message() + ")";
    CHORUS_LOG(ERROR) << choice.status().message();
  }
  ctx.tok = &tok;
  ctx.chat_template = choice.ok() ? &impl_->chat_template : nullptr;
  ctx.tool_syntax = ToolSyntaxFromName(opts_.tool_call_parser);
  if (ctx.tool_syntax) {
    tool_parser_note_ = std::string(ToolSyntaxName(*ctx.tool_syntax)) + " (--tool-call-parser)";
  } else if (ctx.chat_template) {
    tool_parser_note_ = std::string(ToolSyntaxName(DetectToolSyntax(ctx.chat_template->source()))) +
                        " (detected from the chat template)";
  }
  ctx.vocab_size = static_cast<int32_t>(std::min<int64_t>(tok.vocab_size(), cfg.vocab_size));
  const int64_t block = eng->options().block_size;
  ctx.max_context = std::min<int64_t>(eng->context_length(), eng->max_kv_tokens());
  ctx.served_model = opts_.served_model_name;
  ctx.serves_variants = true;  // HandleGenerate resolves them (or answers 404 with the names)
  impl_->kv_block_bytes = model::KvLayoutFor(cfg, block, eng->options().kv_dtype).PageBytes();
  impl_->engine = std::move(eng);
  ready_.store(true, std::memory_order_release);
}

void Server::Drain(std::chrono::milliseconds drain) {
  if (draining_.exchange(true)) return;
  // The running fine-tuning job first: it is interrupted (resumes at the next start), never
  // cancelled by the engine closing its gate under it.
  if (impl_->finetune) impl_->finetune->Stop();
  if (ready()) impl_->engine->Shutdown(drain);
  // Every choice has now ended (finished or aborted); wait for the responses to be written.
  // A client that stops reading is cut off by the write timeout, so this is bounded.
  const auto deadline = Clock::now() + std::chrono::seconds(opts_.write_timeout_s + 5);
  while (in_flight_.load() > 0 && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
}

void Server::Stop() {
  if (!impl_ || impl_->stopped) return;
  impl_->stopped = true;
  // httplib's stop() does nothing until the listen loop has started running, so a Stop() right
  // after Start() (a startup that fails at once) could leave the loop running forever and the
  // join below hanging: repeat it until the loop has ended.
  if (listen_thread_.joinable()) {
    while (!listen_returned_.load()) {
      impl_->http.stop();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    listen_thread_.join();
  }
}

void Server::SetFinetuning(std::shared_ptr<FinetuneApi> api) { impl_->finetune = std::move(api); }

void Server::SetAdapters(std::shared_ptr<adapters::AdapterRegistry> registry,
                         std::shared_ptr<adapters::AdapterCache> cache) {
  impl_->registry = std::move(registry);
  impl_->adapter_cache = std::move(cache);
}

std::optional<ApiError> Server::Impl::ResolveVariant(const std::string& name, const Tenant* tenant,
                                                     engine::GenerationRequest* gen) const {
  // Whole fine-tunes of --swap-full-models (engine/full_models.h): fixed at start-up, shared by
  // every tenant, loaded by the engine when the scheduler swaps them in.
  if (const adapters::VariantRef* full = FullModel(name)) {
    gen->variant = *full;
    return std::nullopt;
  }
  auto info = registry ? registry->Lookup(name) : std::nullopt;
  if (!info && registry && !self->opts_.lora_resolve_dirs.empty()) {
    Result<std::optional<adapters::AdapterInfo>> found = RegisterFromResolveDirs(name);
    if (!found.ok()) return ErrorFromStatus(found.status(), "model");
    info = std::move(*found);
  }
  if (!info || !Visible(*info, tenant)) return UnknownModel(name, tenant);
  if (!info->available) {
    return ErrorFromStatus(
        FailedPreconditionError("adapter '" + info->name + "' is unavailable: " + info->problem),
        "model");
  }
  // Name → VariantRef is all the server does: the engine's residency brings the weights from
  // the host cache or, on its loader threads, from disk. No adapter file is read here.
  gen->variant = info->ref();
  return std::nullopt;
}

Result<std::optional<adapters::AdapterInfo>> Server::Impl::RegisterFromResolveDirs(
    const std::string& name) const {
  // A plain file name only: never a path out of the directory, never a hidden entry.
  if (name.empty() || name.size() > 128 || name[0] == '.' ||
      name.find_first_of("/\\") != std::string::npos)
    return std::optional<adapters::AdapterInfo>();
  for (const std::string& dir : self->opts_.lora_resolve_dirs) {
    for (const std::string& candidate : {dir + "/" + name, dir + "/" + name + ".gguf"}) {
      std::error_code ec;
      if (!std::filesystem::exists(candidate, ec)) continue;
      Result<adapters::AdapterInfo> info = registry->Register(name, candidate);
      if (info.ok()) {
        CHORUS_LOG(INFO) << "registered adapter '" << name << "' from " << candidate
                         << " on its first request (--lora-resolve-dir)";
        return std::optional<adapters::AdapterInfo>(std::move(*info));
      }
      // Another request registered it meanwhile.
      if (info.status().code() == StatusCode::kAlreadyExists) return registry->Lookup(name);
      return info.status().WithContext("adapter '" + name + "' found by --lora-resolve-dir at " +
                                       candidate);
    }
  }
  return std::optional<adapters::AdapterInfo>();
}

ApiError Server::Impl::UnknownModel(const std::string& name, const Tenant* tenant) const {
  // The base first, then adapters in name order, while the list stays short (error messages
  // are kept small); the rest are counted and /v1/models lists them all.
  std::string list = "`" + self->opts_.served_model_name + "`";
  int64_t more = 0;
  if (engine) {
    for (const adapters::VariantRef& r : engine->full_models()) {
      if (more == 0 && list.size() + r.name.size() + 4 <= kUnknownModelListBytes) {
        list += ", `" + r.name + "`";
      } else {
        ++more;
      }
    }
  }
  if (registry) {
    for (const auto& a : registry->List()) {
      if (!a.available || !Visible(a, tenant)) continue;
      if (more == 0 && list.size() + a.name.size() + 4 <= kUnknownModelListBytes) {
        list += ", `" + a.name + "`";
      } else {
        ++more;
      }
    }
  }
  if (more > 0) list += " and " + std::to_string(more) + " more (GET /v1/models)";
  ApiError e = NotFound(
      "The model `" + name.substr(0, 64) + "` does not exist. Served models: " + list + ".",
      "model_not_found");
  e.param = "model";
  return e;
}

json Server::Impl::AdapterJson(const adapters::AdapterInfo& a) const {
  return {{"id", a.name},
          {"object", "model"},
          {"created", a.created},
          {"owned_by", "chorus"},
          {"root", a.path},
          {"parent", self->opts_.served_model_name},
          {"max_model_len", ctx.max_context},
          {"kind", a.kind},  // "lora" or "delta" (a compressed full fine-tune)
          {"lora_rank", a.rank},
          {"target_modules", a.target_modules},
          {"version", a.version}};
}

std::optional<json> Server::Impl::AdapterRequest(const std::string& body,
                                                 httplib::Response& res) const {
  // The registry is set while the model loads: until ready, answer 503 as generation does.
  std::optional<ApiError> e = Unavailable();
  json j;
  if (!e && !registry) {
    e = NotFound("adapters are not enabled on this server (start it with --adapter-root)");
  }
  if (!e) {
    j = json::parse(body, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
      e = BadRequest("request body must be a JSON object");
    } else if (auto name = j.find("lora_name"); name == j.end() || !name->is_string()) {
      e = BadRequest("lora_name must be a string", "lora_name");
    }
  }
  if (e) {
    SendError(res, *e);
    return std::nullopt;
  }
  return j;
}

void Server::Impl::HandleLoadAdapter(const httplib::Request& http_req, const std::string& body,
                                     httplib::Response& res) {
  const std::shared_ptr<Tenant> tenant = TenantOf(http_req);
  std::optional<json> j = AdapterRequest(body, res);
  if (!j) return;
  auto name = j->find("lora_name");
  auto path = j->find("lora_path");
  if (path == j->end() || !path->is_string())
    return SendError(res, BadRequest("lora_path must be a string", "lora_path"));
  bool replace = false;
  if (auto r = j->find("replace"); r != j->end()) {
    if (!r->is_boolean()) return SendError(res, BadRequest("replace must be a boolean", "replace"));
    replace = r->get<bool>();
  }
  const std::string& lora_name = name->get_ref<const std::string&>();
  if (!adapters::IsValidAdapterName(lora_name)) {
    return SendError(
        res, BadRequest("lora_name must be 1-128 characters of [A-Za-z0-9._:/-]", "lora_name"));
  }
  if (lora_name == self->opts_.served_model_name) {
    return SendError(res, BadRequest("lora_name is the base model's name", "lora_name"));
  }
  // With tenants, `ft:` names are the fine-tuning jobs' (finetune_routes.h): a tenant that took
  // the name another tenant's job will register would fail that job.
  if (tenant && finetune && lora_name.starts_with("ft:")) {
    return SendError(res, BadRequest("lora_name: names starting with `ft:` are reserved for the "
                                     "adapters of fine-tuning jobs",
                                     "lora_name"));
  }
  // Reading, validating and fingerprinting the files runs below the engine's priority.
  Result<adapters::AdapterInfo> info = InternalError("adapter registration did not run");
  admin_thread.RunAndWait([&] {
    info = registry->Register(lora_name, path->get<std::string>(), replace,
                              tenant ? tenant->name() : "");
  });
  if (!info.ok()) {
    ApiError e = ErrorFromStatus(info.status(), "lora_path");
    if (info.status().code() == StatusCode::kAlreadyExists) {
      e.http_status = 409;
      e.code = "already_exists";
      e.param = "lora_name";
      e.message += " (pass \"replace\": true to replace it)";
    }
    return SendError(res, e);
  }
  adapter_cache->Erase(info->name);  // a replaced adapter never reuses its predecessor's weights
  if (engine) engine->ForgetAdapter(info->name);  // nor its pool copy
  res.set_content("Success: LoRA adapter '" + info->name + "' added successfully.", "text/plain");
}

void Server::Impl::HandleUnloadAdapter(const httplib::Request& http_req, const std::string& body,
                                       httplib::Response& res) {
  std::optional<json> j = AdapterRequest(body, res);
  if (!j) return;
  auto name = j->find("lora_name");
  // A tenant unloads only its own adapters; another's (or a shared one) is "not registered".
  const std::shared_ptr<Tenant> tenant = TenantOf(http_req);
  Status s;
  admin_thread.RunAndWait([&] {
    s = registry->Unregister(name->get<std::string>(),
                             tenant ? std::optional<std::string>(tenant->name()) : std::nullopt);
  });
  if (!s.ok()) return SendError(res, ErrorFromStatus(s, "lora_name"));
  // Running requests hold their own reference and finish; the weights are freed after them.
  adapter_cache->Erase(name->get<std::string>());
  if (engine) engine->ForgetAdapter(name->get<std::string>());  // pool copy freed after its users
  res.set_content("Success: LoRA adapter '" + name->get<std::string>() + "' removed successfully.",
                  "text/plain");
}

json Server::Impl::ModelJson() const {
  return {{"id", self->opts_.served_model_name},
          {"object", "model"},
          {"created", created},
          {"owned_by", "chorus"},
          {"root", self->opts_.served_model_name},
          {"parent", nullptr},
          {"max_model_len", ctx.max_context}};
}

void Server::Impl::FinetuneRoutes() {
  // Every fine-tuning route: 503 until ready (the job queue needs the loaded model), 404 when the
  // server keeps no fine-tuning state (no adapter registry).
  auto with_api = [this](httplib::Response& res) -> FinetuneApi* {
    if (auto e = Unavailable()) {
      SendError(res, *e);
      return nullptr;
    }
    if (!finetune) {
      SendError(res, NotFound("fine-tuning is not enabled on this server (start it with an "
                              "adapter registry: --registry, --adapter-root or --finetune-dir)"));
      return nullptr;
    }
    return finetune.get();
  };
  // The caller's tenant ("" without tenants): files and jobs are scoped to it
  // (finetune_routes.h).
  auto tenant = [this](const httplib::Request& req) {
    const std::shared_ptr<Tenant> t = TenantOf(req);
    return t ? t->name() : std::string();
  };
  auto send = [](httplib::Response& res, FinetuneReply r) {
    res.status = r.status;
    res.set_content(std::move(r.body), r.content_type);
  };
  // A plain handler: httplib reads the body (up to --max-body-bytes, else 413) and parses the
  // multipart form into req.files.
  http.Post(
      "/v1/files", [with_api, send, tenant](const httplib::Request& req, httplib::Response& res) {
        FinetuneApi* api = with_api(res);
        if (!api) return;
        if (!req.is_multipart_form_data()) {
          ApiError e = BadRequest("POST /v1/files takes multipart/form-data (fields file, purpose)",
                                  std::string(), "unsupported_media_type");
          e.http_status = 415;
          return SendError(res, e);
        }
        const bool has_file = req.has_file("file");
        const httplib::MultipartFormData file = req.get_file_value("file");
        const std::string purpose =
            req.has_file("purpose") ? req.get_file_value("purpose").content : std::string();
        send(res, api->UploadFile(file.filename, purpose, file.content, has_file, tenant(req)));
      });
  http.Get(
      "/v1/files", [with_api, send, tenant](const httplib::Request& req, httplib::Response& res) {
        if (FinetuneApi* api = with_api(res)) {
          send(res, api->ListFiles(req.get_param_value("purpose"), req.get_param_value("after"),
                                   req.get_param_value("limit"), tenant(req)));
        }
      });
  http.Get(R"(/v1/files/([^/]+))",
           [with_api, send, tenant](const httplib::Request& req, httplib::Response& res) {
             if (FinetuneApi* api = with_api(res)) {
               send(res, api->GetFile(req.matches[1].str(), tenant(req)));
             }
           });
  http.Get(R"(/v1/files/([^/]+)/content)",
           [with_api, send, tenant](const httplib::Request& req, httplib::Response& res) {
             if (FinetuneApi* api = with_api(res)) {
               send(res, api->FileContent(req.matches[1].str(), tenant(req)));
             }
           });
  http.Delete(R"(/v1/files/([^/]+))",
              [with_api, send, tenant](const httplib::Request& req, httplib::Response& res) {
                if (FinetuneApi* api = with_api(res)) {
                  send(res, api->DeleteFile(req.matches[1].str(), tenant(req)));
                }
              });
  http.Post("/v1/fine_tuning/jobs",
            [with_api, send, tenant](const httplib::Request& req, httplib::Response& res,
                                     const httplib::ContentReader& reader) {
              FinetuneApi* api = with_api(res);
              if (!api) return;
              std::string body;
              if (!reader([&body](const char* data, size_t n) {
                    body.append(data, n);
                    return true;
                  })) {
                if (res.status < 400) res.status = 400;
                return;
              }
              send(res, api->CreateJob(body, tenant(req)));
            });
  http.Get("/v1/fine_tuning/jobs",
           [with_api, send, tenant](const httplib::Request& req, httplib::Response& res) {
             if (FinetuneApi* api = with_api(res)) {
               send(res, api->ListJobs(req.get_param_value("after"), req.get_param_value("limit"),
                                       tenant(req)));
             }
           });
  http.Get(R"(/v1/fine_tuning/jobs/([^/]+))",
           [with_api, send, tenant](const httplib::Request& req, httplib::Response& res) {
             if (FinetuneApi* api = with_api(res)) {
               send(res, api->GetJob(req.matches[1].str(), tenant(req)));
             }
           });
  http.Get(R"(/v1/fine_tuning/jobs/([^/]+)/events)",
           [with_api, send, tenant](const httplib::Request& req, httplib::Response& res) {
             if (FinetuneApi* api = with_api(res)) {
               send(res, api->ListEvents(req.matches[1].str(), req.get_param_value("after"),
                                         req.get_param_value("limit"), tenant(req)));
             }
           });
  http.Get(R"(/v1/fine_tuning/jobs/([^/]+)/checkpoints)",
           [with_api, send, tenant](const httplib::Request& req, httplib::Response& res) {
             if (FinetuneApi* api = with_api(res)) {
               send(res, api->ListCheckpoints(req.matches[1].str(), req.get_param_value("after"),
                                              req.get_param_value("limit"), tenant(req)));
             }
           });
  http.Post(R"(/v1/fine_tuning/jobs/([^/]+)/cancel)",
            [with_api, send, tenant](const httplib::Request& req, httplib::Response& res,
                                     const httplib::ContentReader& reader) {
              reader([](const char*, size_t) { return true; });  // no body expected
              if (FinetuneApi* api = with_api(res)) {
                send(res, api->CancelJob(req.matches[1].str(), tenant(req)));
              }
            });
}

void Server::Impl::Routes() {
  const ServerOptions& opts = self->opts_;

  // CORS headers go on every answer to an allowed origin (set here, before any handler runs, so
  // errors and streams carry them too). A preflight OPTIONS is answered here without the API key:
  // browsers never send credentials with it.
  http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    const std::string allow_origin =
        AllowedOrigin(self->opts_.allowed_origins, req.get_header_value("Origin"));
    if (!allow_origin.empty()) {
      res.set_header("Access-Control-Allow-Origin", allow_origin);
      if (allow_origin != "*") res.set_header("Vary", "Origin");
    }
    if (req.method == "OPTIONS") {
      res.status = 204;
      const char* allow = AllowedMethods(req.path);
      res.set_header("Allow", allow ? std::string(allow) + ", OPTIONS" : std::string("OPTIONS"));
      if (!allow_origin.empty()) {
        res.set_header("Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS");
        const std::string asked = req.get_header_value("Access-Control-Request-Headers");
        res.set_header("Access-Control-Allow-Headers",
                       asked.empty() ? std::string("Authorization, Content-Type") : asked);
        res.set_header("Access-Control-Max-Age", "600");
      }
      return httplib::Server::HandlerResponse::Handled;
    }
    if (req.path == "/health") return httplib::Server::HandlerResponse::Unhandled;
    if (self->opts_.tenants) {
      if (!TenantOf(req)) {
        SendError(res, ErrorFromStatus(UnauthenticatedError("missing or unknown tenant key")));
        res.set_header("WWW-Authenticate", "Bearer");
        return httplib::Server::HandlerResponse::Handled;
      }
      return httplib::Server::HandlerResponse::Unhandled;
    }
    const std::string& key = self->opts_.api_key;
    if (key.empty()) return httplib::Server::HandlerResponse::Unhandled;
    if (!BearerMatches(req.get_header_value("Authorization"), key)) {
      SendError(res, ErrorFromStatus(UnauthenticatedError("missing or incorrect API key")));
      res.set_header("WWW-Authenticate", "Bearer");
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });

  // Errors httplib produces itself (no route, body too large, bad request line) get OpenAI's
  // body; a known route with another method is 405.
  const int64_t max_body = opts.max_body_bytes;
  http.set_error_handler(httplib::Server::HandlerWithResponse(
      [max_body](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty()) return httplib::Server::HandlerResponse::Handled;  // ours already
        ApiError e;
        e.http_status = res.status;
        if (res.status == 404) {
          if (const char* allow = AllowedMethods(req.path)) {
            e.http_status = 405;
            e.message = "method not allowed; use " + std::string(allow);
            e.code = "method_not_allowed";
            res.set_header("Allow", allow);
          } else {
            e.message = "no such route";
            e.code = "not_found";
          }
        } else if (res.status == 413) {
          e.message = "request body is larger than " + std::to_string(max_body) + " bytes";
          e.code = "request_too_large";
        } else if (res.status < 500) {
          e.message = "malformed HTTP request";
        } else {
          e.type = "server_error";
          e.message = "internal error";
        }
        res.status = e.http_status;
        res.set_content(e.ToJson(), "application/json");
        return httplib::Server::HandlerResponse::Handled;
      }));

  http.set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
        SendError(res, ErrorFromStatus(InternalError("internal error")));
      });

  http.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    counters.Add(RouteLabel(req.path), res.status);
  });

  http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (self->draining()) {
      res.status = 503;
      res.set_content(R"({"status":"draining"})", "application/json");
    } else if (!self->ready()) {
      res.status = 503;
      res.set_content(R"({"status":"loading"})", "application/json");
    } else {
      res.set_content(R"({"status":"ok"})", "application/json");
    }
  });

  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    const engine::EngineMetrics* m = self->ready() ? &engine->metrics() : nullptr;
    std::string text = RenderPrometheus(m, counters, kv_block_bytes);
    if (m) {  // per-adapter series and the host tier
      std::optional<adapters::AdapterCache::Stats> cs;
      if (adapter_cache) cs = adapter_cache->stats();
      text += RenderAdapterPrometheus(
          m->adapters, cs ? &*cs : nullptr, registry ? static_cast<int64_t>(registry->size()) : -1,
          {static_cast<size_t>(self->opts_.metrics_top_adapters), self->opts_.served_model_name});
      const engine::EngineOptions& eo = engine->options();
      text += RenderGatewayPrometheus(
          *m,
          {.model_name = self->opts_.served_model_name,
           .block_size = eo.block_size,
           .max_lora = eo.max_adapters_per_step > 0 ? eo.max_adapters_per_step : eo.max_running});
    }
    if (m && engine->options().training_gate) {  // fine-tuning while serving
      const engine::TrainingGate& g = *engine->options().training_gate;
      char buf[1024];
      std::snprintf(buf, sizeof buf,
                    "# HELP chorus_finetune_iterations_total Training iterations granted between "
                    "inference steps.\n# TYPE chorus_finetune_iterations_total counter\n"
                    "chorus_finetune_iterations_total %lld\n"
                    "# HELP chorus_finetune_busy_seconds_total Wall time of granted training "
                    "iterations.\n# TYPE chorus_finetune_busy_seconds_total counter\n"
                    "chorus_finetune_busy_seconds_total %.6f\n"
                    "# HELP chorus_finetune_iteration_seconds Moving average of an iteration's "
                    "wall time (the deferred policy's cost).\n"
                    "# TYPE chorus_finetune_iteration_seconds gauge\n"
                    "chorus_finetune_iteration_seconds %.6f\n"
                    "# HELP chorus_finetune_iteration_cost_seconds The iteration cost the "
                    "deferred policy assumes (mean + 2 deviations).\n"
                    "# TYPE chorus_finetune_iteration_cost_seconds gauge\n"
                    "chorus_finetune_iteration_cost_seconds %.6f\n",
                    static_cast<long long>(g.iterations()), g.busy_seconds(), g.iteration_seconds(),
                    g.iteration_cost_seconds());
      text += buf;
    }
    if (self->opts_.tenants) text += RenderTenantPrometheus(self->opts_.tenants->All());
    res.set_content(text, "text/plain; version=0.0.4; charset=utf-8");
  });

  http.Get(R"(/v1/models/?)", [this](const httplib::Request& req, httplib::Response& res) {
    if (!self->ready()) return SendError(res, *Unavailable());
    json data = json::array({ModelJson()});
    for (const adapters::VariantRef& r : engine->full_models()) data.push_back(FullModelJson(r));
    if (registry) {
      const std::shared_ptr<Tenant> tenant = TenantOf(req);
      for (const auto& a : registry->List()) {
        if (a.available && Visible(a, tenant.get())) data.push_back(AdapterJson(a));
      }
    }
    json out = {{"object", "list"}, {"data", data}};
    res.set_content(DumpJson(out), "application/json");
  });

  http.Get(R"(/v1/models/(.+))", [this](const httplib::Request& req, httplib::Response& res) {
    if (!self->ready()) return SendError(res, *Unavailable());
    if (req.matches.size() >= 2 && req.matches[1].str() == self->opts_.served_model_name) {
      return res.set_content(DumpJson(ModelJson()), "application/json");
    }
    if (req.matches.size() >= 2) {
      if (const adapters::VariantRef* full = FullModel(req.matches[1].str()))
        return res.set_content(DumpJson(FullModelJson(*full)), "application/json");
    }
    if (registry && req.matches.size() >= 2) {
      auto a = registry->Lookup(req.matches[1].str());
      if (a && Visible(*a, TenantOf(req).get()))
        return res.set_content(DumpJson(AdapterJson(*a)), "application/json");
    }
    return SendError(res, NotFound("The model does not exist.", "model_not_found"));
  });

  // POST routes read their bodies through a content reader: given a plain handler, httplib
  // parses a form-urlencoded body (curl -d's default content type) into parameters and rejects
  // one over 8 KiB with a 413. Bodies are JSON whatever the declared type (as llama.cpp's server
  // takes them); multipart forms are refused with 415. The size limit still applies (413).
  auto post_json = [this](const char* pattern, auto handle) {
    http.Post(pattern, [handle](const httplib::Request& req, httplib::Response& res,
                                const httplib::ContentReader& reader) {
      if (req.is_multipart_form_data()) {
        ApiError e = BadRequest("multipart/form-data bodies are not accepted; send JSON",
                                std::string(), "unsupported_media_type");
        e.http_status = 415;
        return SendError(res, e);
      }
      std::string body;
      if (!reader([&body](const char* data, size_t n) {
            body.append(data, n);
            return true;
          })) {
        if (res.status < 400) res.status = 400;  // httplib set 413 when the body was too large
        return;                                  // the error handler writes the body
      }
      handle(req, body, res);
    });
  };
  FinetuneRoutes();
  post_json("/v1/load_lora_adapter",
            [this](const httplib::Request& req, const std::string& body, httplib::Response& res) {
              HandleLoadAdapter(req, body, res);
            });
  post_json("/v1/unload_lora_adapter",
            [this](const httplib::Request& req, const std::string& body, httplib::Response& res) {
              HandleUnloadAdapter(req, body, res);
            });
  for (const TemplateRoute& r : kTemplateRoutes) {
    post_json(r.path,
              [this, &r](const httplib::Request&, const std::string& body, httplib::Response& res) {
                if (auto e = Unavailable()) return SendError(res, *e);
                RouteReply reply = r.handle(body, ctx);
                res.status = reply.status;
                res.set_content(reply.body, "application/json");
              });
  }
  post_json("/v1/completions",
            [this](const httplib::Request& req, const std::string& body, httplib::Response& res) {
              HandleGenerate(ApiKind::kCompletion, req, body, res);
            });
  post_json("/v1/chat/completions",
            [this](const httplib::Request& req, const std::string& body, httplib::Response& res) {
              HandleGenerate(ApiKind::kChat, req, body, res);
            });
  post_json("/v1/embeddings", [this](const httplib::Request& req, const std::string& body,
                                     httplib::Response& res) { HandleEmbeddings(req, body, res); });
}

// Every input is one engine request (batched with whatever else runs); at most
// kEmbeddingWindow are queued at a time, so a client's list of thousands (LangChain sends 1000
// per call) neither fills the engine's queue nor waits behind it.
void Server::Impl::HandleEmbeddings(const httplib::Request& http_req, const std::string& body,
                                    httplib::Response& res) {
  if (auto e = Unavailable()) return SendError(res, *e);
  EmbeddingApiRequest er;
  const model::ModelConfig& config = engine->model().config();
  const std::string pooling = self->opts_.pooling != "auto" ? self->opts_.pooling
                              : config.pooling.empty()      ? std::string("last")
                                                            : config.pooling;
  if (auto e = ParseEmbeddingRequest(body, ctx, engine::ParsePooling(pooling).value(),
                                     config.n_embd, &er))
    return SendError(res, *e);
  auto gen = std::make_shared<Generation>();
  gen->req.gen.embedding = er.options;
  std::shared_ptr<Tenant> tenant = TenantOf(http_req);
  if (!er.variant_name.empty()) {
    if (auto e = ResolveVariant(er.variant_name, tenant.get(), &gen->req.gen))
      return SendError(res, *e);
  }
  if (tenant) {
    int64_t reserve = 0;
    for (const auto& in : er.inputs) reserve += static_cast<int64_t>(in.size());
    if (!AdmitForTenant(std::move(tenant), reserve, gen.get(), res)) return;
  }
  const std::string id = RandomId("embd-");
  std::vector<std::vector<float>> vectors(er.inputs.size());
  std::vector<size_t> input_of;  // handle index → input index
  size_t next = 0;
  auto submit_more = [&]() -> std::optional<ApiError> {
    std::vector<engine::GenerationRequest> batch;
    const size_t running =
        gen->handles.size() -
        static_cast<size_t>(std::count(gen->finished.begin(), gen->finished.end(), 1));
    while (next + batch.size() < er.inputs.size() && running + batch.size() < kEmbeddingWindow) {
      engine::GenerationRequest g = gen->req.gen;
      g.prompt = std::move(er.inputs[next + batch.size()]);
      g.id = id + "/" + std::to_string(next + batch.size());
      batch.push_back(std::move(g));
    }
    if (batch.empty()) return std::nullopt;
    auto handles = engine->SubmitAll(std::move(batch));
    if (!handles.ok()) {
      // Queue full while some of ours run: try again when one finishes.
      if (handles.status().code() == StatusCode::kResourceExhausted && running > 0)
        return std::nullopt;
      ApiError err = ErrorFromStatus(handles.status(), "input");
      if (handles.status().code() != StatusCode::kInvalidArgument &&
          handles.status().code() != StatusCode::kOutOfRange) {
        err.param.clear();
      }
      return err;
    }
    for (auto& h : *handles) {
      gen->handles.push_back(std::move(h));
      gen->finished.push_back(0);
      input_of.push_back(next++);
    }
    return std::nullopt;
  };
  if (auto err = submit_more()) return SendError(res, *err);
  self->in_flight_.fetch_add(1);
  ClientConnection client(http_req);
  while (!gen->error && !(gen->AllFinished() && next == er.inputs.size())) {
    size_t which = 0;
    engine::StreamEvent ev;
    const bool got = gen->Next(kDisconnectPollInterval, &which, &ev);
    if (client.GoneByNow()) {
      gen->CancelAll();
      AnswerClientGone(res);
      self->in_flight_.fetch_sub(1);
      return;
    }
    if (got) {
      gen->OnEvent(which, ev);
      if (ev.finish == engine::FinishReason::kStop)
        vectors[input_of[which]] = std::move(ev.embedding);
    }
    if (next < er.inputs.size()) {
      if (auto err = submit_more()) gen->error = *err;
    }
  }
  if (gen->error) {
    gen->CancelAll();
    SendError(res, *gen->error);
  } else {
    const std::string model = gen->req.gen.variant ? gen->req.gen.variant->name : ctx.served_model;
    res.set_content(EmbeddingResponseJson(vectors, er.base64, model, gen->GetUsage().prompt_tokens,
                                          id, static_cast<int64_t>(std::time(nullptr))),
                    "application/json");
  }
  self->in_flight_.fetch_sub(1);
}

void Server::Impl::HandleGenerate(ApiKind kind, const httplib::Request& http_req,
                                  const std::string& body, httplib::Response& res) {
  if (auto e = Unavailable()) return SendError(res, *e);
  auto gen = std::make_shared<Generation>();
  if (auto e = ParseApiRequest(kind, body, ctx, &gen->req)) return SendError(res, *e);
  std::shared_ptr<Tenant> tenant = TenantOf(http_req);
  if (!gen->req.variant_name.empty()) {
    if (auto e = ResolveVariant(gen->req.variant_name, tenant.get(), &gen->req.gen))
      return SendError(res, *e);
  }
  if (tenant) {
    // What the request may use: its prompts, and each choice's max_tokens (or the default).
    const ApiRequest& ar = gen->req;
    int64_t reserve = 0;
    const int64_t per_choice = ar.gen.max_tokens > 0 ? ar.gen.max_tokens : kDefaultCompletionTokens;
    for (const auto& p : ar.prompts)
      reserve += static_cast<int64_t>(p.size()) + per_choice * std::max(1, ar.gen.n);
    if (!AdmitForTenant(std::move(tenant), reserve, gen.get(), res)) return;
  }

  const std::string id = NewResponseId(kind);
  // All prompts of the request are queued together or not at all (Engine::SubmitAll).
  std::vector<engine::GenerationRequest> gens(gen->req.prompts.size());
  for (size_t i = 0; i < gen->req.prompts.size(); ++i) {
    if (std::optional<ApiError> err = MakeGenerationRequest(gen->req, i, ctx, &gens[i]))
      return SendError(res, *err);
    gens[i].id = id + "/" + std::to_string(i);
  }
  auto handles = engine->SubmitAll(std::move(gens));
  if (!handles.ok()) {
    ApiError err =
        ErrorFromStatus(handles.status(), kind == ApiKind::kChat ? "messages" : "prompt");
    if (handles.status().code() != StatusCode::kInvalidArgument &&
        handles.status().code() != StatusCode::kOutOfRange) {
      err.param.clear();
    }
    return SendError(res, err);
  }
  for (auto& h : *handles) {
    gen->handles.push_back(std::move(h));
    gen->finished.push_back(0);
  }
  gen->builder = std::make_unique<ResponseBuilder>(gen->req, ctx, id,
                                                   static_cast<int64_t>(std::time(nullptr)));
  self->in_flight_.fetch_add(1);

  if (!gen->req.stream) {
    // Like a stream's failed write, a client that hangs up while it waits cancels its request.
    ClientConnection client(http_req);
    while (!gen->AllFinished()) {
      size_t which = 0;
      engine::StreamEvent ev;
      const bool got = gen->Next(kDisconnectPollInterval, &which, &ev);
      if (client.GoneByNow()) {
        gen->CancelAll();  // the engine frees its KV blocks within one step
        AnswerClientGone(res);
        self->in_flight_.fetch_sub(1);
        CHORUS_LOG(DEBUG) << "client of " << id << " disconnected; request cancelled";
        return;
      }
      if (!got) continue;
      gen->OnEvent(which, ev);
      gen->builder->Add(which, ev);
    }
    if (gen->error) {
      SendError(res, *gen->error);
    } else {
      res.set_content(gen->builder->FinalJson(gen->GetUsage()), "application/json");
    }
    self->in_flight_.fetch_sub(1);
    return;
  }

  // Policy slo (strict) may answer a request 429 at once when it would miss its TTFT SLO
  // (docs/scheduling.md): a streamed request with a TTFT SLO waits for its first event before
  // the stream's 200 is committed, so that the 429 can still be sent. Not just until the SLO:
  // a request still waiting then is aborted at the engine's next step boundary, a moment later,
  // and would have become a 200 stream holding the 429 as an error event. The engine decides
  // on every ready waiting request by the first step after its SLO, so the wait is bounded; a
  // client that hangs up meanwhile cancels the request, as for a non-streamed one.
  const engine::EngineOptions& eopts = engine->options();
  const double ttft_ms =
      gen->req.gen.ttft_slo_ms >= 0 ? gen->req.gen.ttft_slo_ms : eopts.ttft_slo_ms;
  if (eopts.policy == "slo" && !eopts.slo_best_effort && ttft_ms > 0) {
    ClientConnection client(http_req);
    size_t which = 0;
    engine::StreamEvent ev;
    while (!gen->AllFinished()) {
      if (gen->Next(kDisconnectPollInterval, &which, &ev)) {
        gen->OnEvent(which, ev);
        gen->early.emplace_back(which, std::move(ev));
        break;
      }
      if (client.Gone()) {
        gen->CancelAll();
        AnswerClientGone(res);
        self->in_flight_.fetch_sub(1);
        return;
      }
    }
    if (gen->error && gen->error->http_status == 429) {
      gen->CancelAll();
      self->in_flight_.fetch_sub(1);
      return SendError(res, *gen->error);
    }
  }

  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  // The content type must be exactly text/event-stream: httplib never compresses that one.
  res.set_chunked_content_provider(
      "text/event-stream",
      [gen](size_t, httplib::DataSink& sink) -> bool {
        std::string out;
        if (!gen->opened) {
          gen->opened = true;
          out = gen->builder->OpeningChunks();
          for (auto& [which, ev] : gen->early) out += gen->builder->Chunk(which, ev);
          gen->early.clear();
        }
        // Wait for one event, then take whatever else is ready, and send it in one write. With
        // events already in hand (the first call after slo's wait for the first event), do not
        // wait: that would hold the first token back until the next one (a whole step).
        auto wait = out.empty() ? std::chrono::milliseconds(100) : std::chrono::milliseconds(0);
        for (int k = 0; k < 256 && !gen->AllFinished(); ++k) {
          size_t which = 0;
          engine::StreamEvent ev;
          if (!gen->Next(wait, &which, &ev)) break;
          wait = std::chrono::milliseconds(0);
          gen->OnEvent(which, ev);
          out += gen->builder->Chunk(which, ev);
        }
        const bool finished = gen->AllFinished();
        if (finished) {
          if (gen->error) out += ResponseBuilder::ErrorChunk(*gen->error);
          out += gen->builder->ClosingChunks(gen->GetUsage());
        } else if (out.empty() && Clock::now() - gen->last_write >= kStreamProbeInterval) {
          out = ": keep-alive\n\n";
        }
        if (!out.empty()) {
          if (!sink.write(out.data(), out.size())) {
            gen->CancelAll();  // the client went away: free its KV blocks
            return false;
          }
          gen->last_write = Clock::now();
        }
        if (finished) {
          gen->closed = true;
          sink.done();
        }
        return true;
      },
      [gen, this](bool) {
        // Runs when the response is destroyed, however it ended.
        if (!gen->closed) gen->CancelAll();
        self->in_flight_.fetch_sub(1);
      });
}

}  // namespace chorus::server
