#include "chorus/kernels/dispatch.h"

#include <cpuid.h>

#include <atomic>

namespace chorus::kernels {
namespace {

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
  }
  if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) {
    f.avx512bf16 = zmm_os && ((a >> 5) & 1);
    f.avxvnni = ymm_os && ((a >> 4) & 1);
  }
  f.fma = f.fma && ymm_os;
  return f;
}

IsaLevel BestLevel(const CpuFeatures& f) {
  if (f.avx512f && f.avx512bw && f.avx512vl && f.avx512vnni && f.avx512bf16 && f.fma)
    return IsaLevel::kAvx512;
  if (f.avx2 && f.fma && f.f16c) return IsaLevel::kAvx2;
  return IsaLevel::kScalar;
}

std::atomic<int> g_max_level{static_cast<int>(IsaLevel::kAvx512)};

}  // namespace

const CpuFeatures& DetectCpu() {
  static const CpuFeatures features = Probe();
  return features;
}

IsaLevel ActiveIsa() {
  int best = static_cast<int>(BestLevel(DetectCpu()));
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
  }
  return "?";
}

std::optional<IsaLevel> ParseIsaLevel(const std::string& name) {
  for (IsaLevel level : {IsaLevel::kScalar, IsaLevel::kAvx2, IsaLevel::kAvx512})
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
  add(f.avxvnni, "avxvnni");
  return s.empty() ? "none" : s;
}

}  // namespace chorus::kernels
