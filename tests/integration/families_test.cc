// The Qwen3, Phi-3 and Gemma 2/3 families against an independent reference (docs/models.md):
// each tiny test shape is written as a Hugging Face directory (config.json + safetensors), read
// back by the loader, and run by the forward pass over 64 positions — prefilled at once and in
// chunks that cut through the sliding windows — then compared with
// tests/families/reference_forward.py, a numpy forward written from each family's published
// definition: max |chorus − ref| / max |ref| ≤ 1e-4 per position and the same greedy token at
// every position; the chunkings agree bit for bit. With a PEFT LoRA adapter on every projection
// (Phi-3's under its fused qkv_proj / gate_up_proj names), the unmerged LoRA path equals the
// reference's merged weights.
//
// The reference is Debian's python3-numpy (scripts/setup.sh installs it); without it the test
// skips, unless CHORUS_REQUIRE_MODELS=1 makes that a failure.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "chorus/adapters/lora/lora_adapter.h"
#include "chorus/adapters/lora/lora_files.h"
#include "chorus/adapters/lora/lora_hook.h"
#include "chorus/base/rng.h"
#include "chorus/base/thread_pool.h"
#include "chorus/engine/engine.h"
#include "chorus/formats/gguf.h"
#include "chorus/formats/safetensors.h"
#include "chorus/memory/kv_cache.h"
#include "chorus/model/convert.h"
#include "chorus/model/forward.h"
#include "chorus/model/loader.h"
#include "chorus/model/synthetic.h"
#include "chorus/tokenizer/tokenizer.h"
#include "tests/testutil/testutil.h"

