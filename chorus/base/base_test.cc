#include <atomic>
#include <vector>

#include "chorus/base/mapped_file.h"
#include "chorus/base/rng.h"
#include "chorus/base/status.h"
#include "chorus/base/thread_pool.h"
#include "tests/testutil/testutil.h"

namespace chorus {
namespace {

Result<int> Half(int x) {
  if (x % 2) return InvalidArgumentError("odd");
  return x / 2;
}
Result<int> Quarter(int x) {
  CHORUS_ASSIGN_OR_RETURN(int h, Half(x));
  CHORUS_ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}
Status CheckEven(int x) {
  CHORUS_RETURN_IF_ERROR(Half(x));
  return OkStatus();
}

TEST(StatusTest, MacrosPropagate) {
  EXPECT_EQ(*Quarter(8), 2);
  Result<int> r = Quarter(6);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "odd");
  EXPECT_TRUE(CheckEven(4).ok());
  EXPECT_EQ(CheckEven(3).WithContext("x").ToString(), "INVALID_ARGUMENT: x: odd");
}

TEST(ThreadPoolTest, EveryThreadRunsOncePerJob) {
  ThreadPool pool(3);
  for (int iter = 0; iter < 200; ++iter) {
    std::vector<std::atomic<int>> hits(3);
    pool.Run([&](int i, int n) {
      EXPECT_EQ(n, 3);
      hits[i].fetch_add(1);
    });
    for (auto& h : hits) ASSERT_EQ(h.load(), 1);
  }
}

TEST(ThreadPoolTest, SliceCoversRangeAligned) {
  for (int64_t n : {0, 1, 7, 32, 33, 1000}) {
    for (int t : {1, 2, 3}) {
      int64_t covered = 0, prev_end = 0;
      for (int i = 0; i < t; ++i) {
        int64_t b, e;
        ThreadPool::Slice(n, i, t, 16, &b, &e);
        EXPECT_EQ(b, prev_end);
        if (e < n) {
          EXPECT_EQ(e % 16, 0);
        }
        covered += e - b;
        prev_end = e;
      }
      EXPECT_EQ(covered, n);
    }
  }
}

TEST(MappedFileTest, MapsAndRejectsMissing) {
  std::string dir = testing::TempDir();
  CHORUS_ASSERT_OK(WriteFileAtomically(dir + "/a.txt", "hello"));
  auto mf = MappedFile::Open(dir + "/a.txt");
  ASSERT_TRUE(mf.ok());
  EXPECT_EQ((*mf)->view(), "hello");
  auto missing = MappedFile::Open(dir + "/nope");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(MappedFile::Open(dir).status().code(), StatusCode::kInvalidArgument);
}

TEST(RngTest, SameSeedSameStream) {
  Rng a(42), b(42), c(43);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(a.NextU64(), b.NextU64());
  EXPECT_NE(Rng(42).NextU64(), c.NextU64());
}

}  // namespace
}  // namespace chorus
