#include "chorus/compress/quantize.h"

#include <algorithm>
#include <cmath>
#include <functional>

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

// Local search on the true objective f = (Δ − Δ̃)·H·(Δ − Δ̃)ᵀ of each row, after OBS: moves one
// kept value to the grid point nearest its optimum given the others, or swaps a kept and a
// pruned column of a 2:4 block (the pruned one taking its optimal grid value), whenever f drops.
// Scales stay as OBS chose them. Each accepted move costs O(cols) (g = (Δ − Δ̃)·H is kept
// current); evaluating one costs O(1).
void RefineRows(const std::vector<float>& d, const std::vector<double>& h, UnpackedMatrix* m,
                int sweeps, ThreadPool* pool) {
  const MatrixLayout& l = m->layout;
  const int64_t C = l.cols, kept = l.kept_per_row();
  ForRows(pool, l.rows, 1, [&](int64_t r0, int64_t r1) {
    std::vector<double> v(static_cast<size_t>(C)), e(static_cast<size_t>(C)),
        g(static_cast<size_t>(C));
    std::vector<int> code(static_cast<size_t>(C));
    for (int64_t r = r0; r < r1; ++r) {
      std::fill(code.begin(), code.end(), -1);
      std::fill(v.begin(), v.end(), 0.0);
      for (int64_t j = 0; j < kept; ++j) {
        const int64_t c = m->KeptColumn(r, j);
        code[static_cast<size_t>(c)] = m->codes[static_cast<size_t>(r * kept + j)];
        v[static_cast<size_t>(c)] =
            delta::Dequantize(code[static_cast<size_t>(c)], m->Scale(r, c), l);
      }
      for (int64_t c = 0; c < C; ++c)
        e[static_cast<size_t>(c)] = d[static_cast<size_t>(r * C + c)] - v[static_cast<size_t>(c)];
      std::fill(g.begin(), g.end(), 0.0);
      for (int64_t k = 0; k < C; ++k) {
        const double ek = e[static_cast<size_t>(k)];
        if (ek == 0) continue;
        const double* hk = h.data() + k * C;
        for (int64_t c = 0; c < C; ++c) g[static_cast<size_t>(c)] += ek * hk[c];
      }
      auto Hd = [&](int64_t a, int64_t b) { return h[static_cast<size_t>(a * C + b)]; };
      // Best grid value for column c when g_c is its gradient term and its current value is cur.
      auto best = [&](int64_t c, double gc, double cur, int* out_code) {
        const float s = m->Scale(r, c);
        const int q = delta::QuantizeCode(static_cast<float>(cur + gc / Hd(c, c)), s, l);
        *out_code = q;
        return static_cast<double>(delta::Dequantize(q, s, l)) - cur;
      };
      auto move = [&](int64_t c, double dv) {
        v[static_cast<size_t>(c)] += dv;
        e[static_cast<size_t>(c)] -= dv;
        const double* hc = h.data() + c * C;
        for (int64_t k = 0; k < C; ++k) g[static_cast<size_t>(k)] -= dv * hc[k];
      };
      for (int sweep = 0; sweep < sweeps; ++sweep) {
        bool changed = false;
        for (int64_t c = 0; c < C; ++c) {
          if (code[static_cast<size_t>(c)] < 0) continue;
          int q;
          const double dv = best(c, g[static_cast<size_t>(c)], v[static_cast<size_t>(c)], &q);
          const double df = -2 * dv * g[static_cast<size_t>(c)] + dv * dv * Hd(c, c);
          if (dv != 0 && df < 0) {
            move(c, dv);
            code[static_cast<size_t>(c)] = q;
            changed = true;
          }
        }
        if (l.sparse24) {
          for (int64_t b = 0; b < C; b += 4) {
            double best_df = 0;
            int64_t ba = -1, bp = -1;
            int bq = 0;
            double bdp = 0;
            for (int64_t a = b; a < b + 4; ++a) {
              if (code[static_cast<size_t>(a)] < 0) continue;
              const double da = -v[static_cast<size_t>(a)];
              const double dfa = -2 * da * g[static_cast<size_t>(a)] + da * da * Hd(a, a);
              for (int64_t p = b; p < b + 4; ++p) {
                if (code[static_cast<size_t>(p)] >= 0) continue;
                const double gp = g[static_cast<size_t>(p)] - da * Hd(a, p);
                int q;
                const double dp = best(p, gp, 0.0, &q);
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
              move(ba, -v[static_cast<size_t>(ba)]);
              code[static_cast<size_t>(ba)] = -1;
              move(bp, bdp);
              code[static_cast<size_t>(bp)] = bq;
              changed = true;
            }
          }
        }
        if (!changed) break;
      }
      int64_t j = 0;
      for (int64_t c = 0; c < C; ++c) {
        if (code[static_cast<size_t>(c)] < 0) continue;
        m->codes[static_cast<size_t>(r * kept + j++)] =
            static_cast<uint8_t>(code[static_cast<size_t>(c)]);
      }
      if (l.sparse24) {
        for (int64_t b = 0; b < C; b += 4) {
          int first = -1, second = -1;
          for (int k = 0; k < 4; ++k) {
            if (code[static_cast<size_t>(b + k)] < 0) continue;
            (first < 0 ? first : second) = k;
          }
          m->patterns[static_cast<size_t>(r * (C / 4) + b / 4)] =
              static_cast<uint8_t>(delta::Pattern24(first, second));
        }
      }
    }
  });
}

}  // namespace

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

  // H = R·Rᵀ with R upper triangular, from the lower Cholesky factor of the reversed matrix
  // (J·H·J = L·Lᵀ, R = J·L·J); then U = R⁻¹ is the upper Cholesky factor of H⁻¹ (H⁻¹ = UᵀU).
  std::vector<double> L(static_cast<size_t>(C * C), 0.0);
  auto Lr = [&](int64_t i, int64_t j) -> double& { return L[static_cast<size_t>(i * C + j)]; };
  for (int64_t i = 0; i < C; ++i) {
    for (int64_t j = 0; j <= i; ++j) {
      double s = H(C - 1 - i, C - 1 - j);
      const double* li = &Lr(i, 0);
      const double* lj = &Lr(j, 0);
      for (int64_t k = 0; k < j; ++k) s -= li[k] * lj[k];
      if (i == j) {
        if (!(s > 0)) {
          return FailedPreconditionError(
              "the damped Hessian is not positive definite (raise --damp)");
        }
        Lr(i, i) = std::sqrt(s);
      } else {
        Lr(i, j) = s / Lr(j, j);
      }
    }
  }
  // R[i][j] = L[C-1-i][C-1-j] (j ≥ i). U = R⁻¹, upper: column by column, bottom up.
  auto Rv = [&](int64_t i, int64_t j) {
    return L[static_cast<size_t>((C - 1 - i) * C + (C - 1 - j))];
  };
  std::vector<float> U(static_cast<size_t>(C * C), 0.0f);
  {
    std::vector<double> col(static_cast<size_t>(C));
    for (int64_t j = 0; j < C; ++j) {
      col[static_cast<size_t>(j)] = 1.0 / Rv(j, j);
      for (int64_t i = j - 1; i >= 0; --i) {
        double s = 0;
        for (int64_t k = i + 1; k <= j; ++k) s += Rv(i, k) * col[static_cast<size_t>(k)];
        col[static_cast<size_t>(i)] = -s / Rv(i, i);
      }
      for (int64_t i = 0; i <= j; ++i)
        U[static_cast<size_t>(i * C + j)] = static_cast<float>(col[static_cast<size_t>(i)]);
    }
  }

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
          const float e = err[static_cast<size_t>(b)];
          for (int64_t j = i + 1; j < C; ++j) wr[j] -= e * u[j];
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
