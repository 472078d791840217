#include "chorus/model/loader.h"

#include <sys/stat.h>

#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "chorus/base/mapped_file.h"
#include "chorus/formats/gguf.h"
#include "chorus/formats/llama2c.h"
#include "chorus/formats/safetensors.h"
#include "chorus/model/names.h"

namespace chorus::model {
namespace {

bool IsDirectory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

Result<ModelFile> ReadLlama2c(const std::string& path) {
  CHORUS_ASSIGN_OR_RETURN(formats::Llama2cCheckpoint ck, formats::ReadLlama2c(path));
  const auto& h = ck.config;
  ModelConfig c;
  c.arch = "llama";
  c.n_embd = h.dim;
  c.n_layers = h.n_layers;
  c.n_heads = h.n_heads;
  c.n_kv_heads = h.n_kv_heads;
  c.head_dim = h.n_heads > 0 ? h.dim / h.n_heads : 0;
  c.n_ff = h.hidden_dim;
  c.vocab_size = h.vocab_size;
  c.max_seq_len = h.seq_len;
  c.norm_eps = 1e-5f;  // llama2.c run.c
  c.rope_theta = 10000.0f;
  c.tie_embeddings = h.shared_classifier;
  c.rope_layout = kernels::RopeLayout::kInterleaved;
  Model::NamedTensors named;
  auto get = [&](const char* n) -> Result<Tensor> {
    auto it = ck.tensors.find(n);
    if (it == ck.tensors.end())
      return DataLossError(path + ": llama2.c tensor '" + n + "' missing");
    return it->second;
  };
  CHORUS_ASSIGN_OR_RETURN(Tensor emb, get("token_embedding_table"));
  named.emplace_back("model.embed_tokens.weight", emb);
  CHORUS_ASSIGN_OR_RETURN(Tensor fin, get("rms_final_weight"));
  named.emplace_back("model.norm.weight", fin);
  if (!h.shared_classifier) {
    CHORUS_ASSIGN_OR_RETURN(Tensor wcls, get("wcls"));
    named.emplace_back("lm_head.weight", wcls);
  }
  struct Map {
    const char* src;
    std::string (*dst)(int64_t);
  };
  static const Map kMaps[] = {
      {"rms_att_weight", [](int64_t l) { return HfLayerNormName(l, false); }},
      {"rms_ffn_weight", [](int64_t l) { return HfLayerNormName(l, true); }},
      {"wq", [](int64_t l) { return HfLayerTensorName(l, Linear::kQ); }},
      {"wk", [](int64_t l) { return HfLayerTensorName(l, Linear::kK); }},
      {"wv", [](int64_t l) { return HfLayerTensorName(l, Linear::kV); }},
      {"wo", [](int64_t l) { return HfLayerTensorName(l, Linear::kO); }},
      {"w1", [](int64_t l) { return HfLayerTensorName(l, Linear::kGate); }},
      {"w2", [](int64_t l) { return HfLayerTensorName(l, Linear::kDown); }},
      {"w3", [](int64_t l) { return HfLayerTensorName(l, Linear::kUp); }},
  };
  for (const Map& m : kMaps) {
    CHORUS_ASSIGN_OR_RETURN(Tensor stacked, get(m.src));
    if (stacked.view().n_dims() < 2 || stacked.shape()[0] != h.n_layers) {
      return DataLossError(path + ": llama2.c tensor '" + m.src + "' is not stacked by layer");
    }
    for (int64_t l = 0; l < h.n_layers; ++l) named.emplace_back(m.dst(l), stacked.Slice(l));
  }
  return ModelFile{std::move(c), std::move(named), ModelFormat::kLlama2c, path};
}

// The pooling a sentence-transformers export declares (dir/1_Pooling/config.json:
// pooling_mode_lasttoken, pooling_mode_mean_tokens or pooling_mode_cls_token true); "" when the
// directory has none. A file that is there but unreadable or not such an object is an error.
Result<std::string> SentenceTransformersPooling(const std::string& dir) {
  const std::string path = dir + "/1_Pooling/config.json";
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::string();
  CHORUS_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path, 1u << 20));
  const auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return InvalidArgumentError(path + ": not a JSON object");
  auto on = [&](const char* key) {
    auto it = j.find(key);
    return it != j.end() && it->is_boolean() && it->get<bool>();
  };
  if (on("pooling_mode_lasttoken")) return std::string("last");
  if (on("pooling_mode_mean_tokens")) return std::string("mean");
  if (on("pooling_mode_cls_token")) return std::string("cls");
  return std::string();  // max / weighted-mean poolings: not offered, the server's default
}

