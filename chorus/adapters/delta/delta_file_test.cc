#include "chorus/adapters/delta/delta_file.h"

#include <gtest/gtest.h>

#include <fstream>
#include <random>

#include "chorus/model/synthetic.h"
#include "tests/testutil/testutil.h"

namespace chorus::delta {
namespace {

std::shared_ptr<const model::Model> Tiny(uint64_t seed) {
  model::SyntheticSpec spec;
  spec.shape = "tiny";
  spec.seed = seed;
  return *model::MakeSyntheticModel(spec);
}

// A delta over every linear of `base` with random codes, plus one exact and one int8 extra.
Delta RandomDelta(const model::Model& base, int bits, bool sparse, int64_t group) {
  Delta d;
  d.method = Method::kRtn;
  d.bits = bits;
  d.sparse24 = sparse;
  d.group_size = group;
  d.base_hash = BaseWeightsHash(base);
  std::mt19937_64 rng(5);
  for (int64_t l = 0; l < base.config().n_layers; ++l) {
    for (int w = 0; w < model::kNumLinears; ++w) {
      const std::string name = model::HfLayerTensorName(l, static_cast<model::Linear>(w));
      const Tensor* t = nullptr;
      for (const auto& p : base.tensors())
        if (p.first == name) t = &p.second;
      UnpackedMatrix m;
      m.layout = {.rows = t->shape()[0],
                  .cols = t->shape()[1],
                  .bits = bits,
                  .sparse24 = sparse,
                  .group_size = group};
      m.codes.resize(static_cast<size_t>(m.layout.rows * m.layout.kept_per_row()));
      for (auto& c : m.codes) c = static_cast<uint8_t>(rng() % (1u << bits));
      if (sparse) {
        m.patterns.resize(static_cast<size_t>(m.layout.rows * m.layout.cols / 4));
        for (auto& p : m.patterns) p = static_cast<uint8_t>(rng() % 6);
      }
      m.scales.assign(static_cast<size_t>(m.layout.n_scales()),
                      group == 0 ? 0.0123f : RoundToF16(0.01f));
      d.matrices.push_back({name, Pack(m), false});
    }
  }
  ExtraDelta norm;
  norm.name = "model.norm.weight";
  norm.shape = {base.config().n_embd};
  norm.values.assign(static_cast<size_t>(base.config().n_embd), 0.25f);
  d.extras.push_back(norm);
  ExtraDelta emb;
  emb.name = "model.embed_tokens.weight";
  emb.kind = ExtraDelta::Kind::kInt8Rows;
  emb.shape = {base.config().vocab_size, base.config().n_embd};
  emb.q.assign(static_cast<size_t>(emb.shape[0] * emb.shape[1]), 3);
  emb.row_scales.assign(static_cast<size_t>(emb.shape[0]), 0.001f);
  d.extras.push_back(emb);
  return d;
}

TEST(DeltaFileTest, WriteReadRoundTripFileAndDirectory) {
  auto base = Tiny(1);
  for (auto [bits, sparse, group] :
       {std::tuple{2, true, int64_t{64}}, std::tuple{4, false, int64_t{32}},
        std::tuple{1, false, int64_t{0}}, std::tuple{3, true, int64_t{16}}}) {
    Delta d = RandomDelta(*base, bits, sparse, group);
    for (std::string path : {testing::TempDir() + "/d.safetensors", testing::TempDir() + "/ddir"}) {
      WriteStats st;
      ASSERT_TRUE(WriteDelta(path, d, 9, &st).ok());
      EXPECT_TRUE(IsDeltaPath(path));
      auto back = ReadDelta(path);
      ASSERT_TRUE(back.ok()) << back.status().ToString();
      EXPECT_EQ(back->bits, bits);
      EXPECT_EQ(back->sparse24, sparse);
      EXPECT_EQ(back->group_size, group);
      EXPECT_EQ(back->base_hash, d.base_hash);
      ASSERT_EQ(back->matrices.size(), d.matrices.size());
      for (size_t i = 0; i < d.matrices.size(); ++i) {
        EXPECT_EQ(back->matrices[i].name, d.matrices[i].name);
        EXPECT_EQ(back->matrices[i].packed.codes, d.matrices[i].packed.codes);
        EXPECT_EQ(back->matrices[i].packed.mask, d.matrices[i].packed.mask);
        EXPECT_EQ(back->matrices[i].packed.scales, d.matrices[i].packed.scales);
      }
      ASSERT_EQ(back->extras.size(), 2u);
      EXPECT_EQ(back->extras[0].Decode(), d.extras[0].Decode());
      EXPECT_EQ(back->extras[1].Decode(), d.extras[1].Decode());
    }
  }
}

TEST(DeltaFileTest, DenseReconstructionAddsTheDecodedDelta) {
  auto base = Tiny(1);
  Delta d = RandomDelta(*base, 4, true, 64);
  auto m = ApplyDeltaDense(*base, d, "d");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  const std::string name = d.matrices[3].name;
  auto want = Unpack(d.matrices[3].packed, name)->Decode();
  for (const auto& [n, t] : base->tensors()) {
    if (n != name) continue;
    auto b = t.ToF32();
    for (const auto& [n2, t2] : (*m)->tensors()) {
      if (n2 != name) continue;
      auto r = t2.ToF32();
      for (size_t i = 0; i < b.size(); ++i) ASSERT_FLOAT_EQ(r[i], b[i] + want[i]);
    }
  }
}

TEST(DeltaFileTest, AnotherBaseIsRefusedNamingBothHashes) {
  auto base = Tiny(1), other = Tiny(2);
  Delta d = RandomDelta(*base, 2, true, 64);
  auto r = ApplyDeltaDense(*other, d, "/x/delta");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find(d.base_hash), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find(BaseWeightsHash(*other)), std::string::npos);
  EXPECT_NE(r.status().message().find("/x/delta"), std::string::npos);
}

TEST(DeltaFileTest, ShapeMismatchAgainstTheBaseNamesTheTensor) {
  auto base = Tiny(1);
  Delta d = RandomDelta(*base, 2, false, 64);
  // A consistent file whose matrix has one row fewer than the base's.
  MatrixLayout& l = d.matrices[0].packed.layout;
  l.rows -= 1;
  d.matrices[0].packed.codes.resize(static_cast<size_t>(l.rows * l.code_row_bytes()));
  d.matrices[0].packed.scales.resize(static_cast<size_t>(l.n_scales()));
  auto bytes = SerializeDelta(d);
  ASSERT_TRUE(bytes.ok());
  auto back = ParseDelta("d.safetensors", *bytes);
  ASSERT_TRUE(back.ok());
  Status s = CheckDeltaBase(*back, *base, "d.safetensors");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find(d.matrices[0].name), std::string::npos) << s.message();
}

