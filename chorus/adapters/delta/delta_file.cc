#include "chorus/adapters/delta/delta_file.h"

#include <sys/stat.h>
#include <zstd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>

#include "chorus/base/durable_file.h"
#include "chorus/base/mapped_file.h"
#include "chorus/formats/safetensors.h"

namespace chorus::delta {
namespace {

constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ull;
constexpr uint64_t kFnvPrime = 0x100000001b3ull;

uint64_t Fnv(const void* data, size_t n, uint64_t h = kFnvOffset) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * kFnvPrime;
  return h;
}

std::string Hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

bool IsDirectory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string FilePathFor(const std::string& path) {
  return EndsWith(path, ".safetensors") ? path : path + "/" + kDeltaFileName;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

}  // namespace

const char* MethodName(Method m) {
  switch (m) {
    case Method::kRtn:
      return "rtn";
    case Method::kDeltaZip:
      return "deltazip";
    case Method::kBitDelta:
      return "bitdelta";
  }
  return "?";
}

Result<Method> ParseMethod(const std::string& name) {
  if (name == "rtn") return Method::kRtn;
  if (name == "deltazip") return Method::kDeltaZip;
  if (name == "bitdelta") return Method::kBitDelta;
  return InvalidArgumentError("unknown delta method '" + name.substr(0, 64) +
                              "' (expected deltazip, bitdelta or rtn)");
}

std::vector<float> ExtraDelta::Decode() const {
  if (kind == Kind::kExactF32) return values;
  const int64_t rows = shape[0], cols = shape[1];
  std::vector<float> out(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      out[static_cast<size_t>(r * cols + c)] =
          static_cast<float>(q[static_cast<size_t>(r * cols + c)]) *
          row_scales[static_cast<size_t>(r)];
    }
  }
  return out;
}

int64_t ExtraDelta::StoredBytes() const {
  if (kind == Kind::kExactF32) return static_cast<int64_t>(values.size()) * 4;
  return static_cast<int64_t>(q.size() + row_scales.size() * 4);
}

int64_t Delta::MatrixBytes() const {
  int64_t n = 0;
  for (const MatrixDelta& m : matrices) n += m.packed.layout.PackedBytes(group_size == 0 ? 4 : 2);
  return n;
}

int64_t Delta::ExtraBytes() const {
  int64_t n = 0;
  for (const ExtraDelta& e : extras) n += e.StoredBytes();
  return n;
}

namespace {

// BaseWeightsHash over `tensors`; `read(t)` after each tensor's bytes were hashed.
std::string HashTensors(const model::Model::NamedTensors& tensors,
                        const std::function<void(const Tensor&)>& read) {
  std::vector<const std::pair<std::string, Tensor>*> sorted;
  for (const auto& p : tensors) sorted.push_back(&p);
  std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->first < b->first; });
  uint64_t h = kFnvOffset;
  for (const auto* p : sorted) {
    const Tensor& t = p->second;
    std::string line = p->first + " " + std::string(DTypeName(t.dtype())) + " ";
    for (size_t i = 0; i < t.shape().size(); ++i) {
      if (i) line += "x";
      line += std::to_string(t.shape()[i]);
    }
    line += ' ';
    line += Hex(Fnv(t.data(), static_cast<size_t>(t.view().NumBytes())));
    line += '\n';
    h = Fnv(line.data(), line.size(), h);
    read(t);
  }
  return "fnv1a64:" + Hex(h);
}

}  // namespace

std::string BaseWeightsHash(const model::Model& base) {
  // Reading a repacked matrix paged its source back in: a server's resident set would hold the
  // weights twice.
  return HashTensors(base.tensors(), [&](const Tensor& t) { base.ReleaseSourcePages(t); });
}

std::string BaseWeightsHash(const model::ModelFile& base) {
  return HashTensors(base.tensors, [](const Tensor& t) {
    ReleaseResidentPages(t.data(), static_cast<size_t>(t.view().NumBytes()));
  });
}

