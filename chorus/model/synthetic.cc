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
};

constexpr Shape kShapes[] = {
    {"tiny", "llama", 128, 4, 4, 2, 352, 512, 1024, 10000.f, false, false},
    {"stories260k", "llama", 64, 5, 8, 4, 172, 512, 512, 10000.f, true, false},
    {"tinyllama-1.1b", "llama", 2048, 22, 32, 4, 5632, 32000, 2048, 10000.f, false, false},
    {"llama2-7b", "llama", 4096, 32, 32, 32, 11008, 32000, 4096, 10000.f, false, false},
    {"llama3-8b", "llama", 4096, 32, 32, 8, 14336, 128256, 8192, 500000.f, false, false},
    {"mistral-7b", "llama", 4096, 32, 32, 8, 14336, 32000, 8192, 1000000.f, false, false},
    {"qwen2-0.5b", "qwen2", 896, 24, 14, 2, 4864, 151936, 4096, 1000000.f, true, true},
};

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
    c.head_dim = s.dim / s.heads;
    c.n_ff = s.ff;
    c.vocab_size = s.vocab;
    c.max_seq_len = s.ctx;
    c.rope_theta = s.theta;
    c.tie_embeddings = s.tied;
    c.qkv_bias = s.bias;
    c.norm_eps = 1e-5f;
    c.rope_layout = kernels::RopeLayout::kHalf;
    return c;
  }
  std::string list;
  for (const Shape& s : kShapes) list += std::string(list.empty() ? "" : ", ") + s.name;
  return InvalidArgumentError("unknown synthetic shape '" + shape.substr(0, 64) +
                              "' (known: " + list + ")");
}

Result<std::shared_ptr<const Model>> MakeSyntheticModel(const SyntheticSpec& spec) {
  CHORUS_ASSIGN_OR_RETURN(ModelConfig c, SyntheticConfig(spec.shape));
  struct Job {
    std::string name;
    std::vector<int64_t> shape;
    DType dtype;
    float stddev;  // 0 = ones (norm weights)
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
    jobs.push_back({HfLayerNormName(l, false), {c.n_embd}, DType::kF32, 0.0f});
    jobs.push_back({HfLayerNormName(l, true), {c.n_embd}, DType::kF32, 0.0f});
    for (int li = 0; li < kNumLinears; ++li) {
      auto which = static_cast<Linear>(li);
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
          std::vector<float> ones(static_cast<size_t>(job.shape[0]), 1.0f);
          t = Tensor::FromF32(ones, job.dtype, job.shape);
        } else {
          t = RandomTensor(job.dtype, job.shape, spec.seed * 1000003u + j, job.stddev);
        }
        named[j] = {job.name, std::move(t)};
      }
    });
  }
  for (auto& t : threads) t.join();
  return Model::Build(std::move(c), std::move(named), ModelFormat::kSynthetic,
                      "synthetic:" + spec.shape + ":" +
                          (spec.mix ? spec.mix->name() : std::string(DTypeName(spec.dtype))));
}

}  // namespace chorus::model
