// Run-time CPU feature detection and the one place that chooses kernel variants.
#pragma once

#include <optional>
#include <string>

namespace chorus::kernels {

// Kernel levels, each a superset of the one below. kAmx runs the AVX-512 kernels everywhere
// except where an AMX tile kernel exists (docs/kernels.md): today the q8_0/q4_0 base matmuls
// of multi-row steps.
enum class IsaLevel { kScalar = 0, kAvx2 = 1, kAvx512 = 2, kAmx = 3 };
// The highest level there is: SetMaxIsa(kMaxIsaLevel) removes any cap.
inline constexpr IsaLevel kMaxIsaLevel = IsaLevel::kAmx;

struct CpuFeatures {
  bool avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512vnni = false, avx512bf16 = false,
       avxvnni = false;
  // Byte permutes and expands (vpmultishiftqb, vpexpandb): the int16 delta kernel's decode.
  bool avx512vbmi = false, avx512vbmi2 = false;
  // AMX: the CPUID bits, and whether the kernel granted this process the tile data state
  // (arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), asked once by DetectCpu()). Tile
  // kernels run only when all three hold.
  bool amx_tile = false, amx_int8 = false, amx_bf16 = false, amx_permitted = false;
};

// Probes the CPU once (thread-safe) and, on an AMX CPU, asks Linux for the tile permission for
// the whole process; a refusal only leaves the kAmx level unavailable.
const CpuFeatures& DetectCpu();
// The level the kernels use: the best the CPU supports, capped by SetMaxIsa().
IsaLevel ActiveIsa();
// The best level this CPU (and, for kAmx, the OS permission) supports, ignoring the cap.
IsaLevel BestIsa();
// Caps the level (tests run every level the machine supports; `chorus bench --isa`).
// Requires: called while no kernel runs.
void SetMaxIsa(IsaLevel level);
std::string IsaName(IsaLevel level);
// The level IsaName() names ("scalar", "avx2", "avx512", "amx"); nullopt for any other string.
std::optional<IsaLevel> ParseIsaLevel(const std::string& name);
std::string CpuFeaturesString();  // "avx2 fma f16c avx512f ... vnni bf16 amx-int8"
// Why kAmx is unavailable on this host ("" when it is available): no AMX in CPUID, or the
// OS refused the tile permission (with the errno text).
std::string AmxUnavailableReason();

}  // namespace chorus::kernels
