#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>

#include "apps/chorus/commands.h"
#include "apps/chorus/common.h"
#include "chorus/adapters/lora/lora_files.h"
#include "chorus/formats/gguf.h"
#include "chorus/model/loader.h"

namespace chorus::apps {
namespace {

// A PEFT directory (or one of its files, a pickle adapter_model.bin included, so it is refused
// with the adapter reader's message) or a GGUF file whose general.type is "adapter".
bool LooksLikeAdapter(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    for (const char* f :
         {"adapter_config.json", "adapter_model.safetensors", "adapter_model.bin"}) {
      if (fs::exists(fs::path(path) / f, ec)) return true;
    }
    return false;
  }
  const std::string name = fs::path(path).filename().string();
  if (name == "adapter_config.json" || name == "adapter_model.safetensors" ||
      name == "adapter_model.bin")
    return true;
  auto g = formats::GgufFile::Open(path);
  if (!g.ok()) return false;
  auto type = (*g)->GetString("general.type");
  return type.ok() && *type == "adapter";
}

std::string Mib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f MiB", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

// `chorus inspect ADAPTER [--model BASE]`.
int InspectAdapter(const std::string& path, const std::string& base_path, int64_t max_rank) {
  auto info_or = adapters::InspectLoraFile(path);
  if (!info_or.ok()) return Fail("inspect", info_or.status());
  const adapters::LoraFileInfo& info = *info_or;
  std::printf("source:       %s\n", info.path.c_str());
  std::printf(
      "format:       %s LoRA adapter\n",
      info.format == "peft" ? "PEFT (adapter_config.json + adapter_model.safetensors)" : "GGUF");
  if (!info.architecture.empty()) std::printf("architecture: %s\n", info.architecture.c_str());
  std::printf("base model:   %s\n",
              info.base_model.empty() ? "(not recorded)" : info.base_model.c_str());
  std::printf("layers:       %lld (highest targeted layer + 1)\n",
              static_cast<long long>(info.n_layers));
  std::string targets;
  for (const auto& m : info.modules) {
    if (!targets.empty()) targets += ", ";
    targets += m.name;
  }
  std::printf("targets:      %s\n", targets.c_str());
  if (info.format == "peft") {
    std::printf("config:       r=%lld, lora_alpha=%g, use_rslora=%s\n",
                static_cast<long long>(info.config_r), info.config_alpha,
                info.use_rslora ? "true (scale = alpha/sqrt(r))" : "false (scale = alpha/r)");
  } else {
    std::printf("config:       adapter.lora.alpha=%g (scale = alpha/r%s)\n", info.config_alpha,
                info.config_alpha == 0 ? "; absent = scale 1" : "");
  }
  std::printf("tensors:      %lld, %s; files %s\n", static_cast<long long>(info.n_tensors),
              Mib(info.tensor_bytes).c_str(), Mib(info.file_bytes).c_str());
  std::printf("modules:\n");
  for (const auto& m : info.modules) {
    std::string ranks;
    for (const auto& [r, n] : m.ranks) {
      if (!ranks.empty()) ranks += ", ";
      ranks += std::to_string(r);
      if (m.ranks.size() > 1) {
        ranks += 'x';
        ranks += std::to_string(n);
      }
    }
    std::string alphas, scales;
    for (const auto& [a, n] : m.alphas) {
      char buf[48];
      std::snprintf(buf, sizeof(buf), "%g", static_cast<double>(a));
      if (!alphas.empty()) alphas += ", ";
      alphas += buf;
    }
    if (m.ranks.size() == 1 && m.alphas.size() == 1) {
      const double r = static_cast<double>(m.ranks.begin()->first);
      const double a = static_cast<double>(m.alphas.begin()->first);
      char buf[48];
      std::snprintf(buf, sizeof(buf), ", scale %g", info.use_rslora ? a / std::sqrt(r) : a / r);
      scales = buf;
    }
    std::printf("  %-10s %3lld layers  rank %-24s alpha %s%s  [%lld <- %lld]  %s\n", m.name.c_str(),
                static_cast<long long>(m.layers), ranks.c_str(), alphas.c_str(), scales.c_str(),
                static_cast<long long>(m.out), static_cast<long long>(m.in), m.dtype.c_str());
  }
  if (base_path.empty()) return 0;
  auto base = model::LoadModel(base_path);
  if (!base.ok()) return Fail("inspect", base.status());
  adapters::LoraLoadOptions lo;
  lo.limits.max_rank = max_rank;
  // Exactly what registration runs: read against the base, then validate every value.
  auto adapter = adapters::LoadLoraAdapter(path, (*base)->config(), lo,
                                           std::filesystem::path(path).filename().string());
  if (!adapter.ok()) {
    std::printf("validation:   FAILED against %s\n", base_path.c_str());
    return Fail("inspect", adapter.status());
  }
  std::printf("validation:   OK against %s (%s, max rank %lld; %s in compute layout)\n",
              base_path.c_str(), (*base)->config().arch.c_str(), static_cast<long long>(max_rank),
              Mib((*adapter)->memory_bytes()).c_str());
  return 0;
}

}  // namespace