Result<ModelFile> ReadHfDirectory(const std::string& dir) {
  const std::string cfg_path = dir + "/config.json";
  auto text = ReadFileToString(cfg_path, 16u << 20);
  if (!text.ok()) return text.status().WithContext("Hugging Face model directory " + dir);
  CHORUS_ASSIGN_OR_RETURN(ModelConfig c, ConfigFromHfJson(*text, cfg_path));
  CHORUS_ASSIGN_OR_RETURN(c.pooling, SentenceTransformersPooling(dir));
  CHORUS_ASSIGN_OR_RETURN(auto st, formats::SafetensorsModel::Open(dir));
  Model::NamedTensors named;
  for (const std::string& name : st->TensorNames()) {
    // Rotary caches some exporters save are not weights.
    if (name.find("rotary_emb.inv_freq") != std::string::npos) continue;
    CHORUS_ASSIGN_OR_RETURN(Tensor t, st->GetTensor(name));
    named.emplace_back(name, std::move(t));
  }
  // Some checkpoints with tied embeddings still carry lm_head; keep it only when untied.
  if (c.tie_embeddings) {
    std::erase_if(named, [](const auto& p) { return p.first == "lm_head.weight"; });
  } else {
    bool has_head = false;
    for (const auto& p : named) has_head |= p.first == "lm_head.weight";
    if (!has_head) c.tie_embeddings = true;  // HF ties when lm_head is absent
  }
  CHORUS_RETURN_IF_ERROR(SplitFusedProjections(c, &named, dir));
  return ModelFile{std::move(c), std::move(named), ModelFormat::kHfDirectory, dir};
}

