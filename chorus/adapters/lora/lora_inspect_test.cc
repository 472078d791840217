// InspectLoraFile (`chorus inspect` on adapters) and WriteSyntheticLoraSet (`chorus convert
// --lora-count`): what the headers say matches what was written; bad files are refused with a
// message naming the problem; synthetic sets load against the base, hard links included.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "chorus/adapters/lora/lora_files.h"
#include "chorus/model/synthetic.h"
#include "tests/testutil/testutil.h"

namespace chorus::adapters {
namespace {

namespace fs = std::filesystem;
using model::Linear;

model::ModelConfig Tiny() {
  auto c = model::SyntheticConfig("tiny");
  CHORUS_CHECK(c.ok());
  return *c;
}

TEST(LoraInspectTest, PeftMixedRanksAndAlphas) {
  const auto c = Tiny();
  LoraWeights w = LoraWeights::Empty(c.n_layers);
  // q rank 4 in every layer; v rank 8 in layer 0 and rank 2 in the others; alpha differs on v.
  for (int64_t l = 0; l < c.n_layers; ++l) {
    RandomLoraSpec s;
    s.targets = {Linear::kQ};
    s.rank = 4;
    s.alpha = 8;
    s.seed = 10 + static_cast<uint64_t>(l);
    auto q = MakeRandomLora(c, s);
    w.at(l, Linear::kQ) = q.at(l, Linear::kQ);
    s.targets = {Linear::kV};
    s.rank = l == 0 ? 8 : 2;
    s.alpha = 4;
    auto v = MakeRandomLora(c, s);
    w.at(l, Linear::kV) = v.at(l, Linear::kV);
  }
  w.base_model = "org/tiny-base";
  const std::string dir = testing::TempDir() + "/peft-mixed";
  PeftWriteOptions wo;
  wo.dtype = DType::kBF16;
  ASSERT_TRUE(WritePeftLora(dir, w, c, wo).ok());

  auto info = InspectLoraFile(dir);
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->format, "peft");
  EXPECT_EQ(info->base_model, "org/tiny-base");
  EXPECT_EQ(info->n_layers, c.n_layers);
  EXPECT_FALSE(info->use_rslora);
  ASSERT_EQ(info->modules.size(), 2u);
  const auto& q = info->modules[0];
  const auto& v = info->modules[1];
  EXPECT_EQ(q.name, "q_proj");
  EXPECT_EQ(v.name, "v_proj");
  EXPECT_EQ(q.layers, c.n_layers);
  EXPECT_EQ(q.ranks, (std::map<int64_t, int64_t>{{4, c.n_layers}}));
  EXPECT_EQ(v.ranks, (std::map<int64_t, int64_t>{{2, c.n_layers - 1}, {8, 1}}));
  EXPECT_EQ(q.alphas, (std::map<float, int64_t>{{8.0f, c.n_layers}}));
  EXPECT_EQ(v.alphas, (std::map<float, int64_t>{{4.0f, c.n_layers}}));
  EXPECT_EQ(q.in, c.n_embd);
  EXPECT_EQ(q.out, c.n_heads * c.head_dim);
  EXPECT_EQ(v.out, c.n_kv_heads * c.head_dim);
  EXPECT_EQ(q.dtype, "bf16");
  EXPECT_EQ(info->n_tensors, 4 * c.n_layers);
  // bf16: 2 bytes per value of every A and B.
  int64_t values = 0;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    for (Linear which : {Linear::kQ, Linear::kV})
      values += w.at(l, which).a.view().NumElements() + w.at(l, which).b.view().NumElements();
  }
  EXPECT_EQ(info->tensor_bytes, 2 * values);
  EXPECT_GT(info->file_bytes, info->tensor_bytes);
  // The same through one of the directory's files.
  auto via_file = InspectLoraFile(dir + "/adapter_config.json");
  ASSERT_TRUE(via_file.ok());
  EXPECT_EQ(via_file->n_tensors, info->n_tensors);
}

TEST(LoraInspectTest, Gguf) {
  const auto c = Tiny();
  RandomLoraSpec s;
  s.rank = 8;
  s.alpha = 16;
  s.targets = {Linear::kQ, Linear::kK, Linear::kDown};
  const std::string path = testing::TempDir() + "/lora.gguf";
  ASSERT_TRUE(WriteGgufLora(path, MakeRandomLora(c, s), c).ok());
  auto info = InspectLoraFile(path);
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->format, "gguf");
  EXPECT_EQ(info->architecture, c.arch);
  EXPECT_EQ(info->config_alpha, 16);
  ASSERT_EQ(info->modules.size(), 3u);
  EXPECT_EQ(info->modules[2].name, "down_proj");
  EXPECT_EQ(info->modules[2].in, c.n_ff);
  EXPECT_EQ(info->modules[0].ranks, (std::map<int64_t, int64_t>{{8, c.n_layers}}));
  EXPECT_EQ(info->modules[0].dtype, "f32");
}

