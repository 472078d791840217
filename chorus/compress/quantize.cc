#include "chorus/compress/quantize.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "chorus/kernels/dispatch.h"

namespace chorus::compress {
namespace {

using delta::MatrixLayout;
using delta::UnpackedMatrix;

UnpackedMatrix Empty(const MatrixLayout& l) {
  UnpackedMatrix m;
  m.layout = l;
  m.codes.assign(static_cast<size_t>(l.rows * l.kept_per_row()), 0);
  if (l.sparse24) m.patterns.assign(static_cast<size_t>(l.rows * (l.cols / 4)), 0);
  m.scales.assign(static_cast<size_t>(l.n_scales()), 0.0f);
  return m;
}

// The 2 columns (a < b) of w[0..4) with the largest key.
template <typename Key>
std::pair<int, int> KeepTwo(Key key) {
  int best = 0, second = 1;
  if (key(1) > key(0)) std::swap(best, second);
  for (int j = 2; j < 4; ++j) {
    if (key(j) > key(best)) {
      second = best;
      best = j;
    } else if (key(j) > key(second)) {
      second = j;
    }
  }
  return {std::min(best, second), std::max(best, second)};
}

void ForRows(ThreadPool* pool, int64_t rows, int64_t align,
             const std::function<void(int64_t, int64_t)>& fn) {
  if (pool == nullptr || pool->size() <= 1 || rows < 2 * align) {
    fn(0, rows);
    return;
  }
  pool->Run([&](int i, int n) {
    int64_t b, e;
    ThreadPool::Slice(rows, i, n, align, &b, &e);
    if (b < e) fn(b, e);
  });
}

// The inner loops of the local search (g's initial product and every accepted move), of the
// inverse and of OBS's error propagation, and the Cholesky's dot products, compiled for each
// vector width and picked by kernels::ActiveIsa() (GCC's target_clones would do the same through
// an ifunc resolver, which crashes a ThreadSanitizer build before main). Each element is one
// product and one sum, never fused (this file is built with -ffp-contract=off), and Dot's eight
// partial sums are spelled out, so every width gives the same bits.
template <class T>
[[gnu::always_inline]] inline void AddScaledBody(T* y, const T* x, T a, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}
// Σ a[k]·b[k] in one fixed order — 8 interleaved partial sums (which the compiler keeps in
// vector lanes), then the partials pairwise — so a value does not depend on the thread that
// computes it.
[[gnu::always_inline]] inline double DotBody(const double* a, const double* b, int64_t n) {
  double p[8] = {};
  int64_t k = 0;
  for (; k + 8 <= n; k += 8)
    for (int u = 0; u < 8; ++u) p[u] += a[k + u] * b[k + u];
  for (int u = 0; k < n; ++k, ++u) p[u] += a[k] * b[k];
  return ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
}

struct RowOps {
  void (*add_scaled)(double*, const double*, double, int64_t);
  void (*add_scaled_f)(float*, const float*, float, int64_t);
  double (*dot)(const double*, const double*, int64_t);
};
template <class T>
[[gnu::target("avx512f")]] void AddScaled512(T* y, const T* x, T a, int64_t n) {
  AddScaledBody(y, x, a, n);
}
[[gnu::target("avx512f")]] double Dot512(const double* a, const double* b, int64_t n) {
  return DotBody(a, b, n);
}
template <class T>
[[gnu::target("avx2")]] void AddScaled256(T* y, const T* x, T a, int64_t n) {
  AddScaledBody(y, x, a, n);
}
[[gnu::target("avx2")]] double Dot256(const double* a, const double* b, int64_t n) {
  return DotBody(a, b, n);
}
template <class T>
void AddScaledBase(T* y, const T* x, T a, int64_t n) {
  AddScaledBody(y, x, a, n);
}
double DotBase(const double* a, const double* b, int64_t n) { return DotBody(a, b, n); }

RowOps Ops() {
  switch (kernels::ActiveIsa()) {
    case kernels::IsaLevel::kScalar:
      return {AddScaledBase<double>, AddScaledBase<float>, DotBase};
    case kernels::IsaLevel::kAvx2:
      return {AddScaled256<double>, AddScaled256<float>, Dot256};
    default:
      return {AddScaled512<double>, AddScaled512<float>, Dot512};
  }
}

// y[i] += a·x[i].
void AddScaled(double* y, const double* x, double a, int64_t n) { Ops().add_scaled(y, x, a, n); }
void AddScaledF(float* y, const float* x, float a, int64_t n) { Ops().add_scaled_f(y, x, a, n); }
double Dot(const double* a, const double* b, int64_t n) { return Ops().dot(a, b, n); }

// fn(b, e) over slices of [begin, end) on the pool's threads (inline when the range is short:
// the Cholesky hands out one column's rows at a time, down to a handful).
void ForRange(ThreadPool* pool, int64_t begin, int64_t end,
              const std::function<void(int64_t, int64_t)>& fn) {
  if (end - begin < 256) {
    if (begin < end) fn(begin, end);
    return;
  }
  ForRows(pool, end - begin, 1, [&](int64_t b, int64_t e) { fn(begin + b, begin + e); });
}

// The lower Cholesky factor L of A = J·H·J (H [C, C] symmetric, J the reversal), column by
// column (Crout): each column's entries below the diagonal are independent dot products of
// rows of L, shared out to the threads. kFailedPrecondition if A is not positive definite.
Status CholeskyOfReversed(const std::vector<double>& h, int64_t C, ThreadPool* pool,
                          std::vector<double>* out) {
  std::vector<double>& L = *out;
  L.assign(static_cast<size_t>(C * C), 0.0);
  auto A = [&](int64_t i, int64_t j) {
    return h[static_cast<size_t>((C - 1 - i) * C + (C - 1 - j))];
  };
  for (int64_t j = 0; j < C; ++j) {
    const double* lj = L.data() + j * C;
    const double s = A(j, j) - Dot(lj, lj, j);
    if (!(s > 0)) {
      return FailedPreconditionError("the damped Hessian is not positive definite (raise --damp)");
    }
    const double d = std::sqrt(s);
    L[static_cast<size_t>(j * C + j)] = d;
    ForRange(pool, j + 1, C, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        double* li = L.data() + i * C;
        li[j] = (A(i, j) - Dot(li, lj, j)) / d;
      }
    });
  }
  return OkStatus();
}

