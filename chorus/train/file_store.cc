#include "chorus/train/file_store.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "chorus/base/mapped_file.h"

namespace chorus::train {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

int64_t Now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

Result<std::unique_ptr<FileStore>> FileStore::Open(const std::string& dir, int64_t max_file_bytes) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return InternalError("cannot create " + dir + ": " + ec.message());
  std::unique_ptr<FileStore> s(new FileStore());
  s->dir_ = dir;
  s->max_file_bytes_ = max_file_bytes;
  const std::string index = (fs::path(dir) / "files.json").string();
  if (fs::exists(index)) {
    CHORUS_ASSIGN_OR_RETURN(std::string text, ReadFileToString(index));
    const json j = json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("files") || !j["files"].is_array()) {
      return InvalidArgumentError(index + ": not a file index");
    }
    s->counter_ = j.value("counter", uint64_t{0});
    for (const json& f : j["files"]) {
      if (!f.is_object() || !f.contains("id") || !f["id"].is_string()) {
        return InvalidArgumentError(index + ": bad entry " + f.dump().substr(0, 80));
      }
      StoredFile sf;
      sf.id = f["id"];
      sf.filename = f.value("filename", "");
      sf.purpose = f.value("purpose", "");
      sf.bytes = f.value("bytes", int64_t{0});
      sf.created_at = f.value("created_at", int64_t{0});
      sf.path = (fs::path(dir) / (sf.id + ".jsonl")).string();
      if (!fs::exists(sf.path)) {
        return InvalidArgumentError(index + ": the content of " + sf.id + " is missing (" +
                                    sf.path + ")");
      }
      s->files_.push_back(std::move(sf));
    }
  }
  return s;
}

Status FileStore::SaveIndex() const {
  json files = json::array();
  for (const StoredFile& f : files_) {
    files.push_back({{"id", f.id},
                     {"filename", f.filename},
                     {"purpose", f.purpose},
                     {"bytes", f.bytes},
                     {"created_at", f.created_at}});
  }
  const json j = {{"counter", counter_}, {"files", files}};
  return WriteFileAtomically((fs::path(dir_) / "files.json").string(), j.dump(1));
}

Result<StoredFile> FileStore::Add(const std::string& filename, const std::string& purpose,
                                  std::string_view content) {
  if (purpose != "fine-tune") {
    return InvalidArgumentError("purpose must be \"fine-tune\", got \"" + purpose.substr(0, 64) +
                                "\"");
  }
  if (content.empty()) return InvalidArgumentError("the file is empty");
  if (static_cast<int64_t>(content.size()) > max_file_bytes_) {
    return ResourceExhaustedError("the file is " + std::to_string(content.size()) +
                                  " bytes, over the limit of " + std::to_string(max_file_bytes_));
  }
  if (filename.find('/') != std::string::npos || filename.find('\\') != std::string::npos) {
    return InvalidArgumentError("filename must not contain a path separator");
  }
  std::lock_guard<std::mutex> l(mu_);
  StoredFile f;
  f.created_at = Now();
  char id[40];
  std::snprintf(id, sizeof id, "file-%08llx%016llx", static_cast<unsigned long long>(++counter_),
                static_cast<unsigned long long>(f.created_at));
  f.id = id;
  f.filename = filename;
  f.purpose = purpose;
  f.bytes = static_cast<int64_t>(content.size());
  f.path = (fs::path(dir_) / (f.id + ".jsonl")).string();
  CHORUS_RETURN_IF_ERROR(WriteFileAtomically(f.path, content));
  files_.push_back(f);
  if (Status s = SaveIndex(); !s.ok()) {
    files_.pop_back();
    std::error_code ec;
    fs::remove(f.path, ec);
    return s;
  }
  return f;
}

std::optional<StoredFile> FileStore::Get(const std::string& id) const {
  std::lock_guard<std::mutex> l(mu_);
  for (const StoredFile& f : files_) {
    if (f.id == id) return f;
  }
  return std::nullopt;
}

std::vector<StoredFile> FileStore::List() const {
  std::lock_guard<std::mutex> l(mu_);
  return files_;
}

Status FileStore::Delete(const std::string& id) {
  std::lock_guard<std::mutex> l(mu_);
  for (size_t i = 0; i < files_.size(); ++i) {
    if (files_[i].id != id) continue;
    const StoredFile f = files_[i];
    files_.erase(files_.begin() + static_cast<int64_t>(i));
    CHORUS_RETURN_IF_ERROR(SaveIndex());
    std::error_code ec;
    fs::remove(f.path, ec);
    return OkStatus();
  }
  return NotFoundError("no file " + id);
}

}  // namespace chorus::train