Result<ModelFile> ReadGguf(const std::string& path) {
  CHORUS_ASSIGN_OR_RETURN(auto g, formats::GgufFile::Open(path));
  auto err = [&](const std::string& m) { return InvalidArgumentError(path + ": " + m); };
  CHORUS_ASSIGN_OR_RETURN(std::string arch, g->GetString("general.architecture"));
  ModelConfig c;
  if (arch == "llama") {
    c.arch = "llama";
    // llama.cpp's converter permutes q/k rows of llama models into interleaved pair order.
    c.rope_layout = kernels::RopeLayout::kInterleaved;
  } else if (arch == "qwen2") {
    c.arch = "qwen2";
    c.qkv_bias = true;
    c.rope_layout = kernels::RopeLayout::kHalf;  // NEOX-style rope, rows not permuted
  } else if (arch == "qwen3" || arch == "phi3" || arch == "gemma2" || arch == "gemma3") {
    // All NEOX-style rope in llama.cpp: rotate-half order, rows not permuted.
    c.arch = arch;
    c.rope_layout = kernels::RopeLayout::kHalf;
  } else {
    return UnimplementedError(
        path + ": GGUF general.architecture '" + arch.substr(0, 64) +
        "' is not supported (supported: llama, qwen2, qwen3, phi3, gemma2, gemma3)");
  }
  const bool gemma = arch == "gemma2" || arch == "gemma3";
  c.qk_norm = arch == "qwen3" || arch == "gemma3";
  if (gemma) {
    c.norm_plus_one = c.sandwich_norms = c.embed_scale = true;
    c.activation = Activation::kGeluTanh;
  }
  auto get_int = [&](const std::string& key, int64_t* out, bool required) -> Status {
    auto v = g->GetInt(arch + "." + key);
    if (!v.ok()) return required ? v.status().WithContext(path) : OkStatus();
    *out = *v;
    return OkStatus();
  };
  // llama.cpp's enum llama_pooling_type: 1 mean, 2 cls, 3 last (0 none, 4 rank: no vector).
  if (auto pt = g->GetInt(arch + ".pooling_type"); pt.ok()) {
    c.pooling = *pt == 1 ? "mean" : *pt == 2 ? "cls" : *pt == 3 ? "last" : "";
  }
  CHORUS_RETURN_IF_ERROR(get_int("embedding_length", &c.n_embd, true));
  CHORUS_RETURN_IF_ERROR(get_int("block_count", &c.n_layers, true));
  CHORUS_RETURN_IF_ERROR(get_int("feed_forward_length", &c.n_ff, true));
  CHORUS_RETURN_IF_ERROR(get_int("attention.head_count", &c.n_heads, true));
  c.n_kv_heads = c.n_heads;
  CHORUS_RETURN_IF_ERROR(get_int("attention.head_count_kv", &c.n_kv_heads, false));
  CHORUS_RETURN_IF_ERROR(get_int("context_length", &c.max_seq_len, false));
  c.head_dim = c.n_heads > 0 ? c.n_embd / c.n_heads : 0;
  CHORUS_RETURN_IF_ERROR(get_int("attention.key_length", &c.head_dim, false));
  if (auto eps = g->GetFloat(arch + ".attention.layer_norm_rms_epsilon"); eps.ok())
    c.norm_eps = static_cast<float>(*eps);
  if (auto th = g->GetFloat(arch + ".rope.freq_base"); th.ok())
    c.rope_theta = static_cast<float>(*th);
  if (auto st = g->GetString(arch + ".rope.scaling.type");
      st.ok() && *st != "none" && *st != "longrope" && *st != "su") {  // LongRoPE: below
    if (*st != "linear")
      return UnimplementedError(path + ": rope scaling '" + st->substr(0, 32) +
                                "' is not supported");
    c.rope_scaling.type = RopeScaling::Type::kLinear;
    if (auto f = g->GetFloat(arch + ".rope.scaling.factor"); f.ok())
      c.rope_scaling.factor = static_cast<float>(*f);
  }
  if (auto rd = g->GetInt(arch + ".rope.dimension_count"); rd.ok() && *rd != c.head_dim)
    c.rotary_dim = *rd;  // partial rotary (checked by Validate)
  if (auto sw = g->GetInt(arch + ".attention.sliding_window");
      sw.ok() && arch != "llama" && arch != "qwen2" && arch != "qwen3")
    c.sliding_window = *sw;
  if (gemma) {
    if (auto v = g->GetFloat(arch + ".attn_logit_softcapping"); v.ok())
      c.attn_softcap = static_cast<float>(*v);
    if (auto v = g->GetFloat(arch + ".final_logit_softcapping"); v.ok())
      c.final_softcap = static_cast<float>(*v);
    // llama.cpp's fixed layer patterns (Gemma 2: even layers slide; Gemma 3: five of six) and
    // Gemma 3's local RoPE base. GGUF has no query_pre_attn_scalar: like llama.cpp, scale by
    // head_dim except the 27B shapes (46 / 62 layers), which use n_embd / n_heads.
    c.layer_sliding.assign(static_cast<size_t>(std::max<int64_t>(c.n_layers, 0)), 0);
    for (int64_t l = 0; l < c.n_layers; ++l)
      c.layer_sliding[static_cast<size_t>(l)] = arch == "gemma2" ? l % 2 == 0 : (l + 1) % 6 != 0;
    if (arch == "gemma3") c.rope_local_theta = 10000.0f;
    if ((arch == "gemma2" && c.n_layers == 46) || (arch == "gemma3" && c.n_layers == 62))
      c.attn_scale =
          1.0f / std::sqrt(static_cast<float>(c.n_embd / std::max<int64_t>(1, c.n_heads)));
  }
  Model::NamedTensors named;
  bool has_output = false;
  Tensor rope_long, rope_short;
  for (const auto& info : g->tensors()) {
    if (info.name == "rope_freqs.weight") {
      CHORUS_ASSIGN_OR_RETURN(Tensor rf, g->GetTensor(info.name));
      if (rf.dtype() != DType::kF32) return err("rope_freqs.weight must be f32");
      c.rope_freq_factors = rf.ToF32();
      continue;
    }
    if (info.name == "rope_factors_long.weight" || info.name == "rope_factors_short.weight") {
      CHORUS_ASSIGN_OR_RETURN(Tensor rf, g->GetTensor(info.name));
      if (rf.dtype() != DType::kF32) return err(info.name + " must be f32");
      (info.name == "rope_factors_long.weight" ? rope_long : rope_short) = rf;
      continue;
    }
    auto hf = GgufToHfName(info.name, arch);
    if (!hf)
      return err("unexpected tensor '" + info.name.substr(0, 96) + "' for architecture " + arch);
    CHORUS_ASSIGN_OR_RETURN(Tensor t, g->GetTensor(info.name));
    has_output |= *hf == "lm_head.weight";
    if (gemma && hf->size() > 11 && hf->compare(hf->size() - 11, 11, "norm.weight") == 0) {
      // llama.cpp's converter stores Gemma's norms as 1 + w; the canonical tensors hold w.
      if (DTypeIsQuantized(t.dtype()))
        return err("tensor '" + info.name + "' must not be quantized");
      std::vector<float> v = t.ToF32();
      for (float& x : v) x -= 1.0f;
      t = Tensor::FromF32(v, DType::kF32, t.shape());
    }
    named.emplace_back(*hf, std::move(t));
  }
  if (!rope_long.empty() || !rope_short.empty()) {
    if (rope_long.empty() || rope_short.empty())
      return err("LongRoPE needs both rope_factors_long.weight and rope_factors_short.weight");
    c.rope_scaling.type = RopeScaling::Type::kLongRope;
    c.rope_scaling.long_factors = rope_long.ToF32();
    c.rope_scaling.short_factors = rope_short.ToF32();
    c.rope_scaling.original_max_position = c.max_seq_len;
    if (auto o = g->GetInt(arch + ".rope.scaling.original_context_length"); o.ok())
      c.rope_scaling.original_max_position = *o;
    const double scale =
        static_cast<double>(c.max_seq_len) /
        static_cast<double>(std::max<int64_t>(1, c.rope_scaling.original_max_position));
    c.rope_scaling.attn_factor =
        scale <= 1.0
            ? 1.0f
            : static_cast<float>(std::sqrt(
                  1.0 + std::log(scale) /
                            std::log(static_cast<double>(c.rope_scaling.original_max_position))));
    if (auto af = g->GetFloat(arch + ".rope.scaling.attn_factor"); af.ok())
      c.rope_scaling.attn_factor = static_cast<float>(*af);
  }
  c.tie_embeddings = !has_output;
  for (const auto& [name, t] : named) {
    if (name == "model.embed_tokens.weight" && t.view().n_dims() == 2) c.vocab_size = t.shape()[0];
  }
  if (auto vs = g->GetInt(arch + ".vocab_size"); vs.ok() && c.vocab_size != *vs) {
    return err("vocab_size " + std::to_string(*vs) + " disagrees with token_embd rows " +
               std::to_string(c.vocab_size));
  }
  CHORUS_RETURN_IF_ERROR(SplitFusedProjections(c, &named, path));
  return ModelFile{std::move(c), std::move(named), ModelFormat::kGguf, path};
}

}  // namespace

