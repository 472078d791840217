#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <thread>
#include <vector>

#include "chorus/base/background_thread.h"
#include "chorus/base/durable_file.h"
#include "chorus/base/mapped_file.h"
#include "chorus/base/owned_ranges.h"
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

TEST(BackgroundThreadTest, RunsEachCallersTaskOnItsThreadAtItsPriority) {
  const int before = ::getpriority(PRIO_PROCESS, 0);  // the test may itself run under `nice`
  BackgroundThread bg(10);
  std::thread::id caller = std::this_thread::get_id(), ran_on;
  int nice = 0;
  bg.RunAndWait([&] {
    ran_on = std::this_thread::get_id();
    errno = 0;
    nice = ::getpriority(PRIO_PROCESS, 0);  // the calling thread's nice value on Linux
  });
  EXPECT_NE(ran_on, caller);
  if (before <= 10) {
    EXPECT_EQ(nice, 10);
  } else {
    EXPECT_GE(nice, 10);  // lowering nice again needs a privilege the test may not have
  }
  EXPECT_EQ(::getpriority(PRIO_PROCESS, 0), before);  // the caller's own priority is untouched
  // Many callers at once: every task runs once, one at a time, and each caller sees its own.
  std::atomic<int> running{0}, max_running{0};
  std::vector<int> results(16, -1);
  std::vector<std::thread> callers;
  for (int i = 0; i < 16; ++i) {
    callers.emplace_back([&, i] {
      bg.RunAndWait([&, i] {
        const int now = running.fetch_add(1) + 1;
        int seen = max_running.load();
        while (now > seen && !max_running.compare_exchange_weak(seen, now)) {
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        results[static_cast<size_t>(i)] = i * i;
        running.fetch_sub(1);
      });
      EXPECT_EQ(results[static_cast<size_t>(i)], i * i);  // done before RunAndWait returned
    });
  }
  for (std::thread& t : callers) t.join();
  EXPECT_EQ(max_running.load(), 1);
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

// Alone, each thread takes exactly its own contiguous range, front to back.
TEST(OwnedRangesTest, OwnerTakesItsRangeInOrder) {
  OwnedRanges r(10, 3);
  std::vector<int64_t> got;
  for (int64_t u = r.Next(1); u >= 0 && u < 6; u = r.Next(1)) got.push_back(u);
  EXPECT_EQ(got, (std::vector<int64_t>{3, 4, 5}));
  EXPECT_FALSE(r.Empty());
}

// A thread whose range is empty steals the back half of the largest remaining range, then
// continues through it in order; every unit is handed out once and then Next returns -1.
TEST(OwnedRangesTest, StealsBackHalfOfLargestRange) {
  OwnedRanges r(12, 2);  // [0, 6) and [6, 12)
  for (int k = 0; k < 6; ++k) EXPECT_EQ(r.Next(1), 6 + k);
  EXPECT_EQ(r.Next(0), 0);  // thread 0 has [1, 6) left
  EXPECT_EQ(r.Next(1), 3);  // thread 1 steals [3, 6)
  EXPECT_EQ(r.Next(1), 4);
  EXPECT_EQ(r.Next(0), 1);
  EXPECT_EQ(r.Next(0), 2);
  EXPECT_EQ(r.Next(0), 5);  // thread 0 steals the last unit back
  EXPECT_TRUE(r.Empty());
  EXPECT_EQ(r.Next(0), -1);
  EXPECT_EQ(r.Next(1), -1);
}

// A long range is taken a few units per swap (at most kMaxTake, at most a quarter of what is
// left): those stay with their taker, the rest can still be stolen, and the last units of a
// range go one at a time.
TEST(OwnedRangesTest, LongRangesAreTakenAFewUnitsAtATime) {
  static_assert(OwnedRanges::kMaxTake == 4);
  OwnedRanges r(100, 2);    // [0, 50) and [50, 100)
  EXPECT_EQ(r.Next(0), 0);  // takes [0, 4): [4, 50) stays stealable
  for (int64_t u = 50; u < 100; ++u) ASSERT_EQ(r.Next(1), u);
  EXPECT_EQ(r.Next(1), 27);  // steals [27, 50), the back half of [4, 50)
  for (int64_t u = 1; u < 27; ++u) ASSERT_EQ(r.Next(0), u) << "thread 0 keeps its order";
  // Thread 0's range is empty now; thread 1 took [27, 31) and holds 28..30.
  EXPECT_EQ(r.Next(0), 40);  // steals [40, 50), the back half of [31, 50), from thread 1
  for (int64_t u = 28; u < 40; ++u) ASSERT_EQ(r.Next(1), u);
  for (int64_t u = 41; u < 50; ++u) ASSERT_EQ(r.Next(0), u);
  EXPECT_TRUE(r.Empty());
  EXPECT_EQ(r.Next(0), -1);
  EXPECT_EQ(r.Next(1), -1);
}

TEST(OwnedRangesTest, FewerUnitsThanThreadsAndNone) {
  OwnedRanges none(0, 4);
  EXPECT_TRUE(none.Empty());
  EXPECT_EQ(none.Next(2), -1);
  OwnedRanges one(1, 4);
  EXPECT_EQ(one.Next(0), 0);  // thread 0's range is empty: it steals the only unit
  EXPECT_EQ(one.Next(3), -1);
}

// Under real concurrency (threads of uneven speed, more threads than the inline ranges), every
// unit is handed out exactly once.
TEST(OwnedRangesTest, EveryUnitExactlyOnceUnderContention) {
  for (int threads : {2, 3, 12}) {
    for (int64_t total : {1, 7, 100, 5000}) {
      ThreadPool pool(threads);
      OwnedRanges r(total, threads);
      std::vector<std::atomic<int>> hits(static_cast<size_t>(total));
      pool.Run([&](int i, int) {
        for (int64_t u = r.Next(i); u >= 0; u = r.Next(i)) {
          hits[static_cast<size_t>(u)].fetch_add(1);
          if (i == 0) std::this_thread::yield();  // a slow thread: the others steal from it
        }
      });
      for (int64_t u = 0; u < total; ++u)
        ASSERT_EQ(hits[static_cast<size_t>(u)].load(), 1) << threads << " " << total << " " << u;
      EXPECT_TRUE(r.Empty());
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

// The crash-recovery helpers (durable_file.h): temp-name recognition, leftover removal, the
// quarantine move, the exclusive lock, and the crash hook killing a child at the chosen write.
TEST(DurableFileTest, LeftoversQuarantineLockAndCrashPoint) {
  namespace fs = std::filesystem;
  EXPECT_TRUE(IsAtomicWriteTempName("registry.json.tmp.123"));
  EXPECT_FALSE(IsAtomicWriteTempName("registry.json.tmp."));
  EXPECT_FALSE(IsAtomicWriteTempName("registry.json.tmp.12a"));
  EXPECT_FALSE(IsAtomicWriteTempName(".tmp.12"));
  EXPECT_FALSE(IsAtomicWriteTempName("registry.json"));

  const std::string dir = testing::TempDir();
  CHORUS_ASSERT_OK(WriteFileAtomically(dir + "/a.json", "new"));
  EXPECT_EQ(*ReadFileToString(dir + "/a.json"), "new");
  CHORUS_ASSERT_OK(WriteFileAtomically(dir + "/a.json.tmp.1", "x"));
  CHORUS_ASSERT_OK(WriteFileAtomically(dir + "/b.json.tmp.22", "x"));
  EXPECT_EQ(RemoveAtomicWriteTempFiles(dir, "a.json"), 1);
  EXPECT_TRUE(fs::exists(dir + "/b.json.tmp.22"));
  EXPECT_EQ(RemoveAtomicWriteTempFiles(dir), 1);
  EXPECT_EQ(fs::directory_iterator(dir)->path().filename(), "a.json");

  // A temp file of a dead writer goes; one of a live process (this one's parent) stays.
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ::waitpid(child, nullptr, 0);
  const std::string dead = dir + "/a.json.tmp." + std::to_string(child);
  const std::string live = dir + "/a.json.tmp." + std::to_string(::getppid());
  CHORUS_ASSERT_OK(WriteFileAtomically(dead, "x"));
  CHORUS_ASSERT_OK(WriteFileAtomically(live, "x"));
  EXPECT_EQ(RemoveDeadWritersTempFiles(dir + "/a.json"), 1);
  EXPECT_FALSE(fs::exists(dead));
  EXPECT_TRUE(fs::exists(live));
  // Directory-wide: the dead writers' temp files of every name go, live ones and other files stay.
  const std::string dead_b = dir + "/b.gguf.tmp." + std::to_string(child);
  const std::string dead_c = dir + "/config.json.tmp." + std::to_string(child);
  CHORUS_ASSERT_OK(WriteFileAtomically(dead_b, "x"));
  CHORUS_ASSERT_OK(WriteFileAtomically(dead_c, "x"));
  CHORUS_ASSERT_OK(WriteFileAtomically(dir + "/b.gguf", "kept"));
  EXPECT_EQ(RemoveDeadWritersTempFilesIn(dir), 2);
  EXPECT_FALSE(fs::exists(dead_b));
  EXPECT_FALSE(fs::exists(dead_c));
  EXPECT_TRUE(fs::exists(live));
  EXPECT_EQ(*ReadFileToString(dir + "/b.gguf"), "kept");
  fs::remove(live);

  auto moved = QuarantineFile(dir + "/a.json");
  CHORUS_ASSERT_OK(moved.status());
  EXPECT_EQ(moved->rfind(dir + "/a.json.corrupt-", 0), 0u) << *moved;
  EXPECT_EQ(*ReadFileToString(*moved), "new");
  EXPECT_FALSE(fs::exists(dir + "/a.json"));
  CHORUS_ASSERT_OK(WriteFileAtomically(dir + "/a.json", "again"));
  auto moved2 = QuarantineFile(dir + "/a.json");  // the same second: a distinct name
  CHORUS_ASSERT_OK(moved2.status());
  EXPECT_NE(*moved2, *moved);

  {
    auto lock = FileLock::Acquire(dir + "/x.lock", "the test store");
    CHORUS_ASSERT_OK(lock.status());
    auto second = FileLock::Acquire(dir + "/x.lock", "the test store");
    EXPECT_EQ(second.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(second.status().message().find("the test store"), std::string::npos);
  }
  CHORUS_EXPECT_OK(FileLock::Acquire(dir + "/x.lock", "the test store").status());

  // CHORUS_CRASH_POINT=atomic_write.before_rename@2: the second write dies before its rename,
  // leaving the first write's content and a complete temp file.
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setenv("CHORUS_CRASH_POINT", "atomic_write.before_rename@2", 1);
    (void)WriteFileAtomically(dir + "/c.json", "first");
    (void)WriteFileAtomically(dir + "/c.json", "second");
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
  EXPECT_EQ(*ReadFileToString(dir + "/c.json"), "first");
  EXPECT_EQ(*ReadFileToString(dir + "/c.json.tmp." + std::to_string(pid)), "second");
  EXPECT_EQ(RemoveDeadWritersTempFiles(dir + "/c.json"), 1);
}

// StagedDirectory: a new directory appears whole; a replaced one keeps the files the new contents
// do not replace, drops those `replaced` names, and never shows a mix; a staging directory that
// is not committed, or whose writer died, goes; a swap killed on a file system without
// RENAME_EXCHANGE is undone by the next Begin; a kill at each crash point leaves old or new.
TEST(DurableFileTest, StagedDirectoryReplacesTheDirectoryAsAWhole) {
  namespace fs = std::filesystem;
  const std::string root = testing::TempDir() + "/staged";
  fs::remove_all(root);
  fs::create_directories(root);
  const std::string out = root + "/out";
  auto names = [](const std::string& dir) {
    std::vector<std::string> n;
    for (const auto& e : fs::directory_iterator(dir)) n.push_back(e.path().filename().string());
    std::sort(n.begin(), n.end());
    return n;
  };
  auto weights = [](const std::string& n) { return n.rfind("w", 0) == 0; };
  {
    auto s = StagedDirectory::Begin(out);
    CHORUS_ASSERT_OK(s.status());
    EXPECT_EQ(s->path(), out + ".tmp." + std::to_string(::getpid()));
    CHORUS_ASSERT_OK(WriteFileAtomically(s->path() + "/w1", "old w1"));
    CHORUS_ASSERT_OK(WriteFileAtomically(s->path() + "/w2", "old w2"));
    EXPECT_FALSE(fs::exists(out));
    CHORUS_ASSERT_OK(s->Commit(weights));
  }
  EXPECT_EQ(names(out), (std::vector<std::string>{"w1", "w2"}));
  EXPECT_EQ(names(root), (std::vector<std::string>{"out"}));
  // The replaced directory keeps its permission bits; a trailing slash names the same directory.
  fs::permissions(out, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec);
  {
    auto s = StagedDirectory::Begin(out + "/");
    CHORUS_ASSERT_OK(s.status());
    EXPECT_EQ(s->path(), out + ".tmp." + std::to_string(::getpid()));
    CHORUS_ASSERT_OK(WriteFileAtomically(s->path() + "/w1", "old w1"));
    CHORUS_ASSERT_OK(WriteFileAtomically(s->path() + "/w2", "old w2"));
    CHORUS_ASSERT_OK(s->Commit(weights));
  }
  EXPECT_EQ(fs::status(out).permissions() & fs::perms::all,
            fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec);
  EXPECT_EQ(StagedDirectory::Begin("/").status().code(), StatusCode::kInvalidArgument);
  // Someone's own files in the directory, a file and a folder.
  CHORUS_ASSERT_OK(WriteFileAtomically(out + "/README", "mine"));
  fs::create_directories(out + "/notes");
  CHORUS_ASSERT_OK(WriteFileAtomically(out + "/notes/a", "note"));
  CHORUS_ASSERT_OK(WriteFileAtomically(out + "/junk.tmp.99", "a temp file"));
  {
    auto s = StagedDirectory::Begin(out);
    CHORUS_ASSERT_OK(s.status());
    CHORUS_ASSERT_OK(WriteFileAtomically(s->path() + "/w3", "new w3"));
    CHORUS_ASSERT_OK(WriteFileAtomically(s->path() + "/README", "theirs"));
    EXPECT_EQ(names(out), (std::vector<std::string>{"README", "junk.tmp.99", "notes", "w1", "w2"}));
    CHORUS_ASSERT_OK(s->Commit(weights));
  }
  EXPECT_EQ(names(out), (std::vector<std::string>{"README", "notes", "w3"}));
  EXPECT_EQ(*ReadFileToString(out + "/README"), "theirs");  // the new contents win
  EXPECT_EQ(*ReadFileToString(out + "/notes/a"), "note");
  EXPECT_EQ(names(root), (std::vector<std::string>{"out"}));
  {  // Not committed (a failed conversion): the staging directory goes, the output stays.
    auto s = StagedDirectory::Begin(out);
    CHORUS_ASSERT_OK(s.status());
    CHORUS_ASSERT_OK(WriteFileAtomically(s->path() + "/w9", "x"));
  }
  EXPECT_EQ(names(root), (std::vector<std::string>{"out"}));
  EXPECT_EQ(names(out), (std::vector<std::string>{"README", "notes", "w3"}));

  // A dead writer's staging directory is removed by the next Begin; a live one's stays.
  const pid_t gone = ::fork();
  if (gone == 0) ::_exit(0);
  ::waitpid(gone, nullptr, 0);
  fs::create_directories(out + ".tmp." + std::to_string(gone) + "/sub");
  fs::create_directories(out + ".tmp." + std::to_string(::getppid()));
  {
    auto s = StagedDirectory::Begin(out);
    CHORUS_ASSERT_OK(s.status());
    EXPECT_FALSE(fs::exists(out + ".tmp." + std::to_string(gone)));
    EXPECT_TRUE(fs::exists(out + ".tmp." + std::to_string(::getppid())));
  }
  fs::remove_all(out + ".tmp." + std::to_string(::getppid()));
  // The fallback swap killed between its two renames: the old contents aside, `out` absent.
  fs::rename(out, out + ".tmp." + std::to_string(gone) + ".old");
  {
    auto s = StagedDirectory::Begin(out);
    CHORUS_ASSERT_OK(s.status());
    EXPECT_EQ(names(out), (std::vector<std::string>{"README", "notes", "w3"}));
  }
  EXPECT_EQ(names(root), (std::vector<std::string>{"out"}));

  // Killed at each step: before the swap the old contents, after it the new ones (the old ones
  // left in the staging directory for the next Begin).
  for (const char* point : {"staged_dir.before_exchange", "staged_dir.after_exchange"}) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::setenv("CHORUS_CRASH_POINT", point, 1);
      auto s = StagedDirectory::Begin(out);
      if (!s.ok()) ::_exit(1);
      (void)WriteFileAtomically(s->path() + "/w4", "new w4");
      (void)s->Commit(weights);
      ::_exit(0);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << point << " " << status;
    const bool after = std::string(point) == "staged_dir.after_exchange";
    const std::vector<std::string> old_set = {"README", "notes", "w3"},
                                   new_set = {"README", "notes", "w4"};
    EXPECT_EQ(names(out), after ? new_set : old_set) << point;
    EXPECT_EQ(names(root), (std::vector<std::string>{"out", "out.tmp." + std::to_string(pid)}));
    CHORUS_ASSERT_OK(StagedDirectory::Begin(out).status());  // cleans up, commits nothing
    EXPECT_EQ(names(root), (std::vector<std::string>{"out"})) << point;
  }

  // Not a directory: refused, nothing created.
  CHORUS_ASSERT_OK(WriteFileAtomically(root + "/file", "x"));
  auto bad = StagedDirectory::Begin(root + "/file");
  EXPECT_EQ(bad.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(bad.status().message().find("not a directory"), std::string::npos);
  EXPECT_EQ(names(root), (std::vector<std::string>{"file", "out"}));
  fs::remove_all(root);
}

TEST(RngTest, SameSeedSameStream) {
  Rng a(42), b(42), c(43);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(a.NextU64(), b.NextU64());
  EXPECT_NE(Rng(42).NextU64(), c.NextU64());
}

}  // namespace
}  // namespace chorus
