#include "chorus/formats/gguf.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <utility>

#include "chorus/formats/byte_io.h"

namespace chorus::formats {
namespace {

using internal::AlignUp;
using internal::ByteReader;
using internal::ByteWriter;
using internal::CheckedAdd;
using internal::CheckedMul;
using internal::Printable;

constexpr uint32_t kMaxDims = 4;        // GGML_MAX_DIMS
constexpr uint64_t kMaxKeyLen = 65535;  // the spec's limit on key length
constexpr uint64_t kMaxTensorNameLen = 65535;
constexpr uint32_t kDefaultAlignment = 32;
constexpr uint32_t kMaxGgmlTypeId = 63;  // ids above are rejected as garbage
// Minimum encoded sizes, used to reject counts that cannot fit in the remaining bytes before
// anything is allocated.
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;          // empty key, type, 1-byte value
constexpr uint64_t kMinTensorBytes = 8 + 4 + 4 + 8;  // empty name, n_dims=0, type, offset

struct GgmlTypeTraits {
  uint32_t id;
  const char* name;
  int64_t block_elems;  // 0 = size unknown to Chorus
  int64_t block_bytes;
};

// Block sizes from the GGML block structs (ggml-common.h); types whose layout Chorus does not
// know are listed with block_elems = 0 so files holding them still open (GetTensor refuses them).
constexpr GgmlTypeTraits kGgmlTypes[] = {
    {0, "F32", 1, 4},       {1, "F16", 1, 2},       {2, "Q4_0", 32, 18},    {3, "Q4_1", 32, 20},
    {6, "Q5_0", 32, 22},    {7, "Q5_1", 32, 24},    {8, "Q8_0", 32, 34},    {9, "Q8_1", 32, 36},
    {10, "Q2_K", 256, 84},  {11, "Q3_K", 256, 110}, {12, "Q4_K", 256, 144}, {13, "Q5_K", 256, 176},
    {14, "Q6_K", 256, 210}, {15, "Q8_K", 256, 292}, {16, "IQ2_XXS", 0, 0},  {17, "IQ2_XS", 0, 0},
    {18, "IQ3_XXS", 0, 0},  {19, "IQ1_S", 0, 0},    {20, "IQ4_NL", 32, 18}, {21, "IQ3_S", 0, 0},
    {22, "IQ2_S", 0, 0},    {23, "IQ4_XS", 0, 0},   {24, "I8", 1, 1},       {25, "I16", 1, 2},
    {26, "I32", 1, 4},      {27, "I64", 1, 8},      {28, "F64", 1, 8},      {29, "IQ1_M", 0, 0},
    {30, "BF16", 1, 2},     {34, "TQ1_0", 0, 0},    {35, "TQ2_0", 0, 0},
};

const GgmlTypeTraits* FindGgmlType(uint32_t id) {
  for (const auto& t : kGgmlTypes) {
    if (t.id == id) return &t;
  }
  return nullptr;
}

bool IsSignedInt(GgufType t) {
  return t == GgufType::kInt8 || t == GgufType::kInt16 || t == GgufType::kInt32 ||
         t == GgufType::kInt64;
}
bool IsUnsignedIntOrBool(GgufType t) {
  return t == GgufType::kUint8 || t == GgufType::kUint16 || t == GgufType::kUint32 ||
         t == GgufType::kUint64 || t == GgufType::kBool;
}
bool IsFloat(GgufType t) { return t == GgufType::kFloat32 || t == GgufType::kFloat64; }
bool IsIntegral(GgufType t) { return IsSignedInt(t) || IsUnsignedIntOrBool(t); }

// Encoded size of one scalar (0 for strings and arrays, which are variable).
uint64_t ScalarBytes(GgufType t) {
  switch (t) {
    case GgufType::kUint8:
    case GgufType::kInt8:
    case GgufType::kBool:
      return 1;
    case GgufType::kUint16:
    case GgufType::kInt16:
      return 2;
    case GgufType::kUint32:
    case GgufType::kInt32:
    case GgufType::kFloat32:
      return 4;
    case GgufType::kUint64:
    case GgufType::kInt64:
    case GgufType::kFloat64:
      return 8;
    case GgufType::kString:
    case GgufType::kArray:
      return 0;
  }
  return 0;
}

// Range of an integer type, as [lo, hi] in int128 so both signed and unsigned fit.
void IntRange(GgufType t, __int128* lo, __int128* hi) {
  switch (t) {
    case GgufType::kUint8:
      *lo = 0;
      *hi = 255;
      return;
    case GgufType::kInt8:
      *lo = -128;
      *hi = 127;
      return;
    case GgufType::kUint16:
      *lo = 0;
      *hi = 65535;
      return;
    case GgufType::kInt16:
      *lo = -32768;
      *hi = 32767;
      return;
    case GgufType::kUint32:
      *lo = 0;
      *hi = 4294967295LL;
      return;
    case GgufType::kInt32:
      *lo = INT32_MIN;
      *hi = INT32_MAX;
      return;
    case GgufType::kUint64:
      *lo = 0;
      *hi = static_cast<__int128>(UINT64_MAX);
      return;
    case GgufType::kInt64:
      *lo = INT64_MIN;
      *hi = INT64_MAX;
      return;
    case GgufType::kBool:
      *lo = 0;
      *hi = 1;
      return;
    default:
      *lo = 0;
      *hi = -1;
      return;
  }
}

// Reads one integer scalar of type `t` (1..8 bytes) as int128.
bool ReadIntScalar(ByteReader& r, GgufType t, __int128* out) {
  switch (t) {
    case GgufType::kUint8:
    case GgufType::kBool: {
      uint8_t v;
      if (!r.Read(&v)) return false;
      *out = v;
      return true;
    }
    case GgufType::kInt8: {
      int8_t v;
      if (!r.Read(&v)) return false;
      *out = v;
      return true;
    }
    case GgufType::kUint16: {
      uint16_t v;
      if (!r.Read(&v)) return false;
      *out = v;
      return true;
    }
    case GgufType::kInt16: {
      int16_t v;
      if (!r.Read(&v)) return false;
      *out = v;
      return true;
    }
    case GgufType::kUint32: {
      uint32_t v;
      if (!r.Read(&v)) return false;
      *out = v;
      return true;
    }
    case GgufType::kInt32: {
      int32_t v;
      if (!r.Read(&v)) return false;
      *out = v;
      return true;
    }
    case GgufType::kUint64: {
      uint64_t v;
      if (!r.Read(&v)) return false;
      *out = v;
      return true;
    }
    case GgufType::kInt64: {
      int64_t v;
      if (!r.Read(&v)) return false;
      *out = v;
      return true;
    }
    default:
      return false;
  }
}

bool ReadFloatScalar(ByteReader& r, GgufType t, double* out) {
  if (t == GgufType::kFloat32) {
    float v;
    if (!r.Read(&v)) return false;
    *out = v;
    return true;
  }
  double v;
  if (!r.Read(&v)) return false;
  *out = v;
  return true;
}

void WriteIntScalar(ByteWriter& w, GgufType t, __int128 v) {
  switch (t) {
    case GgufType::kUint8:
    case GgufType::kBool:
      w.Write(static_cast<uint8_t>(v));
      return;
    case GgufType::kInt8:
      w.Write(static_cast<int8_t>(v));
      return;
    case GgufType::kUint16:
      w.Write(static_cast<uint16_t>(v));
      return;
    case GgufType::kInt16:
      w.Write(static_cast<int16_t>(v));
      return;
    case GgufType::kUint32:
      w.Write(static_cast<uint32_t>(v));
      return;
    case GgufType::kInt32:
      w.Write(static_cast<int32_t>(v));
      return;
    case GgufType::kUint64:
      w.Write(static_cast<uint64_t>(v));
      return;
    case GgufType::kInt64:
      w.Write(static_cast<int64_t>(v));
      return;
    default:
      return;
  }
}

// The bytes behind a GgufFile: an mmap or an owned string.
struct Backing {
  std::shared_ptr<const void> keepalive;
  const uint8_t* data = nullptr;
  size_t size = 0;
};

}  // namespace

std::string_view GgufTypeName(GgufType t) {
  switch (t) {
    case GgufType::kUint8:
      return "uint8";
    case GgufType::kInt8:
      return "int8";
    case GgufType::kUint16:
      return "uint16";
    case GgufType::kInt16:
      return "int16";
    case GgufType::kUint32:
      return "uint32";
    case GgufType::kInt32:
      return "int32";
    case GgufType::kFloat32:
      return "float32";
    case GgufType::kBool:
      return "bool";
    case GgufType::kString:
      return "string";
    case GgufType::kArray:
      return "array";
    case GgufType::kUint64:
      return "uint64";
    case GgufType::kInt64:
      return "int64";
    case GgufType::kFloat64:
      return "float64";
  }
  return "?";
}

GgufValue GgufValue::Int(GgufType t, int64_t v) {
  GgufValue r;
  r.type = t;
  r.value = v;
  return r;
}
GgufValue GgufValue::Uint(GgufType t, uint64_t v) {
  GgufValue r;
  r.type = t;
  r.value = v;
  return r;
}
GgufValue GgufValue::Float(GgufType t, double v) {
  GgufValue r;
  r.type = t;
  r.value = v;
  return r;
}
GgufValue GgufValue::String(std::string v) {
  GgufValue r;
  r.type = GgufType::kString;
  r.value = std::move(v);
  return r;
}
GgufValue GgufValue::IntArray(GgufType element, std::vector<int64_t> v) {
  GgufValue r;
  r.type = GgufType::kArray;
  r.element_type = element;
  r.value = std::move(v);
  return r;
}
GgufValue GgufValue::FloatArray(GgufType element, std::vector<double> v) {
  GgufValue r;
  r.type = GgufType::kArray;
  r.element_type = element;
  r.value = std::move(v);
  return r;
}
GgufValue GgufValue::StringArray(std::vector<std::string> v) {
  GgufValue r;
  r.type = GgufType::kArray;
  r.element_type = GgufType::kString;
  r.value = std::move(v);
  return r;
}

size_t GgufValue::size() const {
  if (type != GgufType::kArray) return 1;
  if (auto* p = std::get_if<std::vector<int64_t>>(&value)) return p->size();
  if (auto* p = std::get_if<std::vector<double>>(&value)) return p->size();
  if (auto* p = std::get_if<std::vector<std::string>>(&value)) return p->size();
  return 0;
}

bool operator==(const GgufValue& a, const GgufValue& b) {
  if (a.type != b.type) return false;
  if (a.type == GgufType::kArray && a.element_type != b.element_type) return false;
  if (a.value.index() != b.value.index()) return false;
  auto same_double = [](double x, double y) { return (std::isnan(x) && std::isnan(y)) || x == y; };
  if (auto* x = std::get_if<double>(&a.value)) return same_double(*x, std::get<double>(b.value));
  if (auto* x = std::get_if<std::vector<double>>(&a.value)) {
    const auto& y = std::get<std::vector<double>>(b.value);
    if (x->size() != y.size()) return false;
    for (size_t i = 0; i < x->size(); ++i) {
      if (!same_double((*x)[i], y[i])) return false;
    }
    return true;
  }
  return a.value == b.value;
}

std::string GgmlTypeName(uint32_t ggml_type) {
  if (const auto* t = FindGgmlType(ggml_type)) return t->name;
  return "type" + std::to_string(ggml_type);
}

Result<DType> GgmlTypeToDType(uint32_t ggml_type) {
  switch (ggml_type) {
    case kGgmlF32:
      return DType::kF32;
    case kGgmlF16:
      return DType::kF16;
    case kGgmlBF16:
      return DType::kBF16;
    case kGgmlQ8_0:
      return DType::kQ8_0;
    case kGgmlQ4_0:
      return DType::kQ4_0;
    case kGgmlQ2_K:
      return DType::kQ2_K;
    case kGgmlQ3_K:
      return DType::kQ3_K;
    case kGgmlQ4_K:
      return DType::kQ4_K;
    case kGgmlQ5_K:
      return DType::kQ5_K;
    case kGgmlQ6_K:
      return DType::kQ6_K;
    case kGgmlI8:
      return DType::kI8;
    case kGgmlI32:
      return DType::kI32;
    default:
      return UnimplementedError("GGML type " + GgmlTypeName(ggml_type) +
                                " is not supported (supported: F32, F16, BF16, Q8_0, Q4_0, Q2_K, "
                                "Q3_K, Q4_K, Q5_K, Q6_K, I8, I32)");
  }
}

Result<uint32_t> DTypeToGgmlType(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return kGgmlF32;
    case DType::kF16:
      return kGgmlF16;
    case DType::kBF16:
      return kGgmlBF16;
    case DType::kQ8_0:
      return kGgmlQ8_0;
    case DType::kQ4_0:
      return kGgmlQ4_0;
    case DType::kQ2_K:
      return kGgmlQ2_K;
    case DType::kQ3_K:
      return kGgmlQ3_K;
    case DType::kQ4_K:
      return kGgmlQ4_K;
    case DType::kQ5_K:
      return kGgmlQ5_K;
    case DType::kQ6_K:
      return kGgmlQ6_K;
    case DType::kI8:
      return kGgmlI8;
    case DType::kI32:
      return kGgmlI32;
    case DType::kU8:
      break;
  }
  return UnimplementedError("dtype " + std::string(DTypeName(dtype)) + " has no GGML type");
}

