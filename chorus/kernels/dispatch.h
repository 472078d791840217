// Run-time CPU feature detection and the one place that chooses kernel variants.
#pragma once

#include <optional>
#include <string>

namespace chorus::kernels {

enum class IsaLevel { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

struct CpuFeatures {
  bool avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512vnni = false, avx512bf16 = false,
       avxvnni = false;
};

const CpuFeatures& DetectCpu();
// The level the kernels use: the best the CPU supports, capped by SetMaxIsa().
IsaLevel ActiveIsa();
// Caps the level (tests run every level the machine supports; `chorus bench --isa`).
// Requires: called while no kernel runs.
void SetMaxIsa(IsaLevel level);
std::string IsaName(IsaLevel level);
// The level IsaName() names ("scalar", "avx2", "avx512"); nullopt for any other string.
std::optional<IsaLevel> ParseIsaLevel(const std::string& name);
std::string CpuFeaturesString();  // "avx2 fma f16c avx512f ... vnni bf16"

}  // namespace chorus::kernels
