// Model conversion (`chorus convert`): any loadable or synthetic model into GGUF
// (F32/F16/BF16/Q8_0/Q4_0) or a Hugging Face directory (F32/F16/BF16 safetensors + config.json),
// so formats can be cross-checked and benchmarks get realistic files without downloads.
//
// q/k rows are permuted between pair orders as the target expects: GGUF llama wants the
// interleaved order (as llama.cpp's converter writes it), HF wants rotate-half.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "chorus/model/model.h"
#include "chorus/model/quant_scheme.h"

namespace chorus::formats {
class GgufWriter;
}

namespace chorus::model {

enum class OutputFormat { kGguf, kHfDirectory };

struct ConvertOptions {
  OutputFormat format = OutputFormat::kGguf;
  // Dtype of the matrices (linears, embedding, output); norms and biases stay f32.
  // std::nullopt keeps each tensor's current dtype when the target format allows it.
  std::optional<DType> dtype;
  // When set, chooses each matrix's dtype instead (a K-quant mix such as q4_k_m).
  std::optional<QuantScheme> mix = std::nullopt;
  std::string output;  // file (GGUF) or directory (HF)
  // HF: weights of more bytes than this are split into model-0000i-of-0000N.safetensors shards
  // plus model.safetensors.index.json, as transformers' save_pretrained does (its default,
  // "5GB", is 5·10⁹ bytes); no more than this is one model.safetensors. Weight files of an
  // earlier conversion in the directory that this one does not write are gone afterwards (the
  // directory is replaced as a whole: ConvertModel). Must be > 0.
  uint64_t max_shard_bytes = 5'000'000'000;
};

// "5GB", "500MB", "2GiB", "1048576" (bytes): transformers' max_shard_size notation (KB, MB, GB
// are powers of 1000; KiB, MiB, GiB of 1024). Errors name the value.
Result<uint64_t> ParseShardSize(std::string_view text);

// Writes more files into an HF output's directory before it is put in place (the tokenizer's).
using HfFilesWriter = std::function<Status(const std::string& dir)>;

// Writes the model's weights and config. Tokenizer data is written by the caller through
// `gguf_extra` (GGUF metadata) or `hf_extra` (files in the HF directory), so this module does
// not depend on tokenizers. Atomic: a GGUF file by temp + rename; an HF directory as a whole — its
// files are written into a staging directory beside it, then swapped in with one rename
// (StagedDirectory, base/durable_file.h), so a kill leaves the old set of files or the new one.
// The new directory keeps the old one's other files (a README, say) but not an earlier
// conversion's weights, config.json or — when this one writes a tokenizer — tokenizer files.
// Only the file's tensors are read: a model read with ReadModelFile converts without being
// prepared for the kernels (no repacked copy), and tensors whose dtype and row order stay are
// written straight from the source's mapping.
Status ConvertModel(const ModelFile& model, const ConvertOptions& opts,
                    const std::function<Status(formats::GgufWriter*)>& gguf_extra = nullptr,
                    const HfFilesWriter& hf_extra = nullptr);
inline Status ConvertModel(const Model& model, const ConvertOptions& opts,
                           const std::function<Status(formats::GgufWriter*)>& gguf_extra = nullptr,
                           const HfFilesWriter& hf_extra = nullptr) {
  return ConvertModel(ModelFile::Of(model), opts, gguf_extra, hf_extra);
}

// Permutes the rows of a q or k projection [n_heads * head_dim, in] between pair orders.
Tensor PermuteRopeRows(const Tensor& w, int64_t n_heads, int64_t head_dim, kernels::RopeLayout from,
                       kernels::RopeLayout to);

}  // namespace chorus::model