namespace {

// A non-owning tensor over bytes of the Delta being written (which outlives the write).
template <typename T>
Tensor ViewOf(const std::vector<T>& v, DType dtype, std::vector<int64_t> shape) {
  return Tensor(TensorView{dtype, std::move(shape), v.empty() ? nullptr : v.data()}, nullptr);
}

// The delta file's tensors and __metadata__: views into the Delta for what is stored as it is
// held (codes, 2:4 patterns, extras), new buffers only for zstd-compressed codes and f16 scales,
// so that writing a delta holds it about once more at most instead of twice (a copy of every
// tensor, then the assembled file). `stats` gets everything but file_bytes.
struct FileContents {
  std::vector<std::pair<std::string, Tensor>> tensors;
  std::map<std::string, std::string> meta;
  WriteStats stats;
};

Result<FileContents> ContentsOf(const Delta& d, int zstd_level) {
  FileContents out;
  nlohmann::ordered_json shapes = nlohmann::ordered_json::object();
  for (const MatrixDelta& m : d.matrices) {
    const MatrixLayout& l = m.packed.layout;
    if (l.bits != d.bits || l.sparse24 != d.sparse24 || l.group_size != d.group_size) {
      return InvalidArgumentError("delta matrix " + m.name +
                                  " has another bits / sparsity / group size than the delta");
    }
    shapes[m.name] = {l.rows, l.cols};
    // The tensors below are views of these buffers: their sizes must be the layout's.
    if (static_cast<int64_t>(m.packed.codes.size()) != l.rows * l.code_row_bytes() ||
        static_cast<int64_t>(m.packed.mask.size()) != l.rows * l.mask_row_bytes() ||
        static_cast<int64_t>(m.packed.scales.size()) != l.n_scales()) {
      return InvalidArgumentError("delta matrix " + m.name +
                                  " holds another number of codes, 2:4 patterns or scales than "
                                  "its layout");
    }
    // zstd where it pays (≥ 3 % smaller): 2-bit codes of a delta are far from uniform.
    const std::vector<uint8_t>& raw = m.packed.codes;
    auto z = std::make_shared<std::vector<uint8_t>>(ZSTD_compressBound(raw.size()));
    const size_t zn = ZSTD_compress(z->data(), z->size(), raw.data(), raw.size(), zstd_level);
    out.stats.codes_raw_bytes += static_cast<int64_t>(raw.size());
    if (!ZSTD_isError(zn) && zn * 100 < raw.size() * 97) {
      z->resize(zn);
      z->shrink_to_fit();
      const void* bytes = z->data();
      out.tensors.emplace_back(
          m.name + ".codes.zst",
          Tensor(TensorView{DType::kU8, {static_cast<int64_t>(zn)}, bytes}, std::move(z)));
      out.stats.codes_stored_bytes += static_cast<int64_t>(zn);
      ++out.stats.matrices_zstd;
    } else {
      out.tensors.emplace_back(m.name + ".codes",
                               ViewOf(raw, DType::kU8, {l.rows, l.code_row_bytes()}));
      out.stats.codes_stored_bytes += static_cast<int64_t>(raw.size());
    }
    if (l.sparse24)
      out.tensors.emplace_back(m.name + ".mask",
                               ViewOf(m.packed.mask, DType::kU8, {l.rows, l.mask_row_bytes()}));
    if (l.group_size == 0) {
      out.tensors.emplace_back(m.name + ".scales", ViewOf(m.packed.scales, DType::kF32, {1}));
    } else {
      out.tensors.emplace_back(m.name + ".scales", Tensor::FromF32(m.packed.scales, DType::kF16,
                                                                   {l.rows, l.groups_per_row()}));
    }
  }
  for (const ExtraDelta& e : d.extras) {
    int64_t n = 1;
    for (int64_t dim : e.shape) n *= dim;
    const bool exact = e.kind == ExtraDelta::Kind::kExactF32;
    if (e.shape.empty() || (exact ? static_cast<int64_t>(e.values.size()) != n
                                  : static_cast<int64_t>(e.q.size()) != n ||
                                        static_cast<int64_t>(e.row_scales.size()) != e.shape[0])) {
      return InvalidArgumentError("delta extra " + e.name +
                                  " holds another number of values than its shape");
    }
    if (exact) {
      out.tensors.emplace_back(e.name + ".delta", ViewOf(e.values, DType::kF32, e.shape));
    } else {
      out.tensors.emplace_back(e.name + ".q8", ViewOf(e.q, DType::kI8, e.shape));
      out.tensors.emplace_back(e.name + ".q8_scales",
                               ViewOf(e.row_scales, DType::kF32, {e.shape[0]}));
    }
  }
  out.meta["format"] = kDeltaFormatName;
  out.meta["format_version"] = std::to_string(kDeltaFormatVersion);
  out.meta["method"] = MethodName(d.method);
  out.meta["bits"] = std::to_string(d.bits);
  out.meta["sparsity"] = d.sparse24 ? "2:4" : "none";
  out.meta["group_size"] = std::to_string(d.group_size);
  out.meta["base_hash"] = d.base_hash;
  out.meta["matrices"] = shapes.dump();
  if (!d.base_source.empty()) out.meta["base_source"] = d.base_source;
  if (!d.finetuned_source.empty()) out.meta["finetuned_source"] = d.finetuned_source;
  return out;
}

}  // namespace