TEST(DeltaFileTest, TruncatedAndCorruptFilesAreRefusedNamingFileAndTensor) {
  auto base = Tiny(1);
  Delta d = RandomDelta(*base, 2, true, 64);
  auto bytes = SerializeDelta(d);
  ASSERT_TRUE(bytes.ok());
  for (size_t cut : {size_t{0}, size_t{7}, bytes->size() / 2, bytes->size() - 1}) {
    auto r = ParseDelta("cut.safetensors", bytes->substr(0, cut));
    ASSERT_FALSE(r.ok()) << cut;
    EXPECT_NE(r.status().message().find("cut.safetensors"), std::string::npos)
        << r.status().message();
  }
  // Metadata edits: a bits / group size that does not match the tensors, another format.
  auto edit = [&](const std::string& from, const std::string& to) {
    std::string b = *bytes;
    const size_t pos = b.find(from);
    EXPECT_NE(pos, std::string::npos) << from;
    b.replace(pos, from.size(), to);
    return ParseDelta("e.safetensors", b);
  };
  {
    auto r = edit("\"bits\":\"2\"", "\"bits\":\"4\"");
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("e.safetensors"), std::string::npos);
    EXPECT_NE(r.status().message().find("model.layers."), std::string::npos)
        << r.status().message();
  }
  {
    auto r = edit("\"group_size\":\"64\"", "\"group_size\":\"32\"");
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("scales"), std::string::npos) << r.status().message();
  }
  {
    auto r = edit("chorus-delta", "chorus-delte");
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("not a Chorus delta"), std::string::npos);
  }
  // A missing path is not a delta; a damaged .safetensors is read as one (to get its error), a
  // PEFT adapter file is not.
  EXPECT_FALSE(IsDeltaPath(testing::TempDir() + "/missing"));
  EXPECT_TRUE(LooksLikeDeltaPath(testing::TempDir() + "/broken.safetensors"));
  EXPECT_FALSE(LooksLikeDeltaPath(testing::TempDir() + "/lora/adapter_model.safetensors"));
  EXPECT_FALSE(LooksLikeDeltaPath(testing::TempDir()));
}

}  // namespace
}  // namespace chorus::delta
