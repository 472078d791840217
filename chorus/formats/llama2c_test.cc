// test-labels: unit
#include "chorus/formats/llama2c.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "chorus/base/mapped_file.h"
#include "tests/testutil/testutil.h"

namespace chorus::formats {
namespace {

constexpr char kStories[] = "stories260K/stories260K.bin";

std::string StoriesPath() { return testing::SharedModelsDir() + "/" + kStories; }

TEST(Llama2cTest, ReadsStories260K) {
  CHORUS_REQUIRE_SHARED_MODEL(kStories);
  auto ck = ReadLlama2c(StoriesPath());
  ASSERT_TRUE(ck.ok()) << ck.status().ToString();
  const Llama2cConfig& c = ck->config;
  // Header facts from stories260K/PROVENANCE.md.
  EXPECT_EQ(c.dim, 64);
  EXPECT_EQ(c.hidden_dim, 172);
  EXPECT_EQ(c.n_layers, 5);
  EXPECT_EQ(c.n_heads, 8);
  EXPECT_EQ(c.n_kv_heads, 4);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.seq_len, 512);
  EXPECT_TRUE(c.shared_classifier);
  EXPECT_TRUE(c.has_freq_cis);
  EXPECT_EQ(ck->tensors.size(), 11u);
  EXPECT_EQ(ck->tensors.count("wcls"), 0u);
  const std::map<std::string, std::vector<int64_t>> shapes = {{"token_embedding_table", {512, 64}},
                                                              {"rms_att_weight", {5, 64}},
                                                              {"wq", {5, 64, 64}},
                                                              {"wk", {5, 32, 64}},
                                                              {"wv", {5, 32, 64}},
                                                              {"wo", {5, 64, 64}},
                                                              {"rms_ffn_weight", {5, 64}},
                                                              {"w1", {5, 172, 64}},
                                                              {"w2", {5, 64, 172}},
                                                              {"w3", {5, 172, 64}},
                                                              {"rms_final_weight", {64}}};
  int64_t total = 0;
  for (const auto& [name, shape] : shapes) {
    ASSERT_EQ(ck->tensors.count(name), 1u) << name;
    EXPECT_EQ(ck->tensors.at(name).shape(), shape) << name;
    EXPECT_EQ(ck->tensors.at(name).dtype(), DType::kF32);
    total += ck->tensors.at(name).view().NumElements();
  }
  // 264128 floats in the file = weights + 2 x 512 x 4 freq_cis entries (PROVENANCE.md).
  EXPECT_EQ(total + 2 * 512 * 4, 264128);