Result<std::string> SerializeDelta(const Delta& d, int zstd_level, WriteStats* stats) {
  CHORUS_ASSIGN_OR_RETURN(FileContents c, ContentsOf(d, zstd_level));
  auto bytes = formats::SerializeSafetensors(c.tensors, c.meta);
  if (bytes.ok()) c.stats.file_bytes = static_cast<int64_t>(bytes->size());
  if (stats) *stats = c.stats;
  return bytes;
}

Status WriteDelta(const std::string& path, const Delta& d, int zstd_level, WriteStats* stats) {
  CHORUS_ASSIGN_OR_RETURN(FileContents c, ContentsOf(d, zstd_level));
  if (!EndsWith(path, ".safetensors") && !IsDirectory(path)) {
    if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST)
      return ErrnoError(errno, "creating delta directory " + path);
  }
  const std::string file = FilePathFor(path);
  // A killed earlier write of this file left its temp file: removed once its writer is gone.
  RemoveDeadWritersTempFiles(file);
  // Streamed: the header, then each tensor from where it is held (formats/safetensors.h).
  CHORUS_RETURN_IF_ERROR(formats::WriteSafetensors(file, c.tensors, c.meta));
  struct stat sb;
  if (::stat(file.c_str(), &sb) == 0) c.stats.file_bytes = static_cast<int64_t>(sb.st_size);
  if (stats) *stats = c.stats;
  return OkStatus();
}