// ---------------------------------------------------------------------------------------------
// Reader

struct GgufFile::Impl {
  std::string path;
  Backing backing;
  uint32_t version = 0;
  uint32_t alignment = kDefaultAlignment;
  uint64_t data_offset = 0;  // absolute offset of the data section
  std::map<std::string, GgufValue> metadata;
  std::vector<GgufTensorInfo> tensors;
  std::map<std::string, size_t> tensor_index;
};

namespace {

class Parser {
 public:
  explicit Parser(GgufFile::Impl* impl) : impl_(impl), r_(impl->backing.data, impl->backing.size) {}

  Status Parse() {
    const size_t file_size = impl_->backing.size;
    std::string_view magic;
    if (!r_.ReadBytes(4, &magic)) {
      return Fail(StatusCode::kDataLoss,
                  "file is " + std::to_string(file_size) + " bytes, too short for a GGUF header");
    }
    if (magic != "GGUF") {
      return Fail(StatusCode::kInvalidArgument,
                  "bad magic '" + Printable(magic) + "' (not a GGUF file)");
    }
    uint32_t version = 0;
    if (!r_.Read(&version)) return Truncated("the version");
    if (version != 2 && version != 3) {
      if (version == 1) {
        return Fail(StatusCode::kUnimplemented, "GGUF v1 is not supported (only v2 and v3)");
      }
      if (version == __builtin_bswap32(2u) || version == __builtin_bswap32(3u)) {
        return Fail(StatusCode::kUnimplemented, "big-endian GGUF is not supported");
      }
      return Fail(StatusCode::kUnimplemented,
                  "unsupported GGUF version " + std::to_string(version));
    }
    impl_->version = version;
    uint64_t n_tensors = 0, n_kv = 0;
    if (!r_.Read(&n_tensors)) return Truncated("the tensor count");
    if (!r_.Read(&n_kv)) return Truncated("the metadata count");
    if (n_kv > r_.remaining() / kMinKvBytes) {
      return Fail(StatusCode::kDataLoss, "metadata count " + std::to_string(n_kv) +
                                             " cannot fit in the remaining " +
                                             std::to_string(r_.remaining()) + " bytes");
    }
    if (n_tensors > r_.remaining() / kMinTensorBytes) {
      return Fail(StatusCode::kDataLoss, "tensor count " + std::to_string(n_tensors) +
                                             " cannot fit in the remaining " +
                                             std::to_string(r_.remaining()) + " bytes");
    }
    for (uint64_t i = 0; i < n_kv; ++i) CHORUS_RETURN_IF_ERROR(ParseKv(i));
    CHORUS_RETURN_IF_ERROR(ParseAlignment());
    impl_->tensors.reserve(static_cast<size_t>(n_tensors));
    for (uint64_t i = 0; i < n_tensors; ++i) CHORUS_RETURN_IF_ERROR(ParseTensorInfo(i));
    return CheckTensorData();
  }

