// Writes the fuzzers' seed corpora: <out>/{gguf,safetensors,llama2c,delta}/seed_<n>, small valid
// files covering every type the readers support (chorus/formats/fuzz_entry.h). Usage:
//   fuzz_seed_corpus <out_dir>
#include <sys/stat.h>

#include <cstdio>
#include <string>
#include <vector>

#include "chorus/adapters/delta/delta_fuzz.h"
#include "chorus/base/mapped_file.h"
#include "chorus/formats/fuzz_entry.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <out_dir>\n", argv[0]);
    return 2;
  }
  const std::string out = argv[1];
  const std::pair<const char*, std::vector<std::string>> sets[] = {
      {"gguf", chorus::formats::GgufFuzzSeeds()},
      {"safetensors", chorus::formats::SafetensorsFuzzSeeds()},
      {"llama2c", chorus::formats::Llama2cFuzzSeeds()},
      {"delta", chorus::delta::DeltaFuzzSeeds()}};
  ::mkdir(out.c_str(), 0755);
  for (const auto& [name, seeds] : sets) {
    const std::string dir = out + "/" + name;
    ::mkdir(dir.c_str(), 0755);
    for (size_t i = 0; i < seeds.size(); ++i) {
      const std::string path = dir + "/seed_" + std::to_string(i);
      chorus::Status s = chorus::WriteFileAtomically(path, seeds[i]);
      if (!s.ok()) {
        std::fprintf(stderr, "%s\n", s.ToString().c_str());
        return 1;
      }
    }
    std::printf("%s: %zu seeds in %s\n", name, seeds.size(), dir.c_str());
  }
  return 0;
}
