// test-labels: unit
// Model::WithTensors: a model with some tensors replaced (compress's base + a fine-tune's changed
// norms and embeddings) shares the prepared matrices it keeps and prepares only what changed.
#include "chorus/model/model.h"

#include <gtest/gtest.h>

#include <vector>

#include "chorus/model/synthetic.h"
#include "tests/testutil/testutil.h"

namespace chorus::model {
namespace {

TEST(ModelTest, WithTensorsSharesThePreparedMatricesItKeeps) {
  SyntheticSpec spec;
  spec.shape = "tiny";
  spec.dtype = DType::kBF16;  // repacked: every matrix has a prepared copy of its own
  auto base = MakeSyntheticModel(spec);
  ASSERT_TRUE(base.ok()) << base.status().ToString();
  const Model& m = **base;
  ASSERT_GT(m.weights().layers[0].W(Linear::kQ).packed_bytes(), 0);

  std::vector<float> norm = m.weights().output_norm.ToF32();
  for (float& v : norm) v += 0.5f;
  const Tensor up = m.weights().layers[1].W(Linear::kUp).source();
  std::vector<float> up2 = up.ToF32();
  for (float& v : up2) v = -v;
  Model::NamedTensors changed = {
      {"model.norm.weight", Tensor::FromF32(norm, DType::kF32, {m.config().n_embd})},
      {HfLayerTensorName(1, Linear::kUp), Tensor::FromF32(up2, DType::kBF16, up.shape())}};
  auto with = Model::WithTensors(m, changed, "base + changes");
  ASSERT_TRUE(with.ok()) << with.status().ToString();
  const Model& w = **with;
  EXPECT_EQ(w.source(), "base + changes");
  EXPECT_EQ(w.weights().output_norm.ToF32(), norm);
  for (size_t l = 0; l < m.weights().layers.size(); ++l) {
    for (int li = 0; li < kNumLinears; ++li) {
      const bool replaced = l == 1 && li == static_cast<int>(Linear::kUp);
      EXPECT_EQ(
          w.weights().layers[l].linear[li].packed() == m.weights().layers[l].linear[li].packed(),
          !replaced)
          << "layer " << l << " linear " << li;
    }
  }
  EXPECT_EQ(w.weights().layers[1].W(Linear::kUp).source().ToF32(), up2);
  EXPECT_EQ(w.weights().output.packed(), m.weights().output.packed());

  auto missing = Model::WithTensors(m, {{"model.nope.weight", changed[0].second}}, "x");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("model.nope.weight"), std::string::npos);
}

}  // namespace
}  // namespace chorus::model