namespace chorus {
namespace {

using ModelPtr = std::shared_ptr<const model::Model>;
constexpr int64_t kPositions = 64;

std::string ReferenceScript() {
  return std::string(CHORUS_SOURCE_DIR) + "/tests/families/reference_forward.py";
}

bool HaveNumpy() { return std::system("/usr/bin/python3 -c 'import numpy' 2>/dev/null") == 0; }

#define REQUIRE_NUMPY()                                                               \
  do {                                                                                \
    if (!HaveNumpy()) {                                                               \
      if (testing::ModelsRequired()) FAIL() << "python3-numpy is missing";            \
      GTEST_SKIP() << "python3-numpy not installed (the reference forward needs it)"; \
    }                                                                                 \
  } while (0)

std::vector<int32_t> Tokens(int64_t vocab) {
  std::vector<int32_t> t;
  uint32_t x = 12345u;
  for (int64_t i = 0; i < kPositions; ++i) {
    x = x * 1664525u + 1013904223u;
    t.push_back(static_cast<int32_t>((x >> 8) % static_cast<uint32_t>(vocab)));
  }
  return t;
}

// Runs the reference over `tokens`: logits [kPositions, vocab].
std::vector<float> Reference(const std::string& model_dir, const std::vector<int32_t>& tokens,
                             int64_t vocab, const std::string& adapter_dir = "") {
  const std::string dir = testing::TempDir();
  const std::string tok = dir + "/tokens.txt", out = dir + "/logits.f32";
  {
    std::ofstream f(tok);
    for (int32_t t : tokens) f << t << ' ';
  }
  const std::string cmd = "/usr/bin/python3 " + ReferenceScript() + " " + model_dir + " " + tok +
                          " " + out + (adapter_dir.empty() ? "" : " " + adapter_dir) + " 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::vector<float> logits(static_cast<size_t>(kPositions * vocab));
  std::ifstream f(out, std::ios::binary);
  f.read(reinterpret_cast<char*>(logits.data()), static_cast<std::streamsize>(logits.size() * 4));
  EXPECT_TRUE(f.good()) << "reference wrote no logits";
  return logits;
}

// Chorus's logits of every position, prefilling in chunks of `chunk` rows. With `layer_groups`
// the KV cache groups windowed layers apart (model::KvLayoutFor) and releases their blocks
// behind the window after each chunk, as the scheduler does; without, one group keeps every
// block.
std::vector<float> Run(const ModelPtr& m, const std::vector<int32_t>& tokens, int64_t chunk,
                       const adapters::LoraAdapter* adapter = nullptr, bool layer_groups = true) {
  const auto& c = m->config();
  memory::KvLayout layout = model::KvLayoutFor(c, 16);
  if (!layer_groups) layout.layer_windows.clear();
  const int64_t n_groups = layout.Groups().n_groups();
  memory::PagePool pages((kPositions / 16 + 2) * n_groups, layout.PageBytes());
  memory::KvCache kv(layout, &pages);
  std::vector<int32_t> table;
  EXPECT_TRUE(kv.Reserve(&table, kPositions).ok());
  const int32_t* tables[] = {table.data()};
  ThreadPool pool(2);
  model::Forward fwd(m, kPositions, kPositions);
  adapters::LoraHook hook(c, kPositions);
  std::vector<float> out(static_cast<size_t>(kPositions * c.vocab_size));
  for (int64_t p0 = 0; p0 < kPositions; p0 += chunk) {
    const int64_t n = std::min(chunk, kPositions - p0);
    std::vector<int32_t> toks(tokens.begin() + p0, tokens.begin() + p0 + n), pos, seq, rows;
    std::vector<const adapters::LoraAdapter*> row_adapters;
    for (int64_t i = 0; i < n; ++i) {
      pos.push_back(static_cast<int32_t>(p0 + i));
      seq.push_back(0);
      rows.push_back(static_cast<int32_t>(i));
      row_adapters.push_back(adapter);
    }
    model::StepInput in{toks, pos, seq, tables, rows, nullptr};
    if (adapter != nullptr) {
      EXPECT_TRUE(hook.SetRows(row_adapters).ok());
      in.hook = &hook;
    }
    fwd.Run(in, &kv, &pool, out.data() + p0 * c.vocab_size);
    kv.DropBehindWindows(&table, p0 + n);  // blocks nothing reads from here on
  }
  if (kv.groups().any_window()) {  // a windowed group kept about its window, the others all
    const int64_t held = pages.n_used(memory::PageKind::kKv), all = kv.BlocksFor(kPositions);
    EXPECT_LT(held, all * n_groups);
    std::printf("  chunk %lld: %lld of %lld KV pages held after %lld positions\n",
                static_cast<long long>(chunk), static_cast<long long>(held),
                static_cast<long long>(all * n_groups), static_cast<long long>(kPositions));
  }
  kv.Release(&table);
  return out;
}

// Per position: max |a − b| / max |b| over the vocabulary; returns the worst, and counts the
// positions whose greedy tokens differ.
double MaxRelError(const std::vector<float>& got, const std::vector<float>& want, int64_t vocab,
                   int* argmax_mismatches) {
  double worst = 0;
  *argmax_mismatches = 0;
  for (int64_t p = 0; p < kPositions; ++p) {
    const float* a = got.data() + p * vocab;
    const float* b = want.data() + p * vocab;
    double num = 0, den = 0;
    for (int64_t j = 0; j < vocab; ++j) {
      num = std::max(num, std::fabs(static_cast<double>(a[j]) - b[j]));
      den = std::max(den, std::fabs(static_cast<double>(b[j])));
    }
    worst = std::max(worst, num / den);
    *argmax_mismatches +=
        (std::max_element(a, a + vocab) - a) != (std::max_element(b, b + vocab) - b);
  }
  return worst;
}

// A PEFT adapter on every projection of `c` (Phi-3: the fused qkv_proj / gate_up_proj, with one
// lora_A per fused module as PEFT trains them), random A and B; written by hand as PEFT's
// save_pretrained lays it out.
void WritePeftAdapter(const model::ModelConfig& c, const std::string& dir, int64_t rank) {
  std::filesystem::create_directories(dir);
  Rng rng(99);
  auto rnd = [&](int64_t rows, int64_t cols, float sd) {
    std::vector<float> v(static_cast<size_t>(rows * cols));
    for (float& x : v) x = (rng.NextFloat() * 2.0f - 1.0f) * sd;
    return Tensor::FromF32(v, DType::kF32, {rows, cols});
  };
  std::vector<std::pair<std::string, std::array<int64_t, 2>>> modules;  // leaf, {out, in}
  std::vector<std::string> targets;
  auto add = [&](const std::string& leaf, int64_t out, int64_t in) {
    modules.push_back({leaf, std::array<int64_t, 2>{out, in}});
  };
  if (model::FusedProjections(c)) {
    add("self_attn.qkv_proj", c.q_dim() + 2 * c.kv_dim(), c.n_embd);
    add("mlp.gate_up_proj", 2 * c.n_ff, c.n_embd);
    targets = {"qkv_proj", "o_proj", "gate_up_proj", "down_proj"};
  } else {
    add("self_attn.q_proj", c.q_dim(), c.n_embd);
    add("self_attn.k_proj", c.kv_dim(), c.n_embd);
    add("self_attn.v_proj", c.kv_dim(), c.n_embd);
    add("mlp.gate_proj", c.n_ff, c.n_embd);
    add("mlp.up_proj", c.n_ff, c.n_embd);
    targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  }
  add("self_attn.o_proj", c.n_embd, c.q_dim());
  add("mlp.down_proj", c.n_embd, c.n_ff);
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    for (const auto& [leaf, shape] : modules) {
      const std::string p = "base_model.model.model.layers." + std::to_string(l) + "." + leaf;
      tensors.emplace_back(p + ".lora_A.weight", rnd(rank, shape[1], 0.1f));
      tensors.emplace_back(p + ".lora_B.weight", rnd(shape[0], rank, 0.1f));
    }
  }
  ASSERT_TRUE(formats::WriteSafetensors(dir + "/adapter_model.safetensors", tensors).ok());
  nlohmann::json cfg = {{"peft_type", "LORA"},    {"task_type", "CAUSAL_LM"},  {"r", rank},
                        {"lora_alpha", 2 * rank}, {"target_modules", targets}, {"bias", "none"},
                        {"lora_dropout", 0.0}};
  std::ofstream(dir + "/adapter_config.json") << cfg.dump(2);
}

void CheckFamily(const std::string& shape) {
  const std::string dir = testing::TempDir() + "/model";
  auto synth = model::MakeSyntheticModel({shape, DType::kF32, 7});
  ASSERT_TRUE(synth.ok()) << synth.status().ToString();
  model::ConvertOptions co;
  co.format = model::OutputFormat::kHfDirectory;
  co.output = dir;
  ASSERT_TRUE(model::ConvertModel(**synth, co).ok());
  auto loaded = model::LoadModel(dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  const ModelPtr m = *loaded;
  const int64_t vocab = m->config().vocab_size;
  ASSERT_EQ(m->config().arch, (*synth)->config().arch);
  const std::vector<int32_t> tokens = Tokens(vocab);
  const std::vector<float> want = Reference(dir, tokens, vocab);
  const std::vector<float> whole = Run(m, tokens, kPositions);
  // Windowed layers in their own block groups, released behind the window: the same bits as
  // one group keeping every block (memory/kv_cache.h, layer groups).
  EXPECT_EQ(whole, Run(m, tokens, kPositions, nullptr, /*layer_groups=*/false)) << shape;
  for (int64_t chunk : {kPositions, int64_t{13}, int64_t{1}}) {
    int mismatches = 0;
    const std::vector<float> got = Run(m, tokens, chunk);
    // Batch invariance (docs/architecture.md): a row's logits do not depend on how the prompt
    // was chunked — bit for bit, windowed and soft-capped layers included.
    EXPECT_EQ(got, whole) << shape << " chunk " << chunk;
    const double err = MaxRelError(got, want, vocab, &mismatches);
    std::printf("%s chunk %lld: max rel error %.2e, greedy mismatches %d\n", shape.c_str(),
                static_cast<long long>(chunk), err, mismatches);
    EXPECT_LE(err, 1e-4) << shape << " chunk " << chunk;
    EXPECT_EQ(mismatches, 0) << shape << " chunk " << chunk;
  }
  // LoRA on every projection equals the reference with merged weights.
  const std::string ad = testing::TempDir() + "/adapter";
  WritePeftAdapter(m->config(), ad, 4);
  if (model::FusedProjections(m->config())) {  // `chorus inspect` names the fused modules
    auto info = adapters::InspectLoraFile(ad);
    ASSERT_TRUE(info.ok()) << info.status().ToString();
    bool saw_qkv = false;
    for (const auto& mod : info->modules) {
      if (mod.name != "qkv_proj") continue;
      saw_qkv = true;
      EXPECT_EQ(mod.out, m->config().q_dim() + 2 * m->config().kv_dim());
    }
    EXPECT_TRUE(saw_qkv);
  }
  auto lora = adapters::LoadLoraAdapter(ad, m->config(), {});
  ASSERT_TRUE(lora.ok()) << lora.status().ToString();
  const std::vector<float> want_lora = Reference(dir, tokens, vocab, ad);
  const std::vector<float> got_lora = Run(m, tokens, 16, lora->get());
  if (model::FusedProjections(m->config())) {
    // The same adapter as llama.cpp's GGUF LoRA names it (attn_qkv, ffn_up = gate|up fused,
    // attn_output, ffn_down): the same weights, so bit-identical logits.
    const std::string gp = testing::TempDir() + "/adapter.gguf";
    formats::GgufWriter g;
    g.SetString("general.architecture", m->config().arch);
    g.SetString("general.type", "adapter");
    g.SetString("adapter.type", "lora");
    g.SetFloat32("adapter.lora.alpha", 8.0f);  // lora_alpha of WritePeftAdapter at rank 4
    auto st = formats::SafetensorsFile::Open(ad + "/adapter_model.safetensors");
    ASSERT_TRUE(st.ok());
    for (const auto& info : (*st)->tensors()) {
      std::string n = info.name.substr(std::string("base_model.model.model.layers.").size());
      const std::string layer = n.substr(0, n.find('.'));
      std::string leaf = n.substr(n.find('.') + 1);
      const bool is_a = leaf.find(".lora_A.") != std::string::npos;
      leaf = leaf.substr(0, leaf.find(".lora_"));
      const std::string gguf = leaf == "self_attn.qkv_proj" ? "attn_qkv"
                               : leaf == "self_attn.o_proj" ? "attn_output"
                               : leaf == "mlp.gate_up_proj" ? "ffn_up"
                                                            : "ffn_down";
      auto t = (*st)->GetTensor(info.name);
      ASSERT_TRUE(t.ok());
      g.AddTensor("blk." + layer + "." + gguf + ".weight" + (is_a ? ".lora_a" : ".lora_b"), *t);
    }
    ASSERT_TRUE(g.Write(gp).ok());
    auto gl = adapters::LoadLoraAdapter(gp, m->config(), {});
    ASSERT_TRUE(gl.ok()) << gl.status().ToString();
    EXPECT_EQ(Run(m, tokens, 16, gl->get()), got_lora) << "GGUF LoRA with fused names";
  }
  int mismatches = 0;
  const double effect = MaxRelError(want_lora, want, vocab, &mismatches);
  const double err = MaxRelError(got_lora, want_lora, vocab, &mismatches);
  std::printf("%s + LoRA: max rel error %.2e (adapter moves logits by %.2e), mismatches %d\n",
              shape.c_str(), err, effect, mismatches);
  EXPECT_GT(effect, 1e-2) << "the adapter must visibly change the output";
  // Merging the adapter into the weights (adapters::MergeLora, also used by `chorus merge`)
  // gives the same model: it sees Phi-3's split projections like every other family's.
  auto weights = adapters::ReadPeftLora(ad, m->config(), {});
  ASSERT_TRUE(weights.ok()) << weights.status().ToString();
  auto merged = adapters::MergeLora(*m, *weights);
  ASSERT_TRUE(merged.ok()) << merged.status().ToString();
  EXPECT_LE(MaxRelError(Run(*merged, tokens, 64), want_lora, vocab, &mismatches), 1e-4) << shape;
  EXPECT_EQ(mismatches, 0);
  EXPECT_LE(err, 1e-4) << shape << " + LoRA";
  EXPECT_EQ(mismatches, 0) << shape << " + LoRA";
}

// The tiny model written as GGUF by `chorus convert` and read back runs like the HF directory
// (llama.cpp's names and keys: fused attn_qkv / ffn_up for Phi-3, 1 + w norms for Gemma,
// rope_factors_long/short, soft-capping and sliding-window keys).
void CheckGgufRoundTrip(const std::string& shape) {
  auto synth = model::MakeSyntheticModel({shape, DType::kF32, 7});
  ASSERT_TRUE(synth.ok()) << synth.status().ToString();
  const std::string path = testing::TempDir() + "/model.gguf";
  model::ConvertOptions co;
  co.output = path;
  ASSERT_TRUE(model::ConvertModel(**synth, co).ok());
  auto loaded = model::LoadModel(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ((*loaded)->config().Summary(), (*synth)->config().Summary());
  const std::vector<int32_t> tokens = Tokens((*synth)->config().vocab_size);
  int mismatches = 0;
  const double err = MaxRelError(Run(*loaded, tokens, 16), Run(*synth, tokens, 16),
                                 (*synth)->config().vocab_size, &mismatches);
  EXPECT_LE(err, 1e-6) << shape << " via GGUF";
  EXPECT_EQ(mismatches, 0);
}

TEST(FamiliesTest, GgufRoundTrip) {
  for (const char* shape : {"qwen3-tiny", "phi3-tiny", "gemma3-tiny"}) {
    SCOPED_TRACE(shape);
    CheckGgufRoundTrip(shape);
  }
  // gemma2-tiny's query_pre_attn_scalar differs from its head_dim, which GGUF cannot express:
  // refused rather than written as a different model.
  auto synth = model::MakeSyntheticModel({"gemma2-tiny", DType::kF32, 7});
  ASSERT_TRUE(synth.ok());
  model::ConvertOptions co;
  co.output = testing::TempDir() + "/gemma2.gguf";
  Status s = model::ConvertModel(**synth, co);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.ToString().find("query_pre_attn_scalar"), std::string::npos) << s.ToString();
}

// Writes `shape` as an HF directory, then lets `edit` change its config.json / tensors.
std::string WriteHf(const std::string& shape,
                    const std::function<void(nlohmann::json*, model::Model::NamedTensors*)>& edit) {
  auto synth = model::MakeSyntheticModel({shape, DType::kF32, 7});
  EXPECT_TRUE(synth.ok());
  const std::string dir = testing::TempDir() + "/model";
  model::ConvertOptions co;
  co.format = model::OutputFormat::kHfDirectory;
  co.output = dir;
  EXPECT_TRUE(model::ConvertModel(**synth, co).ok());
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(dir + "/config.json"));
  // The tensors as the file holds them (Phi-3's fused), copied off the mapping before rewriting.
  model::Model::NamedTensors tensors;
  {
    auto st = formats::SafetensorsModel::Open(dir);
    EXPECT_TRUE(st.ok());
    for (const std::string& name : (*st)->TensorNames()) {
      auto t = (*st)->GetTensor(name);
      EXPECT_TRUE(t.ok());
      tensors.emplace_back(name, Tensor::FromF32(t->ToF32(), DType::kF32, t->shape()));
    }
  }
  edit(&cfg, &tensors);
  std::ofstream(dir + "/config.json") << cfg.dump(2);
  EXPECT_TRUE(formats::WriteSafetensors(dir + "/model.safetensors", tensors).ok());
  return dir;
}

std::string LoadError(const std::string& dir) {
  auto m = model::LoadModel(dir);
  EXPECT_FALSE(m.ok());
  return m.ok() ? "" : m.status().ToString();
}

// Released config.json files, as published (gemma-3-1b-it's text config; a Gemma 3 text config
// that, like gemma-3-4b-it's, names neither rope_theta nor head_dim nor the layer pattern;
// Qwen3-0.6B's; Phi-3-mini-4k-instruct's): the fields transformers would use, defaults
// included.
TEST(FamiliesTest, PublishedConfigsParse) {
  auto g31 = model::ConfigFromHfJson(R"({"architectures": ["Gemma3ForCausalLM"],
    "model_type": "gemma3_text", "num_hidden_layers": 26, "max_position_embeddings": 32768,
    "hidden_size": 1152, "intermediate_size": 6912, "num_attention_heads": 4,
    "num_key_value_heads": 1, "head_dim": 256, "rms_norm_eps": 1e-06, "rope_theta": 1000000,
    "rope_local_base_freq": 10000, "sliding_window": 512, "sliding_window_pattern": 6,
    "query_pre_attn_scalar": 256, "final_logit_softcapping": null,
    "attn_logit_softcapping": null, "rope_scaling": null, "vocab_size": 262144,
    "hidden_activation": "gelu_pytorch_tanh"})",
                                     "gemma-3-1b/config.json");
  ASSERT_TRUE(g31.ok()) << g31.status().ToString();
  EXPECT_EQ(g31->head_dim, 256);
  EXPECT_EQ(g31->sliding_window, 512);
  EXPECT_TRUE(g31->LayerSliding(4));
  EXPECT_FALSE(g31->LayerSliding(5));
  EXPECT_EQ(g31->attn_softcap, 0.0f);
  EXPECT_EQ(g31->rope_local_theta, 10000.0f);
  EXPECT_TRUE(g31->qk_norm && g31->norm_plus_one && g31->tie_embeddings);
  auto g34 = model::ConfigFromHfJson(R"({"model_type": "gemma3_text", "hidden_size": 2560,
    "intermediate_size": 10240, "num_hidden_layers": 34, "num_attention_heads": 8,
    "num_key_value_heads": 4, "vocab_size": 262208, "sliding_window": 1024,
    "rope_scaling": {"factor": 8.0, "rope_type": "linear"}})",
                                     "gemma-3-4b/config.json");
  ASSERT_TRUE(g34.ok()) << g34.status().ToString();
  EXPECT_EQ(g34->head_dim, 256);  // not 2560 / 8
  EXPECT_EQ(g34->rope_theta, 1000000.0f);
  EXPECT_FLOAT_EQ(g34->AttnScale(), 1.0f / 16.0f);
  EXPECT_FALSE(g34->LayerSliding(11));
  // Linear scaling reaches the global layers only.
  EXPECT_FLOAT_EQ(g34->RopeInvFreq()[0], 1.0f / 8.0f);
  EXPECT_FLOAT_EQ(g34->RopeInvFreqLocal()[0], 1.0f);
  auto q3 = model::ConfigFromHfJson(R"({"architectures": ["Qwen3ForCausalLM"],
    "attention_bias": false, "head_dim": 128, "hidden_act": "silu", "hidden_size": 1024,
    "intermediate_size": 3072, "max_position_embeddings": 40960, "max_window_layers": 28,
    "model_type": "qwen3", "num_attention_heads": 16, "num_hidden_layers": 28,
    "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_scaling": null,
    "rope_theta": 1000000, "sliding_window": null, "tie_word_embeddings": true,
    "use_sliding_window": false, "vocab_size": 151936})",
                                    "qwen3-0.6b/config.json");
  ASSERT_TRUE(q3.ok()) << q3.status().ToString();
  EXPECT_EQ(q3->q_dim(), 2048);  // ≠ hidden_size
  EXPECT_FALSE(q3->qkv_bias);
  EXPECT_EQ(q3->sliding_window, 0);
  auto p3 = model::ConfigFromHfJson(R"({"architectures": ["Phi3ForCausalLM"],
    "hidden_act": "silu", "hidden_size": 3072, "intermediate_size": 8192,
    "max_position_embeddings": 4096, "model_type": "phi3", "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 32, "original_max_position_embeddings": 4096,
    "rms_norm_eps": 1e-05, "rope_scaling": null, "rope_theta": 10000.0, "sliding_window": 2047,
    "tie_word_embeddings": false, "vocab_size": 32064})",
                                    "phi-3-mini-4k/config.json");
  ASSERT_TRUE(p3.ok()) << p3.status().ToString();
  EXPECT_EQ(p3->KvWindow(), 2047);
  EXPECT_EQ(p3->head_dim, 96);
  // Mistral 7B v0.1 slides every layer over 4096 keys; v0.3 says null.
  const std::string mistral = R"({"architectures": ["MistralForCausalLM"], "hidden_size": 4096,
    "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mistral",
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "vocab_size": 32000, "sliding_window": )";
  auto m01 = model::ConfigFromHfJson(mistral + "4096}", "mistral-7b-v0.1/config.json");
  ASSERT_TRUE(m01.ok()) << m01.status().ToString();
  EXPECT_EQ(m01->arch, "llama");
  EXPECT_EQ(m01->KvWindow(), 4096);
  EXPECT_EQ(m01->LayerWindow(31), 4096);
  auto m03 = model::ConfigFromHfJson(mistral + "null}", "mistral-7b-v0.3/config.json");
  ASSERT_TRUE(m03.ok()) << m03.status().ToString();
  EXPECT_EQ(m03->sliding_window, 0);
  // Qwen2's sliding_window counts only with use_sliding_window (false in released configs), and
  // then for the layers ≥ max_window_layers, or as layer_types lists them.
  const std::string qwen2 = R"({"architectures": ["Qwen2ForCausalLM"], "hidden_size": 896,
    "intermediate_size": 4864, "num_attention_heads": 14, "num_hidden_layers": 4,
    "num_key_value_heads": 2, "vocab_size": 151936, "sliding_window": 131072,
    "max_window_layers": 2, )";
  auto q25 = model::ConfigFromHfJson(qwen2 + R"("use_sliding_window": false})", "q/config.json");
  ASSERT_TRUE(q25.ok()) << q25.status().ToString();
  EXPECT_EQ(q25->sliding_window, 0);
  auto qsw = model::ConfigFromHfJson(qwen2 + R"("use_sliding_window": true})", "q/config.json");
  ASSERT_TRUE(qsw.ok()) << qsw.status().ToString();
  EXPECT_EQ(qsw->LayerWindow(1), 0);
  EXPECT_EQ(qsw->LayerWindow(2), 131072);
  EXPECT_EQ(qsw->KvWindow(), 0);  // not every layer slides
  auto qlt = model::ConfigFromHfJson(qwen2 + R"("use_sliding_window": true, "layer_types":
    ["sliding_attention", "full_attention", "full_attention", "full_attention"]})",
                                     "q/config.json");
  ASSERT_TRUE(qlt.ok()) << qlt.status().ToString();
  EXPECT_EQ(qlt->LayerWindow(0), 131072);
  EXPECT_EQ(qlt->LayerWindow(2), 0);
  auto qnull = model::ConfigFromHfJson(qwen2 + R"("use_sliding_window": null})", "q/config.json");
  ASSERT_TRUE(qnull.ok()) << qnull.status().ToString();
  EXPECT_EQ(qnull->sliding_window, 0);
  auto qbad = model::ConfigFromHfJson(qwen2 + R"("use_sliding_window": "yes"})", "q/config.json");
  ASSERT_FALSE(qbad.ok());
  EXPECT_NE(qbad.status().message().find("'use_sliding_window'"), std::string::npos)
      << qbad.status().ToString();
  auto qshort = model::ConfigFromHfJson(
      qwen2 + R"("use_sliding_window": true, "layer_types": ["full_attention"]})", "q/config.json");
  ASSERT_FALSE(qshort.ok());
  EXPECT_NE(qshort.status().message().find("'layer_types' has 1 entries, expected 4"),
            std::string::npos)
      << qshort.status().ToString();
}

