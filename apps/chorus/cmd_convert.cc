#include <sys/stat.h>

#include <cstdio>
#include <filesystem>

#include "apps/chorus/commands.h"
#include "apps/chorus/common.h"
#include "chorus/formats/gguf.h"
#include "chorus/model/convert.h"
#include "chorus/model/loader.h"
#include "chorus/model/synthetic.h"

namespace chorus::apps {
namespace {

std::string ShapeList() {
  std::string s;
  for (const auto& n : model::SyntheticShapeNames()) s += (s.empty() ? "" : ", ") + n;
  return s;
}

}  // namespace

int ConvertCommand(int argc, char** argv) {
  Flags f("convert",
          "Writes a model as GGUF (f32/f16/bf16/q8_0/q4_0) or a Hugging Face directory (f32/f16/bf16).\n"
          "Either --model PATH (any loadable model) or --shape NAME (seeded random weights at a real\n"
          "shape: " + ShapeList() + ").");
  f.String("model", "", "source model: GGUF file, Hugging Face directory or llama2.c .bin");
  f.String("shape", "", "synthetic shape instead of --model");
  f.Int("seed", 1, "seed of the synthetic weights");
  f.String("dtype", "", "dtype of the matrices (default: keep the source's where the target allows)");
  f.String("format", "gguf", "output format: gguf or hf");
  f.String("output", "", "output file (gguf) or directory (hf)");
  if (int rc = ParseOrExit(f, argc, argv); rc >= 0) return rc;
  if (f.GetString("output").empty()) return Fail("convert", InvalidArgumentError("--output is required"));
  if (f.IsSet("model") == f.IsSet("shape")) {
    return Fail("convert", InvalidArgumentError("give exactly one of --model and --shape"));
  }
  model::ConvertOptions opts;
  opts.output = f.GetString("output");
  const std::string fmt = f.GetString("format");
  if (fmt == "gguf") opts.format = model::OutputFormat::kGguf;
  else if (fmt == "hf") opts.format = model::OutputFormat::kHfDirectory;
  else return Fail("convert", InvalidArgumentError("--format must be gguf or hf, not '" + fmt.substr(0, 32) + "'"));
  if (f.IsSet("dtype")) {
    auto d = ParseDType(f.GetString("dtype"));
    if (!d.ok()) return Fail("convert", d.status());
    opts.dtype = *d;
  }

  std::shared_ptr<const model::Model> mdl;
  if (f.IsSet("shape")) {
    model::SyntheticSpec spec{.shape = f.GetString("shape"), .dtype = opts.dtype.value_or(DType::kF32),
                              .seed = static_cast<uint64_t>(f.GetInt("seed"))};
    std::fprintf(stderr, "chorus convert: generating synthetic %s (%s)...\n", spec.shape.c_str(),
                 std::string(DTypeName(spec.dtype)).c_str());
    auto m = model::MakeSyntheticModel(spec);
    if (!m.ok()) return Fail("convert", m.status());
    mdl = *m;
  } else {
    auto m = model::LoadModel(f.GetString("model"));
    if (!m.ok()) return Fail("convert", m.status());
    mdl = *m;
  }

  // Tokenizer data travels with the weights where the source has it in a form the target takes.
  std::function<Status(formats::GgufWriter*)> extra;
  std::shared_ptr<const formats::GgufFile> src_gguf;
  if (mdl->format() == model::ModelFormat::kGguf && opts.format == model::OutputFormat::kGguf) {
    auto g = formats::GgufFile::Open(mdl->source());
    if (!g.ok()) return Fail("convert", g.status());
    src_gguf = *g;
    extra = [src_gguf](formats::GgufWriter* w) {
      for (const auto& [key, value] : src_gguf->metadata()) {
        if (key.rfind("tokenizer.", 0) == 0) w->Set(key, value);
      }
      return OkStatus();
    };
  }
  Status s = model::ConvertModel(*mdl, opts, extra);
  if (!s.ok()) return Fail("convert", s);
  if (mdl->format() == model::ModelFormat::kHfDirectory && opts.format == model::OutputFormat::kHfDirectory) {
    for (const char* name : {"tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json",
                             "generation_config.json"}) {
      std::error_code ec;
      std::filesystem::path src = std::filesystem::path(mdl->source()) / name;
      if (std::filesystem::exists(src, ec)) {
        std::filesystem::copy_file(src, std::filesystem::path(opts.output) / name,
                                   std::filesystem::copy_options::overwrite_existing, ec);
        if (ec) return Fail("convert", InternalError("cannot copy " + src.string() + ": " + ec.message()));
      }
    }
  } else if (!src_gguf) {
    std::fprintf(stderr, "chorus convert: note: no tokenizer written; load with --tokenizer PATH\n");
  }
  std::fprintf(stderr, "chorus convert: wrote %s\n", opts.output.c_str());
  return 0;
}

}  // namespace chorus::apps
