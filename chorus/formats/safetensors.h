// safetensors reader/writer (Hugging Face), bounds-checked; sharded checkpoints through
// model.safetensors.index.json.
//
// Tensors are views into the mmapped file. Dtypes F32, F16, BF16 are usable for weights;
// I8/U8/I32 are readable; anything else is listed but GetTensor() returns kUnimplemented.
//
// Thread-safety: immutable after Open().
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "chorus/base/mapped_file.h"
#include "chorus/base/status.h"
#include "chorus/tensor/tensor.h"

namespace chorus::formats {

struct SafetensorsTensorInfo {
  std::string name;
  std::string dtype;            // as written in the header, e.g. "BF16"
  std::vector<int64_t> shape;   // outermost first
  uint64_t begin = 0, end = 0;  // byte offsets relative to the data section
};

class SafetensorsFile {
 public:
  // Validates the header (size limit 100 MiB, JSON, offsets inside the file, non-overlapping,
  // byte size = product(shape) × dtype size). Errors name the file and the tensor.
  // The data offsets must tile the data section exactly (sorted, no gaps, no overlap, ending at
  // end of file) as the reference implementation requires; duplicate names are rejected.
  static Result<std::shared_ptr<const SafetensorsFile>> Open(const std::string& path);
  // The same over bytes in memory (fuzzers, tests); `name` is used in messages.
  static Result<std::shared_ptr<const SafetensorsFile>> FromBytes(std::string name,
                                                                  std::string bytes);

  const std::string& path() const;
  const std::vector<SafetensorsTensorInfo>& tensors() const;   // in data-offset order
  const std::map<std::string, std::string>& metadata() const;  // "__metadata__"
  bool Has(const std::string& name) const;
  // A view into the file (a heap copy if the data is not aligned to its element size).
  Result<Tensor> GetTensor(const std::string& name) const;

  struct Impl;
  explicit SafetensorsFile(std::unique_ptr<Impl> impl);
  ~SafetensorsFile();

 private:
  std::unique_ptr<Impl> impl_;
};

// One model's tensors across one or more safetensors files: a directory with
// model.safetensors, or model.safetensors.index.json + shards (weight_map), or one file path.
// (A directory holding only adapter_model.safetensors — a PEFT adapter — also works.) Shard
// names in the index must be plain file names in the index's directory; every tensor the
// weight_map names must be in its shard.
class SafetensorsModel {
 public:
  static Result<std::shared_ptr<const SafetensorsModel>> Open(const std::string& path);
  const std::vector<std::shared_ptr<const SafetensorsFile>>& files() const { return files_; }
  std::vector<std::string> TensorNames() const;  // sorted
  bool Has(const std::string& name) const;
  Result<Tensor> GetTensor(const std::string& name) const;

 private:
  std::vector<std::shared_ptr<const SafetensorsFile>> files_;
  std::map<std::string, size_t> where_;  // tensor name -> index in files_
};

// Writes `tensors` (F32, F16 or BF16) atomically, in the given order, with optional metadata.
// Also I8, U8, I32; quantized dtypes are refused (kUnimplemented). Names must be unique,
// non-empty, valid UTF-8 and not "__metadata__".
Status WriteSafetensors(const std::string& path,
                        const std::vector<std::pair<std::string, Tensor>>& tensors,
                        const std::map<std::string, std::string>& metadata = {});
Result<std::string> SerializeSafetensors(const std::vector<std::pair<std::string, Tensor>>& tensors,
                                         const std::map<std::string, std::string>& metadata = {});

// Writes a sharded checkpoint into directory `dir` (which must exist): shards
// model-00001-of-0000N.safetensors of at most `max_shard_bytes` of tensor data each (a larger
// tensor gets a shard of its own), and model.safetensors.index.json with
// {"metadata": {"total_size": ...}, "weight_map": {name: shard}}. `metadata` goes into every
// shard's __metadata__. Returns the shards' file names, in order.
Result<std::vector<std::string>> WriteSafetensorsSharded(
    const std::string& dir, const std::vector<std::pair<std::string, Tensor>>& tensors,
    uint64_t max_shard_bytes, const std::map<std::string, std::string>& metadata = {});

// Safetensors dtype names ("F32", "BF16", ...) to/from Chorus dtypes (F32, F16, BF16, I8, U8,
// I32); others are kUnimplemented.
Result<DType> SafetensorsDTypeToDType(std::string_view name);
Result<std::string> DTypeToSafetensorsDType(DType dtype);

}  // namespace chorus::formats