 private:
  Status Fail(StatusCode code, const std::string& msg) const {
    return Status(code, impl_->path + ": " + msg);
  }
  Status Truncated(const std::string& what) const {
    return Fail(StatusCode::kDataLoss, "truncated: file ends (at " +
                                           std::to_string(impl_->backing.size) + " bytes) inside " +
                                           what);
  }

  Status ReadString(uint64_t max_len, const std::string& what, std::string* out) {
    uint64_t len = 0;
    if (!r_.Read(&len)) return Truncated("the length of " + what);
    if (len > max_len) {
      return Fail(StatusCode::kDataLoss, what + " has length " + std::to_string(len) +
                                             ", more than the limit of " + std::to_string(max_len));
    }
    std::string_view s;
    if (!r_.ReadBytes(len, &s)) {
      return Fail(StatusCode::kDataLoss, what + " of " + std::to_string(len) + " bytes at offset " +
                                             std::to_string(r_.pos()) +
                                             " extends past end of file (" +
                                             std::to_string(r_.size()) + " bytes)");
    }
    out->assign(s);
    return OkStatus();
  }

  Status ReadType(const std::string& what, GgufType* out) {
    uint32_t t = 0;
    if (!r_.Read(&t)) return Truncated("the type of " + what);
    if (t > static_cast<uint32_t>(GgufType::kFloat64)) {
      return Fail(StatusCode::kDataLoss, what + " has invalid value type " + std::to_string(t));
    }
    *out = static_cast<GgufType>(t);
    return OkStatus();
  }