TEST(LoraInspectTest, BadFilesAreRefusedWithTheReason) {
  const auto c = Tiny();
  const std::string tmp = testing::TempDir();
  RandomLoraSpec s;
  s.rank = 4;
  s.targets = {Linear::kQ};
  const std::string good = tmp + "/good";
  ASSERT_TRUE(WritePeftLora(good, MakeRandomLora(c, s), c).ok());

  // Truncated safetensors.
  const std::string trunc = tmp + "/trunc";
  fs::create_directories(trunc);
  fs::copy_file(good + "/adapter_config.json", trunc + "/adapter_config.json");
  {
    std::ifstream in(good + "/adapter_model.safetensors", std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), {});
    std::ofstream(trunc + "/adapter_model.safetensors", std::ios::binary)
        << bytes.substr(0, bytes.size() / 2);
  }
  auto t = InspectLoraFile(trunc);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("adapter_model.safetensors"), std::string::npos)
      << t.status().ToString();

  // Config rank disagrees with the tensors.
  const std::string wrong_r = tmp + "/wrong-r";
  fs::create_directories(wrong_r);
  fs::copy_file(good + "/adapter_model.safetensors", wrong_r + "/adapter_model.safetensors");
  std::ofstream(wrong_r + "/adapter_config.json")
      << R"({"peft_type":"LORA","r":16,"lora_alpha":8,"target_modules":["q_proj"]})";
  auto r = InspectLoraFile(wrong_r);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("has rank 4, adapter_config.json says 16"), std::string::npos)
      << r.status().ToString();

  // Unsupported config features, pickle, missing files, not an adapter.
  const std::string dora = tmp + "/dora";
  fs::create_directories(dora);
  fs::copy_file(good + "/adapter_model.safetensors", dora + "/adapter_model.safetensors");
  std::ofstream(dora + "/adapter_config.json") << R"({"peft_type":"LORA","r":4,"use_dora":true})";
  auto d = InspectLoraFile(dora);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("DoRA"), std::string::npos);

  const std::string pickle = tmp + "/pickle";
  fs::create_directories(pickle);
  std::ofstream(pickle + "/adapter_model.bin") << "not really a pickle";
  auto p = InspectLoraFile(pickle);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("pickle"), std::string::npos);

  EXPECT_EQ(InspectLoraFile(tmp + "/missing").status().code(), StatusCode::kNotFound);
  std::ofstream(tmp + "/junk.txt") << "hello";
  auto j = InspectLoraFile(tmp + "/junk.txt");
  ASSERT_FALSE(j.ok());
  EXPECT_NE(j.status().message().find("neither a PEFT adapter directory nor a GGUF file"),
            std::string::npos);
}

TEST(LoraInspectTest, SyntheticSetRoundRobinRanksAndHardLinks) {
  const auto c = Tiny();
  const std::string dir = testing::TempDir() + "/set";
  SyntheticLoraSetOptions o;
  o.count = 10;
  o.distinct = 4;
  o.ranks = {2, 4};
  o.targets = {Linear::kQ, Linear::kK, Linear::kV, Linear::kO};
  int64_t calls = 0;
  auto bytes = WriteSyntheticLoraSet(dir, c, o, [&](int64_t) { ++calls; });
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
  EXPECT_EQ(calls, 10);
  EXPECT_GT(*bytes, 0);
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.insert(e.path().filename().string());
  EXPECT_EQ(names.size(), 10u);
  EXPECT_TRUE(names.count("lora-0") && names.count("lora-9"));
  for (int i = 0; i < 10; ++i) {
    const std::string a = dir + "/lora-" + std::to_string(i);
    auto info = InspectLoraFile(a);
    ASSERT_TRUE(info.ok()) << info.status().ToString();
    ASSERT_EQ(info->modules.size(), 4u);
    const int64_t rank = o.ranks[static_cast<size_t>(i) % 2];
    EXPECT_EQ(info->modules[0].ranks, (std::map<int64_t, int64_t>{{rank, c.n_layers}})) << a;
    EXPECT_EQ(info->modules[0].dtype, "bf16");
    // Every adapter loads against the base (the registry's validation).
    auto loaded = LoadLoraAdapter(a, c);
    ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
    EXPECT_EQ((*loaded)->max_rank(), rank);
    struct stat st {};
    ASSERT_EQ(::stat((a + "/adapter_model.safetensors").c_str(), &st), 0);
    // Files 0..3 are distinct; 4..9 link 0..3 (each distinct file has 1 + its links).
    EXPECT_GE(st.st_nlink, 2u) << a;
  }
  struct stat s0 {
  }, s4{}, s1{};
  ASSERT_EQ(::stat((dir + "/lora-0/adapter_model.safetensors").c_str(), &s0), 0);
  ASSERT_EQ(::stat((dir + "/lora-4/adapter_model.safetensors").c_str(), &s4), 0);
  ASSERT_EQ(::stat((dir + "/lora-1/adapter_model.safetensors").c_str(), &s1), 0);
  EXPECT_EQ(s0.st_ino, s4.st_ino);
  EXPECT_NE(s0.st_ino, s1.st_ino);

  // Bad options.
  o.distinct = 3;  // not a multiple of the 2 ranks
  EXPECT_FALSE(WriteSyntheticLoraSet(dir + "-bad", c, o).ok());
  o.distinct = 0;
  o.ranks = {0};
  EXPECT_FALSE(WriteSyntheticLoraSet(dir + "-bad", c, o).ok());
}

}  // namespace
}  // namespace chorus::adapters
