// The LoRA adapter file fuzzers' bodies (lora_fuzz.h): the input becomes real files in a private
// temporary directory, so the fuzzer reaches the readers exactly as `chorus serve` and the
// registry call them (directory checks, config size limit, memory-mapped safetensors / GGUF).
#include "chorus/adapters/lora/lora_fuzz.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string_view>

#include "chorus/adapters/lora/lora_adapter.h"
#include "chorus/adapters/lora/lora_files.h"
#include "chorus/base/check.h"
#include "chorus/base/mapped_file.h"
#include "chorus/formats/safetensors.h"
#include "chorus/model/synthetic.h"

namespace chorus::adapters {
namespace {

namespace fs = std::filesystem;
using model::Linear;

// A private directory for this process's files (removed at exit).
const std::string& ScratchDir() {
  static const std::string dir = [] {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/chorus_lora_fuzz_XXXXXX";
    CHORUS_CHECK(::mkdtemp(pattern.data()) != nullptr);
    static const std::string keep = pattern;
    std::atexit([] {
      std::error_code ec;
      fs::remove_all(keep, ec);
    });
    return pattern;
  }();
  return dir;
}

void WriteBytes(const std::string& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  CHORUS_CHECK(static_cast<bool>(out));
}

const model::ModelConfig& Base(std::string_view hint) {
  static const model::ModelConfig llama = *model::SyntheticConfig("stories260k");
  static const model::ModelConfig qwen3 = *model::SyntheticConfig("qwen3-tiny");
  static const model::ModelConfig phi3 = *model::SyntheticConfig("phi3-tiny");
  if (hint.find("phi3") != std::string_view::npos) return phi3;
  if (hint.find("qwen3") != std::string_view::npos) return qwen3;
  return llama;
}

// The rank limit the fuzzers load with: small, so a hostile rank is refused early and large
// shapes never allocate much.
LoraLoadOptions FuzzOptions() {
  LoraLoadOptions o;
  o.limits.max_rank = 16;
  return o;
}

// Reads `path` (a PEFT directory or a GGUF LoRA) against `base` through every entry point.
bool ReadEverywhere(const std::string& path, const model::ModelConfig& base) {
  const LoraLoadOptions opts = FuzzOptions();
  Result<LoraWeights> w = ReadLora(path, base, opts);
  Result<LoraFileInfo> info = InspectLoraFile(path);
  if (!w.ok()) {
    // Errors are values naming the file; never an internal error.
    CHORUS_CHECK(w.status().code() != StatusCode::kInternal);
    CHORUS_CHECK(w.status().message().find(path) != std::string::npos);
    return false;
  }
  // A file the reader accepted against a base is one inspection (which needs no base) accepts.
  CHORUS_CHECK(info.ok());
  CHORUS_CHECK(!info->modules.empty());
  auto ad = LoraAdapter::Build(*w, base, "fuzz", opts.limits);
  // Shapes, ranks and dtypes were validated by the reader; only the values (NaN / Inf) may
  // still be refused.
  if (!ad.ok()) {
    CHORUS_CHECK(ad.status().code() == StatusCode::kInvalidArgument);
    CHORUS_CHECK(ad.status().message().find("finite") != std::string::npos);
    return true;
  }
  CHORUS_CHECK((*ad)->n_layers() == base.n_layers);
  CHORUS_CHECK((*ad)->max_rank() >= 1 && (*ad)->max_rank() <= opts.limits.max_rank);
  return true;
}

// A safetensors file with no tensors: the adapter directory of a config-only input.
constexpr std::string_view kEmptySafetensors("\x02\x00\x00\x00\x00\x00\x00\x00{}", 10);

std::string ReadAll(const std::string& path) {
  auto bytes = ReadFileToString(path);
  CHORUS_CHECK(bytes.ok());
  return std::move(*bytes);
}

}  // namespace

bool FuzzPeftLoraInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t nul = in.find('\0');
  const std::string_view config = in.substr(0, nul);
  const std::string_view st =
      nul == std::string_view::npos ? kEmptySafetensors : in.substr(nul + 1);
  const std::string dir = ScratchDir() + "/peft";
  std::error_code ec;
  fs::create_directories(dir, ec);
  WriteBytes(dir + "/adapter_config.json", config);
  WriteBytes(dir + "/adapter_model.safetensors", st);
  // The base named by base_model_name_or_path (a plain search: the config may not parse).
  std::string_view hint;
  if (size_t p = config.find("base_model_name_or_path"); p != std::string_view::npos) {
    hint = config.substr(p, 64);
  }
  return ReadEverywhere(dir, Base(hint));
}

