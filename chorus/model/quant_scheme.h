// What `--dtype` names for convert and bench: one dtype for every matrix ("q8_0", "q4_k", ...) or
// one of llama.cpp's K-quant mixes ("q4_k_m", ...), which choose a type per tensor. The rules of
// each mix are llama.cpp's (llama-quant.cpp, for dense models) and are listed in
// docs/kernels.md, "K-quant mixes".
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "chorus/base/status.h"
#include "chorus/model/config.h"
#include "chorus/tensor/dtype.h"

namespace chorus::model {

class QuantScheme {
 public:
  enum class Mix { kNone, kQ2_K, kQ3_K_M, kQ4_K_S, kQ4_K_M, kQ5_K_S, kQ5_K_M, kQ6_K };

  QuantScheme() = default;
  // Every matrix in `dtype` (implicit: a plain dtype is the simplest scheme).
  QuantScheme(DType dtype) : base_(dtype) {}  // NOLINT(google-explicit-constructor)

  // "f32" .. "q6_k" (a plain dtype) or "q2_k" .. "q6_k" mixes: "q2_k" and "q6_k" are llama.cpp's
  // Q2_K and Q6_K file types (a mix: attn_v, ffn_down, output get other types), so the plain
  // types are spelled "q2_k_pure" / "q6_k_pure"; "q3_k_m", "q4_k_s", "q4_k_m", "q5_k_s",
  // "q5_k_m"; "q4_k", "q5_k", "q3_k" are every matrix in that type (like llama-quantize --pure).
  static Result<QuantScheme> Parse(std::string_view name);

  std::string name() const;
  Mix mix() const { return mix_; }
  DType base() const { return base_; }
  bool is_mix() const { return mix_ != Mix::kNone; }

  // The dtype of matrix `hf_name` (model.embed_tokens.weight, lm_head.weight,
  // model.layers.N.{self_attn,mlp}.X.weight) with `cols` input features in a model of config c.
  // A K type that does not divide `cols` falls back to q8_0 (llama.cpp falls back to
  // Q5_0/Q5_1/Q8_0, of which Chorus has q8_0).
  DType For(const std::string& hf_name, int64_t cols, const ModelConfig& c) const;

 private:
  DType base_ = DType::kF32;
  Mix mix_ = Mix::kNone;
  std::string alias_;  // the name parsed, when it differs from DTypeName(base_)
};

}  // namespace chorus::model