namespace {

Result<int64_t> MetaInt(const std::map<std::string, std::string>& meta, const std::string& key,
                        const std::string& file) {
  auto it = meta.find(key);
  if (it == meta.end()) return DataLossError(file + ": __metadata__ lacks '" + key + "'");
  const std::string& v = it->second;
  if (v.empty() || v.size() > 9 || v.find_first_not_of("0123456789") != std::string::npos)
    return DataLossError(file + ": __metadata__ '" + key + "' is not a small integer: '" +
                         v.substr(0, 32) + "'");
  return static_cast<int64_t>(std::stoll(v));
}

// The tensor `name` of `f`, checked to be `want` of `want_shape` (any shape when empty): a
// view into the file.
Result<Tensor> GetChecked(const formats::SafetensorsFile& f, const std::string& name,
                          const std::vector<int64_t>& want_shape, DType want,
                          const std::string& file) {
  const formats::SafetensorsTensorInfo* info = nullptr;
  for (const auto& t : f.tensors())
    if (t.name == name) info = &t;
  if (info == nullptr) return DataLossError(file + ": tensor " + name + " is missing");
  CHORUS_ASSIGN_OR_RETURN(Tensor t, f.GetTensor(name));
  if (t.dtype() != want) {
    return DataLossError(file + ": tensor " + name + " has dtype " +
                         std::string(DTypeName(t.dtype())) + ", expected " +
                         std::string(DTypeName(want)));
  }
  if (!want_shape.empty() && t.shape() != want_shape) {
    return DataLossError(file + ": tensor " + name + " has shape " + ShapeString(t.shape()) +
                         ", the delta's metadata implies " + ShapeString(want_shape));
  }
  return t;
}

// GetChecked, copied out.
Result<std::vector<uint8_t>> ReadBytes(const formats::SafetensorsFile& f, const std::string& name,
                                       const std::vector<int64_t>& want_shape, DType want,
                                       const std::string& file) {
  CHORUS_ASSIGN_OR_RETURN(Tensor t, GetChecked(f, name, want_shape, want, file));
  const auto* p = static_cast<const uint8_t*>(t.data());
  return std::vector<uint8_t>(p, p + t.view().NumBytes());
}

// The delta held by an opened safetensors file; `file` names it in messages. With `in_file`,
// uncompressed codes and patterns are left in the file (MappedDelta).
Result<Delta> ParseDeltaFile(const formats::SafetensorsFile& sf, const std::string& file,
                             std::vector<MappedDelta::Bytes>* in_file = nullptr) {
  const formats::SafetensorsFile* f = &sf;
  const auto& meta = f->metadata();
  auto fmt = meta.find("format");
  if (fmt == meta.end() || fmt->second != kDeltaFormatName) {
    return InvalidArgumentError(file + ": not a Chorus delta (__metadata__ format is not '" +
                                std::string(kDeltaFormatName) + "')");
  }
  CHORUS_ASSIGN_OR_RETURN(int64_t version, MetaInt(meta, "format_version", file));
  if (version != kDeltaFormatVersion) {
    return UnimplementedError(file + ": delta format version " + std::to_string(version) +
                              " (this Chorus reads version " + std::to_string(kDeltaFormatVersion) +
                              ")");
  }
  Delta d;
  auto method = meta.find("method");
  if (method == meta.end()) return DataLossError(file + ": __metadata__ lacks 'method'");
  auto m = ParseMethod(method->second);
  if (!m.ok()) return DataLossError(file + ": " + m.status().message());
  d.method = *m;
  CHORUS_ASSIGN_OR_RETURN(int64_t bits, MetaInt(meta, "bits", file));
  d.bits = static_cast<int>(bits);
  auto sp = meta.find("sparsity");
  if (sp == meta.end() || (sp->second != "2:4" && sp->second != "none"))
    return DataLossError(file + ": __metadata__ 'sparsity' must be '2:4' or 'none'");
  d.sparse24 = sp->second == "2:4";
  CHORUS_ASSIGN_OR_RETURN(d.group_size, MetaInt(meta, "group_size", file));
  if (d.bits != 1 && d.bits != 2 && d.bits != 3 && d.bits != 4 && d.bits != 8) {
    return DataLossError(file + ": __metadata__ 'bits' is " + std::to_string(d.bits) +
                         ", not one of 1, 2, 3, 4, 8");
  }
  auto bh = meta.find("base_hash");
  if (bh == meta.end() || bh->second.empty())
    return DataLossError(file + ": __metadata__ lacks 'base_hash'");
  d.base_hash = bh->second;
  if (auto it = meta.find("base_source"); it != meta.end()) d.base_source = it->second;
  if (auto it = meta.find("finetuned_source"); it != meta.end()) d.finetuned_source = it->second;
  auto mi = meta.find("matrices");
  if (mi == meta.end()) return DataLossError(file + ": __metadata__ lacks 'matrices'");
  nlohmann::ordered_json shapes = nlohmann::ordered_json::parse(mi->second, nullptr, false);
  if (shapes.is_discarded() || !shapes.is_object())
    return DataLossError(file + ": __metadata__ 'matrices' is not a JSON object");

  std::set<std::string> used;
  for (const auto& [name, shape] : shapes.items()) {
    if (!shape.is_array() || shape.size() != 2 || !shape[0].is_number_integer() ||
        !shape[1].is_number_integer()) {
      return DataLossError(file + ": matrix " + name + " has no [rows, cols] shape in 'matrices'");
    }
    MatrixDelta md;
    MappedDelta::Bytes bytes;
    md.name = name;
    MatrixLayout& l = md.packed.layout;
    l.rows = shape[0].get<int64_t>();
    l.cols = shape[1].get<int64_t>();
    l.bits = d.bits;
    l.sparse24 = d.sparse24;
    l.group_size = d.group_size;
    CHORUS_RETURN_IF_ERROR(ValidateLayout(l, file + ": matrix " + name));
    const int64_t raw_size = l.rows * l.code_row_bytes();
    if (f->Has(name + ".codes.zst")) {
      CHORUS_ASSIGN_OR_RETURN(auto z, ReadBytes(*f, name + ".codes.zst", {}, DType::kU8, file));
      const unsigned long long n = ZSTD_getFrameContentSize(z.data(), z.size());
      // Packed codes never compress 4096:1; a frame announcing more is refused before the
      // output is allocated (a small file must not make the reader allocate gigabytes).
      const bool plausible =
          static_cast<unsigned long long>(raw_size) <= 4096ull * z.size() + (1ull << 20);
      if (n == ZSTD_CONTENTSIZE_ERROR || n == ZSTD_CONTENTSIZE_UNKNOWN || !plausible ||
          n != static_cast<unsigned long long>(raw_size)) {
        return DataLossError(file + ": tensor " + name +
                             ".codes.zst is not a zstd frame of the layout's " +
                             std::to_string(raw_size) + " bytes");
      }
      md.packed.codes.resize(static_cast<size_t>(raw_size));
      const size_t got =
          ZSTD_decompress(md.packed.codes.data(), md.packed.codes.size(), z.data(), z.size());
      if (ZSTD_isError(got) || got != static_cast<size_t>(raw_size)) {
        return DataLossError(file + ": tensor " + name + ".codes.zst does not decompress (" +
                             (ZSTD_isError(got) ? ZSTD_getErrorName(got) : "short") + ")");
      }
      md.zstd = true;
      used.insert(name + ".codes.zst");
    } else if (in_file != nullptr) {
      CHORUS_ASSIGN_OR_RETURN(
          bytes.codes,
          GetChecked(*f, name + ".codes", {l.rows, l.code_row_bytes()}, DType::kU8, file));
      used.insert(name + ".codes");
    } else {
      CHORUS_ASSIGN_OR_RETURN(
          md.packed.codes,
          ReadBytes(*f, name + ".codes", {l.rows, l.code_row_bytes()}, DType::kU8, file));
      used.insert(name + ".codes");
    }
    if (l.sparse24) {
      if (in_file != nullptr) {
        CHORUS_ASSIGN_OR_RETURN(
            bytes.mask,
            GetChecked(*f, name + ".mask", {l.rows, l.mask_row_bytes()}, DType::kU8, file));
      } else {
        CHORUS_ASSIGN_OR_RETURN(
            md.packed.mask,
            ReadBytes(*f, name + ".mask", {l.rows, l.mask_row_bytes()}, DType::kU8, file));
      }
      used.insert(name + ".mask");
    }
    {
      const std::string sn = name + ".scales";
      if (!f->Has(sn)) return DataLossError(file + ": tensor " + sn + " is missing");
      CHORUS_ASSIGN_OR_RETURN(Tensor t, f->GetTensor(sn));
      const std::vector<int64_t> want = l.group_size == 0
                                            ? std::vector<int64_t>{1}
                                            : std::vector<int64_t>{l.rows, l.groups_per_row()};
      const DType want_dt = l.group_size == 0 ? DType::kF32 : DType::kF16;
      if (t.dtype() != want_dt || t.shape() != want) {
        return DataLossError(file + ": tensor " + sn + " is " + std::string(DTypeName(t.dtype())) +
                             " " + ShapeString(t.shape()) + ", expected " +
                             std::string(DTypeName(want_dt)) + " " + ShapeString(want));
      }
      md.packed.scales = t.ToF32();
      used.insert(sn);
    }
    // Full validation of codes, patterns and scales, wherever they are.
    const auto codes = HeldBytes(bytes.codes, md.packed.codes);
    const auto mask = HeldBytes(bytes.mask, md.packed.mask);
    CHORUS_RETURN_IF_ERROR(CheckPackedBytes(l, codes.data(), codes.size(), mask.data(), mask.size(),
                                            md.packed.scales, file + ": matrix " + name));
    d.matrices.push_back(std::move(md));
    if (in_file != nullptr) in_file->push_back(std::move(bytes));
  }
  // Extras, and nothing else.
  std::set<std::string> extra_names;
  for (const auto& info : f->tensors()) {
    if (used.count(info.name)) continue;
    ExtraDelta e;
    if (EndsWith(info.name, ".delta")) {
      e.name = info.name.substr(0, info.name.size() - 6);
      CHORUS_ASSIGN_OR_RETURN(Tensor t, f->GetTensor(info.name));
      if (t.dtype() != DType::kF32 || t.shape().empty() || t.shape().size() > 2) {
        return DataLossError(file + ": tensor " + info.name + " must be a 1-D or 2-D f32 delta");
      }
      e.kind = ExtraDelta::Kind::kExactF32;
      e.shape = t.shape();
      e.values = t.ToF32();
      for (float v : e.values)
        if (!std::isfinite(v))
          return DataLossError(file + ": tensor " + info.name + " is not finite");
    } else if (EndsWith(info.name, ".q8")) {
      e.name = info.name.substr(0, info.name.size() - 3);
      e.kind = ExtraDelta::Kind::kInt8Rows;
      CHORUS_ASSIGN_OR_RETURN(Tensor t, f->GetTensor(info.name));
      if (t.dtype() != DType::kI8 || t.shape().size() != 2)
        return DataLossError(file + ": tensor " + info.name + " must be a 2-D i8 delta");
      e.shape = t.shape();
      const auto* p = static_cast<const int8_t*>(t.data());
      e.q.assign(p, p + t.view().NumElements());
      const std::string sn = e.name + ".q8_scales";
      if (!f->Has(sn)) return DataLossError(file + ": tensor " + sn + " is missing");
      CHORUS_ASSIGN_OR_RETURN(Tensor s, f->GetTensor(sn));
      if (s.dtype() != DType::kF32 || s.shape() != std::vector<int64_t>{e.shape[0]})
        return DataLossError(file + ": tensor " + sn + " must be f32 [" +
                             std::to_string(e.shape[0]) + "]");
      e.row_scales = s.ToF32();
      for (float v : e.row_scales)
        if (!std::isfinite(v)) return DataLossError(file + ": tensor " + sn + " is not finite");
      used.insert(sn);
    } else if (EndsWith(info.name, ".q8_scales")) {
      continue;  // checked with its .q8 (an orphan is caught below)
    } else {
      return DataLossError(file + ": tensor " + info.name + " is not part of the delta format");
    }
    if (!extra_names.insert(e.name).second) {
      return DataLossError(file + ": tensor " + e.name + " has two extra deltas");
    }
    if (shapes.contains(e.name)) {
      return DataLossError(file + ": tensor " + e.name +
                           " is both a compressed matrix and an extra");
    }
    used.insert(info.name);
    d.extras.push_back(std::move(e));
  }
  for (const auto& info : f->tensors()) {
    if (!used.count(info.name))
      return DataLossError(file + ": tensor " + info.name + " has no matching .q8 tensor");
  }
  return d;
}

}  // namespace