// U = R⁻¹ for R = J·L·J (upper triangular: R[i][k] = L[C−1−i][C−1−k]), as floats. Row by row
// from the bottom: row i of U is −(1/R[i][i])·Σ_{k>i} R[i][k]·(row k of U), so each step is
// a sum of contiguous rows (no reductions), its columns shared out to the threads; rows go in
// blocks of 4 so that each row k read serves four. Each entry's sum runs over k in one fixed
// order whatever the threads.
std::vector<float> InverseOfReversedUpper(const std::vector<double>& L, int64_t C,
                                          ThreadPool* pool) {
  auto R = [&](int64_t i, int64_t k) {
    return L[static_cast<size_t>((C - 1 - i) * C + (C - 1 - k))];
  };
  std::vector<double> Ud(static_cast<size_t>(C * C), 0.0);
  constexpr int64_t kRows = 4;
  for (int64_t top_end = C; top_end > 0; top_end -= kRows) {
    const int64_t lo = std::max<int64_t>(0, top_end - kRows), hi = top_end;  // rows [lo, hi)
    ForRange(pool, lo, C, [&](int64_t j0, int64_t j1) {
      // Rows k ≥ hi (already final) into each row of the block, then the block bottom up.
      for (int64_t k = hi; k < j1; ++k) {
        const double* uk = Ud.data() + k * C;
        const int64_t a = std::max(j0, k);
        for (int64_t i = lo; i < hi; ++i) {
          if (a < j1) AddScaled(Ud.data() + i * C + a, uk + a, R(i, k), j1 - a);
        }
      }
      for (int64_t i = hi - 1; i >= lo; --i) {
        double* ui = Ud.data() + i * C;
        for (int64_t k = hi - 1; k > i; --k) {  // rows of the block below i, final by now
          const int64_t a = std::max(j0, k);
          if (a < j1) AddScaled(ui + a, Ud.data() + k * C + a, R(i, k), j1 - a);
        }
        const double inv = 1.0 / R(i, i);
        for (int64_t j = std::max(j0, i + 1); j < j1; ++j) ui[j] *= -inv;
        if (i >= j0 && i < j1) ui[i] = inv;
      }
    });
  }
  std::vector<float> U(Ud.size());
  for (size_t e = 0; e < Ud.size(); ++e) U[e] = static_cast<float>(Ud[e]);
  return U;
}

