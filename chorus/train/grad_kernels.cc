#include "chorus/train/grad_kernels.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "chorus/kernels/dispatch.h"
#include "chorus/tensor/dtype.h"

namespace chorus::train {
namespace internal {

void ScalarPanel(const PanelArgs& a) {
  for (int64_t r = 0; r < a.rows; ++r) {
    float* out = a.out + r * a.out_stride;
    const float* l = a.l + r * a.l_row;
    for (int64_t c = 0; c < a.cols; ++c) {
      float acc = a.init_zero ? 0.0f : out[c];
      for (int64_t i = 0; i < a.n; ++i)
        acc = std::fma(l[i * a.l_inner], a.p[i * a.p_stride + c], acc);
      out[c] = acc;
    }
  }
}

}  // namespace internal
namespace {

// Columns per thread work item, and rows of W dequantized at a time: a 64 × 64 f32 strip is
// 16 KiB, which stays in L1 while every row tile of dy streams over it.
constexpr int64_t kChunkCols = 64;
constexpr int64_t kStripRows = 64;

void Panel(internal::PanelArgs a) {
  int64_t done = 0;
  switch (kernels::ActiveIsa()) {
    case kernels::IsaLevel::kAvx512:
    case kernels::IsaLevel::kAmx:
      done = internal::Avx512Panel(a);
      break;
    case kernels::IsaLevel::kAvx2:
      done = internal::Avx2Panel(a);
      break;
    default:
      break;
  }
  if (done < a.cols) {
    a.p += done;
    a.out += done;
    a.cols -= done;
    internal::ScalarPanel(a);
  }
}

void Dequant(DType dtype, const void* src, float* dst, int64_t n) {
  bool done = false;
  switch (kernels::ActiveIsa()) {
    case kernels::IsaLevel::kAvx512:
    case kernels::IsaLevel::kAmx:
      done = internal::Avx512DequantQ(dtype, src, dst, n);
      break;
    case kernels::IsaLevel::kAvx2:
      done = internal::Avx2DequantQ(dtype, src, dst, n);
      break;
    default:
      break;
  }
  if (!done) DequantizeRow(dtype, src, dst, n);
}

// Runs fn(c0, c1) over column chunks [0, cols) split statically between the threads: which
// thread computes a column never changes its value (one chain per element).
template <typename Fn>
void ForColumnChunks(int64_t cols, ThreadPool* pool, const Fn& fn) {
  const int64_t n_chunks = (cols + kChunkCols - 1) / kChunkCols;
  auto run = [&](int ti, int nt) {
    const int64_t b = n_chunks * ti / nt, e = n_chunks * (ti + 1) / nt;
    for (int64_t ch = b; ch < e; ++ch) {
      fn(ch * kChunkCols, std::min(cols, (ch + 1) * kChunkCols));
    }
  };
  if (pool == nullptr || pool->size() <= 1 || n_chunks <= 1) {
    run(0, 1);
  } else {
    pool->Run(run);
  }
}

}  // namespace

void MatMulTransposed(const kernels::PackedWeight& w, const float* dy, int64_t dy_stride, int64_t m,
                      float* dx, int64_t dx_stride, bool accumulate, ThreadPool* pool) {
  const int64_t n = w.n(), k = w.k();
  const TensorView& src = w.source().view();
  const int64_t block_elems = DTypeBlockElems(src.dtype);
  const int64_t block_bytes = DTypeBlockBytes(src.dtype);
  ForColumnChunks(k, pool, [&](int64_t c0, int64_t c1) {
    float strip[kStripRows * kChunkCols];
    const int64_t cols = c1 - c0;
    for (int64_t i0 = 0; i0 < n; i0 += kStripRows) {
      const int64_t i1 = std::min(n, i0 + kStripRows);
      // c0 is a multiple of 64, so it starts a block of every format (blocks of 32 or 1).
      for (int64_t i = i0; i < i1; ++i) {
        Dequant(src.dtype, src.Row(i) + c0 / block_elems * block_bytes,
                strip + (i - i0) * kChunkCols, cols);
      }
      // The next strip's rows are a jump of a whole weight row apart each, which the hardware
      // prefetcher does not follow: ask for them now, so they arrive while this strip computes.
      const int64_t row_bytes = (cols + block_elems - 1) / block_elems * block_bytes;
      for (int64_t i = i1; i < std::min(n, i1 + kStripRows); ++i) {
        const uint8_t* p = src.Row(i) + c0 / block_elems * block_bytes;
        for (int64_t b = 0; b < row_bytes; b += 64) __builtin_prefetch(p + b);
      }
      Panel({dy + i0, dy_stride, 1, strip, kChunkCols, i1 - i0, m, cols, dx + c0, dx_stride,
             i0 == 0 && !accumulate});
    }
  });
}

void AccumulateOuter(const float* a, int64_t a_stride, int64_t p, const float* b, int64_t b_stride,
                     int64_t q, int64_t t, float* g, int64_t g_stride, ThreadPool* pool) {
  ForColumnChunks(q, pool, [&](int64_t c0, int64_t c1) {
    Panel({a, 1, a_stride, b + c0, b_stride, t, p, c1 - c0, g + c0, g_stride, false});
  });
}

}  // namespace chorus::train