bool FuzzGgufLoraInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const std::string path = ScratchDir() + "/adapter.gguf";
  WriteBytes(path, in);
  // The architecture string sits in the metadata; a plain search picks the base.
  std::string_view hint;
  if (size_t p = in.find("general.architecture"); p != std::string_view::npos) {
    hint = in.substr(p, 48);
  }
  return ReadEverywhere(path, Base(hint));
}

namespace {

struct SeedSpec {
  const char* base;
  RandomLoraSpec lora;
  int64_t layers;  // adapter modules kept in layers [0, layers) (smaller seeds)
  DType dtype;
  int64_t other_rank = 0;  // when > 0: layer 0's modules get this rank (rank_pattern)
  float other_alpha = 0;   // when > 0: layer 0's modules get this alpha (alpha_pattern)
};

LoraWeights SeedWeights(const SeedSpec& s, const model::ModelConfig& base) {
  LoraWeights w = MakeRandomLora(base, s.lora);
  if (s.other_rank > 0) {
    RandomLoraSpec o = s.lora;
    o.rank = s.other_rank;
    o.seed += 7;
    const LoraWeights w2 = MakeRandomLora(base, o);
    for (int li = 0; li < model::kNumLinears; ++li)
      w.at(0, static_cast<Linear>(li)) = w2.at(0, static_cast<Linear>(li));
  }
  if (s.other_alpha > 0) {
    for (int li = 0; li < model::kNumLinears; ++li) {
      if (w.at(0, static_cast<Linear>(li)).present())
        w.at(0, static_cast<Linear>(li)).alpha = s.other_alpha;
    }
  }
  for (int64_t l = s.layers; l < w.n_layers; ++l)
    for (int li = 0; li < model::kNumLinears; ++li) w.at(l, static_cast<Linear>(li)) = {};
  return w;
}

const SeedSpec kSeedSpecs[] = {
    {"stories260k", {.rank = 2, .alpha = 4, .targets = {Linear::kQ, Linear::kV}}, 2, DType::kF32},
    {"stories260k", {.rank = 4, .alpha = 8}, 1, DType::kBF16},
    {"stories260k",
     {.rank = 2, .alpha = 16, .use_rslora = true, .targets = {Linear::kK, Linear::kO}},
     2,
     DType::kF16},
    {"stories260k",
     {.rank = 2, .alpha = 2, .targets = {Linear::kGate, Linear::kUp, Linear::kDown}},
     2,
     DType::kF32,
     /*other_rank=*/3,
     /*other_alpha=*/5},
    {"qwen3-tiny", {.rank = 2, .alpha = 4, .targets = {Linear::kQ, Linear::kK}}, 2, DType::kF32},
    {"phi3-tiny", {.rank = 2, .alpha = 4, .targets = {Linear::kQ, Linear::kO}}, 1, DType::kBF16},
};

// Writes with `write` into a fresh scratch path and returns what it wrote.
template <typename Fn>
std::string Written(const std::string& path, Fn write) {
  std::error_code ec;
  fs::remove_all(path, ec);
  const Status s = write(path);
  CHORUS_CHECK(s.ok()) << s.ToString();
  return fs::is_directory(path) ? std::string() : ReadAll(path);
}

}  // namespace

