// What an adapter's files held when it was registered, and whether they still do: the content
// hash that names a registration (part of its identity, with the version) and each file's size
// and modification time. The registry records them; the host cache checks them before it loads
// an adapter from disk, so a file changed after registration is never served under the old
// identity (docs/adapters.md, "Identity").
//
// Thread-safety: pure functions over the file system.
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "chorus/base/status.h"

namespace chorus::adapters {

// One file of an adapter as recorded at registration.
struct AdapterFile {
  std::string path;  // resolved real path
  int64_t size = 0;
  int64_t mtime_ns = 0;  // st_mtim in nanoseconds since the epoch
};

// FNV-1a 64-bit: h = (h XOR byte) · 0x100000001b3 per byte, starting from `h`
// (default: the offset basis 0xcbf29ce484222325). Exposed for tests and tools.
inline constexpr uint64_t kFnv1a64Offset = 0xcbf29ce484222325ull;
uint64_t Fnv1a64(std::string_view data, uint64_t h = kFnv1a64Offset);

// FNV-1a 64 over the files (given sorted): for each, its role (its PEFT file name, or
// "adapter.gguf" whatever a GGUF file is called, so the hash depends on bytes, not on where the
// adapter lives), its size, its bytes. Records each file's fingerprint in `out`.
// kUnavailable when a file changes while it is read.
Result<uint64_t> HashFiles(const std::vector<std::string>& files, std::vector<AdapterFile>* out);

// OK when every file still has its recorded size and modification time.
Status CheckFingerprints(const std::vector<AdapterFile>& files);

// OK when the files still hold the content registered as `content_hash`: their fingerprints
// match, or (touched, or copied without preserving times) their content hash does.
// kFailedPrecondition naming the adapter otherwise ("register it again with replace");
// kNotFound when a file is gone.
Status VerifyRegisteredContent(const std::string& name, const std::string& path,
                               const std::vector<AdapterFile>& files, uint64_t content_hash);

// The files' current fingerprints (size, modification time), in the same order.
Result<std::vector<AdapterFile>> CurrentFingerprints(const std::vector<AdapterFile>& files);

// 16 lowercase hex digits.
std::string Hex64(uint64_t v);

int64_t MtimeNs(const struct stat& st);
// stat(2) of a file that must be regular.
Result<struct stat> StatRegular(const std::string& path);
// Opens a regular file for reading without following a final symlink and without blocking on
// a FIFO (O_NONBLOCK; the fstat check then refuses it). The caller closes the descriptor.
Result<int> OpenRegular(const std::string& path, struct stat* st);

}  // namespace chorus::adapters
