#include "chorus/train/layer_ops.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace chorus::train {
namespace {

// fn(i) for i in [0, n), split statically into contiguous ranges between the threads.
template <typename Fn>
void ParallelFor(int64_t n, ThreadPool* pool, const Fn& fn) {
  if (pool == nullptr || pool->size() <= 1 || n <= 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  pool->Run([&](int ti, int nt) {
    const int64_t b = n * ti / nt, e = n * (ti + 1) / nt;
    for (int64_t i = b; i < e; ++i) fn(i);
  });
}

// Eight interleaved partial sums (a fixed association, so the compiler can keep them in one
// vector register) folded in a fixed order; plain multiply-adds rather than std::fma, which
// without -mfma is a library call per element.
float Dot(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int l = 0; l < 8; ++l) acc[l] += a[i + l] * b[i + l];
  }
  for (; i < n; ++i) acc[0] += a[i] * b[i];
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

// y[i] += a·x[i] (vectorized by the compiler: no reduction).
void Axpy(float a, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

}  // namespace

void RmsNormBackward(const float* x, const float* w, int64_t m, int64_t n, float eps,
                     const float* dy, float* dx, bool accumulate) {
  for (int64_t i = 0; i < m; ++i) {
    const float* xr = x + i * n;
    const float* g = dy + i * n;
    float* out = dx + i * n;
    double ss = 0.0, dot = 0.0;
    for (int64_t j = 0; j < n; ++j) {
      ss += static_cast<double>(xr[j]) * xr[j];
      dot += static_cast<double>(g[j]) * w[j] * xr[j];
    }
    const double r = 1.0 / std::sqrt(ss / static_cast<double>(n) + eps);
    const double c = dot * r * r * r / static_cast<double>(n);
    for (int64_t j = 0; j < n; ++j) {
      const float v = static_cast<float>(r * g[j] * w[j] - c * xr[j]);
      out[j] = accumulate ? out[j] + v : v;
    }
  }
}

void SiluMulBackward(const float* g, const float* u, const float* dh, int64_t n, float* dg,
                     float* du) {
  for (int64_t i = 0; i < n; ++i) {
    const float x = g[i], h = dh[i], up = u[i];
    const float sig = 1.0f / (1.0f + std::exp(-x));
    const float silu = x * sig;
    dg[i] = h * up * sig * (1.0f + x * (1.0f - sig));
    du[i] = h * silu;
  }
}

void RopeBackward(float* dx, int64_t n_heads, int64_t head_dim, const float* cos_t,
                  const float* sin_t, kernels::RopeLayout layout) {
  // The rotation by −θ is the rotation with the sines negated.
  const int64_t half = head_dim / 2;
  float neg_sin[kernels::kMaxRopeHeadDim / 2];
  for (int64_t i = 0; i < half; ++i) neg_sin[i] = -sin_t[i];
  kernels::reference::RopeApply(dx, n_heads, head_dim, cos_t, neg_sin, layout);
}

int64_t AttentionProbFloats(const int32_t* seg_start, int64_t n, const AttentionShape& s) {
  int64_t per_head = 0;
  for (int64_t t = 0; t < n; ++t) per_head += t - seg_start[t] + 1;
  return per_head * s.n_heads;
}

namespace {

// Offsets of each row's probabilities inside one head's block.
std::vector<int64_t> ProbOffsets(const int32_t* seg_start, int64_t n, int64_t* per_head) {
  std::vector<int64_t> off(static_cast<size_t>(n));
  int64_t o = 0;
  for (int64_t t = 0; t < n; ++t) {
    off[static_cast<size_t>(t)] = o;
    o += t - seg_start[t] + 1;
  }
  *per_head = o;
  return off;
}

}  // namespace

void AttentionForward(const float* q, const float* k, const float* v, const int32_t* seg_start,
                      int64_t n, const AttentionShape& s, float* probs, float* out,
                      ThreadPool* pool) {
  const int64_t hd = s.head_dim, qd = s.n_heads * hd, kvd = s.n_kv_heads * hd;
  const int64_t group = s.n_heads / s.n_kv_heads;
  int64_t per_head = 0;
  const std::vector<int64_t> off = ProbOffsets(seg_start, n, &per_head);
  ParallelFor(s.n_heads, pool, [&](int64_t h) {
    const int64_t g = h / group;
    float* ph = probs + h * per_head;
    for (int64_t t = 0; t < n; ++t) {
      const float* qt = q + t * qd + h * hd;
      const int64_t j0 = seg_start[t];
      float* p = ph + off[static_cast<size_t>(t)];
      float mx = -INFINITY;
      for (int64_t j = j0; j <= t; ++j) {
        p[j - j0] = Dot(qt, k + j * kvd + g * hd, hd) * s.scale;
        mx = std::max(mx, p[j - j0]);
      }
      double sum = 0.0;
      for (int64_t j = j0; j <= t; ++j) {
        p[j - j0] = std::exp(p[j - j0] - mx);
        sum += p[j - j0];
      }
      const float inv = static_cast<float>(1.0 / sum);
      float* o = out + t * qd + h * hd;
      std::fill(o, o + hd, 0.0f);
      for (int64_t j = j0; j <= t; ++j) {
        p[j - j0] *= inv;
        const float* vj = v + j * kvd + g * hd;
        Axpy(p[j - j0], vj, o, hd);
      }
    }
  });
}

void AttentionBackward(const float* q, const float* k, const float* v, const float* probs,
                       const int32_t* seg_start, int64_t n, const AttentionShape& s,
                       const float* dout, float* dq, float* dk, float* dv, ThreadPool* pool) {
  const int64_t hd = s.head_dim, qd = s.n_heads * hd, kvd = s.n_kv_heads * hd;
  const int64_t group = s.n_heads / s.n_kv_heads;
  int64_t per_head = 0;
  const std::vector<int64_t> off = ProbOffsets(seg_start, n, &per_head);
  // One KV head per task: its query heads all write its dk / dv, in a fixed order.
  ParallelFor(s.n_kv_heads, pool, [&](int64_t g) {
    for (int64_t t = 0; t < n; ++t) {
      std::fill(dk + t * kvd + g * hd, dk + t * kvd + (g + 1) * hd, 0.0f);
      std::fill(dv + t * kvd + g * hd, dv + t * kvd + (g + 1) * hd, 0.0f);
    }
    std::vector<float> ds;
    for (int64_t h = g * group; h < (g + 1) * group; ++h) {
      const float* ph = probs + h * per_head;
      for (int64_t t = 0; t < n; ++t) {
        const int64_t j0 = seg_start[t], len = t - j0 + 1;
        const float* p = ph + off[static_cast<size_t>(t)];
        const float* go = dout + t * qd + h * hd;
        ds.resize(static_cast<size_t>(len));
        double pdp = 0.0;
        for (int64_t j = j0; j <= t; ++j) {
          const float dp = Dot(go, v + j * kvd + g * hd, hd);
          ds[static_cast<size_t>(j - j0)] = dp;
          pdp += static_cast<double>(p[j - j0]) * dp;
          float* dvj = dv + j * kvd + g * hd;
          Axpy(p[j - j0], go, dvj, hd);
        }
        const float* qt = q + t * qd + h * hd;
        float* dqt = dq + t * qd + h * hd;
        std::fill(dqt, dqt + hd, 0.0f);
        for (int64_t j = j0; j <= t; ++j) {
          const float dsj =
              p[j - j0] * (ds[static_cast<size_t>(j - j0)] - static_cast<float>(pdp)) * s.scale;
          const float* kj = k + j * kvd + g * hd;
          float* dkj = dk + j * kvd + g * hd;
          Axpy(dsj, kj, dqt, hd);
          Axpy(dsj, qt, dkj, hd);
        }
      }
    }
  });
}

double SoftmaxCrossEntropy(float* logits, const int32_t* targets, int64_t m, int64_t vocab,
                           float grad_scale, ThreadPool* pool) {
  std::vector<double> loss(static_cast<size_t>(m));
  ParallelFor(m, pool, [&](int64_t i) {
    float* l = logits + i * vocab;
    float mx = -INFINITY;
    for (int64_t j = 0; j < vocab; ++j) mx = std::max(mx, l[j]);
    double sum = 0.0;
    for (int64_t j = 0; j < vocab; ++j) sum += std::exp(static_cast<double>(l[j] - mx));
    const int32_t tgt = targets[i];
    loss[static_cast<size_t>(i)] = std::log(sum) - static_cast<double>(l[tgt] - mx);
    const double inv = 1.0 / sum;
    for (int64_t j = 0; j < vocab; ++j) {
      const double p = std::exp(static_cast<double>(l[j] - mx)) * inv;
      l[j] = static_cast<float>((p - (j == tgt ? 1.0 : 0.0)) * grad_scale);
    }
  });
  double total = 0.0;
  for (double x : loss) total += x;
  return total;
}

}  // namespace chorus::train