Result<Delta> ParseDelta(const std::string& file, std::string bytes) {
  CHORUS_ASSIGN_OR_RETURN(auto f, formats::SafetensorsFile::FromBytes(file, std::move(bytes)));
  return ParseDeltaFile(*f, file);
}

Result<Delta> ReadDelta(const std::string& path) {
  const std::string file = IsDirectory(path) ? path + "/" + kDeltaFileName : path;
  // Parsed in place from the mapping: a copy of the whole file first cost as much as the
  // rest of a load (fresh pages faulted in and cleared, then copied).
  CHORUS_ASSIGN_OR_RETURN(auto f, formats::SafetensorsFile::Open(file));
  return ParseDeltaFile(*f, file);
}

Result<MappedDelta> ReadDeltaMapped(const std::string& path) {
  const std::string file = IsDirectory(path) ? path + "/" + kDeltaFileName : path;
  MappedDelta m;
  CHORUS_ASSIGN_OR_RETURN(m.file, formats::SafetensorsFile::Open(file));
  CHORUS_ASSIGN_OR_RETURN(m.delta, ParseDeltaFile(*m.file, file, &m.in_file));
  return m;
}

std::span<const uint8_t> HeldBytes(const Tensor& in_file, const std::vector<uint8_t>& copy) {
  if (in_file.data() == nullptr) return copy;
  return {static_cast<const uint8_t*>(in_file.data()),
          static_cast<size_t>(in_file.view().NumBytes())};
}

