#include "chorus/compress/compress.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <random>

#include "chorus/eval/eval.h"
#include "chorus/model/convert.h"
#include "chorus/model/loader.h"
#include "chorus/model/synthetic.h"
#include "tests/testutil/testutil.h"

namespace chorus::compress {
namespace {

std::shared_ptr<const model::Model> Tiny() {
  model::SyntheticSpec spec;
  spec.shape = "tiny";
  return *model::MakeSyntheticModel(spec);
}

// base + a random delta of `rel` relative norm on every linear, and a changed final norm.
std::shared_ptr<const model::Model> FineTune(const model::Model& base, float rel, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> g(0, 1);
  model::Model::NamedTensors ts;
  for (const auto& [n, t] : base.tensors()) {
    std::vector<float> v = t.ToF32();
    const bool linear = n.find("_proj.weight") != std::string::npos;
    if (linear) {
      double norm = 0;
      for (float x : v) norm += static_cast<double>(x) * x;
      const float sd = rel * static_cast<float>(std::sqrt(norm / static_cast<double>(v.size())));
      for (float& x : v) x += sd * g(rng);
    } else if (n == "model.norm.weight") {
      for (float& x : v) x += 0.01f;
    }
    ts.emplace_back(n, Tensor::FromF32(v, DType::kF32, t.shape()));
  }
  return *model::Model::Build(base.config(), ts, base.format(), "finetune");
}

std::vector<int32_t> Tokens(int64_t n, int64_t vocab) {
  std::mt19937_64 rng(9);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab));
  return t;
}

TEST(CompressTest, AnotherArchitectureNamesTheFirstMismatchingTensor) {
  auto base = Tiny();
  model::SyntheticSpec spec;
  spec.shape = "stories260k";
  auto other = *model::MakeSyntheticModel(spec);
  Status s = CheckSameArchitecture(*base, *other);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("architecture"), std::string::npos) << s.message();
  EXPECT_TRUE(CheckSameArchitecture(*base, *FineTune(*base, 0.03f, 1)).ok());
  CompressOptions o;
  o.method = delta::Method::kRtn;
  auto r = CompressDelta(base, other, {}, -1, o, nullptr);
  ASSERT_FALSE(r.ok());
}

TEST(CompressTest, EveryMethodWritesAValidDeltaCloserThanTheBase) {
  auto base = Tiny();
  auto ft = FineTune(*base, 0.04f, 2);
  auto tokens = Tokens(1024, base->config().vocab_size);
  ThreadPool pool(2);
  auto held = Tokens(400, base->config().vocab_size);
  auto kl_of = [&](std::shared_ptr<const model::Model> m) {
    auto r =
        eval::Evaluate(m, nullptr, ft, held, {.ctx = 128, .bos_id = -1, .max_rows = 64}, &pool);
    EXPECT_TRUE(r.ok());
    return r->scores.mean_kl();
  };
  const double base_kl = kl_of(base);
  ASSERT_GT(base_kl, 0);
  struct Case {
    delta::Method method;
    int bits;
    bool sparse;
    int64_t group;
  };
  std::map<std::string, double> kl;
  for (Case c :
       {Case{delta::Method::kRtn, 4, true, 64}, Case{delta::Method::kDeltaZip, 4, true, 64},
        Case{delta::Method::kBitDelta, 1, false, 0}}) {
    CompressOptions o;
    o.method = c.method;
    o.bits = c.bits;
    o.sparse24 = c.sparse;
    o.group_size = c.group;
    o.calib_seq_len = 64;
    o.distill_steps = 10;
    CompressReport rep;
    auto d = CompressDelta(base, ft, tokens, -1, o, &pool, &rep);
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    EXPECT_EQ(d->base_hash, delta::BaseWeightsHash(*base));
    EXPECT_EQ(d->matrices.size(),
              static_cast<size_t>(base->config().n_layers * model::kNumLinears));
    ASSERT_EQ(d->extras.size(), 1u);  // the final norm, exact
    EXPECT_EQ(d->extras[0].name, "model.norm.weight");
    EXPECT_EQ(d->extras[0].kind, delta::ExtraDelta::Kind::kExactF32);
    const std::string path = testing::TempDir() + "/" + delta::MethodName(c.method);
    ASSERT_TRUE(delta::WriteDelta(path, *d).ok());
    auto back = delta::ReadDelta(path);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    auto rebuilt = delta::ApplyDeltaDense(*base, *back, path);
    ASSERT_TRUE(rebuilt.ok()) << rebuilt.status().ToString();
    kl[delta::MethodName(c.method)] = kl_of(*rebuilt);
    EXPECT_LT(kl[delta::MethodName(c.method)], 0.5 * base_kl) << delta::MethodName(c.method);
    if (c.method == delta::Method::kBitDelta) {
      EXPECT_LE(rep.final_kl_calib, rep.base_kl_calib);
    }
  }
  EXPECT_LT(kl["deltazip"], kl["rtn"]);
}

