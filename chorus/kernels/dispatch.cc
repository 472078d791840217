#include "chorus/kernels/dispatch.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

namespace chorus::kernels {
namespace {

// Linux's arch_prctl codes for dynamically enabled XSAVE features (asm/prctl.h) and the
// feature number of the AMX tile data (8 KiB of state per thread that uses it).
constexpr int kArchGetXcompPerm = 0x1022;
constexpr int kArchReqXcompPerm = 0x1023;
constexpr int kXfeatureXtiledata = 18;

std::string g_amx_reason;  // written once inside Probe() (under DetectCpu's static init)

CpuFeatures Probe() {
  CpuFeatures f;
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool osxsave = (c >> 27) & 1;
  f.fma = (c >> 12) & 1;
  f.f16c = (c >> 29) & 1;
  unsigned long long xcr0 = 0;
  if (osxsave) {
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    xcr0 = (static_cast<unsigned long long>(hi) << 32) | lo;
  }
  const bool ymm_os = (xcr0 & 0x6) == 0x6;
  const bool zmm_os = (xcr0 & 0xe6) == 0xe6;
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
    f.avx2 = ymm_os && ((b >> 5) & 1);
    f.avx512f = zmm_os && ((b >> 16) & 1);
    f.avx512bw = zmm_os && ((b >> 30) & 1);
    f.avx512vl = zmm_os && ((b >> 31) & 1);
    f.avx512vnni = zmm_os && ((c >> 11) & 1);
    f.avx512vbmi = zmm_os && ((c >> 1) & 1);
    f.avx512vbmi2 = zmm_os && ((c >> 6) & 1);
    // XCR0 bits 17/18: the OS manages the tile config and tile data state.
    const bool tile_os = (xcr0 & 0x60000) == 0x60000;
    f.amx_bf16 = tile_os && ((d >> 22) & 1);
    f.amx_tile = tile_os && ((d >> 24) & 1);
    f.amx_int8 = tile_os && ((d >> 25) & 1);
  }
  if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) {
    f.avx512bf16 = zmm_os && ((a >> 5) & 1);
    f.avxvnni = ymm_os && ((a >> 4) & 1);
  }
  f.fma = f.fma && ymm_os;
  if (!f.amx_tile || !f.amx_int8) {
    g_amx_reason = "the CPU (or the OS, in XCR0) has no AMX tiles with int8";
  } else if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0) {
    // The permission is per process: once granted, every thread may configure tiles (each
    // thread loads its own tile configuration before using them).
    g_amx_reason = std::string("the OS refused the AMX tile permission (arch_prctl: ") +
                   std::strerror(errno) + ")";
  } else {
    unsigned long long perm = 0;
    f.amx_permitted = syscall(SYS_arch_prctl, kArchGetXcompPerm, &perm) == 0 &&
                      ((perm >> kXfeatureXtiledata) & 1);
    if (!f.amx_permitted) g_amx_reason = "the OS did not grant the AMX tile permission";
  }
  return f;
}

IsaLevel BestLevel(const CpuFeatures& f) {
  const bool avx512 =
      f.avx512f && f.avx512bw && f.avx512vl && f.avx512vnni && f.avx512bf16 && f.fma;
  if (avx512 && f.amx_tile && f.amx_int8 && f.amx_permitted) return IsaLevel::kAmx;
  if (f.avx512f && f.avx512bw && f.avx512vl && f.avx512vnni && f.avx512bf16 && f.fma)
    return IsaLevel::kAvx512;
  if (f.avx2 && f.fma && f.f16c) return IsaLevel::kAvx2;
  return IsaLevel::kScalar;
}

std::atomic<int> g_max_level{static_cast<int>(kMaxIsaLevel)};

}  // namespace

const CpuFeatures& DetectCpu() {
  static const CpuFeatures features = Probe();
  return features;
}

IsaLevel BestIsa() {
  static const IsaLevel best = BestLevel(DetectCpu());
  return best;
}

IsaLevel ActiveIsa() {
  int best = static_cast<int>(BestIsa());
  int cap = g_max_level.load(std::memory_order_relaxed);
  return static_cast<IsaLevel>(best < cap ? best : cap);
}

void SetMaxIsa(IsaLevel level) { g_max_level.store(static_cast<int>(level)); }

std::string IsaName(IsaLevel level) {
  switch (level) {
    case IsaLevel::kScalar:
      return "scalar";
    case IsaLevel::kAvx2:
      return "avx2";
    case IsaLevel::kAvx512:
      return "avx512";
    case IsaLevel::kAmx:
      return "amx";
  }
  return "?";
}

std::optional<IsaLevel> ParseIsaLevel(const std::string& name) {
  for (IsaLevel level : {IsaLevel::kScalar, IsaLevel::kAvx2, IsaLevel::kAvx512, IsaLevel::kAmx})
    if (IsaName(level) == name) return level;
  return std::nullopt;
}

std::string CpuFeaturesString() {
  const CpuFeatures& f = DetectCpu();
  std::string s;
  auto add = [&](bool on, const char* name) {
    if (!on) return;
    if (!s.empty()) s += ' ';
    s += name;
  };
  add(f.avx2, "avx2");
  add(f.fma, "fma");
  add(f.f16c, "f16c");
  add(f.avx512f, "avx512f");
  add(f.avx512bw, "avx512bw");
  add(f.avx512vl, "avx512vl");
  add(f.avx512vnni, "avx512vnni");
  add(f.avx512bf16, "avx512bf16");
  add(f.avx512vbmi, "avx512vbmi");
  add(f.avx512vbmi2, "avx512vbmi2");
  add(f.avxvnni, "avxvnni");
  add(f.amx_tile, "amx-tile");
  add(f.amx_int8, "amx-int8");
  add(f.amx_bf16, "amx-bf16");
  if (f.amx_tile && !f.amx_permitted) add(true, "(amx-not-permitted)");
  return s.empty() ? "none" : s;
}

std::string AmxUnavailableReason() {
  DetectCpu();
  if (BestIsa() == IsaLevel::kAmx) return "";
  if (g_amx_reason.empty()) return "the CPU lacks the AVX-512 level below it";
  return g_amx_reason;
}

}  // namespace chorus::kernels
