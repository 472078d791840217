#include <cstdio>
#include <map>

#include "apps/chorus/commands.h"
#include "apps/chorus/common.h"
#include "chorus/model/loader.h"

namespace chorus::apps {

int InspectCommand(int argc, char** argv) {
  Flags f("inspect", "Prints a model's file format, architecture, shapes, dtypes and tokenizer.\n"
                     "usage: chorus inspect --model PATH [--tokenizer PATH] [--tensors]");
  f.String("model", "", "model: GGUF file, Hugging Face directory or llama2.c .bin (default: embedded tiny model)");
  f.String("tokenizer", "", "tokenizer file or directory; overrides the model's own");
  f.Bool("tensors", "list every tensor");
  // `chorus inspect PATH` is accepted as a shorthand for --model PATH.
  std::vector<char*> args(argv, argv + argc);
  std::string positional;
  if (!args.empty() && args[0][0] != '-') {
    positional = args[0];
    args.erase(args.begin());
  }
  if (int rc = ParseOrExit(f, static_cast<int>(args.size()), args.data()); rc >= 0) return rc;
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
    std::printf("%s%s x%lld %.1f MiB", first ? "" : ", ", d.c_str(), static_cast<long long>(e.first),
                static_cast<double>(e.second) / (1 << 20));
    first = false;
  }
  std::printf(")\n");
  std::printf("weights:      %.1f MiB, streamed per decode step %.1f MiB, repacked copies %.1f MiB\n",
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
    std::printf("tokenizer:    %s, %d tokens, bos=%d, eos=", std::string((*tok)->kind()).c_str(), (*tok)->vocab_size(),
                (*tok)->bos_id());
    for (size_t i = 0; i < (*tok)->eos_ids().size(); ++i) std::printf("%s%d", i ? "," : "", (*tok)->eos_ids()[i]);
    std::printf(", chat template: %s\n", (*tok)->chat_template().empty() ? "none" : "yes");
  } else {
    std::printf("tokenizer:    none (%s)\n", tok.status().message().c_str());
  }
  return 0;
}

}  // namespace chorus::apps
