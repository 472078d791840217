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
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>

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

// Whether process `pid` no longer exists (not this one; a process we may not signal counts as
// alive).
bool ProcessIsGone(long pid) {
  return pid > 0 && pid != static_cast<long>(::getpid()) &&
         ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH;
}

// Removes the temp files `<name>.tmp.<pid>` directly in `dir` whose name starts with `prefix`
// ("" = any) and whose writer process no longer exists.
int RemoveDeadTempFiles(const std::string& dir, const std::string& prefix) {
  int removed = 0;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return 0;
  while (struct dirent* ent = ::readdir(d)) {
    const std::string n = ent->d_name;
    if (n.compare(0, prefix.size(), prefix) != 0 || !IsAtomicWriteTempName(n)) continue;
    if (!ProcessIsGone(std::atol(n.c_str() + n.rfind(".tmp.") + 5))) continue;
    const std::string p = dir + "/" + n;
    struct stat st {};
    if (::lstat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
      // A StagedDirectory's staging directory (or the old contents it swapped out).
      std::error_code ec;
      if (std::filesystem::remove_all(p, ec) != static_cast<std::uintmax_t>(-1) && !ec) {
        ++removed;
        CHORUS_LOG(INFO) << "removed leftover staging directory " << p << " (its writer is gone)";
      }
    } else if (::unlink(p.c_str()) == 0) {
      ++removed;
      CHORUS_LOG(INFO) << "removed leftover temp file " << p << " (its writer is gone)";
    }
  }
  ::closedir(d);
  return removed;
}

std::string ParentOf(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
}

std::string BaseNameOf(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// fsync of every regular file under `dir` (what a staged directory holds before it is put in
// place: WriteFileAtomically's files are synced already, links and copies are not).
Status SyncFilesUnder(const std::string& dir) {
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(dir, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    const auto& p = it->path();
    if (it->is_directory(ec)) {
      CHORUS_RETURN_IF_ERROR(SyncDirectory(p.string()));
      continue;
    }
    if (!it->is_regular_file(ec) || it->is_symlink(ec)) continue;
    const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ErrnoError(errno, "cannot open " + p.string());
    const int rc = ::fsync(fd);
    const int err = errno;
    ::close(fd);
    if (rc != 0) return ErrnoError(err, "cannot fsync " + p.string());
  }
  if (ec) return ErrnoError(ec.value(), "cannot list " + dir);
  return SyncDirectory(dir);
}

}  // namespace

