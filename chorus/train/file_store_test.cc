// test-labels: unit concurrency
// Uploaded training files: add / get / list / delete, persistence across a reopen, refusals.
#include "chorus/train/file_store.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "chorus/base/mapped_file.h"
#include "tests/testutil/testutil.h"

namespace chorus::train {
namespace {

TEST(FileStoreTest, AddListDeleteAndReopen) {
  const std::string dir = testing::TempDir() + "/files";
  std::string id1, id2;
  {
    auto s = FileStore::Open(dir);
    CHORUS_ASSERT_OK(s.status());
    const std::string line = "{\"prompt\": \"a\", \"completion\": \"b\"}\n";
    auto a = (*s)->Add("train.jsonl", "fine-tune", line);
    CHORUS_ASSERT_OK(a.status());
    auto b = (*s)->Add("eval.jsonl", "fine-tune", "{\"text\": \"c\"}\n");
    CHORUS_ASSERT_OK(b.status());
    id1 = a->id;
    id2 = b->id;
    EXPECT_NE(id1, id2);
    EXPECT_EQ(id1.rfind("file-", 0), 0u);
    EXPECT_EQ(a->bytes, static_cast<int64_t>(line.size()));
    EXPECT_EQ(*ReadFileToString(a->path), line);
    ASSERT_EQ((*s)->List().size(), 2u);
    CHORUS_ASSERT_OK((*s)->Delete(id1));
    EXPECT_FALSE(std::filesystem::exists(a->path));
    EXPECT_FALSE((*s)->Get(id1).has_value());
    EXPECT_EQ((*s)->Delete(id1).code(), StatusCode::kNotFound);
  }
  auto s = FileStore::Open(dir);  // a restart
  CHORUS_ASSERT_OK(s.status());
  ASSERT_EQ((*s)->List().size(), 1u);
  EXPECT_EQ((*s)->List()[0].id, id2);
  EXPECT_EQ((*s)->Get(id2)->filename, "eval.jsonl");
  auto c = (*s)->Add("more.jsonl", "fine-tune", "x");
  CHORUS_ASSERT_OK(c.status());
  EXPECT_NE(c->id, id1);  // ids are never reused in a directory
}

TEST(FileStoreTest, Refusals) {
  auto s = FileStore::Open(testing::TempDir() + "/files2", 16);
  CHORUS_ASSERT_OK(s.status());
  EXPECT_EQ((*s)->Add("a.jsonl", "assistants", "x").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*s)->Add("a.jsonl", "fine-tune", "").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*s)->Add("../a.jsonl", "fine-tune", "x").status().code(),
            StatusCode::kInvalidArgument);
  // A name that is not UTF-8, or holds control characters, could not be listed as JSON.
  for (const std::string& name : {std::string("a\xff.jsonl"), std::string("a\xc3.jsonl"),
                                  std::string("a\n.jsonl"), std::string("a\x7f")}) {
    auto r = (*s)->Add(name, "fine-tune", "x");
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << name;
    EXPECT_NE(r.status().message().find("filename"), std::string::npos);
  }
  CHORUS_ASSERT_OK((*s)->Add("données ✓.jsonl", "fine-tune", "x").status());
  ASSERT_EQ((*s)->List().size(), 1u);
  CHORUS_ASSERT_OK((*s)->Delete((*s)->List()[0].id));
  auto big = (*s)->Add("a.jsonl", "fine-tune", std::string(17, 'x'));
  EXPECT_EQ(big.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(big.status().message().find("over the limit of 16"), std::string::npos);
  EXPECT_TRUE((*s)->List().empty());
  // A corrupt index is an error naming it.
  const std::string dir = testing::TempDir() + "/files3";
  std::filesystem::create_directories(dir);
  CHORUS_ASSERT_OK(WriteFileAtomically(dir + "/files.json", "{oops"));
  auto bad = FileStore::Open(dir);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("files.json"), std::string::npos);
}

