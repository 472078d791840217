// test-labels: unit
// LoRA adapter files: PEFT and GGUF round trips (mixed ranks, patterns, dtypes, q/k pair order),
// the compute layout LoraAdapter builds, LoraHook segments, and bad input — each refused with a
// message that says what does not fit.
#include "chorus/adapters/lora/lora_files.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "chorus/adapters/lora/lora_adapter.h"
#include "chorus/adapters/lora/lora_hook.h"
#include "chorus/formats/gguf.h"
#include "chorus/formats/safetensors.h"
#include "chorus/model/convert.h"
#include "chorus/model/synthetic.h"
#include "tests/testutil/testutil.h"

namespace chorus::adapters {
namespace {

using model::Linear;
namespace fs = std::filesystem;

model::ModelConfig TinyConfig() {
  auto c = model::SyntheticConfig("tiny");
  CHORUS_CHECK(c.ok());
  return *c;
}

// Mixed ranks: q/v rank 8, k rank 16, o rank 1 on every layer; MLP only on layer 1 (rank 4,
// alpha 2).
LoraWeights MixedLora(const model::ModelConfig& c) {
  RandomLoraSpec s;
  s.rank = 8;
  s.alpha = 16;
  s.targets = {Linear::kQ, Linear::kV};
  LoraWeights w = MakeRandomLora(c, s);
  s.rank = 16;
  s.seed = 2;
  s.targets = {Linear::kK};
  LoraWeights k = MakeRandomLora(c, s);
  s.rank = 1;
  s.seed = 3;
  s.targets = {Linear::kO};
  LoraWeights o = MakeRandomLora(c, s);
  s.rank = 4;
  s.alpha = 2;
  s.seed = 4;
  s.targets = {Linear::kGate, Linear::kUp, Linear::kDown};
  LoraWeights mlp = MakeRandomLora(c, s);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    w.at(l, Linear::kK) = k.at(l, Linear::kK);
    w.at(l, Linear::kO) = o.at(l, Linear::kO);
    if (l == 1)
      for (Linear m : {Linear::kGate, Linear::kUp, Linear::kDown}) w.at(l, m) = mlp.at(l, m);
  }
  return w;
}

void ExpectSameAdapters(const LoraAdapter& a, const LoraAdapter& b, const model::ModelConfig& c,
                        float tol) {
  ASSERT_EQ(a.n_layers(), b.n_layers());
  for (int64_t l = 0; l < c.n_layers; ++l) {
    for (int li = 0; li < model::kNumLinears; ++li) {
      const Linear which = static_cast<Linear>(li);
      const auto& ma = a.module(l, which);
      const auto& mb = b.module(l, which);
      ASSERT_EQ(ma.rank, mb.rank) << LoraModuleName(l, which);
      if (ma.rank == 0) continue;
      EXPECT_NEAR(ma.scale, mb.scale, 1e-6f * std::fabs(ma.scale)) << LoraModuleName(l, which);
      const int64_t na = ma.rank * LinearIn(c, which), nb = ma.rank * LinearOut(c, which);
      for (int64_t i = 0; i < na; ++i)
        ASSERT_NEAR(ma.a[i], mb.a[i], tol) << LoraModuleName(l, which) << " A " << i;
      for (int64_t i = 0; i < nb; ++i)
        ASSERT_NEAR(ma.bt[i], mb.bt[i], tol) << LoraModuleName(l, which) << " Bt " << i;
    }
  }
}

TEST(LoraFilesTest, ModuleNamesAndShapes) {
  const auto c = TinyConfig();
  EXPECT_EQ(LoraModuleName(3, Linear::kQ), "layers.3.self_attn.q_proj");
  EXPECT_EQ(LoraModuleName(0, Linear::kDown), "layers.0.mlp.down_proj");
  EXPECT_EQ(LinearIn(c, Linear::kDown), c.n_ff);
  EXPECT_EQ(LinearOut(c, Linear::kK), c.kv_dim());
  EXPECT_EQ(LinearIn(c, Linear::kO), c.q_dim());
}

TEST(LoraFilesTest, BuildComputeLayout) {
  const auto c = TinyConfig();
  LoraWeights w = MixedLora(c);
  auto ad = LoraAdapter::Build(w, c, "mixed");
  ASSERT_TRUE(ad.ok()) << ad.status().ToString();
  const LoraAdapter& a = **ad;
  EXPECT_EQ(a.max_rank(), 16);
  EXPECT_EQ(a.max_fused_rank(), 32);  // q 8 + k 16 + v 8
  // Fused q|k|v A: rows of q, then k, then v; module pointers alias it.
  const auto& f = a.fused(0, LoraAdapter::Group::kQkv);
  EXPECT_EQ(f.rank, 32);
  EXPECT_EQ(a.module(0, Linear::kK).fused_col, 8);
  EXPECT_EQ(a.module(0, Linear::kV).fused_col, 24);
  EXPECT_EQ(a.module(0, Linear::kK).a, f.a + 8 * c.n_embd);
  EXPECT_EQ(a.fused(0, LoraAdapter::Group::kGateUp).rank, 0);
  EXPECT_EQ(a.fused(1, LoraAdapter::Group::kGateUp).rank, 8);
  // Bᵀ is the transpose of lora_B; s = alpha / r.
  const auto b = w.at(2, Linear::kK).b.ToF32();  // [kv_dim, 16]
  const auto& mk = a.module(2, Linear::kK);
  EXPECT_EQ(mk.bt[5 * c.kv_dim() + 7], b[static_cast<size_t>(7 * 16 + 5)]);
  EXPECT_FLOAT_EQ(mk.scale, 1.0f);
  EXPECT_FLOAT_EQ(a.module(0, Linear::kO).scale, 16.0f);
  EXPECT_FLOAT_EQ(a.module(1, Linear::kUp).scale, 0.5f);
  EXPECT_EQ(a.module(0, Linear::kUp).rank, 0);
  // rsLoRA: alpha / sqrt(r).
  w.use_rslora = true;
  auto rs = LoraAdapter::Build(w, c, "rs");
  ASSERT_TRUE(rs.ok());
  EXPECT_FLOAT_EQ((*rs)->module(0, Linear::kK).scale, 4.0f);
}

TEST(LoraFilesTest, PeftRoundTripMixedRanksAndDtypes) {
  const auto c = TinyConfig();
  LoraWeights w = MixedLora(c);
  auto ref = LoraAdapter::Build(w, c, "ref");
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    const std::string dir = testing::TempDir() + "/peft";
    CHORUS_ASSERT_OK(WritePeftLora(dir, w, c, {.dtype = dt, .base_model_name = "tiny"}));
    ASSERT_TRUE(fs::exists(dir + "/adapter_config.json"));
    auto back = ReadPeftLora(dir, c);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(back->base_model, "tiny");
    EXPECT_EQ(back->at(1, Linear::kUp).rank(), 4);
    EXPECT_FLOAT_EQ(back->at(1, Linear::kUp).alpha, 2.0f);
    auto ad = LoraAdapter::Build(*back, c, "back");
    ASSERT_TRUE(ad.ok()) << ad.status().ToString();
    ExpectSameAdapters(**ad, **ref, c, dt == DType::kF32 ? 0.0f : 0.01f);
    // The auto-detecting loader and the file paths inside the directory work too.
    EXPECT_TRUE(LoadLoraAdapter(dir, c).ok());
    EXPECT_TRUE(ReadLora(dir + "/adapter_model.safetensors", c).ok());
  }
}

