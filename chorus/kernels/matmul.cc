// PackedWeight::Pack (repacking of q8_0/q4_0, and of bf16 for AVX-512, into 64-column panels) and
// MatMul/MatMulMulti: threading, activation scratch and the one place that picks the ISA variant.
#include "chorus/kernels/matmul.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "chorus/base/large_alloc.h"
#include "chorus/base/owned_ranges.h"
#include "chorus/kernels/dispatch.h"
#include "chorus/kernels/matmul_internal.h"

namespace chorus::kernels {

using internal::kPanelCols;

class PackedWeightBuilder {
 public:
  static Result<PackedWeight> Build(const Tensor& w, IsaLevel level);
};

namespace {

std::shared_ptr<uint8_t> AlignedBytes(int64_t bytes) {
  const size_t alloc = static_cast<size_t>((bytes + 63) / 64 * 64);
  void* p = std::aligned_alloc(64, alloc == 0 ? 64 : alloc);
  CHORUS_CHECK(p != nullptr) << "out of memory packing a weight of " << bytes << " bytes";
  return std::shared_ptr<uint8_t>(static_cast<uint8_t*>(p), [](uint8_t* q) { std::free(q); });
}

// A repacked weight: streamed from DRAM at every step, so it asks for transparent huge pages
// (AllocateLarge): with 4 KiB pages the hardware prefetchers stop at every page boundary of the
// stream and each page costs a TLB miss.
std::shared_ptr<uint8_t> PackedBuffer(int64_t bytes) {
  void* p = AllocateLarge(static_cast<size_t>(std::max<int64_t>(bytes, 1)), "a packed weight");
  return std::shared_ptr<uint8_t>(static_cast<uint8_t*>(p), [](uint8_t* q) { std::free(q); });
}

// Repacks rows [n, k] of q8_0 / q4_0 blocks into the panel layout of matmul_internal.h.
// Padding columns of the last panel are left zero with scale 0; their outputs are never stored.
void RepackQuant(const Tensor& w, int layout, int64_t n, int64_t k, uint8_t* out) {
  const int64_t nb = k / kQuantBlock;
  const int64_t n_panels = (n + kPanelCols - 1) / kPanelCols;
  const int64_t qs_block = internal::QsBlockBytes(layout);
  const int64_t blk_bytes = internal::BlockBytes(layout);
  const int64_t panel_bytes = internal::PanelBytes(layout, nb);
  constexpr int64_t kChunk = internal::kChunkBytes;
  std::memset(out, 0, static_cast<size_t>(n_panels * panel_bytes));
  for (int64_t p = 0; p < n_panels; ++p) {
    uint8_t* panel = out + p * panel_bytes;
    const int cols = static_cast<int>(std::min<int64_t>(kPanelCols, n - p * kPanelCols));
    for (int c = 0; c < cols; ++c) {
      const int64_t col = p * kPanelCols + c;
      for (int64_t b = 0; b < nb; ++b) {
        uint8_t* qs = panel + b * blk_bytes + 4 * c;
        uint16_t* scales = reinterpret_cast<uint16_t*>(panel + b * blk_bytes + qs_block);
        if (layout == internal::kLayoutQ8Panel) {
          const BlockQ8_0& blk = static_cast<const BlockQ8_0*>(w.data())[col * nb + b];
          scales[c] = blk.d;
          for (int g = 0; g < 8; ++g) {  // k-group g: elements 4g..4g+3, stored as q + 128
            uint32_t v;
            std::memcpy(&v, blk.qs + 4 * g, 4);
            v ^= 0x80808080u;
            std::memcpy(qs + g * kChunk, &v, 4);
          }
        } else {
          const BlockQ4_0& blk = static_cast<const BlockQ4_0*>(w.data())[col * nb + b];
          scales[c] = blk.d;
          uint8_t nib[kQuantBlock];  // GGML nibbles (q + 8) in element order
          for (int j = 0; j < 16; ++j) {
            nib[j] = blk.qs[j] & 0x0f;
            nib[j + 16] = blk.qs[j] >> 4;
          }
          for (int jj = 0; jj < 4; ++jj)  // chunk jj: k-groups 2jj (low) and 2jj + 1 (high)
            for (int t = 0; t < 4; ++t)
              qs[jj * kChunk + t] =
                  static_cast<uint8_t>(nib[8 * jj + t] | (nib[8 * jj + 4 + t] << 4));
        }
      }
    }
  }
}

// Repacks rows [n, k] of K-quant super-blocks into the panels of matmul_internal.h ("K-quant
// weights"). Padding columns of the last panel stay zero (S = 0, D = 0); their outputs are never
// stored.
void RepackK(const Tensor& w, int layout, int64_t n, int64_t k, uint8_t* out) {
  const DType dt = w.dtype();
  const int64_t nsb = k / 256;
  const int64_t n_panels = (n + kPanelCols - 1) / kPanelCols;
  const int64_t panel_bytes = internal::KPanelBytes(layout, k);
  const int64_t blk_bytes = internal::KBlockBytes(layout);
  const int64_t src_block = DTypeBlockBytes(dt);
  constexpr int64_t kChunk = internal::kChunkBytes;
  std::memset(out, 0, static_cast<size_t>(n_panels * panel_bytes));
  KQuantInts b;
  for (int64_t p = 0; p < n_panels; ++p) {
    const int cols = static_cast<int>(std::min<int64_t>(kPanelCols, n - p * kPanelCols));
    for (int c = 0; c < cols; ++c) {
      const auto* row = static_cast<const uint8_t*>(w.view().Row(p * kPanelCols + c));
      for (int64_t s = 0; s < nsb; ++s) {
        UnpackKQuant(dt, row + s * src_block, &b);
        uint8_t* blk = out + p * panel_bytes + s * blk_bytes;
        for (int e = 0; e < 256; ++e) {
          const int g = e / 4, i = e % 4, q = b.q[e];
          if (internal::KHasNibbles(layout)) {
            uint8_t& byte = blk[internal::KNibOff(layout) + (g / 2) * kChunk + 4 * c + i];
            byte = static_cast<uint8_t>(byte | ((q & 0x0f) << (4 * (g % 2))));
          }
          if (internal::KHasCrumbs(layout)) {
            const int v = layout == internal::kLayoutQ6K ? (q >> 4) & 3 : q & 3;
            uint8_t& byte = blk[internal::KCrumbOff(layout) + (g / 4) * kChunk + 4 * c + i];
            byte = static_cast<uint8_t>(byte | (v << (2 * (g % 4))));
          }
          if (internal::KHasBits(layout)) {
            const int v = layout == internal::kLayoutQ5K ? (q >> 4) & 1 : (q >> 2) & 1;
            uint8_t& byte = blk[internal::KBitOff(layout) + (g / 8) * kChunk + 4 * c + i];
            byte = static_cast<uint8_t>(byte | (v << (g % 8)));
          }
        }
        for (int j = 0; j < b.n_sub; ++j) {
          const int64_t at = (j / 2) * 2 * kPanelCols + 2 * c + (j % 2);
          blk[internal::KSOff(layout) + at] = static_cast<uint8_t>(static_cast<int8_t>(b.S[j]));
          if (internal::KHasMins(layout))
            blk[internal::KNOff(layout) + at] = static_cast<uint8_t>(static_cast<int8_t>(b.N[j]));
        }
        auto* d = reinterpret_cast<uint16_t*>(blk + internal::KDOff(layout));
        d[c] = F32ToF16(b.D);
        if (internal::KHasMins(layout)) {
          reinterpret_cast<uint16_t*>(blk + internal::KMOff(layout))[c] = F32ToF16(b.M);
        }
      }
    }
  }
}

// Repacks bf16 rows [n, k] into the k-pair panels of matmul_internal.h (kLayoutBf16Pairs).
void RepackBf16Pairs(const Tensor& w, int64_t n, int64_t k, uint8_t* out) {
  const auto* src = static_cast<const uint16_t*>(w.data());
  const int64_t kp = (k + 1) / 2;
  const int64_t n_panels = (n + kPanelCols - 1) / kPanelCols;
  const int64_t panel_bytes = internal::Bf16PanelBytes(k);
  for (int64_t p = 0; p < n_panels; ++p) {
    const int cols = static_cast<int>(std::min<int64_t>(kPanelCols, n - p * kPanelCols));
    // Chunk by chunk, so the output is written sequentially; the 64 source rows each advance
    // by one pair per chunk, and their current cache lines stay in L1.
    for (int64_t j = 0; j < kp; ++j) {
      uint32_t words[kPanelCols] = {};
      for (int c = 0; c < cols; ++c) {
        const uint16_t* row = src + (p * kPanelCols + c) * k;
        const uint32_t hi = 2 * j + 1 < k ? row[2 * j + 1] : 0u;
        words[c] = row[2 * j] | hi << 16;
      }
      std::memcpy(out + p * panel_bytes + j * internal::kChunkBytes, words, sizeof(words));
    }
  }
}

// Per-thread scratch for converted activations. Grows on demand and is then reused: after the
// first steps of a serving run no call allocates.
struct Scratch {
  std::shared_ptr<uint8_t> buf;
  int64_t cap = 0;
  uint8_t* Get(int64_t bytes) {
    if (bytes > cap) {
      buf = AlignedBytes(bytes);
      cap = bytes;
    }
    return buf.get();
  }
};
thread_local Scratch t_scratch;

inline int64_t RoundUp(int64_t v, int64_t a) { return (v + a - 1) / a * a; }

internal::QRows LayoutQRows(uint8_t* base, int64_t m, int64_t k) {
  internal::QRows q;
  q.qs_stride = RoundUp(k, 64);
  q.meta_stride = k / kQuantBlock;
  q.qs = reinterpret_cast<int8_t*>(base);
  q.meta = reinterpret_cast<internal::QMeta*>(base + RoundUp(m, internal::kQRowsPad) * q.qs_stride);
  return q;
}
int64_t QRowsBytes(int64_t m, int64_t k) {
  return RoundUp(m, internal::kQRowsPad) * RoundUp(k, 64) +
         m * (k / kQuantBlock) * static_cast<int64_t>(sizeof(internal::QMeta));
}

// Rows per MatMulMulti pass: a step with more runs in blocks of this many (the serving step's
// default size, docs/benchmarks.md "Long prompts: prefill in serving-size steps").
constexpr int64_t kMatMulRowBlock = 512;

// Up to this many rows, every thread converts all activations itself (cheap, and it saves a
// second pool synchronization); above it, threads convert disjoint rows into one buffer first.
constexpr int64_t kRedundantConvertRows = 32;

void RunOnPool(ThreadPool* pool, const std::function<void(int, int)>& fn) {
  if (pool == nullptr || pool->size() <= 1) {
    fn(0, 1);
  } else {
    pool->Run(fn);
  }
}

}  // namespace

Result<PackedWeight> PackedWeightBuilder::Build(const Tensor& w, IsaLevel level) {
  if (w.empty()) return InvalidArgumentError("PackedWeight::Pack: empty tensor");
  if (w.shape().size() != 2) {
    return InvalidArgumentError("PackedWeight::Pack: weight must be 2-D, got shape " +
                                w.view().ShapeString());
  }
  const int64_t n = w.shape()[0], k = w.shape()[1];
  if (n <= 0 || k <= 0) {
    return InvalidArgumentError("PackedWeight::Pack: empty weight shape " + w.view().ShapeString());
  }
  const DType dt = w.dtype();
  if (dt != DType::kF32 && dt != DType::kF16 && dt != DType::kBF16 && dt != DType::kQ8_0 &&
      dt != DType::kQ4_0 && !DTypeIsKQuant(dt)) {
    return UnimplementedError("PackedWeight::Pack: unsupported weight dtype " +
                              std::string(DTypeName(dt)));
  }
  if (DTypeIsQuantized(dt) && k % DTypeBlockElems(dt) != 0) {
    return InvalidArgumentError("PackedWeight::Pack: " + std::string(DTypeName(dt)) +
                                " weight needs k % " + std::to_string(DTypeBlockElems(dt)) +
                                " == 0, got shape " + w.view().ShapeString());
  }
  PackedWeight pw;
  pw.source_ = w;
  pw.n_ = n;
  pw.k_ = k;
  if (DTypeIsKQuant(dt)) {
    const int layout = internal::KLayoutOf(dt);
    const int64_t bytes = (n + kPanelCols - 1) / kPanelCols * internal::KPanelBytes(layout, k);
    std::shared_ptr<uint8_t> buf = PackedBuffer(bytes);
    RepackK(w, layout, n, k, buf.get());
    pw.packed_ = std::move(buf);
    pw.packed_layout_ = layout;
    pw.packed_bytes_ = bytes;
  } else if (DTypeIsQuantized(dt)) {
    const int layout = dt == DType::kQ8_0 ? internal::kLayoutQ8Panel : internal::kLayoutQ4Panel;
    const int64_t bytes =
        (n + kPanelCols - 1) / kPanelCols * internal::PanelBytes(layout, k / kQuantBlock);
    std::shared_ptr<uint8_t> buf = PackedBuffer(bytes);
    RepackQuant(w, layout, n, k, buf.get());
    pw.packed_ = std::move(buf);
    pw.packed_layout_ = layout;
    pw.packed_bytes_ = bytes;
  } else if (dt == DType::kBF16 && level >= IsaLevel::kAvx512) {
    // Only the AVX-512 kernels (which the amx level runs for bf16) read this layout; other
    // levels run on the source in place.
    const int64_t bytes = (n + kPanelCols - 1) / kPanelCols * internal::Bf16PanelBytes(k);
    std::shared_ptr<uint8_t> buf = PackedBuffer(bytes);
    RepackBf16Pairs(w, n, k, buf.get());
    pw.packed_ = std::move(buf);
    pw.packed_layout_ = internal::kLayoutBf16Pairs;
    pw.packed_bytes_ = bytes;
  }
  return pw;
}

int internal::KLayoutOf(DType t) {
  switch (t) {
    case DType::kQ2_K:
      return kLayoutQ2K;
    case DType::kQ3_K:
      return kLayoutQ3K;
    case DType::kQ4_K:
      return kLayoutQ4K;
    case DType::kQ5_K:
      return kLayoutQ5K;
    default:
      CHORUS_CHECK(t == DType::kQ6_K) << "KLayoutOf: not a K type";
      return kLayoutQ6K;
  }
}

Result<PackedWeight> PackedWeight::Pack(const Tensor& w) {
  return PackedWeightBuilder::Build(w, ActiveIsa());
}

Result<PackedWeight> internal::PackForIsa(const Tensor& w, IsaLevel level) {
  return PackedWeightBuilder::Build(w, level);
}

void MatMul(const PackedWeight& w, const float* x, int64_t x_stride, int64_t m, float* y,
            int64_t y_stride, bool accumulate, ThreadPool* pool) {
  const MatMulOut out{&w, y, y_stride};
  MatMulMulti({&out, 1}, x, x_stride, m, accumulate, pool);
}

void MatMulMulti(std::span<const MatMulOut> outs, const float* x, int64_t x_stride, int64_t m,
                 bool accumulate, ThreadPool* pool) {
  if (m <= 0 || outs.empty()) return;
  CHORUS_CHECK_LE(static_cast<int64_t>(outs.size()), kMaxMatMulOuts);
  if (m > kMatMulRowBlock) {
    // A big step in blocks of rows, so that a block's converted activations stay in cache while
    // every weight panel passes over them. Rows are independent (batch invariance), so the bits
    // are those of one call.
    MatMulOut block[kMaxMatMulOuts];
    for (int64_t r = 0; r < m; r += kMatMulRowBlock) {
      for (size_t i = 0; i < outs.size(); ++i) {
        block[i] = outs[i];
        block[i].y = outs[i].y + r * outs[i].y_stride;
      }
      MatMulMulti({block, outs.size()}, x + r * x_stride, x_stride,
                  std::min(kMatMulRowBlock, m - r), accumulate, pool);
    }
    return;
  }
  for (const MatMulOut& o : outs) {
    CHORUS_CHECK(o.w->k() == outs[0].w->k() && o.w->dtype() == outs[0].w->dtype())
        << "MatMulMulti: weights differ in k or dtype";
  }
  const IsaLevel isa = ActiveIsa();
  if (isa == IsaLevel::kScalar) {
    RunOnPool(pool, [&](int i, int nt) {
      for (const MatMulOut& o : outs) {
        int64_t c0, c1;
        ThreadPool::Slice(o.w->n(), i, nt, 16, &c0, &c1);
        if (c0 < c1) {
          internal::ReferenceMatMulCols(*o.w, x, x_stride, m, c0, c1, o.y, o.y_stride, accumulate);
        }
      }
    });
    return;
  }
  const internal::IsaKernels& kern = isa == IsaLevel::kAmx      ? internal::AmxKernels()
                                     : isa == IsaLevel::kAvx512 ? internal::Avx512Kernels()
                                                                : internal::Avx2Kernels();
  internal::MatMulWithKernels(kern, outs, x, x_stride, m, accumulate, pool);
}

namespace {

// The work of one MatMulMulti call cut into units of about kUnitBytes of weights (whole panels
// for q formats, multiples of 16 columns for float weights), numbered across all outputs. Each
// thread owns a contiguous run of units and reads it in address order; a thread that finishes
// early steals from the back of another's run, so a thread that is slowed down (a busy host, a
// slower memory channel) does less of the work instead of holding the others at the end barrier
// (OwnedRanges). Which thread computes a column never changes its value (batch invariance).
// 128 KB: ~8 µs of streaming at batch 1, so the wait at the end of an op stays a few µs.
constexpr int64_t kUnitBytes = 128 * 1024;

struct WorkUnits {
  int n_outs = 0;
  int64_t first[kMaxMatMulOuts + 1] = {};  // first unit of each output; first[n_outs] = total
  int64_t per_unit[kMaxMatMulOuts] = {};   // panels (q) or columns (float) per unit
  int64_t items[kMaxMatMulOuts] = {};      // panels (q) or columns (float) of each output

