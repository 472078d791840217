// test-labels: unit
// Every libFuzzer target's body (fuzz/fuzz_*.cc; docs/fuzzing.md) on its generated seed corpus,
// on the inputs libFuzzer once found failing (tests/data/fuzz_regressions/<target>/, kept as
// regression tests once the bug was fixed), and on short seeded mutation runs of the seeds, so
// the targets added for the server, adapter, registry, dataset and cost-model inputs run in every
// build, with any compiler.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "chorus/adapters/delta/delta_fuzz.h"
#include "chorus/adapters/lora/lora_fuzz.h"
#include "chorus/adapters/registry_fuzz.h"
#include "chorus/engine/fuzz_entry.h"
#include "chorus/formats/fuzz_entry.h"
#include "chorus/grammar/fuzz_entry.h"
#include "chorus/server/fuzz_entry.h"
#include "chorus/tokenizer/fuzz_entry.h"
#include "chorus/train/data_fuzz.h"

namespace chorus {
namespace {

using formats::FuzzTarget;

struct Target {
  const char* name;  // as fuzz/fuzz_<name>.cc
  FuzzTarget fn;
};

const std::vector<Target>& Targets() {
  static const std::vector<Target> t = {
      {"gguf", formats::FuzzGgufInput},
      {"safetensors", formats::FuzzSafetensorsInput},
      {"llama2c", formats::FuzzLlama2cInput},
      {"tokenizer_json", tokenizer::FuzzTokenizerJsonInput},
      {"chat_template", tokenizer::FuzzChatTemplateInput},
      {"delta", delta::FuzzDeltaInput},
      {"gbnf", grammar::FuzzGbnfInput},
      {"json_schema", grammar::FuzzJsonSchemaInput},
      {"peft_lora", adapters::FuzzPeftLoraInput},
      {"gguf_lora", adapters::FuzzGgufLoraInput},
      {"registry_state", adapters::FuzzRegistryStateInput},
      {"api_request", server::FuzzApiRequestInput},
      {"tenants", server::FuzzTenantsInput},
      {"tool_calls", server::FuzzToolCallsInput},
      {"jsonl_dataset", train::FuzzTrainingDataInput},
      {"cost_model", engine::FuzzCostModelInput},
  };
  return t;
}

bool RunInput(FuzzTarget fn, const std::string& s) {
  return fn(reinterpret_cast<const uint8_t*>(s.data()), s.size());
}

std::string Slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Every fuzz/fuzz_<name>.cc has an entry here (so a new target gets its regression directory
// and corpus runs).
TEST(FuzzCorpusTest, EveryTargetIsListed) {
  std::map<std::string, bool> listed;
  for (const Target& t : Targets()) listed[t.name] = true;
  int n = 0;
  for (const auto& e :
       std::filesystem::directory_iterator(std::string(CHORUS_SOURCE_DIR) + "/fuzz")) {
    const std::string f = e.path().filename().string();
    if (f.rfind("fuzz_", 0) != 0 || e.path().extension() != ".cc") continue;
    const std::string name = f.substr(5, f.size() - 8);
    EXPECT_TRUE(listed.count(name)) << name;
    ++n;
  }
  EXPECT_EQ(n, static_cast<int>(Targets().size()));
}

// The inputs libFuzzer found failing, one directory per target: each must now run cleanly.
TEST(FuzzCorpusTest, Regressions) {
  const std::filesystem::path root =
      std::filesystem::path(CHORUS_SOURCE_DIR) / "tests/data/fuzz_regressions";
  int n = 0;
  for (const Target& t : Targets()) {
    const auto dir = root / t.name;
    if (!std::filesystem::is_directory(dir)) continue;
    for (const auto& e : std::filesystem::directory_iterator(dir)) {
      if (e.path().filename() == "README.md") continue;
      SCOPED_TRACE(e.path().string());
      RunInput(t.fn, Slurp(e.path()));  // aborts on the bug it once found
      ++n;
    }
  }
  RecordProperty("regressions", n);
}

struct SeedSet {
  const char* name;
  FuzzTarget fn;
  std::vector<std::string> seeds;
  size_t valid;  // how many of the seeds (the first ones) must be accepted
};

std::vector<SeedSet> SeedSets() {
  std::vector<SeedSet> s;
  auto add = [&](const char* name, FuzzTarget fn, std::vector<std::string> seeds, size_t invalid) {
    const size_t valid = seeds.size() - invalid;
    s.push_back({name, fn, std::move(seeds), valid});
  };
  // Refused seeds come last in each list: the configs-only and broken inputs.
  add("peft_lora", adapters::FuzzPeftLoraInput, adapters::PeftLoraFuzzSeeds(), 5);
  add("gguf_lora", adapters::FuzzGgufLoraInput, adapters::GgufLoraFuzzSeeds(), 0);
  add("registry_state", adapters::FuzzRegistryStateInput, adapters::RegistryStateFuzzSeeds(), 0);
  add("tenants", server::FuzzTenantsInput, server::TenantsFuzzSeeds(), 3);
  add("tool_calls", server::FuzzToolCallsInput, server::ToolCallsFuzzSeeds(), 1);
  add("jsonl_dataset", train::FuzzTrainingDataInput, train::TrainingDataFuzzSeeds(), 4);
  add("cost_model", engine::FuzzCostModelInput, engine::CostModelFuzzSeeds(), 2);
  return s;
}

TEST(FuzzCorpusTest, SeedsAreAcceptedOrRefusedAsMeant) {
  for (const SeedSet& s : SeedSets()) {
    SCOPED_TRACE(s.name);
    ASSERT_FALSE(s.seeds.empty());
    for (size_t i = 0; i < s.seeds.size(); ++i) {
      const bool ok = RunInput(s.fn, s.seeds[i]);
      EXPECT_EQ(ok, i < s.valid) << "seed " << i;
    }
  }
}

TEST(FuzzCorpusTest, ApiRequestSeedsParse) {
  // Most seeds parse (58 bodies: 47 are accepted; the broken ones are refused), so the fuzzer
  // starts past the validation layers.
  const auto seeds = server::ApiRequestFuzzSeeds();
  int accepted = 0;
  for (const std::string& s : seeds) accepted += RunInput(server::FuzzApiRequestInput, s);
  EXPECT_GE(accepted, 40);
  EXPECT_LT(accepted, static_cast<int>(seeds.size()));
  EXPECT_FALSE(RunInput(server::FuzzApiRequestInput, ""));
}

TEST(FuzzCorpusTest, ShortMutationRuns) {
  for (const SeedSet& s : SeedSets()) {
    SCOPED_TRACE(s.name);
    formats::FuzzRunStats st = formats::RunMutationFuzz(s.fn, s.seeds, 400, /*rng_seed=*/16);
    EXPECT_EQ(st.runs, 400 + static_cast<int64_t>(s.seeds.size()));
    EXPECT_EQ(st.seeds_parsed, static_cast<int64_t>(s.valid));
  }
  const auto api = server::ApiRequestFuzzSeeds();
  formats::FuzzRunStats st = formats::RunMutationFuzz(server::FuzzApiRequestInput, api, 2000, 17);
  EXPECT_GT(st.parsed, st.seeds_parsed);  // some mutants still parse: the deep paths are reached
}

}  // namespace
}  // namespace chorus
