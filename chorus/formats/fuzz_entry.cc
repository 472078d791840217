#include "chorus/formats/fuzz_entry.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>

#include "chorus/base/check.h"
#include "chorus/formats/gguf.h"
#include "chorus/formats/llama2c.h"
#include "chorus/formats/safetensors.h"

namespace chorus::formats {
namespace {

bool SameBytes(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  const size_t n = static_cast<size_t>(a.view().NumBytes());
  return n == 0 || std::memcmp(a.data(), b.data(), n) == 0;
}

// Decodes a tensor and folds it into a value so the work is not optimized away.
double Touch(const Tensor& t) {
  double acc = 0;
  for (float x : t.ToF32()) acc += std::isfinite(x) ? x : 1.0;
  return acc;
}

}  // namespace

bool FuzzGgufInput(const uint8_t* data, size_t size) {
  auto file =
      GgufFile::FromBytes("fuzz.gguf", std::string(reinterpret_cast<const char*>(data), size));
  if (!file.ok()) {
    CHORUS_CHECK(!file.status().message().empty());
    return false;
  }
  const GgufFile& g = **file;
  for (const auto& [key, v] : g.metadata()) {
    // Every getter either succeeds or reports a type mismatch; none may crash.
    (void)g.GetString(key);
    (void)g.GetInt(key);
    (void)g.GetFloat(key);
    (void)g.GetStringArray(key);
    (void)g.GetFloatArray(key);
    (void)g.GetIntArray(key);
    CHORUS_CHECK(g.Has(key));
  }
  bool all_supported = true;
  double acc = 0;
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const GgufTensorInfo& info : g.tensors()) {
    auto t = g.GetTensor(info.name);
    if (!t.ok()) {
      CHORUS_CHECK(t.status().code() == StatusCode::kUnimplemented) << t.status().ToString();
      all_supported = false;
      continue;
    }
    CHORUS_CHECK_EQ(static_cast<uint64_t>(t->view().NumBytes()), info.n_bytes);
    acc += Touch(*t);
    tensors.emplace_back(info.name, *std::move(t));
  }
  (void)acc;
  if (!all_supported) return true;

  // Round trip: what was read must write and read back identically.
  GgufWriter w;
  for (const auto& [key, v] : g.metadata()) w.Set(key, v);
  for (const auto& [name, t] : tensors) w.AddTensor(name, t);
  auto bytes = w.Serialize();
  CHORUS_CHECK(bytes.ok()) << bytes.status().ToString();
  auto back = GgufFile::FromBytes("fuzz-rt.gguf", *std::move(bytes));
  CHORUS_CHECK(back.ok()) << back.status().ToString();
  CHORUS_CHECK_EQ((*back)->metadata().size(), g.metadata().size());
  for (const auto& [key, v] : g.metadata()) {
    CHORUS_CHECK((*back)->metadata().at(key) == v) << "metadata '" << key << "' changed";
  }
  CHORUS_CHECK_EQ((*back)->tensors().size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    auto t2 = (*back)->GetTensor(name);
    CHORUS_CHECK(t2.ok() && SameBytes(t, *t2)) << "tensor '" << name << "' changed";
  }
  return true;
}

bool FuzzSafetensorsInput(const uint8_t* data, size_t size) {
  auto file = SafetensorsFile::FromBytes("fuzz.safetensors",
                                         std::string(reinterpret_cast<const char*>(data), size));
  if (!file.ok()) {
    CHORUS_CHECK(!file.status().message().empty());
    return false;
  }
  const SafetensorsFile& f = **file;
  bool round_trippable = true;
  double acc = 0;
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const SafetensorsTensorInfo& info : f.tensors()) {
    CHORUS_CHECK(f.Has(info.name));
    auto t = f.GetTensor(info.name);
    if (!t.ok()) {
      CHORUS_CHECK(t.status().code() == StatusCode::kUnimplemented) << t.status().ToString();
      round_trippable = false;
      continue;
    }
    CHORUS_CHECK_EQ(static_cast<uint64_t>(t->view().NumBytes()), info.end - info.begin);
    acc += Touch(*t);
    // The writer refuses empty names (the reader tolerates them).
    if (info.name.empty()) round_trippable = false;
    tensors.emplace_back(info.name, *std::move(t));
  }
  (void)acc;
  if (!round_trippable) return true;

  auto bytes = SerializeSafetensors(tensors, f.metadata());
  CHORUS_CHECK(bytes.ok()) << bytes.status().ToString();
  auto back = SafetensorsFile::FromBytes("fuzz-rt.safetensors", *std::move(bytes));
  CHORUS_CHECK(back.ok()) << back.status().ToString();
  CHORUS_CHECK((*back)->metadata() == f.metadata());
  CHORUS_CHECK_EQ((*back)->tensors().size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    auto t2 = (*back)->GetTensor(name);
    CHORUS_CHECK(t2.ok() && SameBytes(t, *t2)) << "tensor '" << name << "' changed";
  }
  return true;
}

