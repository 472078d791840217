#include "chorus/adapters/registry.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <utility>

#include "chorus/adapters/lora/lora_files.h"
#include "chorus/base/logging.h"
#include "chorus/base/mapped_file.h"
#include "chorus/formats/gguf.h"

namespace chorus::adapters {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr const char* kStateFormat = "chorus-adapter-registry";
constexpr int kStateSchema = 1;
constexpr size_t kMaxNameLength = 128;
constexpr size_t kMaxStateBytes = 64u << 20;
constexpr const char* kPeftConfig = "adapter_config.json";
constexpr const char* kPeftWeights = "adapter_model.safetensors";
constexpr const char* kPeftPickle = "adapter_model.bin";

bool ParseHex64(const std::string& s, uint64_t* v) {
  if (s.size() != 16) return false;
  uint64_t r = 0;
  for (char c : s) {
    int d;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      d = c - 'a' + 10;
    } else {
      return false;
    }
    r = (r << 4) | static_cast<uint64_t>(d);
  }
  *v = r;
  return true;
}

std::string Basename(const std::string& p) {
  const size_t slash = p.find_last_of('/');
  return slash == std::string::npos ? p : p.substr(slash + 1);
}

std::string Dirname(const std::string& p) {
  const size_t slash = p.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return p.substr(0, slash);
}

// realpath(3) as a Result (ENOENT → kNotFound).
Result<std::string> RealPath(const std::string& path) {
  char* r = ::realpath(path.c_str(), nullptr);
  if (r == nullptr) return ErrnoError(errno, "cannot resolve " + path);
  std::string out(r);
  std::free(r);
  return out;
}

// True when `resolved` (an absolute, normalized path) is `root` or below it, on a component
// boundary: /a/bc is not inside /a/b.
bool IsInside(const std::string& resolved, const std::string& root) {
  if (root == "/") return !resolved.empty() && resolved[0] == '/';
  if (resolved.size() < root.size() || resolved.compare(0, root.size(), root) != 0) return false;
  return resolved.size() == root.size() || resolved[root.size()] == '/';
}

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

json ToJson(const AdapterInfo& a) {
  json files = json::array();
  for (const AdapterFile& f : a.files) {
    files.push_back({{"path", f.path}, {"size", f.size}, {"mtime_ns", f.mtime_ns}});
  }
  return json{{"name", a.name},
              {"path", a.path},
              {"kind", a.kind},
              {"format", a.format},
              {"rank", a.rank},
              {"target_modules", a.target_modules},
              {"alpha", a.alpha},
              {"scale", a.scale},
              {"use_rslora", a.use_rslora},
              {"base_model", a.base_model},
              {"content_hash", Hex64(a.content_hash)},
              {"version", a.version},
              {"bytes", a.bytes},
              {"created", a.created},
              {"files", files}};
}

// Strict field access for the state file: every error says which field of which entry.
class Reader {
 public:
  explicit Reader(std::string where) : where_(std::move(where)) {}
  Status Error(const std::string& what) const { return DataLossError(where_ + ": " + what); }

  Result<const json*> Field(const json& obj, const char* key) const {
    if (!obj.is_object()) return Error("expected an object");
    auto it = obj.find(key);
    if (it == obj.end()) return Error(std::string("missing field '") + key + "'");
    return &*it;
  }
  Result<std::string> String(const json& obj, const char* key) const {
    CHORUS_ASSIGN_OR_RETURN(const json* v, Field(obj, key));
    if (!v->is_string()) return Error(std::string("field '") + key + "' is not a string");
    return v->get<std::string>();
  }
  Result<int64_t> Int(const json& obj, const char* key, int64_t min) const {
    CHORUS_ASSIGN_OR_RETURN(const json* v, Field(obj, key));
    if (!v->is_number_integer()) return Error(std::string("field '") + key + "' is not an integer");
    if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
      return Error(std::string("field '") + key + "' is out of range");
    }
    const int64_t x = v->get<int64_t>();
    if (x < min) return Error(std::string("field '") + key + "' is out of range");
    return x;
  }
  Result<uint64_t> Uint(const json& obj, const char* key) const {
    CHORUS_ASSIGN_OR_RETURN(const json* v, Field(obj, key));
    if (!v->is_number_unsigned()) {
      return Error(std::string("field '") + key + "' is not a non-negative integer");
    }
    return v->get<uint64_t>();
  }
  Result<float> Float(const json& obj, const char* key) const {
    CHORUS_ASSIGN_OR_RETURN(const json* v, Field(obj, key));
    if (!v->is_number()) return Error(std::string("field '") + key + "' is not a number");
    const double d = v->get<double>();
    if (!std::isfinite(d) || std::fabs(d) > 3e38) {
      return Error(std::string("field '") + key + "' is not a finite float");
    }
    return static_cast<float>(d);
  }
  Result<bool> Bool(const json& obj, const char* key) const {
    CHORUS_ASSIGN_OR_RETURN(const json* v, Field(obj, key));
    if (!v->is_boolean()) return Error(std::string("field '") + key + "' is not a boolean");
    return v->get<bool>();
  }

 private:
  std::string where_;
};