int RemoveDeadWritersTempFiles(const std::string& path) {
  return RemoveDeadTempFiles(ParentOf(path), BaseNameOf(path) + ".tmp.");
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

Result<StagedDirectory> StagedDirectory::Begin(const std::string& dir_arg) {
  namespace fs = std::filesystem;
  if (dir_arg.empty()) return InvalidArgumentError("no output directory given");
  // An absolute, normal path ("." and "out/" included), so the staging directory is a sibling.
  std::error_code abs_ec;
  std::string dir = fs::absolute(dir_arg, abs_ec).lexically_normal().string();
  if (abs_ec) return ErrnoError(abs_ec.value(), "cannot resolve " + dir_arg);
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  if (dir == "/") return InvalidArgumentError("the root directory cannot be replaced");
  struct stat st {};
  if (::lstat(dir.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
    // The link stays; the directory it names is replaced.
    std::error_code ec;
    const fs::path target = fs::canonical(dir, ec);
    if (ec) return ErrnoError(ec.value(), "cannot resolve the symbolic link " + dir);
    dir = target.string();
  }
  const std::string parent = ParentOf(dir), name = BaseNameOf(dir);
  // A killed fallback swap (no RENAME_EXCHANGE) may have left the old contents aside and `dir`
  // absent: put them back first, so the state is the old one again.
  const std::string aside_prefix = name + ".tmp.";
  if (DIR* d = ::opendir(parent.c_str())) {
    while (struct dirent* ent = ::readdir(d)) {
      const std::string n = ent->d_name;
      if (n.size() <= aside_prefix.size() + 4 ||
          n.compare(0, aside_prefix.size(), aside_prefix) != 0 ||
          n.compare(n.size() - 4, 4, ".old") != 0)
        continue;
      const std::string digits = n.substr(aside_prefix.size(), n.size() - 4 - aside_prefix.size());
      if (digits.find_first_not_of("0123456789") != std::string::npos) continue;
      if (!ProcessIsGone(std::atol(digits.c_str()))) continue;
      const std::string p = parent + "/" + n;
      if (::lstat(dir.c_str(), &st) != 0 && errno == ENOENT &&
          ::rename(p.c_str(), dir.c_str()) == 0) {
        CHORUS_LOG(WARNING) << "restored " << dir << " from " << p
                            << " (a writer was killed while it swapped them)";
      } else {
        std::error_code ec;
        fs::remove_all(p, ec);
      }
    }
    ::closedir(d);
  }
  RemoveDeadWritersTempFiles(dir);
  if (::stat(dir.c_str(), &st) == 0 && !S_ISDIR(st.st_mode))
    return FailedPreconditionError(dir + " exists and is not a directory");
  const std::string staging = dir + ".tmp." + std::to_string(::getpid());
  std::error_code ec;
  fs::remove_all(staging, ec);  // an earlier StagedDirectory of this process that failed
  if (::mkdir(staging.c_str(), 0755) != 0) {
    return ErrnoError(errno, "cannot create the staging directory " + staging +
                                 " (the directory is written beside " + dir +
                                 " and swapped in whole, so its parent must be writable)");
  }
  return StagedDirectory(dir, staging);
}

StagedDirectory::StagedDirectory(StagedDirectory&& o) noexcept
    : dir_(std::move(o.dir_)), staging_(std::move(o.staging_)), done_(o.done_) {
  o.done_ = true;
}

StagedDirectory::~StagedDirectory() {
  if (done_) return;
  std::error_code ec;
  std::filesystem::remove_all(staging_, ec);
}

Status StagedDirectory::Commit(const std::function<bool(const std::string& name)>& replaced) {
  namespace fs = std::filesystem;
  if (done_) return FailedPreconditionError("staged directory " + staging_ + " already committed");
  std::error_code ec;
  const bool had_old = fs::is_directory(dir_, ec);
  if (had_old) {
    // increment(ec), not ++: an error while listing is reported, never thrown.
    for (auto it = fs::directory_iterator(dir_, ec); !ec && it != fs::directory_iterator();
         it.increment(ec)) {
      const fs::directory_entry& e = *it;
      const std::string n = e.path().filename().string();
      if (IsAtomicWriteTempName(n) || (replaced && replaced(n))) continue;
      const fs::path to = fs::path(staging_) / n;
      std::error_code st_ec;
      if (fs::exists(fs::symlink_status(to, st_ec))) continue;  // the new contents hold it
      std::error_code link_ec;
      fs::copy(e.path(), to,
               fs::copy_options::recursive | fs::copy_options::copy_symlinks |
                   fs::copy_options::create_hard_links,
               link_ec);
      if (link_ec) {
        fs::remove_all(to, link_ec);
        std::error_code copy_ec;
        fs::copy(e.path(), to, fs::copy_options::recursive | fs::copy_options::copy_symlinks,
                 copy_ec);
        if (copy_ec)
          return ErrnoError(copy_ec.value(),
                            "cannot carry " + e.path().string() + " over into " + staging_);
      }
    }
    if (ec) return ErrnoError(ec.value(), "cannot list " + dir_);
  }
  // A replaced directory keeps its permission bits (a new one has rwxr-xr-x less the umask).
  struct stat old_st {};
  if (had_old && ::stat(dir_.c_str(), &old_st) == 0 &&
      ::chmod(staging_.c_str(), old_st.st_mode & 07777) != 0) {
    return ErrnoError(errno, "cannot give " + staging_ + " the permissions of " + dir_);
  }
  CHORUS_RETURN_IF_ERROR(SyncFilesUnder(staging_));
  CrashPoint("staged_dir.before_exchange");
  const std::string parent = ParentOf(dir_);
  if (!had_old) {
    if (::rename(staging_.c_str(), dir_.c_str()) != 0)
      return ErrnoError(errno, "cannot rename " + staging_ + " to " + dir_);
    done_ = true;
    CrashPoint("staged_dir.after_exchange");
    return SyncDirectory(parent);
  }
  if (::renameat2(AT_FDCWD, staging_.c_str(), AT_FDCWD, dir_.c_str(), RENAME_EXCHANGE) != 0) {
    const int err = errno;
    if (err != EINVAL && err != ENOSYS && err != ENOTSUP)
      return ErrnoError(err, "cannot swap " + staging_ + " with " + dir_);
    // No RENAME_EXCHANGE here: old aside, new in (Begin restores the old one after a kill
    // between the two).
    const std::string aside = dir_ + ".tmp." + std::to_string(::getpid()) + ".old";
    if (::rename(dir_.c_str(), aside.c_str()) != 0)
      return ErrnoError(errno, "cannot move " + dir_ + " aside to " + aside);
    if (::rename(staging_.c_str(), dir_.c_str()) != 0) {
      const int err2 = errno;
      (void)::rename(aside.c_str(), dir_.c_str());
      return ErrnoError(err2, "cannot rename " + staging_ + " to " + dir_);
    }
    done_ = true;
    CrashPoint("staged_dir.after_exchange");
    CHORUS_RETURN_IF_ERROR(SyncDirectory(parent));
    fs::remove_all(aside, ec);
    return OkStatus();
  }
  // The old contents are now at staging_.
  done_ = true;
  CrashPoint("staged_dir.after_exchange");
  CHORUS_RETURN_IF_ERROR(SyncDirectory(parent));
  fs::remove_all(staging_, ec);
  if (ec) {
    CHORUS_LOG(WARNING) << "cannot remove the replaced contents at " << staging_ << ": "
                        << ec.message();
  }
  return OkStatus();
}

}  // namespace chorus
