// AdapterRegistry: the persistent name → adapter table of a server (docs/adapters.md, vLLM's
// /v1/load_lora_adapter and /v1/unload_lora_adapter, `chorus serve --lora NAME=PATH`,
// `--lora-dir DIR`). A request's OpenAI `model` field names a registered adapter; the server
// looks it up here and hands its VariantRef (AdapterInfo::ref()) to the engine, whose loader
// threads read the files through the host cache (adapters/adapter_cache.h).
//
// What Register() accepts:
//   * name: 1..128 characters of [A-Za-z0-9._:/-], not the base model's served name.
//   * path: a PEFT directory (adapter_config.json + adapter_model.safetensors, or the path of
//     either file) or a GGUF LoRA file. Relative paths are relative to the adapter roots (the
//     first root under which the path exists); apps/ makes command-line paths absolute first.
//     The path and every adapter file are resolved with realpath(3) and must lie inside one of
//     the (realpath-resolved) adapter roots, compared on path-component boundaries, so `..`
//     and symlinks cannot escape a root (kPermissionDenied). Only regular files are read
//     (a FIFO or device cannot make registration hang).
//   * content: read and validated against the base ModelConfig exactly as serving will load it
//     (chorus/adapters/lora/lora_files.h: shapes, rank ≤ max_lora_rank, dtypes, finite values).
//
// Identity: content_hash is FNV-1a 64 over the adapter's files (for each file, sorted by name:
// the file name, a NUL byte, its size as 8 little-endian bytes, then its bytes). version is a
// registry-wide counter that only grows (persisted; never reused, also after Unregister), so
// a replaced adapter always gets a new version even when its bytes are identical, and
// id() = VariantId{content_hash, version} never names the state of a predecessor.
//
// Persistence: the whole table is one JSON file (`state_path`) rewritten atomically on every
// change (temp file in the same directory, fsync, rename, directory fsync), so a process killed
// at any moment leaves the old or the new state. Every error leaves the registry unchanged in
// memory and on disk. Leftover temp files (`<state>.tmp.<pid>`) of a killed process are ignored
// and removed by Open(), so repeated kills never accumulate files. A state file that exists but
// cannot be parsed or fails validation is a kDataLoss error naming the file and the problem —
// never silently reset; with RegistryOptions::recover_corrupt_state it is quarantined instead
// (moved aside, logged) and the registry starts empty. tests/crash/ kills writers at random
// moments and at every step of the write (docs/adapters.md, "Durability"). `<state>.lock` holds an
// exclusive flock(2) for the registry's lifetime, so two processes cannot overwrite each other's
// state (the second Open() fails with kFailedPrecondition); the kernel drops it when a process
// dies.
//
// Restart policy (Open): entries are re-checked eagerly but cheaply — the path is resolved
// again, must still be inside a configured root, and each file's (size, mtime) must match what
// was recorded; only when they differ are the bytes hashed again (equal hash → accepted). An
// entry that fails (files vanished, outside the roots now, content changed, name now equal to
// the base's) is KEPT but marked unavailable (`available = false`, `problem` says why) and a
// warning is logged: an admin may restore the files (Revalidate() re-checks) or Unregister() it.
// Full validation against the base happens again when the host cache loads the files (and
// checks their fingerprints first).
//
// Thread-safety: all methods may be called from any thread (HTTP threads and the engine).
// Readers (Lookup, List, size) take a short mutex and never wait for disk I/O; mutators
// (Register, Unregister, RegisterDirectory, Revalidate) are serialized among themselves and
// swap the new table in only after it is persisted.
//
// The implementation is split by concern: registry_paths.h (adapter roots, realpath policy, an
// adapter's files), registry_state.h (the state file, its lock, leftover temp files) and
// registry.cc (registration and lookups).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "chorus/adapters/fingerprint.h"
#include "chorus/adapters/lora/lora_adapter.h"
#include "chorus/adapters/variant.h"
#include "chorus/base/mutex.h"
#include "chorus/base/status.h"
#include "chorus/model/config.h"