int InspectCommand(int argc, char** argv) {
  Flags f(
      "inspect",
      "Prints a model's file format, architecture, shapes, dtypes and tokenizer, or a LoRA\n"
      "adapter's format, target modules, ranks, alpha, dtype and size.\n"
      "usage: chorus inspect --model PATH [--tokenizer PATH] [--tensors]\n"
      "       chorus inspect ADAPTER [--model BASE]   (PEFT directory or GGUF LoRA; with --model,\n"
      "                                                validated against BASE as registration "
      "does)");
  f.String(
      "model", "",
      "model: GGUF file, Hugging Face directory or llama2.c .bin (default: embedded tiny model)");
  f.String("tokenizer", "", "tokenizer file or directory; overrides the model's own");
  f.Bool("tensors", "list every tensor");
  f.String("adapter", "",
           "a LoRA adapter to inspect (PEFT directory or GGUF); a positional PATH is detected");
  f.Int("max-lora-rank", 256, "largest rank accepted when validating an adapter against --model");
  // `chorus inspect PATH` is accepted as a shorthand for --model PATH.
  std::vector<char*> args(argv, argv + argc);
  std::string positional;
  if (!args.empty() && args[0][0] != '-') {
    positional = args[0];
    args.erase(args.begin());
  }
  if (int rc = ParseOrExit(f, static_cast<int>(args.size()), args.data()); rc >= 0) return rc;
  std::string adapter = f.GetString("adapter");
  if (adapter.empty() && !positional.empty() && LooksLikeAdapter(positional)) adapter = positional;
  if (!adapter.empty()) {
    if (!positional.empty() && positional != adapter) {
      return Fail("inspect", InvalidArgumentError(
                                 "give the adapter either as PATH or as --adapter, not both"));
    }
    return InspectAdapter(adapter, f.GetString("model"), f.GetInt("max-lora-rank"));
  }
  std::string path = positional.empty() ? f.GetString("model") : positional;
  auto m = path.empty() ? LoadModelAndTokenizer("", "") : Result<LoadedModel>(LoadedModel{});
  std::shared_ptr<const model::Model> mdl;
  if (path.empty()) {
    if (!m.ok()) return Fail("inspect", m.status());
    mdl = m->model;
  } else {
    auto lm = model::LoadModel(path);
    if (!lm.ok()) return Fail("inspect", lm.status());
    mdl = *lm;
  }
  const auto& c = mdl->config();
  std::printf("source:       %s\n", mdl->source().c_str());
  std::printf("format:       %s\n", model::ModelFormatName(mdl->format()));
  std::printf("architecture: %s\n", c.arch.c_str());
  std::printf("config:       %s\n", c.Summary().c_str());
  std::printf("parameters:   %.3f M\n", static_cast<double>(c.NumParams()) / 1e6);
  std::map<std::string, std::pair<int64_t, int64_t>> by_dtype;  // dtype -> (count, bytes)
  for (const auto& [name, t] : mdl->tensors()) {
    auto& e = by_dtype[std::string(DTypeName(t.dtype()))];
    ++e.first;
    e.second += t.view().NumBytes();
  }
  std::printf("tensors:      %zu (", mdl->tensors().size());
  bool first = true;
  for (const auto& [d, e] : by_dtype) {
    std::printf("%s%s x%lld %.1f MiB", first ? "" : ", ", d.c_str(),
                static_cast<long long>(e.first), static_cast<double>(e.second) / (1 << 20));
    first = false;
  }
  std::printf(")\n");
  std::printf(
      "weights:      %.1f MiB, streamed per decode step %.1f MiB, repacked copies %.1f MiB\n",
      static_cast<double>(mdl->WeightBytes()) / (1 << 20),
      static_cast<double>(mdl->StreamedBytesPerToken()) / (1 << 20),
      static_cast<double>(mdl->PackedBytes()) / (1 << 20));
  if (f.GetBool("tensors")) {
    for (const auto& [name, t] : mdl->tensors()) {
      std::printf("  %-48s %-5s %s\n", name.c_str(), std::string(DTypeName(t.dtype())).c_str(),
                  t.view().ShapeString().c_str());
    }
  }
  auto tok = model::LoadTokenizerFor(*mdl, f.GetString("tokenizer"));
  if (tok.ok()) {
    std::printf("tokenizer:    %s, %d tokens, bos=%d, eos=", std::string((*tok)->kind()).c_str(),
                (*tok)->vocab_size(), (*tok)->bos_id());
    for (size_t i = 0; i < (*tok)->eos_ids().size(); ++i)
      std::printf("%s%d", i ? "," : "", (*tok)->eos_ids()[i]);
    std::printf(", chat template: %s\n", (*tok)->chat_template().empty()
                                             ? "none (chat requests use the ChatML fallback)"
                                             : "yes");
    // The engine's rule (a tokenizer id past the model's vocabulary has no embedding row):
    // refuse what `chorus serve` would refuse, and say when the model has rows no id reaches.
    const int64_t tok_vocab = (*tok)->vocab_size();
    if (tok_vocab > c.vocab_size) {
      std::printf("vocabulary:   MISMATCH: the tokenizer has %lld tokens, the model %lld\n",
                  static_cast<long long>(tok_vocab), static_cast<long long>(c.vocab_size));
      return Fail("inspect", InvalidArgumentError("tokenizer has " + std::to_string(tok_vocab) +
                                                  " tokens but the model only " +
                                                  std::to_string(c.vocab_size) +
                                                  " (tokenizer of another model?)"));
    }
    if (tok_vocab < c.vocab_size) {
      std::printf(
          "vocabulary:   tokenizer %lld tokens, model %lld rows (rows %lld.. unused, e.g. "
          "padding)\n",
          static_cast<long long>(tok_vocab), static_cast<long long>(c.vocab_size),
          static_cast<long long>(tok_vocab));
    } else {
      std::printf("vocabulary:   tokenizer and model agree (%lld tokens)\n",
                  static_cast<long long>(tok_vocab));
    }
  } else {
    std::printf("tokenizer:    none (%s)\n", tok.status().message().c_str());
  }
  return 0;
}

}  // namespace chorus::apps