// Local search on the true objective f = (Δ − Δ̃)·H·(Δ − Δ̃)ᵀ of each row, after OBS: moves one
// kept value to the grid point nearest its optimum given the others, or swaps a kept and a
// pruned column of a 2:4 block (the pruned one taking its optimal grid value), whenever f drops.
// Scales stay as OBS chose them. Each accepted move costs O(cols) (g = (Δ − Δ̃)·H is kept
// current); evaluating one costs O(1).
//
// Rows go in blocks of kRefineRows that take each step together — g's initial product, then
// column by column through every sweep — so that a row of H, read from memory once, serves the
// whole block (one row at a time read all of H per row and per sweep: minutes per matrix at
// 2048 columns). Each row's arithmetic is exactly what it would do alone.
constexpr int64_t kRefineRows = 32;

void RefineRows(const std::vector<float>& d, const std::vector<double>& h, UnpackedMatrix* m,
                int sweeps, ThreadPool* pool) {
  const MatrixLayout& l = m->layout;
  const int64_t C = l.cols, kept = l.kept_per_row();
  auto Hd = [&](int64_t a, int64_t b) { return h[static_cast<size_t>(a * C + b)]; };
  ForRows(pool, l.rows, 1, [&](int64_t r0, int64_t r1) {
    const size_t block_elems = static_cast<size_t>(kRefineRows * C);
    std::vector<double> v(block_elems), e(block_elems), g(block_elems);
    std::vector<int> code(block_elems);
    std::vector<uint8_t> active(kRefineRows), changed(kRefineRows);
    for (int64_t rb = r0; rb < r1; rb += kRefineRows) {
      const int64_t nb = std::min(kRefineRows, r1 - rb);
      for (int64_t b = 0; b < nb; ++b) {
        const int64_t r = rb + b;
        int* cb = code.data() + b * C;
        double* vb = v.data() + b * C;
        double* eb = e.data() + b * C;
        std::fill(cb, cb + C, -1);
        std::fill(vb, vb + C, 0.0);
        for (int64_t j = 0; j < kept; ++j) {
          const int64_t c = m->KeptColumn(r, j);
          cb[c] = m->codes[static_cast<size_t>(r * kept + j)];
          vb[c] = delta::Dequantize(cb[c], m->Scale(r, c), l);
        }
        for (int64_t c = 0; c < C; ++c) eb[c] = d[static_cast<size_t>(r * C + c)] - vb[c];
        std::fill(g.data() + b * C, g.data() + (b + 1) * C, 0.0);
        active[static_cast<size_t>(b)] = 1;
      }
      // g = e·H, each row's sum over k in order, each row of H read once for the block.
      for (int64_t k = 0; k < C; ++k) {
        const double* hk = h.data() + k * C;
        for (int64_t b = 0; b < nb; ++b) {
          const double ek = e[static_cast<size_t>(b * C + k)];
          if (ek == 0) continue;
          AddScaled(g.data() + b * C, hk, ek, C);
        }
      }
      // Best grid value for column c of row r when gc is its gradient term and cur its value.
      auto best = [&](int64_t r, int64_t c, double gc, double cur, int* out_code) {
        const float s = m->Scale(r, c);
        const int q = delta::QuantizeCode(static_cast<float>(cur + gc / Hd(c, c)), s, l);
        *out_code = q;
        return static_cast<double>(delta::Dequantize(q, s, l)) - cur;
      };
      auto move = [&](int64_t b, int64_t c, double dv) {
        v[static_cast<size_t>(b * C + c)] += dv;
        e[static_cast<size_t>(b * C + c)] -= dv;
        AddScaled(g.data() + b * C, h.data() + c * C, -dv, C);  // g −= dv·H[c], the same bits
      };
      for (int sweep = 0; sweep < sweeps; ++sweep) {
        std::fill(changed.begin(), changed.end(), 0);
        for (int64_t c = 0; c < C; ++c) {
          for (int64_t b = 0; b < nb; ++b) {
            int* cb = code.data() + b * C;
            if (!active[static_cast<size_t>(b)] || cb[c] < 0) continue;
            const size_t bc = static_cast<size_t>(b * C + c);
            int q;
            const double dv = best(rb + b, c, g[bc], v[bc], &q);
            const double df = -2 * dv * g[bc] + dv * dv * Hd(c, c);
            if (dv != 0 && df < 0) {
              move(b, c, dv);
              cb[c] = q;
              changed[static_cast<size_t>(b)] = 1;
            }
          }
        }
        if (l.sparse24) {
          for (int64_t blk = 0; blk < C; blk += 4) {
            for (int64_t b = 0; b < nb; ++b) {
              if (!active[static_cast<size_t>(b)]) continue;
              int* cb = code.data() + b * C;
              const double* vb = v.data() + b * C;
              const double* gb = g.data() + b * C;
              double best_df = 0;
              int64_t ba = -1, bp = -1;
              int bq = 0;
              double bdp = 0;
              for (int64_t a = blk; a < blk + 4; ++a) {
                if (cb[a] < 0) continue;
                const double da = -vb[a];
                const double dfa = -2 * da * gb[a] + da * da * Hd(a, a);
                for (int64_t p = blk; p < blk + 4; ++p) {
                  if (cb[p] >= 0) continue;
                  const double gp = gb[p] - da * Hd(a, p);
                  int q;
                  const double dp = best(rb + b, p, gp, 0.0, &q);
                  const double df = dfa - 2 * dp * gp + dp * dp * Hd(p, p);
                  if (df < best_df) {
                    best_df = df;
                    ba = a;
                    bp = p;
                    bq = q;
                    bdp = dp;
                  }
                }
              }
              if (ba >= 0) {
                move(b, ba, -vb[ba]);
                cb[ba] = -1;
                move(b, bp, bdp);
                cb[bp] = bq;
                changed[static_cast<size_t>(b)] = 1;
              }
            }
          }
        }
        bool any = false;
        for (int64_t b = 0; b < nb; ++b) {
          active[static_cast<size_t>(b)] &= changed[static_cast<size_t>(b)];
          any |= active[static_cast<size_t>(b)] != 0;
        }
        if (!any) break;
      }
      for (int64_t b = 0; b < nb; ++b) {
        const int64_t r = rb + b;
        const int* cb = code.data() + b * C;
        int64_t j = 0;
        for (int64_t c = 0; c < C; ++c) {
          if (cb[c] < 0) continue;
          m->codes[static_cast<size_t>(r * kept + j++)] = static_cast<uint8_t>(cb[c]);
        }
        if (l.sparse24) {
          for (int64_t blk = 0; blk < C; blk += 4) {
            int first = -1, second = -1;
            for (int k = 0; k < 4; ++k) {
              if (cb[blk + k] < 0) continue;
              (first < 0 ? first : second) = k;
            }
            m->patterns[static_cast<size_t>(r * (C / 4) + blk / 4)] =
                static_cast<uint8_t>(delta::Pattern24(first, second));
          }
        }
      }
    }
  });
}

}  // namespace

