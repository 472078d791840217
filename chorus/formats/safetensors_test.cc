// test-labels: unit
#include "chorus/formats/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <numeric>
#include <random>

#include "chorus/base/mapped_file.h"
#include "tests/testutil/testutil.h"

namespace chorus::formats {
namespace {

constexpr char kLora[] = "stories260K-finetunes/things/lora/adapter_model.safetensors";

// A safetensors file from a literal header and data, built by hand (independent of the writer).
std::string MakeFile(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  return out + header + data;
}

std::string Floats(std::initializer_list<float> v) {
  std::string s(v.size() * 4, '\0');
  std::memcpy(s.data(), v.begin(), s.size());
  return s;
}

TEST(SafetensorsTest, ReadsRealLoraAdapter) {
  CHORUS_REQUIRE_SHARED_MODEL(kLora);
  auto f = SafetensorsFile::Open(testing::SharedModelsDir() + "/" + kLora);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  // rank 8 over q,k,v,o,gate,up,down of 5 layers: 5 x 7 x 2 = 70 tensors, all F32.
  ASSERT_EQ((*f)->tensors().size(), 70u);
  EXPECT_TRUE((*f)->metadata().empty());
  const std::map<std::string, std::vector<int64_t>> shapes = {
      {"q_proj.lora_A", {8, 64}},     {"q_proj.lora_B", {64, 8}},   {"k_proj.lora_A", {8, 64}},
      {"k_proj.lora_B", {32, 8}},     {"v_proj.lora_A", {8, 64}},   {"v_proj.lora_B", {32, 8}},
      {"o_proj.lora_A", {8, 64}},     {"o_proj.lora_B", {64, 8}},   {"gate_proj.lora_A", {8, 64}},
      {"gate_proj.lora_B", {172, 8}}, {"up_proj.lora_A", {8, 64}},  {"up_proj.lora_B", {172, 8}},
      {"down_proj.lora_A", {8, 172}}, {"down_proj.lora_B", {64, 8}}};
  for (const auto& t : (*f)->tensors()) {
    SCOPED_TRACE(t.name);
    EXPECT_EQ(t.dtype, "F32");
    ASSERT_EQ(t.name.rfind("base_model.model.model.layers.", 0), 0u);
    const size_t last = t.name.rfind('.', t.name.size() - 8);  // before ".weight"
    const size_t mod = t.name.rfind('.', last - 1);
    const std::string key = t.name.substr(mod + 1, t.name.size() - 7 - mod - 1);
    ASSERT_EQ(shapes.count(key), 1u) << key;
    EXPECT_EQ(t.shape, shapes.at(key));
  }
  // Values checked against an independent Python decoding of the file.
  auto t = (*f)->GetTensor("base_model.model.model.layers.4.mlp.down_proj.lora_B.weight");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->shape(), (std::vector<int64_t>{64, 8}));
  std::vector<float> v = t->ToF32();
  EXPECT_FLOAT_EQ(v.front(), 0.005948795937001705f);
  EXPECT_FLOAT_EQ(v.back(), -0.00039736717008054256f);
  EXPECT_NEAR(std::accumulate(v.begin(), v.end(), 0.0), -0.53500369284302, 1e-5);
  EXPECT_EQ((*f)->tensors()[0].begin, 0u);  // data-offset order

  // The same through SafetensorsModel on the adapter directory.
  auto m =
      SafetensorsModel::Open(testing::SharedModelsDir() + "/stories260K-finetunes/things/lora");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  auto names = (*m)->TensorNames();
  ASSERT_EQ(names.size(), 70u);
  EXPECT_EQ(names[0], "base_model.model.model.layers.0.mlp.down_proj.lora_A.weight");
  EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
  EXPECT_TRUE((*m)->GetTensor(names[5]).ok());
  EXPECT_EQ((*m)->GetTensor("nope").status().code(), StatusCode::kNotFound);
}

TEST(SafetensorsTest, WriterProducesSpecBytes) {
  const std::string header =
      R"({"__metadata__":{"format":"pt"},"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("a":{"dtype":"F16","shape":[1,1],"data_offsets":[8,10]}})";
  std::string padded = header;
  while (padded.size() % 8) padded.push_back(' ');
  const uint16_t h = F32ToF16(1.5f);
  std::string data = Floats({1, 2}) + std::string(reinterpret_cast<const char*>(&h), 2);
  auto bytes = SerializeSafetensors({{"b", Tensor::FromF32({1, 2}, DType::kF32, {2})},
                                     {"a", Tensor::FromF32({1.5f}, DType::kF16, {1, 1})}},
                                    {{"format", "pt"}});
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
  EXPECT_EQ(*bytes, MakeFile(padded, data));
}