TEST(LoraFilesTest, GgufRoundTripPermutesQkRows) {
  const auto c = TinyConfig();  // llama arch, HF (rotate-half) layout
  RandomLoraSpec s;
  s.rank = 8;
  LoraWeights w = MakeRandomLora(c, s);
  auto ref = LoraAdapter::Build(w, c, "ref");
  ASSERT_TRUE(ref.ok());
  const std::string path = testing::TempDir() + "/a.gguf";
  CHORUS_ASSERT_OK(WriteGgufLora(path, w, c));
  // The file holds lora_b of q in GGUF (interleaved) order, as llama.cpp's converter writes it.
  auto g = formats::GgufFile::Open(path);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(*(*g)->GetString("general.type"), "adapter");
  EXPECT_FLOAT_EQ(static_cast<float>(*(*g)->GetFloat("adapter.lora.alpha")), 16.0f);
  auto qb = (*g)->GetTensor("blk.0.attn_q.weight.lora_b");
  ASSERT_TRUE(qb.ok());
  EXPECT_EQ(qb->shape(), (std::vector<int64_t>{c.q_dim(), 8}));
  const auto stored = qb->ToF32();
  const auto want =
      model::PermuteRopeRows(w.at(0, Linear::kQ).b, c.n_heads, c.head_dim,
                             kernels::RopeLayout::kHalf, kernels::RopeLayout::kInterleaved)
          .ToF32();
  EXPECT_EQ(stored, want);
  EXPECT_NE(stored, w.at(0, Linear::kQ).b.ToF32());
  auto back = ReadLora(path, c);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->qk_layout, kernels::RopeLayout::kInterleaved);
  auto ad = LoraAdapter::Build(*back, c, "gguf");
  ASSERT_TRUE(ad.ok());
  ExpectSameAdapters(**ad, **ref, c, 0.0f);  // permutations are exact
}

