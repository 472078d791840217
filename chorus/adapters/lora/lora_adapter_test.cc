// test-labels: unit
// LoraAdapter::Build converts every tensor in one pass (decode, finite check, q/k pair order,
// transpose of lora_B, bf16 rounding). These tests hold it to the straightforward conversion it
// replaced — ToF32, model::PermuteRopeRows, an element-by-element transpose, F32ToBF16 — bit
// for bit, for every source dtype, both pair orders and both storage types, at shapes whose
// output sizes are not multiples of the transpose tile.
#include "chorus/adapters/lora/lora_adapter.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "chorus/model/convert.h"
#include "chorus/model/synthetic.h"

namespace chorus::adapters {
namespace {

using model::Linear;

model::ModelConfig Config(const std::string& shape) {
  auto c = model::SyntheticConfig(shape);
  CHORUS_CHECK(c.ok());
  return *c;
}

// Every module of every layer, rank `rank`, tensors stored as `dtype` where the row length
// allows it (quantized types need rows of a multiple of 32; other tensors stay f32).
LoraWeights Weights(const model::ModelConfig& c, int64_t rank, DType dtype,
                    kernels::RopeLayout layout, uint64_t seed) {
  RandomLoraSpec s;
  s.rank = rank;
  s.alpha = 3.0f * static_cast<float>(rank);
  s.b_std = 0.3f;
  s.seed = seed;
  LoraWeights w = MakeRandomLora(c, s);
  w.qk_layout = layout;
  for (LoraModuleWeights& m : w.modules) {
    for (Tensor* t : {&m.a, &m.b}) {
      if (DTypeIsQuantized(dtype) && t->shape().back() % kQuantBlock != 0) continue;
      *t = Tensor::FromF32(t->ToF32(), dtype, t->shape());
    }
  }
  return w;
}

int64_t RopeHeads(const model::ModelConfig& c, Linear which) {
  return which == Linear::kQ ? c.n_heads : which == Linear::kK ? c.n_kv_heads : 0;
}

// The reference: what a compute copy must hold for module (l, which), as storage elements
// widened to f32 (A rows, then Bᵀ rows), computed the slow, obvious way.
std::vector<float> Expected(const LoraWeights& w, const model::ModelConfig& c, int64_t l,
                            Linear which, LoraStorage st) {
  const LoraModuleWeights& m = w.at(l, which);
  std::vector<float> out = m.a.ToF32();
  Tensor b = m.b;
  if (RopeHeads(c, which) > 0 && w.qk_layout != c.rope_layout)
    b = model::PermuteRopeRows(b, RopeHeads(c, which), c.head_dim, w.qk_layout, c.rope_layout);
  const std::vector<float> bf = b.ToF32();
  const int64_t r = m.rank(), o = b.shape()[0];
  for (int64_t j = 0; j < r; ++j)
    for (int64_t i = 0; i < o; ++i) out.push_back(bf[static_cast<size_t>(i * r + j)]);
  if (st == LoraStorage::kBF16)
    for (float& f : out) f = BF16ToF32(F32ToBF16(f));
  return out;
}

// What the adapter holds for module (l, which), in the same order.
std::vector<float> Held(const LoraAdapter& a, int64_t l, Linear which) {
  const LoraView::Module& m = a.module(l, which);
  std::vector<float> out;
  auto add = [&](const float* const* f32, const uint16_t* const* b16, int64_t rows, int64_t n) {
    for (int64_t j = 0; j < rows; ++j)
      for (int64_t i = 0; i < n; ++i) out.push_back(b16 ? BF16ToF32(b16[j][i]) : f32[j][i]);
  };
  add(m.a_rows, m.a_rows_bf16, m.rank, m.in);
  add(m.bt_rows, m.bt_rows_bf16, m.rank, m.out);
  return out;
}

TEST(LoraAdapterBuildTest, OnePassConversionEqualsReferenceBitwise) {
  for (const char* shape : {"tiny", "stories260k"}) {
    for (kernels::RopeLayout base_layout :
         {kernels::RopeLayout::kHalf, kernels::RopeLayout::kInterleaved}) {
      model::ModelConfig c = Config(shape);
      c.rope_layout = base_layout;
      for (DType dt : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_0}) {
        for (kernels::RopeLayout file_layout :
             {kernels::RopeLayout::kHalf, kernels::RopeLayout::kInterleaved}) {
          for (int64_t rank : {1, 8, 32, 33}) {
            const LoraWeights w =
                Weights(c, rank, dt, file_layout, 7 + static_cast<uint64_t>(rank));
            for (LoraStorage st : {LoraStorage::kF32, LoraStorage::kBF16}) {
              auto built = LoraAdapter::Build(w, c, "t", LoraLimits{.storage = st});
              ASSERT_TRUE(built.ok()) << built.status().ToString();
              const LoraAdapter& a = **built;
              EXPECT_EQ(a.storage(), st);
              int64_t elems = 0;
              for (int64_t l = 0; l < c.n_layers; ++l) {
                for (int li = 0; li < model::kNumLinears; ++li) {
                  const Linear which = static_cast<Linear>(li);
                  const std::vector<float> want = Expected(w, c, l, which, st);
                  const std::vector<float> got = Held(a, l, which);
                  ASSERT_EQ(want.size(), got.size());
                  ASSERT_EQ(std::memcmp(want.data(), got.data(), want.size() * 4), 0)
                      << shape << " " << DTypeName(dt) << " rank " << rank << " storage "
                      << LoraStorageName(st) << " " << LoraModuleName(l, which);
                  elems += static_cast<int64_t>(want.size());
                  EXPECT_EQ(a.module(l, which).scale, w.Scale(l, which));
                }
              }
              EXPECT_EQ(a.memory_bytes(), elems * a.element_bytes());
              if (st == LoraStorage::kF32) {  // contiguous views exist for f32 storage only
                const LoraView::Module& q = a.module(1, Linear::kQ);
                ASSERT_NE(q.a, nullptr);
                EXPECT_EQ(q.a, q.a_rows[0]);
                EXPECT_EQ(q.bt, q.bt_rows[0]);
                EXPECT_EQ(a.fused(1, LoraView::Group::kQkv).a, q.a);
              } else {
                EXPECT_EQ(a.module(1, Linear::kQ).a, nullptr);
              }
            }
          }
        }
      }
    }
  }
}

// Non-finite values are refused wherever they are (any row, the last of a partial transpose
// tile, q rows that move with the pair order), and the message gives the element's index in
// the tensor as the base orders it: lora_A [r, in], lora_B [out, r].
TEST(LoraAdapterBuildTest, NonFiniteValuesNamedWithTheirElement) {
  const model::ModelConfig c = Config("stories260k");  // n_ff 172: partial tiles
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (LoraStorage st : {LoraStorage::kF32, LoraStorage::kBF16}) {
      for (const float bad :
           {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
            -std::numeric_limits<float>::infinity()}) {
        struct Case {
          Linear which;
          bool is_a;
          int64_t row, col;
          int64_t expect_element;
        };
        const int64_t r = 8;
        const std::vector<Case> cases = {
            {Linear::kV, true, 3, 5, 3 * c.n_embd + 5},
            {Linear::kDown, true, 7, 171, 7 * c.n_ff + 171},
            {Linear::kUp, false, 171, 7, 171 * r + 7},  // last row: the partial tile
            {Linear::kO, false, 0, 0, 0},
            // The file's pair order is interleaved: file row 1 of head 0 is base row
            // head_dim / 2 (rotate-half), so the message names element (head_dim/2)·r + 2.
            {Linear::kQ, false, 1, 2, (c.head_dim / 2) * r + 2},
        };
        for (const Case& cs : cases) {
          LoraWeights w = Weights(c, r, DType::kF32, kernels::RopeLayout::kInterleaved, 3);
          LoraModuleWeights& m = w.at(2, cs.which);
          Tensor& t = cs.is_a ? m.a : m.b;
          std::vector<float> v = t.ToF32();
          v[static_cast<size_t>(cs.row * t.shape()[1] + cs.col)] = bad;
          t = Tensor::FromF32(v, dt, t.shape());
          auto built = LoraAdapter::Build(w, c, "nan-test", LoraLimits{.storage = st});
          ASSERT_FALSE(built.ok());
          EXPECT_EQ(built.status().code(), StatusCode::kInvalidArgument);
          const std::string want = std::string(cs.is_a ? "lora_A" : "lora_B") + " of " +
                                   LoraModuleName(2, cs.which) + " holds a non-finite value";
          const std::string msg = built.status().ToString();
          EXPECT_NE(msg.find(want), std::string::npos) << msg;
          EXPECT_NE(msg.find("at element " + std::to_string(cs.expect_element) + ")"),
                    std::string::npos)
              << msg;
          EXPECT_NE(msg.find("adapter 'nan-test'"), std::string::npos) << msg;
        }
      }
    }
  }
}

}  // namespace
}  // namespace chorus::adapters