TEST(SafetensorsTest, RoundTripAllDTypes) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  auto rnd = [&](size_t n) {
    std::vector<float> v(n);
    for (auto& x : v) x = nd(rng);
    return v;
  };
  std::vector<std::pair<std::string, Tensor>> ts;
  ts.emplace_back("f32", Tensor::FromF32(rnd(12), DType::kF32, {3, 4}));
  ts.emplace_back("f16", Tensor::FromF32(rnd(5), DType::kF16, {5}));
  ts.emplace_back("bf16", Tensor::FromF32(rnd(24), DType::kBF16, {2, 3, 4}));
  Tensor i8 = Tensor::Zeros(DType::kI8, {3});
  static_cast<int8_t*>(i8.mutable_data())[0] = -5;
  ts.emplace_back("i8", i8);
  Tensor u8 = Tensor::Zeros(DType::kU8, {3});
  static_cast<uint8_t*>(u8.mutable_data())[2] = 250;
  ts.emplace_back("u8", u8);
  Tensor i32 = Tensor::Zeros(DType::kI32, {2});
  static_cast<int32_t*>(i32.mutable_data())[1] = -123456;
  ts.emplace_back("i32", i32);
  ts.emplace_back("empty", Tensor::Zeros(DType::kF32, {0}));
  ts.emplace_back("scalar", Tensor::FromF32({7}, DType::kF32, {}));
  const std::string path = testing::TempDir() + "/rt.safetensors";
  CHORUS_ASSERT_OK(WriteSafetensors(path, ts, {{"k", "v"}, {"format", "pt"}}));
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ((*f)->metadata().at("k"), "v");
  ASSERT_EQ((*f)->tensors().size(), ts.size());
  for (const auto& [name, want] : ts) {
    SCOPED_TRACE(name);
    auto got = (*f)->GetTensor(name);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(got->dtype(), want.dtype());
    EXPECT_EQ(got->shape(), want.shape());
    ASSERT_EQ(got->view().NumBytes(), want.view().NumBytes());
    EXPECT_EQ(std::memcmp(got->data(), want.data(), static_cast<size_t>(want.view().NumBytes())),
              0);
  }
  // The file is streamed tensor by tensor; it must be the bytes Serialize assembles.
  auto written = ReadFileToString(path);
  ASSERT_TRUE(written.ok()) << written.status().ToString();
  auto bytes = SerializeSafetensors(ts, {{"k", "v"}, {"format", "pt"}});
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
  EXPECT_EQ(*written, *bytes);
}

TEST(SafetensorsTest, WriterRejectsBadInput) {
  EXPECT_EQ(SerializeSafetensors({{"q", Tensor::Zeros(DType::kQ8_0, {32})}}).status().code(),
            StatusCode::kUnimplemented);
  EXPECT_FALSE(SerializeSafetensors(
                   {{"a", Tensor::Zeros(DType::kF32, {1})}, {"a", Tensor::Zeros(DType::kF32, {1})}})
                   .ok());
  EXPECT_FALSE(SerializeSafetensors({{"", Tensor::Zeros(DType::kF32, {1})}}).ok());
  EXPECT_FALSE(SerializeSafetensors({{"__metadata__", Tensor::Zeros(DType::kF32, {1})}}).ok());
  EXPECT_FALSE(SerializeSafetensors({{"bad\xff", Tensor::Zeros(DType::kF32, {1})}}).ok());
}

