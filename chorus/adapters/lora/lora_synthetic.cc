// Synthetic adapter sets for benchmarks (`chorus convert --lora-count`): many random PEFT
// adapters written with the PEFT codec, optionally sharing their files through hard links.
#include <algorithm>
#include <filesystem>

#include "chorus/adapters/lora/lora_files.h"
#include "chorus/adapters/lora/lora_files_internal.h"

namespace chorus::adapters {

using lora_internal::FileBytes;
using lora_internal::kConfigFile;
using lora_internal::kSafetensorsFile;

Result<int64_t> WriteSyntheticLoraSet(const std::string& dir, const model::ModelConfig& base,
                                      const SyntheticLoraSetOptions& opts,
                                      const std::function<void(int64_t)>& progress) {
  namespace fs = std::filesystem;
  if (opts.count < 1) return InvalidArgumentError("adapter count must be at least 1");
  if (opts.distinct < 0) return InvalidArgumentError("distinct adapter count must not be negative");
  if (opts.ranks.empty()) return InvalidArgumentError("no LoRA ranks given");
  for (int64_t r : opts.ranks) {
    if (r < 1 || r > 256)
      return InvalidArgumentError("LoRA rank " + std::to_string(r) + " is outside [1, 256]");
  }
  if (opts.targets.empty()) return InvalidArgumentError("no target modules given");
  if (opts.dtype != DType::kF32 && opts.dtype != DType::kF16 && opts.dtype != DType::kBF16) {
    return InvalidArgumentError("PEFT adapters are written as f32, f16 or bf16");
  }
  const int64_t distinct = opts.distinct == 0 ? opts.count : std::min(opts.distinct, opts.count);
  if (distinct % static_cast<int64_t>(opts.ranks.size()) != 0 && distinct < opts.count) {
    return InvalidArgumentError(
        "the distinct adapter count must be a multiple of the number of ranks, so each linked "
        "adapter keeps its rank");
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return InternalError(dir + ": cannot create: " + ec.message());
  const int width = static_cast<int>(std::to_string(opts.count - 1).size());
  auto name_of = [&](int64_t i) {
    std::string n = std::to_string(i);
    return (fs::path(dir) /
            (opts.prefix + std::string(static_cast<size_t>(width) - n.size(), '0') + n))
        .string();
  };
  int64_t bytes = 0;
  for (int64_t i = 0; i < opts.count; ++i) {
    const std::string out = name_of(i);
    if (i < distinct) {
      RandomLoraSpec spec;
      spec.rank = opts.ranks[static_cast<size_t>(i) % opts.ranks.size()];
      spec.alpha = 2.0f * static_cast<float>(spec.rank);
      spec.targets = opts.targets;
      spec.seed = opts.seed + static_cast<uint64_t>(i);
      PeftWriteOptions wo;
      wo.dtype = opts.dtype;
      wo.base_model_name = opts.base_model_name;
      CHORUS_RETURN_IF_ERROR(WritePeftLora(out, MakeRandomLora(base, spec), base, wo));
      bytes += FileBytes((fs::path(out) / kSafetensorsFile).string()) +
               FileBytes((fs::path(out) / kConfigFile).string());
    } else {
      const std::string src = name_of(i % distinct);
      fs::create_directories(out, ec);
      if (ec) return InternalError(out + ": cannot create: " + ec.message());
      for (const char* f : {kConfigFile, kSafetensorsFile}) {
        const fs::path to = fs::path(out) / f;
        fs::remove(to, ec);
        fs::create_hard_link(fs::path(src) / f, to, ec);
        if (ec) return InternalError(to.string() + ": cannot hard-link: " + ec.message());
      }
    }
    if (progress) progress(i);
  }
  return bytes;
}

}  // namespace chorus::adapters
