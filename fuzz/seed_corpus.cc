// Writes the fuzzers' seed corpora: <out>/<target>/seed_<n>, one directory per fuzz/fuzz_*.cc
// target with small valid (and a few refused) inputs covering every variant of its format; see
// docs/fuzzing.md. Usage:
//   fuzz_seed_corpus <out_dir>
#include <sys/stat.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "chorus/adapters/delta/delta_fuzz.h"
#include "chorus/adapters/lora/lora_fuzz.h"
#include "chorus/adapters/registry_fuzz.h"
#include "chorus/base/mapped_file.h"
#include "chorus/engine/fuzz_entry.h"
#include "chorus/formats/fuzz_entry.h"
#include "chorus/server/fuzz_entry.h"
#include "chorus/tokenizer/fuzz_entry.h"
#include "chorus/train/data_fuzz.h"

namespace {

std::vector<std::string> GbnfSeeds() {
  return {
      "root ::= \"{\" ws pair (\",\" ws pair)* \"}\"\npair ::= [a-z]+ \":\" ws value\n"
      "value ::= [0-9]{1,3} | \"true\" | root\nws ::= [ \\t\\n]?\n",
      "root ::= (\"ab\" | [^\\n\"]){2,5} .? # comment\n",
      "root ::=\n  x+\n  | \"\\u00e9\" y*\nx ::= [a-c] | \"\"\ny ::= (\"q\" x)?\n",
      "root ::= answer\nanswer ::= \"yes\" | \"no\" | \"maybe\" [.!]{0,3}\n",
      "root ::= item{2,}\nitem ::= \"- \" [^\\x00-\\x1f\\n]+ \"\\n\"\n",
  };
}

// The structured-output test schemas, one per seed.
std::vector<std::string> JsonSchemaSeeds() {
  std::ifstream in(std::string(CHORUS_SOURCE_DIR) + "/tests/data/structured_output_schemas.json");
  std::vector<std::string> out;
  if (!in) return out;
  const auto schemas = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!schemas.is_array()) return out;
  for (const auto& s : schemas) {
    if (s.is_object() && s.contains("schema")) out.push_back(s["schema"].dump());
  }
  return out;
}

}  // namespace

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
      {"delta", chorus::delta::DeltaFuzzSeeds()},
      {"tokenizer_json", chorus::tokenizer::TokenizerJsonFuzzSeeds()},
      {"gbnf", GbnfSeeds()},
      {"json_schema", JsonSchemaSeeds()},
      {"peft_lora", chorus::adapters::PeftLoraFuzzSeeds()},
      {"gguf_lora", chorus::adapters::GgufLoraFuzzSeeds()},
      {"registry_state", chorus::adapters::RegistryStateFuzzSeeds()},
      {"api_request", chorus::server::ApiRequestFuzzSeeds()},
      {"tenants", chorus::server::TenantsFuzzSeeds()},
      {"tool_calls", chorus::server::ToolCallsFuzzSeeds()},
      {"jsonl_dataset", chorus::train::TrainingDataFuzzSeeds()},
      {"cost_model", chorus::engine::CostModelFuzzSeeds()}};
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
