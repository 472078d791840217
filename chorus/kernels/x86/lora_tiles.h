// Helpers shared by the AVX2 and AVX-512 LoRA tiles (x86/lora_avx2.cc, x86/lora_avx512.cc).
// Everything here has internal linkage, so each file compiles its own copy with its own ISA
// flags and no code is shared across them (as with matmul_qtile.h's templates).
#pragma once

#include <cstdint>
#include <type_traits>
#include <vector>

namespace chorus::kernels::lora_internal {
namespace {

// Calls fn(std::integral_constant<int, NR>{}, i) for each row tile of n_rows rows: tiles of
// NR = 4 from i = 0, then one tile of the last 1–3 rows — the tiles take NR as a template
// argument, so their accumulators stay in registers.
template <class Fn>
inline void ForRowTiles(int64_t n_rows, Fn&& fn) {
  int64_t i = 0;
  for (; i + 4 <= n_rows; i += 4) fn(std::integral_constant<int, 4>{}, i);
  switch (n_rows - i) {
    case 3:
      fn(std::integral_constant<int, 3>{}, i);
      break;
    case 2:
      fn(std::integral_constant<int, 2>{}, i);
      break;
    case 1:
      fn(std::integral_constant<int, 1>{}, i);
      break;
    default:
      break;
  }
}

inline int64_t RoundUpTo(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// This thread's expand panel: at least `floats` floats, 64-byte aligned. It grows to the
// largest size seen and is then reused, so a warm step allocates nothing.
inline float* PanelScratch(int64_t floats) {
  thread_local std::vector<float> buf;
  if (buf.size() < static_cast<size_t>(floats + 16)) buf.resize(static_cast<size_t>(floats + 16));
  const uintptr_t misalign = reinterpret_cast<uintptr_t>(buf.data()) % 64;
  return buf.data() + (64 - misalign) % 64 / sizeof(float);
}

}  // namespace
}  // namespace chorus::kernels::lora_internal
