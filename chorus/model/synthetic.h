// Synthetic models at real shapes (seeded random weights), so benchmarks get realistic sizes
// without downloads and the server has an embedded default model.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "chorus/model/model.h"
#include "chorus/model/quant_scheme.h"

namespace chorus::model {

struct SyntheticSpec {
  std::string shape = "tiny";  // a name from SyntheticShapeNames()
  DType dtype = DType::kF32;   // dtype of the linear layers and embeddings
  uint64_t seed = 1;
  // When set, chooses each matrix's dtype instead (a K-quant mix such as q4_k_m).
  std::optional<QuantScheme> mix = std::nullopt;
  // When > 0, only this many layers (the shape's widths, fewer blocks): tests that need a real
  // shape's matrices but not its depth (e.g. tensor parallelism at the TinyLlama shape).
  int64_t n_layers = 0;
};

// "tiny" (the embedded default: dim 128, 4 layers, vocab 512), "stories260k", "tinyllama-1.1b",
// "llama2-7b", "llama3-8b", "mistral-7b", "qwen2-0.5b", "qwen3-0.6b", "phi-3-mini", "gemma-2-2b",
// "gemma-3-1b", and the test shapes "qwen3-tiny", "phi3-tiny", "gemma2-tiny", "gemma3-tiny"
// (docs/models.md).
std::vector<std::string> SyntheticShapeNames();
Result<ModelConfig> SyntheticConfig(const std::string& shape);

// Builds the model in memory. Weights ~ N(0, 0.02²)·scaled per layer, norms = 1 (Gemma's w = 0;
// test shapes add per-channel noise); identical for the same spec on every machine. Quantized
// dtypes are quantized from the same f32 draws.
Result<std::shared_ptr<const Model>> MakeSyntheticModel(const SyntheticSpec& spec);
// The same tensors and config, not prepared for the kernels (what `chorus convert` writes: the
// weights are held once).
Result<ModelFile> MakeSyntheticModelFile(const SyntheticSpec& spec);

}  // namespace chorus::model
