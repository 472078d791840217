// test-labels: unit
#include "chorus/formats/gguf.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "tests/testutil/testutil.h"

namespace chorus::formats {
namespace {

// ---------------------------------------------------------------------------------------------
// A hand-rolled GGUF byte builder, independent of GgufWriter, so the reader and the writer are
// both checked against bytes laid out straight from the spec.
class RawGguf {
 public:
  RawGguf& Bytes(std::string_view s) {
    out_.append(s.data(), s.size());
    return *this;
  }
  template <typename T>
  RawGguf& Le(T v) {
    char b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));
    out_.append(b, sizeof(T));
    return *this;
  }
  RawGguf& Str(std::string_view s) { return Le<uint64_t>(s.size()).Bytes(s); }
  RawGguf& Pad(size_t align) {
    while (out_.size() % align) out_.push_back('\0');
    return *this;
  }
  size_t size() const { return out_.size(); }
  std::string& str() { return out_; }

 private:
  std::string out_;
};

// A small valid file: 2 metadata keys, two F32 tensors "a" ne={4,2} and "b" ne={8}.
// Data: a = 0..7, b = 100..107 (each 32 bytes, so there is no trailing padding).
struct SmallFile {
  std::string bytes;
  size_t off_version, off_n_tensors, off_n_kv, off_key0_len, off_val0, off_key1_type, off_arr_count,
      off_t0_name_len, off_t0_ndims, off_t0_ne0, off_t0_type, off_t0_offset, off_t1_offset,
      off_t1_name, off_data;
};

SmallFile MakeSmallFile() {
  SmallFile f;
  RawGguf g;
  g.Bytes("GGUF");
  f.off_version = g.size();
  g.Le<uint32_t>(3);
  f.off_n_tensors = g.size();
  g.Le<uint64_t>(2);
  f.off_n_kv = g.size();
  g.Le<uint64_t>(2);
  f.off_key0_len = g.size();
  g.Str("general.name").Le<uint32_t>(8);
  f.off_val0 = g.size();
  g.Str("tiny");
  g.Str("list");
  f.off_key1_type = g.size();
  g.Le<uint32_t>(9).Le<uint32_t>(5);
  f.off_arr_count = g.size();
  g.Le<uint64_t>(3).Le<int32_t>(-1).Le<int32_t>(0).Le<int32_t>(7);
  f.off_t0_name_len = g.size();
  g.Str("a");
  f.off_t0_ndims = g.size();
  g.Le<uint32_t>(2);
  f.off_t0_ne0 = g.size();
  g.Le<uint64_t>(4).Le<uint64_t>(2);
  f.off_t0_type = g.size();
  g.Le<uint32_t>(0);
  f.off_t0_offset = g.size();
  g.Le<uint64_t>(0);
  f.off_t1_name = g.size() + 8;
  g.Str("b").Le<uint32_t>(1).Le<uint64_t>(8).Le<uint32_t>(0);
  f.off_t1_offset = g.size();
  g.Le<uint64_t>(32);
  g.Pad(32);
  f.off_data = g.size();
  for (int i = 0; i < 8; ++i) g.Le<float>(static_cast<float>(i));
  for (int i = 0; i < 8; ++i) g.Le<float>(100.0f + i);
  f.bytes = g.str();
  return f;
}

template <typename T>
void Poke(std::string* s, size_t off, T v) {
  std::memcpy(s->data() + off, &v, sizeof(T));
}

