#include "chorus/server/tenants.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

namespace chorus::server {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr int64_t kMaxFileBytes = 1 << 20;

bool ValidName(const std::string& n) {
  if (n.empty() || n.size() > 64) return false;
  return std::all_of(n.begin(), n.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == '-';
  });
}

bool ValidKey(const std::string& k) {
  if (k.size() < 8 || k.size() > 256) return false;
  return std::all_of(k.begin(), k.end(), [](char c) { return c > ' ' && c < 127; });
}

// "line L, column C" of byte offset `pos` of `text` (1-based).
std::string Where(std::string_view text, size_t pos) {
  pos = std::min(pos, text.size());
  int64_t line = 1, col = 1;
  for (size_t i = 0; i < pos; ++i) {
    if (text[i] == '\n') {
      ++line;
      col = 1;
    } else {
      ++col;
    }
  }
  return "line " + std::to_string(line) + ", column " + std::to_string(col);
}

}  // namespace

Result<std::vector<TenantSpec>> ParseTenants(std::string_view text, const std::string& path) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    // e.byte is 1-based, the position just after the offending character.
    const size_t pos = e.byte > 0 ? e.byte - 1 : 0;
    std::string what = e.what();
    if (const size_t p = what.find("syntax error"); p != std::string::npos) what = what.substr(p);
    return InvalidArgumentError(path + ": " + Where(text, pos) + ": not valid JSON (" + what + ")");
  } catch (const json::exception& e) {
    // The parser's other errors carry no position, e.g. a number too large for a double.
    return InvalidArgumentError(path + ": not valid JSON (" + e.what() + ")");
  }
  const std::string top = path + ": ";
  if (!j.is_object() || !j.contains("tenants") || !j["tenants"].is_object()) {
    return InvalidArgumentError(top + "expected {\"tenants\": {\"NAME\": {\"keys\": [...]}}}");
  }
  for (const auto& [k, v] : j.items()) {
    if (k != "tenants") return InvalidArgumentError(top + "unknown top-level field '" + k + "'");
  }
  std::vector<TenantSpec> out;
  std::set<std::string> keys_seen;
  for (const auto& [name, t] : j["tenants"].items()) {
    const std::string where = top + "tenant '" + name + "': ";
    if (!ValidName(name)) {
      return InvalidArgumentError(top + "tenant name '" + name.substr(0, 80) +
                                  "' must be 1..64 characters of [A-Za-z0-9._-]");
    }
    if (!t.is_object()) return InvalidArgumentError(where + "must be an object");
    TenantSpec spec;
    spec.name = name;
    for (const auto& [field, v] : t.items()) {
      if (field == "keys") {
        if (!v.is_array() || v.empty())
          return InvalidArgumentError(where + "'keys' must be a non-empty array of strings");
        for (const json& key : v) {
          if (!key.is_string() || !ValidKey(key.get<std::string>())) {
            return InvalidArgumentError(
                where + "every key must be a string of 8..256 printable characters, no spaces");
          }
          if (!keys_seen.insert(key.get<std::string>()).second)
            return InvalidArgumentError(where + "a key is also used by another tenant or twice");
          spec.keys.push_back(key.get<std::string>());
        }
      } else if (field == "max_concurrent") {
        if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > 1000000)
          return InvalidArgumentError(where + "'max_concurrent' must be an integer in [0, 1e6]");
        spec.limits.max_concurrent = v.get<int64_t>();
      } else if (field == "tokens_per_second") {
        if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < 0 ||
            v.get<double>() > 1e9) {
          return InvalidArgumentError(where + "'tokens_per_second' must be a number in [0, 1e9]");
        }
        spec.limits.tokens_per_second = v.get<double>();
      } else {
        return InvalidArgumentError(where + "unknown field '" + field + "'");
      }
    }
    if (spec.keys.empty()) return InvalidArgumentError(where + "has no 'keys'");
    out.push_back(std::move(spec));
  }
  if (out.empty()) return InvalidArgumentError(top + "no tenants");
  return out;
}

