// llama2.c checkpoints (Karpathy's `run.c` "version 0" format): a header of 7 int32
// {dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len} followed by f32
// tensors in a fixed order. A negative vocab_size means a separate classifier (wcls) follows.
//
// Tensors are views into the mmapped file, named after llama2.c's fields with all layers
// stacked (outermost dimension = layer):
//   token_embedding_table [vocab, dim]        rms_att_weight [L, dim]
//   wq [L, n_heads*hd, dim]  wk [L, n_kv_heads*hd, dim]  wv [L, n_kv_heads*hd, dim]
//   wo [L, dim, n_heads*hd]  rms_ffn_weight [L, dim]
//   w1 [L, hidden, dim]  w2 [L, dim, hidden]  w3 [L, hidden, dim]
//   rms_final_weight [dim]   wcls [vocab, dim] (only when not shared)
// (freq_cis_real/imag of the legacy file are skipped.) q/k rows use the interleaved RoPE
// pair order (kernels::RopeLayout::kInterleaved).
#pragma once

#include <map>
#include <memory>
#include <string>

#include "chorus/base/status.h"
#include "chorus/tensor/tensor.h"

namespace chorus::formats {

struct Llama2cConfig {
  // vocab_size is always positive here; the file's sign is shared_classifier.
  int32_t dim = 0, hidden_dim = 0, n_layers = 0, n_heads = 0, n_kv_heads = 0, vocab_size = 0,
          seq_len = 0;
  bool shared_classifier = true;
  // Whether the file carries the legacy freq_cis_real/imag tables. The reader accepts files with
  // and without them; the writer writes them when true (the default — llama2.c's run.c expects
  // them).
  bool has_freq_cis = true;
};

struct Llama2cCheckpoint {
  Llama2cConfig config;
  std::map<std::string, Tensor> tensors;  // names above
};

// Validates the header (positive, plausible sizes; dim divisible by n_heads; n_heads divisible
// by n_kv_heads) and that the file size is exactly what the header implies (with or without
// wcls / freq_cis). Errors name the file.
Result<Llama2cCheckpoint> ReadLlama2c(const std::string& path);
// The same over bytes in memory (fuzzers, tests); `name` is used in messages.
Result<Llama2cCheckpoint> ReadLlama2cBytes(std::string name, std::string bytes);

// Writes a checkpoint in the same format (for tests and `chorus convert`), atomically. Tensors
// may be of any dtype (converted to f32) but must have the shapes above; freq_cis is computed
// (theta 10000) as llama2.c's export does, iff config.has_freq_cis; wcls is written (and
// vocab_size negated) iff !config.shared_classifier.
Status WriteLlama2c(const std::string& path, const Llama2cCheckpoint& ckpt);
Result<std::string> SerializeLlama2c(const Llama2cCheckpoint& ckpt);

}  // namespace chorus::formats