Result<std::vector<float>> InverseCholeskyUpper(const std::vector<double>& h, int64_t C,
                                                ThreadPool* pool) {
  // H = R·Rᵀ with R upper triangular, from the lower Cholesky factor of the reversed matrix
  // (J·H·J = L·Lᵀ, R = J·L·J); then U = R⁻¹ is the upper Cholesky factor of H⁻¹ (H⁻¹ = UᵀU).
  std::vector<double> L;
  CHORUS_RETURN_IF_ERROR(CholeskyOfReversed(h, C, pool, &L));
  return InverseOfReversedUpper(L, C, pool);
}

UnpackedMatrix RtnCompress(const std::vector<float>& d, const MatrixLayout& l) {
  UnpackedMatrix m = Empty(l);
  const int64_t kept = l.kept_per_row();
  std::vector<uint8_t> keep(static_cast<size_t>(l.cols));
  for (int64_t r = 0; r < l.rows; ++r) {
    const float* w = d.data() + r * l.cols;
    std::fill(keep.begin(), keep.end(), l.sparse24 ? 0 : 1);
    if (l.sparse24) {
      for (int64_t g = 0; g < l.cols / 4; ++g) {
        auto [a, b] = KeepTwo([&](int j) { return std::fabs(w[g * 4 + j]); });
        m.patterns[static_cast<size_t>(r * (l.cols / 4) + g)] =
            static_cast<uint8_t>(delta::Pattern24(a, b));
        keep[static_cast<size_t>(g * 4 + a)] = keep[static_cast<size_t>(g * 4 + b)] = 1;
      }
    }
    if (l.group_size > 0) {
      for (int64_t g = 0; g < l.groups_per_row(); ++g) {
        float mx = 0;
        for (int64_t c = g * l.group_size; c < std::min(l.cols, (g + 1) * l.group_size); ++c)
          if (keep[static_cast<size_t>(c)]) mx = std::max(mx, std::fabs(w[c]));
        m.scales[static_cast<size_t>(r * l.groups_per_row() + g)] =
            delta::ScaleForMaxAbs(mx, l, true);
      }
    }
  }
  if (l.group_size == 0) {
    float mx = 0;
    for (float v : d) mx = std::max(mx, std::fabs(v));
    m.scales[0] = delta::ScaleForMaxAbs(mx, l, false);
  }
  for (int64_t r = 0; r < l.rows; ++r) {
    for (int64_t j = 0; j < kept; ++j) {
      const int64_t c = m.KeptColumn(r, j);
      m.codes[static_cast<size_t>(r * kept + j)] = static_cast<uint8_t>(
          delta::QuantizeCode(d[static_cast<size_t>(r * l.cols + c)], m.Scale(r, c), l));
    }
  }
  return m;
}