bool FuzzLlama2cInput(const uint8_t* data, size_t size) {
  auto ck = ReadLlama2cBytes("fuzz.bin", std::string(reinterpret_cast<const char*>(data), size));
  if (!ck.ok()) {
    CHORUS_CHECK(!ck.status().message().empty());
    return false;
  }
  CHORUS_CHECK_EQ(ck->tensors.size(), ck->config.shared_classifier ? 11u : 12u);
  double acc = 0;
  for (const auto& [name, t] : ck->tensors) acc += Touch(t);
  (void)acc;
  auto bytes = SerializeLlama2c(*ck);
  CHORUS_CHECK(bytes.ok()) << bytes.status().ToString();
  auto back = ReadLlama2cBytes("fuzz-rt.bin", *std::move(bytes));
  CHORUS_CHECK(back.ok()) << back.status().ToString();
  CHORUS_CHECK_EQ(back->tensors.size(), ck->tensors.size());
  for (const auto& [name, t] : ck->tensors) {
    CHORUS_CHECK(SameBytes(t, back->tensors.at(name))) << "tensor '" << name << "' changed";
  }
  return true;
}

std::vector<std::string> GgufFuzzSeeds() {
  std::vector<std::string> seeds;
  {
    GgufWriter w;
    w.SetString("general.architecture", "llama");
    w.Set("u8", GgufValue::Uint(GgufType::kUint8, 7));
    w.Set("i8", GgufValue::Int(GgufType::kInt8, -7));
    w.Set("u16", GgufValue::Uint(GgufType::kUint16, 700));
    w.Set("i16", GgufValue::Int(GgufType::kInt16, -700));
    w.SetUint32("u32", 70000);
    w.SetInt32("i32", -70000);
    w.SetFloat32("f32", 0.5f);
    w.SetBool("b", true);
    w.Set("u64", GgufValue::Uint(GgufType::kUint64, 1ull << 40));
    w.Set("i64", GgufValue::Int(GgufType::kInt64, -(1ll << 40)));
    w.Set("f64", GgufValue::Float(GgufType::kFloat64, 0.25));
    w.SetStringArray("tokenizer.ggml.tokens", {"<unk>", "<s>", "a"});
    w.SetFloat32Array("tokenizer.ggml.scores", {0, 0, -1});
    w.SetInt32Array("tokenizer.ggml.token_type", {2, 3, 1});
    w.Set("a_u8", GgufValue::IntArray(GgufType::kUint8, {1, 2}));
    w.Set("a_bool", GgufValue::IntArray(GgufType::kBool, {0, 1}));
    w.Set("a_f64", GgufValue::FloatArray(GgufType::kFloat64, {1.0}));
    std::vector<float> v(64);
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i) / 8 - 4;
    w.AddTensor("f32",
                Tensor::FromF32(std::vector<float>(v.begin(), v.begin() + 6), DType::kF32, {2, 3}));
    w.AddTensor("f16",
                Tensor::FromF32(std::vector<float>(v.begin(), v.begin() + 4), DType::kF16, {4}));
    w.AddTensor("bf16", Tensor::FromF32(std::vector<float>(v.begin(), v.begin() + 8), DType::kBF16,
                                        {2, 2, 2}));
    w.AddTensor("q8_0", Tensor::FromF32(v, DType::kQ8_0, {2, 32}));
    w.AddTensor("q4_0", Tensor::FromF32(v, DType::kQ4_0, {1, 1, 2, 32}));
    w.AddTensor("i32", Tensor::Zeros(DType::kI32, {2}));
    w.AddTensor("i8", Tensor::Zeros(DType::kI8, {3}));
    seeds.push_back(*w.Serialize());
  }
  {
    GgufWriter w;  // K-quant tensors, one per type (their decoders get the mutated bytes)
    w.SetString("general.architecture", "llama");
    std::vector<float> v(512);
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % 37) / 9 - 2;
    for (DType t : {DType::kQ2_K, DType::kQ3_K, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K}) {
      w.AddTensor(std::string(DTypeName(t)), Tensor::FromF32(v, t, {2, 256}));
    }
    seeds.push_back(*w.Serialize());
  }
  {
    GgufWriter w;  // vocab-only, like llama.cpp's ggml-vocab files
    w.SetString("tokenizer.ggml.model", "gpt2");
    w.SetStringArray("tokenizer.ggml.merges", {"a b", "ab c"});
    seeds.push_back(*w.Serialize());
  }
  {
    GgufWriter w;  // unusual alignment
    w.SetUint32("general.alignment", 4);
    w.AddTensor("x", Tensor::FromF32({1, 2, 3}, DType::kF32, {3}));
    w.AddTensor("y", Tensor::FromF32({1}, DType::kF16, {1}));
    seeds.push_back(*w.Serialize());
  }
  return seeds;
}