TEST(LoraFilesTest, GgufRefusesMixedAlphaItCannotRepresent) {
  const auto c = TinyConfig();
  LoraWeights w = MixedLora(c);  // o has alpha 16 / r 1, mlp alpha 2 / r 4
  EXPECT_EQ(WriteGgufLora(testing::TempDir() + "/m.gguf", w, c).code(), StatusCode::kUnimplemented);
}

TEST(LoraFilesTest, HookSegmentsFromRows) {
  const auto c = TinyConfig();
  RandomLoraSpec s;
  auto a = LoraAdapter::Build(MakeRandomLora(c, s), c, "a");
  s.seed = 5;
  auto b = LoraAdapter::Build(MakeRandomLora(c, s), c, "b");
  ASSERT_TRUE(a.ok() && b.ok());
  LoraHook hook(c, 8);
  const LoraAdapter* A = a->get();
  const LoraAdapter* B = b->get();
  std::vector<const LoraAdapter*> rows = {A, A, nullptr, B, B, B, A};
  CHORUS_ASSERT_OK(hook.SetRows(rows));
  ASSERT_EQ(hook.segments().size(), 3u);
  EXPECT_EQ(hook.segments()[0].row_begin, 0);
  EXPECT_EQ(hook.segments()[0].row_end, 2);
  EXPECT_EQ(hook.segments()[1].row_begin, 3);
  EXPECT_EQ(hook.segments()[2].row_begin, 6);
  EXPECT_EQ(hook.segments()[2].slot, hook.segments()[0].slot);  // same adapter, same slot
  EXPECT_EQ(hook.slots().size(), 2u);
  std::vector<const LoraAdapter*> too_many(9, A);
  EXPECT_FALSE(hook.SetRows(too_many).ok());
}

// ---- bad input ----

// Writes a PEFT dir from `w` and then lets `edit` change the config JSON text.
std::string WriteDir(const LoraWeights& w, const model::ModelConfig& c,
                     const std::string& config_override = "") {
  const std::string dir = testing::TempDir() + "/bad";
  CHORUS_CHECK(WritePeftLora(dir, w, c).ok());
  if (!config_override.empty()) {
    std::ofstream(dir + "/adapter_config.json", std::ios::trunc) << config_override;
  }
  return dir;
}

std::string ErrorOf(const std::string& path, const model::ModelConfig& c, LoraLoadOptions o = {}) {
  auto r = LoadLoraAdapter(path, c, o);
  if (r.ok()) return "OK";
  return r.status().ToString();
}

LoraWeights SmallLora(const model::ModelConfig& c, int64_t rank = 4) {
  RandomLoraSpec s;
  s.rank = rank;
  s.targets = {Linear::kQ, Linear::kV};
  return MakeRandomLora(c, s);
}

TEST(LoraFilesBadInputTest, PickleRefused) {
  const auto c = TinyConfig();
  const std::string dir = testing::TempDir() + "/pickle";
  fs::create_directories(dir);
  std::ofstream(dir + "/adapter_config.json") << R"({"peft_type":"LORA","r":8,"lora_alpha":16})";
  std::ofstream(dir + "/adapter_model.bin") << "\x80\x02pickle";
  const std::string e = ErrorOf(dir, c);
  EXPECT_NE(e.find("pickle"), std::string::npos) << e;
  EXPECT_NE(e.find("UNIMPLEMENTED"), std::string::npos) << e;
  EXPECT_NE(ErrorOf(dir + "/adapter_model.bin", c).find("pickle"), std::string::npos);
}

