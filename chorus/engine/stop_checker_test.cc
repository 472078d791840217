// test-labels: unit
#include "chorus/engine/stop_checker.h"

#include "tests/testutil/testutil.h"

namespace chorus::engine {
namespace {

std::string Feed(StopChecker& sc, const std::vector<std::string>& pieces, bool* stopped) {
  std::string out;
  for (const auto& p : pieces) {
    auto o = sc.Push(p);
    out += o.text;
    if (o.stopped) {
      *stopped = true;
      return out;
    }
  }
  *stopped = false;
  return out + sc.Flush();
}

TEST(StopCheckerTest, NoStopsPassesThrough) {
  StopChecker sc({});
  bool stopped;
  EXPECT_EQ(Feed(sc, {"a", "bc"}, &stopped), "abc");
  EXPECT_FALSE(stopped);
}

TEST(StopCheckerTest, StopSplitAcrossPiecesIsNeverEmitted) {
  StopChecker sc({"END"});
  std::string emitted;
  for (const char* p : {"hello E", "N", "D world"}) {
    auto o = sc.Push(p);
    emitted += o.text;
    EXPECT_EQ(emitted.find('E'), std::string::npos) << emitted;
    if (o.stopped) break;
  }
  EXPECT_EQ(emitted, "hello ");
  EXPECT_TRUE(sc.stopped());
}

TEST(StopCheckerTest, EarliestOfSeveralStopsWins) {
  StopChecker sc({"world", "lo"});
  bool stopped;
  EXPECT_EQ(Feed(sc, {"hello world"}, &stopped), "hel");
  EXPECT_TRUE(stopped);
}

TEST(StopCheckerTest, PartialMatchReleasedAtEnd) {
  StopChecker sc({"STOP"});
  bool stopped;
  EXPECT_EQ(Feed(sc, {"ST", "O"}, &stopped), "STO");
  EXPECT_FALSE(stopped);
}

TEST(StopCheckerTest, HoldBackNeverSplitsUtf8) {
  StopChecker sc({"xyz"});
  auto o = sc.Push("a\xC3\xA9");  // "aé": keeping 2 bytes would split é
  EXPECT_EQ(o.text, "a");
  EXPECT_EQ(o.text + sc.Flush(), "a\xC3\xA9");
}

}  // namespace
}  // namespace chorus::engine
