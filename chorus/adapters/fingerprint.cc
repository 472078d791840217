#include "chorus/adapters/fingerprint.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>

namespace chorus::adapters {
namespace {

constexpr const char* kPeftConfig = "adapter_config.json";
constexpr const char* kPeftWeights = "adapter_model.safetensors";
constexpr const char* kGgufRole = "adapter.gguf";

std::string RoleOf(const std::string& file) {
  const std::string base = std::filesystem::path(file).filename().string();
  if (base == kPeftConfig || base == kPeftWeights) return base;
  return kGgufRole;
}

}  // namespace

uint64_t Fnv1a64(std::string_view data, uint64_t h) {
  for (unsigned char c : data) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

std::string Hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

int64_t MtimeNs(const struct stat& st) {
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}

Result<struct stat> StatRegular(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return ErrnoError(errno, "cannot stat " + path);
  if (!S_ISREG(st.st_mode)) return InvalidArgumentError(path + ": not a regular file");
  return st;
}

Result<int> OpenRegular(const std::string& path, struct stat* st) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return ErrnoError(errno, "cannot open " + path);
  if (::fstat(fd, st) != 0 || !S_ISREG(st->st_mode)) {
    ::close(fd);
    return InvalidArgumentError(path + ": not a regular file");
  }
  return fd;
}

Result<uint64_t> HashFiles(const std::vector<std::string>& files, std::vector<AdapterFile>* out) {
  uint64_t h = kFnv1a64Offset;
  std::vector<char> buf(1u << 20);
  out->clear();
  for (const std::string& path : files) {
    struct stat st {};
    CHORUS_ASSIGN_OR_RETURN(const int fd, OpenRegular(path, &st));
    const std::string role = RoleOf(path);
    h = Fnv1a64(std::string_view(role.data(), role.size() + 1), h);  // with its NUL
    char size_le[8];
    for (int i = 0; i < 8; ++i)
      size_le[i] = static_cast<char>((static_cast<uint64_t>(st.st_size) >> (8 * i)) & 0xff);
    h = Fnv1a64(std::string_view(size_le, 8), h);
    int64_t total = 0;
    for (;;) {
      const ssize_t n = ::read(fd, buf.data(), buf.size());
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        const int e = errno;
        ::close(fd);
        return ErrnoError(e, "cannot read " + path);
      }
      if (n == 0) break;
      h = Fnv1a64(std::string_view(buf.data(), static_cast<size_t>(n)), h);
      total += n;
    }
    ::close(fd);
    if (total != static_cast<int64_t>(st.st_size)) {
      return UnavailableError(path + ": changed while being read; try again");
    }
    out->push_back(AdapterFile{path, static_cast<int64_t>(st.st_size), MtimeNs(st)});
  }
  return h;
}

Status CheckFingerprints(const std::vector<AdapterFile>& files) {
  for (const AdapterFile& f : files) {
    CHORUS_ASSIGN_OR_RETURN(struct stat st, StatRegular(f.path));
    if (static_cast<int64_t>(st.st_size) != f.size || MtimeNs(st) != f.mtime_ns) {
      return FailedPreconditionError(f.path + ": size or modification time changed");
    }
  }
  return OkStatus();
}

Result<std::vector<AdapterFile>> CurrentFingerprints(const std::vector<AdapterFile>& files) {
  std::vector<AdapterFile> now;
  for (const AdapterFile& f : files) {
    CHORUS_ASSIGN_OR_RETURN(struct stat st, StatRegular(f.path));
    now.push_back(AdapterFile{f.path, static_cast<int64_t>(st.st_size), MtimeNs(st)});
  }
  return now;
}

Status VerifyRegisteredContent(const std::string& name, const std::string& path,
                               const std::vector<AdapterFile>& files, uint64_t content_hash) {
  if (CheckFingerprints(files).ok()) return OkStatus();
  std::vector<std::string> paths;
  for (const AdapterFile& f : files) paths.push_back(f.path);
  std::vector<AdapterFile> now;
  CHORUS_ASSIGN_OR_RETURN(uint64_t hash, HashFiles(paths, &now));
  if (hash != content_hash) {
    return FailedPreconditionError(
        "adapter '" + name + "': " + path + " changed since it was registered (content hash " +
        Hex64(hash) + ", registered " + Hex64(content_hash) + "); register it again with replace");
  }
  return OkStatus();
}

}  // namespace chorus::adapters
