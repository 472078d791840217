// Loading a base model from the formats people have:
//   * a Hugging Face directory: config.json + model.safetensors or sharded
//     model.safetensors.index.json (F32/F16/BF16);
//   * a GGUF v3 file (llama / qwen2 architectures; F32, F16, BF16, Q8_0, Q4_0 used in place);
//   * a llama2.c checkpoint (.bin).
// The format is detected from the content (directory / "GGUF" magic / llama2.c header).
#pragma once

#include <memory>
#include <string>

#include "chorus/model/model.h"

namespace chorus::tokenizer {
class Tokenizer;
}

namespace chorus::model {

// A model's file as read (ModelFile, model.h): mapped and validated by the format's reader, not
// prepared for the kernels.
Result<ModelFile> ReadModelFile(const std::string& path);

// ReadModelFile + Model::Build. `pages`: what happens to the file's pages of matrices the
// kernels repack (model.h).
Result<std::shared_ptr<const Model>> LoadModel(const std::string& path,
                                               SourcePages pages = SourcePages::kRelease);

// The tokenizer that goes with a model: `override_path` when given (--tokenizer), else the one
// in the HF directory or embedded in the GGUF. llama2.c checkpoints carry none: they need
// `override_path` (or a tokenizer.bin beside the checkpoint, llama2.c's default).
Result<std::unique_ptr<tokenizer::Tokenizer>> LoadTokenizerFor(const Model& model,
                                                               const std::string& override_path);
Result<std::unique_ptr<tokenizer::Tokenizer>> LoadTokenizerFor(const ModelFile& file,
                                                               const std::string& override_path);

}  // namespace chorus::model
