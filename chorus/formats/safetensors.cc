#include "chorus/formats/safetensors.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "chorus/formats/byte_io.h"

namespace chorus::formats {
namespace {

using internal::CheckedMul;
using internal::Printable;
using Json = nlohmann::json;

// The reference implementation's limit; real headers are at most a few MB.
constexpr uint64_t kMaxHeaderBytes = 100u << 20;
constexpr uint64_t kMaxIndexBytes = 64u << 20;
constexpr size_t kMaxDims = 64;  // far above any real tensor; bounds work on hostile headers

struct DTypeInfo {
  const char* name;
  uint64_t bytes;
};
constexpr DTypeInfo kDTypes[] = {
    {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1},
    {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
    {"U32", 4},  {"F32", 4}, {"F64", 8}, {"I64", 8},     {"U64", 8},
};

const DTypeInfo* FindDType(std::string_view name) {
  for (const auto& d : kDTypes) {
    if (name == d.name) return &d;
  }
  return nullptr;
}

}  // namespace

Result<DType> SafetensorsDTypeToDType(std::string_view name) {
  if (name == "F32") return DType::kF32;
  if (name == "F16") return DType::kF16;
  if (name == "BF16") return DType::kBF16;
  if (name == "I8") return DType::kI8;
  if (name == "U8") return DType::kU8;
  if (name == "I32") return DType::kI32;
  return UnimplementedError("safetensors dtype " + Printable(name) +
                            " is not supported (supported: F32, F16, BF16, I8, U8, I32)");
}

Result<std::string> DTypeToSafetensorsDType(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return std::string("F32");
    case DType::kF16:
      return std::string("F16");
    case DType::kBF16:
      return std::string("BF16");
    case DType::kI8:
      return std::string("I8");
    case DType::kU8:
      return std::string("U8");
    case DType::kI32:
      return std::string("I32");
    default:  // block formats have no safetensors dtype
      break;
  }
  return UnimplementedError("dtype " + std::string(DTypeName(dtype)) +
                            " cannot be stored in safetensors");
}

struct SafetensorsFile::Impl {
  std::string path;
  std::shared_ptr<const void> keepalive;
  const uint8_t* data = nullptr;  // start of the data section
  uint64_t data_size = 0;
  std::vector<SafetensorsTensorInfo> tensors;
  std::map<std::string, size_t> index;
  std::map<std::string, std::string> metadata;
};

namespace {

Status ParseEntry(const std::string& file, const std::string& name, const Json& v,
                  uint64_t data_size, SafetensorsTensorInfo* out) {
  const std::string what = "tensor '" + Printable(name) + "'";
  auto bad = [&](const std::string& m) { return DataLossError(file + ": " + what + " " + m); };
  if (!v.is_object()) return bad("is not a JSON object");
  auto dt = v.find("dtype");
  auto sh = v.find("shape");
  auto off = v.find("data_offsets");
  if (dt == v.end() || !dt->is_string()) return bad("has no string 'dtype'");
  if (sh == v.end() || !sh->is_array()) return bad("has no 'shape' array");
  if (off == v.end() || !off->is_array() || off->size() != 2) {
    return bad("has no 'data_offsets' pair");
  }
  out->name = name;
  out->dtype = dt->get<std::string>();
  const DTypeInfo* info = FindDType(out->dtype);
  if (info == nullptr) {
    return Status(StatusCode::kUnimplemented,
                  file + ": " + what + " has unknown dtype '" + Printable(out->dtype) + "'");
  }
  if (sh->size() > kMaxDims) return bad("has " + std::to_string(sh->size()) + " dimensions");
  uint64_t n = 1;
  for (const Json& d : *sh) {
    if (!d.is_number_unsigned()) return bad("has a shape entry that is not a non-negative integer");
    const uint64_t x = d.get<uint64_t>();
    if (x > static_cast<uint64_t>(INT64_MAX) || !CheckedMul(n, x, &n) ||
        n > static_cast<uint64_t>(INT64_MAX)) {
      return bad("has an absurd shape");
    }
    out->shape.push_back(static_cast<int64_t>(x));
  }
  for (const Json& o : *off) {
    if (!o.is_number_unsigned()) return bad("has a data offset that is not a non-negative integer");
  }
  out->begin = (*off)[0].get<uint64_t>();
  out->end = (*off)[1].get<uint64_t>();
  if (out->begin > out->end || out->end > data_size) {
    return bad("data_offsets [" + std::to_string(out->begin) + ", " + std::to_string(out->end) +
               "] are outside the data section (" + std::to_string(data_size) + " bytes)");
  }
  uint64_t bytes = 0;
  if (!CheckedMul(n, info->bytes, &bytes)) return bad("byte size overflows");
  if (bytes != out->end - out->begin) {
    return bad("of dtype " + out->dtype + " and " + std::to_string(n) + " elements needs " +
               std::to_string(bytes) + " bytes, but data_offsets [" + std::to_string(out->begin) +
               ", " + std::to_string(out->end) + "] hold " + std::to_string(out->end - out->begin));
  }
  return OkStatus();
}

Result<std::shared_ptr<const SafetensorsFile>> Parse(std::unique_ptr<SafetensorsFile::Impl> impl,
                                                     const uint8_t* data, size_t size) {
  const std::string& file = impl->path;
  auto bad = [&](const std::string& m) { return DataLossError(file + ": " + m); };
  if (size < 8) {
    return bad("file is " + std::to_string(size) + " bytes, too short for a safetensors header");
  }
  uint64_t n = 0;
  std::memcpy(&n, data, 8);
  if (n > kMaxHeaderBytes) {
    return bad("header length " + std::to_string(n) + " exceeds the limit of " +
               std::to_string(kMaxHeaderBytes) + " bytes");
  }
  if (n > size - 8) {
    return bad("header of " + std::to_string(n) + " bytes extends past end of file (" +
               std::to_string(size) + " bytes)");
  }
  if (n < 2 || data[8] != '{') return bad("header does not start with '{' (not safetensors)");
  const char* text = reinterpret_cast<const char*>(data + 8);
  // Duplicate top-level keys would silently alias (JSON parsers keep one); detect them.
  std::set<std::string> keys;
  std::string duplicate;
  Json::parser_callback_t cb = [&](int depth, Json::parse_event_t event, Json& parsed) {
    if (event == Json::parse_event_t::key && depth == 1 && parsed.is_string()) {
      if (!keys.insert(parsed.get<std::string>()).second && duplicate.empty()) {
        duplicate = parsed.get<std::string>();
      }
    }
    return true;
  };
  Json header = Json::parse(text, text + n, cb, /*allow_exceptions=*/false);
  if (header.is_discarded()) return bad("header is not valid JSON");
  if (!header.is_object()) return bad("header is not a JSON object");
  if (!duplicate.empty()) return bad("duplicate entry '" + Printable(duplicate) + "' in header");

  impl->data = data + 8 + n;
  impl->data_size = size - 8 - n;
  for (const auto& [name, v] : header.items()) {
    if (name == "__metadata__") {
      if (!v.is_object()) return bad("__metadata__ is not a JSON object");
      for (const auto& [k, s] : v.items()) {
        if (!s.is_string()) {
          return bad("__metadata__ value of '" + Printable(k) + "' is not a string");
        }
        impl->metadata.emplace(k, s.get<std::string>());
      }
      continue;
    }
    SafetensorsTensorInfo t;
    CHORUS_RETURN_IF_ERROR(ParseEntry(file, name, v, impl->data_size, &t));
    impl->tensors.push_back(std::move(t));
  }
  std::sort(impl->tensors.begin(), impl->tensors.end(),
            [](const SafetensorsTensorInfo& a, const SafetensorsTensorInfo& b) {
              return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
            });
  // The tensors must tile the data section: no gap, no overlap, nothing after the last one.
  uint64_t pos = 0;
  for (const SafetensorsTensorInfo& t : impl->tensors) {
    if (t.begin != pos) {
      return bad("tensor '" + Printable(t.name) + "' data_offsets [" + std::to_string(t.begin) +
                 ", " + std::to_string(t.end) + "] " +
                 (t.begin < pos ? std::string("overlap the previous tensor")
                                : "leave a gap after offset " + std::to_string(pos)) +
                 " (tensors must tile the data section)");
    }
    pos = t.end;
  }
  if (pos != impl->data_size) {
    return bad("tensors cover " + std::to_string(pos) + " bytes but the data section has " +
               std::to_string(impl->data_size));
  }
  for (size_t i = 0; i < impl->tensors.size(); ++i) impl->index.emplace(impl->tensors[i].name, i);
  return std::shared_ptr<const SafetensorsFile>(std::make_shared<SafetensorsFile>(std::move(impl)));
}

}  // namespace

SafetensorsFile::SafetensorsFile(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SafetensorsFile::~SafetensorsFile() = default;

Result<std::shared_ptr<const SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  CHORUS_ASSIGN_OR_RETURN(std::shared_ptr<const MappedFile> mf, MappedFile::Open(path));
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  const uint8_t* data = mf->data();
  const size_t size = mf->size();
  impl->keepalive = std::move(mf);
  return Parse(std::move(impl), data, size);
}

Result<std::shared_ptr<const SafetensorsFile>> SafetensorsFile::FromBytes(std::string name,
                                                                          std::string bytes) {
  auto owned = std::make_shared<const std::string>(std::move(bytes));
  auto impl = std::make_unique<Impl>();
  impl->path = std::move(name);
  const auto* data = reinterpret_cast<const uint8_t*>(owned->data());
  const size_t size = owned->size();
  impl->keepalive = std::move(owned);
  return Parse(std::move(impl), data, size);
}

const std::string& SafetensorsFile::path() const { return impl_->path; }
const std::vector<SafetensorsTensorInfo>& SafetensorsFile::tensors() const {
  return impl_->tensors;
}
const std::map<std::string, std::string>& SafetensorsFile::metadata() const {
  return impl_->metadata;
}
bool SafetensorsFile::Has(const std::string& name) const { return impl_->index.count(name) > 0; }

Result<Tensor> SafetensorsFile::GetTensor(const std::string& name) const {
  auto it = impl_->index.find(name);
  if (it == impl_->index.end()) {
    return NotFoundError(impl_->path + ": no tensor '" + Printable(name, 200) + "'");
  }
  const SafetensorsTensorInfo& info = impl_->tensors[it->second];
  auto dtype = SafetensorsDTypeToDType(info.dtype);
  if (!dtype.ok()) return dtype.status().WithContext(impl_->path + ": tensor '" + info.name + "'");
  TensorView view;
  view.dtype = *dtype;
  view.shape = info.shape;
  view.data = impl_->data + info.begin;
  // Headers are normally padded so data is 8-aligned; a file that is not still works, via a copy.
  const uintptr_t need = static_cast<uintptr_t>(DTypeBlockBytes(*dtype));
  if (reinterpret_cast<uintptr_t>(view.data) % need != 0) {
    Tensor copy = Tensor::Zeros(view.dtype, view.shape);
    std::memcpy(copy.mutable_data(), view.data, static_cast<size_t>(info.end - info.begin));
    return copy;
  }
  return Tensor(std::move(view), impl_->keepalive);
}

// ---------------------------------------------------------------------------------------------
// SafetensorsModel

namespace {

bool IsDir(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}
bool IsFile(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}
bool EndsWith(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

Result<std::shared_ptr<const SafetensorsModel>> SafetensorsModel::Open(const std::string& path) {
  std::string index_path, single_path;
  if (IsDir(path)) {
    if (IsFile(path + "/model.safetensors.index.json")) {
      index_path = path + "/model.safetensors.index.json";
    } else if (IsFile(path + "/model.safetensors")) {
      single_path = path + "/model.safetensors";
    } else if (IsFile(path + "/adapter_model.safetensors")) {
      single_path = path + "/adapter_model.safetensors";
    } else {
      return NotFoundError(path + ": no model.safetensors.index.json, model.safetensors or " +
                           "adapter_model.safetensors in this directory");
    }
  } else if (EndsWith(path, ".index.json")) {
    index_path = path;
  } else {
    single_path = path;
  }
  auto model = std::make_shared<SafetensorsModel>();
  if (!single_path.empty()) {
    CHORUS_ASSIGN_OR_RETURN(auto f, SafetensorsFile::Open(single_path));
    for (const auto& t : f->tensors()) model->where_.emplace(t.name, 0);
    model->files_.push_back(std::move(f));
    return std::shared_ptr<const SafetensorsModel>(std::move(model));
  }

  CHORUS_ASSIGN_OR_RETURN(std::string text, ReadFileToString(index_path, kMaxIndexBytes));
  auto bad = [&](const std::string& m) { return DataLossError(index_path + ": " + m); };
  Json index = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (index.is_discarded() || !index.is_object()) return bad("not a JSON object");
  auto wm = index.find("weight_map");
  if (wm == index.end() || !wm->is_object()) return bad("no 'weight_map' object");
  const std::string dir =
      index_path.find('/') == std::string::npos ? "." : index_path.substr(0, index_path.rfind('/'));
  std::map<std::string, size_t> shard_ids;
  for (const auto& [name, shard] : wm->items()) {
    if (!shard.is_string())
      return bad("weight_map entry '" + Printable(name) + "' is not a string");
    const std::string s = shard.get<std::string>();
    // Shards are plain names next to the index; anything else could escape the model folder.
    if (s.empty() || s == "." || s == ".." || s.find('/') != std::string::npos ||
        s.find('\\') != std::string::npos || s.find('\0') != std::string::npos) {
      return bad("shard name '" + Printable(s) + "' is not a plain file name");
    }
    auto [it, added] = shard_ids.emplace(s, model->files_.size());
    if (added) {
      auto f = SafetensorsFile::Open(dir + "/" + s);
      if (!f.ok()) return f.status().WithContext(index_path);
      model->files_.push_back(*std::move(f));
    }
    if (!model->files_[it->second]->Has(name)) {
      return bad("tensor '" + Printable(name) + "' is not in its shard " + s);
    }
    model->where_.emplace(name, it->second);
  }
  return std::shared_ptr<const SafetensorsModel>(std::move(model));
}

std::vector<std::string> SafetensorsModel::TensorNames() const {
  std::vector<std::string> names;
  names.reserve(where_.size());
  for (const auto& [n, i] : where_) names.push_back(n);
  return names;
}

bool SafetensorsModel::Has(const std::string& name) const { return where_.count(name) > 0; }

Result<Tensor> SafetensorsModel::GetTensor(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) {
    return NotFoundError("safetensors model: no tensor '" + Printable(name, 200) + "'" +
                         (files_.empty() ? "" : " (in " + files_[0]->path() + "...)"));
  }
  return files_[it->second]->GetTensor(name);
}

// ---------------------------------------------------------------------------------------------
// Writers

namespace {

// The file as pieces: the length-prefixed header (owned by `*header`), then each tensor's bytes
// where they live (a model's mapping or its buffers). Serialize joins them; Write streams them,
// so a model's checkpoint is never assembled in memory.
Result<std::vector<std::string_view>> SafetensorsPieces(
    const std::vector<std::pair<std::string, Tensor>>& tensors,
    const std::map<std::string, std::string>& metadata, std::string* header) {
  nlohmann::ordered_json json = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    json["__metadata__"] = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) json["__metadata__"][k] = v;
  }
  std::set<std::string> seen;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (name.empty() || name == "__metadata__") {
      return InvalidArgumentError("safetensors: invalid tensor name '" + name + "'");
    }
    if (!seen.insert(name).second) {
      return InvalidArgumentError("safetensors: duplicate tensor '" + name + "'");
    }
    auto dt = DTypeToSafetensorsDType(t.dtype());
    if (!dt.ok()) return dt.status().WithContext("safetensors: tensor '" + name + "'");
    const uint64_t bytes = static_cast<uint64_t>(t.view().NumBytes());
    if (bytes > 0 && t.data() == nullptr) {
      return InvalidArgumentError("safetensors: tensor '" + name + "' has no data");
    }
    nlohmann::ordered_json e;
    e["dtype"] = *dt;
    e["shape"] = t.shape();
    e["data_offsets"] = {offset, offset + bytes};
    json[name] = std::move(e);
    offset += bytes;
  }
  std::string text;
  try {
    text = json.dump();
  } catch (const nlohmann::json::exception&) {
    return InvalidArgumentError("safetensors: a tensor name or metadata string is not UTF-8");
  }
  // Pad with spaces so the data section starts 8-byte aligned (as the reference writer does).
  while (text.size() % 8 != 0) text.push_back(' ');
  header->clear();
  internal::ByteWriter w(header);
  w.Write<uint64_t>(text.size());
  w.WriteBytes(text);
  std::vector<std::string_view> pieces = {*header};
  for (const auto& [name, t] : tensors) {
    const auto bytes = static_cast<size_t>(t.view().NumBytes());
    if (bytes > 0) pieces.emplace_back(static_cast<const char*>(t.data()), bytes);
  }
  return pieces;
}

}  // namespace