  // The views point at the right bytes: check the first and last weights against the raw file
  // at independently computed offsets.
  auto raw = ReadFileToString(StoriesPath());
  ASSERT_TRUE(raw.ok());
  auto f32_at = [&](size_t float_index) {
    float v;
    std::memcpy(&v, raw->data() + 28 + 4 * float_index, 4);
    return v;
  };
  EXPECT_EQ(ck->tensors.at("token_embedding_table").ToF32()[0], f32_at(0));
  const size_t final_norm = static_cast<size_t>(total - 64);
  EXPECT_EQ(ck->tensors.at("rms_final_weight").ToF32()[63], f32_at(final_norm + 63));
  // After rms_final_weight comes freq_cis_real: row 1 is cos(1 * 10000^(-2i/8)).
  for (int i = 0; i < 4; ++i) {
    const double want = std::cos(std::pow(10000.0, -2.0 * i / 8.0));
    EXPECT_NEAR(f32_at(static_cast<size_t>(total) + 4 + i), want, 1e-6) << i;
    EXPECT_NEAR(f32_at(static_cast<size_t>(total) + 2048 + 4 + i),
                std::sin(std::pow(10000.0, -2.0 * i / 8.0)), 1e-6)
        << i;
  }
}

TEST(Llama2cTest, ReadsFullFinetune) {
  CHORUS_REQUIRE_SHARED_MODEL("stories260K-finetunes/things/full.bin");
  auto ck = ReadLlama2c(testing::SharedModelsDir() + "/stories260K-finetunes/things/full.bin");
  ASSERT_TRUE(ck.ok()) << ck.status().ToString();
  EXPECT_EQ(ck->config.dim, 64);
  EXPECT_EQ(ck->config.n_layers, 5);
}

TEST(Llama2cTest, RewriteStoriesIsBitExact) {
  CHORUS_REQUIRE_SHARED_MODEL(kStories);
  auto ck = ReadLlama2c(StoriesPath());
  ASSERT_TRUE(ck.ok());
  auto bytes = SerializeLlama2c(*ck);
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
  auto raw = ReadFileToString(StoriesPath());
  ASSERT_TRUE(raw.ok());
  ASSERT_EQ(bytes->size(), raw->size());
  // Weights must be bit-identical; the recomputed freq_cis tables may differ in the last ulp
  // from PyTorch's float32 math.
  const size_t fc_begin = 28 + 4 * (264128 - 4096), fc_end = fc_begin + 4 * 4096;
  EXPECT_EQ(bytes->substr(0, fc_begin), raw->substr(0, fc_begin));
  EXPECT_EQ(bytes->substr(fc_end), raw->substr(fc_end));
  for (size_t off = fc_begin; off < fc_end; off += 4) {
    float a, b;
    std::memcpy(&a, bytes->data() + off, 4);
    std::memcpy(&b, raw->data() + off, 4);
    ASSERT_NEAR(a, b, 2e-4) << "freq_cis float " << (off - fc_begin) / 4;
  }
}

Llama2cCheckpoint RandomCheckpoint(bool shared, uint32_t seed) {
  Llama2cCheckpoint ck;
  ck.config = {/*dim=*/16,        /*hidden_dim=*/24, /*n_layers=*/2, /*n_heads=*/4,
               /*n_kv_heads=*/2,
               /*vocab_size=*/10, /*seq_len=*/8,     shared,         true};
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  auto make = [&](std::vector<int64_t> shape) {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) x = u(rng);
    return Tensor::FromF32(v, DType::kF32, std::move(shape));
  };
  ck.tensors["token_embedding_table"] = make({10, 16});
  ck.tensors["rms_att_weight"] = make({2, 16});
  ck.tensors["wq"] = make({2, 16, 16});
  ck.tensors["wk"] = make({2, 8, 16});
  ck.tensors["wv"] = make({2, 8, 16});
  ck.tensors["wo"] = make({2, 16, 16});
  ck.tensors["rms_ffn_weight"] = make({2, 16});
  ck.tensors["w1"] = make({2, 24, 16});
  ck.tensors["w2"] = make({2, 16, 24});
  ck.tensors["w3"] = make({2, 24, 16});
  ck.tensors["rms_final_weight"] = make({16});
  if (!shared) ck.tensors["wcls"] = make({10, 16});
  return ck;
}

TEST(Llama2cTest, WriteReadRoundTrip) {
  for (bool shared : {true, false}) {
    SCOPED_TRACE(shared);
    Llama2cCheckpoint ck = RandomCheckpoint(shared, 7);
    const std::string path = testing::TempDir() + "/m.bin";
    CHORUS_ASSERT_OK(WriteLlama2c(path, ck));
    auto raw = ReadFileToString(path);
    ASSERT_TRUE(raw.ok());
    int32_t vocab;
    std::memcpy(&vocab, raw->data() + 20, 4);
    EXPECT_EQ(vocab, shared ? 10 : -10);
    auto back = ReadLlama2c(path);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(back->config.shared_classifier, shared);
    EXPECT_EQ(back->config.vocab_size, 10);
    ASSERT_EQ(back->tensors.size(), ck.tensors.size());
    for (const auto& [name, t] : ck.tensors) {
      ASSERT_EQ(back->tensors.count(name), 1u) << name;
      EXPECT_EQ(back->tensors.at(name).shape(), t.shape()) << name;
      EXPECT_EQ(back->tensors.at(name).ToF32(), t.ToF32()) << name;
    }
  }
}

