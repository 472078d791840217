// GGUF v3 reader and writer (llama.cpp's file format), bounds-checked. v2 files (same layout)
// are read too; v1 and big-endian files are refused.
//
// Tensors are returned as views into the mmapped file (used in place, not converted). Shapes are
// outermost first, i.e. the reverse of GGUF's ne[] order: a GGUF matrix with ne = {k, n} is a
// TensorView with shape {n, k}. Supported tensor types: F32, F16, BF16, Q8_0, Q4_0 (and I8,
// I32); other types are listed by Open() but GetTensor() returns kUnimplemented naming the type.
//
// Validation in Open(): magic and version; counts of metadata entries, tensors and array
// elements checked against the bytes left before anything is allocated; key and name lengths;
// value types; bool bytes; no nested arrays; unique keys and tensor names; general.alignment a
// uint32 power of two; at most 4 dims, no shape overflow; quantized rows a multiple of the block;
// every tensor offset aligned, its data inside the file and not overlapping another's.
//
// Thread-safety: GgufFile is immutable after Open(); GgufWriter is single-threaded.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "chorus/base/mapped_file.h"
#include "chorus/base/status.h"
#include "chorus/tensor/tensor.h"

namespace chorus::formats {

// GGUF metadata value types (numbering from the GGUF spec).
enum class GgufType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

// "uint32", "string", "array", ... (for messages).
std::string_view GgufTypeName(GgufType t);

// One metadata value. Scalars hold one element; arrays hold element_type and the vectors.
struct GgufValue {
  GgufType type = GgufType::kUint32;
  GgufType element_type = GgufType::kUint32;  // for kArray
  // Integers (all widths, bools) are widened to int64/uint64, floats to double.
  // Scalars: signed ints -> int64_t; unsigned ints and bool (0/1) -> uint64_t; floats -> double;
  // string -> std::string. Arrays: any integer or bool element type -> std::vector<int64_t>
  // (uint64 elements bit-cast), floats -> std::vector<double>, strings ->
  // std::vector<std::string>. Nested arrays are not supported (kUnimplemented on read).
  std::variant<int64_t, uint64_t, double, std::string, std::vector<int64_t>, std::vector<double>,
               std::vector<std::string>>
      value;

  // Constructors for the writer and tests.
  static GgufValue Int(GgufType t, int64_t v);    // t: any signed integer type
  static GgufValue Uint(GgufType t, uint64_t v);  // t: any unsigned integer type or kBool
  static GgufValue Float(GgufType t, double v);   // t: kFloat32 or kFloat64
  static GgufValue String(std::string v);
  static GgufValue IntArray(GgufType element, std::vector<int64_t> v);  // integer/bool elements
  static GgufValue FloatArray(GgufType element, std::vector<double> v);
  static GgufValue StringArray(std::vector<std::string> v);
  // Number of elements of an array (1 for a scalar).
  size_t size() const;
};

// Bit-exact equality (floats compared by value, NaN equal to NaN) — for round-trip tests.
bool operator==(const GgufValue& a, const GgufValue& b);

struct GgufTensorInfo {
  std::string name;
  std::vector<int64_t> shape;  // outermost first
  uint32_t ggml_type = 0;      // raw GGML type id
  uint64_t offset = 0;         // relative to the data section
  // Size of the data in bytes; 0 when the type's block size is unknown to Chorus (then only the
  // offset was checked against the file).
  uint64_t n_bytes = 0;
};

// GGML type ids (ggml.h enum ggml_type) of the types Chorus reads and writes.
inline constexpr uint32_t kGgmlF32 = 0, kGgmlF16 = 1, kGgmlQ4_0 = 2, kGgmlQ8_0 = 8, kGgmlI8 = 24,
                          kGgmlI32 = 26, kGgmlBF16 = 30, kGgmlQ2_K = 10, kGgmlQ3_K = 11,
                          kGgmlQ4_K = 12, kGgmlQ5_K = 13, kGgmlQ6_K = 14;
// "F32", "Q4_K", ... or "type<id>" for an id Chorus does not know.
std::string GgmlTypeName(uint32_t ggml_type);
// The Chorus dtype of a GGML type (F32, F16, BF16, Q8_0, Q4_0, I8, I32), else kUnimplemented.
Result<DType> GgmlTypeToDType(uint32_t ggml_type);
// The GGML type id of a Chorus dtype; kUnimplemented for U8 (GGML has no u8 type).
Result<uint32_t> DTypeToGgmlType(DType dtype);

class GgufFile {
 public:
  // Opens and validates the header, metadata and tensor table (every offset and size within
  // the file; absurd counts rejected before any allocation). Errors name the file.
  static Result<std::shared_ptr<const GgufFile>> Open(const std::string& path);
  // The same, over bytes already in memory (fuzzers, tests); `name` is used in messages.
  static Result<std::shared_ptr<const GgufFile>> FromBytes(std::string name, std::string bytes);

