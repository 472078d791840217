#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <optional>

#include "apps/chorus/commands.h"
#include "apps/chorus/common.h"
#include "chorus/adapters/lora/lora_files.h"
#include "chorus/base/mapped_file.h"
#include "chorus/compress/compress.h"
#include "chorus/formats/gguf.h"
#include "chorus/model/convert.h"
#include "chorus/model/loader.h"
#include "chorus/model/synthetic.h"
#include "chorus/tokenizer/export.h"

namespace chorus::apps {
namespace {

std::string ShapeList() {
  std::string s;
  for (const auto& n : model::SyntheticShapeNames()) s += (s.empty() ? "" : ", ") + n;
  return s;
}

// A tokenizer ready to be written: checked against the model's vocabulary and already exported
// once (so an unexportable tokenizer is reported before any weights are written).
struct TokenizerOut {
  std::shared_ptr<const tokenizer::Tokenizer> tok;
  tokenizer::GgufExportOptions gguf_opts;
  tokenizer::HfTokenizerFiles hf;  // filled for HF output
};

Status PrepareTokenizer(std::shared_ptr<const tokenizer::Tokenizer> tok, int64_t model_vocab,
                        bool gguf_out, TokenizerOut* out) {
  if (tok->vocab_size() > model_vocab) {
    return InvalidArgumentError("the tokenizer has " + std::to_string(tok->vocab_size()) +
                                " tokens but the model's vocabulary has only " +
                                std::to_string(model_vocab));
  }
  // Token list padded to the embedding rows, as llama.cpp's converter does.
  out->gguf_opts.pad_to_vocab_size = model_vocab;
  if (gguf_out) {
    formats::GgufWriter probe;
    CHORUS_RETURN_IF_ERROR(tokenizer::ExportToGguf(*tok, &probe, out->gguf_opts));
  } else {
    CHORUS_ASSIGN_OR_RETURN(out->hf, tokenizer::ExportToHfFiles(*tok));
  }
  out->tok = std::move(tok);
  return OkStatus();
}

Result<std::vector<int64_t>> ParseRanks(const std::string& s) {
  std::vector<int64_t> out;
  size_t pos = 0;
  while (pos <= s.size()) {
    const size_t end = std::min(s.find(',', pos), s.size());
    const std::string item = s.substr(pos, end - pos);
    char* e = nullptr;
    const long long v = std::strtoll(item.c_str(), &e, 10);
    if (item.empty() || *e || v < 1 || v > 256)
      return InvalidArgumentError("bad LoRA rank '" + item.substr(0, 16) + "' (1..256)");
    out.push_back(v);
    pos = end + 1;
  }
  return out;
}

Result<std::vector<model::Linear>> ParseTargets(const std::string& s) {
  static const std::pair<const char*, model::Linear> kNames[] = {
      {"q", model::Linear::kQ},      {"k", model::Linear::kK},       {"v", model::Linear::kV},
      {"o", model::Linear::kO},      {"gate", model::Linear::kGate}, {"up", model::Linear::kUp},
      {"down", model::Linear::kDown}};
  std::vector<model::Linear> out;
  size_t pos = 0;
  while (pos <= s.size()) {
    const size_t end = std::min(s.find(',', pos), s.size());
    std::string item = s.substr(pos, end - pos);
    if (item.size() > 5 && item.compare(item.size() - 5, 5, "_proj") == 0)
      item.resize(item.size() - 5);
    bool found = false;
    for (const auto& [n, w] : kNames) {
      if (item == n) {
        out.push_back(w);
        found = true;
      }
    }
    if (!found)
      return InvalidArgumentError("unknown LoRA target '" + item.substr(0, 16) +
                                  "' (q, k, v, o, gate, up, down)");
    pos = end + 1;
  }
  return out;
}

// `chorus convert --lora-count N`: a directory of N synthetic PEFT adapters for the base.
int WriteLoraSet(const Flags& f, const model::ModelConfig& base, const std::string& base_name) {
  adapters::SyntheticLoraSetOptions o;
  o.count = f.GetInt("lora-count");
  o.distinct = f.GetInt("lora-distinct");
  o.seed = static_cast<uint64_t>(f.GetInt("seed")) * 1000003u;
  o.prefix = f.GetString("lora-prefix");
  o.base_model_name = base_name;
  auto ranks = ParseRanks(f.GetString("lora-ranks"));
  if (!ranks.ok()) return Fail("convert", ranks.status());
  o.ranks = *ranks;
  auto targets = ParseTargets(f.GetString("lora-targets"));
  if (!targets.ok()) return Fail("convert", targets.status());
  o.targets = *targets;
  auto d = ParseDType(f.IsSet("dtype") ? f.GetString("dtype") : "bf16");
  if (!d.ok()) return Fail("convert", d.status());
  o.dtype = *d;
  if (o.count < 1 || o.count > 1000000)
    return Fail("convert", InvalidArgumentError("--lora-count must be in [1, 1000000]"));
  const int64_t distinct = o.distinct == 0 ? o.count : std::min(o.distinct, o.count);
  std::fprintf(
      stderr, "chorus convert: writing %lld PEFT adapters (%lld distinct weight files, %s) to %s\n",
      static_cast<long long>(o.count), static_cast<long long>(distinct),
      std::string(DTypeName(o.dtype)).c_str(), f.GetString("output").c_str());
  auto bytes = adapters::WriteSyntheticLoraSet(f.GetString("output"), base, o, [&](int64_t i) {
    if ((i + 1) % 100 == 0 || i + 1 == o.count) {
      std::fprintf(stderr, "\r  %lld / %lld", static_cast<long long>(i + 1),
                   static_cast<long long>(o.count));
    }
  });
  std::fprintf(stderr, "\n");
  if (!bytes.ok()) return Fail("convert", bytes.status());
  std::fprintf(stderr, "chorus convert: wrote %.1f MiB of adapter files (hard links not counted)\n",
               static_cast<double>(*bytes) / (1 << 20));
  return 0;
}

}  // namespace

int ConvertCommand(int argc, char** argv) {
  Flags f(
      "convert",
      "Writes a model as GGUF (f32/f16/bf16/q8_0/q4_0, the K types q3_k/q4_k/q5_k and llama.cpp's\n"
      "K-quant mixes q2_k/q3_k_m/q4_k_s/q4_k_m/q5_k_s/q5_k_m/q6_k) or a Hugging Face directory "
      "(f32/f16/bf16).\n"
      "Either --model PATH (any loadable model) or --shape NAME (seeded random weights at a real\n"
      "shape: " +
          ShapeList() + ").");
  f.String("model", "", "source model: GGUF file, Hugging Face directory or llama2.c .bin");
  f.String("shape", "", "synthetic shape instead of --model");
  f.Int("seed", 1, "seed of the synthetic weights");
  f.String("dtype", "",
           "dtype of the matrices, or a K-quant mix (q4_k_m, ...: a type per tensor as llama.cpp\n"
           "chooses it, docs/kernels.md) (default: keep the source's where the target allows)");
  f.String("format", "gguf", "output format: gguf or hf");
  f.String("max-shard-size", "5GB",
           "hf: split weights larger than this into model-0000i-of-0000N.safetensors shards + "
           "model.safetensors.index.json, as transformers' save_pretrained does (5GB, 500MB, "
           "2GiB or bytes)");
  f.String("output", "", "output file (gguf) or directory (hf)");
  f.String("tokenizer", "",
           "tokenizer file or directory to embed (default: the model's own, found as `chorus "
           "generate` finds it);\n"
           "its vocabulary must not be larger than the model's");
  f.Int("lora-count", 0,
        "instead of a model, write this many synthetic PEFT LoRA adapters for the base (--shape or "
        "--model)\n"
        "into the --output directory (<prefix>NNNN/adapter_config.json + "
        "adapter_model.safetensors);\n"
        "--dtype f32/f16/bf16 (default bf16)");
  f.String("lora-ranks", "8,16,32,64",
           "ranks of those adapters, round-robin (adapter i has ranks[i % len])");
  f.String("lora-targets", "q,k,v,o", "target modules: any of q,k,v,o,gate,up,down");
  f.Int(
      "lora-distinct", 0,
      "write only this many distinct weight files; the other adapters hard-link them (0 = all "
      "distinct;\n"
      "a multiple of the number of ranks). Each directory is still a separate adapter to register");
  f.String("lora-prefix", "lora-", "adapter directory name prefix");
  f.String(
      "finetune-delta", "",
      "LO:HI — write a synthetic full fine-tune of the model instead: every linear matrix plus\n"
      "Gaussian noise of relative norm uniform in [LO, HI] per matrix (e.g. 0.02:0.06), seeded by "
      "--seed");
  if (int rc = ParseOrExit(f, argc, argv); rc >= 0) return rc;
  if (f.GetString("output").empty())
    return Fail("convert", InvalidArgumentError("--output is required"));
  if (f.IsSet("model") == f.IsSet("shape")) {
    return Fail("convert", InvalidArgumentError("give exactly one of --model and --shape"));
  }
  if (f.IsSet("lora-count")) {
    if (f.IsSet("shape")) {
      auto cfg = model::SyntheticConfig(f.GetString("shape"));
      if (!cfg.ok()) return Fail("convert", cfg.status());
      return WriteLoraSet(f, *cfg, "chorus-synthetic/" + f.GetString("shape"));
    }
    auto m = model::LoadModel(f.GetString("model"));
    if (!m.ok()) return Fail("convert", m.status());
    return WriteLoraSet(f, (*m)->config(), f.GetString("model"));
  }
  model::ConvertOptions opts;
  opts.output = f.GetString("output");
  const std::string fmt = f.GetString("format");
  if (fmt == "gguf")
    opts.format = model::OutputFormat::kGguf;
  else if (fmt == "hf")
    opts.format = model::OutputFormat::kHfDirectory;
  else
    return Fail("convert", InvalidArgumentError("--format must be gguf or hf, not '" +
                                                fmt.substr(0, 32) + "'"));
  {
    auto shard = model::ParseShardSize(f.GetString("max-shard-size"));
    if (!shard.ok()) return Fail("convert", shard.status().WithContext("flag --max-shard-size"));
    opts.max_shard_bytes = *shard;
  }
  if (f.IsSet("dtype")) {
    auto d = model::QuantScheme::Parse(f.GetString("dtype"));
    if (!d.ok()) return Fail("convert", d.status());
    opts.dtype = d->base();
    if (d->is_mix()) opts.mix = *d;
  }

  const bool explicit_tok = f.IsSet("tokenizer");
  const bool gguf_out = opts.format == model::OutputFormat::kGguf;
  TokenizerOut tok_out;
  // The model as its file holds it: read, not loaded — converting needs the tensors, not a copy
  // prepared for the kernels (a 2.2 GB bf16 TinyLlama-shape file took 8.5 GB that way).
  std::optional<model::ModelFile> mdl;
  if (f.IsSet("shape")) {
    model::SyntheticSpec spec{.shape = f.GetString("shape"),
                              .dtype = opts.dtype.value_or(DType::kF32),
                              .seed = static_cast<uint64_t>(f.GetInt("seed")),
                              .mix = opts.mix};
    auto cfg = model::SyntheticConfig(spec.shape);
    if (!cfg.ok()) return Fail("convert", cfg.status());
    // Checked before generating weights (big shapes take a while).
    if (explicit_tok) {
      auto t = tokenizer::LoadTokenizer(f.GetString("tokenizer"));
      if (!t.ok()) return Fail("convert", t.status());
      Status s = PrepareTokenizer(std::move(t).value(), cfg->vocab_size, gguf_out, &tok_out);
      if (!s.ok()) return Fail("convert", s);
    }
    std::fprintf(stderr, "chorus convert: generating synthetic %s (%s)...\n", spec.shape.c_str(),
                 spec.mix ? spec.mix->name().c_str() : std::string(DTypeName(spec.dtype)).c_str());
    auto m = model::MakeSyntheticModelFile(spec);
    if (!m.ok()) return Fail("convert", m.status());
    mdl = std::move(m).value();
  } else {
    auto m = model::ReadModelFile(f.GetString("model"));
    if (!m.ok()) return Fail("convert", m.status());
    mdl = std::move(m).value();
  }
  // Where the source's own tokenizer data is: its format and path, not the tensors (a synthetic
  // fine-tune's source names the base and the noise, not a file).
  const model::ModelFile tokenizer_source{mdl->config, {}, mdl->format, mdl->source};
  const std::string& source_path = tokenizer_source.source;
  if (f.IsSet("finetune-delta")) {
    const std::string r = f.GetString("finetune-delta");
    double lo = 0, hi = 0;
    char tail = 0;
    if (std::sscanf(r.c_str(), "%lf:%lf%c", &lo, &hi, &tail) != 2) {
      return Fail("convert",
                  InvalidArgumentError("flag --finetune-delta must be LO:HI, e.g. 0.02:0.06"));
    }
    auto ft =
        compress::MakeSyntheticFineTune(*mdl, lo, hi, static_cast<uint64_t>(f.GetInt("seed")) + 7);
    if (!ft.ok()) return Fail("convert", ft.status().WithContext("flag --finetune-delta"));
    mdl = std::move(ft).value();
  }

  // The tokenizer travels with the weights. Without --tokenizer, a GGUF->GGUF or HF->HF
  // conversion copies the source's tokenizer data as is (lossless); otherwise the tokenizer is
  // loaded as `chorus generate` loads it and exported into the target format: an explicit
  // --tokenizer must be written, the model's own is written when it can be (else a note).
  const bool verbatim =
      !explicit_tok && ((mdl->format == model::ModelFormat::kGguf && gguf_out) ||
                        (mdl->format == model::ModelFormat::kHfDirectory && !gguf_out));
  if (!verbatim && mdl->format != model::ModelFormat::kSynthetic) {
    Status s;
    auto t = model::LoadTokenizerFor(tokenizer_source, f.GetString("tokenizer"));
    if (t.ok()) {
      s = PrepareTokenizer(std::move(t).value(), mdl->config.vocab_size, gguf_out, &tok_out);
    } else {
      s = t.status();
    }
    if (!s.ok()) {
      if (explicit_tok) return Fail("convert", s);
      std::fprintf(stderr, "chorus convert: note: no tokenizer written: %s\n", s.message().c_str());
    }
  }
  const auto& tok = tok_out.tok;

  std::function<Status(formats::GgufWriter*)> extra;
  std::shared_ptr<const formats::GgufFile> src_gguf;
  if (verbatim && gguf_out) {
    auto g = formats::GgufFile::Open(source_path);
    if (!g.ok()) return Fail("convert", g.status());
    src_gguf = *g;
    extra = [src_gguf](formats::GgufWriter* w) {
      for (const auto& [key, value] : src_gguf->metadata()) {
        if (key.rfind("tokenizer.", 0) == 0) w->Set(key, value);
      }
      return OkStatus();
    };
  } else if (tok && gguf_out) {
    extra = [&tok_out](formats::GgufWriter* w) {
      return tokenizer::ExportToGguf(*tok_out.tok, w, tok_out.gguf_opts);
    };
  }
  // HF: the tokenizer's files go into the directory being staged, so they are swapped in with
  // the weights (model::ConvertModel).
  model::HfFilesWriter hf_extra;
  if (verbatim && !gguf_out) {
    hf_extra = [&source_path](const std::string& dir) -> Status {
      for (const char* name : {"tokenizer.json", "tokenizer.model", "tokenizer_config.json",
                               "special_tokens_map.json", "generation_config.json"}) {
        std::error_code ec;
        std::filesystem::path src = std::filesystem::path(source_path) / name;
        if (!std::filesystem::exists(src, ec)) continue;
        std::filesystem::copy_file(src, std::filesystem::path(dir) / name,
                                   std::filesystem::copy_options::overwrite_existing, ec);
        if (ec) return InternalError("cannot copy " + src.string() + ": " + ec.message());
      }
      return OkStatus();
    };
  } else if (tok && !gguf_out) {
    hf_extra = [&tok_out](const std::string& dir) -> Status {
      const std::pair<const char*, const std::string*> out[] = {
          {"tokenizer.json", &tok_out.hf.tokenizer_json},
          {"tokenizer_config.json", &tok_out.hf.tokenizer_config_json},
          {"generation_config.json", &tok_out.hf.generation_config_json}};
      for (const auto& [name, text] : out) {
        if (text->empty()) continue;
        CHORUS_RETURN_IF_ERROR(WriteFileAtomically(dir + "/" + name, *text));
      }
      return OkStatus();
    };
  }
  Status s = model::ConvertModel(*mdl, opts, extra, hf_extra);
  if (!s.ok()) return Fail("convert", s);
  if (tok) {
    std::fprintf(stderr, "chorus convert: tokenizer written (%s, %d tokens)\n",
                 std::string(tok->kind()).c_str(), tok->vocab_size());
  } else if (mdl->format == model::ModelFormat::kSynthetic) {
    std::fprintf(
        stderr, "chorus convert: note: no tokenizer written; pass --tokenizer PATH to embed one\n");
  }
  std::fprintf(stderr, "chorus convert: wrote %s\n", opts.output.c_str());
  return 0;
}

}  // namespace chorus::apps