  Status ParseKv(uint64_t i) {
    std::string key;
    CHORUS_RETURN_IF_ERROR(ReadString(kMaxKeyLen, "metadata key #" + std::to_string(i), &key));
    const std::string what = "metadata '" + Printable(key) + "'";
    if (impl_->metadata.count(key)) return Fail(StatusCode::kDataLoss, "duplicate " + what);
    GgufValue v;
    CHORUS_RETURN_IF_ERROR(ReadType(what, &v.type));
    if (v.type == GgufType::kArray) {
      CHORUS_RETURN_IF_ERROR(ParseArray(what, &v));
    } else {
      CHORUS_RETURN_IF_ERROR(ParseScalar(what, &v));
    }
    impl_->metadata.emplace(std::move(key), std::move(v));
    return OkStatus();
  }

  Status ParseScalar(const std::string& what, GgufValue* v) {
    if (v->type == GgufType::kString) {
      std::string s;
      CHORUS_RETURN_IF_ERROR(ReadString(UINT64_MAX, what, &s));
      v->value = std::move(s);
    } else if (IsFloat(v->type)) {
      double d;
      if (!ReadFloatScalar(r_, v->type, &d)) return Truncated(what);
      v->value = d;
    } else {
      __int128 x;
      if (!ReadIntScalar(r_, v->type, &x)) return Truncated(what);
      if (v->type == GgufType::kBool && x > 1) {
        return Fail(StatusCode::kDataLoss,
                    what + " is a bool with invalid byte " + std::to_string(static_cast<int>(x)));
      }
      if (IsSignedInt(v->type)) {
        v->value = static_cast<int64_t>(x);
      } else {
        v->value = static_cast<uint64_t>(x);
      }
    }
    return OkStatus();
  }

  Status ParseArray(const std::string& what, GgufValue* v) {
    CHORUS_RETURN_IF_ERROR(ReadType(what + " element", &v->element_type));
    uint64_t n = 0;
    if (!r_.Read(&n)) return Truncated("the length of " + what);
    const GgufType et = v->element_type;
    if (et == GgufType::kArray) {
      return Fail(StatusCode::kUnimplemented, what + " is a nested array (not supported)");
    }
    const uint64_t min_elem = et == GgufType::kString ? 8 : ScalarBytes(et);
    if (n > r_.remaining() / min_elem) {
      return Fail(StatusCode::kDataLoss, what + " has " + std::to_string(n) + " " +
                                             std::string(GgufTypeName(et)) +
                                             " elements, more than the remaining " +
                                             std::to_string(r_.remaining()) + " bytes can hold");
    }
    const size_t count = static_cast<size_t>(n);
    if (et == GgufType::kString) {
      std::vector<std::string> out;
      out.reserve(count);
      for (size_t i = 0; i < count; ++i) {
        std::string s;
        CHORUS_RETURN_IF_ERROR(ReadString(UINT64_MAX, what + " element " + std::to_string(i), &s));
        out.push_back(std::move(s));
      }
      v->value = std::move(out);
    } else if (IsFloat(et)) {
      std::vector<double> out(count);
      for (size_t i = 0; i < count; ++i) {
        if (!ReadFloatScalar(r_, et, &out[i])) return Truncated(what);
      }
      v->value = std::move(out);
    } else {
      std::vector<int64_t> out(count);
      for (size_t i = 0; i < count; ++i) {
        __int128 x;
        if (!ReadIntScalar(r_, et, &x)) return Truncated(what);
        if (et == GgufType::kBool && x > 1) {
          return Fail(StatusCode::kDataLoss, what + " element " + std::to_string(i) +
                                                 " is a bool with invalid byte " +
                                                 std::to_string(static_cast<int>(x)));
        }
        out[i] = static_cast<int64_t>(static_cast<uint64_t>(x));  // uint64 bit-cast
      }
      v->value = std::move(out);
    }
    return OkStatus();
  }

  Status ParseAlignment() {
    auto it = impl_->metadata.find("general.alignment");
    if (it == impl_->metadata.end()) return OkStatus();
    const GgufValue& v = it->second;
    if (v.type != GgufType::kUint32) {
      return Fail(
          StatusCode::kDataLoss,
          "general.alignment has type " + std::string(GgufTypeName(v.type)) + ", expected uint32");
    }
    const uint64_t a = std::get<uint64_t>(v.value);
    if (a == 0 || (a & (a - 1)) != 0) {
      return Fail(StatusCode::kDataLoss,
                  "general.alignment " + std::to_string(a) + " is not a power of two");
    }
    impl_->alignment = static_cast<uint32_t>(a);
    return OkStatus();
  }