UnpackedMatrix SignCompress(const std::vector<float>& d, const MatrixLayout& l) {
  // Magnitude 2:4 (if asked) as RTN does, then sign codes and the mean |kept| scale.
  MatrixLayout l1 = l;
  UnpackedMatrix m = RtnCompress(d, l1);
  const int64_t kept = l.kept_per_row();
  double sum = 0;
  for (int64_t r = 0; r < l.rows; ++r) {
    for (int64_t j = 0; j < kept; ++j) {
      const float v = d[static_cast<size_t>(r * l.cols + m.KeptColumn(r, j))];
      sum += std::fabs(v);
      m.codes[static_cast<size_t>(r * kept + j)] = v >= 0 ? 1 : 0;
    }
  }
  const double mean = sum / static_cast<double>(l.rows * kept);
  m.scales[0] = static_cast<float>(2 * mean);
  if (!(m.scales[0] > 0)) m.scales[0] = 1e-8f;
  return m;
}

Result<UnpackedMatrix> ObsCompress(const std::vector<float>& d, std::vector<double> h,
                                   const MatrixLayout& l, double damp, ThreadPool* pool,
                                   int refine_sweeps) {
  const int64_t C = l.cols, R = l.rows;
  auto H = [&](int64_t i, int64_t j) -> double& { return h[static_cast<size_t>(i * C + j)]; };
  std::vector<float> w = d;
  double mean_diag = 0;
  for (int64_t i = 0; i < C; ++i) {
    if (H(i, i) <= 0) {  // an input never seen: its column cannot matter on the calibration data
      H(i, i) = 1;
      for (int64_t r = 0; r < R; ++r) w[static_cast<size_t>(r * C + i)] = 0;
    }
    mean_diag += H(i, i);
  }
  mean_diag /= static_cast<double>(C);
  for (int64_t i = 0; i < C; ++i) H(i, i) += damp * mean_diag;

  CHORUS_ASSIGN_OR_RETURN(std::vector<float> U, InverseCholeskyUpper(h, C, pool));

  UnpackedMatrix m = Empty(l);
  if (l.group_size == 0) {
    float mx = 0;
    for (float v : w) mx = std::max(mx, std::fabs(v));
    m.scales[0] = delta::ScaleForMaxAbs(mx, l, false);
  }
  const int64_t kept = l.kept_per_row();
  constexpr int64_t kBlock =
      16;  // rows processed together, so each row of U is read once per block
  ForRows(pool, R, kBlock, [&](int64_t r0, int64_t r1) {
    std::vector<float> err(kBlock);
    std::vector<uint8_t> keep(static_cast<size_t>(kBlock * 4));
    std::vector<int64_t> n_kept(kBlock, 0);
    for (int64_t rb = r0; rb < r1; rb += kBlock) {
      const int64_t nb = std::min(kBlock, r1 - rb);
      std::fill(n_kept.begin(), n_kept.end(), 0);
      for (int64_t i = 0; i < C; ++i) {
        const float* u = U.data() + i * C;
        for (int64_t b = 0; b < nb; ++b) {
          const int64_t r = rb + b;
          float* wr = w.data() + r * C;
          if (l.sparse24 && i % 4 == 0) {
            auto [a, c2] = KeepTwo([&](int j) {
              const double uj = U[static_cast<size_t>((i + j) * C + i + j)];
              return static_cast<double>(wr[i + j]) * wr[i + j] / (uj * uj);
            });
            m.patterns[static_cast<size_t>(r * (C / 4) + i / 4)] =
                static_cast<uint8_t>(delta::Pattern24(a, c2));
            for (int j = 0; j < 4; ++j) keep[static_cast<size_t>(b * 4 + j)] = (j == a || j == c2);
          }
          if (l.group_size > 0 && i % l.group_size == 0) {
            float mx = 0;
            for (int64_t c = i; c < std::min(C, i + l.group_size); ++c)
              mx = std::max(mx, std::fabs(wr[c]));
            m.scales[static_cast<size_t>(r * l.groups_per_row() + i / l.group_size)] =
                delta::ScaleForMaxAbs(mx, l, true);
          }
          const bool kept_here = !l.sparse24 || keep[static_cast<size_t>(b * 4 + i % 4)];
          float q = 0;
          if (kept_here) {
            const float s = m.Scale(r, i);
            const int code = delta::QuantizeCode(wr[i], s, l);
            m.codes[static_cast<size_t>(r * kept + n_kept[static_cast<size_t>(b)]++)] =
                static_cast<uint8_t>(code);
            q = delta::Dequantize(code, s, l);
          }
          err[static_cast<size_t>(b)] = (wr[i] - q) / u[i];
        }
        for (int64_t b = 0; b < nb; ++b) {
          float* wr = w.data() + (rb + b) * C;
          // w −= e·u over the columns not yet processed (the same bits as a subtraction).
          AddScaledF(wr + i + 1, u + i + 1, -err[static_cast<size_t>(b)], C - i - 1);
        }
      }
    }
  });
  if (refine_sweeps > 0) RefineRows(d, h, &m, refine_sweeps, pool);
  return m;
}

double OutputError(const std::vector<float>& a, const std::vector<float>& b, int64_t rows,
                   int64_t cols, const std::vector<float>& x, int64_t n) {
  double total = 0;
  for (int64_t t = 0; t < n; ++t) {
    const float* xt = x.data() + t * cols;
    for (int64_t r = 0; r < rows; ++r) {
      double s = 0;
      for (int64_t c = 0; c < cols; ++c)
        s += (static_cast<double>(a[static_cast<size_t>(r * cols + c)]) -
              b[static_cast<size_t>(r * cols + c)]) *
             xt[c];
      total += s * s;
    }
  }
  return total / static_cast<double>(n);
}

}  // namespace chorus::compress