  const std::string& path() const;
  uint32_t version() const;
  const std::map<std::string, GgufValue>& metadata() const;
  const std::vector<GgufTensorInfo>& tensors() const;
  uint32_t alignment() const;

  bool Has(const std::string& key) const;
  // Typed getters: kNotFound if absent, kInvalidArgument if the type does not fit.
  Result<std::string> GetString(const std::string& key) const;
  Result<int64_t> GetInt(const std::string& key) const;   // any integer or bool type
  Result<double> GetFloat(const std::string& key) const;  // any float or integer type
  Result<std::vector<std::string>> GetStringArray(const std::string& key) const;
  Result<std::vector<double>> GetFloatArray(const std::string& key) const;
  Result<std::vector<int64_t>> GetIntArray(const std::string& key) const;

  // A view into the mapped file, kept alive by the returned Tensor. (When the data is not
  // aligned to its element size — possible only with general.alignment < 4 — a heap copy.)
  Result<Tensor> GetTensor(const std::string& name) const;
  const GgufTensorInfo* FindTensor(const std::string& name) const;  // nullptr if absent

  // (implementation-defined members follow)
  struct Impl;
  explicit GgufFile(std::unique_ptr<Impl> impl);
  ~GgufFile();

 private:
  std::unique_ptr<Impl> impl_;
};

// Writes a GGUF v3 file atomically (temp file + rename). Tensor data aligned to 32 bytes, or to
// general.alignment when that key is set (a uint32 power of two). Metadata is written in the
// order keys were first set; setting a key again replaces its value. Tensors are written in the
// order added.
class GgufWriter {
 public:
  void Set(const std::string& key, GgufValue v);
  void SetString(const std::string& key, std::string v);
  void SetUint32(const std::string& key, uint32_t v);
  void SetInt32(const std::string& key, int32_t v);
  void SetFloat32(const std::string& key, float v);
  void SetBool(const std::string& key, bool v);
  void SetStringArray(const std::string& key, std::vector<std::string> v);
  void SetFloat32Array(const std::string& key, std::vector<float> v);
  void SetInt32Array(const std::string& key, std::vector<int32_t> v);
  // `t` is written in its own dtype (F32, F16, BF16, Q8_0, Q4_0); shape outermost first.
  // Also I8 and I32. U8 is refused by Write() (GGML has no u8 type).
  void AddTensor(const std::string& name, Tensor t);
  // Writes the file atomically, each tensor's bytes straight from its buffer or mapping (peak
  // memory: the header, not the file).
  Status Write(const std::string& path) const;
  // The file's bytes. Errors: duplicate tensor names, empty names, unsupported dtypes,
  // quantized rows not a multiple of 32, values that do not fit their declared type.
  Result<std::string> Serialize() const;

 private:
  struct Entry {
    std::string key;
    GgufValue value;
  };
  // The file without its tensor data: the header (metadata, tensor infos, padding to the data
  // section), each tensor's offset in the data section, the section's size (padded) and the
  // alignment (≥ 1).
  struct Layout {
    std::string header;
    std::vector<uint64_t> offsets;
    uint64_t data_bytes = 0;
    uint64_t alignment = 1;
  };
  // Validates everything Serialize() and Write() write.
  Result<Layout> Plan() const;
  // The file as consecutive pieces: the header, then per tensor its padding (from `zeros`, at
  // least alignment − 1 bytes) and its bytes, then the final padding.
  std::vector<std::string_view> Pieces(const Layout& layout, std::string_view zeros) const;
  std::vector<Entry> kv_;
  std::vector<std::pair<std::string, Tensor>> tensors_;
};

}  // namespace chorus::formats
