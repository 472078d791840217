#include "chorus/model/config.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <sstream>

namespace chorus::model {

Status ModelConfig::Validate() const {
  auto bad = [](const std::string& m) { return InvalidArgumentError("model config: " + m); };
  constexpr int64_t kMaxDim = 1 << 17, kMaxLayers = 1024, kMaxVocab = 1 << 22;
  if (n_embd <= 0 || n_embd > kMaxDim)
    return bad("hidden size " + std::to_string(n_embd) + " out of range");
  if (n_layers <= 0 || n_layers > kMaxLayers)
    return bad("layer count " + std::to_string(n_layers) + " out of range");
  if (n_heads <= 0 || n_heads > 1024)
    return bad("head count " + std::to_string(n_heads) + " out of range");
  if (n_kv_heads <= 0 || n_kv_heads > n_heads || n_heads % n_kv_heads != 0)
    return bad("kv head count " + std::to_string(n_kv_heads) + " must divide head count " +
               std::to_string(n_heads));
  if (head_dim <= 0 || head_dim % 2 != 0 || head_dim > 1024)
    return bad("head_dim " + std::to_string(head_dim) + " must be even and positive");
  if (n_ff <= 0 || n_ff > 8 * kMaxDim)
    return bad("intermediate size " + std::to_string(n_ff) + " out of range");
  if (vocab_size <= 0 || vocab_size > kMaxVocab)
    return bad("vocab size " + std::to_string(vocab_size) + " out of range");
  if (max_seq_len <= 0 || max_seq_len > (1 << 24))
    return bad("context length " + std::to_string(max_seq_len) + " out of range");
  if (!(norm_eps > 0 && norm_eps < 1)) return bad("rms_norm_eps must be in (0, 1)");
  if (!(rope_theta > 0 && std::isfinite(rope_theta))) return bad("rope_theta must be positive");
  if (!(rope_scaling.factor > 0 && std::isfinite(rope_scaling.factor)))
    return bad("rope_scaling.factor must be positive");
  if (!rope_freq_factors.empty() && static_cast<int64_t>(rope_freq_factors.size()) != head_dim / 2)
    return bad("rope_freqs has " + std::to_string(rope_freq_factors.size()) +
               " entries, expected head_dim/2");
  if (arch != "llama" && arch != "qwen2" && arch != "qwen3" && arch != "phi3" && arch != "gemma2" &&
      arch != "gemma3")
    return bad("unsupported architecture '" + arch + "'");
  if (rotary_dim < 0 || rotary_dim > head_dim || rotary_dim % 2 != 0)
    return bad("rotary dimension " + std::to_string(rotary_dim) + " must be even and ≤ head_dim " +
               std::to_string(head_dim));
  if (rope_scaling.type == RopeScaling::Type::kLongRope) {
    const size_t want = static_cast<size_t>(RotaryDim() / 2);
    if (rope_scaling.long_factors.size() != want || rope_scaling.short_factors.size() != want)
      return bad("rope_scaling long_factor/short_factor have " +
                 std::to_string(rope_scaling.long_factors.size()) + "/" +
                 std::to_string(rope_scaling.short_factors.size()) + " entries, expected " +
                 std::to_string(want) + " (rotary dimension / 2)");
    for (const auto* v : {&rope_scaling.long_factors, &rope_scaling.short_factors})
      for (float f : *v)
        if (!(f > 0 && std::isfinite(f))) return bad("rope_scaling factors must be positive");
    if (rope_scaling.original_max_position <= 0)
      return bad("original_max_position_embeddings must be positive");
    if (!(rope_scaling.attn_factor > 0 && std::isfinite(rope_scaling.attn_factor)))
      return bad("rope_scaling attention_factor must be positive");
  }
  if (!(attn_scale >= 0 && std::isfinite(attn_scale))) return bad("attention scale must be ≥ 0");
  if (!(attn_softcap >= 0 && std::isfinite(attn_softcap)))
    return bad("attn_logit_softcapping must be ≥ 0");
  if (!(final_softcap >= 0 && std::isfinite(final_softcap)))
    return bad("final_logit_softcapping must be ≥ 0");
  if (sliding_window < 0) return bad("sliding_window must be ≥ 0");
  if (!layer_sliding.empty() && static_cast<int64_t>(layer_sliding.size()) != n_layers)
    return bad("layer_types has " + std::to_string(layer_sliding.size()) + " entries, expected " +
               std::to_string(n_layers) + " (one per layer)");
  if (!(rope_local_theta >= 0 && std::isfinite(rope_local_theta)))
    return bad("rope_local_base_freq must be ≥ 0");
  return OkStatus();
}

float ModelConfig::AttnScale() const {
  return attn_scale > 0 ? attn_scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
}

float ModelConfig::RopeAttnFactor() const {
  return rope_scaling.type == RopeScaling::Type::kLongRope ? rope_scaling.attn_factor : 1.0f;
}

std::vector<float> ModelConfig::RopeInvFreqLocal() const {
  if (rope_local_theta <= 0) return RopeInvFreq();
  ModelConfig local = *this;
  local.rope_theta = rope_local_theta;
  local.rope_scaling = RopeScaling{};
  local.rope_freq_factors.clear();
  return local.RopeInvFreq();
}

std::vector<float> ModelConfig::RopeInvFreq() const {
  const int64_t rot = RotaryDim(), half = rot / 2;
  std::vector<float> inv(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    double f =
        1.0 / std::pow(static_cast<double>(rope_theta), (2.0 * i) / static_cast<double>(rot));
    switch (rope_scaling.type) {
      case RopeScaling::Type::kNone:
        break;
      case RopeScaling::Type::kLinear:
        f /= rope_scaling.factor;
        break;
      case RopeScaling::Type::kLlama3: {
        // Llama 3.1 frequency-dependent scaling: long wavelengths are divided by `factor`,
        // short ones kept, and the band between interpolated smoothly.
        const double old_ctx = static_cast<double>(rope_scaling.original_max_position);
        const double low_wavelen = old_ctx / rope_scaling.low_freq_factor;
        const double high_wavelen = old_ctx / rope_scaling.high_freq_factor;
        const double wavelen = 2.0 * M_PI / f;
        if (wavelen > low_wavelen) {
          f /= rope_scaling.factor;
        } else if (wavelen >= high_wavelen) {
          double smooth = (old_ctx / wavelen - rope_scaling.low_freq_factor) /
                          (rope_scaling.high_freq_factor - rope_scaling.low_freq_factor);
          f = (1.0 - smooth) * f / rope_scaling.factor + smooth * f;
        }
        break;
      }
      case RopeScaling::Type::kLongRope: {
        const auto& ext = max_seq_len > rope_scaling.original_max_position
                              ? rope_scaling.long_factors
                              : rope_scaling.short_factors;
        if (static_cast<int64_t>(ext.size()) == half) f /= ext[static_cast<size_t>(i)];
        break;
      }
    }
    if (!rope_freq_factors.empty()) f /= rope_freq_factors[static_cast<size_t>(i)];
    inv[static_cast<size_t>(i)] = static_cast<float>(f);
  }
  return inv;
}

int64_t ModelConfig::NumParams() const {
  int64_t per_layer = n_embd * q_dim() * 2 + n_embd * kv_dim() * 2 + 3 * n_embd * n_ff + 2 * n_embd;
  if (qkv_bias) per_layer += q_dim() + 2 * kv_dim();
  if (qk_norm) per_layer += 2 * head_dim;
  if (sandwich_norms) per_layer += 2 * n_embd;
  int64_t p = n_layers * per_layer + vocab_size * n_embd + n_embd;
  if (!tie_embeddings) p += vocab_size * n_embd;
  return p;
}

std::string ModelConfig::Summary() const {
  std::ostringstream s;
  s << "arch=" << arch << " n_embd=" << n_embd << " n_layers=" << n_layers << " n_heads=" << n_heads
    << " n_kv_heads=" << n_kv_heads << " head_dim=" << head_dim << " n_ff=" << n_ff
    << " vocab=" << vocab_size << " ctx=" << max_seq_len << " rope_theta=" << rope_theta
    << " rope=" << (rope_layout == kernels::RopeLayout::kHalf ? "half" : "interleaved")
    << (tie_embeddings ? " tied" : "") << (qkv_bias ? " qkv_bias" : "")
    << (qk_norm ? " qk_norm" : "") << (activation == Activation::kGeluTanh ? " geglu" : "");
  if (RotaryDim() != head_dim) s << " rotary_dim=" << RotaryDim();
  if (rope_scaling.type == RopeScaling::Type::kLongRope) s << " longrope";
  if (sliding_window > 0) s << " window=" << sliding_window;
  if (!pooling.empty()) s << " pooling=" << pooling;
  if (attn_softcap > 0) s << " attn_softcap=" << attn_softcap;
  if (final_softcap > 0) s << " final_softcap=" << final_softcap;
  return s.str();
}

Result<ModelConfig> ConfigFromHfJson(const std::string& text, const std::string& file) {
  using nlohmann::json;
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return InvalidArgumentError(file + ": not a JSON object");
  auto err = [&](const std::string& m) { return InvalidArgumentError(file + ": " + m); };
  ModelConfig c;
  std::string arch_name;
  if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty() &&
      j["architectures"][0].is_string()) {
    arch_name = j["architectures"][0].get<std::string>();
  } else if (j.contains("model_type") && j["model_type"].is_string()) {
    arch_name = j["model_type"].get<std::string>();
  }
  if (arch_name == "LlamaForCausalLM" || arch_name == "MistralForCausalLM" ||
      arch_name == "llama" || arch_name == "mistral") {
    c.arch = "llama";
  } else if (arch_name == "Qwen2ForCausalLM" || arch_name == "qwen2") {
    c.arch = "qwen2";
    c.qkv_bias = true;
  } else if (arch_name == "Qwen3ForCausalLM" || arch_name == "qwen3") {
    c.arch = "qwen3";
    c.qk_norm = true;
  } else if (arch_name == "Phi3ForCausalLM" || arch_name == "phi3") {
    c.arch = "phi3";
  } else if (arch_name == "Gemma2ForCausalLM" || arch_name == "gemma2") {
    c.arch = "gemma2";
  } else if (arch_name == "Gemma3ForCausalLM" || arch_name == "gemma3_text") {
    c.arch = "gemma3";
    c.qk_norm = true;
  } else if (arch_name == "Gemma3ForConditionalGeneration") {
    return UnimplementedError(file +
                              ": 'architectures' names Gemma3ForConditionalGeneration (the "
                              "multimodal checkpoint); Chorus reads the text-only "
                              "Gemma3ForCausalLM layout (docs/models.md)");
  } else {
    return UnimplementedError(file + ": 'architectures' names unsupported architecture '" +
                              arch_name.substr(0, 64) +
                              "' (supported: LlamaForCausalLM, MistralForCausalLM, "
                              "Qwen2ForCausalLM, Qwen3ForCausalLM, Phi3ForCausalLM, "
                              "Gemma2ForCausalLM, Gemma3ForCausalLM)");
  }
  const bool gemma = c.arch == "gemma2" || c.arch == "gemma3";
  if (gemma) {
    c.norm_plus_one = true;
    c.sandwich_norms = true;
    c.embed_scale = true;
    c.activation = Activation::kGeluTanh;
    c.tie_embeddings = true;  // Gemma checkpoints tie unless they say otherwise
  }
  // Reads an integer field; `required` fields produce an error naming the key.
  auto get_int = [&](const char* key, int64_t* out, bool required) -> Status {
    if (!j.contains(key) || j[key].is_null()) {
      return required ? err(std::string("missing '") + key + "'") : OkStatus();
    }
    if (!j[key].is_number_integer()) return err(std::string("'") + key + "' must be an integer");
    *out = j[key].get<int64_t>();
    return OkStatus();
  };
  auto get_float = [&](const char* key, float* out) -> Status {
    if (!j.contains(key) || j[key].is_null()) return OkStatus();
    if (!j[key].is_number()) return err(std::string("'") + key + "' must be a number");
    *out = j[key].get<float>();
    return OkStatus();
  };
  CHORUS_RETURN_IF_ERROR(get_int("hidden_size", &c.n_embd, true));
  CHORUS_RETURN_IF_ERROR(get_int("num_hidden_layers", &c.n_layers, true));
  CHORUS_RETURN_IF_ERROR(get_int("num_attention_heads", &c.n_heads, true));
  c.n_kv_heads = c.n_heads;
  CHORUS_RETURN_IF_ERROR(get_int("num_key_value_heads", &c.n_kv_heads, false));
  CHORUS_RETURN_IF_ERROR(get_int("intermediate_size", &c.n_ff, true));
  CHORUS_RETURN_IF_ERROR(get_int("vocab_size", &c.vocab_size, true));
  CHORUS_RETURN_IF_ERROR(get_int("max_position_embeddings", &c.max_seq_len, false));
  c.head_dim = c.n_heads > 0 ? c.n_embd / c.n_heads : 0;
  // What transformers' config classes assume for keys a config.json leaves out (Qwen3Config,
  // Gemma2Config, Gemma3TextConfig): released configs often rely on these.
  const int64_t family_head_dim = c.arch == "qwen3" ? 128 : gemma ? 256 : 0;
  if (family_head_dim > 0) c.head_dim = family_head_dim;
  if (c.arch == "qwen3" || gemma) c.norm_eps = 1e-6f;
  if (c.arch == "gemma3") c.rope_theta = 1000000.0f;
  if (family_head_dim == 0 && !j.contains("head_dim") && c.n_heads > 0 && c.n_embd % c.n_heads != 0)
    return err("hidden_size " + std::to_string(c.n_embd) + " is not a multiple of " +
               "num_attention_heads " + std::to_string(c.n_heads) + " and no 'head_dim' is given");
  CHORUS_RETURN_IF_ERROR(get_int("head_dim", &c.head_dim, false));
  CHORUS_RETURN_IF_ERROR(get_float("rms_norm_eps", &c.norm_eps));
  CHORUS_RETURN_IF_ERROR(get_float("rope_theta", &c.rope_theta));
  if (j.contains("tie_word_embeddings")) {
    if (!j["tie_word_embeddings"].is_boolean())
      return err("'tie_word_embeddings' must be a boolean");
    c.tie_embeddings = j["tie_word_embeddings"].get<bool>();
  }
  if (j.contains("attention_bias") && j["attention_bias"].is_boolean() && c.arch != "qwen2") {
    c.qkv_bias = j["attention_bias"].get<bool>();
  }
  auto get_opt_float = [&](const char* key, float* out) -> Status {
    if (!j.contains(key) || j[key].is_null()) return OkStatus();
    return get_float(key, out);
  };
  // transformers' per-layer `layer_types` ("sliding_attention" / "full_attention") into
  // c.layer_sliding.
  auto read_layer_types = [&]() -> Status {
    const json& lt = j["layer_types"];
    if (static_cast<int64_t>(lt.size()) != c.n_layers)
      return err("'layer_types' has " + std::to_string(lt.size()) + " entries, expected " +
                 std::to_string(c.n_layers));
    c.layer_sliding.assign(lt.size(), 0);
    for (size_t i = 0; i < lt.size(); ++i) {
      if (!lt[i].is_string()) return err("'layer_types' entries must be strings");
      const std::string t = lt[i];
      if (t != "sliding_attention" && t != "full_attention")
        return err("'layer_types' entry '" + t.substr(0, 32) + "' is not supported");
      c.layer_sliding[i] = t == "sliding_attention";
    }
    return OkStatus();
  };
  if (arch_name == "MistralForCausalLM" || arch_name == "mistral") {
    // Mistral 7B v0.1 slides every layer over 4096 keys; later Mistrals set null (none).
    CHORUS_RETURN_IF_ERROR(get_int("sliding_window", &c.sliding_window, false));
  } else if (c.arch == "qwen2" || c.arch == "qwen3") {
    // Qwen's sliding_window applies only with use_sliding_window (false in every released
    // config), and then, as transformers' Qwen2Config / Qwen3Config define, to the layers
    // ≥ max_window_layers unless layer_types lists them.
    bool use_window = false;  // absent or null: false
    if (j.contains("use_sliding_window") && !j["use_sliding_window"].is_null()) {
      if (!j["use_sliding_window"].is_boolean())
        return err("'use_sliding_window' must be a boolean");
      use_window = j["use_sliding_window"].get<bool>();
    }
    if (use_window) {
      CHORUS_RETURN_IF_ERROR(get_int("sliding_window", &c.sliding_window, false));
      int64_t max_window_layers = 28;  // the config classes' default
      CHORUS_RETURN_IF_ERROR(get_int("max_window_layers", &max_window_layers, false));
      if (j.contains("layer_types") && j["layer_types"].is_array()) {
        CHORUS_RETURN_IF_ERROR(read_layer_types());
      } else {
        c.layer_sliding.assign(static_cast<size_t>(std::max<int64_t>(c.n_layers, 0)), 0);
        for (int64_t l = 0; l < c.n_layers; ++l)
          c.layer_sliding[static_cast<size_t>(l)] = l >= max_window_layers;
      }
      if (std::find(c.layer_sliding.begin(), c.layer_sliding.end(), 1) == c.layer_sliding.end())
        c.sliding_window = 0;  // no layer slides
    }
  }
  if (c.arch == "phi3") {
    // Phi-3 ignores any hidden_act other than silu in practice; refuse the unexpected.
    if (j.contains("hidden_act") && j["hidden_act"] != "silu")
      return err("'hidden_act' must be silu for Phi3ForCausalLM");
    float partial = 1.0f;
    CHORUS_RETURN_IF_ERROR(get_opt_float("partial_rotary_factor", &partial));
    if (!(partial > 0 && partial <= 1)) return err("'partial_rotary_factor' must be in (0, 1]");
    c.rotary_dim = static_cast<int64_t>(static_cast<float>(c.head_dim) * partial);
    if (c.rotary_dim == c.head_dim) c.rotary_dim = 0;
    CHORUS_RETURN_IF_ERROR(get_int("sliding_window", &c.sliding_window, false));
  }
  if (gemma) {
    const char* act_key = j.contains("hidden_activation") ? "hidden_activation" : "hidden_act";
    if (j.contains(act_key) && j[act_key].is_string()) {
      const std::string act = j[act_key];
      if (act != "gelu_pytorch_tanh" && act != "gelu_tanh" && act != "gelu")
        return err(std::string("'") + act_key + "' " + act.substr(0, 32) +
                   " is not supported (gelu_pytorch_tanh)");
    }
    float qpas = 256.0f;  // the default of both config classes
    CHORUS_RETURN_IF_ERROR(get_opt_float("query_pre_attn_scalar", &qpas));
    if (!(qpas > 0)) return err("'query_pre_attn_scalar' must be positive");
    c.attn_scale = 1.0f / std::sqrt(qpas);
    // Soft caps: absent = the class default (Gemma 2: 50 and 30; Gemma 3: none), null = none.
    auto cap = [&](const char* key, float def, float* out) -> Status {
      *out = def;
      if (j.contains(key) && j[key].is_null()) {
        *out = 0.0f;
        return OkStatus();
      }
      return get_opt_float(key, out);
    };
    const bool g2 = c.arch == "gemma2";
    CHORUS_RETURN_IF_ERROR(cap("attn_logit_softcapping", g2 ? 50.0f : 0.0f, &c.attn_softcap));
    CHORUS_RETURN_IF_ERROR(cap("final_logit_softcapping", g2 ? 30.0f : 0.0f, &c.final_softcap));
    c.sliding_window = 4096;
    CHORUS_RETURN_IF_ERROR(get_int("sliding_window", &c.sliding_window, false));
    // Which layers slide: layer_types when given, else the family's fixed pattern (Gemma 2:
    // even layers; Gemma 3: all but every sliding_window_pattern-th).
    if (j.contains("layer_types") && j["layer_types"].is_array()) {
      CHORUS_RETURN_IF_ERROR(read_layer_types());
    } else {
      c.layer_sliding.assign(static_cast<size_t>(std::max<int64_t>(c.n_layers, 0)), 0);
      int64_t pattern = c.arch == "gemma2" ? 2 : 6;
      CHORUS_RETURN_IF_ERROR(get_int("sliding_window_pattern", &pattern, false));
      if (pattern <= 0) return err("'sliding_window_pattern' must be positive");
      for (int64_t l = 0; l < c.n_layers; ++l)
        c.layer_sliding[static_cast<size_t>(l)] =
            c.arch == "gemma2" ? l % 2 == 0 : (l + 1) % pattern != 0;
    }
    if (c.arch == "gemma3") {
      c.rope_local_theta = 10000.0f;
      CHORUS_RETURN_IF_ERROR(get_opt_float("rope_local_base_freq", &c.rope_local_theta));
    }
  }
  if (j.contains("rope_scaling") && !j["rope_scaling"].is_null()) {
    const json& rs = j["rope_scaling"];
    if (!rs.is_object()) return err("'rope_scaling' must be an object");
    std::string type;
    if (rs.contains("rope_type") && rs["rope_type"].is_string())
      type = rs["rope_type"];
    else if (rs.contains("type") && rs["type"].is_string())
      type = rs["type"];
    auto num = [&](const char* k, float def) -> float {
      return rs.contains(k) && rs[k].is_number() ? rs[k].get<float>() : def;
    };
    if (type == "llama3") {
      c.rope_scaling.type = RopeScaling::Type::kLlama3;
      c.rope_scaling.factor = num("factor", 8.0f);
      c.rope_scaling.low_freq_factor = num("low_freq_factor", 1.0f);
      c.rope_scaling.high_freq_factor = num("high_freq_factor", 4.0f);
      c.rope_scaling.original_max_position =
          static_cast<int64_t>(num("original_max_position_embeddings", 8192.0f));
      if (c.rope_scaling.high_freq_factor <= c.rope_scaling.low_freq_factor)
        return err("rope_scaling: high_freq_factor must exceed low_freq_factor");
    } else if (type == "longrope" || type == "su") {
      auto factors = [&](const char* k, std::vector<float>* out) -> Status {
        if (!rs.contains(k) || !rs[k].is_array())
          return err(std::string("rope_scaling: '") + k + "' must be an array of numbers");
        for (const json& v : rs[k]) {
          if (!v.is_number())
            return err(std::string("rope_scaling: '") + k + "' must be an array of numbers");
          out->push_back(v.get<float>());
        }
        return OkStatus();
      };
      c.rope_scaling.type = RopeScaling::Type::kLongRope;
      CHORUS_RETURN_IF_ERROR(factors("long_factor", &c.rope_scaling.long_factors));
      CHORUS_RETURN_IF_ERROR(factors("short_factor", &c.rope_scaling.short_factors));
      // Phi-3 keeps the pre-training context at the top level; newer configs inside
      // rope_scaling.
      c.rope_scaling.original_max_position = c.max_seq_len;
      CHORUS_RETURN_IF_ERROR(get_int("original_max_position_embeddings",
                                     &c.rope_scaling.original_max_position, false));
      if (rs.contains("original_max_position_embeddings") &&
          rs["original_max_position_embeddings"].is_number_integer())
        c.rope_scaling.original_max_position = rs["original_max_position_embeddings"];
      if (c.rope_scaling.original_max_position <= 0)
        return err("'original_max_position_embeddings' must be positive");
      // The attention factor: given, else from the context ratio (√(1 + ln s / ln L)).
      const double scale = static_cast<double>(c.max_seq_len) /
                           static_cast<double>(c.rope_scaling.original_max_position);
      c.rope_scaling.attn_factor =
          scale <= 1.0
              ? 1.0f
              : static_cast<float>(std::sqrt(
                    1.0 + std::log(scale) /
                              std::log(static_cast<double>(c.rope_scaling.original_max_position))));
      if (rs.contains("attention_factor") && rs["attention_factor"].is_number())
        c.rope_scaling.attn_factor = rs["attention_factor"].get<float>();
    } else if (type == "linear") {
      c.rope_scaling.type = RopeScaling::Type::kLinear;
      c.rope_scaling.factor = num("factor", 1.0f);
    } else if (type == "default" || type.empty()) {
    } else {
      return UnimplementedError(file + ": rope_scaling type '" + type.substr(0, 32) +
                                "' is not supported (supported: linear, llama3, longrope)");
    }
  }
  c.rope_layout = kernels::RopeLayout::kHalf;  // HF checkpoints use rotate_half
  Status s = c.Validate();
  if (!s.ok()) return s.WithContext(file);
  return c;
}

}  // namespace chorus::model