TEST(FamiliesTest, BadInputIsAClearError) {
  // An architecture Chorus does not run: the error names the field and the value.
  std::string e = LoadError(WriteHf("qwen3-tiny", [](nlohmann::json* c, auto*) {
    (*c)["architectures"] = {"FalconForCausalLM"};
  }));
  EXPECT_NE(e.find("'architectures'"), std::string::npos) << e;
  EXPECT_NE(e.find("FalconForCausalLM"), std::string::npos) << e;
  // A Phi-3 checkpoint without its fused projection: named.
  e = LoadError(WriteHf("phi3-tiny", [](auto*, model::Model::NamedTensors* t) {
    std::erase_if(
        *t, [](const auto& p) { return p.first == "model.layers.1.self_attn.qkv_proj.weight"; });
  }));
  EXPECT_NE(e.find("model.layers.1.self_attn.qkv_proj.weight"), std::string::npos) << e;
  e = LoadError(WriteHf("phi3-tiny", [](auto*, model::Model::NamedTensors* t) {
    std::erase_if(
        *t, [](const auto& p) { return p.first == "model.layers.0.mlp.gate_up_proj.weight"; });
  }));
  EXPECT_NE(e.find("model.layers.0.mlp.gate_up_proj.weight"), std::string::npos) << e;
  // Head dims that disagree with the tensors: the first tensor that does not fit is named.
  e = LoadError(WriteHf("qwen3-tiny", [](nlohmann::json* c, auto*) { (*c)["head_dim"] = 16; }));
  EXPECT_NE(e.find("q_norm.weight' has shape [32], expected [16]"), std::string::npos) << e;
  e = LoadError(WriteHf("phi3-tiny", [](nlohmann::json* c, auto*) {
    c->erase("head_dim");
    (*c)["num_attention_heads"] = 3;
    (*c)["num_key_value_heads"] = 3;
  }));
  EXPECT_NE(e.find("'head_dim'"), std::string::npos) << e;
  // A fused tensor of the wrong height (e.g. written for another head count): named.
  e = LoadError(
      WriteHf("phi3-tiny", [](nlohmann::json* c, auto*) { (*c)["num_key_value_heads"] = 4; }));
  EXPECT_NE(e.find("qkv_proj.weight' has shape"), std::string::npos) << e;
  // LongRoPE factors of the wrong length.
  e = LoadError(WriteHf("phi3-tiny", [](nlohmann::json* c, auto*) {
    (*c)["rope_scaling"]["long_factor"] = {1.0, 2.0};
  }));
  EXPECT_NE(e.find("long_factor"), std::string::npos) << e;
}

