// test-labels: unit
// A K-quant model (llama.cpp's Q4_K_M mix: Q4_K with Q6_K attn_v / ffn_down on some layers and a
// Q6_K output) through the forward pass: a row's logits do not depend on the other rows of its
// step, on how its prompt was chunked, or on the thread count — bit for bit — and they stay
// close to the f32 model's.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "chorus/model/forward.h"
#include "chorus/model/quant_scheme.h"
#include "chorus/model/step_builder.h"

namespace chorus::model {
namespace {

constexpr int64_t kPrompt = 96;
constexpr int kDecodeSteps = 3;

// 2 layers of width 256 (the smallest K-quant-able width), GQA 2.
ModelConfig SmallConfig() {
  ModelConfig c;
  c.n_embd = 256;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 64;
  c.n_ff = 512;
  c.vocab_size = 320;
  c.max_seq_len = 256;
  return c;
}

std::shared_ptr<const Model> MakeModel(const QuantScheme* mix) {
  const ModelConfig c = SmallConfig();
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.0f, 0.05f);
  Model::NamedTensors named;
  auto matrix = [&](const std::string& name, int64_t rows, int64_t cols) {
    std::vector<float> v(static_cast<size_t>(rows * cols));
    for (auto& x : v) x = dist(rng);
    const DType dt = mix ? mix->For(name, cols, c) : DType::kF32;
    named.emplace_back(name, Tensor::FromF32(v, dt, {rows, cols}));
  };
  auto ones = [&](const std::string& name, int64_t n) {
    named.emplace_back(
        name, Tensor::FromF32(std::vector<float>(static_cast<size_t>(n), 1.0f), DType::kF32, {n}));
  };
  matrix("model.embed_tokens.weight", c.vocab_size, c.n_embd);
  ones("model.norm.weight", c.n_embd);
  matrix("lm_head.weight", c.vocab_size, c.n_embd);
  const int64_t shapes[kNumLinears][2] = {
      {c.q_dim(), c.n_embd}, {c.kv_dim(), c.n_embd}, {c.kv_dim(), c.n_embd}, {c.n_embd, c.q_dim()},
      {c.n_ff, c.n_embd},    {c.n_ff, c.n_embd},     {c.n_embd, c.n_ff}};
  for (int64_t l = 0; l < c.n_layers; ++l) {
    ones(HfLayerNormName(l, false), c.n_embd);
    ones(HfLayerNormName(l, true), c.n_embd);
    for (int li = 0; li < kNumLinears; ++li)
      matrix(HfLayerTensorName(l, static_cast<Linear>(li)), shapes[li][0], shapes[li][1]);
  }
  auto m = Model::Build(c, std::move(named), ModelFormat::kSynthetic, "kquant-test");
  CHORUS_CHECK(m.ok()) << m.status().ToString();
  return *m;
}

std::vector<int32_t> Prompt(int s, int64_t n) {
  std::vector<int32_t> p;
  for (int64_t j = 0; j < n; ++j) p.push_back(static_cast<int32_t>(1 + (s * 131 + j * 17) % 300));
  return p;
}

// Prefills `target` (with `others` companion sequences) in chunks, then decodes greedily with all
// sequences in each step; returns target's last prompt logits and its decode logits.
std::vector<float> RunSequences(const std::shared_ptr<const Model>& m, int64_t chunk, int others,
                                int threads) {
  const ModelConfig& c = m->config();
  memory::KvLayout layout{
      .n_layers = c.n_layers, .n_kv_heads = c.n_kv_heads, .head_dim = c.head_dim, .block_size = 16};
  ThreadPool pool(threads);
  const int n_seqs = others + 1;
  Forward fwd(m, kPrompt, n_seqs);
  StepBuilder b(kPrompt, n_seqs);
  memory::PagePool pages(n_seqs * ((kPrompt + kDecodeSteps) / 16 + 2), layout.PageBytes());
  memory::KvCache kv(layout, &pages);
  std::vector<std::vector<int32_t>> tables(static_cast<size_t>(n_seqs));
  for (auto& t : tables) EXPECT_TRUE(kv.Reserve(&t, kPrompt + kDecodeSteps).ok());
  std::vector<float> logits(static_cast<size_t>(n_seqs * c.vocab_size)), out;
  for (int s = 1; s < n_seqs; ++s) {
    const std::vector<int32_t> p = Prompt(s, kPrompt - 5 * s);
    b.Clear();
    b.AddSequence(p, 0, tables[static_cast<size_t>(s)].data(), false);
    fwd.Run(b.Input(), &kv, &pool, logits.data());
  }
  const std::vector<int32_t> p = Prompt(0, kPrompt);
  for (int64_t pos = 0; pos < kPrompt; pos += chunk) {
    const int64_t n = std::min(chunk, kPrompt - pos);
    b.Clear();
    b.AddSequence(
        std::span<const int32_t>(p).subspan(static_cast<size_t>(pos), static_cast<size_t>(n)), pos,
        tables[0].data(), pos + n == kPrompt);
    fwd.Run(b.Input(), &kv, &pool, logits.data());
  }
  out.insert(out.end(), logits.begin(), logits.begin() + c.vocab_size);
  std::vector<int32_t> next(static_cast<size_t>(n_seqs), 7);
  for (int step = 0; step < kDecodeSteps; ++step) {
    next[0] = static_cast<int32_t>(std::max_element(logits.begin(), logits.begin() + c.vocab_size) -
                                   logits.begin());
    b.Clear();
    for (int s = 0; s < n_seqs; ++s) {
      const int64_t len = s == 0 ? kPrompt : kPrompt - 5 * s;
      b.AddSequence(std::span<const int32_t>(&next[static_cast<size_t>(s)], 1), len + step,
                    tables[static_cast<size_t>(s)].data(), true);
    }
    fwd.Run(b.Input(), &kv, &pool, logits.data());
    out.insert(out.end(), logits.begin(), logits.begin() + c.vocab_size);
  }
  return out;
}

TEST(KQuantModelTest, Q4KMRowIsTheSameWhateverTheBatchChunkingAndThreads) {
  const QuantScheme mix = *QuantScheme::Parse("q4_k_m");
  const std::shared_ptr<const Model> m = MakeModel(&mix);
  // The mix really is mixed: layer 1's v and down are Q6_K, layer 0's Q4_K.
  const LayerWeights& l0 = m->weights().layers[0];
  const LayerWeights& l1 = m->weights().layers[1];
  EXPECT_EQ(l0.W(Linear::kV).dtype(), DType::kQ4_K);
  EXPECT_EQ(l1.W(Linear::kV).dtype(), DType::kQ6_K);
  EXPECT_EQ(l1.W(Linear::kDown).dtype(), DType::kQ6_K);
  EXPECT_EQ(l1.W(Linear::kQ).dtype(), DType::kQ4_K);
  const std::vector<float> want = RunSequences(m, kPrompt, 0, 2);
  struct Case {
    int64_t chunk;
    int others, threads;
  };
  for (const Case& k : {Case{17, 0, 2}, Case{kPrompt, 5, 2}, Case{40, 5, 1}, Case{kPrompt, 0, 1}}) {
    const std::vector<float> got = RunSequences(m, k.chunk, k.others, k.threads);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0)
        << "chunk " << k.chunk << " others " << k.others << " threads " << k.threads;
  }
  // And the quantized model computes what the f32 one does within quantization error: on the
  // last prompt row, no further from it than a q4_0 model of the same weights.
  const std::vector<float> ref = RunSequences(MakeModel(nullptr), kPrompt, 0, 2);
  const QuantScheme q4_0(DType::kQ4_0);
  const std::vector<float> base = RunSequences(MakeModel(&q4_0), kPrompt, 0, 2);
  auto rel_err = [&](const std::vector<float>& got) {
    double se = 0, sr = 0;
    for (int64_t i = 0; i < SmallConfig().vocab_size; ++i) {
      se += (double(got[i]) - ref[i]) * (double(got[i]) - ref[i]);
      sr += double(ref[i]) * ref[i];
    }
    return std::sqrt(se / sr);
  };
  std::printf("logits vs f32: q4_k_m %.4f, q4_0 %.4f (relative RMS)\n", rel_err(want),
              rel_err(base));
  EXPECT_LT(rel_err(want), rel_err(base));
}

}  // namespace
}  // namespace chorus::model
