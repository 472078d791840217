#include "chorus/model/synthetic.h"

#include <cmath>
#include <thread>

#include "chorus/base/rng.h"

namespace chorus::model {
namespace {

struct Shape {
  const char* name;
  const char* arch;
  int64_t dim, layers, heads, kv_heads, ff, vocab, ctx;
  float theta;
  bool tied, bias;
  int64_t head_dim = 0;  // 0 = dim / heads
  int64_t window = 0;    // sliding window of the family's sliding layers
  bool tiny = false;     // a test shape: random norms, every family feature switched on
};

constexpr Shape kShapes[] = {
    {"tiny", "llama", 128, 4, 4, 2, 352, 512, 1024, 10000.f, false, false},
    {"stories260k", "llama", 64, 5, 8, 4, 172, 512, 512, 10000.f, true, false},
    {"tinyllama-1.1b", "llama", 2048, 22, 32, 4, 5632, 32000, 2048, 10000.f, false, false},
    {"llama2-7b", "llama", 4096, 32, 32, 32, 11008, 32000, 4096, 10000.f, false, false},
    {"llama3-8b", "llama", 4096, 32, 32, 8, 14336, 128256, 8192, 500000.f, false, false},
    {"mistral-7b", "llama", 4096, 32, 32, 8, 14336, 32000, 8192, 1000000.f, false, false},
    {"qwen2-0.5b", "qwen2", 896, 24, 14, 2, 4864, 151936, 4096, 1000000.f, true, true},
    // The families of docs/models.md at their published shapes (config.json of each release).
    {"qwen3-0.6b", "qwen3", 1024, 28, 16, 8, 3072, 151936, 40960, 1000000.f, true, false, 128},
    {"phi-3-mini", "phi3", 3072, 32, 32, 32, 8192, 32064, 4096, 10000.f, false, false, 0, 2047},
    {"gemma-2-2b", "gemma2", 2304, 26, 8, 4, 9216, 256000, 8192, 10000.f, true, false, 256, 4096},
    {"gemma-3-1b", "gemma3", 1152, 26, 4, 1, 6912, 262144, 32768, 1000000.f, true, false, 256, 512},
    // Tiny test shapes: small enough for reference forwards in tests, with windows shorter than
    // their tests' 64 positions and head_dim ≠ dim / heads where the family allows it.
    {"qwen3-tiny", "qwen3", 64, 2, 4, 2, 128, 512, 256, 10000.f, true, false, 32, 0, true},
    {"phi3-tiny", "phi3", 64, 2, 4, 2, 128, 512, 256, 10000.f, false, false, 0, 24, true},
    {"gemma2-tiny", "gemma2", 64, 3, 4, 2, 128, 512, 256, 10000.f, true, false, 32, 16, true},
    {"gemma3-tiny", "gemma3", 64, 7, 4, 2, 128, 512, 256, 1000000.f, true, false, 32, 8, true},
};

// The family's switches (config.h) at the values of its published configs; tiny shapes also
// get a partial rotary and LongRoPE factors (Phi-3) so tests reach every code path.
void ApplyFamily(const Shape& s, ModelConfig* c) {
  if (c->arch == "qwen3" || c->arch == "gemma3") c->qk_norm = true;
  if (c->arch == "phi3") {
    c->sliding_window = s.window;
    if (s.tiny) {
      c->rotary_dim = 12;  // partial rotary, as Phi-4-mini (Phi3ForCausalLM) has
      c->rope_scaling.type = RopeScaling::Type::kLongRope;
      c->rope_scaling.original_max_position = 32;
      for (int i = 0; i < 6; ++i) {
        c->rope_scaling.short_factors.push_back(1.0f + 0.25f * static_cast<float>(i));
        c->rope_scaling.long_factors.push_back(1.5f + 2.0f * static_cast<float>(i));
      }
      c->rope_scaling.attn_factor =
          static_cast<float>(std::sqrt(1.0 + std::log(256.0 / 32.0) / std::log(32.0)));
    }
  }
  if (c->arch == "gemma2" || c->arch == "gemma3") {
    c->norm_plus_one = c->sandwich_norms = c->embed_scale = true;
    c->activation = Activation::kGeluTanh;
    c->norm_eps = 1e-6f;
    c->sliding_window = s.window;
    // query_pre_attn_scalar: the published 256; gemma2-tiny's differs from its head_dim so tests
    // see which one is used, gemma3-tiny's equals it so GGUF (which cannot say it) round-trips.
    const int qpas = !s.tiny ? 256 : c->arch == "gemma2" ? 24 : static_cast<int>(c->head_dim);
    c->attn_scale = 1.0f / std::sqrt(static_cast<float>(qpas));
    c->layer_sliding.assign(static_cast<size_t>(c->n_layers), 0);
    for (int64_t l = 0; l < c->n_layers; ++l)
      c->layer_sliding[static_cast<size_t>(l)] =
          c->arch == "gemma2" ? l % 2 == 0 : (l + 1) % 6 != 0;
    if (c->arch == "gemma2") {
      c->attn_softcap = s.tiny ? 5.0f : 50.0f;  // tiny: low enough that the cap bites
      c->final_softcap = s.tiny ? 8.0f : 30.0f;
    } else {
      c->rope_local_theta = 10000.0f;
    }
  }
}

// Fills one tensor from its own seeded stream (seed mixed with the tensor index) so tensors
// can be generated in parallel and stay identical everywhere.
Tensor RandomTensor(DType dtype, std::vector<int64_t> shape, uint64_t seed, float stddev) {
  Tensor t = Tensor::Zeros(dtype, shape);
  const int64_t cols = t.view().cols(), rows = t.view().rows();
  std::vector<float> row(static_cast<size_t>(cols));
  Rng rng(seed);
  for (int64_t r = 0; r < rows; ++r) {
    // Uniform with matching variance: much faster than Box–Muller for billions of weights.
    for (auto& v : row) v = (rng.NextFloat() * 2.0f - 1.0f) * stddev * 1.7320508f;
    QuantizeRow(dtype, row.data(),
                static_cast<uint8_t*>(t.mutable_data()) + r * t.view().RowBytes(), cols);
  }
  return t;
}

}  // namespace

std::vector<std::string> SyntheticShapeNames() {
  std::vector<std::string> names;
  for (const Shape& s : kShapes) names.emplace_back(s.name);
  return names;
}

Result<ModelConfig> SyntheticConfig(const std::string& shape) {
  for (const Shape& s : kShapes) {
    if (shape != s.name) continue;
    ModelConfig c;
    c.arch = s.arch;
    c.n_embd = s.dim;
    c.n_layers = s.layers;
    c.n_heads = s.heads;
    c.n_kv_heads = s.kv_heads;
    c.head_dim = s.head_dim > 0 ? s.head_dim : s.dim / s.heads;
    c.n_ff = s.ff;
    c.vocab_size = s.vocab;
    c.max_seq_len = s.ctx;
    c.rope_theta = s.theta;
    c.tie_embeddings = s.tied;
    c.qkv_bias = s.bias;
    c.norm_eps = 1e-5f;
    c.rope_layout = kernels::RopeLayout::kHalf;
    ApplyFamily(s, &c);
    return c;
  }
  std::string list;
  for (const Shape& s : kShapes) list += std::string(list.empty() ? "" : ", ") + s.name;
  return InvalidArgumentError("unknown synthetic shape '" + shape.substr(0, 64) +
                              "' (known: " + list + ")");
}

Result<std::shared_ptr<const Model>> MakeSyntheticModel(const SyntheticSpec& spec) {
  CHORUS_ASSIGN_OR_RETURN(ModelFile file, MakeSyntheticModelFile(spec));
  return Model::Build(std::move(file.config), std::move(file.tensors), file.format, file.source);
}

Result<ModelFile> MakeSyntheticModelFile(const SyntheticSpec& spec) {
  CHORUS_ASSIGN_OR_RETURN(ModelConfig c, SyntheticConfig(spec.shape));
  if (spec.n_layers > 0) {
    c.n_layers = spec.n_layers;
    if (!c.layer_sliding.empty()) c.layer_sliding.resize(static_cast<size_t>(c.n_layers));
  }
  bool tiny = false;
  for (const Shape& sh : kShapes) tiny |= spec.shape == sh.name && sh.tiny;
  struct Job {
    std::string name;
    std::vector<int64_t> shape;
    DType dtype;
    float stddev;  // 0 = norm weights: ones (tiny shapes: 1 + noise; Gemma's w: 0 + noise)
  };
  std::vector<Job> jobs;
  const float s = 0.02f;
  // Residual-branch outputs are scaled down with depth (GPT-2 style) so activations stay sane.
  const float s_out = s / std::sqrt(2.0f * static_cast<float>(c.n_layers));
  jobs.push_back({"model.embed_tokens.weight", {c.vocab_size, c.n_embd}, spec.dtype, 1.0f});
  jobs.push_back({"model.norm.weight", {c.n_embd}, DType::kF32, 0.0f});
  if (!c.tie_embeddings)
    jobs.push_back({"lm_head.weight", {c.vocab_size, c.n_embd}, spec.dtype, s});
  const int64_t shapes[kNumLinears][2] = {
      {c.q_dim(), c.n_embd}, {c.kv_dim(), c.n_embd}, {c.kv_dim(), c.n_embd}, {c.n_embd, c.q_dim()},
      {c.n_ff, c.n_embd},    {c.n_ff, c.n_embd},     {c.n_embd, c.n_ff}};
  for (int64_t l = 0; l < c.n_layers; ++l) {
    jobs.push_back({HfNormName(c, l, Norm::kAttn), {c.n_embd}, DType::kF32, 0.0f});
    jobs.push_back({HfNormName(c, l, Norm::kFfn), {c.n_embd}, DType::kF32, 0.0f});
    if (c.sandwich_norms) {
      jobs.push_back({HfNormName(c, l, Norm::kPostAttn), {c.n_embd}, DType::kF32, 0.0f});
      jobs.push_back({HfNormName(c, l, Norm::kPostFfn), {c.n_embd}, DType::kF32, 0.0f});
    }
    if (c.qk_norm) {
      jobs.push_back({HfNormName(c, l, Norm::kQ), {c.head_dim}, DType::kF32, 0.0f});
      jobs.push_back({HfNormName(c, l, Norm::kK), {c.head_dim}, DType::kF32, 0.0f});
    }
    if (FusedProjections(c)) {  // Phi-3 checkpoints store q|k|v and gate|up fused
      jobs.push_back({HfFusedQkvName(l), {c.q_dim() + 2 * c.kv_dim(), c.n_embd}, spec.dtype, s});
      jobs.push_back({HfFusedGateUpName(l), {2 * c.n_ff, c.n_embd}, spec.dtype, s});
    }
    for (int li = 0; li < kNumLinears; ++li) {
      auto which = static_cast<Linear>(li);
      if (FusedProjections(c) && which != Linear::kO && which != Linear::kDown) continue;
      float sd = (which == Linear::kO || which == Linear::kDown) ? s_out : s;
      jobs.push_back({HfLayerTensorName(l, which), {shapes[li][0], shapes[li][1]}, spec.dtype, sd});
    }
    if (c.qkv_bias) {
      jobs.push_back({HfBiasName(l, Linear::kQ), {c.q_dim()}, DType::kF32, s});
      jobs.push_back({HfBiasName(l, Linear::kK), {c.kv_dim()}, DType::kF32, s});
      jobs.push_back({HfBiasName(l, Linear::kV), {c.kv_dim()}, DType::kF32, s});
    }
  }
  if (spec.mix) {  // a K-quant mix: each matrix's own dtype (model/quant_scheme.h)
    for (Job& job : jobs)
      if (job.shape.size() == 2) job.dtype = spec.mix->For(job.name, job.shape[1], c);
  }
  Model::NamedTensors named(jobs.size());
  // Generation of a 7B model is billions of draws: spread tensors over the cores.
  const unsigned n_threads = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> threads;
  for (unsigned ti = 0; ti < n_threads; ++ti) {
    threads.emplace_back([&, ti] {
      for (size_t j = ti; j < jobs.size(); j += n_threads) {
        const Job& job = jobs[j];
        Tensor t;
        if (job.stddev == 0.0f) {
          // Gemma's norms hold w of (1 + w): the neutral value is 0.
          const float base = c.norm_plus_one ? 0.0f : 1.0f;
          std::vector<float> ones(static_cast<size_t>(job.shape[0]), base);
          if (tiny) {  // distinct per channel, so tests see a norm applied the wrong way
            Rng rng(spec.seed * 1000003u + j);
            for (float& v : ones) v += (rng.NextFloat() * 2.0f - 1.0f) * 0.2f;
          }
          t = Tensor::FromF32(ones, job.dtype, job.shape);
        } else {
          t = RandomTensor(job.dtype, job.shape, spec.seed * 1000003u + j, job.stddev);
        }
        named[j] = {job.name, std::move(t)};
      }
    });
  }
  for (auto& t : threads) t.join();
  CHORUS_RETURN_IF_ERROR(SplitFusedProjections(c, &named, "synthetic:" + spec.shape));
  return ModelFile{std::move(c), std::move(named), ModelFormat::kSynthetic,
                   "synthetic:" + spec.shape + ":" +
                       (spec.mix ? spec.mix->name() : std::string(DTypeName(spec.dtype)))};
}

}  // namespace chorus::model