std::vector<std::string> SafetensorsFuzzSeeds() {
  std::vector<std::string> seeds;
  std::vector<std::pair<std::string, Tensor>> ts;
  ts.emplace_back("w.f32", Tensor::FromF32({1, 2, 3, 4, 5, 6}, DType::kF32, {2, 3}));
  ts.emplace_back("w.f16", Tensor::FromF32({1, -2}, DType::kF16, {2}));
  ts.emplace_back("w.bf16", Tensor::FromF32({0.5f, 8, 9, 10}, DType::kBF16, {2, 1, 2}));
  ts.emplace_back("w.i8", Tensor::Zeros(DType::kI8, {2}));
  ts.emplace_back("w.u8", Tensor::Zeros(DType::kU8, {1}));
  ts.emplace_back("w.i32", Tensor::Zeros(DType::kI32, {1}));
  seeds.push_back(*SerializeSafetensors(ts, {{"format", "pt"}}));
  seeds.push_back(*SerializeSafetensors({}));
  seeds.push_back(
      *SerializeSafetensors({{"base_model.model.layers.0.q_proj.lora_A.weight",
                              Tensor::FromF32({1, 2, 3, 4, 5, 6, 7, 8}, DType::kF32, {2, 4})},
                             {"base_model.model.layers.0.q_proj.lora_B.weight",
                              Tensor::FromF32({1, 2, 3, 4, 5, 6, 7, 8}, DType::kF32, {4, 2})}}));
  return seeds;
}

std::vector<std::string> Llama2cFuzzSeeds() {
  std::vector<std::string> seeds;
  for (bool shared : {true, false}) {
    Llama2cCheckpoint ck;
    ck.config = {/*dim=*/8,        /*hidden_dim=*/12, /*n_layers=*/1, /*n_heads=*/2,
                 /*n_kv_heads=*/1, /*vocab_size=*/5,  /*seq_len=*/4,  shared,        true};
    auto make = [](std::vector<int64_t> shape) {
      int64_t n = 1;
      for (int64_t s : shape) n *= s;
      std::vector<float> v(static_cast<size_t>(n));
      for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % 7) - 3;
      return Tensor::FromF32(v, DType::kF32, std::move(shape));
    };
    ck.tensors["token_embedding_table"] = make({5, 8});
    ck.tensors["rms_att_weight"] = make({1, 8});
    ck.tensors["wq"] = make({1, 8, 8});
    ck.tensors["wk"] = make({1, 4, 8});
    ck.tensors["wv"] = make({1, 4, 8});
    ck.tensors["wo"] = make({1, 8, 8});
    ck.tensors["rms_ffn_weight"] = make({1, 8});
    ck.tensors["w1"] = make({1, 12, 8});
    ck.tensors["w2"] = make({1, 8, 12});
    ck.tensors["w3"] = make({1, 12, 8});
    ck.tensors["rms_final_weight"] = make({8});
    if (!shared) ck.tensors["wcls"] = make({5, 8});
    seeds.push_back(*SerializeLlama2c(ck));
  }
  return seeds;
}