Result<MappedDelta> ParseDeltaMapped(const std::string& file, std::string bytes) {
  MappedDelta m;
  CHORUS_ASSIGN_OR_RETURN(m.file, formats::SafetensorsFile::FromBytes(file, std::move(bytes)));
  CHORUS_ASSIGN_OR_RETURN(m.delta, ParseDeltaFile(*m.file, file, &m.in_file));
  return m;
}

bool IsDeltaPath(const std::string& path) {
  const std::string file = IsDirectory(path) ? path + "/" + kDeltaFileName : path;
  auto f = formats::SafetensorsFile::Open(file);
  if (!f.ok()) return false;
  auto it = (*f)->metadata().find("format");
  return it != (*f)->metadata().end() && it->second == kDeltaFormatName;
}

bool LooksLikeDeltaPath(const std::string& path) {
  if (IsDeltaPath(path)) return true;
  struct stat st;
  if (IsDirectory(path)) return ::stat((path + "/" + kDeltaFileName).c_str(), &st) == 0;
  const size_t slash = path.find_last_of('/');
  const std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  return EndsWith(path, ".safetensors") && base != "adapter_model.safetensors";
}

Status CheckDeltaBase(const Delta& d, const model::Model& base, const std::string& delta_path) {
  const std::string h = BaseWeightsHash(base);
  if (h != d.base_hash) {
    return FailedPreconditionError("delta " + delta_path + " was made against base weights " +
                                   d.base_hash + ", but the base " + base.source() + " is " + h +
                                   " (a delta only applies to the exact base it was made from)");
  }
  std::map<std::string, const Tensor*> by_name;
  for (const auto& [n, t] : base.tensors()) by_name[n] = &t;
  for (const MatrixDelta& m : d.matrices) {
    auto it = by_name.find(m.name);
    const std::vector<int64_t> want{m.packed.layout.rows, m.packed.layout.cols};
    if (it == by_name.end())
      return InvalidArgumentError("delta " + delta_path + ": tensor " + m.name +
                                  " is not in the base");
    if (it->second->shape() != want) {
      return InvalidArgumentError("delta " + delta_path + ": tensor " + m.name + " is " +
                                  ShapeString(want) + ", the base's is " +
                                  ShapeString(it->second->shape()));
    }
  }
  for (const ExtraDelta& e : d.extras) {
    auto it = by_name.find(e.name);
    if (it == by_name.end())
      return InvalidArgumentError("delta " + delta_path + ": tensor " + e.name +
                                  " is not in the base");
    if (it->second->shape() != e.shape) {
      return InvalidArgumentError("delta " + delta_path + ": tensor " + e.name + " is " +
                                  ShapeString(e.shape) + ", the base's is " +
                                  ShapeString(it->second->shape()));
    }
  }
  return OkStatus();
}

Result<std::shared_ptr<const model::Model>> ApplyDeltaDense(const model::Model& base,
                                                            const Delta& d,
                                                            const std::string& delta_path) {
  CHORUS_RETURN_IF_ERROR(CheckDeltaBase(d, base, delta_path));
  std::map<std::string, std::vector<float>> add;
  for (const MatrixDelta& m : d.matrices) {
    CHORUS_ASSIGN_OR_RETURN(UnpackedMatrix u, Unpack(m.packed, delta_path + ": " + m.name));
    add[m.name] = u.Decode();
  }
  for (const ExtraDelta& e : d.extras) add[e.name] = e.Decode();
  model::Model::NamedTensors out;
  for (const auto& [name, t] : base.tensors()) {
    auto it = add.find(name);
    if (it == add.end()) {
      out.emplace_back(name, t);
      continue;
    }
    std::vector<float> v = t.ToF32();
    for (size_t i = 0; i < v.size(); ++i) v[i] += it->second[i];
    out.emplace_back(name, Tensor::FromF32(v, DType::kF32, t.shape()));
  }
  return model::Model::Build(base.config(), std::move(out), base.format(),
                             base.source() + " + " + delta_path);
}

}  // namespace chorus::delta
