#include "chorus/base/durable_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>

#include "chorus/base/logging.h"

namespace chorus {
namespace {

// Which hit of `name` CHORUS_CRASH_POINT arms: 0 when it names another point or is unset.
// Read at every call (not cached), so that a forked test child may set it after the parent ran.
long ArmedHit(const char* name) {
  const char* env = std::getenv("CHORUS_CRASH_POINT");
  if (env == nullptr || *env == '\0') return 0;
  const char* at = std::strchr(env, '@');
  const size_t len = at != nullptr ? static_cast<size_t>(at - env) : std::strlen(env);
  if (std::strlen(name) != len || std::strncmp(env, name, len) != 0) return 0;
  return at != nullptr ? std::max(1L, std::atol(at + 1)) : 1;
}

}  // namespace

void CrashPoint(const char* name) {
  const long hit = ArmedHit(name);
  if (hit == 0) return;
  static std::atomic<long> hits{0};
  if (hits.fetch_add(1) + 1 == hit) ::kill(::getpid(), SIGKILL);
}

Status SyncDirectory(const std::string& dir) {
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return ErrnoError(errno, "cannot open directory " + dir);
  const int rc = ::fsync(dfd);
  const int err = errno;
  ::close(dfd);
  if (rc != 0) return ErrnoError(err, "cannot fsync directory " + dir);
  return OkStatus();
}

bool IsAtomicWriteTempName(const std::string& n) {
  const size_t at = n.rfind(".tmp.");
  if (at == std::string::npos || at == 0 || at + 5 == n.size()) return false;
  for (size_t i = at + 5; i < n.size(); ++i) {
    if (n[i] < '0' || n[i] > '9') return false;
  }
  return true;
}

int RemoveAtomicWriteTempFiles(const std::string& dir, const std::string& base_prefix) {
  int removed = 0;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return 0;
  while (struct dirent* ent = ::readdir(d)) {
    const std::string n = ent->d_name;
    if (!IsAtomicWriteTempName(n) || n.compare(0, base_prefix.size(), base_prefix) != 0) continue;
    const std::string p = dir + "/" + n;
    if (::unlink(p.c_str()) == 0) {
      ++removed;
      CHORUS_LOG(INFO) << "removed leftover temp file " << p << " (a writer was interrupted)";
    }
  }
  ::closedir(d);
  if (removed > 0) (void)SyncDirectory(dir);
  return removed;
}

namespace {

// Removes the temp files `<name>.tmp.<pid>` directly in `dir` whose name starts with `prefix`
// ("" = any) and whose writer process no longer exists.
int RemoveDeadTempFiles(const std::string& dir, const std::string& prefix) {
  int removed = 0;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return 0;
  while (struct dirent* ent = ::readdir(d)) {
    const std::string n = ent->d_name;
    if (n.compare(0, prefix.size(), prefix) != 0 || !IsAtomicWriteTempName(n)) continue;
    const long pid = std::atol(n.c_str() + n.rfind(".tmp.") + 5);
    if (pid <= 0 || pid == static_cast<long>(::getpid())) continue;
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;  // alive (or unknown)
    const std::string p = dir + "/" + n;
    if (::unlink(p.c_str()) == 0) {
      ++removed;
      CHORUS_LOG(INFO) << "removed leftover temp file " << p << " (its writer is gone)";
    }
  }
  ::closedir(d);
  return removed;
}

}  // namespace

int RemoveDeadWritersTempFiles(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "."
                          : slash == 0               ? "/"
                                                     : path.substr(0, slash);
  return RemoveDeadTempFiles(
      dir, (slash == std::string::npos ? path : path.substr(slash + 1)) + ".tmp.");
}

int RemoveDeadWritersTempFilesIn(const std::string& dir) { return RemoveDeadTempFiles(dir, ""); }

Result<std::string> QuarantineFile(const std::string& path) {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&now, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%SZ", &tm);
  std::string target = path + ".corrupt-" + stamp;
  struct stat st {};
  for (int n = 1; ::lstat(target.c_str(), &st) == 0; ++n) {
    target = path + ".corrupt-" + stamp + "-" + std::to_string(n);
  }
  if (::rename(path.c_str(), target.c_str()) != 0) {
    return ErrnoError(errno, "cannot move " + path + " aside to " + target);
  }
  const size_t slash = path.find_last_of('/');
  (void)SyncDirectory(slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash));
  return target;
}

Result<FileLock> FileLock::Acquire(const std::string& lock_path, const std::string& what) {
  const int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError(errno, "cannot open " + lock_path);
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    ::close(fd);
    if (err == EWOULDBLOCK) {
      return FailedPreconditionError(what + " is in use by another process (" + lock_path +
                                     " is locked)");
    }
    return ErrnoError(err, "cannot lock " + lock_path);
  }
  FileLock l;
  l.fd_ = fd;
  return l;
}

FileLock& FileLock::operator=(FileLock&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

FileLock::~FileLock() {
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace chorus