Result<ModelFile> ReadModelFile(const std::string& path) {
  if (IsDirectory(path)) return ReadHfDirectory(path);
  CHORUS_ASSIGN_OR_RETURN(auto mf, MappedFile::Open(path));
  if (mf->size() >= 4 && std::memcmp(mf->data(), "GGUF", 4) == 0) return ReadGguf(path);
  if (mf->size() >= 8 && (std::memcmp(mf->data() + 1, "HDF", 3) == 0 || mf->data()[0] == '{')) {
    return InvalidArgumentError(path +
                                ": not a model file Chorus reads (expected a GGUF file, a llama2.c "
                                ".bin or a Hugging Face directory)");
  }
  if (path.size() > 12 && path.compare(path.size() - 12, 12, ".safetensors") == 0) {
    return InvalidArgumentError(
        path +
        ": pass the Hugging Face model directory (with config.json), not the .safetensors file");
  }
  return ReadLlama2c(path);
}

Result<std::shared_ptr<const Model>> LoadModel(const std::string& path, SourcePages pages) {
  CHORUS_ASSIGN_OR_RETURN(ModelFile f, ReadModelFile(path));
  return Model::Build(std::move(f.config), std::move(f.tensors), f.format, std::move(f.source),
                      pages);
}

}  // namespace chorus::model