Result<std::string> SerializeSafetensors(const std::vector<std::pair<std::string, Tensor>>& tensors,
                                         const std::map<std::string, std::string>& metadata) {
  std::string header;
  CHORUS_ASSIGN_OR_RETURN(auto pieces, SafetensorsPieces(tensors, metadata, &header));
  size_t total = 0;
  for (std::string_view p : pieces) total += p.size();
  std::string out;
  out.reserve(total);
  for (std::string_view p : pieces) out.append(p);
  return out;
}

Status WriteSafetensors(const std::string& path,
                        const std::vector<std::pair<std::string, Tensor>>& tensors,
                        const std::map<std::string, std::string>& metadata) {
  std::string header;
  CHORUS_ASSIGN_OR_RETURN(auto pieces, SafetensorsPieces(tensors, metadata, &header));
  return WriteFileAtomically(path, pieces);
}

Result<std::vector<std::string>> WriteSafetensorsSharded(
    const std::string& dir, const std::vector<std::pair<std::string, Tensor>>& tensors,
    uint64_t max_shard_bytes, const std::map<std::string, std::string>& metadata) {
  // Greedy packing in the given order.
  std::vector<std::vector<std::pair<std::string, Tensor>>> shards(1);
  uint64_t in_shard = 0, total = 0;
  for (const auto& p : tensors) {
    const uint64_t b = static_cast<uint64_t>(p.second.view().NumBytes());
    if (!shards.back().empty() && in_shard + b > max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(p);
    in_shard += b;
    total += b;
  }
  nlohmann::ordered_json index;
  index["metadata"] = {{"total_size", total}};
  index["weight_map"] = nlohmann::ordered_json::object();
  std::vector<std::string> names;
  for (size_t i = 0; i < shards.size(); ++i) {
    char name[64];
    std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
    CHORUS_RETURN_IF_ERROR(WriteSafetensors(dir + "/" + name, shards[i], metadata));
    for (const auto& p : shards[i]) index["weight_map"][p.first] = name;
    names.emplace_back(name);
  }
  std::string text;
  try {
    text = index.dump(2) + "\n";
  } catch (const nlohmann::json::exception&) {
    return InvalidArgumentError("safetensors: a tensor name is not UTF-8");
  }
  CHORUS_RETURN_IF_ERROR(WriteFileAtomically(dir + "/model.safetensors.index.json", text));
  return names;
}

}  // namespace chorus::formats
