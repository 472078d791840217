// Uploaded training files (the storage behind OpenAI's /v1/files, purpose "fine-tune";
// docs/finetuning.md, "Jobs"): each file is kept as <dir>/<id>.jsonl with its metadata in
// <dir>/files.json, both written atomically, so the files survive a restart. Ids are
// "file-" + 24 hex digits from a counter and the creation time, never reused in one directory.
//
// Thread-safety: all methods are thread-safe (one mutex; a directory must have one FileStore).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "chorus/base/status.h"

namespace chorus::train {

struct StoredFile {
  std::string id;        // "file-…"
  std::string filename;  // as uploaded (informational)
  std::string purpose;   // "fine-tune"
  int64_t bytes = 0;
  int64_t created_at = 0;  // unix seconds
  std::string path;        // where the content is
};

class FileStore {
 public:
  // Opens (creating it if needed) `dir`, reading files.json when present.
  static Result<std::unique_ptr<FileStore>> Open(const std::string& dir,
                                                 int64_t max_file_bytes = int64_t{256} << 20);

  // Stores `content`. kInvalidArgument for a purpose other than "fine-tune", an empty file or a
  // filename with a path separator; kResourceExhausted over max_file_bytes.
  Result<StoredFile> Add(const std::string& filename, const std::string& purpose,
                         std::string_view content);
  std::optional<StoredFile> Get(const std::string& id) const;
  std::vector<StoredFile> List() const;  // oldest first
  Status Delete(const std::string& id);  // kNotFound for an unknown id

 private:
  FileStore() = default;
  Status SaveIndex() const;  // mu_ held
  std::string dir_;
  int64_t max_file_bytes_ = 0;
  uint64_t counter_ = 0;
  mutable std::mutex mu_;
  std::vector<StoredFile> files_;
};

}  // namespace chorus::train
