// K-quant tensors in GGUF: Chorus's decoders against values written by llama.cpp itself
// (tests/kquant_fixture, see its PROVENANCE.md), Chorus's own quantizer against llama.cpp's on
// the same rows, a written-and-reread mixed-type file, and bad K-quant tensors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "chorus/base/mapped_file.h"
#include "chorus/formats/gguf.h"
#include "tests/testutil/testutil.h"

namespace chorus::formats {
namespace {

const char* kFixture = CHORUS_SOURCE_DIR "/tests/kquant_fixture/kquants.gguf";

const DType kKTypes[] = {DType::kQ2_K, DType::kQ3_K, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};

double Rmse(const std::vector<float>& a, const std::vector<float>& b) {
  double se = 0;
  for (size_t i = 0; i < a.size(); ++i) se += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
  return std::sqrt(se / static_cast<double>(a.size()));
}

TEST(GgufKQuantTest, DequantizationEqualsLlamaCppBitForBit) {
  auto f = GgufFile::Open(kFixture);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  for (DType t : kKTypes) {
    const std::string name(DTypeName(t));
    auto q = (*f)->GetTensor(name);
    ASSERT_TRUE(q.ok()) << q.status().ToString();
    EXPECT_EQ(q->dtype(), t);
    ASSERT_EQ(q->shape(), (std::vector<int64_t>{4, 256}));
    auto want = (*f)->GetTensor(name + ".deq");
    ASSERT_TRUE(want.ok());
    const std::vector<float> got = q->ToF32();
    const std::vector<float> ref = want->ToF32();
    ASSERT_EQ(got.size(), ref.size());
    int bad = 0;
    for (size_t i = 0; i < got.size() && bad < 5; ++i) {
      if (std::memcmp(&got[i], &ref[i], 4) != 0) {
        ADD_FAILURE() << name << " element " << i << ": chorus " << got[i] << " llama.cpp "
                      << ref[i];
        ++bad;
      }
    }
  }
}

// Chorus's quantizer need not write llama.cpp's bits, but its error on the same rows must be
// close: at most 15 % above llama.cpp's RMSE per type (docs/kernels.md lists the figures).
TEST(GgufKQuantTest, OwnQuantizerErrorCloseToLlamaCpp) {
  auto f = GgufFile::Open(kFixture);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  const std::vector<float> x = (*f)->GetTensor("input")->ToF32();
  for (DType t : kKTypes) {
    const std::string name(DTypeName(t));
    const std::vector<float> theirs = (*f)->GetTensor(name + ".deq")->ToF32();
    const std::vector<float> ours = Tensor::FromF32(x, t, {4, 256}).ToF32();
    const double r_theirs = Rmse(x, theirs), r_ours = Rmse(x, ours);
    std::printf("%s rmse: chorus %.6g llama.cpp %.6g (ratio %.3f)\n", name.c_str(), r_ours,
                r_theirs, r_ours / r_theirs);
    EXPECT_LT(r_ours, 1.15 * r_theirs) << name;
  }
}

// A file with a different K type per tensor (as Q4_K_M mixes are) written by GgufWriter and
// read back: same bytes, same decoded values.
TEST(GgufKQuantTest, MixedTypesRoundTripThroughWriter) {
  auto f = GgufFile::Open(kFixture);
  ASSERT_TRUE(f.ok());
  const std::vector<float> x = (*f)->GetTensor("input")->ToF32();
  GgufWriter w;
  w.SetString("general.architecture", "test");
  std::vector<Tensor> written;
  for (DType t : kKTypes) {
    written.push_back(Tensor::FromF32(x, t, {4, 256}));
    w.AddTensor(std::string(DTypeName(t)), written.back());
  }
  const std::string path = testing::TempDir() + "/mixed.gguf";
  ASSERT_TRUE(w.Write(path).ok());
  auto g = GgufFile::Open(path);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  for (size_t i = 0; i < written.size(); ++i) {
    auto t = (*g)->GetTensor(std::string(DTypeName(kKTypes[i])));
    ASSERT_TRUE(t.ok());
    EXPECT_EQ(t->dtype(), kKTypes[i]);
    ASSERT_EQ(t->view().NumBytes(), written[i].view().NumBytes());
    EXPECT_EQ(0, std::memcmp(t->data(), written[i].data(),
                             static_cast<size_t>(written[i].view().NumBytes())));
  }
}

// Reads the fixture's bytes, patches them, and opens the result.
Result<std::shared_ptr<const GgufFile>> OpenPatched(const std::function<void(std::string*)>& patch,
                                                    const std::string& dir) {
  auto bytes = ReadFileToString(kFixture);
  CHORUS_CHECK(bytes.ok());
  std::string b = *bytes;
  patch(&b);
  const std::string path = dir + "/patched.gguf";
  FILE* fp = std::fopen(path.c_str(), "wb");
  CHORUS_CHECK(fp != nullptr);
  std::fwrite(b.data(), 1, b.size(), fp);
  std::fclose(fp);
  return GgufFile::Open(path);
}

// Offset of the type field of tensor `name`'s info: after its name, n_dims and ne[2].
size_t TypeFieldOffset(const std::string& b, const std::string& name) {
  std::string key(8, '\0');
  const uint64_t n = name.size();
  std::memcpy(key.data(), &n, 8);
  key += name;
  const size_t at = b.find(key);
  CHORUS_CHECK(at != std::string::npos);
  return at + key.size() + 4 + 16;
}

TEST(GgufKQuantTest, BadKQuantTensorsAreClearErrors) {
  const std::string dir = testing::TempDir();
  // Truncated data of the last K tensor: the file ends inside q6_k.deq, then inside q6_k.
  {
    auto bytes = ReadFileToString(kFixture);
    ASSERT_TRUE(bytes.ok());
    for (size_t cut : {size_t{4096}, size_t{4096 + 300}}) {
      auto r = OpenPatched([&](std::string* b) { b->resize(b->size() - cut); }, dir);
      ASSERT_FALSE(r.ok());
      EXPECT_NE(r.status().ToString().find("q6_k"), std::string::npos) << r.status().ToString();
    }
  }
  // An unknown quant type id (42) on a tensor: the file opens, the tensor is refused by name.
  {
    auto r = OpenPatched(
        [&](std::string* b) {
          const uint32_t id = 42;
          std::memcpy(b->data() + TypeFieldOffset(*b, "q4_k"), &id, 4);
        },
        dir);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    auto t = (*r)->GetTensor("q4_k");
    ASSERT_FALSE(t.ok());
    EXPECT_NE(t.status().ToString().find("q4_k"), std::string::npos) << t.status().ToString();
    EXPECT_NE(t.status().ToString().find("42"), std::string::npos) << t.status().ToString();
  }
  // A K type on rows that are not a multiple of 256 (ne0 = 128): refused at open, naming it.
  {
    auto r = OpenPatched(
        [&](std::string* b) {
          const uint64_t ne0 = 128;
          std::memcpy(b->data() + TypeFieldOffset(*b, "q5_k") - 16, &ne0, 8);
        },
        dir);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().ToString().find("q5_k"), std::string::npos) << r.status().ToString();
    EXPECT_NE(r.status().ToString().find("256"), std::string::npos) << r.status().ToString();
  }
  // An f32 tensor relabelled Q6_K claims fewer bytes than it has: reads as other values, but a
  // Q6_K tensor relabelled as Q2_K..Q5_K must still decode without reading past its data.
  {
    auto r = OpenPatched(
        [&](std::string* b) {
          const uint32_t id = 14;  // Q6_K (210 bytes per 256) on the f32 input tensor
          std::memcpy(b->data() + TypeFieldOffset(*b, "input"), &id, 4);
        },
        dir);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    auto t = (*r)->GetTensor("input");
    ASSERT_TRUE(t.ok());
    EXPECT_EQ(t->view().NumBytes(), 4 * 210);
    EXPECT_EQ(t->ToF32().size(), 1024u);
  }
}

}  // namespace
}  // namespace chorus::formats
