// PackedWeight::Pack (repacking of q8_0/q4_0 into 16-column panels) and MatMul: threading,
// activation scratch and the one place that picks the ISA variant.
#include "chorus/kernels/matmul.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "chorus/kernels/dispatch.h"
#include "chorus/kernels/matmul_internal.h"

namespace chorus::kernels {

using internal::kPanelCols;

class PackedWeightBuilder {
 public:
  static Result<PackedWeight> Build(const Tensor& w);
};

namespace {

std::shared_ptr<uint8_t> AlignedBytes(int64_t bytes) {
  const size_t alloc = static_cast<size_t>((bytes + 63) / 64 * 64);
  void* p = std::aligned_alloc(64, alloc == 0 ? 64 : alloc);
  CHORUS_CHECK(p != nullptr) << "out of memory packing a weight of " << bytes << " bytes";
  return std::shared_ptr<uint8_t>(static_cast<uint8_t*>(p), [](uint8_t* q) { std::free(q); });
}

// Repacks rows [n, k] of q8_0 / q4_0 blocks into the panel layout of matmul_internal.h.
// Padding columns of the last panel are left zero with scale 0; their outputs are never stored.
void RepackQuant(const Tensor& w, int layout, int64_t n, int64_t k, uint8_t* out) {
  const int64_t nb = k / kQuantBlock;
  const int64_t n_panels = (n + kPanelCols - 1) / kPanelCols;
  const int64_t qs_block = internal::QsBlockBytes(layout);
  const int64_t panel_bytes = internal::PanelBytes(layout, nb);
  std::memset(out, 0, static_cast<size_t>(n_panels * panel_bytes));
  for (int64_t p = 0; p < n_panels; ++p) {
    uint8_t* panel = out + p * panel_bytes;
    uint16_t* scales = reinterpret_cast<uint16_t*>(panel + nb * qs_block);
    const int cols = static_cast<int>(std::min<int64_t>(kPanelCols, n - p * kPanelCols));
    for (int c = 0; c < cols; ++c) {
      const int64_t col = p * kPanelCols + c;
      for (int64_t b = 0; b < nb; ++b) {
        uint8_t* qs = panel + b * qs_block + 4 * c;
        if (layout == internal::kLayoutQ8Panel16) {
          const BlockQ8_0& blk = static_cast<const BlockQ8_0*>(w.data())[col * nb + b];
          scales[b * kPanelCols + c] = blk.d;
          for (int g = 0; g < 8; ++g) {  // k-group g: elements 4g..4g+3, stored as q + 128
            uint32_t v;
            std::memcpy(&v, blk.qs + 4 * g, 4);
            v ^= 0x80808080u;
            std::memcpy(qs + g * 64, &v, 4);
          }
        } else {
          const BlockQ4_0& blk = static_cast<const BlockQ4_0*>(w.data())[col * nb + b];
          scales[b * kPanelCols + c] = blk.d;
          uint8_t nib[kQuantBlock];  // GGML nibbles (q + 8) in element order
          for (int j = 0; j < 16; ++j) {
            nib[j] = blk.qs[j] & 0x0f;
            nib[j + 16] = blk.qs[j] >> 4;
          }
          for (int jj = 0; jj < 4; ++jj)  // chunk jj: k-groups 2jj (low) and 2jj + 1 (high)
            for (int t = 0; t < 4; ++t)
              qs[jj * 64 + t] = static_cast<uint8_t>(nib[8 * jj + t] | (nib[8 * jj + 4 + t] << 4));
        }
      }
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
  q.meta = reinterpret_cast<internal::QMeta*>(base + m * q.qs_stride);
  return q;
}
int64_t QRowsBytes(int64_t m, int64_t k) {
  return m * RoundUp(k, 64) + m * (k / kQuantBlock) * static_cast<int64_t>(sizeof(internal::QMeta));
}

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

Result<PackedWeight> PackedWeightBuilder::Build(const Tensor& w) {
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
      dt != DType::kQ4_0) {
    return UnimplementedError("PackedWeight::Pack: unsupported weight dtype " +
                              std::string(DTypeName(dt)));
  }
  if (DTypeIsQuantized(dt) && k % kQuantBlock != 0) {
    return InvalidArgumentError("PackedWeight::Pack: " + std::string(DTypeName(dt)) +
                                " weight needs k % 32 == 0, got shape " + w.view().ShapeString());
  }
  PackedWeight pw;
  pw.source_ = w;
  pw.n_ = n;
  pw.k_ = k;
  if (DTypeIsQuantized(dt)) {
    const int layout = dt == DType::kQ8_0 ? internal::kLayoutQ8Panel16 : internal::kLayoutQ4Panel16;
    const int64_t bytes =
        (n + kPanelCols - 1) / kPanelCols * internal::PanelBytes(layout, k / kQuantBlock);
    std::shared_ptr<uint8_t> buf = AlignedBytes(bytes);
    RepackQuant(w, layout, n, k, buf.get());
    pw.packed_ = std::move(buf);
    pw.packed_layout_ = layout;
    pw.packed_bytes_ = bytes;
  }
  return pw;
}

Result<PackedWeight> PackedWeight::Pack(const Tensor& w) { return PackedWeightBuilder::Build(w); }

void MatMul(const PackedWeight& w, const float* x, int64_t x_stride, int64_t m, float* y,
            int64_t y_stride, bool accumulate, ThreadPool* pool) {
  const int64_t n = w.n();
  if (m <= 0 || n <= 0) return;
  const IsaLevel isa = ActiveIsa();
  if (isa == IsaLevel::kScalar) {
    RunOnPool(pool, [&](int i, int nt) {
      int64_t c0, c1;
      ThreadPool::Slice(n, i, nt, 16, &c0, &c1);
      if (c0 < c1)
        internal::ReferenceMatMulCols(w, x, x_stride, m, c0, c1, y, y_stride, accumulate);
    });
    return;
  }
  internal::MatMulWithKernels(
      isa == IsaLevel::kAvx512 ? internal::Avx512Kernels() : internal::Avx2Kernels(), w, x,
      x_stride, m, y, y_stride, accumulate, pool);
}

void internal::MatMulWithKernels(const IsaKernels& kern, const PackedWeight& w, const float* x,
                                 int64_t x_stride, int64_t m, float* y, int64_t y_stride,
                                 bool accumulate, ThreadPool* pool) {
  const int64_t n = w.n(), k = w.k();
  if (m <= 0 || n <= 0) return;
  const DType dt = w.dtype();

  if (DTypeIsQuantized(dt)) {
    CHORUS_CHECK(w.packed() != nullptr) << "MatMul: PackedWeight not built by Pack()";
    const int64_t n_panels = (n + kPanelCols - 1) / kPanelCols;
    const uint8_t* packed = static_cast<const uint8_t*>(w.packed());
    auto compute = [&](int i, int nt, const internal::QRows& q) {
      int64_t p0, p1;
      ThreadPool::Slice(n_panels, i, nt, 1, &p0, &p1);
      if (p0 < p1) {
        kern.q_panels(w.packed_layout(), packed, n, k, q, m, p0, p1, y, y_stride, accumulate);
      }
    };
    if (m <= kRedundantConvertRows) {
      RunOnPool(pool, [&](int i, int nt) {
        internal::QRows q = LayoutQRows(t_scratch.Get(QRowsBytes(m, k)), m, k);
        kern.quantize_rows(w.packed_layout(), x, x_stride, 0, m, k, q);
        compute(i, nt, q);
      });
    } else {
      const internal::QRows q = LayoutQRows(t_scratch.Get(QRowsBytes(m, k)), m, k);
      RunOnPool(pool, [&](int i, int nt) {
        int64_t r0, r1;
        ThreadPool::Slice(m, i, nt, 1, &r0, &r1);
        if (r0 < r1) kern.quantize_rows(w.packed_layout(), x, x_stride, r0, r1, k, q);
      });
      RunOnPool(pool, [&](int i, int nt) { compute(i, nt, q); });
    }
    return;
  }

  auto float_compute = [&](int i, int nt, const void* xs, int64_t xs_stride) {
    int64_t c0, c1;
    ThreadPool::Slice(n, i, nt, 16, &c0, &c1);
    if (c0 < c1)
      kern.float_cols(dt, w.source().data(), k, xs, xs_stride, m, c0, c1, y, y_stride, accumulate);
  };
  if (dt != DType::kBF16) {
    RunOnPool(pool, [&](int i, int nt) { float_compute(i, nt, x, x_stride); });
    return;
  }
  // bf16 weights: activations are rounded to bf16 once (see matmul.h).
  const int64_t xb_stride = RoundUp(k, 32);
  const int64_t xb_bytes = m * xb_stride * 4;  // room for either ISA's form (matmul_internal.h)
  if (m <= kRedundantConvertRows) {
    RunOnPool(pool, [&](int i, int nt) {
      void* xb = t_scratch.Get(xb_bytes);
      kern.bf16_rows(x, x_stride, 0, m, k, xb, xb_stride);
      float_compute(i, nt, xb, xb_stride);
    });
  } else {
    void* xb = t_scratch.Get(xb_bytes);
    RunOnPool(pool, [&](int i, int nt) {
      int64_t r0, r1;
      ThreadPool::Slice(m, i, nt, 1, &r0, &r1);
      if (r0 < r1) kern.bf16_rows(x, x_stride, r0, r1, k, xb, xb_stride);
    });
    RunOnPool(pool, [&](int i, int nt) { float_compute(i, nt, xb, xb_stride); });
  }
}

}  // namespace chorus::kernels