  Status ParseTensorInfo(uint64_t i) {
    GgufTensorInfo t;
    CHORUS_RETURN_IF_ERROR(
        ReadString(kMaxTensorNameLen, "the name of tensor #" + std::to_string(i), &t.name));
    if (t.name.empty()) {
      return Fail(StatusCode::kDataLoss, "tensor #" + std::to_string(i) + " has an empty name");
    }
    const std::string what = "tensor '" + Printable(t.name) + "'";
    if (impl_->tensor_index.count(t.name)) {
      return Fail(StatusCode::kDataLoss, "duplicate " + what);
    }
    uint32_t n_dims = 0;
    if (!r_.Read(&n_dims)) return Truncated("the dimensions of " + what);
    if (n_dims > kMaxDims) {
      return Fail(StatusCode::kDataLoss, what + " has " + std::to_string(n_dims) +
                                             " dimensions (at most " + std::to_string(kMaxDims) +
                                             ")");
    }
    uint64_t ne[kMaxDims] = {1, 1, 1, 1};
    // The product of the dimensions, zeros counted as 1, must fit an int64: a zero dimension
    // makes the tensor empty, but the shape is multiplied outermost first elsewhere
    // (TensorView::NumElements), where huge dimensions before the zero would overflow.
    uint64_t n_elems = 1, extent = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      if (!r_.Read(&ne[d])) return Truncated("the shape of " + what);
      if (ne[d] > static_cast<uint64_t>(INT64_MAX) || !CheckedMul(n_elems, ne[d], &n_elems) ||
          !CheckedMul(extent, std::max<uint64_t>(ne[d], 1), &extent) ||
          extent > static_cast<uint64_t>(INT64_MAX)) {
        return Fail(StatusCode::kDataLoss, what + " has an absurd shape (dimension " +
                                               std::to_string(d) + " = " + std::to_string(ne[d]) +
                                               ")");
      }
    }
    // GGUF's ne[] is innermost first; Chorus shapes are outermost first.
    for (uint32_t d = n_dims; d-- > 0;) t.shape.push_back(static_cast<int64_t>(ne[d]));
    if (!r_.Read(&t.ggml_type)) return Truncated("the type of " + what);
    if (t.ggml_type > kMaxGgmlTypeId) {
      return Fail(StatusCode::kDataLoss,
                  what + " has invalid GGML type " + std::to_string(t.ggml_type));
    }
    if (!r_.Read(&t.offset)) return Truncated("the offset of " + what);
    if (t.offset % impl_->alignment != 0) {
      return Fail(StatusCode::kDataLoss, what + " data offset " + std::to_string(t.offset) +
                                             " is not a multiple of the alignment " +
                                             std::to_string(impl_->alignment));
    }
    if (const GgmlTypeTraits* tt = FindGgmlType(t.ggml_type); tt && tt->block_elems > 0) {
      const uint64_t row = n_dims > 0 ? ne[0] : 1;
      if (row % static_cast<uint64_t>(tt->block_elems) != 0) {
        return Fail(StatusCode::kDataLoss, what + " of type " + tt->name + " has rows of " +
                                               std::to_string(row) +
                                               " elements, not a multiple of the block size " +
                                               std::to_string(tt->block_elems));
      }
      if (!CheckedMul(n_elems / static_cast<uint64_t>(tt->block_elems),
                      static_cast<uint64_t>(tt->block_bytes), &t.n_bytes)) {
        return Fail(StatusCode::kDataLoss, what + " byte size overflows");
      }
    }
    impl_->tensor_index.emplace(t.name, impl_->tensors.size());
    impl_->tensors.push_back(std::move(t));
    return OkStatus();
  }

  Status CheckTensorData() {
    const uint64_t file_size = impl_->backing.size;
    uint64_t data_offset = 0;
    if (!AlignUp(r_.pos(), impl_->alignment, &data_offset)) {
      return Fail(StatusCode::kDataLoss, "data section offset overflows");
    }
    impl_->data_offset = data_offset;
    if (impl_->tensors.empty()) return OkStatus();  // vocab-only files may end unpadded
    if (data_offset > file_size) {
      return Fail(StatusCode::kDataLoss, "data section starts at " + std::to_string(data_offset) +
                                             ", past end of file (" + std::to_string(file_size) +
                                             " bytes)");
    }
    const uint64_t data_size = file_size - data_offset;
    for (const GgufTensorInfo& t : impl_->tensors) {
      uint64_t end = 0;
      if (!CheckedAdd(t.offset, t.n_bytes, &end) || end > data_size) {
        return Fail(StatusCode::kDataLoss,
                    "tensor '" + Printable(t.name) + "' data [offset " + std::to_string(t.offset) +
                        ", " + std::to_string(t.n_bytes) +
                        " bytes] extends past end of data section (" + std::to_string(data_size) +
                        " bytes; file " + std::to_string(file_size) + " bytes)");
      }
    }
    std::vector<size_t> order(impl_->tensors.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return impl_->tensors[a].offset < impl_->tensors[b].offset;
    });
    for (size_t k = 1; k < order.size(); ++k) {
      const GgufTensorInfo& prev = impl_->tensors[order[k - 1]];
      const GgufTensorInfo& cur = impl_->tensors[order[k]];
      if (prev.offset + prev.n_bytes > cur.offset) {
        return Fail(StatusCode::kDataLoss, "tensors '" + Printable(prev.name) + "' [" +
                                               std::to_string(prev.offset) + ", " +
                                               std::to_string(prev.offset + prev.n_bytes) +
                                               ") and '" + Printable(cur.name) + "' [" +
                                               std::to_string(cur.offset) + ", ...) overlap");
      }
    }
    return OkStatus();
  }

  GgufFile::Impl* impl_;
  ByteReader r_;
};

Result<std::shared_ptr<const GgufFile>> ParseGguf(std::unique_ptr<GgufFile::Impl> impl) {
  CHORUS_RETURN_IF_ERROR(Parser(impl.get()).Parse());
  return std::shared_ptr<const GgufFile>(std::make_shared<GgufFile>(std::move(impl)));
}

}  // namespace