namespace chorus::adapters {

struct RegistryOptions {
  // Directories adapters may be registered from (resolved with realpath at Open; each must
  // exist and be a directory). Empty = every Register() is refused with kPermissionDenied.
  std::vector<std::string> adapter_roots;
  // Largest LoRA rank accepted (default 256, LoraLimits' default). Must be ≥ 1.
  int64_t max_lora_rank = 256;
  // The base model every adapter must fit (validated at Open).
  model::ModelConfig base;
  // The base's served model name; an adapter may not take it (default empty = no such check).
  std::string base_model_name;
  // delta::BaseWeightsHash() of the served base: a delta made against other weights is refused
  // naming both hashes (empty: not checked, e.g. tests that only register LoRA adapters).
  std::string base_weights_hash;
  // A state file that exists but is corrupt (truncated, not JSON, wrong format, a bad field):
  // false (default) — Open() refuses with kDataLoss naming the file and the problem and leaves
  // the file untouched, as a database refuses to start on a damaged file; true — the file is
  // moved aside to `<state>.corrupt-<UTC time>` (kept, never deleted), an ERROR log line names
  // the problem and that path, and the registry opens empty. Never silently emptied either way.
  bool recover_corrupt_state = false;
};

struct AdapterInfo {
  std::string name;
  std::string path;           // resolved real path of the PEFT directory or GGUF file
  std::string kind = "lora";  // "lora" or "delta" (a compressed full fine-tune, docs/deltas.md)
  std::string format;         // "peft", "gguf" or "delta"
  int64_t rank = 0;           // largest rank of any module (0 for a delta)
  // Targeted linears, in model order: "q_proj", "k_proj", ... (Hugging Face names).
  std::vector<std::string> target_modules;
  float alpha = 0;  // the most common lora_alpha of the modules (ties: the first in model order)
  float scale = 0;  // the most common scale s = alpha/r (rsLoRA alpha/√r) of the modules
  bool use_rslora = false;
  std::string base_model;     // informational, from the adapter file (may be empty)
  uint64_t content_hash = 0;  // FNV-1a 64 over the files (see the file comment)
  uint64_t version = 0;       // registry-wide, strictly increasing with every registration
  int64_t bytes = 0;          // total size of the adapter's files
  int64_t created = 0;        // unix time (seconds) of this registration
  // The tenant that registered it through the API (server/tenants.h); empty = shared (command
  // line, --lora-dir, or a server without tenants). Persisted.
  std::string owner;
  std::vector<AdapterFile> files;  // sorted by path

  // Runtime state, not persisted: false when the last check (Open, Revalidate, Load) found the
  // adapter unusable; `problem` says why.
  bool available = true;
  std::string problem;

  // This registration's VariantId (content_hash, version): the key of every tier's copies;
  // differs from every earlier registration of the same name.
  VariantId id() const { return {content_hash, version}; }
  // What a request for this adapter carries (GenerationRequest::variant).
  VariantRef ref() const { return {name, id(), kind, path, files}; }
};

// Outcome of one entry of RegisterDirectory().
struct DirectoryEntryResult {
  std::string name;                 // directory name or file stem
  std::string path;                 // the entry's path under the scanned directory
  Status status;                    // OK when registered
  std::optional<AdapterInfo> info;  // set when registered
};

class AdapterRegistry {
 public:
  // Opens (or creates, writing an empty state) the registry at `state_path`, whose directory
  // must exist. Errors: kInvalidArgument (bad options, a root that is not a directory),
  // kNotFound (a missing root or state directory), kDataLoss (corrupt state file, unless
  // options.recover_corrupt_state),
  // kFailedPrecondition (state locked by another process), I/O errors.
  static Result<std::unique_ptr<AdapterRegistry>> Open(const std::string& state_path,
                                                       RegistryOptions options);
  ~AdapterRegistry();
  AdapterRegistry(const AdapterRegistry&) = delete;
  AdapterRegistry& operator=(const AdapterRegistry&) = delete;

