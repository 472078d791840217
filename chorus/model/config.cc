#include "chorus/model/config.h"

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
  if (arch != "llama" && arch != "qwen2") return bad("unsupported architecture '" + arch + "'");
  return OkStatus();
}

std::vector<float> ModelConfig::RopeInvFreq() const {
  const int64_t half = head_dim / 2;
  std::vector<float> inv(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    double f =
        1.0 / std::pow(static_cast<double>(rope_theta), (2.0 * i) / static_cast<double>(head_dim));
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
    }
    if (!rope_freq_factors.empty()) f /= rope_freq_factors[static_cast<size_t>(i)];
    inv[static_cast<size_t>(i)] = static_cast<float>(f);
  }
  return inv;
}

int64_t ModelConfig::NumParams() const {
  int64_t per_layer = n_embd * q_dim() * 2 + n_embd * kv_dim() * 2 + 3 * n_embd * n_ff + 2 * n_embd;
  if (qkv_bias) per_layer += q_dim() + 2 * kv_dim();
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
    << (tie_embeddings ? " tied" : "") << (qkv_bias ? " qkv_bias" : "");
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
  } else {
    return UnimplementedError(
        file + ": unsupported architecture '" + arch_name.substr(0, 64) +
        "' (supported: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM)");
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
  CHORUS_RETURN_IF_ERROR(get_int("head_dim", &c.head_dim, false));
  CHORUS_RETURN_IF_ERROR(get_float("rms_norm_eps", &c.norm_eps));
  CHORUS_RETURN_IF_ERROR(get_float("rope_theta", &c.rope_theta));
  if (j.contains("tie_word_embeddings")) {
    if (!j["tie_word_embeddings"].is_boolean())
      return err("'tie_word_embeddings' must be a boolean");
    c.tie_embeddings = j["tie_word_embeddings"].get<bool>();
  }
  if (j.contains("attention_bias") && j["attention_bias"].is_boolean()) {
    c.qkv_bias = c.qkv_bias || j["attention_bias"].get<bool>();
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
    } else if (type == "linear") {
      c.rope_scaling.type = RopeScaling::Type::kLinear;
      c.rope_scaling.factor = num("factor", 1.0f);
    } else if (type == "default" || type.empty()) {
    } else {
      return UnimplementedError(file + ": rope_scaling type '" + type.substr(0, 32) +
                                "' is not supported (supported: linear, llama3)");
    }
  }
  c.rope_layout = kernels::RopeLayout::kHalf;  // HF checkpoints use rotate_half
  Status s = c.Validate();
  if (!s.ok()) return s.WithContext(file);
  return c;
}

}  // namespace chorus::model
