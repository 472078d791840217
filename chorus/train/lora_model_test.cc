// test-labels: unit
// The whole-model LoRA gradient: analytic gradients of TrainModel against central finite
// differences of its loss, on a synthetic model and on the real stories260K (every target
// linear, packed samples); thread counts give bitwise-equal gradients; a quantized base trains
// through the same pass.
#include "chorus/train/lora_model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "chorus/base/rng.h"
#include "chorus/model/loader.h"
#include "chorus/model/synthetic.h"
#include "tests/testutil/testutil.h"

namespace chorus::train {
namespace {

using model::Linear;

const std::vector<Linear> kAll = {Linear::kQ,    Linear::kK,  Linear::kV,   Linear::kO,
                                  Linear::kGate, Linear::kUp, Linear::kDown};

// Two samples packed into one row block (lengths 9 and 7), loss on every row but the last of
// each sample.
Batch TwoSamples(int64_t vocab, uint64_t seed) {
  Rng rng(seed);
  Batch b;
  int32_t start = 0;
  for (int len : {9, 7}) {
    for (int i = 0; i < len; ++i) {
      b.tokens.push_back(static_cast<int32_t>(rng.NextU64() % static_cast<uint64_t>(vocab)));
      b.positions.push_back(i);
      b.seg_start.push_back(start);
    }
    for (int i = 0; i < len; ++i) {
      b.targets.push_back(i + 1 < len ? b.tokens[static_cast<size_t>(start + i + 1)] : -1);
    }
    start += len;
  }
  return b;
}

LoraParams RandomParams(const model::ModelConfig& c, int64_t rank, uint64_t seed) {
  LoraSpec spec;
  spec.rank = rank;
  spec.alpha = 2.0f * static_cast<float>(rank);
  spec.targets = kAll;
  spec.seed = seed;
  LoraParams p = *LoraParams::Init(c, spec);
  Rng rng(seed + 1);
  // B = 0 at init makes every dA zero; a random B exercises both factors.
  for (int64_t l = 0; l < c.n_layers; ++l) {
    for (Linear li : kAll) {
      for (float& x : p.module(l, li).bt.value) x = 0.05f * rng.NextGaussian();
    }
  }
  return p;
}

double MeanLoss(TrainModel& tm, const Batch& b, const LoraParams& p) {
  const LossSum ls = *tm.Loss(b, p, nullptr);
  return ls.sum / static_cast<double>(ls.tokens);
}

// Gradient of the mean loss; checks (1) the directional derivative along a random direction over
// all parameters and (2) single coordinates with the largest gradients of each module kind, by
// central differences, within `rel` relative error.
void CheckGradients(std::shared_ptr<const model::Model> m, double rel) {
  const model::ModelConfig& c = m->config();
  const Batch b = TwoSamples(c.vocab_size, 3);
  LoraParams p = RandomParams(c, 4, 5);
  TrainModel tm(m, 64);
  const float scale = 1.0f / static_cast<float>(b.loss_tokens());
  CHORUS_ASSERT_OK(tm.ForwardBackward(b, &p, scale, nullptr).status());

  // (1) Directional derivative.
  Rng rng(9);
  std::vector<std::vector<float>> dir;
  double analytic = 0;
  for (Param* prm : p.params()) {
    dir.emplace_back(prm->value.size());
    for (size_t i = 0; i < prm->value.size(); ++i) {
      dir.back()[i] = rng.NextGaussian();
      analytic += static_cast<double>(dir.back()[i]) * prm->grad[i];
    }
  }
  const float h = 1e-3f;
  auto shifted = [&](float t) {
    LoraParams q = p;
    std::vector<Param*> qs = q.params();
    for (size_t k = 0; k < qs.size(); ++k) {
      for (size_t i = 0; i < qs[k]->value.size(); ++i) qs[k]->value[i] += t * dir[k][i];
    }
    return MeanLoss(tm, b, q);
  };
  const double fd = (shifted(h) - shifted(-h)) / (2.0 * h);
  EXPECT_NEAR(analytic, fd, rel * std::fabs(fd)) << "directional derivative";

  // (2) Coordinates: for each linear kind, the largest |grad| entries of A and Bᵀ in the last
  // and the first layer.
  for (int64_t l : {int64_t{0}, c.n_layers - 1}) {
    for (Linear li : kAll) {
      for (int which = 0; which < 2; ++which) {
        Param& prm = which == 0 ? p.module(l, li).a : p.module(l, li).bt;
        const size_t i = static_cast<size_t>(
            std::max_element(prm.grad.begin(), prm.grad.end(),
                             [](float x, float y) { return std::fabs(x) < std::fabs(y); }) -
            prm.grad.begin());
        const float e = 1e-2f;
        const float x0 = prm.value[i];
        prm.value[i] = x0 + e;
        const double fp = MeanLoss(tm, b, p);
        prm.value[i] = x0 - e;
        const double fm = MeanLoss(tm, b, p);
        prm.value[i] = x0;
        const double fdi = (fp - fm) / (2.0 * e);
        EXPECT_NEAR(prm.grad[i], fdi, rel * std::fabs(fdi) + 2e-5)
            << "layer " << l << " " << model::LinearName(li) << (which ? " B" : " A") << "[" << i
            << "]";
      }
    }
  }
}

TEST(LoraModelTest, GradientsMatchFiniteDifferencesSynthetic) {
  model::SyntheticSpec spec;
  spec.shape = "tiny";
  CheckGradients(*model::MakeSyntheticModel(spec), 0.02);
}

TEST(LoraModelTest, GradientsMatchFiniteDifferencesStories260K) {
  CHORUS_REQUIRE_SHARED_MODEL("stories260K/stories260K.bin");
  auto m = model::LoadModel(testing::SharedModelsDir() + "/stories260K/stories260K.bin");
  CHORUS_ASSERT_OK(m.status());
  CheckGradients(*m, 0.02);
}

TEST(LoraModelTest, ThreadCountDoesNotChangeGradients) {
  model::SyntheticSpec spec;
  spec.shape = "tiny";
  auto m = *model::MakeSyntheticModel(spec);
  const Batch b = TwoSamples(m->config().vocab_size, 4);
  LoraParams p1 = RandomParams(m->config(), 8, 6), p3 = p1;
  TrainModel t1(m, 64), t3(m, 64);
  ThreadPool pool(3);
  const LossSum a = *t1.ForwardBackward(b, &p1, 0.1f, nullptr);
  const LossSum c = *t3.ForwardBackward(b, &p3, 0.1f, &pool);
  EXPECT_EQ(a.sum, c.sum);
  const auto g1 = p1.params();
  const auto g3 = p3.params();
  for (size_t k = 0; k < g1.size(); ++k) ASSERT_EQ(g1[k]->grad, g3[k]->grad) << k;
}

// QLoRA-style: a q8_0 / q4_0 base trains through the same pass; its gradients are close to
// those of an f32 base holding the dequantized weights (not equal: the forward quantizes
// activations for q8_0/q4_0 matmuls, kernels/matmul.h).
TEST(LoraModelTest, QuantizedBaseGradientsCloseToDequantized) {
  for (DType dt : {DType::kQ8_0, DType::kQ4_0}) {
    model::SyntheticSpec spec;
    spec.shape = "tiny";
    spec.dtype = dt;
    auto mq = *model::MakeSyntheticModel(spec);
    model::Model::NamedTensors f32;
    for (const auto& [name, t] : mq->tensors()) {
      f32.emplace_back(name, Tensor::FromF32(t.ToF32(), DType::kF32, t.shape()));
    }
    auto mf = *model::Model::Build(mq->config(), f32, model::ModelFormat::kSynthetic, "f32");
    const Batch b = TwoSamples(mq->config().vocab_size, 7);
    LoraParams pq = RandomParams(mq->config(), 4, 8), pf = pq;
    TrainModel tq(mq, 64), tf(mf, 64);
    CHORUS_ASSERT_OK(tq.ForwardBackward(b, &pq, 0.1f, nullptr).status());
    CHORUS_ASSERT_OK(tf.ForwardBackward(b, &pf, 0.1f, nullptr).status());
    double num = 0, den = 0;
    const auto gq = pq.params();
    const auto gf = pf.params();
    for (size_t k = 0; k < gq.size(); ++k) {
      for (size_t i = 0; i < gq[k]->grad.size(); ++i) {
        ASSERT_TRUE(std::isfinite(gq[k]->grad[i]));
        const double d = gq[k]->grad[i] - gf[k]->grad[i];
        num += d * d;
        den += static_cast<double>(gf[k]->grad[i]) * gf[k]->grad[i];
      }
    }
    EXPECT_LT(std::sqrt(num / den), 0.05) << DTypeName(dt);
  }
}

}  // namespace
}  // namespace chorus::train
