// Finite-difference checks of every backward in layer_ops.h: each gradient is compared with
// central differences of the forward (kernels/ops.h or the training attention), in double where
// the loss is summed.
#include "chorus/train/layer_ops.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <vector>

#include "chorus/base/rng.h"
#include "chorus/kernels/ops.h"

namespace chorus::train {
namespace {

std::vector<float> Random(int64_t n, uint64_t seed, float scale = 1.0f) {
  Rng rng(seed);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = rng.NextGaussian() * scale;
  return v;
}

double Weighted(const std::vector<float>& y, const std::vector<float>& g) {
  double s = 0;
  for (size_t i = 0; i < y.size(); ++i) s += static_cast<double>(y[i]) * g[i];
  return s;
}

// Central differences of f at every `stride`-th element of x against grad.
void CheckFd(std::vector<float> x, const std::vector<float>& grad,
             const std::function<double(const std::vector<float>&)>& f, float h, double tol,
             const char* what, int64_t stride = 1) {
  for (size_t i = 0; i < x.size(); i += static_cast<size_t>(stride)) {
    const float x0 = x[i];
    x[i] = x0 + h;
    const double fp = f(x);
    x[i] = x0 - h;
    const double fm = f(x);
    x[i] = x0;
    const double fd = (fp - fm) / (2.0 * h);
    ASSERT_NEAR(fd, grad[i], tol * (1.0 + std::fabs(fd))) << what << " element " << i;
  }
}

TEST(LayerOpsTest, RmsNormBackward) {
  const int64_t m = 3, n = 37;
  const std::vector<float> x = Random(m * n, 1), w = Random(n, 2), g = Random(m * n, 3);
  std::vector<float> dx(x.size(), 0.25f), dx_acc(x.size(), 0.25f);
  RmsNormBackward(x.data(), w.data(), m, n, 1e-5f, g.data(), dx.data(), false);
  RmsNormBackward(x.data(), w.data(), m, n, 1e-5f, g.data(), dx_acc.data(), true);
  for (size_t i = 0; i < dx.size(); ++i) EXPECT_NEAR(dx_acc[i], dx[i] + 0.25f, 1e-5);
  CheckFd(
      x, dx,
      [&](const std::vector<float>& xs) {
        std::vector<float> y(xs.size());
        kernels::reference::RmsNorm(xs.data(), w.data(), m, n, 1e-5f, y.data());
        return Weighted(y, g);
      },
      1e-2f, 2e-3, "rmsnorm");
}

TEST(LayerOpsTest, SiluMulBackward) {
  const int64_t n = 300;
  const std::vector<float> gate = Random(n, 1, 3.0f), up = Random(n, 2), dh = Random(n, 3);
  std::vector<float> dg(n), du(n);
  SiluMulBackward(gate.data(), up.data(), dh.data(), n, dg.data(), du.data());
  auto f_gate = [&](const std::vector<float>& g) {
    std::vector<float> y(n);
    kernels::reference::SiluMul(g.data(), up.data(), n, y.data());
    return Weighted(y, dh);
  };
  auto f_up = [&](const std::vector<float>& u) {
    std::vector<float> y(n);
    kernels::reference::SiluMul(gate.data(), u.data(), n, y.data());
    return Weighted(y, dh);
  };
  CheckFd(gate, dg, f_gate, 1e-2f, 2e-3, "silu gate");
  CheckFd(up, du, f_up, 1e-2f, 2e-3, "silu up");
  // In place (dg aliasing dh), as the training pass calls it.
  std::vector<float> inplace = dh, du2(n);
  SiluMulBackward(gate.data(), up.data(), inplace.data(), n, inplace.data(), du2.data());
  EXPECT_EQ(inplace, dg);
  EXPECT_EQ(du2, du);
}

TEST(LayerOpsTest, RopeBackward) {
  for (auto layout : {kernels::RopeLayout::kInterleaved, kernels::RopeLayout::kHalf}) {
    const int64_t heads = 3, hd = 16, half = hd / 2;
    std::vector<float> inv(half);
    for (int64_t i = 0; i < half; ++i) inv[i] = std::pow(10000.0f, -2.0f * i / hd);
    std::vector<float> cs(half), sn(half);
    kernels::RopeTable(37, inv.data(), half, cs.data(), sn.data());
    const std::vector<float> x = Random(heads * hd, 1), g = Random(heads * hd, 2);
    std::vector<float> dx = g;
    RopeBackward(dx.data(), heads, hd, cs.data(), sn.data(), layout);
    CheckFd(
        x, dx,
        [&](const std::vector<float>& xs) {
          std::vector<float> y = xs;
          kernels::reference::RopeApply(y.data(), heads, hd, cs.data(), sn.data(), layout);
          return Weighted(y, g);
        },
        1e-2f, 2e-3, "rope");
  }
}

TEST(LayerOpsTest, AttentionBackwardPackedGqa) {
  // Two samples packed in one sequence (rows 0..4 and 5..10), 4 query heads over 2 KV heads.
  const AttentionShape s{4, 2, 8, 1.0f / std::sqrt(8.0f)};
  const int64_t n = 11, qd = 32, kvd = 16;
  std::vector<int32_t> seg(n);
  for (int64_t t = 0; t < n; ++t) seg[t] = t < 5 ? 0 : 5;
  const std::vector<float> q = Random(n * qd, 1), k = Random(n * kvd, 2), v = Random(n * kvd, 3),
                           g = Random(n * qd, 4);
  std::vector<float> probs(static_cast<size_t>(AttentionProbFloats(seg.data(), n, s)));
  std::vector<float> out(n * qd), dq(n * qd), dk(n * kvd), dv(n * kvd);
  ThreadPool pool(2);
  AttentionForward(q.data(), k.data(), v.data(), seg.data(), n, s, probs.data(), out.data(), &pool);
  AttentionBackward(q.data(), k.data(), v.data(), probs.data(), seg.data(), n, s, g.data(),
                    dq.data(), dk.data(), dv.data(), &pool);
  auto fwd = [&](const std::vector<float>& qq, const std::vector<float>& kk,
                 const std::vector<float>& vv) {
    std::vector<float> p(probs.size()), o(n * qd);
    AttentionForward(qq.data(), kk.data(), vv.data(), seg.data(), n, s, p.data(), o.data(),
                     nullptr);
    return Weighted(o, g);
  };
  CheckFd(
      q, dq, [&](const std::vector<float>& x) { return fwd(x, k, v); }, 1e-2f, 3e-3, "dq");
  CheckFd(
      k, dk, [&](const std::vector<float>& x) { return fwd(q, x, v); }, 1e-2f, 3e-3, "dk");
  CheckFd(
      v, dv, [&](const std::vector<float>& x) { return fwd(q, k, x); }, 1e-2f, 3e-3, "dv");
  // Rows of the second sample never see the first: its keys get no gradient from them.
  std::vector<float> out1(n * qd);
  std::vector<float> q2 = q;
  for (int64_t i = 5 * qd; i < n * qd; ++i) q2[i] += 1.0f;
  std::vector<float> probs1(probs.size());
  AttentionForward(q2.data(), k.data(), v.data(), seg.data(), n, s, probs1.data(), out1.data(),
                   nullptr);
  for (int64_t i = 0; i < 5 * qd; ++i) EXPECT_EQ(out1[i], out[i]);
  // The thread count changes nothing.
  std::vector<float> dq1(dq.size()), dk1(dk.size()), dv1(dv.size());
  ThreadPool pool3(3);
  AttentionBackward(q.data(), k.data(), v.data(), probs.data(), seg.data(), n, s, g.data(),
                    dq1.data(), dk1.data(), dv1.data(), &pool3);
  EXPECT_EQ(dq1, dq);
  EXPECT_EQ(dk1, dk);
  EXPECT_EQ(dv1, dv);
}

TEST(LayerOpsTest, SoftmaxCrossEntropy) {
  const int64_t m = 4, vocab = 23;
  const std::vector<float> logits = Random(m * vocab, 1, 2.0f);
  const std::vector<int32_t> tg = {0, 22, 5, 5};
  std::vector<float> grad = logits;
  const double loss = SoftmaxCrossEntropy(grad.data(), tg.data(), m, vocab, 0.5f, nullptr);
  auto f = [&](const std::vector<float>& l) {
    double s = 0;
    for (int64_t i = 0; i < m; ++i) {
      double z = 0;
      for (int64_t j = 0; j < vocab; ++j) z += std::exp(static_cast<double>(l[i * vocab + j]));
      s += std::log(z) - l[i * vocab + tg[i]];
    }
    return 0.5 * s;
  };
  EXPECT_NEAR(loss * 0.5, f(logits), 1e-6);
  CheckFd(logits, grad, f, 1e-2f, 1e-3, "cross-entropy");
}

}  // namespace
}  // namespace chorus::train
