// The adapter registry's persistence: the JSON state file, its lock file and leftover temp
// files (registry_state.h).
#include "chorus/adapters/registry_state.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <nlohmann/json.hpp>
#include <utility>

#include "chorus/adapters/fingerprint.h"
#include "chorus/adapters/registry_paths.h"
#include "chorus/base/logging.h"
#include "chorus/base/mapped_file.h"

namespace chorus::adapters::registry_internal {
namespace {

using json = nlohmann::json;

constexpr const char* kStateFormat = "chorus-adapter-registry";
constexpr int kStateSchema = 1;
constexpr size_t kMaxStateBytes = 64u << 20;

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

json ToJson(const AdapterInfo& a) {
  json files = json::array();
  for (const AdapterFile& f : a.files) {
    files.push_back({{"path", f.path}, {"size", f.size}, {"mtime_ns", f.mtime_ns}});
  }
  json out{{"name", a.name},
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
  if (!a.owner.empty()) out["owner"] = a.owner;  // absent: shared (older state files too)
  return out;
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
  if (a.kind != "lora" && a.kind != "delta") return re.Error("unknown kind '" + a.kind + "'");
  CHORUS_ASSIGN_OR_RETURN(a.format, re.String(e, "format"));
  if ((a.kind == "lora" && a.format != "peft" && a.format != "gguf") ||
      (a.kind == "delta" && a.format != "delta"))
    return re.Error("unknown format '" + a.format + "' for kind '" + a.kind + "'");
  CHORUS_ASSIGN_OR_RETURN(a.rank, re.Int(e, "rank", a.kind == "delta" ? 0 : 1));
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
  if (e.contains("owner")) {
    CHORUS_ASSIGN_OR_RETURN(a.owner, re.String(e, "owner"));
    if (a.owner.empty()) return re.Error("field 'owner' is empty");
  }
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

std::string SerializeState(const std::map<std::string, AdapterInfo>& entries,
                           uint64_t next_version) {
  json list = json::array();
  for (const auto& [name, info] : entries) list.push_back(ToJson(info));
  const json doc{{"format", kStateFormat},
                 {"schema_version", kStateSchema},
                 {"next_version", next_version},
                 {"adapters", std::move(list)}};
  return doc.dump(1) + "\n";
}

Status WriteState(const std::string& state_path, const std::map<std::string, AdapterInfo>& entries,
                  uint64_t next_version) {
  Status s = WriteFileAtomically(state_path, SerializeState(entries, next_version));
  if (!s.ok()) return s.WithContext("cannot persist adapter registry " + state_path);
  return OkStatus();
}

Result<std::optional<RegistryState>> ReadState(const std::string& state_path) {
  struct stat sst {};
  if (::stat(state_path.c_str(), &sst) != 0) {
    if (errno != ENOENT) return ErrnoError(errno, "cannot stat " + state_path);
    return std::optional<RegistryState>();
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
  return std::optional<RegistryState>(RegistryState{std::move(entries), next_version});
}

Result<int> LockState(const std::string& state_path) {
  const std::string lock_path = state_path + ".lock";
  const int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError(errno, "cannot open " + lock_path);
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    ::close(fd);
    if (err == EWOULDBLOCK) {
      return FailedPreconditionError("adapter registry " + state_path +
                                     " is in use by another process (" + lock_path + " is locked)");
    }
    return ErrnoError(err, "cannot lock " + lock_path);
  }
  return fd;
}

void RemoveLeftoverTempFiles(const std::string& state_path) {
  const std::string dir = Dirname(state_path);
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
}

}  // namespace chorus::adapters::registry_internal
