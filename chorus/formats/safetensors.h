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
#include <vector>

#include "chorus/base/mapped_file.h"
#include "chorus/base/status.h"
#include "chorus/tensor/tensor.h"

namespace chorus::formats {

struct SafetensorsTensorInfo {
  std::string name;
  std::string dtype;           // as written in the header, e.g. "BF16"
  std::vector<int64_t> shape;  // outermost first
  uint64_t begin = 0, end = 0; // byte offsets relative to the data section
};

class SafetensorsFile {
 public:
  // Validates the header (size limit 100 MiB, JSON, offsets inside the file, non-overlapping,
  // byte size = product(shape) × dtype size). Errors name the file and the tensor.
  static Result<std::shared_ptr<const SafetensorsFile>> Open(const std::string& path);

  const std::string& path() const;
  const std::vector<SafetensorsTensorInfo>& tensors() const;
  const std::map<std::string, std::string>& metadata() const;  // "__metadata__"
  bool Has(const std::string& name) const;
  Result<Tensor> GetTensor(const std::string& name) const;

  struct Impl;
  explicit SafetensorsFile(std::unique_ptr<Impl> impl);
  ~SafetensorsFile();

 private:
  std::unique_ptr<Impl> impl_;
};

// One model's tensors across one or more safetensors files: a directory with
// model.safetensors, or model.safetensors.index.json + shards (weight_map), or one file path.
class SafetensorsModel {
 public:
  static Result<std::shared_ptr<const SafetensorsModel>> Open(const std::string& path);
  std::vector<std::string> TensorNames() const;  // sorted
  bool Has(const std::string& name) const;
  Result<Tensor> GetTensor(const std::string& name) const;

 private:
  std::vector<std::shared_ptr<const SafetensorsFile>> files_;
  std::map<std::string, size_t> where_;  // tensor name -> index in files_
};

// Writes `tensors` (F32, F16 or BF16) atomically, in the given order, with optional metadata.
Status WriteSafetensors(const std::string& path,
                        const std::vector<std::pair<std::string, Tensor>>& tensors,
                        const std::map<std::string, std::string>& metadata = {});

}  // namespace chorus::formats
