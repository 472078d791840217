// test-labels: unit concurrency
// Uploaded training files: add / get / list / delete, persistence across a reopen, refusals.
#include "chorus/train/file_store.h"

#include <gtest/gtest.h>

#include <filesystem>

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

}  // namespace
}  // namespace chorus::train
