// Compressed full-model deltas in memory and on disk (docs/deltas.md): a fine-tune stored as
// Δ̃ ≈ W_ft − W_base against one base model, identified by the content hash of that base's
// weights.
//
//   * Linear matrices (q/k/v/o/gate/up/down of every layer): packed codes, 2:4 patterns and
//     scales (delta_codec.h), the codes zstd-compressed where that saves ≥ 3 %.
//   * Every other tensor the fine-tune changed (embeddings, output head, norms): an "extra"
//     delta, exact f32 for vectors, and for matrices exact f32 or int8 with one f32 scale per row.
//
// The container is safetensors (formats/safetensors.h, whose reader bounds-checks the header
// and offsets); this module checks everything the container does not: every tensor accounted
// for, shapes and byte counts consistent with the metadata, pattern bytes and padding valid,
// scales finite, zstd frames of the announced size.
//
// Thread-safety: value types and functions; the Model is shared and immutable.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "chorus/adapters/delta/delta_codec.h"
#include "chorus/base/status.h"
#include "chorus/model/model.h"

namespace chorus::formats {
class SafetensorsFile;
}

namespace chorus::delta {

inline constexpr int kDeltaFormatVersion = 1;
inline constexpr const char* kDeltaFormatName = "chorus-delta";
// The file inside a delta directory.
inline constexpr const char* kDeltaFileName = "delta.safetensors";

enum class Method { kRtn, kDeltaZip, kBitDelta };
const char* MethodName(Method m);  // "rtn", "deltazip", "bitdelta"
Result<Method> ParseMethod(const std::string& name);

struct MatrixDelta {
  std::string
      name;  // the base tensor (Hugging Face naming), e.g. model.layers.0.mlp.up_proj.weight
  PackedMatrix packed;
  bool zstd = false;  // as read: whether the file held the codes zstd-compressed
};

struct ExtraDelta {
  enum class Kind { kExactF32, kInt8Rows };
  std::string name;  // the base tensor
  Kind kind = Kind::kExactF32;
  std::vector<int64_t> shape;     // the base tensor's shape (1-D or 2-D)
  std::vector<float> values;      // kExactF32: the delta, product(shape) values
  std::vector<int8_t> q;          // kInt8Rows: [rows, cols] codes
  std::vector<float> row_scales;  // kInt8Rows: [rows]; value = q · scale
  std::vector<float> Decode() const;
  int64_t StoredBytes() const;
};

struct Delta {
  Method method = Method::kRtn;
  int bits = 4;
  bool sparse24 = true;
  int64_t group_size = 64;                    // 0 = one scale per matrix
  std::string base_hash;                      // BaseWeightsHash() of the base it was made against
  std::string base_source, finetuned_source;  // informational
  std::vector<MatrixDelta> matrices;
  std::vector<ExtraDelta> extras;

  // Bytes of packed matrices (codes before zstd + patterns + scales as stored) and of extras.
  int64_t MatrixBytes() const;
  int64_t ExtraBytes() const;
};

// "fnv1a64:<16 hex>": FNV-1a 64 over, for each of the model's tensors sorted by name, the line
// "<name> <dtype> <d0>x<d1>... <FNV-1a 64 of its bytes in hex>\n" (docs/deltas.md). Depends on
// the weights as stored (dtype and q/k row order included), not on the file they came from.
// Reads every byte, paging the repacked matrices' sources out again as it goes
// (Model::ReleaseSourcePages).
std::string BaseWeightsHash(const model::Model& base);
// The same hash of a model's file as read (the same tensors give the same hash); pages every
// tensor out once hashed (`chorus compress`, which prepares the base later if at all).
std::string BaseWeightsHash(const model::ModelFile& base);

struct WriteStats {
  int64_t file_bytes = 0;
  int64_t codes_raw_bytes = 0;     // codes before zstd
  int64_t codes_stored_bytes = 0;  // codes as stored
  int64_t matrices_zstd = 0;       // matrices whose codes were compressed
};
// Serializes to safetensors bytes (zstd over codes where it pays, at `zstd_level`).
Result<std::string> SerializeDelta(const Delta& d, int zstd_level = 9, WriteStats* stats = nullptr);
// Writes atomically (temporary file + rename). `path` ending in ".safetensors" is a single file;
// anything else is a directory (created if needed) holding kDeltaFileName.
Status WriteDelta(const std::string& path, const Delta& d, int zstd_level = 9,
                  WriteStats* stats = nullptr);

// Reads and fully validates a delta (a .safetensors file or a directory holding
// kDeltaFileName). Errors name the file and the tensor.
Result<Delta> ReadDelta(const std::string& path);
Result<Delta> ParseDelta(const std::string& name_for_errors, std::string bytes);

// A delta read for serving, validated exactly as ReadDelta does, whose matrices' codes and 2:4
// patterns stay in the mapped file: `delta.matrices[i].packed.codes` / `.mask` are empty where
// `in_file[i].codes` / `.mask` hold them (views into `file`; zstd-compressed codes are
// decompressed into the vector as ReadDelta does). DeltaWeights::Build(MappedDelta) copies them
// once, into its streamed buffer: a copy of each matrix in between, into fresh pages, cost as
// much as the rest of a load.
struct MappedDelta {
  struct Bytes {
    Tensor codes, mask;  // empty tensors when the vectors hold the bytes
  };
  Delta delta;
  std::vector<Bytes> in_file;  // one per delta.matrices
  std::shared_ptr<const formats::SafetensorsFile> file;
};
Result<MappedDelta> ReadDeltaMapped(const std::string& path);
// The same over bytes in memory (fuzzers, tests): the views point into `file`'s copy of them.
Result<MappedDelta> ParseDeltaMapped(const std::string& name_for_errors, std::string bytes);
// A matrix's codes or patterns wherever they are: `in_file` when it holds them (a MappedDelta's
// view), else `copy` (the MatrixDelta's vector).
std::span<const uint8_t> HeldBytes(const Tensor& in_file, const std::vector<uint8_t>& copy);
// True when `path` is a delta (a safetensors file or directory whose metadata says
// format=chorus-delta); false for anything else, including unreadable paths.
bool IsDeltaPath(const std::string& path);
// True when `path` should be read as a delta rather than a LoRA adapter: IsDeltaPath, or a
// directory holding kDeltaFileName, or a .safetensors file that is not a PEFT
// adapter_model.safetensors (so a damaged delta gets the delta reader's error).
bool LooksLikeDeltaPath(const std::string& path);

// Checks the delta against `base`: the base hash (kFailedPrecondition naming both hashes), and
// every tensor it names exists in the base with its shape. `delta_path` is used in messages.
Status CheckDeltaBase(const Delta& d, const model::Model& base, const std::string& delta_path);

// The dense reconstruction W_b + Δ̃ of every tensor, as f32, built into a new Model: the oracle
// the served path (base matmul + delta term) is checked against. Checks the base first.
Result<std::shared_ptr<const model::Model>> ApplyDeltaDense(const model::Model& base,
                                                            const Delta& d,
                                                            const std::string& delta_path);

}  // namespace chorus::delta