void Tenant::RefillLocked(Clock::time_point now) {
  const double rate = limits_.tokens_per_second;
  if (!bucket_started_) {
    bucket_ = rate;  // a full bucket: one second's worth
    bucket_started_ = true;
  } else {
    const double dt = std::chrono::duration<double>(now - refilled_).count();
    bucket_ = std::min(rate, bucket_ + dt * rate);
  }
  refilled_ = now;
}

std::optional<Tenant::Refusal> Tenant::Admit(int64_t reserve_tokens) {
  MutexLock lock(&mu_);
  if (limits_.max_concurrent > 0 && stats_.in_flight >= limits_.max_concurrent) {
    ++stats_.rejected_concurrency;
    return Refusal{1, "max_concurrent"};
  }
  if (limits_.tokens_per_second > 0) {
    RefillLocked(Clock::now());
    if (bucket_ < 0) {
      ++stats_.rejected_rate;
      const double wait = -bucket_ / limits_.tokens_per_second;
      return Refusal{std::max(1, static_cast<int>(std::ceil(wait))), "tokens_per_second"};
    }
  }
  if (limits_.tokens_per_second > 0) bucket_ -= static_cast<double>(reserve_tokens);
  ++stats_.in_flight;
  ++stats_.requests;
  return std::nullopt;
}

void Tenant::Finish(int64_t tokens, int64_t reserved) {
  MutexLock lock(&mu_);
  --stats_.in_flight;
  stats_.tokens += static_cast<uint64_t>(std::max<int64_t>(0, tokens));
  if (limits_.tokens_per_second > 0) {
    RefillLocked(Clock::now());
    bucket_ -= static_cast<double>(tokens - reserved);  // the charge beyond the reservation
  }
}

Tenant::Stats Tenant::stats() const {
  MutexLock lock(&mu_);
  return stats_;
}

void Tenant::SetLimits(TenantLimits limits) {
  MutexLock lock(&mu_);
  limits_ = limits;
  if (limits_.tokens_per_second > 0 && bucket_started_)
    bucket_ = std::min(bucket_, limits_.tokens_per_second);
}

namespace {

Result<std::vector<TenantSpec>> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFoundError(path + ": cannot open");
  std::ostringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  if (static_cast<int64_t>(text.size()) > kMaxFileBytes)
    return InvalidArgumentError(path + ": larger than 1 MiB");
  return ParseTenants(text, path);
}

}  // namespace

Result<std::shared_ptr<Tenants>> Tenants::Load(const std::string& path) {
  CHORUS_ASSIGN_OR_RETURN(std::vector<TenantSpec> specs, ReadFile(path));
  auto t = std::make_shared<Tenants>();
  t->path_ = path;
  CHORUS_RETURN_IF_ERROR(t->Install(std::move(specs)));
  return t;
}

Status Tenants::Reload() {
  CHORUS_ASSIGN_OR_RETURN(std::vector<TenantSpec> specs, ReadFile(path_));
  return Install(std::move(specs));
}

Status Tenants::Install(std::vector<TenantSpec> specs) {
  MutexLock lock(&mu_);
  std::map<std::string, std::shared_ptr<Tenant>> by_name;
  std::map<std::string, std::shared_ptr<Tenant>, std::less<>> by_key;
  for (TenantSpec& s : specs) {
    auto it = by_name_.find(s.name);  // a tenant keeps its live state across reloads
    std::shared_ptr<Tenant> t =
        it != by_name_.end() ? it->second : std::make_shared<Tenant>(s.name);
    t->SetLimits(s.limits);
    for (const std::string& k : s.keys) by_key[k] = t;
    by_name[s.name] = std::move(t);
  }
  by_name_ = std::move(by_name);
  by_key_ = std::move(by_key);
  return OkStatus();
}

std::shared_ptr<Tenant> Tenants::ForKey(std::string_view key) const {
  MutexLock lock(&mu_);
  auto it = by_key_.find(key);
  return it == by_key_.end() ? nullptr : it->second;
}

std::vector<std::shared_ptr<Tenant>> Tenants::All() const {
  MutexLock lock(&mu_);
  std::vector<std::shared_ptr<Tenant>> out;
  for (const auto& [name, t] : by_name_) out.push_back(t);
  return out;
}

}  // namespace chorus::server