TEST(Llama2cTest, AcceptsFileWithoutFreqCis) {
  Llama2cCheckpoint ck = RandomCheckpoint(false, 3);
  auto bytes = SerializeLlama2c(ck);
  ASSERT_TRUE(bytes.ok());
  // Cut the freq_cis tables (2 x seq_len x hd/2 floats before wcls) out of the file.
  const size_t wcls_bytes = 10 * 16 * 4, fc_bytes = 2 * 8 * 2 * 4;
  std::string no_fc = bytes->substr(0, bytes->size() - wcls_bytes - fc_bytes) +
                      bytes->substr(bytes->size() - wcls_bytes);
  auto back = ReadLlama2cBytes("nofc.bin", no_fc);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_FALSE(back->config.has_freq_cis);
  EXPECT_EQ(back->tensors.at("wcls").ToF32(), ck.tensors.at("wcls").ToF32());
  // Writing it back keeps the layout it was read with.
  ck.config.has_freq_cis = false;
  auto again = SerializeLlama2c(ck);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, no_fc);
}

TEST(Llama2cTest, WriterRejectsBadCheckpoints) {
  Llama2cCheckpoint ck = RandomCheckpoint(true, 1);
  ck.tensors.erase("w2");
  EXPECT_EQ(SerializeLlama2c(ck).status().code(), StatusCode::kInvalidArgument);
  ck = RandomCheckpoint(true, 1);
  ck.tensors["w2"] = Tensor::Zeros(DType::kF32, {2, 24, 16});
  auto r = SerializeLlama2c(ck);
  EXPECT_NE(r.status().message().find("'w2' has shape [2, 24, 16]"), std::string::npos)
      << r.status().message();
  ck = RandomCheckpoint(false, 1);
  ck.tensors.erase("wcls");
  EXPECT_FALSE(SerializeLlama2c(ck).ok());
  ck = RandomCheckpoint(true, 1);
  ck.config.n_kv_heads = 3;
  EXPECT_FALSE(SerializeLlama2c(ck).ok());
}

TEST(Llama2cTest, CorruptionsGiveCleanErrors) {
  const std::string good = *SerializeLlama2c(RandomCheckpoint(true, 5));
  ASSERT_TRUE(ReadLlama2cBytes("m.bin", good).ok());
  // Every truncation, and one extra byte, is rejected.
  for (size_t n = 0; n < good.size(); n += (n < 64 ? 1 : 37)) {
    auto r = ReadLlama2cBytes("m.bin", good.substr(0, n));
    ASSERT_FALSE(r.ok()) << n;
    EXPECT_EQ(r.status().message().rfind("m.bin: ", 0), 0u);
  }
  EXPECT_FALSE(ReadLlama2cBytes("m.bin", good + "x").ok());
  struct Case {
    int field;
    int32_t value;
    const char* expect;
  };
  const Case cases[] = {
      {0, 0, "dim = 0"},
      {0, -64, "dim = -64"},
      {0, 1 << 30, "dim = 1073741824"},
      {0, 18, "not divisible by n_heads"},
      {1, 0, "hidden_dim"},
      {2, -1, "n_layers"},
      {2, 100000, "n_layers"},
      {3, 0, "n_heads"},
      {4, 3, "not a multiple of n_kv_heads"},
      {4, 8, "not a multiple of n_kv_heads"},
      {4, 0, "n_kv_heads"},
      {5, 0, "vocab_size"},
      {5, INT32_MIN, "vocab_size"},
      {5, INT32_MAX, "vocab_size"},
      {5, -10, "implies a file of"},  // wcls announced but absent
      {5, 11, "implies a file of"},
      {6, 0, "seq_len"},
      {6, 9, "implies a file of"},
      {3, 8, "implies a file of"},  // valid header, different layout
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.expect) + " field " + std::to_string(c.field));
    std::string bad = good;
    std::memcpy(bad.data() + 4 * c.field, &c.value, 4);
    auto r = ReadLlama2cBytes("m.bin", bad);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find(c.expect), std::string::npos) << r.status().message();
  }
  // An odd head size: dim 12, n_heads 4 -> 3.
  std::string odd = good;
  const int32_t dims[3] = {12, 24, 2};
  std::memcpy(odd.data(), dims, 12);
  const int32_t heads[2] = {4, 2};
  std::memcpy(odd.data() + 12, heads, 8);
  auto r = ReadLlama2cBytes("m.bin", odd);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("odd"), std::string::npos) << r.status().message();
}

}  // namespace
}  // namespace chorus::formats
