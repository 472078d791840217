#include "chorus/model/quant_scheme.h"

#include <cctype>
#include <cstdio>

namespace chorus::model {
namespace {

struct MixName {
  const char* name;
  QuantScheme::Mix mix;
  DType base;
};
constexpr MixName kMixes[] = {
    {"q2_k", QuantScheme::Mix::kQ2_K, DType::kQ2_K},
    {"q3_k_m", QuantScheme::Mix::kQ3_K_M, DType::kQ3_K},
    {"q4_k_s", QuantScheme::Mix::kQ4_K_S, DType::kQ4_K},
    {"q4_k_m", QuantScheme::Mix::kQ4_K_M, DType::kQ4_K},
    {"q5_k_s", QuantScheme::Mix::kQ5_K_S, DType::kQ5_K},
    {"q5_k_m", QuantScheme::Mix::kQ5_K_M, DType::kQ5_K},
    {"q6_k", QuantScheme::Mix::kQ6_K, DType::kQ6_K},
};

// llama.cpp's use_more_bits: the first and last eighth of the layers and every third between.
bool UseMoreBits(int64_t i, int64_t n) {
  return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

// Layer index of "model.layers.N.", or -1.
int64_t LayerOf(const std::string& name) {
  long long l = -1;
  if (std::sscanf(name.c_str(), "model.layers.%lld.", &l) != 1) return -1;
  return l;
}

bool Has(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

}  // namespace

Result<QuantScheme> QuantScheme::Parse(std::string_view name) {
  std::string s(name);
  for (auto& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  for (const MixName& m : kMixes) {
    if (s == m.name) {
      QuantScheme q(m.base);
      q.mix_ = m.mix;
      return q;
    }
  }
  std::string plain = s;
  const std::string pure = "_pure";
  if (plain.size() > pure.size() && plain.ends_with(pure)) plain.resize(plain.size() - pure.size());
  auto d = ParseDType(plain);
  if (!d.ok()) {
    return InvalidArgumentError(
        "unknown weight type '" + std::string(name.substr(0, 32)) +
        "' (expected a dtype: f32, f16, bf16, q8_0, q4_0, q3_k, q4_k, "
        "q5_k; or a K-quant mix: q2_k, q3_k_m, q4_k_s, q4_k_m, q5_k_s, "
        "q5_k_m, q6_k; q2_k_pure / q6_k_pure for every matrix in one type)");
  }
  QuantScheme q(*d);
  if (plain != s) q.alias_ = s;
  return q;
}

std::string QuantScheme::name() const {
  for (const MixName& m : kMixes)
    if (m.mix == mix_ && mix_ != Mix::kNone) return m.name;
  if (!alias_.empty()) return alias_;
  return std::string(DTypeName(base_));
}

DType QuantScheme::For(const std::string& n, int64_t cols, const ModelConfig& c) const {
  DType t = base_;
  if (mix_ != Mix::kNone) {
    const bool output =
        n == "lm_head.weight" || (c.tie_embeddings && n == "model.embed_tokens.weight");
    const int64_t layer = LayerOf(n), layers = c.n_layers;
    const bool attn_v = Has(n, "self_attn.v_proj."), ffn_down = Has(n, "mlp.down_proj."),
               attn_out = Has(n, "self_attn.o_proj.");
    const int64_t gqa = c.n_kv_heads > 0 ? c.n_heads / c.n_kv_heads : 1;
    if (output) {
      t = DType::kQ6_K;
    } else if (attn_v) {
      switch (mix_) {
        case Mix::kQ2_K:
          t = gqa >= 4 ? DType::kQ4_K : DType::kQ3_K;
          break;
        case Mix::kQ3_K_M:
          t = layer < 2 ? DType::kQ5_K : DType::kQ4_K;
          break;
        case Mix::kQ4_K_M:
        case Mix::kQ5_K_M:
          if (UseMoreBits(layer, layers)) t = DType::kQ6_K;
          break;
        case Mix::kQ4_K_S:
          if (layer < 4) t = DType::kQ5_K;
          break;
        default:
          break;
      }
    } else if (ffn_down) {
      switch (mix_) {
        case Mix::kQ2_K:
          t = DType::kQ3_K;
          break;
        case Mix::kQ3_K_M:
          t = layer < layers / 16 ? DType::kQ5_K : DType::kQ4_K;
          break;
        case Mix::kQ4_K_M:
        case Mix::kQ5_K_M:
          if (UseMoreBits(layer, layers)) t = DType::kQ6_K;
          break;
        case Mix::kQ4_K_S:
          if (layer < layers / 8) t = DType::kQ5_K;
          break;
        default:
          break;
      }
    } else if (attn_out) {
      if (mix_ == Mix::kQ2_K) t = DType::kQ3_K;
      if (mix_ == Mix::kQ3_K_M) t = DType::kQ4_K;
    }
  }
  if (DTypeIsQuantized(t) && cols % DTypeBlockElems(t) != 0) {
    t = DTypeIsKQuant(t) && cols % kQuantBlock == 0 ? DType::kQ8_0 : t;
  }
  return t;
}

}  // namespace chorus::model