TEST(LoraFilesBadInputTest, MissingFiles) {
  const auto c = TinyConfig();
  EXPECT_NE(ErrorOf(testing::TempDir() + "/nope", c).find("NOT_FOUND"), std::string::npos);
  const std::string dir = testing::TempDir() + "/empty";
  fs::create_directories(dir);
  EXPECT_NE(ErrorOf(dir, c).find("adapter_model.safetensors"), std::string::npos);
}

TEST(LoraFilesBadInputTest, UnsupportedConfigs) {
  const auto c = TinyConfig();
  const LoraWeights w = SmallLora(c);
  struct Case {
    const char* json;
    const char* expect;
  };
  const Case cases[] = {
      {R"({"peft_type":"LORA","r":4,"lora_alpha":8,"use_dora":true})", "DoRA"},
      {R"({"peft_type":"LORA","r":4,"lora_alpha":8,"modules_to_save":["lm_head"]})",
       "modules_to_save"},
      {R"({"peft_type":"LORA","r":4,"lora_alpha":8,"target_modules":["q_proj","embed_tokens"]})",
       "embed_tokens"},
      {R"({"peft_type":"LORA","r":4,"lora_alpha":8,"target_modules":["q_proj","wqkv"]})",
       "unknown target module 'wqkv'"},
      {R"({"peft_type":"IA3"})", "peft_type"},
      {R"({"peft_type":"LORA","r":4,"bias":"all"})", "bias"},
      {R"({"peft_type":"LORA","r":8,"lora_alpha":8})", "has rank 4, adapter_config.json says 8"},
      {R"({"peft_type":"LORA","r":4,"rank_pattern":{"q_proj":16}})", "says 16"},
      {R"({"peft_type":"LORA","r":4,"rank_pattern":{"^q.*":4}})", "regular expression"},
      {R"({"peft_type":"LORA","r":"four"})", "r must be"},
      {R"({not json)", "JSON"},
  };
  for (const Case& cs : cases) {
    const std::string e = ErrorOf(WriteDir(w, c, cs.json), c);
    EXPECT_NE(e.find(cs.expect), std::string::npos) << cs.json << " -> " << e;
  }
  // A rank_pattern that matches the file is accepted, and alpha_pattern changes the scale.
  auto ok = LoadLoraAdapter(
      WriteDir(
          w, c,
          R"({"r":8,"lora_alpha":8,"rank_pattern":{"q_proj":4,"v_proj":4},"alpha_pattern":{"model.layers.2.self_attn.v_proj":2}})"),
      c);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_FLOAT_EQ((*ok)->module(2, Linear::kV).scale, 0.5f);
  EXPECT_FLOAT_EQ((*ok)->module(1, Linear::kV).scale, 2.0f);
}

// Writes a safetensors adapter with the given tensors next to a valid config.
std::string DirWithTensors(const std::vector<std::pair<std::string, Tensor>>& tensors, int r = 4) {
  const std::string dir = testing::TempDir() + "/t";
  fs::create_directories(dir);
  std::ofstream(dir + "/adapter_config.json")
      << R"({"peft_type":"LORA","lora_alpha":8,"r":)" << r << "}";
  CHORUS_CHECK(formats::WriteSafetensors(dir + "/adapter_model.safetensors", tensors).ok());
  return dir;
}

Tensor Filled(std::vector<int64_t> shape, float v = 0.01f, DType dt = DType::kF32) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return Tensor::FromF32(std::vector<float>(static_cast<size_t>(n), v), dt, shape);
}

