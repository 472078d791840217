// Helpers shared by the AVX2 and AVX-512 LoRA tiles (x86/lora_avx2.cc, x86/lora_avx512.cc).
// Everything here has internal linkage, so each file compiles its own copy with its own ISA
// flags and no code is shared across them (as with matmul_qtile.h's templates).
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

namespace chorus::kernels::lora_internal {
namespace {

// Calls fn(std::integral_constant<int, N>{}, i) once for the last `left` ∈ [0, 3] items from
// i: N = left as a template argument (nothing for 0).
template <class Fn>
inline void ForTailOf4(int64_t left, int64_t i, Fn&& fn) {
  switch (left) {
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

// Calls fn(std::integral_constant<int, NR>{}, i) for each row tile of n_rows rows: tiles of
// NR = 4 from i = 0, then one tile of the last 1–3 rows — the tiles take NR as a template
// argument, so their accumulators stay in registers.
template <class Fn>
inline void ForRowTiles(int64_t n_rows, Fn&& fn) {
  int64_t i = 0;
  for (; i + 4 <= n_rows; i += 4) fn(std::integral_constant<int, 4>{}, i);
  ForTailOf4(n_rows - i, i, fn);
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

// The packed expand of both ISAs (see x86/lora_avx512.cc for why it packs): columns
// [c_begin, c_end) in blocks as wide as fit a panel of `panel_floats` floats (a multiple of `sub`
// columns, at most `max_block`); for each block, pack(cb, width, panel) packs the rank rows of Bᵀ
// into this thread's panel, then rows(nr, i, panel, cb, width) runs every row tile over it.
// Each column's value depends only on its own block's pack, never on the row count.
template <class Pack, class Rows>
inline void ExpandByPanels(int64_t n_rows, int64_t rank, int64_t c_begin, int64_t c_end,
                           int64_t sub, int64_t max_block, int64_t panel_floats, Pack&& pack,
                           Rows&& rows) {
  const int64_t block = std::max(sub, std::min(max_block, panel_floats / rank / sub * sub));
  float* panel = PanelScratch(rank * RoundUpTo(std::min(block, c_end - c_begin), sub));
  for (int64_t cb = c_begin; cb < c_end; cb += block) {
    const int64_t width = std::min(block, c_end - cb);
    pack(cb, width, panel);
    ForRowTiles(n_rows, [&](auto nr, int64_t i) { rows(nr, i, panel, cb, width); });
  }
}

}  // namespace
}  // namespace chorus::kernels::lora_internal
