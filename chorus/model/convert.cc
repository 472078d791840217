#include "chorus/model/convert.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string_view>

#include "chorus/base/durable_file.h"
#include "chorus/base/mapped_file.h"
#include "chorus/formats/gguf.h"
#include "chorus/formats/safetensors.h"
#include "chorus/model/names.h"

namespace chorus::model {

Tensor PermuteRopeRows(const Tensor& w, int64_t n_heads, int64_t head_dim, kernels::RopeLayout from,
                       kernels::RopeLayout to) {
  if (from == to) return w;
  CHORUS_CHECK_EQ(w.shape()[0], n_heads * head_dim);
  Tensor out = Tensor::Zeros(w.dtype(), w.shape());
  const int64_t rb = w.view().RowBytes(), half = head_dim / 2;
  auto* dst = static_cast<uint8_t*>(out.mutable_data());
  for (int64_t h = 0; h < n_heads; ++h) {
    for (int64_t i = 0; i < half; ++i) {
      // Interleaved row 2i pairs with 2i+1; rotate-half row i pairs with i + half.
      int64_t inter_a = h * head_dim + 2 * i, inter_b = inter_a + 1;
      int64_t half_a = h * head_dim + i, half_b = half_a + half;
      int64_t src_a = to == kernels::RopeLayout::kHalf ? inter_a : half_a;
      int64_t src_b = to == kernels::RopeLayout::kHalf ? inter_b : half_b;
      int64_t dst_a = to == kernels::RopeLayout::kHalf ? half_a : inter_a;
      int64_t dst_b = to == kernels::RopeLayout::kHalf ? half_b : inter_b;
      std::memcpy(dst + dst_a * rb, w.view().Row(src_a), static_cast<size_t>(rb));
      std::memcpy(dst + dst_b * rb, w.view().Row(src_b), static_cast<size_t>(rb));
    }
  }
  return out;
}

namespace {

bool IsMatrixName(const std::string& name) {
  return name.find("_proj.weight") != std::string::npos || name == "model.embed_tokens.weight" ||
         name == "lm_head.weight";
}

Tensor Recast(const Tensor& t, DType dtype) {
  if (t.dtype() == dtype) return t;
  return Tensor::FromF32(t.ToF32(), dtype, t.shape());
}

// The tensor as the target wants it: dtype and q/k row order.
Result<Tensor> Prepare(const ModelFile& m, const std::string& name, const Tensor& t,
                       const ConvertOptions& o, kernels::RopeLayout target_layout) {
  const ModelConfig& c = m.config;
  Tensor out = t;
  if (IsMatrixName(name)) {
    DType d = o.mix ? o.mix->For(name, t.view().cols(), c) : o.dtype.value_or(t.dtype());
    if (o.format == OutputFormat::kHfDirectory && DTypeIsQuantized(d)) {
      return InvalidArgumentError("a Hugging Face directory holds f32, f16 or bf16 weights, not " +
                                  std::string(DTypeName(d)) + " (pass --dtype f32|f16|bf16)");
    }
    if (DTypeIsQuantized(d) && t.view().cols() % DTypeBlockElems(d) != 0) {
      return InvalidArgumentError("tensor '" + name + "' has " + std::to_string(t.view().cols()) +
                                  " columns, not a multiple of " +
                                  std::to_string(DTypeBlockElems(d)) + " as " +
                                  std::string(DTypeName(d)) + " needs");
    }
    out = Recast(t, d);
  } else if (out.dtype() != DType::kF32) {
    out = Recast(t, DType::kF32);
  }
  const bool is_q = name.find("q_proj") != std::string::npos,
             is_k = name.find("k_proj") != std::string::npos;
  if ((is_q || is_k) && c.rope_layout != target_layout) {
    const int64_t heads = is_q ? c.n_heads : c.n_kv_heads;
    if (out.view().n_dims() == 1) {
      // A bias permutes like a column of rows.
      Tensor as_rows = out.Reshaped({out.shape()[0], 1});
      out = PermuteRopeRows(as_rows, heads, c.head_dim, c.rope_layout, target_layout)
                .Reshaped({out.shape()[0]});
    } else {
      out = PermuteRopeRows(out, heads, c.head_dim, c.rope_layout, target_layout);
    }
  }
  return out;
}

// The model's tensors as the target stores them: each prepared (Prepare), and for a family that
// stores fused projections (Phi-3) each layer's q|k|v and gate|up rows concatenated again into
// qkv_proj / gate_up_proj, in place of the first member.
Result<Model::NamedTensors> TargetTensors(const ModelFile& m, const ConvertOptions& o,
                                          kernels::RopeLayout target) {
  const ModelConfig& c = m.config;
  std::map<std::string, const Tensor*> by_name;
  for (const auto& [name, t] : m.tensors) by_name[name] = &t;
  Model::NamedTensors out;
  for (const auto& [name, t] : m.tensors) {
    bool handled = false;
    for (int64_t l = 0; FusedProjections(c) && !handled && l < c.n_layers; ++l) {
      for (LinearGroup g : {LinearGroup::kQkv, LinearGroup::kGateUp}) {
        const auto members = LinearGroupMembers(g);
        bool is_member = false;
        for (Linear mem : members) is_member |= name == HfLayerTensorName(l, mem);
        if (!is_member) continue;
        handled = true;
        if (name != HfLayerTensorName(l, members[0])) break;  // written with the first
        std::vector<Tensor> parts;
        int64_t rows = 0;
        for (Linear mem : members) {
          const std::string n = HfLayerTensorName(l, mem);
          auto it = by_name.find(n);
          if (it == by_name.end()) return InvalidArgumentError("missing tensor '" + n + "'");
          CHORUS_ASSIGN_OR_RETURN(Tensor p, Prepare(m, n, *it->second, o, target));
          if (!parts.empty() && p.dtype() != parts[0].dtype())
            return InvalidArgumentError("tensor '" + n + "' differs in dtype from its fused group");
          rows += p.shape()[0];
          parts.push_back(std::move(p));
        }
        Tensor fused = Tensor::Zeros(parts[0].dtype(), {rows, parts[0].shape()[1]});
        auto* dst = static_cast<uint8_t*>(fused.mutable_data());
        for (const Tensor& p : parts) {
          const auto bytes = static_cast<size_t>(p.view().NumBytes());
          std::memcpy(dst, p.data(), bytes);
          dst += bytes;
        }
        out.emplace_back(g == LinearGroup::kQkv ? HfFusedQkvName(l) : HfFusedGateUpName(l),
                         std::move(fused));
        break;
      }
    }
    if (handled) continue;
    CHORUS_ASSIGN_OR_RETURN(Tensor p, Prepare(m, name, t, o, target));
    out.emplace_back(name, std::move(p));
  }
  return out;
}

Status WriteGguf(const ModelFile& m, const ConvertOptions& o,
                 const std::function<Status(formats::GgufWriter*)>& extra) {
  const ModelConfig& c = m.config;
  formats::GgufWriter w;
  const std::string a = c.arch;
  w.SetString("general.architecture", a);
  w.SetString("general.name", m.source);
  w.SetUint32(a + ".context_length", static_cast<uint32_t>(c.max_seq_len));
  w.SetUint32(a + ".embedding_length", static_cast<uint32_t>(c.n_embd));
  w.SetUint32(a + ".block_count", static_cast<uint32_t>(c.n_layers));
  w.SetUint32(a + ".feed_forward_length", static_cast<uint32_t>(c.n_ff));
  if (!c.pooling.empty()) {  // an embedding model's pooling, in llama.cpp's numbering
    w.SetUint32(a + ".pooling_type", c.pooling == "mean" ? 1u : c.pooling == "cls" ? 2u : 3u);
  }
  w.SetUint32(a + ".attention.head_count", static_cast<uint32_t>(c.n_heads));
  w.SetUint32(a + ".attention.head_count_kv", static_cast<uint32_t>(c.n_kv_heads));
  w.SetUint32(a + ".attention.key_length", static_cast<uint32_t>(c.head_dim));
  w.SetUint32(a + ".attention.value_length", static_cast<uint32_t>(c.head_dim));
  w.SetUint32(a + ".rope.dimension_count", static_cast<uint32_t>(c.head_dim));
  w.SetUint32(a + ".vocab_size", static_cast<uint32_t>(c.vocab_size));
  w.SetFloat32(a + ".rope.freq_base", c.rope_theta);
  w.SetFloat32(a + ".attention.layer_norm_rms_epsilon", c.norm_eps);
  if (c.rope_scaling.type == RopeScaling::Type::kLinear) {
    w.SetString(a + ".rope.scaling.type", "linear");
    w.SetFloat32(a + ".rope.scaling.factor", c.rope_scaling.factor);
  }
  std::vector<float> freq_factors = c.rope_freq_factors;
  if (c.rope_scaling.type == RopeScaling::Type::kLlama3) {
    // llama.cpp stores Llama-3 scaling as per-frequency divisors.
    ModelConfig plain = c;
    plain.rope_scaling = RopeScaling{};
    plain.rope_freq_factors.clear();
    std::vector<float> base = plain.RopeInvFreq(), scaled = c.RopeInvFreq();
    freq_factors.resize(base.size());
    for (size_t i = 0; i < base.size(); ++i) freq_factors[i] = base[i] / scaled[i];
  }
  if (!freq_factors.empty()) {
    w.AddTensor("rope_freqs.weight", Tensor::FromF32(freq_factors, DType::kF32,
                                                     {static_cast<int64_t>(freq_factors.size())}));
  }
  const bool gemma = c.arch == "gemma2" || c.arch == "gemma3";
  if (c.RotaryDim() != c.head_dim)
    w.SetUint32(a + ".rope.dimension_count", static_cast<uint32_t>(c.RotaryDim()));
  if (c.sliding_window > 0)
    w.SetUint32(a + ".attention.sliding_window", static_cast<uint32_t>(c.sliding_window));
  if (c.attn_softcap > 0) w.SetFloat32(a + ".attn_logit_softcapping", c.attn_softcap);
  if (c.final_softcap > 0) w.SetFloat32(a + ".final_logit_softcapping", c.final_softcap);
  if (gemma) {
    // GGUF has no per-layer pattern, local RoPE base or query_pre_attn_scalar: llama.cpp (and
    // the loader) use fixed ones, so a model that differs would load as a different model.
    ModelConfig fixed = c;
    fixed.layer_sliding.assign(static_cast<size_t>(c.n_layers), 0);
    for (int64_t l = 0; l < c.n_layers; ++l)
      fixed.layer_sliding[static_cast<size_t>(l)] = a == "gemma2" ? l % 2 == 0 : (l + 1) % 6 != 0;
    const float want_scale =
        (a == "gemma2" && c.n_layers == 46) || (a == "gemma3" && c.n_layers == 62)
            ? 1.0f / std::sqrt(static_cast<float>(c.n_embd / c.n_heads))
            : 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    if (fixed.layer_sliding != c.layer_sliding ||
        (a == "gemma3" && c.rope_local_theta != 10000.0f) ||
        std::fabs(c.AttnScale() - want_scale) > 1e-6f * want_scale) {
      return UnimplementedError(
          "this " + a +
          " model's sliding-layer pattern, local RoPE base or query_pre_attn_scalar differ from "
          "the fixed ones GGUF readers assume; convert it to a Hugging Face directory instead");
    }
  }
  if (c.rope_scaling.type == RopeScaling::Type::kLongRope) {
    const auto& rs = c.rope_scaling;
    w.SetUint32(a + ".rope.scaling.original_context_length",
                static_cast<uint32_t>(rs.original_max_position));
    w.SetFloat32(a + ".rope.scaling.attn_factor", rs.attn_factor);
    const auto n = static_cast<int64_t>(rs.long_factors.size());
    w.AddTensor("rope_factors_long.weight", Tensor::FromF32(rs.long_factors, DType::kF32, {n}));
    w.AddTensor("rope_factors_short.weight", Tensor::FromF32(rs.short_factors, DType::kF32, {n}));
  }
  // llama.cpp's llama architecture uses the interleaved pair order; the others rotate-half.
  const auto target =
      c.arch == "llama" ? kernels::RopeLayout::kInterleaved : kernels::RopeLayout::kHalf;
  CHORUS_ASSIGN_OR_RETURN(Model::NamedTensors prepared, TargetTensors(m, o, target));
  for (auto& [name, out] : prepared) {
    auto g = HfToGgufName(name, a);
    if (!g) return InvalidArgumentError("no GGUF name for tensor '" + name + "'");
    if (gemma && name.size() > 11 && name.compare(name.size() - 11, 11, "norm.weight") == 0) {
      // llama.cpp's Gemma layout stores norms as 1 + w.
      std::vector<float> v = out.ToF32();
      for (float& x : v) x += 1.0f;
      out = Tensor::FromF32(v, DType::kF32, out.shape());
    }
    w.AddTensor(*g, std::move(out));
  }
  if (extra) CHORUS_RETURN_IF_ERROR(extra(&w));
  // A killed earlier conversion to this path left its temp file: removed once its writer is gone
  // (a one-shot command holds no lock; base/durable_file.h).
  RemoveDeadWritersTempFiles(o.output);
  return w.Write(o.output);
}

// The files a conversion into an HF directory writes, so an earlier conversion's are replaced
// rather than carried over (StagedDirectory::Commit): the weights — model.safetensors,
// model.safetensors.index.json, model-NNNNN-of-NNNNN.safetensors — and config.json always (a
// reader that finds an index ignores model.safetensors, but other tools would not, and a stale
// shard wastes disk); the tokenizer's files when this conversion writes a tokenizer, so files of
// two tokenizers never mix. Anything else in the directory stays.
bool IsConversionFile(const std::string& n, bool writes_tokenizer) {
  // model-NNNNN-of-NNNNN.safetensors, exactly.
  auto is_shard_name = [](const std::string& n) {
    static constexpr std::string_view kShape = "model-#####-of-#####.safetensors";
    if (n.size() != kShape.size()) return false;
    for (size_t i = 0; i < n.size(); ++i) {
      if (kShape[i] == '#' ? n[i] < '0' || n[i] > '9' : n[i] != kShape[i]) return false;
    }
    return true;
  };
  if (n == "model.safetensors" || n == "model.safetensors.index.json" || is_shard_name(n) ||
      n == "config.json")
    return true;
  return writes_tokenizer &&
         (n == "tokenizer.json" || n == "tokenizer.model" || n == "tokenizer_config.json" ||
          n == "special_tokens_map.json" || n == "generation_config.json");
}

Status WriteHf(const ModelFile& m, const ConvertOptions& o, const HfFilesWriter& hf_extra) {
  const ModelConfig& c = m.config;
  if (o.max_shard_bytes == 0) return InvalidArgumentError("the maximum shard size must be > 0");
  // Everything is written into a staging directory beside the output and swapped in at once, so
  // a kill or a reader never sees the files of two conversions mixed (base/durable_file.h). A
  // killed earlier conversion's staging directory is removed here.
  CHORUS_ASSIGN_OR_RETURN(StagedDirectory stage, StagedDirectory::Begin(o.output));
  const std::string& dir = stage.path();
  std::vector<std::pair<std::string, Tensor>> out;
  CHORUS_ASSIGN_OR_RETURN(out, TargetTensors(m, o, kernels::RopeLayout::kHalf));
  uint64_t total = 0;
  for (const auto& [name, t] : out) total += static_cast<uint64_t>(t.view().NumBytes());
  if (total > o.max_shard_bytes) {
    CHORUS_RETURN_IF_ERROR(
        formats::WriteSafetensorsSharded(dir, out, o.max_shard_bytes, {{"format", "pt"}}).status());
  } else {
    CHORUS_RETURN_IF_ERROR(
        formats::WriteSafetensors(dir + "/model.safetensors", out, {{"format", "pt"}}));
  }
  nlohmann::json j;
  const char* hf_arch = c.arch == "qwen2"    ? "Qwen2ForCausalLM"
                        : c.arch == "qwen3"  ? "Qwen3ForCausalLM"
                        : c.arch == "phi3"   ? "Phi3ForCausalLM"
                        : c.arch == "gemma2" ? "Gemma2ForCausalLM"
                        : c.arch == "gemma3" ? "Gemma3ForCausalLM"
                                             : "LlamaForCausalLM";
  j["architectures"] = {hf_arch};
  j["model_type"] = c.arch == "gemma3" ? "gemma3_text" : c.arch;
  j["hidden_size"] = c.n_embd;
  j["intermediate_size"] = c.n_ff;
  j["num_hidden_layers"] = c.n_layers;
  j["num_attention_heads"] = c.n_heads;
  j["num_key_value_heads"] = c.n_kv_heads;
  j["head_dim"] = c.head_dim;
  j["vocab_size"] = c.vocab_size;
  j["max_position_embeddings"] = c.max_seq_len;
  j["rms_norm_eps"] = c.norm_eps;
  j["rope_theta"] = c.rope_theta;
  j["tie_word_embeddings"] = c.tie_embeddings;
  j["hidden_act"] = "silu";
  if (c.qkv_bias && c.arch == "llama") j["attention_bias"] = true;
  if (c.arch == "qwen3" || c.arch == "phi3") j["attention_bias"] = false;
  if (c.RotaryDim() != c.head_dim)
    j["partial_rotary_factor"] =
        static_cast<double>(c.RotaryDim()) / static_cast<double>(c.head_dim);
  if (c.sliding_window > 0) j["sliding_window"] = c.sliding_window;
  if (c.arch == "gemma2" || c.arch == "gemma3") {
    j["hidden_activation"] = "gelu_pytorch_tanh";
    j["hidden_act"] = "gelu_pytorch_tanh";
    // query_pre_attn_scalar is what the scale is the inverse square root of.
    j["query_pre_attn_scalar"] = std::lround(
        1.0 / (static_cast<double>(c.AttnScale()) * static_cast<double>(c.AttnScale())));
    j["attn_logit_softcapping"] = c.attn_softcap > 0 ? nlohmann::json(c.attn_softcap) : nullptr;
    j["final_logit_softcapping"] = c.final_softcap > 0 ? nlohmann::json(c.final_softcap) : nullptr;
    nlohmann::json types = nlohmann::json::array();
    for (int64_t l = 0; l < c.n_layers; ++l)
      types.push_back(c.LayerSliding(l) ? "sliding_attention" : "full_attention");
    j["layer_types"] = types;
    if (c.arch == "gemma3") j["rope_local_base_freq"] = c.rope_local_theta;
  }
  if (c.rope_scaling.type == RopeScaling::Type::kLongRope) {
    j["rope_scaling"] = {{"rope_type", "longrope"},
                         {"long_factor", c.rope_scaling.long_factors},
                         {"short_factor", c.rope_scaling.short_factors},
                         {"attention_factor", c.rope_scaling.attn_factor}};
    j["original_max_position_embeddings"] = c.rope_scaling.original_max_position;
  } else if (c.rope_scaling.type == RopeScaling::Type::kLinear) {
    j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", c.rope_scaling.factor}};
  } else if (c.rope_scaling.type == RopeScaling::Type::kLlama3) {
    j["rope_scaling"] = {
        {"rope_type", "llama3"},
        {"factor", c.rope_scaling.factor},
        {"low_freq_factor", c.rope_scaling.low_freq_factor},
        {"high_freq_factor", c.rope_scaling.high_freq_factor},
        {"original_max_position_embeddings", c.rope_scaling.original_max_position}};
  } else if (!c.rope_freq_factors.empty()) {
    return UnimplementedError(
        "per-frequency rope factors (GGUF rope_freqs) have no Hugging Face config equivalent");
  }
  const char* dtype_name = "float32";
  if (o.dtype == DType::kBF16) dtype_name = "bfloat16";
  if (o.dtype == DType::kF16) dtype_name = "float16";
  j["torch_dtype"] = dtype_name;
  CHORUS_RETURN_IF_ERROR(WriteFileAtomically(dir + "/config.json", j.dump(2) + "\n"));
  if (hf_extra) CHORUS_RETURN_IF_ERROR(hf_extra(dir));
  std::error_code ec;
  const bool writes_tokenizer = std::filesystem::exists(dir + "/tokenizer.json", ec) ||
                                std::filesystem::exists(dir + "/tokenizer.model", ec);
  return stage.Commit([&](const std::string& n) { return IsConversionFile(n, writes_tokenizer); });
}

}  // namespace

Status ConvertModel(const ModelFile& model, const ConvertOptions& opts,
                    const std::function<Status(formats::GgufWriter*)>& gguf_extra,
                    const HfFilesWriter& hf_extra) {
  if (opts.output.empty()) return InvalidArgumentError("convert needs an output path (-o)");
  if (opts.format == OutputFormat::kGguf) return WriteGguf(model, opts, gguf_extra);
  return WriteHf(model, opts, hf_extra);
}

Result<uint64_t> ParseShardSize(std::string_view text) {
  auto bad = [&] {
    return InvalidArgumentError("shard size '" + std::string(text.substr(0, 32)) +
                                "' is not a positive size such as 5GB, 500MB, 2GiB or a number "
                                "of bytes");
  };
  size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
  if (digits == 0 || digits > 15) return bad();
  uint64_t n = 0;
  for (size_t i = 0; i < digits; ++i) n = n * 10 + static_cast<uint64_t>(text[i] - '0');
  static const std::map<std::string, uint64_t, std::less<>> kUnits = {{"", 1},
                                                                      {"B", 1},
                                                                      {"KB", 1000},
                                                                      {"MB", 1000'000},
                                                                      {"GB", 1000'000'000},
                                                                      {"KiB", uint64_t{1} << 10},
                                                                      {"MiB", uint64_t{1} << 20},
                                                                      {"GiB", uint64_t{1} << 30}};
  auto unit = kUnits.find(text.substr(digits));
  if (unit == kUnits.end() || n == 0 || n > UINT64_MAX / unit->second) return bad();
  return n * unit->second;
}

}  // namespace chorus::model