  // Registers `path` as `name` (see the file comment for what is accepted) and persists.
  // Errors: kInvalidArgument (bad name, bad or mismatching adapter), kAlreadyExists (name taken
  // and !replace — HTTP 409), kPermissionDenied (outside the roots), kNotFound (no such path),
  // kUnimplemented (a valid adapter Chorus cannot serve), kDataLoss (truncated file), kUnavailable
  // (files changed while being read), I/O errors from persisting. replace=true also registers
  // a new name. `owner` (a tenant, "" = shared) is recorded; an entry is only replaced by its
  // own owner (another owner's name is kAlreadyExists, with no detail about the entry).
  Result<AdapterInfo> Register(const std::string& name, const std::string& path,
                               bool replace = false, const std::string& owner = "");
  // Removes `name` and persists. kNotFound when absent, or when `owner` is given and the entry
  // has another owner (a tenant never learns that another tenant's adapter exists).
  Status Unregister(const std::string& name, const std::optional<std::string>& owner = {});
  // Registers every adapter directly under `dir` (which must be inside a root): each
  // subdirectory holding adapter_config.json, named after the subdirectory, and each *.gguf
  // file whose general.type is "adapter", named after its stem. Hidden entries and other GGUF
  // files are skipped. Entries are processed in name order; one entry's error does not stop the
  // others. The outer error is for `dir` itself.
  Result<std::vector<DirectoryEntryResult>> RegisterDirectory(const std::string& dir,
                                                              bool replace = false);

  std::optional<AdapterInfo> Lookup(const std::string& name) const;
  std::vector<AdapterInfo> List() const;  // sorted by name
  size_t size() const;
  // The next version Register() will assign (all registered versions are smaller).
  uint64_t next_version() const;

  // Re-checks every entry as Open() does and updates `available` / `problem`. Returns the
  // entries found unavailable, with the reason. Nothing is persisted.
  std::vector<std::pair<std::string, Status>> Revalidate();

  const std::string& state_path() const { return state_path_; }
  const RegistryOptions& options() const { return options_; }

 private:
  AdapterRegistry() = default;
  Status CheckEntry(const AdapterInfo& info) const;
  // Reads and validates a LoRA adapter as serving loads it; fills rank, targets, alpha, scale.
  Status ValidateLora(const std::string& name, const std::string& path, AdapterInfo* info) const;

  std::string state_path_;
  RegistryOptions options_;         // immutable after Open
  std::vector<std::string> roots_;  // resolved real paths of options_.adapter_roots
  int lock_fd_ = -1;

  // Serializes mutators (held across reading, validating and persisting). Acquired before mu_.
  Mutex write_mu_ ACQUIRED_BEFORE(mu_);
  mutable Mutex mu_;
  // Written with write_mu_ and mu_ held; read with mu_ held, or by a writer (holding write_mu_)
  // through WriterEntries() / WriterNextVersion(): no one else can change them meanwhile.
  std::map<std::string, AdapterInfo> entries_ GUARDED_BY(mu_);
  uint64_t next_version_ GUARDED_BY(mu_) = 1;
  // The analysis cannot express "guarded by either lock"; these are the one exception.
  const std::map<std::string, AdapterInfo>& WriterEntries() const
      REQUIRES(write_mu_) NO_THREAD_SAFETY_ANALYSIS {
    return entries_;
  }
  uint64_t WriterNextVersion() const REQUIRES(write_mu_) NO_THREAD_SAFETY_ANALYSIS {
    return next_version_;
  }
};

// True for a valid adapter name: 1..128 characters of [A-Za-z0-9._:/-].
bool IsValidAdapterName(std::string_view name);

}  // namespace chorus::adapters