TEST(SafetensorsTest, ShardedRoundTrip) {
  std::vector<std::pair<std::string, Tensor>> ts;
  for (int i = 0; i < 7; ++i) {
    std::vector<float> v(static_cast<size_t>(10 + i));
    std::iota(v.begin(), v.end(), static_cast<float>(100 * i));
    ts.emplace_back("layer." + std::to_string(i) + ".w",
                    Tensor::FromF32(v, DType::kF32, {static_cast<int64_t>(v.size())}));
  }
  const std::string dir = testing::TempDir();
  CHORUS_ASSERT_OK(WriteSafetensorsSharded(dir, ts, /*max_shard_bytes=*/120));
  // 40..64 bytes per tensor, at most 120 per shard: [40+44] [48+52] [56+60] [64] = 4 shards.
  EXPECT_TRUE(std::filesystem::exists(dir + "/model-00001-of-00004.safetensors"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/model-00004-of-00004.safetensors"));
  auto index = ReadFileToString(dir + "/model.safetensors.index.json");
  ASSERT_TRUE(index.ok());
  EXPECT_NE(index->find("\"total_size\": 364"), std::string::npos) << *index;
  for (const std::string& p : {dir, dir + "/model.safetensors.index.json"}) {
    auto m = SafetensorsModel::Open(p);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    EXPECT_EQ((*m)->files().size(), 4u);
    ASSERT_EQ((*m)->TensorNames().size(), 7u);
    for (const auto& [name, want] : ts) {
      auto got = (*m)->GetTensor(name);
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      EXPECT_EQ(got->ToF32(), want.ToF32()) << name;
    }
  }
  // A single file path works too.
  auto one = SafetensorsModel::Open(dir + "/model-00002-of-00004.safetensors");
  ASSERT_TRUE(one.ok());
  EXPECT_EQ((*one)->TensorNames(), (std::vector<std::string>{"layer.2.w", "layer.3.w"}));
}

TEST(SafetensorsTest, BadIndexFiles) {
  const std::string dir = testing::TempDir();
  CHORUS_ASSERT_OK(
      WriteSafetensors(dir + "/s.safetensors", {{"a", Tensor::FromF32({1}, DType::kF32, {1})}}));
  struct Case {
    const char* json;
    const char* expect;
  };
  const Case cases[] = {
      {"not json", "not a JSON object"},
      {"[1]", "not a JSON object"},
      {R"({"metadata": {}})", "weight_map"},
      {R"({"weight_map": {"a": 3}})", "not a string"},
      {R"({"weight_map": {"a": "../s.safetensors"}})", "plain file name"},
      {R"({"weight_map": {"a": "/etc/passwd"}})", "plain file name"},
      {R"({"weight_map": {"a": ".."}})", "plain file name"},
      {R"({"weight_map": {"b": "s.safetensors"}})", "'b' is not in its shard"},
      {R"({"weight_map": {"a": "missing.safetensors"}})", "missing.safetensors"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.json);
    ASSERT_TRUE(WriteFileAtomically(dir + "/model.safetensors.index.json", c.json).ok());
    auto m = SafetensorsModel::Open(dir);
    ASSERT_FALSE(m.ok());
    EXPECT_NE(m.status().message().find(c.expect), std::string::npos) << m.status().message();
    EXPECT_NE(m.status().message().find("model.safetensors.index.json"), std::string::npos);
  }
  EXPECT_EQ(SafetensorsModel::Open(testing::TempDir()).status().code(), StatusCode::kNotFound);
}

TEST(SafetensorsTest, MisalignedDataIsCopied) {
  // The format does not require the header to be padded, so data may start at an offset that
  // is not a multiple of the element size.
  const std::string header = R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  ASSERT_NE((8 + header.size()) % 4, 0u);
  auto f = SafetensorsFile::FromBytes("m.safetensors", MakeFile(header, Floats({3.5f, -1})));
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  auto t = (*f)->GetTensor("x");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t->data()) % 4, 0u);
  EXPECT_EQ(t->ToF32(), (std::vector<float>{3.5f, -1}));
}