// `chorus compress` reads both models from their files without preparing them for the kernels,
// pages each matrix out once read, and builds the fine-tune only for bitdelta's reference pass
// and the base only for calibration; none of that may change a bit of the delta.
TEST(CompressTest, ModelsReadFromTheirFilesGiveTheDeltaOfTheLoadedModels) {
  auto tiny = Tiny();
  auto ft = FineTune(*tiny, 0.04f, 3);
  const std::string dir = testing::TempDir() + "/compress_from_file";
  std::filesystem::create_directories(dir);
  model::ConvertOptions co;
  co.dtype = DType::kBF16;  // repacked by the kernels: the path whose pages compress releases
  co.output = dir + "/base.gguf";
  ASSERT_TRUE(model::ConvertModel(*tiny, co).ok());
  auto base_file = model::ReadModelFile(co.output);
  ASSERT_TRUE(base_file.ok()) << base_file.status().ToString();
  auto base = model::LoadModel(co.output);
  ASSERT_TRUE(base.ok()) << base.status().ToString();
  co.output = dir + "/ft.gguf";
  ASSERT_TRUE(model::ConvertModel(*ft, co).ok());
  auto file = model::ReadModelFile(co.output);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  auto loaded = model::LoadModel(co.output);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ(delta::BaseWeightsHash(*base_file), delta::BaseWeightsHash(**base));
  auto tokens = Tokens(512, tiny->config().vocab_size);
  ThreadPool pool(2);
  for (delta::Method m :
       {delta::Method::kRtn, delta::Method::kDeltaZip, delta::Method::kBitDelta}) {
    CompressOptions o;
    o.method = m;
    if (m == delta::Method::kBitDelta) {
      o.bits = 1;
      o.sparse24 = false;
      o.group_size = 0;
    }
    o.calib_seq_len = 64;
    o.distill_steps = 4;
    auto from_file = CompressDelta(*base_file, *file, tokens, -1, o, &pool);
    ASSERT_TRUE(from_file.ok()) << from_file.status().ToString();
    auto from_model = CompressDelta(*base, *loaded, tokens, -1, o, &pool);
    ASSERT_TRUE(from_model.ok()) << from_model.status().ToString();
    EXPECT_EQ(from_file->finetuned_source, co.output);
    auto a = delta::SerializeDelta(*from_file, 0);
    auto b = delta::SerializeDelta(*from_model, 0);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_TRUE(*a == *b) << delta::MethodName(m);
  }
}

TEST(CompressTest, CalibratedMethodsNeedText) {
  auto base = Tiny();
  auto ft = FineTune(*base, 0.04f, 2);
  CompressOptions o;
  o.method = delta::Method::kDeltaZip;
  auto r = CompressDelta(base, ft, {}, -1, o, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("calibration"), std::string::npos);
  o.bits = 5;
  EXPECT_FALSE(ValidateCompressOptions(o).ok());
}

}  // namespace
}  // namespace chorus::compress
