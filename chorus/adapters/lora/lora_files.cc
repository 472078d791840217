// The format dispatch: ReadLora tells a PEFT directory from a GGUF LoRA and hands the path to
// the codec (peft_codec.cc, gguf_lora_codec.cc); LoadLoraAdapter reads and builds the adapter.
#include "chorus/adapters/lora/lora_files.h"

#include <filesystem>

#include "chorus/adapters/lora/lora_files_internal.h"

namespace chorus::adapters {

Result<LoraWeights> ReadLora(const std::string& path, const model::ModelConfig& base,
                             const LoraLoadOptions& opts) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return lora_internal::ReadPeftDir(path, base, opts);
  CHORUS_ASSIGN_OR_RETURN(const bool gguf, lora_internal::StartsWithGgufMagic(path));
  if (gguf) return ReadGgufLora(path, base, opts);
  return ReadPeftLora(path, base, opts);
}

Result<std::shared_ptr<const LoraAdapter>> LoadLoraAdapter(const std::string& path,
                                                           const model::ModelConfig& base,
                                                           const LoraLoadOptions& opts,
                                                           std::string name) {
  CHORUS_ASSIGN_OR_RETURN(LoraWeights w, ReadLora(path, base, opts));
  auto ad =
      LoraAdapter::Build(w, base, name.empty() ? path : std::move(name), opts.limits, opts.id);
  if (!ad.ok()) return ad.status().WithContext(path);
  return ad;
}

}  // namespace chorus::adapters
