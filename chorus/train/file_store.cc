#include "chorus/train/file_store.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "chorus/base/logging.h"
#include "chorus/base/mapped_file.h"
#include "chorus/tokenizer/utf8.h"

namespace chorus::train {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

int64_t Now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

constexpr const char* kIndex = "files.json";

// "file-" + 24 lowercase hex digits (8 of counter, 16 of creation time).
bool IsFileId(const std::string& id) {
  if (id.size() != 29 || id.compare(0, 5, "file-") != 0) return false;
  for (size_t i = 5; i < id.size(); ++i) {
    const char c = id[i];
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

// Where an owned file's owner is kept beside its content (read only to rebuild the index).
std::string OwnerPath(const std::string& dir, const std::string& id) {
  return (fs::path(dir) / (id + ".owner")).string();
}

}  // namespace

bool IsValidOwnerName(std::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == '-';
  });
}

Result<std::unique_ptr<FileStore>> FileStore::Open(const std::string& dir, int64_t max_file_bytes,
                                                   bool recover_corrupt_state) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return InternalError("cannot create " + dir + ": " + ec.message());
  std::unique_ptr<FileStore> s(new FileStore());
  s->dir_ = dir;
  s->max_file_bytes_ = max_file_bytes;
  CHORUS_ASSIGN_OR_RETURN(s->lock_, FileLock::Acquire(dir + "/.lock", "the file store " + dir));
  // What a killed writer left: temp files (never read), then content files the index does not
  // list (written by an Add whose index write did not happen, or left by a Delete).
  RemoveAtomicWriteTempFiles(dir);
  Status loaded = s->LoadIndex();
  if (!loaded.ok() && loaded.code() == StatusCode::kDataLoss && recover_corrupt_state) {
    const std::string index = (fs::path(dir) / kIndex).string();
    // The content files are read before the index is moved aside: a recovery that cannot
    // proceed (an unreadable owner file) leaves the directory as it was.
    s->files_.clear();
    CHORUS_RETURN_IF_ERROR(s->RebuildIndex());
    std::string moved = "(no index file)";
    if (fs::exists(index, ec)) {
      CHORUS_ASSIGN_OR_RETURN(moved, QuarantineFile(index));
    }
    CHORUS_RETURN_IF_ERROR(s->SaveIndex());
    CHORUS_LOG(ERROR) << "file store " << dir << ": corrupt index moved aside to " << moved
                      << "; rebuilt from the " << s->files_.size() << " content files present ("
                      << loaded.message() << ")";
    return s;
  }
  CHORUS_RETURN_IF_ERROR(loaded);
  std::set<std::string> listed;
  for (const StoredFile& f : s->files_) listed.insert(f.id);
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    for (const char* ext : {".jsonl", ".owner"}) {
      const size_t len = std::char_traits<char>::length(ext);
      if (n.size() > len && n.ends_with(ext) && IsFileId(n.substr(0, n.size() - len)) &&
          listed.count(n.substr(0, n.size() - len)) == 0) {
        fs::remove(e.path(), ec);
        CHORUS_LOG(INFO) << "file store " << dir << ": removed " << n
                         << ", which the index does not list (an interrupted add or delete)";
      }
    }
  }
  // An owned file whose owner file is missing or differs (only a hand-edited directory): written
  // again, so that a rebuilt index could not lose the owner.
  for (const StoredFile& f : s->files_) {
    if (f.owner.empty()) continue;
    auto text = ReadFileToString(OwnerPath(dir, f.id));
    if (text.ok() && *text == f.owner) continue;
    CHORUS_RETURN_IF_ERROR(WriteFileAtomically(OwnerPath(dir, f.id), f.owner));
    CHORUS_LOG(WARNING) << "file store " << dir << ": rewrote " << f.id
                        << ".owner, which was missing or did not match the index";
  }
  return s;
}

Status FileStore::LoadIndex() {
  const std::string index = (fs::path(dir_) / kIndex).string();
  std::error_code ec;
  if (!fs::exists(index, ec)) return OkStatus();
  auto text = ReadFileToString(index);
  if (!text.ok()) {
    if (text.status().code() == StatusCode::kNotFound) return text.status();
    return DataLossError(index + ": unreadable file index: " + text.status().message());
  }
  auto bad = [&](const std::string& what) {
    return DataLossError(index + ": corrupt file index: " + what);
  };
  const json j = json::parse(*text, nullptr, false);
  if (j.is_discarded()) return bad("not valid JSON");
  if (!j.is_object()) return bad("not an object");
  if (!j.contains("counter") || !j["counter"].is_number_unsigned())
    return bad("'counter' is missing or not a non-negative integer");
  if (!j.contains("files") || !j["files"].is_array())
    return bad("'files' is missing or not an array");
  counter_ = j["counter"].get<uint64_t>();
  std::set<std::string> ids;
  for (const json& f : j["files"]) {
    if (!f.is_object() || !f.contains("id") || !f["id"].is_string() ||
        !IsFileId(f["id"].get<std::string>())) {
      return bad("an entry has no valid 'id': " + f.dump().substr(0, 80));
    }
    StoredFile sf;
    sf.id = f["id"];
    const std::string where = "entry " + sf.id + ": ";
    for (const char* key : {"filename", "purpose"}) {
      if (!f.contains(key) || !f[key].is_string())
        return bad(where + "'" + key + "' is missing or not a string");
    }
    for (const char* key : {"bytes", "created_at"}) {
      if (!f.contains(key) || !f[key].is_number_integer() || f[key].get<int64_t>() < 0)
        return bad(where + "'" + key + "' is missing or not a non-negative integer");
    }
    if (!ids.insert(sf.id).second) return bad(where + "listed twice");
    sf.filename = f["filename"];
    sf.purpose = f["purpose"];
    sf.bytes = f["bytes"].get<int64_t>();
    sf.created_at = f["created_at"].get<int64_t>();
    if (f.contains("owner")) {  // absent: no owner (also every index written before owners)
      if (!f["owner"].is_string() || !IsValidOwnerName(f["owner"].get<std::string>())) {
        return bad(where + "'owner' is not a tenant name (1-64 characters of [A-Za-z0-9._-])");
      }
      sf.owner = f["owner"];
    }
    sf.path = (fs::path(dir_) / (sf.id + ".jsonl")).string();
    const auto size = fs::file_size(sf.path, ec);
    if (ec) return bad(where + "its content " + sf.path + " is missing");
    if (static_cast<int64_t>(size) != sf.bytes) {
      return bad(where + "its content " + sf.path + " has " + std::to_string(size) +
                 " bytes, the index says " + std::to_string(sf.bytes));
    }
    files_.push_back(std::move(sf));
  }
  return OkStatus();
}