std::string MutateForFuzz(const std::string& input, const std::vector<std::string>& seeds,
                          std::mt19937_64& rng) {
  std::string s = input;
  auto below = [&](size_t n) { return n == 0 ? size_t{0} : static_cast<size_t>(rng() % n); };
  const int n_edits = 1 + static_cast<int>(below(4));
  for (int e = 0; e < n_edits; ++e) {
    const uint64_t sz = s.size();
    const uint64_t interesting[] = {
        0,          1,          2,          3,          4,          8,
        9,          12,         13,         31,         32,         64,
        255,        256,        65535,      0x7fffffff, 0x80000000, 0xffffffff,
        1ull << 32, 1ull << 40, 1ull << 62, 1ull << 63, UINT64_MAX, UINT64_MAX - 7,
        sz,         sz + 1,     sz - 1,     sz - 8};
    switch (below(10)) {
      case 0:  // bit flips
        for (size_t k = 1 + below(8); k > 0 && !s.empty(); --k) {
          s[below(s.size())] ^= static_cast<char>(1u << below(8));
        }
        break;
      case 1: {  // interesting byte
        const char bytes[] = {0, 1, 0x7f, static_cast<char>(0x80), static_cast<char>(0xff)};
        if (!s.empty()) s[below(s.size())] = bytes[below(sizeof(bytes))];
        break;
      }
      case 2:  // interesting u32 / u64 at a 4-aligned position (header fields are aligned)
      case 3: {
        const size_t width = below(2) ? 8 : 4;
        if (s.size() < width) break;
        const size_t pos = below((s.size() - width) / 4 + 1) * 4;
        const uint64_t v = interesting[below(sizeof(interesting) / sizeof(interesting[0]))];
        std::memcpy(s.data() + pos, &v, width);
        break;
      }
      case 4:  // truncate
        s.resize(below(s.size() + 1));
        break;
      case 5: {  // insert random bytes
        std::string ins(1 + below(16), '\0');
        for (char& c : ins) c = static_cast<char>(rng());
        s.insert(below(s.size() + 1), ins);
        break;
      }
      case 6: {  // delete a range
        if (s.empty()) break;
        const size_t pos = below(s.size());
        s.erase(pos, 1 + below(std::min<size_t>(64, s.size() - pos)));
        break;
      }
      case 7: {  // duplicate a range elsewhere
        if (s.empty()) break;
        const size_t pos = below(s.size());
        const std::string chunk = s.substr(pos, 1 + below(64));
        s.insert(below(s.size() + 1), chunk);
        break;
      }
      case 8: {  // splice with a seed
        if (seeds.empty()) break;
        const std::string& other = seeds[below(seeds.size())];
        s = s.substr(0, below(s.size() + 1)) + other.substr(below(other.size() + 1));
        break;
      }
      case 9: {  // text edits: digits and JSON punctuation
        if (s.empty()) break;
        const char text[] = "0123456789-.e{}[]\":, ";
        const size_t pos = below(s.size());
        if (s[pos] >= '0' && s[pos] <= '9') {
          s[pos] = static_cast<char>('0' + below(10));
          if (below(2)) s.insert(pos, 1, static_cast<char>('0' + below(10)));
        } else {
          s[pos] = text[below(sizeof(text) - 1)];
        }
        break;
      }
    }
  }
  return s;
}

FuzzRunStats RunMutationFuzz(FuzzTarget target, const std::vector<std::string>& seeds,
                             int64_t iterations, uint64_t rng_seed) {
  FuzzRunStats stats;
  auto run = [&](const std::string& in) {
    ++stats.runs;
    const bool ok = target(reinterpret_cast<const uint8_t*>(in.data()), in.size());
    stats.parsed += ok;
    return ok;
  };
  for (const std::string& s : seeds) stats.seeds_parsed += run(s);
  if (seeds.empty()) return stats;
  std::mt19937_64 rng(rng_seed);
  std::vector<std::string> pool;
  constexpr size_t kPool = 64;
  for (int64_t i = 0; i < iterations; ++i) {
    const bool from_pool = !pool.empty() && rng() % 4 == 0;
    const std::string& base = from_pool ? pool[rng() % pool.size()] : seeds[rng() % seeds.size()];
    std::string mutant = MutateForFuzz(base, seeds, rng);
    if (run(mutant)) {
      if (pool.size() < kPool) {
        pool.push_back(std::move(mutant));
      } else {
        pool[rng() % kPool] = std::move(mutant);
      }
    }
  }
  return stats;
}

}  // namespace chorus::formats
