#include "chorus/base/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <sstream>

#include "chorus/base/durable_file.h"
#include "chorus/base/logging.h"

namespace chorus {

Result<std::shared_ptr<const MappedFile>> MappedFile::Open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(errno, "cannot open " + path);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    return ErrnoError(e, "cannot stat " + path);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return InvalidArgumentError(path + " is not a regular file");
  }
  auto mf = std::shared_ptr<MappedFile>(new MappedFile());
  mf->path_ = path;
  mf->size_ = static_cast<size_t>(st.st_size);
  if (mf->size_ > 0) {
    void* p = ::mmap(nullptr, mf->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      ::close(fd);
      return ErrnoError(e, "cannot mmap " + path);
    }
    mf->data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
  return std::shared_ptr<const MappedFile>(std::move(mf));
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
}

void ReleaseResidentPages(const void* p, size_t n) {
#ifdef MADV_PAGEOUT
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  uintptr_t begin = (reinterpret_cast<uintptr_t>(p) + page - 1) / page * page;
  uintptr_t end = (reinterpret_cast<uintptr_t>(p) + n) / page * page;
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_PAGEOUT);
#else
  (void)p;
  (void)n;
#endif
}

Result<std::string> ReadFileToString(const std::string& path, size_t max_bytes) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(errno, "cannot open " + path);
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return InvalidArgumentError(path + " is not a regular file");
  }
  if (static_cast<size_t>(st.st_size) > max_bytes) {
    ::close(fd);
    return ResourceExhaustedError(path + " is " + std::to_string(st.st_size) +
                                  " bytes, more than the limit of " + std::to_string(max_bytes));
  }
  std::string out(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < out.size()) {
    ssize_t n = ::read(fd, out.data() + got, out.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int e = errno;
      ::close(fd);
      return ErrnoError(e, "cannot read " + path);
    }
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  return out;
}

Status WriteFileAtomically(const std::string& path, std::string_view data) {
  return WriteFileAtomically(path, std::span<const std::string_view>(&data, 1));
}

Status WriteFileAtomically(const std::string& path, std::span<const std::string_view> pieces) {
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError(errno, "cannot create " + tmp);
  size_t total = 0;
  for (std::string_view p : pieces) total += p.size();
  // Writes stop at half of the total once, so that a crash test can stop the writer there (a
  // torn temp file).
  const size_t half = total / 2;
  size_t written = 0;  // bytes of the file so far
  for (std::string_view piece : pieces) {
    size_t put = 0;
    while (put < piece.size()) {
      if (written == half) CrashPoint("atomic_write.partial");
      size_t n_max = piece.size() - put;
      if (written < half) n_max = std::min(n_max, half - written);
      ssize_t n = ::write(fd, piece.data() + put, n_max);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        int e = errno;
        ::close(fd);
        ::unlink(tmp.c_str());
        return ErrnoError(e, "cannot write " + tmp);
      }
      put += static_cast<size_t>(n);
      written += static_cast<size_t>(n);
    }
  }
  if (::fsync(fd) != 0) {
    int e = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    return ErrnoError(e, "cannot fsync " + tmp);
  }
  ::close(fd);
  CrashPoint("atomic_write.before_rename");
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int e = errno;
    ::unlink(tmp.c_str());
    return ErrnoError(e, "cannot rename " + tmp + " to " + path);
  }
  CrashPoint("atomic_write.after_rename");
  // fsync the directory so the rename itself survives a crash.
  const size_t slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? std::string(".")
                          : slash == 0               ? std::string("/")
                                                     : path.substr(0, slash);
  // The new content is in place; a failed directory fsync only weakens durability against a
  // power loss, so it is reported but not an error (the caller's state already changed).
  if (Status s = SyncDirectory(dir); !s.ok()) {
    CHORUS_LOG(WARNING) << s.ToString();
  }
  return OkStatus();
}

}  // namespace chorus
