// The adapter registry's path policy (registry.h, "What Register() accepts"): which paths lie
// inside the adapter roots (realpath(3), compared on path-component boundaries, so `..` and
// symlinks cannot escape a root), and which files a registered adapter consists of (only
// regular files, so a FIFO or device cannot make registration hang). Internal to the registry;
// its persistence is registry_state.h, registration registry.cc.
#pragma once

#include <string>
#include <vector>

#include "chorus/base/status.h"

namespace chorus::adapters::registry_internal {

// The files of a PEFT adapter directory, and the pickle checkpoint Chorus refuses.
inline constexpr const char* kPeftConfig = "adapter_config.json";
inline constexpr const char* kPeftWeights = "adapter_model.safetensors";
inline constexpr const char* kPeftPickle = "adapter_model.bin";
// The file of a delta directory (delta/delta_file.h's kDeltaFileName).
inline constexpr const char* kDeltaFile = "delta.safetensors";

// The last component of `p` (all of it when it has no '/').
std::string Basename(const std::string& p);
// `p` without its last component ("." when it has no '/', "/" for a top-level entry).
std::string Dirname(const std::string& p);

// realpath(3) as a Result (ENOENT → kNotFound).
Result<std::string> RealPath(const std::string& path);

// True when `resolved` (an absolute, normalized path) is `root` or below it, on a component
// boundary: /a/bc is not inside /a/b.
bool IsInside(const std::string& resolved, const std::string& root);

// The configured adapter roots resolved with realpath, without repeats; each must exist and be
// a directory.
Result<std::vector<std::string>> ResolveRoots(const std::vector<std::string>& adapter_roots);

// The real path of `path` when it lies inside one of `roots` (resolved roots), else
// kPermissionDenied — also for a missing path that lexically leaves the roots, so errors do not
// reveal which paths exist elsewhere. No roots: every path is refused.
Status ResolveInsideRoots(const std::vector<std::string>& roots, const std::string& path,
                          std::string* resolved);

// An adapter path as Register() reads it: the resolved adapter path, its format and files.
struct ResolvedAdapter {
  std::string path;                // real path of the PEFT directory or GGUF file
  std::string format;              // "peft", "gguf" or "delta"
  std::vector<std::string> files;  // real paths of its files, sorted
};
// Resolves a user-given adapter path: relative paths are relative to the roots (the first root
// under which the path exists); the path of adapter_config.json or adapter_model.safetensors
// names its directory; a *.safetensors file or a directory holding delta.safetensors (and no
// adapter_config.json) is a delta; another regular file must start with the GGUF magic; a PEFT
// directory must hold both files (a pickle adapter_model.bin is refused), each a regular file that
// resolves inside a root too. `path` must not be empty.
Result<ResolvedAdapter> ResolveAdapterPath(const std::vector<std::string>& roots,
                                           const std::string& path);

}  // namespace chorus::adapters::registry_internal