std::vector<std::string> PeftLoraFuzzSeeds() {
  std::vector<std::string> seeds;
  const std::string dir = ScratchDir() + "/seed_peft";
  for (const SeedSpec& s : kSeedSpecs) {
    const model::ModelConfig& base = Base(s.base);
    const LoraWeights w = SeedWeights(s, base);
    Written(dir, [&](const std::string& d) {
      return WritePeftLora(d, w, base, {.dtype = s.dtype, .base_model_name = s.base});
    });
    seeds.push_back(ReadAll(dir + "/adapter_config.json") + std::string(1, '\0') +
                    ReadAll(dir + "/adapter_model.safetensors"));
  }
  // Phi-3's fused modules as PEFT names them (qkv_proj, gate_up_proj): one shared lora_A, lora_B
  // of the fused height.
  {
    const model::ModelConfig& base = Base("phi3");
    const int64_t r = 2, d = base.n_embd;
    const int64_t qkv = model::LinearOut(base, Linear::kQ) + model::LinearOut(base, Linear::kK) +
                        model::LinearOut(base, Linear::kV);
    const int64_t gate_up =
        model::LinearOut(base, Linear::kGate) + model::LinearOut(base, Linear::kUp);
    auto filled = [](std::vector<int64_t> shape, float v) {
      std::vector<float> f(static_cast<size_t>(shape[0] * shape[1]));
      for (size_t i = 0; i < f.size(); ++i)
        f[i] = v * static_cast<float>(static_cast<int>(i % 7) - 3);
      return Tensor::FromF32(f, DType::kF32, std::move(shape));
    };
    const std::string p = "base_model.model.model.layers.1.";
    std::vector<std::pair<std::string, Tensor>> tensors;
    tensors.emplace_back(p + "self_attn.qkv_proj.lora_A.weight", filled({r, d}, 0.01f));
    tensors.emplace_back(p + "self_attn.qkv_proj.lora_B.weight", filled({qkv, r}, 0.02f));
    tensors.emplace_back(p + "mlp.gate_up_proj.lora_A.weight", filled({r, d}, 0.03f));
    tensors.emplace_back(p + "mlp.gate_up_proj.lora_B.weight", filled({gate_up, r}, 0.04f));
    nlohmann::ordered_json cfg = {{"peft_type", "LORA"},
                                  {"base_model_name_or_path", "phi3-tiny"},
                                  {"r", r},
                                  {"lora_alpha", 8},
                                  {"target_modules", {"qkv_proj", "gate_up_proj"}}};
    seeds.push_back(cfg.dump() + std::string(1, '\0') + *formats::SerializeSafetensors(tensors));
  }
  // Configs alone (a config-only input gets an empty safetensors file): every key the parser
  // reads, and values it refuses.
  for (
      const char* cfg : {
          R"({"peft_type": "LORA", "r": 8, "lora_alpha": 16, "use_rslora": false, "bias": "none",
               "target_modules": ["q_proj", "v_proj"], "rank_pattern": {"q_proj": 4},
               "alpha_pattern": {"model.layers.0.self_attn.v_proj": 2.5},
               "modules_to_save": null, "fan_in_fan_out": false, "use_dora": false,
               "base_model_name_or_path": "stories260k"})",
          R"({"peft_type": "LORA", "r": 8, "target_modules": ["lm_head"], "layer_replication": null})",
          R"({"peft_type": "LORA", "use_dora": true, "lora_bias": true})",
          R"({"peft_type": "PREFIX_TUNING", "modules_to_save": ["embed_tokens"]})",
          R"({"rank_pattern": {"layers.*q_proj": 2}, "bias": "all"})",
      }) {
    seeds.emplace_back(cfg);
  }
  return seeds;
}

std::vector<std::string> GgufLoraFuzzSeeds() {
  std::vector<std::string> seeds;
  const std::string path = ScratchDir() + "/seed.gguf";
  for (const SeedSpec& s : kSeedSpecs) {
    if (std::string_view(s.base) == "phi3-tiny") continue;  // the writer refuses fused bases
    if (s.lora.use_rslora || s.other_rank > 0 || s.other_alpha > 0) continue;  // one alpha only
    const model::ModelConfig& base = Base(s.base);
    const LoraWeights w = SeedWeights(s, base);
    seeds.push_back(Written(
        path, [&](const std::string& p) { return WriteGgufLora(p, w, base, {.dtype = s.dtype}); }));
    // q8_0 lora_a needs inputs of whole 32-value blocks (not the 172-wide down_proj of
    // stories260k): a seed wherever the writer can make one.
    if (WriteGgufLora(path, w, base, {.dtype = DType::kQ8_0}).ok()) seeds.push_back(ReadAll(path));
  }
  return seeds;
}

}  // namespace chorus::adapters
