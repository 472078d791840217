// The adapter registry's registration (registry.h): Open, Register, Unregister,
// RegisterDirectory, Revalidate and the lookups. Which paths are accepted is registry_paths.h;
// how the table is stored is registry_state.h.
#include "chorus/adapters/registry.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <ctime>
#include <filesystem>
#include <utility>

#include "chorus/adapters/delta/delta_hook.h"
#include "chorus/adapters/lora/lora_files.h"
#include "chorus/adapters/registry_paths.h"
#include "chorus/adapters/registry_state.h"
#include "chorus/base/durable_file.h"
#include "chorus/base/logging.h"
#include "chorus/formats/gguf.h"

namespace chorus::adapters {

using registry_internal::kPeftConfig;
using registry_internal::ResolveInsideRoots;

namespace {

namespace fs = std::filesystem;

constexpr size_t kMaxNameLength = 128;

Status ValidateName(const std::string& name, const std::string& base_name) {
  if (!IsValidAdapterName(name)) {
    return InvalidArgumentError("invalid adapter name '" + name.substr(0, kMaxNameLength + 8) +
                                "': names are 1.." + std::to_string(kMaxNameLength) +
                                " characters of A-Z a-z 0-9 . _ : / -");
  }
  if (!base_name.empty() && name == base_name) {
    return InvalidArgumentError("adapter name '" + name + "' is the base model's served name");
  }
  return OkStatus();
}

// Fills the descriptive fields of `info` from the weights.
void Summarize(const LoraWeights& w, AdapterInfo* info) {
  info->rank = w.MaxRank();
  info->use_rslora = w.use_rslora;
  info->base_model = w.base_model;
  info->target_modules.clear();
  std::vector<std::pair<float, int>> alphas, scales;  // (value, count) in first-seen order
  auto count = [](std::vector<std::pair<float, int>>* v, float x) {
    for (auto& p : *v) {
      if (p.first == x) {
        ++p.second;
        return;
      }
    }
    v->emplace_back(x, 1);
  };
  // Model order: linear by linear, so ties resolve to the earlier linear.
  for (int li = 0; li < model::kNumLinears; ++li) {
    const auto which = static_cast<model::Linear>(li);
    bool any = false;
    for (int64_t l = 0; l < w.n_layers; ++l) {
      const LoraModuleWeights& m = w.at(l, which);
      if (!m.present()) continue;
      any = true;
      count(&alphas, m.alpha);
      count(&scales, w.Scale(l, which));
    }
    if (any) info->target_modules.emplace_back(model::LinearName(which));
  }
  auto most = [](const std::vector<std::pair<float, int>>& v) {
    float best = 0;
    int n = 0;
    for (const auto& p : v) {
      if (p.second > n) {
        best = p.first;
        n = p.second;
      }
    }
    return best;
  };
  info->alpha = most(alphas);
  info->scale = most(scales);
}

}  // namespace

bool IsValidAdapterName(std::string_view name) {
  if (name.empty() || name.size() > kMaxNameLength) return false;
  for (char c : name) {
    const bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == ':' || c == '/' || c == '-';
    if (!ok) return false;
  }
  return true;
}

Result<std::unique_ptr<AdapterRegistry>> AdapterRegistry::Open(const std::string& state_path,
                                                               RegistryOptions options) {
  if (state_path.empty()) return InvalidArgumentError("adapter registry: empty state path");
  if (options.max_lora_rank < 1) {
    return InvalidArgumentError("adapter registry: max_lora_rank must be ≥ 1, got " +
                                std::to_string(options.max_lora_rank));
  }
  CHORUS_RETURN_IF_ERROR(options.base.Validate().WithContext("adapter registry: base config"));
  std::unique_ptr<AdapterRegistry> reg(new AdapterRegistry());
  CHORUS_ASSIGN_OR_RETURN(reg->roots_, registry_internal::ResolveRoots(options.adapter_roots));
  reg->state_path_ = state_path;
  reg->options_ = std::move(options);

  const std::string dir = registry_internal::Dirname(state_path);
  struct stat dst {};
  if (::stat(dir.c_str(), &dst) != 0) return ErrnoError(errno, "adapter registry directory " + dir);
  if (!S_ISDIR(dst.st_mode))
    return InvalidArgumentError("adapter registry: " + dir + " is not a directory");

  // One process per state file: an exclusive lock held until destruction (or death).
  CHORUS_ASSIGN_OR_RETURN(reg->lock_fd_, registry_internal::LockState(state_path));
  // Temp files of a writer killed before its rename: never read, removed now that we hold the
  // lock (nobody else can be writing one).
  registry_internal::RemoveLeftoverTempFiles(state_path);

  Result<std::optional<registry_internal::RegistryState>> read =
      registry_internal::ReadState(state_path);
  if (!read.ok() && read.status().code() == StatusCode::kDataLoss &&
      reg->options_.recover_corrupt_state) {
    // Kept for inspection under a new name; the registry starts empty.
    CHORUS_ASSIGN_OR_RETURN(const std::string moved, QuarantineFile(state_path));
    CHORUS_LOG(ERROR) << "adapter registry " << state_path << " is corrupt and was moved aside to "
                      << moved << "; starting with an empty registry (" << read.status().message()
                      << ")";
    read = std::optional<registry_internal::RegistryState>();
  }
  CHORUS_ASSIGN_OR_RETURN(std::optional<registry_internal::RegistryState> state, std::move(read));
  if (!state) {
    CHORUS_RETURN_IF_ERROR(registry_internal::WriteState(state_path, {}, 1));
    return reg;
  }
  {
    MutexLock write_lock(&reg->write_mu_);  // not shared yet; taken for the rule's sake
    MutexLock lock(&reg->mu_);
    reg->entries_ = std::move(state->entries);
    reg->next_version_ = state->next_version;
  }
  for (const auto& [name, why] : reg->Revalidate()) {
    CHORUS_LOG(WARNING) << "adapter=" << name << " unavailable after restart: " << why.ToString();
  }
  CHORUS_LOG(INFO) << "adapter registry " << state_path << ": " << reg->size() << " adapters";
  return reg;
}

AdapterRegistry::~AdapterRegistry() {
  if (lock_fd_ >= 0) ::close(lock_fd_);  // closing releases the flock
}

Status AdapterRegistry::ValidateLora(const std::string& name, const std::string& path,
                                     AdapterInfo* info) const {
  // Validate exactly as serving will load it. The files read are the resolved ones: a PEFT
  // directory's two files, or the GGUF file.
  LoraLoadOptions lo;
  lo.limits.max_rank = options_.max_lora_rank;
  auto weights = ReadLora(path, options_.base, lo);
  if (!weights.ok()) return weights.status().WithContext("adapter '" + name + "'");
  auto built = LoraAdapter::Build(*weights, options_.base, name, lo.limits);
  if (!built.ok()) return built.status().WithContext("adapter '" + name + "': " + path);
  Summarize(*weights, info);
  if (info->rank < 1)
    return InvalidArgumentError("adapter '" + name + "': " + path + " holds no LoRA modules");
  return OkStatus();
}

Result<AdapterInfo> AdapterRegistry::Register(const std::string& name, const std::string& path,
                                              bool replace, const std::string& owner) {
  MutexLock write_lock(&write_mu_);
  CHORUS_RETURN_IF_ERROR(ValidateName(name, options_.base_model_name));
  const std::map<std::string, AdapterInfo>& entries = WriterEntries();
  if (auto it = entries.find(name); it != entries.end() && it->second.owner != owner) {
    return AlreadyExistsError("adapter name '" + name + "' is taken");
  }
  if (!replace && entries.count(name) != 0) {
    return AlreadyExistsError("adapter '" + name + "' is already registered (" +
                              entries.at(name).path + "); unregister it or replace it");
  }
  if (path.empty()) return InvalidArgumentError("adapter '" + name + "': empty path");
  CHORUS_ASSIGN_OR_RETURN(const registry_internal::ResolvedAdapter ra,
                          registry_internal::ResolveAdapterPath(roots_, path));

  AdapterInfo info;
  info.name = name;
  info.owner = owner;
  info.path = ra.path;
  info.format = ra.format;
  CHORUS_ASSIGN_OR_RETURN(info.content_hash, HashFiles(ra.files, &info.files));
  for (const AdapterFile& f : info.files) info.bytes += f.size;

  if (ra.format == "delta") {
    // A delta: every byte read and checked, against the base's weights hash and mapped to its
    // linears, as serving will load it — but not copied into memory (the host cache does that on
    // first use).
    auto w = delta::CheckDeltaFile(ra.files[0], options_.base, options_.base_weights_hash, name);
    if (!w.ok()) return w.status().WithContext("adapter '" + name + "'");
    info.kind = "delta";
    info.base_model = w->base_source;
    for (const model::Linear which : w->linears)
      info.target_modules.push_back(model::LinearName(which));
  } else {
    CHORUS_RETURN_IF_ERROR(ValidateLora(name, ra.path, &info));
  }
  // The bytes read must be the bytes hashed.
  if (Status s = CheckFingerprints(info.files); !s.ok()) {
    return UnavailableError("adapter '" + name +
                            "': files changed while being registered; try again (" + s.message() +
                            ")");
  }

  const uint64_t version = WriterNextVersion();
  info.version = version;
  info.created = static_cast<int64_t>(std::time(nullptr));
  std::map<std::string, AdapterInfo> next = WriterEntries();
  next[name] = info;
  CHORUS_RETURN_IF_ERROR(registry_internal::WriteState(state_path_, next, version + 1));
  {
    MutexLock lock(&mu_);
    entries_ = std::move(next);
    next_version_ = version + 1;
  }
  CHORUS_LOG(INFO) << "adapter=" << name << " registered: " << info.path << " rank " << info.rank
                   << " id " << info.id().ToString();
  return info;
}

Status AdapterRegistry::Unregister(const std::string& name,
                                   const std::optional<std::string>& owner) {
  MutexLock write_lock(&write_mu_);
  auto it = WriterEntries().find(name);
  if (it == WriterEntries().end() || (owner && it->second.owner != *owner))
    return NotFoundError("adapter '" + name + "' is not registered");
  std::map<std::string, AdapterInfo> next = WriterEntries();
  next.erase(name);
  CHORUS_RETURN_IF_ERROR(registry_internal::WriteState(state_path_, next, WriterNextVersion()));
  {
    MutexLock lock(&mu_);
    entries_ = std::move(next);
  }
  CHORUS_LOG(INFO) << "adapter=" << name << " unregistered";
  return OkStatus();
}

Result<std::vector<DirectoryEntryResult>> AdapterRegistry::RegisterDirectory(const std::string& dir,
                                                                             bool replace) {
  std::string real;
  CHORUS_RETURN_IF_ERROR(ResolveInsideRoots(roots_, dir, &real));
  struct stat st {};
  if (::stat(real.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return InvalidArgumentError(dir + ": not a directory");
  }
  std::vector<std::pair<std::string, std::string>> found;  // (name, path)
  std::vector<DirectoryEntryResult> results;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string file = it->path().filename().string();
    if (file.empty() || file[0] == '.') continue;
    const std::string p = it->path().string();
    // Nothing outside the roots is opened, not even to read its GGUF header.
    std::string resolved;
    if (Status s = ResolveInsideRoots(roots_, p, &resolved); !s.ok()) {
      const bool gguf = file.size() > 5 && file.compare(file.size() - 5, 5, ".gguf") == 0;
      results.push_back(
          DirectoryEntryResult{gguf ? file.substr(0, file.size() - 5) : file, p, s, std::nullopt});
      continue;
    }
    std::error_code e2;
    if (it->is_directory(e2)) {
      if (fs::exists(it->path() / kPeftConfig, e2)) found.emplace_back(file, p);
    } else if (it->is_regular_file(e2) && file.size() > 5 &&
               file.compare(file.size() - 5, 5, ".gguf") == 0) {
      const std::string stem = file.substr(0, file.size() - 5);
      auto g = formats::GgufFile::Open(resolved);
      if (!g.ok()) {
        results.push_back(DirectoryEntryResult{stem, p, g.status(), std::nullopt});
        continue;
      }
      auto type = (*g)->GetString("general.type");
      if (type.ok() && *type == "adapter") found.emplace_back(stem, p);
    }
  }
  if (ec) return ErrnoError(ec.value(), "cannot list " + dir);
  for (const auto& [name, p] : found) {
    auto r = Register(name, p, replace);
    if (r.ok()) {
      results.push_back(DirectoryEntryResult{name, p, OkStatus(), *r});
    } else {
      CHORUS_LOG(WARNING) << "adapter=" << name << " from " << p
                          << " not registered: " << r.status().ToString();
      results.push_back(DirectoryEntryResult{name, p, r.status(), std::nullopt});
    }
  }
  std::sort(
      results.begin(), results.end(),
      [](const DirectoryEntryResult& a, const DirectoryEntryResult& b) { return a.name < b.name; });
  return results;
}

std::optional<AdapterInfo> AdapterRegistry::Lookup(const std::string& name) const {
  MutexLock lock(&mu_);
  auto it = entries_.find(name);
  if (it == entries_.end()) return std::nullopt;
  return it->second;
}

std::vector<AdapterInfo> AdapterRegistry::List() const {
  MutexLock lock(&mu_);
  std::vector<AdapterInfo> out;
  out.reserve(entries_.size());
  for (const auto& [name, info] : entries_) out.push_back(info);  // std::map: sorted by name
  return out;
}

size_t AdapterRegistry::size() const {
  MutexLock lock(&mu_);
  return entries_.size();
}

uint64_t AdapterRegistry::next_version() const {
  MutexLock lock(&mu_);
  return next_version_;
}

Status AdapterRegistry::CheckEntry(const AdapterInfo& info) const {
  if (!options_.base_model_name.empty() && info.name == options_.base_model_name) {
    return FailedPreconditionError("adapter name '" + info.name +
                                   "' is now the base model's served name");
  }
  std::string real;
  CHORUS_RETURN_IF_ERROR(ResolveInsideRoots(roots_, info.path, &real));
  if (real != info.path) {
    return FailedPreconditionError(info.path + " now resolves to " + real + "; register it again");
  }
  for (const AdapterFile& f : info.files) {
    CHORUS_RETURN_IF_ERROR(ResolveInsideRoots(roots_, f.path, &real));
    if (real != f.path) {
      return FailedPreconditionError(f.path + " now resolves to " + real + "; register it again");
    }
  }
  return VerifyRegisteredContent(info.name, info.path, info.files, info.content_hash);
}

std::vector<std::pair<std::string, Status>> AdapterRegistry::Revalidate() {
  MutexLock write_lock(&write_mu_);
  std::vector<std::pair<std::string, Status>> bad;
  std::map<std::string, Status> checked;
  for (const auto& [name, info] : WriterEntries()) {
    Status s = CheckEntry(info);
    if (!s.ok()) bad.emplace_back(name, s);
    checked.emplace(name, std::move(s));
  }
  MutexLock lock(&mu_);
  for (auto& [name, info] : entries_) {
    const Status& s = checked.at(name);
    info.available = s.ok();
    info.problem = s.ok() ? "" : s.ToString();
  }
  return bad;
}

}  // namespace chorus::adapters