// A corrupt index is refused with kDataLoss naming the problem (the directory untouched), or
// with recover_corrupt_state moved aside and rebuilt from the content files present; files a
// killed writer left (temp files, content the index does not list) are removed at Open.
TEST(FileStoreTest, CorruptIndexIsRefusedOrQuarantined) {
  namespace fs = std::filesystem;
  const std::string dir = testing::TempDir() + "/files";
  std::string id;
  {
    auto s = FileStore::Open(dir);
    CHORUS_ASSERT_OK(s.status());
    auto a = (*s)->Add("train.jsonl", "fine-tune", "{\"text\": \"a\"}\n");
    CHORUS_ASSERT_OK(a.status());
    id = a->id;
    // A second process on the same directory is refused while this one holds it.
    auto second = FileStore::Open(dir);
    EXPECT_EQ(second.status().code(), StatusCode::kFailedPrecondition);
  }
  // Leftovers of killed writers: removed, the listed file kept.
  CHORUS_ASSERT_OK(WriteFileAtomically(dir + "/files.json.tmp.4242", "{"));
  CHORUS_ASSERT_OK(WriteFileAtomically(dir + "/file-00000009000000000000abcd.jsonl", "orphan"));
  {
    auto s = FileStore::Open(dir);
    CHORUS_ASSERT_OK(s.status());
    EXPECT_EQ((*s)->List().size(), 1u);
    EXPECT_FALSE(fs::exists(dir + "/files.json.tmp.4242"));
    EXPECT_FALSE(fs::exists(dir + "/file-00000009000000000000abcd.jsonl"));
    EXPECT_TRUE(fs::exists(dir + "/" + id + ".jsonl"));
  }
  const std::string good = *ReadFileToString(dir + "/files.json");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {good.substr(0, good.size() / 2), "not valid JSON"},
      {"[1, 2]", "not an object"},
      {R"({"counter": 1, "files": [{"id": "file-x"}]})", "no valid 'id'"},
      {R"({"counter": "1", "files": []})", "'counter'"},
      {R"({"counter": 1, "files": [{"id": ")" + id +
           R"(", "filename": "t", "purpose": "fine-tune", "bytes": 3, "created_at": 1}]})",
       "has 14 bytes, the index says 3"}};
  for (const auto& [text, problem] : cases) {
    CHORUS_ASSERT_OK(WriteFileAtomically(dir + "/files.json", text));
    auto refused = FileStore::Open(dir);
    ASSERT_EQ(refused.status().code(), StatusCode::kDataLoss) << text;
    EXPECT_NE(refused.status().message().find(problem), std::string::npos)
        << refused.status().message();
    EXPECT_NE(refused.status().message().find("files.json"), std::string::npos);
    EXPECT_EQ(*ReadFileToString(dir + "/files.json"), text) << "refused: left as it was";
    EXPECT_TRUE(fs::exists(dir + "/" + id + ".jsonl")) << "refused: content kept";

    auto recovered = FileStore::Open(dir, int64_t{256} << 20, /*recover_corrupt_state=*/true);
    CHORUS_ASSERT_OK(recovered.status());
    ASSERT_EQ((*recovered)->List().size(), 1u) << "rebuilt from the content present";
    EXPECT_EQ((*recovered)->List()[0].id, id);
    EXPECT_EQ(*ReadFileToString((*recovered)->List()[0].path), "{\"text\": \"a\"}\n");
    int quarantined = 0;
    for (const auto& e : fs::directory_iterator(dir)) {
      const std::string n = e.path().filename().string();
      if (n.rfind("files.json.corrupt-", 0) == 0) {
        ++quarantined;
        EXPECT_EQ(*ReadFileToString(e.path().string()), text);
        fs::remove(e.path());
      }
    }
    EXPECT_EQ(quarantined, 1);
    recovered->reset();
    auto again = FileStore::Open(dir);  // the rebuilt index is valid
    CHORUS_ASSERT_OK(again.status());
    auto next = (*again)->Add("b.jsonl", "fine-tune", "x");
    CHORUS_ASSERT_OK(next.status());
    EXPECT_NE(next->id, id);
    CHORUS_ASSERT_OK((*again)->Delete(next->id));
  }
}