// Greedy continuation of `prompt` by the forward pass alone, every KV block kept.
std::vector<int32_t> GreedyReference(const ModelPtr& m, const std::vector<int32_t>& prompt,
                                     int64_t n) {
  const auto& c = m->config();
  const int64_t total = static_cast<int64_t>(prompt.size()) + n;
  memory::KvLayout layout{
      .n_layers = c.n_layers, .n_kv_heads = c.n_kv_heads, .head_dim = c.head_dim, .block_size = 16};
  memory::PagePool pages(total / 16 + 2, layout.PageBytes());
  memory::KvCache kv(layout, &pages);
  std::vector<int32_t> table;
  EXPECT_TRUE(kv.Reserve(&table, total).ok());
  const int32_t* tables[] = {table.data()};
  ThreadPool pool(2);
  model::Forward fwd(m, total, 1);
  std::vector<float> logits(static_cast<size_t>(c.vocab_size));
  std::vector<int32_t> toks = prompt, out;
  int64_t pos0 = 0;
  while (static_cast<int64_t>(out.size()) < n) {
    std::vector<int32_t> pos, seq;
    for (size_t i = 0; i < toks.size(); ++i) {
      pos.push_back(static_cast<int32_t>(pos0 + static_cast<int64_t>(i)));
      seq.push_back(0);
    }
    const int32_t last[] = {static_cast<int32_t>(toks.size() - 1)};
    fwd.Run({toks, pos, seq, tables, last, nullptr}, &kv, &pool, logits.data());
    pos0 += static_cast<int64_t>(toks.size());
    const auto next =
        static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    out.push_back(next);
    toks = {next};
  }
  return out;
}

