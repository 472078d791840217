// The adapter registry's persistence (registry.h, "Persistence"): the JSON state file (its
// serialization, strict parsing and validation, atomic rewrite), the lock file that keeps a
// second process out, and the removal of temp files a killed writer left. Internal to the
// registry; its path policy is registry_paths.h, registration registry.cc.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "chorus/adapters/registry.h"
#include "chorus/base/status.h"

namespace chorus::adapters::registry_internal {

// What the state file holds.
struct RegistryState {
  std::map<std::string, AdapterInfo> entries;  // by name
  uint64_t next_version = 1;
};

// The state file's text.
std::string SerializeState(const std::map<std::string, AdapterInfo>& entries,
                           uint64_t next_version);
// Rewrites the state file atomically (temp file in the same directory, fsync, rename, directory
// fsync): a process killed at any moment leaves the old or the new state.
Status WriteState(const std::string& state_path, const std::map<std::string, AdapterInfo>& entries,
                  uint64_t next_version);
// Reads and validates the state file; nullopt when it does not exist. A file that cannot be
// parsed or fails validation is kDataLoss naming the file (kUnimplemented for a newer schema).
Result<std::optional<RegistryState>> ReadState(const std::string& state_path);

// Opens `<state>.lock` and takes an exclusive flock(2) on it; the caller closes the returned
// descriptor to release it (the kernel does when the process dies). kFailedPrecondition when
// another process holds it.
Result<int> LockState(const std::string& state_path);
// Removes the `<state>.tmp.<digits>` files of a writer killed before its rename. Call with the
// lock held (then nobody else can be writing one).
void RemoveLeftoverTempFiles(const std::string& state_path);

}  // namespace chorus::adapters::registry_internal