TEST(LoraFilesBadInputTest, WrongShapesNamesRanksValues) {
  const auto c = TinyConfig();  // n_embd 128, q_dim 128, kv_dim 64
  const std::string p = "base_model.model.model.layers.";
  struct Case {
    std::vector<std::pair<std::string, Tensor>> tensors;
    const char* expect;
  };
  std::vector<Case> cases;
  cases.push_back({{{p + "3.self_attn.q_proj.lora_A.weight", Filled({4, 96})},
                    {p + "3.self_attn.q_proj.lora_B.weight", Filled({128, 4})}},
                   "lora_A of layers.3.self_attn.q_proj has 96 columns, base q_proj has 128 inputs "
                   "(hint: adapter for another base model?)"});
  cases.push_back({{{p + "0.self_attn.k_proj.lora_A.weight", Filled({4, 128})},
                    {p + "0.self_attn.k_proj.lora_B.weight", Filled({128, 4})}},
                   "lora_B of layers.0.self_attn.k_proj has 128 rows, base k_proj has 64 outputs"});
  cases.push_back({{{p + "0.self_attn.q_proj.lora_A.weight", Filled({4, 128})},
                    {p + "0.self_attn.q_proj.lora_B.weight", Filled({4, 128})}},
                   "lora_B of layers.0.self_attn.q_proj has 4 rows"});
  cases.push_back(
      {{{p + "0.self_attn.q_proj.lora_A.weight", Filled({4, 128})}}, "lora_A but no lora_B"});
  cases.push_back({{{p + "9.self_attn.q_proj.lora_A.weight", Filled({4, 128})},
                    {p + "9.self_attn.q_proj.lora_B.weight", Filled({128, 4})}},
                   "layer 9, the base model has 4 layers"});
  cases.push_back({{{p + "0.self_attn.rotary.lora_A.weight", Filled({4, 128})}},
                   "unknown module 'self_attn.rotary'"});
  cases.push_back({{{p + "0.self_attn.q_proj.lora_magnitude_vector", Filled({128})}}, "DoRA"});
  cases.push_back({{{"base_model.model.lm_head.lora_A.weight", Filled({4, 128})}}, "lm_head"});
  cases.push_back(
      {{{"base_model.model.model.embed_tokens.lora_embedding_A", Filled({4, 512})}}, "embedding"});
  cases.push_back({{{p + "0.self_attn.q_proj.lora_B.bias", Filled({128})}}, "no LoRA biases"});
  cases.push_back({{{p + "0.self_attn.q_proj.weight", Filled({128, 128})}}, "unexpected tensor"});
  cases.push_back({{{p + "99999999999999.self_attn.q_proj.lora_A.weight", Filled({4, 128})}},
                   "malformed layer index"});
  {
    std::vector<float> nan(4 * 128, 0.01f);
    nan[77] = std::numeric_limits<float>::quiet_NaN();
    cases.push_back(
        {{{p + "1.self_attn.v_proj.lora_A.weight", Tensor::FromF32(nan, DType::kF32, {4, 128})},
          {p + "1.self_attn.v_proj.lora_B.weight", Filled({64, 4})}},
         "lora_A of layers.1.self_attn.v_proj holds a non-finite value"});
    std::vector<float> inf(64 * 4, 0.01f);
    inf[3] = std::numeric_limits<float>::infinity();
    cases.push_back(
        {{{p + "1.self_attn.v_proj.lora_A.weight", Filled({4, 128})},
          {p + "1.self_attn.v_proj.lora_B.weight", Tensor::FromF32(inf, DType::kBF16, {64, 4})}},
         "lora_B of layers.1.self_attn.v_proj holds a non-finite value"});
  }
  cases.push_back({{{p + "0.self_attn.q_proj.lora_A.weight", Tensor::Zeros(DType::kI32, {4, 128})},
                    {p + "0.self_attn.q_proj.lora_B.weight", Filled({128, 4})}},
                   "dtype I32"});
  for (const Case& cs : cases) {
    const std::string e = ErrorOf(DirWithTensors(cs.tensors), c);
    EXPECT_NE(e.find(cs.expect), std::string::npos) << cs.tensors[0].first << " -> " << e;
  }
  // Rank above the limit.
  const std::string big =
      DirWithTensors({{p + "0.self_attn.q_proj.lora_A.weight", Filled({300, 128})},
                      {p + "0.self_attn.q_proj.lora_B.weight", Filled({128, 300})}},
                     300);
  EXPECT_NE(ErrorOf(big, c).find("rank 300, outside the supported 1..256"), std::string::npos)
      << ErrorOf(big, c);
  EXPECT_EQ(ErrorOf(big, c, {.limits = {.max_rank = 512}}), "OK");
  // The adapter name inside the tensor name (older PEFT saves) is accepted.
  EXPECT_EQ(
      ErrorOf(DirWithTensors({{p + "0.self_attn.q_proj.lora_A.default.weight", Filled({4, 128})},
                              {p + "0.self_attn.q_proj.lora_B.default.weight", Filled({128, 4})}}),
              c),
      "OK");
}