TEST(GgufTest, ReadsHandBuiltFile) {
  SmallFile f = MakeSmallFile();
  auto file = GgufFile::FromBytes("small.gguf", f.bytes);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  const GgufFile& g = **file;
  EXPECT_EQ(g.version(), 3u);
  EXPECT_EQ(g.alignment(), 32u);
  EXPECT_EQ(*g.GetString("general.name"), "tiny");
  EXPECT_EQ(*g.GetIntArray("list"), (std::vector<int64_t>{-1, 0, 7}));
  EXPECT_EQ(*g.GetFloatArray("list"), (std::vector<double>{-1, 0, 7}));
  ASSERT_EQ(g.tensors().size(), 2u);
  // ne = {4, 2} (innermost first) is shape [2, 4].
  EXPECT_EQ(g.tensors()[0].shape, (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(g.tensors()[0].n_bytes, 32u);
  auto a = g.GetTensor("a");
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->dtype(), DType::kF32);
  EXPECT_EQ(a->ToF32(), (std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a->data()) % 4, 0u);
  auto b = g.GetTensor("b");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->shape(), (std::vector<int64_t>{8}));
  EXPECT_EQ(b->ToF32()[7], 107.0f);
  // Typed getter errors.
  EXPECT_EQ(g.GetString("missing").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(g.GetInt("general.name").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(g.GetStringArray("list").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(g.GetTensor("nope").status().code(), StatusCode::kNotFound);
}

TEST(GgufTest, WriterProducesSpecBytes) {
  // The writer's output for the same content must equal the hand-built bytes exactly.
  GgufWriter w;
  w.SetString("general.name", "tiny");
  w.SetInt32Array("list", {-1, 0, 7});
  w.AddTensor("a", Tensor::FromF32({0, 1, 2, 3, 4, 5, 6, 7}, DType::kF32, {2, 4}));
  w.AddTensor("b", Tensor::FromF32({100, 101, 102, 103, 104, 105, 106, 107}, DType::kF32, {8}));
  auto bytes = w.Serialize();
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
  EXPECT_EQ(*bytes, MakeSmallFile().bytes);
}

TEST(GgufTest, OpenMissingFile) {
  auto r = GgufFile::Open("/nonexistent/x.gguf");
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
}

// ---------------------------------------------------------------------------------------------
// Real files from llama.cpp (../shared/models/ggml-vocab, see its PROVENANCE.md).

TEST(GgufTest, RealLlamaSpmVocab) {
  CHORUS_REQUIRE_SHARED_MODEL("ggml-vocab/ggml-vocab-llama-spm.gguf");
  auto file = GgufFile::Open(testing::SharedModelsDir() + "/ggml-vocab/ggml-vocab-llama-spm.gguf");
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  const GgufFile& g = **file;
  EXPECT_EQ(g.version(), 3u);
  EXPECT_TRUE(g.tensors().empty());
  EXPECT_EQ(*g.GetString("general.architecture"), "llama");
  EXPECT_EQ(*g.GetString("tokenizer.ggml.model"), "llama");
  EXPECT_EQ(*g.GetString("tokenizer.ggml.pre"), "default");
  auto tokens = g.GetStringArray("tokenizer.ggml.tokens");
  ASSERT_TRUE(tokens.ok()) << tokens.status().ToString();
  ASSERT_EQ(tokens->size(), 32000u);
  // Pieces checked against Meta's tokenizer.json (llama2-tokenizer).
  EXPECT_EQ((*tokens)[0], "<unk>");
  EXPECT_EQ((*tokens)[1], "<s>");
  EXPECT_EQ((*tokens)[2], "</s>");
  EXPECT_EQ((*tokens)[3], "<0x00>");
  EXPECT_EQ((*tokens)[450], "\xe2\x96\x81The");
  EXPECT_EQ((*tokens)[29871], "\xe2\x96\x81");
  EXPECT_EQ((*tokens)[31999], "\xe7\xbb\x99");
  auto scores = g.GetFloatArray("tokenizer.ggml.scores");
  ASSERT_TRUE(scores.ok());
  EXPECT_EQ(scores->size(), 32000u);
  auto types = g.GetIntArray("tokenizer.ggml.token_type");
  ASSERT_TRUE(types.ok());
  EXPECT_EQ(types->size(), 32000u);
  EXPECT_EQ((*types)[0], 2);    // UNKNOWN
  EXPECT_EQ((*types)[1], 3);    // CONTROL
  EXPECT_EQ((*types)[3], 6);    // BYTE
  EXPECT_EQ((*types)[450], 1);  // NORMAL
  EXPECT_EQ(*g.GetInt("tokenizer.ggml.bos_token_id"), 1);
  EXPECT_EQ(*g.GetInt("tokenizer.ggml.eos_token_id"), 2);
  EXPECT_EQ(*g.GetInt("tokenizer.ggml.unknown_token_id"), 0);
  EXPECT_EQ(*g.GetInt("tokenizer.ggml.add_bos_token"), 1);
  EXPECT_EQ(*g.GetInt("llama.context_length"), 4096);
  EXPECT_EQ(*g.GetInt("llama.embedding_length"), 4096);
}

TEST(GgufTest, RealGpt2Vocab) {
  CHORUS_REQUIRE_SHARED_MODEL("ggml-vocab/ggml-vocab-gpt-2.gguf");
  auto file = GgufFile::Open(testing::SharedModelsDir() + "/ggml-vocab/ggml-vocab-gpt-2.gguf");
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  const GgufFile& g = **file;
  EXPECT_EQ(*g.GetString("general.architecture"), "gpt2");
  EXPECT_EQ(*g.GetString("tokenizer.ggml.model"), "gpt2");
  auto tokens = g.GetStringArray("tokenizer.ggml.tokens");
  ASSERT_TRUE(tokens.ok());
  ASSERT_EQ(tokens->size(), 50257u);
  EXPECT_EQ((*tokens)[0], "!");
  EXPECT_EQ((*tokens)[464], "The");
  EXPECT_EQ((*tokens)[50256], "<|endoftext|>");
  auto merges = g.GetStringArray("tokenizer.ggml.merges");
  ASSERT_TRUE(merges.ok());
  ASSERT_EQ(merges->size(), 50000u);
  EXPECT_EQ((*merges)[0], "\xc4\xa0 t");  // "Ġ t", the first line of GPT-2's merges.txt
  EXPECT_EQ(*g.GetInt("tokenizer.ggml.bos_token_id"), 50256);
  EXPECT_EQ(*g.GetInt("tokenizer.ggml.eos_token_id"), 50256);
}

// ---------------------------------------------------------------------------------------------
// Round trip: every metadata type and every supported tensor type.

std::vector<float> RandomFloats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

TEST(GgufTest, RoundTripAllTypes) {
  GgufWriter w;
  w.Set("u8", GgufValue::Uint(GgufType::kUint8, 255));
  w.Set("i8", GgufValue::Int(GgufType::kInt8, -128));
  w.Set("u16", GgufValue::Uint(GgufType::kUint16, 65535));
  w.Set("i16", GgufValue::Int(GgufType::kInt16, -32768));
  w.SetUint32("u32", 4000000000u);
  w.SetInt32("i32", -2000000000);
  w.SetFloat32("f32", 0.15625f);
  w.SetBool("bool", true);
  w.SetString("str", std::string("h\xc3\xa9llo\0world", 12));
  w.Set("u64", GgufValue::Uint(GgufType::kUint64, UINT64_MAX));
  w.Set("i64", GgufValue::Int(GgufType::kInt64, INT64_MIN));
  w.Set("f64", GgufValue::Float(GgufType::kFloat64, 1.0 / 3.0));
  w.Set("nan", GgufValue::Float(GgufType::kFloat32, std::nan("")));
  w.Set("a_u8", GgufValue::IntArray(GgufType::kUint8, {0, 1, 255}));
  w.Set("a_i8", GgufValue::IntArray(GgufType::kInt8, {-128, 127}));
  w.Set("a_u16", GgufValue::IntArray(GgufType::kUint16, {65535}));
  w.Set("a_i16", GgufValue::IntArray(GgufType::kInt16, {-32768, 5}));
  w.Set("a_u32", GgufValue::IntArray(GgufType::kUint32, {4294967295LL}));
  w.SetInt32Array("a_i32", {INT32_MIN, 0, INT32_MAX});
  w.Set("a_u64", GgufValue::IntArray(GgufType::kUint64, {-1 /* bit-cast UINT64_MAX */, 3}));
  w.Set("a_i64", GgufValue::IntArray(GgufType::kInt64, {INT64_MIN, INT64_MAX}));
  w.Set("a_bool", GgufValue::IntArray(GgufType::kBool, {1, 0, 1}));
  w.SetFloat32Array("a_f32", {1.5f, -2.25f});
  w.Set("a_f64", GgufValue::FloatArray(GgufType::kFloat64, {1e300, -1e-300}));
  w.SetStringArray("a_str", {"", "x", std::string(300, 'y')});
  w.SetStringArray("a_empty", {});
  w.SetString("str", "replaced");  // setting again replaces

  std::vector<std::pair<std::string, Tensor>> tensors;
  tensors.emplace_back("f32", Tensor::FromF32(RandomFloats(6, 1), DType::kF32, {2, 3}));
  tensors.emplace_back("f16", Tensor::FromF32(RandomFloats(10, 2), DType::kF16, {10}));
  tensors.emplace_back("bf16", Tensor::FromF32(RandomFloats(24, 3), DType::kBF16, {2, 3, 4}));
  tensors.emplace_back("q8_0", Tensor::FromF32(RandomFloats(128, 4), DType::kQ8_0, {2, 64}));
  tensors.emplace_back("q4_0", Tensor::FromF32(RandomFloats(192, 5), DType::kQ4_0, {1, 2, 3, 32}));
  Tensor i8 = Tensor::Zeros(DType::kI8, {5});
  for (int i = 0; i < 5; ++i)
    static_cast<int8_t*>(i8.mutable_data())[i] = static_cast<int8_t>(i - 2);
  tensors.emplace_back("i8", i8);
  Tensor i32 = Tensor::Zeros(DType::kI32, {3});
  static_cast<int32_t*>(i32.mutable_data())[2] = -7;
  tensors.emplace_back("i32", i32);
  tensors.emplace_back("empty", Tensor::Zeros(DType::kF32, {0, 4}));
  for (auto& [n, t] : tensors) w.AddTensor(n, t);

  const std::string path = testing::TempDir() + "/all.gguf";
  CHORUS_ASSERT_OK(w.Write(path));
  auto file = GgufFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  const GgufFile& g = **file;

  EXPECT_EQ(g.metadata().size(), 26u);
  EXPECT_EQ(g.metadata().at("u8"), GgufValue::Uint(GgufType::kUint8, 255));
  EXPECT_EQ(g.metadata().at("i8"), GgufValue::Int(GgufType::kInt8, -128));
  EXPECT_EQ(g.metadata().at("u16"), GgufValue::Uint(GgufType::kUint16, 65535));
  EXPECT_EQ(g.metadata().at("i16"), GgufValue::Int(GgufType::kInt16, -32768));
  EXPECT_EQ(*g.GetInt("u32"), 4000000000LL);
  EXPECT_EQ(*g.GetInt("i32"), -2000000000LL);
  EXPECT_EQ(*g.GetFloat("f32"), 0.15625);
  EXPECT_EQ(*g.GetInt("bool"), 1);
  EXPECT_EQ(g.metadata().at("bool").type, GgufType::kBool);
  EXPECT_EQ(*g.GetString("str"), "replaced");
  EXPECT_EQ(g.metadata().at("u64"), GgufValue::Uint(GgufType::kUint64, UINT64_MAX));
  EXPECT_EQ(g.GetInt("u64").status().code(), StatusCode::kInvalidArgument);  // > INT64_MAX
  EXPECT_EQ(*g.GetInt("i64"), INT64_MIN);
  EXPECT_EQ(*g.GetFloat("f64"), 1.0 / 3.0);
  EXPECT_TRUE(std::isnan(*g.GetFloat("nan")));
  EXPECT_EQ(*g.GetIntArray("a_u8"), (std::vector<int64_t>{0, 1, 255}));
  EXPECT_EQ(*g.GetIntArray("a_i8"), (std::vector<int64_t>{-128, 127}));
  EXPECT_EQ(*g.GetIntArray("a_u16"), (std::vector<int64_t>{65535}));
  EXPECT_EQ(*g.GetIntArray("a_i16"), (std::vector<int64_t>{-32768, 5}));
  EXPECT_EQ(*g.GetIntArray("a_u32"), (std::vector<int64_t>{4294967295LL}));
  EXPECT_EQ(*g.GetIntArray("a_i32"), (std::vector<int64_t>{INT32_MIN, 0, INT32_MAX}));
  EXPECT_EQ(*g.GetIntArray("a_u64"), (std::vector<int64_t>{-1, 3}));
  EXPECT_EQ((*g.GetFloatArray("a_u64"))[0], 18446744073709551615.0);
  EXPECT_EQ(*g.GetIntArray("a_i64"), (std::vector<int64_t>{INT64_MIN, INT64_MAX}));
  EXPECT_EQ(*g.GetIntArray("a_bool"), (std::vector<int64_t>{1, 0, 1}));
  EXPECT_EQ(g.metadata().at("a_bool").element_type, GgufType::kBool);
  EXPECT_EQ(*g.GetFloatArray("a_f32"), (std::vector<double>{1.5, -2.25}));
  EXPECT_EQ(*g.GetFloatArray("a_f64"), (std::vector<double>{1e300, -1e-300}));
  EXPECT_EQ(*g.GetStringArray("a_str"), (std::vector<std::string>{"", "x", std::string(300, 'y')}));
  EXPECT_TRUE(g.GetStringArray("a_empty")->empty());

  ASSERT_EQ(g.tensors().size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& [name, want] = tensors[i];
    SCOPED_TRACE(name);
    EXPECT_EQ(g.tensors()[i].name, name);
    EXPECT_EQ(g.tensors()[i].offset % 32, 0u);
    auto got = g.GetTensor(name);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(got->dtype(), want.dtype());
    EXPECT_EQ(got->shape(), want.shape());
    ASSERT_EQ(got->view().NumBytes(), want.view().NumBytes());
    EXPECT_EQ(std::memcmp(got->data(), want.data(), static_cast<size_t>(want.view().NumBytes())),
              0);
  }
  EXPECT_EQ(g.tensors()[0].ggml_type, 0u);
  EXPECT_EQ(g.tensors()[2].ggml_type, 30u);  // BF16
  EXPECT_EQ(g.tensors()[3].ggml_type, 8u);   // Q8_0
  EXPECT_EQ(g.tensors()[4].ggml_type, 2u);   // Q4_0
  // Tensors outlive the file object (the mmap is kept alive by the Tensor).
  auto keep = g.GetTensor("f32");
  ASSERT_TRUE(keep.ok());
  file = GgufFile::FromBytes("x", "");  // drops the last reference to the opened file
  EXPECT_EQ(keep->ToF32(), tensors[0].second.ToF32());
}

TEST(GgufTest, CustomAlignment) {
  GgufWriter w;
  w.SetUint32("general.alignment", 64);
  w.AddTensor("x", Tensor::FromF32({1, 2, 3}, DType::kF32, {3}));
  w.AddTensor("y", Tensor::FromF32({4, 5}, DType::kF32, {2}));
  auto bytes = w.Serialize();
  ASSERT_TRUE(bytes.ok());
  auto g = GgufFile::FromBytes("a.gguf", *bytes);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ((*g)->alignment(), 64u);
  EXPECT_EQ((*g)->tensors()[1].offset, 64u);
  EXPECT_EQ((*g)->GetTensor("y")->ToF32(), (std::vector<float>{4, 5}));

  GgufWriter bad;
  bad.SetUint32("general.alignment", 48);
  EXPECT_FALSE(bad.Serialize().ok());
}

TEST(GgufTest, StreamedWriteEqualsSerializeByteForByte) {
  // Write() streams the header and each tensor from its own buffer with the padding between;
  // Serialize() assembles the same file in memory. Odd tensor sizes, every padding width, custom
  // alignments, a zero-size tensor, a file without tensors and a bad one.
  const std::string path = testing::TempDir() + "/streamed.gguf";
  for (uint32_t alignment : {0u, 1u, 8u, 32u, 64u, 4096u}) {
    for (int n_tensors : {0, 1, 2, 5}) {
      GgufWriter w;
      w.SetString("general.name", "streamed");
      if (alignment != 0) w.SetUint32("general.alignment", alignment);
      for (int i = 0; i < n_tensors; ++i) {
        std::vector<float> v(static_cast<size_t>(1 + 7 * i), 0.5f + static_cast<float>(i));
        std::string name = "t";  // (not "t" + std::to_string(i): GCC 12's bogus -Wrestrict)
        name += std::to_string(i);
        w.AddTensor(name, Tensor::FromF32(v, i % 2 ? DType::kBF16 : DType::kF32,
                                          {static_cast<int64_t>(v.size())}));
      }
      if (n_tensors == 5) w.AddTensor("empty", Tensor::FromF32({}, DType::kF32, {0}));
      auto bytes = w.Serialize();
      ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
      ASSERT_TRUE(w.Write(path).ok());
      auto written = ReadFileToString(path);
      ASSERT_TRUE(written.ok());
      EXPECT_EQ(*written, *bytes) << "alignment " << alignment << ", " << n_tensors << " tensors";
    }
  }
  GgufWriter bad;
  bad.SetUint32("general.alignment", 48);
  bad.AddTensor("x", Tensor::FromF32({1}, DType::kF32, {1}));
  ASSERT_TRUE(GgufWriter().Write(path).ok());
  EXPECT_FALSE(bad.Write(path).ok());
  auto kept = ReadFileToString(path);  // a refused write leaves the file as it was
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(*kept, *GgufWriter().Serialize());
}

TEST(GgufTest, WriterRejectsBadInput) {
  {
    GgufWriter w;
    w.AddTensor("x", Tensor::Zeros(DType::kF32, {2}));
    w.AddTensor("x", Tensor::Zeros(DType::kF32, {2}));
    EXPECT_EQ(w.Serialize().status().code(), StatusCode::kInvalidArgument);
  }
  {
    GgufWriter w;
    w.AddTensor("u8", Tensor::Zeros(DType::kU8, {2}));
    EXPECT_EQ(w.Serialize().status().code(), StatusCode::kUnimplemented);
  }
  {
    GgufWriter w;
    w.Set("v", GgufValue::Uint(GgufType::kUint8, 256));
    EXPECT_EQ(w.Serialize().status().code(), StatusCode::kInvalidArgument);
  }
  {
    GgufWriter w;
    w.Set("v", GgufValue::IntArray(GgufType::kInt8, {1, 200}));
    EXPECT_EQ(w.Serialize().status().code(), StatusCode::kInvalidArgument);
  }
  {
    GgufWriter w;
    w.Set("v", GgufValue::Int(GgufType::kUint32, 5));  // wrong variant for the type
    EXPECT_EQ(w.Serialize().status().code(), StatusCode::kInvalidArgument);
  }
}

TEST(GgufTest, UnsupportedTypeListedButNotLoaded) {
  RawGguf g;
  g.Bytes("GGUF").Le<uint32_t>(3).Le<uint64_t>(1).Le<uint64_t>(0);
  // Q5_0 (id 6: blocks of 32 in 22 bytes) is listed but has no Chorus decoder (the K types,
  // Q4_K included, are loaded: gguf_kquant_test.cc).
  g.Str("k").Le<uint32_t>(1).Le<uint64_t>(256).Le<uint32_t>(6 /* Q5_0 */).Le<uint64_t>(0);
  g.Pad(32);
  g.str().append(176, '\0');
  auto f = GgufFile::FromBytes("k.gguf", g.str());
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ((*f)->tensors()[0].n_bytes, 176u);
  auto t = (*f)->GetTensor("k");
  EXPECT_EQ(t.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(t.status().message().find("Q5_0"), std::string::npos) << t.status().message();
}

TEST(GgufTest, AcceptsVersion2) {
  SmallFile f = MakeSmallFile();
  Poke<uint32_t>(&f.bytes, f.off_version, 2);
  auto g = GgufFile::FromBytes("v2.gguf", f.bytes);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ((*g)->version(), 2u);
}

// ---------------------------------------------------------------------------------------------
// Corruptions: every one must give a clean error naming the file (and the problem).

TEST(GgufTest, EveryTruncationFails) {
  const SmallFile f = MakeSmallFile();
  for (size_t n = 0; n < f.bytes.size(); ++n) {
    auto g = GgufFile::FromBytes("trunc.gguf", f.bytes.substr(0, n));
    ASSERT_FALSE(g.ok()) << "prefix of " << n << " bytes accepted";
    EXPECT_EQ(g.status().message().rfind("trunc.gguf: ", 0), 0u) << g.status().message();
  }
}

struct Corruption {
  const char* name;
  std::function<void(SmallFile&)> apply;
  const char* expect;  // substring of the message
};

TEST(GgufTest, CorruptionsGiveCleanErrors) {
  const std::vector<Corruption> cases = {
      {"bad magic", [](SmallFile& f) { f.bytes[0] = 'X'; }, "bad magic"},
      {"v1", [](SmallFile& f) { Poke<uint32_t>(&f.bytes, f.off_version, 1); }, "v1"},
      {"v99", [](SmallFile& f) { Poke<uint32_t>(&f.bytes, f.off_version, 99); }, "version 99"},
      {"big endian", [](SmallFile& f) { Poke<uint32_t>(&f.bytes, f.off_version, 0x03000000u); },
       "big-endian"},
      {"huge tensor count",
       [](SmallFile& f) { Poke<uint64_t>(&f.bytes, f.off_n_tensors, UINT64_MAX); }, "tensor count"},
      {"huge kv count",
       [](SmallFile& f) { Poke<uint64_t>(&f.bytes, f.off_n_kv, uint64_t{1} << 40); },
       "metadata count"},
      {"kv count too big by one", [](SmallFile& f) { Poke<uint64_t>(&f.bytes, f.off_n_kv, 3); },
       "small.gguf"},
      {"huge key length",
       [](SmallFile& f) { Poke<uint64_t>(&f.bytes, f.off_key0_len, uint64_t{1} << 62); }, "limit"},
      {"huge string value",
       [](SmallFile& f) { Poke<uint64_t>(&f.bytes, f.off_val0, UINT64_MAX - 3); },
       "extends past end of file"},
      {"bad value type", [](SmallFile& f) { Poke<uint32_t>(&f.bytes, f.off_key1_type, 13); },
       "invalid value type"},
      {"nested array", [](SmallFile& f) { Poke<uint32_t>(&f.bytes, f.off_key1_type + 4, 9); },
       "nested array"},
      {"huge array count",
       [](SmallFile& f) { Poke<uint64_t>(&f.bytes, f.off_arr_count, uint64_t{1} << 61); },
       "elements"},
      {"bool byte 2",
       [](SmallFile& f) {
         Poke<uint32_t>(&f.bytes, f.off_key1_type + 4, 7);  // array of bool: 3 bytes + junk
         Poke<uint8_t>(&f.bytes, f.off_arr_count + 8, 2);
       },
       "bool"},
      {"huge tensor name",
       [](SmallFile& f) { Poke<uint64_t>(&f.bytes, f.off_t0_name_len, uint64_t{1} << 40); },
       "limit"},
      {"empty tensor name",
       [](SmallFile& f) {
         // Tensor "a" loses its one name byte and gets length 0.
         std::string& b = f.bytes;
         b.erase(f.off_t0_name_len + 8, 1);
         Poke<uint64_t>(&b, f.off_t0_name_len, 0);
       },
       "empty name"},
      {"n_dims 5", [](SmallFile& f) { Poke<uint32_t>(&f.bytes, f.off_t0_ndims, 5); }, "dimensions"},
      {"n_dims huge", [](SmallFile& f) { Poke<uint32_t>(&f.bytes, f.off_t0_ndims, 0xffffffffu); },
       "dimensions"},
      {"shape overflow",
       [](SmallFile& f) {
         Poke<uint64_t>(&f.bytes, f.off_t0_ne0, uint64_t{1} << 40);
         Poke<uint64_t>(&f.bytes, f.off_t0_ne0 + 8, uint64_t{1} << 40);
       },
       "absurd shape"},
      {"negative-as-signed dim",
       [](SmallFile& f) { Poke<uint64_t>(&f.bytes, f.off_t0_ne0, UINT64_MAX); }, "absurd shape"},
      {"shape past end", [](SmallFile& f) { Poke<uint64_t>(&f.bytes, f.off_t0_ne0, 1000); },
       "tensor 'a' data [offset 0, 8000 bytes] extends past end"},
      {"invalid ggml type", [](SmallFile& f) { Poke<uint32_t>(&f.bytes, f.off_t0_type, 200); },
       "invalid GGML type"},
      {"quant row not multiple of 32",
       [](SmallFile& f) { Poke<uint32_t>(&f.bytes, f.off_t0_type, 8); }, "block size"},
      {"misaligned offset", [](SmallFile& f) { Poke<uint64_t>(&f.bytes, f.off_t0_offset, 4); },
       "alignment"},
      {"offset past end", [](SmallFile& f) { Poke<uint64_t>(&f.bytes, f.off_t1_offset, 64); },
       "extends past end"},
      {"offset overflow",
       [](SmallFile& f) { Poke<uint64_t>(&f.bytes, f.off_t1_offset, UINT64_MAX - 31); },
       "extends past end"},
      {"overlap", [](SmallFile& f) { Poke<uint64_t>(&f.bytes, f.off_t1_offset, 0); }, "overlap"},
      {"duplicate tensor", [](SmallFile& f) { f.bytes[f.off_t1_name] = 'a'; }, "duplicate tensor"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    SmallFile f = MakeSmallFile();
    c.apply(f);
    auto g = GgufFile::FromBytes("small.gguf", f.bytes);
    ASSERT_FALSE(g.ok());
    EXPECT_EQ(g.status().message().rfind("small.gguf: ", 0), 0u) << g.status().message();
    EXPECT_NE(g.status().message().find(c.expect), std::string::npos) << g.status().message();
  }
}

TEST(GgufTest, DuplicateKeyRejected) {
  RawGguf g;
  g.Bytes("GGUF").Le<uint32_t>(3).Le<uint64_t>(0).Le<uint64_t>(2);
  g.Str("k").Le<uint32_t>(4).Le<uint32_t>(1);
  g.Str("k").Le<uint32_t>(4).Le<uint32_t>(2);
  auto f = GgufFile::FromBytes("dup.gguf", g.str());
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("duplicate metadata 'k'"), std::string::npos);
}

TEST(GgufTest, BadAlignmentValues) {
  for (uint32_t a : {0u, 3u, 48u}) {
    RawGguf g;
    g.Bytes("GGUF").Le<uint32_t>(3).Le<uint64_t>(0).Le<uint64_t>(1);
    g.Str("general.alignment").Le<uint32_t>(4).Le<uint32_t>(a);
    auto f = GgufFile::FromBytes("al.gguf", g.str());
    ASSERT_FALSE(f.ok()) << a;
    EXPECT_NE(f.status().message().find("power of two"), std::string::npos);
  }
  RawGguf g;
  g.Bytes("GGUF").Le<uint32_t>(3).Le<uint64_t>(0).Le<uint64_t>(1);
  g.Str("general.alignment").Le<uint32_t>(10).Le<uint64_t>(32);  // uint64, not uint32
  EXPECT_FALSE(GgufFile::FromBytes("al.gguf", g.str()).ok());
}

TEST(GgufTest, TinyAlignmentCopiesMisalignedData) {
  // With general.alignment = 1 a tensor may start at an odd address; GetTensor must still hand
  // out correctly aligned f32 data.
  RawGguf g;
  g.Bytes("GGUF").Le<uint32_t>(3).Le<uint64_t>(1).Le<uint64_t>(1);
  g.Str("general.alignment").Le<uint32_t>(4).Le<uint32_t>(1);
  g.Str("t").Le<uint32_t>(1).Le<uint64_t>(2).Le<uint32_t>(0).Le<uint64_t>(1);
  g.Bytes(std::string(1, '\0')).Le<float>(1.5f).Le<float>(-2.0f);
  auto f = GgufFile::FromBytes("a1.gguf", g.str());
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  auto t = (*f)->GetTensor("t");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t->data()) % 4, 0u);
  EXPECT_EQ(t->ToF32(), (std::vector<float>{1.5f, -2.0f}));
}

TEST(GgufTest, CorruptRealFileHeaderFields) {
  CHORUS_REQUIRE_SHARED_MODEL("ggml-vocab/ggml-vocab-llama-spm.gguf");
  auto raw = ReadFileToString(testing::SharedModelsDir() + "/ggml-vocab/ggml-vocab-llama-spm.gguf");
  ASSERT_TRUE(raw.ok());
  // Truncate at many points: every prefix must fail cleanly.
  for (size_t n : {size_t{0}, size_t{3}, size_t{10}, size_t{24}, size_t{100}, size_t{1000},
                   raw->size() / 2, raw->size() - 1}) {
    auto g = GgufFile::FromBytes("spm.gguf", raw->substr(0, n));
    EXPECT_FALSE(g.ok()) << n;
  }
}

}  // namespace
}  // namespace chorus::formats