  // Output j and its item range [b, e) for unit u < total().
  void Find(int64_t u, int* j, int64_t* b, int64_t* e) const {
    int o = 0;
    while (u >= first[o + 1]) ++o;
    *j = o;
    *b = (u - first[o]) * per_unit[o];
    *e = std::min(items[o], *b + per_unit[o]);
  }
  int64_t total() const { return first[n_outs]; }
};

// `panels`: the weights are repacked into 64-column panels (q formats, bf16 k-pairs), and a unit
// is whole panels; otherwise a unit is a multiple of 16 columns of a weight in place.
WorkUnits MakeUnits(std::span<const MatMulOut> outs, bool panels, int n_threads) {
  WorkUnits wu;
  wu.n_outs = static_cast<int>(outs.size());
  for (int j = 0; j < wu.n_outs; ++j) {
    const PackedWeight& w = *outs[static_cast<size_t>(j)].w;
    int64_t item_bytes, align;
    if (panels) {
      wu.items[j] = (w.n() + kPanelCols - 1) / kPanelCols;
      item_bytes = w.packed_layout() == internal::kLayoutBf16Pairs
                       ? internal::Bf16PanelBytes(w.k())
                       : internal::QPanelBytes(w.packed_layout(), w.k());
      align = 1;
    } else {
      wu.items[j] = w.n();
      item_bytes = DTypeBytes(w.dtype(), w.k());
      align = 16;
    }
    // About kUnitBytes per unit, but at least ~4 units per thread where the output has the
    // columns for it, so that small weights (k/v projections) are shared out evenly too.
    const int64_t by_bytes = std::max<int64_t>(1, kUnitBytes / item_bytes / align) * align;
    const int64_t by_count = RoundUp((wu.items[j] + 4 * n_threads - 1) / (4 * n_threads), align);
    wu.per_unit[j] = std::max<int64_t>(align, std::min(by_bytes, by_count));
    wu.first[j + 1] = wu.first[j] + (wu.items[j] + wu.per_unit[j] - 1) / wu.per_unit[j];
  }
  return wu;
}

// Runs fn(unit) for units of `ranges` on thread i until every unit has been handed out.
template <class Fn>
void ForEachUnit(OwnedRanges* ranges, int i, Fn&& fn) {
  for (int64_t u = ranges->Next(i); u >= 0; u = ranges->Next(i)) fn(u);
}

}  // namespace

void internal::MatMulWithKernels(const IsaKernels& kern, std::span<const MatMulOut> outs,
                                 const float* x, int64_t x_stride, int64_t m, bool accumulate,
                                 ThreadPool* pool) {
  if (m <= 0 || outs.empty()) return;
  const DType dt = outs[0].w->dtype();
  const int64_t k = outs[0].w->k();
  const bool quantized = DTypeIsQuantized(dt);
  // bf16 k-pair panels run only where this kernel set has their kernel (and every output has
  // them: weights packed at different ISA levels fall back to float_cols together).
  bool bf16_pairs = dt == DType::kBF16 && kern.bf16_panels != nullptr;
  for (const MatMulOut& o : outs)
    bf16_pairs = bf16_pairs && o.w->packed_layout() == internal::kLayoutBf16Pairs;
  const WorkUnits wu = MakeUnits(outs, quantized || bf16_pairs, pool == nullptr ? 1 : pool->size());
  OwnedRanges ranges(wu.total(), pool == nullptr ? 1 : pool->size());

  if (quantized) {
    const int layout = outs[0].w->packed_layout();
    for (const MatMulOut& o : outs)
      CHORUS_CHECK(o.w->n() == 0 || o.w->packed() != nullptr)
          << "MatMul: PackedWeight not built by Pack()";
    auto compute = [&](int i, const internal::QRows& q) {
      ForEachUnit(&ranges, i, [&](int64_t u) {
        int j;
        int64_t p0, p1;
        wu.Find(u, &j, &p0, &p1);
        const MatMulOut& o = outs[static_cast<size_t>(j)];
        kern.q_panels(layout, static_cast<const uint8_t*>(o.w->packed()), o.w->n(), k, q, m, p0, p1,
                      o.y, o.y_stride, accumulate);
      });
    };
    if (m <= kRedundantConvertRows) {
      RunOnPool(pool, [&](int i, int) {
        // A thread that starts late (descheduled) finds the work done: skip the conversion.
        if (ranges.Empty()) return;
        internal::QRows q = LayoutQRows(t_scratch.Get(QRowsBytes(m, k)), m, k);
        kern.quantize_rows(layout, x, x_stride, 0, m, k, q);
        compute(i, q);
      });
    } else {
      const internal::QRows q = LayoutQRows(t_scratch.Get(QRowsBytes(m, k)), m, k);
      RunOnPool(pool, [&](int i, int nt) {
        int64_t r0, r1;
        ThreadPool::Slice(m, i, nt, 1, &r0, &r1);
        if (r0 < r1) kern.quantize_rows(layout, x, x_stride, r0, r1, k, q);
      });
      RunOnPool(pool, [&](int i, int) { compute(i, q); });
    }
    return;
  }

  auto float_compute = [&](int i, const void* xs, int64_t xs_stride) {
    ForEachUnit(&ranges, i, [&](int64_t u) {
      int j;
      int64_t c0, c1;  // panels when bf16_pairs, columns otherwise
      wu.Find(u, &j, &c0, &c1);
      const MatMulOut& o = outs[static_cast<size_t>(j)];
      if (bf16_pairs) {
        kern.bf16_panels(static_cast<const uint8_t*>(o.w->packed()), o.w->n(), k,
                         static_cast<const uint16_t*>(xs), xs_stride, m, c0, c1, o.y, o.y_stride,
                         accumulate);
      } else {
        kern.float_cols(dt, o.w->source().data(), k, xs, xs_stride, m, c0, c1, o.y, o.y_stride,
                        accumulate);
      }
    });
  };
  if (dt != DType::kBF16) {
    RunOnPool(pool, [&](int i, int) { float_compute(i, x, x_stride); });
    return;
  }
  // bf16 weights: activations are rounded to bf16 once (see matmul.h).
  const int64_t xb_stride = RoundUp(k, 32);
  const int64_t xb_bytes = m * xb_stride * 4;  // room for either ISA's form (matmul_internal.h)
  if (m <= kRedundantConvertRows) {
    RunOnPool(pool, [&](int i, int) {
      if (ranges.Empty()) return;
      void* xb = t_scratch.Get(xb_bytes);
      kern.bf16_rows(x, x_stride, 0, m, k, xb, xb_stride);
      float_compute(i, xb, xb_stride);
    });
  } else {
    void* xb = t_scratch.Get(xb_bytes);
    RunOnPool(pool, [&](int i, int nt) {
      int64_t r0, r1;
      ThreadPool::Slice(m, i, nt, 1, &r0, &r1);
      if (r0 < r1) kern.bf16_rows(x, x_stride, r0, r1, k, xb, xb_stride);
    });
    RunOnPool(pool, [&](int i, int) { float_compute(i, xb, xb_stride); });
  }
}

}  // namespace chorus::kernels