Result<AdapterInfo> ParseEntry(const json& e, const std::string& where) {
  Reader r(where);
  AdapterInfo a;
  CHORUS_ASSIGN_OR_RETURN(a.name, r.String(e, "name"));
  if (!IsValidAdapterName(a.name)) return r.Error("invalid adapter name '" + a.name + "'");
  Reader re(where + ": adapter '" + a.name + "'");
  CHORUS_ASSIGN_OR_RETURN(a.path, re.String(e, "path"));
  if (a.path.empty() || a.path[0] != '/') return re.Error("path is not absolute");
  CHORUS_ASSIGN_OR_RETURN(a.kind, re.String(e, "kind"));
  if (a.kind != "lora") return re.Error("unknown kind '" + a.kind + "'");
  CHORUS_ASSIGN_OR_RETURN(a.format, re.String(e, "format"));
  if (a.format != "peft" && a.format != "gguf")
    return re.Error("unknown format '" + a.format + "'");
  CHORUS_ASSIGN_OR_RETURN(a.rank, re.Int(e, "rank", 1));
  CHORUS_ASSIGN_OR_RETURN(const json* tm, re.Field(e, "target_modules"));
  if (!tm->is_array()) return re.Error("field 'target_modules' is not an array");
  for (const json& m : *tm) {
    if (!m.is_string()) return re.Error("field 'target_modules' holds a non-string");
    a.target_modules.push_back(m.get<std::string>());
  }
  CHORUS_ASSIGN_OR_RETURN(a.alpha, re.Float(e, "alpha"));
  CHORUS_ASSIGN_OR_RETURN(a.scale, re.Float(e, "scale"));
  CHORUS_ASSIGN_OR_RETURN(a.use_rslora, re.Bool(e, "use_rslora"));
  CHORUS_ASSIGN_OR_RETURN(a.base_model, re.String(e, "base_model"));
  CHORUS_ASSIGN_OR_RETURN(std::string hash, re.String(e, "content_hash"));
  if (!ParseHex64(hash, &a.content_hash))
    return re.Error("field 'content_hash' is not 16 hex digits");
  CHORUS_ASSIGN_OR_RETURN(a.version, re.Uint(e, "version"));
  if (a.version == 0) return re.Error("version 0");
  CHORUS_ASSIGN_OR_RETURN(a.bytes, re.Int(e, "bytes", 0));
  CHORUS_ASSIGN_OR_RETURN(a.created, re.Int(e, "created", 0));
  CHORUS_ASSIGN_OR_RETURN(const json* files, re.Field(e, "files"));
  if (!files->is_array() || files->empty())
    return re.Error("field 'files' is not a non-empty array");
  int64_t total = 0;
  for (const json& f : *files) {
    AdapterFile af;
    CHORUS_ASSIGN_OR_RETURN(af.path, re.String(f, "path"));
    if (af.path.empty() || af.path[0] != '/') return re.Error("a file path is not absolute");
    CHORUS_ASSIGN_OR_RETURN(af.size, re.Int(f, "size", 0));
    CHORUS_ASSIGN_OR_RETURN(af.mtime_ns, re.Int(f, "mtime_ns", INT64_MIN));
    if (af.size > INT64_MAX - total) return re.Error("file sizes overflow");
    total += af.size;
    a.files.push_back(std::move(af));
  }
  if (total != a.bytes) return re.Error("'bytes' is not the sum of the file sizes");
  return a;
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
  for (const std::string& root : options.adapter_roots) {
    auto real = RealPath(root);
    if (!real.ok()) return real.status().WithContext("adapter root");
    struct stat st {};
    if (::stat(real->c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      return InvalidArgumentError("adapter root " + root + " is not a directory");
    }
    if (std::find(reg->roots_.begin(), reg->roots_.end(), *real) == reg->roots_.end()) {
      reg->roots_.push_back(*real);
    }
  }
  reg->state_path_ = state_path;
  reg->options_ = std::move(options);

  const std::string dir = Dirname(state_path);
  struct stat dst {};
  if (::stat(dir.c_str(), &dst) != 0) return ErrnoError(errno, "adapter registry directory " + dir);
  if (!S_ISDIR(dst.st_mode))
    return InvalidArgumentError("adapter registry: " + dir + " is not a directory");

  // One process per state file: an exclusive lock held until destruction (or death).
  const std::string lock_path = state_path + ".lock";
  reg->lock_fd_ = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (reg->lock_fd_ < 0) return ErrnoError(errno, "cannot open " + lock_path);
  if (::flock(reg->lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) {
      return FailedPreconditionError("adapter registry " + state_path +
                                     " is in use by another process (" + lock_path + " is locked)");
    }
    return ErrnoError(errno, "cannot lock " + lock_path);
  }

  // Temp files of a writer killed before its rename: never read, removed now that we hold the
  // lock (nobody else can be writing one).
  const std::string tmp_prefix = Basename(state_path) + ".tmp.";
  if (DIR* d = ::opendir(dir.c_str())) {
    while (struct dirent* ent = ::readdir(d)) {
      const std::string n = ent->d_name;
      if (n.size() <= tmp_prefix.size() || n.compare(0, tmp_prefix.size(), tmp_prefix) != 0)
        continue;
      const std::string suffix = n.substr(tmp_prefix.size());
      if (!std::all_of(suffix.begin(), suffix.end(), [](char c) { return c >= '0' && c <= '9'; })) {
        continue;
      }
      const std::string p = dir + "/" + n;
      if (::unlink(p.c_str()) == 0) {
        CHORUS_LOG(INFO) << "adapter registry: removed leftover temp file " << p;
      }
    }
    ::closedir(d);
  }

  struct stat sst {};
  if (::stat(state_path.c_str(), &sst) != 0) {
    if (errno != ENOENT) return ErrnoError(errno, "cannot stat " + state_path);
    CHORUS_RETURN_IF_ERROR(reg->Persist({}, 1));
    return reg;
  }
  if (!S_ISREG(sst.st_mode)) return InvalidArgumentError(state_path + ": not a regular file");
  auto text = ReadFileToString(state_path, kMaxStateBytes);
  if (!text.ok()) {
    if (text.status().code() == StatusCode::kNotFound) return text.status();
    return DataLossError(state_path +
                         ": unreadable adapter registry state: " + text.status().message());
  }
  const json doc = json::parse(*text, nullptr, /*allow_exceptions=*/false);
  Reader r(state_path + ": corrupt adapter registry state");
  if (doc.is_discarded()) return r.Error("not valid JSON");
  CHORUS_ASSIGN_OR_RETURN(std::string format, r.String(doc, "format"));
  if (format != kStateFormat)
    return r.Error("format is '" + format + "', expected '" + kStateFormat + "'");
  CHORUS_ASSIGN_OR_RETURN(int64_t schema, r.Int(doc, "schema_version", 1));
  if (schema > kStateSchema) {
    return UnimplementedError(state_path + ": adapter registry schema " + std::to_string(schema) +
                              " was written by a newer Chorus (this one reads " +
                              std::to_string(kStateSchema) + ")");
  }
  CHORUS_ASSIGN_OR_RETURN(uint64_t next_version, r.Uint(doc, "next_version"));
  if (next_version == 0) return r.Error("next_version 0");
  CHORUS_ASSIGN_OR_RETURN(const json* list, r.Field(doc, "adapters"));
  if (!list->is_array()) return r.Error("'adapters' is not an array");
  std::map<std::string, AdapterInfo> entries;
  std::map<uint64_t, std::string> versions;
  for (const json& e : *list) {
    CHORUS_ASSIGN_OR_RETURN(AdapterInfo a,
                            ParseEntry(e, state_path + ": corrupt adapter registry state"));
    if (a.version >= next_version) {
      return r.Error("adapter '" + a.name + "' has version " + std::to_string(a.version) +
                     " ≥ next_version " + std::to_string(next_version));
    }
    if (!versions.emplace(a.version, a.name).second) {
      return r.Error("adapters '" + versions[a.version] + "' and '" + a.name + "' share version " +
                     std::to_string(a.version));
    }
    const std::string name = a.name;
    if (!entries.emplace(name, std::move(a)).second)
      return r.Error("adapter '" + name + "' listed twice");
  }
  {
    MutexLock write_lock(&reg->write_mu_);  // not shared yet; taken for the rule's sake
    MutexLock lock(&reg->mu_);
    reg->entries_ = std::move(entries);
    reg->next_version_ = next_version;
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

Status AdapterRegistry::Persist(const std::map<std::string, AdapterInfo>& entries,
                                uint64_t next_version) {
  json list = json::array();
  for (const auto& [name, info] : entries) list.push_back(ToJson(info));
  const json doc{{"format", kStateFormat},
                 {"schema_version", kStateSchema},
                 {"next_version", next_version},
                 {"adapters", std::move(list)}};
  Status s = WriteFileAtomically(state_path_, doc.dump(1) + "\n");
  if (!s.ok()) return s.WithContext("cannot persist adapter registry " + state_path_);
  return OkStatus();
}

Status AdapterRegistry::ResolveInsideRoots(const std::string& path, std::string* resolved) const {
  if (roots_.empty()) {
    return PermissionDeniedError("adapter path " + path +
                                 " refused: no adapter roots are configured");
  }
  auto refuse = [&]() {
    std::string roots;
    for (const std::string& r : roots_) roots += (roots.empty() ? "" : ", ") + r;
    return PermissionDeniedError("adapter path " + path + " is outside the adapter roots (" +
                                 roots + ")");
  };
  auto real = RealPath(path);
  if (!real.ok()) {
    // Say "outside the roots" rather than "does not exist" for a path that lexically leaves
    // them, so the API does not reveal which paths exist elsewhere.
    const std::string lexical = fs::path(path).lexically_normal().string();
    const bool inside = std::any_of(roots_.begin(), roots_.end(),
                                    [&](const std::string& r) { return IsInside(lexical, r); });
    if (!inside) return refuse();
    return real.status();
  }
  for (const std::string& r : roots_) {
    if (IsInside(*real, r)) {
      *resolved = *real;
      return OkStatus();
    }
  }
  return refuse();
}

namespace {

// What Register() reads: the resolved adapter path, its format and files (sorted).
struct ResolvedAdapter {
  std::string path;
  std::string format;
  std::vector<std::string> files;
};

}  // namespace

Result<AdapterInfo> AdapterRegistry::Register(const std::string& name, const std::string& path,
                                              bool replace) {
  MutexLock write_lock(&write_mu_);
  CHORUS_RETURN_IF_ERROR(ValidateName(name, options_.base_model_name));
  const std::map<std::string, AdapterInfo>& entries = WriterEntries();
  if (!replace && entries.count(name) != 0) {
    return AlreadyExistsError("adapter '" + name + "' is already registered (" +
                              entries.at(name).path + "); unregister it or replace it");
  }
  if (path.empty()) return InvalidArgumentError("adapter '" + name + "': empty path");

  // Relative paths are relative to the roots (the first root under which the path exists).
  std::string candidate = path;
  if (path[0] != '/') {
    candidate.clear();
    for (const std::string& r : roots_) {
      struct stat st {};
      const std::string p = r + "/" + path;
      if (::lstat(p.c_str(), &st) == 0) {
        candidate = p;
        break;
      }
    }
    if (candidate.empty()) {
      return roots_.empty()
                 ? PermissionDeniedError("adapter path " + path +
                                         " refused: no adapter roots are configured")
                 : NotFoundError("adapter path " + path + " exists under no adapter root");
    }
  }

  ResolvedAdapter ra;
  CHORUS_RETURN_IF_ERROR(ResolveInsideRoots(candidate, &ra.path));
  struct stat st {};
  if (::stat(ra.path.c_str(), &st) != 0) return ErrnoError(errno, "cannot stat " + ra.path);
  if (S_ISREG(st.st_mode)) {
    const std::string base = Basename(ra.path);
    if (base == kPeftConfig || base == kPeftWeights) {
      ra.path = Dirname(ra.path);  // the PEFT directory (inside the root: its child is)
    } else {
      struct stat fst {};
      CHORUS_ASSIGN_OR_RETURN(const int fd, OpenRegular(ra.path, &fst));
      char magic[4] = {0, 0, 0, 0};
      const ssize_t n = ::read(fd, magic, 4);
      ::close(fd);
      if (n != 4 || std::string_view(magic, 4) != "GGUF") {
        return InvalidArgumentError(ra.path +
                                    ": not a LoRA adapter (expected a PEFT directory with " +
                                    kPeftConfig + " and " + kPeftWeights + ", or a GGUF file)");
      }
      ra.format = "gguf";
      ra.files = {ra.path};
    }
  } else if (!S_ISDIR(st.st_mode)) {
    return InvalidArgumentError(ra.path + ": neither a directory nor a regular file");
  }
  if (ra.format.empty()) {
    ra.format = "peft";
    for (const char* f : {kPeftConfig, kPeftWeights}) {
      const std::string p = ra.path + "/" + f;
      struct stat fst {};
      if (::lstat(p.c_str(), &fst) != 0) {
        struct stat pst {};
        if (std::string(f) == kPeftWeights &&
            ::lstat((ra.path + "/" + kPeftPickle).c_str(), &pst) == 0) {
          return UnimplementedError(ra.path +
                                    ": adapter_model.bin is a pickle file, which Chorus refuses to "
                                    "load; save the adapter as safetensors");
        }
        return NotFoundError(ra.path + ": no " + f);
      }
      // Each file may itself be a symlink: it must resolve inside a root too.
      std::string real;
      CHORUS_RETURN_IF_ERROR(ResolveInsideRoots(p, &real));
      CHORUS_RETURN_IF_ERROR(StatRegular(real).status());
      ra.files.push_back(real);
    }
  }
  std::sort(ra.files.begin(), ra.files.end());

  AdapterInfo info;
  info.name = name;
  info.path = ra.path;
  info.format = ra.format;
  CHORUS_ASSIGN_OR_RETURN(info.content_hash, HashFiles(ra.files, &info.files));
  for (const AdapterFile& f : info.files) info.bytes += f.size;

  // Validate exactly as serving will load it. The files read are the resolved ones: a PEFT
  // directory's two files (checked above), or the GGUF file.
  LoraLoadOptions lo;
  lo.limits.max_rank = options_.max_lora_rank;
  auto weights = ReadLora(ra.path, options_.base, lo);
  if (!weights.ok()) return weights.status().WithContext("adapter '" + name + "'");
  auto built = LoraAdapter::Build(*weights, options_.base, name, lo.limits);
  if (!built.ok()) return built.status().WithContext("adapter '" + name + "': " + ra.path);
  Summarize(*weights, &info);
  if (info.rank < 1)
    return InvalidArgumentError("adapter '" + name + "': " + ra.path + " holds no LoRA modules");
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
  CHORUS_RETURN_IF_ERROR(Persist(next, version + 1));
  {
    MutexLock lock(&mu_);
    entries_ = std::move(next);
    next_version_ = version + 1;
  }
  CHORUS_LOG(INFO) << "adapter=" << name << " registered: " << info.path << " rank " << info.rank
                   << " id " << info.id().ToString();
  return info;
}

Status AdapterRegistry::Unregister(const std::string& name) {
  MutexLock write_lock(&write_mu_);
  if (WriterEntries().count(name) == 0)
    return NotFoundError("adapter '" + name + "' is not registered");
  std::map<std::string, AdapterInfo> next = WriterEntries();
  next.erase(name);
  CHORUS_RETURN_IF_ERROR(Persist(next, WriterNextVersion()));
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
  CHORUS_RETURN_IF_ERROR(ResolveInsideRoots(dir, &real));
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
    if (Status s = ResolveInsideRoots(p, &resolved); !s.ok()) {
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
  CHORUS_RETURN_IF_ERROR(ResolveInsideRoots(info.path, &real));
  if (real != info.path) {
    return FailedPreconditionError(info.path + " now resolves to " + real + "; register it again");
  }
  for (const AdapterFile& f : info.files) {
    CHORUS_RETURN_IF_ERROR(ResolveInsideRoots(f.path, &real));
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