TEST(SafetensorsTest, UnsupportedDTypeListedButNotLoaded) {
  const std::string header = R"({"x":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})";
  auto f = SafetensorsFile::FromBytes("f64.safetensors", MakeFile(header, std::string(8, '\0')));
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ((*f)->GetTensor("x").status().code(), StatusCode::kUnimplemented);
}

TEST(SafetensorsTest, EveryTruncationFails) {
  auto good = SerializeSafetensors({{"a", Tensor::FromF32({1, 2, 3}, DType::kF32, {3})},
                                    {"b", Tensor::FromF32({4}, DType::kBF16, {1})}});
  ASSERT_TRUE(good.ok());
  ASSERT_TRUE(SafetensorsFile::FromBytes("t.safetensors", *good).ok());
  for (size_t n = 0; n < good->size(); ++n) {
    auto f = SafetensorsFile::FromBytes("t.safetensors", good->substr(0, n));
    ASSERT_FALSE(f.ok()) << n;
    EXPECT_EQ(f.status().message().rfind("t.safetensors: ", 0), 0u) << f.status().message();
  }
  EXPECT_FALSE(SafetensorsFile::FromBytes("t.safetensors", *good + "x").ok());
}

TEST(SafetensorsTest, CorruptHeadersGiveCleanErrors) {
  const std::string d8 = std::string(8, '\0');
  struct Case {
    std::string header, data, expect;
  };
  const std::vector<Case> cases = {
      {"", "", "does not start with '{'"},
      {"[]", "", "does not start with '{'"},
      {"{\"a\":", "", "not valid JSON"},
      {"{} garbage", "", "not valid JSON"},
      {R"({"a":1})", "", "not a JSON object"},
      {R"({"a":{"shape":[2],"data_offsets":[0,8]}})", d8, "dtype"},
      {R"({"a":{"dtype":"F32","data_offsets":[0,8]}})", d8, "shape"},
      {R"({"a":{"dtype":"F32","shape":[2]}})", d8, "data_offsets"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", d8, "data_offsets"},
      {R"({"a":{"dtype":"Q9","shape":[2],"data_offsets":[0,8]}})", d8, "unknown dtype"},
      {R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", d8, "non-negative"},
      {R"({"a":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", d8, "non-negative"},
      {R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", d8,
       "absurd shape"},
      {R"({"a":{"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,8]}})", d8,
       "overflows"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", d8, "outside"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,16]}})", d8, "outside"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,18446744073709551615]}})", d8,
       "outside"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,-8]}})", d8, "non-negative"},
      {R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", d8, "needs 12 bytes"},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
       d8, "overlap"},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", d8, "gap"},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", d8, "cover 4 bytes"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
       d8, "duplicate entry 'a'"},
      {R"({"__metadata__":{"k":1}})", "", "not a string"},
      {R"({"__metadata__":[]})", "", "__metadata__ is not"},
      {"{\"a\xff\":{}}", "", "not valid JSON"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.header);
    auto f = SafetensorsFile::FromBytes("c.safetensors", MakeFile(c.header, c.data));
    ASSERT_FALSE(f.ok());
    EXPECT_EQ(f.status().message().rfind("c.safetensors: ", 0), 0u) << f.status().message();
    EXPECT_NE(f.status().message().find(c.expect), std::string::npos) << f.status().message();
  }
  // Header length fields.
  std::string huge = MakeFile("{}", "");
  const uint64_t big = uint64_t{1} << 40;
  std::memcpy(huge.data(), &big, 8);
  auto f = SafetensorsFile::FromBytes("c.safetensors", huge);
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("exceeds the limit"), std::string::npos);
  std::string past = MakeFile("{}", "");
  const uint64_t three = 3;
  std::memcpy(past.data(), &three, 8);
  f = SafetensorsFile::FromBytes("c.safetensors", past);
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("extends past end of file"), std::string::npos);
  // An empty header with no data is a valid, empty file.
  EXPECT_TRUE(SafetensorsFile::FromBytes("e.safetensors", MakeFile("{}", "")).ok());
}

}  // namespace
}  // namespace chorus::formats