// Serving a model with sliding-window layers keeps only the windows' blocks of those layers in
// the paged KV cache (memory/kv_cache.h, layer groups): phi3-tiny (every layer slides, window
// 24), gemma2-tiny (two of three layers, window 16) and gemma3-tiny (six of seven, window 8),
// 16-token blocks. Generated tokens equal the forward pass's with every block kept (greedy):
// several requests batched together, an n = 2 request (its choices fork the prompt's blocks),
// then alone — from the prefix cache's copy of the prompt's blocks — while the pages in use
// stay within every block of the global groups plus 3 per windowed group (a window of ≤ 24
// keys plus the token being written spans at most 3 blocks).
void CheckWindowedServing(const std::string& shape, int64_t window) {
  CHORUS_REQUIRE_SHARED_MODEL("stories260K/tok512.bin");
  auto m = model::MakeSyntheticModel({shape, DType::kF32, 7});
  ASSERT_TRUE(m.ok());
  ASSERT_EQ((*m)->config().sliding_window, window);
  const memory::KvGroups groups = model::KvLayoutFor((*m)->config()).Groups();
  int64_t n_global = 0, n_windowed = 0;
  for (int64_t w : groups.window) (w > 0 ? n_windowed : n_global) += 1;
  ASSERT_GT(n_windowed, 0);
  auto tok = tokenizer::LoadTokenizer(testing::SharedModelsDir() + "/stories260K/tok512.bin");
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  engine::EngineOptions o;
  o.threads = 2;
  o.max_batch_tokens = 64;
  o.max_running = 4;
  o.pool_bytes = 8 << 20;
  auto e =
      engine::Engine::Create(*m, std::shared_ptr<const tokenizer::Tokenizer>(std::move(*tok)), o);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  std::vector<int32_t> a = {1}, b = {1};
  for (int32_t i = 0; i < 39; ++i) a.push_back(300 + i);  // 40 tokens: 2 full blocks cached
  for (int32_t i = 0; i < 22; ++i) b.push_back(400 + 3 * i);
  constexpr int64_t kGenerate = 150;
  const std::vector<int32_t> want_a = GreedyReference(*m, a, kGenerate);
  const std::vector<int32_t> want_b = GreedyReference(*m, b, kGenerate);
  auto submit = [&](const std::vector<int32_t>& prompt, int n) {
    engine::GenerationRequest r;
    r.prompt = prompt;
    r.max_tokens = kGenerate;
    r.n = n;
    r.sampling.temperature = 0;
    r.ignore_eos = true;
    auto h = (*e)->Submit(std::move(r));
    EXPECT_TRUE(h.ok()) << h.status().ToString();
    return std::move(*h);
  };
  // Tokens of each choice; the most pages in use seen while they ran.
  auto collect = [&](engine::RequestHandle* h, int64_t* max_pages) {
    std::vector<std::vector<int32_t>> got(static_cast<size_t>(h->n_choices()));
    for (int done = 0; done < h->n_choices();) {
      auto ev = h->Next(std::chrono::milliseconds(30000));
      if (!ev.has_value()) {
        ADD_FAILURE() << "no event";
        break;
      }
      if (ev->token >= 0) got[static_cast<size_t>(ev->index)].push_back(ev->token);
      *max_pages = std::max(*max_pages, (*e)->kv_blocks_used());
      done += ev->finish != engine::FinishReason::kNone;
    }
    return got;
  };
  {  // Batched: a, b and a with n = 2 in the same steps.
    auto h1 = submit(a, 1), h2 = submit(b, 1), h3 = submit(a, 2);
    int64_t unused = 0;
    EXPECT_EQ(collect(h1.get(), &unused)[0], want_a) << shape;
    EXPECT_EQ(collect(h2.get(), &unused)[0], want_b) << shape;
    for (const auto& got : collect(h3.get(), &unused)) EXPECT_EQ(got, want_a) << shape;
  }
  const int64_t all_blocks = (static_cast<int64_t>(a.size()) + kGenerate + 15) / 16;
  for (int run = 0; run < 2; ++run) {  // alone, from the prefix cache's blocks
    int64_t max_pages = 0;
    auto h = submit(run == 0 ? a : b, 1);
    EXPECT_EQ(collect(h.get(), &max_pages)[0], run == 0 ? want_a : want_b) << shape;
    std::printf("%s: at most %lld KV pages in use for %lld tokens (every block: %lld)\n",
                shape.c_str(), static_cast<long long>(max_pages),
                static_cast<long long>(a.size() + kGenerate),
                static_cast<long long>(all_blocks * groups.n_groups()));
    EXPECT_LE(max_pages, n_global * all_blocks + n_windowed * 3) << shape << " run " << run;
  }
}

TEST(FamiliesTest, SlidingWindowKeepsOnlyTheWindowsBlocks) {
  CheckWindowedServing("phi3-tiny", 24);
}
TEST(FamiliesTest, Gemma2WindowedLayersKeepOnlyTheirWindowsBlocks) {
  CheckWindowedServing("gemma2-tiny", 16);
}
TEST(FamiliesTest, Gemma3WindowedLayersKeepOnlyTheirWindowsBlocks) {
  CheckWindowedServing("gemma3-tiny", 8);
}

TEST(FamiliesTest, Qwen3MatchesReference) {
  REQUIRE_NUMPY();
  CheckFamily("qwen3-tiny");
}
TEST(FamiliesTest, Gemma2MatchesReference) {
  REQUIRE_NUMPY();
  CheckFamily("gemma2-tiny");
}
TEST(FamiliesTest, Gemma3MatchesReference) {
  REQUIRE_NUMPY();
  CheckFamily("gemma3-tiny");
}
TEST(FamiliesTest, Phi3MatchesReference) {
  REQUIRE_NUMPY();
  CheckFamily("phi3-tiny");
}

}  // namespace
}  // namespace chorus
