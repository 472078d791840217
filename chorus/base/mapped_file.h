// MappedFile: a read-only mmap of a whole file (RAII). Model weights are used in place from it
// where the file layout is the compute layout.
//
// Thread-safety: immutable after Open(); share via std::shared_ptr<const MappedFile>.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "chorus/base/status.h"

namespace chorus {

class MappedFile {
 public:
  // Maps `path` read-only. Errors: kNotFound, kPermissionDenied, kInvalidArgument (a directory).
  static Result<std::shared_ptr<const MappedFile>> Open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  std::string_view view() const { return {reinterpret_cast<const char*>(data_), size_}; }

 private:
  MappedFile() = default;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
};

// Asks the kernel to reclaim the whole pages inside [p, p + n) (MADV_PAGEOUT). Clean pages of a
// file mapping leave the resident set and are re-read from the file if touched again; heap
// pages are never lost (without swap they simply stay). Used after weights were repacked, so
// the mmapped source no longer counts twice. Best effort: errors are ignored.
void ReleaseResidentPages(const void* p, size_t n);

// Reads a whole (small) file into a string. Refuses files larger than `max_bytes`.
Result<std::string> ReadFileToString(const std::string& path, size_t max_bytes = 256u << 20);

// Writes `data` to `path` atomically: a temp file `<path>.tmp.<pid>` in the same directory,
// fsync, rename, directory fsync. A process killed at any moment leaves the old or the new
// content at `path`, at worst plus a temp file that its owner removes at its next start
// (durable_file.h, RemoveAtomicWriteTempFiles). Crash points (durable_file.h, CrashPoint):
// atomic_write.partial, atomic_write.before_rename, atomic_write.after_rename.
Status WriteFileAtomically(const std::string& path, std::string_view data);
// The same for a file that is the concatenation of `pieces`, written one after the other, so
// that a large file (a model's tensors) need not be assembled in memory first. The partial crash
// point falls at half of the total bytes, as above.
Status WriteFileAtomically(const std::string& path, std::span<const std::string_view> pieces);

}  // namespace chorus
