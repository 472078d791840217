// Uploaded training files (the storage behind OpenAI's /v1/files, purpose "fine-tune";
// docs/finetuning.md, "Jobs"): each file is kept as <dir>/<id>.jsonl with its metadata in
// <dir>/files.json, both written atomically, so the files survive a restart. Ids are
// "file-" + 24 hex digits from a counter and the creation time, never reused in one directory.
//
// Durability (docs/finetuning.md, "Durability"): Add writes the content, then the index; Delete
// writes the index, then removes the content; so a process killed at any moment leaves the
// index listing exactly the files before or after the operation, each complete. Open() removes
// what a killed writer left: temp files (`*.tmp.<pid>`) and content files the index does not
// list. A corrupt index (not JSON, a bad field, a listed file missing or of the wrong size) is
// kDataLoss naming the problem, the directory left as it is; with recover_corrupt_state the
// index is moved aside to `files.json.corrupt-<UTC time>` and rebuilt from the content files
// present (their ids kept, filenames lost), with an ERROR log line naming both.
//
// Thread-safety: all methods are thread-safe (one mutex). One process per directory: `<dir>/.lock`
// holds an exclusive flock(2) (a second Open() fails with kFailedPrecondition).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "chorus/base/durable_file.h"
#include "chorus/base/status.h"

namespace chorus::train {

struct StoredFile {
  std::string id;        // "file-…"
  std::string filename;  // as uploaded (informational)
  std::string purpose;   // "fine-tune"
  int64_t bytes = 0;
  int64_t created_at = 0;  // unix seconds
  std::string path;        // where the content is
  std::string owner;       // the tenant that uploaded it; empty = none (no tenants)
};

// True for a name a record may be owned by: a tenant name, 1..64 characters of [A-Za-z0-9._-]
// (server/tenants.h).
bool IsValidOwnerName(std::string_view name);

class FileStore {
 public:
  // Opens (creating it if needed) `dir`, reading files.json when present.
  static Result<std::unique_ptr<FileStore>> Open(const std::string& dir,
                                                 int64_t max_file_bytes = int64_t{256} << 20,
                                                 bool recover_corrupt_state = false);

  // Stores `content`, owned by `owner` ("" = none). kInvalidArgument for a purpose other than
  // "fine-tune", an empty file, a filename with a path separator or an owner that is not a
  // tenant name; kResourceExhausted over max_file_bytes.
  Result<StoredFile> Add(const std::string& filename, const std::string& purpose,
                         std::string_view content, const std::string& owner = "");
  std::optional<StoredFile> Get(const std::string& id) const;
  std::vector<StoredFile> List() const;  // oldest first
  Status Delete(const std::string& id);  // kNotFound for an unknown id

 private:
  FileStore() = default;
  Status SaveIndex() const;  // mu_ held
  // Reads files.json (absent: empty). kDataLoss for a corrupt index.
  Status LoadIndex();
  // Rebuilds files_ from the content files present (recovery of a corrupt index); writes
  // nothing. kDataLoss for an owner file that is not a tenant name.
  Status RebuildIndex();
  FileLock lock_;
  std::string dir_;
  int64_t max_file_bytes_ = 0;
  uint64_t counter_ = 0;
  mutable std::mutex mu_;
  std::vector<StoredFile> files_;
};

}  // namespace chorus::train