// A file records its owner (a tenant): in files.json (absent for an ownerless file, so older
// indexes load unchanged; a bad one is kDataLoss) and in <id>.owner beside the content, so an
// index rebuilt by the recovery keeps every owner. Owner files a killed writer left are removed
// and a missing one is written again at Open; Delete removes it.
TEST(FileStoreTest, OwnerIsPersistedAndSurvivesARebuild) {
  namespace fs = std::filesystem;
  const std::string dir = testing::TempDir() + "/files-owned";
  std::string mine, shared;
  {
    auto s = FileStore::Open(dir);
    CHORUS_ASSERT_OK(s.status());
    auto a = (*s)->Add("a.jsonl", "fine-tune", "{\"text\": \"a\"}\n", "acme");
    CHORUS_ASSERT_OK(a.status());
    auto b = (*s)->Add("b.jsonl", "fine-tune", "{\"text\": \"b\"}\n");
    CHORUS_ASSERT_OK(b.status());
    mine = a->id;
    shared = b->id;
    EXPECT_EQ(a->owner, "acme");
    EXPECT_EQ(b->owner, "");
    EXPECT_EQ((*s)->Get(mine)->owner, "acme");
    for (const char* bad : {"a b", "a/b", "x\n", "t\xc3\xa9"}) {
      auto r = (*s)->Add("c.jsonl", "fine-tune", "x", bad);
      EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
      EXPECT_NE(r.status().message().find("owner"), std::string::npos);
    }
    EXPECT_EQ((*s)->Add("c.jsonl", "fine-tune", "x", std::string(65, 'a')).status().code(),
              StatusCode::kInvalidArgument);
    EXPECT_EQ((*s)->List().size(), 2u);
  }
  EXPECT_EQ(*ReadFileToString(dir + "/" + mine + ".owner"), "acme");
  EXPECT_FALSE(fs::exists(dir + "/" + shared + ".owner"));
  const nlohmann::json index = nlohmann::json::parse(*ReadFileToString(dir + "/files.json"));
  ASSERT_EQ(index["files"].size(), 2u);
  EXPECT_EQ(index["files"][0]["owner"], "acme");
  EXPECT_FALSE(index["files"][1].contains("owner")) << "ownerless: the field is absent";

  // A restart keeps the owners; an owner file the index does not list (a killed add) is removed,
  // a listed file's missing one is written again.
  CHORUS_ASSERT_OK(WriteFileAtomically(dir + "/file-00000009000000000000abcd.owner", "blue"));
  fs::remove(dir + "/" + mine + ".owner");
  {
    auto s = FileStore::Open(dir);
    CHORUS_ASSERT_OK(s.status());
    EXPECT_EQ((*s)->Get(mine)->owner, "acme");
    EXPECT_EQ((*s)->Get(shared)->owner, "");
    EXPECT_FALSE(fs::exists(dir + "/file-00000009000000000000abcd.owner"));
    EXPECT_EQ(*ReadFileToString(dir + "/" + mine + ".owner"), "acme");
  }

  // A bad owner in the index is corruption naming the field.
  const std::string good = *ReadFileToString(dir + "/files.json");
  for (const nlohmann::json& bad_owner :
       {nlohmann::json(""), nlohmann::json(7), nlohmann::json("a b"), nlohmann::json(nullptr)}) {
    nlohmann::json j = index;
    j["files"][1]["owner"] = bad_owner;
    CHORUS_ASSERT_OK(WriteFileAtomically(dir + "/files.json", j.dump()));
    auto refused = FileStore::Open(dir);
    ASSERT_EQ(refused.status().code(), StatusCode::kDataLoss) << bad_owner.dump();
    EXPECT_NE(refused.status().message().find("entry " + shared + ": 'owner'"), std::string::npos)
        << refused.status().message();
  }

  // The recovery rebuilds the index from the content present and keeps each owner.
  CHORUS_ASSERT_OK(WriteFileAtomically(dir + "/files.json", "{oops"));
  {
    auto recovered = FileStore::Open(dir, int64_t{256} << 20, /*recover_corrupt_state=*/true);
    CHORUS_ASSERT_OK(recovered.status());
    ASSERT_EQ((*recovered)->List().size(), 2u);
    EXPECT_EQ((*recovered)->Get(mine)->owner, "acme");
    EXPECT_EQ((*recovered)->Get(shared)->owner, "");
  }
  // An owner file that is not a tenant name stops the recovery, naming it.
  CHORUS_ASSERT_OK(WriteFileAtomically(dir + "/files.json", "{oops"));
  CHORUS_ASSERT_OK(WriteFileAtomically(dir + "/" + mine + ".owner", "not a name"));
  {
    auto refused = FileStore::Open(dir, int64_t{256} << 20, /*recover_corrupt_state=*/true);
    ASSERT_EQ(refused.status().code(), StatusCode::kDataLoss);
    EXPECT_NE(refused.status().message().find(mine + ".owner"), std::string::npos)
        << refused.status().message();
    EXPECT_EQ(*ReadFileToString(dir + "/files.json"), "{oops") << "refused: nothing moved";
  }
  CHORUS_ASSERT_OK(WriteFileAtomically(dir + "/" + mine + ".owner", "acme"));
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().filename().string().rfind("files.json.corrupt-", 0) == 0) fs::remove(e.path());
  }
  CHORUS_ASSERT_OK(WriteFileAtomically(dir + "/files.json", good));
  auto s = FileStore::Open(dir);
  CHORUS_ASSERT_OK(s.status());
  CHORUS_ASSERT_OK((*s)->Delete(mine));
  EXPECT_FALSE(fs::exists(dir + "/" + mine + ".jsonl"));
  EXPECT_FALSE(fs::exists(dir + "/" + mine + ".owner")) << "Delete removes the owner file too";
}

}  // namespace
}  // namespace chorus::train