GgufFile::GgufFile(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GgufFile::~GgufFile() = default;

Result<std::shared_ptr<const GgufFile>> GgufFile::Open(const std::string& path) {
  CHORUS_ASSIGN_OR_RETURN(std::shared_ptr<const MappedFile> mf, MappedFile::Open(path));
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  impl->backing.data = mf->data();
  impl->backing.size = mf->size();
  impl->backing.keepalive = std::move(mf);
  return ParseGguf(std::move(impl));
}

Result<std::shared_ptr<const GgufFile>> GgufFile::FromBytes(std::string name, std::string bytes) {
  auto owned = std::make_shared<const std::string>(std::move(bytes));
  auto impl = std::make_unique<Impl>();
  impl->path = std::move(name);
  impl->backing.data = reinterpret_cast<const uint8_t*>(owned->data());
  impl->backing.size = owned->size();
  impl->backing.keepalive = std::move(owned);
  return ParseGguf(std::move(impl));
}

const std::string& GgufFile::path() const { return impl_->path; }
uint32_t GgufFile::version() const { return impl_->version; }
const std::map<std::string, GgufValue>& GgufFile::metadata() const { return impl_->metadata; }
const std::vector<GgufTensorInfo>& GgufFile::tensors() const { return impl_->tensors; }
uint32_t GgufFile::alignment() const { return impl_->alignment; }
bool GgufFile::Has(const std::string& key) const { return impl_->metadata.count(key) > 0; }

namespace {

Result<const GgufValue*> Lookup(const GgufFile::Impl& impl, const std::string& key) {
  auto it = impl.metadata.find(key);
  if (it == impl.metadata.end()) {
    return NotFoundError(impl.path + ": no metadata key '" + key + "'");
  }
  return &it->second;
}

Status WrongType(const GgufFile::Impl& impl, const std::string& key, const GgufValue& v,
                 const char* wanted) {
  std::string have(GgufTypeName(v.type));
  if (v.type == GgufType::kArray) have += " of " + std::string(GgufTypeName(v.element_type));
  return InvalidArgumentError(impl.path + ": metadata '" + key + "' is " + have + ", expected " +
                              wanted);
}

}  // namespace

Result<std::string> GgufFile::GetString(const std::string& key) const {
  CHORUS_ASSIGN_OR_RETURN(const GgufValue* v, Lookup(*impl_, key));
  if (v->type != GgufType::kString) return WrongType(*impl_, key, *v, "string");
  return std::get<std::string>(v->value);
}

Result<int64_t> GgufFile::GetInt(const std::string& key) const {
  CHORUS_ASSIGN_OR_RETURN(const GgufValue* v, Lookup(*impl_, key));
  if (IsSignedInt(v->type)) return std::get<int64_t>(v->value);
  if (IsUnsignedIntOrBool(v->type)) {
    const uint64_t u = std::get<uint64_t>(v->value);
    if (u > static_cast<uint64_t>(INT64_MAX)) {
      return InvalidArgumentError(impl_->path + ": metadata '" + key + "' = " + std::to_string(u) +
                                  " does not fit in int64");
    }
    return static_cast<int64_t>(u);
  }
  return WrongType(*impl_, key, *v, "an integer");
}

Result<double> GgufFile::GetFloat(const std::string& key) const {
  CHORUS_ASSIGN_OR_RETURN(const GgufValue* v, Lookup(*impl_, key));
  if (IsFloat(v->type)) return std::get<double>(v->value);
  if (IsSignedInt(v->type)) return static_cast<double>(std::get<int64_t>(v->value));
  if (IsUnsignedIntOrBool(v->type)) return static_cast<double>(std::get<uint64_t>(v->value));
  return WrongType(*impl_, key, *v, "a number");
}

Result<std::vector<std::string>> GgufFile::GetStringArray(const std::string& key) const {
  CHORUS_ASSIGN_OR_RETURN(const GgufValue* v, Lookup(*impl_, key));
  if (v->type != GgufType::kArray || v->element_type != GgufType::kString) {
    return WrongType(*impl_, key, *v, "an array of strings");
  }
  return std::get<std::vector<std::string>>(v->value);
}

Result<std::vector<double>> GgufFile::GetFloatArray(const std::string& key) const {
  CHORUS_ASSIGN_OR_RETURN(const GgufValue* v, Lookup(*impl_, key));
  if (v->type == GgufType::kArray && IsFloat(v->element_type)) {
    return std::get<std::vector<double>>(v->value);
  }
  if (v->type == GgufType::kArray && IsIntegral(v->element_type)) {
    const auto& ints = std::get<std::vector<int64_t>>(v->value);
    std::vector<double> out(ints.size());
    const bool u64 = v->element_type == GgufType::kUint64;
    for (size_t i = 0; i < ints.size(); ++i) {
      out[i] =
          u64 ? static_cast<double>(static_cast<uint64_t>(ints[i])) : static_cast<double>(ints[i]);
    }
    return out;
  }
  return WrongType(*impl_, key, *v, "an array of numbers");
}

Result<std::vector<int64_t>> GgufFile::GetIntArray(const std::string& key) const {
  CHORUS_ASSIGN_OR_RETURN(const GgufValue* v, Lookup(*impl_, key));
  if (v->type != GgufType::kArray || !IsIntegral(v->element_type)) {
    return WrongType(*impl_, key, *v, "an array of integers");
  }
  return std::get<std::vector<int64_t>>(v->value);
}

const GgufTensorInfo* GgufFile::FindTensor(const std::string& name) const {
  auto it = impl_->tensor_index.find(name);
  return it == impl_->tensor_index.end() ? nullptr : &impl_->tensors[it->second];
}

Result<Tensor> GgufFile::GetTensor(const std::string& name) const {
  const GgufTensorInfo* info = FindTensor(name);
  if (info == nullptr) {
    return NotFoundError(impl_->path + ": no tensor '" + Printable(name, 200) + "'");
  }
  auto dtype = GgmlTypeToDType(info->ggml_type);
  if (!dtype.ok()) {
    return dtype.status().WithContext(impl_->path + ": tensor '" + info->name + "'");
  }
  TensorView view;
  view.dtype = *dtype;
  view.shape = info->shape;
  view.data = impl_->backing.data + impl_->data_offset + info->offset;
  // Kernels read elements through typed pointers: f32/i32 need 4-byte alignment, f16/bf16 and
  // the Q blocks (which start with an f16 scale) 2. Only an unusual general.alignment (< 4) can
  // break that; then the tensor is copied to an aligned heap buffer.
  const uintptr_t need = DTypeBlockBytes(*dtype) == 4 ? 4 : (*dtype == DType::kI8 ? 1 : 2);
  if (reinterpret_cast<uintptr_t>(view.data) % need != 0) {
    Tensor copy = Tensor::Zeros(view.dtype, view.shape);
    std::memcpy(copy.mutable_data(), view.data, static_cast<size_t>(info->n_bytes));
    return copy;
  }
  return Tensor(std::move(view), impl_->backing.keepalive);
}

// ---------------------------------------------------------------------------------------------
// Writer

void GgufWriter::Set(const std::string& key, GgufValue v) {
  for (Entry& e : kv_) {
    if (e.key == key) {
      e.value = std::move(v);
      return;
    }
  }
  kv_.push_back(Entry{key, std::move(v)});
}

void GgufWriter::SetString(const std::string& key, std::string v) {
  Set(key, GgufValue::String(std::move(v)));
}
void GgufWriter::SetUint32(const std::string& key, uint32_t v) {
  Set(key, GgufValue::Uint(GgufType::kUint32, v));
}
void GgufWriter::SetInt32(const std::string& key, int32_t v) {
  Set(key, GgufValue::Int(GgufType::kInt32, v));
}
void GgufWriter::SetFloat32(const std::string& key, float v) {
  Set(key, GgufValue::Float(GgufType::kFloat32, v));
}
void GgufWriter::SetBool(const std::string& key, bool v) {
  Set(key, GgufValue::Uint(GgufType::kBool, v ? 1 : 0));
}
void GgufWriter::SetStringArray(const std::string& key, std::vector<std::string> v) {
  Set(key, GgufValue::StringArray(std::move(v)));
}
void GgufWriter::SetFloat32Array(const std::string& key, std::vector<float> v) {
  Set(key, GgufValue::FloatArray(GgufType::kFloat32, std::vector<double>(v.begin(), v.end())));
}
void GgufWriter::SetInt32Array(const std::string& key, std::vector<int32_t> v) {
  Set(key, GgufValue::IntArray(GgufType::kInt32, std::vector<int64_t>(v.begin(), v.end())));
}

void GgufWriter::AddTensor(const std::string& name, Tensor t) {
  tensors_.emplace_back(name, std::move(t));
}

namespace {

Status WriteValue(ByteWriter& w, const std::string& key, const GgufValue& v) {
  auto bad = [&](const std::string& why) {
    return InvalidArgumentError("GGUF metadata '" + key + "': " + why);
  };
  auto write_string = [&](const std::string& s) {
    w.Write<uint64_t>(s.size());
    w.WriteBytes(s);
  };
  auto write_int = [&](GgufType t, __int128 x) -> Status {
    __int128 lo, hi;
    IntRange(t, &lo, &hi);
    if (x < lo || x > hi) return bad("value out of range for " + std::string(GgufTypeName(t)));
    WriteIntScalar(w, t, x);
    return OkStatus();
  };
  if (static_cast<uint32_t>(v.type) > static_cast<uint32_t>(GgufType::kFloat64)) {
    return bad("invalid type");
  }
  w.Write<uint32_t>(static_cast<uint32_t>(v.type));
  if (v.type == GgufType::kString) {
    const auto* s = std::get_if<std::string>(&v.value);
    if (s == nullptr) return bad("string type without a string value");
    write_string(*s);
    return OkStatus();
  }
  if (IsFloat(v.type)) {
    const auto* d = std::get_if<double>(&v.value);
    if (d == nullptr) return bad("float type without a double value");
    if (v.type == GgufType::kFloat32) {
      w.Write(static_cast<float>(*d));
    } else {
      w.Write(*d);
    }
    return OkStatus();
  }
  if (IsSignedInt(v.type)) {
    const auto* x = std::get_if<int64_t>(&v.value);
    if (x == nullptr) return bad("signed type without an int64 value");
    return write_int(v.type, *x);
  }
  if (IsUnsignedIntOrBool(v.type)) {
    const auto* x = std::get_if<uint64_t>(&v.value);
    if (x == nullptr) return bad("unsigned type without a uint64 value");
    return write_int(v.type, *x);
  }
  // Array.
  const GgufType et = v.element_type;
  if (et == GgufType::kArray || static_cast<uint32_t>(et) > 12) {
    return bad("invalid array element type");
  }
  w.Write<uint32_t>(static_cast<uint32_t>(et));
  if (et == GgufType::kString) {
    const auto* a = std::get_if<std::vector<std::string>>(&v.value);
    if (a == nullptr) return bad("string array without strings");
    w.Write<uint64_t>(a->size());
    for (const auto& s : *a) write_string(s);
  } else if (IsFloat(et)) {
    const auto* a = std::get_if<std::vector<double>>(&v.value);
    if (a == nullptr) return bad("float array without doubles");
    w.Write<uint64_t>(a->size());
    for (double d : *a) {
      if (et == GgufType::kFloat32) {
        w.Write(static_cast<float>(d));
      } else {
        w.Write(d);
      }
    }
  } else {
    const auto* a = std::get_if<std::vector<int64_t>>(&v.value);
    if (a == nullptr) return bad("integer array without int64 values");
    w.Write<uint64_t>(a->size());
    for (int64_t x : *a) {
      // uint64 elements are stored bit-cast in int64.
      const __int128 wide = et == GgufType::kUint64
                                ? static_cast<__int128>(static_cast<uint64_t>(x))
                                : static_cast<__int128>(x);
      CHORUS_RETURN_IF_ERROR(write_int(et, wide));
    }
  }
  return OkStatus();
}

}  // namespace

Result<GgufWriter::Layout> GgufWriter::Plan() const {
  uint64_t alignment = kDefaultAlignment;
  for (const Entry& e : kv_) {
    if (e.key != "general.alignment") continue;
    const auto* a = std::get_if<uint64_t>(&e.value.value);
    if (e.value.type != GgufType::kUint32 || a == nullptr || *a == 0 || (*a & (*a - 1)) != 0) {
      return InvalidArgumentError("GGUF general.alignment must be a uint32 power of two");
    }
    alignment = *a;
  }
  std::string out;
  ByteWriter w(&out);
  w.WriteBytes("GGUF");
  w.Write<uint32_t>(3);
  w.Write<uint64_t>(tensors_.size());
  w.Write<uint64_t>(kv_.size());
  for (const Entry& e : kv_) {
    if (e.key.size() > kMaxKeyLen) return InvalidArgumentError("GGUF metadata key too long");
    w.Write<uint64_t>(e.key.size());
    w.WriteBytes(e.key);
    CHORUS_RETURN_IF_ERROR(WriteValue(w, e.key, e.value));
  }
  // Tensor infos, with offsets laid out in order, each aligned.
  std::map<std::string, int> seen;
  uint64_t offset = 0;
  std::vector<uint64_t> offsets;
  for (const auto& [name, t] : tensors_) {
    const std::string what = "GGUF tensor '" + name + "'";
    if (name.empty()) return InvalidArgumentError("GGUF tensor with an empty name");
    if (name.size() > kMaxTensorNameLen) return InvalidArgumentError(what + ": name too long");
    if (!seen.emplace(name, 0).second) return InvalidArgumentError("duplicate " + what);
    auto ggml_type = DTypeToGgmlType(t.dtype());
    if (!ggml_type.ok()) return ggml_type.status().WithContext(what);
    const auto& shape = t.shape();
    if (shape.size() > kMaxDims) {
      return InvalidArgumentError(what + " has more than 4 dimensions");
    }
    for (int64_t d : shape) {
      if (d < 0) return InvalidArgumentError(what + " has a negative dimension");
    }
    if (DTypeIsQuantized(t.dtype()) && t.view().cols() % DTypeBlockElems(t.dtype()) != 0) {
      return InvalidArgumentError(what + ": rows of " + std::to_string(t.view().cols()) +
                                  " elements are not a multiple of " +
                                  std::to_string(DTypeBlockElems(t.dtype())));
    }
    if (t.view().NumBytes() > 0 && t.data() == nullptr) {
      return InvalidArgumentError(what + " has no data");
    }
    w.Write<uint64_t>(name.size());
    w.WriteBytes(name);
    w.Write<uint32_t>(static_cast<uint32_t>(shape.size()));
    for (size_t d = shape.size(); d-- > 0;) w.Write<uint64_t>(static_cast<uint64_t>(shape[d]));
    w.Write<uint32_t>(*ggml_type);
    w.Write<uint64_t>(offset);
    offsets.push_back(offset);
    offset += static_cast<uint64_t>(t.view().NumBytes());
    offset = (offset + alignment - 1) / alignment * alignment;
  }
  if (!tensors_.empty()) w.PadTo(alignment);
  return Layout{std::move(out), std::move(offsets), offset, alignment};
}

std::vector<std::string_view> GgufWriter::Pieces(const Layout& layout,
                                                 std::string_view zeros) const {
  std::vector<std::string_view> pieces = {layout.header};
  uint64_t at = 0;  // bytes of the data section so far
  for (size_t i = 0; i < tensors_.size(); ++i) {
    pieces.push_back(zeros.substr(0, static_cast<size_t>(layout.offsets[i] - at)));
    const Tensor& t = tensors_[i].second;
    const auto n = static_cast<size_t>(t.view().NumBytes());
    if (n > 0) pieces.emplace_back(static_cast<const char*>(t.data()), n);
    at = layout.offsets[i] + n;
  }
  pieces.push_back(zeros.substr(0, static_cast<size_t>(layout.data_bytes - at)));
  return pieces;
}

Result<std::string> GgufWriter::Serialize() const {
  CHORUS_ASSIGN_OR_RETURN(Layout layout, Plan());
  // Every padding is shorter than the alignment.
  const std::string zeros(static_cast<size_t>(layout.alignment - 1), '\0');
  std::string out;
  out.reserve(layout.header.size() + layout.data_bytes);
  for (std::string_view piece : Pieces(layout, zeros)) out.append(piece);
  return out;
}

Status GgufWriter::Write(const std::string& path) const {
  // Streamed: the header, then each tensor's bytes from where they live (a model's mapping or its
  // buffers), with zero padding between — the file is never assembled in memory.
  CHORUS_ASSIGN_OR_RETURN(Layout layout, Plan());
  const std::string zeros(static_cast<size_t>(layout.alignment - 1), '\0');
  return WriteFileAtomically(path, Pieces(layout, zeros));
}

}  // namespace chorus::formats