Status FileStore::RebuildIndex() {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    const std::string n = e.path().filename().string();
    if (n.size() <= 6 || !n.ends_with(".jsonl") || !IsFileId(n.substr(0, n.size() - 6))) continue;
    StoredFile sf;
    sf.id = n.substr(0, n.size() - 6);
    sf.filename = "recovered-" + n;
    sf.purpose = "fine-tune";
    sf.bytes = static_cast<int64_t>(fs::file_size(e.path(), ec));
    sf.created_at = static_cast<int64_t>(std::stoull(sf.id.substr(13), nullptr, 16));
    sf.path = e.path().string();
    // The owner file is written before the content, so every owned content file has one.
    const std::string owner_path = OwnerPath(dir_, sf.id);
    std::error_code owner_ec;
    if (fs::exists(owner_path, owner_ec)) {
      auto owner = ReadFileToString(owner_path);
      if (!owner.ok() || !IsValidOwnerName(*owner)) {
        return DataLossError(
            owner_path + ": cannot recover the owner of " + sf.id +
            (owner.ok() ? std::string(": not a tenant name") : ": " + owner.status().message()) +
            " (remove the file's content or fix its owner file)");
      }
      sf.owner = *owner;
    }
    counter_ = std::max<uint64_t>(counter_, std::stoull(sf.id.substr(5, 8), nullptr, 16));
    files_.push_back(std::move(sf));
  }
  if (ec) return ErrnoError(ec.value(), "cannot list " + dir_);
  std::sort(files_.begin(), files_.end(), [](const StoredFile& a, const StoredFile& b) {
    return a.created_at != b.created_at ? a.created_at < b.created_at : a.id < b.id;
  });
  return OkStatus();
}

Status FileStore::SaveIndex() const {
  json files = json::array();
  for (const StoredFile& f : files_) {
    json e = {{"id", f.id},
              {"filename", f.filename},
              {"purpose", f.purpose},
              {"bytes", f.bytes},
              {"created_at", f.created_at}};
    if (!f.owner.empty()) e["owner"] = f.owner;  // absent: no owner, as in older indexes
    files.push_back(std::move(e));
  }
  const json j = {{"counter", counter_}, {"files", files}};
  return WriteFileAtomically((fs::path(dir_) / "files.json").string(), j.dump(1));
}

Result<StoredFile> FileStore::Add(const std::string& filename, const std::string& purpose,
                                  std::string_view content, const std::string& owner) {
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
  // It is listed in JSON (the index, GET /v1/files): text only.
  if (tokenizer::internal::SanitizeUtf8(filename) != filename ||
      std::any_of(filename.begin(), filename.end(),
                  [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; })) {
    return InvalidArgumentError("filename must be UTF-8 text without control characters");
  }
  if (!owner.empty() && !IsValidOwnerName(owner)) {
    return InvalidArgumentError("owner must be a tenant name (1-64 characters of [A-Za-z0-9._-])");
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
  f.owner = owner;
  std::error_code ec;
  // The owner before the content: a content file present always has its owner beside it (a
  // rebuilt index keeps it); a killed add leaves files the index does not list, removed at Open.
  if (!owner.empty()) CHORUS_RETURN_IF_ERROR(WriteFileAtomically(OwnerPath(dir_, f.id), owner));
  if (Status s = WriteFileAtomically(f.path, content); !s.ok()) {
    fs::remove(OwnerPath(dir_, f.id), ec);
    return s;
  }
  files_.push_back(f);
  if (Status s = SaveIndex(); !s.ok()) {
    files_.pop_back();
    fs::remove(f.path, ec);
    fs::remove(OwnerPath(dir_, f.id), ec);
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
    // The index first: a process killed before the content is removed leaves a file the index
    // does not list, which the next Open() removes.
    if (Status s = SaveIndex(); !s.ok()) {
      files_.insert(files_.begin() + static_cast<int64_t>(i), f);
      return s;
    }
    std::error_code ec;
    fs::remove(f.path, ec);
    fs::remove(OwnerPath(dir_, f.id), ec);  // after the content: a rebuild never loses an owner
    return OkStatus();
  }
  return NotFoundError("no file " + id);
}

}  // namespace chorus::train