TEST(LoraFilesBadInputTest, TruncatedFiles) {
  const auto c = TinyConfig();
  const LoraWeights w = SmallLora(c);
  const std::string dir = WriteDir(w, c);
  const std::string st = dir + "/adapter_model.safetensors";
  const auto size = fs::file_size(st);
  for (uintmax_t keep : {size - 1, size / 2, uintmax_t{20}, uintmax_t{7}, uintmax_t{0}}) {
    fs::resize_file(st, keep);
    EXPECT_NE(ErrorOf(dir, c), "OK") << keep;
  }
  const std::string gguf = testing::TempDir() + "/t.gguf";
  CHORUS_ASSERT_OK(WriteGgufLora(gguf, w, c));
  const auto gsize = fs::file_size(gguf);
  for (uintmax_t keep : {gsize - 1, gsize / 2, uintmax_t{30}, uintmax_t{5}}) {
    fs::resize_file(gguf, keep);
    const std::string e = ErrorOf(gguf, c);
    EXPECT_NE(e, "OK") << keep;
  }
}

TEST(LoraFilesBadInputTest, GgufMetadataAndNames) {
  const auto c = TinyConfig();
  auto write = [&](const std::string& type, const std::string& adapter_type,
                   const std::string& arch,
                   const std::vector<std::pair<std::string, Tensor>>& tensors) {
    formats::GgufWriter g;
    g.SetString("general.architecture", arch);
    if (!type.empty()) g.SetString("general.type", type);
    g.SetString("adapter.type", adapter_type);
    g.SetFloat32("adapter.lora.alpha", 8.0f);
    for (const auto& [n, t] : tensors) g.AddTensor(n, t);
    const std::string path = testing::TempDir() + "/g.gguf";
    CHORUS_CHECK(g.Write(path).ok());
    return path;
  };
  const std::vector<std::pair<std::string, Tensor>> good = {
      {"blk.0.attn_q.weight.lora_a", Filled({4, 128})},
      {"blk.0.attn_q.weight.lora_b", Filled({128, 4})}};
  EXPECT_EQ(ErrorOf(write("adapter", "lora", "llama", good), c), "OK");
  EXPECT_NE(ErrorOf(write("model", "lora", "llama", good), c).find("expected 'adapter'"),
            std::string::npos);
  EXPECT_NE(ErrorOf(write("", "lora", "llama", good), c).find("general.type is missing"),
            std::string::npos);
  EXPECT_NE(ErrorOf(write("adapter", "control_vector", "llama", good), c).find("only 'lora'"),
            std::string::npos);
  EXPECT_NE(ErrorOf(write("adapter", "lora", "qwen2", good), c).find("does not match"),
            std::string::npos);
  EXPECT_NE(
      ErrorOf(write("adapter", "lora", "llama", {{"token_embd.weight.lora_a", Filled({4, 512})}}),
              c)
          .find("embeddings"),
      std::string::npos);
  EXPECT_NE(ErrorOf(write("adapter", "lora", "llama",
                          {{"blk.0.attn_qkv.weight.lora_a", Filled({4, 128})}}),
                    c)
                .find("unknown module 'attn_qkv.weight'"),
            std::string::npos);
  EXPECT_NE(
      ErrorOf(write("adapter", "lora", "llama", {{"blk.0.attn_q.weight.lora_x", Filled({4, 128})}}),
              c)
          .find("unexpected suffix"),
      std::string::npos);
  EXPECT_NE(ErrorOf(write("adapter", "lora", "llama",
                          {{"blk.0.attn_q.weight.lora_a", Filled({4, 128})},
                           {"blk.0.attn_q.weight.lora_b", Filled({4, 128})}}),
                    c)
                .find("lora_B of layers.0.self_attn.q_proj has 4 rows"),
            std::string::npos);
  // Scale = alpha / r per module (llama.cpp).
  auto ad = LoadLoraAdapter(write("adapter", "lora", "llama", good), c);
  ASSERT_TRUE(ad.ok());
  EXPECT_FLOAT_EQ((*ad)->module(0, Linear::kQ).scale, 2.0f);
}

}  // namespace
}  // namespace chorus::adapters
