// Internal contract between matmul.cc (packing, threading, dispatch) and the per-ISA matmul
// kernels in x86/. Not part of the public API.
#pragma once

#include <cstdint>
#include <span>

#include "chorus/kernels/dispatch.h"
#include "chorus/kernels/matmul.h"
#include "chorus/tensor/dtype.h"

namespace chorus::kernels::internal {

// Quantized weights (q8_0, q4_0) are repacked at Pack() time into panels of 64 output columns
// (the last panel is padded with zero weights). Within a panel, a "k-group" is 4 consecutive
// k of one block; a 256-byte chunk holds one k-group for the 64 columns: byte 4*c + t is column
// c, element 4*g + t of the block. So one 32-bit broadcast of 4 activation bytes feeds 16
// (AVX-512) or 8 (AVX2) column dot products at once (vpdpbusd / vpmaddubsw lanes = columns), and
// a column vector h of kL lanes is the kL*4 bytes at offset h*kL*4 of each chunk.
//
// A panel is nb blocks stored one after the other, each block being its quants followed by its
// scales, so a batch-1 GEMV over a panel (all 64 columns: 4 AVX-512 vectors) reads one
// contiguous stream — the hardware prefetcher's best case; the earlier layout (16-column panels,
// scales after all quants) made a decode tile read 8 streams at once and reached only ~60 % of
// the single-thread read bandwidth.
//
// Block b of panel p occupies BlockBytes bytes at packed + p * PanelBytes + b * BlockBytes:
//   qs : QsBlockBytes
//        q8_0: 8 chunks of 256 bytes (k-groups 0..7), each byte = q + 128 (u8)
//        q4_0: 4 chunks of 256 bytes; chunk j: low nibble = k-group 2j, high nibble = 2j + 1,
//              nibble = q + 8 as in GGML
//   d  : 64 f16 scales (column order)
inline constexpr int kPanelCols = 64;
inline constexpr int64_t kChunkBytes = 4 * kPanelCols;
enum PackedLayout : int {
  kLayoutInPlace = 0,
  kLayoutQ8Panel = 1,
  kLayoutQ4Panel = 2,
  kLayoutBf16Pairs = 3,
  // K-quant super-block panels (below), one id per type.
  kLayoutQ2K = 4,
  kLayoutQ3K = 5,
  kLayoutQ4K = 6,
  kLayoutQ5K = 7,
  kLayoutQ6K = 8,
};

inline constexpr int64_t QsBlockBytes(int layout) {
  return (layout == kLayoutQ4Panel ? 4 : 8) * kChunkBytes;
}
inline constexpr int64_t BlockBytes(int layout) { return QsBlockBytes(layout) + 2 * kPanelCols; }
inline constexpr int64_t PanelBytes(int layout, int64_t nb) { return nb * BlockBytes(layout); }

// bf16 weights, on CPUs with AVX-512 BF16 (Pack() chooses by ActiveIsa()): panels of 64 output
// columns again, but the unit is a k-pair. Chunk j (256 bytes) of a panel holds elements 2j and
// 2j + 1 of its 64 columns: 32-bit word c = w[col c][2j] | w[col c][2j + 1] << 16 (the second is
// 0 when 2j + 1 == k; padding columns are 0). Panel p occupies Bf16PanelBytes(k) bytes at
// packed + p * Bf16PanelBytes(k).
//
// Why: vdpbf16ps multiplies 32 bf16 pairs per instruction. With lanes = columns, one 32-bit
// broadcast of an activation pair feeds 16 columns and each weight vector feeds every row of a
// tile, so a 6-row × 64-column tile issues 24 vdpbf16ps per 4 weight loads and needs no
// horizontal sums, where the in-place layout (lanes over k) needed one load per 2 vdpbf16ps and
// a reduction per output. Every output lane sums its k-pairs in order in one accumulator,
// whatever the tile's row count, so a row's result does not depend on its batch.
inline constexpr int64_t Bf16PanelBytes(int64_t k) { return (k + 1) / 2 * kChunkBytes; }

// K-quant weights (q2_k..q6_k) are repacked into 64-column panels of super-blocks (256 k). Every
// type is reduced to one integer form (dtype.h, KQuantInts): per sub-block j (16 elements, or 32
// for q4_k/q5_k) x_e = D·S_j·q_e − M·N_j with an unsigned code q_e ≤ 63. Super-block s of panel p
// occupies KBlockBytes(layout) bytes at packed + p * KPanelBytes(layout, k) + s * KBlockBytes:
//   nibble plane (q4_k, q5_k, q6_k): 32 chunks; chunk t byte 4c+i: low nibble = bits 0-3 of the
//        code of element 8t+i of column c (k-group 2t), high nibble = element 8t+4+i (k-group 2t+1)
//   crumb plane (q2_k, q3_k: bits 0-1; q6_k: bits 4-5): 16 chunks; chunk t byte 4c+i, bits 2s..2s+1
//        = element 16t+4s+i (k-group 4t+s)
//   bit plane (q3_k: bit 2; q5_k: bit 4): 8 chunks; chunk t byte 4c+i, bit s = element 32t+4s+i
//   S: n_sub/2 pair rows of 128 bytes; row i byte 2c+h = S_{2i+h} of column c (int8)
//   N: the same for N_j (q2_k, q4_k, q5_k; q3_k and q6_k derive N_j = 4·S_j resp. 32·S_j)
//   D: 64 f16; M: 64 f16 (q2_k, q4_k, q5_k; the others have M = D)
// A pair row loaded as 16 (AVX-512) or 8 (AVX2) columns and sign-extended to int16 holds
// (S_2i, S_2i+1) in each 32-bit lane: the operand of vpdpwssd / vpmaddwd against a broadcast
// pair of activation group sums.
inline constexpr bool IsKLayout(int layout) { return layout >= kLayoutQ2K && layout <= kLayoutQ6K; }
inline constexpr int KSubBlocks(int layout) {
  return layout == kLayoutQ4K || layout == kLayoutQ5K ? 8 : 16;
}
inline constexpr bool KHasNibbles(int layout) {
  return layout == kLayoutQ4K || layout == kLayoutQ5K || layout == kLayoutQ6K;
}
inline constexpr bool KHasCrumbs(int layout) {
  return layout == kLayoutQ2K || layout == kLayoutQ3K || layout == kLayoutQ6K;
}
inline constexpr bool KHasBits(int layout) { return layout == kLayoutQ3K || layout == kLayoutQ5K; }
inline constexpr bool KHasMins(int layout) {  // separate N_j and M
  return layout == kLayoutQ2K || layout == kLayoutQ4K || layout == kLayoutQ5K;
}
inline constexpr int64_t KNibOff(int) { return 0; }
inline constexpr int64_t KCrumbOff(int layout) {
  return KHasNibbles(layout) ? 32 * kChunkBytes : 0;
}
inline constexpr int64_t KBitOff(int layout) {
  return KCrumbOff(layout) + (KHasCrumbs(layout) ? 16 * kChunkBytes : 0);
}
inline constexpr int64_t KSOff(int layout) {
  return KBitOff(layout) + (KHasBits(layout) ? 8 * kChunkBytes : 0);
}
inline constexpr int64_t KNOff(int layout) {
  return KSOff(layout) + KSubBlocks(layout) * kPanelCols;
}
inline constexpr int64_t KDOff(int layout) {
  return KNOff(layout) + (KHasMins(layout) ? KSubBlocks(layout) * kPanelCols : 0);
}
inline constexpr int64_t KMOff(int layout) { return KDOff(layout) + 2 * kPanelCols; }
inline constexpr int64_t KBlockBytes(int layout) {
  return KDOff(layout) + (KHasMins(layout) ? 4 : 2) * kPanelCols;
}
inline constexpr int64_t KPanelBytes(int layout, int64_t k) {
  return k / 256 * KBlockBytes(layout);
}
// Bytes of one 64-column panel of a repacked quantized weight (q8_0, q4_0 or a K layout).
inline constexpr int64_t QPanelBytes(int layout, int64_t k) {
  return IsKLayout(layout) ? KPanelBytes(layout, k) : PanelBytes(layout, k / 32);
}
int KLayoutOf(DType t);  // the K layout of a K dtype

// One activation row quantized to q8_0-style blocks with an f32 scale (the MatMul spec):
// per block of 32: amax = max|x|, d = amax / 127, q = lround(x / d) (via x * (1/d)).
// corr = −offset·Σq removes the offset of unsigned-encoded weights from the block's integer dot
// product (offset chosen by the ISA kernel: 128 for q8_0 under vpdpbusd, 8 for q4_0, 0 when the
// kernel multiplies signed weights).
struct QMeta {
  float d;
  int32_t corr;
};
// The buffer holds RoundUp(m, kQRowsPad) rows of quants: the AMX kernel loads activation tiles
// of 16 rows, and the rows past m (never quantized, any bytes) only feed tile rows whose
// results are discarded (a tile row's products depend on that row alone).
inline constexpr int64_t kQRowsPad = 16;
// For a K layout the row is quantized per super-block of 256 instead (one scale, like GGML's
// q8_K): amax = max|x|, d = amax / 127, q = lround(x / d), with the sums of the quants of every
// 16 (s16) and 32 (s32) elements. The meta row (k/32 QMeta = 64 bytes per super-block) holds
// k/256 QMetaK.
struct QMetaK {
  float d;
  int16_t s16[16];
  int16_t s32[8];
};
static_assert(sizeof(QMetaK) <= 8 * sizeof(QMeta) && alignof(QMetaK) <= alignof(QMeta));
struct QRows {
  int8_t* qs = nullptr;     // [m, qs_stride] quants, row r block b at qs + r*qs_stride + 32*b
  QMeta* meta = nullptr;    // [m, meta_stride]
  int64_t qs_stride = 0;    // bytes
  int64_t meta_stride = 0;  // entries
};

// The scalar spec of the activation quantizer: one row of k (k % 32 == 0) floats.
void ReferenceQuantizeRow(const float* x, int64_t k, int32_t offset, int8_t* qs, QMeta* meta);
// The same for K layouts: one row of k (k % 256 == 0) floats.
void ReferenceQuantizeRowK(const float* x, int64_t k, int8_t* qs, QMetaK* meta);
inline QMetaK* KMetaRow(const QRows& q, int64_t r) {
  return reinterpret_cast<QMetaK*>(q.meta + r * q.meta_stride);
}
// The scalar spec over output columns [c0, c1) of all m rows (the scalar dispatch level).
void ReferenceMatMulCols(const PackedWeight& w, const float* x, int64_t x_stride, int64_t m,
                         int64_t c0, int64_t c1, float* y, int64_t y_stride, bool accumulate);

// The kernels of one ISA level. Each function is single-threaded over the range it is given.
struct IsaKernels {
  // Rows [r0, r1) of x [*, k] → q for a weight of `layout` (same numbers as
  // ReferenceQuantizeRow with this kernel's offset for that layout, or ReferenceQuantizeRowK for
  // a K layout, bit for bit).
  void (*quantize_rows)(int layout, const float* x, int64_t x_stride, int64_t r0, int64_t r1,
                        int64_t k, const QRows& q);
  // Rows [r0, r1) of x rounded to bf16 (round to nearest even, like F32ToBF16), in the form
  // this ISA's float_cols reads: AVX-512 stores bf16 (and zeros from k up to the next multiple
  // of 16, which the k-pair kernel reads when k is odd); AVX2 stores the rounded values as f32,
  // permuted like its bf16→f32 unpack. `out` holds ≥ 4 bytes per element; out_stride is in
  // elements and a multiple of 32.
  void (*bf16_rows)(const float* x, int64_t x_stride, int64_t r0, int64_t r1, int64_t k, void* out,
                    int64_t out_stride);
  // y[0..m, 64*p0 .. min(n, 64*p1)) for a repacked q weight (q8_0, q4_0 or a K layout).
  void (*q_panels)(int layout, const uint8_t* packed, int64_t n, int64_t k, const QRows& q,
                   int64_t m, int64_t p0, int64_t p1, float* y, int64_t y_stride, bool accumulate);
  // y[0..m, c0..c1) for a float weight in place [n, k]; x is f32 (f32/f16 weights) or the
  // bf16-rounded activations (bf16 weights), stride in elements.
  void (*float_cols)(DType dtype, const void* w, int64_t k, const void* x, int64_t x_stride,
                     int64_t m, int64_t c0, int64_t c1, float* y, int64_t y_stride,
                     bool accumulate);
  // y[0..m, 64*p0 .. min(n, 64*p1)) for a bf16 weight repacked as kLayoutBf16Pairs; x is what
  // bf16_rows wrote (bf16, zero past k up to the next multiple of 16). Null when this ISA has
  // no such kernel (then float_cols runs on the weight in place).
  void (*bf16_panels)(const uint8_t* packed, int64_t n, int64_t k, const uint16_t* x,
                      int64_t x_stride, int64_t m, int64_t p0, int64_t p1, float* y,
                      int64_t y_stride, bool accumulate);
};

const IsaKernels& Avx2Kernels();
const IsaKernels& Avx512Kernels();
// The AVX-512 kernels with q_panels replaced by the AMX int8 tile GEMM (x86/matmul_amx.cc) for
// steps of several rows. Requires: BestIsa() == kAmx (the tile permission is granted).
const IsaKernels& AmxKernels();
// AmxKernels().q_panels without its choice of the VNNI kernel for steps of few rows: the tile
// GEMM at any m (lets a test check the tiles on 1..11 rows too). Same requirement.
void AmxTileQPanels(int layout, const uint8_t* packed, int64_t n, int64_t k, const QRows& q,
                    int64_t m, int64_t p0, int64_t p1, float* y, int64_t y_stride, bool accumulate);

// Pack() for a given ISA level (Pack uses ActiveIsa()): lets a test build the AVX-512 layouts on
// any machine.
Result<PackedWeight> PackForIsa(const Tensor& w, IsaLevel level);

// MatMulMulti with the given kernels (what MatMul runs after choosing them by ActiveIsa());
// lets a test drive a kernel set directly.
void MatMulWithKernels(const IsaKernels& kern, std::span<const MatMulOut> outs, const float* x,
                       int64_t x_stride, int64_t m, bool accumulate, ThreadPool* pool);

}  // namespace chorus::kernels::internal
