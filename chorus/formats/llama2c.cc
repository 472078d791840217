#include "chorus/formats/llama2c.h"

#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "chorus/base/mapped_file.h"
#include "chorus/formats/byte_io.h"

namespace chorus::formats {
namespace {

constexpr uint64_t kHeaderBytes = 7 * 4;
// Plausibility limits: far above any llama2.c-format model, low enough that every size product
// below fits comfortably in 64 bits.
constexpr int64_t kMaxDim = 1 << 16;
constexpr int64_t kMaxHidden = 1 << 20;
constexpr int64_t kMaxLayers = 1 << 12;
constexpr int64_t kMaxVocab = 1 << 24;
constexpr int64_t kMaxSeqLen = 1 << 24;

struct Piece {
  const char* name;
  std::vector<int64_t> shape;
  bool skip = false;  // freq_cis: present in the file, not returned
};

// The tensors of a checkpoint in file order.
std::vector<Piece> Layout(const Llama2cConfig& c, bool with_freq_cis) {
  const int64_t L = c.n_layers, d = c.dim, h = c.hidden_dim, hd = c.dim / c.n_heads;
  const int64_t q = c.n_heads * hd, kv = c.n_kv_heads * hd;
  std::vector<Piece> p = {
      {"token_embedding_table", {c.vocab_size, d}},
      {"rms_att_weight", {L, d}},
      {"wq", {L, q, d}},
      {"wk", {L, kv, d}},
      {"wv", {L, kv, d}},
      {"wo", {L, d, q}},
      {"rms_ffn_weight", {L, d}},
      {"w1", {L, h, d}},
      {"w2", {L, d, h}},
      {"w3", {L, h, d}},
      {"rms_final_weight", {d}},
  };
  if (with_freq_cis) {
    p.push_back({"freq_cis_real", {c.seq_len, hd / 2}, true});
    p.push_back({"freq_cis_imag", {c.seq_len, hd / 2}, true});
  }
  if (!c.shared_classifier) p.push_back({"wcls", {c.vocab_size, d}});
  return p;
}

uint64_t Elems(const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (int64_t s : shape) n *= static_cast<uint64_t>(s);  // bounded by the limits above
  return n;
}

uint64_t TotalBytes(const std::vector<Piece>& layout) {
  uint64_t n = kHeaderBytes;
  for (const Piece& p : layout) n += 4 * Elems(p.shape);
  return n;
}

Status ValidateConfig(const std::string& name, const Llama2cConfig& c) {
  auto bad = [&](const std::string& m) {
    return DataLossError(name + ": invalid llama2.c header: " + m);
  };
  struct Field {
    const char* name;
    int64_t value, max;
  };
  const Field fields[] = {{"dim", c.dim, kMaxDim},
                          {"hidden_dim", c.hidden_dim, kMaxHidden},
                          {"n_layers", c.n_layers, kMaxLayers},
                          {"n_heads", c.n_heads, kMaxDim},
                          {"n_kv_heads", c.n_kv_heads, kMaxDim},
                          {"vocab_size", c.vocab_size, kMaxVocab},
                          {"seq_len", c.seq_len, kMaxSeqLen}};
  for (const Field& f : fields) {
    if (f.value <= 0 || f.value > f.max) {
      return bad(std::string(f.name) + " = " + std::to_string(f.value) + " (must be in [1, " +
                 std::to_string(f.max) + "])");
    }
  }
  if (c.dim % c.n_heads != 0) {
    return bad("dim " + std::to_string(c.dim) + " is not divisible by n_heads " +
               std::to_string(c.n_heads));
  }
  if (c.n_kv_heads > c.n_heads || c.n_heads % c.n_kv_heads != 0) {
    return bad("n_heads " + std::to_string(c.n_heads) + " is not a multiple of n_kv_heads " +
               std::to_string(c.n_kv_heads));
  }
  if ((c.dim / c.n_heads) % 2 != 0) {
    return bad("head size " + std::to_string(c.dim / c.n_heads) + " is odd (RoPE needs pairs)");
  }
  return OkStatus();
}

Result<Llama2cCheckpoint> Parse(const std::string& name, std::shared_ptr<const void> keepalive,
                                const uint8_t* data, size_t size) {
  if (size < kHeaderBytes) {
    return DataLossError(name + ": file is " + std::to_string(size) +
                         " bytes, too short for a llama2.c header (28 bytes)");
  }
  int32_t h[7];
  std::memcpy(h, data, sizeof(h));
  Llama2cCheckpoint ck;
  Llama2cConfig& c = ck.config;
  c.dim = h[0];
  c.hidden_dim = h[1];
  c.n_layers = h[2];
  c.n_heads = h[3];
  c.n_kv_heads = h[4];
  c.shared_classifier = h[5] > 0;
  // INT32_MIN has no positive counterpart; it is rejected by the range check either way.
  c.vocab_size = h[5] == INT32_MIN ? 0 : (h[5] < 0 ? -h[5] : h[5]);
  c.seq_len = h[6];
  CHORUS_RETURN_IF_ERROR(ValidateConfig(name, c));

  const std::vector<Piece> with = Layout(c, true), without = Layout(c, false);
  const uint64_t size_with = TotalBytes(with), size_without = TotalBytes(without);
  const std::vector<Piece>* layout = nullptr;
  if (size == size_with) {
    layout = &with;
    c.has_freq_cis = true;
  } else if (size == size_without) {
    layout = &without;
    c.has_freq_cis = false;
  } else {
    return DataLossError(name + ": llama2.c header (dim " + std::to_string(c.dim) + ", hidden " +
                         std::to_string(c.hidden_dim) + ", " + std::to_string(c.n_layers) +
                         " layers, vocab " + std::to_string(h[5]) + ", seq_len " +
                         std::to_string(c.seq_len) + ") implies a file of " +
                         std::to_string(size_with) + " bytes (or " + std::to_string(size_without) +
                         " without freq_cis), but it is " + std::to_string(size) + " bytes");
  }
  uint64_t offset = kHeaderBytes;
  for (const Piece& p : *layout) {
    const uint64_t bytes = 4 * Elems(p.shape);
    if (!p.skip) {
      TensorView v;
      v.dtype = DType::kF32;
      v.shape = p.shape;
      v.data = data + offset;
      ck.tensors.emplace(p.name, Tensor(std::move(v), keepalive));
    }
    offset += bytes;
  }
  return ck;
}

}  // namespace

Result<Llama2cCheckpoint> ReadLlama2c(const std::string& path) {
  CHORUS_ASSIGN_OR_RETURN(std::shared_ptr<const MappedFile> mf, MappedFile::Open(path));
  const uint8_t* data = mf->data();
  const size_t size = mf->size();
  return Parse(path, std::move(mf), data, size);
}

Result<Llama2cCheckpoint> ReadLlama2cBytes(std::string name, std::string bytes) {
  auto owned = std::make_shared<const std::string>(std::move(bytes));
  const auto* data = reinterpret_cast<const uint8_t*>(owned->data());
  const size_t size = owned->size();
  return Parse(name, std::move(owned), data, size);
}

Result<std::string> SerializeLlama2c(const Llama2cCheckpoint& ckpt) {
  const Llama2cConfig& c = ckpt.config;
  CHORUS_RETURN_IF_ERROR(ValidateConfig("llama2.c checkpoint", c));
  const std::vector<Piece> layout = Layout(c, c.has_freq_cis);
  std::string out;
  out.reserve(static_cast<size_t>(TotalBytes(layout)));
  internal::ByteWriter w(&out);
  const int32_t header[7] = {c.dim,        c.hidden_dim,
                             c.n_layers,   c.n_heads,
                             c.n_kv_heads, c.shared_classifier ? c.vocab_size : -c.vocab_size,
                             c.seq_len};
  for (int32_t v : header) w.Write(v);
  const int64_t hd = c.dim / c.n_heads;
  for (const Piece& p : layout) {
    if (p.skip) {
      // freq_cis as llama2.c's exporter computes it: cos/sin(pos * theta^(-2i/hd)).
      const bool real = std::strcmp(p.name, "freq_cis_real") == 0;
      for (int64_t pos = 0; pos < c.seq_len; ++pos) {
        for (int64_t i = 0; i < hd / 2; ++i) {
          const float freq =
              1.0f / std::pow(10000.0f, static_cast<float>(2 * i) / static_cast<float>(hd));
          const float angle = static_cast<float>(pos) * freq;
          w.Write(real ? std::cos(angle) : std::sin(angle));
        }
      }
      continue;
    }
    auto it = ckpt.tensors.find(p.name);
    if (it == ckpt.tensors.end()) {
      return InvalidArgumentError("llama2.c checkpoint: tensor '" + std::string(p.name) +
                                  "' missing");
    }
    if (it->second.shape() != p.shape) {
      TensorView want;
      want.shape = p.shape;
      return InvalidArgumentError("llama2.c checkpoint: tensor '" + std::string(p.name) +
                                  "' has shape " + it->second.view().ShapeString() + ", expected " +
                                  want.ShapeString());
    }
    if (it->second.dtype() == DType::kF32) {
      w.WriteBytes(std::string_view(static_cast<const char*>(it->second.data()),
                                    static_cast<size_t>(4 * Elems(p.shape))));
    } else {
      for (float x : it->second.ToF32()) w.Write(x);
    }
  }
  return out;
}

Status WriteLlama2c(const std::string& path, const Llama2cCheckpoint& ckpt) {
  CHORUS_ASSIGN_OR_RETURN(std::string bytes, SerializeLlama2c(ckpt));
  return WriteFileAtomically(path, bytes);
}

}  // namespace chorus::formats
