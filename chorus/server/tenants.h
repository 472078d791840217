// Tenants (`chorus serve --tenants FILE`, docs/api.md "Tenants"): the customers one server is
// shared by. Each has API keys, optional limits, and the adapters it loaded through the API.
//
// The file:
//   {"tenants": {"acme": {"keys": ["sk-acme-1", "sk-acme-2"],
//                         "max_concurrent": 8, "tokens_per_second": 500},
//                "blue": {"keys": ["sk-blue"]}}}
// Names: 1..64 characters of [A-Za-z0-9._-]. Keys: 8..256 printable ASCII characters without
// spaces, each used by one tenant only. Limits are optional (absent or 0: unlimited):
// `max_concurrent` requests at once, `tokens_per_second` (prompt + completion tokens) as a token
// bucket that holds one second's worth. Errors name the file, line and column (a JSON syntax
// error) or the tenant and field.
//
// Limits: Admit() says whether a new request may start — fewer than max_concurrent in flight,
// and the bucket not in debt — or else how many seconds to wait (Retry-After). An admitted
// request reserves the tokens it may use (prompt + max_tokens) at once, so a burst of requests
// cannot all start before the first one is charged; Finish() gives back what it did not use.
// The bucket may go into debt, and the tenant waits it out: its rate over time is bounded by
// tokens_per_second.
//
// Reload(): a new file replaces the table atomically; a tenant keeps its in-flight count and
// bucket across reloads (by name); a bad file changes nothing and says why.
//
// Thread-safety: thread-safe (HTTP threads, the signal thread that reloads).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "chorus/base/mutex.h"
#include "chorus/base/status.h"

namespace chorus::server {

struct TenantLimits {
  int64_t max_concurrent = 0;    // 0 = unlimited
  double tokens_per_second = 0;  // 0 = unlimited
};

struct TenantSpec {
  std::string name;
  std::vector<std::string> keys;
  TenantLimits limits;
};

// Parses the file's text (`path` is only for messages).
Result<std::vector<TenantSpec>> ParseTenants(std::string_view text, const std::string& path);

// One tenant's live state.
class Tenant {
 public:
  explicit Tenant(std::string name) : name_(std::move(name)) {}
  const std::string& name() const { return name_; }

  // May a new request that may use up to `reserve_tokens` start now? nullopt: yes (counted in
  // flight, the tokens reserved; call Finish exactly once). Otherwise the seconds to wait (≥ 1)
  // and why ("max_concurrent", "tokens_per_second").
  struct Refusal {
    int retry_after_s;
    const char* reason;
  };
  std::optional<Refusal> Admit(int64_t reserve_tokens = 0);
  // An admitted request that reserved `reserved` tokens ended having used `tokens`.
  void Finish(int64_t tokens, int64_t reserved = 0);

  struct Stats {
    uint64_t requests = 0, rejected_concurrency = 0, rejected_rate = 0, tokens = 0;
    int64_t in_flight = 0;
  };
  Stats stats() const;
  void SetLimits(TenantLimits limits);

 private:
  void RefillLocked(std::chrono::steady_clock::time_point now) REQUIRES(mu_);
  const std::string name_;
  mutable Mutex mu_;
  TenantLimits limits_ GUARDED_BY(mu_);
  double bucket_ GUARDED_BY(mu_) = 0;  // tokens available; negative = debt
  bool bucket_started_ GUARDED_BY(mu_) = false;
  std::chrono::steady_clock::time_point refilled_ GUARDED_BY(mu_);
  Stats stats_ GUARDED_BY(mu_);
};

class Tenants {
 public:
  // Reads and parses `path`. Errors name the file and the line.
  static Result<std::shared_ptr<Tenants>> Load(const std::string& path);
  // Reads the file again; on error keeps the current table and returns why.
  Status Reload();

  // The tenant whose key this is (null: none).
  std::shared_ptr<Tenant> ForKey(std::string_view key) const;
  // Every tenant, by name (for /metrics).
  std::vector<std::shared_ptr<Tenant>> All() const;
  const std::string& path() const { return path_; }

 private:
  Status Install(std::vector<TenantSpec> specs);
  std::string path_;
  mutable Mutex mu_;
  std::map<std::string, std::shared_ptr<Tenant>> by_name_ GUARDED_BY(mu_);
  std::map<std::string, std::shared_ptr<Tenant>, std::less<>> by_key_ GUARDED_BY(mu_);
};

}  // namespace chorus::server
