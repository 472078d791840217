// GGUF v3 reader and writer (llama.cpp's file format), bounds-checked.
//
// Tensors are returned as views into the mmapped file (used in place, not converted). Shapes are
// outermost first, i.e. the reverse of GGUF's ne[] order: a GGUF matrix with ne = {k, n} is a
// TensorView with shape {n, k}. Supported tensor types: F32, F16, BF16, Q8_0, Q4_0; other
// types are listed by Open() but GetTensor() returns kUnimplemented naming the type.
//
// Thread-safety: GgufFile is immutable after Open(); GgufWriter is single-threaded.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "chorus/base/mapped_file.h"
#include "chorus/base/status.h"
#include "chorus/tensor/tensor.h"

namespace chorus::formats {

// GGUF metadata value types (numbering from the GGUF spec).
enum class GgufType : uint32_t {
  kUint8 = 0, kInt8 = 1, kUint16 = 2, kInt16 = 3, kUint32 = 4, kInt32 = 5, kFloat32 = 6,
  kBool = 7, kString = 8, kArray = 9, kUint64 = 10, kInt64 = 11, kFloat64 = 12,
};

// One metadata value. Scalars hold one element; arrays hold element_type and the vectors.
struct GgufValue {
  GgufType type = GgufType::kUint32;
  GgufType element_type = GgufType::kUint32;  // for kArray
  // Integers (all widths, bools) are widened to int64/uint64, floats to double.
  std::variant<int64_t, uint64_t, double, std::string, std::vector<int64_t>, std::vector<double>,
               std::vector<std::string>>
      value;
};

struct GgufTensorInfo {
  std::string name;
  std::vector<int64_t> shape;  // outermost first
  uint32_t ggml_type = 0;      // raw GGML type id
  uint64_t offset = 0;         // relative to the data section
};

class GgufFile {
 public:
  // Opens and validates the header, metadata and tensor table (every offset and size within
  // the file; absurd counts rejected before any allocation). Errors name the file.
  static Result<std::shared_ptr<const GgufFile>> Open(const std::string& path);

  const std::string& path() const;
  uint32_t version() const;
  const std::map<std::string, GgufValue>& metadata() const;
  const std::vector<GgufTensorInfo>& tensors() const;
  uint32_t alignment() const;

  bool Has(const std::string& key) const;
  // Typed getters: kNotFound if absent, kInvalidArgument if the type does not fit.
  Result<std::string> GetString(const std::string& key) const;
  Result<int64_t> GetInt(const std::string& key) const;  // any integer or bool type
  Result<double> GetFloat(const std::string& key) const;  // any float or integer type
  Result<std::vector<std::string>> GetStringArray(const std::string& key) const;
  Result<std::vector<double>> GetFloatArray(const std::string& key) const;
  Result<std::vector<int64_t>> GetIntArray(const std::string& key) const;

  // A view into the mapped file, kept alive by the returned Tensor.
  Result<Tensor> GetTensor(const std::string& name) const;

  // (implementation-defined members follow)
  struct Impl;
  explicit GgufFile(std::unique_ptr<Impl> impl);
  ~GgufFile();

 private:
  std::unique_ptr<Impl> impl_;
};

// Writes a GGUF v3 file atomically (temp file + rename). Tensor data aligned to 32 bytes
// (general.alignment written when different).
class GgufWriter {
 public:
  void SetString(const std::string& key, std::string v);
  void SetUint32(const std::string& key, uint32_t v);
  void SetInt32(const std::string& key, int32_t v);
  void SetFloat32(const std::string& key, float v);
  void SetBool(const std::string& key, bool v);
  void SetStringArray(const std::string& key, std::vector<std::string> v);
  void SetFloat32Array(const std::string& key, std::vector<float> v);
  void SetInt32Array(const std::string& key, std::vector<int32_t> v);
  // `t` is written in its own dtype (F32, F16, BF16, Q8_0, Q4_0); shape outermost first.
  void AddTensor(const std::string& name, Tensor t);
  Status Write(const std::string& path) const;

 private:
  struct Entry {
    std::string key;
    GgufValue value;
  };
  std::vector<Entry> kv_;
  std::vector<std::pair<std::string, Tensor>> tensors_;
};

}  // namespace chorus::formats
