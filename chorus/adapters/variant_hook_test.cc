// test-labels: unit
// VariantHook adds each kind's term once: two fake kinds that own disjoint rows (a row's kind is
// the only one that writes it), in either order, give every row exactly its own term.
#include "chorus/adapters/variant_hook.h"

#include <gtest/gtest.h>

#include <vector>

namespace chorus::adapters {
namespace {

// A kind that adds `delta` (times the row's x) to the rows it owns, and records its calls.
struct FakeKind : model::LinearHook {
  std::vector<bool> owns;  // [rows]
  float delta = 0;
  mutable int applies = 0, groups = 0;
  void Apply(int64_t /*layer*/, model::Linear /*which*/, const float* x, int64_t x_stride, float* y,
             int64_t y_stride, int64_t n_rows, ThreadPool* /*pool*/) const override {
    ++applies;
    for (int64_t i = 0; i < n_rows; ++i)
      if (owns[static_cast<size_t>(i)]) y[i * y_stride] += delta * x[i * x_stride];
  }
  void ApplyGroup(int64_t /*layer*/, model::LinearGroup /*group*/, std::span<const Target> targets,
                  const float* x, int64_t x_stride, int64_t n_rows,
                  ThreadPool* /*pool*/) const override {
    ++groups;
    for (const Target& t : targets)
      for (int64_t i = 0; i < n_rows; ++i)
        if (owns[static_cast<size_t>(i)]) t.y[i * t.y_stride] += delta * x[i * x_stride];
  }
};

TEST(VariantHookTest, EachRowGetsTheTermOfItsOwnKindOnce) {
  FakeKind lora, delta;
  lora.owns = {true, false, false, true};
  delta.owns = {false, true, false, false};  // row 2: the base model
  lora.delta = 0.5f;
  delta.delta = 2.0f;
  const std::vector<float> x = {1, 2, 3, 4};
  for (bool lora_first : {true, false}) {
    VariantHook hook;
    EXPECT_TRUE(hook.empty());
    hook.Add(lora_first ? &lora : &delta);
    hook.Add(lora_first ? &delta : &lora);
    std::vector<float> y(4, 10.0f), q(4, 0.0f), k(4, 0.0f), v(4, 0.0f);
    hook.Apply(0, model::Linear::kO, x.data(), 1, y.data(), 1, 4, nullptr);
    EXPECT_EQ(y, (std::vector<float>{10.5f, 14.0f, 10.0f, 12.0f}));
    const model::LinearHook::Target targets[] = {{model::Linear::kQ, q.data(), 1},
                                                 {model::Linear::kK, k.data(), 1},
                                                 {model::Linear::kV, v.data(), 1}};
    hook.ApplyGroup(0, model::LinearGroup::kQkv, targets, x.data(), 1, 4, nullptr);
    for (const auto* out : {&q, &k, &v}) EXPECT_EQ(*out, (std::vector<float>{0.5f, 4, 0, 2}));
  }
  EXPECT_EQ(lora.applies, 2);
  EXPECT_EQ(lora.groups, 2);
  EXPECT_EQ(delta.applies, 2);
  VariantHook none;
  std::vector<float> y(4, 1.0f);
  none.Apply(0, model::Linear::kO, x.data(), 1, y.data(), 1, 4, nullptr);
  EXPECT_EQ(y, std::vector<float>(4, 1.0f));  // no kind: the base model's output unchanged
}

TEST(VariantHookTest, TheModelDeclaresItsLinearGroupsOnce) {
  using model::Linear;
  using model::LinearGroup;
  const auto qkv = model::LinearGroupMembers(LinearGroup::kQkv);
  const auto gate_up = model::LinearGroupMembers(LinearGroup::kGateUp);
  EXPECT_EQ(std::vector<Linear>(qkv.begin(), qkv.end()),
            (std::vector<Linear>{Linear::kQ, Linear::kK, Linear::kV}));
  EXPECT_EQ(std::vector<Linear>(gate_up.begin(), gate_up.end()),
            (std::vector<Linear>{Linear::kGate, Linear::kUp}));
  EXPECT_EQ(model::LinearGroupOf(Linear::kV), LinearGroup::kQkv);
  EXPECT_EQ(model::LinearGroupOf(Linear::kUp), LinearGroup::kGateUp);
  EXPECT_FALSE(model::LinearGroupOf(Linear::kO).has_value());
  EXPECT_FALSE(model::LinearGroupOf(Linear::kDown).has_value());
}

}  // namespace
}  // namespace chorus::adapters
