// test-labels: unit
// `chorus convert --format hf` writes shards above --max-shard-size as transformers'
// save_pretrained does (model-0000i-of-0000N.safetensors + model.safetensors.index.json), the
// sharded and the single-file directory hold the same tensors, and a conversion into a directory
// of an earlier one leaves none of the earlier weight files behind.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "chorus/base/mapped_file.h"
#include "chorus/model/convert.h"
#include "chorus/model/loader.h"
#include "chorus/model/synthetic.h"
#include "tests/testutil/testutil.h"

namespace chorus::model {
namespace {

std::set<std::string> FilesIn(const std::string& dir) {
  std::set<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    out.insert(e.path().filename().string());
  return out;
}

// name -> the tensor's values as f32; `bytes`: the tensors' bytes as stored.
std::map<std::string, std::vector<float>> TensorsOf(const std::string& path,
                                                    uint64_t* bytes = nullptr) {
  auto f = ReadModelFile(path);
  EXPECT_TRUE(f.ok()) << f.status().ToString();
  std::map<std::string, std::vector<float>> out;
  if (!f.ok()) return out;
  if (bytes != nullptr) *bytes = 0;
  for (const auto& [name, t] : f->tensors) {
    out[name] = t.ToF32();
    if (bytes != nullptr) *bytes += static_cast<uint64_t>(t.view().NumBytes());
  }
  return out;
}

TEST(ConvertHfTest, ShardsAboveTheMaximumAndRemovesTheEarlierConversionsWeightFiles) {
  auto m = MakeSyntheticModel({.shape = "tiny", .dtype = DType::kF32, .seed = 5});
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  const std::string root = testing::TempDir() + "/convert_hf";
  std::filesystem::remove_all(root);
  std::filesystem::create_directories(root);

  ConvertOptions single;
  single.format = OutputFormat::kHfDirectory;
  single.dtype = DType::kBF16;
  single.output = root + "/single";
  CHORUS_ASSERT_OK(ConvertModel(**m, single));
  EXPECT_EQ(FilesIn(single.output), (std::set<std::string>{"config.json", "model.safetensors"}));
  uint64_t total = 0;  // bf16 matrices, f32 norms
  const auto want = TensorsOf(single.output, &total);
  ASSERT_FALSE(want.empty());

  // A quarter of the weights per shard: several shards, an index naming each tensor's shard.
  ConvertOptions sharded = single;
  sharded.output = root + "/sharded";
  sharded.max_shard_bytes = total / 4;
  CHORUS_ASSERT_OK(ConvertModel(**m, sharded));
  const std::set<std::string> files = FilesIn(sharded.output);
  EXPECT_EQ(files.count("model.safetensors"), 0u);
  ASSERT_EQ(files.count("model.safetensors.index.json"), 1u);
  auto text = ReadFileToString(sharded.output + "/model.safetensors.index.json");
  ASSERT_TRUE(text.ok());
  const auto index = nlohmann::json::parse(*text);
  EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), total);
  std::set<std::string> shards;
  for (const auto& [tensor, shard] : index["weight_map"].items()) {
    EXPECT_EQ(want.count(tensor), 1u) << tensor;
    shards.insert(shard.get<std::string>());
  }
  EXPECT_GE(shards.size(), 4u);
  EXPECT_EQ(index["weight_map"].size(), want.size());
  for (const std::string& s : shards) {
    EXPECT_EQ(files.count(s), 1u) << s;
    EXPECT_NE(s.find("-of-" + std::string(5 - std::to_string(shards.size()).size(), '0') +
                     std::to_string(shards.size()) + ".safetensors"),
              std::string::npos)
        << s;
  }
  EXPECT_EQ(TensorsOf(sharded.output), want);

  // Into the single-file directory: its model.safetensors goes; files that are not weight files
  // of a conversion stay.
  {
    std::ofstream(single.output + "/README.md") << "notes\n";
    std::ofstream(single.output + "/model-extra.safetensors") << "not a shard name\n";
  }
  ConvertOptions resharded = sharded;
  resharded.output = single.output;
  CHORUS_ASSERT_OK(ConvertModel(**m, resharded));
  std::set<std::string> expect = files;
  expect.insert({"README.md", "model-extra.safetensors"});
  EXPECT_EQ(FilesIn(single.output), expect);
  EXPECT_EQ(TensorsOf(single.output), want);

  // Into the sharded directory with fewer, larger shards, then as one file: no shard of the
  // earlier conversion stays, nor the index.
  ConvertOptions halves = sharded;
  halves.max_shard_bytes = total / 2 + 1;
  CHORUS_ASSERT_OK(ConvertModel(**m, halves));
  const std::set<std::string> halved = FilesIn(sharded.output);
  EXPECT_LT(halved.size(), files.size());
  for (const std::string& s : halved)
    EXPECT_EQ(s.find("-of-0000" + std::to_string(shards.size())), std::string::npos) << s;
  EXPECT_EQ(TensorsOf(sharded.output), want);
  ConvertOptions whole = single;
  whole.output = sharded.output;
  CHORUS_ASSERT_OK(ConvertModel(**m, whole));
  EXPECT_EQ(FilesIn(sharded.output), (std::set<std::string>{"config.json", "model.safetensors"}));
  EXPECT_EQ(TensorsOf(sharded.output), want);

  // Exactly the maximum is still one file.
  ConvertOptions exact = single;
  exact.output = root + "/exact";
  exact.max_shard_bytes = total;
  CHORUS_ASSERT_OK(ConvertModel(**m, exact));
  EXPECT_EQ(FilesIn(exact.output).count("model.safetensors"), 1u);

  ConvertOptions zero = single;
  zero.output = root + "/zero";
  zero.max_shard_bytes = 0;
  EXPECT_FALSE(ConvertModel(**m, zero).ok());
}

TEST(ConvertHfTest, ShardSizesParseAsTransformersWritesThem) {
  EXPECT_EQ(*ParseShardSize("5GB"), 5'000'000'000u);
  EXPECT_EQ(*ParseShardSize("500MB"), 500'000'000u);
  EXPECT_EQ(*ParseShardSize("2GiB"), uint64_t{2} << 30);
  EXPECT_EQ(*ParseShardSize("64KiB"), uint64_t{64} << 10);
  EXPECT_EQ(*ParseShardSize("1048576"), 1048576u);
  EXPECT_EQ(*ParseShardSize("10B"), 10u);
  for (const char* bad : {"", "GB", "0", "0GB", "5 GB", "5gb", "5TB", "-1", "1.5GB",
                          "99999999999999999999", "999999999999999GiB"}) {
    auto r = ParseShardSize(bad);
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) {
      EXPECT_NE(r.status().message().find("shard size"), std::string::npos) << bad;
    }
  }
}

}  // namespace
}  // namespace chorus::model
